#!/usr/bin/env bash
# Runs every CPU test (GPU tests carry the "gpu" label and run on the GPU machine: scripts/test.sh -L gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
# scripts/test.sh --sanitize: the CPU engine, its tests and the CLI built with ASan + UBSan into build-asan/, then the
# whole CPU suite there (slower: a separate build, and the tests run 2-4x slower under the sanitizers).
if [ "${1:-}" = "--sanitize" ]; then
  shift
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DELASTIC_CUDA=OFF -DELASTIC_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$(nproc)"
  # OpenMP's runtime keeps thread pools alive at exit, which LeakSanitizer would report as leaks of ours.
  export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  exec ctest --test-dir build-asan --output-on-failure -LE gpu "$@"
fi
cmake --build build -j"$(nproc)"
if [ $# -gt 0 ]; then exec ctest --test-dir build --output-on-failure "$@"; fi
rc=0
ctest --test-dir build --output-on-failure -LE gpu || rc=$?
# The CPU-only configuration (a machine without the CUDA toolkit) must build too, and its CLI must refuse the CUDA
# flags by name: the #ifndef ELASTIC_HAVE_CUDA branches are compiled nowhere else. After the tests, so a failure
# here never hides their results.
{ cmake -S . -B build-cpu -DCMAKE_BUILD_TYPE=Release -DELASTIC_CUDA=OFF >/dev/null &&
  cmake --build build-cpu -j"$(nproc)" --target elastic &&
  tests/cli_errors.sh build-cpu/elastic "$PWD" 0; } || { echo "CPU-only build check failed" >&2; rc=1; }
exit $rc
