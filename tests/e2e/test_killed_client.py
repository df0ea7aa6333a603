#!/usr/bin/env python3
"""test_killed_client.py: clients that die in the middle of a stream.

A client process is SIGKILLed while its generate streams (alone, then four at
once, one of them on a session and one not streaming), and a client closes
its socket abruptly (RST) mid-stream. Each time, within two seconds status
shows 0 active and the KV free blocks back at their initial value; a killed
session turn is not committed; the daemon keeps serving.
"""
import os
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402

LONG = 1500
SETTLE_S = 2.0


def client_main(sock, mode, session, text):
    """The client process: starts a generate, says so after its first reply, then
    reads on (slowly) until it is killed."""
    c = rsd.Client(sock, timeout=60)
    c.call("hello", client="doomed-" + mode)
    kw = dict(max_tokens=LONG, temperature=0)
    if session:
        rid = c.start_generate(session=session, messages=[{"role": "user", "content": text}], **kw)
    elif mode == "nostream":
        rid = c.start_generate(prompt=text, stream=False, **kw)
    else:
        rid = c.start_generate(prompt=text, **kw)
    if mode != "nostream":
        r = c.next(rid)
        assert r["type"] == "token", r
    print("started", flush=True)
    while True:
        time.sleep(0.05)
        try:
            c.next(rid, 0.01)
        except TimeoutError:
            pass


def spawn(d, mode, text, session=""):
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--client", d.sock, mode, session, text],
                         stdout=subprocess.PIPE, stderr=sys.stderr)
    return p


def wait_started(p, what):
    line = p.stdout.readline().decode().strip()
    if line != "started":
        raise AssertionError("%s: the client process did not start (%r, exit %r)" % (what, line, p.poll()))


def active_within(c, n, seconds=5.0):
    """status' active count once it is n, or the last seen after seconds: the non-streaming client
    says it started when it has sent its request, which a loaded machine may admit a little later."""
    deadline = time.monotonic() + seconds
    while True:
        a = c.call("status")["active"]
        if a == n or time.monotonic() > deadline:
            return a
        time.sleep(0.02)


def kv_free(st):
    return {m["name"]: m["kv_free_blocks"] for m in st["models"]}


def settles(c, kv0):
    """Polls status until nothing is active and the KV pool is back; returns (seconds, status)."""
    t0 = time.monotonic()
    while True:
        st = c.call("status")
        if st["active"] == 0 and st["queued"] == 0 and kv_free(st) == kv0:
            return time.monotonic() - t0, st
        if time.monotonic() - t0 > SETTLE_S:
            return None, st
        time.sleep(0.02)


def check_settled(ck, c, kv0, what):
    t, st = settles(c, kv0)
    ok = ck.ok(t is not None, "%s: within %.0fs status shows 0 active and the KV pool back: active %d, "
               "queued %d, kv_free %r (initially %r)" % (what, SETTLE_S, st["active"], st["queued"], kv_free(st),
                                                        kv0))
    if ok:
        print("   %s: settled in %.2fs" % (what, t))
    g = c.generate(prompt="still serving?", max_tokens=4, temperature=0)
    ck.eq(g.finish, "length", "%s: the daemon keeps serving" % what)


def main():
    ck = Checks()
    with Daemon() as d:
        c = d.client(timeout=30)
        c.call("hello", client="observer")
        st = c.call("status")
        kv0 = kv_free(st)
        ck.eq(st["active"], 0, "idle at the start")
        lp, lm = rsd.long_prompt(c, tag="doomed"), rsd.long_prompt(c, messages=True, tag="doomed")
        check_settled(ck, c, kv0, "the probes")

        # 1. one streaming client SIGKILLed mid-stream
        p = spawn(d, "stream", lp)
        try:
            wait_started(p, "stream")
            st = c.call("status")
            ck.eq(st["active"], 1, "the doomed generate is active")
            ck.ok(kv_free(st) != kv0, "it holds KV blocks")
            ck.ok(any(x["client"] == "doomed-stream" for x in st["clients"]), "status lists the client")
            p.send_signal(signal.SIGKILL)
            p.wait()
        finally:
            p.kill()
        check_settled(ck, c, kv0, "SIGKILL mid-stream")
        ck.ok(not any(x["client"].startswith("doomed") for x in c.call("status")["clients"]),
              "the killed client is gone from status.clients")

        # 2. four at once: streaming, not streaming, a session turn
        sess = c.call("session.new", title="doomed session")["session"]["session"]
        procs = [spawn(d, "a", lp), spawn(d, "b", lp), spawn(d, "nostream", lp), spawn(d, "session", lm, sess)]
        try:
            for p, m in zip(procs, ("a", "b", "nostream", "session")):
                wait_started(p, m)
            ck.eq(active_within(c, 4), 4, "four doomed generates are active")
            for p in procs:
                p.send_signal(signal.SIGKILL)
            for p in procs:
                p.wait()
        finally:
            for p in procs:
                p.kill()
        # the session keeps its (uncommitted) cached sequence as a cache: drop it to compare
        # the pool, by deleting the session once its turn has been reaped
        t0 = time.monotonic()
        while c.call("status")["active"] != 0 and time.monotonic() - t0 < SETTLE_S:
            time.sleep(0.02)
        got = c.call("session.get", session=sess)
        ck.eq((got["session"]["turns"], got["turns"]), (0, []), "a killed session turn is not committed")
        c.call("session.delete", session=sess)
        check_settled(ck, c, kv0, "four clients SIGKILLed")

        # 3. a socket closed abruptly (RST) mid-stream, in this process
        s = d.client(timeout=30)
        rid = s.start_generate(prompt=lp, max_tokens=LONG, temperature=0)
        s.next(rid)
        s.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        check_settled(ck, c, kv0, "socket reset mid-stream")

        # 4. a client that stops reading and half-closes its side
        s = d.client(timeout=30)
        rid = s.start_generate(prompt=lp, max_tokens=LONG, temperature=0)
        s.next(rid)
        s.sock.shutdown(socket.SHUT_WR)
        time.sleep(0.1)
        s.close()
        check_settled(ck, c, kv0, "half-closed then closed mid-stream")
        c.close()
    return ck


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        rsd.main(main)
