#!/usr/bin/env python3
"""test_badinput.py: bad input of every kind, each answered with its error
code, while a second client keeps generating successfully throughout.

Inputs: bytes that are not msgpack, frames over the limit (announced only,
and sent whole), a truncated frame then hang-up, wrong types, an unknown op,
missing fields, invalid UTF-8, negative and huge parameters, a prompt beyond
the context, an unknown session and model, and 1,000 connections opened and
dropped (before, in the middle of and after a frame, some with a generate in
flight). At the end status shows nothing active or queued, only the test's
own clients, and the KV pool back where it started.
"""
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, frame, raw_frame  # noqa: E402

import msgpack  # noqa: E402

MAX_FRAME = 65536
CTX = 256
N_CONNS = 1000


class Generator(threading.Thread):
    """The well-behaved client: generates again and again until told to stop."""

    def __init__(self, d):
        super().__init__(daemon=True)
        self.d = d
        self.stop = threading.Event()
        self.done = []      # (time, ok)
        self.errors = []
        self.first = None

    def run(self):
        try:
            with self.d.client(timeout=60) as c:
                c.call("hello", client="well-behaved")
                while not self.stop.is_set():
                    g = c.generate(prompt="A steady stream of text", max_tokens=16, temperature=0)
                    ok = g.finish == "length" and len(g.tokens) == 16
                    if self.first is None:
                        self.first = g.ids
                    ok = ok and g.ids == self.first
                    if not ok:
                        self.errors.append("unexpected result %r %r" % (g.done, g.ids))
                    self.done.append((time.monotonic(), ok))
        except Exception as e:  # noqa: BLE001
            self.errors.append(repr(e))

    def count_since(self, t):
        return sum(1 for (x, ok) in self.done if x >= t and ok)


def expect(ck, c, rid, code, what):
    try:
        r = c.next(rid, 30)
    except rsd.Closed:
        return ck.ok(False, "%s: the connection was closed instead of %s" % (what, code))
    return ck.eq((r["type"], r.get("code")), ("error", code), what)


def closed_after(c, timeout=5):
    """True if the daemon closes the connection (EOF or reset) without more replies."""
    try:
        r = c.any(timeout)
        return "got %r" % (r,)
    except rsd.Closed:
        return True
    except TimeoutError:
        return "still open after %ds" % timeout


def main():
    ck = Checks()
    with Daemon(extra=["--ctx", str(CTX), "--max-frame", str(MAX_FRAME)]) as d:
        with d.client() as probe:
            probe.call("hello", client="probe")
            kv0 = {m["name"]: m["kv_free_blocks"] for m in probe.call("status")["models"]}
            ck.eq(probe.call("hello")["max_frame"], MAX_FRAME, "hello reports --max-frame")
        gen = Generator(d)
        gen.start()
        rsd.wait_for(lambda: gen.done or gen.errors, 30)
        t_start = time.monotonic()

        with d.client() as c:
            # not msgpack
            for i, body in enumerate((b"\xc1", b"\xff" * 64, b"not msgpack at all", b"\x92\x01")):
                c.send_raw(raw_frame(body))
                expect(ck, c, None, "bad_frame", "bad_frame #%d" % i)
            # wrong types, missing fields, unknown op
            for rid, req, code, what in (
                    (10, {"op": "generate", "prompt": 42}, "bad_request", "prompt an int"),
                    (11, {"op": "generate", "prompt": "x", "stream": "yes"}, "bad_request", "stream a str"),
                    (12, {"op": "generate", "messages": {"role": "user"}}, "bad_request", "messages a map"),
                    (13, {"op": "session.get", "session": 7}, "bad_request", "session an int"),
                    (14, {"op": "detokenize", "tokens": [1, "two"]}, "invalid_param", "a token not a uint"),
                    (15, {"op": "generate"}, "bad_request", "generate without prompt"),
                    (16, {"op": "tokenize"}, "bad_request", "tokenize without text"),
                    (17, {"op": "session.rename", "session": "0badc0de-0000-4000-8000-000000000000"},
                     "bad_request", "rename without title"),
                    (18, {"op": "cancel"}, "bad_request", "cancel without target"),
                    (19, {"op": "launch"}, "unknown_op", "unknown op"),
                    (20, {"op": "generate", "prompt": "x", "max_tokens": -5}, "invalid_param", "max_tokens -5"),
                    (21, {"op": "generate", "prompt": "x", "max_tokens": 1 << 62}, "invalid_param",
                     "max_tokens 2^62"),
                    (22, {"op": "generate", "prompt": "x", "max_tokens": CTX + 1}, "invalid_param",
                     "max_tokens beyond the context"),
                    (23, {"op": "generate", "prompt": "x", "temperature": -1}, "invalid_param", "temperature -1"),
                    (24, {"op": "generate", "prompt": "x", "temperature": 1e300}, "invalid_param",
                     "temperature 1e300"),
                    (25, {"op": "generate", "prompt": "x", "top_p": 0}, "invalid_param", "top_p 0"),
                    (26, {"op": "generate", "prompt": "x", "top_k": -3}, "invalid_param", "top_k -3"),
                    (27, {"op": "generate", "prompt": "x", "seed": -(1 << 63)}, "invalid_param", "seed -2^63"),
                    (28, {"op": "session.list", "limit": 1 << 40}, "invalid_param", "limit 2^40"),
                    (29, {"op": "generate", "prompt": "x", "stop": ["a"] * 100}, "invalid_param",
                     "100 stop strings"),
                    (30, {"op": "generate", "prompt": " ".join("w%d" % i for i in range(2000))},
                     "context_exceeded", "a prompt beyond the context"),
                    (31, {"op": "generate", "messages": [{"role": "user", "content": "x " * 1000}]},
                     "context_exceeded", "messages beyond the context"),
                    (32, {"op": "session.get", "session": "0badc0de-0000-4000-8000-000000000000"}, "not_found",
                     "an unknown session"),
                    (33, {"op": "generate", "session": "0badc0de-0000-4000-8000-000000000000",
                          "messages": [{"role": "user", "content": "x"}]}, "not_found",
                     "generate on an unknown session"),
                    (34, {"op": "generate", "model": "nonexistent", "prompt": "x"}, "not_found", "an unknown model"),
                    (35, {"op": "model.unload", "model": "nonexistent"}, "not_found", "unload an unknown model")):
                c.send(dict(req, id=rid))
                expect(ck, c, rid, code, what)
            # invalid UTF-8 in a str object
            for rid, obj in ((40, {"op": b"generate", "prompt": b"\x80abc"}),
                             (41, {"op": b"tokenize", "text": b"ok\xe2\x82"}),
                             (42, {"op": b"session.new", "title": b"\xf8\x88\x80\x80\x80"})):
                c.send_raw(raw_frame(msgpack.packb(dict(obj, id=rid), use_bin_type=False)))
                expect(ck, c, rid, "invalid_utf8", "invalid_utf8 #%d" % rid)
            ck.eq(c.call("hello")["version"], 1, "the connection survived all of it")

        # the well-behaved client goes on (a generation completes after the bad input)
        ck.ok(rsd.wait_for(lambda: gen.count_since(t_start) >= 1 or gen.errors, 20) and not gen.errors,
              "the well-behaved client generates during the bad requests")

        # frames over the limit: announced only, and sent whole; then closed
        with d.client() as c:
            c.send_raw(struct.pack(">I", MAX_FRAME + 1))
            expect(ck, c, None, "frame_too_large", "frame_too_large (announced)")
            ck.eq(closed_after(c), True, "closed after frame_too_large")
        with d.client() as c:
            big = frame({"id": 1, "op": "generate", "prompt": "x" * (MAX_FRAME + 100)})
            try:
                c.send_raw(big)
            except OSError:
                pass  # the daemon may close before it has read it all
            try:
                expect(ck, c, None, "frame_too_large", "frame_too_large (sent whole)")
            except (ConnectionResetError, BrokenPipeError):
                ck.ok(False, "frame_too_large (sent whole): reset before the reply")
        with d.client() as c:
            c.send_raw(frame({"id": 1, "op": "tokenize", "text": "y" * (MAX_FRAME - 100)}))
            ck.ok(len(c.result(1)["tokens"]) > 0, "a frame just under the limit is fine")
        with d.client() as c:
            c.send_raw(struct.pack(">I", 0))
            r = c.next(None, 10)
            # PROTOCOL.md: N is at least 1; which code a 0 gets is not said
            ck.ok(r.get("code") in ("bad_frame", "frame_too_large"), "a frame of length 0: %r" % (r,))

        # a truncated frame, then hang-up (several shapes)
        for part in (b"\x00", b"\x00\x00\x00", struct.pack(">I", 100) + b"\x82\xa2id",
                     frame({"id": 1, "op": "generate", "prompt": "x"})[:-1]):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.sock)
            s.sendall(part)
            s.close()

        # 1,000 connections opened and dropped
        t_conns = time.monotonic()
        gen_req = frame({"id": 1, "op": "generate", "prompt": "gone", "max_tokens": 4, "temperature": 0})
        hello = frame({"id": 1, "op": "hello"})
        refused = 0
        for i in range(N_CONNS):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(d.sock)
                k = i % 5
                if k == 1:
                    s.sendall(gen_req[:2])                    # inside the length
                elif k == 2:
                    s.sendall(gen_req[:len(gen_req) // 2])    # inside the map
                elif k == 3:
                    s.sendall(gen_req)                        # a generate in flight, then gone
                elif k == 4:
                    s.sendall(hello + b"\xc1")                # a reply pending, a bad frame started
                if i % 50 == 0:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
            except OSError:
                refused += 1
            finally:
                s.close()
        ck.eq(refused, 0, "all %d connections were accepted" % N_CONNS)
        ck.ok(rsd.wait_for(lambda: gen.count_since(t_conns) >= 1 or gen.errors, 20) and not gen.errors,
              "the well-behaved client generates during the 1,000 connections")
        print("   %d connections in %.1fs" % (N_CONNS, time.monotonic() - t_conns))

        # the daemon stays responsive, and the well-behaved client kept going
        with d.client() as c:
            ck.eq(c.call("hello")["version"], 1, "a new client is served after the storm")
            gen.stop.set()
            gen.join(60)
            ck.eq(gen.errors, [], "the well-behaved client never failed")
            t_end = time.monotonic()
            print("   the well-behaved client: %d generations in %.2fs of bad input, %d during the "
                  "connections (%.2fs)" % (gen.count_since(t_start), t_end - t_start, gen.count_since(t_conns),
                                          t_end - t_conns))

            def settled():
                st = c.call("status")
                return st if st["active"] == 0 and st["queued"] == 0 else None
            st = rsd.wait_for(settled, 10) or c.call("status")
            ck.eq((st["active"], st["queued"]), (0, 0), "status: 0 active, 0 queued at the end")
            ck.eq([m.get("active") for m in st["models"]], [0] * len(st["models"]), "models[].active 0")

            def only_me():
                st = c.call("status")
                return st if len(st["clients"]) == 1 else None
            st = rsd.wait_for(only_me, 10) or c.call("status")
            ck.eq(len(st["clients"]), 1, "status lists only the one connected client: %r" % st["clients"][:5])
            kv = {m["name"]: m["kv_free_blocks"] for m in st["models"]}
            ck.eq(kv, kv0, "KV free blocks back to where they started")
    return ck


if __name__ == "__main__":
    rsd.main(main)
