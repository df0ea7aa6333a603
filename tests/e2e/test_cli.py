"""End-to-end test of the `resident` CLI (and so of libresident) against a real
residentd: generated tiny models, a temporary socket and database. Every
command is run, text and --json output checked (JSON parsed with json.load),
a session made by `chat` from stdin is resumed, Ctrl-C cancels a generation,
a model loaded on demand shows in `ps` and `stop` unloads it under a running
request, --start launches a daemon, and the daemon stops on SIGTERM with
status 0.
Automake runs it with RESIDENT_BUILDDIR set (exit 0 pass, 1 fail)."""
import atexit
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "py"))
from common import binary, fail, srcdir  # noqa: E402
import rsd  # noqa: E402

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIMEOUT = 30  # seconds for one CLI command

tmp = tempfile.mkdtemp(prefix="resident-e2e.")
daemons = []  # Popen objects, or pids of daemons that are not our children


def cleanup():
    """Stops every daemon this test started, then removes the temporary files."""
    for d in daemons:
        try:
            if isinstance(d, int):
                os.kill(d, signal.SIGKILL)
            elif d.poll() is None:
                d.kill()
                d.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
    shutil.rmtree(tmp, ignore_errors=True)


atexit.register(cleanup)
# automake's harness or a user may stop the test: still clean up
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, lambda s, f: sys.exit(128 + s))


def check(cond, what, detail=""):
    if not cond:
        fail(f"{what}{': ' + str(detail) if detail else ''}")


def resident(*args, stdin=None, sock=None, rc=0, cwd=None):
    """Runs the CLI; checks its exit status (None: any). Returns (stdout, stderr, status)."""
    argv = [binary("resident"), "--socket", sock or SOCK, *args]
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=TIMEOUT,
                       errors="replace", cwd=cwd)
    if rc is not None and r.returncode != rc:
        fail(f"`resident {' '.join(args)}` exited {r.returncode}, expected {rc}\n"
             f"stdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-2000:]}")
    return r.stdout, r.stderr, r.returncode


JSON_KEYS = {}  # every key --json printed: the command that printed it first


def seen_keys(v, cmd):
    """Records the keys of a JSON value (a session's sampling `defaults` are the protocol's)."""
    if isinstance(v, dict):
        for k, x in v.items():
            JSON_KEYS.setdefault(k, cmd)
            if k != "defaults":
                seen_keys(x, cmd)
    elif isinstance(v, list):
        for x in v:
            seen_keys(x, cmd)


def resident_json(*args, **kw):
    out, _, _ = resident(*args, "--json", **kw)
    try:
        v = json.loads(out)
    except ValueError as e:
        fail(f"`resident {' '.join(args)} --json` printed no JSON ({e}): {out[:500]!r}")
    seen_keys(v, " ".join(args[:2]))
    return v


def wait_for_socket(path, proc, what):
    """Waits until a daemon accepts on path."""
    deadline = time.time() + 20
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            fail(f"{what} exited with {proc.returncode}: {open(LOG).read()[-2000:]}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
                return
        except OSError:
            time.sleep(0.05)
    fail(f"{what} did not listen on {path}")


def first_output(p):
    """Waits for the first byte a CLI process writes to stdout (generation has started)."""
    if not select.select([p.stdout], [], [], TIMEOUT)[0]:
        p.kill()
        fail("no output from the generation")
    return p.stdout.read(1)


def ok(msg):
    print(f"ok  {msg}", flush=True)


SOCK = os.path.join(tmp, "sock")
DB = os.path.join(tmp, "db.sqlite")
LOG = os.path.join(tmp, "residentd.log")
MODEL = os.path.join(tmp, "tiny.gguf")
OTHER = os.path.join(tmp, "other.gguf")     # shown while not loaded
SLOW = os.path.join(tmp, "slow.gguf")       # a vocabulary of 65,536: slow enough to act on a running request
# sampling close to uniform over slow's 65,536 tokens: it runs (at 70 tokens/s on the 2-core
# development VM) until it is stopped
SLOW_RUN = ["-m", SLOW, "--raw", "-t", "5", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "7",
            "-n", "2000", "once upon a time"]


def test_not_running():
    _, err, _ = resident("status", rc=3)
    check(f"residentd is not running (no socket at {SOCK})" in err, "no-socket message", err)
    check("residentd -m MODEL" in err and "systemctl --user start residentd" in err,
          "the message says how to start it", err)
    # a socket file nobody listens on (a daemon that died)
    stale = os.path.join(tmp, "stale")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(stale)
    _, err, _ = resident("sessions", "list", sock=stale, rc=3)
    check("nobody listens" in err, "stale-socket message", err)
    ok("not running: exit 3 with a clear message")


def test_usage():
    out, _, _ = resident("--version")
    check(out.startswith("resident ") and "protocol 1" in out, "--version", out)
    out, _, _ = resident("--help")
    check("sessions fork" in out and "exit status" in out and "ps " in out and "show NAME_OR_PATH" in out
          and "stop NAME_OR_PATH" in out, "--help", out)
    for args in (["frobnicate"], ["sessions"], ["sessions", "show"], ["sessions", "bogus"],
                 ["models", "load"], ["run", "--top-k", "many", "hi"], ["run", "--raw",
                 "--session", "x", "hi"], ["chat", "extra"], ["status", "extra"],
                 ["sessions", "list", "--limit", "x"], ["show"], ["show", "a", "b"], ["stop"],
                 ["ps", "extra"], ["models", "show"], ["models", "unload", "a", "b"]):
        _, err, _ = resident(*args, rc=2)
        check(err.startswith("resident: "), f"usage error message of {args}", err)
    r = subprocess.run([binary("resident")], capture_output=True, timeout=TIMEOUT)
    check(r.returncode == 2, "no command: exit 2", r)
    # a bad value is said as the option typed, not as the protocol's field (--max_tokens is no option)
    for args, says in ((["-n", "-5"], "run: --max-tokens wants a whole number, not '-5'"),
                       (["--top-k", "many"], "run: --top-k wants a whole number, not 'many'"),
                       (["--min-p", "x"], "run: --min-p wants a number, not 'x'"),
                       (["--repeat-penalty", "x"], "run: --repeat-penalty wants a number, not 'x'")):
        _, err, _ = resident("run", *args, "hi", rc=2)
        check(says in err, f"the bad value of {args} named as its option", err)
    ok("usage errors: exit 2")


def test_command_help():
    """-h and --help after any command print the usage on stdout and exit 0, whatever else the
    command line holds; after "--", or as an option's value, "--help" is an argument like others
    (here a prompt, sent to a daemon that is not running: exit 3)."""
    usage, _, _ = resident("--help")
    for args in (["run", "--help"], ["run", "-h"], ["run", "-n", "3", "hi", "--help"], ["chat", "--help"],
                 ["sessions", "--help"], ["sessions", "rm", "-h"], ["session", "list", "--help"],
                 ["models", "--help"], ["models", "load", "-h"], ["show", "--help"], ["stop", "-h"],
                 ["ps", "--help"], ["status", "-h"], ["embed", "-h"], ["embed", "-m", "x", "--help", "text"]):
        out, err, _ = resident(*args)
        check(out == usage and err == "", f"`resident {' '.join(args)}` prints the usage", (out[:200], err))
    for args in (["run", "--", "--help"], ["run", "--stop", "-h", "hi"], ["run", "--system", "--help", "hi"],
                 ["embed", "--", "-h"]):
        out, err, _ = resident(*args, rc=3)
        check(out == "" and "residentd is not running" in err, f"`resident {' '.join(args)}`: an argument",
              (out[:200], err))
    ok("-h / --help after every command: the usage, exit 0; after -- or as a value: an argument")


def test_daemon_bad_options():
    """residentd refuses a numeric option that is not a whole number, and a device it does not
    have, with exit status 2 and a message naming the option (residentd(8), EXIT STATUS), instead
    of taking "many" for 0 (the default) and starting."""
    for args, says in ((["--threads", "many"], "--threads wants a whole number, not 'many'"),
                       (["--ctx", "12abc"], "--ctx wants a whole number, not '12abc'"),
                       (["--max-seqs", "x"], "--max-seqs wants a whole number, not 'x'"),
                       (["--max-frame", "16M"], "--max-frame wants a whole number, not '16M'"),
                       (["--device", "gpu"], "residentd: --device: unknown device 'gpu' (cpu, cuda)")):
        sock = os.path.join(tmp, "bad-option.sock")
        argv = [binary("residentd"), "-m", MODEL, "-s", sock, "--db", os.path.join(tmp, "db4.sqlite"), *args]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            fail(f"residentd {' '.join(args)} started instead of refusing the value")
        check(r.returncode == 2 and says in r.stderr, f"residentd {' '.join(args)}: exit 2 saying {says!r}",
              (r.returncode, r.stderr[-500:]))
        check(not os.path.exists(sock), f"residentd {' '.join(args)} made no socket")
    ok("residentd: bad option values refused with exit 2")


def test_status():
    out, _, _ = resident("status")
    for word in ("residentd", "protocol 1", "tiny", "MODEL", "PID", "resident", "batches", "memory",
                 "KV cache", "on disk", "KEEP-ALIVE", "5m 00s", "CACHE HIT / MISS", "requests", "cancelled",
                 "PROMPT TOKENS", "GUESSES ACCEPTED", "FIRST TOKEN p50 / p90", "NEXT TOKEN p50 / p90"):
        check(word in out, f"status shows {word}", out)
    st = resident_json("status")
    check(st["version"] == 1 and st["uptime_s"] >= 0, "status version, uptime", st)
    check([m["name"] for m in st["models"]] == ["tiny"], "status models", st)
    check(st["models"][0]["weights_bytes"] > 0, "status weights_bytes", st)
    check(any(c["client"] == "resident" and c["pid"] > 0 for c in st["clients"]), "status clients", st)
    check(set(st["steps"]) >= {"count", "tokens", "max_batch", "mean_batch"}, "status steps", st)
    check(st["active"] == 0 and st["queued"] == 0, "status idle", st)
    check(set(st["memory"]) >= {"budget_bytes", "used_bytes", "loads", "unloads"}, "status memory", st)
    check(set(st["kv"]) >= {"device_bytes", "host_bytes", "disk_bytes"}, "status kv", st)
    check(st["models"][0]["memory_bytes"] > 0 and st["models"][0]["keep_alive_s"] == 300, "status model memory",
          st)
    ok("status, text and JSON")


def test_models():
    out, _, _ = resident("models", "list")
    check(re.search(r"^tiny\s+yes\s+\*\s+cpu\s+llama", out, re.M), "models list row", out)
    ms = resident_json("models", "list")["models"]
    check(len(ms) == 1 and ms[0]["name"] == "tiny" and ms[0]["loaded"] and ms[0]["default"]
          and ms[0]["path"] == MODEL, "models list JSON", ms)
    out, _, _ = resident("models", "unload", "tiny")
    check(out == "unloaded tiny\n", "unload says so", out)
    check(not resident_json("models", "list")["models"][0]["loaded"], "unloaded")
    out, err, _ = resident("models", "load", "tiny")
    check(out.startswith("loaded tiny (llama, "), "load message", out)
    check(resident_json("models", "list")["models"][0]["loaded"], "loaded again")
    m = resident_json("models", "load", MODEL)["model"]       # by path
    check(m["name"] == "tiny" and m["loaded"], "load by path, JSON", m)
    u = resident_json("models", "unload", "tiny")
    check(set(u) == {"model", "unloaded", "cancelled"} and u["unloaded"] and u["cancelled"] == 0
          and u["model"]["name"] == "tiny" and not u["model"]["loaded"], "unload JSON", u)
    resident("models", "load", "tiny")
    _, err, _ = resident("models", "load", "no-such-model", rc=1)
    check("not_found" in err, "loading an unknown model", err)
    _, err, _ = resident("models", "unload", "no-such-model", rc=1)
    check("not_found" in err, "unloading an unknown model", err)
    ok("models list / load / unload")


# the keys of `show --json`'s model (resident(1) documents them)
SHOW_KEYS = {"name", "path", "loaded", "default", "device", "arch", "size", "format", "parameters", "quantization",
             "tensor_types", "context", "context_train", "template", "template_error", "vocab", "layers",
             "embedding", "heads", "kv_heads", "head_dim", "feed_forward", "sliding_window", "memory_bytes",
             "need_bytes", "whole_bytes", "host_layers", "host_bytes", "hot_experts", "pooling", "dimensions", "bidirectional"}
# the keys of a status model map, as `ps --json` prints those of the loaded models
STATUS_MODEL_KEYS = {"name", "loaded", "device", "exact", "faults", "memory_bytes", "keep_alive_s", "expires_in_s",
                     "loads", "unloads", "weights_bytes", "host_layers", "host_bytes", "hot_experts", "expert_moves", "kv_type", "kv_bytes", "kv_blocks", "kv_free_blocks", "kv_used_bytes",
                     "active", "queued", "cache_hit_tokens", "cache_miss_tokens", "cache_host_hit_tokens",
                     "cache_disk_hit_tokens", "prompt_tokens", "generated_tokens", "drafted_tokens", "accepted_tokens",
                     "ttft", "itl"}


def ps_rows():
    """`resident ps` as {name: [device, memory, running, queued, keep-alive]}, its header checked, and its
    HOST column "-" (the CPU keeps no layer apart)."""
    out, _, _ = resident("ps")
    lines = out.splitlines()
    check(lines and lines[0].split() == ["NAME", "DEVICE", "MEMORY", "HOST", "RUNNING", "QUEUED", "KEEP-ALIVE"],
          "ps header", out)
    rows = {}
    for line in lines[1:]:
        m = re.fullmatch(r"(\S+)\s+(\S+)\s+(\d+\.\d [KMG]iB)\s+-\s+(\d+)\s+(\d+)\s+(.+)", line)
        check(m, "a ps line (no host layers)", line)
        rows[m.group(1)] = list(m.groups()[1:])
    return rows


def test_show():
    out, _, _ = resident("show", "tiny")
    for line in ("name          tiny (the default model)", f"path          {MODEL}", "family        llama (gguf)",
                 "parameters    1.7M", "layers        2, embedding 256, feed-forward 512",
                 "attention     4 heads, 2 KV heads, head size 64", "vocabulary    1024 tokens",
                 "context       2048 tokens (trained for 2048)", "template      llama3", "loaded        on cpu, "):
        check(line in out, f"show: {line!r}", out)
    check(re.search(r"^quantization  Q8_0 \(Q8_0: 16 tensors, 1\.7 MiB; F32: 5 tensors, 5\.0 KiB\)$", out, re.M),
          "show: quantization and tensor types", out)
    m = resident_json("show", "tiny")["model"]
    check(set(m) == SHOW_KEYS, "show --json keys", sorted(set(m) ^ SHOW_KEYS))
    # the CPU computes every layer where its weights are: nothing to place, the least it needs is all of it
    check(m["host_layers"] == 0 and m["host_bytes"] == 0 and m["whole_bytes"] == m["need_bytes"],
          "show --json: no host layers on the CPU", m)
    check(m["loaded"] and m["quantization"] == "Q8_0" and m["memory_bytes"] >= m["need_bytes"] > 0
          and m["context"] == 2048 and m["template_error"] == "", "show --json of the loaded model", m)
    check(resident_json("models", "show", "tiny") == {"model": m}, "models show is show")
    # a file not loaded: described from the file, and it stays not loaded
    out, _, _ = resident("show", OTHER)
    check("name          other\n" in out and re.search(r"^quantization  Q4_K_M \(Q4_K: 13 tensors", out, re.M)
          and re.search(r"^loaded        no \(loading takes \d+\.\d MiB at least\)$", out, re.M),
          "show of a model not loaded", out)
    m = resident_json("show", OTHER)["model"]
    check(set(m) == SHOW_KEYS and not m["loaded"] and m["device"] == "" and m["memory_bytes"] == 0
          and m["need_bytes"] > 0 and m["tensor_types"][0] == {"type": "Q4_K", "tensors": 13, "bytes": 718848},
          "show --json of a model not loaded", m)
    check(list(ps_rows()) == ["tiny"], "show loads nothing")
    # a relative path is a path here, not in residentd's directory
    out, _, _ = resident("show", os.path.basename(OTHER), cwd=tmp)
    check("name          other\n" in out, "show of a relative path", out)
    _, err, _ = resident("show", "no-such-model", rc=1)
    check(err.startswith("resident: show: no model named 'no-such-model'") and "(not_found)" in err,
          "show of an unknown model", err)
    ok("show: loaded, not loaded, by path, unknown")


def test_ps_stop():
    """A model loaded on demand by a running request shows in ps; stop unloads it and
    ends the request; stop of a model not loaded says so."""
    rows = ps_rows()
    check(list(rows) == ["tiny"] and rows["tiny"][0] == "cpu" and rows["tiny"][2:4] == ["0", "0"]
          and re.fullmatch(r"(\d+m \d\ds|\d+\.\ds) left", rows["tiny"][4]), "ps of the idle default model", rows)
    ms = resident_json("ps")["models"]
    check(len(ms) == 1 and set(ms[0]) == STATUS_MODEL_KEYS and ms[0]["name"] == "tiny" and ms[0]["loaded"]
          and ms[0]["memory_bytes"] > 0 and 0 < ms[0]["expires_in_s"] <= 300, "ps --json", ms)
    p = subprocess.Popen([binary("resident"), "--socket", SOCK, "run", "-v", *SLOW_RUN],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first_output(p)
        rows = ps_rows()
        check(sorted(rows) == ["slow", "tiny"] and rows["slow"][2:] == ["1", "0", "in use"],
              "the model loaded for a running request is in ps, in use", rows)
        m = [m for m in resident_json("ps")["models"] if m["name"] == "slow"]
        check(len(m) == 1 and m[0]["active"] == 1 and m[0]["expires_in_s"] == -1, "ps --json while in use", m)
        out, _, _ = resident("stop", "slow")
        check(out == "unloaded slow; 1 running request was cancelled\n", "stop of a model in use", out)
        _, err = p.communicate(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    check(p.returncode == 0 and b"[cancel]" in err, "the running request ended as cancelled", (p.returncode, err))
    check(list(ps_rows()) == ["tiny"], "stop removed it from ps")
    out, _, _ = resident("stop", "slow")
    check(out == "slow is not loaded\n", "stop of a model not loaded", out)
    u = resident_json("stop", SLOW)
    check(u["unloaded"] is False and u["cancelled"] == 0 and u["model"]["name"] == "slow", "stop --json", u)
    _, err, _ = resident("stop", "no-such-model", rc=1)
    check(err.startswith("resident: stop: no model named 'no-such-model'") and "(not_found)" in err,
          "stop of an unknown model", err)
    # a model kept until its memory is needed, and one unloaded when its request ends
    with rsd.Client(SOCK) as c:
        c.generate(prompt="1 2 3", max_tokens=2, temperature=0, keep_alive=-1)
        check(ps_rows()["tiny"][4] == "until needed", "ps: keep-alive -1")
        c.generate(prompt="1 2 3", max_tokens=2, temperature=0, keep_alive=300)
        c.generate(model=SLOW, prompt="1 2 3", max_tokens=2, temperature=0, keep_alive=0)
    check(list(ps_rows()) == ["tiny"], "keep-alive 0: unloaded when its request ended")
    ok("ps / stop: loaded on demand, in use, cancelled, not loaded, keep-alive left")


def test_run():
    out, _, _ = resident("run", "--raw", "-t", "0", "-n", "12", "1 2 3")
    again, _, _ = resident("run", "--raw", "--temperature", "0", "--max-tokens", "12", "1", "2", "3")
    check(out == again and out.endswith("\n") and len(out) > 1, "greedy run is repeatable", (out, again))
    d = resident_json("run", "--raw", "-t", "0", "-n", "12", "1 2 3")
    check(d["finish"] in ("stop", "length") and d["usage"]["generated_tokens"] <= 12, "done JSON", d)
    check(out in (d["text"], d["text"] + "\n"), "streamed text equals done's text", (out, d["text"]))
    u = d["usage"]
    check(u["prompt_tokens"] > 0 and u["ttft_ms"] > 0 and "cached_tokens" in u and "tokens_per_s" in u,
          "usage fields", u)
    # seeded sampling is repeatable; the prompt may come from stdin
    a = resident_json("run", "--seed", "42", "-n", "8", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.01",
                      "--repeat-penalty", "1.1", "-", stdin="tell me something")
    b = resident_json("run", "--seed", "42", "-n", "8", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.01",
                      "--repeat-penalty", "1.1", stdin="tell me something")
    check(a["text"] == b["text"] and a["usage"]["generated_tokens"] <= 8, "seeded run", (a, b))
    # a stdin that cannot be read is said so, not taken for no prompt
    fd = os.open(os.path.dirname(SOCK), os.O_RDONLY)   # a directory: reading it fails
    try:
        r = subprocess.run([binary("resident"), "--socket", SOCK, "run", "-"], stdin=fd, capture_output=True,
                           text=True, timeout=TIMEOUT)
    finally:
        os.close(fd)
    check(r.returncode == 2 and "reading standard input: Is a directory" in r.stderr,
          "run: stdin that cannot be read: exit 2, saying why", (r.returncode, r.stderr.strip()))
    # --stop: cut a known greedy output before a piece of it
    long = resident_json("run", "--raw", "-t", "0", "-n", "40", "1 2 3")["text"]
    m = re.search(r"[a-z]{3}", long[2:])
    check(m is not None, "a word to stop at in the greedy output", long)
    cut = resident_json("run", "--raw", "-t", "0", "-n", "40", "--stop", m.group(0), "--stop", "zzzq",
                        "1 2 3")
    check(cut["finish"] == "stop" and cut["text"] == long[:long.index(m.group(0))], "--stop",
          (m.group(0), long, cut))
    # -v prints the usage on stderr; --system with a chat message
    _, err, _ = resident("run", "-v", "-n", "3", "--system", "be brief", "hi")
    check(re.search(r"\[(stop|length)\] \d+ prompt tokens \(\d+ cached\), \d+ generated", err), "-v", err)
    # --tools: a required call, held to a schema of one value, is --json's tool_calls (and, as the
    # llama3 template has the calls written as the answer, calls_in_text) and a line of the text output
    tools = os.path.join(tmp, "tools.json")
    with open(tools, "w") as f:
        json.dump([{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"enum": ["Paris"]}}, "required": ["city"],
            "additionalProperties": False}}}], f)
    d = resident_json("run", "--tools", tools, "--tool-choice", "required", "-n", "400", "--seed", "1",
                      "Weather in Paris?")
    calls = d.get("tool_calls", [])
    check(d["finish"] == "stop" and [c["name"] for c in calls] == ["get_weather"]
          and json.loads(calls[0]["arguments"]) == {"city": "Paris"} and d.get("calls_in_text") is True,
          "run --tools --json: tool_calls", d)
    out, _, _ = resident("run", "--tools", tools, "--tool-choice", "get_weather", "-n", "400", "--seed", "1",
                         "Weather in Paris?")
    check(re.search(r'^tool call: get_weather \{"city": "Paris"\} \(call_\w{16}\)$', out, re.M),
          "run --tools prints the call", out)
    # the daemon refuses bad values: exit 1 with its code
    _, err, _ = resident("run", "--top-p", "5", "hi", rc=1)
    check("invalid_param" in err, "invalid top_p", err)
    _, err, _ = resident("run", "--model", "nope", "hi", rc=1)
    check("not_found" in err, "unknown model", err)
    ok("run: streaming, --json, --raw, sampling options, --stop, errors")


def test_run_cancel():
    """Ctrl-C during `run` cancels the generation: exit 130, the done says cancel."""
    p = subprocess.Popen([binary("resident"), "--socket", SOCK, "run", "--raw", "-t", "0", "-n", "2000",
                          "-v", "once upon a time"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = first_output(p)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=TIMEOUT)
    check(first and p.returncode == 130, "run exits 130 after Ctrl-C", (p.returncode, err))
    check(b"[cancel]" in err, "the generation ended as cancelled", err)
    # with --json nothing is printed until the end: Ctrl-C once status shows it running on the slow model
    p = subprocess.Popen([binary("resident"), "--socket", SOCK, "run", "--json", *SLOW_RUN],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + TIMEOUT
    while time.time() < deadline and resident_json("status")["active"] == 0:
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=TIMEOUT)
    check(p.returncode == 130 and json.loads(out)["finish"] == "cancel", "run --json exits 130 after Ctrl-C",
          (p.returncode, out[-300:], err))
    resident("stop", "slow")
    st = resident_json("status")
    check(st["active"] == 0, "nothing left running after the cancel", st)
    ok("run: Ctrl-C cancels")


CHAT_INPUT = 'first message\nsecond \\\nline\n\n"""\nblock line 1\n\nblock line 2\n"""\n'


def test_chat():
    """A chat from stdin makes a session; it is then resumed. Returns its id."""
    out, err, _ = resident("chat", "-n", "4", "--seed", "3", "--system", "You are terse.", stdin=CHAT_INPUT)
    m = re.search(r"new session (" + UUID.pattern + r")", err)
    check(m and f"resident chat --session {m.group(1)}" in err, "chat prints the new session id", err)
    sid = m.group(1)
    got = resident_json("sessions", "show", sid)
    s, turns = got["session"], got["turns"]
    check(s["system"] == "You are terse." and s["title"] == "first message", "chat session fields", s)
    check([t["role"] for t in turns] == ["user", "assistant"] * 3, "three exchanges", turns)
    check([t["content"] for t in turns[::2]] == ["first message", "second \nline",
                                                 "block line 1\n\nblock line 2"],
          "backslash continuation and \"\"\" blocks", turns)
    check(all(t["tokens"] > 0 for t in turns), "turn token counts", turns)
    for t in turns[1::2]:
        check(t["content"].strip()[:5] in out, "the replies were printed", (t["content"], out))
    # resume: the last turns are shown, the new exchange is appended
    out, err, _ = resident("chat", "--session", sid, "-n", "4", stdin="third\n")
    check(f"session {sid}: first message" in err, "resume header", err)
    check("user: first message" in out and "user: block line 1" in out, "resume shows the last turns", out)
    turns = resident_json("sessions", "show", sid)["turns"]
    check(len(turns) == 8 and turns[6]["content"] == "third", "resumed turn appended", turns)
    # the same session continues through `run --session`
    d = resident_json("run", "--session", sid, "-n", "3", stdin="fourth")
    check(d["session"] == sid and d["usage"]["cached_tokens"] > 0, "run --session reuses the cache", d)
    check(resident_json("sessions", "show", sid)["session"]["turns"] == 10, "run --session appends")
    _, err, _ = resident("chat", "--session", "00000000-0000-4000-8000-000000000000", stdin="", rc=1)
    check("not_found" in err, "resuming an unknown session", err)
    ok("chat: session from stdin, multi-line input, resume, run --session")
    return sid


def test_chat_cancel():
    """Ctrl-C while a reply streams cancels that turn only; the chat goes on."""
    p = subprocess.Popen([binary("resident"), "--socket", SOCK, "chat", "-t", "0", "-n", "1000"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write(b"abc\n")
    p.stdin.flush()
    first = first_output(p)
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)
    out, err = p.communicate(b"after\n", timeout=TIMEOUT)
    check(first and p.returncode == 0, "chat survives Ctrl-C", (p.returncode, err))
    check(b"[cancelled" in err, "the turn was cancelled", err)
    sid = UUID.search(err.decode()).group(0)
    turns = resident_json("sessions", "show", sid)["turns"]
    check([t["content"] for t in turns[::2]] == ["after"], "the cancelled turn is not kept", turns)
    ok("chat: Ctrl-C cancels a reply, not the chat")


def test_sessions(sid):
    out, _, _ = resident("sessions", "list")
    check(out.startswith("SESSION") and sid in out and "first message" in out, "sessions list", out)
    ss = resident_json("sessions", "list")["sessions"]
    mine = [s for s in ss if s["session"] == sid]
    check(len(mine) == 1 and mine[0]["turns"] == 10 and mine[0]["model"] == "tiny", "list JSON", ss)
    check(len(resident_json("sessions", "list", "--limit", "1")["sessions"]) == 1, "--limit")
    check(len(resident_json("sessions", "list", "--offset", "1000")["sessions"]) == 0, "--offset")
    out, _, _ = resident("sessions", "show", sid)
    check(f"session  {sid}" in out and "system   You are terse." in out and "assistant: " in out,
          "sessions show", out)
    # fork: prints the new id; with and without a title
    out, _, _ = resident("sessions", "fork", sid, "my fork")
    fork = out.strip()
    check(UUID.fullmatch(fork) and fork != sid, "fork prints the new id", out)
    f = resident_json("sessions", "show", fork)
    check(f["session"]["title"] == "my fork" and len(f["turns"]) == 10, "the fork has the history", f)
    f2 = resident_json("sessions", "fork", fork)["session"]
    check(f2["title"] == "my fork (fork)", "default fork title", f2)
    # rename
    out, _, _ = resident("sessions", "rename", fork, "renamed fork")
    check(out.strip() == f"{fork}  renamed fork", "rename output", out)
    check(resident_json("sessions", "rename", f2["session"], "r2")["session"]["title"] == "r2", "rename JSON")
    # rm
    out, _, _ = resident("sessions", "rm", fork)
    check(out == "", "rm prints nothing", out)
    check(resident_json("sessions", "rm", f2["session"]) == {}, "rm JSON is {}")
    _, err, _ = resident("sessions", "show", fork, rc=1)
    check("not_found" in err, "a removed session is gone", err)
    _, err, _ = resident("sessions", "rm", fork, rc=1)
    check("not_found" in err, "removing twice", err)
    _, err, _ = resident("sessions", "show", "not-a-uuid", rc=1)
    check("invalid_param" in err, "a malformed uuid", err)
    check(sid in [s["session"] for s in resident_json("sessions", "list")["sessions"]], "the original stays")
    ok("sessions list / show / fork / rename / rm")


def test_json_documented():
    """Every key that --json printed in this test is in resident(1)'s JSON OUTPUT section."""
    man = open(os.path.join(srcdir(), "contrib", "man", "resident.1")).read()
    section = man[man.index(".SH JSON OUTPUT"):man.index(".SH EXIT STATUS")]
    missing = sorted(f"{k} ({cmd})" for k, cmd in JSON_KEYS.items()
                     if not re.search(r"(?<![\w\\])" + re.escape(k) + r"(?!\w)", section))
    check(len(JSON_KEYS) > 60 and not missing, "JSON keys missing from resident.1", missing or len(JSON_KEYS))
    ok(f"the {len(JSON_KEYS)} JSON keys printed are documented in resident.1")


def test_start_daemon():
    """--start runs $RESIDENT_DAEMON -s SOCKET when nobody listens."""
    sock2, pidfile = os.path.join(tmp, "sock2"), os.path.join(tmp, "pid2")
    wrapper = os.path.join(tmp, "start-residentd")
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\necho $$ > '{pidfile}'\n"
                f"exec '{binary('residentd')}' -m '{MODEL}' --db '{tmp}/db2.sqlite' -t 1 \"$@\"\n")
    os.chmod(wrapper, 0o755)
    env = dict(os.environ, RESIDENT_DAEMON=wrapper)
    r = subprocess.run([binary("resident"), "--socket", sock2, "--start", "models", "list", "--json"],
                       capture_output=True, text=True, env=env, timeout=TIMEOUT)
    if os.path.exists(pidfile):
        daemons.append(int(open(pidfile).read()))
    check(r.returncode == 0 and json.loads(r.stdout)["models"][0]["name"] == "tiny", "--start", r)
    pid = daemons[-1]
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + 10
    while time.time() < deadline and os.path.exists(f"/proc/{pid}") and \
            "zombie" not in open(f"/proc/{pid}/status").read():
        time.sleep(0.05)
    check(not os.path.exists(sock2), "the started daemon stopped and removed its socket")
    ok("--start launches residentd")


def test_config_max_frame():
    """The configuration file's keys are the long options with underscores (residentd(8)):
    max_frame sets the frame limit, which hello states, and --max-frame overrides it."""
    cfg, sock = os.path.join(tmp, "residentd.json"), os.path.join(tmp, "sock-cfg")
    with open(cfg, "w") as f:
        json.dump({"max_frame": 1000}, f)
    for extra, want in (([], 1000), (["--max-frame", "2000"], 2000)):
        with open(LOG, "a") as log:
            d = subprocess.Popen([binary("residentd"), "-m", MODEL, "-s", sock, "-c", cfg, "--db",
                                  os.path.join(tmp, "db5.sqlite"), "-t", "1", *extra],
                                 stdout=log, stderr=subprocess.STDOUT)
        daemons.append(d)
        wait_for_socket(sock, d, "residentd -c")
        with rsd.Client(sock) as c:
            got = c.call("hello", client="test_cli", version=1)["max_frame"]
        d.send_signal(signal.SIGTERM)
        d.wait(15)
        check(got == want, f"max_frame of the config file {'with ' + ' '.join(extra) if extra else 'alone'}",
              got)
    ok("the config file's max_frame, and --max-frame over it")


def test_config_unknown_key():
    """A key of the config file that residentd does not read (a typo) is named in a warning at
    startup, and the daemon starts all the same; the keys it reads are not named."""
    cfg, sock, log = (os.path.join(tmp, n) for n in ("residentd-typo.json", "sock-typo", "residentd-typo.log"))
    with open(cfg, "w") as f:
        json.dump({"kv_hosts": "1G", "max_frame": 100000, "threads": 1, "model_drafts": {}}, f)
    with open(log, "w") as out:
        d = subprocess.Popen([binary("residentd"), "-m", MODEL, "-s", sock, "-c", cfg, "--db",
                              os.path.join(tmp, "db6.sqlite")], stdout=out, stderr=subprocess.STDOUT)
    daemons.append(d)
    wait_for_socket(sock, d, "residentd -c with an unknown key")
    d.send_signal(signal.SIGTERM)
    check(d.wait(15) == 0, "residentd with an unknown config key exits 0 on SIGTERM", open(log).read()[-2000:])
    text = open(log).read()
    check(f"{cfg}: unknown key 'kv_hosts' ignored" in text, "the unknown key is named with its file", text)
    check(text.count("unknown key") == 1, "the known keys are not warned about", text)
    ok("an unknown config key: a warning naming it, and the daemon starts")


def test_stop(daemon):
    daemon.send_signal(signal.SIGTERM)
    try:
        rc = daemon.wait(15)
    except subprocess.TimeoutExpired:
        fail("residentd did not stop on SIGTERM")
    check(rc == 0, "residentd exits 0 on SIGTERM", open(LOG).read()[-2000:])
    check(not os.path.exists(SOCK), "the socket is removed")
    _, err, _ = resident("status", rc=3)
    check("residentd is not running" in err, "after the stop: not running", err)
    ok("SIGTERM stops residentd with status 0")


def test_socket_path_taken():
    """residentd refuses a socket path another daemon answers on, or a file that is no socket (left as it was)."""
    for path, says in ((SOCK, "another program listens there"), (os.path.join(tmp, "plain"),
                                                                  "a file that is not a socket is there")):
        if path != SOCK:
            with open(path, "w") as f:
                f.write("not a socket")
        r = subprocess.run([binary("residentd"), "-m", MODEL, "-s", path, "--db", os.path.join(tmp, "db3.sqlite"),
                            "-t", "1"], capture_output=True, text=True, timeout=TIMEOUT)
        check(r.returncode != 0 and says in r.stderr, f"residentd on {path}: refused, saying {says!r}",
              (r.returncode, r.stderr[-500:]))
        check(os.path.exists(path), f"{path} is still there")
    check(open(os.path.join(tmp, "plain")).read() == "not a socket", "the plain file is untouched")
    ok("residentd refuses a socket in use and a file that is no socket")


def main():
    for shape, path, qtype in (("tiny", MODEL, "q8_0"), ("tiny", OTHER, "q4_k_m"), ("tiny-swa", SLOW, "q8_0")):
        r = subprocess.run([binary("resident-model"), "gen", shape, path, "--type", qtype, "--quiet"],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"generating the {shape} model {path}", r.stderr)
    test_not_running()
    test_usage()
    test_command_help()
    test_daemon_bad_options()
    with open(LOG, "w") as log:
        daemon = subprocess.Popen([binary("residentd"), "-m", MODEL, "-s", SOCK, "--db", DB, "-t", "2"],
                                  stdout=log, stderr=subprocess.STDOUT)
    daemons.append(daemon)
    wait_for_socket(SOCK, daemon, "residentd")
    test_status()
    test_socket_path_taken()
    test_models()
    test_run()
    test_run_cancel()
    sid = test_chat()
    test_chat_cancel()
    test_sessions(sid)
    test_show()
    test_ps_stop()
    test_json_documented()
    test_start_daemon()
    test_config_max_frame()
    test_config_unknown_key()
    test_stop(daemon)


if __name__ == "__main__":
    main()
