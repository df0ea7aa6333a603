#!/usr/bin/env python3
"""test_kv_tiers.py: a session's KV outlives its eviction from the device
pool and restarts of the daemon, and is never used when it does not match.

Every answer is checked against the same conversation on a fresh daemon
with no disk tier (greedy, so the token ids must be equal).

With a generated model:
1. host tier: a session whose blocks other requests pushed out of a small
   device pool gets them back from host memory (cache_host_hit_tokens).
2. disk tier: after a restart a session's next turn loads its blocks
   (cache_disk_hit_tokens). A byte changed in the middle of the file, a file
   cut inside a record, a model file modified since, and another numerics
   mode (--exact) each make the daemon compute from there instead. `session
   delete` removes the file; a small --kv-disk keeps the most recently used.
With the real Gemma 3 270M on the CPU:
3. A 1,500-token session is killed (kill -9) while its KV is being written
   (RESIDENT_KV_WRITE_STALL stops the writer after 2 records) and half a
   record of garbage is added, as a torn write would leave: its next turn
   loads the 2 whole records, computes the rest and answers correctly.
4. After an orderly restart its next turn has at least 1,488 tokens cached
   and its first token in at most 10 % of the time that computing the
   history took in step 3.
In an instrumented build, steps 3 and 4 run a generated model and 200
tokens, and no time is judged (rsd.timed_section).
"""
import glob
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402

REC_HEAD = 80  # a record's magic, index, 16 token ids and key (daemon/kvdisk.c)
QUESTIONS = ["Tell me about lighthouses.", "And the keepers?", "What did they eat?", "Who relieved them?",
             "How did the lamps work?", "Are any left today?"]


def user(t):
    return [{"role": "user", "content": t}]


def turn(c, sid, i, max_tokens=12):
    return c.generate(session=sid, messages=user(QUESTIONS[i]), max_tokens=max_tokens, temperature=0)


def reference(model, system, n_turns, extra=(), max_tokens=12):
    """The token ids of each reply of the conversation on a fresh daemon without a disk tier."""
    with Daemon(model=model, extra=["--kv-disk", "0"] + list(extra)) as d:
        c = d.client(timeout=600)
        sid = c.call("session.new", title="reference", system=system)["session"]["session"]
        return [turn(c, sid, i, max_tokens).ids for i in range(n_turns)]


def kv_files(d, sid=None):
    return sorted(glob.glob(os.path.join(d.tmp, "kv", "*", (sid or "*") + ".kv")))


def records(path):
    """Whole records the file is long enough for (its header says the sizes)."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24:
        return 0
    hb, bb = struct.unpack("<I", head[8:12])[0], struct.unpack("<Q", head[16:24])[0]
    return max(0, (os.path.getsize(path) - hb) // (REC_HEAD + bb + 8))


def record_offset(path, i):
    with open(path, "rb") as f:
        head = f.read(24)
    hb, bb = struct.unpack("<I", head[8:12])[0], struct.unpack("<Q", head[16:24])[0]
    return hb + i * (REC_HEAD + bb + 8), REC_HEAD + bb + 8


def model_stats(c):
    return c.call("status")["models"][0]


def host_part(ck):
    system = "You know the coast and its lights. " * 12
    with Daemon(extra=["--kv-tokens", "1024", "--ctx", "1024", "--kv-disk", "0"]) as d:
        c = d.client()
        sid = c.call("session.new", title="host", system=system)["session"]["session"]
        got = [turn(c, sid, 0).ids]
        for i in range(6):  # 6 x ~400 tokens through a pool of 1,024
            c.generate(prompt="other prompt %d " % i + "filler words here " * 60, max_tokens=2, temperature=0)
        st = c.call("status")
        ck.ok(st["kv"]["host_bytes"] > 0, "blocks the pool gave up are in host memory: %d bytes" %
              st["kv"]["host_bytes"])
        g = turn(c, sid, 1)
        got.append(g.ids)
        host_hits = model_stats(c)["cache_host_hit_tokens"]
        print("   turn 2 after the pool was reused: usage %s, %d tokens from host memory" % (g.usage, host_hits))
        ck.ok(host_hits >= 16 * (g.usage["cached_tokens"] // 16) - 16 and host_hits > 0,
              "turn 2: its blocks came back from host memory (%d tokens)" % host_hits)
        ck.ok(g.usage["cached_tokens"] >= g.usage["prompt_tokens"] - 40, "turn 2: %d of %d tokens cached"
              % (g.usage["cached_tokens"], g.usage["prompt_tokens"]))
        ck.eq(got, reference(d.model, system, 2), "host tier: the same answers as a fresh daemon")


def turn_after(d, sid, i, change=None):
    """Stops the daemon, makes a change (to its files, its flags), starts it
    again and runs turn i of the session: returns (Gen, tokens from disk)."""
    d.stop()
    if change is not None:
        change()
    d.start()
    with d.client() as c:
        g = turn(c, sid, i)
        return g, model_stats(c)["cache_disk_hit_tokens"]


def flip_byte(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x10]))


def touch(path):
    t = os.stat(path).st_mtime + 10
    os.utime(path, (t, t))


def damage_part(ck):
    system = "You know the coast and its lights. " * 12
    with Daemon() as d:
        c = d.client()
        sid = c.call("session.new", title="disk", system=system)["session"]["session"]
        got = [turn(c, sid, 0).ids]
        c.close()
        # 1. an orderly restart: the next turn loads the whole history
        g, hits = turn_after(d, sid, 1)
        got.append(g.ids)
        ck.ok(hits >= g.usage["prompt_tokens"] - 40 and g.usage["cached_tokens"] == hits,
              "after a restart: %d of %d tokens loaded from disk" % (hits, g.usage["prompt_tokens"]))
        [path] = kv_files(d, sid)
        # 2. one byte changed in record 5's K/V: records 0-4 are used
        g, _ = turn_after(d, sid, 2, lambda: flip_byte(path, record_offset(path, 5)[0] + REC_HEAD + 1000))
        got.append(g.ids)
        ck.eq(g.usage["cached_tokens"], 5 * 16, "a damaged record 5: records 0-4 used")
        # 3. the file cut inside record 7 (the last turn rewrote it whole)
        g, _ = turn_after(d, sid, 3, lambda: os.truncate(path, record_offset(path, 7)[0] + 100))
        got.append(g.ids)
        ck.eq(g.usage["cached_tokens"], 7 * 16, "a file cut inside record 7: records 0-6 used")
        ck.eq(got, reference(d.model, system, 4), "the same answers as a fresh daemon, whatever was loaded")
        # 4. the model file changed since, 5. another numerics mode: nothing stored is used
        g, _ = turn_after(d, sid, 4, lambda: touch(d.model))
        ck.eq(g.usage["cached_tokens"], 0, "a modified model file: nothing loaded")
        g, _ = turn_after(d, sid, 5, lambda: d.extra.append("--exact"))
        ck.eq(g.usage["cached_tokens"], 0, "--exact does not use what the default mode stored")
        ck.ok(rsd.wait_for(lambda: len(kv_files(d, sid)) == 3), "one file per model identity and numerics: %d"
              % len(kv_files(d, sid)))
        # 6. session delete removes every file of the session
        with d.client() as c:
            c.call("session.delete", session=sid)
            ck.ok(rsd.wait_for(lambda: not kv_files(d, sid)), "session.delete removes its KV files")
            ck.ok(rsd.wait_for(lambda: c.call("status")["kv"]["disk_bytes"] == 0), "status: nothing left on disk")


def budget_part(ck):
    system = "You know the coast and its lights. " * 12
    with Daemon() as d:
        c = d.client()
        a = c.call("session.new", title="a", system=system)["session"]["session"]
        turn(c, a, 0)
        c.close()
        d.stop()  # its file is written
        size = os.path.getsize(kv_files(d, a)[0])
        d.extra += ["--kv-disk", str(int(size * 1.5))]
        d.start()
        c = d.client()
        b = c.call("session.new", title="b", system=system)["session"]["session"]
        turn(c, b, 0)
        ck.ok(rsd.wait_for(lambda: len(kv_files(d)) == 1 and kv_files(d, b)),
              "--kv-disk of 1.5 files: the older session's file makes room for the newer")
        c.close()


def long_part(ck, model, n_system, timed):
    extra = ["--ctx", "2048"]
    with Daemon(model=model, extra=extra, env={"RESIDENT_KV_WRITE_STALL": "2"}) as d:
        c = d.client(timeout=600)
        system = rsd.long_system(c, n_system)
        sid = c.call("session.new", title="archivist", system=system)["session"]["session"]
        g1 = turn(c, sid, 0, 8)
        print("   turn 1: usage", g1.usage)
        ck.ok(rsd.wait_for(lambda: kv_files(d, sid) and records(kv_files(d, sid)[0]) >= 2, timeout=60),
              "the KV write of turn 1 has begun")
        [path] = kv_files(d, sid)
        d.kill9()
        with open(path, "ab") as f:  # half a record, as a write cut short leaves it
            f.write(os.urandom(record_offset(path, 0)[1] // 2))
        d.env = {}
        d.start()
        c = d.client(timeout=600)
        c.call("status")  # answered once the model is loaded: the times below are the turns' own
        t0 = time.monotonic()
        g2 = turn(c, sid, 1, 8)
        print("   turn 2 after kill -9 mid-write: usage %s (%.2fs)" % (g2.usage, time.monotonic() - t0))
        ck.eq(g2.usage["cached_tokens"], 32, "after kill -9 mid-write: the 2 whole records loaded, the rest computed")
        c.close()
        d.stop()  # the whole history is written on the way out
        d.start()
        c = d.client(timeout=600)
        c.call("status")
        g3 = turn(c, sid, 2, 8)
        print("   turn 3 after a restart: usage", g3.usage)
        ck.ok(g3.usage["cached_tokens"] >= n_system - 12, "after a restart: %d tokens cached (>= %d)"
              % (g3.usage["cached_tokens"], n_system - 12))
        ck.ok(not timed or g3.usage["ttft_ms"] <= 0.10 * g2.usage["ttft_ms"],
              "after a restart: first token in %.1f ms, at most 10 %% of computing the history (%.1f ms): %.1f %%"
              % (g3.usage["ttft_ms"], g2.usage["ttft_ms"], 100 * g3.usage["ttft_ms"] / g2.usage["ttft_ms"]))
        c.close()
    ck.eq([g1.ids, g2.ids, g3.ids], reference(model, system, 3, extra, 8),
          "the same answers as a daemon that never stopped and has no disk tier")


def main():
    ck = Checks()
    with ck.section("host memory"):
        host_part(ck)
    with ck.section("disk: restarts, damaged and stale files, delete"):
        damage_part(ck)
    with ck.section("disk budget"):
        budget_part(ck)
    rsd.timed_section(ck, "%s: kill -9 while writing, then a restart", long_part)
    return ck


if __name__ == "__main__":
    rsd.main(main)
