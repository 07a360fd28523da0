#!/usr/bin/env bash
# Fetches llama.cpp's own tokenizer fixtures — vocabulary-only GGUFs with test
# texts (.inp) and their token ids (.out) — for Qwen 2, Llama's SentencePiece
# and Phi-3, out of the PyPI sdist of llama-cpp-python (which vendors
# llama.cpp's models/ folder), into models/vocab/. Idempotent.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="$here/vocab"
names="qwen2 llama-spm phi-3"
have=1; for n in $names; do [ -s "$dest/ggml-vocab-$n.gguf.out" ] || have=0; done
if [ $have = 1 ]; then echo "$dest"; exit 0; fi
ver=0.3.36
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --no-binary=llama-cpp-python "llama-cpp-python==$ver" -d "$tmp" >&2
mkdir -p "$dest"
python3 - "$tmp/llama_cpp_python-$ver.tar.gz" "$dest" $names <<'PY'
import os, sys, tarfile
src, dest, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with tarfile.open(src) as t:
    for m in t.getmembers():
        base = os.path.basename(m.name)
        if "/vendor/llama.cpp/models/" in m.name and any(base.startswith(f"ggml-vocab-{n}.gguf") for n in names):
            with t.extractfile(m) as f, open(os.path.join(dest, base), "wb") as o:
                o.write(f.read())
PY
echo "$dest"
