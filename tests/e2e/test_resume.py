#!/usr/bin/env python3
"""test_resume.py: sessions survive turns, crashes and restarts.

1. A session's second turn reuses the first turn's KV cache: its
   usage.cached_tokens is at least the first turn's prompt_tokens, and (only
   new tokens are prefilled: docs/ARCHITECTURE.md, "KV memory") at least the
   whole first turn the daemon computed itself (prompt + generated - 1).
2. Turn 3 is started with a long generation and the daemon is killed with
   SIGKILL mid-stream. Restarted on the same database, session.get shows
   turns 1-2 intact and no trace of turn 3, and turn 3 repeated (greedy, same
   messages) gives exactly what the same history gives on daemons that never
   crashed: a fork of the session run to completion before the crash (KV
   cached), and a separate daemon and database where turns 1-2 are replayed.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402

T1 = "Tell me about lighthouses."
T2 = "And about the keepers?"
T3_CANDIDATES = ["Write a long story about the sea, part %d." % i for i in range(40)]
TURN = dict(max_tokens=12, temperature=0)
LONG = 300          # turn 3 runs to max_tokens, so that it can be killed mid-stream


def user(t):
    return [{"role": "user", "content": t}]


def main():
    ck = Checks()
    with Daemon() as d:
        c = d.client(timeout=60)
        sid = c.call("session.new", title="resume", system="You know the coast.")["session"]["session"]
        g1 = c.generate(session=sid, messages=user(T1), **TURN)
        g2 = c.generate(session=sid, messages=user(T2), **TURN)
        u1, u2 = g1.usage, g2.usage
        print("   turn 1 usage:", u1)
        print("   turn 2 usage:", u2)
        ck.eq(u1["cached_tokens"], 0, "turn 1: nothing cached")
        ck.ok(u2["prompt_tokens"] > u1["prompt_tokens"] + u1["generated_tokens"],
              "turn 2's prompt holds the history and the new message")
        ck.ok(u2["cached_tokens"] >= u1["prompt_tokens"],
              "turn 2: cached_tokens %d >= turn 1's prompt_tokens %d" % (u2["cached_tokens"], u1["prompt_tokens"]))
        ck.ok(u2["cached_tokens"] >= u1["prompt_tokens"] + u1["generated_tokens"] - 1,
              "turn 2: only new tokens prefilled: cached_tokens %d >= turn 1's prompt + generated - 1 = %d "
              "(prompt_tokens %d)" % (u2["cached_tokens"], u1["prompt_tokens"] + u1["generated_tokens"] - 1,
                                      u2["prompt_tokens"]))
        before = c.call("session.get", session=sid)
        want_turns = [("user", T1), ("assistant", g1.text), ("user", T2), ("assistant", g2.text)]
        ck.eq([(t["role"], t["content"]) for t in before["turns"]], want_turns, "turns 1-2 stored")

        # Turn 3's expected output on the live daemon: a fork (same history, cached
        # prefix) runs it to completion. Pick a message whose reply runs long, so
        # that the daemon can be killed while it is generating.
        t3, expected = None, None
        for cand in T3_CANDIDATES:
            fk = c.call("session.fork", session=sid, title="reference")["session"]["session"]
            e = c.generate(session=fk, messages=user(cand), max_tokens=LONG, temperature=0)
            if e.finish == "length":
                t3, expected, fork = cand, e, fk
                break
        if t3 is None:
            raise AssertionError("no turn-3 message gives a reply of %d tokens to kill mid-stream" % LONG)
        print("   turn 3: %r, %d tokens, finish %s" % (t3, expected.usage["generated_tokens"], expected.finish))

        # Turn 3 on the session itself, killed mid-stream.
        rid = c.start_generate(session=sid, messages=user(t3), max_tokens=LONG, temperature=0)
        got = []
        while len(got) < 5:
            r = c.next(rid)
            ck.ok(r["type"] == "token", "turn 3 streams: %r" % (r if r["type"] != "token" else ""))
            if r["type"] != "token":
                break
            got.append(r["token"])
        d.kill9()
        c.close()
        ck.eq(got, expected.ids[:5], "turn 3 began like the fork's")

        # Restart on the same database.
        d.start()
        c = d.client(timeout=60)
        after = c.call("session.get", session=sid)
        ck.eq([(t["role"], t["content"]) for t in after["turns"]], want_turns,
              "after the crash: turns 1-2 intact, no turn 3")
        ck.eq([t["tokens"] for t in after["turns"]], [t["tokens"] for t in before["turns"]],
              "after the crash: turns' token counts intact")
        ck.eq(after["session"]["turns"], 4, "after the crash: session.turns")
        ck.eq(after["session"]["tokens"], before["session"]["tokens"], "after the crash: session.tokens")
        fk = c.call("session.get", session=fork)
        ck.eq(len(fk["turns"]), 6, "the fork's completed turn 3 was committed before the crash")
        # Turn 3 again: the history is rebuilt from the database.
        r3 = c.generate(session=sid, messages=user(t3), max_tokens=LONG, temperature=0)
        ck.eq(r3.usage["prompt_tokens"], expected.usage["prompt_tokens"], "turn 3 after restart: prompt tokens")
        ck.eq(r3.ids, expected.ids, "turn 3 after restart = turn 3 on the never-crashed daemon (token ids)")
        ck.eq(r3.text, expected.text, "turn 3 after restart: same text")
        ck.eq(c.call("session.get", session=sid)["session"]["turns"], 6, "turn 3 committed after the restart")
        c.close()
        model = d.model

        # A separate daemon and database that never crashed: replay turns 1-2.
        os.makedirs(os.path.join(d.tmp, "ref"))
        with Daemon(tmp=os.path.join(d.tmp, "ref"), model=model) as ref:
            rc = ref.client(timeout=60)
            rs = rc.call("session.new", title="replay", system="You know the coast.")["session"]["session"]
            h1 = rc.generate(session=rs, messages=user(T1), **TURN)
            h2 = rc.generate(session=rs, messages=user(T2), **TURN)
            ck.eq((h1.text, h2.text), (g1.text, g2.text), "replayed turns 1-2 give the same replies")
            h3 = rc.generate(session=rs, messages=user(t3), max_tokens=LONG, temperature=0)
            ck.eq(r3.ids, h3.ids, "turn 3 after restart = turn 3 on a separate never-crashed daemon")
            rc.close()
    return ck


if __name__ == "__main__":
    rsd.main(main)
