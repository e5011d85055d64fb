#!/usr/bin/env bash
# GPU machine: builds the CUDA kernels and their tests with nvcc alone (that image has no CMake deps such as
# OpenBLAS or GoogleTest; carry GoogleTest/nlohmann headers and static libs in .gpudeps/) and runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${DEPS:-.gpudeps}
OUTDIR=${OUT:-/tmp}
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Iinclude -I$DEPS/include \
  src/cuda/*.cu src/io/safetensors.cpp tests/gpu/*.cpp -L$DEPS/lib -lgtest_main -lgtest -lpthread \
  -Xcompiler -fopenmp -o /tmp/elastic_gpu_tests
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
/tmp/elastic_gpu_tests 2>&1 | tee "$OUTDIR/gpu_tests.log"
