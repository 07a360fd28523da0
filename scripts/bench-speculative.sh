#!/usr/bin/env bash
# Speculative decoding, measured: for each workload (lookup: copy or edit a given passage; chat: free
# text), `wllm bench serve` against llama.cpp's llama-server (CPU, 2 threads, no speculation), then
# `wllm serve` without and with --speculative-config, one after the other in one run on one model.
# Prints each table, the ratios and the acceptance rate. Run from the project root after a release build:
#   scripts/bench-speculative.sh [--concurrency 1 --num-prompts 6 --input-len 200 --output-len 256]
# Env: MODEL (default: the default model), SPEC (the JSON, default ngram with 5 tokens),
# WORKLOADS (default "lookup chat"), LLAMA_BIN (llama.cpp's build/bin; default: built by
# ../shared/tools/peer-llamacpp.sh; NONE skips it).
set -euo pipefail
W=target/release/wllm; M=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
SPEC=${SPEC:-'{"method": "ngram", "num_speculative_tokens": 5}'}
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(--concurrency 1 --num-prompts 6 --input-len 200 --output-len 256)
L=${LLAMA_BIN:-$(../shared/tools/peer-llamacpp.sh)}
out=$(mktemp -d); export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
up() { for _ in $(seq 300); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 1; done; echo "server on $1 did not start" >&2; return 1; }
p=$((20000 + RANDOM % 20000))
for wl in ${WORKLOADS:-lookup chat}; do
  if [ "$L" != NONE ]; then
    "$L/llama-server" -m "$M" -t 2 -np 1 -c 8192 --host 127.0.0.1 --port $p >"$out/llama-server.log" 2>&1 & sp=$!
    up $p; echo "== $wl: llama.cpp llama-server (CPU, 2 threads)"
    "$W" bench serve --base-url "http://127.0.0.1:$p" --workload "$wl" "${args[@]}" --json "$out/$wl-llama.json"
    kill $sp; wait $sp 2>/dev/null || true
  fi
  for mode in off on; do
    extra=(); [ $mode = on ] && extra=(--speculative-config "$SPEC")
    "$W" serve --model "$M" --host 127.0.0.1 --port $((p + 1)) "${extra[@]}" >"$out/wllm-$mode.log" 2>&1 & sp=$!
    up $((p + 1)); echo "== $wl: wllm serve, speculation $mode"
    "$W" bench serve --base-url "http://127.0.0.1:$((p + 1))" --workload "$wl" "${args[@]}" --json "$out/$wl-$mode.json"
    kill $sp; wait $sp 2>/dev/null || true
  done
done
python3 - "$out" ${WORKLOADS:-lookup chat} <<'PY'
import json, os, sys
d = sys.argv[1]
load = lambda f: {r['concurrency']: r for r in json.load(open(f))['levels']} if os.path.exists(f) else {}
print("| workload | concurrency | output tok/s: speculation / without | / llama.cpp | drafts accepted |")
print("|---|---|---|---|---|")
for wl in sys.argv[2:]:
    on, off, ll = load(f"{d}/{wl}-on.json"), load(f"{d}/{wl}-off.json"), load(f"{d}/{wl}-llama.json")
    for c in sorted(on):
        a, b = on[c]['output_tokens_per_s'], off[c]['output_tokens_per_s']
        l = ll.get(c, {}).get('output_tokens_per_s')
        vs = f"{a:.1f} / {l:.1f} = x{a / l:.2f}" if l else "n/a"
        acc = on[c].get('spec_acceptance')
        print(f"| {wl} | {c} | {a:.1f} / {b:.1f} = x{a / b:.2f} | {vs} | {'n/a' if acc is None else f'{acc * 100:.1f} %'} |")
PY
