#!/usr/bin/env bash
# Here (the build machine): collects the CUDA-enabled binaries and the shared libraries the GPU image lacks into
# .gpucarry/ (git-ignored), for `run` with carry [".gpucarry"] and scripts/gpu_model.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j2 --target elastic elastic_gpu_tests bench_train_gpu bench_attention_gpu
rm -rf .gpucarry && mkdir -p .gpucarry/lib
cp build/elastic build/elastic_gpu_tests build/bench_train_gpu build/bench_attention_gpu .gpucarry/
for lib in $(ldd build/elastic build/elastic_gpu_tests build/bench_train_gpu build/bench_attention_gpu | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++*|libgcc_s*|ld-linux*|libcudart*|libcublas*|libssl*|libcrypto*|libz.so*) ;;
    *) cp -L "$lib" .gpucarry/lib/ ;;
  esac
done
du -sh .gpucarry
