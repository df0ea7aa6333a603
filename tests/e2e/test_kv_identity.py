#!/usr/bin/env python3
"""test_kv_identity.py: the KV a daemon keeps for later is never another
model's, never outlives its session, and one KV directory has one owner.

1. disk tier: a model file overwritten in place by another of the same
   shape, size and layout (its own header, the weights of one generated
   with another seed), its access and modification times put back as
   `cp -p`, `rsync -a` or `tar x` do: after
   a restart nothing of the session's KV file is loaded, and the next turn's
   greedy tokens are those of a daemon without a disk tier on a copy of the
   database.
2. host tier: the same replacement while the model is unloaded and the
   session's blocks wait in host memory: none comes back, and the next
   turn's tokens are again a fresh daemon's.
3. `session.delete` on a daemon with `--kv-disk 0` removes the session's
   KV file all the same.
4. Two daemons on one database (so one KV directory): the second one keeps
   no KV on disk (it says so in its log, and status shows no disk budget),
   and its `session.delete` removes the file the first one wrote, which was
   never in its index. Once the first has stopped, the second, restarted,
   has the disk tier.
"""
import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402

SYSTEM = "You know the coast and its lights. " * 12
QUESTIONS = ["Tell me about lighthouses.", "And the keepers?"]


def turn(c, sid, i):
    return c.generate(session=sid, messages=[{"role": "user", "content": QUESTIONS[i]}], max_tokens=12,
                      temperature=0)


def kv_files(tmp, sid="*"):
    return sorted(glob.glob(os.path.join(tmp, "kv", "*", sid + ".kv")))


def twin(d):
    """A model of d's model's size and tensor layout, another one's weights:
    d's model's header and metadata (the tokenizer of a generated model
    depends on its seed, and so its size), then the tensor data of the
    model generated with seed 2."""
    other = rsd.gen_model(os.path.join(d.tmp, "seed2.gguf"), seed=2)

    def data_offset(path):
        out = subprocess.run([rsd.tool("resident-model"), "info", path, "--json"], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out)["data_offset"]

    with open(d.model, "rb") as f:
        head = f.read(data_offset(d.model))
    with open(other, "rb") as f:
        f.seek(data_offset(other))
        data = f.read()
    path = os.path.join(d.tmp, "twin.gguf")
    with open(path, "wb") as f:
        f.write(head + data)
    return path


def replace_in_place(path, other):
    """Writes other's bytes into path's own inode (as cp does onto an existing
    file) and puts path's access and modification times back (cp -p)."""
    st = os.stat(path)
    with open(other, "rb") as src, open(path, "r+b") as dst:
        shutil.copyfileobj(src, dst)
        dst.truncate()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    new = os.stat(path)
    return (new.st_ino, new.st_size, new.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


def fresh_answer(d, sid, i):
    """Turn i of the session on a daemon without a disk tier, on a copy of
    d's database (so that d's session is left as it is)."""
    tmp = os.path.join(d.tmp, "fresh")
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp)
    src, dst = sqlite3.connect(d.db), sqlite3.connect(os.path.join(tmp, "resident.db"))
    src.backup(dst)
    src.close(), dst.close()
    with Daemon(model=d.model, db=os.path.join(tmp, "resident.db"), extra=["--kv-disk", "0"]) as f:
        with f.client(timeout=120) as c:
            return turn(c, sid, i).ids


def disk_part(ck):
    with Daemon() as d:
        other = twin(d)
        with d.client() as c:
            sid = c.call("session.new", title="disk", system=SYSTEM)["session"]["session"]
            turn(c, sid, 0)
        d.stop()
        ck.ok(kv_files(d.tmp, sid), "the session's KV file is written")
        ck.ok(replace_in_place(d.model, other), "the model file replaced in place: inode, size and times kept")
        want = fresh_answer(d, sid, 1)
        d.start()
        with d.client() as c:
            g = turn(c, sid, 1)
            hits = c.call("status")["models"][0]["cache_disk_hit_tokens"]
        ck.eq(hits, 0, "nothing loaded from the replaced model's KV file")
        ck.eq(g.ids, want, "the same answer as a daemon without a disk tier")


def host_part(ck):
    with Daemon(extra=["--kv-tokens", "1024", "--ctx", "1024", "--kv-disk", "0"]) as d:
        other = twin(d)
        c = d.client()
        sid = c.call("session.new", title="host", system=SYSTEM)["session"]["session"]
        turn(c, sid, 0)
        for i in range(6):  # 6 x ~400 tokens through a pool of 1,024
            c.generate(prompt="other prompt %d " % i + "filler words here " * 60, max_tokens=2, temperature=0)
        ck.ok(c.call("status")["kv"]["host_bytes"] > 0, "blocks the pool gave up are in host memory")
        name = c.call("status")["models"][0]["name"]
        ck.ok(c.call("model.unload", model=name)["unloaded"], "the model is unloaded")
        ck.ok(replace_in_place(d.model, other), "the model file replaced in place: inode, size and times kept")
        want = fresh_answer(d, sid, 1)
        g = turn(c, sid, 1)
        hits = c.call("status")["models"][0]["cache_host_hit_tokens"]
        ck.eq(hits, 0, "no block of the replaced model comes back from host memory")
        ck.eq(g.ids, want, "the same answer as a fresh daemon")
        c.close()


def delete_without_tier_part(ck):
    with Daemon() as d:
        with d.client() as c:
            sid = c.call("session.new", title="deleted", system=SYSTEM)["session"]["session"]
            turn(c, sid, 0)
        d.stop()
        ck.ok(kv_files(d.tmp, sid), "the session's KV file is written")
        d.extra += ["--kv-disk", "0"]
        d.start()
        with d.client() as c:
            c.call("session.delete", session=sid)
        ck.ok(rsd.wait_for(lambda: not kv_files(d.tmp, sid)), "--kv-disk 0: session.delete removes the KV file")


def two_daemons_part(ck):
    with Daemon() as a:
        a.client().call("status")  # answered once its scheduler, and so its disk tier, is up
        b = Daemon(model=a.model, db=a.db)
        try:
            b.start()
            with b.client() as cb:
                ck.eq(cb.call("status")["kv"]["disk_budget_bytes"], 0,
                      "the second daemon on the KV directory has no disk tier")
            ck.ok("in use by another residentd" in b.log_text(), "and its log says why")
            with a.client() as ca:
                ck.ok(ca.call("status")["kv"]["disk_budget_bytes"] > 0, "the first keeps its disk tier")
                sid = ca.call("session.new", title="shared", system=SYSTEM)["session"]["session"]
                turn(ca, sid, 0)
            ck.ok(rsd.wait_for(lambda: kv_files(a.tmp, sid)), "the first daemon wrote the session's KV file")
            with b.client() as cb:
                cb.call("session.delete", session=sid)
            ck.ok(rsd.wait_for(lambda: not kv_files(a.tmp, sid)),
                  "session.delete on the second daemon removes the file the first one wrote")
            b.stop()
            a.stop()
            b.start()
            with b.client() as cb:
                ck.ok(cb.call("status")["kv"]["disk_budget_bytes"] > 0,
                      "alone on the directory, the second daemon has the disk tier")
        finally:
            if b.alive():
                b.stop()
            b.cleanup()


def main():
    ck = Checks()
    with ck.section("disk tier: a model file replaced in place, times kept"):
        disk_part(ck)
    with ck.section("host tier: a model file replaced in place while unloaded"):
        host_part(ck)
    with ck.section("session.delete with --kv-disk 0"):
        delete_without_tier_part(ck)
    with ck.section("two daemons on one KV directory"):
        two_daemons_part(ck)
    return ck


if __name__ == "__main__":
    rsd.main(main)
