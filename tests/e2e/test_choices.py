#!/usr/bin/env python3
"""test_choices.py: several choices of one prompt (generate's `n`,
libclient/PROTOCOL.md, "Several choices") end to end, on generated models.

1. n=3, streamed and not, with logprobs: done has three choices; each token
   reply names its choice, and each choice has as many as its
   generated_tokens; usage counts the prompt once and the choices' tokens
   together.
2. One prefill: n=4 over a fresh prompt of P tokens computes P + 3 prompt
   tokens (status cache_miss_tokens: the prompt once, and its last token
   again for each other choice), n=1 computes P.
3. Seeds: a seeded n=3 at temperature 1 gives the same choices again, its
   choices differ, and choice i is what n=1 gives with seed + i. Greedy
   n=2 gives two equal texts.
4. Constraints: n=3 with a json_schema at temperature 1.5, streamed and
   not: every choice is a JSON value the schema validates. A required tool
   with n=2 on tiny-qwen3: each choice has its own valid call.
5. A cancel ends every choice (finish "cancel") and gives their KV blocks
   back; a client that leaves mid-way frees them too; the daemon goes on.
6. Errors: n 0, 9, -1 and "2"; n=2 with a session.
7. Admission counts a request of n choices as n sequences: under
   --max-seqs 4, a request behind a running n=4 waits until it ends; n=8,
   more than the limit, runs alone.
8. The Python package (contrib/python), blocking and asyncio: token.choice,
   done.choices, streamed and not, the same choices as the daemon's.
9. resident-http with the `openai` package (skipped, saying so, without
   it): n=3, chat and completions, streamed (each chunk's choices[0].index
   is its choice, each choice has its role chunk and its finish_reason) and
   not (three choices), the daemon's texts and usage; logprobs per choice,
   streamed and not alike; a required tool on tiny-qwen3 with n=2: each
   choice has its calls; n=2 with a session is a 400.

The daemons run on the CPU backend, whose tokens do not depend on what
else is in the step (test_batch.c): so a choice forked after the prompt
(its last token computed alone) draws what n=1 draws, exactly. On a GPU
the step's shape picks the kernels, and sampled choices could part from
n=1's at a near tie. libresident's rs_reply_choice is tested against a
fake daemon (test_client).
"""
import asyncio
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402

try:
    import openai
    from test_openai import Bridge
except ImportError:
    openai = None
sys.path.insert(0, os.path.join(rsd.common.srcdir(), "contrib", "python"))
import resident  # noqa: E402

LONG = 1500
CPU = ["--device", "cpu"]
SETTLE_S = 2.0
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"enum": ["x", "y"]}},
          "required": ["a", "b"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                           "parameters": WEATHER}}]


def texts(g, n):
    """Each choice's answer: done's texts without streaming, else its token replies' text joined."""
    if g.done["choices"][0].get("text") is not None:
        return [ch["text"] for ch in g.done["choices"]]
    return ["".join(t["text"] for t in toks) for toks in g.by_choice(n)]


def check_shape(ck, c):
    """Section 1."""
    prompt = "several choices of one prompt"
    one = c.generate(prompt=prompt, max_tokens=12, temperature=0)
    for stream in (True, False):
        what = "n=3 stream=%s" % stream
        g = c.generate(prompt=prompt, n=3, max_tokens=12, temperature=1.0, seed=7, stream=stream,
                       logprobs=True, top_logprobs=2)
        chs = g.done.get("choices")
        if not ck.ok(isinstance(chs, list) and len(chs) == 3, "%s: done has 3 choices: %r" % (what, g.done)):
            continue
        ck.ok(not any(k in g.done for k in ("finish", "text", "tool_calls")),
              "%s: no per-choice field at done's top level" % what)
        ck.eq([ch["finish"] for ch in chs], ["length"] * 3, what + ": each choice's finish")
        ck.eq([ch["generated_tokens"] for ch in chs], [12] * 3, what + ": each choice's generated_tokens")
        u = g.done["usage"]
        ck.eq(u["prompt_tokens"], one.usage["prompt_tokens"], what + ": prompt_tokens counted once")
        ck.eq(u["generated_tokens"], 36, what + ": generated_tokens of the three together")
        if stream:
            toks = g.by_choice(3)
            ck.eq([len(t) for t in toks], [12] * 3, what + ": token replies of each choice")
            ck.ok(all("logprob" in t and len(t["top_logprobs"]) == 2 for t in g.tokens),
                  what + ": each token reply has its logprobs")
            ck.ok(all(isinstance(ch.get("text"), type(None)) for ch in chs), what + ": no text in done")
        else:
            ck.eq(g.tokens, [], what + ": no token replies")
            ck.ok(all(isinstance(ch.get("text"), str) for ch in chs), what + ": each choice's text")


def tiny(st):
    """The status of the daemon's own model (section 4 loads another)."""
    return next(m for m in st["models"] if m["name"] == "tiny")


def miss(c):
    return tiny(c.call("status"))["cache_miss_tokens"]


def check_one_prefill(ck, c):
    """Section 2: the prompt computed once, for n=4."""
    counts = {}
    for n in (1, 4):
        prompt = " ".join("word%d of the n=%d prompt" % (i, n) for i in range(60))
        m0 = miss(c)
        g = c.generate(prompt=prompt, n=n, max_tokens=4, temperature=0.8, seed=3)
        p = g.usage["prompt_tokens"]
        ck.eq(g.usage["cached_tokens"], 0, "n=%d: a fresh prompt" % n)
        counts[n] = (p, miss(c) - m0)
    (p1, c1), (p4, c4) = counts[1], counts[4]
    print("   prompt tokens computed: n=1 %d of %d; n=4 %d of %d (four prefills would be %d)" %
          (c1, p1, c4, p4, 4 * p4))
    ck.eq(c1, p1, "n=1 computes its prompt")
    ck.eq(c4, p4 + 3, "n=4 computes its prompt once, and its last token again for 3 choices")


def check_seeds(ck, c):
    """Section 3."""
    prompt = "a seeded request of three choices"
    kw = dict(prompt=prompt, max_tokens=16, temperature=1.0, seed=11)
    a = texts(c.generate(n=3, **kw), 3)
    b = texts(c.generate(n=3, stream=False, **kw), 3)
    ck.eq(a, b, "a seeded n=3 gives the same choices again, streamed or not")
    ck.eq(len(set(a)), 3, "the choices differ: %r" % a)
    for i in range(3):
        one = c.generate(prompt=prompt, max_tokens=16, temperature=1.0, seed=11 + i)
        ck.eq(a[i], one.text, "choice %d is n=1 with seed + %d" % (i, i))
    g = c.generate(prompt="greedy choices", n=2, max_tokens=24, temperature=0)
    t = texts(g, 2)
    ck.ok(t[0] == t[1] and t[0] != "", "greedy n=2: two equal texts: %r" % t)


def valid(doc):
    """Whether doc is a JSON text SCHEMA validates (checked here by hand)."""
    try:
        v = json.loads(doc)
    except ValueError:
        return False
    return isinstance(v, dict) and set(v) == {"a", "b"} and type(v["a"]) is int and 0 <= v["a"] <= 99 and \
        v["b"] in ("x", "y")


def check_constraints(ck, c, qwen):
    """Section 4."""
    for stream in (True, False):
        for seed in (1, 2):
            what = "json_schema n=3 stream=%s seed %d" % (stream, seed)
            g = c.generate(prompt="json please", json_schema=json.dumps(SCHEMA), n=3, max_tokens=200,
                           temperature=1.5, seed=seed, stream=stream)
            ck.eq([ch["finish"] for ch in g.done["choices"]], ["stop"] * 3, what + ": each choice ends complete")
            for i, t in enumerate(texts(g, 3)):
                ck.ok(valid(t), "%s: choice %d validates: %r" % (what, i, t))
    g = c.generate(model=qwen, messages=[{"role": "user", "content": "Weather in Paris?"}],
                   tools=json.dumps(TOOLS), tool_name="get_weather", n=2, max_tokens=300, temperature=1.5, seed=4)
    for i, ch in enumerate(g.done["choices"]):
        calls = ch.get("tool_calls") or []
        ck.ok(len(calls) >= 1 and all(x["name"] == "get_weather" for x in calls), "tools: choice %d calls: %r" %
              (i, ch))
        for x in calls:
            args = json.loads(x["arguments"])
            ck.ok(set(args) == {"city", "days"} and 1 <= args["days"] <= 7, "tools: choice %d arguments %r" %
                  (i, args))
    ck.ok(len({x["id"] for ch in g.done["choices"] for x in ch.get("tool_calls", [])}) >= 2,
          "tools: each choice's calls have their own ids")
    tool_text = ["".join(t.get("tool", "") for t in toks) for toks in g.by_choice(2)]
    ck.ok(all("<tool_call>" in t for t in tool_text), "tools: each choice's call came as its tool text")


def check_errors(ck, c):
    """Section 6."""
    for n, code in ((0, "invalid_param"), (9, "invalid_param"), (-1, "invalid_param"), ("2", "bad_request")):
        r = c.error("generate", prompt="x", n=n)
        ck.eq(r["code"], code, "n=%r: %s" % (n, r["message"]))
    r = c.error("generate", prompt="x", n=9)
    ck.ok("1..8" in r["message"], "n=9's message names the range: %s" % r["message"])
    s = c.call("session.new", title="choices")["session"]["session"]
    r = c.error("generate", session=s, messages=[{"role": "user", "content": "hi"}], n=2)
    ck.eq(r["code"], "invalid_param", "n=2 with a session: %s" % r["message"])
    ck.ok("session" in r["message"], "its message says why: %s" % r["message"])
    g = c.generate(session=s, messages=[{"role": "user", "content": "hi"}], n=1, max_tokens=4)
    ck.ok("choices" not in g.done and g.finish in ("stop", "length"), "n=1 with a session is a turn as before")


def kv_free(c):
    return tiny(c.call("status"))["kv_free_blocks"]


def settled(ck, c, kv0, what):
    """Nothing active and the KV pool back within SETTLE_S; the daemon still serves."""
    t0 = time.monotonic()
    while True:
        st = c.call("status")
        if st["active"] == 0 and tiny(st)["kv_free_blocks"] == kv0:
            break
        if time.monotonic() - t0 > SETTLE_S:
            ck.ok(False, "%s: active %d, kv_free_blocks %d (was %d)" % (what, st["active"],
                                                                        tiny(st)["kv_free_blocks"], kv0))
            break
        time.sleep(0.02)
    g = c.generate(prompt="still serving?", max_tokens=4, temperature=0)
    ck.eq(g.finish, "length", what + ": the daemon keeps serving")


def start_choices(ck, c, prompt, what, n=4):
    """Starts a long generate of n choices and reads until each has sent a token; returns its id."""
    rid = c.start_generate(prompt=prompt, n=n, max_tokens=LONG, temperature=0)
    seen = set()
    while len(seen) < n:
        r = c.next(rid)
        ck.eq(r["type"], "token", what + ": a token")
        seen.add(r["choice"])
    return rid


def check_cancel(ck, d, c):
    """Section 5 (before section 6's session, whose KV written to disk holds blocks a while)."""
    prompt = rsd.long_prompt(c, tag="choices")
    kv0 = kv_free(c)
    with d.client() as w:
        rid = start_choices(ck, w, prompt, "cancel")
        kv = kv_free(c)
        ck.ok(kv < kv0, "the four choices hold KV blocks: %d free, %d before" % (kv, kv0))
        w.call("cancel", target=rid)
        g = w.collect(rid)
        ck.eq([ch["finish"] for ch in g.done["choices"]], ["cancel"] * 4, "a cancel ends every choice")
    settled(ck, c, kv0, "cancelled")
    w = d.client()
    start_choices(ck, w, prompt, "left")
    w.close()
    settled(ck, c, kv0, "the client left")


def waits_behind(ck, d, c, prompt, n, what):
    """A request of n choices runs (under --max-seqs 4); one sent behind it is
    queued, not running, while it does (status taken a few times at once,
    and the cancel that ends it finding it still running, so that every
    snapshot was taken while it ran), and runs once it ends."""
    with d.client() as a, d.client() as b:
        for attempt in range(5):
            ra = start_choices(ck, a, prompt, what, n)
            rb = b.start_generate(prompt="behind it", max_tokens=4, temperature=0)
            seen = {tuple(c.call("status")[k] for k in ("active", "queued")) for _ in range(10)}
            rc = a.request("cancel", target=ra)
            ran = a.next(rc)["type"] == "result"
            g = a.collect(ra)
            ck.eq(b.collect(rb).finish, "length", what + ": the request behind it runs once it ended")
            if ran:
                break
        if not ck.ok(ran, what + ": still running after 10 status calls (in 5 tries)"):
            return
        ck.ok((1, 1) in seen and all(act == 1 for act, _ in seen),
              "%s: the request behind it waits, queued: (active, queued) %r" % (what, sorted(seen)))
        ck.eq(len(g.done["choices"]), n, what + ": its choices")


def check_admission(ck):
    """Section 7."""
    with Daemon(extra=CPU + ["--max-seqs", "4"]) as d:
        c = d.client()
        prompt = rsd.long_prompt(c, tag="admission")
        waits_behind(ck, d, c, prompt, 4, "n=4 fills --max-seqs 4")
        waits_behind(ck, d, c, prompt, 8, "n=8 runs alone under --max-seqs 4")


def check_python(ck, d, c):
    """Section 8."""
    kw = dict(prompt="python choices", n=3, max_tokens=10, temperature=1.0, seed=5)
    want = texts(c.generate(stream=False, **kw), 3)
    with resident.connect(d.sock) as pc:
        for stream in (True, False):
            what = "python stream=%s" % stream
            gen = pc.generate(stream=stream, **kw)
            toks = list(gen)
            done = gen.done
            ck.eq([ch.text for ch in done.choices], want, what + ": done.choices' texts are the daemon's")
            ck.eq([ch.generated_tokens for ch in done.choices], [10] * 3, what + ": each choice's generated_tokens")
            ck.eq((done.text, done.finish, gen.text), (want[0], "length", want[0]), what + ": done's own: the first")
            if stream:
                ck.eq(["".join(t.text for t in toks if t.choice == i) for i in range(3)], want,
                      what + ": each token's choice")
        one = pc.generate(prompt="python choices", max_tokens=10, temperature=1.0, seed=5).result()
        ck.eq((len(one.choices), one.choices[0].text, one.choices[0].generated_tokens), (1, want[0], 10),
              "python n=1: one choice, done's own")

    async def aio():
        async with await resident.aio.connect(d.sock) as ac:
            gen = await ac.generate(**kw)
            async for _ in gen:
                pass
            return [ch.text for ch in gen.done.choices]
    ck.eq(asyncio.run(aio()), want, "python asyncio: the same choices")


def by_index(chunks, chat):
    """A stream's chunks gathered by choice index: text, roles, finish_reasons, logprob entries, tool calls."""
    out = {}
    for chunk in chunks:
        for x in chunk.choices:
            o = out.setdefault(x.index, {"text": "", "roles": 0, "finish": [], "lp": 0, "calls": []})
            if chat:
                o["text"] += x.delta.content or ""
                o["roles"] += x.delta.role == "assistant"
                o["calls"] += x.delta.tool_calls or []
            else:
                o["text"] += x.text
            if x.logprobs is not None:
                o["lp"] += len(x.logprobs.content if chat else x.logprobs.tokens)
            if x.finish_reason is not None:
                o["finish"].append(x.finish_reason)
    return out


def check_bridge(ck, d, c, qwen):
    """Section 9."""
    if openai is None:
        raise Skip("the openai package is not installed")
    b = Bridge(d.sock)
    try:
        oc = b.client()
        msgs = [{"role": "user", "content": "Three answers, please."}]
        kw = dict(max_tokens=12, temperature=1.0, seed=9)
        for kind, create, field in (("chat", oc.chat.completions.create, dict(messages=msgs)),
                                    ("completions", oc.completions.create, dict(prompt="Three answers:"))):
            chat = kind == "chat"
            want = c.generate(stream=False, n=3, **field, **kw)
            wt = texts(want, 3)
            r = create(model="tiny", n=3, **field, **kw)
            ck.eq([x.index for x in r.choices], [0, 1, 2], kind + ": three choices, their indexes")
            ck.eq([x.message.content if chat else x.text for x in r.choices], wt, kind + ": the daemon's texts")
            ck.eq((r.usage.prompt_tokens, r.usage.completion_tokens),
                  (want.usage["prompt_tokens"], want.usage["generated_tokens"]), kind + ": usage, the prompt once")
            chunks = list(create(model="tiny", n=3, stream=True, stream_options={"include_usage": True},
                                 **field, **kw))
            got = by_index(chunks, chat)
            ck.eq(sorted(got), [0, 1, 2], kind + " streamed: chunks of the three indexes")
            ck.eq([got[i]["text"] for i in range(3)], wt, kind + " streamed: each index's text")
            ck.eq([got[i]["finish"] for i in range(3)], [[x.finish_reason] for x in r.choices],
                  kind + " streamed: one finish_reason each")
            if chat:
                ck.eq([got[i]["roles"] for i in range(3)], [1, 1, 1], kind + " streamed: a role chunk each")
            ck.eq(chunks[-1].usage.completion_tokens, r.usage.completion_tokens, kind + " streamed: the usage")
            lp = dict(logprobs=True, top_logprobs=2) if chat else dict(logprobs=2)
            r = create(model="tiny", n=2, **field, **kw, **lp)
            n_lp = [len(x.logprobs.content if chat else x.logprobs.tokens) for x in r.choices]
            ck.ok(all(n > 0 for n in n_lp), "%s logprobs: each choice has its own: %r" % (kind, n_lp))
            got = by_index(create(model="tiny", n=2, stream=True, **field, **kw, **lp), chat)
            ck.eq([got[i]["lp"] for i in range(2)], n_lp, kind + " logprobs streamed: as many per choice")
        tools = dict(model=os.path.basename(qwen)[:-5], messages=[{"role": "user", "content": "Weather?"}],
                     tools=TOOLS, tool_choice="required", n=2, max_tokens=300, temperature=1.5, seed=4)
        r = oc.chat.completions.create(**tools)
        for x in r.choices:
            ck.ok(x.finish_reason == "tool_calls" and x.message.tool_calls and
                  x.message.tool_calls[0].function.name == "get_weather",
                  "tools: choice %d has its calls: %r" % (x.index, x))
        got = by_index(oc.chat.completions.create(stream=True, **tools), True)
        ck.eq([(got[i]["finish"], bool(got[i]["calls"])) for i in range(2)], [(["tool_calls"], True)] * 2,
              "tools streamed: each index has its calls")
        e = ck.raises(lambda: oc.chat.completions.create(model="tiny", messages=msgs, n=2,
                                                         extra_body={"session": "new"}),
                      openai.BadRequestError, "n=2 with a session", status_code=400)
        ck.ok(e is not None and "session" in e.message, "its message says why: %s" % e)
    finally:
        ck.eq(b.stop(), 0, "resident-http exits 0")


def main():
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-choices-")
    try:
        qwen = rsd.gen_model(os.path.join(tmp, "tiny-qwen3.gguf"), shape="tiny-qwen3")
        with Daemon(extra=CPU) as d:
            c = d.client(timeout=120)
            for title, fn in (("1. n=3: replies, usage, logprobs", lambda: check_shape(ck, c)),
                              ("2. one prefill for n=4", lambda: check_one_prefill(ck, c)),
                              ("3. seeds; greedy", lambda: check_seeds(ck, c)),
                              ("4. a json_schema and a required tool per choice",
                               lambda: check_constraints(ck, c, qwen)),
                              ("5. cancel, a client that leaves", lambda: check_cancel(ck, d, c)),
                              ("6. errors", lambda: check_errors(ck, c)),
                              ("8. the Python package", lambda: check_python(ck, d, c))):
                with ck.section(title):
                    fn()
            try:
                with ck.section("9. resident-http"):
                    check_bridge(ck, d, c, qwen)
            except Skip as e:
                print("   skipped:", e)
        with ck.section("7. admission counts n"):
            check_admission(ck)
    finally:
        rsd.shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
