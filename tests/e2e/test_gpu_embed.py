#!/usr/bin/env python3
"""test_gpu_embed.py: embeddings on the GPU against the CPU backend's, and
against sentence-transformers.

Two daemons, --device cpu and --device cuda, each embed the same inputs
with generated models of both kinds (resident-model gen tiny-qwen3-embed,
last-token pooling, causal: its prefill tiles on the tensor cores, and an
input of about 1,200 tokens in chunks over several steps; and
tiny-gemma3-embed, bidirectional attention in the split kernel, a sliding
window of 16 either side, mean pooling, Dense modules), in float32 and in
Q8_0, 64 inputs in one request and one by one, and with dimensions. Every
vector's cosine similarity with the CPU's must be at least 0.999 (the
GPU keeps K/V in fp16 and rounds the activations of larger steps to fp16).
Where numpy, torch, transformers and sentence-transformers are installed,
the random models of embed_ref.py (made and saved by sentence-transformers)
are compared with sentence-transformers' own vectors on the GPU too, at
0.999.

Skips (77) without a GPU (nvidia-smi -L), or when residentd was built
without the CUDA backend.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embed_ref  # noqa: E402
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402

MIN_COS = 0.999
SHAPES = ["tiny-qwen3-embed", "tiny-gemma3-embed"]
INPUTS = embed_ref.TEXTS + ["input number %d, a few words about %s" % (i, "x" * (i % 7)) for i in range(58)]
LONG = "many words " * 240


def start(tmp, device):
    """A daemon on device, or Skip when the build has no CUDA backend."""
    path = os.path.join(tmp, device)
    os.makedirs(path, exist_ok=True)
    d = Daemon(tmp=path, extra=["--device", device])
    try:
        d.start(timeout=300)
        return d
    except (AssertionError, OSError, rsd.Closed, TimeoutError):
        log = d.log_text()
        d.cleanup()
        if device == "cuda" and "no CUDA backend" in log:
            raise Skip("residentd was built without the CUDA backend:\n" + log.strip())
        raise AssertionError("residentd --device %s did not start:\n%s" % (device, log.strip()))


def vectors(d, model):
    """{case: array of vectors} of a model on a daemon."""
    import numpy as np

    with d.client(timeout=300) as c:
        st = c.call("status")
        if not any(m.get("device") in ("cpu", "cuda") for m in st["models"]):
            raise AssertionError("status names no device")
        out = {"batch": c.call("embed", input=INPUTS, model=model, timeout=300)["embeddings"],
               "one by one": [c.call("embed", input=x, model=model, timeout=60)["embeddings"][0] for x in INPUTS[:8]],
               "dimensions 64": c.call("embed", input=INPUTS[:8], model=model, dimensions=64)["embeddings"],
               "long input": c.call("embed", input=[LONG, "short"], model=model, truncate=True,
                                    timeout=300)["embeddings"]}
        devices = {m["name"]: m["device"] for m in c.call("status")["models"] if m["loaded"]}
    return {k: np.array(v, dtype=np.float64) for k, v in out.items()}, devices


def main():
    rsd.tool("resident-model")
    rsd.require_gpu()
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-gpu-embed-")
    try:
        paths = []
        for shape in SHAPES:
            for qtype in ("f32", "q8_0"):
                p = os.path.join(tmp, "%s-%s.gguf" % (shape, qtype))
                subprocess.run([rsd.tool("resident-model"), "gen", shape, p, "--type", qtype, "--quiet"], check=True,
                               stdout=subprocess.DEVNULL)
                paths.append(p)
        daemons = []
        try:
            for device in ("cuda", "cpu"):
                daemons.append(start(tmp, device))
            gpu, cpu = daemons
            for p in paths:
                name = os.path.basename(p)
                with ck.section(name):
                    g, gdev = vectors(gpu, p)
                    c, cdev = vectors(cpu, p)
                    ck.ok(set(gdev.values()) == {"cuda"} and set(cdev.values()) == {"cpu"},
                          "%s: the daemons run where they were told (%r, %r)" % (name, gdev, cdev))
                    for case in g:
                        cos = embed_ref.cosines(g[case], c[case])
                        what = "%s, %s: GPU against CPU, min cosine %.6f (>= %g)" % (name, case, float(cos.min()),
                                                                                    MIN_COS)
                        print(what)
                        ck.ok(g[case].shape == c[case].shape and float(cos.min()) >= MIN_COS, what)
            why = embed_ref.missing()
            if why is not None:
                print("SKIP part: sentence-transformers on the GPU: %s" % why)
            for kind in ("qwen3", "gemma3") if why is None else ():
                with ck.section("%s against sentence-transformers" % kind):
                    path = os.path.join(tmp, kind)
                    ref = embed_ref.reference(embed_ref.make(kind, path), embed_ref.TEXTS)
                    with gpu.client(timeout=300) as c:
                        ours = c.call("embed", input=embed_ref.TEXTS, model=path, timeout=300)["embeddings"]
                    cos = embed_ref.cosines(ours, ref)
                    what = "%s on the GPU against sentence-transformers: min cosine %.6f" % (kind, float(cos.min()))
                    print(what)
                    ck.ok(float(cos.min()) >= MIN_COS, what)
        finally:
            for d in daemons:
                d.stop()
                d.cleanup()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
