#!/usr/bin/env python3
"""test_gpu_placement.py: models larger than the device budget, on the GPU.

1. A generated Mixtral-shaped model (experts: most of its bytes) under a
   --device-memory of a third of its size loads on the CUDA backend: its
   embeddings, attention and output on the GPU, the feed-forwards of its
   first layers in host memory, computed by the host inside each step.
   `status` and `model.show` show the split (host_layers, host_bytes) and
   memory_bytes stays under the budget. In exact mode its greedy tokens for
   three prompts are those of the same model wholly on the GPU and those
   of the CPU backend. Float sums in another order may tip a near tie:
   where streams part, the CPU's two best logits there must be within TIE
   (`resident-model logits --exact`) and the other token within TIE of
   the best, else the test fails.
2. A dense model (generated llama3-1b) under the least budget it loads in:
   the same greedy tokens as wholly on the GPU, with host layers shown.
3. Under a budget that holds neither wholly, requests that name the two
   models in turn are all answered: each load unloads the other (idle)
   model first, status counts the loads and unloads and shows the host
   layers of the model that has them.
4. Hot experts follow the routing: the Mixtral-shaped model under its
   budget keeps some experts of each host layer on the GPU (status:
   hot_experts). Requests on one text, then on another whose tokens
   choose other experts: during the second, experts move to the device
   (status: expert_moves grows), every request answered. The daemon is
   then killed (SIGKILL) in the middle of a request while experts move;
   started again, it answers the first text with the same greedy tokens
   as before, or parts only at a near tie as above (nothing of the moves
   outlives the process).

Skips (77) without a GPU or without the CUDA backend.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rsd  # noqa: E402
from rsd import Checks  # noqa: E402

TIE = 1e-3
MAX_TOKENS = 24
ARGS = ["--exact", "--ctx", "512", "--kv-tokens", "1024"]
PROMPTS = ["The lighthouse keeper opened the bottle and read",
           "Steam engines work by",
           "Once upon a time, in a market of a large city,"]


def models(st):
    return {m["name"]: m for m in st["models"]}


def start(tmp, name, model, device, budget=None):
    extra = ARGS + (["--device-memory", str(budget)] if budget is not None else [])
    return rsd.device_daemon(tmp, name, model, device, extra, timeout=600)


def greedy(d, model=None):
    """Each prompt's greedy tokens, and the prompts' token ids."""
    out, ids = [], []
    with d.client(timeout=600) as c:
        for p in PROMPTS:
            f = dict(prompt=p, max_tokens=MAX_TOKENS, temperature=0)
            if model:
                f["model"] = model
            out.append(c.generate(**f).ids)
            ids.append(c.call("tokenize", text=p, **({"model": model} if model else {}))["tokens"])
    return out, ids


def agree(ck, what, model, tmp, prompt_ids, ref, got):
    """ref and got agree, or part only at a near tie of the CPU's logits."""
    for i, (a, b) in enumerate(zip(ref, got)):
        k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), None)
        if k is None:
            ck.eq(len(a), len(b), "%s, prompt %d: as many tokens" % (what, i))
            continue
        row = rsd.cpu_logits_row(model, prompt_ids[i] + a[:k], tmp)
        best = max(range(len(row)), key=row.__getitem__)
        second = max((t for t in range(len(row)) if t != best), key=row.__getitem__)
        ok = row[best] - row[second] < TIE and row[best] - row[b[k]] < TIE
        ck.ok(ok, "%s, prompt %d: part at token %d (%d against %d), a near tie (margin %.2e)" %
              (what, i, k, a[k], b[k], row[best] - row[second]))


def split(ck, d, name, budget):
    with d.client() as c:
        m = models(c.call("status"))[name]
        shown = c.call("model.show", model=name)["model"]
    ck.ok(m["loaded"] and m["device"] == "cuda", "%s is loaded on cuda: %r" % (name, m.get("device")))
    ck.ok(m["host_layers"] > 0 and m["host_bytes"] > 0,
          "%s: some layers' feed-forwards in host memory (%d layers, %d bytes)" %
          (name, m["host_layers"], m["host_bytes"]))
    ck.ok(m["memory_bytes"] <= budget, "%s: %d bytes on the device, within the budget of %d" %
          (name, m["memory_bytes"], budget))
    ck.eq((shown["host_layers"], shown["host_bytes"]), (m["host_layers"], m["host_bytes"]),
          "model.show tells the same split")
    ck.ok(shown["whole_bytes"] > budget, "model.show: all on the device would take %d" % shown["whole_bytes"])
    return m


def larger_than_budget(ck, tmp, model, label, times):
    """Greedy tokens wholly on the GPU, then under a budget of 1 / times of the
    file (times None: what the model needs at least); returns the budget,
    the tokens and the prompts' ids."""
    size = os.path.getsize(model)
    g = start(tmp, label + "-gpu", model, "cuda")
    try:
        with g.client() as c:
            st = models(c.call("status"))
            name = list(st)[0]
            shown = c.call("model.show", model=name)["model"]
        ck.eq(st[name]["host_layers"], 0, "%s without a budget: every layer on the GPU" % label)
        ref, prompt_ids = greedy(g)
    finally:
        g.stop()
        g.cleanup()
    budget = max(size // times if times else 0, shown["need_bytes"] + (4 << 20))
    if times:
        ck.ok(size >= times * budget - (12 << 20), "%s: the file (%d bytes) is %dx the budget (%d); it needs %d "
              "at least" % (label, size, times, budget, shown["need_bytes"]))
    h = start(tmp, label + "-host", model, "cuda", budget)
    try:
        split(ck, h, name, budget)
        got, _ = greedy(h)
        agree(ck, "%s: GPU with host layers against GPU alone" % label, model, tmp, prompt_ids, ref, got)
    finally:
        h.stop()
        h.cleanup()
    return budget, ref, prompt_ids


def in_turn(ck, tmp, moe, dense, budget):
    """Requests for the two models in turn: each load unloads the other (idle)
    first, since neither fits wholly beside it."""
    d = start(tmp, "turns", moe, "cuda", budget)
    try:
        with d.client(timeout=600) as c:
            c.call("model.load", model=dense)
            names = list(models(c.call("status")))
            big = next(n for n in names if "moe" in n)
            for i, name in enumerate(names * 2):
                g = c.generate(model=name, prompt=PROMPTS[i % 3], max_tokens=8, temperature=0)
                st = c.call("status")
                m = models(st)
                ck.ok(g.finish in ("stop", "length") and g.usage["generated_tokens"] > 0,
                      "request %d for %s answered" % (i, name))
                ck.eq([n for n in names if m[n]["loaded"]], [name], "request %d: only %s is loaded" % (i, name))
                ck.ok(st["memory"]["used_bytes"] <= st["memory"]["budget_bytes"],
                      "request %d: memory used within the budget" % i)
                if name == big:
                    ck.ok(m[name]["host_layers"] > 0, "request %d: status shows %s's host layers" % (i, name))
            ck.ok(st["memory"]["loads"] >= 5 and st["memory"]["unloads"] >= 4,
                  "loads and unloads counted: %d, %d" % (st["memory"]["loads"], st["memory"]["unloads"]))
    finally:
        d.stop()
        d.cleanup()


# two texts whose tokens choose other experts (a generated model's routing: any two unlike texts)
TEXT_A = "1 2 3 4 5 6 7 8 9 10 11 12"
TEXT_B = "Zebras graze quietly while storms gather over"
ROUNDS = 8


def moves(c, name):
    m = models(c.call("status"))[name]
    return m["hot_experts"], m["expert_moves"]


def round_of(ck, c, text, what):
    out = []
    for i in range(ROUNDS):
        g = c.generate(prompt=text, max_tokens=MAX_TOKENS, temperature=0)
        ck.ok(g.finish in ("stop", "length") and g.usage["generated_tokens"] > 0, "%s: request %d answered" % (what, i))
        out.append(g.ids)
    return out


def hot_follow(ck, tmp, model, budget):
    d = start(tmp, "hot", model, "cuda", budget)
    try:
        with d.client(timeout=600) as c:
            name = list(models(c.call("status")))[0]
            hot, m0 = moves(c, name)
            ck.ok(hot > 0, "%s under the budget keeps %d experts of each host layer on the GPU" % (name, hot))
            first = round_of(ck, c, TEXT_A, "text A")
            _, ma = moves(c, name)
            round_of(ck, c, TEXT_B, "text B")
            _, mb = moves(c, name)
            ck.ok(mb > ma, "experts moved to the GPU while text B ran: %d moves before it, %d after (%d at the "
                  "load)" % (ma, mb, m0))
            print("hot experts: %d a host layer; moves %d after text A, %d after text B" % (hot, ma, mb))
            rid = c.start_generate(prompt=TEXT_A, max_tokens=MAX_TOKENS, temperature=0)
            c.next(rid, 600)  # its first token: the request is under way, the counts turn back to text A
            d.kill9()
        d.start(timeout=600)
        with d.client(timeout=600) as c:
            g = c.generate(prompt=TEXT_A, max_tokens=MAX_TOKENS, temperature=0)
            ids = c.call("tokenize", text=TEXT_A)["tokens"]
            agree(ck, "after a SIGKILL in the middle of a request, text A against before", model, tmp, [ids],
                  [first[0]], [g.ids])
            ck.eq(moves(c, name)[0], hot, "started again: the same hot experts a layer")
    finally:
        d.cleanup()


def main():
    ck = Checks()
    rsd.require_gpu()
    tmp = tempfile.mkdtemp(prefix="rsd-placement-")
    try:
        moe = rsd.gen_model(os.path.join(tmp, "moe.gguf"), seed=3, shape="mixtral-8x1b", qtype="q4_k_m")
        with ck.section("a mixture of experts three times the budget"):
            budget, ref, prompt_ids = larger_than_budget(ck, tmp, moe, "mixtral", 3)
            c = start(tmp, "moe-cpu", moe, "cpu")
            try:
                got, _ = greedy(c)
            finally:
                c.stop()
                c.cleanup()
            agree(ck, "mixtral: the CPU against the GPU", moe, tmp, prompt_ids, ref, got)
        dense = rsd.gen_model(os.path.join(tmp, "dense.gguf"), seed=5, shape="llama3-1b", qtype="q4_k_m")
        with ck.section("a dense model, its feed-forwards in host memory"):
            dense_budget, _, _ = larger_than_budget(ck, tmp, dense, "llama3-1b", None)
        with ck.section("two models in turn under the budget"):
            in_turn(ck, tmp, moe, dense, max(budget, dense_budget))
        with ck.section("hot experts follow the routing; a SIGKILL while they move"):
            hot_follow(ck, tmp, moe, budget * 3 // 2)  # room for them: at a third every layer is on the host
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ck


if __name__ == "__main__":
    rsd.main(main)
