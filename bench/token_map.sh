#!/usr/bin/env bash
# KV Ridge with and without the receiver's token features (fit --token-rank), on the same fit
# documents and the same builtin items: each map alone, with the chosen spans recomputed, and with
# them quoted, against no_context and quote. Prints the tables.
# Usage: bench/token_map.sh SENDER RECEIVER [RANK] [LENGTHS]
#   e.g. bench/token_map.sh smollm2-135m-instruct qwen2.5-coder-0.5b-instruct 256 1024
set -euo pipefail
cd "$(dirname "$0")/.."
HF=.venv/bin/heterofold
S=$1 R=$2 RANK=${3:-256} LENGTHS=${4:-1024}
dir=artifacts/adapters/${S}__${R}
[ -f "$dir/kv-ridge/manifest.json" ] ||
  $HF fit --sender "$S" --receiver "$R" --method kv-ridge --docs 8 --out "$dir/kv-ridge" --version kv-ridge-v1
[ -f "$dir/kv-ridge-tok$RANK/manifest.json" ] ||
  $HF fit --sender "$S" --receiver "$R" --method kv-ridge --docs 8 --token-rank "$RANK" \
    --out "$dir/kv-ridge-tok$RANK" --version "kv-ridge-tok$RANK-v1"
out=artifacts/results/tokenmap_${S}__${R}_${LENGTHS//,/-}.json
$HF eval --sender "$S" --receiver "$R" --data builtin --lengths "$LENGTHS" --per-cell 1 \
  --ridge "$dir/kv-ridge" --map tok="$dir/kv-ridge-tok$RANK" --served tok --budgets 0,0.02 --budget 0.02 \
  --paths no_context,quote,kv_ridge,tok,kv_ridge+quote,tok+quote --json "$out"
.venv/bin/python -m bench.ablation "$out"
