#!/usr/bin/env python3
"""resume_ttft.py: the time to first token of a resumed session, from each
place its KV can be: the device, host memory, disk, or nowhere (computed
again).

    tests/bench/resume_ttft.py -m MODEL [--tokens 8000] [--repeat 3] [-- RESIDENTD_FLAGS...]

It starts residentd (RESIDENT_BUILDDIR's, or --daemon) on a temporary socket,
database and KV directory with the model and the flags after `--` (e.g.
`--device cuda`), builds a session whose history is --tokens tokens (one long
user message, a short reply), then resumes it with a short message, each
time after putting its KV in one place:

  device   right after the previous turn (its blocks are still in the pool);
  host     after a prompt as long as the pool has pushed its blocks out to
           host memory (the pool holds one context: --kv-tokens);
  disk     after a restart of residentd (its KV file was written when its
           last turn ended; with --drop-caches the page cache is emptied
           first, where this runs as root, so that the file comes from the disk);
  compute  after a restart with its KV file removed.

Each resume's first token is timed by the daemon (usage.ttft_ms, from the
request's arrival) and by this client (from sending the request), and
status says where the cached tokens came from. The table has the median of
--repeat rounds.
"""
import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
import rsd  # noqa: E402

PATHS = ("device", "host", "disk", "compute")


def sized_text(c, n):
    """User text of about n tokens (at most n)."""
    words = ("the keeper climbed the stairs at dusk and lit the lamp while the tide turned over "
             "the rocks below and gulls settled on the gallery rail").split()
    text = " ".join(words[i % len(words)] + ("." if i % 17 == 16 else "") for i in range(n))
    have = len(c.call("tokenize", text=text)["tokens"])
    while have > n:
        text = text[:int(len(text) * n / have * 0.995)]
        have = len(c.call("tokenize", text=text)["tokens"])
    return text


def hits(c):
    m = c.call("status")["models"][0]
    return m["cache_hit_tokens"], m["cache_host_hit_tokens"], m["cache_disk_hit_tokens"]


def resume(c, sid, i):
    """One short turn of the session: (daemon ttft ms, client ttft ms, usage, host and disk hits)."""
    before = hits(c)
    t0 = time.monotonic()
    rid = c.start_generate(session=sid, messages=[{"role": "user", "content": "And then, %d?" % i}],
                           max_tokens=4, temperature=0)
    first = None
    while True:
        r = c.next(rid)
        if r["type"] == "token" and first is None:
            first = time.monotonic() - t0
        elif r["type"] == "done":
            break
        elif r["type"] == "error":
            raise rsd.ProtoError(r)
    after = hits(c)
    return r["usage"]["ttft_ms"], first * 1e3, r["usage"], after[1] - before[1], after[2] - before[2]


def drop_page_cache():
    """Empties the kernel's page cache (root only); says whether it could."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def restart(d, drop_kv=False, drop_cache=False):
    """residentd again; drop_cache: the page cache emptied while it is down (False if it could not be)."""
    d.stop()
    if drop_kv:
        shutil.rmtree(os.path.join(d.tmp, "kv"), ignore_errors=True)
    dropped = drop_cache and drop_page_cache()
    if drop_cache and not dropped:
        print("the page cache could not be dropped (not root?): the disk row reads it", flush=True)
    d.start(timeout=600)
    c = d.client(timeout=600)
    c.call("status")  # answered once the model is loaded
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokens", type=int, default=8000, help="tokens of the session's history (8000)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; the table has their medians (1)")
    ap.add_argument("--daemon", help="residentd to run (else RESIDENT_BUILDDIR's)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="empty the page cache before the disk row's resume (root), so its KV file is read from disk")
    ap.add_argument("flags", nargs="*", help="residentd flags (after --)")
    a = ap.parse_args()
    if a.daemon:
        os.environ["RESIDENT_DAEMON"] = a.daemon
    tmp = tempfile.mkdtemp(prefix="resume-ttft-")
    ctx = a.tokens + 1024
    # a pool of one context: a prompt as long pushes every other block out
    extra = ["--ctx", str(ctx), "--kv-tokens", str(ctx)] + a.flags
    rows = {p: [] for p in PATHS}
    fills = []  # (seconds, tokens) of the prompt that pushes the session's blocks out to host memory
    try:
        with rsd.Daemon(model=os.path.abspath(a.model), tmp=tmp, extra=extra) as d:
            c = d.client(timeout=600)
            st = c.call("status")
            print("model %s on %s, residentd %s" % (st["models"][0]["name"], st["models"][0]["device"],
                                                     " ".join(extra)), flush=True)
            sid = c.call("session.new", title="resume-ttft")["session"]["session"]
            text = sized_text(c, a.tokens - 64)
            g = c.generate(session=sid, messages=[{"role": "user", "content": text}], max_tokens=8,
                           temperature=0)
            print("session built: %d prompt tokens, first token after %.1f ms (nothing cached)"
                  % (g.usage["prompt_tokens"], g.usage["ttft_ms"]), flush=True)
            filler = sized_text(c, ctx - 32)
            for r in range(a.repeat):
                rows["device"].append(resume(c, sid, 4 * r))
                # a prompt as long as the pool: the session's idle blocks go to host memory
                t0 = time.monotonic()
                g = c.generate(prompt="%d %s" % (r, filler), max_tokens=1, temperature=0)
                fills.append((time.monotonic() - t0, g.usage["prompt_tokens"]))
                rows["host"].append(resume(c, sid, 4 * r + 1))
                c.close()
                c = restart(d, drop_cache=a.drop_caches)
                rows["disk"].append(resume(c, sid, 4 * r + 2))
                c.close()
                c = restart(d, drop_kv=True)
                rows["compute"].append(resume(c, sid, 4 * r + 3))
            c.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("the prompt that pushed the session out (its blocks copied to host memory as it ran): %s"
          % ", ".join("%d tokens in %.0f ms" % (n, t * 1e3) for t, n in fills))
    print("\n| KV from | ttft ms (daemon) | ttft ms (client) | prompt tokens | cached | from host | from disk |")
    print("|---------|-----------------:|-----------------:|--------------:|-------:|----------:|----------:|")
    for p in PATHS:
        rs = rows[p]
        med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
        print("| %-7s | %16.1f | %16.1f | %13d | %6d | %9d | %9d |" % (
            p, med(0), med(1), rs[-1][2]["prompt_tokens"], statistics.median(x[2]["cached_tokens"] for x in rs),
            med(3), med(4)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except rsd.Skip as e:
        print("SKIP:", e)
        sys.exit(77)
    finally:
        rsd._kill_all()
