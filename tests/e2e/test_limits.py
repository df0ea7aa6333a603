#!/usr/bin/env python3
"""test_limits.py: every bounded field of the protocol (PROTOCOL.md, Limits)
accepted at its limit and refused one byte (or one item) over it, with its
error code and a message that names the field; the sessions-per-uid quota,
also across a restart; the requests-in-flight limit of a connection; the
daemon's memory returned after a burst of large requests (RSS back near its
baseline; not measured under ASan, whose allocator keeps freed memory in
quarantine); more connections than the daemon has descriptors for: it
does not spin, serves the connections it has, and accepts again once some
close; one client over --max-clients: told overloaded (by the C client, the
CLI and the Python client too) while the others are served; frames received
together over a uid's share of the input budget: the last waits, unread,
until another is done, and its client's hang-up meanwhile frees its place;
and a frame that stops arriving midway: its connection closed
--frame-timeout after it began.
"""
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, ProtoError  # noqa: E402

sys.path.insert(0, os.path.join(rsd.common.srcdir(), "contrib", "python"))
import resident  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
TITLE, SYSTEM, TEXT, CLIENT, MODEL = 256, 64 * KiB, MiB, 64, 4096
TOKENS, MSGS, STOP, STOP_LEN, LIST, INFLIGHT = 1 << 18, 4096, 16, 256, 1000, 1024
# RSS may end this much above its baseline after the bursts (measured: 7.0 ->
# 8.1 MB; without residentd's fixed mmap threshold 7.0 -> 43.4 MB)
RSS_SLACK_MB = 12


def refused(ck, c, what, code, field, op, **fields):
    """op(**fields) must fail with code and a message that names field."""
    try:
        r = c.call(op, timeout=120, **fields)
    except ProtoError as e:
        ck.eq(e.code, code, what)
        return ck.ok(field in e.reply.get("message", ""), "%s: the message %r names %s" %
                     (what, e.reply.get("message"), field))
    return ck.ok(False, "%s: accepted: %r" % (what, r))


def accepted(ck, c, what, op, **fields):
    try:
        return c.call(op, timeout=120, **fields)
    except ProtoError as e:
        ck.ok(False, "%s: refused: %s" % (what, e))
        return None


def gen_refused(ck, c, what, field, **fields):
    """A generate that must be refused with invalid_param naming field."""
    try:
        g = c.generate(timeout=120, **fields)
        ck.ok(False, "%s: accepted: %r" % (what, g.done))
    except ProtoError as e:
        ck.eq(e.code, "invalid_param", what)
        ck.ok(field in e.reply["message"], "%s: the message %r names %s" % (what, e.reply["message"], field))


def gen_accepted(ck, c, what, **fields):
    """A generate at a limit: decoded and run (it may then not fit the context)."""
    try:
        g = c.generate(timeout=120, max_tokens=1, **fields)
        ck.ok(g.finish in ("length", "stop"), "%s: finish %s" % (what, g.finish))
    except ProtoError as e:
        ck.eq(e.code, "context_exceeded", what)


def exact(n):
    """A string of exactly n bytes of UTF-8, most of it multi-byte characters."""
    s = "\u4e2d" * (n // 3) + "a" * (n % 3)
    assert len(s.encode()) == n
    return s


def check_fields(ck, d):
    c = d.client(timeout=120)
    with ck.section("hello client"):
        name = exact(CLIENT)
        accepted(ck, c, "a client name of %d bytes" % CLIENT, "hello", client=name)
        st = c.call("status")
        ck.ok(any(k["client"] == name for k in st["clients"]), "status shows the %d-byte name whole" % CLIENT)
        refused(ck, c, "a client name of %d bytes" % (CLIENT + 1), "invalid_param", "client", "hello",
                client=exact(CLIENT + 1))
    with ck.section("titles"):
        s = accepted(ck, c, "a title of %d bytes" % TITLE, "session.new", title=exact(TITLE))
        refused(ck, c, "a title of %d bytes" % (TITLE + 1), "invalid_param", "title", "session.new",
                title=exact(TITLE + 1))
        refused(ck, c, "an 8 MiB title", "invalid_param", "title", "session.new", title="t" * (8 * MiB))
        if s is not None:
            u = s["session"]["session"]
            refused(ck, c, "a rename to %d bytes" % (TITLE + 1), "invalid_param", "title", "session.rename",
                    session=u, title=exact(TITLE + 1))
            refused(ck, c, "a fork titled %d bytes" % (TITLE + 1), "invalid_param", "title", "session.fork",
                    session=u, title=exact(TITLE + 1))
            f = accepted(ck, c, "a fork of a %d-byte title" % TITLE, "session.fork", session=u)
            if f is not None:
                t = f["session"]["title"]
                ck.ok(len(t.encode()) <= TITLE and t.endswith(" (fork)") and t.startswith("\u4e2d" * 10),
                      "the fork's title is cut to %d bytes: %d bytes, %r..." % (TITLE, len(t.encode()), t[-12:]))
    with ck.section("system prompt"):
        accepted(ck, c, "a system prompt of %d bytes" % SYSTEM, "session.new", system=exact(SYSTEM))
        refused(ck, c, "a system prompt of %d bytes" % (SYSTEM + 1), "invalid_param", "system prompt",
                "session.new", system=exact(SYSTEM + 1))
        refused(ck, c, "a 4 MiB system prompt", "invalid_param", "system prompt", "session.new",
                system="s" * (4 * MiB))
    with ck.section("generate"):
        gen_accepted(ck, c, "a prompt of %d bytes" % TEXT, prompt="p" * TEXT)
        gen_refused(ck, c, "a prompt of %d bytes" % (TEXT + 1), "prompt", prompt="p" * (TEXT + 1))
        half = [{"role": "user", "content": "m" * (TEXT // 2)}, {"role": "assistant", "content": "m" * (TEXT // 2)},
                {"role": "user", "content": "m"}]
        gen_refused(ck, c, "messages of %d bytes together" % (TEXT + 1), "messages", messages=half)
        half[-1]["content"] = ""
        gen_accepted(ck, c, "messages of %d bytes together" % TEXT, messages=half)
        gen_refused(ck, c, "one message of %d bytes" % (TEXT + 1), "content",
                    messages=[{"role": "user", "content": "m" * (TEXT + 1)}])
        many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(MSGS + 1)]
        gen_refused(ck, c, "%d messages" % (MSGS + 1), "messages", messages=many)
        gen_accepted(ck, c, "%d messages" % (MSGS - 1), messages=many[:MSGS - 1])
        gen_refused(ck, c, "%d stop strings" % (STOP + 1), "stop", prompt="x", stop=["s%d" % i for i in range(STOP + 1)])
        gen_refused(ck, c, "a stop string of %d bytes" % (STOP_LEN + 1), "stop", prompt="x",
                    stop=[exact(STOP_LEN + 1)])
        gen_accepted(ck, c, "%d stop strings of %d bytes" % (STOP, STOP_LEN), prompt="x",
                     stop=[exact(STOP_LEN - 1) + chr(97 + i) for i in range(STOP)])
        gen_refused(ck, c, "a model name of %d bytes" % (MODEL + 1), "model", prompt="x", model="m" * (MODEL + 1))
    with ck.section("tokenize, detokenize, lists"):
        r = accepted(ck, c, "a tokenize text of %d bytes" % TEXT, "tokenize", text="t" * TEXT)
        ck.ok(r is not None and len(r["tokens"]) > 0, "the %d-byte text was tokenized" % TEXT)
        refused(ck, c, "a tokenize text of %d bytes" % (TEXT + 1), "invalid_param", "text", "tokenize",
                text="t" * (TEXT + 1))
        accepted(ck, c, "%d token ids" % TOKENS, "detokenize", tokens=[5] * TOKENS)
        refused(ck, c, "%d token ids" % (TOKENS + 1), "invalid_param", "tokens", "detokenize", tokens=[5] * (TOKENS + 1))
        refused(ck, c, "model.load of a path of %d bytes" % (MODEL + 1), "invalid_param", "model", "model.load",
                model="/" + "m" * MODEL)
        accepted(ck, c, "session.list limit %d" % LIST, "session.list", limit=LIST)
        refused(ck, c, "session.list limit %d" % (LIST + 1), "invalid_param", "limit", "session.list", limit=LIST + 1)
    c.close()


def cpu_ticks(pid):
    """User + system clock ticks the process has used."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def check_descriptors(ck):
    """A descriptor limit a few above what the daemon holds, and 40 connections more."""
    with ck.section("descriptors run out"), Daemon() as d:
        c = d.client()
        c.call("hello", client="first")
        pid = d.proc.pid
        n_open = len(os.listdir("/proc/%d/fd" % pid))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (n_open + 4, resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]))
        extra = []
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.sock)      # the backlog takes them whether or not they are accepted
            extra.append(s)
        time.sleep(0.5)
        t0 = cpu_ticks(pid)
        time.sleep(2)
        used = (cpu_ticks(pid) - t0) / os.sysconf("SC_CLK_TCK")
        ck.ok(used < 0.5, "out of descriptors, the daemon does not spin: %.2f s of CPU in 2 s" % used)
        ck.ok(c.call("status")["version"] == 1, "the open connection is served")
        for s in extra:
            s.close()
        c2 = rsd.wait_for(lambda: d.client(timeout=10), 10)
        ck.eq(c2.call("hello", client="after")["version"], 1, "a new client is served once descriptors are free")
        ck.ok("cannot accept a client" in d.log_text(), "the log says why clients were not accepted")
        c2.close()
        c.close()


def check_clients(ck):
    """--max-clients 4: a fifth connection is told overloaded and closed; the
    four are served; once one closes a new one is served."""
    with ck.section("max clients"), Daemon(extra=["--max-clients", "4"]) as d:
        cs = [d.client(hello="c%d" % i) for i in range(4)]
        with d.client() as extra:
            try:
                r = extra.any(10)
                ck.eq((r["id"], r["type"], r.get("code")), (None, "error", "overloaded"),
                      "the fifth client is told overloaded")
                ck.ok("--max-clients" in r.get("message", ""), "the message %r names the option" %
                      (r.get("message"),))
                extra.any(5)
                ck.ok(False, "the fifth connection is closed after overloaded")
            except rsd.Closed:
                pass
        cli = subprocess.run([rsd.tool("resident"), "--socket", d.sock, "status"], capture_output=True,
                             text=True, timeout=60)
        ck.ok(cli.returncode != 0 and "too many clients" in cli.stderr,
              "the CLI says why it was refused: %d %r" % (cli.returncode, cli.stderr.strip()))
        try:
            resident.Client(d.sock, timeout=30).close()
            ck.ok(False, "the Python client is refused")
        except resident.Overloaded as e:
            ck.ok("too many clients" in str(e), "the Python client raises Overloaded: %s" % e)
        ck.ok(all(c.call("status")["version"] == 1 for c in cs), "the four clients are served")
        cs.pop().close()
        c = rsd.wait_for(lambda: _served(d), 10)
        ck.ok(c is not None, "a client is served once one of the four has gone")
        ck.ok("refused: 4 clients connected" in d.log_text(), "the log says a client was refused")
        for x in cs + [c]:
            if x is not None:
                x.close()


def _served(d):
    """A new connection that gets a hello answered, or None."""
    c = d.client(timeout=10)
    try:
        c.call("hello", client="late")
        return c
    except (rsd.Closed, ProtoError, OSError):    # refused: the reply, or the hello's write on the closed socket
        c.close()
        return None


def big_hello(rid, n):
    """A hello frame of n bytes in all: an unknown field pads it (daemons ignore those)."""
    def body(pad):
        return rsd.msgpack.packb({"id": rid, "op": "hello", "pad": b"x" * pad}, use_bin_type=True)
    b = body(n - 4)
    b = body(n - 4 - (len(b) - (n - 4)))
    assert 4 + len(b) == n
    return struct.pack(">I", len(b)) + b


def check_input_budget(ck):
    """Two 16 MiB frames begun hold the half of the 64 MiB input budget one
    uid may: a third waits, unread, until one of them is done; a frame not
    whole --frame-timeout after it began ends its connection (frame_timeout);
    nothing stays reserved after."""
    # the timeout is well past the wait checked below, so that only the first frame's end can end that wait
    with ck.section("input budget"), Daemon(extra=["--frame-timeout", "8"]) as d:
        frames = [big_hello(1, 16 * MiB) for _ in range(3)]
        cs = [d.client() for _ in range(3)]
        for c, f in zip(cs[:2], frames):
            c.send_raw(f[:MiB])
        t_sent = time.monotonic()
        third = threading.Thread(target=cs[2].send_raw, args=(frames[2],), daemon=True)
        third.start()
        time.sleep(1.0)
        for c, what in ((cs[2], "the third frame waits while two frames hold the uid's budget"),
                        (cs[1], "a frame stopped midway is not given up before --frame-timeout")):
            try:
                r = c.any(0.3)
                ck.ok(False, "%s: got %r" % (what, r))
            except TimeoutError:
                ck.ok(True, what)
        cs[0].send_raw(frames[0][MiB:])
        ck.eq(cs[0].next(1, 30)["type"], "result", "the first frame, finished, is answered")
        t_done = time.monotonic()
        ck.eq(cs[2].next(1, 30)["type"], "result", "then the third is read and answered")
        ck.ok(time.monotonic() - t_done < 4.0, "the third goes on once the first is done (%.1f s)" %
              (time.monotonic() - t_done))
        third.join(30)
        try:
            r = cs[1].any(15)
            ck.eq((r["id"], r.get("code")), (None, "frame_timeout"), "a frame stopped midway: frame_timeout")
            cs[1].any(5)
            ck.ok(False, "the stopped frame's connection is closed")
        except rsd.Closed:
            pass
        ck.ok(time.monotonic() - t_sent < 20, "it ends soon after 8 s (%.1f s)" % (time.monotonic() - t_sent))
        ck.ok("was not whole 8 s after it began" in d.log_text(), "the log says why the connection was closed")
        late = [d.client() for _ in range(2)]
        for c in late:
            c.send_raw(big_hello(1, 16 * MiB))
        ck.ok(all(c.next(1, 10)["type"] == "result" for c in late),
              "two frames of 16 MiB later go through: nothing stayed reserved")
        for c in cs + late:
            c.close()


def check_waiting_hangup(ck):
    """--max-clients 3: two frames begun hold the uid's half of the input
    budget, a third client's frame waits unread; that client hangs up, and
    its place is free for a new client (the daemon watches a waiting
    connection for a hang-up; reading nothing, it would not see the EOF)."""
    with ck.section("a waiting client hangs up"), Daemon(extra=["--max-clients", "3"]) as d:
        cs = [rsd.wait_for(lambda: _served(d), 10) for _ in range(3)]  # the start's probe may hold a place a while
        for c in cs[:2]:
            c.send_raw(big_hello(1, 16 * MiB)[:MiB])
        time.sleep(0.5)
        cs[2].send_raw(big_hello(1, 16 * MiB)[:4096])   # less than the socket holds: the send does not block
        time.sleep(0.5)
        cs[2].close()
        c = rsd.wait_for(lambda: _served(d), 10)
        ck.ok(c is not None, "a client is served once the waiting one has hung up")
        for x in cs[:2] + [c]:
            if x is not None:
                x.close()


def check_quota(ck):
    """--max-sessions 3: the fourth session (new or fork) is refused, also after a restart."""
    with ck.section("sessions per uid"), Daemon(extra=["--max-sessions", "3"]) as d:
        c = d.client()
        uu = [c.call("session.new", title="q%d" % i)["session"]["session"] for i in range(3)]
        refused(ck, c, "a fourth session", "quota_exceeded", "sessions", "session.new", title="q3")
        refused(ck, c, "a fork as the fourth session", "quota_exceeded", "sessions", "session.fork", session=uu[0])
        ck.eq(len(c.call("session.list")["sessions"]), 3, "the refused ones were not created")
        c.close()
        d.stop()
        d.start()
        c = d.client()
        refused(ck, c, "a fourth session after a restart", "quota_exceeded", "sessions", "session.new")
        c.call("session.delete", session=uu[1])
        accepted(ck, c, "a session after one was deleted", "session.new", title="q4")
        c.close()


def check_inflight(ck, d):
    """INFLIGHT + 8 generates sent at once on one connection: the ones past the limit are overloaded."""
    with ck.section("requests in flight"):
        c = d.client(timeout=60)
        text = rsd.long_prompt(c, n=400)
        ids = list(range(1000, 1000 + INFLIGHT + 8))
        c.send_raw(b"".join(rsd.frame({"id": i, "op": "generate", "prompt": text, "max_tokens": 400,
                                       "temperature": 0, "stream": False}) for i in ids))
        over = 0
        for rid in ids[INFLIGHT:]:
            r = c.next(rid, 60)
            over += r["type"] == "error" and r["code"] == "overloaded" and "in flight" in r["message"]
        ck.eq(over, 8, "the 8 requests past %d in flight are refused as overloaded" % INFLIGHT)
        c.close()
        with d.client() as c2:
            ok = rsd.wait_for(lambda: c2.call("status")["queued"] == 0 and c2.call("status")["active"] == 0, 60)
            ck.ok(ok, "the hung-up connection's requests are gone from the queue")


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def burst(c):
    """Large requests, accepted and refused."""
    for op, kw in [("session.new", {"title": "t" * (15 * MiB)}), ("hello", {"client": "c" * (15 * MiB)}),
                   ("tokenize", {"text": "hello world " * (TEXT // 12)}),
                   ("detokenize", {"tokens": list(range(1000)) * (TOKENS // 1000)})]:
        try:
            c.call(op, timeout=120, **kw)
        except ProtoError:
            pass
    for kw in [{"prompt": "word " * (TEXT // 5)},
               {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "m%d " % i * 60}
                             for i in range(MSGS - 1)]}]:
        try:
            c.generate(timeout=120, max_tokens=1, **kw)
        except ProtoError:
            pass


def check_memory(ck, d):
    if os.environ.get("RESIDENT_ASAN"):
        print("-- memory: not measured under ASan (its allocator keeps freed memory)")
        return
    with ck.section("memory after large requests"):
        c = d.client(timeout=120)
        c.generate(prompt="warm up", max_tokens=4, temperature=0)
        time.sleep(0.3)
        base = rss_mb(d.proc.pid)
        after = []
        for _ in range(4):
            burst(c)
            after.append(rss_mb(d.proc.pid))
        time.sleep(0.3)
        end = rss_mb(d.proc.pid)
        print("   RSS: baseline %.1f MB, after each burst %s MB, at the end %.1f MB" %
              (base, " ".join("%.1f" % x for x in after), end))
        ck.ok(end <= base + RSS_SLACK_MB, "RSS returns near its baseline: %.1f MB -> %.1f MB (slack %d MB)" %
              (base, end, RSS_SLACK_MB))
        c.close()


def main():
    ck = Checks()
    with Daemon(extra=["--max-queue", "2048", "--max-seqs", "1"]) as d:
        check_memory(ck, d)     # first: its baseline is a daemon that saw no large request
        check_fields(ck, d)
        check_inflight(ck, d)
    check_quota(ck)
    check_descriptors(ck)
    check_clients(ck)
    check_input_budget(ck)
    check_waiting_hangup(ck)
    return ck


if __name__ == "__main__":
    rsd.main(main)
