#!/usr/bin/env python3
"""greedy_path.py: resident's choices along another engine's greedy path.

Two engines' greedy continuations of one prompt part at the first step
where their rounding decides a near-tie, and say nothing after it. This
runs `resident-model logits` over the prompt and the other engine's
tokens (each step given the other's tokens before it) and prints, for
every step, resident's top token and its top-two margin, and how far
below resident's top the other engine's token lies: a step where they
differ with both margins small is a near-tie, not a different model.

  tests/bench/greedy_path.py MODEL --prompt-ids "1 2 3" --tokens "81124 131236" \\
      [--margins "0.25 0.18"] [--device cpu|cuda] [--exact] [--bin resident-model]

--margins: the other engine's top-two margins at each step, printed beside.
"""
import argparse
import array
import os
import subprocess
import sys
import tempfile


def top_two(row):
    """(index of the largest, the largest, the second largest) of a row."""
    best, first, second = 0, row[0], float("-inf")
    for i in range(1, len(row)):
        v = row[i]
        if v > first:
            best, first, second = i, v, first
        elif v > second:
            second = v
    return best, first, second


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--tokens", required=True, help="the other engine's greedy tokens")
    ap.add_argument("--margins", help="the other engine's top-two margin at each step")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--bin", default="resident-model")
    a = ap.parse_args()
    prompt = a.prompt_ids.replace(",", " ").split()
    toks = [int(t) for t in a.tokens.replace(",", " ").split()]
    theirs = [float(m) for m in a.margins.replace(",", " ").split()] if a.margins else []
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        cmd = [a.bin, "logits", a.model, "--out", out, "--device", a.device] + (["--exact"] if a.exact else [])
        subprocess.run(cmd + prompt + [str(t) for t in toks], check=True)
        lg = array.array("f")
        with open(out, "rb") as f:
            lg.frombytes(f.read())
    n_pos = len(prompt) + len(toks)
    vocab = len(lg) // n_pos
    agree = 0
    print("step  their token  their margin  resident top  resident margin  their token below resident's top")
    for s, t in enumerate(toks):
        row = lg[(len(prompt) - 1 + s) * vocab:(len(prompt) + s) * vocab]
        best, first, second = top_two(row)
        agree += best == t
        m = "%.4f" % theirs[s] if s < len(theirs) else "-"
        print("%4d  %11d  %12s  %12d  %15.4f  %s" % (s + 1, t, m, best, first - second,
              "agrees" if best == t else "%.4f" % (first - row[t])))
    print("%d of %d steps agree" % (agree, len(toks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
