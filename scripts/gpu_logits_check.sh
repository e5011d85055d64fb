#!/usr/bin/env bash
# GPU machine: every GPU test (scripts/gpu_model.sh, tests only), then `elastic logits` on the CPU and with
# --device cuda for the transformers fixtures, each compared with transformers' logits.npy; then `elastic probe` on
# both devices for the same fixtures, their head scores compared. Logs go to $OUT.
set -u
O=$OUT
TEST_TIMEOUT=${TEST_TIMEOUT:-240} SKIP_TRAIN=1 SKIP_BENCH=1 SKIP_HF=1 bash scripts/gpu_model.sh > $O/gpu_model.log 2>&1; echo "gpu_model rc=$?"
tail -n 25 $O/gpu_model.log
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
for f in qwen3_gpu llama_gpu; do
  F=$O/fixtures/$f
  .gpucarry/elastic logits -m $F --ids $F/ids.npy -o $O/${f}_cpu.npy 2>&1 | tail -1
  .gpucarry/elastic logits -m $F --ids $F/ids.npy -o $O/${f}_cuda.npy --device cuda 2>&1 | tail -2
  .gpucarry/elastic logits -m $F --ids $F/ids.npy -o $O/${f}_cuda_ssa.npy --device cuda --mode ssa 2>&1 | tail -1
  python3 - $F $O/${f}_cpu.npy $O/${f}_cuda.npy <<'PY'
import sys, numpy as np
ref=np.load(sys.argv[1]+"/logits.npy"); c=np.load(sys.argv[2]); g=np.load(sys.argv[3])
s=ref.std()
print(sys.argv[1].split('/')[-1], "shape", ref.shape, "cpu max|d|/std %.2e"%(abs(c-ref).max()/s), "cuda max|d|/std %.2e"%(abs(g-ref).max()/s),
      "argmax agree cpu %.3f cuda %.3f"%((c.argmax(1)==ref.argmax(1)).mean(), (g.argmax(1)==ref.argmax(1)).mean()))
PY
done
for f in qwen3_gpu llama_gpu; do
  F=$O/fixtures/$f
  .gpucarry/elastic probe -m $F -c 120 --depths 4 --needles 2 -o $O/${f}_heads_cpu.json 2>&1 | tail -1
  .gpucarry/elastic probe -m $F -c 120 --depths 4 --needles 2 -o $O/${f}_heads_cuda.json --device cuda 2>&1 | tail -1
  python3 - $O/${f}_heads_cpu.json $O/${f}_heads_cuda.json <<'PY'
import sys, json
a=json.load(open(sys.argv[1]))["scores"]; b=json.load(open(sys.argv[2]))["scores"]
d=max(abs(x-y) for ra,rb in zip(a,b) for x,y in zip(ra,rb))
print(sys.argv[1].split('/')[-1], "probe cpu vs cuda: max |score diff| %.2e over %d heads" % (d, sum(len(r) for r in a)))
PY
done
