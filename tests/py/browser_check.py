"""Drives wllm's pages in headless Chromium (tests/browser_tests.rs runs it):
the chat page streams a reply that names Paris and its Stop button aborts a
long reply on the server, the engine page shows 4
running requests and a non-empty block map while 4 requests run, and a trace
report renders with no console errors. Screenshots go to OUTDIR.
Usage: python3 browser_check.py BASE_URL REPORT_HTML OUTDIR"""
import json
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cdp  # noqa: E402

base, report, outdir = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
os.makedirs(outdir, exist_ok=True)


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}", flush=True)


def get_json(path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return json.load(r)


b = cdp.Browser()
try:
    # 1. The chat page, phone-width.
    p = b.new_page(width=390, height=844, mobile=True)
    p.navigate(base + "/")
    p.wait_for("document.getElementById('model').textContent !== 'connecting…'", 30, "the model name")
    p.eval("document.getElementById('temperature').value = '0'; document.getElementById('input').focus(); true")
    p.type_text("What is the capital of France?")
    p.eval("document.getElementById('send').click(); true")
    lengths = []
    end = time.time() + 120
    while time.time() < end:
        n = p.eval("(document.querySelector('.msg.assistant .text') || {textContent: ''}).textContent.length")
        if n and (not lengths or lengths[-1] != n):
            lengths.append(n)
        if p.eval("!!document.querySelector('.msg.assistant .stats')"):
            break
        time.sleep(0.03)
    reply = p.eval("document.querySelector('.msg.assistant .text').textContent")
    stats = p.eval("document.querySelector('.msg.assistant .stats').textContent")
    print(f"reply: {reply!r} ({stats}); lengths seen while streaming: {lengths}")
    check("Paris" in reply, "the chat reply names Paris")
    check(len(lengths) >= 3, f"the reply streamed ({len(lengths)} distinct lengths seen)")
    check("TTFT" in stats and "tokens/s" in stats, "the reply shows TTFT and tokens/s")
    check(p.eval("document.documentElement.scrollWidth <= window.innerWidth"), "no horizontal scroll at 390 px")
    check(p.eval("JSON.parse(localStorage.getItem('wllm.chat')).length") == 2, "the conversation is kept")
    p.screenshot(os.path.join(outdir, "chat.png"))
    # Stop: a long reply cut short in the page is aborted on the server too.
    p.eval("document.getElementById('maxtokens').value = '400'; document.getElementById('input').focus(); true")
    p.type_text("Write a very long story about a dragon.")
    p.eval("document.getElementById('send').click(); true")
    p.wait_for("document.querySelectorAll('.msg.assistant').length === 2 && "
               "document.querySelectorAll('.msg.assistant .text')[1].textContent.length > 20", 120, "the second reply")
    check(get_json("/engine/state")["num_running"] == 1, "the long reply is running")
    p.eval("document.getElementById('stop').click(); true")
    stopped = p.wait_for("(document.querySelectorAll('.msg.assistant .stats')[1] || {}).textContent", 30, "stop")
    check("stopped" in stopped, f"the reply says it was stopped: {stopped}")
    end = time.time() + 10
    while time.time() < end and get_json("/engine/state")["num_running"] > 0:
        time.sleep(0.2)
    check(get_json("/engine/state")["num_running"] == 0, "Stop aborted the request on the server")
    check(p.eval("!document.getElementById('send').disabled"), "the page takes a new message")
    check(p.errors() == [], f"no console errors on the chat page: {p.errors()}")

    # 2. The engine page while 4 requests run.
    def long_request(i):
        body = json.dumps({"prompt": f"Tell a long story about the number {i}.", "max_tokens": 160,
                           "ignore_eos": True, "temperature": 0}).encode()
        req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=600).read()

    threads = [threading.Thread(target=long_request, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    end = time.time() + 120
    while time.time() < end and get_json("/engine/state")["num_running"] < 4:
        time.sleep(0.2)
    e = b.new_page(width=1280, height=1000)
    e.navigate(base + "/engine")
    running = e.wait_for("document.getElementById('running-count').textContent === '4' && "
                         "document.querySelectorAll('#blockmap .blk.used').length", 30,
                         "4 running and a block map")
    check(running > 0, f"the engine page shows 4 running and {running} used blocks in the block map")
    check(e.wait_for("document.getElementById('timeline').width > 100", 10, "the timeline"), "the timeline is drawn")
    e.screenshot(os.path.join(outdir, "engine.png"))
    check(e.errors() == [], f"no console errors on the engine page: {e.errors()}")
    for t in threads:
        t.join(600)

    # 3. A trace report.
    r = b.new_page(width=1280, height=1100)
    r.navigate("file://" + report)
    cells = r.eval("document.querySelectorAll('#blockmap .blk').length")
    check(cells > 0, f"the report draws the block map ({cells} blocks)")
    check(r.eval("document.getElementById('timeline').width > 100"), "the report draws the timeline")
    r.screenshot(os.path.join(outdir, "report.png"))
    check(r.errors() == [], f"no console errors in the report: {r.errors()}")
finally:
    b.close()
print("browser check: ok")
