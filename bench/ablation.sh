#!/usr/bin/env bash
# Reproduces BENCHMARKS.md's ablation tables for one direction: fit KV Ridge, distil it, then every
# path (native, no_context, sender, quote, recompute_only, each map alone, with recompute and with
# the selected spans quoted) on the same builtin items, and print the tables.
# Usage: bench/ablation.sh SENDER RECEIVER [LENGTHS] [PER_CELL]
#   e.g. bench/ablation.sh smollm2-135m-instruct gemma3-270m 1024 1
# On the 2-core CPU: fits 4-18 minutes, the 45-item evaluation 30-50 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
HF=.venv/bin/heterofold
S=$1 R=$2 LENGTHS=${3:-1024} PER_CELL=${4:-1}
dir=artifacts/adapters/${S}__${R}
[ -f "$dir/kv-ridge/manifest.json" ] ||
  $HF fit --sender "$S" --receiver "$R" --method kv-ridge --docs 8 --out "$dir/kv-ridge" --version kv-ridge-v1
[ -f "$dir/distilled/manifest.json" ] ||
  $HF fit --sender "$S" --receiver "$R" --method distilled --start "$dir/kv-ridge" --steps 200 --distill-docs 16 \
    --out "$dir/distilled" --version distilled-v1
out=artifacts/results/ablation_${S}__${R}_${LENGTHS//,/-}.json
$HF eval --sender "$S" --receiver "$R" --data builtin --lengths "$LENGTHS" --per-cell "$PER_CELL" \
  --ridge "$dir/kv-ridge" --map distilled="$dir/distilled" --served distilled --budgets 0,0.02,0.05 --budget 0.02 \
  --json "$out"
.venv/bin/python -m bench.ablation "$out"
