# Sourced first by the scripts/gpu_*.sh that run on the GPU machine: the repository root as the working folder, $O
# for the logs ($OUT there, /tmp elsewhere), $C for the binaries scripts/gpu_carry.sh packs, their libraries unpacked
# (they travel xz-packed) and on the loader path.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
O=${OUT:-/tmp}
C=.gpucarry
[ -d $C/lib ] || tar -xJf $C/lib.tar.xz -C $C
export LD_LIBRARY_PATH=$PWD/$C/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
