/*
 * cpu_backend.c: the reference backend. One forward step over a batch of
 * sequences, straight from the stored weights, float32 activations and a
 * float32 KV pool. Written to be read next to the architecture definitions;
 * the speed comes from cpu_ops.c (SIMD) and cpu_pool.c (threads).
 */
#include "config.h"
#include "kernels.h"
#include "cpu_ffn.h"
#include "cpu_ops.h"
#include "cpu_pool.h"
#include "cpu_q8.h"
#include "fault.h"
#include "model.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 1-D weights as float, converted once at load (the feed-forward's are cpu_ffn's). */
struct cpu_layer {
	float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffn_norm;
	float *q_norm, *k_norm, *bq, *bk, *bv, *bo, *sinks;
};

struct backend {
	const struct model_desc *m;
	struct cpu_pool *pool;
	struct cpu_layer *layers;
	float *out_norm;
	float *freq[2];     /* RoPE frequencies of global and sliding layers (model_rope_freqs) */
	struct cpu_ffn *ffn;    /* every layer's feed-forward */
	int max_tokens;
	int exact;          /* float activations everywhere: the reference mode */
	/*
	 * KV pool: [block][layer][K|V][KV_BLOCK_TOKENS][n_head_kv * head_dim],
	 * each token's row floats or, with KV_Q8_0, q8_act32 blocks of 32
	 * (allocated as floats, addressed in bytes)
	 */
	float *kv;
	enum kv_type kv_type;
	int64_t kv_blocks;
	size_t kv_row;      /* bytes of one token's K (or V) of one layer */
	size_t kv_stride;   /* bytes of one block's K (or V) of one layer */
	/* activations, max_tokens rows each */
	float *x, *h, *q, *k, *v, *att, *ffn_out;
	float *mm_scratch;
	uint8_t *q8[2];     /* 8-bit copies of a product's input (fast mode); NULL: exact mode */
	float *scores;      /* per thread: the attention scores of one task (attn_task) */
	int64_t scores_len;
	/* per step: where each token sits */
	int32_t *tok_seq, *tok_pos;
};

/* The float copies of one layer's small weights. */
static void
load_layer(const struct model_layer *L, struct cpu_layer *c)
{
	c->attn_norm = cpu_to_float(L->attn_norm);
	c->ffn_norm = cpu_to_float(L->ffn_norm);
	c->post_attn_norm = cpu_to_float(L->post_attn_norm);
	c->post_ffn_norm = cpu_to_float(L->post_ffn_norm);
	c->q_norm = cpu_to_float(L->q_norm);
	c->k_norm = cpu_to_float(L->k_norm);
	c->bq = cpu_to_float(L->bq);
	c->bk = cpu_to_float(L->bk);
	c->bv = cpu_to_float(L->bv);
	c->bo = cpu_to_float(L->bo);
	c->sinks = cpu_to_float(L->sinks);
}

static void
free_layer(struct cpu_layer *c)
{
	free(c->attn_norm), free(c->ffn_norm), free(c->post_attn_norm), free(c->post_ffn_norm);
	free(c->q_norm), free(c->k_norm), free(c->bq), free(c->bk), free(c->bv), free(c->bo), free(c->sinks);
}

/* Allocates a zeroed array of n floats, refusing sizes that overflow. */
static float *
alloc_floats(size_t a, size_t b, char *err, int *rc)
{
	size_t n;
	float *p;

	if (mul_size(a, b, &n) != 0 || mul_size(n, sizeof(float), &n) != 0) {
		*rc = err_set(err, ERR_RANGE, "buffer of %zu x %zu floats is too large", a, b);
		return NULL;
	}
	if ((p = calloc(1, n ? n : 1)) == NULL)
		*rc = err_set(err, ERR_NOMEM, "out of memory allocating %zu MiB", n >> 20);
	return p;
}

static void cpu_free(struct backend *b);

/* A float buffer of the backend: where it goes, rows x cols floats. */
struct cpu_buf {
	float **p;
	size_t rows, cols;
};

/* The widest row an attention or output product takes as input (the feed-forward's are cpu_ffn's). */
static size_t
widest_input(const struct model_hparams *hp)
{
	return MAX((size_t)hp->n_embd, (size_t)hp->n_head * hp->head_dim);
}

/* Most buffers cpu_bufs names. */
#define CPU_BUFS 10

/*
 * The float buffers: the KV pool, the activations for max_tokens rows and
 * the products' scratch (b->pool is NULL when only planning: threads is
 * then given). Returns how many.
 */
static int
cpu_bufs(struct backend *b, int threads, struct cpu_buf *out)
{
	const struct model_hparams *hp = &b->m->hp;
	size_t T = (size_t)b->max_tokens, nq = (size_t)hp->n_head * hp->head_dim;
	size_t nkv = (size_t)hp->n_head_kv * hp->head_dim, widest = widest_input(hp), D = (size_t)hp->n_embd;
	int n = 0;

	b->kv_row = b->kv_type == KV_Q8_0 ? nkv / 32 * sizeof(struct q8_act32) : nkv * sizeof(float);
	b->kv_stride = KV_BLOCK_TOKENS * b->kv_row;
	out[n++] = (struct cpu_buf){ &b->kv, (size_t)b->kv_blocks * (size_t)hp->n_layer * 2,
		b->kv_stride / sizeof(float) };
	out[n++] = (struct cpu_buf){ &b->x, T, D };
	out[n++] = (struct cpu_buf){ &b->h, T, widest };
	out[n++] = (struct cpu_buf){ &b->q, T, nq };
	out[n++] = (struct cpu_buf){ &b->k, T, nkv };
	out[n++] = (struct cpu_buf){ &b->v, T, nkv };
	out[n++] = (struct cpu_buf){ &b->att, T, nq };
	out[n++] = (struct cpu_buf){ &b->ffn_out, T, D };
	out[n++] = (struct cpu_buf){ &b->mm_scratch, (size_t)threads * CPU_MM_ROWS, widest };
	return n;
}

/* Bytes of the 8-bit copies of an attention or output product's input (fast mode), each of the two. */
static size_t
q8_bytes(const struct backend *b)
{
	return b->exact ? 0 : cpu_act_bytes((int64_t)widest_input(&b->m->hp), b->max_tokens);
}

/* Allocates the buffers (cpu_bufs), the 8-bit copies and the feed-forward's runner. */
static int
alloc_buffers(struct backend *b, char *err)
{
	struct cpu_buf bufs[CPU_BUFS];
	int n = cpu_bufs(b, cpu_pool_threads(b->pool), bufs), rc = 0;

	for (int i = 0; i < n; i++)
		*bufs[i].p = alloc_floats(bufs[i].rows, bufs[i].cols, err, &rc);
	if (!b->exact)
		for (int k = 0; k < 2; k++)
			if ((b->q8[k] = malloc(q8_bytes(b))) == NULL)
				rc = err_set(err, ERR_NOMEM, "out of memory for 8-bit activations");
	b->tok_seq = xcalloc((size_t)b->max_tokens, sizeof *b->tok_seq);
	b->tok_pos = xcalloc((size_t)b->max_tokens, sizeof *b->tok_pos);
	if (rc == 0 && (b->ffn = cpu_ffn_new(b->m, NULL, b->max_tokens, b->exact, b->pool, err)) == NULL)
		rc = ERR_NOMEM;
	return rc;
}

/* Worker threads for the options. */
static int
cpu_threads(const struct backend_opts *o)
{
	return o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
}

/*
 * What load takes besides the KV pool: the weights (mapped from the file,
 * in memory once used), the activations and scratch; and one KV block.
 * Every feed-forward is computed where it is: none moves.
 */
static int
cpu_plan(const struct model_desc *m, const struct backend_opts *o, struct backend_plan *p, char *err)
{
	struct backend b = { .m = m, .max_tokens = o->max_tokens, .kv_blocks = 1, .exact = o->exact,
		.kv_type = o->kv_type };
	struct cpu_buf bufs[CPU_BUFS];
	int n, rc;

	if ((rc = kv_type_check(o->kv_type, m->hp.head_dim, err)) != 0)
		return rc;
	n = cpu_bufs(&b, cpu_threads(o), bufs);
	p->kv_block = bufs[0].rows * bufs[0].cols * sizeof(float);
	p->fixed = m->weight_bytes + 2 * q8_bytes(&b) + cpu_ffn_bytes(m, o->max_tokens, o->exact, cpu_threads(o));
	for (int i = 1; i < n; i++)
		p->fixed += bufs[i].rows * bufs[i].cols * sizeof(float);
	p->host = 0;
	if (p->ffn != NULL)
		memset(p->ffn, 0, (size_t)m->hp.n_layer * sizeof *p->ffn);
	return 0;
}

static int
cpu_load(const struct model_desc *m, const struct backend_opts *o, struct backend **out, char *err)
{
	struct backend *b = xcalloc(1, sizeof *b);
	int l, rc, threads = cpu_threads(o);

	if (o->max_tokens < 1 || o->kv_blocks < 1) {
		free(b);
		return err_set(err, ERR_INVAL, "max_tokens and kv_blocks must be positive");
	}
	if ((rc = kv_type_check(o->kv_type, m->hp.head_dim, err)) != 0) {
		free(b);
		return rc;
	}
	if ((rc = fault_init(FAULT_CPU, err)) != 0) {
		free(b);
		return rc;
	}
	cpu_ops_init();
	b->m = m;
	b->max_tokens = o->max_tokens;
	b->kv_blocks = o->kv_blocks;
	b->exact = o->exact;
	b->kv_type = o->kv_type;
	b->pool = cpu_pool_new(threads, CPU_POOL_SPIN);
	b->layers = xcalloc((size_t)m->hp.n_layer, sizeof *b->layers);
	for (l = 0; l < m->hp.n_layer; l++)
		load_layer(&m->layers[l], &b->layers[l]);
	b->out_norm = cpu_to_float(m->out_norm);
	for (int swa = 0; swa < 2; swa++) {
		b->freq[swa] = xmalloc((size_t)m->hp.head_dim / 2 * sizeof(float));
		model_rope_freqs(&m->hp, swa, b->freq[swa]);
	}
	if ((rc = alloc_buffers(b, err)) != 0) {
		cpu_free(b);
		return rc;
	}
	*out = b;
	return 0;
}

static void
cpu_free(struct backend *b)
{
	int l;

	if (b == NULL)
		return;
	for (l = 0; l < b->m->hp.n_layer; l++)
		free_layer(&b->layers[l]);
	free(b->layers);
	free(b->out_norm), free(b->freq[0]), free(b->freq[1]);
	free(b->kv), free(b->x), free(b->h), free(b->q), free(b->k), free(b->v), free(b->att);
	free(b->ffn_out), free(b->mm_scratch), free(b->scores);
	cpu_ffn_free(b->ffn);
	free(b->q8[0]), free(b->q8[1]);
	free(b->tok_seq), free(b->tok_pos);
	cpu_pool_free(b->pool);
	free(b);
}

/* Where position pos of a sequence keeps its K (kv = 0) or V (kv = 1) at layer l. */
static uint8_t *
kv_slot(const struct backend *b, const struct fwd_seq *q, int l, int kv, int64_t pos)
{
	int64_t block = q->block_table[pos / KV_BLOCK_TOKENS];

	return (uint8_t *)b->kv + (((size_t)block * (size_t)b->m->hp.n_layer + (size_t)l) * 2 + (size_t)kv) *
	    b->kv_stride + (size_t)(pos % KV_BLOCK_TOKENS) * b->kv_row;
}

/* A token's K or V row x (nkv floats) into its slot, as the pool holds it. */
static void
kv_store(const struct backend *b, uint8_t *slot, const float *x, size_t nkv)
{
	struct q8_act32 *y = (struct q8_act32 *)slot;

	if (b->kv_type == KV_F16) {
		memcpy(slot, x, nkv * sizeof *x);
		return;
	}
	/* a value that is not finite: the row reads back as NaN, as a float pool's would spread it */
	if (cpu_q8_quantize(Q8_ACT_32, x, (int64_t)nkv, slot) != 0)
		for (size_t i = 0; i < nkv / 32; i++)
			y[i].d = NAN;
}

/*
 * Head h's part (hd values) of a K or V row as floats: the float pool's
 * own, or a q8_0 row's dequantized into buf; the float kernels take it
 * from there.
 */
static const float *
kv_head(const struct backend *b, const uint8_t *row, int64_t h, int hd, float *buf)
{
	if (b->kv_type == KV_F16)
		return (const float *)row + h * hd;
	cpu_q8_dequant32((const struct q8_act32 *)row + h * (hd / 32), hd / 32, buf);
	return buf;
}

struct step {
	struct backend *b;
	const struct fwd_batch *batch;
	int l;
};

/* Token embeddings, scaled. */
static void
embed(struct backend *b, const struct fwd_batch *batch)
{
	const struct model_hparams *hp = &b->m->hp;
	int32_t t;
	int64_t i;

	for (t = 0; t < batch->n_tokens; t++) {
		float *x = b->x + (size_t)t * hp->n_embd;

		cpu_get_row(b->m->tok_embd, batch->tokens[t], x);
		if (hp->embd_scale != 1.0f)
			for (i = 0; i < hp->n_embd; i++)
				x[i] *= hp->embd_scale;
	}
}

/* Task t: bias, QK norm and RoPE of token t's heads, then its K/V into the pool. */
static void
qk_task(void *arg, int64_t t, int thread)
{
	const struct step *st = arg;
	struct backend *b = st->b;
	const struct model_hparams *hp = &b->m->hp;
	const struct cpu_layer *c = &b->layers[st->l];
	const struct fwd_seq *q = &st->batch->seqs[b->tok_seq[t]];
	int swa = model_layer_is_swa(hp, st->l), hd = hp->head_dim, h;
	float pos = (float)b->tok_pos[t] / (swa ? 1.0f : hp->rope_scale);
	float *qt = b->q + (size_t)t * hp->n_head * hd, *kt = b->k + (size_t)t * hp->n_head_kv * hd;
	float *vt = b->v + (size_t)t * hp->n_head_kv * hd;
	size_t nkv = (size_t)hp->n_head_kv * hd;

	if (c->bq != NULL) {
		cpu_add(qt, c->bq, (int64_t)hp->n_head * hd);
		cpu_add(kt, c->bk, (int64_t)nkv);
		cpu_add(vt, c->bv, (int64_t)nkv);
	}
	for (h = 0; c->q_norm != NULL && h < hp->n_head; h++)
		cpu_rmsnorm(qt + h * hd, c->q_norm, hp->norm_offset, hp->norm_eps, hd, qt + h * hd);
	for (h = 0; c->k_norm != NULL && h < hp->n_head_kv; h++)
		cpu_rmsnorm(kt + h * hd, c->k_norm, hp->norm_offset, hp->norm_eps, hd, kt + h * hd);
	cpu_rope(qt, hp->n_head, hd, pos, b->freq[swa], hp->rope == ROPE_NEOX);
	cpu_rope(kt, hp->n_head_kv, hd, pos, b->freq[swa], hp->rope == ROPE_NEOX);
	kv_store(b, kv_slot(b, q, st->l, 0, b->tok_pos[t]), kt, nkv);
	kv_store(b, kv_slot(b, q, st->l, 1, b->tok_pos[t]), vt, nkv);
}

/*
 * The positions [*p0, *last] a token at pos attends to in layer l: up to
 * itself, or with bidir up to *last (the sequence's end); a sliding-window
 * layer the last sliding_window of them, or with bidir those at most half
 * the window away either side.
 */
static void
attn_span(const struct model_hparams *hp, int l, int bidir, int64_t pos, int64_t *p0, int64_t *last)
{
	int64_t w = hp->sliding_window;

	*p0 = 0;
	if (!model_layer_is_swa(hp, l))
		return;
	if (bidir) {
		*p0 = MAX(0, pos - w / 2);
		*last = MIN(*last, pos + w / 2);
	} else if (pos >= w) {
		*p0 = pos - w + 1;
	}
}

/*
 * Task (token, KV head): softmax(q.K / scale) V over the positions the
 * token sees, for each query head of the KV head's group; with attention
 * sinks, the head's sink logit joins the softmax and takes its share of
 * the weight to no value. Each K and V row is read once for the whole
 * group; each head's sums run as they would alone, so the results do not
 * depend on the grouping.
 */
static void
attn_task(void *arg, int64_t task, int thread)
{
	const struct step *st = arg;
	struct backend *b = st->b;
	const struct model_hparams *hp = &b->m->hp;
	int64_t t = task / hp->n_head_kv, kvh = task % hp->n_head_kv, p, p0 = 0, pos = b->tok_pos[t], n;
	const struct fwd_seq *q = &st->batch->seqs[b->tok_seq[t]];
	int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv, g;
	size_t h0 = (size_t)t * hp->n_head + (size_t)kvh * group; /* the group's first head */
	const float *qh = b->q + h0 * hd, *kv;
	float *out = b->att + h0 * hd, *sc = b->scores + (size_t)thread * (size_t)b->scores_len, *sum, mx;
	float *buf = sc + b->scores_len - hd;
	int64_t last = q->bidir ? q->pos0 + q->n_new - 1 : pos;

	attn_span(hp, st->l, q->bidir, pos, &p0, &last);
	n = last - p0 + 1;
	sum = sc + (size_t)group * n;
	for (p = p0; p <= last; p++) {
		kv = kv_head(b, kv_slot(b, q, st->l, 0, p), kvh, hd, buf);
		for (g = 0; g < group; g++)
			sc[g * n + p - p0] = cpu_dot(qh + (size_t)g * hd, kv, hd) * hp->attn_scale;
	}
	for (g = 0; g < group; g++) {
		const float *sink = b->layers[st->l].sinks;

		for (mx = sink ? sink[h0 % hp->n_head + g] : -INFINITY, p = 0; p < n; p++)
			mx = MAX(mx, sc[g * n + p]);
		sum[g] = cpu_exp_sum(sc + g * n, n, mx);
		if (sink != NULL)
			sum[g] += expf(sink[h0 % hp->n_head + g] - mx);
	}
	memset(out, 0, (size_t)group * hd * sizeof *out);
	for (p = p0; p <= last; p++) {
		kv = kv_head(b, kv_slot(b, q, st->l, 1, p), kvh, hd, buf);
		for (g = 0; g < group; g++)
			cpu_axpy(out + (size_t)g * hd, sc[g * n + p - p0] / sum[g], kv, hd);
	}
}

/* Task t: RMSNorm of row t of src into dst (widths n), optionally added to x. */
struct norm_ctx {
	const float *src, *w;
	float *dst;
	int64_t n;
	const struct model_hparams *hp;
};

static void
norm_task(void *arg, int64_t t, int thread)
{
	const struct norm_ctx *c = arg;

	cpu_rmsnorm(c->src + t * c->n, c->w, c->hp->norm_offset, c->hp->norm_eps, c->n, c->dst + t * c->n);
}

/* RMSNorm of T rows. */
static void
norm_rows(struct backend *b, const float *src, const float *w, float *dst, int T)
{
	struct norm_ctx c = { src, w, dst, b->m->hp.n_embd, &b->m->hp };

	cpu_pool_run(b->pool, T, norm_task, &c);
}

/* T rows of n floats as the input of products, 8-bit copies allowed unless exact. */
static void
input(struct backend *b, struct cpu_act *in, const float *x, int64_t n, int T)
{
	cpu_act_init(in, x, n, T, n, b->exact ? NULL : b->q8);
}

/* x += f(rows), where the sandwich norm, if any, is applied to rows first. */
static void
residual(struct backend *b, float *rows, const float *post_norm, int T)
{
	int64_t n = b->m->hp.n_embd;

	if (post_norm != NULL)
		norm_rows(b, rows, post_norm, rows, T);
	cpu_add(b->x, rows, n * T);
}

/* The attention half of layer l. */
static void
attention(struct backend *b, const struct fwd_batch *batch, int l)
{
	const struct model_hparams *hp = &b->m->hp;
	const struct model_layer *L = &b->m->layers[l];
	struct step st = { b, batch, l };
	int T = batch->n_tokens;
	int64_t nq = (int64_t)hp->n_head * hp->head_dim, nkv = (int64_t)hp->n_head_kv * hp->head_dim;

	struct cpu_act in;

	norm_rows(b, b->x, b->layers[l].attn_norm, b->h, T);
	input(b, &in, b->h, hp->n_embd, T);
	cpu_matmul(b->pool, &in, 3, (const struct model_tensor *[]){ L->wq, L->wk, L->wv },
	    (float *[]){ b->q, b->k, b->v }, (int64_t[]){ nq, nkv, nkv }, b->mm_scratch);
	cpu_pool_run(b->pool, T, qk_task, &st);
	cpu_pool_run(b->pool, (int64_t)T * hp->n_head_kv, attn_task, &st);
	input(b, &in, b->att, nq, T);
	cpu_matmul(b->pool, &in, 1, &L->wo, &b->ffn_out, (int64_t[]){ hp->n_embd }, b->mm_scratch);
	for (int t = 0; b->layers[l].bo != NULL && t < T; t++)
		cpu_add(b->ffn_out + (size_t)t * hp->n_embd, b->layers[l].bo, hp->n_embd);
	residual(b, b->ffn_out, b->layers[l].post_attn_norm, T);
}

/* The feed-forward half of layer l: dense or experts. */
static void
feed_forward(struct backend *b, int T, int l)
{
	norm_rows(b, b->x, b->layers[l].ffn_norm, b->h, T);
	cpu_ffn_run(b->ffn, l, b->h, T, b->ffn_out);
	residual(b, b->ffn_out, b->layers[l].post_ffn_norm, T);
}

/*
 * Final norm of the rows that want logits, then the output projection;
 * the rows that want hidden states normed into batch->embd. Returns the
 * number of logits rows.
 */
static int32_t
output(struct backend *b, const struct fwd_batch *batch, float *logits)
{
	const struct model_hparams *hp = &b->m->hp;
	int32_t s, t = 0, n = 0, ne = 0, r;

	for (s = 0; s < batch->n_seqs; s++) {
		const struct fwd_seq *q = &batch->seqs[s];

		for (r = q->n_new - q->logits; r < q->n_new; r++, n++)
			cpu_rmsnorm(b->x + (size_t)(t + r) * hp->n_embd, b->out_norm, hp->norm_offset,
			    hp->norm_eps, hp->n_embd, b->h + (size_t)n * hp->n_embd);
		for (r = q->n_new - q->embd; r < q->n_new; r++, ne++)
			cpu_rmsnorm(b->x + (size_t)(t + r) * hp->n_embd, b->out_norm, hp->norm_offset,
			    hp->norm_eps, hp->n_embd, batch->embd + (size_t)ne * hp->n_embd);
		t += q->n_new;
	}
	if (n > 0) {
		struct cpu_act in;

		input(b, &in, b->h, hp->n_embd, n);
		cpu_matmul(b->pool, &in, 1, &b->m->output, &logits, (int64_t[]){ hp->n_vocab }, b->mm_scratch);
	}
	return n;
}

/* Records each token's sequence and position; sizes the score rows. */
static void
place_tokens(struct backend *b, const struct fwd_batch *batch, int64_t max_len)
{
	int32_t s, i, t = 0;
	int64_t need;

	for (s = 0; s < batch->n_seqs; s++)
		for (i = 0; i < batch->seqs[s].n_new; i++, t++) {
			b->tok_seq[t] = s;
			b->tok_pos[t] = batch->seqs[s].pos0 + i;
		}
	/* per thread: the scores of a KV head's group of query heads, their sums, a K or V head's floats */
	need = (int64_t)(b->m->hp.n_head / b->m->hp.n_head_kv) * (max_len + 1) + b->m->hp.head_dim;
	if (need > b->scores_len) {
		b->scores_len = need;
		free(b->scores);
		b->scores = xmalloc((size_t)cpu_pool_threads(b->pool) * (size_t)need * sizeof(float));
	}
}

static int
cpu_forward(struct backend *b, const struct fwd_batch *batch, float *logits, char *err)
{
	int64_t max_len = 0, n_table;
	struct fwd_masks mk;
	int l, rc;

	if ((rc = fwd_batch_check(batch, b->max_tokens, b->kv_blocks, b->m->hp.n_vocab, &max_len, &n_table,
	    err)) != 0)
		return rc;
	if (fault_hit(FAULT_CPU, FAULT_STEP))
		return err_set(err, ERR_DEVICE, "cpu forward step: %s", fault_message(FAULT_CPU));
	place_tokens(b, batch, max_len);
	embed(b, batch);
	for (l = 0; l < b->m->hp.n_layer; l++) {
		attention(b, batch, l);
		feed_forward(b, batch->n_tokens, l);
	}
	rc = fwd_masks_get(batch, output(b, batch, logits), &mk, err);
	if (rc == 0)
		fwd_masks_apply(&mk, logits, b->m->hp.n_vocab);
	return rc;
}

/* Block blk in the pool, or NULL (with err) if it is not one. */
static uint8_t *
kv_block(struct backend *b, int32_t blk, char *err)
{
	if (blk < 0 || blk >= b->kv_blocks) {
		err_set(err, ERR_INVAL, "KV block %d is outside the pool", blk);
		return NULL;
	}
	return (uint8_t *)b->kv + (size_t)blk * (size_t)b->m->hp.n_layer * 2 * b->kv_stride;
}

static int
cpu_kv_copy(struct backend *b, int32_t src, int32_t dst, int32_t n_tokens, char *err)
{
	const uint8_t *s;
	uint8_t *d;
	size_t i;

	if (n_tokens < 0 || n_tokens > KV_BLOCK_TOKENS)
		return err_set(err, ERR_INVAL, "kv_copy of %d tokens: out of range", n_tokens);
	if ((s = kv_block(b, src, err)) == NULL || (d = kv_block(b, dst, err)) == NULL)
		return ERR_INVAL;
	if (fault_hit(FAULT_CPU, FAULT_COPY))
		return err_set(err, ERR_DEVICE, "cpu kv_copy: %s", fault_message(FAULT_CPU));
	for (i = 0; i < (size_t)b->m->hp.n_layer * 2; i++)
		memcpy(d + i * b->kv_stride, s + i * b->kv_stride, (size_t)n_tokens * b->kv_row);
	return 0;
}

static int
cpu_kv_move(struct backend *b, const int32_t *blocks, int32_t n, void *const *out, const void *const *in,
    char *err)
{
	size_t per = (size_t)b->m->hp.n_layer * 2 * b->kv_stride;
	uint8_t *p;

	for (int32_t i = 0; i < n; i++) {
		if ((p = kv_block(b, blocks[i], err)) == NULL)
			return ERR_INVAL;
		if (out != NULL && out[i] != NULL)
			memcpy(out[i], p, per);
		if (in != NULL && in[i] != NULL)
			memcpy(p, in[i], per);
	}
	return 0;
}

/* Host memory is all the same to the CPU. */
static void *
cpu_host_alloc(size_t bytes)
{
	return malloc(bytes);
}

static void
cpu_host_free(void *p)
{
	free(p);
}

/* A token's row: fp32 in both modes, or q8_act32 blocks. */
static size_t
cpu_kv_row_bytes(const struct backend *b)
{
	return b->kv_row;
}

/* A CPU pays by the token. */
static int
cpu_step_tokens(const struct backend *b, int n)
{
	(void)b;
	return n;
}

const struct backend_ops cpu_backend = {
	.name = "cpu",
	.kv_row_bytes = cpu_kv_row_bytes,
	.plan = cpu_plan,
	.load = cpu_load,
	.forward = cpu_forward,
	.kv_copy = cpu_kv_copy,
	.kv_move = cpu_kv_move,
	.host_alloc = cpu_host_alloc,
	.host_free = cpu_host_free,
	.step_tokens = cpu_step_tokens,
	.free = cpu_free,
};
