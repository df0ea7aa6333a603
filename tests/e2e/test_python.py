#!/usr/bin/env python3
"""test_python.py: the Python client contrib/python (package `resident`)
against residentd on a generated tiny model, imported from the source tree.

Every call of the blocking and the asyncio API; generations compared with
what rsd.py (the tests' own protocol client) gets for the same request;
concurrent generations on one connection, from one thread, from several
threads and from asyncio tasks; cancel; typed errors with the protocol's
codes; the default socket path rules; a daemon that is not running or that
dies. Then the package is installed with pip into a temporary directory
(when setuptools is there to build it) and imported from there.
"""
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402

SRC = os.path.join(rsd.common.srcdir(), "contrib", "python")
sys.path.insert(0, SRC)
import resident  # noqa: E402

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MODEL = "tiny"
LONG = 1500
GREEDY = dict(temperature=0)


def user(text):
    return [{"role": "user", "content": text}]


def raises(ck, fn, cls, code, what):
    """fn() must raise cls (a ResidentError) with .code code and a message."""
    e = ck.raises(fn, cls, what, code=code)
    if e is not None:
        ck.ok(isinstance(e, resident.ResidentError) and e.message and str(e), "%s: message %r" % (what, str(e)))
    return e


def check_socket_path(ck):
    saved = {k: os.environ.get(k) for k in ("RESIDENT_SOCKET", "XDG_RUNTIME_DIR")}

    def path(sock, run):
        for k, v in (("RESIDENT_SOCKET", sock), ("XDG_RUNTIME_DIR", run)):
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return resident.default_socket()

    try:
        ck.eq(path("/x/sock", "/run/user/7"), "/x/sock", "$RESIDENT_SOCKET first")
        ck.eq(path("", "/run/user/7"), "/run/user/7/resident/socket", "then $XDG_RUNTIME_DIR/resident/socket")
        ck.eq(path(None, None), "/tmp/resident-%d/socket" % os.getuid(), "else /tmp/resident-UID/socket")
        ck.eq(path(None, "relative"), "/tmp/resident-%d/socket" % os.getuid(),
              "a relative XDG_RUNTIME_DIR is not used")
    finally:
        path(saved["RESIDENT_SOCKET"], saved["XDG_RUNTIME_DIR"])


def check_no_daemon(ck, tmp):
    missing = os.path.join(tmp, "none")
    e = raises(ck, lambda: resident.connect(missing), resident.ConnectError, None, "no socket")
    ck.ok(e is not None and str(e) == "residentd is not running (no socket at %s)" % missing,
          "no socket: the message names it")
    stale = os.path.join(tmp, "stale")
    import socket as so
    s = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    s.bind(stale)
    s.close()
    e = raises(ck, lambda: resident.connect(stale), resident.ConnectError, None, "nobody listens")
    ck.ok(e is not None and "nobody listens at" in str(e), "nobody listens: said so")
    e = asyncio.run(_async_connect_error(missing))
    ck.ok(isinstance(e, resident.ConnectError) and "no socket at" in str(e), "asyncio: ConnectError too")


async def _async_connect_error(path):
    try:
        await resident.aio.connect(path)
    except resident.ResidentError as e:
        return e
    return None


def check_blocking(ck, d, ref, long_prompt, tmp):
    with resident.connect(d.sock, client="test-python") as c:
        ck.eq((c.server["version"], c.server["server"].split()[0]), (1, "residentd"), "hello at connect")
        ck.ok(any(k["client"] == "test-python" for k in c.status()["clients"]), "status lists the client by name")

        # generate: tokens, done, text; the same as the reference client's
        want = ref.generate(prompt="Once upon", max_tokens=20, **GREEDY)
        g = c.generate(prompt="Once upon", max_tokens=20, **GREEDY)
        toks = list(g)
        ck.eq([t.id for t in toks], want.ids, "generate: the token ids")
        ck.eq("".join(t.text for t in toks), want.text, "generate: the text pieces")
        ck.eq((g.done.finish, g.done.usage["generated_tokens"], g.text), (want.finish, len(want.ids), want.text),
              "generate: done, usage, text")
        ck.eq(list(g), [], "a finished generation yields nothing more")
        d2 = c.generate(prompt="Once upon", max_tokens=20, stream=False, **GREEDY)
        ck.eq((list(d2), d2.result().text), ([], want.text), "stream=False: no tokens, the text in done")
        lp = c.generate(messages=user("hi"), max_tokens=3, logprobs=True, stop="never", **GREEDY)
        ck.ok(all(isinstance(t.logprob, float) and t.logprob <= 0 for t in lp), "logprobs")

        # sessions
        s = c.session_new(title="py", system="Be brief.", defaults={"temperature": 0})
        ck.ok(UUID.match(s["session"]) and s["system"] == "Be brief.", "session_new")
        r1 = c.generate(messages=user("Hello"), session=s["session"], max_tokens=6).result()
        ck.eq(r1.session, s["session"], "done names the session")
        got = c.session_get(s["session"])
        ck.eq([t["role"] for t in got["turns"]], ["user", "assistant"], "session_get: the turns")
        ck.eq(got["turns"][1]["content"], r1.text, "session_get: the reply")
        ck.ok(s["session"] in [x["session"] for x in c.session_list(limit=50)], "session_list")
        f = c.session_fork(s["session"], title="fork")
        ck.eq((f["title"], len(c.session_get(f["session"])["turns"])), ("fork", 2), "session_fork")
        ck.eq(c.session_rename(f["session"], "renamed")["title"], "renamed", "session_rename")
        c.session_delete(f["session"])
        raises(ck, lambda: c.session_get(f["session"]), resident.NotFound, "not_found", "a deleted session")

        # models
        ck.eq([m["name"] for m in c.model_list()], [MODEL], "model_list")
        other = rsd.gen_model(os.path.join(tmp, "other.gguf"), seed=2)
        seen = []
        m = c.model_load(other, progress=lambda done, total: seen.append((done, total)))
        ck.ok(m["name"] == "other" and m["loaded"], "model_load by path")
        ck.ok(seen and seen[-1][0] == seen[-1][1] and all(a[0] <= b[0] for a, b in zip(seen, seen[1:])),
              "model_load: progress up to the total: %r" % seen[-3:])
        ck.eq(c.model_show(other)["quantization"], "Q8_0", "model_show by path")
        ck.eq(c.model_show()["name"], MODEL, "model_show of the default model")
        u = c.model_unload("other")
        ck.eq((u["unloaded"], u["cancelled"], u["model"]["name"]), (True, 0, "other"), "model_unload result")
        ck.ok(not [x for x in c.model_list() if x["name"] == "other"][0]["loaded"], "model_unload")
        ck.ok(not c.model_show("other")["loaded"], "model_show of a model not loaded")
        raises(ck, lambda: c.model_load(os.path.join(tmp, "nothing.gguf")), resident.NotFound, "not_found",
               "loading a missing model")

        # tokens
        ids = c.tokenize("Hello world")
        ck.eq(ids, ref.call("tokenize", text="Hello world")["tokens"], "tokenize")
        ck.eq(c.detokenize(ids), ref.call("detokenize", tokens=ids)["text"], "detokenize")
        ck.ok(len(c.tokenize("Hello", bos=False)) < len(c.tokenize("Hello", bos=True)), "tokenize bos")
        st = c.status()
        ck.ok(st["version"] == 1 and st["models"] and "active" in st and "queued" in st, "status")

        # cancel
        g = c.generate(messages=user(long_prompt), max_tokens=LONG, **GREEDY)
        next(g)
        g.cancel()
        ck.eq(g.result().finish, "cancel", "cancel: the generation ends with finish cancel")
        g.cancel()
        raises(ck, lambda: c.cancel(g.id), resident.NotFound, "not_found", "cancel of what ended")
        busy = c.session_new(title="busy")["session"]
        g = c.generate(messages=user(long_prompt), session=busy, max_tokens=LONG, **GREEDY)
        next(g)
        raises(ck, lambda: c.generate(messages=user("x"), session=busy).result(), resident.SessionBusy,
               "session_busy", "a second turn of a session while one generates")
        g.cancel()
        ck.eq(g.result().finish, "cancel", "the first turn, cancelled")

        # errors carry the protocol's codes
        raises(ck, lambda: c.generate(prompt="x", temperature=500).result(), resident.InvalidParam,
               "invalid_param", "a temperature out of range")
        raises(ck, lambda: c.generate(prompt="x", messages=user("x")).result(), resident.BadRequest,
               "bad_request", "prompt and messages")
        # a dict json_schema reaches the daemon as a string (else its type would be the refusal)
        e = raises(ck, lambda: c.generate(prompt="x", json_schema={"type": "object"}, json=True).result(),
                   resident.BadRequest, "bad_request", "json_schema and json")
        ck.ok(e is not None and "at most one of 'grammar', 'json_schema' and 'json'" in e.message,
              "json_schema and json: refused as two constraints (%s)" % e)
        raises(ck, lambda: c.generate(prompt="x " * 3000).result(), resident.ContextExceeded,
               "context_exceeded", "a prompt over the context")
        raises(ck, lambda: c.call("no.such.op"), resident.UnknownOp, "unknown_op", "an unknown op")
        raises(ck, lambda: c.generate(prompt="x", model="nope").result(), resident.NotFound, "not_found",
               "an unknown model")
        ck.eq(c.generate(prompt="still", max_tokens=2).result().finish, "length", "served after the errors")


def check_concurrent_blocking(ck, d, ref):
    prompts = ["first %d" % i for i in range(4)]
    want = [ref.generate(prompt=p, max_tokens=40, **GREEDY).text for p in prompts]
    with resident.connect(d.sock) as c:
        gens = [c.generate(prompt=p, max_tokens=40, **GREEDY) for p in prompts]
        live = list(gens)
        while live:                      # one thread, the generations read in turn
            for g in list(live):
                if next(g, None) is None:
                    live.remove(g)
        ck.eq([g.text for g in gens], want, "four generations on one connection, read in turn")
        out, errs = [None] * 4, []

        def worker(i):
            try:
                out[i] = c.generate(prompt=prompts[i], max_tokens=40, **GREEDY).result().text
            except Exception as e:  # noqa: BLE001
                errs.append(repr(e))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ck.eq((out, errs), (want, []), "four threads sharing one connection")


async def async_checks(ck, d, ref, long_prompt):
    c = await resident.aio.connect(d.sock, client="test-python-aio")
    async with c:
        ck.eq(c.server["version"], 1, "aio: hello at connect")
        want = ref.generate(prompt="Once upon", max_tokens=20, **GREEDY)
        g = await c.generate(prompt="Once upon", max_tokens=20, **GREEDY)
        ids = [t.id async for t in g]
        ck.eq((ids, g.done.finish, g.text), (want.ids, want.finish, want.text), "aio: generate")
        d2 = await (await c.generate(prompt="Once upon", max_tokens=20, stream=False, **GREEDY)).result()
        ck.eq(d2.text, want.text, "aio: stream=False")

        prompts = ["task %d" % i for i in range(4)]
        wants = [ref.generate(messages=user(p), max_tokens=30, **GREEDY).text for p in prompts]

        async def one(p):
            return (await (await c.generate(messages=user(p), max_tokens=30, **GREEDY)).result()).text
        ck.eq(await asyncio.gather(*(one(p) for p in prompts)), wants, "aio: four generations at once")

        s = await c.session_new(title="aio")
        r = await (await c.generate(messages=user("Hi"), session=s["session"], max_tokens=4)).result()
        ck.eq(r.session, s["session"], "aio: a session's generation")
        ck.eq(len((await c.session_get(s["session"]))["turns"]), 2, "aio: session_get")
        ck.ok(s["session"] in [x["session"] for x in await c.session_list()], "aio: session_list")
        f = await c.session_fork(s["session"])
        ck.eq((await c.session_rename(f["session"], "t"))["title"], "t", "aio: fork, rename")
        await c.session_delete(f["session"])
        try:
            await c.session_get(f["session"])
            ck.ok(False, "aio: a deleted session is gone")
        except resident.NotFound as e:
            ck.eq(e.code, "not_found", "aio: NotFound carries not_found")

        ck.eq([m["name"] for m in await c.model_list()][-1], MODEL, "aio: model_list")
        seen = []
        m = await c.model_load("other", progress=lambda done, total: seen.append(done))
        ck.ok(m["loaded"] and seen, "aio: model_load with progress")
        ck.eq((await c.model_unload("other"))["unloaded"], True, "aio: model_unload")
        ck.eq((await c.model_show("other"))["loaded"], False, "aio: model_show")
        ids = await c.tokenize("Hello world")
        ck.eq(await c.detokenize(ids), ref.call("detokenize", tokens=ids)["text"], "aio: tokenize, detokenize")
        ck.ok("active" in await c.status(), "aio: status")

        g = await c.generate(messages=user(long_prompt), max_tokens=LONG, **GREEDY)
        await g.__anext__()
        await g.cancel()
        ck.eq((await g.result()).finish, "cancel", "aio: cancel")
        try:
            await (await c.generate(prompt="x", top_p=5)).result()
            ck.ok(False, "aio: top_p 5 is refused")
        except resident.InvalidParam as e:
            ck.eq(e.code, "invalid_param", "aio: InvalidParam")


def check_lost(ck, d, long_prompt):
    """The daemon dies mid-generation: both APIs raise ConnectionLost, also for later calls."""
    c = resident.connect(d.sock)
    g = c.generate(messages=user(long_prompt), max_tokens=LONG, **GREEDY)
    next(g)

    async def aio_side():
        a = await resident.aio.connect(d.sock)
        ag = await a.generate(messages=user(long_prompt), max_tokens=LONG, **GREEDY)
        await ag.__anext__()
        d.kill9()
        try:
            await ag.result()
            return None
        except resident.ResidentError as e:
            return e
        finally:
            await a.close()

    e = asyncio.run(aio_side())
    ck.ok(isinstance(e, resident.ConnectionLost), "aio: ConnectionLost when the daemon dies (%r)" % e)
    raises(ck, g.result, resident.ConnectionLost, None, "ConnectionLost when the daemon dies")
    raises(ck, c.status, resident.ConnectionLost, None, "a later call on the lost connection")
    c.close()


def check_pip_install(ck):
    """pip installs the package from its pyproject.toml (without network: no build isolation)."""
    import importlib.util
    if importlib.util.find_spec("setuptools") is None or (
            importlib.util.find_spec("wheel") is None and
            importlib.util.find_spec("setuptools.command.bdist_wheel") is None):
        print("-- pip install not tried: setuptools and wheel are needed to build the package offline")
        return
    with tempfile.TemporaryDirectory() as tmp:
        build = os.path.join(tmp, "src")
        subprocess.run(["cp", "-r", SRC, build], check=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", "--disable-pip-version-check", "--target", os.path.join(tmp, "t"),
                            build], capture_output=True, text=True, timeout=300)
        ck.ok(r.returncode == 0, "pip install: %s" % r.stderr[-1000:])
        r = subprocess.run([sys.executable, "-c", "import resident, sys; print(resident.__file__, "
                            "resident.__version__, resident.connect, resident.aio.connect)"],
                           env=dict(os.environ, PYTHONPATH=os.path.join(tmp, "t")), capture_output=True,
                           text=True, cwd=tmp, timeout=60)
        ck.ok(r.returncode == 0 and r.stdout.startswith(os.path.join(tmp, "t")),
              "the installed package imports: %s%s" % (r.stdout, r.stderr[-500:]))


def run():
    ck = Checks()
    with ck.section("socket path"):
        check_socket_path(ck)
    with Daemon() as d:
        with ck.section("no daemon"):
            check_no_daemon(ck, d.tmp)
        with d.client(timeout=60) as ref:
            long_prompt = rsd.long_prompt(ref, LONG, messages=True)
            with ck.section("blocking"):
                check_blocking(ck, d, ref, long_prompt, d.tmp)
            with ck.section("concurrent, blocking"):
                check_concurrent_blocking(ck, d, ref)
            with ck.section("asyncio"):
                asyncio.run(async_checks(ck, d, ref, long_prompt))
        with ck.section("connection lost"):
            check_lost(ck, d, long_prompt)      # kills the daemon
    with ck.section("pip install"):
        check_pip_install(ck)
    return ck


if __name__ == "__main__":
    rsd.main(run)
