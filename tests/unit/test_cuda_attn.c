/*
 * test_cuda_attn.c: the CUDA backend's heads one kernel at a time, through
 * kernels/cuda/cuda_probe.h: RoPE with the KV write (cuda_qk), the same
 * fused into the Q/K/V product (cuda_matmul_qkv) and its refusals, and
 * attention (one piece, split and merged, prefill tiles on the tensor
 * cores, and for one token with qk's work in it) over fp16 and fp32 pools
 * and q8_0 ones (the prefill kernel widens their tiles to fp16), against
 * the CPU backend's, a float64 reference or qk then attention. The inputs,
 * tolerances and the skip without a GPU are cuda_ops_common.h's.
 */
#include "config.h"
#include "cpu_ops.h"
#include "cuda_ops_common.h"
#include "cuda_probe.h"
#include "kernels.h"
#include "model.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define MAX_SEQS 8
#define MAX_TOK 256
#define MAX_TAB 128
#define N_LAYER 3       /* layers of the KV pool; the heads use the middle one */
#define POISON16 0xffff /* an fp16 NaN: what the pool holds where nothing was written */
#define POISON32 0xffffffffu /* the same in an fp32 pool, and a q8 pool's scale */
#define POISON8 (-128)       /* a q8 pool's level that no quantization makes */
/* The pools tried: fp16, fp32 (exact mode's), q8 (either mode's: the same kernels). */
#define N_KINDS 3
#define KIND_F32(k) ((k) == 1)
#define KIND_Q8(k) ((k) == 2)
static const char *const kind_names[N_KINDS] = { "fp16", "fp32", "q8" };

/* ---- heads: RoPE, the KV write, attention ---- */

/* Sequences of a step: len positions in all, of which the last n_new are this step's tokens. */
struct seq_spec {
	int len, n_new;
};

/* Where a step's tokens sit: as struct cuda_probe_kv's fields, with the blocks shuffled. */
struct place {
	int n_tok, n_tables, n_blocks, n_seqs;
	int32_t tok_pos[MAX_TOK], tok_tab[MAX_TOK], tables[MAX_TAB];
	int len[MAX_SEQS], tab0[MAX_SEQS];
};

/* Lays the sequences out in a pool with two spare blocks, the blocks in a random order. */
static void
place_seqs(struct place *pl, const struct seq_spec *s, int n_seqs)
{
	int32_t perm[MAX_TAB];

	memset(pl, 0, sizeof *pl);
	pl->n_seqs = n_seqs;
	for (int q = 0; q < n_seqs; q++)
		pl->n_tables += (s[q].len + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	pl->n_blocks = pl->n_tables + 2;
	assert_true(pl->n_blocks <= MAX_TAB);
	for (int i = 0; i < pl->n_blocks; i++)
		perm[i] = i;
	for (int i = pl->n_blocks - 1; i > 0; i--) {
		int j = (int)(rnd() % (uint64_t)(i + 1));
		int32_t tmp = perm[i];

		perm[i] = perm[j];
		perm[j] = tmp;
	}
	memcpy(pl->tables, perm, (size_t)pl->n_tables * sizeof *perm);
	for (int q = 0, tab = 0; q < n_seqs; q++) {
		pl->len[q] = s[q].len;
		pl->tab0[q] = tab;
		for (int i = s[q].len - s[q].n_new; i < s[q].len; i++) {
			assert_true(pl->n_tok < MAX_TOK);
			pl->tok_pos[pl->n_tok] = i;
			pl->tok_tab[pl->n_tok++] = tab;
		}
		tab += (s[q].len + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	}
}

/* Index in the pool of element i of head h of K (kv 0) or V (kv 1) at position pos (the layout of kernels.h). */
static size_t
pool_at(const struct cuda_probe_heads *hd, const struct place *pl, int tab, int pos, int kv, int h, int i)
{
	size_t nkv = (size_t)hd->n_head_kv * (size_t)hd->head_dim;
	size_t block = (size_t)pl->tables[tab + pos / KV_BLOCK_TOKENS];

	return ((block * N_LAYER + 1) * 2 + (size_t)kv) * KV_BLOCK_TOKENS * nkv +
	    (size_t)(pos % KV_BLOCK_TOKENS) * nkv + (size_t)h * (size_t)hd->head_dim + (size_t)i;
}

static size_t
pool_len(const struct cuda_probe_heads *hd, const struct place *pl)
{
	return (size_t)pl->n_blocks * N_LAYER * 2 * KV_BLOCK_TOKENS * (size_t)hd->n_head_kv *
	    (size_t)hd->head_dim;
}

/*
 * A KV pool on the host: fp16 bits, or floats (f32) as the exact mode keeps
 * them, or q8 rows (kernels/cuda/attention.cuh: a block's K of one layer is
 * its int8 rows, then a float scale for each 32 of them), n elements of
 * nkv a row, indexed as pool_at counts them.
 */
struct kv_pool {
	void *data;
	size_t n, nkv;
	int f32, q8;
};

static size_t
pool_bytes(const struct kv_pool *kp)
{
	return kp->q8 ? kp->n + kp->n / 32 * sizeof(float) : kp->n * (kp->f32 ? 4 : 2);
}

/* A q8 pool's level and scale of element i. */
static int8_t *
q8_level(const struct kv_pool *kp, size_t i)
{
	size_t region = (size_t)KV_BLOCK_TOKENS * kp->nkv;

	return (int8_t *)kp->data + i / region * (region + region / 32 * sizeof(float)) + i % region;
}

static float *
q8_scale(const struct kv_pool *kp, size_t i)
{
	size_t region = (size_t)KV_BLOCK_TOKENS * kp->nkv;

	return (float *)((char *)kp->data + i / region * (region + region / 32 * sizeof(float)) + region +
	    i % region / 32 * sizeof(float));
}

/* n elements of rows of nkv, all poison. */
static struct kv_pool
pool_new(size_t n, size_t nkv, int kind)
{
	struct kv_pool kp = { NULL, n, nkv, KIND_F32(kind), KIND_Q8(kind) };

	kp.data = xmalloc(pool_bytes(&kp));
	for (size_t i = 0; i < n; i++)
		if (kp.q8) {
			*q8_level(&kp, i) = POISON8;
			memcpy(q8_scale(&kp, i), &(uint32_t){ POISON32 }, sizeof(float));
		} else if (kp.f32) {
			((uint32_t *)kp.data)[i] = POISON32;
		} else {
			((uint16_t *)kp.data)[i] = POISON16;
		}
	return kp;
}

/* Element i as the decode kernel uses it: a q8 pool's q * d in float (the prefill kernel's fp16 is within TOL_FLASH). */
static double
pool_get(const struct kv_pool *kp, size_t i)
{
	if (kp->q8)
		return (float)*q8_level(kp, i) * *q8_scale(kp, i);
	return kp->f32 ? (double)((const float *)kp->data)[i] : fp16_to_fp32(((const uint16_t *)kp->data)[i]);
}

/* Elements i .. i + d - 1 (a head's row) random in [-1, 1]: a q8 pool's levels and scales themselves. */
static void
pool_fill(struct kv_pool *kp, size_t i, int d)
{
	for (int j = 0; j < d; j++)
		if (kp->q8) {
			*q8_level(kp, i + j) = (int8_t)((int)(rnd() % 255) - 127);
			if (j % 32 == 0)
				*q8_scale(kp, i + j) = unif(0.5f, 1.0f) / 127;
		} else if (kp->f32) {
			((float *)kp->data)[i + j] = unif(-1, 1);
		} else {
			((uint16_t *)kp->data)[i + j] = fp32_to_fp16(unif(-1, 1));
		}
}

static int
pool_poisoned(const struct kv_pool *kp, size_t i)
{
	uint32_t sb;

	if (kp->q8) {
		memcpy(&sb, q8_scale(kp, i), sizeof sb);
		return *q8_level(kp, i) == POISON8 && sb == POISON32;
	}
	return kp->f32 ? ((const uint32_t *)kp->data)[i] == POISON32 : ((const uint16_t *)kp->data)[i] == POISON16;
}

static const char *
pool_name(const struct kv_pool *kp)
{
	return kind_names[kp->q8 ? 2 : kp->f32];
}

static struct cuda_probe_kv
probe_kv(struct place *pl, struct kv_pool *kp, int split, int flash)
{
	struct cuda_probe_kv kv = { kp->data, pl->n_blocks, N_LAYER, 1, pl->tok_pos, pl->tok_tab, pl->tables,
		pl->n_tables, kp->f32, split, flash, kp->q8, 0 };

	return kv;
}

/* Head shapes, biases, norms and RoPE settings tried. */
static const struct {
	int head_dim, n_head, n_head_kv, neox, bias, qk_norm;
	float offset, theta, pos_div;
	int window;
} head_cfgs[] = {
	{ 64, 8, 2, 0, 0, 0, 0.0f, 10000.0f, 1.0f, 0 },
	{ 128, 4, 4, 1, 1, 0, 0.0f, 1000000.0f, 1.0f, 0 },
	{ 256, 8, 1, 1, 0, 1, 1.0f, 10000.0f, 8.0f, 20 },
	{ 96, 6, 3, 0, 1, 1, 0.0f, 500000.0f, 1.0f, 0 },
	{ 32, 5, 1, 1, 0, 0, 0.0f, 10000.0f, 1.0f, 5 },
	/* a second dimension a thread for one warp of the decode kernel only */
	{ 160, 4, 2, 1, 0, 0, 0.0f, 10000.0f, 1.0f, 0 },
	/* more query heads to a KV head than a block of the tensor-core decode kernel has rows */
	{ 64, 20, 1, 0, 0, 0, 0.0f, 10000.0f, 1.0f, 0 },
};

/* Floats of a test's biases: at least any case's heads times head_dim (test_qkv's 128 too). */
#define BIAS_FLOATS (32 * 256)

/* A step of several sequences: a prefill chunk, a first token, decodes, a whole prompt. */
static const struct seq_spec step_seqs[] = { { 45, 13 }, { 1, 1 }, { 100, 1 }, { 33, 33 }, { 17, 2 } };

static struct cuda_probe_heads
heads_cfg(size_t c, float *bq, float *bk, float *bv, float *qn, float *kn)
{
	struct cuda_probe_heads hd = {
		.n_head = head_cfgs[c].n_head, .n_head_kv = head_cfgs[c].n_head_kv,
		.head_dim = head_cfgs[c].head_dim,
		.bq = head_cfgs[c].bias ? bq : NULL, .bk = head_cfgs[c].bias ? bk : NULL,
		.bv = head_cfgs[c].bias ? bv : NULL,
		.q_norm = head_cfgs[c].qk_norm ? qn : NULL, .k_norm = head_cfgs[c].qk_norm ? kn : NULL,
		.norm_offset = head_cfgs[c].offset, .norm_eps = 1e-6f, .theta = head_cfgs[c].theta,
		.pos_div = head_cfgs[c].pos_div, .neox = head_cfgs[c].neox,
		.scale = 1.0f / sqrtf((float)head_cfgs[c].head_dim), .window = head_cfgs[c].window,
	};

	return hd;
}

/* The CPU backend's qk_task on one head: bias, norm, rotation. */
static void
cpu_head(float *x, const float *bias, const float *nw, const struct cuda_probe_heads *hd, int pos)
{
	if (bias != NULL)
		cpu_add(x, bias, hd->head_dim);
	if (nw != NULL)
		cpu_rmsnorm(x, nw, hd->norm_offset, hd->norm_eps, hd->head_dim, x);
	struct model_hparams hp = { .head_dim = hd->head_dim, .rope_theta = hd->theta, .rope_theta_local = hd->theta };
	float freq[512];

	model_rope_freqs(&hp, 0, freq);
	cpu_rope(x, 1, hd->head_dim, (float)pos / hd->pos_div, freq, hd->neox);
}

/*
 * Checks one K or V head in the pool against its reference (fp16 rounding
 * allowed in an fp16 pool, half a q8 level in a q8 pool: the
 * largest of its group over 254); marks it written.
 */
static double
check_pool_head(const char *what, const struct kv_pool *kp, uint8_t *written, const float *ref,
    const struct cuda_probe_heads *hd, const struct place *pl, int t, int kv, int h)
{
	double m = max_abs(ref, (size_t)hd->head_dim), worst = 0;

	for (int i = 0; i < hd->head_dim; i++) {
		size_t at = pool_at(hd, pl, pl->tok_tab[t], pl->tok_pos[t], kv, h, i);
		double g = pool_get(kp, at);
		double bound = (kp->f32 || kp->q8 ? 0 : ldexp(fabs((double)ref[i]), -11)) + TOL_F32 * m;

		if (kp->q8)
			bound += max_abs(ref + i / 32 * 32, 32) / 254 + TOL_F32 * m;

		if (!(fabs(g - ref[i]) <= bound))
			fail_msg("%s: token %d %s head %d element %d: gpu %g cpu %g", what, t, kv ? "V" : "K",
			    h, i, g, ref[i]);
		worst = fmax(worst, fabs(g - ref[i]) / m);
		written[at] = 1;
	}
	return worst;
}

/* One head configuration of cuda_qk: q in place, K and V in the pool, nothing else written. */
static double
qk_case(size_t c, int kind)
{
	struct place pl;
	float *bq = rand_floats(BIAS_FLOATS, -0.5f, 0.5f), *bk = rand_floats(BIAS_FLOATS, -0.5f, 0.5f);
	float *bv = rand_floats(BIAS_FLOATS, -0.5f, 0.5f), *qn = rand_floats(256, 0.5f, 1.5f);
	float *kn = rand_floats(256, 0.5f, 1.5f);
	struct cuda_probe_heads hd = heads_cfg(c, bq, bk, bv, qn, kn);
	int d = hd.head_dim, nq, nkv;
	struct cuda_probe_kv kv;
	float *q, *k, *v, *qr;
	struct kv_pool kp;
	uint8_t *written;
	size_t np;
	char err[ERR_LEN], what[96];
	double worst = 0;

	place_seqs(&pl, step_seqs, (int)ARRAY_LEN(step_seqs));
	nq = hd.n_head * d;
	nkv = hd.n_head_kv * d;
	np = pool_len(&hd, &pl);
	q = rand_floats((size_t)pl.n_tok * nq, -2, 2);
	k = rand_floats((size_t)pl.n_tok * nkv, -2, 2);
	v = rand_floats((size_t)pl.n_tok * nkv, -2, 2);
	qr = xmalloc((size_t)pl.n_tok * nq * sizeof *qr);
	memcpy(qr, q, (size_t)pl.n_tok * nq * sizeof *q);
	kp = pool_new(np, (size_t)nkv, kind);
	written = xcalloc(np, 1);
	kv = probe_kv(&pl, &kp, 0, 0);
	snprintf(what, sizeof what, "qk head_dim %d, %d/%d heads, neox %d, bias %d, qk_norm %d, %s pool", d,
	    hd.n_head, hd.n_head_kv, hd.neox, hd.bq != NULL, hd.q_norm != NULL, pool_name(&kp));
	if (cuda_probe_qk(probe, &hd, &kv, q, k, v, pl.n_tok, err) != 0)
		fail_msg("%s: %s", what, err);
	for (int t = 0; t < pl.n_tok; t++) {
		for (int h = 0; h < hd.n_head; h++)
			cpu_head(qr + ((size_t)t * hd.n_head + h) * d, hd.bq ? hd.bq + h * d : NULL, hd.q_norm, &hd,
			    pl.tok_pos[t]);
		worst = fmax(worst, check_rows(what, q + (size_t)t * nq, qr + (size_t)t * nq, hd.n_head, d));
		for (int h = 0; h < hd.n_head_kv; h++) {
			float *kh = k + ((size_t)t * hd.n_head_kv + h) * d, *vh = v + ((size_t)t * hd.n_head_kv + h) * d;

			cpu_head(kh, hd.bk ? hd.bk + h * d : NULL, hd.k_norm, &hd, pl.tok_pos[t]);
			if (hd.bv != NULL)
				cpu_add(vh, hd.bv + h * d, d);
			worst = fmax(worst, check_pool_head(what, &kp, written, kh, &hd, &pl, t, 0, h));
			worst = fmax(worst, check_pool_head(what, &kp, written, vh, &hd, &pl, t, 1, h));
		}
	}
	for (size_t i = 0; i < np; i++)
		if (!written[i] && !pool_poisoned(&kp, i))
			fail_msg("%s: pool element %zu was written (%g) but belongs to no token's K/V", what, i,
			    pool_get(&kp, i));
	free(bq), free(bk), free(bv), free(qn), free(kn), free(q), free(k), free(v), free(qr);
	free(kp.data), free(written);
	return worst;
}

static void
test_qk(void **state)
{
	(void)state;
	for (int kind = 0; kind < N_KINDS; kind++) {
		double worst = 0;

		for (size_t c = 0; c < ARRAY_LEN(head_cfgs); c++)
			worst = fmax(worst, qk_case(c, kind));
		print_message("qk, %s pool: max error / head max %.2e (bound %.0e%s%s)\n", kind_names[kind], worst, TOL_F32,
		    kind == 0 ? ", plus fp16 rounding" : "", KIND_Q8(kind) ? ", plus half a level" : "");
	}
}

/*
 * One case of cuda_matmul_qkv: Q/K/V of types a (Q, K) and b (V) with qk's
 * work in the product against the same product on the same path (int8 or
 * mmt.cu's) followed by cuda_qk; the same sums in both, so q and the pool
 * must agree to float rounding (and fp16's, a last bit, in the pool), and
 * the pool elements of no token stay unwritten. Returns the worst error /
 * head max.
 */
static double
qkv_case(const struct cuda_probe_heads *hd, uint32_t a, uint32_t b, const struct seq_spec *seqs, int n_seqs,
    enum cuda_probe_path path)
{
	int d = hd->head_dim, nq = hd->n_head * d, nkv = hd->n_head_kv * d, k = 512, same = a == b;
	int n = nq + nkv + (same ? nkv : 0), ny = nq + 2 * nkv;
	float *wf, *wf2 = NULL, *x, *y, *y2, *q, *qr, *kr, *vr;
	struct model_tensor t = random_weight(a, k, n, &wf), t2 = { 0 };
	struct cuda_probe_weight w = probe_weight(&t), w2;
	struct kv_pool kp, kpr;
	struct cuda_probe_kv kv, kvr;
	struct place pl;
	char err[ERR_LEN], what[96];
	double worst = 0;
	size_t np;

	place_seqs(&pl, seqs, n_seqs);
	snprintf(what, sizeof what, "qkv %s %s + %s, head_dim %d, %d/%d heads, bias %d, %d tokens", path_name(path),
	    quant_traits(a)->name, quant_traits(b)->name, d, hd->n_head, hd->n_head_kv, hd->bq != NULL, pl.n_tok);
	if (!same) {
		t2 = random_weight(b, k, nkv, &wf2);
		w2 = probe_weight(&t2);
	}
	x = rand_floats((size_t)pl.n_tok * k, -1, 1);
	y = nan_floats((size_t)pl.n_tok * ny), y2 = nan_floats((size_t)pl.n_tok * nkv);
	q = nan_floats((size_t)pl.n_tok * nq);
	qr = xmalloc((size_t)pl.n_tok * nq * sizeof *qr), kr = xmalloc((size_t)pl.n_tok * nkv * sizeof *kr);
	vr = xmalloc((size_t)pl.n_tok * nkv * sizeof *vr);
	np = pool_len(hd, &pl);
	kp = pool_new(np, (size_t)nkv, 0), kpr = pool_new(np, (size_t)nkv, 0);
	kv = probe_kv(&pl, &kp, 0, 0), kvr = probe_kv(&pl, &kpr, 0, 0);
	if (cuda_probe_qkv(probe, &w, same ? NULL : &w2, x, pl.n_tok, path, hd, &kv, q, err) != 0)
		fail_msg("%s: %s", what, err);
	if ((same ? cuda_probe_matmul(probe, &w, 3, x, pl.n_tok, path, 0, 0, y, err) :
	    cuda_probe_matmul_two(probe, &w, &w2, x, pl.n_tok, path, y, y2, err)) != 0)
		fail_msg("%s: unfused product: %s", what, err);
	for (int i = 0; i < pl.n_tok; i++) {
		const float *yt = y + (size_t)i * (same ? ny : nq + nkv);

		memcpy(qr + (size_t)i * nq, yt, (size_t)nq * sizeof *qr);
		memcpy(kr + (size_t)i * nkv, yt + nq, (size_t)nkv * sizeof *kr);
		memcpy(vr + (size_t)i * nkv, same ? yt + nq + nkv : y2 + (size_t)i * nkv, (size_t)nkv * sizeof *vr);
	}
	if (cuda_probe_qk(probe, hd, &kvr, qr, kr, vr, pl.n_tok, err) != 0)
		fail_msg("%s: qk: %s", what, err);
	worst = check_rows(what, q, qr, pl.n_tok * hd->n_head, d);
	for (size_t i = 0; i < np; i++) {
		double g = pool_get(&kp, i), r = pool_get(&kpr, i);

		if (pool_poisoned(&kpr, i) != pool_poisoned(&kp, i) ||
		    (!pool_poisoned(&kpr, i) && !(fabs(g - r) <= ldexp(fabs(r), -10) + TOL_F32)))
			fail_msg("%s: pool element %zu: fused %g, product then qk %g", what, i, g, r);
	}
	free((void *)t.data), free((void *)t2.data), free(wf), free(wf2), free(x), free(y), free(y2), free(q);
	free(qr), free(kr), free(vr), free(kp.data), free(kpr.data);
	return worst;
}

/* cuda_matmul_qkv must refuse these heads, this pool (of a kind) or this many tokens on a path, and write nothing. */
static void
qkv_refused(const struct cuda_probe_heads *hd, const struct seq_spec *seqs, int n_seqs, int kind,
    enum cuda_probe_path path)
{
	int nq = hd->n_head * hd->head_dim;
	struct model_tensor t;
	float *wf, *x, *q;
	struct kv_pool kp;
	struct cuda_probe_kv kv;
	struct place pl;
	char err[ERR_LEN];
	struct cuda_probe_weight w;

	place_seqs(&pl, seqs, n_seqs);
	t = random_weight(TT_Q4_K, 512, nq + 2 * hd->n_head_kv * hd->head_dim, &wf);
	w = probe_weight(&t);
	x = rand_floats((size_t)pl.n_tok * 512, -1, 1), q = nan_floats((size_t)pl.n_tok * nq);
	kp = pool_new(pool_len(hd, &pl), (size_t)hd->n_head_kv * (size_t)hd->head_dim, kind);
	kv = probe_kv(&pl, &kp, 0, 0);
	assert_int_equal(cuda_probe_qkv(probe, &w, NULL, x, pl.n_tok, path, hd, &kv, q, err), ERR_UNSUPPORTED);
	for (size_t i = 0; i < (size_t)pl.n_tok * nq; i++)
		assert_true(isnan(q[i]));
	for (size_t i = 0; i < pool_len(hd, &pl); i++)
		assert_true(pool_poisoned(&kp, i));
	free((void *)t.data), free(wf), free(x), free(q), free(kp.data);
}

/* Placements of a step's tokens in sequences. */
struct seq_set {
	const struct seq_spec *s;
	int n;
};

/* The type pairs (Q and K, V) and placements one path's cuda_matmul_qkv is checked over, every pair with each. */
struct qkv_grid {
	enum cuda_probe_path path;
	const uint32_t (*types)[2];
	size_t n_types;
	const struct seq_set *seqs;
	size_t n_seqs;
};

/* The worst qkv_case of grid g with heads hd. */
static double
qkv_cases(const struct cuda_probe_heads *hd, const struct qkv_grid *g)
{
	double worst = 0;

	for (size_t ti = 0; ti < g->n_types; ti++)
		for (size_t si = 0; si < g->n_seqs; si++)
			worst = fmax(worst, qkv_case(hd, g->types[ti][0], g->types[ti][1], g->seqs[si].s, g->seqs[si].n,
			    g->path));
	return worst;
}

/*
 * cuda_matmul_qkv on the int8 path for one and two tokens (two sequences
 * decoding, one sequence's two new tokens) and on mmt.cu's for two to
 * eight (sequences decoding, a sequence's new tokens, both; and llama3-8b's
 * heads, which take 5-warp blocks on an H100), with and
 * without biases and a RoPE position divisor, heads of 64 and 128, Q/K/V
 * of one type or V of another; and its refusal where qk's work needs a
 * whole head (QK norm) or pairs half a head apart (neox), of an fp32 pool
 * and of more tokens than the path's kernels take.
 */
static void
test_qkv(void **state)
{
	static const struct seq_spec one[] = { { 100, 1 } }, two[] = { { 45, 1 }, { 3, 1 } }, pair[] = { { 17, 2 } };
	static const struct seq_spec three[] = { { 9, 3 } }, nine[] = { { 9, 5 }, { 30, 4 } };
	static const struct seq_spec eight[] = { { 45, 1 }, { 3, 2 }, { 17, 1 }, { 100, 3 }, { 9, 1 } };
	static const struct seq_set int8_seqs[] = { { one, 1 }, { two, 2 }, { pair, 1 } };
	static const struct seq_set few_seqs[] = { { two, 2 }, { three, 1 }, { eight, 5 } };
	static const uint32_t int8_pairs[][2] = { { TT_Q4_K, TT_Q4_K }, { TT_Q4_K, TT_Q6_K }, { TT_Q8_0, TT_Q8_0 },
		{ TT_Q6_K, TT_Q8_0 } };
	static const uint32_t few_pairs[][2] = { { TT_Q4_K, TT_Q4_K }, { TT_Q4_K, TT_Q6_K }, { TT_Q6_K, TT_Q4_K },
		{ TT_Q6_K, TT_Q6_K } };
	static const struct qkv_grid int8 = { CUDA_PROBE_INT8, int8_pairs, ARRAY_LEN(int8_pairs), int8_seqs,
		ARRAY_LEN(int8_seqs) };
	static const struct qkv_grid few = { CUDA_PROBE_FEW, few_pairs, ARRAY_LEN(few_pairs), few_seqs,
		ARRAY_LEN(few_seqs) };
	/* llama3-8b's heads: 384 blocks of 16 rows, one wave of mmt.cu's 5-warp blocks on 132 multiprocessors */
	static const struct qkv_grid few_8b = { CUDA_PROBE_FEW, few_pairs, 2, few_seqs, 1 };
	float *bq = rand_floats(BIAS_FLOATS, -0.5f, 0.5f), *bk = rand_floats(BIAS_FLOATS, -0.5f, 0.5f);
	float *bv = rand_floats(BIAS_FLOATS, -0.5f, 0.5f), *qn = rand_floats(256, 0.5f, 1.5f);
	float *kn = rand_floats(256, 0.5f, 1.5f);
	double worst = 0, worst_few = 0;

	(void)state;
	for (size_t c = 0; c < ARRAY_LEN(head_cfgs); c++) {
		struct cuda_probe_heads hd = heads_cfg(c, bq, bk, bv, qn, kn);

		if (hd.neox || hd.q_norm != NULL) {
			qkv_refused(&hd, one, 1, 0, CUDA_PROBE_INT8);
			qkv_refused(&hd, two, 2, 0, CUDA_PROBE_FEW);
			continue;
		}
		for (int kind = 1; kind < N_KINDS; kind++) { /* fp32 and q8 pools: qk_kernel stores them */
			qkv_refused(&hd, one, 1, kind, CUDA_PROBE_INT8);
			qkv_refused(&hd, two, 2, kind, CUDA_PROBE_FEW);
		}
		qkv_refused(&hd, three, 1, 0, CUDA_PROBE_INT8);
		qkv_refused(&hd, nine, 2, 0, CUDA_PROBE_FEW);
		for (int v = 0; v < 8; v++) {
			hd.bq = v & 1 ? bq : NULL, hd.bk = v & 1 ? bk : NULL, hd.bv = v & 1 ? bv : NULL;
			hd.pos_div = v & 2 ? 4.0f : 1.0f;
			hd.head_dim = v & 4 ? 128 : head_cfgs[c].head_dim; /* llama's */
			worst = fmax(worst, qkv_cases(&hd, &int8));
			worst_few = fmax(worst_few, qkv_cases(&hd, &few));
		}
	}
	{
		struct cuda_probe_heads hd = heads_cfg(0, bq, bk, bv, qn, kn);

		hd.n_head = 32, hd.n_head_kv = 8, hd.head_dim = 128;
		worst_few = fmax(worst_few, qkv_cases(&hd, &few_8b));
	}
	print_message("qkv in the product: max error / head max %.2e (int8), %.2e (mmt) against the product, "
	    "then qk (bound %.0e)\n", worst, worst_few, TOL_F32);
	free(bq), free(bk), free(bv), free(qn), free(kn);
}

/* softmax(q . K * scale) V over the positions [p0, pos] of a sequence, in float64. */
static void
ref_attention(const float *qh, const struct kv_pool *kp, const struct cuda_probe_heads *hd,
    const struct place *pl, int tab, int pos, int kvh, float *out, double *vmax)
{
	int d = hd->head_dim, p0 = hd->window > 0 && pos >= hd->window ? pos - hd->window + 1 : 0;
	double *s = xmalloc((size_t)(pos + 1) * sizeof *s), mx = -INFINITY, sum = 0;
	double *acc = xcalloc((size_t)d, sizeof *acc);

	*vmax = 0;
	for (int p = p0; p <= pos; p++) {
		double dot = 0;

		for (int i = 0; i < d; i++)
			dot += (double)qh[i] * pool_get(kp, pool_at(hd, pl, tab, p, 0, kvh, i));
		s[p] = dot * hd->scale;
		mx = fmax(mx, s[p]);
	}
	for (int p = p0; p <= pos; p++) {
		s[p] = exp(s[p] - mx);
		sum += s[p];
	}
	for (int p = p0; p <= pos; p++)
		for (int i = 0; i < d; i++) {
			double vv = pool_get(kp, pool_at(hd, pl, tab, p, 1, kvh, i));

			acc[i] += s[p] / sum * vv;
			*vmax = fmax(*vmax, fabs(vv));
		}
	for (int i = 0; i < d; i++)
		out[i] = (float)acc[i];
	free(s), free(acc);
}

/*
 * One head configuration of cuda_attention over a pool of random K/V (NaN
 * where no position is) for a step of sequences; split: with the scratch
 * of split attention; flash: prefill tiles on the tensor cores; dec: the
 * other tokens on the tensor-core decode kernel. The output's fp16 form
 * is asked for too (not from an fp32 pool), and without prefill tiles its
 * int8 form, both checked against the floats the kernels wrote.
 */
static double
attention_case(size_t c, const struct seq_spec *seqs, int n_seqs, int kind, int split, int flash, int dec)
{
	struct place pl;
	struct cuda_probe_heads hd = heads_cfg(c, NULL, NULL, NULL, NULL, NULL);
	int d = hd.head_dim, nq = hd.n_head * d, group = hd.n_head / hd.n_head_kv;
	float *q, *out, *q8d = NULL, *h16s = NULL, *ref = xmalloc((size_t)d * sizeof *ref);
	int8_t *q8 = NULL;
	uint16_t *h16 = NULL;
	struct kv_pool kp;
	char err[ERR_LEN];
	double worst = 0, vmax;
	int rc;

	place_seqs(&pl, seqs, n_seqs);
	kp = pool_new(pool_len(&hd, &pl), (size_t)hd.n_head_kv * d, kind);
	for (int s = 0; s < pl.n_seqs; s++)
		for (int p = 0; p < pl.len[s]; p++)
			for (int kvs = 0; kvs < 2; kvs++)
				for (int h = 0; h < hd.n_head_kv; h++)
					pool_fill(&kp, pool_at(&hd, &pl, pl.tab0[s], p, kvs, h, 0), d);
	/* queries large enough that the softmax is far from uniform */
	q = rand_floats((size_t)pl.n_tok * nq, -4, 4);
	out = nan_floats((size_t)pl.n_tok * nq);
	struct cuda_probe_kv kv = probe_kv(&pl, &kp, split, flash);
	double tol = flash || dec ? TOL_FLASH : TOL_ATTN;
	kv.dec_tc = dec;
	if (!flash)
		q8 = xmalloc((size_t)pl.n_tok * 2 * nq), q8d = nan_floats((size_t)pl.n_tok * nq / 16);
	if (!kp.f32)
		h16 = xmalloc((size_t)pl.n_tok * nq * sizeof *h16), h16s = nan_floats((size_t)pl.n_tok);
	rc = cuda_probe_attention(probe, &hd, &kv, q, pl.n_tok, out, q8, q8d, h16, h16s, err);
	if (rc == ERR_UNSUPPORTED && dec) { /* the decode kernel's shared memory does not fit this device */
		print_message("attention head_dim %d, %s pool: %s: not checked here\n", d, pool_name(&kp), err);
		goto out;
	}
	if (rc != 0)
		fail_msg("attention head_dim %d, %s pool, split %d, flash %d, dec %d: %s", d, pool_name(&kp), split, flash,
		    dec, err);
	/* fails on any element outside its bound; the floats' error is what this case reports */
	if (q8 != NULL)
		(void)check_rows_q8("attention output", q8, q8d, out, pl.n_tok, nq);
	if (h16 != NULL)
		(void)check_rows_f16("attention output", h16, h16s, out, pl.n_tok, nq);
	for (int t = 0; t < pl.n_tok; t++)
		for (int h = 0; h < hd.n_head; h++) {
			const float *got = out + ((size_t)t * hd.n_head + h) * d;

			ref_attention(q + ((size_t)t * hd.n_head + h) * d, &kp, &hd, &pl, pl.tok_tab[t],
			    pl.tok_pos[t], h / group, ref, &vmax);
			for (int i = 0; i < d; i++) {
				double e = fabs((double)got[i] - ref[i]) / vmax;

				if (!(e <= tol))
					fail_msg("attention head_dim %d, %d/%d heads, window %d, %s pool, split %d, flash %d, "
					    "dec %d: token %d (position %d) head %d element %d: gpu %g reference %g", d,
					    hd.n_head, hd.n_head_kv, hd.window, pool_name(&kp), split, flash, dec, t,
					    pl.tok_pos[t], h, i, got[i], ref[i]);
				worst = fmax(worst, e);
			}
		}
out:
	free(q), free(out), free(q8), free(q8d), free(h16), free(h16s), free(ref), free(kp.data);
	return worst;
}

/* Decodes only: one token each over long contexts, where split attention cuts them into many pieces. */
static const struct seq_spec decode_seqs[] = { { 700, 1 }, { 1, 1 }, { 130, 1 } };

/*
 * The worst attention_case over every head shape and the n placements of
 * sets (flash, dec as attention_case's), printed as what's error on a
 * pool of kind, in one piece or split.
 */
static void
attention_sweep(const char *what, const struct seq_set *sets, size_t n, int kind, int split, int flash, int dec)
{
	double worst = 0;

	for (size_t c = 0; c < ARRAY_LEN(head_cfgs); c++)
		for (size_t i = 0; i < n; i++)
			worst = fmax(worst, attention_case(c, sets[i].s, sets[i].n, kind, split, flash, dec));
	print_message("attention, %s pool, %s%s: max error / max |V| %.2e (bound %.0e)\n", kind_names[kind], what,
	    split ? "split and merged" : "one piece", worst, flash || dec ? TOL_FLASH : TOL_ATTN);
}

static void
test_attention(void **state)
{
	static const struct seq_set sets[] = { { step_seqs, ARRAY_LEN(step_seqs) },
		{ decode_seqs, ARRAY_LEN(decode_seqs) } };

	(void)state;
	for (int kind = 0; kind < N_KINDS; kind++)
		for (int split = 0; split < 2; split++)
			attention_sweep("", sets, ARRAY_LEN(sets), kind, split, 0, 0);
}

/*
 * A decode step of one token a sequence, at positions lens[i] - 1, whose
 * attention kernel does qk's work (cuda_kv.k_new; with dec, the
 * tensor-core decode kernel), against cuda_qk then cuda_attention on the
 * same raw q, k and v: the output within TOL_F32 of the row's largest
 * value (TOL_FLASH on the decode kernel, below) and the whole pool the
 * same but for fp16's rounding (the same arithmetic). Returns the worst
 * output error, or -1 where the decode kernel does not take the heads
 * (more query heads a KV head than its block's rows) or does not fit the
 * device.
 */
static double
attention_new_case(size_t c, const int *lens, int n_tok, int kind, int split, int dec, float *bq, float *bk,
    float *bv, float *qn, float *kn)
{
	struct seq_spec seqs[MAX_SEQS];
	struct place pl;
	struct cuda_probe_heads hd = heads_cfg(c, bq, bk, bv, qn, kn);
	int d = hd.head_dim, nq = hd.n_head * d, nkv = hd.n_head_kv * d;
	struct kv_pool kp, kpr;
	char err[ERR_LEN], what[160];
	float *q, *k, *v, *qr, *out, *outr;
	double worst;
	size_t np;
	int rc;

	assert_true(n_tok <= MAX_SEQS);
	for (int s = 0; s < n_tok; s++)
		seqs[s] = (struct seq_spec){ lens[s], 1 };
	place_seqs(&pl, seqs, n_tok);
	snprintf(what, sizeof what, "attention with qk's work, head_dim %d, %d/%d heads, %s pool, split %d, dec %d, "
	    "%d sequence(s), the first at position %d", d, hd.n_head, hd.n_head_kv, kind_names[kind], split, dec, n_tok,
	    lens[0] - 1);
	np = pool_len(&hd, &pl);
	kp = pool_new(np, (size_t)nkv, kind), kpr = pool_new(np, (size_t)nkv, kind);
	for (int s = 0; s < n_tok; s++)
		for (int p = 0; p < lens[s] - 1; p++)
			for (int kvs = 0; kvs < 2; kvs++)
				for (int h = 0; h < hd.n_head_kv; h++)
					pool_fill(&kp, pool_at(&hd, &pl, pl.tab0[s], p, kvs, h, 0), d);
	memcpy(kpr.data, kp.data, pool_bytes(&kp));
	q = rand_floats((size_t)n_tok * nq, -4, 4), k = rand_floats((size_t)n_tok * nkv, -2, 2);
	v = rand_floats((size_t)n_tok * nkv, -1, 1);
	qr = xmalloc((size_t)n_tok * nq * sizeof *qr);
	memcpy(qr, q, (size_t)n_tok * nq * sizeof *qr);
	out = nan_floats((size_t)n_tok * nq), outr = nan_floats((size_t)n_tok * nq);
	struct cuda_probe_kv kv = probe_kv(&pl, &kp, split, 0), kvr = probe_kv(&pl, &kpr, split, 0);
	kv.dec_tc = kvr.dec_tc = dec;
	rc = cuda_probe_attention_new(probe, &hd, &kv, q, k, v, n_tok, out, err);
	if (rc == ERR_UNSUPPORTED && dec) {
		worst = -1;
		goto out;
	}
	if (rc != 0)
		fail_msg("%s: %s", what, err);
	if (cuda_probe_qk(probe, &hd, &kvr, qr, k, v, n_tok, err) != 0 ||
	    cuda_probe_attention(probe, &hd, &kvr, qr, n_tok, outr, NULL, NULL, NULL, NULL, err) != 0)
		fail_msg("%s: qk, then attention: %s", what, err);
	/*
	 * the decode kernel rounds q to fp16: a multiply-add its new-token work
	 * contracts otherwise than qk_kernel can round an element the other way
	 * (1.4e-5 of a row's largest measured), within that kernel's bound
	 */
	worst = check_rows_tol(what, out, outr, n_tok * hd.n_head, d, dec ? TOL_FLASH : TOL_F32);
	for (size_t i = 0; i < np; i++) {
		double g = pool_get(&kp, i), r = pool_get(&kpr, i);

		if (pool_poisoned(&kpr, i) != pool_poisoned(&kp, i) ||
		    (!pool_poisoned(&kpr, i) && !(fabs(g - r) <= ldexp(fabs(r), -10) + TOL_F32)))
			fail_msg("%s: pool element %zu: %g, qk's %g", what, i, g, r);
	}
out:
	free(q), free(k), free(v), free(qr), free(out), free(outr), free(kp.data), free(kpr.data);
	return worst;
}

/*
 * The attention kernel doing qk's work for a decode step, as the backend
 * asks it where the product cannot (QK norms, neox pairs): every head
 * shape (biases, norms with and without an offset, windows, a RoPE
 * position divisor), every kind of pool, one piece and split, one token
 * at the first position, inside the first block and past several blocks,
 * and a step of those four sequences' tokens at once; on the split kernel,
 * and for fp16 and q8 pools on the tensor-core decode kernel.
 */
static void
test_attention_new(void **state)
{
	static const int lens[] = { 1, 17, 130, 700 };
	float *bq = rand_floats(BIAS_FLOATS, -0.5f, 0.5f), *bk = rand_floats(BIAS_FLOATS, -0.5f, 0.5f);
	float *bv = rand_floats(BIAS_FLOATS, -0.5f, 0.5f), *qn = rand_floats(256, 0.5f, 1.5f);
	float *kn = rand_floats(256, 0.5f, 1.5f);
	double worst = 0, e;
	int on_tc = 0, off_tc = 0;

	(void)state;
	for (size_t c = 0; c < ARRAY_LEN(head_cfgs); c++)
		for (int kind = 0; kind < N_KINDS; kind++)
			for (int split = 0; split < 2; split++)
				for (int dec = 0; dec < (KIND_F32(kind) ? 1 : 2); dec++) /* no decode kernel on fp32 */
					for (size_t i = 0; i <= ARRAY_LEN(lens); i++) { /* each alone, then all at once */
						e = i < ARRAY_LEN(lens) ?
						    attention_new_case(c, lens + i, 1, kind, split, dec, bq, bk, bv, qn, kn) :
						    attention_new_case(c, lens, ARRAY_LEN(lens), kind, split, dec, bq, bk, bv, qn,
						    kn);
						on_tc += dec && e >= 0, off_tc += dec && e < 0;
						worst = fmax(worst, e);
					}
	print_message("attention with qk's work for a decode step: max error / head max %.2e against qk, then "
	    "attention (bound %.0e); %d cases on the tensor-core decode kernel, %d it does not take\n", worst, TOL_F32,
	    on_tc, off_tc);
	assert_true(on_tc > 0);
	free(bq), free(bk), free(bv), free(qn), free(kn);
}

/*
 * Chunks for the tensor-core kernel (one past a window, one exactly the
 * minimum) beside tokens for the split kernel: a decode, and 3, 2 and 4
 * new tokens of a sequence (the last over a long context, as its guesses).
 */
static const struct seq_spec prefill_seqs[] = { { 300, 100 }, { 70, 17 }, { 16, 16 }, { 1, 1 }, { 40, 3 },
	{ 50, 2 }, { 900, 4 } };

/*
 * The tensor-core prefill kernel (fp16 and q8 pools; not in exact mode)
 * beside the split kernel, which takes the other tokens.
 */
static void
test_flash(void **state)
{
	static const struct seq_set sets[] = { { prefill_seqs, ARRAY_LEN(prefill_seqs) },
		{ step_seqs, ARRAY_LEN(step_seqs) } };
	static const int kinds[] = { 0, 2 };

	(void)state;
	for (size_t k = 0; k < ARRAY_LEN(kinds); k++)
		for (int split = 0; split < 2; split++)
			attention_sweep("prefill on the tensor cores, ", sets, ARRAY_LEN(sets), kinds[k], split, 1, 0);
}

/*
 * Decode tokens on the tensor cores (cuda_kv.dec_tc; fp16 and q8 pools):
 * alone over long contexts, beside other tokens of a step, and beside
 * prefill tiles.
 */
static void
test_decode_tc(void **state)
{
	static const struct seq_set sets[] = { { decode_seqs, ARRAY_LEN(decode_seqs) },
		{ step_seqs, ARRAY_LEN(step_seqs) } }, tiles[] = { { prefill_seqs, ARRAY_LEN(prefill_seqs) } };
	static const int kinds[] = { 0, 2 };

	(void)state;
	for (size_t k = 0; k < ARRAY_LEN(kinds); k++)
		for (int split = 0; split < 2; split++) {
			attention_sweep("decode on the tensor cores, ", sets, ARRAY_LEN(sets), kinds[k], split, 0, 1);
			attention_sweep("decode on the tensor cores beside prefill tiles, ", tiles, ARRAY_LEN(tiles),
			    kinds[k], split, 1, 1);
		}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qk),
		cmocka_unit_test(test_qkv),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_attention_new),
		cmocka_unit_test(test_flash),
		cmocka_unit_test(test_decode_tc),
	};

	return cuda_ops_run("test_cuda_attn", tests, ARRAY_LEN(tests));
}
