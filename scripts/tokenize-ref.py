#!/usr/bin/env python3
"""Writes llama.cpp's token ids for the tokenizer test texts (tests/data/tokenize-texts.json)
as tests/data/tokenize-<name>.json: the reference of tests/tokenizer_tests.rs.

  LLAMACPP_BIN_DIR=$(../shared/tools/peer-llamacpp.sh) scripts/tokenize-ref.py MODEL.gguf NAME

Each text goes through `llama-tokenize -f FILE --ids` (BOS as the model adds it, special
tokens parsed), so newlines and spaces reach it exactly.
"""
import json, os, subprocess, sys, tempfile

model, name = sys.argv[1], sys.argv[2]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
texts = json.load(open(os.path.join(root, "tests/data/tokenize-texts.json")))
exe = os.path.join(os.environ["LLAMACPP_BIN_DIR"], "llama-tokenize")
out = []
for t in texts:
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", delete=False, suffix=".txt") as f:
        f.write(t)
    r = subprocess.run([exe, "-m", model, "-f", f.name, "--ids", "--log-disable"], capture_output=True, text=True, check=True)
    os.unlink(f.name)
    line = [l for l in r.stdout.splitlines() if l.startswith("[")][-1]
    out.append({"text": t, "ids": json.loads(line)})
dest = os.path.join(root, f"tests/data/tokenize-{name}.json")
with open(dest, "w", encoding="utf-8") as f:
    json.dump({"model": os.path.basename(model), "tool": "llama.cpp llama-tokenize (llama-cpp-python 0.3.36's vendor copy)", "cases": out}, f, ensure_ascii=False, indent=0)
print(dest)
