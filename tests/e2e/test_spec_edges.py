#!/usr/bin/env python3
"""test_spec_edges.py: speculative decoding at its edges, through the daemon
on the CPU backend (the GPU's, in exact mode: test_gpu_spec.py) with
generated models. Each output with guesses (lookup, or a draft model,
generate's `draft`; `speculative` "on", so that every step guesses) is
compared with the same request with `speculative` "off": greedy output must be the same token ids, text, finish
and count (libclient/PROTOCOL.md, "Speculative decoding"). The drafts: the
daemon's model itself (on the CPU, and the GPU in exact mode, a token's
logits do not depend on the step, so every guess is accepted: runs of 8
tokens a step) and the same model cut to its first layer (same vocabulary,
guesses that often fail).

1. Sessions: four turns of messages on four sessions, with guesses off,
   with lookup and with either draft, the same replies turn by turn; then the
   daemon restarts, and a fifth turn on each, its KV read from disk (the
   disk tier's hits counted), is the same again.
2. Several choices (n = 3) at temperature 0, streamed and not, with a
   repeat penalty too: each choice is its `off` output, and all are equal.
3. Stop strings that end inside a run of accepted guesses (one token's text,
   two tokens' across their boundary), and max_tokens at the ends of runs
   and inside them: the same text, ids and finish, and no guess drafted past
   max_tokens.
4. A request with a draft cancelled before its first token and after it, a
   client that hangs up mid-stream with a draft: the others' outputs are
   their own, the daemon goes on, and every KV block of the model and of the
   draft comes back.
5. The daemon's model as its own draft, eight streams at once beside lookup
   and the other draft: each its output alone, every own guess accepted.
6. model.unload of the target while requests with a draft run: they end with
   cancel, the draft's blocks come back, and the next request runs. Under a
   --device-memory that holds the model but not the model and its draft, a
   request naming the draft is a model_error at once (not a request that
   waits for ever and holds every later one back), and the daemon goes on;
   where the memory the draft needs is held by another model in use, the
   request waits for it, then runs.
7. json_schema and grammar requests with guesses (lookup, draft, n = 2):
   valid output, the same as `off`, guesses made.
8. Bad drafts: an empty name (invalid_param, naming the parameter), a
   directory, a file that is no model, a cut GGUF file, a path that does not
   exist: each a clear error (and ignored with speculative "off"); none is
   left in status.
"""
import json
import os
import re
import shutil
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, ProtoError  # noqa: E402

DEVICE = rsd.test_device()
TIMEOUT = 120
# every step guesses: these are the mechanism's edges, not the measured choice of when to guess (guess.h)
ON = {"speculative": "on"}
PROMPTS = ["one two three four five one two three four five one two three",
           "the cat sat on the mat and the cat sat on the",
           "def f(x):\n    return x + 1\n\ndef f(x):\n    return",
           "red green blue red green blue red"]


def first_layer(tmp):
    """The tiny model cut to its first layer: the same vocabulary, a draft that often disagrees."""
    path = os.path.join(tmp, "other.gguf")
    return path if os.path.exists(path) else rsd.gen_model(path, seed=1, layers=1)


def model(c, name):
    return next(m for m in c.call("status")["models"] if m["name"] == name)


def same(ck, on, off, what, ids=True):
    """Two greedy generations (rsd.Gen) of one request, with guesses and without."""
    ck.eq(on.text, off.text, what + ": the same text")
    if ids:
        ck.eq(on.ids, off.ids, what + ": the same token ids")
    ck.eq(on.finish, off.finish, what + ": the same finish")
    ck.eq(on.usage["generated_tokens"], off.usage["generated_tokens"], what + ": the same token count")
    ck.ok(on.usage["accepted_tokens"] <= on.usage["drafted_tokens"], what + ": accepted at most drafted")


def modes(own, other):
    """The ways a request guesses, each with the fields that ask for it."""
    return [("lookup", ON), ("own draft", dict(ON, draft=own)), ("other draft", dict(ON, draft=other))]


# ---- 1. sessions

TURNS = ["Say one two three four five, then one two three four five again.",
         "And again: one two three four five.",
         "Now list red green blue red green blue.",
         "Repeat what you said before."]


def user(text):
    return [{"role": "user", "content": text}]


def check_sessions(ck, tmp):
    """Section 1."""
    other = first_layer(tmp)
    home = os.path.join(tmp, "sessions")
    os.makedirs(home)
    own = os.path.join(tmp, "tiny.gguf")
    kinds = [("off", {"speculative": "off"}), ("lookup", ON), ("draft", dict(ON, draft=other)),
             ("own", dict(ON, draft=own))]
    with Daemon(tmp=home, model=own, extra=DEVICE) as d:
        c = d.client(timeout=TIMEOUT)
        sids = {k: c.call("session.new", title=k, system="You repeat things.")["session"]["session"]
                for k, _ in kinds}
        drafted = {k: 0 for k, _ in kinds}
        for t, text in enumerate(TURNS):
            got = {k: c.generate(session=sids[k], messages=user(text), max_tokens=40, temperature=0, **kw)
                   for k, kw in kinds}
            for k, _ in kinds[1:]:
                same(ck, got[k], got["off"], "turn %d, %s" % (t + 1, k))
                drafted[k] += got[k].usage["drafted_tokens"]
        print("   tokens guessed over the turns: %r" % drafted)
        # whether a step guesses is measured (guess.h): the own draft's pay, lookup's on a random model seldom do
        ck.ok(drafted["own"] > 0, "the sessions' turns guessed: %r" % drafted)
        stored = {k: [(x["role"], x["content"]) for x in c.call("session.get", session=sids[k])["turns"]]
                  for k, _ in kinds}
        for k, _ in kinds[1:]:
            ck.eq(stored[k], stored["off"], "the %s session stores the same turns" % k)
        c.close()
        d.stop()
        d.start()
        c = d.client(timeout=TIMEOUT)
        hits0 = model(c, "tiny")["cache_disk_hit_tokens"]
        text = "Once more: one two three four five, one two three four five."
        # the own draft's session first: what it reads is the disk tier's, not the others' prefix cache
        got = {k: c.generate(session=sids[k], messages=user(text), max_tokens=60, temperature=0, **kw)
               for k, kw in reversed(kinds)}
        ck.ok(model(c, "tiny")["cache_disk_hit_tokens"] > hits0, "after the restart the turn's KV came from disk")
        for k, _ in kinds:
            ck.ok(got[k].usage["cached_tokens"] > 0, "after the restart %s's turn had its KV cached: %r"
                  % (k, got[k].usage))
        for k, _ in kinds[1:]:
            same(ck, got[k], got["off"], "after a restart, %s" % k)
        u = got["own"].usage
        ck.ok(u["drafted_tokens"] > 0 and u["accepted_tokens"] == u["drafted_tokens"],
              "after a restart the own draft's guesses all accepted: %r" % u)
        c.close()


# ---- 2. several choices

def choice_outputs(g, n, stream):
    """Each choice's (text, ids or None, finish, generated_tokens)."""
    chs = g.done["choices"]
    if stream:
        toks = g.by_choice(n)
        return [("".join(t["text"] for t in toks[i]), [t["token"] for t in toks[i]], chs[i]["finish"],
                 chs[i]["generated_tokens"]) for i in range(n)]
    return [(ch["text"], None, ch["finish"], ch["generated_tokens"]) for ch in chs]


def check_choices(ck, c, own, other):
    """Section 2."""
    drafted = 0
    for p, prompt in enumerate(PROMPTS[:3]):
        for stream, pen in ((True, {}), (False, {}), (True, {"repeat_penalty": 1.3})):
            req = dict(prompt=prompt, n=3, max_tokens=40, temperature=0, stream=stream, **pen)
            off = choice_outputs(c.generate(speculative="off", **req), 3, stream)
            ck.ok(off[0] == off[1] == off[2], "prompt %d off: the choices are equal at temperature 0" % p)
            for name, kw in modes(own, other):
                what = "prompt %d n=3 stream=%s %s%s" % (p, stream, name, " penalty" if pen else "")
                g = c.generate(**req, **kw)
                ck.eq(choice_outputs(g, 3, stream), off, what + ": each choice its off output")
                drafted += g.done["usage"]["drafted_tokens"]
    ck.ok(drafted > 0, "the choices guessed")


# ---- 3. stop strings and max_tokens inside a run of guesses

def check_stops(ck, c, own, other):
    """Section 3."""
    n_stop = n_mid = 0
    for p, prompt in enumerate(PROMPTS[:2]):
        full = c.generate(prompt=prompt, max_tokens=40, temperature=0, speculative="off")
        pieces = [t["text"] for t in full.tokens]
        for j in range(2, min(len(pieces) - 1, 22), 4):
            at = len("".join(pieces[:j]))
            # one token's text, and two tokens' cut inside both (the stop across their boundary)
            stops = [pieces[j], (pieces[j] + pieces[j + 1])[max(0, len(pieces[j]) - 2):len(pieces[j]) + 2]]
            for stop in stops:
                if stop.strip() == "" or full.text.find(stop) < 0:
                    continue
                req = dict(prompt=prompt, max_tokens=40, temperature=0, stop=[stop])
                off = c.generate(speculative="off", **req)
                n_stop += off.finish == "stop"
                for name, kw in modes(own, other):
                    g = c.generate(**req, **kw)
                    same(ck, g, off, "prompt %d stop %r (at %d) %s" % (p, stop, at, name))
                    if name == "own draft" and off.finish == "stop" and off.usage["generated_tokens"] % 8 != 1:
                        n_mid += 1
        # the own draft's steps settle tokens 1, 2-9, 10-17: the ends of runs and their middles
        for mt in (1, 2, 5, 8, 9, 10, 13, 17, 20):
            off = c.generate(prompt=prompt, max_tokens=mt, temperature=0, speculative="off")
            for name, kw in modes(own, other):
                g = c.generate(prompt=prompt, max_tokens=mt, temperature=0, **kw)
                same(ck, g, off, "prompt %d max_tokens %d %s" % (p, mt, name))
                # every own guess is accepted, and each step settles one more than it guessed after the
                # prompt's: more drafted than mt - 2 were guesses past max_tokens, drafted for nothing
                ck.ok(name != "own draft" or g.usage["drafted_tokens"] <= max(0, mt - 2),
                      "prompt %d max_tokens %d own draft: no guess past max_tokens: %r" % (p, mt, g.usage))
    print("   %d stopped by a stop string, %d of them inside a run of the own draft's guesses" % (n_stop, n_mid))
    ck.ok(n_stop > 0 and n_mid > 0, "stop strings ended generations, inside runs of guesses (%d, %d)" %
          (n_stop, n_mid))


# ---- 4. cancel and hang-up with a draft

def blocks(c, names):
    st = {m["name"]: m for m in c.call("status")["models"]}
    return [(st[n]["kv_free_blocks"], st[n]["active"]) for n in names]


LONG = 1800  # a reply this long is still running when the test acts on it (set_long)


def set_long(c, own):
    """LONG: the tokens the daemon makes in about half a second (200..1800) at its fastest (the model as its
    own draft, every guess accepted): still running when the test acts on it, and not minutes of a daemon
    under valgrind (tests/valgrind.sh)."""
    global LONG
    rate = max(c.generate(prompt=PROMPTS[0], max_tokens=200, temperature=0, **kw).usage["tokens_per_s"]
               for kw in ({"speculative": "off"}, dict(ON, draft=own)))
    LONG = int(min(1800, max(200, rate * 0.5)))


def long_prompts(c, n, tag):
    """n prompts whose greedy reply runs LONG tokens (rsd.long_prompt), found once a tag."""
    return [rsd.long_prompt(c, n=LONG, tag="%s %d" % (tag, i)) for i in range(n)]


def words(n):
    """A prompt of about 4n tokens (LONG // 5 words: a prompt longer than a step's 512 tokens, the draft's
    catching up a chunk a round, where the daemon is fast enough)."""
    return " ".join("w%d" % i for i in range(n))


def check_cancel(ck, d, c, own, other):
    """Section 4."""
    names = ["tiny", "other"]
    c.call("model.load", model=other)
    prompts = PROMPTS + long_prompts(c, 2, "cancel")
    alone = [c.generate(prompt=p, max_tokens=100, temperature=0, speculative="off").ids for p in PROMPTS]
    free0 = blocks(c, names)
    clients = [d.client(timeout=TIMEOUT) for _ in range(7)]
    out = [None] * 7
    errors = []

    def run(i):
        w = clients[i]
        try:
            if i < 4:
                out[i] = w.generate(prompt=prompts[i], max_tokens=100, temperature=0, speculative="on",
                                    draft=other)
                return
            # a long prompt's draft sequence prefills a chunk a round: cancelled while it catches up
            prompt = words(LONG // 5) if i == 6 else prompts[i]
            rid = w.start_generate(prompt=prompt, max_tokens=LONG, temperature=0, speculative="on",
                                   draft=own if i == 5 else other)
            w.next(rid, TIMEOUT)
            if i == 5:
                w.close()  # hangs up mid-stream
                return
            w.request("cancel", target=rid)
            out[i] = w.collect(rid, TIMEOUT)
        except Exception as e:  # noqa: BLE001 (reported)
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    ck.eq(errors, [], "no stream failed")
    for i in range(4):
        ck.eq(out[i].ids if out[i] else None, alone[i], "stream %d beside the cancels and the hang-up: its output" % i)
    for i in (4, 6):
        ck.eq(out[i].finish if out[i] else None, "cancel", "cancelled stream %d ends so" % i)
    # cancelled at once: before its prompt is in, or its draft's
    w = d.client(timeout=TIMEOUT)
    rid = w.start_generate(prompt=words(LONG // 5), max_tokens=100, temperature=0, speculative="on", draft=other)
    w.request("cancel", target=rid)
    ck.eq(w.collect(rid, TIMEOUT).finish, "cancel", "a cancel before the first token")
    w.close()
    ck.ok(rsd.wait_for(lambda: blocks(c, names) == free0, timeout=10),
          "every block of the model and of the draft back: %r, before %r" % (blocks(c, names), free0))
    g = c.generate(prompt=prompts[1], max_tokens=100, temperature=0, speculative="on", draft=other)
    ck.eq(g.ids, alone[1], "the daemon goes on with the draft")
    off = c.generate(prompt=words(LONG // 5), max_tokens=100, temperature=0, speculative="off")
    same(ck, c.generate(prompt=words(LONG // 5), max_tokens=100, temperature=0, speculative="on", draft=other), off,
         "a long prompt with a draft")
    for w in clients:
        w.close()


# ---- 5. the model as its own draft, several streams

def short_prompts(c, n):
    """Prompts whose greedy reply ends (an end token) within the first step of guesses: a draft that
    ends while the others it drafts with go on."""
    out = []
    for i in range(400):
        p = "short reply %d" % i
        g = c.generate(prompt=p, max_tokens=8, temperature=0, speculative="off")
        if g.finish == "stop":
            out.append(p)
            if len(out) == n:
                return out
    raise AssertionError("no prompt gives a greedy reply of at most 8 tokens")


def check_own(ck, d, c, own, other):
    """Section 5."""
    n = 8
    prompts = [PROMPTS[i % len(PROMPTS)] + " (%d)" % i for i in range(n - 2)] + short_prompts(c, 2)
    alone = [c.generate(prompt=p, max_tokens=60, temperature=0, speculative="off").ids for p in prompts]
    kws = [dict(ON, draft=own)] * 5 + [ON, dict(ON, draft=own), dict(ON, draft=other)]
    drafted = 0
    for burst in range(3):
        clients = [d.client(timeout=TIMEOUT) for _ in range(n)]
        rids = [w.start_generate(prompt=p, max_tokens=60, temperature=0, **kw)
                for w, p, kw in zip(clients, prompts, kws)]
        got = [w.collect(rid, TIMEOUT) for w, rid in zip(clients, rids)]
        for i in range(n):
            ck.eq(got[i].ids, alone[i], "burst %d stream %d (%r): its output alone" % (burst, i, kws[i]))
            u = got[i].usage
            if kws[i].get("draft") == own:
                # a draft that ended gives no guesses after its end token (they would all fail)
                ck.eq(u["accepted_tokens"], u["drafted_tokens"],
                      "burst %d stream %d: its own draft's guesses all accepted" % (burst, i))
        drafted += sum(g.usage["drafted_tokens"] for g in got)
        for w in clients:
            w.close()
    ck.ok(drafted > 0, "the streams guessed")


# ---- 6. unloads and the memory budget

def check_unload(ck, d, c, own, other):
    """Section 6, the unload of the target."""
    prompts = long_prompts(c, 2, "unload")
    c.call("model.load", model=other)
    free_other = model(c, "other")["kv_free_blocks"]
    kws = [dict(ON, draft=other), dict(ON, draft=own), dict(ON, draft=other), dict(ON, draft=own)]
    clients = [d.client(timeout=TIMEOUT) for _ in kws]
    rids = [w.start_generate(prompt=prompts[i % 2], max_tokens=LONG, temperature=0, **kw)
            for i, (w, kw) in enumerate(zip(clients, kws))]
    for w, rid in zip(clients, rids):
        ck.eq(w.next(rid, TIMEOUT)["type"], "token", "a request with a draft runs")
    r = c.call("model.unload", model="tiny")
    ck.eq((r["unloaded"], r["cancelled"]), (True, len(kws)), "the unload ends the requests on the model")
    for w, rid, kw in zip(clients, rids, kws):
        ck.eq(w.collect(rid, TIMEOUT).finish, "cancel", "a request with draft %s ends with cancel" % kw["draft"])
        w.close()
    ck.ok(rsd.wait_for(lambda: model(c, "other")["kv_free_blocks"] == free_other and
                       model(c, "other")["active"] == 0, timeout=10),
          "the draft's blocks back: %d of %d" % (model(c, "other")["kv_free_blocks"], free_other))
    off = c.generate(prompt=prompts[0], max_tokens=40, temperature=0, speculative="off")
    for kw in kws[:2]:
        same(ck, c.generate(prompt=prompts[0], max_tokens=40, temperature=0, **kw), off,
             "after the unload, with draft %s" % kw["draft"])
    ck.eq(model(c, "tiny")["active"], 0, "nothing holds the model after")


def sizes(tmp, a, b):
    """Two models' memory, loaded without a budget."""
    home = os.path.join(tmp, "probe")
    os.makedirs(home)
    with Daemon(tmp=home, model=a, extra=DEVICE + ["--ctx", "2048", "--kv-tokens", "4096"]) as d:
        c = d.client(timeout=TIMEOUT)
        c.call("model.load", model=b)
        st = {m["name"]: m["memory_bytes"] for m in c.call("status")["models"] if m["loaded"]}
        return st["tiny"], st["other"]


def check_budget(ck, tmp):
    """Section 6, the budget."""
    a = os.path.join(tmp, "tiny.gguf")
    other = first_layer(tmp)
    third = os.path.join(tmp, "third.gguf")
    shutil.copyfile(other, third)
    sa, so = sizes(tmp, a, other)
    args = DEVICE + ["--ctx", "2048", "--kv-tokens", "4096"]
    home = os.path.join(tmp, "budget")
    os.makedirs(home)
    # the model fits, the model and its draft do not, with nothing else loaded
    with Daemon(tmp=home, model=a, extra=args + ["--device-memory", str(sa + so // 2)]) as d:
        c = d.client(timeout=30)
        try:
            g = c.generate(prompt=PROMPTS[0], max_tokens=8, temperature=0, speculative="on", draft=other,
                           timeout=30)
            ck.ok(False, "a draft that cannot fit beside its model: expected an error, got %r" % g.done)
        except ProtoError as e:
            ck.eq(e.code, "model_error", "a draft that cannot fit beside its model: %s" % e)
            ck.ok("other" in e.reply.get("message", "") and "tiny" in e.reply.get("message", ""),
                  "the error names the draft and the model: %r" % e.reply.get("message"))
        except TimeoutError:
            ck.ok(False, "a draft that cannot fit beside its model: no answer in 30 s")
        g = c.generate(prompt=PROMPTS[0], max_tokens=8, temperature=0, timeout=30)
        ck.eq(g.finish, "length", "the daemon goes on: a request without the draft runs")
    # room for the model and one other: the draft waits while a third model is in use, then runs
    os.makedirs(os.path.join(home, "2"))
    with Daemon(tmp=os.path.join(home, "2"), model=a, extra=args + ["--device-memory", str(sa + so + so // 2)]) as d:
        c = d.client(timeout=TIMEOUT)
        off = c.generate(prompt=PROMPTS[1], max_tokens=30, temperature=0, speculative="off")
        busy = rsd.long_prompt(c, n=LONG, model=third, tag="busy")
        rb = c.start_generate(prompt=busy, model=third, max_tokens=LONG, temperature=0)
        ck.eq(c.next(rb)["type"], "token", "the third model runs")
        ra = c.start_generate(prompt=PROMPTS[1], max_tokens=30, temperature=0, speculative="on", draft=other)
        frames = []  # both requests' replies, in the order they came
        while sum(f["type"] in ("done", "error") for f in frames) < 2:
            frames.append(c.any())
        order = [(f["id"], f["type"]) for f in frames if f["type"] != "progress"]
        ck.eq(order.index((rb, "done")) < order.index((ra, "token")) if (ra, "token") in order else None, True,
              "the draft's request waited for the third model's end: %r" % order[-40:])
        g = rsd.Gen(ra)
        g.tokens = [f for f in frames if f["id"] == ra and f["type"] == "token"]
        g.done = next(f for f in frames if f["id"] == ra and f["type"] in ("done", "error"))
        same(ck, g, off, "the request that waited for its draft")
        ck.ok(g.usage["drafted_tokens"] > 0, "it ran with its draft")


# ---- 7. constrained requests

SCHEMA = {"type": "array", "minItems": 3, "maxItems": 4,
          "items": {"type": "object", "additionalProperties": False, "required": ["name", "id"],
                    "properties": {"name": {"enum": ["red", "green", "blue"]},
                                   "id": {"type": "integer", "minimum": 0, "maximum": 9}}}}
GRAMMAR = 'root ::= ("one two three. " | "four five six. ")+ "end"'


def valid(text):
    try:
        v = json.loads(text)
    except ValueError:
        return False
    return isinstance(v, list) and 3 <= len(v) <= 4 and all(
        set(x) == {"name", "id"} and x["name"] in ("red", "green", "blue") and 0 <= x["id"] <= 9 for x in v)


def check_constrained(ck, c, own, other):
    """Section 7."""
    drafted = 0
    for field, value, ok in (("json_schema", json.dumps(SCHEMA), valid),
                             ("grammar", GRAMMAR, lambda t: re.fullmatch(r"((one two three|four five six)\. )+end", t))):
        for p, prompt in enumerate(PROMPTS[:3]):
            req = {field: value, "prompt": prompt, "max_tokens": 120, "temperature": 0}
            off = c.generate(speculative="off", **req)
            ck.ok(off.finish == "length" or ok(off.text), "%s off: valid output: %r" % (field, off.text))
            for name, kw in modes(own, other):
                g = c.generate(**req, **kw)
                same(ck, g, off, "%s prompt %d %s" % (field, p, name))
                drafted += g.usage["drafted_tokens"]
            g = c.generate(n=2, speculative="on", draft=other, **req)
            ck.eq([ch[0] for ch in choice_outputs(g, 2, True)], [off.text] * 2,
                  "%s prompt %d n=2 with a draft: each choice its off output" % (field, p))
    print("   %d tokens guessed" % drafted)
    ck.ok(drafted > 0, "the constrained requests guessed")


# ---- 8. bad drafts

def check_bad(ck, c, tmp):
    """Section 8."""
    junk = os.path.join(tmp, "junk.txt")
    with open(junk, "w") as f:
        f.write("not a model\n")
    cut = os.path.join(tmp, "cut.gguf")
    with open(os.path.join(tmp, "tiny.gguf"), "rb") as f, open(cut, "wb") as g:
        g.write(f.read(4096))
    empty_dir = os.path.join(tmp, "emptydir")
    os.makedirs(empty_dir)
    before = sorted(m["name"] for m in c.call("status")["models"])
    for bad, code in (("", "invalid_param"), (empty_dir, "model_error"), (junk, "model_error"),
                      (cut, "model_error"), (os.path.join(tmp, "none.gguf"), "not_found")):
        what = "draft %r" % bad
        try:
            g = c.generate(prompt="hi", max_tokens=4, draft=bad)
            ck.ok(False, what + ": refused, got %r" % g.done)
        except ProtoError as e:
            ck.eq(e.code, code, what + ": " + str(e))
            ck.ok(len(e.reply.get("message", "")) > 10, what + ": a message says why")
            # an empty name is a bad parameter, not a model looked for (no file '' in residentd's directory)
            ck.ok(bad != "" or e.reply.get("message", "").startswith("draft "),
                  what + ": the message names the parameter: %r" % e.reply.get("message"))
        g = c.generate(prompt="hi", max_tokens=4, draft=bad, speculative="off")
        ck.eq(g.finish, "length", what + " with speculative off: ignored")
    ck.eq(sorted(m["name"] for m in c.call("status")["models"]), before, "no bad draft is left in status")


def main():
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-spec-edges-")
    try:
        own = rsd.gen_model(os.path.join(tmp, "tiny.gguf"))
        other = first_layer(tmp)
        with ck.section("1. sessions, and a restart"):
            check_sessions(ck, tmp)
        home = os.path.join(tmp, "main")
        os.makedirs(home)
        with Daemon(tmp=home, model=own, extra=DEVICE) as d:
            c = d.client(timeout=TIMEOUT)
            rsd.check_device(ck, c, DEVICE)
            set_long(c, own)
            for title, fn in (("2. several choices", lambda: check_choices(ck, c, own, other)),
                              ("3. stop strings and max_tokens inside a run", lambda: check_stops(ck, c, own, other)),
                              ("4. cancel and hang-up with a draft", lambda: check_cancel(ck, d, c, own, other)),
                              ("5. the model as its own draft", lambda: check_own(ck, d, c, own, other)),
                              ("7. constrained", lambda: check_constrained(ck, c, own, other)),
                              ("8. bad drafts", lambda: check_bad(ck, c, tmp)),
                              ("6. unloading the model", lambda: check_unload(ck, d, c, own, other))):
                with ck.section(title):
                    fn()
        with ck.section("6. the memory budget"):
            check_budget(ck, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
