#!/usr/bin/env python3
"""Hostile input against a real `wllm serve` (issue 57's review, bounded).

    python3 scripts/hostile_soak.py [--wllm target/release/wllm] [--minutes 5] [--rows-only]

Starts `wllm serve` on the default model and, for each row of the review
that a client can send, prints the status, the seconds it took and the
server's RSS after it, then checks that a small request beside it is still
answered (restarting the server where it is not: an old binary wedges).
Then, for --minutes, sends random hostile bodies from two threads while a
third sends small requests, and checks: no non-OpenAI answer, no 5xx other
than 503, the server alive, its RSS back within 10 % of its start a few
seconds after the hostile requests end, and SIGTERM exits within the
shutdown timeout. Exits non-zero if any of that fails. Standard library only.
"""

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

PORT = int(os.environ.get("WLLM_HOSTILE_PORT", "18533"))


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def call(method, path, body=None, headers=None, timeout=30.0):
    """(status or a string saying why none came, parsed body, seconds)."""
    t = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    h = {"content-type": "application/json", "host": "localhost"}
    h.update(headers or {})
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        try:
            v = json.loads(raw)
        except ValueError:
            v = raw[:200].decode("utf-8", "replace")
        return r.status, v, time.monotonic() - t
    except (OSError, http.client.HTTPException) as e:
        return f"no answer ({type(e).__name__})", None, time.monotonic() - t
    finally:
        c.close()


SMALL = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}


class Server:
    def __init__(self, wllm, extra):
        self.wllm, self.extra, self.p = wllm, extra, None

    def start(self):
        self.p = subprocess.Popen(
            [self.wllm, "serve", "--port", str(PORT), "--kv-cache-memory", "268435456", *self.extra],
            stdout=subprocess.DEVNULL,
            stderr=open("/tmp/wllm-hostile-server.log", "a"),
        )
        for _ in range(300):
            if self.p.poll() is not None:
                sys.exit(f"the server exited at start ({self.p.returncode}); see /tmp/wllm-hostile-server.log")
            st, _, _ = call("GET", "/health", timeout=2)
            if st == 200:
                return
            time.sleep(1)
        sys.exit("the server did not come up in 300 s")

    def stop(self, timeout=40):
        """Seconds SIGTERM took to end it (None: it had to be killed)."""
        if self.p is None or self.p.poll() is not None:
            return 0.0
        t = time.monotonic()
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout)
            return time.monotonic() - t
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None

    def rss(self):
        return rss_mib(self.p.pid)


def rows():
    long = "y" * 3000
    props = {f"p{i}": {"type": "integer"} for i in range(300)}
    return [
        ("1 prompt_lookup_max u64::MAX", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "hi hi hi hi"}], "max_tokens": 8, "temperature": 0,
          "speculative_config": {"method": "ngram", "prompt_lookup_min": 1,
                                 "prompt_lookup_max": 18446744073709551615, "adaptive": False}}, {}),
        ("2 1000 stops x 3000 B, 4 prompts, n 64", "/v1/completions",
         {"prompt": ["a", "b", "c", "d"], "n": 64, "max_tokens": 2, "stop": [long] * 1000}, {}),
        ("3 a 5 MB text prompt", "/v1/completions", {"prompt": "hello " * 870000, "max_tokens": 1}, {}),
        ("4 keep_alive 1e20", "/v1/completions", {"prompt": "hi", "max_tokens": 1, "keep_alive": 1e20}, {}),
        ("10 schema of 300 properties, n 64", "/v1/completions",
         {"prompt": "{", "n": 64, "max_tokens": 2,
          "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema":
                              {"type": "object", "properties": props}}}}, {}),
        ("12 Host: evil.example (DNS rebinding)", "/v1/models", None, {"host": "evil.example"}),
    ]


def hostile_body(r):
    """A random body with fields at their extremes."""
    big = 18446744073709551615
    pick = lambda *v: r.choice(v)  # noqa: E731
    b = {}
    if r.random() < 0.5:
        b["n"] = pick(1, 8, 64, 65, -1, big)
    b["max_tokens"] = pick(1, 2, 4, 0, 10 ** 9)
    if r.random() < 0.4:
        b["stop"] = ["s" * pick(1, 1024, 1025)] * pick(1, 64, 65)
    if r.random() < 0.3:
        b["stop_token_ids"] = list(range(pick(1, 1024, 1025)))
    if r.random() < 0.3:
        b["speculative_config"] = {"prompt_lookup_max": pick(1, 16, 17, big), "prompt_lookup_min": pick(0, 1, big),
                                   "num_speculative_tokens": pick(0, 1, 64, 65, big)}
    if r.random() < 0.3:
        b["keep_alive"] = pick(1e20, -1, "5m", "inf", "1h30m")
    if r.random() < 0.3:
        b["temperature"] = pick(0, 1, 1e30, -1)
    if r.random() < 0.2:
        n = pick(1, 300, 3000)
        b["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}}}
    prompt = pick("hi", "x" * pick(10, 100000, 3000000), [1, 2, 3], [4294967295])
    if r.random() < 0.5:
        content = prompt if isinstance(prompt, str) else "hi"
        b["messages"] = [{"role": "user", "content": content}]
        return "/v1/chat/completions", b
    b["prompt"] = prompt
    return "/v1/completions", b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wllm", default="target/release/wllm")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--rows-only", action="store_true")
    ap.add_argument("--row-timeout", type=float, default=60.0)
    a, extra = ap.parse_known_args()
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    s = Server(a.wllm, extra)
    s.start()
    failures = []
    print(f"{'row':44} {'status':>22} {'seconds':>8} {'RSS MiB':>8}  small request beside it")
    for name, path, body, headers in rows():
        before = s.rss()
        st, v, secs = call("POST" if body is not None else "GET", path, body, headers, timeout=a.row_timeout)
        after = s.rss()
        ok, _, small_secs = call("POST", "/v1/completions", SMALL, timeout=a.row_timeout)
        msg = v["error"]["message"][:70] if isinstance(v, dict) and "error" in v else ""
        rss = f"{before:.0f}->{after:.0f}" if before and after else "gone"
        print(f"{name:44} {str(st):>22} {secs:8.2f} {rss:>8}  {ok} in {small_secs:.2f} s  {msg}", flush=True)
        if ok != 200:
            print("  (the server no longer answers: restarting it)", flush=True)
            s.stop(timeout=5)
            s.start()
    if a.rows_only:
        took = s.stop()
        print(f"SIGTERM: {'killed after 40 s' if took is None else f'exited in {took:.1f} s'}")
        return
    # The soak.
    for _ in range(3):
        call("POST", "/v1/completions", SMALL)
    start_rss = s.rss()
    end = time.monotonic() + a.minutes * 60
    counts, lock = {}, threading.Lock()

    def hostile(seed):
        r = random.Random(seed)
        while time.monotonic() < end:
            path, body = hostile_body(r)
            st, v, _ = call("POST", path, body, timeout=120)
            bad = not isinstance(st, int) or (st >= 500 and st != 503) or (
                st >= 400 and not (isinstance(v, dict) and "error" in v))
            with lock:
                counts[st] = counts.get(st, 0) + 1
                if bad:
                    failures.append(f"{st} for {json.dumps(body)[:200]}: {str(v)[:200]}")

    small = []

    def canary():
        while time.monotonic() < end:
            st, _, secs = call("POST", "/v1/completions", SMALL, timeout=120)
            small.append((st, secs))
            time.sleep(0.5)

    threads = [threading.Thread(target=hostile, args=(i,)) for i in range(2)] + [threading.Thread(target=canary)]
    peak = start_rss
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, s.rss() or 0)
        time.sleep(1)
    time.sleep(5)
    call("POST", "/v1/completions", SMALL)
    end_rss = s.rss()
    alive = s.p.poll() is None
    oks = [x for st, x in small if st == 200]
    print(f"soak {a.minutes:g} min: hostile answers by status {dict(sorted(counts.items(), key=str))}")
    print(f"small requests: {len(oks)}/{len(small)} answered 200, slowest {max(oks, default=0):.2f} s")
    print(f"RSS: start {start_rss:.0f} MiB, peak {peak:.0f}, after {end_rss or 0:.0f} "
          f"({(end_rss or 0) / start_rss * 100 - 100:+.1f} %)")
    took = s.stop()
    print(f"SIGTERM: {'killed after 40 s' if took is None else f'exited in {took:.1f} s'}")
    if not alive:
        failures.append("the server died during the soak")
    if len(oks) != len(small):
        failures.append(f"{len(small) - len(oks)} small requests not answered")
    if end_rss is None or end_rss > start_rss * 1.10:
        failures.append(f"RSS {end_rss} MiB is not within 10 % of the start's {start_rss:.0f} MiB")
    if took is None:
        failures.append("SIGTERM did not end the server within 40 s")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
