#!/usr/bin/env python3
"""test_metrics.py: resident-http's GET /metrics, Prometheus' text format of
residentd's status, read by the `prometheus_client` package's parser.

Generations run through the daemon (streamed, one not streamed, one of two
choices, one cancelled, one for a model that does not exist), and the
metrics read before and after must have grown by what was run: requests by
outcome, prompt and generated tokens (the replies' usage), the
time-to-first-token histogram by a value a request whose sum is the
replies' ttft_ms, the inter-token histogram by a value a token after each
choice's first, the batch histogram by a value a step. Every family has
its type, histograms' buckets are cumulative and end at +Inf with _count,
a model's name that needs escaping comes back whole, and /metrics asks for
--api-key-file's key, refuses other methods and answers 503 without a
daemon.

Skips (exit 77) when `prometheus_client` is missing.
"""
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402
from test_openai import Bridge  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    text_string_to_metric_families = None

MODEL = "tiny"
ODD = 'q"uo\\te'        # a model named with a double quote and a backslash, which labels escape
# a start that the requests share, longer than a KV block (16 tokens), so that the prefix cache has it
PREFACE = ("Here is the same long preface for every request of this test, so that the daemon's prefix cache "
           "keeps its blocks and the later requests find them there instead of computing them again. ")

# family name (as the parser names it: a counter without _total) -> type
FAMILIES = {
    "resident_uptime_seconds": "gauge", "resident_requests": "counter", "resident_requests_running": "gauge",
    "resident_requests_queued": "gauge", "resident_clients": "gauge", "resident_steps": "counter",
    "resident_step_tokens": "counter", "resident_batch_size": "histogram",
    "resident_memory_budget_bytes": "gauge", "resident_memory_used_bytes": "gauge",
    "resident_kv_bytes": "gauge", "resident_kv_budget_bytes": "gauge",
    "resident_model_loaded": "gauge", "resident_model_memory_bytes": "gauge",
    "resident_model_weights_bytes": "gauge", "resident_model_kv_bytes": "gauge",
    "resident_model_kv_used_bytes": "gauge", "resident_model_kv_blocks": "gauge",
    "resident_model_kv_free_blocks": "gauge", "resident_model_loads": "counter",
    "resident_model_unloads": "counter", "resident_model_faults": "counter",
    "resident_model_requests_running": "gauge", "resident_model_requests_queued": "gauge",
    "resident_prompt_tokens": "counter", "resident_generated_tokens": "counter",
    "resident_cache_hit_tokens": "counter", "resident_cache_host_hit_tokens": "counter",
    "resident_cache_disk_hit_tokens": "counter", "resident_cache_miss_tokens": "counter",
    "resident_time_to_first_token_seconds": "histogram", "resident_inter_token_latency_seconds": "histogram",
}
HISTOGRAMS = [f for f, t in FAMILIES.items() if t == "histogram"]


def get(url, key=None, method="GET"):
    """(status, content type, body text) of a request."""
    req = urllib.request.Request(url, method=method)
    if key is not None:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode("utf-8", "replace")


class Metrics:
    """A /metrics page parsed: families by name, and samples by (name, labels)."""

    def __init__(self, text):
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = {}
        for f in self.families.values():
            for s in f.samples:
                self.samples[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def value(self, name, **labels):
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def hist(self, family, **labels):
        """A histogram's buckets [(le, cumulative count)], _sum and _count."""
        f = self.families[family]
        buckets = [(float(s.labels["le"]), s.value) for s in f.samples if s.name == family + "_bucket" and
                   {k: v for k, v in s.labels.items() if k != "le"} == labels]
        return buckets, self.value(family + "_sum", **labels), self.value(family + "_count", **labels)


def scrape(ck, b, key=None):
    st, ctype, body = get("http://127.0.0.1:%d/metrics" % b.port, key)
    ck.eq(st, 200, "GET /metrics")
    ck.ok(ctype is not None and ctype.startswith("text/plain") and "version=0.0.4" in ctype,
          "the content type is Prometheus' text format 0.0.4 (%s)" % ctype)
    return Metrics(body)


def check_shape(ck, m, models):
    for name, kind in FAMILIES.items():
        f = m.families.get(name)
        ck.ok(f is not None and f.type == kind, "family %s is a %s (%s)" % (name, kind, f and f.type))
    ck.ok(set(m.families) <= set(FAMILIES), "no family beyond the documented ones: %s" %
          sorted(set(m.families) - set(FAMILIES)))
    for family in HISTOGRAMS:
        for labels in ({},) if family == "resident_batch_size" else ({"model": n} for n in models):
            buckets, total, count = m.hist(family, **labels)
            les = [le for le, _ in buckets]
            ck.ok(len(buckets) >= 2 and les == sorted(les) and les[-1] == float("inf"),
                  "%s%s: bounds ascending, the last +Inf" % (family, labels))
            ck.ok(all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])),
                  "%s%s: the buckets are cumulative" % (family, labels))
            ck.ok(buckets and buckets[-1][1] == count and total is not None and total >= 0,
                  "%s%s: +Inf is _count (%s, %s), _sum present" % (family, labels, buckets[-1:], count))


def delta(before, after, name, **labels):
    return (after.value(name, **labels) or 0) - (before.value(name, **labels) or 0)


def run_requests(dc, long_prompt):
    """The generations whose figures the metrics must show: a list of
    (outcome, usage, choices' generated tokens)."""
    runs = []
    for i in (0, 1, 2, 0):                                          # the preface and the last one cached
        g = dc.generate(messages=[{"role": "user", "content": PREFACE + "Say thing %d." % i}],
                        max_tokens=12 + 4 * i, temperature=0, stream=True)
        runs.append((g.finish, g.usage, [g.usage["generated_tokens"]]))
    g = dc.generate(prompt="Once upon a time", max_tokens=9, stream=False)
    runs.append((g.finish, g.usage, [g.usage["generated_tokens"]]))
    rid = dc.start_generate(prompt="Two ways", max_tokens=10, n=2, seed=3, temperature=1.0)
    g = dc.collect(rid)
    runs.append((g.done["choices"][0]["finish"], g.usage, [c["generated_tokens"] for c in g.done["choices"]]))
    rid = dc.start_generate(prompt=long_prompt, max_tokens=1500, temperature=0)
    while True:                                                     # a few tokens, then cancel
        r = dc.next(rid)
        if r["type"] == "token":
            break
    dc.call("cancel", target=rid)
    g = dc.collect(rid)
    runs.append((g.finish, g.usage, [g.usage["generated_tokens"]]))
    return runs


def check_growth(ck, before, after, runs, dc):
    outcomes = {}
    for finish, _, _ in runs:
        outcomes[finish] = outcomes.get(finish, 0) + 1
    outcomes["error"] = 1                                           # the unknown model's
    for o in ("stop", "length", "context", "cancel", "error"):
        ck.eq(delta(before, after, "resident_requests_total", outcome=o), outcomes.get(o, 0),
              "requests_total{outcome=%s} grew by the requests that ended so" % o)
    usage = [u for _, u, _ in runs]
    ck.eq(delta(before, after, "resident_prompt_tokens_total", model=MODEL), sum(u["prompt_tokens"] for u in usage),
          "prompt_tokens_total grew by the replies' prompt_tokens")
    ck.eq(delta(before, after, "resident_generated_tokens_total", model=MODEL),
          sum(u["generated_tokens"] for u in usage), "generated_tokens_total grew by the replies' generated_tokens")
    cached = sum(u["cached_tokens"] for u in usage)
    ck.ok(cached > 0 and delta(before, after, "resident_cache_hit_tokens_total", model=MODEL) >= cached,
          "cache_hit_tokens_total grew by the replies' cached_tokens at least (%d)" % cached)

    b0, s0, c0 = before.hist("resident_time_to_first_token_seconds", model=MODEL)
    b1, s1, c1 = after.hist("resident_time_to_first_token_seconds", model=MODEL)
    ck.eq(c1 - c0, len(runs), "time to first token: a value a request that generated")
    ttft = sum(u["ttft_ms"] for u in usage) / 1e3
    ck.ok(abs((s1 - s0) - ttft) < 1e-3, "time to first token: _sum grew by the replies' ttft_ms (%g, %g)" % (
        s1 - s0, ttft))
    ck.ok(all(b[1] >= a[1] for a, b in zip(b0, b1)), "time to first token: no bucket shrank")

    _, s0, c0 = before.hist("resident_inter_token_latency_seconds", model=MODEL)
    _, s1, c1 = after.hist("resident_inter_token_latency_seconds", model=MODEL)
    gaps = sum(n - 1 for _, _, choices in runs for n in choices if n > 0)
    ck.eq(c1 - c0, gaps, "inter-token latency: a value a token after each choice's first")
    ck.ok(s1 > s0, "inter-token latency: _sum grew")

    steps = delta(before, after, "resident_steps_total")
    _, s0, c0 = before.hist("resident_batch_size")
    _, s1, c1 = after.hist("resident_batch_size")
    ck.ok(steps > 0 and c1 - c0 == steps, "batch size: a value a step (%d, %d)" % (c1 - c0, steps))
    ck.ok(s1 - s0 >= steps, "batch size: at least one sequence a step")

    st = rsd.status(dc)
    ck.eq(after.value("resident_requests_running"), 0, "requests_running: none left")
    ck.eq(after.value("resident_requests_queued"), 0, "requests_queued: none")
    ck.ok(after.value("resident_clients") >= 1, "clients: the bridge's own connection at least")
    ck.eq(after.value("resident_model_loaded", model=MODEL), 1, "model_loaded")
    mine = [x for x in st["models"] if x["name"] == MODEL][0]
    ck.eq(after.value("resident_model_weights_bytes", model=MODEL), mine["weights_bytes"],
          "model_weights_bytes is status's")
    ck.eq(after.value("resident_memory_budget_bytes"), st["memory"]["budget_bytes"], "memory_budget_bytes")
    ck.eq(after.value("resident_kv_budget_bytes", tier="host"), st["kv"]["host_budget_bytes"],
          "kv_budget_bytes{tier=host}")
    ck.ok(after.value("resident_kv_bytes", tier="device") > 0, "kv_bytes{tier=device}: the cached prompts")


def check_status_keys(ck, dc, runs):
    """The figures behind the histograms, as status gives them (PROTOCOL.md)."""
    st = rsd.status(dc)
    m = [x for x in st["models"] if x["name"] == MODEL][0]
    for key in ("ttft", "itl"):
        h = m[key]
        ck.ok(len(h["counts"]) == len(h["bounds"]) + 1 and h["bounds"] == sorted(h["bounds"]),
              "status %s: a count a bound and one above" % key)
    ck.eq(m["ttft"]["bounds"][0], 0.005, "status ttft: the first bound is 5 ms")
    ck.eq(m["ttft"]["bounds"][-1], 60.0, "status ttft: the last bound is 60 s")
    ck.eq((m["itl"]["bounds"][0], m["itl"]["bounds"][-1]), (0.001, 5.0), "status itl: 1 ms .. 5 s")
    ck.eq(st["steps"]["batch"]["bounds"][-1], 256.0, "status steps.batch: up to 256 sequences")
    ck.eq(sum(st["steps"]["batch"]["counts"]), st["steps"]["count"], "status steps.batch: a value a step")
    ck.eq(set(st["requests"]), {"stop", "length", "context", "cancel", "error"}, "status requests: the outcomes")


def check_odd_name(ck, b, d, dc):
    path = os.path.join(d.tmp, ODD + ".gguf")
    shutil.copy(d.model, path)
    dc.call("model.load", model=path)
    dc.generate(model=ODD, prompt="odd", max_tokens=3, stream=True)
    m = scrape(ck, b)
    ck.eq(m.value("resident_model_loaded", model=ODD), 1, "a name with a quote and a backslash comes back whole")
    buckets, _, count = m.hist("resident_time_to_first_token_seconds", model=ODD)
    ck.ok(count == 1 and buckets[-1][1] == 1, "its own time to first token")
    check_shape(ck, m, [MODEL, ODD])


def check_http(ck, d, b):
    st, _, body = get("http://127.0.0.1:%d/metrics" % b.port, method="POST")
    ck.eq(st, 405, "POST /metrics: 405")
    key = os.path.join(d.tmp, "key")
    with open(key, "w") as f:
        f.write("s3cret\n")
    kb = Bridge(d.sock, ["--api-key-file", key])
    try:
        st, _, body = get("http://127.0.0.1:%d/metrics" % kb.port)
        ck.ok(st == 401 and "invalid_api_key" in body, "--api-key-file: /metrics without the key is 401")
        scrape(ck, kb, key="s3cret")
    finally:
        ck.eq(kb.stop(), 0, "resident-http with a key stops")
    nb = Bridge(os.path.join(d.tmp, "no-such-socket"))
    try:
        t0 = time.monotonic()
        st, ctype, body = get("http://127.0.0.1:%d/metrics" % nb.port)
        err = json.loads(body).get("error", {}) if body.startswith("{") else {}
        ck.ok(st == 503 and err.get("code") == "daemon_unavailable" and "no-such-socket" in err.get("message", ""),
              "no daemon: 503 saying which socket (%d %s)" % (st, body[:200]))
        ck.ok(time.monotonic() - t0 < 5, "no daemon: answered at once")
    finally:
        nb.stop()


def run():
    if text_string_to_metric_families is None:
        raise Skip("the PyPI package prometheus-client is not installed (pip install prometheus-client; "
                   "contrib/install-deps.sh)")
    ck = Checks()
    with Daemon() as d:
        b = Bridge(d.sock)
        with d.client(timeout=60) as dc:
            long_prompt = rsd.long_prompt(dc, 200)
            with ck.section("shape"):
                before = scrape(ck, b)
                check_shape(ck, before, [MODEL])
            with ck.section("growth"):
                runs = run_requests(dc, long_prompt)
                ck.code(lambda: dc.generate(model="no-such-model", prompt="x", max_tokens=2), "not_found",
                        "a request for an unknown model fails")
                after = scrape(ck, b)
                check_shape(ck, after, [MODEL])
                check_growth(ck, before, after, runs, dc)
            with ck.section("status"):
                check_status_keys(ck, dc, runs)
            with ck.section("escaping"):
                check_odd_name(ck, b, d, dc)
            with ck.section("http"):
                check_http(ck, d, b)
        ck.eq(b.stop(), 0, "resident-http stops on SIGTERM with status 0")
        if ck.failed:
            print(b.text()[-3000:])
    return ck


if __name__ == "__main__":
    rsd.main(run)
