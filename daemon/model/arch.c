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

#define MAX_LAYERS 1024
#define MAX_DIM (1 << 20)

static const char *const arch_names[] = {
	[ARCH_LLAMA] = "llama", [ARCH_QWEN2] = "qwen2", [ARCH_QWEN3] = "qwen3",
	[ARCH_GEMMA3] = "gemma3",
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
	return hp->sliding_window > 0 && hp->swa_period > 0 && (l + 1) % hp->swa_period != 0;
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
	switch (a) {
	case ARCH_LLAMA:
		break;
	case ARCH_QWEN2:
		hp->qkv_bias = 1;
		break;
	case ARCH_QWEN3:
		hp->qk_norm = 1;
		break;
	case ARCH_GEMMA3:
		hp->qk_norm = 1;
		hp->sandwich_norm = 1;
		hp->gelu = 1;
		hp->swa_period = 6;
		hp->rope_theta_local = 10000.0f;
		hp->norm_eps = 1e-6f;
		break;
	}
}

/* Values derived once the sizes are known; checks they are sane. */
static int
hparams_finish(struct model_hparams *hp, enum model_arch a, char *err)
{
	if (hp->n_embd <= 0 || hp->n_embd > MAX_DIM || hp->n_layer <= 0 || hp->n_layer > MAX_LAYERS ||
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
	if (hp->n_ctx_train <= 0)
		hp->n_ctx_train = 4096;
	return 0;
}

/* ---- GGUF ---- */

/* Reads "<arch>.<key>" as an int32; missing keys keep *v if !required. */
static int
gguf_hp_i32(const struct gguf_file *f, const char *arch, const char *key, int32_t *v,
    int required, char *err)
{
	char full[128];
	int64_t x;
	int rc;

	snprintf(full, sizeof full, "%s.%s", arch, key);
	rc = gguf_get_i64(f, full, &x, err);
	if (rc == ERR_NOTFOUND && !required)
		return 0;
	if (rc == ERR_NOTFOUND)
		return err_set(err, rc, "missing metadata key %s", full);
	if (rc != 0)
		return rc;
	if (x < 0 || x > INT32_MAX)
		return err_set(err, ERR_RANGE, "%s = %lld is out of range", full, (long long)x);
	*v = (int32_t)x;
	return 0;
}

/* Reads "<arch>.<key>" as a float if present. */
static int
gguf_hp_f32(const struct gguf_file *f, const char *arch, const char *key, float *v, char *err)
{
	char full[128];
	int rc;

	snprintf(full, sizeof full, "%s.%s", arch, key);
	rc = gguf_get_f32(f, full, v, err);
	return rc == ERR_NOTFOUND ? 0 : rc;
}

/* Hyperparameters from the <arch>.* keys. */
static int
gguf_hparams(const struct gguf_file *f, struct model_desc *m, char *err)
{
	struct model_hparams *hp = &m->hp;
	const char *a = arch_names[m->arch];
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
	    (rc = gguf_hp_f32(f, a, "rope.scaling.factor", &hp->rope_scale, err)))
		return rc;
	if (hp->rope_scale == 0)
		hp->rope_scale = 1.0f;
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
	if (tok_find(tok, "<|im_start|>") >= 0 && tok_find(tok, "<|im_end|>") >= 0)
		return CHAT_CHATML;
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
	int rc, a;

	if ((rc = gguf_open(m->path, &f, err)) != 0)
		return rc;
	m->file = f;
	m->format = MODEL_GGUF;
	if ((rc = gguf_get_str(f, "general.architecture", &s, err)) != 0)
		return rc == ERR_NOTFOUND ? err_set(err, ERR_FORMAT, "general.architecture is missing") : rc;
	arch = xstrndup(s.s, (size_t)s.n);
	a = model_arch_from_name(arch);
	if (a < 0) {
		rc = err_set(err, ERR_UNSUPPORTED,
		    "architecture '%.40s' is not supported (llama, qwen2, qwen3, gemma3 are)", arch);
		free(arch);
		return rc;
	}
	free(arch);
	m->arch = (enum model_arch)a;
	if (gguf_get_str(f, "general.name", &s, NULL) == 0)
		m->name = xstrndup(s.s, (size_t)s.n);
	if (gguf_get_u32(f, "general.file_type", &file_type, NULL) == 0)
		m->file_type = file_type;
	if ((rc = gguf_hparams(f, m, err)) != 0)
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
		{ "llama", ARCH_LLAMA }, { "mistral", ARCH_LLAMA }, { "qwen2", ARCH_QWEN2 },
		{ "qwen3", ARCH_QWEN3 }, { "gemma3_text", ARCH_GEMMA3 },
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
	return err_set(err, ERR_UNSUPPORTED,
	    "model_type '%.40s' is not supported (llama, mistral, qwen2, qwen3, gemma3_text are)", t);
}

/* rope_scaling {"rope_type": "linear", "factor": f}; others are refused. */
static int
hf_rope_scaling(json_t *cfg, struct model_hparams *hp, char *err)
{
	json_t *rs = json_object_get(cfg, "rope_scaling");
	const char *type;

	if (rs == NULL || json_is_null(rs))
		return 0;
	type = json_string_value(json_object_get(rs, "rope_type"));
	if (type == NULL)
		type = json_string_value(json_object_get(rs, "type"));
	if (type == NULL || strcmp(type, "linear") != 0)
		return err_set(err, ERR_UNSUPPORTED, "config.json: rope_scaling type '%s' is not supported",
		    type ? type : "?");
	return json_f32(rs, "factor", &hp->rope_scale, err);
}

/* One RoPE object of rope_parameters: its base, and a linear scaling if it has one. */
static int
hf_rope_object(json_t *o, float *theta, float *scale, char *err)
{
	const char *type = json_string_value(json_object_get(o, "rope_type"));
	int rc;

	if (o == NULL)
		return 0;
	if ((rc = json_f32(o, "rope_theta", theta, err)) != 0)
		return rc;
	if (type == NULL || strcmp(type, "default") == 0)
		return 0;
	if (strcmp(type, "linear") != 0)
		return err_set(err, ERR_UNSUPPORTED, "config.json: rope_parameters type '%s' is not supported",
		    type);
	return json_f32(o, "factor", scale, err);
}

/*
 * transformers 5 writes rope_parameters instead of rope_theta and
 * rope_scaling: {"rope_type", "rope_theta", "factor"}, or for Gemma 3 one
 * such object per layer type ("full_attention", "sliding_attention").
 */
static int
hf_rope_parameters(json_t *cfg, struct model_hparams *hp, char *err)
{
	json_t *rp = json_object_get(cfg, "rope_parameters");
	json_t *full = json_object_get(rp, "full_attention"), *local = json_object_get(rp, "sliding_attention");
	int rc;

	if (full == NULL && local == NULL)
		return hf_rope_object(rp, &hp->rope_theta, &hp->rope_scale, err);
	if ((rc = hf_rope_object(full, &hp->rope_theta, &hp->rope_scale, err)) != 0)
		return rc;
	return json_f32(local, "rope_theta", &hp->rope_theta_local, err);
}

/* Hyperparameters from config.json. */
static int
hf_hparams(json_t *cfg, struct model_desc *m, char *err)
{
	struct model_hparams *hp = &m->hp;
	json_t *tie = json_object_get(cfg, "tie_word_embeddings");
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
	    (rc = json_f32(cfg, "rms_norm_eps", &hp->norm_eps, err)) ||
	    (rc = json_f32(cfg, "rope_theta", &hp->rope_theta, err)) ||
	    (rc = json_f32(cfg, "query_pre_attn_scalar", &qpas, err)) ||
	    (rc = hf_rope_scaling(cfg, hp, err)))
		return rc;
	if (m->arch == ARCH_GEMMA3) {
		if ((rc = json_i32(cfg, "sliding_window", &hp->sliding_window, err)) ||
		    (rc = json_i32(cfg, "sliding_window_pattern", &hp->swa_period, err)) ||
		    (rc = json_f32(cfg, "rope_local_base_freq", &hp->rope_theta_local, err)))
			return rc;
		hp->norm_offset = 1.0f; /* HF Gemma norms compute x * (1 + w) */
		if (qpas > 0)
			hp->attn_scale = 1.0f / sqrtf(qpas);
	}
	if ((rc = hf_rope_parameters(cfg, hp, err)) != 0)
		return rc;
	if (m->arch == ARCH_QWEN2 && json_is_boolean(json_object_get(cfg, "attention_bias")))
		hp->qkv_bias = json_is_true(json_object_get(cfg, "attention_bias"));
	if (m->arch == ARCH_LLAMA && json_is_true(json_object_get(cfg, "attention_bias")))
		return err_set(err, ERR_UNSUPPORTED, "config.json: llama with attention_bias is not supported");
	hp->tied_embd = tie == NULL ? m->arch == ARCH_GEMMA3 : json_is_true(tie);
	return hparams_finish(hp, m->arch, err);
}

/* Hugging Face and GGUF names of the per-layer weights, after "model.layers.N." / "blk.N.". */
static const struct { const char *hf, *gguf; } layer_names[] = {
	{ "input_layernorm.weight", "attn_norm.weight" },
	{ "self_attn.q_proj.weight", "attn_q.weight" },
	{ "self_attn.k_proj.weight", "attn_k.weight" },
	{ "self_attn.v_proj.weight", "attn_v.weight" },
	{ "self_attn.o_proj.weight", "attn_output.weight" },
	{ "self_attn.q_proj.bias", "attn_q.bias" },
	{ "self_attn.k_proj.bias", "attn_k.bias" },
	{ "self_attn.v_proj.bias", "attn_v.bias" },
	{ "self_attn.q_norm.weight", "attn_q_norm.weight" },
	{ "self_attn.k_norm.weight", "attn_k_norm.weight" },
	{ "pre_feedforward_layernorm.weight", "ffn_norm.weight" },
	{ "post_feedforward_layernorm.weight", "post_ffw_norm.weight" },
	{ "mlp.gate_proj.weight", "ffn_gate.weight" },
	{ "mlp.up_proj.weight", "ffn_up.weight" },
	{ "mlp.down_proj.weight", "ffn_down.weight" },
	/* the norm after attention feeds the FFN in llama/qwen; gemma has both */
	{ "post_attention_layernorm.weight", "ffn_norm.weight" },
	{ "post_attention_layernorm.weight", "post_attention_norm.weight" },
};

static const struct { const char *hf, *gguf; } global_names[] = {
	{ "model.embed_tokens.weight", "token_embd.weight" },
	{ "model.norm.weight", "output_norm.weight" },
	{ "lm_head.weight", "output.weight" },
};

/* Whether the pair of layer_names[i] applies to the family (the two post_attention rows differ). */
static int
layer_name_applies(size_t i, enum model_arch a)
{
	if (strcmp(layer_names[i].hf, "post_attention_layernorm.weight") == 0)
		return (a == ARCH_GEMMA3) == (strcmp(layer_names[i].gguf, "post_attention_norm.weight") == 0);
	if (strcmp(layer_names[i].hf, "pre_feedforward_layernorm.weight") == 0 ||
	    strcmp(layer_names[i].hf, "post_feedforward_layernorm.weight") == 0)
		return a == ARCH_GEMMA3;
	return 1;
}

/* Translates a weight name between the two conventions; NULL for names we do not use. */
static char *
translate_name(const char *name, enum model_arch a, int to_gguf)
{
	const char *layer_fmt = to_gguf ? "model.layers.%d.%n" : "blk.%d.%n";
	const char *out_fmt = to_gguf ? "blk.%d.%s" : "model.layers.%d.%s";
	char buf[256];
	int layer, n = 0;
	size_t i;

	for (i = 0; i < ARRAY_LEN(global_names); i++)
		if (strcmp(name, to_gguf ? global_names[i].hf : global_names[i].gguf) == 0)
			return xstrdup(to_gguf ? global_names[i].gguf : global_names[i].hf);
	if (sscanf(name, layer_fmt, &layer, &n) != 1 || n == 0 || layer < 0)
		return NULL;
	for (i = 0; i < ARRAY_LEN(layer_names); i++) {
		if (layer_name_applies(i, a) &&
		    strcmp(name + n, to_gguf ? layer_names[i].hf : layer_names[i].gguf) == 0) {
			snprintf(buf, sizeof buf, out_fmt, layer,
			    to_gguf ? layer_names[i].gguf : layer_names[i].hf);
			return xstrdup(buf);
		}
	}
	return NULL;
}

char *
model_name_from_hf(const char *hf, enum model_arch a)
{
	return translate_name(hf, a, 1);
}

char *
model_name_to_hf(const char *gguf, enum model_arch a)
{
	return translate_name(gguf, a, 0);
}

/* Copies the safetensors directory into model tensors under GGUF names. */
static void
hf_tensors(const struct st_model *st, struct model_desc *m)
{
	int64_t i, n = st_n_tensors(st);
	char *name;

	m->tensors = xcalloc((size_t)(n ? n : 1), sizeof *m->tensors);
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
	json_decref(cfg);
	if (rc != 0)
		return rc;
	if ((rc = st_open_dir(m->path, &st, err)) != 0)
		return rc;
	m->file = st;
	hf_tensors(st, m);
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
enum dim { D_1, D_EMBD, D_Q, D_KV, D_FF, D_HEAD, D_VOCAB };

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
	default: return 1;
	}
}

/* Finds a tensor by name (linear: done once per weight at load). */
static const struct model_tensor *
find_tensor(const struct model_desc *m, const char *name)
{
	int64_t i;

	for (i = 0; i < m->n_tensors; i++)
		if (strcmp(m->tensors[i].name, name) == 0)
			return &m->tensors[i];
	return NULL;
}

/* Looks a weight up and checks its shape; a missing optional weight is NULL. */
static int
bind(const struct model_desc *m, const char *name, enum dim d0, enum dim d1, int required,
    const struct model_tensor **out, char *err)
{
	const struct model_tensor *t = find_tensor(m, name);
	int64_t e0 = dim_value(&m->hp, d0), e1 = dim_value(&m->hp, d1);

	*out = t;
	if (t == NULL)
		return required ? err_set(err, ERR_FORMAT, "tensor %s is missing", name) : 0;
	if (t->ne[0] != e0 || t->ne[1] != e1 || t->ne[2] != 1 || t->ne[3] != 1)
		return err_set(err, ERR_FORMAT, "tensor %s has shape [%lld, %lld, %lld], expected [%lld, %lld]",
		    name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
		    (long long)e0, (long long)e1);
	return 0;
}

/* The weights of layer l. */
static int
bind_layer(const struct model_desc *m, int l, struct model_layer *L, char *err)
{
	const struct model_hparams *hp = &m->hp;
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
		{ "attn_q_norm.weight", offsetof(struct model_layer, q_norm), D_HEAD, D_1, hp->qk_norm },
		{ "attn_k_norm.weight", offsetof(struct model_layer, k_norm), D_HEAD, D_1, hp->qk_norm },
		{ "post_attention_norm.weight", offsetof(struct model_layer, post_attn_norm), D_EMBD, D_1,
		    hp->sandwich_norm },
		{ "ffn_norm.weight", offsetof(struct model_layer, ffn_norm), D_EMBD, D_1, 1 },
		{ "ffn_gate.weight", offsetof(struct model_layer, w_gate), D_EMBD, D_FF, 1 },
		{ "ffn_up.weight", offsetof(struct model_layer, w_up), D_EMBD, D_FF, 1 },
		{ "ffn_down.weight", offsetof(struct model_layer, w_down), D_FF, D_EMBD, 1 },
		{ "post_ffw_norm.weight", offsetof(struct model_layer, post_ffn_norm), D_EMBD, D_1,
		    hp->sandwich_norm },
	};
	char name[96];
	size_t i;
	int rc;

	for (i = 0; i < ARRAY_LEN(w); i++) {
		snprintf(name, sizeof name, "blk.%d.%s", l, w[i].suffix);
		rc = bind(m, name, w[i].d0, w[i].d1, w[i].required,
		    (const struct model_tensor **)((char *)L + w[i].field), err);
		if (rc != 0)
			return rc;
	}
	/* only the families that define them use them */
	if (!hp->qkv_bias)
		L->bq = L->bk = L->bv = NULL;
	if (!hp->qk_norm)
		L->q_norm = L->k_norm = NULL;
	return 0;
}

/* Binds every weight the architecture uses. */
static int
bind_all(struct model_desc *m, char *err)
{
	const struct model_tensor *e = find_tensor(m, "token_embd.weight");
	int l, rc;

	if (e == NULL)
		return err_set(err, ERR_FORMAT, "tensor token_embd.weight is missing");
	m->hp.n_vocab = (int32_t)e->ne[1];
	if (e->ne[1] > INT32_MAX || e->ne[1] != tok_n_vocab(m->tok))
		return err_set(err, ERR_FORMAT, "the embedding has %lld rows but the tokenizer %d tokens",
		    (long long)e->ne[1], tok_n_vocab(m->tok));
	if ((rc = bind(m, "token_embd.weight", D_EMBD, D_VOCAB, 1, &m->tok_embd, err)) ||
	    (rc = bind(m, "output_norm.weight", D_EMBD, D_1, 1, &m->out_norm, err)) ||
	    (rc = bind(m, "output.weight", D_EMBD, D_VOCAB, 0, &m->output, err)))
		return rc;
	if (m->output == NULL || m->hp.tied_embd) {
		m->output = m->tok_embd;
		m->hp.tied_embd = 1;
	}
	m->layers = xcalloc((size_t)m->hp.n_layer, sizeof *m->layers);
	for (l = 0; l < m->hp.n_layer; l++)
		if ((rc = bind_layer(m, l, &m->layers[l], err)) != 0)
			return rc;
	return 0;
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
	free(m->layers);
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
