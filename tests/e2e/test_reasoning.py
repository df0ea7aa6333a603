#!/usr/bin/env python3
"""test_reasoning.py: a model's reasoning delivered apart from its answer, end
to end (libclient/PROTOCOL.md, "Reasoning"), on generated models.

Random weights do not reason by themselves, so the requests make them: a
presence and a frequency penalty of -10 raise the tokens of the prompt's
last 64, and top_k keeps only the few the prompt repeats, which a high
temperature then draws about evenly. A prompt made of "<think>", "a",
"</think>" and "b" is answered with a random mix of those four, the same
for the same seed; the seeds whose reply opens with <think> reason. Nothing
here is a fixed text: each reply is checked against an independent split
of what was generated (the `detokenize` of its token ids), written from
PROTOCOL.md:

1. tiny-qwen3moe (Qwen3's template): the streamed `reasoning` and `text`
   are that split, `done` without streaming has the same; a raw `prompt`
   (whose text need not follow the template) is all `text`.
2. Stop strings are the answer's: one the reasoning holds changes nothing,
   one the answer holds cuts it there.
3. A session stores the answer as the turn's content and the reasoning
   apart; the next turn renders the history without it, as Qwen3's template
   does: it is, token for token, a stateless request whose history holds the
   answers alone (answers without a </think>, which that template would cut
   a content at), reuses the cached prompt, and so again after a restart.
4. The CLI prints the reasoning, a blank line, then the answer (faint on a
   terminal, not with NO_COLOR), --hide-reasoning leaves it out, --json has
   both; `sessions show` shows a stored reply's reasoning.
5. resident-http puts it in reasoning_content, streamed and not; the
   Python package (contrib/python) in its tokens' and done's reasoning.
6. tiny-gptoss (harmony): its markers raised the same way, the replies are
   split as an independent reader of harmony's token ids splits them.
7. `think`: false gives Qwen3's prompt the empty think block its template
   writes for enable_thinking=false (its tokens more, counted) and a reply
   that is all answer; true is the default; an effort leaves Qwen3 as it is
   and sets gpt-oss's "Reasoning:" line (false as low); other values are
   refused; the CLI's --think sends it.
"""
import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402
from test_openai import Bridge  # noqa: E402

sys.path.insert(0, os.path.join(rsd.common.srcdir(), "contrib", "python"))
import resident  # noqa: E402

QWEN3 = "<think>a</think>b" * 10
HARMONY = "<|start|><|channel|>x<|message|>y<|end|>" * 10
# every token of the prompt's end raised alike, drawn about evenly among the top_k
RAISED = dict(presence_penalty=-10.0, frequency_penalty=-10.0, temperature=50.0, top_p=1.0, min_p=0.0,
              max_tokens=40)
SHORT = dict(RAISED, max_tokens=6, top_k=4)    # replies short enough to answer without a </think>
SEEDS = range(1, 41)


def user(text):
    return [{"role": "user", "content": text}]


def qwen3_split(full):
    """(reasoning, answer) of a Qwen3 reply: a <think> block may open it (after
    newlines), its newlines trimmed; the answer follows without its leading
    newlines. Anything else is all answer."""
    s = full.lstrip("\n")
    if not s.startswith("<think>"):
        return "", full
    s = s[len("<think>"):]
    end = s.find("</think>")
    if end < 0:
        return s.lstrip("\n"), ""
    return s[:end].strip("\n"), s[end + len("</think>"):].lstrip("\n")


def parts(g):
    """A streamed generation's (reasoning, answer, tool), each its pieces joined."""
    return tuple("".join(t.get(k, "") for t in g.tokens) for k in ("reasoning", "text", "tool"))


def whole(c, ids, model=None):
    """What the ids decode to, special tokens not rendered (as a reply's text is)."""
    return c.call("detokenize", tokens=ids, **({"model": model} if model else {}))["text"]


def check_qwen3(ck, c):
    """Section 1; returns {seed: (reasoning, answer)} of the seeds whose reply has both."""
    both = {}
    for seed in SEEDS:
        g = c.generate(messages=user(QWEN3), seed=seed, top_k=4, **RAISED)
        want = qwen3_split(whole(c, g.ids))
        r, a, tool = parts(g)
        ck.eq((r, a), want, "seed %d: streamed reasoning and answer are the split of the generated text" % seed)
        ck.eq(tool, "", "seed %d: Qwen3 has no tool text" % seed)
        if r and a:
            both[seed] = (r, a)
    ck.ok(len(both) >= 2, "some seeds reason, then answer (%d of %d)" % (len(both), len(SEEDS)))
    print("   seeds that reason and answer:", sorted(both))
    for seed, (r, a) in list(both.items())[:3]:
        g = c.generate(messages=user(QWEN3), seed=seed, top_k=4, stream=False, **RAISED)
        ck.eq((g.done.get("reasoning"), g.done.get("text")), (r, a), "seed %d: done without streaming" % seed)
    raw_think = 0
    for seed in SEEDS:
        g = c.generate(prompt=QWEN3, seed=seed, top_k=4, **RAISED)
        ck.eq(parts(g), ("", whole(c, g.ids), ""), "seed %d: a raw prompt's reply is all text" % seed)
        raw_think += "<think>" in g.text
    ck.ok(raw_think > 0, "raw replies that hold <think> keep it as text (%d)" % raw_think)
    return both


def check_stops(ck, c, both):
    """Section 2: the stop strings of the seeds that reason."""
    tried = 0
    for seed, (r, a) in both.items():
        base = c.generate(messages=user(QWEN3), seed=seed, top_k=4, **RAISED)
        # from the reasoning, not in the answer: nothing changes
        s_r = next((r[i:i + n] for n in (2, 3, 4) for i in range(len(r) - n + 1) if r[i:i + n] not in a), None)
        # from the answer, after its first character: the answer stops before its first occurrence
        s_a = a[1:4] if len(a) >= 4 else None
        if s_r is None or s_a is None:
            continue
        tried += 1
        g = c.generate(messages=user(QWEN3), seed=seed, top_k=4, stop=[s_r], **RAISED)
        ck.eq((parts(g), g.ids, g.finish), (parts(base), base.ids, base.finish),
              "seed %d: stop %r, which only the reasoning holds, changes nothing" % (seed, s_r))
        g = c.generate(messages=user(QWEN3), seed=seed, top_k=4, stop=[s_a], **RAISED)
        ck.eq((parts(g), g.finish), ((r, a[:a.find(s_a)], ""), "stop"),
              "seed %d: stop %r cuts the answer there" % (seed, s_a))
        ck.eq(g.ids, base.ids[:len(g.ids)], "seed %d: the stopped reply is the start of the other" % seed)
    ck.ok(tried > 0, "stop strings tried on %d seeds" % tried)


def pick(c, history):
    """The first seed whose short reply to history reasons and answers without a
    </think>, which a history given as text would split again (Qwen3's template
    cuts an assistant content at its last </think>); returns (seed, its reply)."""
    for seed in range(1, 201):
        g = c.generate(messages=history, seed=seed, **SHORT)
        r, a, _ = parts(g)
        if r and a and "</think>" not in a:
            return seed, g
    raise AssertionError("no seed reasons and answers without </think>")


def check_session(ck, d, c):
    """Section 3: session turns with reasoning, stored, and rendered again as
    their stateless equals, whose history holds the answers alone."""
    sid = c.call("session.new", title="reasons")["session"]["session"]
    history, stored, first = user(QWEN3), [], None
    for turn in (1, 2, 3):
        if turn == 3:
            c.close()
            d.stop()
            d.start()
            c = d.client(timeout=60)
            ck.eq([t.get("reasoning") for t in c.call("session.get", session=sid)["turns"]], stored,
                  "after a restart the stored reasoning is there")
        seed, ref = pick(c, history)
        print("   turn %d: seed %d, reasoning %r, answer %r" % ((turn, seed) + parts(ref)[:2]))
        g = c.generate(session=sid, messages=user(QWEN3), seed=seed, **SHORT)
        ck.eq((g.ids, parts(g), g.usage["prompt_tokens"]), (ref.ids, parts(ref), ref.usage["prompt_tokens"]),
              "turn %d = a request whose history holds the answers alone (past reasoning is not rendered)" % turn)
        if first is None:
            first = g.usage["prompt_tokens"]
        else:
            ck.ok(g.usage["cached_tokens"] >= first - 16, "turn %d reuses turn 1's cached prompt: %d of %d"
                  % (turn, g.usage["cached_tokens"], first))
        r, a, _ = parts(g)
        stored += [None, r]
        turns = c.call("session.get", session=sid)["turns"]
        ck.eq([(t["role"], t["content"], t.get("reasoning")) for t in turns[-2:]],
              [("user", QWEN3, None), ("assistant", a, r)], "turn %d stored: the answer as content, the "
              "reasoning apart" % turn)
        history += [{"role": "assistant", "content": a}] + user(QWEN3)
    return c


def run_cli(d, args, tty=False, env=None):
    """resident run ARGS against d; stdout as text (a pseudo-terminal's, \\r\\n as \\n, with tty)."""
    argv = [rsd.tool("resident"), "--socket", d.sock] + args
    envp = dict(os.environ, **(env or {}))
    if not tty:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=envp, check=True).stdout
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.DEVNULL, env=envp)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:         # EIO: the terminal's last writer is gone
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    p.wait(60)
    return out.decode("utf-8", "replace").replace("\r\n", "\n")


def check_cli(ck, d, c, seed, r, a):
    """Section 4: the CLI's reasoning, each run in a session of its own whose defaults raise the prompt."""
    defaults = dict(RAISED, top_k=4, seed=seed)

    def session():
        return c.call("session.new", defaults=defaults)["session"]["session"]

    ck.eq(run_cli(d, ["run", "--session", session(), QWEN3]), r + "\n\n" + a + "\n",
          "run: the reasoning, a blank line, the answer (not a terminal: no styles)")
    ck.eq(run_cli(d, ["run", "--hide-reasoning", "--session", session(), QWEN3]), a + "\n",
          "run --hide-reasoning: the answer alone")
    out = json.loads(run_cli(d, ["run", "--json", "--session", session(), QWEN3]))
    ck.eq((out.get("reasoning"), out.get("text")), (r, a), "run --json: reasoning and text")
    sid = session()
    out = run_cli(d, ["run", "--session", sid, QWEN3], tty=True, env={"NO_COLOR": ""})
    ck.eq(out, "\x1b[2m" + r + "\x1b[0m\n\n" + a + "\n", "run on a terminal: the reasoning faint")
    out = run_cli(d, ["run", "--session", session(), QWEN3], tty=True, env={"NO_COLOR": "1"})
    ck.eq(out, r + "\n\n" + a + "\n", "run on a terminal with NO_COLOR: no styles")
    out = run_cli(d, ["sessions", "show", sid])
    ck.ok(("assistant: " + r + "\n\n" + a + "\n") in out, "sessions show: the reasoning before the answer: %r" % out)


def check_bridge(ck, d, seed, r, a):
    """Section 5: resident-http's reasoning_content."""
    b = Bridge(d.sock)
    try:
        body = dict(RAISED, model=os.path.splitext(os.path.basename(d.model))[0], messages=user(QWEN3),
                    seed=seed, top_k=4)

        def post(stream):
            req = urllib.request.Request(b.url + "/chat/completions", json.dumps(dict(body, stream=stream)).encode(),
                                         {"Content-Type": "application/json"})
            return urllib.request.urlopen(req, timeout=60)

        msg = json.load(post(False))["choices"][0]["message"]
        ck.eq((msg.get("reasoning_content"), msg["content"]), (r, a), "bridge: reasoning_content beside content")
        got = {"reasoning_content": "", "content": ""}
        for line in post(True):
            line = line.decode().strip()
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    for k in got:
                        got[k] += choice["delta"].get(k) or ""
        ck.eq((got["reasoning_content"], got["content"]), (r, a), "bridge: streamed deltas carry reasoning_content")
        with d.client(timeout=60) as c:
            off = c.generate(messages=user(QWEN3), seed=seed, top_k=4, think=False, stream=False, **RAISED).done
        body["reasoning_effort"] = "none"
        msg = json.load(post(False))["choices"][0]["message"]
        ck.eq((msg.get("reasoning_content"), msg["content"]), (None, off["text"]),
              "bridge: reasoning_effort none is the daemon's think false")
        body["reasoning_effort"] = "high"
        msg = json.load(post(False))["choices"][0]["message"]
        ck.eq((msg.get("reasoning_content"), msg["content"]), (r, a), "bridge: an effort leaves Qwen3 as it is")
        body["reasoning_effort"] = "hard"
        try:
            post(False)
            ck.ok(False, "bridge: reasoning_effort hard refused")
        except urllib.error.HTTPError as e:
            ck.ok(e.code == 400 and b"reasoning_effort must be" in e.read(), "bridge: reasoning_effort hard: 400")
    finally:
        ck.eq(b.stop(), 0, "resident-http exits 0")


def check_python(ck, d, seed, r, a):
    """Section 5 too: the Python package's Token.reasoning and Done.reasoning."""
    with resident.connect(d.sock) as c:
        fields = dict(messages=user(QWEN3), seed=seed, top_k=4, **RAISED)
        gen = c.generate(**fields)
        toks = list(gen)
        ck.eq(("".join(t.reasoning for t in toks), "".join(t.text for t in toks)), (r, a),
              "python: the tokens' reasoning and text")
        ck.eq((gen.done.reasoning, gen.done.text, gen.reasoning), (r, a, r), "python: done's reasoning and text")
        done = c.generate(stream=False, **fields).result()
        ck.eq((done.reasoning, done.text, done.tool), (r, a, ""), "python: without streaming")


def harmony_split(ids, piece, mark):
    """(reasoning, answer, tool) of harmony token ids, as PROTOCOL.md says: a
    message's body goes to its channel's part (analysis: reasoning,
    commentary: tool, anything else or no channel: answer); headers (role,
    channel name) and markers go nowhere."""
    out = {"reasoning": "", "answer": "", "tool": ""}
    state, part, chan = "header", "answer", ""
    for i in ids:
        if i in (mark["<|start|>"], mark["<|end|>"], mark["<|return|>"], mark["<|call|>"]):
            state = "header"
        elif i == mark["<|channel|>"]:
            state, chan = "channel", ""
        elif i == mark["<|message|>"]:
            word = chan.split(" ")[0]
            part = "answer" if state != "channel" else \
                {"analysis": "reasoning", "commentary": "tool"}.get(word, "answer")
            state = "body"
        elif state == "body":
            out[part] += piece(i)
        elif state == "channel":
            chan += piece(i)
    return out["reasoning"], out["answer"], out["tool"]


def check_harmony(ck, c, path):
    """Section 6: gpt-oss's replies split by their markers."""
    mark = {m: c.call("tokenize", text=m, special=True, bos=False, model=path)["tokens"][0]
            for m in ("<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|channel|>", "<|message|>")}
    pieces = {}

    def piece(i):
        if i not in pieces:
            pieces[i] = whole(c, [i], path)
        return pieces[i]

    answered = dropped = 0
    for seed in SEEDS:
        g = c.generate(messages=user(HARMONY), model=path, seed=seed, top_k=6, **RAISED)
        got = parts(g)
        ck.eq(got, harmony_split(g.ids, piece, mark), "harmony seed %d: split by its markers" % seed)
        answered += got[1] != ""
        dropped += whole(c, g.ids, path) != "".join(got)
    ck.ok(answered > 0 and dropped > 0, "harmony: replies with an answer (%d) and headers left out (%d)"
          % (answered, dropped))
    print("   harmony: %d of %d replies answer, %d left headers out" % (answered, len(SEEDS), dropped))


def ntok(c, text, model=None):
    """Tokens of text, special tokens parsed, no BOS."""
    return len(c.call("tokenize", text=text, special=True, bos=False, **({"model": model} if model else {}))["tokens"])


def check_think(ck, d, c, gptoss, both):
    """Section 7: think on both families, bad values, the CLI."""
    closed = ntok(c, "<think>\n\n</think>\n\n")
    for seed in list(both)[:4]:
        base = c.generate(messages=user(QWEN3), seed=seed, top_k=4, **RAISED)
        g = c.generate(messages=user(QWEN3), seed=seed, top_k=4, think=True, **RAISED)
        ck.eq((g.ids, parts(g)), (base.ids, parts(base)), "seed %d: think true is the default" % seed)
        g = c.generate(messages=user(QWEN3), seed=seed, top_k=4, think="high", **RAISED)
        ck.eq(g.ids, base.ids, "seed %d: an effort leaves Qwen3 as it is" % seed)
        g = c.generate(messages=user(QWEN3), seed=seed, top_k=4, think=False, **RAISED)
        ck.eq(g.usage["prompt_tokens"], base.usage["prompt_tokens"] + closed,
              "seed %d: think false: the prompt holds the closed think block (%d tokens more)" % (seed, closed))
        ck.eq(parts(g), ("", whole(c, g.ids), ""), "seed %d: think false: the reply is all answer" % seed)
    for bad in ("maybe", 1, ""):
        e = c.error("generate", messages=user("hi"), think=bad)
        ck.ok(e.get("code") in ("invalid_param", "bad_request") and "think" in e.get("message", ""),
              "think %r refused: %s" % (bad, e))
    sizes = {v: ntok(c, "Reasoning: " + v, gptoss) for v in ("low", "medium", "high")}
    base = c.generate(messages=user(HARMONY), model=gptoss, seed=1, top_k=6, **RAISED)
    for think, effort in (("low", "low"), ("high", "high"), ("medium", "medium"), (False, "low")):
        g = c.generate(messages=user(HARMONY), model=gptoss, seed=1, top_k=6, think=think, **RAISED)
        ck.eq(g.usage["prompt_tokens"] - base.usage["prompt_tokens"], sizes[effort] - sizes["medium"],
              "harmony think %r: the prompt's Reasoning line is %s's" % (think, effort))
        if effort == "medium":
            ck.eq(g.ids, base.ids, "harmony think medium is the default")
    low = c.generate(messages=user(HARMONY), model=gptoss, seed=1, top_k=6, think="low", **RAISED)
    off = c.generate(messages=user(HARMONY), model=gptoss, seed=1, top_k=6, think=False, **RAISED)
    ck.eq(off.ids, low.ids, "harmony think false is low")
    seed = next(iter(both))
    sid = c.call("session.new", defaults=dict(RAISED, top_k=4, seed=seed))["session"]["session"]
    out = json.loads(run_cli(d, ["run", "--json", "--think", "off", "--session", sid, QWEN3]))
    ck.ok(not out.get("reasoning") and out.get("text"), "run --think off: an answer, no reasoning: %r" % out)
    r = subprocess.run([rsd.tool("resident"), "--socket", d.sock, "run", "--think", "maybe", "x"],
                       capture_output=True, text=True, timeout=30)
    ck.ok(r.returncode == 2 and "--think wants on, off, low, medium or high" in r.stderr,
          "run --think maybe: a usage error (%d: %s)" % (r.returncode, r.stderr.strip()))


def main():
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-reason-")
    try:
        models = [rsd.gen_model(os.path.join(tmp, name + ".gguf"), seed=3, shape=shape)
                  for name, shape in (("qwen3moe", "tiny-qwen3moe"), ("gptoss", "tiny-gptoss"))]
        sections(ck, *models)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


def sections(ck, qwen3, gptoss):
    """The sections in order, on one daemon; the first seed that reasons serves the later ones."""
    with Daemon(model=qwen3) as d:
        c = d.client(timeout=60)
        both = {}
        with ck.section("Qwen3: reasoning and answer split"):
            both = check_qwen3(ck, c)
        with ck.section("stop strings are the answer's"):
            check_stops(ck, c, both)
        seed, (r, a) = next(iter(both.items()))
        with ck.section("sessions: stored apart, not rendered again"):
            c = check_session(ck, d, c)
        with ck.section("the CLI"):
            check_cli(ck, d, c, seed, r, a)
        with ck.section("resident-http and the Python package"):
            check_bridge(ck, d, seed, r, a)
            check_python(ck, d, seed, r, a)
        with ck.section("harmony: analysis, final and headers"):
            check_harmony(ck, c, gptoss)
        with ck.section("think"):
            check_think(ck, d, c, gptoss, both)
        c.close()


if __name__ == "__main__":
    rsd.main(main)
