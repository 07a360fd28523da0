"""A minimal Chrome DevTools Protocol client over --remote-debugging-pipe
(JSON messages separated by NUL on fds 3 and 4): standard library only, so
the browser tests need nothing but Debian's chromium."""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time


def find_chromium():
    for name in (os.environ.get("WLLM_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise SystemExit("no chromium found: install Debian's chromium (apt-get install -y chromium) "
                     "or set WLLM_CHROMIUM to a Chrome binary")


class Browser:
    def __init__(self):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds():
            # The child reads commands on fd 3 and writes replies on fd 4.
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._profile = tempfile.mkdtemp(prefix="wllm-chromium-")
        args = [find_chromium(), "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                f"--user-data-dir={self._profile}", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=fds, pass_fds=(3, 4),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._next = 0
        self._replies = {}
        self.events = []
        self._cv = threading.Condition()
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        buf = b""
        while True:
            chunk = os.read(self._from_child, 1 << 16)
            if not chunk:
                with self._cv:
                    self._replies[None] = "closed"
                    self._cv.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                m = json.loads(msg)
                with self._cv:
                    if "id" in m:
                        self._replies[m["id"]] = m
                    else:
                        self.events.append(m)
                    self._cv.notify_all()

    def send(self, method, params=None, session=None, timeout=60):
        self._next += 1
        i = self._next
        msg = {"id": i, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        end = time.time() + timeout
        with self._cv:
            while i not in self._replies:
                if None in self._replies:
                    raise RuntimeError("chromium exited")
                left = end - time.time()
                if left <= 0:
                    raise TimeoutError(f"{method}: no reply in {timeout} s")
                self._cv.wait(left)
            r = self._replies.pop(i)
        if "error" in r:
            raise RuntimeError(f"{method}: {r['error']}")
        return r.get("result", {})

    def new_page(self, width=1280, height=900, mobile=False):
        t = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = self.send("Target.attachToTarget", {"targetId": t, "flatten": True})["sessionId"]
        for d in ("Page", "Runtime", "Log"):
            self.send(f"{d}.enable", session=s)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}, session=s)
        return Page(self, s)

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self._profile, ignore_errors=True)


class Page:
    def __init__(self, browser, session):
        self.b = browser
        self.s = session

    def navigate(self, url, timeout=60):
        start = len(self.b.events)
        self.b.send("Page.navigate", {"url": url}, self.s)
        end = time.time() + timeout
        while time.time() < end:
            if any(e.get("method") == "Page.loadEventFired" and e.get("sessionId") == self.s
                   for e in self.b.events[start:]):
                return
            time.sleep(0.05)
        raise TimeoutError(f"{url} did not load in {timeout} s")

    def eval(self, expr):
        r = self.b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True},
                        self.s)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr, timeout=120, what=None):
        end = time.time() + timeout
        while time.time() < end:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(0.1)
        raise TimeoutError(f"waited {timeout} s for {what or expr}")

    def type_text(self, text):
        self.b.send("Input.insertText", {"text": text}, self.s)

    def screenshot(self, path):
        data = self.b.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, self.s)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def errors(self):
        """Console errors and uncaught exceptions of this page so far."""
        out = []
        for e in self.b.events:
            if e.get("sessionId") != self.s:
                continue
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(p["exceptionDetails"].get("exception", {}).get("description")
                           or p["exceptionDetails"].get("text"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text"))
        return out
