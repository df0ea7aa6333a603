#!/usr/bin/env python3
"""test_kv_type.py: residentd --kv-type q8_0, a KV cache of 8-bit values
and a scale for each 32 (the CPU backend's; docs/ARCHITECTURE.md).

1. A daemon with q8_0 answers greedily, over a session's turns too, with
   replies of the lengths asked; status gives its models' kv_type, and its
   pool takes 36 bytes for each 128 of the f16 daemon's (fp32 on the CPU)
   for the same --kv-tokens.
2. Its disk tier: restarted with q8_0, a session's next turn reads the KV
   stored by the first run (disk hits counted) and says what the first run
   would have; restarted with f16 instead, nothing of those files is read
   (no disk hits: they hold another type), and the turn still answers.
3. Bad settings stop residentd at its start, naming them: --kv-type q4, a
   config's kv_type of 3.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402

CPU = ["--device", "cpu", "--kv-tokens", "2048"]
TIMEOUT = 120
SYSTEM = "You keep the harbour's tide tables. " * 10
QUESTIONS = ["When is high water?", "And low water?", "What of the spring tides?"]


def model_status(c):
    return next(m for m in c.call("status")["models"] if m["loaded"])


def turn(c, sid, i):
    msgs = [{"role": "user", "content": QUESTIONS[i]}]
    if i == 0:
        msgs.insert(0, {"role": "system", "content": SYSTEM})
    return c.generate(session=sid, messages=msgs, max_tokens=12, temperature=0)


def sub(tmp, name):
    path = os.path.join(tmp, name)
    os.makedirs(path)
    return path


def check_serves(ck, tmp, model):
    """Section 1."""
    with Daemon(extra=CPU, tmp=sub(tmp, "f16"), model=model) as d:
        c = d.client(timeout=TIMEOUT)
        c.generate(prompt="warm", max_tokens=2, temperature=0)
        f16 = model_status(c)
    ck.eq(f16["kv_type"], "f16", "the default KV type: f16")
    with Daemon(extra=CPU + ["--kv-type", "q8_0"], tmp=sub(tmp, "q8"), model=model) as d:
        c = d.client(timeout=TIMEOUT)
        g = c.generate(prompt="the tide comes in and", max_tokens=24, temperature=0)
        ck.ok(g.finish in ("length", "stop") and len(g.ids) > 0, "q8_0: a greedy reply (%s, %d tokens)"
              % (g.finish, len(g.ids)))
        sid = c.call("session.new")["session"]["session"]
        got = [turn(c, sid, i) for i in range(2)]
        ck.ok(all(t.finish == "length" and len(t.ids) == 12 for t in got), "q8_0: two turns of a session")
        q8 = model_status(c)
    ck.eq(q8["kv_type"], "q8_0", "status: kv_type q8_0")
    ck.ok(q8["kv_blocks"] == f16["kv_blocks"] and q8["kv_bytes"] * 128 == f16["kv_bytes"] * 36,
          "q8_0's pool: 36 bytes for f16's 128 (%d / %d bytes, %d / %d blocks)"
          % (q8["kv_bytes"], f16["kv_bytes"], q8["kv_blocks"], f16["kv_blocks"]))


def disk_hits(c):
    return model_status(c)["cache_disk_hit_tokens"]


def check_disk(ck, tmp, model):
    """Section 2."""
    d = Daemon(extra=CPU + ["--kv-type", "q8_0"], tmp=sub(tmp, "disk"), model=model)
    with d:
        c = d.client(timeout=TIMEOUT)
        sid = c.call("session.new")["session"]["session"]
        turn(c, sid, 0)
        ref = d.client(timeout=TIMEOUT)
        # the reply the first run gives to the second question, on a session of its own that it keeps in memory
        sid2 = ref.call("session.new")["session"]["session"]
        turn(ref, sid2, 0)
        want = turn(ref, sid2, 1)
        c.call("session.delete", session=sid2)
        rsd.wait_for(lambda: len(os.listdir(os.path.join(d.tmp, "kv"))) > 0, timeout=20)
        d.stop()
        d.start()
        c = d.client(timeout=TIMEOUT)
        again = turn(c, sid, 1)
        ck.ok(disk_hits(c) > 0, "restarted with q8_0: the session's KV read from disk (%d tokens)" % disk_hits(c))
        ck.eq(again.ids, want.ids, "and the turn is the one the first run gives")
        d.stop()
        d.extra = CPU + ["--kv-type", "f16"]
        d.start()
        c = d.client(timeout=TIMEOUT)
        g = turn(c, sid, 2)
        ck.eq(disk_hits(c), 0, "restarted with f16: nothing of the q8_0 files is read")
        ck.ok(g.finish == "length" and len(g.ids) == 12, "and the turn answers (%s)" % g.finish)


def check_refused(ck, tmp, model):
    """Section 3."""
    daemon = rsd.daemon_path()
    cfg = os.path.join(tmp, "bad.json")
    with open(cfg, "w") as f:
        json.dump({"kv_type": 3}, f)
    cases = [(["--kv-type", "q4"] + CPU, ("--kv-type",)), (["-c", cfg] + CPU, ("kv_type",))]
    for flags, says in cases:
        r = subprocess.run([daemon, "-s", os.path.join(tmp, "x.sock"), "--db", os.path.join(tmp, "x.db")] + flags,
                           capture_output=True, text=True, timeout=TIMEOUT)
        ck.ok(r.returncode != 0 and any(w in r.stderr for w in says), "%s: refused at the start, saying %r: exit "
              "%d, %s" % (" ".join(flags), says[0], r.returncode, r.stderr.strip()[-300:]))


def main():
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-kvtype-")
    try:
        model = rsd.gen_model(os.path.join(tmp, "tiny.gguf"))
        for name, fn in (("1. q8_0 serves", check_serves), ("2. the disk tier", check_disk),
                         ("3. bad settings", check_refused)):
            with ck.section(name):
                fn(ck, tmp, model)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
