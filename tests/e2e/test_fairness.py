#!/usr/bin/env python3
"""test_fairness.py: a long prompt does not stall the streams beside it, and
many streams share the device evenly. On the CPU, with a generated model
whose layers all slide (tiny-swa), so that a 32,000-token prompt costs the
same per token as a short one and fits the time of a test.

1. 16 clients stream; then a client sends a 32,000-token prompt. Over each
   stream's whole life (100 tokens before that prompt, while it is
   prefilled, 100 after), 99 % of the gaps between two of its tokens, as
   the client receives them, are at most twice the median of its gaps, and
   none is over four times it (the step thread held up for 60 ms, a stall
   put in by hand, made 5.7-6.1 times); and the median gap while the
   prompt is prefilled is at most twice the one before (a scheduler that
   let the prompt take whole steps of 512 tokens would make it 2.3 times
   here).
   The tail is a quantile, not the largest gap alone: on a shared 2-core
   machine the streams' own steps, with nothing else in the daemon, vary
   by up to 1.5-1.9 times now and then, and the pacer's steps beside a
   prompt are 1.25-1.4 times a decode-only one by design, so the single
   largest gap of 900 reached 2.0-2.4 times the median in runs where the
   streams alone had been even (2026-11-28).
2. 64 clients start streams together (the same length): each one's
   tokens/s, from its first token to its last, is within 10 % of every
   other's (the slowest at least 90 % of the fastest).
The streams decode a token a step (speculative "off"): guessed tokens come
several at once, with no gap between them, and this test is about the
scheduler's steps. Skipped in an instrumented build (rsd.instrumented): it times steps, which
the instrumentation slows several times over; the pacer and the worker
thread run in every other test there.
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Streams  # noqa: E402

LONG = 32000
RUNS = 5
TAIL = 0.99       # the share of a stream's gaps within twice its median
MOST = 4          # and no gap over this many times its median
CONTROL = 300     # tokens each stream makes alone first
MANY = 64


def long_text(c, n, salt):
    """Raw text of about n tokens (at most n) on the default model, starting
    with salt (so that no earlier one is in the prefix cache)."""
    words = "river mountain sea bread clock owl train snow copper jazz tea bridge moth glass map salt".split()
    text = salt + " " + " ".join(words[(i * 7) % len(words)] for i in range(n))
    have = len(c.call("tokenize", text=text)["tokens"])
    while have > n:
        text = text[:int(len(text) * n / have * 0.998)]
        have = len(c.call("tokenize", text=text)["tokens"])
    return text, have


def wait_long(c, rid):
    """A predicate for Streams.pump: true once request rid (sent on c) has ended; fills c.ended."""
    c.sock.setblocking(False)
    c.buf, c.ended = b"", None

    def ended():
        try:
            c.buf += c.sock.recv(1 << 16)
        except BlockingIOError:
            pass
        while len(c.buf) >= 4 and len(c.buf) >= 4 + int.from_bytes(c.buf[:4], "big"):
            n = int.from_bytes(c.buf[:4], "big")
            r = rsd.msgpack.unpackb(c.buf[4:4 + n], raw=False)
            c.buf = c.buf[4 + n:]
            if r["id"] == rid and r["type"] in ("done", "error"):
                c.ended = (time.monotonic(), r)
        return c.ended is not None
    return ended


def spread(gaps):
    """(the TAIL quantile of gaps, the largest) over their median, and the median."""
    s = sorted(gaps)
    med = statistics.median(s)
    return s[int(TAIL * (len(s) - 1))] / med, s[-1] / med, med


def uneven(sp):
    """Whether a spread breaks the bounds of part 1 (see the file's comment)."""
    return sp[0] > 2 or sp[1] > MOST


def long_prompt_run(d, c, stream_prompt, run):
    """One run of part 1. Returns (the streams whose gaps were uneven, the
    other checks, whether the streams alone, before the prompt and after it,
    were even, the figures as text)."""
    strict, other = [], Checks()
    text, _ = long_text(c, LONG, "run %d:" % run)
    st = Streams(d, 16)
    for i in range(16):
        st.start(i, prompt=stream_prompt, max_tokens=30000, temperature=0, speculative="off")
    st.pump(lambda: min(len(t) for t in st.times) >= CONTROL)  # the control: streams alone
    control = [st.gaps(i)[20:] for i in range(16)]
    t0 = time.monotonic()
    st.pump(wait_long(c, c.start_generate(prompt=text, max_tokens=1, temperature=0)))
    t_long, r = c.ended
    c.sock.setblocking(True)
    counts = [len(t) for t in st.times]
    st.pump(lambda: min(len(t) for t in st.times) >= max(counts) + 100)  # and after it
    other.eq(r["type"], "done", "the long prompt is answered")
    other.eq([x for x in st.done if x is not None], [], "the streams ran through")
    alone = [spread(g) for g in control + [st.gaps(i, lo=t_long) for i in range(16)]]
    worst, slowed = (0, 0, 0, 0), 0
    for i in range(16):
        q, top, med = sp = spread(st.gaps(i))
        worst = max(worst, (q, top, i, med))
        if uneven(sp):
            strict.append("stream %d: 99th percentile of its gaps %.2fx the median %.1f ms (at most 2x), the "
                          "largest %.2fx (at most %dx), %d tokens"
                          % (i, q, med * 1e3, top, MOST, len(st.times[i])))
        before = statistics.median(st.gaps(i, hi=t0))
        during = statistics.median(st.gaps(i, t0, t_long))
        slowed = max(slowed, during / before)
        other.ok(during <= 2 * before, "stream %d: median gap %.1f ms while the prompt is prefilled, %.1f ms "
                 "before" % (i, during * 1e3, before * 1e3))
    figures = ["the %s-token prompt: first token after %.1f s" % (r.get("usage", {}).get("prompt_tokens"),
                                                                  t_long - t0),
               "worst stream %d: median gap %.1f ms, 99th percentile %.2fx it, largest %.2fx (the streams "
               "alone, before and after: up to %.2fx and %.2fx); median gap while the prompt is prefilled up "
               "to %.2fx the one before" % (worst[2], worst[3] * 1e3, worst[0], worst[1],
                                           max(a[0] for a in alone), max(a[1] for a in alone), slowed)]
    st.close()
    return strict, other, not any(uneven(a) for a in alone), figures


def long_prompt_part(ck, d):
    """Part 1, up to RUNS times. Gaps are wall-clock time, and a machine busy
    with other work holds the daemon up now and then for a step's time or
    more (seen on a shared 2-core machine: single steps of 300 ms among ones
    of 25 ms), which no scheduling prevents. So each run also watches the
    streams alone, before the prompt (CONTROL tokens) and after it: a run
    whose streams were uneven even then cannot judge the gaps, and says so.
    A run that passes ends it; the gaps fail the test when no run passed
    and one that could judge them failed. A scheduler that stalls the
    streams fails every run, and the medians besides (those are judged in
    every run)."""
    c = d.client(timeout=600)
    stream_prompt = rsd.long_prompt(c, n=1500, tag="fair")
    judged = None
    for run in range(RUNS):
        strict, other, even, figures = long_prompt_run(d, c, stream_prompt, run)
        for f in figures:
            print("   run %d: %s" % (run + 1, f))
        if other.failed or not strict:
            break
        print("   run %d: %s" % (run + 1, strict[0]))
        if even:
            judged = strict
        else:
            print("   run %d: not judged: the streams alone were uneven too (this machine, not the scheduler)"
                  % (run + 1))
    ck.failed += other.failed + (judged if strict and judged else [])
    ck.n += other.n + 16
    if strict and not judged:
        print("   NOT JUDGED: the gaps (%d runs, in each the streams alone were uneven too: this machine is "
              "too busy to tell)" % RUNS)
    c.close()


def many_part(ck, d):
    c = d.client(timeout=600)
    prompt = rsd.long_prompt(c, n=300, tag="many")
    st = Streams(d, MANY)
    for i in range(MANY):
        st.start(i, prompt=prompt, max_tokens=300, temperature=0, speculative="off")
    st.pump(lambda: all(x is not None for x in st.done))
    rates = [(len(t) - 1) / (t[-1] - t[0]) for t in st.times]
    lo, hi = min(rates), max(rates)
    print("   %d streams: %.1f .. %.1f tokens/s (median %.1f), slowest/fastest %.3f" %
          (MANY, lo, hi, statistics.median(rates), lo / hi))
    ck.ok(all(x["type"] == "done" for x in st.done), "%d streams: every one done" % MANY)
    ck.ok(lo >= 0.9 * hi, "%d streams: the slowest %.1f tokens/s is within 10 %% of the fastest %.1f" % (MANY, lo, hi))
    st.close()
    c.close()


def main():
    ck = Checks()
    if rsd.instrumented():
        raise rsd.Skip("an instrumented build: its step times say nothing of the scheduler's")
    tmp = tempfile.mkdtemp(prefix="rsd-fair-")
    try:
        model = rsd.gen_model(os.path.join(tmp, "swa.gguf"), seed=7, shape="tiny-swa")
        # one compute thread: the other core is the loop thread's and the clients', whose
        # time on it the gaps include
        with Daemon(tmp=tmp, model=model, threads=1,
                    extra=["--ctx", str(LONG + 4096), "--kv-tokens", str(LONG + 16 * 4096)]) as d:
            with ck.section("a %d-token prompt beside 16 streams" % LONG):
                long_prompt_part(ck, d)
            with ck.section("%d streams" % MANY):
                many_part(ck, d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
