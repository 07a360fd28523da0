#!/usr/bin/env bash
# Starts `wllm serve` on the default model and drives it with the official
# `openai` Python package (scripts/openai_smoke.py). Run after a release build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -m pip install --quiet --disable-pip-version-check openai >/dev/null 2>&1 || python3 -m pip install --quiet openai
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
port="${WLLM_SMOKE_PORT:-18431}"
cargo build --release --quiet --bin wllm
./target/release/wllm serve --port "$port" --served-model-name smollm2 --kv-cache-memory 268435456 > /tmp/wllm-smoke-server.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 $pid 2>/dev/null; then cat /tmp/wllm-smoke-server.log; exit 1; fi
  sleep 1
done
python3 scripts/openai_smoke.py "http://127.0.0.1:$port/v1" smollm2
