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
	ARCH_LLAMA,  /* Llama 2/3, Mistral, TinyLlama, SmolLM */
	ARCH_QWEN2,  /* + QKV bias */
	ARCH_QWEN3,  /* + QK norm */
	ARCH_GEMMA3, /* + embedding scale, GeGLU, sandwich norms, QK norm, sliding windows */
};

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
	int32_t sliding_window; /* 0: every layer attends to everything */
	int32_t swa_period;     /* layer l is global iff (l + 1) % swa_period == 0 */
	float attn_scale;       /* scale of q.k */
	float embd_scale;       /* token embeddings are multiplied by it (gemma: sqrt(n_embd)) */
	float norm_offset;      /* RMSNorm multiplies by (w + norm_offset): 1 for HF gemma */
	int qkv_bias;
	int qk_norm;
	int sandwich_norm;      /* extra norms after attention and after the FFN */
	int gelu;               /* GeGLU (tanh GELU) instead of SwiGLU */
	int tied_embd;          /* the output projection is the embedding matrix */
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
	const struct model_tensor *ffn_norm;
	const struct model_tensor *w_gate, *w_up, *w_down;
	const struct model_tensor *post_ffn_norm;   /* sandwich_norm */
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
	/* backing store */
	struct model_tensor *tensors;
	int64_t n_tensors;
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
/* Parses "llama", "qwen2", "qwen3", "gemma3"; -1 if unknown. */
int model_arch_from_name(const char *s);
/*
 * Weight names: model_name_from_hf("model.layers.3.mlp.up_proj.weight")
 * is "blk.3.ffn_up.weight", model_name_to_hf the inverse. malloc'd; NULL for
 * a name the family does not use.
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

#endif
