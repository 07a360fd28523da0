#!/usr/bin/env bash
# Embeddings against llama.cpp's llama-embedding (CPU, 2 threads), one run on one model:
#  1. agreement: tests/data/embedding-texts.txt (prose, code, SQL, Spanish, Japanese, a short line)
#     embedded by both with each pooling (unit length), the cosine of each pair printed;
#  2. speed: 32 inputs of about 64 tokens through /v1/embeddings of llama-server --embeddings and
#     of wllm serve, one after the other: 32 requests of one input, then one request of all 32;
#  3. speed on the command line: `llama-embedding -f` and `wllm embed` on 1 input and on all 32, one
#     at a time (llama.cpp's batch of 96 tokens holds one input; wllm's --batch 1) and all at once:
#     embeddings/s = 31 / (time for 32 - time for 1), so that loading and warming up cancel out.
# Run from the project root after a release build: scripts/compare-embeddings.sh [MODEL]
# Env: LLAMA_BIN (llama.cpp's build/bin; default: built by ../shared/tools/peer-llamacpp.sh).
set -euo pipefail
W=target/release/wllm; M=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
L=${LLAMA_BIN:-$(../shared/tools/peer-llamacpp.sh)}
out=$(mktemp -d); export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
T=tests/data/embedding-texts.txt
for pool in mean cls last; do
  "$L/llama-embedding" -m "$M" --pooling $pool --embd-normalize 2 -t 2 -f $T --embd-output-format json \
    2>"$out/llama-$pool.err" >"$out/llama-$pool.json"
  "$W" --model "$M" embed --pooling $pool --json <$T >"$out/wllm-$pool.jsonl" 2>"$out/wllm-$pool.err"
done
python3 - "$out" <<'PY'
import json, math, sys
d = sys.argv[1]
for pool in ["mean", "cls", "last"]:
    ll = [x["embedding"] for x in json.load(open(f"{d}/llama-{pool}.json"))["data"]]
    ww = [json.loads(l)["embedding"] for l in open(f"{d}/wllm-{pool}.jsonl")]
    assert len(ll) == len(ww), (len(ll), len(ww))
    cos = [sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b)) for a, b in zip(ll, ww)]
    print(f"{pool}: {len(cos)} texts, cosine to llama-embedding min {min(cos):.6f} mean {sum(cos) / len(cos):.6f}")
PY
# 32 inputs of about 64 tokens: sentences of common words.
python3 - >"$out/inputs.txt" <<'PY'
import random
random.seed(47)
words = ("the of and to in is was for on that with as by at from this have an are it be or not which "
         "model memory cache block token engine device request step batch window layer kernel").split()
for _ in range(32):
    print(" ".join(random.choice(words) for _ in range(60)).capitalize() + ".")
PY
up() { for _ in $(seq 300); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 1; done; echo "server on $1 did not start" >&2; return 1; }
p=$((20000 + RANDOM % 20000))
speed() {  # BASE_URL NAME: 32 requests of one input, then one request of all 32 (after two warm-up calls)
  python3 - "$1" "$2" "$out/inputs.txt" <<'PY'
import json, sys, time, urllib.request
url, name, texts = sys.argv[1] + "/v1/embeddings", sys.argv[2], [l.strip() for l in open(sys.argv[3]) if l.strip()]
def call(inp):
    r = urllib.request.Request(url, json.dumps({"input": inp}).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r, timeout=600))
call(texts[0]); call(texts[:4])
t = time.time()
for x in texts:
    call(x)
one = time.time() - t
t = time.time()
d = call(texts)
all32 = time.time() - t
print(f"{name}: {len(texts)} inputs of {d['usage']['prompt_tokens'] // len(texts)} tokens: one at a time {len(texts) / one:.1f} embeddings/s, 32 at a time {len(texts) / all32:.1f} embeddings/s")
PY
}
"$L/llama-server" -m "$M" --embeddings --pooling mean -t 2 -c 4096 -np 32 -b 4096 -ub 4096 --host 127.0.0.1 --port $p \
  >"$out/llama-server.log" 2>&1 & sp=$!
up $p; speed "http://127.0.0.1:$p" "llama-server --embeddings (CPU, 2 threads)"; kill $sp; wait $sp 2>/dev/null || true
"$W" serve --model "$M" --host 127.0.0.1 --port $((p + 1)) >"$out/wllm-serve.log" 2>&1 & sp=$!
up $((p + 1)); speed "http://127.0.0.1:$((p + 1))" "wllm serve"; kill $sp; wait $sp 2>/dev/null || true
# 3. The command-line tools, 1 input and 32, one at a time and all at once.
head -1 "$out/inputs.txt" >"$out/one.txt"
secs() {  # seconds a command takes (its output dropped; it must succeed)
  python3 -c 'import subprocess, sys, time
t = time.time(); subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print(time.time() - t)' "$@"
}
for mode in one all; do
  if [ $mode = one ]; then lb=96; wb=1; else lb=4096; wb=32; fi
  l1=$(secs "$L/llama-embedding" -m "$M" --pooling mean -t 2 -c 4096 -b $lb -ub $lb -f "$out/one.txt")
  l32=$(secs "$L/llama-embedding" -m "$M" --pooling mean -t 2 -c 4096 -b $lb -ub $lb -f "$out/inputs.txt")
  w1=$(secs sh -c "\"$W\" --model \"$M\" embed --pooling mean --batch $wb <\"$out/one.txt\"")
  w32=$(secs sh -c "\"$W\" --model \"$M\" embed --pooling mean --batch $wb <\"$out/inputs.txt\"")
  python3 -c "
l = 31 / ($l32 - $l1); w = 31 / ($w32 - $w1)
print(f'command line, $mode at a time: llama-embedding {l:.1f} embeddings/s (1 input {$l1:.2f} s, 32 {$l32:.2f} s), '
      f'wllm embed {w:.1f} (1 input {$w1:.2f} s, 32 {$w32:.2f} s): {w / l:.2f}x')"
done
