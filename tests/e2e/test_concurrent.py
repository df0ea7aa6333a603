#!/usr/bin/env python3
"""test_concurrent.py: 16 clients at once, each with its own session,
generate greedily on one model. Every stream must be complete and identical
to the same request run alone (on a separate, fresh daemon, one request at a
time), and `status` must show that the daemon batched them
(steps.max_batch > 1 and steps.mean_batch > 1).

Then one session asked for two turns at once: while its first is
generating, a second generate on it, from the same or another connection,
is refused with session_busy (a turn made from a history the other turn
then extends would be stored after it without having seen it); once the
first is done the second works, and the session holds both in order.
Deleting a session cancels its turn in flight.

Last, tokenizing megabytes of text does not stop a stream: tokenize runs
beside the decoding, so the stream's longest pause stays far below the
time the tokenizing took; and one client's backlog of tokenizes does not
hold another client's prompt back: the worker that tokenizes takes the
clients in turn. Nor does it hold back the unloading of another model,
which waits only for the worker's items of the model it unloads.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, sessions_at_once  # noqa: E402

N_CLIENTS = 16
MAX_TOKENS = 32
TOPICS = ["rivers", "mountains", "the sea", "bread", "clocks", "owls", "trains", "snow", "copper",
          "jazz", "tea", "bridges", "moths", "glass", "maps", "salt"]


def request(i):
    # different prompts of different lengths, so prefill and decode mix in a step
    text = "Client %d asks: tell me about %s. " % (i, TOPICS[i]) + "Please. " * (i % 5)
    return dict(messages=[{"role": "user", "content": text}], max_tokens=MAX_TOKENS, temperature=0,
                logprobs=True)


def run_one(d, i):
    """One client: its own session and one generate. Returns (text, ids, done, n_token_replies)."""
    with d.client(timeout=60) as c:
        c.call("hello", client="concurrent-%d" % i)
        s = c.call("session.new", title="client %d" % i)["session"]["session"]
        g = c.generate(session=s, **request(i))
        return g


def main():
    ck = Checks()
    tmp = None
    # 1. each request alone, one after the other, on a fresh daemon
    with Daemon() as d:
        tmp = d.tmp
        alone = [run_one(d, i) for i in range(N_CLIENTS)]
        st = d.client().call("status")
        ck.eq(st["steps"]["max_batch"], 1, "run alone: batches of one")
        model = d.model
        # 2. all at once on another fresh daemon (same model file), so that its
        # status counts only the concurrent steps
        os.makedirs(os.path.join(tmp, "b"))
        with Daemon(tmp=os.path.join(tmp, "b"), model=model) as d2:
            results, errors = sessions_at_once(d2, N_CLIENTS, "concurrent", request, 120)
            ck.eq(errors, [], "every client finished without an error")
            for i in range(N_CLIENTS):
                a, g = alone[i], results[i]
                if g is None:
                    ck.ok(False, "client %d has no result" % i)
                    continue
                ck.eq(g.finish, a.finish, "client %d: finish" % i)
                ck.eq(g.usage["generated_tokens"], len(g.tokens), "client %d: one token reply per token" % i)
                ck.ok(a.finish != "length" or len(g.tokens) == MAX_TOKENS,
                      "client %d: a complete stream of %d tokens (got %d)" % (i, MAX_TOKENS, len(g.tokens)))
                ck.eq(g.ids, a.ids, "client %d: the same tokens as alone" % i)
                ck.eq(g.text, a.text, "client %d: the same text as alone" % i)
                ck.eq(g.usage["prompt_tokens"], a.usage["prompt_tokens"], "client %d: prompt tokens" % i)
                # logprobs agree closely (batched arithmetic may round differently)
                lp = [abs(x["logprob"] - y["logprob"]) for x, y in zip(g.tokens, a.tokens)]
                ck.ok(not lp or max(lp) < 1e-2, "client %d: logprobs match alone (max diff %.3g)" %
                      (i, max(lp) if lp else 0))
            with d2.client() as c:
                st = c.call("status")
                steps = st["steps"]
                print("   status.steps:", steps)
                ck.ok(steps["max_batch"] > 1, "steps.max_batch > 1: %r" % steps)
                ck.ok(steps["mean_batch"] > 1, "steps.mean_batch > 1: %r" % steps)
                ck.eq((st["active"], st["queued"]), (0, 0), "nothing active at the end")
                ck.eq(len(c.call("session.list")["sessions"]), N_CLIENTS, "one session per client")
                # every session holds its committed turn
                for x in c.call("session.list")["sessions"]:
                    ck.eq(x["turns"], 2, "session %s has its turn" % x["title"])
            one_session_two_turns(ck, d2)
            tokenize_beside_a_stream(ck, d2)
            prompt_beside_a_backlog(ck, d2)
            unload_beside_a_backlog(ck, d2)
    return ck


def tokenize_beside_a_stream(ck, d):
    text = ("A sentence to tokenize, with some words in it. " * 22000)[:1 << 20]
    with d.client(timeout=120) as a, d.client(timeout=120) as b:
        prompt = rsd.long_prompt(a, n=400)
        rid = a.start_generate(prompt=prompt, max_tokens=400, temperature=0)
        ck.eq(a.next(rid)["type"], "token", "the stream has begun")
        times = []

        def read():
            while True:
                r = a.next(rid)
                times.append(time.monotonic())
                if r["type"] != "token":
                    return
        reader = threading.Thread(target=read)
        reader.start()
        t0 = time.monotonic()
        ids = [b.request("tokenize", text=text) for _ in range(8)]
        n = [len(b.result(i)["tokens"]) for i in ids]
        spent = time.monotonic() - t0
        reader.join(120)
        # while both ran: the stream may end first
        end = min(t0 + spent, times[-1])
        during = [t for t in times if t0 <= t <= end]
        gaps = [y - x for x, y in zip([t0] + during, during + [end])]
        print("   8 tokenizes of 1 MiB (%d tokens each) took %.2f s; %d stream tokens meanwhile, longest pause "
              "%.3f s" % (n[0], spent, len(during), max(gaps)))
        ck.ok(len(during) > 0 and max(gaps) < spent / 3,
              "the stream goes on while text is tokenized: longest pause %.3f s of %.2f s" % (max(gaps), spent))


def beside_a_backlog(a, act, **tokenize):
    """Queues 24 tokenizes of 1 MiB on client a (tokenize: more of their
    fields), then runs act(), reading a's replies meanwhile as a client does
    (unread, they would get it dropped as too slow). Returns act's result,
    the seconds it took and the seconds until a's last reply, both from
    when every tokenize was queued."""
    text = ("A sentence to tokenize, with some words in it. " * 22000)[:1 << 20]
    ids = [a.request("tokenize", text=text, **tokenize) for _ in range(24)]
    a.call("status")    # answered once the engine has queued every tokenize before it
    t0 = time.monotonic()
    reader = threading.Thread(target=lambda: [a.result(i) for i in ids])
    reader.start()
    r = act()
    t_act = time.monotonic() - t0
    reader.join(600)
    return r, t_act, time.monotonic() - t0


def prompt_beside_a_backlog(ck, d):
    with d.client(timeout=600) as a, d.client(timeout=300) as b:
        _, t_b, t_a = beside_a_backlog(a, lambda: b.generate(prompt="Once upon a time", max_tokens=1,
                                                             temperature=0))
        print("   a prompt sent behind another client's 24 tokenizes of 1 MiB: its token after %.2f s, "
              "their last after %.2f s" % (t_b, t_a))
        ck.ok(t_b < t_a / 3, "the prompt does not wait for the other client's backlog: %.2f s of %.2f s" %
              (t_b, t_a))


def unload_beside_a_backlog(ck, d):
    other = rsd.gen_model(os.path.join(d.tmp, "other.gguf"), seed=7)
    with d.client(timeout=600) as a, d.client(timeout=300) as b:
        a.call("model.load", model=other)
        b.generate(prompt="Once upon a time", max_tokens=1, temperature=0)  # the default model is loaded
        default = os.path.splitext(os.path.basename(d.model))[0]
        r, t_u, t_a = beside_a_backlog(a, lambda: b.call("model.unload", model=default), model="other")
        print("   the default model unloaded beside another model's 24 tokenizes of 1 MiB: after %.2f s, "
              "their last after %.2f s" % (t_u, t_a))
        ck.eq(r["unloaded"], True, "model.unload of the default model unloads it")
        ck.ok(t_u < t_a / 3, "the unload does not wait for another model's tokenizes: %.2f s of %.2f s" %
              (t_u, t_a))


def one_session_two_turns(ck, d):
    with d.client(timeout=60) as a, d.client(timeout=60) as b:
        s = a.call("session.new", title="two at once")["session"]["session"]
        text = rsd.long_prompt(a, n=300, messages=True)
        rid = a.start_generate(session=s, messages=[{"role": "user", "content": text}], max_tokens=300, temperature=0)
        ck.eq(a.next(rid)["type"], "token", "the first turn streams")
        ck.code(lambda: b.generate(session=s, **request(0)), "session_busy",
                "a second turn from another connection while the first generates")
        ck.code(lambda: a.generate(session=s, **request(1)), "session_busy",
                "a second turn from the same connection")
        a.call("cancel", target=rid)
        while a.next(rid)["type"] == "token":
            pass
        ck.eq(b.call("session.get", session=s)["turns"], [], "the cancelled turn left nothing")
        g1 = b.generate(session=s, **request(2))
        g2 = a.generate(session=s, **request(3))
        turns = [(t["role"], t["content"]) for t in b.call("session.get", session=s)["turns"]]
        ck.eq(turns, [("user", request(2)["messages"][0]["content"]), ("assistant", g1.text),
                      ("user", request(3)["messages"][0]["content"]), ("assistant", g2.text)],
              "one turn after the other: both stored, in order")
        # a session deleted while a turn of it generates: the turn ends as cancelled
        rid = a.start_generate(session=s, messages=[{"role": "user", "content": text}], max_tokens=300, temperature=0)
        ck.eq(a.next(rid)["type"], "token", "a turn of the session to delete streams")
        b.call("session.delete", session=s)
        while True:
            r = a.next(rid)
            if r["type"] != "token":
                break
        ck.eq((r["type"], r.get("finish")), ("done", "cancel"), "session.delete cancels its turn")
        ck.code(lambda: b.call("session.get", session=s), "not_found", "and the session is gone")


if __name__ == "__main__":
    rsd.main(main)
