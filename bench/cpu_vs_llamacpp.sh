#!/usr/bin/env bash
# Elastic's CPU path against llama.cpp on the same GGUF: builds llama-cpp-python (from source, CPU) into
# build-bench/venv once (it compiles llama.cpp: about 10 minutes on 2 cores), then prints the side-by-side table of
# bench/cpu_vs_llamacpp.py. A benchmark, not a test. Usage:
#   bash bench/cpu_vs_llamacpp.sh [-m models/SmolLM2-135M-Instruct.Q4_1.gguf] [--prompts 128,512,2048] [--threads 1,2]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build-bench/venv
LLAMA_CPP_PYTHON=0.3.36
if ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  python3 -m venv "$VENV"
  # llama.cpp's native build enables its AMX kernels where the CPU reports AMX, and on the Xeon VMs we run on they
  # crash (SIGSEGV in ggml_backend_amx_mul_mat at the first eval). Its AVX-512 kernels are the fastest that run.
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON
    -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
    "$VENV/bin/pip" install -q --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON" numpy
fi
ELASTIC=${ELASTIC:-build/elastic}  # another build: ELASTIC=build-cpu/elastic bash bench/cpu_vs_llamacpp.sh
[ -x "$ELASTIC" ] || { echo "cpu_vs_llamacpp: $ELASTIC missing (bash scripts/setup.sh)" >&2; exit 1; }
args=("$@")
case " $* " in *" -m "*|*" --model "*) ;; *) args=(-m models/SmolLM2-135M-Instruct.Q4_1.gguf "${args[@]}") ;; esac
exec "$VENV/bin/python" bench/cpu_vs_llamacpp.py --elastic "$ELASTIC" "${args[@]}"
