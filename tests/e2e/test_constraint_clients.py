#!/usr/bin/env python3
"""test_constraint_clients.py: the clients' side of constrained output
(issue 35): what the `resident` CLI (--grammar, --json-schema,
--json-object), resident-http (response_format, grammar) and the Python
package (grammar=, json_schema=, json=) send as the generate fields
`grammar`, `json_schema` and `json`, and what they refuse before sending.

Against a stand-in daemon that records each request and answers it with a
fixed reply, so that what is checked is the mapping alone, whatever the real
daemon makes of it (tests/e2e/test_protocol.py and the engine's tests hold
the constraint itself).
"""
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks  # noqa: E402

sys.path.insert(0, os.path.join(rsd.common.srcdir(), "contrib", "python"))
import resident  # noqa: E402

UUID = "0123abcd-4567-89ab-cdef-0123456789ab"
REPLY = '{"ok": true}'
# the stand-in answers a request whose grammar is this with the daemon's compile error
BAD_GRAMMAR = "root ::= ("
BAD_MESSAGE = "grammar, line 1 column 11: a '(' without its ')'"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                                           "city": {"enum": ["Zürich", None]}},
          "required": ["name", "age"], "additionalProperties": False}
CONSTRAINTS = ("grammar", "json_schema", "json")


class Recorder:
    """A daemon on path that records every generate and answers it: a token
    and a done (the whole text when not streamed), or for BAD_GRAMMAR the
    invalid_param error the real one would send. hello, model.list,
    session.new and session.rename are answered too; other ops are
    unknown_op."""

    def __init__(self, path):
        self.path = path
        self.requests = []
        self.lock = threading.Lock()
        self.ls = socket.socket(socket.AF_UNIX)
        self.ls.bind(path)
        self.ls.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def take(self):
        """The generate requests recorded since the last take."""
        with self.lock:
            got, self.requests = self.requests, []
        return got

    def _accept(self):
        while True:
            try:
                conn, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            while True:
                hdr = conn.recv(4, socket.MSG_WAITALL)
                if len(hdr) < 4:
                    return
                req = rsd.msgpack.unpackb(conn.recv(struct.unpack(">I", hdr)[0], socket.MSG_WAITALL))
                for reply in self._answer(req):
                    conn.sendall(rsd.frame(dict(reply, id=req["id"])))

    def _answer(self, req):
        op = req.get("op")
        session = {"session": UUID, "title": "", "model": "tiny", "system": "", "created": 1, "updated": 1,
                   "tokens": 0, "turns": 0}
        if op == "hello":
            return [{"type": "result", "version": 1, "server": "residentd stand-in", "max_frame": 1 << 24,
                     "uid": os.getuid(), "capabilities": []}]
        if op == "model.list":
            return [{"type": "result", "models": [{"name": "tiny", "path": "/tiny.gguf", "loaded": True,
                                                    "default": True, "device": "cpu"}]}]
        if op in ("session.new", "session.rename"):
            return [{"type": "result", "session": session}]
        if op != "generate":
            return [{"type": "error", "code": "unknown_op", "message": "no op %r here" % op}]
        with self.lock:
            self.requests.append(req)
        if req.get("grammar") == BAD_GRAMMAR:
            return [{"type": "error", "code": "invalid_param", "message": BAD_MESSAGE}]
        usage = {"prompt_tokens": 3, "cached_tokens": 0, "generated_tokens": 1, "ttft_ms": 1.0,
                 "tokens_per_s": 1.0}
        done = {"type": "done", "finish": "stop", "usage": usage}
        if req.get("session"):
            done["session"] = req["session"]
        if req.get("stream", True):
            return [{"type": "token", "text": REPLY, "token": 7}, done]
        return [dict(done, text=REPLY)]


def constraint(req):
    """The constraint fields a generate request carried."""
    return {k: req[k] for k in CONSTRAINTS if k in req}


def one(ck, rec, what):
    """The one generate request rec got since the last take (None if not one)."""
    got = rec.take()
    if not ck.eq(len(got), 1, what + ": one generate request"):
        return None
    return got[0]


# ---- the CLI

def cli(sock, *args, stdin=None):
    r = subprocess.run([rsd.tool("resident"), "--socket", sock, *args], input=stdin, capture_output=True,
                       text=True, timeout=30)
    return r.returncode, r.stdout, r.stderr


def check_cli(ck, rec, tmp):
    files = {}
    for name, text in (("g.gbnf", 'root ::= "yes" | "no"\n# é\n'), ("s.json", json.dumps(SCHEMA, indent=2)),
                       ("limit.gbnf", 'root ::= "x"' + " " * ((1 << 20) - 12)),
                       ("big.gbnf", "#" * ((1 << 20) + 1)), ("nul.gbnf", 'root ::= "\0"')):
        files[name] = os.path.join(tmp, name)
        with open(files[name], "w", encoding="utf-8") as f:
            f.write(text)

    def sent(args, want, what, stdin=None):
        rc, out, err = cli(rec.path, *args, stdin=stdin)
        ck.ok(rc == 0, "%s: exit 0 (%d: %s)" % (what, rc, err.strip()))
        req = one(ck, rec, what)
        if req is not None:
            ck.eq(constraint(req), want, what + ": the constraint sent")
        return req, out

    grammar = open(files["g.gbnf"], encoding="utf-8").read()
    req, out = sent(["run", "--grammar", files["g.gbnf"], "hi"], {"grammar": grammar}, "run --grammar")
    ck.eq(out, REPLY + "\n", "run --grammar: the reply printed")
    ck.ok(req is not None and req.get("messages") == [{"role": "user", "content": "hi"}],
          "run --grammar: the prompt as a message, beside it")
    req, _ = sent(["run", "--raw", "--json-schema", files["s.json"], "-t", "0", "x"],
                  {"json_schema": json.dumps(SCHEMA, indent=2)}, "run --json-schema: the file's text as it is")
    ck.ok(req is not None and req.get("prompt") == "x" and req.get("temperature") == 0,
          "run --json-schema: with --raw and sampling options")
    req, out = sent(["run", "--json-object", "--json", "hi"], {"json": True}, "run --json-object")
    ck.eq(json.loads(out).get("text"), REPLY, "run --json-object --json: --json is the output's format still")
    sent(["run", "hi"], {}, "run without a constraint")
    sent(["run", "--grammar", files["limit.gbnf"], "hi"],
         {"grammar": open(files["limit.gbnf"], encoding="utf-8").read()}, "run --grammar: a file of 1 MiB")
    # chat: every turn carries it, the new session's defaults do not
    req, _ = sent(["chat", "--json-object", "-t", "0"], {"json": True}, "chat --json-object", stdin="hello\n")
    ck.ok(req is not None and req.get("session") == UUID, "chat --json-object: the turn of its session")

    # refused before connecting: nothing reaches the daemon
    for args, want in (
            (["run", "--grammar", os.path.join(tmp, "none"), "hi"],
             "resident: run: --grammar %s: No such file or directory" % os.path.join(tmp, "none")),
            (["run", "--json-schema", tmp, "hi"], "resident: run: --json-schema %s: Is a directory" % tmp),
            (["run", "--grammar", files["big.gbnf"], "hi"],
             "resident: run: --grammar %s: larger than 1 MiB" % files["big.gbnf"]),
            (["chat", "--grammar", files["nul.gbnf"]],
             "resident: chat: --grammar %s: holds a NUL byte" % files["nul.gbnf"]),
            (["run", "--grammar", files["g.gbnf"], "--json-object", "hi"],
             "resident: run: give at most one of --grammar, --json-schema and --json-object"),
            (["run", "--json-object", "--json-object", "hi"], "give at most one of"),
            (["run", "--grammar"], "resident: ")):
        rc, _, err = cli(rec.path, *args)
        ck.ok(rc == 2 and want in err, "%s: exit 2 saying %r (%d: %s)" % (args, want, rc, err.strip()))
    ck.eq(rec.take(), [], "refused options: no request sent")
    # the daemon's refusal: exit 1 with its message and code
    bad = os.path.join(tmp, "bad.gbnf")
    with open(bad, "w") as f:
        f.write(BAD_GRAMMAR)
    rc, _, err = cli(rec.path, "run", "--grammar", bad, "hi")
    ck.ok(rc == 1 and BAD_MESSAGE in err and "(invalid_param)" in err,
          "a grammar the daemon refuses: exit 1 with its message (%d: %s)" % (rc, err.strip()))
    rec.take()
    rc, out, _ = cli(rec.path, "--help")
    ck.ok(all(o in out for o in ("--grammar FILE", "--json-schema FILE", "--json-object")), "--help lists them")


# ---- the Python package

def check_python(ck, rec):
    compact = json.dumps(SCHEMA, ensure_ascii=False, separators=(",", ":"))
    with resident.connect(rec.path) as c:
        for kw, want, what in (
                (dict(json_schema=SCHEMA), {"json_schema": compact}, "json_schema=dict: its compact JSON text"),
                (dict(json_schema=True), {"json_schema": "true"}, "json_schema=True: the schema true"),
                (dict(json_schema='{"type": "array"}'), {"json_schema": '{"type": "array"}'},
                 "json_schema=str: as it is"),
                (dict(grammar='root ::= [a-z]+'), {"grammar": "root ::= [a-z]+"}, "grammar=str"),
                (dict(json=True), {"json": True}, "json=True"),
                (dict(json_schema=None, grammar=None, json=None), {}, "None: left out")):
            done = c.generate(messages=[{"role": "user", "content": "hi"}], **kw).result()
            ck.eq(done.text, REPLY, what + ": the reply")
            req = one(ck, rec, what)
            if req is not None:
                ck.eq(constraint(req), want, what)
        c.generate(prompt="x", json_schema=SCHEMA, stream=False).result()
        req = one(ck, rec, "json_schema=dict, not streamed")
        if req is not None:
            pairs = json.loads(req["json_schema"], object_pairs_hook=list)
            ck.eq([k for k, _ in dict(pairs)["properties"]], ["name", "age", "city"],
                  "json_schema=dict: properties in their order")
        ck.raises(lambda: c.generate(prompt="x", json_schema=["type"]), TypeError, "json_schema=list: TypeError")
        ck.raises(lambda: c.generate(prompt="x", json_schema={"maximum": float("nan")}), ValueError,
                  "json_schema with NaN: ValueError, not invalid JSON")
        ck.eq(rec.take(), [], "refused schemas: no request sent")
        e = ck.raises(lambda: c.generate(prompt="x", grammar=BAD_GRAMMAR).result(), resident.InvalidParam,
                      "a grammar the daemon refuses", code="invalid_param")
        ck.ok(e is not None and e.message == BAD_MESSAGE, "InvalidParam: the daemon's message")
        rec.take()

    async def aio():
        async with await resident.aio.connect(rec.path) as c:
            gen = await c.generate(messages=[{"role": "user", "content": "hi"}], json_schema=SCHEMA)
            return (await gen.result()).text

    ck.eq(asyncio.run(aio()), REPLY, "aio json_schema=dict: the reply")
    req = one(ck, rec, "aio")
    if req is not None:
        ck.eq(constraint(req), {"json_schema": compact}, "aio json_schema=dict: its compact JSON text")


# ---- resident-http

class Bridge:
    """resident-http on a free port of 127.0.0.1, in front of sock."""

    def __init__(self, sock):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([rsd.tool("resident-http"), "--listen", "127.0.0.1:0", "-s", sock],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            self.log.seek(0)
            text = self.log.read().decode("utf-8", "replace")
            port = text.split("listening on http://127.0.0.1:")[-1].split("/")[0] if "listening on" in text else ""
            if port.isdigit():
                self.url = "http://127.0.0.1:%s/v1" % port
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("resident-http did not start:\n" + text)
            time.sleep(0.02)

    def post(self, path, body):
        """(status, JSON reply) of a POST; a streamed reply's events as a list."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        if text.startswith("data: "):
            return status, [json.loads(x[6:]) for x in text.split("\n\n") if x.startswith("data: {")]
        return status, json.loads(text)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def check_openai(ck, rec):
    b = Bridge(rec.path)
    msgs = [{"role": "user", "content": "hi"}]
    try:
        for extra, want, what in (
                ({"response_format": {"type": "json_object"}}, {"json": True}, "json_object"),
                ({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "strict": True,
                                                                            "schema": SCHEMA}}},
                 {"json_schema": json.dumps(SCHEMA, ensure_ascii=False, separators=(",", ":"))},
                 "json_schema: the schema's JSON text"),
                ({"response_format": {"type": "text"}}, {}, "text: nothing"),
                ({}, {}, "no response_format"),
                ({"grammar": 'root ::= "a"'}, {"grammar": 'root ::= "a"'}, "resident's grammar")):
            for stream in (False, True):
                st, r = b.post("/chat/completions", dict(extra, model="tiny", messages=msgs, stream=stream))
                text = ("".join(c["choices"][0]["delta"].get("content", "") for c in r if c.get("choices"))
                        if stream else r.get("choices", [{}])[0].get("message", {}).get("content"))
                ck.ok(st == 200 and text == REPLY, "%s%s: 200 with the reply (%d %s)"
                      % (what, " (stream)" if stream else "", st, r))
                req = one(ck, rec, what)
                if req is not None:
                    ck.eq(constraint(req), want, what + (" (stream)" if stream else ""))
        st, r = b.post("/completions", {"model": "tiny", "prompt": "x", "response_format": {"type": "json_object"}})
        req = one(ck, rec, "completions json_object")
        ck.ok(st == 200 and req is not None and constraint(req) == {"json": True} and req.get("prompt") == "x",
              "completions: response_format json_object sends json")
        for extra, param, want in (
                ({"response_format": {"type": "xml"}}, "response_format", "type 'xml' is not supported"),
                ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
                 "json_schema.schema must be a JSON Schema"),
                ({"grammar": "root ::= \"a\"", "response_format": {"type": "json_schema",
                                                                 "json_schema": {"schema": {}}}},
                 "grammar", "give one of them")):
            st, r = b.post("/chat/completions", dict(extra, model="tiny", messages=msgs))
            err = r.get("error", {})
            ck.ok(st == 400 and err.get("param") == param and want in err.get("message", ""),
                  "%s: 400 about %s saying %r (%d %s)" % (extra, param, want, st, r))
        ck.eq(rec.take(), [], "refused response_formats: no request sent")
        st, r = b.post("/chat/completions", {"model": "tiny", "messages": msgs, "grammar": BAD_GRAMMAR})
        err = r.get("error", {})
        ck.ok(st == 400 and err.get("code") == "invalid_param" and err.get("message") == BAD_MESSAGE,
              "a grammar the daemon refuses: 400 invalid_param with its message (%d %s)" % (st, r))
        rec.take()
    finally:
        b.stop()


def run():
    ck = Checks()
    with tempfile.TemporaryDirectory(prefix="resident-constraint.") as tmp:
        rec = Recorder(os.path.join(tmp, "sock"))
        for name, fn in (("cli", lambda: check_cli(ck, rec, tmp)),
                         ("python", lambda: check_python(ck, rec)),
                         ("openai", lambda: check_openai(ck, rec))):
            with ck.section(name):
                fn()
        rec.ls.close()
    return ck


if __name__ == "__main__":
    rsd.main(run)
