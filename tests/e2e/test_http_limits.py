#!/usr/bin/env python3
"""test_http_limits.py: resident-http against peers that would stall or
exhaust it, and the limits it states (man resident-http, LIMITS), over raw
sockets so that each peer does exactly what it is written to:

- a client that floods its connection while its reply streams leaves the
  bridge's resident memory (VmRSS) under 64 MiB, also after it left;
- a connection that sends nothing, half a request line, or a body a byte at
  a time is closed after --idle-timeout / --request-timeout (here 2 and 3
  s), and a kept-alive one once idle; a reply that takes longer (its daemon
  stopped meanwhile) is not cut;
- with residentd stopped (SIGSTOP) and a 2 MB request sent to it, other
  clients are answered within a second and SIGTERM ends the bridge; a bridge
  started meanwhile serves too;
- with the descriptors used up (RLIMIT_NOFILE lowered with prlimit) the
  bridge does not spin on accept() and keeps its listener: once the
  connections close, a request is answered;
- a request over the daemon's --max-frame is a 413 every time;
- an HTTP/1.0 stream (keep-alive asked for) has no Content-Length, no
  chunks, and ends with the connection closing;
- a client that leaves behind a pipelined request, before a reply that is
  not streamed, cancels its generation;
- failed requests for session "new" leave no session behind;
- session_busy and quota_exceeded are 409 and 429 (not 500s that clients
  retry);
- an error message cut to fit in the middle of a UTF-8 character comes back
  cut before it, not empty;
- --listen unix:PATH serves on a socket of mode 0600, removed at exit; it
  takes over a socket file nobody listens on, and refuses one in use and a
  file that is not a socket.

Needs no PyPI package but msgpack (rsd.py).
"""
import json
import os
import re
import resource
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402
from test_openai import LONG, MODEL, Bridge, user  # noqa: E402

IDLE, REQUEST = 2, 3            # the test bridge's --idle-timeout and --request-timeout
MAX_FRAME = 65536               # the second daemon's --max-frame
RSS_LIMIT = 64 << 20


def connect(b, timeout=10):
    s = socket.create_connection(("127.0.0.1", b.port))
    s.settimeout(timeout)
    return s


def post(path, obj, version="1.1", headers=""):
    body = json.dumps(obj).encode()
    return (b"POST %s HTTP/%s\r\nHost: localhost\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
            % (path.encode(), version.encode(), headers.encode(), len(body))) + body


def read_reply(s, timeout=30):
    """One whole HTTP/1.1 reply with a Content-Length: (status, head, body)."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"\r\n\r\n" not in data:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        d = s.recv(65536)
        if not d:
            break
        data += d
    head, _, body = data.partition(b"\r\n\r\n")
    n = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
             0)
    while len(body) < n:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        d = s.recv(65536)
        if not d:
            break
        body += d
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
    return status, head.decode("latin-1"), body


def request(b, data, timeout=30):
    with connect(b, timeout) as s:
        s.sendall(data)
        return read_reply(s, timeout)


def closed_after(s, limit):
    """Seconds until the peer closes s (reading and dropping what comes), or None if not within limit."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        s.settimeout(max(0.01, limit - (time.monotonic() - t0)))
        try:
            if not s.recv(65536):
                return time.monotonic() - t0
        except socket.timeout:
            return None
        except ConnectionResetError:
            return time.monotonic() - t0
    return None


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def models_ok(b, timeout=5):
    try:
        return request(b, b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n", timeout)[0] == 200
    except OSError:
        return False


def chat(content, **kw):
    return dict({"model": MODEL, "messages": user(content), "max_tokens": 8, "temperature": 0}, **kw)


def check_flood(ck, d, long_msgs):
    """A client that sends while its reply streams: what the bridge holds of it is bounded."""
    b = Bridge(d.sock)
    try:
        before = rss(b.proc.pid)
        s = connect(b)
        s.sendall(post("/v1/chat/completions", {"model": MODEL, "messages": long_msgs, "max_tokens": LONG,
                                                "temperature": 0, "stream": True}))
        ck.ok(s.recv(4096).startswith(b"HTTP/1.1 200"), "flood: the stream began")
        os.kill(d.proc.pid, signal.SIGSTOP)     # the stream stays open, sending nothing
        try:
            s.setblocking(False)
            sent, chunk, t0, peak = 0, b"x" * (1 << 20), time.monotonic(), 0
            while sent < (200 << 20) and time.monotonic() - t0 < 4:
                try:
                    sent += s.send(chunk)
                except BlockingIOError:
                    time.sleep(0.005)
                peak = max(peak, rss(b.proc.pid))
            peak = max(peak, rss(b.proc.pid))
            ck.ok(peak < RSS_LIMIT, "flood: %d MiB sent, the bridge's VmRSS stays under 64 MiB (%.1f MiB, %.1f "
                  "before)" % (sent >> 20, peak / 2**20, before / 2**20))
            s.close()
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        ck.ok(rsd.wait_for(lambda: models_ok(b), timeout=10), "flood: the bridge serves on")
        ck.ok(rss(b.proc.pid) < RSS_LIMIT, "flood: the bridge's VmRSS after the client left: %.1f MiB" % (
            rss(b.proc.pid) / 2**20))
    finally:
        ck.eq(b.stop(), 0, "flood: resident-http stops on SIGTERM with status 0")


def check_timeouts(ck, d, long_msgs):
    """Idle, half-sent and slow connections are closed after the stated timeouts; replies are not."""
    b = Bridge(d.sock, ["--idle-timeout", str(IDLE), "--request-timeout", str(REQUEST)])
    try:
        s = connect(b)
        t = closed_after(s, 10)
        ck.ok(t is not None and IDLE - 0.5 <= t <= IDLE + 1.5, "a connection that sends nothing is closed after "
              "--idle-timeout %d s (%s)" % (IDLE, t))
        s.close()

        s = connect(b)
        s.sendall(b"POST /v1/chat/comp")
        t = closed_after(s, 10)
        ck.ok(t is not None and REQUEST - 0.5 <= t <= REQUEST + 1.5, "half a request line: closed after "
              "--request-timeout %d s (%s)" % (REQUEST, t))
        s.close()

        # headers whole, the body a byte every 0.25 s: bytes keep coming, the request never ends in time
        s = connect(b)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n")
        t0, t = time.monotonic(), None
        while time.monotonic() - t0 < 10:
            try:
                s.send(b"{")
            except OSError:
                t = time.monotonic() - t0
                break
            got = closed_after(s, 0.25)
            if got is not None:
                t = time.monotonic() - t0
                break
        ck.ok(t is not None and REQUEST - 0.5 <= t <= REQUEST + 1.5, "a body trickled a byte at a time: closed "
              "after --request-timeout %d s (%s)" % (REQUEST, t))
        s.close()

        s = connect(b)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
        st, _, _ = read_reply(s)
        t = closed_after(s, 10)
        ck.ok(st == 200 and t is not None and IDLE - 0.5 <= t <= IDLE + 1.5,
              "a kept-alive connection is closed after --idle-timeout once idle (%d, %s)" % (st, t))
        s.close()

        # a reply that takes longer than the timeouts (the daemon stopped meanwhile) is not cut
        request(b, post("/v1/chat/completions", chat("warm")))
        s = connect(b, 30)
        s.sendall(post("/v1/chat/completions", chat("slow reply")))
        s2 = connect(b, 30)
        s2.sendall(post("/v1/chat/completions", chat("slow stream", stream=True)))
        time.sleep(0.3)
        os.kill(d.proc.pid, signal.SIGSTOP)
        time.sleep(REQUEST + IDLE + 0.5)
        os.kill(d.proc.pid, signal.SIGCONT)
        st, _, body = read_reply(s)
        ck.ok(st == 200 and json.loads(body)["choices"][0]["finish_reason"] in ("stop", "length"),
              "a reply made longer than the timeouts is whole (%d)" % st)
        data = b""
        while True:
            got = s2.recv(65536)
            if not got:
                break
            data += got
            if b"0\r\n\r\n" in data:
                break
        ck.ok(b"data: [DONE]" in data, "a stream made longer than the timeouts is whole")
        s.close()
        s2.close()
    finally:
        ck.eq(b.stop(), 0, "timeouts: resident-http stops on SIGTERM with status 0")


def timed_404(b):
    """(status or the error, seconds) of a GET of a route that does not exist."""
    t0 = time.monotonic()
    try:
        st = request(b, b"GET /nothing HTTP/1.1\r\nHost: localhost\r\n\r\n", timeout=5)[0]
    except OSError as e:
        st = repr(e)
    return st, time.monotonic() - t0


def check_daemon_stopped(ck, d):
    """A stopped daemon holds up its own requests only."""
    b = Bridge(d.sock)
    stopped = False
    try:
        ck.eq(request(b, post("/v1/chat/completions", chat("warm")))[0], 200, "daemon stopped: a request before")
        os.kill(d.proc.pid, signal.SIGSTOP)
        stopped = True
        big = socket.create_connection(("127.0.0.1", b.port))
        threading.Thread(target=lambda: big.sendall(post("/v1/chat/completions", chat("x" * (2 << 20)))),
                         daemon=True).start()
        time.sleep(0.5)
        st, t = timed_404(b)
        ck.ok(st == 404 and t < 1, "with the daemon stopped and a 2 MB request to it, another client is "
              "answered within a second (%s in %.2f s)" % (st, t))
        ck.eq(term(b), 0, "with the daemon stopped, SIGTERM ends the bridge at once")
        big.close()
        # a bridge that starts while the daemon is stopped serves too (its check of the daemon waits alone)
        b3 = Bridge(d.sock)
        try:
            st, t = timed_404(b3)
            ck.ok(st == 404 and t < 1, "a bridge started while the daemon is stopped answers within a second "
                  "(%s in %.2f s)" % (st, t))
            ck.eq(term(b3), 0, "and SIGTERM ends it at once, with status 0")
        finally:
            b3.stop()
    finally:
        if stopped:
            os.kill(d.proc.pid, signal.SIGCONT)
        b.stop()


def term(b):
    """SIGTERM: the bridge's exit status within 3 s, or None."""
    b.proc.send_signal(signal.SIGTERM)
    try:
        return b.proc.wait(3)
    except subprocess.TimeoutExpired:
        return None


def check_descriptors(ck, d):
    """Descriptors used up: accepting pauses (no spinning), and the listener stays."""
    b = Bridge(d.sock)
    socks = []
    try:
        resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE, (40, 40))
        for _ in range(80):
            socks.append(socket.create_connection(("127.0.0.1", b.port)))
        time.sleep(0.5)
        c0, t0 = cpu_seconds(b.proc.pid), time.monotonic()
        time.sleep(3)
        cpu = cpu_seconds(b.proc.pid) - c0
        ck.ok(cpu < 0.3 * (time.monotonic() - t0), "descriptors used up: the bridge does not spin (%.2f s of CPU in "
              "%.1f s)" % (cpu, time.monotonic() - t0))
        ck.ok(b.wait_log("cannot accept a connection") is not None, "descriptors used up: the bridge says so")
        for s in socks:
            s.close()
        socks = []
        ck.ok(rsd.wait_for(lambda: models_ok(b, 2), timeout=10), "once they are closed, a request is answered")
    finally:
        for s in socks:
            s.close()
        ck.eq(b.stop(), 0, "descriptors: resident-http stops on SIGTERM with status 0")


def check_max_frame(ck, d2):
    """A request over the daemon's --max-frame: 413 from the bridge itself, every time."""
    b = Bridge(d2.sock)
    try:
        # several times the socket's buffer: the daemon refused it while it was still being written
        got = [request(b, post("/v1/chat/completions", chat("y" * 300000))) for _ in range(20)]
        codes = [(st, json.loads(body)["error"]["code"] if body else None) for st, _, body in got]
        ck.eq(set(codes), {(413, "request_too_large")}, "20 requests over --max-frame: 413 request_too_large each")
        ck.ok("at most %d" % MAX_FRAME in json.loads(got[0][2])["error"]["message"], "the 413 says the limit")
        st, _, body = request(b, post("/api/chat", {"model": MODEL, "messages": user("y" * MAX_FRAME),
                                                    "stream": False}))
        ck.ok(st == 413 and "error" in json.loads(body), "Ollama's API: 413 too (%d)" % st)
        ck.eq(request(b, post("/v1/chat/completions", chat("small")))[0], 200, "a request under it is served")
    finally:
        ck.eq(b.stop(), 0, "max_frame: resident-http stops on SIGTERM with status 0")


def check_http10(ck, b):
    """An HTTP/1.0 stream: no chunks, no length, closed at its end (also with keep-alive asked for)."""
    for path, obj in (("/v1/chat/completions", chat("hi", stream=True)),
                      ("/api/chat", {"model": MODEL, "messages": user("hi"), "options": {"num_predict": 4}})):
        for conn in ("Connection: keep-alive\r\n", ""):
            what = "HTTP/1.0 %s%s" % (path, " keep-alive" if conn else "")
            with connect(b) as s:
                s.sendall(post(path, obj, "1.0", conn))
                data, closed = b"", False
                try:
                    while True:
                        got = s.recv(65536)
                        if not got:
                            closed = True
                            break
                        data += got
                except socket.timeout:
                    pass
            head, _, body = data.partition(b"\r\n\r\n")
            hl = head.lower()
            ck.ok(head.startswith(b"HTTP/1.0 200"), "%s: 200" % what)
            ck.ok(b"content-length" not in hl and b"chunked" not in hl, "%s: neither a length nor chunks: %r" % (
                what, head))
            ck.ok(closed, "%s: the connection is closed at the end" % what)
            if path.startswith("/v1/"):
                whole = body.endswith(b"data: [DONE]\n\n")
            else:
                whole = body.strip() != b"" and json.loads(body.strip().split(b"\n")[-1]).get("done") is True
            ck.ok(whole, "%s: the body is the whole stream (%r)" % (what, body[-80:]))


def check_pipelined_leave(ck, b, dc, long_msgs):
    """A client that leaves behind a pipelined request, before its reply (not streamed): its generation stops."""
    pat = r"the client left: generation cancelled after (\d+) tokens"
    before = len(re.findall(pat, b.text()))
    with connect(b) as s:
        s.sendall(post("/v1/chat/completions", {"model": MODEL, "messages": long_msgs, "max_tokens": LONG,
                                                "temperature": 0}))
        # the next request comes while the reply is made: once the daemon runs the generation, which on
        # a fast machine ends within a quarter of a second (a fixed sleep raced it)
        ck.ok(rsd.wait_for(lambda: dc.call("status")["active"] > 0, timeout=10, step=0.002),
              "the pipelined request's first runs in the daemon")
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
        time.sleep(0.02)
    ok = rsd.wait_for(lambda: len(re.findall(pat, b.text())) > before, timeout=20)
    n = [int(x) for x in re.findall(pat, b.text())][before:] if ok else []
    ck.ok(n and n[0] < LONG, "a client gone behind a pipelined request: its generation is cancelled (%s of %d "
          "tokens)" % (n, LONG))


def sessions(dc):
    return len(dc.call("session.list", limit=1000)["sessions"])


def check_failed_session_new(ck, b, dc):
    """Requests for a new session that fail leave none behind."""
    n0 = sessions(dc)
    bad = chat("x", temperature=500, session="new")
    got = [request(b, post("/v1/chat/completions", dict(bad, stream=i % 2 == 1)))[0] for i in range(4)]
    got += [request(b, post("/v1/chat/completions", dict(bad, session=None), headers="X-Resident-Session: new\r\n"))[0]
            for _ in range(2)]
    ck.eq(got, [400] * 6, "six requests for a new session that the daemon refuses: 400 each")
    ck.eq(sessions(dc), n0, "they leave no session behind")
    st, head, _ = request(b, post("/v1/chat/completions", chat("x", session="new")))
    ck.ok(st == 200 and "X-Resident-Session" in head and sessions(dc) == n0 + 1,
          "one that succeeds keeps its session (%d)" % st)


def check_error_mapping(ck, b, b2, dc, dc2, long_msgs):
    """The daemon's session_busy and quota_exceeded: 409 and 429, in OpenAI's shape."""
    sid = dc.call("session.new")["session"]["session"]
    rid = dc.start_generate(session=sid, messages=long_msgs, max_tokens=LONG, temperature=0, stream=True)
    dc.next(rid)
    st, _, body = request(b, post("/v1/chat/completions", chat("x", session=sid)))
    err = json.loads(body).get("error", {}) if body else {}
    ck.ok(st == 409 and err.get("code") == "session_busy", "session_busy: 409 (%d %s)" % (st, body[:200]))
    dc.call("cancel", target=rid)
    dc.collect(rid)
    # the second daemon keeps one session a user (--max-sessions 1): it has it
    while sessions(dc2) < 1:
        dc2.call("session.new")
    st, _, body = request(b2, post("/v1/chat/completions", chat("x", session="new")))
    err = json.loads(body).get("error", {}) if body else {}
    ck.ok(st == 429 and err.get("code") == "quota_exceeded", "quota_exceeded: 429 (%d %s)" % (st, body[:200]))


def check_utf8_cut(ck, b):
    """A message cut to fit is cut at a character boundary."""
    name = "a" + "\u00e9" * 400     # the message is cut within them, in the middle of a character
    st, _, body = request(b, post("/v1/chat/completions", chat("x", model=name)))
    msg = json.loads(body)["error"]["message"] if body else ""
    ck.ok(st == 404 and msg.startswith("the model 'a\u00e9\u00e9") and len(msg.encode()) >= 500,
          "OpenAI's API: a message cut mid-character keeps what fits (%d, %d bytes)" % (st, len(msg.encode())))
    st, _, body = request(b, post("/api/chat", {"model": name, "messages": user("x"), "stream": False}))
    msg = json.loads(body)["error"] if body else ""
    ck.ok(st == 404 and len(msg.encode()) >= 500, "Ollama's API: the same (%d, %d bytes)" % (st, len(msg.encode())))


def unix_listens(path):
    """Whether something accepts on the Unix socket path."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def unix_refused(ck, d, path, why, what):
    """A bridge on path exits 1 at once, saying why."""
    p = subprocess.run([rsd.tool("resident-http"), "--listen", "unix:" + path, "-s", d.sock],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10)
    ck.ok(p.returncode == 1 and why in p.stderr, "%s: refused (%d %s)" % (what, p.returncode, p.stderr.strip()))


def check_unix(ck, d):
    """--listen unix:PATH: a socket of mode 0600 that serves, removed at exit; a stale socket file is
    taken over, one in use and a file that is no socket are not."""
    path = os.path.join(d.tmp, "http.sock")
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(path)                # closed without unlinking: a socket file nobody listens on
    other = os.path.join(d.tmp, "http.file")
    with open(other, "w") as f:
        f.write("not a socket")
    unix_refused(ck, d, other, "a file that is not a socket is there", "a regular file at the path")
    ck.ok(os.path.exists(other), "the regular file is left as it was")
    log = tempfile.TemporaryFile()
    p = subprocess.Popen([rsd.tool("resident-http"), "--listen", "unix:" + path, "-s", d.sock],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        ok = rsd.wait_for(lambda: unix_listens(path) or p.poll() is not None, timeout=10) and p.poll() is None
        log.seek(0)
        ck.ok(ok, "--listen unix:PATH: it listens (%s)" % log.read().decode(errors="replace").strip()[-300:])
        if not ok:
            return
        st = os.stat(path)
        ck.ok(stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, "the socket's mode is 0600 (%o)" %
              stat.S_IMODE(st.st_mode))
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(path)
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
            code, _, body = read_reply(s)
        ck.ok(code == 200 and json.loads(body)["data"][0]["id"] == MODEL, "a request over it is served (%d)" % code)
        unix_refused(ck, d, path, "another program listens there", "a second bridge on the socket in use")
        ck.ok(os.path.exists(path), "the socket in use is left to its bridge")
        p.send_signal(signal.SIGTERM)
        ck.eq(p.wait(10), 0, "it stops on SIGTERM with status 0")
        ck.ok(not os.path.exists(path), "the socket is removed at exit")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def run():
    ck = Checks()
    with Daemon() as d, d.client(timeout=60) as dc:
        long_msgs = user(rsd.long_prompt(dc, LONG, messages=True))
        sub = os.path.join(d.tmp, "second")
        os.makedirs(sub)
        with Daemon(extra=["--max-frame", str(MAX_FRAME), "--max-sessions", "1"], tmp=sub, model=d.model) as d2, \
                d2.client(timeout=60) as dc2:
            b, b2 = Bridge(d.sock), Bridge(d2.sock)
            for name, fn in (("flood", lambda: check_flood(ck, d, long_msgs)),
                             ("timeouts", lambda: check_timeouts(ck, d, long_msgs)),
                             ("daemon stopped", lambda: check_daemon_stopped(ck, d)),
                             ("descriptors", lambda: check_descriptors(ck, d)),
                             ("max_frame", lambda: check_max_frame(ck, d2)),
                             ("HTTP/1.0", lambda: check_http10(ck, b)),
                             ("pipelined", lambda: check_pipelined_leave(ck, b, dc, long_msgs)),
                             ("session new", lambda: check_failed_session_new(ck, b, dc)),
                             ("error codes", lambda: check_error_mapping(ck, b, b2, dc, dc2, long_msgs)),
                             ("UTF-8", lambda: check_utf8_cut(ck, b)),
                             ("unix", lambda: check_unix(ck, d))):
                with ck.section(name):
                    fn()
            ck.eq(b.stop(), 0, "resident-http stops on SIGTERM with status 0")
            ck.eq(b2.stop(), 0, "the second resident-http stops on SIGTERM with status 0")
            if ck.failed:
                print(b.text()[-3000:])
    return ck


if __name__ == "__main__":
    rsd.main(run)
