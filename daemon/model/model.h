/*
 * model.h: one description of a decoder-only transformer, whichever file it
 * came from. The families differ only in flags and hyperparameters; the
 * engine reads nothing else.
 */
#ifndef RESIDENT_MODEL_H
#define RESIDENT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"

struct tokenizer;

enum model_arch {
	ARCH_LLAMA,    /* Llama 2/3, Mistral, TinyLlama, SmolLM; Mixtral (with experts) */
	ARCH_QWEN2,    /* + QKV bias */
	ARCH_QWEN3,    /* + QK norm */
	ARCH_GEMMA3,   /* + embedding scale, GeGLU, sandwich norms, QK norm, sliding windows */
	ARCH_QWEN3MOE, /* Qwen3 whose feed-forwards are experts */
	ARCH_GPTOSS,   /* gpt-oss: biases, attention sinks, sliding windows, YaRN, clamped SwiGLU experts */
};

/* The feed-forward's gate: act(gate) * up. */
enum ffn_act {
	ACT_SILU,       /* SwiGLU */
	ACT_GELU,       /* GeGLU, GELU's tanh form */
	ACT_SWIGLU_OAI, /* gpt-oss: gate clamped above at glu_limit, up to +-glu_limit,
	                   (up + 1) * gate * sigmoid(glu_alpha * gate) */
};

/* Most layers a model may have; the sliding-window mask holds one bit each. */
#define MODEL_MAX_LAYERS 1024

enum model_format { MODEL_GGUF, MODEL_SAFETENSORS };

/* How RoPE pairs the dimensions of a head. */
enum rope_kind {
	ROPE_NORM, /* adjacent pairs (2i, 2i+1): llama GGUF files, whose Q/K rows were permuted */
	ROPE_NEOX, /* halves (i, i + d/2): Hugging Face layout, qwen, gemma */
};

struct model_hparams {
	int32_t n_vocab;
	int32_t n_embd;
	int32_t n_layer;
	int32_t n_head;
	int32_t n_head_kv;
	int32_t head_dim;
	int32_t n_ff;
	int32_t n_ctx_train;
	float norm_eps;
	float rope_theta;       /* global (full attention) layers */
	float rope_theta_local; /* sliding-window layers (gemma3) */
	float rope_scale;       /* linear position scaling of global layers: pos / rope_scale */
	enum rope_kind rope;
	/*
	 * YaRN (yarn_factor > 0): RoPE frequencies between the model's
	 * original context and yarn_factor times it (model_rope_freqs), and
	 * q and k scaled by rope_mscale (folded into attn_scale).
	 */
	float yarn_factor, yarn_beta_fast, yarn_beta_slow, rope_mscale;
	int32_t yarn_orig_ctx;
	int yarn_truncate;      /* the ramp's ends rounded to whole dimensions (llama.cpp, HF's default) */
	int32_t sliding_window; /* 0: every layer attends to everything */
	uint64_t swa_mask[MODEL_MAX_LAYERS / 64]; /* bit l: layer l slides (model_layer_is_swa) */
	float attn_scale;       /* scale of q.k */
	float embd_scale;       /* token embeddings are multiplied by it (gemma: sqrt(n_embd)) */
	float norm_offset;      /* RMSNorm multiplies by (w + norm_offset): 1 for HF gemma */
	int qkv_bias;
	int o_bias;             /* a bias after the attention's output projection (gpt-oss) */
	int attn_sinks;         /* a learned logit per head joins each softmax (gpt-oss) */
	int qk_norm;
	int sandwich_norm;      /* extra norms after attention and after the FFN */
	enum ffn_act act;
	float glu_alpha, glu_limit; /* ACT_SWIGLU_OAI */
	int tied_embd;          /* the output projection is the embedding matrix */
	/*
	 * Experts (n_expert > 0): every layer's feed-forward is n_expert of
	 * n_ff_exp rows each and a router; a token goes through the
	 * n_expert_used whose router logits are largest, weighted by a softmax
	 * of those logits alone (expert_norm) or of all n_expert.
	 */
	int32_t n_expert, n_expert_used, n_ff_exp;
	int expert_norm;
	int expert_bias;        /* biases on the router and on each expert's products (gpt-oss) */
};

/* A weight: shape in GGML order (ne[0] is the row, the input dimension). */
struct model_tensor {
	const char *name;
	uint32_t type;
	int n_dims;
	int64_t ne[4];
	const void *data;  /* in the mapped file */
	size_t bytes;
};

struct model_layer {
	const struct model_tensor *attn_norm;
	const struct model_tensor *wq, *wk, *wv, *wo;
	const struct model_tensor *bq, *bk, *bv;    /* qkv_bias */
	const struct model_tensor *q_norm, *k_norm; /* qk_norm: head_dim weights */
	const struct model_tensor *post_attn_norm;  /* sandwich_norm */
	const struct model_tensor *bo;              /* o_bias */
	const struct model_tensor *sinks;           /* attn_sinks: n_head logits */
	const struct model_tensor *ffn_norm;
	const struct model_tensor *w_gate, *w_up, *w_down; /* a dense feed-forward (n_expert 0) */
	const struct model_tensor *post_ffn_norm;   /* sandwich_norm */
	/*
	 * Experts: the router [n_embd, n_expert], and n_expert matrices each
	 * of gate and up [n_embd, n_ff_exp] and down [n_ff_exp, n_embd], one
	 * after the other in these arrays (expert e's gate is exp_gate[e]),
	 * whether the file stores them as one tensor or one per expert.
	 */
	const struct model_tensor *router, *router_b;
	const struct model_tensor *exp_gate, *exp_up, *exp_down;
	const struct model_tensor *exp_gate_b, *exp_up_b; /* expert_bias: [n_ff_exp, n_expert] */
	const struct model_tensor *exp_down_b;            /* expert_bias: [n_embd, n_expert] */
};

/*
 * How an embedding model makes one vector of a sequence's final hidden
 * states (after the output norm), as sentence-transformers' modules do:
 * Pooling, then each Dense, then Normalize. The values are llama.cpp's
 * LLAMA_POOLING_TYPE (GGUF {arch}.pooling_type).
 */
enum pool_kind { POOL_NONE = 0, POOL_MEAN = 1, POOL_CLS = 2, POOL_LAST = 3 };

/* A Dense module: y = act(W x + b), W n_out rows of n_in, in float (small, and run on the host). */
struct model_dense {
	int32_t n_in, n_out;
	float *w;
	float *b;                   /* NULL: no bias */
	int tanh;                   /* the activation: tanh, else identity */
};

#define MODEL_MAX_DENSE 2

struct model_embed {
	enum pool_kind pool;        /* POOL_NONE: not an embedding model */
	int bidirectional;          /* its sequences' tokens attend to every token of the sequence (a
	                               sliding-window layer to those within half its window either side),
	                               not to those before them alone: it cannot generate */
	struct model_dense dense[MODEL_MAX_DENSE];
	int n_dense;
	int normalize;              /* L2-normalised (a Normalize module; always for a GGUF file, as
	                               llama.cpp and Ollama do) */
	int32_t n_out;              /* floats of its vectors: the last Dense's n_out, else n_embd */
};

struct model_desc {
	enum model_arch arch;
	enum model_format format;
	char *path;
	char *name;                 /* general.name, or the file / directory name */
	struct model_hparams hp;
	const struct model_tensor *tok_embd;
	const struct model_tensor *out_norm;
	const struct model_tensor *output; /* == tok_embd when tied */
	struct model_layer *layers;
	struct tokenizer *tok;
	enum chat_tmpl chat;
	char *chat_error;           /* why the file's chat template is not usable, or NULL */
	size_t weight_bytes;        /* all tensors, as stored */
	int64_t file_type;          /* GGUF general.file_type (quant_file_type_name), or -1 */
	struct model_embed embed;   /* an embedding model's pooling (embed.h); pool POOL_NONE for others */
	/* backing store */
	struct model_tensor *tensors;
	int64_t n_tensors;
	struct model_tensor *experts; /* the per-expert matrices the layers point at */
	void **owned;               /* weights converted at load (convert.h), freed with the model */
	int n_owned;
	void *file;                 /* struct gguf_file * or struct st_model * */
};

/*
 * Opens a model: a .gguf file, or a Hugging Face directory (config.json,
 * safetensors, tokenizer.json). Checks every tensor the architecture needs
 * is present with the right shape. Returns 0 or a negative code with a
 * message that names the file and what is wrong.
 */
int model_open(const char *path, struct model_desc **out, char *err);
void model_close(struct model_desc *m);

const char *model_arch_name(enum model_arch a);
/*
 * The name a model goes by: its file or directory name without ".gguf"
 * ("/m/gemma-3-270m.gguf" -> "gemma-3-270m"). malloc'd.
 */
char *model_file_name(const char *path);
/* Parses "llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "gpt-oss"; -1 if unknown. */
int model_arch_from_name(const char *s);
/*
 * Weight names: model_name_from_hf("model.layers.3.mlp.up_proj.weight")
 * is "blk.3.ffn_up.weight" (so is "layers.3.mlp.up_proj.weight", a base
 * model's name), model_name_to_hf the inverse. malloc'd; NULL for a name
 * the family does not use.
 */
char *model_name_from_hf(const char *hf, enum model_arch a);
char *model_name_to_hf(const char *gguf, enum model_arch a);

/* The tensors of one type. */
struct model_type_use {
	uint32_t type;
	const char *name;           /* "Q4_K" */
	uint64_t tensors, bytes;
};
/* The tensor types a model has, most bytes first: *out is malloc'd; returns their count. */
size_t model_tensor_types(const struct model_desc *m, struct model_type_use **out);
/* Parameters: the elements of all its tensors. */
uint64_t model_n_params(const struct model_desc *m);
/*
 * Its quantization as people name it: the GGUF file type ("Q4_K_M") when
 * the file says and it is known, else the tensor type that holds most of
 * the weights' bytes ("BF16").
 */
const char *model_quantization(const struct model_desc *m);

/* 1 if layer l uses the sliding window. */
int model_layer_is_swa(const struct model_hparams *hp, int l);

/*
 * The head_dim / 2 RoPE frequencies of a sliding-window (swa 1) or global
 * layer: 1 / base^(2i / head_dim) as Hugging Face computes them in float,
 * blended towards their 1 / yarn_factor fraction where the model uses
 * YaRN. Both backends rotate by these.
 */
void model_rope_freqs(const struct model_hparams *hp, int swa, float *out);

/* Bytes a step reads of the weights of one token's experts in layer l (the n_expert_used largest). */
uint64_t model_expert_bytes(const struct model_desc *m, int l);

#endif
