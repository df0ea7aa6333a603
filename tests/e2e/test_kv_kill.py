#!/usr/bin/env python3
"""test_kv_kill.py: a kill -9 in the middle of a move of KV blocks into the
device pool loses nothing: after a restart the session's history is intact
and its next turn reloads or recomputes what it needs, answering as a daemon
that never had a KV tier does.

With a generated model, a pool of 1,024 tokens, the host and disk tiers on
and RESIDENT_KV_MOVE_STALL set (a move into the pool copies its first
block, says so in the log, and waits a minute before the rest):
1. host tier: session A has a turn; other prompts push its blocks out to
   host memory; A's next turn brings them back, and the daemon is killed
   once the log shows the move's first block copied and before the turn
   answered. Restarted without the hook, session.get shows A's history,
   and its KV file holds the records, as before the kill; the same turn
   again loads A's stored blocks from disk, computes the rest and answers.
2. disk tier: after an orderly restart with the hook, A's next turn loads
   its blocks from disk; the daemon is killed in the middle of the copy up.
   Restarted without it, the same: history and file intact, the turn
   answers.
Every answer is checked against the same conversation on a fresh daemon
with neither tier (greedy, so the token ids must be equal).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Closed, Daemon  # noqa: E402
from test_kv_tiers import QUESTIONS, kv_files, model_stats, records, reference, turn, user  # noqa: E402

SYSTEM = "You know the coast and its lights. " * 12
POOL = ["--kv-tokens", "1024", "--ctx", "1024"]
STALL = {"RESIDENT_KV_MOVE_STALL": "60000"}  # a minute: far longer than the test takes to see it and kill
STALL_LINE = r"RESIDENT_KV_MOVE_STALL: a move of (\d+) blocks in from %s has copied its first;"


def history(c, sid):
    """What session.get says of the session's history: its turns and totals."""
    s = c.call("session.get", session=sid)
    return ([(t["role"], t["content"], t["tokens"]) for t in s["turns"]],
            s["session"]["turns"], s["session"]["tokens"])


def stored(d, sid):
    """The records of the session's KV file."""
    return [records(p) for p in kv_files(d, sid)]


def kill_in_move(ck, d, sid, i, where):
    """Starts turn i of the session, waits until the log shows the move into
    the pool from where stalled after its first block, kills the daemon
    (SIGKILL), and checks that the turn had not answered."""
    c = d.client(timeout=120)
    rid = c.start_generate(session=sid, messages=user(QUESTIONS[i]), max_tokens=12, temperature=0)
    pattern = STALL_LINE % re.escape(where)
    m = rsd.wait_for(lambda: re.search(pattern, d.log_text()), timeout=60)
    ck.ok(m is not None, "turn %d: the move from %s stalled after its first block (the daemon's log)"
          % (i + 1, where))
    ck.ok(m is not None and int(m.group(1)) >= 2, "turn %d: the move from %s is of %s blocks: the kill lands "
          "between its first and the rest" % (i + 1, where, m.group(1) if m else "no"))
    d.kill9()
    try:
        g = c.collect(rid, timeout=30)
        ck.ok(False, "turn %d: answered before the kill (%s)" % (i + 1, g.finish))
    except Closed:
        ck.ok(True, "turn %d: killed before it answered" % (i + 1))
    c.close()


def after_kill(ck, d, sid, i, before, what):
    """Restarts the daemon without the hook: the session's history and KV
    file must be those before the kill; runs turn i again. Returns its Gen."""
    d.env = {}
    d.start()
    with d.client(timeout=120) as c:
        ck.eq((history(c, sid), stored(d, sid)), before, "%s: after the restart the session's history and "
              "its KV file are intact" % what)
        g = turn(c, sid, i)
        hits = model_stats(c)["cache_disk_hit_tokens"]
        print("   turn %d after kill -9 during the move from %s: usage %s, %d tokens from disk"
              % (i + 1, what, g.usage, hits))
        ck.ok(hits > 0 and g.usage["cached_tokens"] >= hits, "%s: the next turn loaded A's blocks from disk "
              "(%d tokens), the rest computed" % (what, hits))
        h = history(c, sid)
        ck.eq((len(h[0]), h[1]), (len(before[0][0]) + 2, before[0][1] + 2), "%s: the turn is committed after it"
              % what)
    return g


def main():
    ck = Checks()
    got = []
    with ck.section("kill -9 during moves into the pool from host memory and from disk"):
        with Daemon(extra=POOL + ["--kv-host", "256M", "--kv-disk", "1G"], env=STALL) as d:
            c = d.client(timeout=120)
            sid = c.call("session.new", title="A", system=SYSTEM)["session"]["session"]
            g = turn(c, sid, 0)
            got.append(g.ids)
            n_prompt = g.usage["prompt_tokens"] // 16
            ck.ok(rsd.wait_for(lambda: kv_files(d, sid) and records(kv_files(d, sid)[0]) >= n_prompt, timeout=60),
                  "A's turn 1 is written to disk (%d records at least)" % n_prompt)
            for k in range(6):  # 6 x ~400 tokens through a pool of 1,024
                c.generate(prompt="other prompt %d " % k + "filler words here " * 60, max_tokens=2, temperature=0)
            ck.ok(c.call("status")["kv"]["host_bytes"] > 0, "blocks the pool gave up are in host memory")
            ck.ok(re.search("RESIDENT_KV_MOVE_STALL", d.log_text()) is None, "no move into the pool stalled yet")
            before = history(c, sid), stored(d, sid)
            c.close()
            # 1. killed while A's blocks come back from host memory
            kill_in_move(ck, d, sid, 1, "host memory")
            got.append(after_kill(ck, d, sid, 1, before, "host memory").ids)
            # 2. killed while they come up from disk, after an orderly restart
            d.stop()
            d.env = STALL
            d.start()
            with d.client(timeout=120) as c:
                before = history(c, sid), stored(d, sid)
            kill_in_move(ck, d, sid, 2, "disk")
            got.append(after_kill(ck, d, sid, 2, before, "disk").ids)
            ck.eq(got, reference(d.model, SYSTEM, 3, POOL + ["--kv-host", "0"]),
                  "the same answers as a fresh daemon without KV tiers")
    return ck


if __name__ == "__main__":
    rsd.main(main)
