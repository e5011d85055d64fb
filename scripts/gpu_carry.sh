#!/usr/bin/env bash
# Here (the build machine): collects the CUDA-enabled binaries and the shared libraries the GPU image lacks into
# .gpucarry/ (git-ignored), for `run` with carry [".gpucarry"] and scripts/gpu_model.sh there. The binaries are
# stripped (the kernels' fatbins stay) and bench_train_gpu is left out unless WITH_TRAIN_BENCH=1, so .gpucarry plus
# the working tree stay under the device tool's 64 MiB carry limit; the script prints the total. BEFORE=path/to/elastic
# adds another build as .gpucarry/elastic_before (scripts/gpu_decode_before_after.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BINS="elastic elastic_gpu_tests bench_attention_gpu"
[ -z "${WITH_TRAIN_BENCH:-}" ] || BINS="$BINS bench_train_gpu"
cmake --build build -j2 --target $BINS
rm -rf .gpucarry && mkdir -p .gpucarry/lib
for b in $BINS; do
  cp "build/$b" .gpucarry/
  strip -s ".gpucarry/$b"
done
for lib in $(cd build && ldd $BINS | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++*|libgcc_s*|ld-linux*|libcudart*|libcublas*|libssl*|libcrypto*|libz.so*) ;;
    *) cp -L "$lib" .gpucarry/lib/ ;;
  esac
done
# Packed with xz (42 -> 6 MiB, mostly OpenBLAS), so two builds, or a build and a model part, fit in one carry; the GPU
# scripts unpack it first.
tar -C .gpucarry -cJf .gpucarry/lib.tar.xz lib && rm -rf .gpucarry/lib
[ -z "${BEFORE:-}" ] || { cp "$BEFORE" .gpucarry/elastic_before && strip -s .gpucarry/elastic_before; }
carry=$(du -sb .gpucarry | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((carry + tree))
echo ".gpucarry $((carry / 1048576)) MiB + working tree $((tree / 1048576)) MiB = $((total / 1048576)) MiB (limit 64)"
[ "$total" -lt $((64 * 1048576)) ] || { echo "gpu_carry: over the 64 MiB carry limit" >&2; exit 1; }
