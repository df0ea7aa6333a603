#!/usr/bin/env python3
"""test_embed_hf.py: residentd's embeddings against sentence-transformers'
own, on the CPU backend, for random models of both kinds that
embed_ref.py makes with transformers' from_config and saves with
sentence-transformers: a Qwen3 with last-token pooling, and a Gemma 3 with
bidirectional attention, mean pooling, two Dense modules and Normalize.

Each text's vector must have a cosine similarity of at least 0.9999 with
the reference's, the whole batch in one embed request (the daemon computes
every input in its own sequence, side by side in its steps), in the
daemon's default numerics and in --exact; with dimensions 64 the vector is
the reference's first 64 floats normalised again (cut alone, for a model
without Normalize: the cosines are alike). A third model, the Gemma 3 with
CLS pooling and a Dense module with a bias and tanh, no Normalize, covers
the modules' other forms. The models are real
sentence-transformers directories: the daemon reads their modules.json,
1_Pooling, 2_Dense and 3_Dense, 4_Normalize and config.json's
use_bidirectional_attention as sentence-transformers does.

Skips (77) without numpy, torch, transformers or sentence-transformers
(contrib/install-deps.sh does not install torch: its CPU wheels come from
outside PyPI). The same comparison on the GPU is test_gpu_embed.py.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embed_ref  # noqa: E402
import rsd  # noqa: E402
from rsd import Checks, Daemon, Skip  # noqa: E402

MIN_COS = 0.9999
DIMS = 64


def main():
    why = embed_ref.missing()
    if why is not None:
        raise Skip(why)
    import numpy as np
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-embed-hf-")
    try:
        for kind in ("qwen3", "gemma3", "gemma3-cls"):
            path = os.path.join(tmp, kind)
            st = embed_ref.make(kind, path)
            ref = embed_ref.reference(st, embed_ref.TEXTS)
            ref_cut = embed_ref.reference(st, embed_ref.TEXTS, DIMS)
            ck.ok(float(np.min(np.std(ref, axis=1))) > 1e-3 and
                  float(np.max(np.abs(ref[0] - ref[1]))) > 1e-2, "%s: the reference's vectors are non-trivial" % kind)
            for mode in ([], ["--exact"]):
                what = "%s cpu%s" % (kind, " exact" if mode else "")
                with ck.section(what), Daemon(model=path, extra=["--device", "cpu"] + mode, tmp=tmp,
                                              db=os.path.join(tmp, kind + ".db"), sock_name="sock-" + kind) as d:
                    c = d.client()
                    r = c.call("embed", input=embed_ref.TEXTS, timeout=120)
                    ours = np.array(r["embeddings"], dtype=np.float64)
                    ck.eq(ours.shape, ref.shape, "%s: one vector of the model's width per text" % what)
                    if kind == "gemma3-cls":
                        ratio = np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
                        ck.ok(float(np.max(np.abs(ratio - 1))) < 1e-4,
                              "%s: without Normalize the vectors keep the reference's lengths" % what)
                    cos = embed_ref.cosines(ours, ref)
                    ck.ok(float(np.min(cos)) >= MIN_COS, "%s: cosine with sentence-transformers >= %g (min %.7f, "
                          "per text %s)" % (what, MIN_COS, float(np.min(cos)), np.round(cos, 7).tolist()))
                    r = c.call("embed", input=embed_ref.TEXTS, dimensions=DIMS, timeout=120)
                    cut = np.array(r["embeddings"], dtype=np.float64)
                    cos = embed_ref.cosines(cut, ref_cut)
                    ck.ok(cut.shape == (len(embed_ref.TEXTS), DIMS) and float(np.min(cos)) >= MIN_COS,
                          "%s: dimensions %d is the reference's cut and normalised (min cosine %.7f)" %
                          (what, DIMS, float(np.min(cos))))
                    print("%s: 1 - cosine at most %.2e" % (what, 1 - float(np.min(embed_ref.cosines(ours, ref)))))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
