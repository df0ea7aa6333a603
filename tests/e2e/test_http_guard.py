#!/usr/bin/env python3
"""test_http_guard.py: resident-http's door for web pages (contrib/http/guard.c),
with raw HTTP requests that carry the headers a browser would send, against
a real residentd on a generated tiny model.

What a page of another site can send without a preflight (a POST of
text/plain, an Origin of its own) is refused (403 by its Origin, 415 by its
type without one), and so is a body sent as a form (curl -d), with a message
that says what to send; a Host of a name pointed at this machine (DNS
rebinding) is refused (403) in the dialect of the route (OpenAI's error
object under /v1, Ollama's {"error": string} under /api), and so is an
Origin that --allow-origin does not name, preflight or not. An origin that
--allow-origin names goes through a real preflight (OPTIONS: 204, its
methods, the asked headers that are safe and no other, Max-Age; before the
API key is asked for) and then gets its completion with
Access-Control-Allow-Origin and Vary: Origin; --allow-origin '*' lets any
page in. Loopback names (localhost, *.localhost, 127.0.0.1, [::1]), the
bridge's own numeric host:port, a same-origin Origin, a request without
Host (HTTP/1.0) and --allow-host's name are answered. Malformed
--allow-origin and --allow-host values are usage errors.

Skips (exit 77) when curl is missing.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402
from test_openai import Bridge  # noqa: E402

MODEL = "tiny"
CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
                   "temperature": 0})
OLLAMA_CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "stream": False,
                          "options": {"num_predict": 4}})
PAGE = "http://localhost:3000"  # the origin --allow-origin names
JSON = "application/json"


def request(b, method, path, host="default", body=None, headers=None, version11=True):
    """One request on a connection of its own; host None sends none (as
    HTTP/1.0 may). Returns (status, headers as a dict of lowercase names,
    body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", b.port, timeout=60)
    if not version11:
        conn._http_vsn, conn._http_vsn_str = 10, "HTTP/1.0"
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    if host is not None:
        conn.putheader("Host", "127.0.0.1:%d" % b.port if host == "default" else host)
    for k, v in (headers or {}).items():
        conn.putheader(k, v)
    data = body.encode() if body is not None else None
    if data is not None:
        conn.putheader("Content-Length", str(len(data)))
    conn.endheaders(data)
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, text


def openai_error(ck, what, text, code):
    """OpenAI's error object, with the code; returns its message."""
    try:
        e = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        ck.ok(False, "%s: OpenAI's error object: %r" % (what, text[:300]))
        return ""
    ck.ok(isinstance(e, dict) and e.get("code") == code and isinstance(e.get("message"), str),
          "%s: OpenAI's error object with code %s: %r" % (what, code, e))
    return e.get("message", "") if isinstance(e, dict) else ""


def ollama_error(ck, what, text):
    """Ollama's {"error": string}; returns it."""
    try:
        e = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        e = None
    ck.ok(isinstance(e, str), "%s: Ollama's {\"error\": string}: %r" % (what, text[:300]))
    return e or ""


def completed(ck, what, st, text):
    ok = st == 200
    try:
        ok = ok and json.loads(text)["object"] == "chat.completion"
    except (ValueError, KeyError, TypeError):
        ok = False
    ck.ok(ok, "%s: a completion (%d %s)" % (what, st, text[:200]))


def check_cross_site(ck, b):
    """What a page of another site sends without a preflight."""
    evil = {"Origin": "http://evil.example", "Content-Type": "text/plain;charset=UTF-8"}
    st, _, text = request(b, "POST", "/v1/chat/completions", body=CHAT, headers=evil)
    ck.ok(st in (403, 415), "a cross-site text/plain POST is refused (%d)" % st)
    msg = openai_error(ck, "the cross-site POST", text, "origin_not_allowed")
    ck.ok("http://evil.example" in msg and "--allow-origin" in msg, "the refusal names the origin and the flag: " + msg)
    st, _, text = request(b, "POST", "/api/chat", body=OLLAMA_CHAT, headers=evil)
    ck.eq(st, 403, "a cross-site text/plain POST to /api/chat")
    ollama_error(ck, "/api/chat's refusal", text)

    # without an Origin (an old browser, a form): its type alone refuses it
    st, _, text = request(b, "POST", "/v1/chat/completions", body=CHAT, headers={"Content-Type": "text/plain"})
    ck.eq(st, 415, "a text/plain POST")
    msg = openai_error(ck, "a text/plain POST", text, "unsupported_media_type")
    ck.ok("application/json" in msg and "text/plain" in msg, "the 415 says what to send: " + msg)
    st, _, text = request(b, "POST", "/api/generate", body=json.dumps({"model": MODEL, "prompt": "hi"}),
                          headers={"Content-Type": "multipart/form-data; boundary=x"})
    ck.eq(st, 415, "a multipart form POST to /api/generate")
    ollama_error(ck, "/api/generate's 415", text)
    st, _, text = request(b, "POST", "/v1/embeddings", body=json.dumps({"model": MODEL, "input": "x"}),
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    ck.eq(st, 415, "a form POST to /v1/embeddings")
    r = subprocess.run(["curl", "-s", "--max-time", "60", "-w", "\n%{http_code}", b.url + "/chat/completions",
                        "-d", CHAT], capture_output=True, text=True, timeout=90)
    body, _, code = r.stdout.rpartition("\n")
    ck.eq(code, "415", "curl -d alone (a form's type)")
    ck.ok("-H 'Content-Type: application/json'" in body, "the 415 tells curl's users the flag: " + body[:300])

    # what is JSON: parameters, any case; and no type at all (many command line clients)
    for ctype in ("application/json; charset=utf-8", "Application/JSON", None):
        st, _, text = request(b, "POST", "/v1/chat/completions", body=CHAT,
                              headers={"Content-Type": ctype} if ctype else {})
        completed(ck, "Content-Type %s" % ctype, st, text)


def check_rebinding(ck, b):
    """A name of the attacker's, pointed at 127.0.0.1 after its page loaded."""
    host = "evil.example:%d" % b.port
    for headers in ({"Content-Type": JSON}, {"Content-Type": JSON, "Origin": "http://" + host}):
        st, _, text = request(b, "POST", "/v1/chat/completions", host=host, body=CHAT, headers=headers)
        ck.eq(st, 403, "Host %s (%s)" % (host, ", ".join(headers)))
        msg = openai_error(ck, "the rebinding Host", text, "host_not_allowed")
        ck.ok(host in msg and "--allow-host" in msg, "the refusal names the Host and the flag: " + msg)
    st, _, text = request(b, "POST", "/api/chat", host=host, body=OLLAMA_CHAT, headers={"Content-Type": JSON})
    ck.eq(st, 403, "Host %s on /api/chat" % host)
    ollama_error(ck, "/api/chat's refusal of the Host", text)
    for h in ("evil.example", "localhost.evil.example:%d" % b.port, "127.0.0.1.nip.io:%d" % b.port,
              "localhost.:%d" % b.port):
        st, _, _ = request(b, "GET", "/v1/models", host=h)
        ck.eq(st, 403, "Host %s" % h)
    st, _, _ = request(b, "GET", "/metrics", host=host)
    ck.eq(st, 403, "GET /metrics with Host %s" % host)


def check_disallowed_origin(ck, b):
    for origin in (PAGE, "http://127.0.0.1:%d" % (b.port + 1), "null", "https://127.0.0.1:%d" % b.port):
        st, head, text = request(b, "GET", "/v1/models", headers={"Origin": origin})
        ck.eq(st, 403, "GET /v1/models from a page of %s" % origin)
        ck.ok("access-control-allow-origin" not in head, "%s: no CORS header" % origin)
        openai_error(ck, origin, text, "origin_not_allowed")
    st, head, _ = request(b, "OPTIONS", "/v1/chat/completions",
                          headers={"Origin": PAGE, "Access-Control-Request-Method": "POST",
                                   "Access-Control-Request-Headers": "content-type"})
    ck.eq(st, 403, "a preflight from a page of %s" % PAGE)
    ck.ok("access-control-allow-origin" not in head and "access-control-allow-methods" not in head,
          "the refused preflight allows nothing: %r" % head)


def check_allowed_origin(ck, d, tmp):
    """--allow-origin PAGE (with an API key: the preflight carries none)."""
    key = os.path.join(tmp, "guard-key")
    with open(key, "w") as f:
        f.write("k3y\n")
    b = Bridge(d.sock, ["--allow-origin", PAGE + "/", "--allow-origin", "chrome-extension://abcdef",
                        "--api-key-file", key])
    try:
        st, head, text = request(b, "OPTIONS", "/v1/chat/completions", headers={
            "Origin": PAGE, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type, x-stainless-os,x-evil"})
        ck.eq(st, 204, "the preflight of an allowed origin")
        ck.eq(head.get("access-control-allow-origin"), PAGE, "preflight: Access-Control-Allow-Origin")
        ck.ok("origin" in head.get("vary", "").lower(), "preflight: Vary: Origin")
        methods = {m.strip() for m in head.get("access-control-allow-methods", "").split(",")}
        ck.ok({"GET", "POST", "OPTIONS"} <= methods, "preflight: the methods: %r" % methods)
        allowed = {h.strip().lower() for h in head.get("access-control-allow-headers", "").split(",")}
        ck.eq(allowed, {"authorization", "content-type", "x-stainless-os"},
              "preflight: the asked headers that are safe, and not x-evil")
        ck.ok(int(head.get("access-control-max-age", "0")) > 0, "preflight: Max-Age")
        ck.eq(text, "", "preflight: no body")

        hdrs = {"Origin": PAGE, "Content-Type": JSON, "Authorization": "Bearer k3y"}
        st, head, text = request(b, "POST", "/v1/chat/completions", body=CHAT, headers=hdrs)
        completed(ck, "the POST after the preflight", st, text)
        ck.eq(head.get("access-control-allow-origin"), PAGE, "the reply's Access-Control-Allow-Origin")
        ck.ok("origin" in head.get("vary", "").lower(), "the reply's Vary: Origin")
        st, head, _ = request(b, "POST", "/v1/chat/completions", body=CHAT, headers=dict(hdrs, Authorization="Bearer x"))
        ck.ok(st == 401 and head.get("access-control-allow-origin") == PAGE,
              "a wrong key: 401, readable by the page (%d, %r)" % (st, head.get("access-control-allow-origin")))
        st, head, text = request(b, "POST", "/api/chat", body=OLLAMA_CHAT, headers=hdrs)
        ck.ok(st == 200 and json.loads(text).get("done") is True and head.get("access-control-allow-origin") == PAGE,
              "/api/chat from the allowed origin (%d %s)" % (st, text[:200]))
        st, head, _ = request(b, "GET", "/v1/models", headers={"Origin": "chrome-extension://abcdef",
                                                                "Authorization": "Bearer k3y"})
        ck.ok(st == 200 and head.get("access-control-allow-origin") == "chrome-extension://abcdef",
              "a second --allow-origin (%d)" % st)
        st, _, _ = request(b, "POST", "/v1/chat/completions", body=CHAT, headers=dict(hdrs, Origin="http://localhost:3001"))
        ck.eq(st, 403, "another origin is still refused")
    finally:
        ck.eq(b.stop(), 0, "resident-http --allow-origin stops with 0")

    b = Bridge(d.sock, ["--allow-origin", "*"])
    try:
        ck.ok(b.wait_log(r"--allow-origin \* without --api-key-file"), "--allow-origin '*' without a key warns")
        for origin in ("http://evil.example", "null"):
            st, head, text = request(b, "POST", "/v1/chat/completions", body=CHAT,
                                     headers={"Origin": origin, "Content-Type": JSON})
            completed(ck, "--allow-origin '*': %s" % origin, st, text)
            ck.eq(head.get("access-control-allow-origin"), origin, "--allow-origin '*' echoes %s" % origin)
        st, _, _ = request(b, "POST", "/v1/chat/completions", body=CHAT,
                           headers={"Origin": "http://evil.example", "Content-Type": "text/plain"})
        ck.eq(st, 415, "--allow-origin '*': text/plain is still refused")
    finally:
        ck.eq(b.stop(), 0, "resident-http --allow-origin * stops with 0")


def check_known_hosts(ck, b):
    port = b.port
    for host in ("localhost:%d" % port, "LocalHost:%d" % port, "localhost", "app.localhost:%d" % port,
                 "127.0.0.1:%d" % port, "127.0.0.1", "[::1]:%d" % port, "[::1]"):
        st, _, _ = request(b, "GET", "/v1/models", host=host)
        ck.eq(st, 200, "GET /v1/models with Host %s" % host)
    st, _, text = request(b, "POST", "/v1/chat/completions", host="localhost:%d" % port, body=CHAT,
                          headers={"Content-Type": JSON})
    completed(ck, "a completion for Host localhost", st, text)
    st, _, _ = request(b, "GET", "/v1/models", host=None, version11=False)
    ck.eq(st, 200, "HTTP/1.0 without Host")


def check_own_host(ck, b):
    """The bridge's own numeric host:port, and a page of that origin (same origin)."""
    own = "127.0.0.1:%d" % b.port
    st, head, text = request(b, "POST", "/v1/chat/completions", host=own, body=CHAT,
                             headers={"Content-Type": JSON, "Origin": "http://" + own})
    completed(ck, "Host %s with Origin http://%s" % (own, own), st, text)
    st, _, _ = request(b, "POST", "/v1/chat/completions", host="localhost:%d" % b.port, body=CHAT,
                       headers={"Content-Type": JSON, "Origin": "http://" + own})
    ck.eq(st, 403, "Origin http://%s with Host localhost: another origin" % own)


def check_flags(ck, d):
    b = Bridge(d.sock, ["--allow-host", "myhost.lan", "--allow-host", "Other.Example"])
    try:
        for host, want in (("myhost.lan:%d" % b.port, 200), ("MYHOST.LAN", 200), ("other.example:80", 200),
                           ("sub.myhost.lan:%d" % b.port, 403)):
            st, _, _ = request(b, "GET", "/v1/models", host=host)
            ck.eq(st, want, "--allow-host: Host %s" % host)
    finally:
        ck.eq(b.stop(), 0, "resident-http --allow-host stops with 0")
    b = Bridge(d.sock, ["--allow-host", "*"])
    try:
        ck.ok(b.wait_log(r"--allow-host \* without --api-key-file"), "--allow-host '*' without a key warns")
        st, _, _ = request(b, "GET", "/v1/models", host="evil.example")
        ck.eq(st, 200, "--allow-host '*': any Host")
        st, _, _ = request(b, "GET", "/v1/models", host="evil.example", headers={"Origin": "http://evil.example"})
        ck.eq(st, 200, "--allow-host '*': the page of that Host is its own origin")
    finally:
        ck.eq(b.stop(), 0, "resident-http --allow-host * stops with 0")
    for flag, value in (("--allow-origin", "localhost:3000"), ("--allow-origin", "http://localhost:3000/app"),
                        ("--allow-origin", "http://"), ("--allow-host", "host:8080"),
                        ("--allow-host", "http://host"), ("--allow-host", "")):
        r = subprocess.run([rsd.tool("resident-http"), flag, value, "-s", d.sock], capture_output=True,
                           text=True, timeout=10)
        ck.ok(r.returncode == 2 and flag in r.stderr, "%s '%s': a usage error (%d %s)" %
              (flag, value, r.returncode, r.stderr.strip()))


def run():
    if shutil.which("curl") is None:
        raise Skip("curl is not installed (contrib/install-deps.sh)")
    ck = Checks()
    with Daemon() as d:
        b = Bridge(d.sock)
        try:
            for name, fn in (("a page of another site", lambda: check_cross_site(ck, b)),
                             ("DNS rebinding", lambda: check_rebinding(ck, b)),
                             ("an origin not allowed", lambda: check_disallowed_origin(ck, b)),
                             ("--allow-origin", lambda: check_allowed_origin(ck, d, d.tmp)),
                             ("loopback hosts", lambda: check_known_hosts(ck, b)),
                             ("the bridge's own host", lambda: check_own_host(ck, b)),
                             ("--allow-host and bad flags", lambda: check_flags(ck, d))):
                with ck.section(name):
                    fn()
        finally:
            ck.eq(b.stop(), 0, "resident-http stops on SIGTERM with status 0")
            if ck.failed:
                print(b.text()[-3000:])
    return ck


if __name__ == "__main__":
    rsd.main(run)
