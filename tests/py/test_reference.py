"""The C engine's logits against an independent numpy forward pass.

For every tiny shape (llama, qwen2, qwen3, gemma3) and every file format and
weight type, `resident-model gen` writes a model with a fixed seed,
`resident-model logits` runs 40 fixed random token ids through it, and
tests/reference/reference.py (written from the Hugging Face / llama.cpp
definitions, float64 math, weights read with gguf-py or a hand-written
safetensors parser) computes the same logits. For quantized GGUF types the
reference runs on gguf.quants.dequantize of the stored blocks, i.e. on exactly
the weights the engine holds, so the bound is the same for every type:

    max over positions of ||ours - ref||_2 / ||ref||_2 < 1e-4

That is the engine's --exact mode (float activations everywhere). Its
default mode, which multiplies quantized weights with 8-bit activations,
must stay within FAST_TOL for quantized types and within 1e-4 for float
ones (which it leaves on the float path).

Also: `--chunk 7` gives the unchunked logits (to 1e-5) on one case per family,
and the GGUF f32 and safetensors f32 twins of each shape (same seed, same
weights) give the same reference logits (to 1e-4): the two loaders agree.

40 ids exceed the tiny gemma3 shape's sliding window of 16, so its sliding
layers are exercised.
"""
import os
import subprocess
import sys
import tempfile
import time

from common import binary, fail, skip, srcdir

try:
    import numpy as np
    import gguf  # noqa: F401  (reference.py needs it for GGUF files)
except ImportError as e:
    skip(f"needs the numpy and gguf Python packages ({e})")

sys.path.insert(0, os.path.join(srcdir(), "tests", "reference"))
import reference  # noqa: E402

SHAPES = ["tiny", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"]
CASES = [("gguf", "f32"), ("gguf", "f16"), ("gguf", "q8_0"), ("gguf", "q4_k_m"),
         ("safetensors", "f32"), ("safetensors", "bf16")]
CHUNK_CASE = ("gguf", "f32")
N_IDS = 40
SEED = 7
TOL = 1e-4
CHUNK_TOL = 1e-5
TWIN_TOL = 1e-4
# The default (fast) mode quantizes the activations of products with
# quantized weights to 8 bits a block, as llama.cpp does: rounding to a
# step of max|x|/127 adds ~0.6% of noise to each product, and the products
# of these random models compound it to 1.5-3.5% (measured: 2 layers
# 1.5-2.6%, tiny-gemma3's 6 layers up to 3.5%); a wrong kernel gives ~100%.
# Float weights keep the float path.
FAST_TOL = 5e-2
FLOAT_TYPES = ("f32", "f16", "bf16")

TOOL = binary("resident-model")
failures = []


def check(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        failures.append(what)
    return ok


def run(args, what):
    """Runs resident-model; None (and a recorded failure) if it fails."""
    try:
        p = subprocess.run([TOOL] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=300)
    except subprocess.TimeoutExpired:
        check(False, f"{what}: resident-model {' '.join(args[:2])} timed out")
        return None
    if p.returncode != 0:
        err = (p.stderr or p.stdout).decode(errors="replace").strip().splitlines()
        check(False, f"{what}: resident-model {args[0]} exited {p.returncode}: "
                     f"{err[-1] if err else ''}")
        return None
    return p


def rel_err(ours, ref):
    """max over positions of ||ours - ref||_2 / ||ref||_2."""
    ref = np.asarray(ref, dtype=np.float64)
    diff = np.linalg.norm(np.asarray(ours, dtype=np.float64) - ref, axis=1)
    return float(np.max(diff / np.linalg.norm(ref, axis=1)))


def engine_logits(model_path, ids, n_vocab, out, what, extra=()):
    if run(["logits", model_path, "--out", out] + list(extra) + [str(i) for i in ids],
           what) is None:
        return None
    a = np.fromfile(out, dtype="<f4")
    if not check(a.size == len(ids) * n_vocab,
                 f"{what}: {out} holds {a.size} floats, want {len(ids)} x {n_vocab}"):
        return None
    a = a.reshape(len(ids), n_vocab)
    if not check(bool(np.all(np.isfinite(a))), f"{what}: engine logits finite"):
        return None
    return a


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="resident-ref-") as tmp:
        for shape in SHAPES:
            ids = None
            twins = {}
            for fmt, typ in CASES:
                what = f"{shape} {fmt} {typ}"
                path = os.path.join(tmp, f"{shape}-{typ}" + (".gguf" if fmt == "gguf" else ""))
                if run(["gen", shape, path, "--format", fmt, "--type", typ,
                        "--seed", str(SEED), "--quiet"], what) is None:
                    continue
                try:
                    model = reference.load(path)
                except Exception as e:  # noqa: BLE001 (any load error is a failure)
                    check(False, f"{what}: reference cannot load it: {type(e).__name__}: {e}")
                    continue
                if ids is None:
                    ids = np.random.default_rng(SEED).integers(0, model.n_vocab, N_IDS).tolist()
                ref = reference.logits(model, ids)
                if (fmt, typ) in (("gguf", "f32"), ("safetensors", "f32")):
                    twins[fmt] = ref
                # A degenerate model would make any comparison meaningless.
                if not check(bool(np.all(np.linalg.norm(ref, axis=1) > 0)) and
                             float(np.std(ref[:, :8], axis=0).max()) > 0,
                             f"{what}: reference logits are non-trivial"):
                    continue
                out = os.path.join(tmp, f"{shape}-{fmt}-{typ}.f32")
                ours = engine_logits(path, ids, model.n_vocab, out, what, ["--exact"])
                if ours is None:
                    continue
                e = rel_err(ours, ref)
                check(e < TOL, f"{what}: engine (--exact) vs reference rel err {e:.3e} (< {TOL:g}; "
                               f"{len(ids)} ids, vocab {model.n_vocab}, {model.n_layer} layers)")
                fast = engine_logits(path, ids, model.n_vocab, out, what + " (8-bit activations)")
                if fast is not None:
                    bound = TOL if typ in FLOAT_TYPES else FAST_TOL
                    e = rel_err(fast, ref)
                    check(e < bound, f"{what}: engine (default, 8-bit activations) vs reference "
                                     f"rel err {e:.3e} (< {bound:g})")
                if (fmt, typ) == CHUNK_CASE:
                    outc = os.path.join(tmp, f"{shape}-{fmt}-{typ}-chunk.f32")
                    chunked = engine_logits(path, ids, model.n_vocab, outc,
                                            what + " --chunk 7", ["--chunk", "7", "--exact"])
                    if chunked is not None:
                        ec = rel_err(chunked, ours)
                        check(ec < CHUNK_TOL, f"{what}: --chunk 7 vs unchunked rel err "
                                              f"{ec:.3e} (< {CHUNK_TOL:g})")
            if len(twins) == 2:
                et = rel_err(twins["safetensors"], twins["gguf"])
                check(et < TWIN_TOL, f"{shape}: reference on gguf f32 vs safetensors f32 twins "
                                     f"rel err {et:.3e} (< {TWIN_TOL:g})")
            else:
                check(False, f"{shape}: gguf f32 / safetensors f32 twins not both available")
    n_fail = len(failures)
    print(f"done in {time.time() - t0:.1f} s")
    if n_fail:
        fail(f"{n_fail} check(s) failed, first: {failures[0]}")
    print("PASS: engine logits match the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
