/*
 * convert.c: Hugging Face layouts that are not GGUF's, turned into GGUF's
 * at load. The engine then sees one layout whatever the file; the price is
 * a copy of the converted weights in memory, paid only by the few
 * checkpoints that need it (gpt-oss in float: its published MXFP4 files
 * come as GGUF).
 */
#include "config.h"
#include "convert.h"
#include "quant.h"
#include "safetensors.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of one element of a (float) safetensors tensor. */
static size_t
elem_bytes(const struct st_tensor *t)
{
	return (size_t)quant_traits(t->type)->block_bytes;
}

/* The layer's tensor name.suffix, or NULL. */
static const struct st_tensor *
layer_tensor(const struct st_model *st, int layer, const char *suffix)
{
	char name[128];

	snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", layer, suffix);
	return st_find(st, name);
}

/* A new output tensor of ne (GGML order) and the source's type; its buffer, or NULL when out of memory. */
static void *
out_tensor(struct convert_out *out, int layer, const char *suffix, const struct st_tensor *src, int n_dims,
    int64_t ne0, int64_t ne1, int64_t ne2)
{
	struct model_tensor *t = &out->t[out->n];
	size_t es = elem_bytes(src);
	char name[128];

	snprintf(name, sizeof name, "blk.%d.%s", layer, suffix);
	memset(t, 0, sizeof *t);
	t->type = src->type;
	t->n_dims = n_dims;
	t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2, t->ne[3] = 1;
	t->bytes = (size_t)ne0 * (size_t)ne1 * (size_t)ne2 * es;
	if ((out->buf[out->n] = malloc(t->bytes ? t->bytes : 1)) == NULL)
		return NULL;
	t->name = xstrdup(name);
	t->data = out->buf[out->n];
	return out->buf[out->n++];
}

/*
 * Each of src's E row-major A x B matrices transposed into a B/stride x A
 * one of dst, keeping src's columns off, off + stride, ...; es bytes an
 * element.
 */
static void
transpose_take(uint8_t *dst, const uint8_t *src, int64_t E, int64_t A, int64_t B, int stride, int off, size_t es)
{
	int64_t bo = B / stride;

	for (int64_t e = 0; e < E; e++)
		for (int64_t b = 0; b < bo; b++)
			for (int64_t a = 0; a < A; a++)
				memcpy(dst + (((size_t)e * (size_t)bo + (size_t)b) * (size_t)A + (size_t)a) * es,
				    src + (((size_t)e * (size_t)A + (size_t)a) * (size_t)B + (size_t)(b * stride + off)) * es, es);
}

/* Every stride-th element from off of each of n rows of w elements. */
static void
take_every(uint8_t *dst, const uint8_t *src, int64_t n, int64_t w, int stride, int off, size_t es)
{
	for (int64_t r = 0; r < n; r++)
		for (int64_t c = 0; c < w / stride; c++)
			memcpy(dst + ((size_t)r * (size_t)(w / stride) + (size_t)c) * es,
			    src + ((size_t)r * (size_t)w + (size_t)(c * stride + off)) * es, es);
}

/* Frees what a failed conversion made. */
static int
fail(struct convert_out *out, int rc)
{
	for (int i = 0; i < out->n; i++) {
		free((char *)out->t[i].name);
		free(out->buf[i]);
	}
	out->n = 0;
	return rc;
}

int
convert_gptoss_experts(const struct st_model *st, int layer, struct convert_out *out, char *err)
{
	const struct st_tensor *gu = layer_tensor(st, layer, "gate_up_proj");
	const struct st_tensor *gub = layer_tensor(st, layer, "gate_up_proj_bias");
	const struct st_tensor *dn = layer_tensor(st, layer, "down_proj");
	int64_t E, H, I2;
	void *g, *u, *d, *gb, *ub;

	out->n = 0;
	if (gu == NULL && dn == NULL)
		return 0;
	if (gu == NULL || dn == NULL || gub == NULL)
		return err_set(err, ERR_FORMAT, "layer %d: gate_up_proj, its bias and down_proj come together", layer);
	/* GGML order: gate_up_proj [2I, H, E], down_proj [H, I, E], the bias [2I, E] */
	I2 = gu->ne[0], H = gu->ne[1], E = gu->ne[2];
	if (gu->n_dims != 3 || I2 % 2 != 0 || dn->n_dims != 3 || dn->ne[0] != H || dn->ne[1] != I2 / 2 ||
	    dn->ne[2] != E || gub->n_dims != 2 || gub->ne[0] != I2 || gub->ne[1] != E)
		return err_set(err, ERR_FORMAT, "layer %d: the experts' gate_up_proj [%lld, %lld, %lld], its bias and "
		    "down_proj do not fit together", layer, (long long)E, (long long)H, (long long)I2);
	if ((g = out_tensor(out, layer, "ffn_gate_exps.weight", gu, 3, H, I2 / 2, E)) == NULL ||
	    (u = out_tensor(out, layer, "ffn_up_exps.weight", gu, 3, H, I2 / 2, E)) == NULL ||
	    (d = out_tensor(out, layer, "ffn_down_exps.weight", dn, 3, I2 / 2, H, E)) == NULL ||
	    (gb = out_tensor(out, layer, "ffn_gate_exps.bias", gub, 2, I2 / 2, E, 1)) == NULL ||
	    (ub = out_tensor(out, layer, "ffn_up_exps.bias", gub, 2, I2 / 2, E, 1)) == NULL)
		return fail(out, err_set(err, ERR_NOMEM, "layer %d: out of memory converting the experts", layer));
	transpose_take(g, gu->data, E, H, I2, 2, 0, elem_bytes(gu));
	transpose_take(u, gu->data, E, H, I2, 2, 1, elem_bytes(gu));
	transpose_take(d, dn->data, E, I2 / 2, H, 1, 0, elem_bytes(dn));
	take_every(gb, gub->data, E, I2, 2, 0, elem_bytes(gub));
	take_every(ub, gub->data, E, I2, 2, 1, elem_bytes(gub));
	return 0;
}
