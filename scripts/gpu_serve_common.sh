# Sourced by scripts/gpu_serve_load.sh and scripts/gpu_serve_capacity.sh (GPU machine), with SHAPE set: makes W (a
# scratch folder for what is not a result, so not under $OUT), kills the caller's servers when it exits, unpacks .gpucarry's libraries, sets E (the binary) and L, H, V (the shape's layers, KV heads and
# vocabulary, read from the router file's fingerprint, so the named shapes have one home: model_shapes.cpp), and
# writes into $W what the routings name:
#   router.safetensors  an untrained router (elastic route init --shape SHAPE, seed 7, dense bias ROUTER_BIAS, -0.1)
#   hybrid.json         70% of the KV heads streaming, drawn with seed 7; ssa.json: every head streaming
# (sink 128 + window 2048, block 128). routing_flags NAME prints the serve flags of a routing: full, router, hybrid,
# ssa.
W=$(mktemp -d)
# A server left running (the script cut by a timeout) would keep its GPU memory from the next one.
trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT
trap 'exit 143' TERM INT
. "$(dirname "$0")/gpu_env.sh"  # root, $O, $C, libraries
E=.gpucarry/elastic
fp=$($E route init --shape "$SHAPE" --seed 7 --dense-bias "${ROUTER_BIAS:--0.1}" --block 128 \
       -o "$W/router.safetensors" 2>&1) || { echo "$fp" >&2; exit 1; }
L=$(sed -n 's/.* L=\([0-9]*\) .*/\1/p' <<<"$fp"); H=$(sed -n 's/.* Hkv=\([0-9]*\) .*/\1/p' <<<"$fp")
V=$(sed -n 's/.* V=\([0-9]*\).*/\1/p' <<<"$fp")
[ -n "$L" ] && [ -n "$H" ] && [ -n "$V" ] || { echo "gpu_serve_common: no shape in '$fp'" >&2; exit 1; }
python3 - "$L" "$H" "$W" <<'PY'
import json, random, sys
L, H, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(7)
heads = [(l, h) for l in range(L) for h in range(H)]
for name, share in (("hybrid", 0.7), ("ssa", 1.0)):
    sparse = set(rng.sample(heads, round(share * len(heads))))
    layers = [["ssa" if (l, h) in sparse else "full" for h in range(H)] for l in range(L)]
    json.dump({"block_size": 128, "sink": 128, "local": 2048, "layers": layers}, open("%s/%s.json" % (out, name), "w"))
PY
routing_flags() {
  case $1 in
    full) echo "";;
    router) echo "--router $W/router.safetensors";;
    *) echo "--routing $W/$1.json";;
  esac
}
