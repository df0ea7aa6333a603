#!/usr/bin/env python3
"""test_http_browser.py: a real browser against resident-http's door for web
pages (contrib/http/guard.c). Headless Chromium loads a page served from
another origin (a small http.server on another port of 127.0.0.1) whose
script asks the bridge for a chat completion three ways: a POST of
text/plain (what any site may send without a preflight), the same in
no-cors mode (sent blind: the page cannot read the reply, but the model
would run) and a POST of JSON (preflighted). The page writes what it got
into its DOM, which Chromium dumps (--dump-dom, with a virtual time budget
that waits for the fetches).

Without --allow-origin every attempt fails in the page and the bridge
generates nothing (its log shows the 403s and no completion). With
--allow-origin for the page's origin, the JSON POST goes through
Chromium's own preflight and the page reads the completion, and the
text/plain POST gets a 415 that the page can read.

Skips (exit 77) where no Chromium is installed (the CI machine need not
have one: contrib/install-deps.sh does not install it).
"""
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402
from test_openai import Bridge  # noqa: E402

MODEL = "tiny"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

PAGE = """<!doctype html>
<html><head><title>pending</title></head><body><pre id="out">pending</pre>
<script>
const BRIDGE = %(bridge)s;
const CHAT = JSON.stringify({model: "tiny", messages: [{role: "user", content: "Hello"}], max_tokens: 4});
async function attempt(init) {
  try {
    const r = await fetch(BRIDGE + "/v1/chat/completions", Object.assign({method: "POST", body: CHAT}, init));
    return {status: r.status, type: r.type, body: await r.text()};
  } catch (e) {
    return {error: String(e)};
  }
}
(async () => {
  const out = {};
  out.text_plain = await attempt({headers: {"Content-Type": "text/plain"}});
  out.no_cors = await attempt({mode: "no-cors", headers: {"Content-Type": "text/plain"}});
  out.json = await attempt({headers: {"Content-Type": "application/json"}});
  document.getElementById("out").textContent = JSON.stringify(out);
  document.title = "done";
})();
</script></body></html>
"""


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class PageServer:
    """The page on a free port of 127.0.0.1: another origin than the bridge's."""

    def __init__(self, root):
        handler = functools.partial(Quiet, directory=root)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.origin = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def browse(browser, tmp, url, name):
    """Loads url in headless Chromium; returns what the page wrote (a dict), or None with the reason printed."""
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-extensions", "--user-data-dir=" + os.path.join(tmp, "profile-" + name),
                        "--virtual-time-budget=60000", "--dump-dom", url],
                       capture_output=True, text=True, timeout=180, errors="replace")
    m = re.search(r'<pre id="out">(.*?)</pre>', r.stdout, re.S)
    if m is None or m.group(1) == "pending":
        print("Chromium (exit %d) showed no result:\n%s\n%s" % (r.returncode, r.stdout[-2000:], r.stderr[-2000:]))
        return None
    return json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def completions(b):
    """The completions the bridge made (its log: a line per request)."""
    return len(re.findall(r"POST /v1/chat/completions 200", b.text()))


def run():
    browser = next((shutil.which(n) for n in BROWSERS if shutil.which(n)), None)
    if browser is None:
        raise Skip("no Chromium (%s) is installed: this test drives a real browser" % ", ".join(BROWSERS))
    ck = Checks()
    with Daemon() as d:
        root = os.path.join(d.tmp, "site")
        os.mkdir(root)
        site = PageServer(root)
        try:
            with ck.section("a page of another origin is refused"):
                b = Bridge(d.sock)
                with open(os.path.join(root, "refused.html"), "w") as f:
                    f.write(PAGE % {"bridge": json.dumps("http://127.0.0.1:%d" % b.port)})
                out = browse(browser, d.tmp, site.origin + "/refused.html", "refused")
                if ck.ok(out is not None, "the page ran its script"):
                    print("the page got:", json.dumps(out)[:1500])
                    for k in ("text_plain", "json"):
                        ck.ok("error" in out[k], "%s: the fetch fails in the page: %r" % (k, out[k]))
                    ck.eq(out["no_cors"].get("type"), "opaque", "no-cors: an opaque reply (sent blind)")
                ck.eq(completions(b), 0, "the bridge generated nothing for the page")
                ck.ok(len(re.findall(r"POST /v1/chat/completions 403 .*origin %s" % re.escape(site.origin),
                                     b.text())) >= 2, "the bridge logged the refusals of the page's POSTs")
                if ck.failed:
                    print(b.text()[-3000:])
                ck.eq(b.stop(), 0, "resident-http stops with 0")

            with ck.section("--allow-origin lets the page in"):
                b = Bridge(d.sock, ["--allow-origin", site.origin])
                with open(os.path.join(root, "allowed.html"), "w") as f:
                    f.write(PAGE % {"bridge": json.dumps("http://127.0.0.1:%d" % b.port)})
                out = browse(browser, d.tmp, site.origin + "/allowed.html", "allowed")
                if ck.ok(out is not None, "the page ran its script"):
                    print("the page got:", json.dumps(out)[:1500])
                    j = out["json"]
                    # a reply the page may read ("cors", not "opaque") is one CORS let through
                    ck.ok(j.get("status") == 200 and j.get("type") == "cors",
                          "the JSON POST, after Chromium's preflight: 200, read by the page: %r" % j)
                    try:
                        reply = json.loads(j.get("body", ""))
                        ck.ok(reply["object"] == "chat.completion" and
                              isinstance(reply["choices"][0]["message"]["content"], str),
                              "the page reads the completion")
                    except (ValueError, KeyError, IndexError, TypeError) as e:
                        ck.ok(False, "the page reads the completion: %r" % e)
                    t = out["text_plain"]
                    ck.ok(t.get("status") == 415 and "application/json" in t.get("body", "") and t.get("type") == "cors",
                          "text/plain from the allowed page: a 415 it can read: %r" % t)
                ck.eq(completions(b), 1, "the bridge made the one completion asked for as JSON")
                if ck.failed:
                    print(b.text()[-3000:])
                ck.eq(b.stop(), 0, "resident-http stops with 0")
        finally:
            site.close()
    return ck


if __name__ == "__main__":
    rsd.main(run)
