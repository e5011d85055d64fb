#!/usr/bin/env bash
# Runs every CPU test (GPU tests carry the "gpu" label and run on the GPU machine: scripts/test.sh -L gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
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
