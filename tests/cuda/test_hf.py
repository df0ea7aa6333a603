"""Our logits against Hugging Face transformers (PyTorch), on the CPU and CUDA backends.

Random models of every family with something of its own are made in
transformers with AutoModelForCausalLM.from_config: Llama, Qwen3 (tied
embeddings), Gemma 3 with alternating layer_types (not its 5-to-1 default),
and the mixtures of experts Qwen3-MoE (weights of all experts, not
renormalised), Mixtral and gpt-oss (biases, attention sinks, sliding
windows, YaRN, its clamped SwiGLU, fused expert tensors); GQA, head_dim 64,
a RoPE base that is no family's default, norm weights away from 1 so that a
missed norm shows, windows shorter than the prompt. Routers are scaled up so
that each token's choice of experts is clear: where two experts' logits
nearly tie, any two implementations may pick differently and the comparison
would measure the tie, not the arithmetic. Saved with save_pretrained (safetensors and
config.json exactly as transformers writes them), in float32 and in bfloat16,
next to a tokenizer.json of the same size made by `resident-model vocab` (the
loader wants one; the ids below do not go through it). `resident-model
logits` runs N_IDS fixed random ids through each and every position's logits
are compared with torch's float32 forward pass of the same weights (a bf16
model is widened to float32 exactly, so both sides hold the same numbers):

    max over positions of  max |ours - torch| / max |torch|   (per row)

Bounds, and why:
  * CPU backend: 1e-4. Both sides are float32 throughout and differ only in
    summation order and libm; measured errors are ~1e-6.
  * CUDA backend: 1e-2, the bound of tests/unit/test_cuda.c against the CPU
    backend. The KV cache is fp16 and the products of more than
    RESIDENT_CUDA_MMV_MAX tokens round their inputs to fp16 (2^-11 relative
    each), through 4 layers; test_cuda.c measured up to 1.7e-3 on an H100.
    Run twice: the whole prompt in one step (the cuBLAS path, >8 tokens) and
    in chunks of 5 (the matrix-vector kernels, several steps over the paged
    KV cache). The mixtures of experts run in the exact mode (fp32
    activations and KV cache): fp16 ones move a router's logits by ~1e-3 of
    their size, enough to route a token whose k-th and (k+1)-th experts
    nearly tie to the other one now and then, and its row jumps by far more
    than the bound; which expert wins on the fast path is checked on
    identical inputs by test_cuda_ops (test_moe), its arithmetic by
    test_cuda.

Exit 0: all passed. Exit 77 (skip), saying why: no torch or transformers; or
no CUDA device (or no CUDA backend in this build), after the CPU half passed.
"""
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "py"))
from common import SKIP, Checks, binary, fail, skip  # noqa: E402

try:
    import numpy as np
    import torch
    import transformers
    from transformers import (AutoModelForCausalLM, Gemma3TextConfig, GptOssConfig, LlamaConfig,
                              MixtralConfig, Qwen3Config, Qwen3MoeConfig)
except ImportError as e:
    skip(f"needs numpy, torch and transformers ({e})")

N_VOCAB = 1003      # not a multiple of the kernels' 4-row tiles
N_IDS = 45          # past two 16-token KV blocks, not a multiple of 16
SEED = 1234
THETA = 50000.0     # no family's default: a loader that misses it fails
CPU_TOL = 1e-4
CUDA_TOL = 1e-2
CUDA_RUNS = [("one step", []), ("chunks of 5", ["--chunk", "5"])]
WINDOW = 12         # sliding windows shorter than the prompt
ROUTER_SCALE = 8.0
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": THETA}
YARN = {"rope_type": "yarn", "rope_theta": THETA, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "original_max_position_embeddings": 4096, "truncate": False}
MOE = {"num_experts_per_tok": 2}
# (name, config class, tied embeddings, the family's own settings)
FAMILIES = [
    ("llama", LlamaConfig, False, {}),
    ("qwen3", Qwen3Config, True, {}),
    ("gemma3 alternating", Gemma3TextConfig, True,
     {"layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": WINDOW,
      "rope_parameters": {"full_attention": DEFAULT_ROPE, "sliding_attention": DEFAULT_ROPE}}),
    ("qwen3moe", Qwen3MoeConfig, False,
     dict(MOE, num_experts=8, moe_intermediate_size=96, norm_topk_prob=False)),
    ("mixtral", MixtralConfig, False, dict(MOE, num_local_experts=8)),
    ("gpt-oss", GptOssConfig, False,
     dict(MOE, num_local_experts=8, intermediate_size=128, sliding_window=WINDOW, rope_parameters=YARN,
          max_position_embeddings=4096 * 32)),
]
DTYPES = [("f32", torch.float32), ("bf16", torch.bfloat16)]
NO_GPU = ("no CUDA device", "has no CUDA backend")

TOOL = binary("resident-model")
check = Checks()


def make_model(cls, tied, own, dtype, seed, out):
    """A random model saved by save_pretrained into out, its weights rounded to dtype;
    returns it in float32 (the same numbers). Only the parameters are rounded: a
    model cast to bf16 as a whole also rounds its RoPE frequencies."""
    kw = dict(vocab_size=N_VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=tied,
              initializer_range=0.06, rope_parameters=DEFAULT_ROPE)
    kw.update(own)
    cfg = cls(**kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # RMSNorm weights start at 1
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("sinks") or name.endswith("bias"):  # gpt-oss's start at 0
                p.copy_(0.5 * torch.randn_like(p))
            if ".gate.weight" in name or ".router." in name:
                p.mul_(ROUTER_SCALE)
            p.copy_(p.to(dtype).to(torch.float32))
    copy.deepcopy(model).to(dtype).save_pretrained(out)
    return model.eval()


def torch_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids], dtype=torch.long)).logits[0].to(torch.float64).numpy()


def our_logits(path, ids, out, device, extra):
    """(logits, None) or (None, the error's last line)."""
    p = subprocess.run([TOOL, "logits", path, "--out", out, "--device", device] + extra +
                       [str(i) for i in ids], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=300)
    if p.returncode != 0:
        lines = (p.stderr or p.stdout).decode(errors="replace").strip().splitlines()
        return None, lines[-1] if lines else f"exit {p.returncode}"
    a = np.fromfile(out, dtype="<f4")
    if a.size != len(ids) * N_VOCAB:
        return None, f"{out} holds {a.size} floats, want {len(ids)} x {N_VOCAB}"
    return a.reshape(len(ids), N_VOCAB).astype(np.float64), None


def rel_err(ours, ref):
    """max over rows of max |ours - ref| / max |ref|; inf if ours is not finite."""
    if not np.all(np.isfinite(ours)):
        return float("inf")
    return float(np.max(np.max(np.abs(ours - ref), axis=1) / np.max(np.abs(ref), axis=1)))


def compare(what, path, ids, ref, out, device, extra, tol):
    """Runs and checks one case; returns the error message if the device is missing."""
    ours, err = our_logits(path, ids, out, device, extra)
    if ours is None:
        if device == "cuda" and any(s in err for s in NO_GPU):
            return err
        check(False, f"{what}: resident-model logits: {err}")
        return None
    e = rel_err(ours, ref)
    check(e < tol, f"{what}: rel err {e:.2e} (< {tol:g}; {len(ids)} positions, "
                   f"argmax agrees on {int(np.sum(ours.argmax(1) == ref.argmax(1)))})")
    return None


def main():
    t0 = time.time()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    no_gpu = None
    with tempfile.TemporaryDirectory(prefix="resident-hf-") as tmp:
        voc = os.path.join(tmp, "vocab")
        p = subprocess.run([TOOL, "vocab", "llama3", str(N_VOCAB), "1", voc],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            fail(f"resident-model vocab: {p.stdout.decode(errors='replace').strip()}")
        ids = np.random.default_rng(SEED).integers(0, N_VOCAB, N_IDS).tolist()
        for fi, (fam, cls, tied, own) in enumerate(FAMILIES):
            for di, (dname, dtype) in enumerate(DTYPES):
                what = f"{fam} {dname}{' tied' if tied else ''}"
                path = os.path.join(tmp, f"{fam.replace(' ', '-')}-{dname}")
                model = make_model(cls, tied, own, dtype, SEED + 10 * fi + di, path)
                for f in ("tokenizer.json", "tokenizer_config.json"):
                    shutil.copy(os.path.join(voc, f), path)
                ref = torch_logits(model, ids)
                # a degenerate model would make any comparison meaningless
                if not check(float(np.min(np.std(ref, axis=1))) > 1e-3 and
                             len(set(ref.argmax(1).tolist())) > 1,
                             f"{what}: torch logits are non-trivial"):
                    continue
                out = os.path.join(tmp, "logits.f32")
                compare(f"{what} cpu", path, ids, ref, out, "cpu", [], CPU_TOL)
                moe = getattr(model.config, "num_experts_per_tok", 0) > 0
                for run_name, extra in CUDA_RUNS:
                    if no_gpu is None:
                        no_gpu = compare(f"{what} cuda{' exact' if moe else ''}, {run_name}", path, ids, ref, out,
                                         "cuda", extra + (["--exact"] if moe else []), CUDA_TOL)
    print(f"done in {time.time() - t0:.1f} s (torch {torch.__version__}, "
          f"transformers {transformers.__version__})")
    check.finish()
    if no_gpu is not None:
        print(f"SKIP: the CUDA half did not run ({no_gpu}); the CPU backend matched torch")
        return SKIP
    print("PASS: our logits match transformers on the CPU and CUDA backends")
    return 0


if __name__ == "__main__":
    sys.exit(main())
