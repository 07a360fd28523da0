#!/usr/bin/env python3
"""Greedy continuations of wllm against llama.cpp's llama-simple on the same
GGUF file and on its F32 copy (llama-quantize --allow-requantize ... F32: the
same weight values, without llama.cpp's 8-bit rounding of activations in its
quantised dot products), printed side by side with how many characters agree.

  scripts/compare-llamacpp.py MODEL.gguf [N_TOKENS]

llama.cpp's binaries come from ../shared/tools/peer-llamacpp.sh (their folder
in $LLAMACPP_BIN, else the script is run to find it); wllm from target/release.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORY = ("The lighthouse keeper counted the ships that passed each night, writing their names in a "
         "ledger that had belonged to his grandfather. ") * 24 + \
    "Question: what did the keeper write in the ledger? Answer:"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "北京是",
           "Once upon a time, in a small village,", "Explain why the sky is blue in one sentence.", STORY]


def peer_bin():
    if os.environ.get("LLAMACPP_BIN"):
        return os.environ["LLAMACPP_BIN"]
    script = os.path.join(ROOT, "..", "shared", "tools", "peer-llamacpp.sh")
    return subprocess.run(["bash", script], capture_output=True, check=True).stdout.decode().strip().splitlines()[-1]


def main():
    model, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 24
    b = peer_bin()
    env = dict(os.environ, LD_LIBRARY_PATH=b, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    f32 = os.path.join("/tmp", os.path.basename(model) + ".f32.gguf")
    if not os.path.exists(f32):
        subprocess.run([b + "/llama-quantize", "--allow-requantize", model, f32, "F32"],
                       capture_output=True, env=env, check=True)

    def run(cmd):
        return subprocess.run(cmd, capture_output=True, env=env).stdout.decode("utf-8", "replace")

    def common(a, c):
        k = 0
        while k < min(len(a), len(c)) and a[k] == c[k]:
            k += 1
        return k

    wllm = os.path.join(ROOT, "target", "release", "wllm")
    for p in PROMPTS:
        w = p + run([wllm, "generate", "--model", model, "--prompt", p, "--max-tokens", str(n),
                     "--temperature", "0", "--ignore-eos"]).rstrip("\n")
        print(f"== {p[:40]!r} ({len(p)} chars)")
        print(f"  wllm          : {w[len(p):]!r}")
        for name, m in [("llama.cpp     ", model), ("llama.cpp F32 ", f32)]:
            o = run([b + "/llama-simple", "-m", m, "-n", str(n), p]).replace("<bos>", "", 1).rstrip("\n")
            print(f"  {name}: {o[len(p):]!r}  (agree: {common(w, o) - len(p)} of {len(w) - len(p)} chars)")


if __name__ == "__main__":
    main()
