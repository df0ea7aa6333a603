/*
 * arch.c: GGUF files and Hugging Face directories into one model_desc.
 *
 * Tensors carry GGUF's names ("blk.3.attn_q.weight") whichever the format:
 * safetensors names are rewritten on load. Binding then walks one table of
 * the weights a layer can have, with the shape each must have, so a file
 * with a missing or misshapen tensor is refused before the engine sees it.
 */
#include "config.h"
#include "model.h"
#include "convert.h"
#include "embed.h"
#include "gguf.h"
#include "quant.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_DIM (1 << 20)
#define MAX_EXPERTS 1024

static const char *const arch_names[] = {
	[ARCH_LLAMA] = "llama", [ARCH_QWEN2] = "qwen2", [ARCH_QWEN3] = "qwen3",
	[ARCH_GEMMA3] = "gemma3", [ARCH_QWEN3MOE] = "qwen3moe", [ARCH_GPTOSS] = "gpt-oss",
};

const char *
model_arch_name(enum model_arch a)
{
	return arch_names[a];
}

int
model_arch_from_name(const char *s)
{
	size_t i;

	for (i = 0; i < ARRAY_LEN(arch_names); i++)
		if (strcmp(s, arch_names[i]) == 0)
			return (int)i;
	return -1;
}

int
model_layer_is_swa(const struct model_hparams *hp, int l)
{
	return hp->sliding_window > 0 && l >= 0 && l < MODEL_MAX_LAYERS && (hp->swa_mask[l / 64] >> (l % 64) & 1);
}

/* Marks layer l sliding or not. */
static void
set_swa(struct model_hparams *hp, int l, int on)
{
	uint64_t bit = (uint64_t)1 << (l % 64);

	hp->swa_mask[l / 64] = on ? hp->swa_mask[l / 64] | bit : hp->swa_mask[l / 64] & ~bit;
}

/* Every layer slides but each period-th (period 1: none; 0: all), as llama.cpp's set_swa_pattern. */
static void
swa_period(struct model_hparams *hp, int32_t period)
{
	for (int l = 0; l < hp->n_layer && l < MODEL_MAX_LAYERS; l++)
		set_swa(hp, l, period == 0 || (l + 1) % period != 0);
}

/* YaRN's ramp end for a rotation count: the dimension whose wavelength fits it into the original context. */
static float
yarn_dim(const struct model_hparams *hp, float rotations)
{
	return (float)hp->head_dim * logf((float)hp->yarn_orig_ctx / (rotations * 2.0f * (float)M_PI)) /
	    (2.0f * logf(hp->rope_theta));
}

void
model_rope_freqs(const struct model_hparams *hp, int swa, float *out)
{
	float theta = swa ? hp->rope_theta_local : hp->rope_theta, lo, hi, ramp;
	int d = hp->head_dim;

	for (int i = 0; i < d / 2; i++)
		out[i] = 1.0f / powf(theta, (float)(2 * i) / (float)d);
	if (hp->yarn_factor <= 0)
		return;
	/* Hugging Face's _compute_yarn_parameters (llama.cpp's rope_yarn: truncated) */
	lo = yarn_dim(hp, hp->yarn_beta_fast);
	hi = yarn_dim(hp, hp->yarn_beta_slow);
	if (hp->yarn_truncate)
		lo = floorf(lo), hi = ceilf(hi);
	lo = MAX(lo, 0.0f);
	hi = MIN(hi, (float)(d - 1));
	if (lo == hi)
		hi += 0.001f;
	for (int i = 0; i < d / 2; i++) {
		/* 1 where the frequency is kept (extrapolated), 0 where it is divided by the factor */
		ramp = 1.0f - MIN(1.0f, MAX(0.0f, ((float)i - lo) / (hi - lo)));
		out[i] = out[i] / hp->yarn_factor * (1.0f - ramp) + out[i] * ramp;
	}
}

/* Flags and defaults that follow from the family alone. */
static void
arch_defaults(struct model_hparams *hp, enum model_arch a)
{
	hp->rope = ROPE_NEOX;
	hp->rope_scale = 1.0f;
	hp->embd_scale = 1.0f;
	hp->norm_eps = 1e-5f;
	hp->rope_theta = 10000.0f;
	hp->yarn_beta_fast = 32.0f;
	hp->yarn_beta_slow = 1.0f;
	hp->yarn_truncate = 1;
	hp->expert_norm = 1;
	switch (a) {
	case ARCH_LLAMA:
		break;
	case ARCH_QWEN2:
		hp->qkv_bias = 1;
		break;
	case ARCH_QWEN3:
	case ARCH_QWEN3MOE:
		hp->qk_norm = 1;
		break;
	case ARCH_GEMMA3:
		hp->qk_norm = 1;
		hp->sandwich_norm = 1;
		hp->act = ACT_GELU;
		hp->rope_theta_local = 10000.0f;
		hp->norm_eps = 1e-6f;
		break;
	case ARCH_GPTOSS:
		hp->qkv_bias = hp->o_bias = hp->attn_sinks = hp->expert_bias = 1;
		hp->act = ACT_SWIGLU_OAI;
		hp->glu_alpha = 1.702f;
		hp->glu_limit = 7.0f;
		break;
	}
}

/* The sliding-window pattern a family has when its file says none. */
static int32_t
default_swa_period(enum model_arch a)
{
	return a == ARCH_GEMMA3 ? 6 : a == ARCH_GPTOSS ? 2 : 1;
}

/* Checks the expert counts; a model without experts has none of them. */
static int
experts_finish(struct model_hparams *hp, char *err)
{
	if (hp->n_expert == 0)
		return 0;
	if (hp->n_expert < 0 || hp->n_expert > MAX_EXPERTS || hp->n_expert_used < 1 ||
	    hp->n_expert_used > hp->n_expert)
		return err_set(err, ERR_FORMAT, "%d experts with %d used per token: expected 1 <= used <= experts <= %d",
		    hp->n_expert, hp->n_expert_used, MAX_EXPERTS);
	if (hp->n_ff_exp <= 0)
		hp->n_ff_exp = hp->n_ff;
	if (hp->n_ff_exp <= 0 || hp->n_ff_exp > MAX_DIM)
		return err_set(err, ERR_FORMAT, "expert feed-forward size %d", hp->n_ff_exp);
	return 0;
}

/* YaRN's attention factor (get_mscale), unless the file gave one; q.k scales by its square. */
static int
yarn_finish(struct model_hparams *hp, char *err)
{
	if (hp->yarn_factor <= 0) {
		hp->rope_mscale = 1.0f;
		return 0;
	}
	if (!(hp->yarn_factor >= 1) || hp->yarn_orig_ctx <= 0 || !(hp->yarn_beta_fast > 0) || !(hp->yarn_beta_slow > 0))
		return err_set(err, ERR_FORMAT, "YaRN factor %g over an original context of %d (beta %g, %g)",
		    hp->yarn_factor, hp->yarn_orig_ctx, hp->yarn_beta_fast, hp->yarn_beta_slow);
	if (hp->rope_mscale == 0)
		hp->rope_mscale = 0.1f * logf(hp->yarn_factor) + 1.0f;
	hp->attn_scale *= hp->rope_mscale * hp->rope_mscale;
	return 0;
}

/* Values derived once the sizes are known; checks they are sane. */
static int
hparams_finish(struct model_hparams *hp, enum model_arch a, char *err)
{
	int rc;

	if (hp->n_embd <= 0 || hp->n_embd > MAX_DIM || hp->n_layer <= 0 || hp->n_layer > MODEL_MAX_LAYERS ||
	    hp->n_head <= 0 || hp->n_head > 4096 || hp->n_ff <= 0 || hp->n_ff > MAX_DIM)
		return err_set(err, ERR_FORMAT,
		    "implausible sizes: embedding %d, layers %d, heads %d, feed-forward %d",
		    hp->n_embd, hp->n_layer, hp->n_head, hp->n_ff);
	if (hp->n_head_kv <= 0)
		hp->n_head_kv = hp->n_head;
	if (hp->n_head_kv > hp->n_head || hp->n_head % hp->n_head_kv != 0)
		return err_set(err, ERR_FORMAT, "%d heads cannot share %d key/value heads",
		    hp->n_head, hp->n_head_kv);
	if (hp->head_dim <= 0)
		hp->head_dim = hp->n_embd / hp->n_head;
	if (hp->head_dim <= 0 || hp->head_dim > 1024 || hp->head_dim % 2 != 0)
		return err_set(err, ERR_FORMAT, "head size %d is not supported", hp->head_dim);
	if (!(hp->norm_eps > 0 && hp->norm_eps < 1) || !(hp->rope_theta > 0) || !(hp->rope_scale > 0))
		return err_set(err, ERR_FORMAT, "bad norm epsilon %g, rope base %g or rope scale %g",
		    hp->norm_eps, hp->rope_theta, hp->rope_scale);
	if (hp->sliding_window < 0)
		return err_set(err, ERR_FORMAT, "negative sliding window");
	if (hp->attn_scale == 0)
		hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	if (a == ARCH_GEMMA3)
		hp->embd_scale = sqrtf((float)hp->n_embd);
	if (hp->rope_theta_local <= 0)
		hp->rope_theta_local = hp->rope_theta;
	if (hp->n_ctx_train <= 0)
		hp->n_ctx_train = 4096;
	if ((rc = experts_finish(hp, err)) != 0)
		return rc;
	return yarn_finish(hp, err);
}

/* ---- GGUF ---- */

/*
 * The sliding layers: "<arch>.attention.sliding_window_pattern" as a
 * period or as one flag per layer (llama.cpp's get_key_or_arr), else the
 * family's pattern.
 */
static int
gguf_swa(const struct gguf_file *f, const char *a, struct model_hparams *hp, enum model_arch arch, char *err)
{
	char key[128];
	int32_t period = default_swa_period(arch);
	int64_t k;
	int rc;

	snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
	k = gguf_find_key(f, key);
	if (k >= 0 && gguf_kv_type(f, k) == GGUF_ARRAY) {
		enum gguf_vtype t = gguf_arr_type(f, k);

		if (t == GGUF_STRING || t == GGUF_ARRAY || t == GGUF_F32 || t == GGUF_F64)
			return err_set(err, ERR_FORMAT, "%s is an array of neither flags nor integers", key);
		if (gguf_arr_n(f, k) != (uint64_t)hp->n_layer)
			return err_set(err, ERR_FORMAT, "%s has %llu entries for %d layers", key,
			    (unsigned long long)gguf_arr_n(f, k), hp->n_layer);
		for (int l = 0; l < hp->n_layer; l++)
			set_swa(hp, l, gguf_arr_i64(f, k, (uint64_t)l) != 0);
		return 0;
	}
	if ((rc = gguf_hp_i32(f, a, "attention.sliding_window_pattern", &period, 0, err)) != 0)
		return rc;
	swa_period(hp, period);
	return 0;
}

/* rope.scaling.type: none or linear (pos / factor), or yarn with its keys. */
static int
gguf_rope_scaling(const struct gguf_file *f, const char *a, struct model_hparams *hp, char *err)
{
	char key[128];
	struct gguf_str type = { "linear", 6 };
	float factor = 0;
	int rc;

	snprintf(key, sizeof key, "%s.rope.scaling.type", a);
	if ((rc = gguf_get_str(f, key, &type, err)) != 0 && rc != ERR_NOTFOUND)
		return rc;
	if ((rc = gguf_hp_f32(f, a, "rope.scaling.factor", &factor, err)) != 0)
		return rc;
	if (gguf_str_eq(type, "none") || factor == 0)
		return 0;
	if (gguf_str_eq(type, "linear")) {
		hp->rope_scale = factor;
		return 0;
	}
	if (!gguf_str_eq(type, "yarn"))
		return err_set(err, ERR_UNSUPPORTED, "RoPE scaling '%.*s' is not supported (linear and yarn are)",
		    (int)MIN(type.n, 40), type.s);
	hp->yarn_factor = factor;
	hp->yarn_orig_ctx = hp->n_ctx_train;
	if ((rc = gguf_hp_i32(f, a, "rope.scaling.original_context_length", &hp->yarn_orig_ctx, 0, err)) ||
	    (rc = gguf_hp_f32(f, a, "rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast, err)) ||
	    (rc = gguf_hp_f32(f, a, "rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow, err)))
		return rc;
	return 0;
}

/* The expert keys, and whether the chosen experts' weights are renormalised (llama.cpp's expert_weights_norm). */
static int
gguf_experts(const struct gguf_file *f, const char *a, struct model_hparams *hp, char *err)
{
	char key[128];
	int rc, norm;

	if ((rc = gguf_hp_i32(f, a, "expert_count", &hp->n_expert, 0, err)) ||
	    (rc = gguf_hp_i32(f, a, "expert_used_count", &hp->n_expert_used, 0, err)) ||
	    (rc = gguf_hp_i32(f, a, "expert_feed_forward_length", &hp->n_ff_exp, 0, err)))
		return rc;
	snprintf(key, sizeof key, "%s.expert_weights_norm", a);
	if ((rc = gguf_get_bool(f, key, &norm, err)) == 0)
		hp->expert_norm = norm;
	return rc == ERR_NOTFOUND ? 0 : rc;
}

/* Hyperparameters from the <arch>.* keys. */
static int
gguf_hparams(const struct gguf_file *f, struct model_desc *m, const char *a, char *err)
{
	struct model_hparams *hp = &m->hp;
	int rc;

	arch_defaults(hp, m->arch);
	if (m->arch == ARCH_LLAMA)
		hp->rope = ROPE_NORM; /* convert_hf_to_gguf permutes llama's Q and K rows */
	if ((rc = gguf_hp_i32(f, a, "embedding_length", &hp->n_embd, 1, err)) ||
	    (rc = gguf_hp_i32(f, a, "block_count", &hp->n_layer, 1, err)) ||
	    (rc = gguf_hp_i32(f, a, "feed_forward_length", &hp->n_ff, 1, err)) ||
	    (rc = gguf_hp_i32(f, a, "attention.head_count", &hp->n_head, 1, err)) ||
	    (rc = gguf_hp_i32(f, a, "attention.head_count_kv", &hp->n_head_kv, 0, err)) ||
	    (rc = gguf_hp_i32(f, a, "attention.key_length", &hp->head_dim, 0, err)) ||
	    (rc = gguf_hp_i32(f, a, "context_length", &hp->n_ctx_train, 0, err)) ||
	    (rc = gguf_hp_i32(f, a, "attention.sliding_window", &hp->sliding_window, 0, err)) ||
	    (rc = gguf_hp_f32(f, a, "attention.layer_norm_rms_epsilon", &hp->norm_eps, err)) ||
	    (rc = gguf_hp_f32(f, a, "rope.freq_base", &hp->rope_theta, err)) ||
	    (rc = gguf_hp_f32(f, a, "rope.freq_base_swa", &hp->rope_theta_local, err)) ||
	    (rc = gguf_experts(f, a, hp, err)))
		return rc;
	if (hp->n_layer <= 0 || hp->n_layer > MODEL_MAX_LAYERS)
		return err_set(err, ERR_FORMAT, "%d layers (at most %d)", hp->n_layer, MODEL_MAX_LAYERS);
	if ((rc = gguf_swa(f, a, hp, m->arch, err)) != 0 || (rc = gguf_rope_scaling(f, a, hp, err)) != 0)
		return rc;
	return hparams_finish(hp, m->arch, err);
}

/* Copies the GGUF tensor directory into model tensors. */
static void
gguf_tensors(const struct gguf_file *f, struct model_desc *m)
{
	int64_t i;

	m->n_tensors = gguf_n_tensors(f);
	m->tensors = xcalloc((size_t)(m->n_tensors ? m->n_tensors : 1), sizeof *m->tensors);
	for (i = 0; i < m->n_tensors; i++) {
		const struct gguf_tensor *g = gguf_tensor(f, i);
		struct model_tensor *t = &m->tensors[i];

		t->name = xstrndup(g->name.s, (size_t)g->name.n);
		t->type = g->type;
		t->n_dims = (int)g->n_dims;
		memcpy(t->ne, g->ne, sizeof t->ne);
		t->data = g->data;
		t->bytes = g->bytes;
	}
}

/*
 * With no template in the file (the Gemma 3 GGUF has none), the family
 * whose turn markers the vocabulary holds is the one the model was tuned on.
 */
static enum chat_tmpl
infer_chat(const struct tokenizer *tok)
{
	if (tok_find(tok, "<start_of_turn>") >= 0 && tok_find(tok, "<end_of_turn>") >= 0)
		return CHAT_GEMMA;
	if (tok_find(tok, "<|start_header_id|>") >= 0 && tok_find(tok, "<|eot_id|>") >= 0)
		return CHAT_LLAMA3;
	if (tok_find(tok, "<|start|>") >= 0 && tok_find(tok, "<|channel|>") >= 0 && tok_find(tok, "<|message|>") >= 0)
		return CHAT_HARMONY;
	if (tok_find(tok, "<|im_start|>") >= 0 && tok_find(tok, "<|im_end|>") >= 0)
		return tok_find(tok, "<think>") >= 0 && tok_find(tok, "</think>") >= 0 ? CHAT_QWEN3 : CHAT_CHATML;
	return CHAT_RAW;
}

/* Picks the chat template from the file's Jinja source; an unknown one is kept as an error for chat requests. */
static void
detect_chat(struct model_desc *m, const char *src)
{
	char err[ERR_LEN];
	int rc = src != NULL ? chat_detect(src, &m->chat, err) : ERR_NOTFOUND;

	if (rc == ERR_NOTFOUND)
		m->chat = infer_chat(m->tok);
	else if (rc != 0)
		m->chat_error = xstrdup(err);
}

static int
open_gguf(struct model_desc *m, char *err)
{
	struct gguf_file *f;
	struct gguf_str s;
	char *arch, *tmpl = NULL;
	uint32_t file_type;
	int rc, a, bidir;

	if ((rc = gguf_open(m->path, &f, err)) != 0)
		return rc;
	m->file = f;
	m->format = MODEL_GGUF;
	if ((rc = gguf_get_str(f, "general.architecture", &s, err)) != 0)
		return rc == ERR_NOTFOUND ? err_set(err, ERR_FORMAT, "general.architecture is missing") : rc;
	arch = xstrndup(s.s, (size_t)s.n);
	/* EmbeddingGemma: Gemma 3 whose attention is bidirectional, its keys under its own name */
	bidir = strcmp(arch, "gemma-embedding") == 0;
	a = bidir ? ARCH_GEMMA3 : model_arch_from_name(arch);
	if (a < 0) {
		rc = err_set(err, ERR_UNSUPPORTED, "architecture '%.40s' is not supported (llama, qwen2, qwen3, gemma3, "
		    "gemma-embedding, qwen3moe, gpt-oss are)", arch);
		free(arch);
		return rc;
	}
	m->arch = (enum model_arch)a;
	if (gguf_get_str(f, "general.name", &s, NULL) == 0)
		m->name = xstrndup(s.s, (size_t)s.n);
	if (gguf_get_u32(f, "general.file_type", &file_type, NULL) == 0)
		m->file_type = file_type;
	rc = gguf_hparams(f, m, arch, err);
	if (rc == 0)
		rc = embed_open_gguf(m, f, arch, bidir, err);
	free(arch);
	if (rc != 0)
		return rc;
	gguf_tensors(f, m);
	if ((rc = tok_load_gguf(f, &m->tok, err)) != 0)
		return err_prefix(err, rc, "tokenizer");
	if (gguf_get_str(f, "tokenizer.chat_template", &s, NULL) == 0)
		tmpl = xstrndup(s.s, (size_t)s.n);
	detect_chat(m, tmpl);
	free(tmpl);
	return 0;
}

/* ---- Hugging Face directory ---- */

/* An integer field of config.json; absent keeps *v. */
static int
json_i32(json_t *cfg, const char *key, int32_t *v, char *err)
{
	json_t *j = json_object_get(cfg, key);

	if (j == NULL || json_is_null(j))
		return 0;
	if (!json_is_integer(j) || json_integer_value(j) < 0 || json_integer_value(j) > INT32_MAX)
		return err_set(err, ERR_FORMAT, "config.json: %s is not a non-negative integer", key);
	*v = (int32_t)json_integer_value(j);
	return 0;
}

/* A number field of config.json; absent keeps *v. */
static int
json_f32(json_t *cfg, const char *key, float *v, char *err)
{
	json_t *j = json_object_get(cfg, key);

	if (j == NULL || json_is_null(j))
		return 0;
	if (!json_is_number(j))
		return err_set(err, ERR_FORMAT, "config.json: %s is not a number", key);
	*v = (float)json_number_value(j);
	return 0;
}

/* The family from config.json's model_type. */
static int
hf_arch(json_t *cfg, enum model_arch *a, char *err)
{
	static const struct { const char *type; enum model_arch arch; } map[] = {
		{ "llama", ARCH_LLAMA }, { "mistral", ARCH_LLAMA }, { "mixtral", ARCH_LLAMA },
		{ "qwen2", ARCH_QWEN2 }, { "qwen3", ARCH_QWEN3 }, { "gemma3_text", ARCH_GEMMA3 },
		{ "qwen3_moe", ARCH_QWEN3MOE }, { "gpt_oss", ARCH_GPTOSS },
	};
	const char *t = json_string_value(json_object_get(cfg, "model_type"));
	size_t i;

	if (t == NULL)
		return err_set(err, ERR_FORMAT, "config.json: model_type is missing");
	for (i = 0; i < ARRAY_LEN(map); i++) {
		if (strcmp(t, map[i].type) == 0) {
			*a = map[i].arch;
			return 0;
		}
	}
	return err_set(err, ERR_UNSUPPORTED, "model_type '%.40s' is not supported (llama, mistral, mixtral, qwen2, "
	    "qwen3, qwen3_moe, gemma3_text, gpt_oss are)", t);
}

/* YaRN's fields of a RoPE object (_compute_yarn_parameters), its factor already read. */
static int
hf_yarn(json_t *o, struct model_hparams *hp, char *err)
{
	json_t *tr = json_object_get(o, "truncate");
	float mscale = 0, mscale_all = 0;
	int rc;

	hp->yarn_orig_ctx = hp->n_ctx_train;
	if ((rc = json_i32(o, "original_max_position_embeddings", &hp->yarn_orig_ctx, err)) ||
	    (rc = json_f32(o, "beta_fast", &hp->yarn_beta_fast, err)) ||
	    (rc = json_f32(o, "beta_slow", &hp->yarn_beta_slow, err)) ||
	    (rc = json_f32(o, "attention_factor", &hp->rope_mscale, err)) ||
	    (rc = json_f32(o, "mscale", &mscale, err)) || (rc = json_f32(o, "mscale_all_dim", &mscale_all, err)))
		return rc;
	if (json_is_boolean(tr))
		hp->yarn_truncate = json_is_true(tr);
	/* get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) */
	if (hp->rope_mscale == 0 && mscale != 0 && mscale_all != 0 && hp->yarn_factor > 1)
		hp->rope_mscale = (0.1f * mscale * logf(hp->yarn_factor) + 1.0f) /
		    (0.1f * mscale_all * logf(hp->yarn_factor) + 1.0f);
	return 0;
}

/*
 * One RoPE object (rope_scaling, or transformers 5's rope_parameters): its
 * base if it has one, and its scaling: none, linear (global layers only
 * when global is set: Gemma 3's local layers have their own object) or
 * YaRN. Others are refused.
 */
static int
hf_rope_object(json_t *o, struct model_hparams *hp, float *theta, const char *what, char *err)
{
	const char *type = json_string_value(json_object_get(o, "rope_type"));
	float factor = 0;
	int rc;

	if (o == NULL || json_is_null(o))
		return 0;
	if (type == NULL)
		type = json_string_value(json_object_get(o, "type"));
	if ((rc = json_f32(o, "rope_theta", theta, err)) != 0 || (rc = json_f32(o, "factor", &factor, err)) != 0)
		return rc;
	if (type == NULL || strcmp(type, "default") == 0)
		return 0;
	if (strcmp(type, "linear") == 0 && theta == &hp->rope_theta) {
		hp->rope_scale = factor;
		return 0;
	}
	if (strcmp(type, "yarn") == 0 && theta == &hp->rope_theta && factor >= 1) {
		hp->yarn_factor = factor;
		return hf_yarn(o, hp, err);
	}
	return err_set(err, ERR_UNSUPPORTED, "config.json: %s type '%.40s' is not supported", what, type);
}

/*
 * transformers 5 writes rope_parameters instead of rope_theta and
 * rope_scaling: {"rope_type", "rope_theta", "factor"...}, or for Gemma 3
 * one such object per layer type ("full_attention", "sliding_attention").
 */
static int
hf_rope_parameters(json_t *cfg, struct model_hparams *hp, char *err)
{
	json_t *rp = json_object_get(cfg, "rope_parameters");
	json_t *full = json_object_get(rp, "full_attention"), *local = json_object_get(rp, "sliding_attention");
	int rc;

	if ((rc = hf_rope_object(json_object_get(cfg, "rope_scaling"), hp, &hp->rope_theta, "rope_scaling", err)) != 0)
		return rc;
	if (full == NULL && local == NULL)
		return hf_rope_object(rp, hp, &hp->rope_theta, "rope_parameters", err);
	if ((rc = hf_rope_object(full, hp, &hp->rope_theta, "rope_parameters", err)) != 0)
		return rc;
	return hf_rope_object(local, hp, &hp->rope_theta_local, "rope_parameters", err);
}

/*
 * The sliding layers, as transformers decides them: layer_types when the
 * config has it; else Gemma 3's sliding_window_pattern, gpt-oss's
 * alternation, or every layer for a Mistral-style sliding_window.
 */
static int
hf_layer_types(json_t *cfg, struct model_hparams *hp, enum model_arch a, char *err)
{
	json_t *lt = json_object_get(cfg, "layer_types");
	int32_t period = default_swa_period(a);
	size_t i;
	int rc;

	if (json_is_array(lt)) {
		if (json_array_size(lt) != (size_t)hp->n_layer)
			return err_set(err, ERR_FORMAT, "config.json: layer_types has %zu entries for %d layers",
			    json_array_size(lt), hp->n_layer);
		for (i = 0; i < json_array_size(lt); i++) {
			const char *t = json_string_value(json_array_get(lt, i));

			if (t == NULL || (strcmp(t, "sliding_attention") != 0 && strcmp(t, "full_attention") != 0))
				return err_set(err, ERR_UNSUPPORTED, "config.json: layer_types[%zu] is '%.40s' (full_attention "
				    "and sliding_attention are supported)", i, t ? t : "?");
			set_swa(hp, (int)i, strcmp(t, "sliding_attention") == 0);
		}
		return 0;
	}
	if (a == ARCH_GEMMA3 && (rc = json_i32(cfg, "sliding_window_pattern", &period, err)) != 0)
		return rc;
	swa_period(hp, a == ARCH_LLAMA ? 0 : period);
	return 0;
}

/* Qwen3-MoE's experts must be in every layer: no dense layers among them. */
static int
hf_sparse_layers(json_t *cfg, char *err)
{
	json_t *only = json_object_get(cfg, "mlp_only_layers");
	int32_t step = 1;
	int rc;

	if ((rc = json_i32(cfg, "decoder_sparse_step", &step, err)) != 0)
		return rc;
	if (step != 1 || (json_is_array(only) && json_array_size(only) > 0))
		return err_set(err, ERR_UNSUPPORTED, "config.json: dense layers among the experts (decoder_sparse_step %d, "
		    "%zu mlp_only_layers) are not supported", step, json_is_array(only) ? json_array_size(only) : 0);
	return 0;
}

/* The expert fields: counts, the experts' width, the router's normalisation. */
static int
hf_experts(json_t *cfg, struct model_hparams *hp, enum model_arch a, char *err)
{
	json_t *norm = json_object_get(cfg, "norm_topk_prob");
	int rc;

	if ((rc = json_i32(cfg, "num_local_experts", &hp->n_expert, err)) ||
	    (rc = json_i32(cfg, "num_experts", &hp->n_expert, err)) ||
	    (rc = json_i32(cfg, "num_experts_per_tok", &hp->n_expert_used, err)) ||
	    (rc = json_i32(cfg, "moe_intermediate_size", &hp->n_ff_exp, err)) ||
	    (rc = json_f32(cfg, "swiglu_limit", &hp->glu_limit, err)))
		return rc;
	if (a == ARCH_QWEN3MOE) {
		hp->expert_norm = json_is_true(norm); /* Qwen3MoeConfig's default is false */
		return hf_sparse_layers(cfg, err);
	}
	if (a != ARCH_GPTOSS && a != ARCH_LLAMA)
		hp->n_expert = 0;
	return 0;
}

/* Hyperparameters from config.json. */
static int
hf_hparams(json_t *cfg, struct model_desc *m, char *err)
{
	struct model_hparams *hp = &m->hp;
	json_t *tie = json_object_get(cfg, "tie_word_embeddings");
	json_t *bias = json_object_get(cfg, "attention_bias");
	float qpas = 0;
	int rc;

	arch_defaults(hp, m->arch);
	if ((rc = json_i32(cfg, "hidden_size", &hp->n_embd, err)) ||
	    (rc = json_i32(cfg, "num_hidden_layers", &hp->n_layer, err)) ||
	    (rc = json_i32(cfg, "intermediate_size", &hp->n_ff, err)) ||
	    (rc = json_i32(cfg, "num_attention_heads", &hp->n_head, err)) ||
	    (rc = json_i32(cfg, "num_key_value_heads", &hp->n_head_kv, err)) ||
	    (rc = json_i32(cfg, "head_dim", &hp->head_dim, err)) ||
	    (rc = json_i32(cfg, "max_position_embeddings", &hp->n_ctx_train, err)) ||
	    (rc = json_i32(cfg, "sliding_window", &hp->sliding_window, err)) ||
	    (rc = json_f32(cfg, "rms_norm_eps", &hp->norm_eps, err)) ||
	    (rc = json_f32(cfg, "rope_theta", &hp->rope_theta, err)) ||
	    (rc = json_f32(cfg, "query_pre_attn_scalar", &qpas, err)) ||
	    (rc = hf_experts(cfg, hp, m->arch, err)))
		return rc;
	if (hp->n_layer <= 0 || hp->n_layer > MODEL_MAX_LAYERS)
		return err_set(err, ERR_FORMAT, "config.json: %d layers (at most %d)", hp->n_layer, MODEL_MAX_LAYERS);
	if (m->arch == ARCH_GEMMA3) {
		if ((rc = json_f32(cfg, "rope_local_base_freq", &hp->rope_theta_local, err)) != 0)
			return rc;
		hp->norm_offset = 1.0f; /* HF Gemma norms compute x * (1 + w) */
		if (qpas > 0)
			hp->attn_scale = 1.0f / sqrtf(qpas);
	}
	if ((rc = hf_rope_parameters(cfg, hp, err)) != 0 || (rc = hf_layer_types(cfg, hp, m->arch, err)) != 0)
		return rc;
	if ((m->arch == ARCH_QWEN2 || m->arch == ARCH_GPTOSS) && json_is_boolean(bias))
		hp->qkv_bias = json_is_true(bias);
	if (m->arch == ARCH_GPTOSS)
		hp->o_bias = hp->qkv_bias;
	if ((m->arch == ARCH_LLAMA || m->arch == ARCH_QWEN3MOE) && json_is_true(bias))
		return err_set(err, ERR_UNSUPPORTED, "config.json: %s with attention_bias is not supported",
		    json_string_value(json_object_get(cfg, "model_type")));
	hp->tied_embd = tie == NULL ? m->arch == ARCH_GEMMA3 : json_is_true(tie);
	return hparams_finish(hp, m->arch, err);
}

/* A name pair that only some families use: a mask of (1 << arch); ALL for every family. */
#define ALL 0u
#define FAM(a) (1u << (a))

/* Hugging Face and GGUF names of the per-layer weights, after "model.layers.N." / "blk.N.". */
static const struct { const char *hf, *gguf; unsigned only; } layer_names[] = {
	{ "input_layernorm.weight", "attn_norm.weight", ALL },
	{ "self_attn.q_proj.weight", "attn_q.weight", ALL },
	{ "self_attn.k_proj.weight", "attn_k.weight", ALL },
	{ "self_attn.v_proj.weight", "attn_v.weight", ALL },
	{ "self_attn.o_proj.weight", "attn_output.weight", ALL },
	{ "self_attn.q_proj.bias", "attn_q.bias", ALL },
	{ "self_attn.k_proj.bias", "attn_k.bias", ALL },
	{ "self_attn.v_proj.bias", "attn_v.bias", ALL },
	{ "self_attn.o_proj.bias", "attn_output.bias", ALL },
	{ "self_attn.q_norm.weight", "attn_q_norm.weight", ALL },
	{ "self_attn.k_norm.weight", "attn_k_norm.weight", ALL },
	{ "self_attn.sinks", "attn_sinks.weight", ALL },
	{ "pre_feedforward_layernorm.weight", "ffn_norm.weight", FAM(ARCH_GEMMA3) },
	{ "post_feedforward_layernorm.weight", "post_ffw_norm.weight", FAM(ARCH_GEMMA3) },
	{ "mlp.gate_proj.weight", "ffn_gate.weight", ALL },
	{ "mlp.up_proj.weight", "ffn_up.weight", ALL },
	{ "mlp.down_proj.weight", "ffn_down.weight", ALL },
	/* the norm after attention feeds the FFN; gemma has both, and gpt-oss's GGUF keeps the HF name */
	{ "post_attention_layernorm.weight", "ffn_norm.weight", ~(FAM(ARCH_GEMMA3) | FAM(ARCH_GPTOSS)) },
	{ "post_attention_layernorm.weight", "post_attention_norm.weight", FAM(ARCH_GEMMA3) | FAM(ARCH_GPTOSS) },
	/* routers */
	{ "mlp.gate.weight", "ffn_gate_inp.weight", FAM(ARCH_QWEN3MOE) },
	{ "block_sparse_moe.gate.weight", "ffn_gate_inp.weight", FAM(ARCH_LLAMA) },
	{ "mlp.router.weight", "ffn_gate_inp.weight", FAM(ARCH_GPTOSS) },
	{ "mlp.router.bias", "ffn_gate_inp.bias", FAM(ARCH_GPTOSS) },
	/* gpt-oss's other expert weights are converted (convert.h) */
	{ "mlp.experts.down_proj_bias", "ffn_down_exps.bias", FAM(ARCH_GPTOSS) },
};

/* Per-expert weights: the expert's number stands where the %d is, on both sides. */
static const struct { const char *hf, *gguf; unsigned only; } expert_names[] = {
	{ "mlp.experts.%d.gate_proj.weight", "ffn_gate.%d.weight", FAM(ARCH_QWEN3MOE) },
	{ "mlp.experts.%d.up_proj.weight", "ffn_up.%d.weight", FAM(ARCH_QWEN3MOE) },
	{ "mlp.experts.%d.down_proj.weight", "ffn_down.%d.weight", FAM(ARCH_QWEN3MOE) },
	{ "block_sparse_moe.experts.%d.w1.weight", "ffn_gate.%d.weight", FAM(ARCH_LLAMA) },
	{ "block_sparse_moe.experts.%d.w3.weight", "ffn_up.%d.weight", FAM(ARCH_LLAMA) },
	{ "block_sparse_moe.experts.%d.w2.weight", "ffn_down.%d.weight", FAM(ARCH_LLAMA) },
};

static const struct { const char *hf, *gguf; } global_names[] = {
	{ "model.embed_tokens.weight", "token_embd.weight" },
	{ "model.norm.weight", "output_norm.weight" },
	{ "lm_head.weight", "output.weight" },
};

/* Whether a pair whose mask is only applies to the family. */
static int
name_applies(unsigned only, enum model_arch a)
{
	return only == ALL || (only & FAM(a)) != 0;
}

/*
 * Matches name against fmt, which has one "%d" (a decimal number without
 * sign or leading zero); *num gets the number. 1 on a whole match.
 */
static int
match_numbered(const char *name, const char *fmt, int *num)
{
	const char *d = strstr(fmt, "%d"), *p = name + (d - fmt);
	long v = 0;

	if (strncmp(name, fmt, (size_t)(d - fmt)) != 0 || !(*p >= '0' && *p <= '9') || (*p == '0' && p[1] >= '0' &&
	    p[1] <= '9'))
		return 0;
	for (; *p >= '0' && *p <= '9' && v <= MAX_EXPERTS; p++)
		v = v * 10 + (*p - '0');
	*num = (int)v;
	return v <= MAX_EXPERTS && strcmp(p, d + 2) == 0;
}

/* A layer weight's name (after the layer prefix) in the other convention, into buf; 0, or -1 if none. */
static int
translate_layer(const char *rest, enum model_arch a, int to_gguf, char *buf, size_t cap)
{
	size_t i;
	int e;

	for (i = 0; i < ARRAY_LEN(layer_names); i++)
		if (name_applies(layer_names[i].only, a) &&
		    strcmp(rest, to_gguf ? layer_names[i].hf : layer_names[i].gguf) == 0) {
			snprintf(buf, cap, "%s", to_gguf ? layer_names[i].gguf : layer_names[i].hf);
			return 0;
		}
	for (i = 0; i < ARRAY_LEN(expert_names); i++)
		if (name_applies(expert_names[i].only, a) &&
		    match_numbered(rest, to_gguf ? expert_names[i].hf : expert_names[i].gguf, &e)) {
			snprintf(buf, cap, to_gguf ? expert_names[i].gguf : expert_names[i].hf, e);
			return 0;
		}
	return -1;
}

/* Translates a weight name between the two conventions; NULL for names we do not use. */
static char *
translate_name(const char *name, enum model_arch a, int to_gguf)
{
	const char *layer_fmt = to_gguf ? "model.layers.%d.%n" : "blk.%d.%n";
	const char *out_fmt = to_gguf ? "blk.%d.%s" : "model.layers.%d.%s";
	char rest[192], buf[256];
	int layer, n = 0;
	size_t i;

	for (i = 0; i < ARRAY_LEN(global_names); i++)
		if (strcmp(name, to_gguf ? global_names[i].hf : global_names[i].gguf) == 0)
			return xstrdup(to_gguf ? global_names[i].gguf : global_names[i].hf);
	if (sscanf(name, layer_fmt, &layer, &n) != 1 || n == 0 || layer < 0 ||
	    translate_layer(name + n, a, to_gguf, rest, sizeof rest) != 0)
		return NULL;
	snprintf(buf, sizeof buf, out_fmt, layer, rest);
	return xstrdup(buf);
}

char *
model_name_from_hf(const char *hf, enum model_arch a)
{
	char prefixed[256];

	/* a base model's checkpoint (Qwen3Model, Gemma3TextModel: embedding models) has no "model." before its names */
	if (strncmp(hf, "model.", 6) != 0 && strncmp(hf, "lm_head.", 8) != 0 &&
	    (size_t)snprintf(prefixed, sizeof prefixed, "model.%s", hf) < sizeof prefixed)
		return translate_name(prefixed, a, 1);
	return translate_name(hf, a, 1);
}

char *
model_name_to_hf(const char *gguf, enum model_arch a)
{
	return translate_name(gguf, a, 0);
}

/* Keeps a conversion's tensors and buffers in the model. */
static void
take_converted(struct model_desc *m, struct convert_out *c)
{
	m->owned = xrealloc(m->owned, (size_t)(m->n_owned + c->n) * sizeof *m->owned);
	for (int i = 0; i < c->n; i++) {
		m->tensors[m->n_tensors++] = c->t[i];
		m->owned[m->n_owned++] = c->buf[i];
	}
}

/* Copies the safetensors directory into model tensors under GGUF names, converting what needs it. */
static int
hf_tensors(const struct st_model *st, struct model_desc *m, char *err)
{
	int64_t i, n = st_n_tensors(st);
	struct convert_out c;
	char *name;
	int rc;

	m->tensors = xcalloc((size_t)n + ARRAY_LEN(c.t) * (size_t)m->hp.n_layer + 1, sizeof *m->tensors);
	for (i = 0; i < n; i++) {
		const struct st_tensor *s = st_tensor(st, i);
		struct model_tensor *t = &m->tensors[m->n_tensors];

		if ((name = model_name_from_hf(s->name, m->arch)) == NULL)
			continue;
		t->name = name;
		t->type = s->type;
		t->n_dims = s->n_dims;
		memcpy(t->ne, s->ne, sizeof t->ne);
		t->data = s->data;
		t->bytes = s->bytes;
		m->n_tensors++;
	}
	for (int l = 0; m->arch == ARCH_GPTOSS && l < m->hp.n_layer; l++) {
		if ((rc = convert_gptoss_experts(st, l, &c, err)) != 0)
			return rc;
		take_converted(m, &c);
	}
	return 0;
}

/* dir/name into buf; 0 if the file exists. */
static int
dir_file(char *buf, size_t cap, const char *dir, const char *name)
{
	struct stat st;

	snprintf(buf, cap, "%s/%s", dir, name);
	return stat(buf, &st) == 0 ? 0 : -1;
}

/* The chat template of tokenizer_config.json (or chat_template.jinja). */
static void
hf_chat(struct model_desc *m, const char *tok_cfg)
{
	char path[4096];
	json_t *cfg = tok_cfg ? json_load_file(tok_cfg, 0, NULL) : NULL;
	const char *src = json_string_value(json_object_get(cfg, "chat_template"));
	char *data = NULL;
	size_t len;

	if (src == NULL && dir_file(path, sizeof path, m->path, "chat_template.jinja") == 0 &&
	    read_file(path, &data, &len, NULL) == 0)
		src = data;
	detect_chat(m, src);
	free(data);
	json_decref(cfg);
}

static int
open_hf(struct model_desc *m, char *err)
{
	char path[4096], tcfg[4096];
	json_error_t jerr;
	json_t *cfg;
	struct st_model *st;
	int rc, has_tcfg;

	m->format = MODEL_SAFETENSORS;
	if (dir_file(path, sizeof path, m->path, "config.json") != 0)
		return err_set(err, ERR_NOTFOUND, "%s: no config.json (not a model directory)", m->path);
	if ((cfg = json_load_file(path, 0, &jerr)) == NULL)
		return err_set(err, ERR_FORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
	if ((rc = hf_arch(cfg, &m->arch, err)) == 0)
		rc = hf_hparams(cfg, m, err);
	if (rc == 0)
		rc = embed_open_hf(m, cfg, err);
	json_decref(cfg);
	if (rc != 0)
		return rc;
	if ((rc = st_open_dir(m->path, &st, err)) != 0)
		return rc;
	m->file = st;
	if ((rc = hf_tensors(st, m, err)) != 0)
		return rc;
	if (dir_file(path, sizeof path, m->path, "tokenizer.json") != 0)
		return err_set(err, ERR_NOTFOUND, "%s: no tokenizer.json", m->path);
	has_tcfg = dir_file(tcfg, sizeof tcfg, m->path, "tokenizer_config.json") == 0;
	if ((rc = tok_load_json(path, has_tcfg ? tcfg : NULL, &m->tok, err)) != 0)
		return err_prefix(err, rc, "tokenizer");
	hf_chat(m, has_tcfg ? tcfg : NULL);
	return 0;
}

/* ---- binding ---- */

/* Expected shape of a weight, in multiples of the hyperparameters. */
enum dim { D_1, D_EMBD, D_Q, D_KV, D_FF, D_HEAD, D_VOCAB, D_HEADS, D_FFX, D_EXPERTS };

static int64_t
dim_value(const struct model_hparams *hp, enum dim d)
{
	switch (d) {
	case D_EMBD: return hp->n_embd;
	case D_Q: return (int64_t)hp->n_head * hp->head_dim;
	case D_KV: return (int64_t)hp->n_head_kv * hp->head_dim;
	case D_FF: return hp->n_ff;
	case D_HEAD: return hp->head_dim;
	case D_VOCAB: return hp->n_vocab;
	case D_HEADS: return hp->n_head;
	case D_FFX: return hp->n_ff_exp;
	case D_EXPERTS: return hp->n_expert;
	default: return 1;
	}
}

/* The model's tensors in name order, for lookups (a Hugging Face MoE has tens of thousands). */
struct binder {
	struct model_desc *m;
	const struct model_tensor **by_name;
};

static int
cmp_tensor_name(const void *a, const void *b)
{
	return strcmp((*(const struct model_tensor *const *)a)->name, (*(const struct model_tensor *const *)b)->name);
}

/* Finds a tensor by name, or NULL. */
static const struct model_tensor *
find_tensor(const struct binder *bd, const char *name)
{
	struct model_tensor key = { .name = name };
	const struct model_tensor *k = &key, **hit;

	hit = bsearch(&k, bd->by_name, (size_t)bd->m->n_tensors, sizeof *bd->by_name, cmp_tensor_name);
	return hit ? *hit : NULL;
}

/* Checks a tensor's shape against [e0, e1, e2]. */
static int
check_shape(const struct model_tensor *t, int64_t e0, int64_t e1, int64_t e2, char *err)
{
	if (t->ne[0] != e0 || t->ne[1] != e1 || t->ne[2] != e2 || t->ne[3] != 1)
		return err_set(err, ERR_FORMAT, "tensor %s has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
		    t->name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)e0,
		    (long long)e1, (long long)e2);
	return 0;
}

/* Looks a weight up and checks its shape; a missing optional weight is NULL. */
static int
bind(const struct binder *bd, const char *name, enum dim d0, enum dim d1, int required,
    const struct model_tensor **out, char *err)
{
	const struct model_tensor *t = find_tensor(bd, name);

	*out = t;
	if (t == NULL)
		return required ? err_set(err, ERR_FORMAT, "tensor %s is missing", name) : 0;
	return check_shape(t, dim_value(&bd->m->hp, d0), dim_value(&bd->m->hp, d1), 1, err);
}

/*
 * The n_expert matrices of one projection of layer l into views: one
 * tensor "blk.l.<stack>.weight" [d0, d1, n_expert] cut into n_expert, or
 * one tensor per expert, "blk.l.<per>.E.weight" (older Mixtral GGUFs,
 * Hugging Face checkpoints).
 */
static int
bind_experts(const struct binder *bd, int l, const char *stack, const char *per, enum dim d0, enum dim d1,
    struct model_tensor *views, char *err)
{
	const struct model_hparams *hp = &bd->m->hp;
	int64_t e0 = dim_value(hp, d0), e1 = dim_value(hp, d1);
	const struct model_tensor *t;
	char name[96];
	size_t each;
	int rc;

	snprintf(name, sizeof name, "blk.%d.%s.weight", l, stack);
	if ((t = find_tensor(bd, name)) != NULL) {
		if ((rc = check_shape(t, e0, e1, hp->n_expert, err)) != 0)
			return rc;
		each = t->bytes / (size_t)hp->n_expert;
		for (int e = 0; e < hp->n_expert; e++) {
			views[e] = *t;
			views[e].n_dims = 2;
			views[e].ne[2] = 1;
			views[e].data = (const uint8_t *)t->data + (size_t)e * each;
			views[e].bytes = each;
		}
		return 0;
	}
	for (int e = 0; e < hp->n_expert; e++) {
		snprintf(name, sizeof name, "blk.%d.%s.%d.weight", l, per, e);
		if ((t = find_tensor(bd, name)) == NULL)
			return err_set(err, ERR_FORMAT, "tensor blk.%d.%s.weight is missing (nor is %s there)", l, stack,
			    name);
		if ((rc = check_shape(t, e0, e1, 1, err)) != 0)
			return rc;
		views[e] = *t;
	}
	return 0;
}

/* Layer l's router and experts. */
static int
bind_moe(const struct binder *bd, int l, struct model_layer *L, char *err)
{
	const struct model_hparams *hp = &bd->m->hp;
	struct model_tensor *v = bd->m->experts + (size_t)l * 3 * (size_t)hp->n_expert;
	char name[96];
	int rc, b = hp->expert_bias;

#define NAME(s) (snprintf(name, sizeof name, "blk.%d.%s", l, s), name)
	if ((rc = bind(bd, NAME("ffn_gate_inp.weight"), D_EMBD, D_EXPERTS, 1, &L->router, err)) ||
	    (rc = bind(bd, NAME("ffn_gate_inp.bias"), D_EXPERTS, D_1, b, &L->router_b, err)) ||
	    (rc = bind(bd, NAME("ffn_gate_exps.bias"), D_FFX, D_EXPERTS, b, &L->exp_gate_b, err)) ||
	    (rc = bind(bd, NAME("ffn_up_exps.bias"), D_FFX, D_EXPERTS, b, &L->exp_up_b, err)) ||
	    (rc = bind(bd, NAME("ffn_down_exps.bias"), D_EMBD, D_EXPERTS, b, &L->exp_down_b, err)) ||
	    (rc = bind_experts(bd, l, "ffn_gate_exps", "ffn_gate", D_EMBD, D_FFX, v, err)) ||
	    (rc = bind_experts(bd, l, "ffn_up_exps", "ffn_up", D_EMBD, D_FFX, v + hp->n_expert, err)) ||
	    (rc = bind_experts(bd, l, "ffn_down_exps", "ffn_down", D_FFX, D_EMBD, v + 2 * hp->n_expert, err)))
		return rc;
#undef NAME
	if (!b)
		L->router_b = L->exp_gate_b = L->exp_up_b = L->exp_down_b = NULL;
	L->exp_gate = v;
	L->exp_up = v + hp->n_expert;
	L->exp_down = v + 2 * hp->n_expert;
	return 0;
}

/* The weights of layer l. */
static int
bind_layer(const struct binder *bd, int l, struct model_layer *L, char *err)
{
	const struct model_hparams *hp = &bd->m->hp;
	int dense = hp->n_expert == 0;
	const struct {
		const char *suffix;
		size_t field;
		enum dim d0, d1;
		int required;
	} w[] = {
		{ "attn_norm.weight", offsetof(struct model_layer, attn_norm), D_EMBD, D_1, 1 },
		{ "attn_q.weight", offsetof(struct model_layer, wq), D_EMBD, D_Q, 1 },
		{ "attn_k.weight", offsetof(struct model_layer, wk), D_EMBD, D_KV, 1 },
		{ "attn_v.weight", offsetof(struct model_layer, wv), D_EMBD, D_KV, 1 },
		{ "attn_output.weight", offsetof(struct model_layer, wo), D_Q, D_EMBD, 1 },
		{ "attn_q.bias", offsetof(struct model_layer, bq), D_Q, D_1, hp->qkv_bias },
		{ "attn_k.bias", offsetof(struct model_layer, bk), D_KV, D_1, hp->qkv_bias },
		{ "attn_v.bias", offsetof(struct model_layer, bv), D_KV, D_1, hp->qkv_bias },
		{ "attn_output.bias", offsetof(struct model_layer, bo), D_EMBD, D_1, hp->o_bias },
		{ "attn_q_norm.weight", offsetof(struct model_layer, q_norm), D_HEAD, D_1, hp->qk_norm },
		{ "attn_k_norm.weight", offsetof(struct model_layer, k_norm), D_HEAD, D_1, hp->qk_norm },
		{ "attn_sinks.weight", offsetof(struct model_layer, sinks), D_HEADS, D_1, hp->attn_sinks },
		{ "post_attention_norm.weight", offsetof(struct model_layer, post_attn_norm), D_EMBD, D_1,
		    hp->sandwich_norm },
		/* gpt-oss's GGUF names the FFN's norm after its Hugging Face name */
		{ bd->m->arch == ARCH_GPTOSS ? "post_attention_norm.weight" : "ffn_norm.weight",
		    offsetof(struct model_layer, ffn_norm), D_EMBD, D_1, 1 },
		{ "ffn_gate.weight", offsetof(struct model_layer, w_gate), D_EMBD, D_FF, dense },
		{ "ffn_up.weight", offsetof(struct model_layer, w_up), D_EMBD, D_FF, dense },
		{ "ffn_down.weight", offsetof(struct model_layer, w_down), D_FF, D_EMBD, dense },
		{ "post_ffw_norm.weight", offsetof(struct model_layer, post_ffn_norm), D_EMBD, D_1,
		    hp->sandwich_norm },
	};
	char name[96];
	size_t i;
	int rc;

	for (i = 0; i < ARRAY_LEN(w); i++) {
		snprintf(name, sizeof name, "blk.%d.%s", l, w[i].suffix);
		rc = bind(bd, name, w[i].d0, w[i].d1, w[i].required,
		    (const struct model_tensor **)((char *)L + w[i].field), err);
		if (rc != 0)
			return rc;
	}
	/* only the families that define them use them */
	if (!hp->qkv_bias)
		L->bq = L->bk = L->bv = NULL;
	if (!hp->o_bias)
		L->bo = NULL;
	if (!hp->qk_norm)
		L->q_norm = L->k_norm = NULL;
	if (!hp->attn_sinks)
		L->sinks = NULL;
	if (!hp->sandwich_norm)
		L->post_attn_norm = L->post_ffn_norm = NULL;
	if (!dense) {
		L->w_gate = L->w_up = L->w_down = NULL;
		return bind_moe(bd, l, L, err);
	}
	return 0;
}

/* Binds every weight the architecture uses. */
static int
bind_all(struct model_desc *m, char *err)
{
	struct binder bd = { m, xcalloc((size_t)m->n_tensors + 1, sizeof *bd.by_name) };
	const struct model_tensor *e;
	int l, rc = 0;

	for (int64_t i = 0; i < m->n_tensors; i++)
		bd.by_name[i] = &m->tensors[i];
	qsort(bd.by_name, (size_t)m->n_tensors, sizeof *bd.by_name, cmp_tensor_name);
	if ((e = find_tensor(&bd, "token_embd.weight")) == NULL) {
		rc = err_set(err, ERR_FORMAT, "tensor token_embd.weight is missing");
		goto out;
	}
	m->hp.n_vocab = (int32_t)e->ne[1];
	if (e->ne[1] > INT32_MAX || e->ne[1] != tok_n_vocab(m->tok)) {
		rc = err_set(err, ERR_FORMAT, "the embedding has %lld rows but the tokenizer %d tokens",
		    (long long)e->ne[1], tok_n_vocab(m->tok));
		goto out;
	}
	if ((rc = bind(&bd, "token_embd.weight", D_EMBD, D_VOCAB, 1, &m->tok_embd, err)) ||
	    (rc = bind(&bd, "output_norm.weight", D_EMBD, D_1, 1, &m->out_norm, err)) ||
	    (rc = bind(&bd, "output.weight", D_EMBD, D_VOCAB, 0, &m->output, err)))
		goto out;
	if (m->output == NULL || m->hp.tied_embd) {
		m->output = m->tok_embd;
		m->hp.tied_embd = 1;
	}
	m->layers = xcalloc((size_t)m->hp.n_layer, sizeof *m->layers);
	m->experts = xcalloc((size_t)m->hp.n_layer * 3 * (size_t)m->hp.n_expert + 1, sizeof *m->experts);
	for (l = 0; l < m->hp.n_layer && rc == 0; l++)
		rc = bind_layer(&bd, l, &m->layers[l], err);
out:
	free(bd.by_name);
	return rc;
}

char *
model_file_name(const char *path)
{
	const char *b;
	size_t n = strlen(path);

	while (n > 1 && path[n - 1] == '/')
		n--;
	for (b = path + n; b > path && b[-1] != '/'; b--)
		;
	n -= (size_t)(b - path);
	if (n > 5 && memcmp(b + n - 5, ".gguf", 5) == 0)
		n -= 5;
	return xstrndup(b, n);
}

int
model_open(const char *path, struct model_desc **out, char *err)
{
	struct model_desc *m = xcalloc(1, sizeof *m);
	struct stat st;
	int64_t i;
	int rc;

	m->path = xstrdup(path);
	m->file_type = -1;
	if (stat(path, &st) != 0)
		rc = err_set(err, ERR_NOTFOUND, "%s: no such file or directory", path);
	else
		rc = S_ISDIR(st.st_mode) ? open_hf(m, err) : open_gguf(m, err);
	if (rc == 0)
		rc = bind_all(m, err);
	if (rc != 0) {
		model_close(m);
		return rc;
	}
	if (m->name == NULL)
		m->name = model_file_name(path);
	for (i = 0; i < m->n_tensors; i++)
		m->weight_bytes += m->tensors[i].bytes;
	*out = m;
	return 0;
}

void
model_close(struct model_desc *m)
{
	int64_t i;

	if (m == NULL)
		return;
	for (i = 0; i < m->n_tensors; i++)
		free((char *)m->tensors[i].name);
	free(m->tensors);
	free(m->experts);
	for (i = 0; i < m->n_owned; i++)
		free(m->owned[i]);
	free(m->owned);
	free(m->layers);
	embed_close(&m->embed);
	tok_free(m->tok);
	if (m->format == MODEL_GGUF)
		gguf_close(m->file);
	else
		st_close(m->file);
	free(m->chat_error);
	free(m->name);
	free(m->path);
	free(m);
}

uint64_t
model_expert_bytes(const struct model_desc *m, int l)
{
	const struct model_layer *L = &m->layers[l];
	uint64_t all = 0;

	for (int e = 0; e < m->hp.n_expert; e++)
		all += L->exp_gate[e].bytes + L->exp_up[e].bytes + L->exp_down[e].bytes;
	return m->hp.n_expert > 0 ? all / (uint64_t)m->hp.n_expert * (uint64_t)m->hp.n_expert_used : 0;
}

uint64_t
model_n_params(const struct model_desc *m)
{
	uint64_t n = 0, elems;
	int64_t i;
	int d;

	for (i = 0; i < m->n_tensors; i++) {
		for (elems = 1, d = 0; d < m->tensors[i].n_dims; d++)
			elems *= (uint64_t)m->tensors[i].ne[d];
		n += elems;
	}
	return n;
}

/* Orders type uses by bytes, most first (then by type id, for a stable order). */
static int
cmp_use(const void *a, const void *b)
{
	const struct model_type_use *x = a, *y = b;

	if (x->bytes != y->bytes)
		return x->bytes < y->bytes ? 1 : -1;
	return x->type < y->type ? -1 : x->type > y->type;
}

size_t
model_tensor_types(const struct model_desc *m, struct model_type_use **out)
{
	struct model_type_use all[TT_COUNT_] = { { 0 } };
	size_t n = 0;
	uint32_t t;
	int64_t i;

	for (i = 0; i < m->n_tensors; i++) {
		t = m->tensors[i].type;    /* model_open refused the types quant_traits does not know */
		all[t].type = t;
		all[t].name = quant_traits(t)->name;
		all[t].tensors++;
		all[t].bytes += m->tensors[i].bytes;
	}
	for (t = 0; t < TT_COUNT_; t++)
		if (all[t].tensors > 0)
			all[n++] = all[t];
	qsort(all, n, sizeof *all, cmp_use);
	*out = xmalloc((n ? n : 1) * sizeof **out);
	memcpy(*out, all, n * sizeof *all);
	return n;
}

const char *
model_quantization(const struct model_desc *m)
{
	const char *name = m->file_type >= 0 ? quant_file_type_name((uint32_t)m->file_type) : NULL;
	struct model_type_use *uses;

	if (name != NULL)
		return name;
	name = model_tensor_types(m, &uses) > 0 ? uses[0].name : "";
	free(uses);
	return name;
}
