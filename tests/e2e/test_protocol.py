#!/usr/bin/env python3
"""test_protocol.py: every op and every error code of libclient/PROTOCOL.md,
against residentd on a generated tiny model. After each bad input a fresh
client must still be served.

`internal` is not reachable from outside by design (a bug or a failed system
call in the daemon); it is not tested here.
"""
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, ProtoError, frame, raw_frame  # noqa: E402

import msgpack  # noqa: E402

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
GREEDY = dict(temperature=0)
LONG = 1500          # max_tokens of a generation that runs long enough to act on
LP = {}              # model name -> a prompt whose greedy reply runs long (rsd.long_prompt)
CTX = 2048           # the tiny model's context


def user(text):
    return [{"role": "user", "content": text}]


def serves(d, ck, what):
    """A fresh client still gets answers (and a short generation)."""
    try:
        with d.client(timeout=20) as c:
            c.call("hello", client="probe")
            g = c.generate(prompt="still there?", max_tokens=2, **GREEDY)
            ck.ok(g.finish == "length", "%s: the daemon still generates" % what)
    except Exception as e:  # noqa: BLE001
        ck.ok(False, "%s: a fresh client is not served: %r" % (what, e))


def packb_raw_str(obj):
    """msgpack with Python bytes packed as *str* (raw) objects, so that a
    string field can carry bytes that are not UTF-8."""
    body = msgpack.packb(obj, use_bin_type=False)
    return raw_frame(body)


def until_done(c, rid, timeout=30):
    """All replies of rid up to and including its done/error."""
    out = []
    while True:
        r = c.next(rid, timeout)
        out.append(r)
        if r["type"] in ("done", "error"):
            return out


def first_token(c, rid):
    r = c.next(rid)
    assert r["type"] == "token", "expected a token, got %r" % (r,)
    return r


# ----------------------------------------------------------------------------

def t_hello(d, ck):
    with d.client() as c:
        r = c.call("hello", client="test_protocol", version=1, some_future_key=[1, 2])
        ck.eq(r["version"], 1, "hello.version")
        ck.ok(isinstance(r.get("server"), str) and re.match(r"^residentd \d+\.\d+\.\d+$", r["server"]),
              "hello.server is 'residentd X.Y.Z': %r" % r.get("server"))
        ck.eq(r.get("max_frame"), 16 << 20, "hello.max_frame (default)")
        ck.eq(r.get("uid"), os.getuid(), "hello.uid")
        ck.ok(isinstance(r.get("capabilities"), list) and
              all(isinstance(x, str) for x in r["capabilities"]), "hello.capabilities is an array of str")
        # hello is optional, and a client may send it without any field
        r = c.call("hello")
        ck.eq(r["version"], 1, "hello without fields")
        # an id in any integer width: uint64 encoding of 7, and a large id
        body = b"\x82\xa2id\xcf" + struct.pack(">Q", 7) + b"\xa2op\xa5hello"
        c.send_raw(raw_frame(body))
        r = c.next(7)
        ck.eq(r["type"], "result", "id packed as uint64")
        big = (1 << 64) - 2
        r = c.result(c.request("hello", rid=big))
        ck.eq(r["id"], big, "a 64-bit id is echoed")


def t_generate(d, ck):
    with d.client() as c:
        prompt = "The quick brown fox"
        n_prompt = len(c.call("tokenize", text=prompt)["tokens"])
        # streaming (the default), prompt
        g = c.generate(prompt=prompt, max_tokens=8, **GREEDY)
        ck.eq(len(g.tokens), 8, "stream: one token reply per generated token (tiny vocab has no partial)")
        for t in g.tokens:
            ck.ok(isinstance(t.get("text"), str) and isinstance(t.get("token"), int) and "logprob" not in t,
                  "token reply fields: %r" % (t,))
        ck.eq(g.finish, "length", "finish at max_tokens")
        ck.ok("text" not in g.done, "done has no text when streaming")
        ck.ok("session" not in g.done, "done has no session without one")
        u = g.usage
        ck.eq(u.get("generated_tokens"), 8, "usage.generated_tokens")
        ck.eq(u.get("prompt_tokens"), n_prompt, "usage.prompt_tokens = tokens of the prompt")
        ck.ok(isinstance(u.get("cached_tokens"), int) and 0 <= u["cached_tokens"] <= u["prompt_tokens"],
              "usage.cached_tokens in [0, prompt_tokens]: %r" % (u,))
        ck.ok(isinstance(u.get("ttft_ms"), float) and u["ttft_ms"] >= 0, "usage.ttft_ms float")
        ck.ok(isinstance(u.get("tokens_per_s"), float) and u["tokens_per_s"] >= 0, "usage.tokens_per_s float")
        streamed = g.text
        # the same greedy request, not streamed: no token replies, the whole text in done
        rid = c.start_generate(prompt=prompt, max_tokens=8, stream=False, **GREEDY)
        replies = until_done(c, rid)
        ck.eq([r["type"] for r in replies], ["done"], "stream false: only done")
        ck.eq(replies[-1].get("text"), streamed, "stream false: done.text = the streamed text")
        # max_tokens 1
        g = c.generate(prompt=prompt, max_tokens=1, **GREEDY)
        ck.eq((g.finish, g.usage["generated_tokens"]), ("length", 1), "max_tokens 1")
        # messages, rendered with the chat template
        g = c.generate(messages=[{"role": "system", "content": "Be brief."}] + user("Hello!"),
                       max_tokens=6, **GREEDY)
        ck.ok(g.finish in ("length", "stop") and len(g.tokens) <= 6, "generate with messages")
        ck.ok(g.usage["prompt_tokens"] > len(c.call("tokenize", text="Be brief.Hello!")["tokens"]),
              "messages are rendered with a template (more tokens than the bare text)")
        # logprobs
        g = c.generate(prompt=prompt, max_tokens=6, logprobs=True, temperature=0.7, seed=3)
        ck.ok(len(g.tokens) > 0 and all(isinstance(t.get("logprob"), float) and t["logprob"] <= 1e-6
                                        for t in g.tokens), "logprobs: a float <= 0 in every token")
        g = c.generate(prompt=prompt, max_tokens=6, logprobs=True, **GREEDY)
        ck.ok(all(isinstance(t.get("logprob"), float) for t in g.tokens), "logprobs with greedy")
        # priority background still runs
        g = c.generate(prompt=prompt, max_tokens=3, priority="background", **GREEDY)
        ck.eq(g.finish, "length", "priority background")
        # integer where a float is expected, float32 floats
        g = c.generate(prompt=prompt, max_tokens=3, temperature=1, top_p=1, seed=1)
        ck.eq(g.finish, "length", "integers for float fields")
        c.send_raw(raw_frame(msgpack.packb({"id": 900, "op": "generate", "prompt": prompt, "max_tokens": 3,
                                            "temperature": 0.5, "top_p": 0.9, "min_p": 0.01},
                                           use_single_float=True)))
        ck.eq(c.collect(900).finish, "length", "float32 fields")


def t_seed(d, ck):
    with d.client() as c:
        kw = dict(prompt="Once upon a time", max_tokens=24, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
        a = c.generate(seed=1234, **kw)
        b = c.generate(seed=1234, **kw)
        ck.eq(b.ids, a.ids, "same seed at temperature 1: same tokens")
        ck.eq(b.text, a.text, "same seed: same text")
        others = [c.generate(seed=s, **kw).ids for s in (1, 2, 3)]
        ck.ok(any(o != a.ids for o in others), "other seeds give other samples")
        # two concurrent requests with the same seed still agree
        r1 = c.start_generate(seed=99, **kw)
        r2 = c.start_generate(seed=99, **kw)
        g1, g2 = c.collect(r1), c.collect(r2)
        ck.eq(g1.ids, g2.ids, "same seed, run concurrently: same tokens")


def t_stop(d, ck):
    with d.client() as c:
        base = dict(prompt="Stop strings are tested here", max_tokens=64, **GREEDY)
        full = c.generate(**base).text
        # a stop string of two printable ASCII characters that first occurs at k > 0
        k, s = None, None
        for i in range(1, len(full) - 1):
            cand = full[i:i + 2]
            if all(33 <= ord(ch) < 127 for ch in cand) and full.find(cand) == i:
                k, s = i, cand
                break
        if not ck.ok(s is not None, "a usable stop string in %r" % full):
            return
        g = c.generate(stop=[s], **base)
        ck.eq(g.finish, "stop", "a stop string ends with finish stop")
        ck.eq(g.text, full[:k], "the text ends right before the stop string %r" % s)
        g = c.generate(stop=[s], stream=False, **base)
        ck.eq(g.done.get("text"), full[:k], "stop string, not streamed")
        # the earliest of several stop strings wins; one that never occurs is harmless
        g = c.generate(stop=["\x07never\x07", s, full[k:k + 1] + "\x07"], **base)
        ck.eq(g.text, full[:k], "several stop strings")
        # 16 stop strings are allowed
        g = c.generate(stop=["zz%02d" % i for i in range(16)], max_tokens=4, prompt="x", **GREEDY)
        ck.ok(g.finish in ("length", "stop"), "16 stop strings are allowed")


def t_nul(d, ck):
    """A generated byte token <0x00> reaches the text (streamed, done, stored in
    the session) as U+FFFD: the whole reply is stored, not cut at a NUL (the
    soak test found stored replies cut there)."""
    with d.client() as c:
        nul = [i for i in range(256) if c.call("detokenize", tokens=[i])["text"] == "\x00"]
        if not ck.ok(len(nul) == 1, "the vocabulary has one token for the byte 0: %r" % nul):
            return
        # near-uniform sampling; the first seed whose reply holds that token (deterministic)
        for seed in range(1, 200):
            kw = dict(messages=user("nul %d" % seed), max_tokens=300, temperature=100, top_k=0, top_p=1.0,
                      min_p=0.0, seed=seed)
            if nul[0] in c.generate(**kw).ids:
                break
        else:
            ck.ok(False, "no seed in 1..199 generates the byte 0")
            return
        sid = c.call("session.new", title="nul")["session"]["session"]
        g = c.generate(session=sid, **kw)
        pieces = [t["text"] for t in g.tokens if t["token"] == nul[0]]
        ck.ok(pieces and all(p == "\ufffd" for p in pieces) and "\x00" not in g.text,
              "the byte 0 is streamed as U+FFFD: %r" % pieces)
        ck.eq(c.generate(stream=False, **kw).text, g.text, "and sent as U+FFFD in done's text")
        turns = c.call("session.get", session=sid)["turns"]
        ck.eq(turns[-1]["content"], g.text, "the whole reply is stored")


def t_cancel(d, ck):
    with d.client() as c:
        rid = c.start_generate(prompt=LP["tiny"], max_tokens=LONG, **GREEDY)
        first_token(c, rid)
        cid = c.request("cancel", target=rid)
        ck.eq(c.result(cid).get("type"), "result", "cancel of a running generate: result")
        reps = until_done(c, rid)
        ck.eq(reps[-1]["type"], "done", "the cancelled generate ends with done")
        ck.eq(reps[-1].get("finish"), "cancel", "finish cancel")
        ck.ok(reps[-1]["usage"]["generated_tokens"] < LONG, "it did stop early")
        # non-streamed cancel still gives done (with the partial text)
        rid = c.start_generate(prompt=LP["tiny"], max_tokens=LONG, stream=False, **GREEDY)
        c.result(c.request("cancel", target=rid))
        r = c.next(rid)
        ck.eq((r["type"], r.get("finish")), ("done", "cancel"), "cancel of a non-streamed generate")
        # an unknown target, and one that has finished
        ck.code(lambda: c.call("cancel", target=424242), "not_found", "cancel of an unknown target")
        ck.code(lambda: c.call("cancel", target=rid), "not_found", "cancel of a finished target")
        # the id of a finished request can be used again
        g = c.generate(rid=rid, prompt="again", max_tokens=2, **GREEDY)
        ck.eq(g.finish, "length", "an id is free again after its done")
        # a target of another connection is not found on this one
        with d.client() as other:
            rid = other.start_generate(prompt=LP["tiny"], max_tokens=LONG, **GREEDY)
            first_token(other, rid)
            ck.code(lambda: c.call("cancel", target=rid), "not_found", "cancel of another connection's id")
            other.call("cancel", target=rid)
            ck.eq(until_done(other, rid)[-1].get("finish"), "cancel", "cancel on its own connection")


def session_map_ok(ck, s, what):
    ck.ok(isinstance(s, dict), "%s: a session map" % what)
    for k, t in (("session", str), ("title", str), ("model", str), ("system", str), ("created", int),
                 ("updated", int), ("tokens", int), ("turns", int)):
        ck.ok(isinstance(s.get(k), t), "%s: field %s (%s) in %r" % (what, k, t.__name__, s))
    ck.ok(UUID.match(s.get("session", "")) is not None, "%s: uuid format %r" % (what, s.get("session")))


def t_sessions(d, ck):
    with d.client() as c:
        s = c.call("session.new", title="first", system="You are terse.")["session"]
        session_map_ok(ck, s, "session.new")
        ck.eq((s["title"], s["system"], s["model"], s["turns"], s["tokens"]),
              ("first", "You are terse.", "tiny", 0, 0), "session.new fields")
        ck.ok(abs(s["created"] - time.time()) < 60 and s["updated"] >= s["created"], "timestamps")
        sid = s["session"]
        s2 = c.call("session.new")["session"]
        ck.eq((s2["title"], s2["system"], s2["model"]), ("", "", "tiny"), "session.new defaults")
        ck.ok(s2["session"] != sid, "a new uuid per session")
        # a turn
        g = c.generate(session=sid, messages=user("Hi there"), max_tokens=5, **GREEDY)
        ck.eq(g.done.get("session"), sid, "done carries the session")
        r = c.call("session.get", session=sid)
        session_map_ok(ck, r["session"], "session.get")
        turns = r.get("turns", [])
        ck.eq([(t["role"], t["content"]) for t in turns], [("user", "Hi there"), ("assistant", g.text)],
              "session.get turns")
        ck.ok(all(isinstance(t.get("tokens"), int) for t in turns), "turn tokens are uints")
        ck.eq(r["session"]["turns"], 2, "session.turns after one exchange")
        ck.eq(r["session"]["tokens"], sum(t["tokens"] for t in turns), "session.tokens = sum of turns' tokens")
        ck.eq(turns[-1]["tokens"] if turns else None, g.usage["generated_tokens"], "assistant turn tokens")
        # list: both there, most recently updated first, limit/offset
        lst = c.call("session.list")["sessions"]
        ids = [x["session"] for x in lst]
        ck.ok(sid in ids and s2["session"] in ids, "session.list has both")
        ck.ok(all(lst[i]["updated"] >= lst[i + 1]["updated"] for i in range(len(lst) - 1)),
              "session.list: most recently updated first")
        for x in lst:
            session_map_ok(ck, x, "session.list entry")
        ck.eq(len(c.call("session.list", limit=1)["sessions"]), 1, "session.list limit")
        ck.eq([x["session"] for x in c.call("session.list", limit=1, offset=1)["sessions"]], ids[1:2],
              "session.list offset")
        ck.eq(c.call("session.list", offset=100)["sessions"], [], "session.list past the end")
        # fork: same history, default title, own uuid; it continues like its parent
        f = c.call("session.fork", session=sid)["session"]
        session_map_ok(ck, f, "session.fork")
        ck.ok(f["session"] != sid, "fork has its own uuid")
        ck.eq(f["title"], "first (fork)", "fork default title")
        ck.eq((f["turns"], f["tokens"], f["system"], f["model"]),
              (2, r["session"]["tokens"], "You are terse.", "tiny"), "fork copies the history")
        ft = c.call("session.get", session=f["session"])["turns"]
        ck.eq(ft, turns, "fork turns = parent turns")
        f2 = c.call("session.fork", session=sid, title="named")["session"]
        ck.eq(f2["title"], "named", "fork with a title")
        nxt = dict(messages=user("And then?"), max_tokens=6, **GREEDY)
        a = c.generate(session=f["session"], **nxt)
        b = c.generate(session=f2["session"], **nxt)
        ck.eq(b.text, a.text, "two forks continue alike")
        ck.eq(c.call("session.get", session=sid)["session"]["turns"], 2, "forking left the parent alone")
        # rename
        rn = c.call("session.rename", session=sid, title="renamed")["session"]
        ck.eq((rn["session"], rn["title"]), (sid, "renamed"), "session.rename result")
        ck.eq(c.call("session.get", session=sid)["session"]["title"], "renamed", "rename is stored")
        # delete
        r = c.call("session.delete", session=s2["session"])
        ck.eq(set(r) - {"id", "type", "_progress"}, set(), "session.delete result {}")
        ck.code(lambda: c.call("session.get", session=s2["session"]), "not_found", "get after delete")
        ck.code(lambda: c.call("session.delete", session=s2["session"]), "not_found", "delete twice")
        ck.code(lambda: c.generate(session=s2["session"], messages=user("x"), max_tokens=1),
                "not_found", "generate on a deleted session")
        ck.ok(s2["session"] not in [x["session"] for x in c.call("session.list")["sessions"]],
              "deleted session not listed")
        # sampling defaults of a session apply to fields a request leaves out
        sd = c.call("session.new", defaults={"max_tokens": 3, "temperature": 0})["session"]
        ck.eq(sd.get("defaults", {}).get("max_tokens"), 3, "session defaults appear in the session map")
        g = c.generate(session=sd["session"], messages=user("Tell me a long story"))
        ck.ok(g.usage["generated_tokens"] <= 3, "session default max_tokens applies: %r" % g.usage)
        g = c.generate(session=sd["session"], messages=user("More"), max_tokens=5)
        ck.ok(3 < g.usage["generated_tokens"] <= 5 or g.finish == "stop", "a request overrides a default")
        # a session with prompt is bad_request; unknown session is not_found
        ck.code(lambda: c.generate(session=sid, prompt="raw", max_tokens=1), "bad_request",
                "session with prompt")
        missing = "00000000-0000-4000-8000-000000000000"
        for op, kw in (("session.get", {}), ("session.fork", {}), ("session.rename", {"title": "x"}),
                       ("session.delete", {})):
            ck.code(lambda: c.call(op, session=missing, **kw), "not_found", "%s of an unknown uuid" % op)
        ck.code(lambda: c.generate(session=missing, messages=user("x"), max_tokens=1), "not_found",
                "generate on an unknown session")
        try:
            c.call("session.get", session="not-a-uuid")
            ck.ok(False, "session.get of a malformed uuid succeeded")
        except ProtoError as e:
            ck.ok(e.code in ("not_found", "invalid_param"), "session.get of a malformed uuid: %s" % e.code)


def t_models(d, ck, tmp):
    with d.client() as c:
        ms = c.call("model.list")["models"]
        ck.eq(len(ms), 1, "one model configured")
        m = ms[0] if ms else {}
        for k, t in (("name", str), ("path", str), ("arch", str), ("format", str), ("size", int),
                     ("loaded", bool), ("default", bool)):
            ck.ok(isinstance(m.get(k), t), "model map field %s (%s) in %r" % (k, t.__name__, m))
        ck.eq((m.get("name"), m.get("arch"), m.get("format"), m.get("default"), m.get("loaded")),
              ("tiny", "llama", "gguf", True, True), "the default model")
        ck.eq(m.get("path"), d.model, "model path")
        # a second model by path, with progress
        p2 = rsd.gen_model(os.path.join(tmp, "second.gguf"), seed=2)
        rid = c.request("model.load", model=p2)
        prog = []
        while True:
            r = c.next(rid, 60)
            if r["type"] != "progress":
                break
            prog.append(r)
        ck.eq(r["type"], "result", "model.load result: %r" % (r,))
        ck.ok(all(isinstance(p.get("done"), int) and isinstance(p.get("total"), int) and
                  0 <= p["done"] <= p["total"] for p in prog), "progress {done, total}: %r" % prog[:3])
        ck.ok(all(prog[i]["done"] <= prog[i + 1]["done"] for i in range(len(prog) - 1)), "progress grows")
        print("   model.load sent %d progress replies" % len(prog))
        m2 = r.get("model", {})
        ck.eq((m2.get("name"), m2.get("path"), m2.get("loaded"), m2.get("default"), m2.get("format")),
              ("second", p2, True, False, "gguf"), "model.load result model map")
        names = {x["name"]: x for x in c.call("model.list")["models"]}
        ck.ok("second" in names and names["second"]["loaded"], "model.list shows the loaded model")
        # it serves, and differs from the default model (other weights)
        kw = dict(prompt="Which model?", max_tokens=8, **GREEDY)
        g1 = c.generate(**kw)
        g2 = c.generate(model="second", **kw)
        ck.eq(g2.finish, "length", "generate on the second model")
        ck.ok(g1.ids != g2.ids, "the second model is another model")
        ck.ok(len(c.call("tokenize", text="abc", model="second")["tokens"]) > 0, "tokenize on a named model")
        s = c.call("session.new", model="second")["session"]
        ck.eq(s["model"], "second", "session on the second model")
        g = c.generate(session=s["session"], messages=user("hi"), max_tokens=2, **GREEDY)
        ck.eq(g.finish, "length", "session generate on its model")
        # loading it again is fine (idempotent)
        r = c.call("model.load", model="second", timeout=60)
        ck.eq(r.get("model", {}).get("name"), "second", "model.load by name of a known model")
        # unload with a running generation: it ends with finish cancel
        rid = c.start_generate(model="second", prompt=rsd.long_prompt(c, model="second"), max_tokens=LONG, **GREEDY)
        first_token(c, rid)
        r = c.call("model.unload", model="second")
        ck.eq((r.get("unloaded"), r.get("cancelled"), r.get("model", {}).get("name"), r.get("model", {}).get("loaded")),
              (True, 1, "second", False), "model.unload result: %r" % (r,))
        ck.eq(until_done(c, rid)[-1].get("finish"), "cancel", "unload cancels running requests")
        r = c.call("model.unload", model="second")
        ck.eq((r.get("unloaded"), r.get("cancelled")), (False, 0), "model.unload of a model not loaded: %r" % (r,))
        names = {x["name"]: x for x in c.call("model.list")["models"]}
        ck.ok("second" not in names or not names["second"]["loaded"], "unloaded model is not loaded")
        # unknown names
        ck.code(lambda: c.call("model.load", model="no-such-model"), "not_found", "model.load unknown name")
        ck.code(lambda: c.call("model.unload", model="no-such-model"), "not_found", "model.unload unknown")
        ck.code(lambda: c.call("model.show", model="no-such-model"), "not_found", "model.show unknown")
        ck.code(lambda: c.generate(model="no-such-model", prompt="x", max_tokens=1), "not_found",
                "generate on an unknown model")
        ck.code(lambda: c.call("tokenize", model="no-such-model", text="x"), "not_found",
                "tokenize on an unknown model")
        ck.code(lambda: c.call("session.new", model="no-such-model"), "not_found",
                "session.new on an unknown model")
        # model_error: a corrupt file and a truncated one
        bad = os.path.join(tmp, "corrupt.gguf")
        with open(bad, "wb") as f:
            f.write(b"GGUF\x03\x00\x00\x00" + os.urandom(4096))
        ck.code(lambda: c.call("model.load", model=bad, timeout=60), "model_error", "model.load of a corrupt file")
        ck.code(lambda: c.call("model.show", model=bad), "model_error", "model.show of a corrupt file")
        trunc = os.path.join(tmp, "truncated.gguf")
        with open(p2, "rb") as f, open(trunc, "wb") as g:
            g.write(f.read(100000))
        ck.code(lambda: c.call("model.load", model=trunc, timeout=60), "model_error",
                "model.load of a truncated file")
        # a file that is no model leaves no model behind, however often it is named
        for _ in range(2):
            ck.code(lambda: c.call("model.show", model=bad), "model_error", "model.show of a corrupt file again")
            ck.code(lambda: c.generate(model=__file__, prompt="x", max_tokens=1), "model_error",
                    "generate on a Python file")
        names = [m["path"] for m in c.call("model.list")["models"]]
        ck.ok(bad not in names and os.path.abspath(__file__) not in names,
              "model.list holds no file that is no model: %r" % names)
        # error messages stay valid UTF-8 however long the path in them
        longpath = os.path.join(tmp, "\u00e9" * 120 + ".gguf")
        try:
            c.call("model.load", model=longpath)
            ck.ok(False, "model.load of a missing path succeeded")
        except ProtoError as e:
            ck.ok(e.code in ("not_found", "model_error"), "model.load of a missing path: %s" % e.code)
        except (ValueError, UnicodeDecodeError) as e:
            ck.ok(False, "model.load of a long non-ASCII path: the error is not valid UTF-8: %r" % e)
        ck.eq(c.generate(prompt="ok", max_tokens=2, **GREEDY).finish, "length", "default model unharmed")
    serves(d, ck, "after model errors")


SHOW_FIELDS = (("parameters", int), ("quantization", str), ("tensor_types", list), ("context", int),
               ("context_train", int), ("template", str), ("template_error", str), ("vocab", int),
               ("layers", int), ("embedding", int), ("heads", int), ("kv_heads", int), ("head_dim", int),
               ("feed_forward", int), ("sliding_window", int), ("memory_bytes", int), ("need_bytes", int))


def t_model_show(d, ck, tmp):
    """model.show of the loaded default model, and of files not loaded (GGUF Q4_K_M,
    safetensors BF16), which stay not loaded."""
    with d.client() as c:
        m = c.call("model.show")["model"]
        for k, t in SHOW_FIELDS + (("name", str), ("path", str), ("arch", str), ("format", str), ("size", int)):
            ck.ok(isinstance(m.get(k), t), "model.show field %s (%s) in %r" % (k, t.__name__, m))
        ck.eq((m.get("name"), m.get("loaded"), m.get("quantization"), m.get("template"), m.get("template_error")),
              ("tiny", True, "Q8_0", "llama3", ""), "model.show of the default model")
        ck.eq([m.get(k) for k in ("vocab", "embedding", "layers", "heads", "kv_heads", "head_dim", "feed_forward",
                                  "sliding_window", "context_train")],
              [1024, 256, 2, 4, 2, 64, 512, 0, 2048], "the tiny shape's hyperparameters (resident-model shapes)")
        types = m.get("tensor_types", [])
        ck.eq([t.get("type") for t in types], ["Q8_0", "F32"], "tensor types, most bytes first: %r" % types)
        ck.eq(sum(t.get("bytes", 0) for t in types), m.get("size"), "tensor type bytes add up to the size")
        # tiny: 1024 x 256 embedding and output, per layer 2 x 256 norm, 256 x (256 + 128 + 128 + 256)
        # attention, 3 x 256 x 512 feed-forward; the output norm
        ck.eq(m.get("parameters"), 2 * 1024 * 256 + 2 * (2 * 256 + 256 * 768 + 3 * 256 * 512) + 256,
              "parameters: the tensors' elements")
        ck.ok(0 < m.get("need_bytes", 0) <= m.get("memory_bytes", 0), "need_bytes <= memory_bytes: %r" % m)
        ck.eq(m.get("context"), 2048, "context as residentd runs it")
        ck.eq(c.call("model.show", model="tiny")["model"], m, "model.show by name is the default's")
        loads = c.call("status")["memory"]["loads"]
        q4 = rsd.gen_model(os.path.join(tmp, "show-q4.gguf"), seed=3, qtype="q4_k_m")
        m = c.call("model.show", model=q4)["model"]
        ck.eq((m.get("name"), m.get("path"), m.get("loaded"), m.get("device"), m.get("memory_bytes"),
               m.get("quantization"), [t.get("type") for t in m.get("tensor_types", [])]),
              ("show-q4", q4, False, "", 0, "Q4_K_M", ["Q4_K", "Q6_K", "F32"]), "model.show of a file not loaded")
        ck.ok(m.get("need_bytes", 0) > 0, "need_bytes of a model not loaded")
        st = os.path.join(tmp, "show-st")
        subprocess.run([rsd.tool("resident-model"), "gen", "tiny-qwen2", st, "--format", "safetensors", "--type",
                        "bf16", "--quiet"], check=True, stdout=subprocess.DEVNULL)
        m = c.call("model.show", model=st)["model"]
        ck.eq((m.get("format"), m.get("arch"), m.get("quantization"), m.get("template"), m.get("loaded")),
              ("safetensors", "qwen2", "BF16", "chatml", False), "model.show of a safetensors directory")
        ms = {x["name"]: x for x in c.call("model.list")["models"]}
        ck.ok(not ms.get("show-q4", {}).get("loaded", True) and not ms.get("show-st", {}).get("loaded", True),
              "model.show loads nothing, and the paths became known models: %r" % ms)
        ck.eq(c.call("status")["memory"]["loads"], loads, "no load counted")


def t_tokenize(d, ck):
    with d.client() as c:
        text = "Hello world, this is a tokenizer round trip. 123"
        toks = c.call("tokenize", text=text)["tokens"]
        ck.ok(len(toks) > 3 and all(isinstance(t, int) and t >= 0 for t in toks), "tokenize: uints")
        nobos = c.call("tokenize", text=text, bos=False)["tokens"]
        withbos = c.call("tokenize", text=text, bos=True)["tokens"]
        ck.eq(len(withbos), len(nobos) + 1, "bos true adds one token")
        ck.eq(withbos[1:], nobos, "bos is the first token")
        ck.eq(toks, withbos, "the tiny model wants a BOS by default")
        ck.eq(c.call("detokenize", tokens=nobos)["text"], text, "round trip")
        ck.eq(c.call("detokenize", tokens=toks)["text"], text, "special tokens are not rendered by default")
        sp = c.call("tokenize", text="<|eot_id|>", special=True, bos=False)["tokens"]
        ck.eq(len(sp), 1, "special true parses a special token")
        plain = c.call("tokenize", text="<|eot_id|>", special=False, bos=False)["tokens"]
        ck.ok(len(plain) > 1, "special false tokenizes its text")
        ck.eq(c.call("detokenize", tokens=sp, special=True)["text"], "<|eot_id|>", "detokenize special")
        ck.eq(c.call("detokenize", tokens=sp)["text"], "", "detokenize without special")
        ck.eq(c.call("detokenize", tokens=[])["text"], "", "detokenize []")
        ck.eq(c.call("tokenize", text="", bos=False)["tokens"], [], "tokenize ''")
        # a token sequence that ends inside a UTF-8 character
        e = c.call("tokenize", text="\u00e9\u00e9\u00e9", bos=False)["tokens"]
        for i in range(1, len(e)):
            t = c.call("detokenize", tokens=e[:i])["text"]
            ck.ok(t == "\u00e9" * (len(t)) or t.endswith("\ufffd"),
                  "a partial character at the end is U+FFFD: %r" % t)
        ck.code(lambda: c.call("detokenize", tokens=[10 ** 6]), "invalid_param",
                "detokenize of an id beyond the vocabulary")


def t_status(d, ck):
    with d.client() as c:
        c.call("hello", client="status-test")
        g = c.generate(prompt="count me", max_tokens=4, **GREEDY)
        st = c.call("status")
        ck.eq(st.get("version"), 1, "status.version")
        ck.ok(isinstance(st.get("uptime_s"), float) and st["uptime_s"] > 0, "status.uptime_s")
        ms = st.get("models", [])
        ck.ok(len(ms) >= 1, "status.models")
        for m in ms:
            for k, t in (("name", str), ("device", str), ("exact", bool), ("weights_bytes", int), ("kv_bytes", int),
                         ("kv_blocks", int), ("kv_free_blocks", int), ("active", int), ("queued", int)):
                ck.ok(isinstance(m.get(k), t), "status.models[] field %s (%s) in %r" % (k, t.__name__, m))
            if isinstance(m.get("kv_blocks"), int) and isinstance(m.get("kv_free_blocks"), int):
                ck.ok(0 <= m["kv_free_blocks"] <= m["kv_blocks"], "kv_free_blocks <= kv_blocks")
        me = [x for x in st.get("clients", []) if x.get("client") == "status-test"]
        ck.eq(len(me), 1, "status.clients has this client by its hello name")
        if me:
            ck.eq((me[0].get("pid"), me[0].get("uid")), (os.getpid(), os.getuid()), "client pid and uid")
            ck.ok(isinstance(me[0].get("requests"), int), "client requests")
        steps = st.get("steps", {})
        for k, t in (("count", int), ("tokens", int), ("max_batch", int), ("mean_batch", float)):
            ck.ok(isinstance(steps.get(k), t), "status.steps.%s (%s): %r" % (k, t.__name__, steps))
        ck.ok(steps.get("count", 0) >= g.usage["generated_tokens"], "steps counted")
        ck.eq((st.get("active"), st.get("queued")), (0, 0), "status active/queued when idle")
        # while a generation runs: active 1
        rid = c.start_generate(prompt=LP["tiny"], max_tokens=LONG, **GREEDY)
        first_token(c, rid)
        st = c.call("status")
        ck.eq(st.get("active"), 1, "status.active while generating")
        c.call("cancel", target=rid)
        until_done(c, rid)


def t_errors(d, ck):
    """The error codes a single daemon can produce."""
    # --- bad_frame: not msgpack, not a map, trailing bytes; the connection stays
    with d.client() as c:
        for what, body in (("not msgpack", b"\xc1\xc1\xc1"), ("garbage", b"hello, daemon"),
                           ("an array", msgpack.packb([1, "op"])), ("an int", b"\x05"),
                           ("a truncated map", msgpack.packb({"id": 1, "op": "hello"})[:-2]),
                           ("map + trailing bytes", msgpack.packb({"id": 3, "op": "hello"}) + b"\x00"),
                           ("2^19 objects", msgpack.packb({"id": 4, "op": "hello", "pad": [0] * (1 << 19)}))):
            c.send_raw(raw_frame(body))
            r = c.next(None)
            ck.eq((r["type"], r.get("code")), ("error", "bad_frame"), "bad_frame: %s" % what)
            ck.ok(isinstance(r.get("message"), str), "error message is a str")
        ck.eq(c.call("hello")["version"], 1, "the connection stays open after bad_frame")
        # a well-formed map is accepted whatever its unknown keys hold (ext, bin, nested)
        for rid, extra in ((31, msgpack.ExtType(3, b"abc")), (32, msgpack.ExtType(5, b"x" * 300)),
                           (33, msgpack.ExtType(1, b"")), (34, msgpack.ExtType(7, b"12345678")),
                           (35, b"\x00" * 70000), (36, [[{"a": [None, 1.5, True]}]])):
            c.send({"id": rid, "op": "hello", "zz_unknown": extra, "client": "ext"})
            r = c.any()
            ck.eq((r["id"], r["type"], r.get("code")), (rid, "result", None),
                  "a map with an unknown key holding %r is accepted" % (extra if len(repr(extra)) < 40 else
                                                                      type(extra).__name__,))
    serves(d, ck, "after bad_frame")

    # --- frame_too_large: refused before reading, then closed
    with d.client() as c:
        c.send_raw(struct.pack(">I", (16 << 20) + 1) + b"\x80" * 100)
        try:
            r = c.next(None, 10)
            ck.eq((r["type"], r.get("code")), ("error", "frame_too_large"), "frame_too_large")
            try:
                more = c.any(5)
                ck.ok(False, "the connection is closed after frame_too_large, got %r" % (more,))
            except rsd.Closed:
                pass
        except rsd.Closed:
            ck.ok(False, "frame_too_large: closed without the error reply")
    with d.client() as c:
        c.send_raw(struct.pack(">I", 0xFFFFFFFF))
        try:
            r = c.next(None, 10)
            ck.eq(r.get("code"), "frame_too_large", "a 4 GiB frame length")
        except rsd.Closed:
            ck.ok(False, "4 GiB frame: closed without the error reply")
    serves(d, ck, "after frame_too_large")

    # --- bad_request: missing fields, wrong types
    with d.client() as c:
        c.send({"op": "hello"})
        r = c.next(None)
        ck.eq((r.get("id"), r.get("code")), (None, "bad_request"), "a request without id: id nil")
        c.send({"id": "seven", "op": "hello"})
        r = c.next(None)
        ck.eq((r.get("id"), r.get("code")), (None, "bad_request"), "a string id: id nil, bad_request")
        c.send({"id": -3, "op": "hello"})
        r = c.next(None)
        ck.eq((r.get("id"), r.get("code")), (None, "bad_request"), "a negative id: id nil, bad_request")
        c.send({"id": 11})
        ck.eq(c.next(11).get("code"), "bad_request", "a request without op")
        c.send({"id": 12, "op": 5})
        ck.eq(c.next(12).get("code"), "bad_request", "op not a string")
        br = [
            ("generate", {}, "generate without prompt or messages"),
            ("generate", {"prompt": "a", "messages": user("b")}, "generate with prompt and messages"),
            ("generate", {"prompt": 5}, "prompt not a string"),
            ("generate", {"messages": "hi"}, "messages not an array"),
            ("generate", {"messages": ["hi"]}, "a message not a map"),
            ("generate", {"messages": [{"role": "user"}]}, "a message without content"),
            ("generate", {"messages": [{"content": "x"}]}, "a message without role"),
            ("generate", {"prompt": "a", "max_tokens": "5"}, "max_tokens a string"),
            ("generate", {"prompt": "a", "max_tokens": 2.5}, "max_tokens a float"),
            ("generate", {"prompt": "a", "temperature": "hot"}, "temperature a string"),
            ("generate", {"prompt": "a", "stream": 1}, "stream an int"),
            ("generate", {"prompt": "a", "logprobs": "yes"}, "logprobs a string"),
            ("generate", {"prompt": "a", "stop": "x"}, "stop a string"),
            ("generate", {"prompt": "a", "stop": [1]}, "a stop not a string"),
            ("generate", {"prompt": "a", "seed": "1"}, "seed a string"),
            ("generate", {"prompt": "a", "session": 12}, "session an int"),
            ("cancel", {}, "cancel without target"),
            ("cancel", {"target": "1"}, "target a string"),
            ("session.get", {}, "session.get without session"),
            ("session.fork", {}, "session.fork without session"),
            ("session.delete", {}, "session.delete without session"),
            ("session.rename", {"session": "00000000-0000-4000-8000-000000000000"}, "rename without title"),
            ("session.new", {"title": 3}, "title an int"),
            ("session.new", {"defaults": [1]}, "defaults an array"),
            ("session.list", {"limit": "3"}, "limit a string"),
            ("model.load", {}, "model.load without model"),
            ("model.unload", {}, "model.unload without model"),
            ("tokenize", {}, "tokenize without text"),
            ("tokenize", {"text": b"bytes"}, "text as bin"),
            ("tokenize", {"text": "x", "special": 1}, "special an int"),
            ("detokenize", {}, "detokenize without tokens"),
            ("detokenize", {"tokens": "1 2"}, "tokens a string"),
            ("hello", {"client": 1}, "client an int"),
        ]
        for op, kw, what in br:
            r = c.error(op, **kw)
            ck.eq(r.get("code"), "bad_request", "bad_request: " + what)
    serves(d, ck, "after bad_request")

    # --- unknown_op
    with d.client() as c:
        for op in ("nope", "Generate", "session.", "", "x" * 1000, "a" + "\u00e9" * 40):
            try:
                r = c.error(op)
                ck.eq(r.get("code"), "unknown_op", "unknown_op %r" % op[:20])
            except (ValueError, UnicodeDecodeError) as e:
                ck.ok(False, "unknown_op %r: the reply is not valid msgpack/UTF-8: %r" % (op[:20], e))
    serves(d, ck, "after unknown_op")

    # --- invalid_param: out-of-range values
    with d.client() as c:
        P = {"prompt": "a"}
        ip = [
            ({"max_tokens": -1}, "max_tokens -1"),
            ({"max_tokens": 0}, "max_tokens 0"),
            ({"max_tokens": CTX + 1}, "max_tokens beyond the context"),
            ({"max_tokens": 10 ** 12}, "max_tokens huge"),
            ({"max_tokens": (1 << 64) - 1}, "max_tokens 2^64-1"),
            ({"temperature": -1}, "temperature -1"),
            ({"temperature": 101}, "temperature 101"),
            ({"temperature": float("nan")}, "temperature nan"),
            ({"temperature": float("inf")}, "temperature inf"),
            ({"top_k": -1}, "top_k -1"),
            ({"top_k": 1 << 40}, "top_k huge"),
            ({"top_p": 0}, "top_p 0"),
            ({"top_p": 1.5}, "top_p 1.5"),
            ({"top_p": -0.5}, "top_p -0.5"),
            ({"min_p": 1}, "min_p 1"),
            ({"min_p": -0.1}, "min_p -0.1"),
            ({"repeat_penalty": 0}, "repeat_penalty 0"),
            ({"repeat_penalty": 10.5}, "repeat_penalty 10.5"),
            ({"presence_penalty": 11}, "presence_penalty 11"),
            ({"frequency_penalty": -10.5}, "frequency_penalty -10.5"),
            ({"seed": -1}, "seed -1"),
            ({"stop": ["s%d" % i for i in range(17)]}, "17 stop strings"),
            ({"stop": [""]}, "an empty stop string"),
            ({"stop": ["x" * 257]}, "a 257-byte stop string"),
            ({"priority": "urgent"}, "priority urgent"),
        ]
        for kw, what in ip:
            r = c.error("generate", **dict(P, **kw))
            ck.eq(r.get("code"), "invalid_param", "invalid_param: " + what)
        # refused when it arrives, before a model is looked up (or loaded, or waited for)
        r = c.error("generate", prompt="a", temperature=101, model="no-such-model")
        ck.eq(r.get("code"), "invalid_param", "invalid_param before the model: %r" % r.get("message"))
        for kw, what in ((dict(messages=[{"role": "robot", "content": "x"}]), "role robot"),
                         (dict(messages=[]), "messages []")):
            ck.eq(c.error("generate", **kw).get("code"), "invalid_param", "invalid_param: " + what)
        for op, kw, what in (("session.list", {"limit": -1}, "session.list limit -1"),
                             ("session.list", {"offset": -5}, "session.list offset -5"),
                             ("session.new", {"defaults": {"top_p": 0}}, "session defaults top_p 0"),
                             ("session.new", {"defaults": {"temperature": -1}}, "session defaults temperature -1"),
                             ("detokenize", {"tokens": [-1]}, "detokenize [-1]"),
                             ("cancel", {"target": -1}, "cancel target -1")):
            ck.eq(c.error(op, **kw).get("code"), "invalid_param", "invalid_param: " + what)
        # the boundaries that are allowed
        for kw in ({"top_p": 1}, {"min_p": 0}, {"temperature": 100}, {"repeat_penalty": 10},
                   {"presence_penalty": -10}, {"frequency_penalty": 10}, {"top_k": 0},
                   {"max_tokens": CTX}, {"seed": (1 << 64) - 1}, {"stop": ["x" * 256]}):
            rid = c.start_generate(prompt="edge", **kw)
            r = c.next(rid)
            ck.ok(r["type"] != "error", "allowed boundary %r: %r" % (kw, r))
            if r["type"] != "error":
                if r["type"] != "done":
                    c.call("cancel", target=rid)
                    until_done(c, rid)
    serves(d, ck, "after invalid_param")

    # --- invalid_utf8: a str object holding bytes that are not UTF-8
    with d.client() as c:
        bad = b"ab\xff\xfecd"
        for rid, obj, what in (
                (501, {"op": b"generate", "prompt": bad, "max_tokens": 1}, "prompt"),
                (502, {"op": b"generate", "messages": [{"role": b"user", "content": bad}], "max_tokens": 1},
                 "message content"),
                (503, {"op": b"generate", "prompt": b"x", "stop": [b"\xc3"], "max_tokens": 1}, "stop string"),
                (504, {"op": b"session.new", "title": bad}, "session title"),
                (505, {"op": b"session.new", "system": b"\xed\xa0\x80"}, "a surrogate in system"),
                (506, {"op": b"tokenize", "text": b"\xc0\xaf"}, "overlong encoding in text"),
                (507, {"op": b"hello", "client": bad}, "hello client"),
                (508, {"op": b"model.load", "model": bad}, "model name")):
            obj = dict(obj, id=rid)
            c.send_raw(packb_raw_str(obj))
            r = c.next(rid)
            ck.eq((r["type"], r.get("code")), ("error", "invalid_utf8"), "invalid_utf8: " + what)
    serves(d, ck, "after invalid_utf8")

    # --- not_found
    with d.client() as c:
        missing = "12345678-1234-4234-8234-123456789abc"
        ck.code(lambda: c.call("session.get", session=missing), "not_found", "not_found: unknown session")
        ck.code(lambda: c.generate(model="nope", prompt="x", max_tokens=1), "not_found",
                "not_found: unknown model")
        ck.code(lambda: c.call("cancel", target=99999), "not_found", "not_found: unknown request")

    # --- duplicate_id: two generates with one id in flight
    with d.client() as c:
        rid = 4242
        c.start_generate(rid=rid, prompt=LP["tiny"], max_tokens=LONG, **GREEDY)
        first_token(c, rid)
        c.start_generate(rid=rid, prompt="second", max_tokens=2, **GREEDY)
        c.request("status", rid=rid)
        errs, others = [], []
        # now cancel: the first one must end with done/cancel
        cid = c.request("cancel", target=rid)
        done = None
        while done is None:
            r = c.next(rid, 30)
            if r["type"] == "error":
                errs.append(r.get("code"))
            elif r["type"] == "done":
                done = r
            elif r["type"] != "token":
                others.append(r["type"])
        c.result(cid)
        ck.eq(errs, ["duplicate_id", "duplicate_id"], "duplicate_id for a generate and a status on a busy id")
        ck.eq(others, [], "nothing else answers to a duplicate id")
        ck.eq(done.get("finish"), "cancel", "the first request goes on until cancelled")
    serves(d, ck, "after duplicate_id")


def t_context(tmp, ck):
    """--ctx 64: context_exceeded, max_tokens limited by the context."""
    os.makedirs(os.path.join(tmp, "ctx"), exist_ok=True)
    with Daemon(extra=["--ctx", "64"], tmp=os.path.join(tmp, "ctx"), model=os.path.join(tmp, "tiny.gguf")) as d:
        with d.client() as c:
            long_prompt = " ".join("word%d" % i for i in range(200))
            ck.code(lambda: c.generate(prompt=long_prompt, max_tokens=1), "context_exceeded",
                    "context_exceeded: a long prompt")
            ck.code(lambda: c.generate(messages=user(long_prompt), max_tokens=1), "context_exceeded",
                    "context_exceeded: long messages")
            ck.code(lambda: c.generate(prompt="a", max_tokens=65), "invalid_param",
                    "max_tokens beyond --ctx 64")
            g = c.generate(prompt="short", max_tokens=64, **GREEDY)
            ck.ok(g.finish in ("context", "stop"), "generation that fills the context ends with finish "
                                                    "context: %r" % g.done)
            # a session whose history grows past the context
            s = c.call("session.new")["session"]["session"]
            finish = []
            try:
                for i in range(8):
                    g = c.generate(session=s, messages=user("turn %d" % i), max_tokens=20, **GREEDY)
                    finish.append(g.finish)
                ck.ok(False, "a session history beyond the context: no error after %r" % finish)
            except ProtoError as e:
                ck.eq(e.code, "context_exceeded", "a session history beyond the context")
        serves(d, ck, "after context_exceeded")


def t_overloaded(tmp, ck):
    """--max-queue 1 --max-seqs 1: one runs, one waits, the rest are overloaded."""
    os.makedirs(os.path.join(tmp, "ovl"), exist_ok=True)
    with Daemon(extra=["--max-queue", "1", "--max-seqs", "1"], tmp=os.path.join(tmp, "ovl"),
                model=os.path.join(tmp, "tiny.gguf")) as d:
        with d.client() as c:
            running = c.start_generate(prompt=LP["tiny"], max_tokens=LONG, **GREEDY)
            first_token(c, running)
            ids = [c.start_generate(prompt="more %d" % i, max_tokens=4, **GREEDY) for i in range(6)]
            results = {}
            # the overloaded ones fail at once; the queued one waits behind the running one
            deadline = time.monotonic() + 10
            while len(results) < len(ids) - 1 and time.monotonic() < deadline:
                for i in ids:
                    if i in results or not c.queues[i]:
                        continue
                    r = c.queues[i].popleft()
                    results[i] = r
                try:
                    r = c.any(1)
                    c.queues[r["id"]].appendleft(r)
                except TimeoutError:
                    pass
                # tokens of the running one
                while c.queues[running]:
                    c.queues[running].popleft()
            codes = sorted(r.get("code", r["type"]) for r in results.values())
            ck.ok(codes.count("overloaded") >= len(ids) - 1,
                  "overloaded: with one running and a queue of 1, %d of %d more are refused: %r" %
                  (codes.count("overloaded"), len(ids), codes))
            st = c.call("status")
            ck.ok(st.get("queued", 0) <= 1 and st.get("active", 0) <= 1, "status queued <= 1, active <= 1: "
                  "%r" % {k: st.get(k) for k in ("active", "queued")})
            m = st.get("models", [{}])[0]
            ck.eq((m.get("active"), m.get("queued")), (st.get("active"), st.get("queued")),
                  "the model's active and queued count what runs on it and what waits for it")
            c.call("cancel", target=running)
            # the waiting one, if any, now runs
            for i in ids:
                if i not in results:
                    g = c.collect(i)
                    ck.eq(g.finish, "length", "the queued request runs after the running one")
            # drain the cancelled one
            while True:
                r = c.next(running)
                if r["type"] == "done":
                    break
            ck.eq(r.get("finish"), "cancel", "the running one was cancelled")
        serves(d, ck, "after overloaded")


def t_shutdown(tmp, ck):
    """SIGTERM with a generation running: it ends with done finish cancel, a
    request read while the daemon drains is told shutting_down, and the daemon
    exits 0. To keep the daemon draining long enough for that request to be
    read, another client leaves a large reply unread (the daemon flushes
    output for a few seconds before it exits)."""
    os.makedirs(os.path.join(tmp, "shut"), exist_ok=True)
    d = Daemon(tmp=os.path.join(tmp, "shut"), model=os.path.join(tmp, "tiny.gguf"))
    with d:
        slow = d.client(timeout=20)
        c = d.client(timeout=20)
        # just under the 1 MiB text limit, two ids over 127 a character: ~1.7 MB of reply, never read
        slow.request("tokenize", text="\u4e2d" * 349525, bos=False)
        ck.ok(select.select([slow.sock], [], [], 20)[0], "the large reply has started")
        rid = c.start_generate(prompt=LP["tiny"], max_tokens=LONG, **GREEDY)
        first_token(c, rid)
        d.proc.send_signal(signal.SIGTERM)
        while True:
            r = c.next(rid, 20)
            if r["type"] != "token":
                break
        ck.eq((r["type"], r.get("finish")), ("done", "cancel"),
              "SIGTERM: the running generation ends with done finish cancel")
        try:
            late = c.request("hello")
            r = c.next(late, 20)
            ck.eq((r["type"], r.get("code")), ("error", "shutting_down"),
                  "a request read after SIGTERM is told shutting_down")
        except (OSError, rsd.Closed) as e:
            ck.ok(False, "the connection closed before the late request was answered: %r" % e)
        try:
            rsd.Client(d.sock, timeout=2).close()
            ck.ok(False, "new connections are refused while stopping")
        except OSError:
            pass
        slow.close()
        c.close()
        try:
            rc = d.proc.wait(20)
        except Exception:  # noqa: BLE001
            rc = None
        ck.eq(rc, 0, "exit status after SIGTERM")


def main():
    ck = Checks()
    with Daemon() as d:
        tmp = d.tmp
        with d.client() as c:
            LP["tiny"] = rsd.long_prompt(c)
        for name, fn in (("hello", t_hello), ("generate", t_generate), ("seed", t_seed), ("stop", t_stop),
                         ("nul", t_nul), ("cancel", t_cancel), ("sessions", t_sessions), ("tokenize", t_tokenize),
                         ("status", t_status), ("errors", t_errors)):
            with ck.section(name):
                fn(d, ck)
            if not d.alive():
                ck.ok(False, "the daemon died during %s:\n%s" % (name, d.log_text()[-3000:]))
                return ck
        with ck.section("models"):
            t_models(d, ck, tmp)
        with ck.section("model.show"):
            t_model_show(d, ck, tmp)
        with ck.section("context"):
            t_context(tmp, ck)
        with ck.section("overloaded"):
            t_overloaded(tmp, ck)
        with ck.section("shutdown"):
            t_shutdown(tmp, ck)
        ck.ok(d.alive(), "the main daemon is still alive at the end")
    return ck


if __name__ == "__main__":
    rsd.main(main)
