#!/usr/bin/env python3
"""Runs the test binaries that `cargo test --release --no-run` built as
parallel processes, longest first, and the doc-tests; prints each binary's
output whole when it ends, then a table of wall times. Exits 1 if any failed.

Why processes: lavapipe compiles one pipeline at a time per device (a test
binary's threads wait on each other's LLVM compiles), while separate processes
compile at once, so the suite's wall time is spent on all cores.

Usage: cargo test --release --no-run --message-format=json-render-diagnostics \
         | run_tests.py
(cargo's JSON messages on stdin name the executables; WLLM_TEST_JOBS sets how
many run at once, default the number of CPUs)
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

# Rough seconds each binary took on a 2-vCPU lavapipe machine (CI of 2026-12-06), to start the
# long ones first (unknown ones count as 30 s). Only the order depends on it.
HINT_S = {
    "speculative_tests": 151,
    "quantize_tests": 131,
    "arch_tests": 116,
    "embedding_tests": 112,
    "quant_ref_tests": 110,
    "engine_model_tests": 103,
    "fused_tests": 87,
    "router_tests": 84,
    "gemm_tests": 65,
    "structured_tests": 65,
    "trace_tests": 58,
    "oracle_tests": 51,
    "server_limits_tests": 48,
    "browser_tests": 46,
    "model_load_tests": 45,
    "pipeline_tests": 35,
    "engine_tests": 35,
    "registry_tests": 45,
    "server_tests": 27,
    "profile_tests": 25,
    "backend_tests": 22,
    "soak_tests": 21,
    "fused_norm_tests": 17,
    "wllm:lib": 13,
    "fuzz_tests": 11,
    "server_models_tests": 9,
}


def executables(lines):
    """(display name, hint key, path) of every test executable in cargo's JSON."""
    out = []
    for line in lines:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        kind = target["kind"][0]
        key = target["name"] if kind == "test" else f"{target['name']}:{kind}"
        src = os.path.relpath(target["src_path"])
        out.append((f"{src} ({os.path.relpath(msg['executable'])})", key, msg["executable"]))
    return out


def main():
    jobs = os.environ.get("WLLM_TEST_JOBS") or os.cpu_count() or 1
    try:
        jobs = max(1, int(jobs))
    except ValueError:
        sys.exit(f"run_tests.py: WLLM_TEST_JOBS={jobs!r} is not a number of jobs")
    tests = executables(sys.stdin)
    if not tests:
        sys.exit("run_tests.py: cargo built no test executable (see its messages above)")
    tests.sort(key=lambda t: -HINT_S.get(t[1], 30))
    # The doc-tests are cargo's own run; they go last, while others still run.
    tests.append(("doc-tests", "doc", None))
    queue = tests
    lock = threading.Lock()
    results = []

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                name, _, exe = queue.pop(0)
            cmd = [exe] if exe else ["cargo", "test", "--release", "--doc"]
            started = time.monotonic()
            with tempfile.TemporaryFile() as log:
                code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
                log.seek(0)
                text = log.read().decode("utf-8", "replace")
            took = time.monotonic() - started
            with lock:
                print(f"     Running {name}  [{took:.0f} s]\n{text}", flush=True)
                results.append((name, code, took))

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [r for r in results if r[1] != 0]
    print(f"test binaries: {len(results)} in {time.monotonic() - started:.0f} s on {jobs} jobs")
    for name, code, took in sorted(results, key=lambda r: -r[2]):
        print(f"  {took:6.0f} s  {'FAILED' if code else 'ok    '}  {name}")
    if failed:
        print(f"FAILED: {', '.join(r[0] for r in failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
