#!/usr/bin/env python3
"""test_openai.py: resident-http, the OpenAI-compatible endpoint, driven by
the official `openai` package from PyPI and by curl, in front of residentd
on a generated tiny model.

Replies are compared with what the daemon itself answers to the same
request (greedy, so equal), streamed and not, chat and completions; stop,
seed, top_p and max_tokens reach the daemon; two clients are served at
once; a bad request, an unknown model or session, a body or a frame too
large, a full queue, a missing API key, an unreachable daemon and bad flags
get their status and OpenAI's error shape; a client that leaves, or that
stops reading, cancels its generation (a cancelled turn leaves its session
untouched); a session is resumed with only the new message; curl sees the
event stream's exact framing. logprobs and top_logprobs, chat and
completions, streamed and not, are the daemon's own: as many top tokens as
asked for, best first, the greedy token the first of them, -inf (a token a
grammar forbids) shown as -9999.0. response_format json_schema and
json_object, streamed and not, sampled hot: every reply parses and
validates against its schema (the `jsonschema` package).

Skips (exit 77) when the `openai` package or curl is missing.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402

try:
    import openai
except ImportError:
    openai = None

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MODEL = "tiny"          # rsd.Daemon's model file is tiny.gguf
LONG = 1500             # max_tokens of a generation that runs long enough to leave it (as test_protocol)
MAX_FRAME = 65536       # the daemon's --max-frame


class Bridge:
    """resident-http on a free port of 127.0.0.1, in front of socket."""

    def __init__(self, socket_path, extra=()):
        self.argv = [rsd.tool("resident-http"), "--listen", "127.0.0.1:0", "-s", socket_path, *extra]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", self.text())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("resident-http did not start:\n" + self.text())
            time.sleep(0.02)
        self.url = "http://127.0.0.1:%d/v1" % self.port

    def text(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=60)

    def wait_log(self, pattern, timeout=20):
        """Waits for a log line matching pattern; returns the match or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text())
            if m:
                return m
            time.sleep(0.02)
        return None

    def stop(self):
        """SIGTERM: it must exit 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def user(text):
    return [{"role": "user", "content": text}]


def curl(*args):
    """Runs curl -s, a body (-d) sent as JSON (curl's -d alone sends a form's type, which
    the bridge refuses); returns (status, headers text, body)."""
    json_type = ["-H", "Content-Type: application/json"] if "-d" in args else []
    r = subprocess.run(["curl", "-s", "-N", "-D", "-", "--max-time", "60", *json_type, *args], capture_output=True,
                       timeout=90)
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.\d (\d+)", head)
    return int(m.group(1)) if m else 0, head.decode("latin-1"), body.decode("utf-8", "replace")


def status_error(ck, fn, cls, status, what, **want):
    """fn() must raise the openai error class cls with this status (and code,
    param...), its body in OpenAI's error shape."""
    e = ck.raises(fn, cls, what, status_code=status, **want)
    if e is not None:
        ck.ok(isinstance(e.body, dict) and isinstance(e.body.get("message"), str) and "type" in e.body,
              "%s: the error body has OpenAI's shape: %r" % (what, e.body))
    return e


def daemon_gen(c, **kw):
    """The daemon's own reply to a generate (the reference the bridge must match)."""
    return c.generate(stream=False, **kw)


def check_models(ck, oc):
    ids = [m.id for m in oc.models.list().data]
    ck.eq(ids, [MODEL], "GET /v1/models")
    ck.eq(oc.models.retrieve(MODEL).id, MODEL, "GET /v1/models/tiny")
    status_error(ck, lambda: oc.models.retrieve("nope"), openai.NotFoundError, 404, "an unknown model",
                 code="model_not_found")


def check_chat(ck, oc, dc):
    msgs = user("Say something.")
    want = daemon_gen(dc, messages=msgs, max_tokens=24, temperature=0)
    r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0)
    ck.eq(r.choices[0].message.content, want.text, "chat: the daemon's greedy text")
    ck.eq(r.choices[0].message.role, "assistant", "chat: role")
    ck.eq(r.choices[0].finish_reason, "length" if want.finish == "length" else "stop", "chat: finish_reason")
    ck.eq((r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens),
          (want.usage["prompt_tokens"], want.usage["generated_tokens"],
           want.usage["prompt_tokens"] + want.usage["generated_tokens"]), "chat: usage")
    ck.ok(r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL, "chat: id, object")

    chunks = list(oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0,
                                             stream=True, stream_options={"include_usage": True}))
    ck.eq(chunks[0].choices[0].delta.role, "assistant", "stream: the first chunk has the role")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ck.eq(text, want.text, "stream: the deltas make the daemon's text")
    ck.eq(chunks[-2].choices[0].finish_reason, r.choices[0].finish_reason, "stream: finish_reason")
    ck.ok(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens,
          "stream: include_usage adds a last chunk with the usage")
    ck.ok(all(c.usage is None for c in chunks[:-1]), "stream: the other chunks have usage null")
    ck.eq(len({c.id for c in chunks}), 1, "stream: one id for every chunk")
    plain = list(oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, stream=True))
    ck.ok(all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason is not None,
          "stream without include_usage: no usage chunk")


def check_completions(ck, oc, dc):
    want = daemon_gen(dc, prompt="Once upon a time", max_tokens=20, temperature=0)
    r = oc.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0)
    ck.eq(r.choices[0].text, want.text, "completions: the daemon's greedy text")
    ck.eq(r.usage.prompt_tokens, want.usage["prompt_tokens"], "completions: prompt tokens")
    ck.ok(r.id.startswith("cmpl-") and r.object == "text_completion", "completions: id, object")
    chunks = list(oc.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0,
                                        stream=True))
    ck.eq("".join(c.choices[0].text for c in chunks), want.text, "completions stream: the daemon's text")
    ck.eq(chunks[-1].choices[0].finish_reason, r.choices[0].finish_reason, "completions stream: finish_reason")


def check_sampling(ck, oc, dc):
    msgs = user("Tell a story.")
    greedy = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=0)
    text = greedy.choices[0].message.content
    cut = next((i for i in range(8, len(text) - 2) if text[i:i + 2].strip() and text[:i].strip()), None)
    if cut is not None:
        stop = text[cut:cut + 2]
        r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=0, stop=[stop])
        ck.eq((r.choices[0].message.content, r.choices[0].finish_reason), (text[:text.find(stop)], "stop"),
              "stop: the text ends before the stop string")
    ck.eq(oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=1.5,
                                     top_p=1e-6).choices[0].message.content, text,
          "top_p: a tiny top_p keeps the likeliest token only (the greedy text)")
    a, b, c = (oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30, temperature=1.5, seed=s)
               .choices[0].message.content for s in (7, 7, 8))
    want = daemon_gen(dc, messages=msgs, max_tokens=30, temperature=1.5, seed=7).text
    ck.ok(a == b == want, "seed: the same seed gives the daemon's text again")
    ck.ok(a != c, "seed: another seed gives another text")
    # OpenAI's seed is any int64: a negative one is the daemon's seed of the same 64 bits
    neg = [oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30, temperature=1.5, seed=-7)
           .choices[0].message.content for _ in range(2)]
    want = daemon_gen(dc, messages=msgs, max_tokens=30, temperature=1.5, seed=2**64 - 7).text
    ck.ok(neg[0] == neg[1] == want, "seed -7: taken, the daemon's seed 2**64-7, the same text again")
    r = oc.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=3)
    ck.eq(r.usage.completion_tokens, 3, "max_completion_tokens")


def close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(a))


def check_chat_lp_entries(ck, what, content, top_n):
    """Chat logprobs entries: bytes decode to the token, top_n top tokens,
    best first, the greedy token the first (and so the best) of them."""
    ck.ok(all(bytes(e.bytes).decode("utf-8", "replace") == e.token for e in content),
          "%s: each token string is its bytes decoded" % what)
    ck.ok(all(len(e.top_logprobs) == top_n for e in content),
          "%s: %d top_logprobs per token (%s)" % (what, top_n, sorted({len(e.top_logprobs) for e in content})))
    ck.ok(all(all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:])) for e in content),
          "%s: top_logprobs are best first" % what)
    if top_n:
        ck.ok(all(close(e.logprob, e.top_logprobs[0].logprob) and e.bytes == e.top_logprobs[0].bytes
                  for e in content), "%s: greedy: the token is the first of the top_logprobs" % what)
    ck.ok(all(-9999.0 <= e.logprob <= 0 for e in content), "%s: logprobs are log-probabilities" % what)


def check_logprobs(ck, oc, dc):
    msgs = user("Say something.")
    want = daemon_gen(dc, messages=msgs, max_tokens=16, temperature=0)
    own = [t for t in dc.generate(messages=msgs, max_tokens=16, temperature=0, stream=True, logprobs=True,
                                  top_logprobs=3).tokens if t.get("text") or not (t.get("reasoning") or t.get("tool"))]
    r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0, logprobs=True,
                                   top_logprobs=3)
    content = r.choices[0].logprobs.content
    ck.eq(r.choices[0].message.content, want.text, "chat logprobs: the text is the daemon's greedy text")
    ck.ok(1 <= len(content) <= r.usage.completion_tokens, "chat logprobs: an entry per token (%d of %d)" % (
        len(content), r.usage.completion_tokens))
    ck.eq([(bytes(e.bytes), e.logprob, [(bytes(x.bytes), x.logprob) for x in e.top_logprobs]) for e in content],
          [(t["bytes"], t["logprob"], [(x["bytes"], x["logprob"]) for x in t["top_logprobs"]]) for t in own],
          "chat logprobs: the daemon's own tokens and logprobs")
    ck.eq(b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace"), want.text,
          "chat logprobs: the tokens' bytes make the text")
    check_chat_lp_entries(ck, "chat logprobs", content, 3)

    chunks = list(oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0,
                                             logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    ck.eq("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), want.text,
          "chat logprobs stream: the text")
    ck.eq([(e.token, e.bytes, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in streamed],
          [(e.token, e.bytes, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in content],
          "chat logprobs stream: the chunks' logprobs are those of the whole reply")
    ck.ok(all(len(c.choices[0].logprobs.content) == 1 for c in chunks if c.choices and c.choices[0].logprobs),
          "chat logprobs stream: one token a chunk")

    for n in (0, 20):
        r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=n, stream=n == 20)
        content = (r.choices[0].logprobs.content if n == 0 else
                   [e for c in r if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content])
        ck.ok(len(content) >= 1, "chat top_logprobs=%d: entries" % n)
        check_chat_lp_entries(ck, "chat top_logprobs=%d" % n, content, n)
    r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0)
    ck.ok(r.choices[0].logprobs is None, "chat without logprobs: logprobs null")

    # a grammar that allows fewer tokens than asked for: the others are -inf, shown as -9999.0
    r = oc.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                   top_logprobs=20, extra_body={"grammar": 'root ::= "yes" | "no"'})
    content = r.choices[0].logprobs.content
    ck.ok(r.choices[0].message.content in ("yes", "no"), "grammar logprobs: the text is the grammar's")
    check_chat_lp_entries(ck, "grammar logprobs", content, 20)
    ck.ok(content and content[0].top_logprobs[-1].logprob == -9999.0 and
          all(e.logprob > -9999.0 for e in content),
          "grammar logprobs: forbidden tokens' -inf is -9999.0, the drawn ones are allowed")

    # completions: logprobs N
    prompt = "Once upon a time"
    want = daemon_gen(dc, prompt=prompt, max_tokens=12, temperature=0)
    r = oc.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    ck.eq(r.choices[0].text, want.text, "completions logprobs: the daemon's greedy text")
    ck.ok(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) >= 1,
          "completions logprobs: four arrays of one length")
    ck.eq(lp.text_offset, [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))],
          "completions logprobs: text_offset counts the tokens' characters from 0")
    ck.ok(all(len(d) == 2 for d in lp.top_logprobs), "completions logprobs=2: two top tokens each (%s)" % (
        sorted({len(d) for d in lp.top_logprobs})))
    ck.ok(all(close(max(d.values()), v) for d, v in zip(lp.top_logprobs, lp.token_logprobs)),
          "completions logprobs: greedy: the token's logprob is the best of the top tokens")
    if "\ufffd" not in "".join(lp.tokens):
        ck.eq("".join(lp.tokens), want.text, "completions logprobs: the tokens make the text")
    chunks = list(oc.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=2,
                                        stream=True))
    ck.eq("".join(c.choices[0].text for c in chunks), want.text, "completions logprobs stream: the text")
    got = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    ck.eq(([t for g in got for t in g.tokens], [v for g in got for v in g.token_logprobs],
           [d for g in got for d in g.top_logprobs], [o for g in got for o in g.text_offset]),
          (lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset),
          "completions logprobs stream: the chunks' logprobs are those of the whole reply")
    r = oc.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, logprobs=0)
    ck.ok(r.choices[0].logprobs.tokens and all(d == {} for d in r.choices[0].logprobs.top_logprobs),
          "completions logprobs=0: the tokens' logprobs, no top tokens")

    status_error(ck, lambda: oc.chat.completions.create(model=MODEL, messages=msgs, logprobs=True, top_logprobs=21),
                 openai.BadRequestError, 400, "top_logprobs=21", param="top_logprobs")
    status_error(ck, lambda: oc.chat.completions.create(model=MODEL, messages=msgs, top_logprobs=2),
                 openai.BadRequestError, 400, "top_logprobs without logprobs", param="top_logprobs")
    status_error(ck, lambda: oc.completions.create(model=MODEL, prompt=prompt, logprobs=6),
                 openai.BadRequestError, 400, "completions logprobs=6", param="logprobs")


RF_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": False}


def check_response_format(ck, oc):
    import jsonschema
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": RF_SCHEMA}}
    for seed in range(4):
        kw = dict(model=MODEL, messages=user("A person as JSON."), max_tokens=120, temperature=1.5, seed=seed,
                  response_format=fmt)
        r = oc.chat.completions.create(**kw)
        text = "".join(c.choices[0].delta.content or "" for c in oc.chat.completions.create(stream=True, **kw)
                       if c.choices)
        for what, got in (("not streamed", r.choices[0].message.content), ("streamed", text)):
            try:
                jsonschema.validate(json.loads(got), RF_SCHEMA)
                ok = True
            except (ValueError, jsonschema.ValidationError) as e:
                ok, got = False, f"{got!r}: {e}"
            ck.ok(ok, f"response_format json_schema, seed {seed}, {what}: valid" + ("" if ok else f" ({got})"))
        ck.eq(text, r.choices[0].message.content, f"response_format json_schema, seed {seed}: streamed the same")
        ck.eq(r.choices[0].finish_reason, "stop", f"response_format json_schema, seed {seed}: ends with the schema")
    r = oc.chat.completions.create(model=MODEL, messages=user("JSON."), max_tokens=120, temperature=1.5, seed=7,
                                   response_format={"type": "json_object"})
    try:
        ok = isinstance(json.loads(r.choices[0].message.content), dict)
    except ValueError:
        ok = False
    ck.ok(ok or r.choices[0].finish_reason == "length",
          f"response_format json_object: an object or cut by max_tokens ({r.choices[0].message.content!r})")


def check_errors(ck, oc, b):
    status_error(ck, lambda: oc.chat.completions.create(model="nope", messages=user("x")), openai.NotFoundError,
                 404, "chat with an unknown model", code="model_not_found", param="model")
    status_error(ck, lambda: oc.chat.completions.create(model=MODEL, messages=user("x"), n=9),
                 openai.BadRequestError, 400, "n=9", param="n")
    status_error(ck, lambda: oc.chat.completions.create(model=MODEL, messages=[{"role": "function", "content": "x",
                                                                                  "name": "f"}]),
                 openai.BadRequestError, 400, "a function message", param="messages")
    e = status_error(ck, lambda: oc.chat.completions.create(model=MODEL, messages=user("x"), temperature=500),
                     openai.BadRequestError, 400, "a temperature the daemon refuses", code="invalid_param")
    ck.ok(e is not None and "temperature" in e.message, "the daemon's message names the field")
    status_error(ck, lambda: oc.chat.completions.create(model=MODEL, messages=user("x " * 3000)),
                 openai.BadRequestError, 400, "a prompt over the context", code="context_length_exceeded")
    status_error(ck, lambda: oc.completions.create(model=MODEL, prompt="x", echo=True), openai.BadRequestError,
                 400, "echo", param="echo")
    status_error(ck, lambda: oc.chat.completions.create(model=MODEL, messages=user("x"), stream=True,
                                                       extra_body={"session": "0" * 8 + "-0000-0000-0000-" + "0" * 12}),
                 openai.NotFoundError, 404, "an unknown session", code="session_not_found", param="session")
    # curl: what the openai package cannot send
    st, head, body = curl(b.url + "/chat/completions", "-d", '{"model": "tiny", "messages": [')
    ck.eq(st, 400, "invalid JSON: 400")
    ck.ok(json.loads(body)["error"]["type"] == "invalid_request_error" and "application/json" in head,
          "invalid JSON: a JSON error body")
    st, _, body = curl(b.url + "/chat/completions", "-d", json.dumps({"model": MODEL, "messages": user("x" * MAX_FRAME)}))
    ck.ok(st == 413 and json.loads(body)["error"]["code"] == "request_too_large",
          "a request over the daemon's frame limit: 413 (%d %s)" % (st, body[:200]))
    st, _, body = curl(b.url + "/nothing")
    ck.ok(st == 404 and json.loads(body)["error"]["code"] == "unknown_url", "an unknown URL: 404")
    st, head, body = curl("-X", "POST", b.url + "/models")
    ck.ok(st == 405 and "Allow: GET" in head and "error" in json.loads(body), "POST /v1/models: 405 with Allow")


def check_framing(ck, b):
    """The raw event stream, as curl receives it."""
    st, head, body = curl(b.url + "/chat/completions", "-d",
                          json.dumps({"model": MODEL, "messages": user("hi"), "max_tokens": 8, "stream": True,
                                      "stream_options": {"include_usage": True}}))
    ck.eq(st, 200, "stream: 200")
    ck.ok(re.search(r"(?im)^content-type: text/event-stream\r?$", head), "stream: Content-Type text/event-stream")
    ck.ok(body.endswith("data: [DONE]\n\n"), "stream: ends with data: [DONE] and a blank line")
    events = body.split("\n\n")
    ck.eq(events[-1], "", "stream: every event ends with a blank line")
    ck.ok(all(e.startswith("data: ") and "\n" not in e for e in events[:-1]), "stream: one data line per event")
    objs = [json.loads(e[6:]) for e in events[:-2]]
    ck.ok(all(o["object"] == "chat.completion.chunk" for o in objs), "stream: every event is a chunk")
    ck.ok(objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] >= 1, "stream: the usage chunk")
    st, _, body = curl(b.url + "/completions", "-d", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 3,
                                                                 "stream": True}))
    ck.ok(st == 200 and body.endswith("data: [DONE]\n\n") and
          all(json.loads(e[6:])["object"] == "text_completion" for e in body.split("\n\n")[:-2]),
          "completions stream framing")


def check_concurrent(ck, b, long_msgs):
    """Two clients at once: a stream stays open, unread, while another request is answered."""
    ref = b.client().chat.completions.create(model=MODEL, messages=user("second"), max_tokens=16, temperature=0)
    got, errs = {}, []
    second_done = threading.Event()

    def first():
        try:
            s = b.client().chat.completions.create(model=MODEL, messages=long_msgs, max_tokens=200,
                                                   temperature=0, stream=True)
            it = iter(s)
            head = next(it)
            if not second_done.wait(30):
                errs.append("the second request was not answered while the first stream was open")
            got["first"] = (head.choices[0].delta.content or "") + "".join(c.choices[0].delta.content or "" for c in it)
        except Exception as e:  # noqa: BLE001
            errs.append(repr(e))

    def second():
        try:
            r = b.client().chat.completions.create(model=MODEL, messages=user("second"), max_tokens=16,
                                                   temperature=0)
            got["second"] = r.choices[0].message.content
        except Exception as e:  # noqa: BLE001
            errs.append(repr(e))
        second_done.set()

    t1 = threading.Thread(target=first)
    t1.start()
    time.sleep(0.1)
    t2 = threading.Thread(target=second)
    t2.start()
    t1.join(60)
    t2.join(60)
    ck.eq(errs, [], "two clients at once")
    want = b.client().chat.completions.create(model=MODEL, messages=long_msgs, max_tokens=200, temperature=0)
    ck.eq(got.get("first"), want.choices[0].message.content, "two clients: the stream's text")
    ck.eq(got.get("second"), ref.choices[0].message.content, "two clients: the other reply")


def turns(dc, sid):
    return dc.call("session.get", session=sid)["turns"]


def check_disconnect(ck, b, dc, long_msgs):
    """A client that leaves, streamed or not, cancels its generation."""
    oc = b.client()
    left = "the client left: generation cancelled"
    before = b.text().count(left)
    with oc.chat.completions.with_streaming_response.create(model=MODEL, messages=long_msgs, max_tokens=LONG,
                                                            temperature=0, stream=True,
                                                            extra_body={"session": "new"}) as resp:
        sid = resp.headers.get("x-resident-session")
        first = next(json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: "))
    ck.ok(sid and UUID.match(sid), "stream: X-Resident-Session names the new session")
    ck.eq(first.get("session"), sid, "stream: chunks carry the session")
    m = b.wait_log(r"the client left: generation cancelled after (\d+) tokens")
    ck.ok(m and int(m.group(1)) < LONG, "a streaming client that leaves: its generation is cancelled")
    ck.eq(len(turns(dc, sid)), 0, "the cancelled turn is not committed to the session")
    s = oc.chat.completions.create(model=MODEL, messages=long_msgs, max_tokens=LONG, temperature=0, stream=True,
                                   extra_headers={"X-Resident-Session": sid})
    next(iter(s))
    ck.ok(any(k["client"] == "resident-http" and k["requests"] >= 1 for k in dc.call("status")["clients"]),
          "the daemon's status names the bridge's connection")
    s.close()
    ck.ok(rsd.wait_for(lambda: b.text().count(left) == before + 2, timeout=20),
          "the openai package closing a stream cancels it")
    ck.eq(len(turns(dc, sid)), 0, "the session is still untouched")
    ck.ok(rsd.wait_for(lambda: dc.call("status")["active"] == 0), "the daemon runs nothing afterwards")

    # not streamed: the bridge sends nothing until the end, so it must see the close itself
    body = json.dumps({"model": MODEL, "messages": long_msgs, "max_tokens": LONG, "temperature": 0,
                       "session": sid}).encode()
    left = "the client left: generation cancelled"
    before = b.text().count(left)
    with socket.create_connection(("127.0.0.1", b.port)) as so:
        so.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.05)
    ck.ok(rsd.wait_for(lambda: b.text().count(left) > before, timeout=20),
          "a client that leaves before a reply that is not streamed: its generation is cancelled")
    ck.eq(len(turns(dc, sid)), 0, "the session is still untouched")


def check_slow_client(ck, d, dc, long_msgs):
    """A client that leaves a stream unread past --max-unread is dropped and its generation cancelled."""
    b = Bridge(d.sock, ["--max-unread", "1"])
    try:
        sid = dc.call("session.new")["session"]["session"]
        st, _, body = curl(b.url + "/chat/completions", "-d", json.dumps(
            {"model": MODEL, "messages": long_msgs, "max_tokens": LONG, "temperature": 0, "stream": True,
             "session": sid}))
        ck.ok("[DONE]" not in body, "a dropped client's stream is cut short")
        ck.ok(b.wait_log(r"unread: dropped") and b.wait_log(r"the client left: generation cancelled"),
              "the bridge says it dropped the client and cancelled its generation")
        ck.eq(len(turns(dc, sid)), 0, "the dropped client's turn is not committed")
    finally:
        ck.eq(b.stop(), 0, "resident-http stops on SIGTERM with status 0")


def check_overloaded(ck, d, long_msgs):
    """A daemon whose queue is full: 429, and the bridge goes on serving."""
    tmp = os.path.join(d.tmp, "ovl")
    os.makedirs(tmp)
    with Daemon(extra=["--max-queue", "1", "--max-seqs", "1"], tmp=tmp, model=d.model) as d2, \
            d2.client(timeout=30) as dc2:
        b = Bridge(d2.sock)
        try:
            oc = b.client()
            running = oc.chat.completions.create(model=MODEL, messages=long_msgs, max_tokens=LONG, temperature=0,
                                                 stream=True)
            next(iter(running))
            waiting = []
            t = threading.Thread(target=lambda: waiting.append(oc.chat.completions.create(
                model=MODEL, messages=user("queued"), max_tokens=2)))
            t.start()
            ck.ok(rsd.wait_for(lambda: dc2.call("status")["queued"] == 1), "a request waits in the daemon's queue")
            status_error(ck, lambda: oc.chat.completions.create(model=MODEL, messages=user("more"), max_tokens=2),
                         openai.RateLimitError, 429, "a full queue", code="overloaded")
            running.close()
            t.join(30)
            ck.ok(waiting and waiting[0].usage.completion_tokens == 2, "the queued request is served after")
        finally:
            ck.eq(b.stop(), 0, "resident-http stops on SIGTERM with status 0")


def check_session(ck, b, dc):
    """A session resumed with the new message only."""
    oc = b.client()
    r1 = oc.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, extra_body={"session": "new"},
                                    messages=[{"role": "system", "content": "You are terse."},
                                              {"role": "user", "content": "Hello there."}])
    sid = r1.model_extra.get("session")
    ck.ok(sid and UUID.match(sid), "session new: the reply names the session")
    r2 = oc.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, messages=user("And then?"),
                                    extra_body={"session": sid})
    ck.eq(r2.model_extra.get("session"), sid, "session: the reply names it again")
    ck.ok(r2.usage.prompt_tokens > r1.usage.prompt_tokens + r1.usage.completion_tokens,
          "session: the prompt holds the history (%d > %d + %d)" % (
              r2.usage.prompt_tokens, r1.usage.prompt_tokens, r1.usage.completion_tokens))
    ck.ok(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens,
          "session: the history was not computed again (%d cached)" % r2.usage.prompt_tokens_details.cached_tokens)
    got = dc.call("session.get", session=sid)
    ck.eq(got["session"]["system"], "You are terse.", "session: the system message is the session's")
    ck.eq([(t["role"], t["content"]) for t in got["turns"]],
          [("user", "Hello there."), ("assistant", r1.choices[0].message.content),
           ("user", "And then?"), ("assistant", r2.choices[0].message.content)], "session: its turns")
    # the same two turns in a session of the daemon's own give the same replies
    own = dc.call("session.new", system="You are terse.")["session"]["session"]
    want = [daemon_gen(dc, session=own, messages=user(t), max_tokens=12, temperature=0).text
            for t in ("Hello there.", "And then?")]
    ck.eq([r1.choices[0].message.content, r2.choices[0].message.content], want,
          "session: the replies of the daemon's own session")
    status_error(ck, lambda: oc.completions.create(model=MODEL, prompt="x", extra_body={"session": sid}),
                 openai.BadRequestError, 400, "a session with completions", param="session")


def check_api_key(ck, d, tmp):
    key = os.path.join(tmp, "key")
    with open(key, "w") as f:
        f.write("s3cret\n")
    b = Bridge(d.sock, ["--api-key-file", key, "--max-body", "4096"])
    try:
        st, _, _ = curl("-H", "Authorization: Bearer s3cret", b.url + "/completions", "-d",
                        json.dumps({"model": MODEL, "prompt": "x" * 5000}))
        ck.eq(st, 413, "a body over --max-body")
        status_error(ck, lambda: b.client("wrong").models.list(), openai.AuthenticationError, 401,
                     "a wrong API key", code="invalid_api_key")
        status_error(ck, lambda: b.client("s3cre").models.list(), openai.AuthenticationError, 401,
                     "a prefix of the API key")
        ck.eq([m.id for m in b.client("s3cret").models.list().data], [MODEL], "the right API key")
    finally:
        ck.eq(b.stop(), 0, "resident-http stops on SIGTERM with status 0")


def check_no_daemon(ck, tmp):
    b = Bridge(os.path.join(tmp, "no-such-socket"))
    try:
        ck.ok(b.wait_log("residentd is not running"), "at start it says residentd is not running")
        e = status_error(ck, lambda: b.client().models.list(), openai.APIStatusError, 503, "no daemon",
                         code="daemon_unavailable")
        ck.ok(e is not None and "no-such-socket" in e.message, "no daemon: the message names the socket")
    finally:
        b.stop()


def check_flags(ck, tmp):
    exe = rsd.tool("resident-http")
    for args, what, rc in ((["--listen", "nonsense"], "ADDR:PORT", 2), (["--bogus"], "unknown option --bogus", 2),
                           (["-s"], "-s needs a value", 2),
                           (["--api-key-file", os.path.join(tmp, "none")], "No such file", 2),
                           (["--max-body", "lots"], "number of bytes", 2), (["-l", "loud"], "unknown log level", 2),
                           (["--listen", "256.0.0.1:1"], "cannot listen on 256.0.0.1:1: no such address", 1)):
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10)
        ck.ok(r.returncode == rc and what in r.stderr and len(r.stderr.strip().splitlines()) == 1,
              "resident-http %s: exit %d saying %r (got %d: %s)" % (" ".join(args), rc, what, r.returncode,
                                                                     r.stderr.strip()[:300]))
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10)
    ck.ok(r.returncode == 0 and "--listen" in r.stdout, "--help")
    r = subprocess.run([rsd.tool("resident-openai"), "--version"], capture_output=True, text=True, timeout=10)
    ck.ok(r.returncode == 0 and r.stdout.startswith("resident-http "), "the old name, resident-openai, runs it")


def run():
    if openai is None:
        raise Skip("the PyPI package openai is not installed (pip install openai; contrib/install-deps.sh)")
    if shutil.which("curl") is None:
        raise Skip("curl is not installed (contrib/install-deps.sh)")
    ck = Checks()
    with Daemon(extra=["--max-frame", str(MAX_FRAME)]) as d:
        b = Bridge(d.sock)
        with d.client(timeout=60) as dc:
            long_msgs = user(rsd.long_prompt(dc, LONG, messages=True))
            oc = b.client()
            for name, fn in (("models", lambda: check_models(ck, oc)),
                             ("chat", lambda: check_chat(ck, oc, dc)),
                             ("completions", lambda: check_completions(ck, oc, dc)),
                             ("sampling", lambda: check_sampling(ck, oc, dc)),
                             ("logprobs", lambda: check_logprobs(ck, oc, dc)),
                             ("response_format", lambda: check_response_format(ck, oc)),
                             ("errors", lambda: check_errors(ck, oc, b)),
                             ("framing", lambda: check_framing(ck, b)),
                             ("concurrent", lambda: check_concurrent(ck, b, long_msgs)),
                             ("disconnect", lambda: check_disconnect(ck, b, dc, long_msgs)),
                             ("slow client", lambda: check_slow_client(ck, d, dc, long_msgs)),
                             ("overloaded", lambda: check_overloaded(ck, d, long_msgs)),
                             ("session", lambda: check_session(ck, b, dc)),
                             ("api key", lambda: check_api_key(ck, d, d.tmp)),
                             ("no daemon", lambda: check_no_daemon(ck, d.tmp)),
                             ("flags", lambda: check_flags(ck, d.tmp))):
                with ck.section(name):
                    fn()
        ck.eq(b.stop(), 0, "resident-http stops on SIGTERM with status 0")
        if ck.failed:
            print(b.text()[-3000:])
    return ck


if __name__ == "__main__":
    rsd.main(run)
