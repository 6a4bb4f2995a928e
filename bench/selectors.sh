#!/usr/bin/env bash
# Reproduces BENCHMARKS.md's selector tables: for each direction, fit KV Ridge (receiver-attention
# reads its map), then `heterofold bench selectors` on the same builtin items: answer-sentence
# recall of every selector at 1%, 2% and 5% and its own time; with FULL=1 also the accuracy of
# quoting each selector's 2% (QUOTE=a,b: only those selectors) and the receiver's native accuracy.
# SCOUT=0 leaves the scout out (it reads the same text for every direction); KINDS=a,b picks kinds.
# Usage: bench/selectors.sh LENGTH FULL SENDER:RECEIVER ...
#   e.g. bench/selectors.sh 1024 0 smollm2-135m-instruct:gemma3-270m
#        QUOTE=lexical,scout bench/selectors.sh 1024 1 smollm2-135m-instruct:gemma3-270m
# On the 2-core CPU: a KV Ridge fit 1-4 minutes; 35 items at 1024 tokens about 5 minutes for recall
# only, several times that with quote accuracy; at 4096 tokens about 5x.
set -euo pipefail
cd "$(dirname "$0")/.."
HF=.venv/bin/heterofold
LENGTH=$1 FULL=$2
shift 2
KINDS=${KINDS:-passkey,multikey,facts,handoff,paraphrase,update,chain}
if [ "$FULL" = 1 ]; then
  extra=(--quote-budget 0.02 --quote-selectors "${QUOTE:-}" --native) name=selectors_quote
else
  extra=(--quote-budget 0 --no-native) name=selectors
fi
[ "${SCOUT:-1}" = 1 ] || extra+=(--no-scout)
for pair in "$@"; do
  s=${pair%%:*} r=${pair##*:}
  dir=artifacts/adapters/${s}__${r}
  [ -f "$dir/kv-ridge/manifest.json" ] ||
    $HF fit --sender "$s" --receiver "$r" --method kv-ridge --docs 8 --out "$dir/kv-ridge" --version kv-ridge-v1
  $HF bench selectors --sender "$s" --receiver "$r" --lengths "$LENGTH" --kinds "$KINDS" \
    --adapter "$dir/kv-ridge" "${extra[@]}" --json "artifacts/results/${name}_${s}__${r}_${LENGTH}.json"
done
