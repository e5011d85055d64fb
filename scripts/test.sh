#!/usr/bin/env bash
# Runs every CPU test (GPU tests carry the "gpu" label and run on the GPU machine: scripts/test.sh -L gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j"$(nproc)"
if [ $# -eq 0 ]; then set -- -LE gpu; fi
ctest --test-dir build --output-on-failure "$@"
