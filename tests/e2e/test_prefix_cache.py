#!/usr/bin/env python3
"""test_prefix_cache.py: requests share the KV of a common prefix.

With the real Gemma 3 270M on the CPU, --exact:
1. Two requests (no session) with the same 1,500-token system prompt: the
   second finds at least 1,488 of its prompt tokens in the cache, its first
   token comes in at most 10 % of the first request's time (usage.ttft_ms),
   and it generates the same tokens as the first, which ran with nothing
   cached. (In an instrumented build, a generated model and 200 tokens, and
   no time is judged: rsd.timed_section.)
2. A third request with another question after the same system prompt also
   starts from the cached system prompt, and so does a session's first turn.
3. status counts the hits and misses.

With a generated model (two daemons, one with --kv-share-users):
4. Another uid finds nothing of a user's prompts unless the daemon shares
   the cache between users; run as root, the test sends as uid 65534
   through a socket made accessible to it.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon  # noqa: E402

def ask(c, system, question, max_tokens=8, **kw):
    t0 = time.monotonic()
    rid = c.start_generate(messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
                           max_tokens=max_tokens, temperature=0, **kw)
    first = None
    g = rsd.Gen(rid)
    while True:
        r = c.next(rid)
        if r["type"] == "token":
            first = first or time.monotonic() - t0
            g.tokens.append(r)
        elif r["type"] == "done":
            g.done = r
            break
        elif r["type"] == "progress":
            continue
        else:
            raise rsd.ProtoError(r)
    g.client_ttft = first
    return g


def long_part(ck, model, n_system, timed):
    with Daemon(model=model, extra=["--exact", "--ctx", "2048"]) as d:
        c = d.client(timeout=600)
        system = rsd.long_system(c, n_system)
        g1 = ask(c, system, "What about bells?")
        g2 = ask(c, system, "What about bells?")
        g3 = ask(c, system, "And the kites?")
        for name, g in (("first", g1), ("second", g2), ("third", g3)):
            print("   %s: usage %s, client ttft %.3fs" % (name, g.usage, g.client_ttft))
        u1, u2, u3 = g1.usage, g2.usage, g3.usage
        ck.ok(u1["prompt_tokens"] >= n_system, "the prompt has %d tokens (>= %d)" % (u1["prompt_tokens"], n_system))
        ck.eq(u1["cached_tokens"], 0, "first request: nothing cached")
        ck.ok(u2["cached_tokens"] >= n_system - 12, "second request: %d tokens cached (>= %d)"
              % (u2["cached_tokens"], n_system - 12))
        ck.ok(not timed or u2["ttft_ms"] <= 0.10 * u1["ttft_ms"],
              "second request's first token in %.1f ms, at most 10 %% of the first's %.1f ms (%.1f %%)" %
              (u2["ttft_ms"], u1["ttft_ms"], 100 * u2["ttft_ms"] / u1["ttft_ms"]))
        ck.eq(g2.ids, g1.ids, "second request (cached) = first request (nothing cached): the same tokens")
        ck.ok(u3["cached_tokens"] >= n_system - 12, "another question after the same system prompt: %d cached"
              % u3["cached_tokens"])
        sid = c.call("session.new", title="archivist", system=system)["session"]["session"]
        gs = c.generate(session=sid, messages=[{"role": "user", "content": "What about tea?"}],
                        max_tokens=4, temperature=0)
        ck.ok(gs.usage["cached_tokens"] >= n_system - 12, "a session's first turn starts from the cached system "
              "prompt: %d" % gs.usage["cached_tokens"])
        st = c.call("status")["models"][0]
        print("   status:", {k: st.get(k) for k in ("cache_hit_tokens", "cache_miss_tokens")})
        want_hits = sum(g.usage["cached_tokens"] for g in (g1, g2, g3, gs))
        want_miss = sum(g.usage["prompt_tokens"] - g.usage["cached_tokens"] for g in (g1, g2, g3, gs))
        ck.eq((st.get("cache_hit_tokens"), st.get("cache_miss_tokens")), (want_hits, want_miss),
              "status: cache hits and misses in tokens")


def uid_part(ck):
    prompt = "A prompt long enough to fill a few blocks of the cache, " * 6
    group = rsd.other_uid_group() if os.geteuid() == 0 else None
    for share in (False, True):
        extra = (["--kv-share-users"] if share else []) + (["--group", group[0]] if group else [])
        with Daemon(extra=extra) as d:
            c = d.client()
            first = c.generate(prompt=prompt, max_tokens=2, temperature=0).usage
            again = c.generate(prompt=prompt, max_tokens=2, temperature=0).usage
            ck.ok(first["prompt_tokens"] >= 48 and again["cached_tokens"] >= first["prompt_tokens"] - 16,
                  "same uid: %d of %d cached" % (again["cached_tokens"], again["prompt_tokens"]))
            if group is None:
                print("   (not root: the other uid's half needs a second uid)")
                continue
            os.chmod(d.tmp, 0o711)  # let the other uid reach the socket inside

            def other_generate():
                with rsd.Client(d.sock) as o:
                    return o.generate(prompt=prompt, max_tokens=2, temperature=0).usage
            other = rsd.as_uid(rsd.OTHER_UID, group[1], other_generate)
            want = again["cached_tokens"] if share else 0
            ck.eq(other["cached_tokens"], want, "another uid, %s: cached_tokens" %
                  ("--kv-share-users" if share else "caches per user"))


def main():
    ck = Checks()
    with ck.section("a generated model: isolation between uids"):
        uid_part(ck)
    rsd.timed_section(ck, "%s: a shared system prompt", long_part)
    return ck


if __name__ == "__main__":
    rsd.main(main)
