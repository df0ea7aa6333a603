#!/usr/bin/env python3
"""test_faults.py: a backend that fails in the middle of serving.

The backends' fault hooks (kernels/fault.h) make the Nth call of a kind
fail: RESIDENT_CPU_FAULT (step, copy) here, on the CPU backend, which goes
through the same scheduler path as a GPU fault; tests/e2e/test_gpu_faults.py
runs the same scenarios with RESIDENT_CUDA_FAULT (launch, copy, alloc) on a
GPU. A scenario:

  - a daemon without faults gives the reference greedy replies;
  - a daemon with the fault serves four sessions at once (and a fork, whose
    next turn copies a shared KV block) round after round until the fault
    fires: each request either finishes or ends with model_error saying the
    fault was injected (the step's requests: the failed call; the model's
    other running requests: that the model was loaded again after it);
  - then status counts the fault and names the device (--device-fault cpu:
    the CPU), nothing is left running, each session holds exactly its
    finished turns, the same greedy replies come back (same device), and
    every session takes another turn.

Also: a fault on every step from the Nth on (the daemon keeps answering and
counts them), a malformed RESIDENT_CPU_FAULT (refused at start), and bad
arguments and settings (refused before the start, with nothing leaked under
tests/valgrind.sh).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, ProtoError  # noqa: E402

PROMPTS = ["The lighthouse keeper", "A storm over the harbour", "Salt and glass"]
GREEDY = dict(max_tokens=24, temperature=0)
N_SESSIONS = 4
MAX_ROUNDS = 30


def user(text):
    return [{"role": "user", "content": text}]


def replies(d):
    """The greedy replies to PROMPTS, one request at a time."""
    with d.client(timeout=300) as c:
        return [c.generate(prompt=p, **GREEDY).ids for p in PROMPTS]


def injected(ck, what, e):
    """An error a fault caused: model_error saying it was injected."""
    return ck.ok(e.code == "model_error" and "fault injected by RESIDENT_" in e.reply.get("message", ""),
                 "%s: %s: %s" % (what, e.code, e.reply.get("message")))


def round_of_turns(d, c, sessions, turns, rnd, errors):
    """A fork of the first session (while it is idle, so that the child shares its
    cached blocks and its first turn copies the last one), then one turn on each
    session and on the fork at once."""
    child = c.call("session.fork", session=sessions[0])["session"]["session"]
    turns[child] = list(turns[sessions[0]])

    def one(sid, i):
        text = "round %d, turn of session %d" % (rnd, i)
        try:
            with d.client(timeout=300) as c2:
                g = c2.generate(session=sid, messages=user(text), max_tokens=16, temperature=0)
            turns[sid] += [("user", text), ("assistant", g.text)]
        except ProtoError as e:
            errors.append(e)
    threads = [threading.Thread(target=one, args=(sid, i)) for i, sid in enumerate(sessions + [child])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)


def scenario(ck, name, device, env, policy, device_after, extra=()):
    """Serves until the fault fires, then checks the daemon recovered (see the file's comment)."""
    flags = ["--device", device, "--ctx", "2048"] + list(extra)
    with ck.section("%s: reference" % name), Daemon(extra=flags) as d:
        want = replies(d)
    with ck.section(name), Daemon(extra=flags + ["--device-fault", policy], env=env) as d:
        c = d.client(timeout=300)
        sessions = [c.call("session.new", title="s%d" % i)["session"]["session"] for i in range(N_SESSIONS)]
        turns = {s: [] for s in sessions}
        errors = []
        for rnd in range(MAX_ROUNDS):
            round_of_turns(d, c, sessions, turns, rnd, errors)
            if errors:
                break
        if not ck.ok(errors, "%s: the fault fired within %d rounds" % (name, MAX_ROUNDS)):
            return
        print("   %s: fired in round %d; %d requests failed, e.g. %s" % (name, rnd, len(errors),
                                                                         errors[0].reply.get("message")))
        for e in errors:
            injected(ck, "%s: a failed request" % name, e)
        st = c.call("status")
        m = st["models"][0]
        ck.ok(m["faults"] >= 1, "%s: status counts the fault: %d" % (name, m["faults"]))
        ck.eq(m["device"], device_after, "%s: the model runs on" % name)
        ck.eq((st["active"], st["queued"]), (0, 0), "%s: nothing left running or queued" % name)
        for sid, t in turns.items():
            got = [(x["role"], x["content"]) for x in c.call("session.get", session=sid)["turns"]]
            ck.eq(got, t, "%s: session %s holds its finished turns, no failed one" % (name, sid[:8]))
        if device_after == device:
            ck.eq(replies(d), want, "%s: the same greedy replies after the reload" % name)
        for sid in turns:
            g = c.generate(session=sid, messages=user("after the fault"), max_tokens=8, temperature=0)
            ck.ok(g.finish in ("stop", "length"), "%s: session %s takes another turn" % (name, sid[:8]))
        c.close()


def persistent(ck, name, device, env, first):
    """Every step from the first failing one on fails: each request says so, the daemon answers."""
    with ck.section(name), Daemon(extra=["--device", device], env=env) as d:
        c = d.client(timeout=300)
        failed = 0
        for i in range(first + 3):
            try:
                c.generate(prompt="step %d" % i, max_tokens=1, temperature=0)
            except ProtoError as e:
                failed += injected(ck, "%s: request %d" % (name, i), e)
        ck.ok(failed >= 3, "%s: %d requests failed" % (name, failed))
        ck.ok(c.call("status")["models"][0]["faults"] >= failed, "%s: each failure counted" % name)
        ck.ok(len(c.call("tokenize", text="still here")["tokens"]) > 0, "%s: the daemon still answers" % name)
        c.close()


def refused(ck, name, env, want):
    """A fault plan that keeps the default model from loading: the daemon exits
    with status 1 and says why (it may listen for a moment before: it loads
    its default model after opening its socket)."""
    with ck.section(name):
        d = Daemon(env=env)
        try:
            try:
                d.start()
                rc = d.proc.wait(300)
            except AssertionError:
                rc = d.proc.wait(10) if d.proc is not None else None
            ck.eq(rc, 1, "%s: the daemon's exit status" % name)
            ck.ok(want in d.log_text(), "%s: its log says %r" % (name, want))
        finally:
            d.cleanup()


def bad_settings(ck):
    """Arguments and settings residentd refuses before it starts: exit status 2
    and what was wrong (under tests/valgrind.sh: nothing leaked on the way
    out); --help prints the usage and exits 0."""
    with ck.section("refused settings"):
        tmp = tempfile.mkdtemp(prefix="resident-bad-")
        try:
            cfg = os.path.join(tmp, "residentd.json")
            with open(cfg, "w") as f:
                f.write('{"threads": "many"}')
            base = [rsd.daemon_path(), "-s", os.path.join(tmp, "s"), "--db", os.path.join(tmp, "db")]
            # test_spec.py checks what each --model-draft refusal says; here, one after a pair was kept
            cases = [(["-m", "a.gguf", "-m", "b.gguf", "-c", cfg], 2, "threads must be"),
                     (["--model-draft", "a.gguf=b.gguf", "--model-draft", "nodraft"], 2, "MODEL=PATH"),
                     (["--no-such-flag"], 2, "usage: residentd"),
                     (["--help"], 0, "usage: residentd")]
            for args, want_rc, says in cases:
                r = subprocess.run(base + args, capture_output=True, text=True, timeout=120)
                ck.eq(r.returncode, want_rc, "residentd %s: exit status" % " ".join(args))
                ck.ok(says in r.stdout + r.stderr, "residentd %s: says %r (%s)"
                      % (" ".join(args), says, (r.stdout + r.stderr).strip()[-200:]))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    ck = Checks()
    bad_settings(ck)
    scenario(ck, "cpu step fault, reload", "cpu", {"RESIDENT_CPU_FAULT": "step:60"}, "reload", "cpu")
    scenario(ck, "cpu KV copy fault, reload", "cpu", {"RESIDENT_CPU_FAULT": "copy:1"}, "reload", "cpu")
    scenario(ck, "cpu step fault, --device-fault cpu", "cpu", {"RESIDENT_CPU_FAULT": "step:60"}, "cpu", "cpu")
    persistent(ck, "cpu step faults from the 3rd on", "cpu", {"RESIDENT_CPU_FAULT": "step:3+"}, 3)
    refused(ck, "a kind the CPU backend does not count", {"RESIDENT_CPU_FAULT": "launch:1"}, "RESIDENT_CPU_FAULT")
    refused(ck, "a malformed count", {"RESIDENT_CPU_FAULT": "step:0"}, "RESIDENT_CPU_FAULT")
    return ck


if __name__ == "__main__":
    rsd.main(main)
