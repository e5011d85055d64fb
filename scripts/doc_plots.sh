#!/usr/bin/env bash
# Here (no GPU needed): the SVG figures in docs/PERFORMANCE.md, drawn by `elastic plot` from the CSVs next to them,
# which hold figures copied from the raw GPU results in the same folder (each CSV names its sources).
set -euo pipefail
cd "$(dirname "$0")/.."
E=${ELASTIC:-build/elastic}
D=docs/results/gpu_2026-12-03d
$E plot $D/plot_attention_tflops.csv -o $D/attention_tflops.svg --log2-x --x-label "tokens (T)" \
  --y-label "TFLOP/s (dense causal)" --title "Full causal attention, one layer, H200 (Qwen3-4B heads)"
$E plot $D/plot_sa_cost_ratio.csv -o $D/sa_cost_ratio.svg --log2-x --y-fit --x-label "tokens (T)" \
  --y-label "time share / computed-block share" --title "Cost of an all-streaming layer against its block share"
$E plot $D/plot_prefill_tok_s.csv -o $D/prefill_tok_s.svg --log2-x --x-label "prompt tokens" \
  --y-label "prefill tokens/s" --title "Whole-model prefill, Qwen3-4B shape, H200"
$E plot $D/plot_decode_tok_s.csv -o $D/decode_tok_s.svg --log2-x --x-label "context tokens" \
  --y-label "decode tokens/s" --title "Decode after the prefill, Qwen3-4B shape, H200"
D=docs/results/gpu_2026-12-03e
$E plot $D/plot_sa_cost_paired.csv -o $D/sa_cost_paired.svg --log2-x --y-fit --x-label "tokens (T)" \
  --y-label "time share / computed share" --title "All-streaming layer against its computed share, paired timing"
$E plot $D/plot_decode_tok_s.csv -o $D/decode_tok_s.svg --log2-x --x-label "context tokens" \
  --y-label "decode tokens/s" --title "Decode after the prefill, Qwen3-4B shape, H200"
