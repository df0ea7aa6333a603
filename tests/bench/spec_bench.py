#!/usr/bin/env python3
"""spec_bench.py: speculative decoding through the daemon: tokens/s with
`speculative` "off" and "auto" (or "on": --mode) (lookup guesses, or a
--draft model's), the same greedy requests, and whether their texts are the
same.

    tests/bench/spec_bench.py -m MODEL [--draft DRAFT] [--task rewrite|free] [--seqs 1,16]
                              [--tokens 256] [--repeat 2] [--mode auto|on] [--stream] [--log FILE]
                              [-- RESIDENTD_FLAGS...]

Tasks:
  rewrite  a chat request: a C source file (--file, default
           daemon/engine/draft.c, about 1,500 tokens) and the instruction to
           write it again with one identifier renamed; an instruction-tuned
           model copies most of its prompt, which lookup guesses;
  free     a raw prompt of a few words, for generated models (random
           weights: a draft that is the model itself accepts every guess,
           another model few).
Each of --seqs runs that many such requests at once (sequences n take
rewrite prompts renaming different identifiers), --repeat times per mode;
the table has, per mode, the median aggregate rate: every request's tokens
over the time from the first request's start to the last request's end
(with --stream: the tokens after each one's first, from the first token
of any); the guesses drafted and accepted; and "same" when every request's
text equals its "off" text (else how many do). The prompts are in the
prefix cache by then (a short round of each mode runs first).
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
import rsd  # noqa: E402

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RENAMES = [("run_key", "gram_key"), ("key_len", "run_length"), ("same_run", "runs_equal"), ("grow", "enlarge"),
           ("index_to", "index_upto"), ("find", "lookup"), ("put", "insert"), ("draft_guess", "draft_next")]


def requests(task, n, text):
    """The generate fields of request i of n."""
    out = []
    for i in range(n):
        if task == "free":
            out.append(dict(prompt="%d the quick brown fox %d" % (i, i)))
            continue
        old, new = RENAMES[i % len(RENAMES)]
        msg = ("Here is a C file:\n\n```c\n%s```\n\nWrite the whole file again, exactly as it is but with the "
               "identifier `%s` renamed to `%s` everywhere. Reply with the file only." % (text, old, new))
        out.append(dict(messages=[{"role": "user", "content": msg}]))
    return out


def run_round(d, reqs, mode, tokens, draft, stream):
    """All reqs at once in one mode: (tokens/s, drafted, accepted, texts)."""
    clients = [d.client(timeout=1200) for _ in reqs]
    res = [None] * len(reqs)
    first = [None] * len(reqs)
    extra = dict({"speculative": mode}, **({"draft": draft} if draft and mode != "off" else {}))

    def one(i):
        c = clients[i]
        t0 = time.monotonic()
        rid = c.start_generate(max_tokens=tokens, temperature=0, stream=stream, **reqs[i], **extra)
        g = rsd.Gen(rid)
        while True:
            r = c.next(rid, 1200)
            if r["type"] == "token":
                first[i] = first[i] or time.monotonic()
                g.tokens.append(r)
            elif r["type"] == "done":
                g.done = r
                break
            elif r["type"] == "error":
                raise rsd.ProtoError(r)
        first[i] = first[i] or t0
        res[i] = (g, time.monotonic())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    t0 = min(first)
    t1 = max(e for _, e in res)
    # streamed, the first token (the prompt's work) is left out; else every token over the whole time
    n = sum(g.usage["generated_tokens"] - stream for g, _ in res)
    return (n / (t1 - t0) if t1 > t0 else 0, sum(g.usage["drafted_tokens"] for g, _ in res),
            sum(g.usage["accepted_tokens"] for g, _ in res), [g.text for g, _ in res])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--draft", help="a draft model for the guessing rows (else lookup's guesses)")
    ap.add_argument("--task", choices=("rewrite", "free"), default="rewrite")
    ap.add_argument("--file", default=os.path.join(SRC, "daemon", "engine", "draft.c"),
                    help="the rewrite task's source file")
    ap.add_argument("--seqs", default="1,16", help="requests at once, comma-separated (1,16)")
    ap.add_argument("--tokens", type=int, default=256, help="max_tokens of each request (256)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds per mode; the median is shown (2)")
    ap.add_argument("--mode", choices=("auto", "on"), default="auto",
                    help="the speculative mode compared with off (auto: where the daemon measured it pays)")
    ap.add_argument("--stream", action="store_true", help="stream the replies (a Python client reading a frame "
                    "a token can then be what bounds many requests' rate)")
    ap.add_argument("--daemon", help="residentd to run (else RESIDENT_BUILDDIR's)")
    ap.add_argument("--log", help="keep the daemon's log there (with -- --log-level debug: each step's tokens and time)")
    ap.add_argument("flags", nargs="*", help="residentd flags (after --)")
    a = ap.parse_args()
    if a.daemon:
        os.environ["RESIDENT_DAEMON"] = a.daemon
    text = open(a.file).read()
    tmp = tempfile.mkdtemp(prefix="spec-bench-")
    try:
        with rsd.Daemon(model=os.path.abspath(a.model), tmp=tmp, extra=a.flags) as d:
            c = d.client(timeout=1200)
            st = c.call("status")["models"][0]
            print("model %s on %s; task %s; draft %s; residentd %s" % (st["name"], st["device"], a.task,
                  a.draft or "lookup", " ".join(a.flags)), flush=True)
            print("| seqs | off t/s | %s t/s | speed-up | drafted | accepted | text |" % a.mode)
            print("|---:|---:|---:|---:|---:|---:|---|")
            for n in (int(x) for x in a.seqs.split(",")):
                reqs = requests(a.task, n, text)
                run_round(d, reqs, "off", 8, a.draft, a.stream)  # warm: the prompts in the prefix cache, the draft loaded
                run_round(d, reqs, a.mode, 8, a.draft, a.stream)
                rate = {}
                for mode in ("off", a.mode):
                    rounds = [run_round(d, reqs, mode, a.tokens, a.draft, a.stream) for _ in range(a.repeat)]
                    rate[mode] = (statistics.median(r[0] for r in rounds), rounds[-1])
                off, auto = rate["off"], rate[a.mode]
                same = sum(x == y for x, y in zip(off[1][3], auto[1][3]))
                same = "same" if same == n else "%d of %d same" % (same, n)
                print("| %d | %.1f | %.1f | %.2fx | %d | %d | %s |" % (n, off[0], auto[0], auto[0] / off[0],
                      auto[1][1], auto[1][2], same), flush=True)
    finally:
        if a.log:
            for f in sorted(x for x in os.listdir(tmp) if x.startswith("daemon.")):
                rsd.shutil.copyfile(os.path.join(tmp, f), a.log)
        rsd.shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
