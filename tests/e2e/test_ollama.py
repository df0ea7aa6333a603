#!/usr/bin/env python3
"""test_ollama.py: Ollama's API of resident-http, driven by the `ollama`
package from PyPI (Ollama's own Python client), in front of residentd on
generated models: tiny (Llama 3's template) and tiny-qwen3moe (Qwen3's:
reasoning, and tool calls as tool text).

1. Models: list (/api/tags: NAME:latest, the file's size and time), ps
   (/api/ps: the loaded models, their keep-alive as expires_at), show
   (/api/show: details, model_info, capabilities by template family),
   /api/version; name:tag resolution (NAME:latest, a name with a ':' of its
   own as it is, a wrong tag 404); an unknown model is a 404 in Ollama's
   error shape.
2. chat and generate, streamed (NDJSON, each line an object, the last one
   done with its counts and durations) and not: greedy replies are the
   daemon's own to the same request; generate's prompt goes through the
   template (after its system prompt), raw's does not; options reach the
   daemon (num_predict, stop, seed; no seed draws a new one, as Ollama's
   default does), keep_alive sets the model's, an empty request loads or
   unloads it; logprobs.
3. format: a JSON Schema (sampled hot, every reply validates, streamed
   and not) and "json"; a schema the daemon refuses is a 400.
4. tools: a required call (resident's own tool_choice, added to the
   client's bodies) comes back parsed in message.tool_calls, its arguments
   an object the tool's schema validates, streamed and not, on Llama 3.1's
   calls written as text and Qwen3's tool text; auto; a round trip with
   the calls and a tool message.
5. think: Qwen3's reasoning is message.thinking (generate: thinking),
   streamed and not; think false is the daemon's (Qwen3 answers at once:
   the daemon's own reply to think false, all content).
6. Refused with a clear error: images, pull, push, create, copy, delete;
   unsupported options.
7. The port: --ollama takes Ollama's 11434 or fails saying so; without
   --listen the bridge takes 11434 when it is free, where the ollama
   package looks by default, and 127.0.0.1:8080 when it is not.

Skips (exit 77) without the `ollama` or `jsonschema` package.
"""
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402
from test_openai import Bridge  # noqa: E402

try:
    import httpx
    import ollama
except ImportError:
    ollama = None
try:
    import jsonschema
except ImportError:
    jsonschema = None

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
    "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now", "description": "The time.",
                                           "parameters": {"type": "object", "properties": {}}}}]
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"], "additionalProperties": False}
# Qwen3's reasoning raised as test_reasoning.py raises it: the prompt's tokens, drawn about evenly
QWEN3 = "<think>a</think>b" * 10
RAISED = {"presence_penalty": -10.0, "frequency_penalty": -10.0, "temperature": 50.0, "top_p": 1.0, "min_p": 0.0,
          "top_k": 4}


class Extra(httpx.BaseTransport if ollama else object):
    """Adds fields to each request's JSON body: resident's own (tool_choice),
    which the ollama package has no parameter for."""

    def __init__(self, **fields):
        self.inner = httpx.HTTPTransport()
        self.fields = fields

    def handle_request(self, request):
        body = json.loads(request.read() or b"{}")
        body.update(self.fields)
        content = json.dumps(body).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        return self.inner.handle_request(httpx.Request(request.method, request.url, headers=headers,
                                                       content=content, extensions=request.extensions))

    def close(self):
        self.inner.close()


def client(b, **fields):
    return ollama.Client(host="http://127.0.0.1:%d" % b.port, timeout=120,
                         **({"transport": Extra(**fields)} if fields else {}))


def name_of(path):
    return os.path.splitext(os.path.basename(path))[0]


def when(text):
    """An RFC 3339 time as Ollama writes it, as a Unix time."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")[:26] + "+00:00").timestamp()


def status_model(dc, name):
    return next(m for m in dc.call("status")["models"] if m["name"] == name)


def error(ck, fn, status, what, says):
    """fn() must raise ollama.ResponseError with status, its error a message that holds says."""
    e = ck.raises(fn, ollama.ResponseError, what, status_code=status)
    if e is not None:
        ck.ok(isinstance(e.error, str) and says in e.error, "%s: the error says %r: %r" % (what, says, e.error))
    return e


def final_counts(ck, last, want, what):
    """The last object's counts are the daemon's usage; its durations are nanoseconds that add up."""
    ck.ok(last.done and last.done_reason == ("length" if want.finish in ("length", "context") else "stop"),
          "%s: done, done_reason %r" % (what, last.done_reason))
    ck.eq((last.prompt_eval_count, last.eval_count), (want.usage["prompt_tokens"], want.usage["generated_tokens"]),
          what + ": prompt_eval_count and eval_count")
    ck.ok(0 < last.prompt_eval_duration <= last.total_duration and 0 <= last.eval_duration <= last.total_duration
          and last.load_duration == 0 and last.total_duration < 60e9,
          "%s: durations in nanoseconds (total %d, prompt %d, eval %d)" % (what, last.total_duration,
                                                                          last.prompt_eval_duration,
                                                                          last.eval_duration))


def check_models(ck, b, d, dc):
    cl = client(b)
    name = name_of(d.model)
    dc.generate(messages=ASK, max_tokens=1)          # loaded
    listed = {m["name"]: m for m in dc.call("model.list")["models"]}
    tags = cl.list().models
    ck.eq([m.model for m in tags], [name + ":latest"], "list: NAME:latest")
    st = os.stat(d.model)
    ck.eq(tags[0].size, listed[name]["size"], "list: a loaded model's size is its weights'")
    ck.ok(abs(tags[0].modified_at.timestamp() - st.st_mtime) < 1e-3, "list: modified_at is the file's mtime")
    ck.eq((tags[0].details.format, tags[0].details.family), ("gguf", "llama"), "list: format and family")
    raw = httpx.get(b.http + "/api/tags").json()["models"][0]
    ck.eq((raw["name"], raw["digest"]), (name + ":latest", ""), "list: name, and no digest")

    ps = cl.ps().models
    ck.eq([m.model for m in ps], [name + ":latest"], "ps: the loaded model")
    sm = status_model(dc, name)
    ck.eq((ps[0].size, ps[0].size_vram), (sm["memory_bytes"], 0), "ps: size, on the CPU none in VRAM")
    left = ps[0].expires_at.timestamp() - time.time()
    ck.ok(sm["keep_alive_s"] - 30 < left <= sm["keep_alive_s"] + 1, "ps: expires_at is its keep-alive from now "
          "(%.1fs left of %.0fs)" % (left, sm["keep_alive_s"]))

    shown = dc.call("model.show", model=name)["model"]
    s = cl.show(name + ":latest")
    ck.eq(s.capabilities, ["completion", "tools"], "show: Llama 3's template has tools, no thinking")
    ck.eq((s.details.family, s.details.quantization_level), ("llama", shown["quantization"]),
          "show: family and quantization")
    ck.ok(re.fullmatch(r"[0-9.]+[KMB]", s.details.parameter_size or ""), "show: parameter_size %r" %
          s.details.parameter_size)
    ck.eq((s.modelinfo["general.parameter_count"], s.modelinfo["llama.context_length"],
           s.modelinfo["llama.block_count"], s.modelinfo["resident.context_length"]),
          (shown["parameters"], shown["context_train"], shown["layers"], shown["context"]), "show: model_info")
    ck.ok(abs(s.modified_at.timestamp() - st.st_mtime) < 1e-3, "show: modified_at")
    r = httpx.get(b.http + "/api/version")
    ck.ok(r.status_code == 200 and re.fullmatch(r"\d+\.\d+\.\d+", r.json()["version"]), "version: %r" % r.text)
    ck.eq(httpx.head(b.http + "/api/version").status_code, 200, "version: HEAD")
    # the root is where Ollama's clients look for a server: its Go client's Heartbeat (HEAD), apps' probes (GET)
    r = httpx.get(b.http + "/")
    ck.eq((r.status_code, r.text), (200, "Ollama is running"), "GET /: Ollama's answer")
    ck.eq(httpx.head(b.http + "/").status_code, 200, "HEAD /: Ollama's heartbeat")

    for bad in ("nope", "nope:latest", name + ":7b", name.upper()):
        error(ck, lambda: cl.chat(model=bad, messages=ASK), 404, "chat with %r" % bad, "model '%s' not found" % bad)
    error(ck, lambda: cl.show("nope"), 404, "show an unknown model", "model 'nope' not found")
    error(ck, lambda: cl.generate(model="nope", prompt="a", stream=True).__next__(), 404,
          "generate, streamed, of an unknown model", "model 'nope' not found")
    r = httpx.post(b.http + "/api/chat", json={"model": "nope", "messages": ASK})
    ck.eq((r.status_code, list(r.json())), (404, ["error"]), "Ollama's error shape: {\"error\": message}")


def check_names(ck, b, d, dc):
    """A model whose name has a tag of its own, as a file name can give one."""
    cl = client(b)
    tagged = os.path.join(d.tmp, "tiny:q8.gguf")
    shutil.copy(d.model, tagged)
    dc.call("model.load", model=tagged)
    names = [m.model for m in cl.list().models]
    ck.ok("tiny:q8" in names and name_of(d.model) + ":latest" in names, "list: a name with a tag is as it is: %r"
          % names)
    want = dc.generate(model="tiny:q8", messages=ASK, max_tokens=6, temperature=0, stream=False)
    for asked in ("tiny:q8", "tiny:q8:latest"):
        r = cl.chat(model=asked, messages=ASK, options={"num_predict": 6, "temperature": 0})
        ck.eq((r.model, r.message.content), (asked, want.text), "chat with %r: resolved, the name echoed" % asked)
    dc.call("model.unload", model="tiny:q8")


def check_chat(ck, b, dc, model):
    cl = client(b)
    want = dc.generate(messages=ASK, max_tokens=24, temperature=0, stream=False)
    opts = {"num_predict": 24, "temperature": 0}
    r = cl.chat(model=model + ":latest", messages=ASK, options=opts)
    ck.eq((r.message.role, r.message.content, r.message.thinking), ("assistant", want.text, None),
          "chat: the daemon's greedy text")
    ck.eq(r.model, model + ":latest", "chat: model as asked")
    ck.ok(abs(when(r.created_at) - time.time()) < 60, "chat: created_at %r" % r.created_at)
    final_counts(ck, r, want, "chat")
    chunks = list(cl.chat(model=model, messages=ASK, options=opts, stream=True))
    ck.eq("".join(c.message.content or "" for c in chunks), want.text, "chat streamed: the pieces make the text")
    ck.ok(all(not c.done for c in chunks[:-1]) and chunks[-1].done and chunks[-1].message.content == "",
          "chat streamed: done only in the last object, which has no text")
    ck.ok(len(chunks) > 3, "chat streamed: in pieces (%d)" % len(chunks))
    final_counts(ck, chunks[-1], want, "chat streamed")

    # NDJSON as it is on the wire
    with httpx.stream("POST", b.http + "/api/chat", json={"model": model, "messages": ASK, "options": opts}) as s:
        lines = [line for line in s.iter_lines()]
        ctype = s.headers.get("content-type")
    ck.eq(ctype, "application/x-ndjson", "streamed: Content-Type")
    objs = [json.loads(line) for line in lines if line]
    ck.ok(len(objs) == len(lines) and objs[-1]["done"] is True and "total_duration" in objs[-1],
          "streamed: one object a line, no event-stream framing")
    r = httpx.post(b.http + "/api/chat", json={"model": model, "messages": ASK, "options": opts, "stream": False})
    ck.eq((r.status_code, r.headers.get("content-type"), r.json()["message"]["content"]),
          (200, "application/json", want.text), "stream false: one JSON object")


def check_generate(ck, b, dc, model):
    cl = client(b)
    opts = {"num_predict": 16, "temperature": 0}
    want = dc.generate(messages=[{"role": "system", "content": "Be brief."}] + ASK, max_tokens=16, temperature=0,
                       stream=False)
    r = cl.generate(model=model, prompt=ASK[0]["content"], system="Be brief.", options=opts)
    ck.eq(r.response, want.text, "generate: the prompt through the template, after the system prompt")
    final_counts(ck, r, want, "generate")
    chunks = list(cl.generate(model=model, prompt=ASK[0]["content"], system="Be brief.", options=opts, stream=True))
    ck.eq("".join(c.response for c in chunks), want.text, "generate streamed")
    ck.ok(chunks[-1].done and not any(c.done for c in chunks[:-1]), "generate streamed: done last")
    final_counts(ck, chunks[-1], want, "generate streamed")
    want = dc.generate(prompt="Once upon a time", max_tokens=16, temperature=0, stream=False)
    r = cl.generate(model=model, prompt="Once upon a time", raw=True, options=opts)
    ck.eq(r.response, want.text, "generate raw: the prompt as it is")


def check_options(ck, b, dc, model):
    cl = client(b)
    base = dc.generate(messages=ASK, max_tokens=24, temperature=0, stream=False).text
    stop = base[len(base) // 2:len(base) // 2 + 3]
    r = cl.chat(model=model, messages=ASK, options={"num_predict": 24, "temperature": 0, "stop": [stop]})
    ck.eq((r.message.content, r.done_reason), (base[:base.index(stop)], "stop"), "options.stop %r" % stop)
    r = cl.chat(model=model, messages=ASK, options={"num_predict": 5, "temperature": 0})
    ck.eq((r.eval_count, r.done_reason), (5, "length"), "options.num_predict")
    want = dc.generate(messages=ASK, max_tokens=24, temperature=1.0, seed=5, stream=False).text
    r = cl.chat(model=model, messages=ASK, options={"num_predict": 24, "temperature": 1.0, "seed": 5, "top_k": 40,
                                                    "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
                                                    "num_ctx": 8192, "num_gpu": 99, "typical_p": 1.0,
                                                    "repeat_last_n": 64})
    ck.eq(r.message.content, want, "options: seed and sampling reach the daemon; num_ctx and the like are ignored")
    texts = {cl.chat(model=model, messages=ASK, options={"num_predict": 24, "temperature": 1.0}).message.content
             for _ in range(3)}
    ck.ok(len(texts) > 1, "no seed: each request draws its own, as Ollama's default (%d of 3 differ)" % len(texts))
    for opt, val in (("typical_p", 0.5), ("mirostat", 2)):
        error(ck, lambda: cl.chat(model=model, messages=ASK, options={opt: val}), 400, "options.%s" % opt,
              "options.%s is not supported" % opt)
    error(ck, lambda: cl.chat(model=model, messages=ASK, options={"temperature": "hot"}), 400,
          "a temperature that is not a number", "temperature must be a number")

    # keep_alive: the model's, in status and ps
    cl.chat(model=model, messages=ASK, options={"num_predict": 1}, keep_alive="7m")
    ck.eq(status_model(dc, model)["keep_alive_s"], 420.0, "keep_alive \"7m\" is the model's keep-alive")
    left = cl.ps().models[0].expires_at.timestamp() - time.time()
    ck.ok(380 < left <= 421, "ps: expires in about 7 minutes (%.1fs)" % left)
    cl.chat(model=model, messages=ASK, options={"num_predict": 1}, keep_alive=-1)
    ck.ok(cl.ps().models[0].expires_at.year > 2200, "keep_alive -1: kept until its memory is needed")
    # an empty request loads, or with keep_alive 0 unloads
    r = cl.generate(model=model, keep_alive=0)
    ck.eq((r.done, r.done_reason, r.response), (True, "unload", ""), "generate of no prompt, keep_alive 0: unload")
    ck.eq((status_model(dc, model)["loaded"], cl.ps().models), (False, []), "unloaded")
    r = cl.chat(model=model + ":latest", messages=[])
    ck.eq((r.done_reason, r.model, r.message.content), ("load", model + ":latest", ""), "chat of no messages: load")
    ck.eq([m.model for m in cl.ps().models], [model + ":latest"], "loaded again")
    cl.chat(model=model, messages=ASK, options={"num_predict": 1}, keep_alive=0)
    deadline = time.monotonic() + 10
    while status_model(dc, model)["loaded"] and time.monotonic() < deadline:
        time.sleep(0.05)
    ck.eq(status_model(dc, model)["loaded"], False, "a reply with keep_alive 0: unloaded after it")
    cl.generate(model=model)

    # logprobs: the answer's tokens, greedy: each is the first of its top tokens
    for stream in (False, True):
        got = cl.chat(model=model, messages=ASK, options={"num_predict": 8, "temperature": 0}, logprobs=True,
                      top_logprobs=2, stream=stream)
        lps = [lp for c in got for lp in c.logprobs or []] if stream else got.logprobs
        ck.ok(len(lps) == 8 and all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].token == lp.token and
                                    lp.top_logprobs[0].logprob == lp.logprob for lp in lps),
              "logprobs, stream=%s: 8 tokens, each with its 2 top tokens, the greedy one first" % stream)


def check_format(ck, b, model):
    cl = client(b)
    for seed in range(3):
        kw = dict(model=model, messages=[{"role": "user", "content": "A person as JSON."}], format=PERSON,
                  options={"num_predict": 120, "temperature": 1.5, "seed": seed})
        r = cl.chat(**kw)
        text = "".join(c.message.content for c in cl.chat(stream=True, **kw))
        for what, got in (("not streamed", r.message.content), ("streamed", text)):
            try:
                jsonschema.validate(json.loads(got), PERSON)
                ok = True
            except (ValueError, jsonschema.ValidationError) as e:
                ok, got = False, "%r: %s" % (got, e)
            ck.ok(ok, "format as a schema, seed %d, %s: valid%s" % (seed, what, "" if ok else " (%s)" % got))
        ck.eq((text, r.done_reason), (r.message.content, "stop"), "format, seed %d: streamed the same, ends" % seed)
    r = cl.generate(model=model, prompt="JSON.", format="json", options={"num_predict": 120, "temperature": 1.5,
                                                                          "seed": 7})
    try:
        ok = isinstance(json.loads(r.response), dict)
    except ValueError:
        ok = False
    ck.ok(ok or r.done_reason == "length", "format \"json\": an object (%r)" % r.response)
    bad = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}
    for stream in (False, True):
        error(ck, lambda: list(cl.chat(model=model, messages=ASK, format=bad, stream=True)) if stream else
              cl.chat(model=model, messages=ASK, format=bad), 400, "a schema the daemon refuses, stream=%s" % stream,
              "multipleOf")


def valid_calls(ck, calls, what):
    if not ck.ok(calls, "%s: tool_calls" % what):
        return
    for c in calls:
        f = c.function
        ck.ok(f.name in ("get_weather", "now") and isinstance(f.arguments, dict), "%s: %s(%r)" % (what, f.name,
                                                                                            f.arguments))
        if f.name == "get_weather":
            try:
                jsonschema.validate(dict(f.arguments), WEATHER)
            except jsonschema.ValidationError as e:
                ck.ok(False, "%s: arguments %r: %s" % (what, f.arguments, e))


def check_tools(ck, b, model):
    required = client(b, tool_choice="required")
    cl = client(b)
    for seed in range(1, 4):
        kw = dict(model=model, messages=ASK, tools=TOOLS, options={"num_predict": 400, "temperature": 1.0,
                                                                   "seed": seed})
        what = "%s required seed %d" % (model, seed)
        r = required.chat(**kw)
        ck.eq((r.message.content, r.done_reason), ("", "stop"), what + ": no content, done")
        valid_calls(ck, r.message.tool_calls, what)
        chunks = list(required.chat(stream=True, **kw))
        calls = [c for ch in chunks for c in ch.message.tool_calls or []]
        ck.eq("".join(ch.message.content or "" for ch in chunks), "", what + " streamed: no content")
        valid_calls(ck, calls, what + " streamed")
        ck.eq([(c.function.name, dict(c.function.arguments)) for c in calls],
              [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls],
              what + " streamed: the same calls")
    raw = httpx.post(b.http + "/api/chat", json=dict(kw, stream=False, tool_choice="required")).json()
    ck.ok(all(c["id"].startswith("call_") and c["function"]["index"] == i
              for i, c in enumerate(raw["message"]["tool_calls"])), "tool_calls: each with its id and index")
    for stream in (False, True):
        r = cl.chat(model=model, messages=ASK, tools=TOOLS, options={"num_predict": 16, "seed": 3}, stream=stream)
        last = list(r)[-1] if stream else r
        ck.ok(last.done and last.done_reason in ("stop", "length"), "%s auto, stream=%s: %s" % (model, stream,
                                                                                              last.done_reason))
    first = required.chat(model=model, messages=ASK, tools=TOOLS, options={"num_predict": 400, "temperature": 1.0,
                                                                           "seed": 1})
    call = first.message.tool_calls[0]
    msgs = ASK + [first.message, {"role": "tool", "content": "21 C", "tool_name": call.function.name}]
    for stream in (False, True):
        r = cl.chat(model=model, messages=msgs, tools=TOOLS, options={"num_predict": 8, "seed": 2}, stream=stream)
        last = list(r)[-1] if stream else r
        ck.ok(last.done, "%s: a round trip with the calls and the tool's result, stream=%s" % (model, stream))


def check_think(ck, b, dc, model):
    """Seeds whose reply reasons, then answers: as the daemon splits them."""
    cl = client(b)
    both = []
    for seed in range(1, 41):
        g = dc.generate(messages=[{"role": "user", "content": QWEN3}], seed=seed, max_tokens=40, stream=False,
                        **RAISED)
        if g.done.get("reasoning") and g.done.get("text"):
            both.append((seed, g.done["reasoning"], g.done["text"]))
        if len(both) == 2:
            break
    ck.eq(len(both), 2, "seeds that reason, then answer")
    for seed, reasoning, text in both:
        kw = dict(model=model, messages=[{"role": "user", "content": QWEN3}],
                  options=dict(RAISED, seed=seed, num_predict=40))
        for think in (True, None, "high"):
            r = cl.chat(think=think, **kw)
            ck.eq((r.message.thinking, r.message.content), (reasoning, text), "seed %d think=%r: thinking apart"
                  % (seed, think))
        chunks = list(cl.chat(think=True, stream=True, **kw))
        ck.eq(("".join(c.message.thinking or "" for c in chunks), "".join(c.message.content or "" for c in chunks)),
              (reasoning, text), "seed %d streamed: thinking apart" % seed)
        off = dc.generate(messages=[{"role": "user", "content": QWEN3}], seed=seed, max_tokens=40, stream=False,
                          think=False, **RAISED)
        ck.eq(off.done.get("reasoning"), None, "seed %d: the daemon's think false has no reasoning" % seed)
        r = cl.chat(think=False, **kw)
        ck.eq((r.message.thinking, r.message.content), (None, off.done["text"]),
              "seed %d think=False: the daemon's reply without reasoning" % seed)
        chunks = list(cl.chat(think=False, stream=True, **kw))
        ck.ok(not any(c.message.thinking for c in chunks) and
              "".join(c.message.content for c in chunks) == off.done["text"],
              "seed %d think=False streamed: no thinking" % seed)
        r = cl.generate(model=model, prompt=QWEN3, think=True, options=kw["options"])
        ck.eq((r.thinking, r.response), (reasoning, text), "seed %d generate: thinking apart" % seed)
    s = cl.show(model)
    ck.eq(s.capabilities, ["completion", "tools", "thinking"], "show: Qwen3's template has tools and thinking")
    error(ck, lambda: cl.chat(model=model, messages=ASK, think="hard"), 400, "think \"hard\"", "think must be")


def check_refused(ck, b, model):
    cl = client(b)
    png = b"\x89PNG\r\n\x1a\n" + bytes(32)
    error(ck, lambda: cl.chat(model=model, messages=[dict(ASK[0], images=[png])]), 400, "chat with images",
          "images are not supported")
    error(ck, lambda: cl.generate(model=model, prompt="What is this?", images=[png]), 400, "generate with images",
          "images are not supported")
    store = "resident models load PATH"
    error(ck, lambda: cl.pull(model), 501, "pull", store)
    error(ck, lambda: list(cl.pull(model, stream=True)), 501, "pull streamed", store)
    error(ck, lambda: cl.push(model), 501, "push", store)
    error(ck, lambda: cl.create(model="mine", from_=model, system="Be brief."), 501, "create", store)
    error(ck, lambda: cl.copy(model, "mine"), 501, "copy", store)
    error(ck, lambda: cl.delete(model), 501, "delete", store)
    error(ck, lambda: cl.generate(model=model, prompt="a", suffix="b"), 400, "generate's suffix",
          "fill in the middle")
    r = httpx.get(b.http + "/api/nothing")
    ck.eq((r.status_code, list(r.json())), (404, ["error"]), "an unknown /api/ URL: 404, Ollama's shape")
    r = httpx.get(b.http + "/api/chat")
    ck.eq((r.status_code, r.headers.get("allow")), (405, "POST"), "GET /api/chat: 405")


def start(argv, timeout=20):
    """Runs resident-http; returns (process, log file, the port it listens on or None)."""
    log = tempfile.TemporaryFile()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log.seek(0)
        m = re.search(rb"listening on http://127\.0\.0\.1:(\d+)/v1", log.read())
        if m or p.poll() is not None:
            return p, log, int(m.group(1)) if m else None
        time.sleep(0.02)
    return p, log, None


def stop(p, log):
    if p.poll() is None:
        p.terminate()
        p.wait(10)
    log.seek(0)
    return log.read().decode("utf-8", "replace")


def check_port(ck, d):
    exe = rsd.tool("resident-http")
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        held.bind(("127.0.0.1", 11434))
        held.listen(1)
        ours = True
    except OSError:
        ours = False            # another program holds it (an Ollama): held all the same
    try:
        r = subprocess.run([exe, "--ollama", "-s", d.sock], capture_output=True, text=True, timeout=10)
        ck.ok(r.returncode == 1 and "cannot listen on 127.0.0.1:11434: Address already in use" in r.stderr,
              "--ollama with 11434 held: exit 1 saying so (%d: %s)" % (r.returncode, r.stderr.strip()))
        p, log, port = start([exe, "-s", d.sock])
        text = stop(p, log)
        ck.ok("127.0.0.1:11434 is in use" in text and ("listening on 127.0.0.1:8080 instead" in text) and
              (port == 8080 or "cannot listen on 127.0.0.1:8080" in text),
              "no --listen, 11434 held: 127.0.0.1:8080 instead (%s)" % text.strip()[-300:])
    finally:
        held.close()
    r = subprocess.run([exe, "--ollama", "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=10)
    ck.ok(r.returncode == 2 and "not both" in r.stderr, "--ollama and --listen: a usage error")
    if not ours:
        print("   11434 is another program's: the bridge on it by default is not tried")
        return
    p, log, port = start([exe, "-s", d.sock])
    try:
        ck.eq(port, 11434, "no --listen, 11434 free: Ollama's port")
        if port == 11434:
            names = [m.model for m in ollama.Client(timeout=60).list().models]
            ck.ok(name_of(d.model) + ":latest" in names, "the ollama package finds it where it looks by default: %r"
                  % names)
    finally:
        stop(p, log)


def run():
    if ollama is None:
        raise Skip("the PyPI package ollama is not installed (pip install ollama; contrib/install-deps.sh)")
    if jsonschema is None:
        raise Skip("the PyPI package jsonschema is not installed (contrib/install-deps.sh)")
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-ollama-")
    try:
        with Daemon() as d:
            b = Bridge(d.sock)
            b.http = "http://127.0.0.1:%d" % b.port
            with d.client(timeout=120) as dc:
                model = name_of(d.model)
                for name, fn in (("models", lambda: check_models(ck, b, d, dc)),
                                 ("names with tags", lambda: check_names(ck, b, d, dc)),
                                 ("chat", lambda: check_chat(ck, b, dc, model)),
                                 ("generate", lambda: check_generate(ck, b, dc, model)),
                                 ("options, keep_alive, logprobs", lambda: check_options(ck, b, dc, model)),
                                 ("format", lambda: check_format(ck, b, model)),
                                 ("tools: Llama 3.1", lambda: check_tools(ck, b, model)),
                                 ("refused", lambda: check_refused(ck, b, model)),
                                 ("the port", lambda: check_port(ck, d))):
                    with ck.section(name):
                        fn()
            ck.eq(b.stop(), 0, "resident-http stops on SIGTERM with status 0")
            if ck.failed:
                print(b.text()[-3000:])
        qwen3 = rsd.gen_model(os.path.join(tmp, "tiny-qwen3moe.gguf"), seed=3, shape="tiny-qwen3moe")
        with Daemon(model=qwen3) as d:
            b = Bridge(d.sock)
            b.http = "http://127.0.0.1:%d" % b.port
            with d.client(timeout=120) as dc:
                with ck.section("tools: Qwen3"):
                    check_tools(ck, b, "tiny-qwen3moe")
                with ck.section("think"):
                    check_think(ck, b, dc, "tiny-qwen3moe")
            ck.eq(b.stop(), 0, "resident-http stops on SIGTERM with status 0")
            if ck.failed:
                print(b.text()[-3000:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(run)
