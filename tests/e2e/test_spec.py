#!/usr/bin/env python3
"""test_spec.py: speculative decoding (generate's `speculative`,
libclient/PROTOCOL.md) through the daemon, on a generated model and the
CPU backend (the GPU's, in exact mode: test_gpu_spec.py).

1. Greedy output with `speculative` "auto" (the default: guesses where the
   daemon measured that they pay) and "on" (every step guesses) is the
   output with "off", token for token, streamed and not, over prompts that
   repeat themselves (so that lookup guesses): a token reply per token
   however many a step settled; usage's drafted_tokens and accepted_tokens
   (0 with "off", accepted at most drafted, some guessed over the suite
   with "on"), and the model's status counts them.
2. Sixteen streams at once, each the output it has alone; a cancel in the
   middle of one leaves the others' outputs and the KV pool whole.
3. `resident run -v` prints how many guessed tokens were accepted;
   `--speculative on` the same reply with some, `--speculative off` none; a
   bad --speculative is refused.
4. Errors: speculative "maybe", 1, true; "auto", "on" and "off" taken.
5. A draft model (generate's `draft`, with speculative "on"): the model
   itself as its own draft (on the CPU, and the GPU in exact mode, a token's
   logits do not depend on the step: every guess is accepted, greedy and
   sampled at temperature 1 and at the chat defaults, since the draft draws
   with the request's generator; a seed's tokens unchanged), the same
   model cut to its first layer (the same vocabulary; greedy output
   unchanged, sixteen streams at once too), a draft of another vocabulary
   (invalid_param), one that does not exist (not_found); unloading the
   draft while a request uses it leaves the request going without guesses;
   status lists the draft as loaded and in use while it runs; `resident run
   --draft` prints the draft's accepted guesses.
6. residentd --draft: requests on the default model that name no draft use
   it (the same output, guesses made), those with speculative "off" do
   not; a --draft of another vocabulary leaves requests running without it.
   --model-draft MODEL=PATH (the later of two for a model): requests on
   another model that name no draft guess as they do naming that draft (tokens, drafted and accepted the
   same; lookup alone guesses otherwise), and the default model's do not;
   the config's model_drafts the same; a malformed pair or config value, a
   model or a draft that does not exist stop residentd at its start,
   saying so.
7. A request whose prompt arrives while another streams with a guess in
   every step is prefilled beside that stream, not held back until it
   ends (the pacer measures a guessing step as its decoders').
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, ProtoError  # noqa: E402

DEVICE = rsd.test_device()
TIMEOUT = 120
# a reply its grammar holds to one phrase, over and over (no end token): lookup's guesses are all accepted
REPEAT = dict(prompt="one two one two", grammar='root ::= ("one two "){1000}', max_tokens=2000, temperature=0)
PROMPTS = ["one two three four five one two three four five one two three",
           "the cat sat on the mat and the cat sat on the",
           "def f(x):\n    return x + 1\n\ndef f(x):\n    return",
           "a b a b a b a b a b",
           "red green blue red green blue red",
           "1, 2, 3, 4, 1, 2, 3, 4, 1, 2",
           "hello world hello world hello world",
           "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,"]


def model_status(c):
    return next(m for m in c.call("status")["models"] if m["loaded"])


def check_same(ck, c):
    """Section 1."""
    drafted = accepted = guessed_on = 0
    s0 = model_status(c)
    for i, p in enumerate(PROMPTS):
        stream = i % 3 != 2
        off = c.generate(prompt=p, max_tokens=80, temperature=0, speculative="off", stream=stream)
        auto = c.generate(prompt=p, max_tokens=80, temperature=0, stream=stream)
        on = c.generate(prompt=p, max_tokens=80, temperature=0, speculative="on", stream=stream)
        what = "prompt %d (stream %s)" % (i, stream)
        ck.eq((auto.text, auto.ids), (off.text, off.ids), what + ": the same output with the measured choice")
        ck.eq(on.text, off.text, what + ": the same text with guesses")
        ck.eq(on.finish, off.finish, what + ": the same finish")
        ck.eq(on.usage["generated_tokens"], off.usage["generated_tokens"], what + ": the same token count")
        if stream:
            ck.eq(on.ids, off.ids, what + ": the same token ids")
            ck.eq(len(on.tokens), len(off.tokens), what + ": a token reply per token (an ending one "
                  "without text has none)")
        ck.eq((off.usage["drafted_tokens"], off.usage["accepted_tokens"]), (0, 0), what + ": off guesses nothing")
        ck.ok(on.usage["accepted_tokens"] <= on.usage["drafted_tokens"], what + ": accepted at most drafted")
        drafted += on.usage["drafted_tokens"] + auto.usage["drafted_tokens"]
        accepted += on.usage["accepted_tokens"] + auto.usage["accepted_tokens"]
        guessed_on += on.usage["drafted_tokens"]
    # the context's end inside a run of accepted guesses
    n_ctx = 2048 - 1
    off = c.generate(**dict(REPEAT, max_tokens=n_ctx), speculative="off")
    on = c.generate(**dict(REPEAT, max_tokens=n_ctx), speculative="on")
    ck.eq((on.finish, on.ids), ("context", off.ids), "the context's end inside a run of guesses: as without them")
    drafted += on.usage["drafted_tokens"]
    accepted += on.usage["accepted_tokens"]
    print("   %d of %d guessed tokens accepted" % (accepted, drafted))
    ck.ok(guessed_on > 0, "lookup guessed over the suite with speculative on")
    s1 = model_status(c)
    ck.eq((s1["drafted_tokens"] - s0["drafted_tokens"], s1["accepted_tokens"] - s0["accepted_tokens"]),
          (drafted, accepted), "status counts the usage's guesses")


def check_many(ck, d, c):
    """Section 2."""
    alone = [c.generate(prompt=p, max_tokens=60, temperature=0, speculative="off").ids for p in PROMPTS * 2]
    free0 = model_status(c)["kv_free_blocks"]
    clients = [d.client(timeout=TIMEOUT) for _ in range(16)]
    out = [None] * 16
    victim = [None]

    def one(i):
        w = clients[i]
        rid = w.start_generate(prompt=PROMPTS[i % len(PROMPTS)], max_tokens=60, temperature=0)
        if i == 5:
            w.next(rid, TIMEOUT)
            w.request("cancel", target=rid)
            victim[0] = w.collect(rid, TIMEOUT)
            return
        out[i] = w.collect(rid, TIMEOUT)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    for i in range(16):
        if i != 5:
            ck.eq(out[i].ids if out[i] else None, alone[i], "stream %d: its output alone" % i)
    ck.eq(victim[0].finish if victim[0] else None, "cancel", "the cancelled stream ends so")
    ck.ok(rsd.wait_for(lambda: model_status(c)["kv_free_blocks"] == free0 and model_status(c)["active"] == 0),
          "every block back once all end")
    for w in clients:
        w.close()


def check_beside(ck, d, c):
    """Section 7."""
    # steps of 8 tokens run REPEAT to max_tokens (about 250 steps)
    req = dict(REPEAT, speculative="on")
    w1, w2 = d.client(timeout=TIMEOUT), d.client(timeout=TIMEOUT)
    ends = {}
    rid = w1.start_generate(**req)
    ck.eq(w1.next(rid, TIMEOUT)["type"], "token", "the guessing stream runs")

    def stream():
        g = w1.collect(rid, TIMEOUT)
        ends["stream"] = (time.monotonic(), g)

    t = threading.Thread(target=stream)
    t.start()
    # a prompt of a few hundred tokens: on a CPU the pacer keeps a step with a prompt beside one stream to
    # 2.5 decode-only ones, a few tokens a step beside the stream's guesses; held back, none until it ends
    late = w2.generate(prompt=" ".join("word%d" % (i % 97) for i in range(100)), max_tokens=4, temperature=0,
                       timeout=TIMEOUT)
    ends["late"] = time.monotonic()
    t.join(TIMEOUT)
    g = ends["stream"][1]
    ck.eq((late.finish, g.finish), ("length", "length"), "both end")
    ck.ok(g.usage["accepted_tokens"] > g.usage["generated_tokens"] // 2,
          "the stream settled several tokens a step: %r" % g.usage)
    print("   the later request ended %.3f s before the stream" % (ends["stream"][0] - ends["late"]))
    ck.ok(ends["late"] < ends["stream"][0], "the later request's prompt was computed beside the guessing stream, "
          "not after it: it ended %.3f s before the stream" % (ends["stream"][0] - ends["late"]))
    w1.close(), w2.close()


def resident(d, *args):
    return subprocess.run([rsd.tool("resident"), "--socket", d.sock, *args], capture_output=True, text=True,
                          timeout=TIMEOUT)


def check_cli(ck, d):
    """Section 3."""
    prompt = PROMPTS[0]
    on = resident(d, "run", "--raw", "--json", "-v", "-t", "0", "-n", "80", prompt)
    off = resident(d, "run", "--raw", "--json", "-v", "-t", "0", "-n", "80", "--speculative", "off", prompt)
    ck.eq((on.returncode, off.returncode), (0, 0), "run -v exits 0: %s %s" % (on.stderr, off.stderr))
    don, doff = json.loads(on.stdout), json.loads(off.stdout)
    ck.eq(don["text"], doff["text"], "run prints the same reply either way")
    # whether a step guesses is the daemon's measured choice: the line says so exactly when it did
    ck.eq("guessed tokens accepted" in on.stderr, don["usage"]["drafted_tokens"] > 0,
          "run -v says how many guesses were accepted when there were some: %r %r" % (on.stderr, don["usage"]))
    always = resident(d, "run", "--raw", "--json", "-v", "-t", "0", "-n", "80", "--speculative", "on", prompt)
    ck.ok(always.returncode == 0 and json.loads(always.stdout)["text"] == doff["text"] and
          "guessed tokens accepted" in always.stderr, "--speculative on: the same reply, guesses made: %r" %
          always.stderr)
    ck.ok("guessed" not in off.stderr, "--speculative off: no guesses to report: %r" % off.stderr)
    bad = resident(d, "run", "--speculative", "sometimes", "hi")
    ck.ok(bad.returncode != 0 and "--speculative wants auto, on or off" in bad.stderr,
          "a bad --speculative is refused: %r" % bad.stderr)


def check_errors(ck, c):
    """Section 4."""
    for v in ("maybe", 1, True):
        try:
            c.generate(prompt="hi", max_tokens=2, speculative=v)
            ck.ok(False, "speculative %r is refused" % (v,))
        except ProtoError as e:
            ck.eq(e.code, "invalid_param" if v == "maybe" else "bad_request", "speculative %r: %s" % (v, e))
    for v in ("auto", "on", "off"):
        g = c.generate(prompt="hi", max_tokens=2, temperature=0, speculative=v)
        ck.eq(g.finish, "length", "speculative %r is taken, and the daemon goes on" % v)


def check_draft(ck, d, c, tmp):
    """Section 5."""
    own = d.model
    # the daemon's model cut to its first layer: the same vocabulary, a smaller model that often agrees
    other = rsd.gen_model(os.path.join(tmp, "other.gguf"), seed=1, layers=1)
    qwen = rsd.gen_model(os.path.join(tmp, "tiny-qwen3.gguf"), shape="tiny-qwen3")
    for p in PROMPTS[:4]:
        off = c.generate(prompt=p, max_tokens=60, temperature=0, speculative="off")
        mine = c.generate(prompt=p, max_tokens=60, temperature=0, speculative="on", draft=own)
        ck.eq(mine.ids, off.ids, "its own draft: the same tokens")
        u = mine.usage
        ck.ok(u["drafted_tokens"] > 0 and u["accepted_tokens"] == u["drafted_tokens"],
              "its own draft: every guess accepted (%d of %d)" % (u["accepted_tokens"], u["drafted_tokens"]))
        theirs = c.generate(prompt=p, max_tokens=60, temperature=0, speculative="on", draft=other)
        ck.eq(theirs.ids, off.ids, "another model's draft: the same tokens")
        ck.ok(theirs.usage["drafted_tokens"] > 0, "another model's draft guessed")
    # sampled: the draft draws with the request's own generator, so its own guesses are the seed's tokens
    for i, kw in enumerate((dict(temperature=1.0), dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05))):
        off = c.generate(prompt=PROMPTS[i], max_tokens=60, seed=5 + i, speculative="off", **kw)
        mine = c.generate(prompt=PROMPTS[i], max_tokens=60, seed=5 + i, speculative="on", draft=own, **kw)
        ck.eq(mine.ids, off.ids, "its own draft, sampled at %r: the seed's tokens" % kw)
        u = mine.usage
        ck.ok(u["drafted_tokens"] > 0 and u["accepted_tokens"] == u["drafted_tokens"],
              "its own draft, sampled: every guess accepted (%d of %d)" % (u["accepted_tokens"], u["drafted_tokens"]))
        theirs = c.generate(prompt=PROMPTS[i], max_tokens=60, seed=5 + i, speculative="on", draft=other, **kw)
        ck.eq(theirs.ids, off.ids, "another model's draft, sampled: the seed's tokens")
    clients = [d.client(timeout=TIMEOUT) for _ in range(16)]
    alone = [c.generate(prompt=PROMPTS[i % len(PROMPTS)], max_tokens=40, temperature=0, speculative="off").ids
             for i in range(16)]
    rids = [w.start_generate(prompt=PROMPTS[i % len(PROMPTS)], max_tokens=40, temperature=0, speculative="on",
                             draft=other)
            for i, w in enumerate(clients)]
    got = [w.collect(rid, TIMEOUT).ids for w, rid in zip(clients, rids)]
    ck.eq(got, alone, "sixteen streams with a draft: each its output alone")
    for w in clients:
        w.close()
    for bad, code in ((qwen, "invalid_param"), (os.path.join(tmp, "none.gguf"), "not_found")):
        try:
            c.generate(prompt="hi", max_tokens=4, draft=bad)
            ck.ok(False, "draft %s is refused" % bad)
        except ProtoError as e:
            ck.eq(e.code, code, "draft %s: %s" % (os.path.basename(bad), e))
    # the draft unloaded mid-request: the request goes on, without guesses from then on
    w = d.client(timeout=TIMEOUT)
    # held by its grammar from an end token, long enough to be running still when status is asked, on a GPU too
    rid = w.start_generate(**REPEAT, speculative="on", draft=other)
    w.next(rid, TIMEOUT)
    st = c.call("status")["models"]
    ck.ok(any(m["name"] == "other" and m["loaded"] and m["expires_in_s"] == -1 for m in st),
          "status: the draft is loaded and in use: %r" % [(m["name"], m["loaded"]) for m in st])
    c.call("model.unload", model=other)
    g = w.collect(rid, TIMEOUT)
    off = c.generate(**REPEAT, speculative="off")
    ck.eq(g.ids, off.ids[1:len(g.ids) + 1], "the request goes on after its draft is unloaded (its first token "
          "read before)")
    ck.eq(g.finish, off.finish, "and ends as without it")
    w.close()
    r = resident(d, "run", "--raw", "--json", "-v", "-t", "0", "-n", "40", "--speculative", "on", "--draft", other,
                 PROMPTS[1])
    ck.ok(r.returncode == 0 and ("guessed tokens accepted" in r.stderr) ==
          (json.loads(r.stdout)["usage"]["drafted_tokens"] > 0), "run --draft -v: %r" % r.stderr)


def check_daemon_draft(ck, tmp):
    """Section 6."""
    other = os.path.join(tmp, "other.gguf")
    qwen = os.path.join(tmp, "tiny-qwen3.gguf")
    with Daemon(extra=DEVICE + ["--draft", other]) as d:
        c = d.client(timeout=TIMEOUT)
        for p in PROMPTS[:3]:
            off = c.generate(prompt=p, max_tokens=50, temperature=0, speculative="off")
            on = c.generate(prompt=p, max_tokens=50, temperature=0, speculative="on")
            ck.eq(on.ids, off.ids, "--draft: the same tokens")
            ck.ok(on.usage["drafted_tokens"] > 0, "--draft: the default model's requests use it")
            ck.eq(off.usage["drafted_tokens"], 0, "--draft: speculative off guesses nothing")
    with Daemon(extra=DEVICE + ["--draft", qwen]) as d:
        c = d.client(timeout=TIMEOUT)
        g = c.generate(prompt=PROMPTS[0], max_tokens=30, temperature=0)
        ck.eq(g.finish, "length", "a --draft of another vocabulary: requests run without it")


def check_model_draft(ck, tmp):
    """Section 6, --model-draft."""
    other = os.path.join(tmp, "other.gguf")
    with Daemon(extra=DEVICE) as d:
        c = d.client(timeout=TIMEOUT)
        named = [c.generate(model=other, prompt=p, max_tokens=50, temperature=0, speculative="on", draft=other)
                 for p in PROMPTS[:3]]
        lookup = [c.generate(model=other, prompt=p, max_tokens=50, temperature=0, speculative="on")
                  for p in PROMPTS[:3]]
        plain = c.generate(prompt=PROMPTS[0], max_tokens=50, temperature=0, speculative="on")
    usage = lambda g: (g.usage["drafted_tokens"], g.usage["accepted_tokens"])  # noqa: E731
    ck.ok([usage(g) for g in named] != [usage(g) for g in lookup],
          "lookup alone guesses otherwise than the draft (so the checks below tell them apart)")
    config = os.path.join(tmp, "drafts.json")
    with open(config, "w") as f:
        json.dump({"model_drafts": {other: other}}, f)
    qwen = os.path.join(tmp, "tiny-qwen3.gguf")  # another vocabulary: were it the model's draft, no draft at all
    for how, flags in (("--model-draft, the later of two", ["--model-draft", "%s=%s" % (other, qwen),
                                                           "--model-draft", "%s=%s" % (other, other)]),
                       ("the config's model_drafts", ["-c", config])):
        with Daemon(extra=DEVICE + flags) as d:
            c = d.client(timeout=TIMEOUT)
            for p, n in zip(PROMPTS[:3], named):
                g = c.generate(model=other, prompt=p, max_tokens=50, temperature=0, speculative="on")
                ck.eq(g.ids, n.ids, how + ": the same tokens")
                ck.eq(usage(g), usage(n), how + ": the model's requests guess as naming its draft do")
            g = c.generate(prompt=PROMPTS[0], max_tokens=50, temperature=0, speculative="on")
            ck.eq(usage(g), usage(plain), how + ": the default model's requests have no draft")
    bad = os.path.join(tmp, "bad-drafts.json")
    with open(bad, "w") as f:
        json.dump({"model_drafts": other}, f)
    daemon = rsd.daemon_path()
    for flags, says in ((["--model-draft", "noequals"], "MODEL=PATH"),
                        (["--model-draft", "nosuch.gguf=" + other], "--model-draft"),
                        (["--model-draft", other + "=" + os.path.join(tmp, "none.gguf")], "--model-draft"),
                        (["-c", bad], "model_drafts")):
        r = subprocess.run([daemon, "-s", os.path.join(tmp, "md.sock"), "--db", os.path.join(tmp, "md.db")] + flags +
                           DEVICE, capture_output=True, text=True, timeout=TIMEOUT)
        ck.ok(r.returncode != 0 and says in r.stderr, "%s: refused at the start, saying %r: exit %d, %s"
              % (" ".join(flags), says, r.returncode, r.stderr.strip()[-300:]))


def main():
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-spec-")
    try:
        with Daemon(extra=DEVICE) as d:
            c = d.client(timeout=TIMEOUT)
            rsd.check_device(ck, c, DEVICE)
            for title, fn in (("1. the same output, usage and status", lambda: check_same(ck, c)),
                              ("2. sixteen at once, a cancel", lambda: check_many(ck, d, c)),
                              ("3. resident run", lambda: check_cli(ck, d)),
                              ("4. errors", lambda: check_errors(ck, c)),
                              ("5. a draft model", lambda: check_draft(ck, d, c, tmp)),
                              ("7. a prompt beside a stream that guesses", lambda: check_beside(ck, d, c))):
                with ck.section(title):
                    fn()
        with ck.section("6. residentd --draft, --model-draft"):
            check_daemon_draft(ck, tmp)
            check_model_draft(ck, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
