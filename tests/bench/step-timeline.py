#!/usr/bin/env python3
"""step-timeline.py: where one decode step's GPU time goes, per kernel class.

Reads the CSV of an ncu run over resident-bench (each kernel alone: graphs
off) and prints a table of the decode steps' kernels grouped by name,
template arguments and grid: calls a step, microseconds a step, MB read
from DRAM a step, the rate and the share of the step. A decode step is the
run of kernels from one embedding gather of the batch's tokens (one
block a token) to the next; the first two are left out (warm-up).

  RESIDENT_CUDA_GRAPHS=0 ncu --cache-control none --clock-control none \\
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \\
      --csv --page raw resident-bench -m MODEL --device cuda -p 16 -n 8 -b 1 -r 1 > ncu.csv
  tests/bench/step-timeline.py ncu.csv [BATCH]

Or reads the trace of kernels/cuda/kernel-trace.so (graphs on, each
kernel's start and end as the step ran them, launched early by
programmatic dependent launch or not) and prints the decode steps' kernels
in order: how long each ran, how long before the previous one's end it
started, and what it added to the step (from the previous one's end to its
own): the step's critical path, kernel by kernel.

  KERNEL_TRACE=trace.txt CUDA_INJECTION64_PATH=kernels/cuda/kernel-trace.so \\
      resident-bench -m MODEL --device cuda -p '' -n 32 -b 1 -r 1
  tests/bench/step-timeline.py trace.txt [BATCH]
"""
import csv
import re
import statistics
import subprocess
import sys
from collections import defaultdict


def rows(path):
    """The kernels of an ncu CSV, in launch order: (name, grid, us, bytes)."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rd = csv.DictReader(lines)
    out = []
    for r in rd:
        try:
            us = float(r["gpu__time_duration.sum"].replace(",", ""))
            by = float(r["dram__bytes_read.sum"].replace(",", ""))
            grid = int(float(r["launch__grid_size"].replace(",", "")))
        except (KeyError, ValueError, AttributeError):
            continue  # the units row, or a last row cut short (ncu stopped by a timeout)
        out.append((r["Kernel Name"], grid, us, by))
    return out


def units(path):
    """The units ncu gave the time and byte columns (its second row)."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rd = csv.DictReader(lines)
    u = next(rd, None)
    if u is None:
        sys.exit(f"{path}: no kernels (did ncu run to the end?)")
    return u["gpu__time_duration.sum"], u["dram__bytes_read.sum"]


def short(name):
    """A kernel's name with its template arguments, without its parameters."""
    name = re.sub(r"^void ", "", name)
    depth, end = 0, len(name)
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            end = i
            break
    return name[:end]


def steps(ks, batch):
    """The decode steps of batch tokens: runs from an embedding gather of that many blocks to the next gather."""
    starts = [i for i, k in enumerate(ks) if short(k[0]).startswith("embed_kernel")]
    return [ks[a:b] for a, b in zip(starts, starts[1:]) if ks[a][1] == batch]


def trace_rows(path):
    """The kernels of a kernel-trace.so file in start order: (name, grid, start ns, end ns)."""
    out = []
    with open(path) as f:
        for line in f:
            p = line.split(None, 4)
            if len(p) == 5:
                out.append((p[4].strip(), int(p[2]), int(p[0]), int(p[1])))
    names = demangle(sorted({k[0] for k in out}))
    return sorted(((names[k[0]],) + k[1:] for k in out), key=lambda k: k[2])


def is_trace(path):
    with open(path) as f:
        return re.match(r"\d+ \d+ \d+ \d+ \S", f.readline()) is not None


def demangle(names):
    """Readable names (c++filt where there is one, else the mangled ones)."""
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return dict(zip(names, r.stdout.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def timeline(path, batch):
    """The table of a trace: each position of the steps of batch tokens, medians over the later steps."""
    st = steps(trace_rows(path), batch)
    if not st:
        sys.exit(f"{path}: no complete decode step of {batch} tokens")
    n = statistics.mode(len(s) for s in st)
    st = [s for s in st if len(s) == n]
    st = st[len(st) // 3:]  # the first steps capture their graphs

    def med(f):
        return statistics.median(f(s) for s in st) / 1e3

    print(f"{len(st)} decode steps of {n} kernels; a step {med(lambda s: s[-1][3] - s[0][2]):.1f} us "
          f"(first start to last end)\n")
    print("| # | kernel (grid) | us | started before the previous end | added to the step |")
    print("|---:|---|---:|---:|---:|")
    for i in range(n):
        run = med(lambda s: s[i][3] - s[i][2])
        early = med(lambda s: s[i - 1][3] - s[i][2]) if i else 0.0
        added = med(lambda s: s[i][3] - s[i - 1][3]) if i else run
        print(f"| {i} | {short(st[0][i][0])} ({st[0][i][1]}) | {run:.2f} | {early:.2f} | {added:.2f} |")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: step-timeline.py NCU.csv|TRACE [BATCH]")
    batch = int(sys.argv[2]) if len(sys.argv) == 3 else 1
    if is_trace(sys.argv[1]):
        timeline(sys.argv[1], batch)
        return
    tu, bu = units(sys.argv[1])
    tscale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(tu)
    bscale = {"byte": 1.0, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}.get(bu)
    if tscale is None or bscale is None:
        sys.exit(f"unknown units {tu} / {bu}")
    ks = rows(sys.argv[1])
    st = steps(ks, batch)[2:]
    if not st:
        seen = sorted({k[1] for k in ks if short(k[0]).startswith("embed_kernel")})
        sys.exit(f"no complete decode step of {batch} tokens after the first two in the CSV"
                 + (f" (its gathers are of {', '.join(map(str, seen))} tokens: the capture ends before the"
                    " batch's steps; a larger --launch-skip or --launch-count reaches them)" if seen else ""))
    cls = defaultdict(lambda: [0, 0.0, 0.0])
    for s in st:
        for name, grid, us, by in s:
            c = cls[(short(name), grid)]
            c[0] += 1
            c[1] += us * tscale
            c[2] += by * bscale
    n = len(st)
    total = sum(c[1] for c in cls.values()) / n
    print(f"{n} decode steps; kernel time a step {total:.1f} us\n")
    print("| kernel (grid) | calls | us a step | MB read | TB/s | share |")
    print("|---|---:|---:|---:|---:|---:|")
    for (name, grid), (calls, us, by) in sorted(cls.items(), key=lambda kv: -kv[1][1]):
        us, by = us / n, by / n
        print(f"| {name} ({grid}) | {calls // n} | {us:.1f} | {by / 1e6:.1f} | "
              f"{by / us / 1e6:.2f} | {100 * us / total:.1f} % |")


if __name__ == "__main__":
    main()
