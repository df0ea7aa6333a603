"""embed_ref.py: random embedding models made with transformers and
sentence-transformers, and their vectors by sentence-transformers itself,
for test_embed_hf.py (CPU) and test_gpu_embed.py (GPU).

Two kinds, each a from_config random model saved by sentence-transformers
(model.save: config.json, model.safetensors, modules.json and each
module's directory, exactly as it writes them):
  * "qwen3": Qwen3 (causal, tied embeddings), last-token pooling,
    Normalize: Qwen3-Embedding's modules.
  * "gemma3": Gemma 3 with use_bidirectional_attention (sliding layers
    attend to a window either side), mean pooling, two Dense modules
    (256 -> 768 -> 256, no bias, identity) and Normalize: EmbeddingGemma's.
  * "gemma3-cls": the same Gemma 3 with the first token's state (CLS
    pooling), a Dense module with a bias and tanh (sentence-transformers'
    default), no Normalize.
Both with GQA, a RoPE base that is no family's default, norm weights away
from their start, a sliding window shorter than the longer texts, next to
a tokenizer.json made by `resident-model vocab` with a pad token (the
reference encodes one text at a time, so no padding takes part).
"""
import os
import shutil
import subprocess
import warnings

import rsd

N_VOCAB = 1003
SEED = 5
WINDOW = 12
TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "a",
    "Embeddings turn text into vectors; texts of like meaning land near each other, which is what search wants.",
    "tokens " * 30,
    "Ein kleiner Satz auf Deutsch, und noch einer.",
]


def missing():
    """The reason the reference cannot run (a package missing), or None."""
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError as e:
        return "needs numpy, torch, transformers and sentence-transformers (%s)" % e
    return None


def make(kind, out):
    """Writes model kind into out (a sentence-transformers directory); returns the loaded SentenceTransformer."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
    from transformers import AutoModel, Gemma3TextConfig, Qwen3Config

    warnings.filterwarnings("ignore")
    voc = out + "-vocab"
    gemma = kind.startswith("gemma3")
    subprocess.run([rsd.tool("resident-model"), "vocab", "gemma" if gemma else "qwen2", str(N_VOCAB),
                    "1", voc], check=True, stdout=subprocess.DEVNULL)
    kw = dict(vocab_size=N_VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
              rms_norm_eps=1e-6, initializer_range=0.06)
    rope = {"rope_type": "default", "rope_theta": 50000.0}
    if gemma:
        cfg = Gemma3TextConfig(**kw, sliding_window=WINDOW, use_bidirectional_attention=True,
                               layer_types=["sliding_attention", "full_attention"] * 2,
                               rope_parameters={"full_attention": rope, "sliding_attention": dict(rope, rope_theta=1e4)})
    else:
        cfg = Qwen3Config(**kw, tie_word_embeddings=True, rope_parameters=rope)
    torch.manual_seed(SEED)
    model = AutoModel.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # Gemma stores w of (1 + w), the others w
                p.copy_((0.0 if gemma else 1.0) + 0.3 * torch.randn_like(p))
    base = out + "-base"
    model.save_pretrained(base)
    for f in os.listdir(voc):
        shutil.copy(os.path.join(voc, f), base)
    tr = Transformer(base)
    tok = getattr(tr, "tokenizer", None) or tr.processor
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if kind == "gemma3":
        mods = [tr, Pooling(256, pooling_mode="mean"),
                Dense(256, 768, bias=False, activation_function=torch.nn.Identity()),
                Dense(768, 256, bias=False, activation_function=torch.nn.Identity()), Normalize()]
    elif kind == "gemma3-cls":
        torch.manual_seed(SEED + 1)
        mods = [tr, Pooling(256, pooling_mode="cls"), Dense(256, 128, bias=True)]
    else:
        mods = [tr, Pooling(256, pooling_mode="lasttoken"), Normalize()]
    SentenceTransformer(modules=mods).save(out)
    return SentenceTransformer(out, device="cpu")


def reference(st, texts, dims=None):
    """sentence-transformers' vectors (float64), one text at a time; with dims cut and normalised again."""
    import numpy as np

    e = np.asarray(st.encode(texts, batch_size=1, convert_to_numpy=True), dtype=np.float64)
    if dims is not None:
        e = e[:, :dims]
        e /= np.linalg.norm(e, axis=1, keepdims=True)
    return e


def cosines(a, b):
    """Each row pair's cosine similarity."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
