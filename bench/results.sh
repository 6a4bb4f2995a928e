#!/usr/bin/env bash
# Reproduces BENCHMARKS.md: fit both adapters for every direction, evaluate, benchmark speed.
# Usage: bench/results.sh [LENGTHS] [CONTEXTS]   e.g. bench/results.sh 1024 "1024 2048 4096"
# Everything lands under artifacts/ (adapters, JSON results). On the 2-core CPU: fits 1-9 minutes
# per adapter, a 20-item evaluation 10-17 minutes, the speed runs 1-2 minutes per context.
set -euo pipefail
cd "$(dirname "$0")/.."
HF=.venv/bin/heterofold
LENGTHS=${1:-1024}
CONTEXTS=${2:-"1024 2048 4096"}
MODELS=(smollm2-135m-instruct gemma3-270m qwen2.5-coder-0.5b-instruct)
docs() {  # fit documents of 1024 tokens: 8, except the first direction fitted (kept as it was)
  case "$1/$2/$3" in
    smollm2-135m-instruct/gemma3-270m/heterofold) echo 10 ;;
    smollm2-135m-instruct/gemma3-270m/kv-ridge) echo 16 ;;
    *) echo 8 ;;
  esac
}
for s in "${MODELS[@]}"; do
  for r in "${MODELS[@]}"; do
    [ "$s" = "$r" ] && continue
    dir=artifacts/adapters/${s}__${r}
    for m in heterofold kv-ridge; do
      [ -f "$dir/$m/manifest.json" ] ||
        $HF fit --sender "$s" --receiver "$r" --method "$m" --docs "$(docs "$s" "$r" "$m")" --out "$dir/$m" --version "$m-v1"
    done
    # the look-up kinds and the HeteroFold / KV Ridge budget sweep (bench/ablation.sh has the ablations)
    $HF eval --sender "$s" --receiver "$r" --data builtin --lengths "$LENGTHS" --budget 0.02 \
      --kinds passkey,multikey,facts,handoff --paths heterofold,kv_ridge,no_context,sender \
      --adapter "$dir/heterofold" --ridge "$dir/kv-ridge" --json "artifacts/results/eval_${s}__${r}_${LENGTHS//,/-}.json"
    for n in $CONTEXTS; do
      $HF bench transfer --sender "$s" --receiver "$r" --context "$n" --repeats 2 \
        --json "artifacts/results/bench_${s}__${r}_${n}.json"
    done
  done
done
.venv/bin/python -m bench.report artifacts/results --svg docs/frontier.svg > artifacts/results/tables.md
