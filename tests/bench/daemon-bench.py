"""daemon-bench.py: decode throughput through the daemon, against the engine
alone. Starts residentd with MODEL, then for each N of --clients, N clients
on their own connections each stream one greedy generation of --tokens
tokens at once (a short prompt each, so that decoding dominates); prints the
tokens per second the clients received together (first request sent to last
`done`), each client's own tokens/s, and the same N's decode rate from
resident-bench on the same model in the same run.

  python3 tests/bench/daemon-bench.py MODEL [--clients 16,64] [--tokens 128]
      [--device cuda] [--bench] [--also MODEL2] [-- RESIDENTD_FLAGS...]

--also loads a second model first (one generated token) and keeps it
loaded beside MODEL while the clients run, both under the daemon's one
memory budget; the run fails if status does not list both at the end.

Needs RESIDENT_BUILDDIR (residentd, resident-bench) and PyPI msgpack.
"""
import argparse
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
import rsd  # noqa: E402


def run_clients(d, n, tokens, timeout):
    """n clients generate at once; returns (wall seconds, tokens, per-client t/s, per-client ms to the
    first token)."""
    results, errors = [None] * n, []
    barrier = threading.Barrier(n + 1)
    t_end = [0.0] * n

    def worker(i):
        try:
            with d.client(timeout=timeout) as c:
                c.call("hello", client="bench-%d" % i)
                barrier.wait(60)
                t0 = time.monotonic()
                g = c.generate(prompt="Story %d: once upon a time" % i, max_tokens=tokens, temperature=0,
                               seed=i)
                t_end[i] = time.monotonic()
                results[i] = (len(g.ids), t_end[i] - t0, g.usage["ttft_ms"])
        except Exception as e:  # noqa: BLE001 (reported)
            errors.append((i, repr(e)))
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait(60)
    t0 = time.monotonic()
    for t in threads:
        t.join(timeout)
    if errors:
        raise RuntimeError("client errors: %s" % errors[:3])
    wall = max(t_end) - t0
    return wall, sum(r[0] for r in results), [r[0] / r[1] for r in results], sorted(r[2] for r in results)


def bench_rate(model, n, tokens, device):
    """resident-bench's decode t/s for n sequences."""
    out = subprocess.run([os.path.join(rsd.builddir(), "resident-bench"), "-m", model, "--device", device,
                          "-p", "", "-n", str(tokens), "-b", str(n), "-r", "2"],
                         capture_output=True, text=True, timeout=600).stdout
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) > 8 and f[4].startswith("tg") and f[5] == str(n):
            return float(re.split(r"\s", f[7])[0])
    raise RuntimeError("no tg row in resident-bench's output:\n" + out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--clients", default="16,64")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--bench", action="store_true", help="also run resident-bench for the same N")
    ap.add_argument("--also", help="a second model loaded beside MODEL for the whole run")
    # residentd's flags after "--" (argparse's positional nargs="*" takes none once the model is read)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a, flags = ap.parse_args(argv[:cut]), argv[cut + 1:]
    ns = [int(x) for x in a.clients.split(",")]
    rows = []
    with rsd.Daemon(model=os.path.abspath(a.model), extra=["--device", a.device, "--max-seqs", str(max(ns))] + flags) as d:
        if a.also:
            with d.client(timeout=600) as c:
                c.generate(prompt="Hello", max_tokens=1, temperature=0, model=os.path.abspath(a.also),
                           keep_alive=-1)
        run_clients(d, 2, 8, 300)  # warm up: load, graphs of the small shapes
        for n in ns:
            wall, toks, per, ttft = run_clients(d, n, a.tokens, 600)
            rows.append((n, toks / wall, min(per), max(per), ttft[0], ttft[len(ttft) // 2], ttft[-1]))
        if a.also:
            with d.client(timeout=60) as c:
                st = c.call("status")
            names = [m.get("name") for m in st.get("models", []) if m.get("loaded", True)]
            print("models loaded at the end: %s" % names)
            if len(names) < 2:
                raise RuntimeError("the second model was not kept loaded: %s" % st)
    print("| clients | tokens/s through the daemon | slowest client t/s | fastest client t/s | first token ms "
          "(min / median / max) | resident-bench t/s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, rate, lo, hi, t0, t1, t2 in rows:
        ref = bench_rate(a.model, n, a.tokens, a.device) if a.bench else float("nan")
        print("| %d | %.1f | %.1f | %.1f | %.0f / %.0f / %.0f | %.1f | %.2f |" % (n, rate, lo, hi, t0, t1, t2, ref,
                                                                                rate / ref))


if __name__ == "__main__":
    main()
