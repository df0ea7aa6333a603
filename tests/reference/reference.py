"""An independent numpy forward pass, the yardstick for the C engine's logits.

Written from the published definitions only, not from this project's C code:
Hugging Face transformers' modeling code (LlamaForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, Gemma3ForCausalLM / Gemma3TextModel, Qwen3MoeForCausalLM,
MixtralForCausalLM, GptOssForCausalLM, modeling_rope_utils) for the math, and
llama.cpp's convert_hf_to_gguf.py / gguf-py / src/models for how a GGUF file
stores the same model and what llama.cpp does with it. All arithmetic is
float64, so this is the more precise side of any comparison; weights are kept
as the float32 values the file holds (f16, bf16 and every quantized type,
MXFP4 included, widen to float32 exactly, the latter through
gguf.quants.dequantize).

API:
    model = load(path)             # a .gguf file, or a Hugging Face directory
                                   # (config.json + model.safetensors, or the
                                   # sharded model.safetensors.index.json)
    out = logits(model, token_ids) # np.float64 [n_tokens, n_vocab]
    logits(model, ids, swaps, routing)  # with experts: forced routing
                                   # choices in, the router's logits and
                                   # choices out (see _moe)

Families: llama, qwen2 (bias on q/k/v), qwen3 (per-head RMSNorm on q and k),
gemma3 (scaled embeddings, 1+w norms, sandwich norms, GeGLU, sliding-window
layers with their own RoPE base), and the mixtures of experts: mixtral (llama
with experts), qwen3moe (qwen3 with experts) and gpt-oss (biases on q/k/v/o and
on the router and experts, attention sinks, every other layer sliding, YaRN
RoPE, the clamped SwiGLU). A layer's experts: the router's logits pick the top
k; their weights are the softmax over the chosen logits (the same as the full
softmax's top k renormalised), or for Qwen3-MoE with norm_topk_prob false the
full softmax's values; the output is the weighted sum of the chosen experts'
down(act(gate x) * up x).

Every family whose transformers code reads the config's layer_types (qwen2,
qwen3, gemma3, gpt-oss) honours it; mixtral and qwen3moe slide every layer or
none.

GGUF conventions handled here (convert_hf_to_gguf.py):
  * llama: the rows of Q and K (and their biases) are permuted per head so
    that llama.cpp can rotate adjacent pairs; this loader undoes that and then
    uses the HF rotate_half pairing (Mixtral is llama with experts in GGUF).
    qwen2/qwen3/gemma3/qwen3moe/gpt-oss are not permuted (llama.cpp uses NeoX
    RoPE for them).
  * gemma3: every *norm.weight is stored as 1+w already; the attention scale
    is 1/sqrt(head_dim) (llama.cpp's choice for every size but 27B), the
    sliding window pattern is 6 and the local RoPE base 10000.
  * output.weight absent means tied to token_embd.weight.
  * experts: blk.L.ffn_{gate,up,down}_exps.weight stacked, [n_expert, out,
    in] once in numpy order (or, in older Mixtral files, one
    blk.L.ffn_{gate,up,down}.E.weight per expert), the router
    blk.L.ffn_gate_inp.weight; qwen3moe always renormalises the chosen
    weights, as llama.cpp does.
  * gpt-oss: gate and up already de-interleaved; the FFN's norm is
    blk.L.post_attention_norm.weight (no sandwich); layer l slides iff
    l % 2 == 0 (llama.cpp's default period); YaRN's correction range is
    truncated to whole dimensions (floor, ceil) as llama.cpp does, where HF
    follows the config's "truncate" (false in gpt-oss's): load(...,
    yarn_truncate=) overrides either side, so that twins compare.

Run as a script: `python3 reference.py MODEL ID...` prints the argmax and the
first logits of each position.
"""
import json
import math
import os
import struct
import sys

import numpy as np

__all__ = ["Model", "load", "logits", "load_gguf", "load_hf", "read_safetensors"]

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "gpt-oss")
# Whose transformers code reads config.layer_types.
_LAYER_TYPES_FAMILIES = ("qwen2", "qwen3", "gemma3", "gpt-oss")


class Model:
    """Hyper-parameters and weights of one decoder-only model.

    Matrices are float32 [out, in] as in HF (y = x @ W.T), expert matrices
    [n_expert, out, in]; norm weights hold the effective multiplier (for
    gemma3 that is 1+w)."""

    def __init__(self):
        self.arch = None
        self.n_vocab = self.n_embd = self.n_layer = self.n_ff = 0
        self.n_head = self.n_head_kv = self.head_dim = 0
        self.n_expert = self.n_expert_used = self.n_ff_exp = 0
        self.eps = 1e-6
        self.act = "silu"
        self.expert_act = "silu"     # or "swiglu_oai" (gpt-oss)
        self.norm_topk = True        # the chosen experts' weights sum to 1
        self.embed_scale = 1.0
        self.attn_scale = None
        self.attn_softcap = None
        self.final_softcap = None
        self.sliding_window = None
        self.layer_sliding = []     # bool per layer
        # (inv_freq float64 [head_dim/2], factor on cos and sin)
        self.rope_global = None
        self.rope_local = None
        self.tok_embd = None         # [n_vocab, n_embd]
        self.output = None           # [n_vocab, n_embd]
        self.output_norm = None      # [n_embd]
        self.layers = []             # dicts, see _LAYER_KEYS
        self.source = None

    def __repr__(self):
        moe = f", experts {self.n_expert_used} of {self.n_expert}" if self.n_expert else ""
        return (f"Model({self.arch}, vocab={self.n_vocab}, embd={self.n_embd}, "
                f"layers={self.n_layer}, heads={self.n_head}/{self.n_head_kv}x"
                f"{self.head_dim}, ff={self.n_ff}{moe}, from {self.source})")


# Keys of a layer dict; absent optional ones are None. A layer with a
# router has experts (exp_*: [n_expert, ...]) in place of w_gate/w_up/w_down.
_LAYER_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo",
               "q_norm", "k_norm", "sinks", "post_attn_norm", "ffn_norm",
               "w_gate", "w_up", "w_down", "post_ffn_norm",
               "router", "router_b", "exp_gate", "exp_up", "exp_down",
               "exp_gate_b", "exp_up_b", "exp_down_b")


# ---------------------------------------------------------------------------
# RoPE frequencies (HF modeling_rope_utils)

def _default_inv_freq(base, dim):
    return 1.0 / (float(base) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def _rope(base, dim, scaling, yarn_truncate=None):
    """(inv_freq, attention factor) of an HF rope_scaling dict (None, default,
    linear, llama3 or yarn); yarn_truncate overrides the dict's "truncate"."""
    inv_freq = _default_inv_freq(base, dim)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        low = float(scaling["low_freq_factor"])
        high = float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        low_wavelen = old / low
        high_wavelen = old / high
        wavelen = 2 * math.pi / inv_freq
        out = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        # _compute_yarn_parameters: dimensions below `low` keep their
        # frequency, above `high` are divided by factor, a linear ramp between.
        if scaling.get("mscale") or scaling.get("mscale_all_dim") or scaling.get("attention_factor"):
            raise NotImplementedError("yarn with mscale or attention_factor")
        old = float(scaling["original_max_position_embeddings"])
        truncate = scaling.get("truncate", True) if yarn_truncate is None else yarn_truncate

        def corr_dim(rotations):
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = corr_dim(float(scaling.get("beta_fast") or 32))
        high = corr_dim(float(scaling.get("beta_slow") or 1))
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        attn_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        return inv_freq / factor * ramp + inv_freq * (1 - ramp), attn_factor
    raise NotImplementedError(f"rope scaling type {kind!r}")


# ---------------------------------------------------------------------------
# safetensors, parsed by hand: 8-byte little-endian header size, JSON header,
# then the raw little-endian data.

def read_safetensors(path):
    """{name: float32 ndarray} of one .safetensors file (F32, F16, BF16)."""
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        shape = tuple(info["shape"])
        start, end = info["data_offsets"]
        raw = blob[base + start: base + end]
        n = int(np.prod(shape)) if shape else 1
        if dtype == "F32":
            a = np.frombuffer(raw, dtype="<f4", count=n).astype(np.float32)
        elif dtype == "F16":
            a = np.frombuffer(raw, dtype="<f2", count=n).astype(np.float32)
        elif dtype == "BF16":
            u = np.frombuffer(raw, dtype="<u2", count=n).astype(np.uint32) << 16
            a = u.view(np.float32)
        elif dtype == "F64":
            a = np.frombuffer(raw, dtype="<f8", count=n).astype(np.float32)
        else:
            raise NotImplementedError(f"{path}: tensor {name} has dtype {dtype}")
        if len(raw) != n * {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}[dtype]:
            raise ValueError(f"{path}: tensor {name}: {len(raw)} bytes for shape {shape} {dtype}")
        out[name] = a.reshape(shape)
    return out


def _hf_tensors(path):
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for fn in files:
        tensors.update(read_safetensors(os.path.join(path, fn)))
    return tensors


_HF_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
             "gemma3": "gemma3", "qwen3_moe": "qwen3moe", "mixtral": "mixtral", "gpt_oss": "gpt-oss",
             "LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
             "Gemma3ForCausalLM": "gemma3", "Qwen3MoeForCausalLM": "qwen3moe",
             "MixtralForCausalLM": "mixtral", "GptOssForCausalLM": "gpt-oss"}

# A layer's router and each expert's gate, up and down ({} the expert) in
# the checkpoints of the families that keep one tensor per expert.
_HF_EXPERTS = {
    "qwen3moe": ("mlp.gate.weight", "mlp.experts.{}.gate_proj.weight",
                 "mlp.experts.{}.up_proj.weight", "mlp.experts.{}.down_proj.weight"),
    "mixtral": ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{}.w1.weight",
                "block_sparse_moe.experts.{}.w3.weight", "block_sparse_moe.experts.{}.w2.weight"),
}


def load_hf(path, yarn_truncate=None):
    """A Hugging Face checkpoint directory; yarn_truncate: see _rope."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    if "text_config" in cfg and cfg.get("model_type") == "gemma3":
        cfg = dict(cfg["text_config"], **{k: v for k, v in cfg.items() if k == "tie_word_embeddings"})
        cfg.setdefault("model_type", "gemma3_text")
    mt = cfg.get("model_type", "")
    arch = _HF_ARCHS.get(mt) or _HF_ARCHS.get((cfg.get("architectures") or [""])[0])
    if arch is None:
        raise NotImplementedError(f"{path}: model_type {mt!r}")
    gemma = arch == "gemma3"

    m = Model()
    m.arch = arch
    m.source = path
    m.n_embd = int(cfg["hidden_size"])
    m.n_layer = int(cfg["num_hidden_layers"])
    m.n_ff = int(cfg["intermediate_size"])
    m.n_head = int(cfg["num_attention_heads"])
    m.n_head_kv = int(cfg.get("num_key_value_heads") or m.n_head)
    m.head_dim = int(cfg.get("head_dim") or (256 if gemma else m.n_embd // m.n_head))
    m.eps = float(cfg.get("rms_norm_eps", 1e-6))
    m.act = cfg.get("hidden_activation" if gemma else "hidden_act") or \
        cfg.get("hidden_act") or ("gelu_pytorch_tanh" if gemma else "silu")
    m.n_expert = int(cfg.get("num_experts" if arch == "qwen3moe" else "num_local_experts") or 0)
    m.n_expert_used = int(cfg.get("num_experts_per_tok") or 0)
    m.n_ff_exp = int(cfg["moe_intermediate_size"]) if arch == "qwen3moe" else m.n_ff
    m.norm_topk = bool(cfg.get("norm_topk_prob", False)) if arch == "qwen3moe" else True
    # GptOssExperts hard-codes its activation; the config's hidden_act is unused.
    m.expert_act = "swiglu_oai" if arch == "gpt-oss" else m.act

    # RoPE: old style (rope_theta + rope_scaling) or the newer rope_parameters
    # (possibly keyed by layer type).
    rp = cfg.get("rope_parameters")
    default_theta = 1000000.0 if gemma else 10000.0
    if isinstance(rp, dict) and ("full_attention" in rp or "sliding_attention" in rp):
        g = rp.get("full_attention") or {}
        l = rp.get("sliding_attention") or {}
        theta_g = g.get("rope_theta", cfg.get("rope_theta", default_theta))
        theta_l = l.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0))
        scal_g, scal_l = g, l
    else:
        if isinstance(rp, dict):
            theta_g = rp.get("rope_theta", cfg.get("rope_theta", default_theta))
            scal_g = rp
        else:
            theta_g = cfg.get("rope_theta", default_theta)
            scal_g = cfg.get("rope_scaling")
        theta_l = cfg.get("rope_local_base_freq", 10000.0) if gemma else theta_g
        scal_l = None if gemma else scal_g
    m.rope_global = _rope(theta_g, m.head_dim, scal_g, yarn_truncate)
    m.rope_local = _rope(theta_l, m.head_dim, scal_l, yarn_truncate)

    # Which layers slide, and over how many positions.
    window = cfg.get("sliding_window")
    if arch == "llama" or (arch in ("qwen2", "qwen3", "qwen3moe") and not cfg.get("use_sliding_window")):
        window = None   # LlamaConfig has no window; Qwen's configs drop it unless use_sliding_window
    layer_types = cfg.get("layer_types") if arch in _LAYER_TYPES_FAMILIES else None
    if gemma:
        window = int(cfg.get("sliding_window", 4096))
        if layer_types is None:
            pattern = int(cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6)))
            layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                           for i in range(m.n_layer)]
        m.query_pre_attn_scalar = float(cfg.get("query_pre_attn_scalar", 256))
        m.attn_scale = m.query_pre_attn_scalar ** -0.5
        # HF casts sqrt(hidden_size) to the weights' dtype; the reference
        # keeps the float32 value.
        m.embed_scale = float(np.float32(m.n_embd ** 0.5))
        m.attn_softcap = cfg.get("attn_logit_softcapping")
        m.final_softcap = cfg.get("final_logit_softcapping")
    elif arch == "gpt-oss":
        window = int(cfg.get("sliding_window", 128))
        if layer_types is None:
            layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                           for i in range(m.n_layer)]
    elif layer_types is None and arch in ("qwen2", "qwen3"):
        mwl = int(cfg.get("max_window_layers", m.n_layer))
        layer_types = ["sliding_attention" if i >= mwl else "full_attention"
                       for i in range(m.n_layer)]
    elif layer_types is None:
        layer_types = ["sliding_attention"] * m.n_layer   # mixtral, qwen3moe: the window is global
    m.sliding_window = window
    m.layer_sliding = [window is not None and t == "sliding_attention" for t in layer_types]
    if m.attn_scale is None:
        m.attn_scale = m.head_dim ** -0.5

    t = _hf_tensors(path)
    # Strip a wrapper prefix (e.g. "language_model.") if there is one.
    emb_names = [n for n in t if n.endswith("embed_tokens.weight")]
    if len(emb_names) != 1:
        raise ValueError(f"{path}: cannot find embed_tokens.weight")
    pre = emb_names[0][:-len("embed_tokens.weight")]   # e.g. "model."
    outer = pre[:-len("model.")] if pre.endswith("model.") else ""

    used = set()

    def get(name, required=True):
        a = t.get(pre + name)
        if a is None and required:
            raise KeyError(f"{path}: missing tensor {pre + name}")
        used.add(pre + name)
        return a

    def norm(name, required=True):
        w = get(name, required)
        if w is None:
            return None
        w = w.astype(np.float64)
        return 1.0 + w if gemma else w

    m.tok_embd = get("embed_tokens.weight")
    m.n_vocab = m.tok_embd.shape[0]
    m.output_norm = norm("norm.weight")
    m.output = t.get(outer + "lm_head.weight")
    used.add(outer + "lm_head.weight")
    if m.output is None:
        m.output = m.tok_embd
    for i in range(m.n_layer):
        p = f"layers.{i}."
        L = dict.fromkeys(_LAYER_KEYS)
        L["attn_norm"] = norm(p + "input_layernorm.weight")
        L["wq"] = get(p + "self_attn.q_proj.weight")
        L["wk"] = get(p + "self_attn.k_proj.weight")
        L["wv"] = get(p + "self_attn.v_proj.weight")
        L["wo"] = get(p + "self_attn.o_proj.weight")
        for b, n in (("bq", "q"), ("bk", "k"), ("bv", "v"), ("bo", "o")):
            L[b] = get(p + f"self_attn.{n}_proj.bias", False)
        L["q_norm"] = norm(p + "self_attn.q_norm.weight", False)
        L["k_norm"] = norm(p + "self_attn.k_norm.weight", False)
        L["sinks"] = get(p + "self_attn.sinks", arch == "gpt-oss")
        if gemma:
            L["post_attn_norm"] = norm(p + "post_attention_layernorm.weight")
            L["ffn_norm"] = norm(p + "pre_feedforward_layernorm.weight")
            L["post_ffn_norm"] = norm(p + "post_feedforward_layernorm.weight")
        else:
            L["ffn_norm"] = norm(p + "post_attention_layernorm.weight")
        if arch == "gpt-oss":
            L["router"] = get(p + "mlp.router.weight")
            L["router_b"] = get(p + "mlp.router.bias")
            # x @ W layouts: gate_up_proj [E, H, 2I] with gate and up
            # interleaved along 2I, down_proj [E, I, H].
            gu = get(p + "mlp.experts.gate_up_proj")
            gub = get(p + "mlp.experts.gate_up_proj_bias")
            L["exp_gate"] = gu[..., ::2].transpose(0, 2, 1)
            L["exp_up"] = gu[..., 1::2].transpose(0, 2, 1)
            L["exp_gate_b"] = gub[:, ::2]
            L["exp_up_b"] = gub[:, 1::2]
            L["exp_down"] = get(p + "mlp.experts.down_proj").transpose(0, 2, 1)
            L["exp_down_b"] = get(p + "mlp.experts.down_proj_bias")
        elif arch in _HF_EXPERTS and pre + p + _HF_EXPERTS[arch][0] in t:
            router, *each = _HF_EXPERTS[arch]
            L["router"] = get(p + router)
            for k, name in zip(("exp_gate", "exp_up", "exp_down"), each):
                L[k] = np.stack([get(p + name.format(e)) for e in range(m.n_expert)])
        else:   # a dense layer (Qwen3-MoE's mlp_only_layers too)
            L["w_gate"] = get(p + "mlp.gate_proj.weight")
            L["w_up"] = get(p + "mlp.up_proj.weight")
            L["w_down"] = get(p + "mlp.down_proj.weight")
        m.layers.append(L)
    _unused(path, set(t) - used - {n for n in t if n.endswith("rotary_emb.inv_freq")})
    _check(m)
    return m


# ---------------------------------------------------------------------------
# GGUF through gguf-py

def _unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf's LlamaModel.permute(w, n_head):
    w.reshape(n_head, 2, d/n_head/2, ...).swapaxes(1, 2).reshape(w.shape)."""
    shape = w.shape
    return (w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:])
             .swapaxes(1, 2).reshape(shape))


def load_gguf(path, yarn_truncate=None):
    """A GGUF file as written by convert_hf_to_gguf (and our generator);
    yarn_truncate: see _rope (None: truncated, as llama.cpp does)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    r = gguf.GGUFReader(path)

    def kv(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    arch = kv("general.architecture")
    if arch not in FAMILIES:
        raise NotImplementedError(f"{path}: architecture {arch!r}")
    gemma = arch == "gemma3"
    gptoss = arch == "gpt-oss"

    tensors = {}
    for ti in r.tensors:
        if ti.tensor_type == T.F32:
            a = np.array(ti.data, dtype=np.float32)
        elif ti.tensor_type in (T.F16,):
            a = np.array(ti.data).astype(np.float32)
        else:
            a = gguf.quants.dequantize(np.array(ti.data), ti.tensor_type).astype(np.float32)
        # ti.shape is ggml's ne order (innermost first); numpy wants it reversed.
        shape = tuple(int(x) for x in reversed(ti.shape))
        tensors[ti.name] = a.reshape(shape)

    m = Model()
    m.arch = arch
    m.source = path
    m.n_embd = int(kv(f"{arch}.embedding_length"))
    m.n_layer = int(kv(f"{arch}.block_count"))
    m.n_ff = int(kv(f"{arch}.feed_forward_length"))
    m.n_head = int(kv(f"{arch}.attention.head_count"))
    m.n_head_kv = int(kv(f"{arch}.attention.head_count_kv", m.n_head))
    m.head_dim = int(kv(f"{arch}.attention.key_length", m.n_embd // m.n_head))
    m.eps = float(kv(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
    m.act = "gelu_pytorch_tanh" if gemma else "silu"
    m.n_expert = int(kv(f"{arch}.expert_count", 0))
    m.n_expert_used = int(kv(f"{arch}.expert_used_count", 0))
    m.n_ff_exp = int(kv(f"{arch}.expert_feed_forward_length", m.n_ff))
    m.expert_act = "swiglu_oai" if gptoss else m.act
    n_rot = int(kv(f"{arch}.rope.dimension_count", m.head_dim))
    if n_rot != m.head_dim:
        raise NotImplementedError(f"{path}: partial rotary ({n_rot} of {m.head_dim})")
    theta = float(kv(f"{arch}.rope.freq_base", 10000.0))
    stype = kv(f"{arch}.rope.scaling.type")
    if stype in (None, "none"):
        scaling = None
    elif stype == "linear":
        scaling = {"rope_type": "linear", "factor": float(kv(f"{arch}.rope.scaling.factor", 1.0))}
    elif stype == "yarn":
        scaling = {"rope_type": "yarn", "factor": float(kv(f"{arch}.rope.scaling.factor")),
                   "original_max_position_embeddings":
                       float(kv(f"{arch}.rope.scaling.original_context_length")),
                   "beta_fast": float(kv(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
                   "beta_slow": float(kv(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
                   "truncate": True}
    else:
        raise NotImplementedError(f"{path}: rope scaling {stype}")
    inv_freq, attn_factor = _rope(theta, m.head_dim, scaling, yarn_truncate)
    if "rope_freqs.weight" in tensors:   # llama3-style per-frequency factors
        inv_freq = inv_freq / tensors["rope_freqs.weight"].astype(np.float64)
    m.rope_global = m.rope_local = (inv_freq, attn_factor)
    m.attn_scale = m.head_dim ** -0.5
    m.layer_sliding = [False] * m.n_layer
    if gemma or gptoss:
        m.sliding_window = int(kv(f"{arch}.attention.sliding_window", 4096))
        # llama.cpp's set_swa_pattern: of each `period` layers all but the last slide.
        period = 6 if gemma else 2
        m.layer_sliding = [i % period < period - 1 for i in range(m.n_layer)]
    if gemma:
        m.rope_local = _rope(10000.0, m.head_dim, None)
        m.embed_scale = float(np.float32(m.n_embd ** 0.5))
        m.final_softcap = kv(f"{arch}.final_logit_softcapping")
        m.attn_softcap = kv(f"{arch}.attn_logit_softcapping")

    used = {"rope_freqs.weight"}

    def get(name, required=True):
        a = tensors.get(name)
        if a is None and required:
            raise KeyError(f"{path}: missing tensor {name}")
        used.add(name)
        return a

    def norm(name, required=True):
        a = get(name, required)
        return None if a is None else a.astype(np.float64)   # gemma3: already 1+w

    m.tok_embd = get("token_embd.weight")
    m.n_vocab = m.tok_embd.shape[0]
    m.output_norm = norm("output_norm.weight")
    m.output = get("output.weight", False)
    if m.output is None:
        m.output = m.tok_embd
    for i in range(m.n_layer):
        p = f"blk.{i}."
        L = dict.fromkeys(_LAYER_KEYS)
        L["attn_norm"] = norm(p + "attn_norm.weight")
        L["wq"] = get(p + "attn_q.weight")
        L["wk"] = get(p + "attn_k.weight")
        L["wv"] = get(p + "attn_v.weight")
        L["wo"] = get(p + "attn_output.weight")
        L["bq"] = get(p + "attn_q.bias", False)
        L["bk"] = get(p + "attn_k.bias", False)
        L["bv"] = get(p + "attn_v.bias", False)
        L["bo"] = get(p + "attn_output.bias", False)
        if arch == "llama":
            L["wq"] = _unpermute(L["wq"], m.n_head)
            L["wk"] = _unpermute(L["wk"], m.n_head_kv)
            if L["bq"] is not None:
                L["bq"] = _unpermute(L["bq"], m.n_head)
            if L["bk"] is not None:
                L["bk"] = _unpermute(L["bk"], m.n_head_kv)
        L["q_norm"] = norm(p + "attn_q_norm.weight", False)
        L["k_norm"] = norm(p + "attn_k_norm.weight", False)
        L["sinks"] = get(p + "attn_sinks.weight", gptoss)
        if gptoss:   # no sandwich: this is the FFN's input norm
            L["ffn_norm"] = norm(p + "post_attention_norm.weight")
        else:
            L["post_attn_norm"] = norm(p + "post_attention_norm.weight", gemma)
            L["ffn_norm"] = norm(p + "ffn_norm.weight")
        L["post_ffn_norm"] = norm(p + "post_ffw_norm.weight", gemma)
        if p + "ffn_gate_inp.weight" in tensors:
            L["router"] = get(p + "ffn_gate_inp.weight")
            L["router_b"] = get(p + "ffn_gate_inp.bias", False)
            for k in ("gate", "up", "down"):
                stacked = get(f"{p}ffn_{k}_exps.weight", False)
                if stacked is None:   # an older Mixtral file: one tensor per expert
                    stacked = np.stack([get(f"{p}ffn_{k}.{e}.weight") for e in range(m.n_expert)])
                L[f"exp_{k}"] = stacked
                L[f"exp_{k}_b"] = get(f"{p}ffn_{k}_exps.bias", False)
        else:
            L["w_gate"] = get(p + "ffn_gate.weight")
            L["w_up"] = get(p + "ffn_up.weight")
            L["w_down"] = get(p + "ffn_down.weight")
        m.layers.append(L)
    _unused(path, set(tensors) - used)
    _check(m)
    return m


def _unused(path, names):
    """A tensor this reference does not use means a feature it does not
    model (an MLP bias, say): refuse rather than silently ignore it."""
    if names:
        raise NotImplementedError(f"{path}: tensors not understood: {sorted(names)[:8]}")


def _check(m):
    """Shape sanity, so a mislabelled file fails loudly here."""
    E, H, KV, D, F = m.n_embd, m.n_head, m.n_head_kv, m.head_dim, m.n_ff
    X, FX = m.n_expert, m.n_ff_exp
    want = {"router": (X, E), "router_b": (X,), "exp_gate": (X, FX, E), "exp_up": (X, FX, E),
            "exp_down": (X, E, FX), "exp_gate_b": (X, FX), "exp_up_b": (X, FX), "exp_down_b": (X, E),
            "sinks": (H,),
            "wq": (H * D, E), "wk": (KV * D, E), "wv": (KV * D, E), "wo": (E, H * D),
            "w_gate": (F, E), "w_up": (F, E), "w_down": (E, F),
            "bq": (H * D,), "bk": (KV * D,), "bv": (KV * D,), "bo": (E,),
            "attn_norm": (E,), "ffn_norm": (E,), "post_attn_norm": (E,),
            "post_ffn_norm": (E,), "q_norm": (D,), "k_norm": (D,)}
    if H % KV:
        raise ValueError(f"{m.source}: {H} heads not a multiple of {KV} kv heads")
    if any(L["router"] is not None for L in m.layers) and not 0 < m.n_expert_used <= m.n_expert:
        raise ValueError(f"{m.source}: {m.n_expert_used} of {m.n_expert} experts used")
    for i, L in enumerate(m.layers):
        for k, shape in want.items():
            if L[k] is not None and tuple(L[k].shape) != shape:
                raise ValueError(f"{m.source}: layer {i} {k} has shape {L[k].shape}, want {shape}")
    if m.tok_embd.shape[1] != E or m.output.shape != (m.n_vocab, E) or m.output_norm.shape != (E,):
        raise ValueError(f"{m.source}: embedding/output shapes {m.tok_embd.shape} {m.output.shape}")
    if m.arch in ("qwen3", "qwen3moe") and m.layers and m.layers[0]["q_norm"] is None:
        raise ValueError(f"{m.source}: {m.arch} without q_norm")


def load(path, yarn_truncate=None):
    """A model from a .gguf file or a Hugging Face directory. yarn_truncate
    (None: as the file's own convention) lets GGUF and safetensors twins of
    a YaRN model be compared on equal terms."""
    if os.path.isdir(path):
        return load_hf(path, yarn_truncate)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return load_gguf(path, yarn_truncate)
    if path.endswith(".safetensors") or os.path.basename(path) == "config.json":
        return load_hf(os.path.dirname(os.path.abspath(path)), yarn_truncate)
    raise ValueError(f"{path}: neither a GGUF file nor a Hugging Face directory")


# ---------------------------------------------------------------------------
# The forward pass, all float64.

def _linear(x, w, b=None):
    y = x @ w.astype(np.float64).T
    if b is not None:
        y = y + b.astype(np.float64)
    return y


def _rms_norm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last axis (w already 1+w for
    gemma3)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _act(name, x):
    if name in ("silu", "swish"):
        return x / (1.0 + np.exp(-x))
    if name in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_tanh"):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "gelu":
        erf = np.vectorize(math.erf, otypes=[np.float64])
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    raise NotImplementedError(f"activation {name!r}")


def _glu(name, gate, up):
    """act(gate) * up, or gpt-oss's clamped SwiGLU (GptOssExperts._apply_gate):
    g = min(gate, 7), (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g)."""
    if name == "swiglu_oai":
        g = np.minimum(gate, 7.0)
        return (np.clip(up, -7.0, 7.0) + 1.0) * g / (1.0 + np.exp(-1.702 * g))
    return _act(name, gate) * up


def _rotate(x, pos, rope):
    """HF apply_rotary_pos_emb on x [heads, n, d]: x*cos + rotate_half(x)*sin,
    rotate_half pairing element i with i + d/2; cos and sin carry the rope's
    attention factor (YaRN's)."""
    inv_freq, factor = rope
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]     # [n, d/2]
    emb = np.concatenate([ang, ang], axis=-1)                      # [n, d]
    cos, sin = np.cos(emb) * factor, np.sin(emb) * factor
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def _attention(m, L, x, pos, sliding):
    n = x.shape[0]
    H, KV, D = m.n_head, m.n_head_kv, m.head_dim
    q = _linear(x, L["wq"], L["bq"]).reshape(n, H, D).transpose(1, 0, 2)    # [H, n, D]
    k = _linear(x, L["wk"], L["bk"]).reshape(n, KV, D).transpose(1, 0, 2)   # [KV, n, D]
    v = _linear(x, L["wv"], L["bv"]).reshape(n, KV, D).transpose(1, 0, 2)
    if L["q_norm"] is not None:
        q = _rms_norm(q, L["q_norm"], m.eps)
    if L["k_norm"] is not None:
        k = _rms_norm(k, L["k_norm"], m.eps)
    rope = m.rope_local if sliding else m.rope_global
    q = _rotate(q, pos, rope)
    k = _rotate(k, pos, rope)
    # repeat_kv: query head h reads kv head h // (H / KV).
    rep = H // KV
    k = np.repeat(k, rep, axis=0)
    v = np.repeat(v, rep, axis=0)
    s = (q @ k.transpose(0, 2, 1)) * m.attn_scale                      # [H, n, n]
    if m.attn_softcap:
        s = np.tanh(s / m.attn_softcap) * m.attn_softcap
    i = pos[:, None]
    j = pos[None, :]
    visible = j <= i
    if sliding:
        visible &= (i - j) < m.sliding_window
    s = np.where(visible[None], s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    if L["sinks"] is not None:
        # gpt-oss: one more logit per head joins every row's softmax and
        # takes its share of the weight to no value.
        sink = L["sinks"].astype(np.float64)[:, None, None]
        top = np.maximum(top, sink)
        p = np.exp(s - top)
        p /= p.sum(axis=-1, keepdims=True) + np.exp(sink - top)
    else:
        p = np.exp(s - top)
        p /= p.sum(axis=-1, keepdims=True)
    o = (p @ v).transpose(1, 0, 2).reshape(n, H * D)
    return _linear(o, L["wo"], L["bo"])


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _moe(m, L, x, il, swaps, routing):
    """The experts' weighted sum for rows x [n, n_embd] of layer il. swaps:
    (layer, position, expert, other) each puts `other` among that row's
    chosen experts in place of `expert`, as noise in a router near a tie
    would; routing, a dict or None: gets {il: (router logits [n, n_expert],
    chosen experts [n, k])}."""
    k = m.n_expert_used
    r = _linear(x, L["router"], L["router_b"])
    chosen = np.argsort(-r, axis=1, kind="stable")[:, :k]
    for sl, sp, expert, other in swaps:
        if sl == il:
            if expert not in chosen[sp] or other in chosen[sp]:
                raise ValueError(f"layer {il} position {sp}: cannot swap {expert} for {other}")
            chosen[sp][chosen[sp] == expert] = other
    if routing is not None:
        routing[il] = r, chosen
    if m.norm_topk:
        w = _softmax(np.take_along_axis(r, chosen, axis=1))
    else:
        w = np.take_along_axis(_softmax(r), chosen, axis=1)
    out = np.zeros_like(x)
    for e in range(m.n_expert):
        hit, slot = np.nonzero(chosen == e)
        if hit.size == 0:
            continue
        bias = {n: None if L[n] is None else L[n][e] for n in ("exp_gate_b", "exp_up_b", "exp_down_b")}
        h = x[hit]
        a = _glu(m.expert_act, _linear(h, L["exp_gate"][e], bias["exp_gate_b"]),
                 _linear(h, L["exp_up"][e], bias["exp_up_b"]))
        out[hit] += w[hit, slot][:, None] * _linear(a, L["exp_down"][e], bias["exp_down_b"])
    return out


def hidden_states(model, token_ids, swaps=(), routing=None):
    """The final-norm output [n_tokens, n_embd] (float64); swaps and
    routing: see _moe."""
    m = model
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError("token_ids must be a non-empty 1-D sequence")
    if ids.min() < 0 or ids.max() >= m.n_vocab:
        raise ValueError(f"token id out of range [0, {m.n_vocab})")
    pos = np.arange(ids.size, dtype=np.int64)
    x = m.tok_embd[ids].astype(np.float64) * m.embed_scale
    for il, L in enumerate(m.layers):
        sliding = m.layer_sliding[il]
        h = _rms_norm(x, L["attn_norm"], m.eps)
        a = _attention(m, L, h, pos, sliding)
        if L["post_attn_norm"] is not None:
            a = _rms_norm(a, L["post_attn_norm"], m.eps)
        x = x + a
        h = _rms_norm(x, L["ffn_norm"], m.eps)
        if L["router"] is not None:
            f = _moe(m, L, h, il, swaps, routing)
        else:
            f = _linear(_glu(m.act, _linear(h, L["w_gate"]), _linear(h, L["w_up"])), L["w_down"])
        if L["post_ffn_norm"] is not None:
            f = _rms_norm(f, L["post_ffn_norm"], m.eps)
        x = x + f
    return _rms_norm(x, m.output_norm, m.eps)


def logits(model, token_ids, swaps=(), routing=None):
    """Logits [n_tokens, n_vocab] (float64) of a causal pass over token_ids
    from position 0; swaps and routing: see _moe."""
    out = _linear(hidden_states(model, token_ids, swaps, routing), model.output)
    if model.final_softcap:
        out = np.tanh(out / model.final_softcap) * model.final_softcap
    return out


def main(argv):
    if len(argv) < 3:
        print(f"usage: {argv[0]} MODEL ID...", file=sys.stderr)
        return 2
    m = load(argv[1])
    print(m)
    out = logits(m, [int(a) for a in argv[2:]])
    for i, row in enumerate(out):
        print(f"{i:4d} argmax {int(row.argmax()):6d}  " + " ".join(f"{v:+.5f}" for v in row[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
