#!/usr/bin/env python3
"""Start-up beside llama.cpp, in one run: wall time of a one-token completion on
the default model with `wllm generate` cold (empty cache home: no driver shader
cache, no wllm pipeline cache) and warm, and with `llama-cli -st` (2 threads).

    python3 scripts/startup_bench.py [--reps 5] [--llama-bin DIR]

DIR defaults to what ../shared/tools/peer-llamacpp.sh prints. Needs
`cargo build --release` first. Prints medians and the ratios."""
import argparse, os, statistics, subprocess, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--llama-bin")
ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
a = ap.parse_args()
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(root)
bin_dir = a.llama_bin or subprocess.run(
    ["bash", "../shared/tools/peer-llamacpp.sh"], capture_output=True, text=True, check=True
).stdout.strip()
prompt = "The capital of France is"


def timed(cmd, env=None):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed ({r.returncode}): {r.stderr[-2000:]}")
    return dt, r.stderr


wllm = ["target/release/wllm", "generate", "--model", a.model, "--prompt", prompt, "--max-tokens", "1"]
llama = [f"{bin_dir}/llama-cli", "-m", a.model, "-p", prompt, "-n", "1", "-st", "-t", "2"]
warm_home = tempfile.mkdtemp(prefix="wllm-warm-")
warm_env = dict(os.environ, XDG_CACHE_HOME=warm_home)
timed(wllm, warm_env)  # fills the warm caches
res = {"wllm cold": [], "wllm warm": [], "llama-cli": []}
last_line = ""
for _ in range(a.reps):
    cold_env = dict(os.environ, XDG_CACHE_HOME=tempfile.mkdtemp(prefix="wllm-cold-"))
    cold_env.pop("MESA_SHADER_CACHE_DIR", None)
    res["wllm cold"].append(timed(wllm, cold_env)[0])
    dt, err = timed(wllm, warm_env)
    res["wllm warm"].append(dt)
    last_line = next((l for l in err.splitlines() if l.startswith("loaded")), "")
    res["llama-cli"].append(timed(llama)[0])
med = {k: statistics.median(v) for k, v in res.items()}
for k, v in res.items():
    print(f"{k:10} median {med[k]:.2f} s  (runs: {', '.join(f'{x:.2f}' for x in v)})")
print(f"warm / llama-cli = {med['wllm warm'] / med['llama-cli']:.2f}x (target <= 2)")
print(f"cold = {med['wllm cold']:.2f} s (target <= 10)")
print(f"last warm start-up line: {last_line}")
