/*
 * embed.c: an embedding model's pooling, Dense modules and normalisation,
 * from sentence-transformers' files or GGUF keys (embed.h), and the host
 * side of making its vectors.
 */
#include "config.h"
#include "embed.h"
#include "gguf.h"
#include "quant.h"
#include "safetensors.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_DENSE_DIM (1 << 16)

/* A Dense module's weights, rows of n_in elements of a stored type, into floats. */
static int
dense_load(struct model_dense *d, uint32_t type, const int64_t *ne, const void *data, const char *what, char *err)
{
	size_t row;

	if (ne[0] < 1 || ne[1] < 1 || ne[0] > MAX_DENSE_DIM || ne[1] > MAX_DENSE_DIM || ne[2] != 1 || ne[3] != 1)
		return err_set(err, ERR_FORMAT, "%s has shape [%lld, %lld]: not a Dense module's matrix", what,
		    (long long)ne[0], (long long)ne[1]);
	if (quant_row_bytes(type, ne[0], &row) != 0)
		return err_set(err, ERR_UNSUPPORTED, "%s: rows of %lld of type %u are not supported", what,
		    (long long)ne[0], type);
	d->n_in = (int32_t)ne[0];
	d->n_out = (int32_t)ne[1];
	d->w = xmalloc((size_t)ne[0] * (size_t)ne[1] * sizeof *d->w);
	for (int64_t r = 0; r < ne[1]; r++)
		quant_dequantize(type, (const uint8_t *)data + (size_t)r * row, d->w + r * ne[0], ne[0]);
	return 0;
}

/* The vectors' width once the modules are known; checks that each Dense takes what the one before gives. */
static int
embed_chain(struct model_desc *m, char *err)
{
	int32_t n = m->hp.n_embd;

	for (int i = 0; i < m->embed.n_dense; i++) {
		if (m->embed.dense[i].n_in != n)
			return err_set(err, ERR_FORMAT, "Dense module %d takes %d features, but is given %d", i + 1,
			    m->embed.dense[i].n_in, n);
		n = m->embed.dense[i].n_out;
	}
	m->embed.n_out = n;
	return 0;
}

/* ---- sentence-transformers ---- */

/* The module type's last name ("sentence_transformers.models.Pooling" -> "Pooling"). */
static const char *
module_kind(const char *type)
{
	const char *dot = strrchr(type, '.');

	return dot ? dot + 1 : type;
}

/* A JSON file of the directory, or NULL with err. */
static json_t *
load_json(const char *dir, const char *sub, const char *name, char *err)
{
	char path[4096];
	json_error_t jerr;
	json_t *j;

	snprintf(path, sizeof path, "%s/%s%s%s", dir, sub, sub[0] ? "/" : "", name);
	if ((j = json_load_file(path, 0, &jerr)) == NULL)
		err_set(err, ERR_FORMAT, "%s: %s", path, jerr.text);
	return j;
}

/* Pooling's config.json: pooling_mode ("mean", "cls", "lasttoken"), or the older pooling_mode_* flags. */
static int
pooling_config(struct model_desc *m, const char *sub, char *err)
{
	static const struct { const char *mode, *flag; enum pool_kind pool; } modes[] = {
		{ "mean", "pooling_mode_mean_tokens", POOL_MEAN },
		{ "cls", "pooling_mode_cls_token", POOL_CLS },
		{ "lasttoken", "pooling_mode_lasttoken", POOL_LAST },
	};
	static const char *const others[] = { "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
		"pooling_mode_weightedmean_tokens" };
	json_t *c = load_json(m->path, sub, "config.json", err);
	const char *mode;
	int rc = 0, n = 0;

	if (c == NULL)
		return ERR_FORMAT;
	mode = json_string_value(json_object_get(c, "pooling_mode"));
	for (size_t i = 0; i < ARRAY_LEN(modes); i++)
		if ((mode != NULL && strcmp(mode, modes[i].mode) == 0) || json_is_true(json_object_get(c, modes[i].flag))) {
			m->embed.pool = modes[i].pool;
			n++;
		}
	for (size_t i = 0; i < ARRAY_LEN(others); i++)
		n += json_is_true(json_object_get(c, others[i])) ? 2 : 0;
	if (n != 1)
		rc = err_set(err, ERR_UNSUPPORTED, "%s/%s/config.json: the pooling must be one of mean, cls and lasttoken "
		    "(%s)", m->path, sub, mode ? mode : "another, or several");
	json_decref(c);
	return rc;
}

/* A Dense module's config.json (activation Identity or Tanh) and model.safetensors (linear.weight, .bias). */
static int
dense_module(struct model_desc *m, const char *sub, char *err)
{
	struct model_dense *d = &m->embed.dense[m->embed.n_dense];
	json_t *c = load_json(m->path, sub, "config.json", err);
	const char *act;
	const struct st_tensor *w, *b;
	struct st_model *st = NULL;
	char path[4096];
	int rc;

	if (c == NULL)
		return ERR_FORMAT;
	if (m->embed.n_dense == MODEL_MAX_DENSE) {
		json_decref(c);
		return err_set(err, ERR_UNSUPPORTED, "%s: more than %d Dense modules", m->path, MODEL_MAX_DENSE);
	}
	act = json_string_value(json_object_get(c, "activation_function"));
	/* sentence-transformers' default is Tanh */
	d->tanh = act == NULL || strcmp(module_kind(act), "Tanh") == 0;
	rc = act == NULL || d->tanh || strcmp(module_kind(act), "Identity") == 0 ? 0 :
	    err_set(err, ERR_UNSUPPORTED, "%s/%s: activation %.100s is not supported (Identity, Tanh)", m->path, sub, act);
	json_decref(c);
	snprintf(path, sizeof path, "%s/%s/model.safetensors", m->path, sub);
	if (rc != 0 || (rc = st_open_file(path, &st, err)) != 0)
		return rc;
	if ((w = st_find(st, "linear.weight")) == NULL)
		rc = err_set(err, ERR_FORMAT, "%s: no linear.weight", path);
	else
		rc = dense_load(d, w->type, w->ne, w->data, path, err);
	if (rc == 0 && (b = st_find(st, "linear.bias")) != NULL) {
		if (b->n_elems != d->n_out)
			rc = err_set(err, ERR_FORMAT, "%s: linear.bias has %lld elements, not %d", path, (long long)b->n_elems,
			    d->n_out);
		else
			quant_dequantize(b->type, b->data, d->b = xmalloc((size_t)d->n_out * sizeof *d->b), d->n_out);
	}
	m->embed.n_dense++;
	st_close(st);
	return rc;
}

/* One module of modules.json. */
static int
st_module(struct model_desc *m, json_t *mod, char *err)
{
	const char *type = json_string_value(json_object_get(mod, "type"));
	const char *sub = json_string_value(json_object_get(mod, "path"));
	const char *kind;

	if (type == NULL || sub == NULL || strstr(sub, "..") != NULL || strchr(sub, '/') != NULL)
		return err_set(err, ERR_FORMAT, "%s/modules.json: a module without type and path (a directory of the "
		    "model's)", m->path);
	kind = module_kind(type);
	if (strcmp(kind, "Transformer") == 0)
		return 0;
	if (strcmp(kind, "Pooling") == 0)
		return m->embed.pool != POOL_NONE ? err_set(err, ERR_UNSUPPORTED, "%s: two Pooling modules", m->path) :
		    pooling_config(m, sub, err);
	if (m->embed.pool == POOL_NONE)
		return err_set(err, ERR_UNSUPPORTED, "%s/modules.json: %s before the Pooling module is not supported",
		    m->path, kind);
	if (strcmp(kind, "Dense") == 0)
		return dense_module(m, sub, err);
	if (strcmp(kind, "Normalize") == 0) {
		m->embed.normalize = 1;
		return 0;
	}
	return err_set(err, ERR_UNSUPPORTED, "%s/modules.json: module %.100s is not supported (Transformer, Pooling, "
	    "Dense, Normalize are)", m->path, type);
}

int
embed_open_hf(struct model_desc *m, json_t *cfg, char *err)
{
	char path[4096];
	struct stat st;
	json_t *mods;
	size_t i;
	int rc = 0;

	m->embed.bidirectional = json_is_true(json_object_get(cfg, "use_bidirectional_attention"));
	snprintf(path, sizeof path, "%s/modules.json", m->path);
	if (stat(path, &st) != 0)
		return 0;
	if ((mods = load_json(m->path, "", "modules.json", err)) == NULL)
		return ERR_FORMAT;
	if (!json_is_array(mods))
		rc = err_set(err, ERR_FORMAT, "%s: not an array of modules", path);
	for (i = 0; rc == 0 && i < json_array_size(mods); i++)
		rc = st_module(m, json_array_get(mods, i), err);
	json_decref(mods);
	return rc != 0 ? rc : embed_chain(m, err);
}

/* ---- GGUF ---- */

int
embed_open_gguf(struct model_desc *m, const struct gguf_file *f, const char *prefix, int bidirectional, char *err)
{
	static const char *const dense[] = { "dense_2.weight", "dense_3.weight" };
	int32_t pool = bidirectional ? POOL_MEAN : POOL_NONE;
	const struct gguf_tensor *t;
	char key[128];
	int causal = 1, rc;

	snprintf(key, sizeof key, "%s.attention.causal", prefix);
	if ((rc = gguf_hp_i32(f, prefix, "pooling_type", &pool, 0, err)) != 0 ||
	    ((rc = gguf_get_bool(f, key, &causal, err)) != 0 && rc != ERR_NOTFOUND))
		return rc;
	m->embed.bidirectional = bidirectional || !causal;
	if (pool == POOL_NONE)
		return m->embed.bidirectional ? err_set(err, ERR_UNSUPPORTED, "%s: bidirectional attention without a "
		    "pooling type (%s.pooling_type) makes no vectors", m->path, prefix) : 0;
	if (pool > POOL_LAST)
		return err_set(err, ERR_UNSUPPORTED, "%s.pooling_type %d is not supported (1 mean, 2 cls, 3 last)", prefix,
		    (int)pool);
	m->embed.pool = (enum pool_kind)pool;
	m->embed.normalize = 1;
	for (size_t i = 0; i < ARRAY_LEN(dense); i++) {
		if ((t = gguf_find_tensor(f, dense[i])) == NULL)
			continue;
		if ((rc = dense_load(&m->embed.dense[m->embed.n_dense], t->type, t->ne, t->data, dense[i], err)) != 0)
			return rc;
		m->embed.n_dense++;
	}
	return embed_chain(m, err);
}

void
embed_close(struct model_embed *e)
{
	for (int i = 0; i < e->n_dense; i++)
		free(e->dense[i].w), free(e->dense[i].b);
	memset(e, 0, sizeof *e);
}

/* ---- vectors ---- */

size_t
embed_scratch(const struct model_embed *e, int32_t n_embd)
{
	int32_t n = n_embd;

	for (int i = 0; i < e->n_dense; i++)
		n = MAX(n, e->dense[i].n_out);
	return 2 * (size_t)n;
}

/*
 * w . x over n floats in eight running sums, which the compiler keeps in
 * vector registers (about seven times a double sum's speed: EmbeddingGemma's
 * two Dense modules take 0.6 ms an input, not 4, on the engine thread).
 */
static float
dot8(const float *w, const float *x, int32_t n)
{
	float acc[8] = { 0 }, s = 0;
	int32_t i;

	for (i = 0; i + 8 <= n; i += 8)
		for (int k = 0; k < 8; k++)
			acc[k] += w[i + k] * x[i + k];
	for (; i < n; i++)
		s += w[i] * x[i];
	for (int k = 0; k < 8; k++)
		s += acc[k];
	return s;
}

/* y = act(W x + b) of one Dense module. */
static void
dense_apply(const struct model_dense *d, const float *x, float *y)
{
	for (int32_t r = 0; r < d->n_out; r++) {
		float s = dot8(d->w + (size_t)r * (size_t)d->n_in, x, d->n_in) + (d->b ? d->b[r] : 0.0f);

		y[r] = d->tanh ? tanhf(s) : s;
	}
}

/* Scales v to unit length (a zero vector stays zero). */
static void
l2_normalize(float *v, int32_t n)
{
	double s = 0;

	for (int32_t i = 0; i < n; i++)
		s += (double)v[i] * v[i];
	/* sentence-transformers' Normalize: x / max(|x|, 1e-12) */
	s = MAX(sqrt(s), 1e-12);
	for (int32_t i = 0; i < n; i++)
		v[i] = (float)(v[i] / s);
}

void
embed_finish(const struct model_embed *e, const float *pooled, int32_t n_embd, int32_t dims, float *out,
    float *scratch)
{
	const float *x = pooled;
	float *y = scratch;
	int32_t n = n_embd;

	for (int i = 0; i < e->n_dense; i++) {
		dense_apply(&e->dense[i], x, y);
		n = e->dense[i].n_out;
		x = y;
		y = y == scratch ? scratch + embed_scratch(e, n_embd) / 2 : scratch;
	}
	dims = dims > 0 ? MIN(dims, n) : n;
	memcpy(out, x, (size_t)dims * sizeof *out);
	/* normalised whole and then cut and normalised again is the cut normalised */
	if (e->normalize)
		l2_normalize(out, dims);
}
