#!/usr/bin/env python3
"""test_tools.py: tool calls end to end (libclient/PROTOCOL.md, "Tool calls"),
on generated models of each family that has them: tiny (Llama 3), tiny-qwen2
(ChatML), tiny-qwen3, tiny-gemma3 and tiny-gptoss (harmony).

Random weights never call a tool by themselves, so what is checked is what
the daemon guarantees whatever the weights:

1. With tool_choice required, and with a named tool, the reply is
   constrained by the tools' parameter schemas: at temperature 1.5 and
   several seeds, done always carries tool_calls that parse, name one of
   the tools (the named one), and whose arguments the `jsonschema` package
   validates against the tool's parameters; Qwen's calls come as `tool`
   text in the token replies; harmony opens a named call's header in the
   prompt, and refuses required among several tools with a clear message.
2. With auto, the reply is well-formed (a done, calls or not); with none,
   no call is parsed.
3. A session stores the reply's calls and the tool result that answers
   them (session.get and `resident sessions show` show them), and a later
   turn, after a restart too, renders them again.
4. What is refused: duplicate tool names, an unknown tool_name, a tool whose
   parameters use an unsupported keyword (by JSON pointer), tool_choice
   without tools, a required call beside a grammar, calls on a user message,
   arguments that are not an object.
5. resident-http with the `openai` package, on tiny-qwen3 (whose calls
   are tool text) and tiny (Llama 3.1's, written as its answer): tools
   with tool_choice auto, required and named, streamed and not (required
   and named: message.tool_calls with finish_reason "tool_calls", content
   null; streamed: delta.tool_calls and no content), and a round trip
   with the assistant's calls and a `tool` message.
6. The Python package (contrib/python): tools as a list, tool_choice as
   OpenAI's named function, done.tool_calls; a round trip whose assistant
   message has OpenAI's tool_calls (arguments as a dict); asyncio too.
7. The real Gemma 3 270M (rsd.gemma_path; the section is skipped, saying
   so, without it), greedy: asked for the weather in a city with
   tool_choice required, it calls get_weather with that city, streamed
   and not, through the daemon and resident-http; with auto (where this
   small model does not call), the reply is well-formed; a tool result
   round trip answers.
8. The CLI: resident run --tools FILE --tool-choice NAME prints the call
   ("tool call: NAME ARGS (ID)"), --json has tool_calls; chat refuses
   --tools; --tools with --raw is a usage error.

Skips (exit 77) without the `jsonschema` package; section 5 without `openai`.
"""
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402

try:
    import jsonschema
except ImportError:
    jsonschema = None
try:
    import openai
    from test_openai import Bridge
except ImportError:
    openai = None
sys.path.insert(0, os.path.join(rsd.common.srcdir(), "contrib", "python"))
import resident  # noqa: E402

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "days"], "additionalProperties": False}
NOW = {"type": "object", "properties": {"zone": {"$ref": "#/$defs/zone"}}, "required": ["zone"],
       "additionalProperties": False, "$defs": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                           "parameters": WEATHER}},
         {"name": "now", "description": "The time in a zone.", "parameters": NOW}]
SCHEMAS = {"get_weather": WEATHER, "now": NOW}
ASK = [{"role": "user", "content": "What is the weather in Paris, and the time?"}]
SHAPES = ["tiny", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-gptoss"]
SEEDS = range(1, 5)


def valid_calls(ck, calls, what, only=None):
    """Each call names a tool (only, if given) and its arguments validate."""
    if not ck.ok(calls, "%s: tool_calls" % what):
        return
    for call in calls:
        ck.ok(call["id"], "%s: an id" % what)
        if not ck.ok(call["name"] in SCHEMAS and (only is None or call["name"] == only),
                     "%s: name %r" % (what, call["name"])):
            continue
        try:
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        except (ValueError, jsonschema.ValidationError) as e:
            ck.ok(False, "%s: arguments %r: %s" % (what, call["arguments"], e))


def check_constrained(ck, c, shape):
    """Section 1 on one model: required and named calls always parse and validate."""
    tools = json.dumps(TOOLS)
    harmony = shape == "tiny-gptoss"
    choices = [("named", {"tool_name": "now"}, "now"),
               ("one tool", {"tool_choice": "required", "tools": json.dumps(TOOLS[:1])}, "get_weather")]
    if not harmony:
        choices.append(("required", {"tool_choice": "required"}, None))
    ids = set()
    for name, fields, only in choices:
        for seed in SEEDS:
            what = "%s %s seed %d" % (shape, name, seed)
            req = dict(messages=ASK, tools=tools, max_tokens=300, temperature=1.5, seed=seed, stream=seed % 2 == 0)
            req.update(fields)
            g = c.generate(**req)
            ck.eq(g.finish, "stop", what + ": finish")
            ck.ok("tool_error" not in g.done, "%s: no tool_error (%s)" % (what, g.done.get("tool_error")))
            valid_calls(ck, g.done.get("tool_calls"), what, only)
            ids.update(call["id"] for call in g.done.get("tool_calls", []))
            if shape in ("tiny-qwen2", "tiny-qwen3") and req["stream"]:
                tool = "".join(t.get("tool", "") for t in g.tokens)
                ck.ok(tool.startswith("<tool_call>") and tool.rstrip().endswith("</tool_call>"),
                      "%s: the calls are tool text: %r" % (what, tool[:60]))
    ck.ok(len(ids) >= len(SEEDS) * len(choices), "%s: call ids are unique" % shape)
    if harmony:
        c_err = rsd_error(c, messages=ASK, tools=tools, tool_choice="required")
        ck.ok(c_err and c_err["code"] == "invalid_param" and "give tool_name" in c_err["message"],
              "harmony: required among several tools is refused: %r" % (c_err,))


def rsd_error(c, **fields):
    """The error reply of a generate that must fail, or None."""
    rid = c.start_generate(**fields)
    while True:
        r = c.next(rid)
        if r["type"] in ("error", "done"):
            return r if r["type"] == "error" else None


def check_auto_none(ck, c, shape):
    """Section 2: auto answers well-formed; none parses no call."""
    for choice in ("auto", "none"):
        for stream in (False, True):
            g = c.generate(messages=ASK, tools=json.dumps(TOOLS), tool_choice=choice, max_tokens=20, seed=3,
                           stream=stream)
            what = "%s %s stream=%s" % (shape, choice, stream)
            ck.ok(g.finish in ("stop", "length"), what + ": finish")
            for call in g.done.get("tool_calls", []):
                ck.ok(choice == "auto" and call["name"] in SCHEMAS, what + ": a call only with auto")


def check_session(ck, d, c):
    """Section 3: calls and results stored, shown, and rendered again after a restart."""
    tools = json.dumps(TOOLS)
    s = c.call("session.new")["session"]["session"]
    hello = [{"role": "user", "content": "Hello."}]
    g0 = c.generate(session=s, messages=hello, max_tokens=4, seed=5)
    # a turn that offers tools after one that did not: its prompt is rendered with them, as a
    # stateless request of the same conversation is (the stored ids were rendered without)
    ref = c.generate(messages=hello + [{"role": "assistant", "content": g0.text}] + ASK, tools=tools,
                     tool_name="get_weather", max_tokens=1, seed=5)
    g = c.generate(session=s, messages=ASK, tools=tools, tool_name="get_weather", max_tokens=100, seed=5)
    ck.eq(g.usage["prompt_tokens"], ref.usage["prompt_tokens"], "session: tools rendered into the history")
    calls = g.done.get("tool_calls", [])
    if not ck.ok(len(calls) == 1, "session: one call"):
        return c
    result = {"role": "tool", "content": "21 C, clear", "tool_call_id": calls[0]["id"], "name": "get_weather"}
    g2 = c.generate(session=s, messages=[result], tools=tools, max_tokens=8, seed=5)
    ck.ok(g2.finish in ("stop", "length"), "session: the tool result's turn")
    turns = c.call("session.get", session=s)["turns"]
    ck.eq([t["role"] for t in turns], ["user", "assistant", "user", "assistant", "tool", "assistant"],
          "session: roles")
    turns = turns[2:]
    ck.eq(turns[1].get("tool_calls"), calls, "session.get: the reply's calls")
    ck.eq((turns[2].get("tool_call_id"), turns[2].get("name"), turns[2]["content"]),
          (calls[0]["id"], "get_weather", "21 C, clear"), "session.get: the result")
    r = subprocess.run([rsd.tool("resident"), "--socket", d.sock, "sessions", "show", s], capture_output=True,
                       text=True, timeout=60)
    ck.ok(r.returncode == 0 and "tool call: get_weather %s (%s)" % (calls[0]["arguments"], calls[0]["id"]) in r.stdout
          and "(the result of %s)" % calls[0]["id"] in r.stdout, "resident sessions show: the call and its result")
    d.stop()
    d.start()
    c = d.client(timeout=60)
    g3 = c.generate(session=s, messages=[{"role": "user", "content": "Thanks."}], tools=tools, max_tokens=4,
                    seed=5)
    ck.ok(g3.finish in ("stop", "length"), "session: resumed after a restart")
    return c


def check_refusals(ck, c):
    """Section 4."""
    tools = json.dumps(TOOLS)
    bad = [
        ("duplicate names", dict(tools=json.dumps([TOOLS[0], TOOLS[0]])), "invalid_param", "is also tools[0]'s"),
        ("unknown tool_name", dict(tools=tools, tool_name="nope"), "invalid_param", "none of the tools"),
        ("unsupported keyword", dict(tools=json.dumps([{"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}}])),
         "invalid_param", "f's parameters: json_schema at /properties/n/multipleOf"),
        ("tool_choice without tools", dict(tool_choice="required"), "invalid_param", "need tools"),
        ("a bad tool_choice", dict(tools=tools, tool_choice="any"), "invalid_param", "tool_choice must be"),
        ("required beside a grammar", dict(tools=tools, tool_choice="required", json=True), "bad_request",
         "constrained by the tools"),
        ("tools not JSON", dict(tools="[{"), "invalid_param", "tools is not JSON"),
    ]
    for what, fields, code, needle in bad:
        r = rsd_error(c, messages=ASK, max_tokens=4, **fields)
        ck.ok(r is not None and r["code"] == code and needle in r["message"], "%s: %r" % (what, r))
    msgs = [
        ("calls on a user message", [{"role": "user", "content": "x", "tool_calls": [
            {"name": "f", "arguments": "{}"}]}], "only an assistant message"),
        ("arguments not an object", ASK + [{"role": "assistant", "tool_calls": [
            {"name": "f", "arguments": "[1]"}]}], "arguments must be the JSON text of an object"),
        ("an unknown role", [{"role": "function", "content": "x"}], "role must be"),
    ]
    for what, m, needle in msgs:
        r = rsd_error(c, messages=m, max_tokens=4)
        ck.ok(r is not None and r["code"] == "invalid_param" and needle in r["message"], "%s: %r" % (what, r))


def openai_calls(ck, calls, what, only=None):
    """OpenAI's tool_calls (objects) as the daemon's, then checked as valid_calls does."""
    valid_calls(ck, [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                     for c in calls or []], what, only)


def stream_calls(stream):
    """A stream's tool calls put together from their deltas, its content, and its finish_reason."""
    calls, content, finish = {}, "", None
    for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                c["id"] += d.id or ""
                c["name"] += (d.function.name or "") if d.function else ""
                c["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = ch.finish_reason or finish
    return [calls[i] for i in sorted(calls)], content, finish


def check_bridge(ck, d, shape):
    """Section 5 on one model."""
    b = Bridge(d.sock)
    try:
        cl = b.client()
        kw = dict(model=shape, messages=ASK, tools=TOOLS[:1] + [{"type": "function", "function": TOOLS[1]}],
                  max_tokens=300, temperature=1.5)
        for name, choice, only in (("required", "required", None),
                                   ("named", {"type": "function", "function": {"name": "now"}}, "now")):
            for seed in SEEDS:
                what = "bridge %s %s seed %d" % (shape, name, seed)
                r = cl.chat.completions.create(tool_choice=choice, seed=seed, **kw)
                ck.eq(r.choices[0].finish_reason, "tool_calls", what + ": finish_reason")
                ck.eq(r.choices[0].message.content, None, what + ": no content")
                openai_calls(ck, r.choices[0].message.tool_calls, what, only)
                calls, content, finish = stream_calls(cl.chat.completions.create(
                    tool_choice=choice, seed=seed, stream=True, **kw))
                ck.eq(finish, "tool_calls", what + " streamed: finish_reason")
                ck.eq(content, "", what + " streamed: no content")
                valid_calls(ck, calls, what + " streamed", only)
        for stream in (False, True):
            r = cl.chat.completions.create(tool_choice="auto", seed=3, stream=stream, **dict(kw, max_tokens=16))
            if stream:
                calls, content, finish = stream_calls(r)
            else:
                finish = r.choices[0].finish_reason
            ck.ok(finish in ("stop", "length", "tool_calls"), "bridge %s auto stream=%s: %s" % (shape, stream,
                                                                                              finish))
        first = cl.chat.completions.create(tool_choice="required", seed=1, **kw)
        call = first.choices[0].message.tool_calls[0]
        msgs = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "21 C"}]
        for stream in (False, True):
            r = cl.chat.completions.create(model=shape, messages=msgs, tools=kw["tools"], max_tokens=8, seed=2,
                                           stream=stream)
            finish = stream_calls(r)[2] if stream else r.choices[0].finish_reason
            ck.ok(finish in ("stop", "length", "tool_calls"), "bridge %s: a tool result's round trip, stream=%s"
                  % (shape, stream))
    finally:
        ck.eq(b.stop(), 0, "resident-http exits 0")


def check_python(ck, d):
    """Section 6."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    with resident.connect(d.sock) as c:
        done = c.generate(messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=200, seed=4).result()
        valid_calls(ck, done.tool_calls, "python: named", "get_weather")
        ck.ok(done.tool_error is None and not done.calls_in_text, "python: no tool_error; Qwen's calls are tool text")
        call = done.tool_calls[0]
        msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"],
                                                                "arguments": json.loads(call["arguments"])}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": "21 C"}]
        done = c.generate(messages=msgs, tools=json.dumps(TOOLS), max_tokens=6, seed=4).result()
        ck.ok(done.finish in ("stop", "length"), "python: a round trip with OpenAI's tool_calls")

    async def aio():
        async with await resident.aio.connect(d.sock) as c:
            gen = await c.generate(messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, seed=6)
            return await gen.result()

    done = asyncio.run(aio())
    valid_calls(ck, done.tool_calls, "python asyncio: required")


def check_cli(ck, d, tmp):
    """Section 8."""
    path = os.path.join(tmp, "tools.json")
    with open(path, "w") as f:
        json.dump(TOOLS, f)
    base = [rsd.tool("resident"), "--socket", d.sock]
    run = base + ["run", "--tools", path, "--tool-choice", "get_weather", "-n", "200", "--seed", "2",
                  "Weather in Paris?"]
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    m = re.search(r"^tool call: get_weather (\{.*\}) \((call_\w+)\)$", r.stdout, re.M)
    ck.ok(r.returncode == 0 and m, "resident run --tools: the call printed: %r %r" % (r.stdout[-200:], r.stderr))
    if m:
        valid_calls(ck, [{"id": m.group(2), "name": "get_weather", "arguments": m.group(1)}], "resident run")
    r = subprocess.run(base + ["--json"] + run[len(base):], capture_output=True, text=True, timeout=120)
    calls = json.loads(r.stdout).get("tool_calls") if r.returncode == 0 else None
    valid_calls(ck, calls, "resident --json run", "get_weather")
    for argv, what in ((["chat", "--tools", path], "chat --tools"),
                       (["run", "--raw", "--tools", path, "x"], "run --raw --tools")):
        r = subprocess.run(base + argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        ck.eq(r.returncode, 2, what + ": a usage error (%s)" % r.stderr.strip())


GEMMA_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                   "required": ["city"]}}}]


def check_gemma(ck):
    """Section 7."""
    try:
        path = rsd.gemma_path()
    except Skip as e:
        print("SKIP section: the real Gemma 3 270M:", e)
        return
    tools = json.dumps(GEMMA_TOOLS)
    with Daemon(model=path) as d:
        c = d.client(timeout=120)
        for city in ("Paris", "Tokyo"):
            ask = [{"role": "user", "content": "What is the weather in %s right now?" % city}]
            for stream in (False, True):
                g = c.generate(messages=ask, tools=tools, tool_choice="required", max_tokens=60, temperature=0,
                               stream=stream)
                calls = [(x["name"], json.loads(x["arguments"])) for x in g.done.get("tool_calls", [])]
                ck.eq(calls, [("get_weather", {"city": city})], "gemma %s stream=%s: the call" % (city, stream))
                ck.ok(g.done.get("calls_in_text"), "gemma: the call is its answer's text")
            g = c.generate(messages=ask, tools=tools, max_tokens=40, temperature=0)
            ck.ok(g.finish in ("stop", "length") and "tool_error" not in g.done,
                  "gemma %s auto: well-formed (%s)" % (city, g.finish))
        if openai is None:
            return
        b = Bridge(d.sock)
        try:
            cl = b.client()
            ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
            for stream in (False, True):
                kw = dict(model=os.path.basename(path)[:-5], messages=ask, tools=GEMMA_TOOLS, temperature=0,
                          max_tokens=60, tool_choice="required", stream=stream)
                if stream:
                    calls, content, finish = stream_calls(cl.chat.completions.create(**kw))
                else:
                    m = cl.chat.completions.create(**kw).choices[0].message
                    calls = [{"id": x.id, "name": x.function.name, "arguments": x.function.arguments}
                             for x in m.tool_calls or []]
                    content = m.content or ""
                ck.eq([(x["name"], json.loads(x["arguments"])) for x in calls], [("get_weather", {"city": "Paris"})],
                      "gemma through resident-http stream=%s: the call" % stream)
                ck.eq(content, "", "gemma through resident-http stream=%s: its text is not content" % stream)
            msgs = ask + [{"role": "assistant", "content": None, "tool_calls": [
                {"id": calls[0]["id"], "type": "function", "function": {"name": "get_weather",
                                                                        "arguments": calls[0]["arguments"]}}]},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "Sunny, 24 degrees Celsius."}]
            r = cl.chat.completions.create(model=kw["model"], messages=msgs, tools=GEMMA_TOOLS, temperature=0,
                                           max_tokens=40)
            ck.ok(r.choices[0].finish_reason in ("stop", "length", "tool_calls"),
                  "gemma: a round trip with the tool's result: %r" % (r.choices[0].message.content,))
        finally:
            ck.eq(b.stop(), 0, "resident-http exits 0")


def main():
    if jsonschema is None:
        raise Skip("the jsonschema package is not installed")
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-tools-")
    try:
        for shape in SHAPES:
            model = rsd.gen_model(os.path.join(tmp, shape + ".gguf"), shape=shape)
            with Daemon(model=model) as d:
                c = d.client(timeout=120)
                with ck.section("%s: required and named calls are constrained" % shape):
                    check_constrained(ck, c, shape)
                with ck.section("%s: auto and none" % shape):
                    check_auto_none(ck, c, shape)
                if shape in ("tiny", "tiny-qwen3") and openai is not None:
                    with ck.section("%s: resident-http's tools" % shape):
                        check_bridge(ck, d, shape)
                if shape == "tiny-qwen3":
                    with ck.section("the Python package"):
                        check_python(ck, d)
                    with ck.section("the CLI"):
                        check_cli(ck, d, tmp)
                    with ck.section("sessions store calls and results"):
                        c = check_session(ck, d, c)
                    with ck.section("refusals"):
                        check_refusals(ck, c)
                c.close()
        with ck.section("the real Gemma 3 270M"):
            check_gemma(ck)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
