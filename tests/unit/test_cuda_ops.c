/*
 * test_cuda_ops.c: the CUDA backend's kernels one at a time against the
 * CPU backend's (kernels/cpu/cpu_ops.h) or a plain reference, through
 * kernels/cuda/cuda_probe.h.
 *
 * Inputs are fresh random numbers every run; the seed is printed, and
 * TEST_CUDA_OPS_SEED=N repeats a run; TEST_CUDA_OPS_ONLY=PATTERN runs
 * the tests whose names match it (cmocka's pattern: * and ?), so that a
 * sanitizer's slow run can take the kernels it is about. Quantized
 * weights are random bytes with block scales that keep the values near
 * [-1, 1], so every bit of the packed quants and sub-block scales is
 * exercised. Shapes are chosen not
 * to be multiples of the kernels' tiles: rows not multiples of 4, token
 * counts not multiples of 8, rows of 8-element chunks not multiples of the
 * 128 threads, widths not multiples of 256, sequence lengths not multiples
 * of the 16-token KV block, head counts not multiples of 4. The probe
 * fills every output with NaN bytes before the kernel runs and checks the
 * bytes after each buffer, so a missed or a stray write fails.
 *
 * Tolerances, and why:
 * - dequantization (embedding rows): the same float operations as
 *   quant.c, but the compiler may fuse a product and a difference: 1e-6 of
 *   the row's largest value;
 * - products, against cpu_matmul, as a fraction of sum |w_i x_i| (the
 *   size of the dot product's terms, which bounds any rounding error):
 *   matrix-vector kernels (float32 throughout, another summation order)
 *   2e-5; the many-token paths (the tensor-core kernel on quantized
 *   blocks, cuBLAS on the others), which round both operands to fp16 (at
 *   most 2^-10 of each product) and accumulate in float32, 2e-3;
 * - norms, GLU, RoPE: float32 with other reduction orders and CUDA's
 *   expf/tanhf/sinf/cosf (2 ulp): 1e-5 relative;
 * - K and V in the fp16 pool: half an fp16 ulp (2^-11) of the value, plus
 *   the float32 error above; in the fp32 pool (exact mode) the float32
 *   error alone;
 * - attention, against a float64 softmax over the same K/V (fp16 or fp32
 *   pool, one piece or split and merged): 1e-5 of the largest value it
 *   averages; prefill tiles on the tensor cores (fp16 queries and
 *   weights): 3e-3;
 * - argmax: exact, the lowest index among equal maxima.
 *
 * Without a CUDA device the program says so and exits 77 (a skip).
 */
#include "config.h"
#include "cpu_ops.h"
#include "cpu_pool.h"
#include "cuda_probe.h"
#include "kernels.h"
#include "model.h"
#include "quant.h"
#include "sample.h"
#include "util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define TOL_DEQ 1e-6
#define TOL_MATVEC 2e-5
#define TOL_GEMM 2e-3
/*
 * int8 activations with an int8 remainder: about 15 bits per value, relative
 * to each 32's largest (1/127 of it, then 1/254 of that step): ~3e-5 of
 * the block's scale per term, so 5e-4 of sum |w x| leaves room for blocks
 * whose largest value dwarfs the rest, and stays 4x under cuBLAS's fp16.
 */
#define TOL_INT8 5e-4
#define TOL_F32 1e-5
#define TOL_ATTN 1e-5
/*
 * Prefill attention on the tensor cores rounds the scaled queries and the
 * softmax weights to fp16 (2^-11 relative each) and sums in float: scores
 * of these tests reach ~10, so a weight errs by ~1e-3 of itself at worst.
 */
#define TOL_FLASH 3e-3
#define CPU_THREADS 4
#define MAX_SEQS 8
#define MAX_TOK 256
#define MAX_TAB 128
#define N_LAYER 3       /* layers of the KV pool; the heads use the middle one */
#define POISON16 0xffff /* an fp16 NaN: what the pool holds where nothing was written */
#define POISON32 0xffffffffu /* the same in an fp32 pool */

static uint64_t rng_state;
static struct cuda_probe *probe;
static struct cpu_pool *pool;

/* splitmix64: the next 64 random bits. */
static uint64_t
rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static float
unif(float lo, float hi)
{
	return lo + (hi - lo) * (float)((double)(rnd() >> 11) / 9007199254740992.0);
}

/* n floats uniform in [lo, hi), malloc'd. */
static float *
rand_floats(size_t n, float lo, float hi)
{
	float *f = xmalloc((n ? n : 1) * sizeof *f);

	for (size_t i = 0; i < n; i++)
		f[i] = unif(lo, hi);
	return f;
}

/* n floats, all NaN: what an output holds before the call that fills it. */
static float *
nan_floats(size_t n)
{
	float *f = xmalloc((n ? n : 1) * sizeof *f);

	for (size_t i = 0; i < n; i++)
		f[i] = NAN;
	return f;
}

static double
max_abs(const float *a, size_t n)
{
	double m = 0;

	for (size_t i = 0; i < n; i++)
		m = fmax(m, fabs((double)a[i]));
	return m;
}

/* ---- weights ---- */

static const uint32_t all_types[] = {
	TT_F32, TT_F16, TT_BF16, TT_Q8_0, TT_Q4_0, TT_Q5_0, TT_Q4_K, TT_Q5_K, TT_Q6_K, TT_MXFP4,
};

/*
 * Where a block type keeps its fp16 scales, and the largest multiple of d
 * its quants reach (so that d = 1 / range keeps the values within +-1).
 */
static const struct {
	uint32_t type;
	int d_off, dmin_off; /* dmin_off -1: none */
	float range;
} block_scales[] = {
	{ TT_Q8_0, 0, -1, 127 }, { TT_Q4_0, 0, -1, 8 }, { TT_Q5_0, 0, -1, 16 },
	{ TT_Q4_K, 0, 2, 63 * 15 }, { TT_Q5_K, 0, 2, 63 * 31 }, { TT_Q6_K, 208, -1, 128 * 32 },
};

static void
put_f16(uint8_t *p, float f)
{
	uint16_t h = fp32_to_fp16(f);

	memcpy(p, &h, sizeof h);
}

/*
 * Widths of the products: one block (or unit), several, for 32-blocks a
 * width of no whole 64, and one past the integer kernel's MMQ_WIDE_K
 * (8,192), where one token takes 2 rows a warp, or 4 rows a pair of
 * warps (Q4_K, Q6_K; 3 rows leave a pair of a block with none).
 */
enum width { W_SMALL, W_MID, W_ODD, W_WIDE };

/*
 * Elements of a row of type for a width: a multiple of its block whose
 * 8-element chunks are not a multiple of 128.
 */
static int64_t
row_len(uint32_t type, enum width w)
{
	int be = quant_traits(type)->block_elems;

	if (w == W_SMALL)
		return be == 1 ? 8 : be == 32 ? 64 : be;
	if (w == W_ODD && be == 32)
		return 32 * 37;
	if (w == W_WIDE)
		return 256 * 33;
	return be == 1 ? 8 * 149 : be == 32 ? 64 * 19 : 256 * 5;
}


/*
 * n random rows of k elements of type, as stored (malloc'd): float types
 * from uniform values, block types random bytes with sane scales. *f gets
 * the rows dequantized (malloc'd), as the CPU backend reads them.
 */
static struct model_tensor
random_weight(uint32_t type, int64_t k, int64_t n, float **f)
{
	const struct quant_traits *qt = quant_traits(type);
	struct model_tensor t = { "w", type, 2, { k, n, 1, 1 }, NULL, 0 };
	size_t row_bytes, nb, i;
	uint8_t *d;

	assert_int_equal(quant_row_bytes(type, k, &row_bytes), 0);
	t.bytes = row_bytes * (size_t)n;
	d = xmalloc(t.bytes);
	if (qt->block_elems == 1) {
		float *src = rand_floats((size_t)(k * n), -1, 1);

		assert_int_equal(quant_quantize(type, src, d, k * n), 0);
		free(src);
	} else {
		for (i = 0; i < t.bytes; i++)
			d[i] = (uint8_t)rnd();
		nb = t.bytes / (size_t)qt->block_bytes;
		for (i = 0; type == TT_MXFP4 && i < nb; i++) /* scales of 2^-4 to 2^-2: values within +-1.5 */
			d[i * (size_t)qt->block_bytes] = (uint8_t)(123 + rnd() % 3);
		for (size_t s = 0; s < ARRAY_LEN(block_scales); s++) {
			if (block_scales[s].type != type)
				continue;
			for (i = 0; i < nb; i++) {
				uint8_t *b = d + i * (size_t)qt->block_bytes;

				put_f16(b + block_scales[s].d_off, unif(0.5f, 1.0f) / block_scales[s].range);
				if (block_scales[s].dmin_off >= 0)
					put_f16(b + block_scales[s].dmin_off, unif(0.0f, 1.0f) / 63.0f);
			}
		}
	}
	t.data = d;
	*f = xmalloc((size_t)(k * n) * sizeof **f);
	quant_dequantize(type, d, *f, k * n);
	return t;
}

static struct cuda_probe_weight
probe_weight(const struct model_tensor *t)
{
	struct cuda_probe_weight w = { t->type, t->ne[0], t->ne[1], t->data };

	return w;
}

/* ---- embedding rows ---- */

static void
test_embed(void **state)
{
	char err[ERR_LEN];

	(void)state;
	for (size_t ti = 0; ti < ARRAY_LEN(all_types); ti++) {
		uint32_t type = all_types[ti];
		int64_t k = row_len(type, W_ODD), n = 37;
		int32_t tokens[11] = { 0, 36 };
		float *wf, *ref = xmalloc((size_t)k * sizeof *ref), *out = nan_floats(11 * (size_t)k);
		float scale = ti % 2 ? 1.0f : unif(0.5f, 4.0f);
		struct model_tensor t = random_weight(type, k, n, &wf);
		struct cuda_probe_weight w = probe_weight(&t);
		double worst = 0;

		for (int i = 2; i < 11; i++)
			tokens[i] = (int32_t)(rnd() % (uint64_t)n);
		if (cuda_probe_embed(probe, &w, tokens, 11, scale, out, err) != 0)
			fail_msg("embed %s: %s", quant_traits(type)->name, err);
		for (int i = 0; i < 11; i++) {
			double m;

			cpu_get_row(&t, tokens[i], ref);
			for (int64_t j = 0; j < k; j++)
				ref[j] = scale != 1.0f ? ref[j] * scale : ref[j];
			m = max_abs(ref, (size_t)k);
			for (int64_t j = 0; j < k; j++) {
				double e = fabs((double)out[(size_t)i * k + j] - ref[j]) / m;

				if (!(e <= TOL_DEQ))
					fail_msg("embed %s: token %d (row %d) element %lld: gpu %g cpu %g",
					    quant_traits(type)->name, i, tokens[i], (long long)j,
					    out[(size_t)i * k + j], ref[j]);
				worst = fmax(worst, e);
			}
		}
		print_message("embed  %-5s k %5lld: max error / row max %.2e (bound %.0e)\n",
		    quant_traits(type)->name, (long long)k, worst, TOL_DEQ);
		free((void *)t.data), free(wf), free(ref), free(out);
	}
}

/* ---- products ---- */

static double
path_tol(enum cuda_probe_path path)
{
	return path == CUDA_PROBE_MATVEC ? TOL_MATVEC : path == CUDA_PROBE_INT8 ? TOL_INT8 : TOL_GEMM;
}

static const char *
path_name(enum cuda_probe_path path)
{
	return path == CUDA_PROBE_MATVEC ? "matvec" : path == CUDA_PROBE_INT8 ? "int8" :
	    path == CUDA_PROBE_GEMM ? "gemm" : path == CUDA_PROBE_FEW ? "few" : "gemm-whole";
}

/* Fails unless y (n_tok x n) is t x within tol of sum |w x| per value; returns the worst error / sum |w x|. */
static double
check_product(const char *what, const struct model_tensor *t, const float *wf, const float *x, int n_tok,
    const float *y, double tol)
{
	int64_t k = t->ne[0], n = t->ne[1];
	float *ref = nan_floats((size_t)(n * n_tok));
	float *scratch = xmalloc((size_t)(CPU_THREADS * CPU_MM_ROWS * k) * sizeof *scratch);
	double worst = 0;
	struct cpu_act in;

	cpu_act_init(&in, x, k, n_tok, k, NULL); /* float activations: the exact product */
	cpu_matmul(pool, &in, 1, &t, &ref, &n, scratch);
	for (int tk = 0; tk < n_tok; tk++)
		for (int64_t o = 0; o < n; o++) {
			double size = 0, e;

			for (int64_t i = 0; i < k; i++)
				size += fabs((double)wf[o * k + i] * x[(size_t)tk * k + i]);
			e = fabs((double)y[(size_t)tk * n + o] - ref[(size_t)tk * n + o]) / size;
			if (!(e <= tol))
				fail_msg("%s %s %lld x %lld, %d tokens: token %d row %lld: gpu %g cpu %g, error %.2e of "
				    "sum |w x| %g", what, quant_traits(t->type)->name, (long long)n, (long long)k, n_tok,
				    tk, (long long)o, y[(size_t)tk * n + o], ref[(size_t)tk * n + o], e, size);
			worst = fmax(worst, e);
		}
	free(ref), free(scratch);
	return worst;
}

/* One product on a path, checked against cpu_matmul; returns the worst error / sum |w x|. */
static double
check_matmul(const struct model_tensor *t, const float *wf, const float *x, int n_tok,
    enum cuda_probe_path path, int64_t tile_rows, int reuse_x, int n_parts)
{
	int64_t n = t->ne[1];
	float *y = nan_floats((size_t)(n * n_tok));
	struct cuda_probe_weight w = probe_weight(t);
	double worst;
	char err[ERR_LEN], what[96];

	if (cuda_probe_matmul(probe, &w, n_parts, x, n_tok, path, tile_rows, reuse_x, y, err) != 0)
		fail_msg("matmul %s %s in %d parts: %s", path_name(path), quant_traits(t->type)->name, n_parts, err);
	snprintf(what, sizeof what, "matmul %s (tile %lld, reuse %d, %d parts)", path_name(path),
	    (long long)tile_rows, reuse_x, n_parts);
	worst = check_product(what, t, wf, x, n_tok, y, path_tol(path));
	free(y);
	return worst;
}

/*
 * Rows, tokens, cuBLAS tile rows, width and an fp16-overflowing last token
 * of the products tried on each path. The many-token shapes cut the
 * tensor-core kernel's tiles (64 or 128 rows, 16 to 128 tokens) unevenly,
 * split K or not, and reach 4,100 rows and 4,100 tokens. The few-token
 * shapes cut mmt.cu's tiles of 16 rows unevenly and give its warps 1 to 33
 * blocks of a row (some none), with 1 to 8 tokens, in blocks of 8 warps
 * and (8,464 rows: 529 tiles, on up to 132 multiprocessors) of 4.
 */
struct mm_shape {
	int n, n_tok, tile;
	enum width w;
	int big_row;
};
static const struct mm_shape mv_shapes[] = {
	{ 1, 1, 0, W_SMALL, 0 }, { 37, 1, 0, W_MID, 0 }, { 130, 3, 0, W_SMALL, 0 }, { 259, 13, 0, W_MID, 0 },
	{ 6, 8, 0, W_MID, 0 }, { 37, 1, 0, W_WIDE, 0 }, { 3, 1, 0, W_WIDE, 0 },
}, mm_shapes[] = {
	{ 37, 9, 0, W_MID, 0 }, { 259, 33, 64, W_MID, 1 }, { 130, 100, 7, W_SMALL, 0 }, { 5, 17, 0, W_MID, 1 },
	{ 64, 64, 0, W_MID, 0 }, { 100, 513, 0, W_MID, 0 }, { 4100, 17, 0, W_MID, 0 }, { 9, 4100, 0, W_SMALL, 0 },
	{ 33, 40, 5, W_ODD, 0 },
}, few_shapes[] = {
	{ 1, 1, 0, W_SMALL, 0 }, { 37, 2, 0, W_MID, 0 }, { 130, 3, 0, W_WIDE, 0 }, { 16, 8, 0, W_MID, 1 },
	{ 259, 5, 0, W_MID, 0 }, { 6, 8, 0, W_SMALL, 0 }, { 33, 7, 0, W_ODD, 0 }, { 4100, 4, 0, W_MID, 0 },
	{ 8464, 6, 0, W_SMALL, 0 }, { 5000, 3, 0, W_MID, 0 },
};

/* Every type on one path over its shapes; on the many-token paths a second weight reuses the fp16 x. */
static void
matmul_path(enum cuda_probe_path path)
{
	int mv = path == CUDA_PROBE_MATVEC || path == CUDA_PROBE_INT8;
	const struct mm_shape *shapes = mv ? mv_shapes : path == CUDA_PROBE_FEW ? few_shapes : mm_shapes;
	int n_shapes = mv ? (int)ARRAY_LEN(mv_shapes) :
	    path == CUDA_PROBE_FEW ? (int)ARRAY_LEN(few_shapes) : (int)ARRAY_LEN(mm_shapes);

	for (size_t ti = 0; ti < ARRAY_LEN(all_types); ti++) {
		uint32_t type = all_types[ti];
		double worst = 0;

		for (int s = 0; s < n_shapes; s++) {
			int n = shapes[s].n, n_tok = shapes[s].n_tok, tile = shapes[s].tile, big = shapes[s].big_row;
			enum width wd = shapes[s].w;
			int64_t k = row_len(type, wd);
			float *wf, *wf2, *x = rand_floats((size_t)(n_tok * k), -1, 1);
			struct model_tensor t = random_weight(type, k, n, &wf);

			/* a last token beyond fp16's range: the many-token paths scale it by a power of two */
			for (int64_t i = 0; big && i < k; i++)
				x[(size_t)(n_tok - 1) * k + i] *= 1e5f;
			worst = fmax(worst, check_matmul(&t, wf, x, n_tok, path, tile, 0, 1));
			/* as Q, K and V: three weights one after the other, one launch */
			if (n >= 3)
				worst = fmax(worst, check_matmul(&t, wf, x, n_tok, path, tile, 0, 3));
			if (!mv) {
				struct model_tensor t2 = random_weight(type, k, n + 3, &wf2);

				worst = fmax(worst, check_matmul(&t2, wf2, x, n_tok, path, tile, 1, 1));
				free((void *)t2.data), free(wf2);
			}
			free((void *)t.data), free(wf), free(x);
		}
		print_message("matmul %-10s %-5s: max error / sum |w x| %.2e (bound %.0e)\n",
		    path_name(path), quant_traits(type)->name, worst, path_tol(path));
	}
}

static void
test_matvec(void **state)
{
	(void)state;
	matmul_path(CUDA_PROBE_MATVEC);
}

static void
test_gemm(void **state)
{
	(void)state;
	matmul_path(CUDA_PROBE_GEMM);
}

/*
 * Products of more tiles than one wave of the GPU holds, whose last wave
 * would be under half full, as Q, K and V: on a 132-multiprocessor GPU
 * (an H100 SXM, an H200), which holds one prefill tile a multiprocessor of
 * the K types and Q8_0, 4,100 rows (33 row tiles) by 520 tokens (5 token
 * tiles) run their last 7 row tiles as a second launch with K split, from
 * inside the last output; 4,200 rows by 700 tokens (33 x 6 tiles) their
 * last 11, from 16 rows into it. K is two units, so that the launch can
 * split.
 */
static void
test_gemm_waves(void **state)
{
	static const uint32_t types[] = { TT_Q4_K, TT_Q5_K, TT_Q6_K, TT_Q8_0 };
	static const int shapes[][2] = { { 4100, 520 }, { 4200, 700 } };

	(void)state;
	for (size_t ti = 0; ti < ARRAY_LEN(types); ti++)
		for (size_t si = 0; si < ARRAY_LEN(shapes); si++) {
			int n = shapes[si][0], n_tok = shapes[si][1];
			int64_t k = 2 * MAX(quant_traits(types[ti])->block_elems, 64); /* two of qgemm's units */
			float *wf, *x = rand_floats((size_t)n_tok * (size_t)k, -1, 1);
			struct model_tensor t = random_weight(types[ti], k, n, &wf);
			double worst = check_matmul(&t, wf, x, n_tok, CUDA_PROBE_GEMM, 0, 0, 3);

			print_message("matmul %-10s %-5s %d x %d: max error / sum |w x| %.2e (bound %.0e)\n",
			    path_name(CUDA_PROBE_GEMM), quant_traits(types[ti])->name, n, n_tok, worst,
			    path_tol(CUDA_PROBE_GEMM));
			free((void *)t.data), free(wf), free(x);
		}
}

static void
test_few(void **state)
{
	(void)state;
	matmul_path(CUDA_PROBE_FEW);
}

static void
test_gemm_whole(void **state)
{
	(void)state;
	matmul_path(CUDA_PROBE_GEMM_WHOLE);
}

static void
test_int8(void **state)
{
	(void)state;
	matmul_path(CUDA_PROBE_INT8);
}

/* Types of the integer kernels and of mmt.cu's, which put weights of two of them in one launch. */
static const uint32_t int8_types[] = { TT_Q4_K, TT_Q6_K, TT_Q8_0 };
static const uint32_t few_types[] = { TT_Q4_K, TT_Q6_K };

/*
 * Q and K of one type and V of another (a Q4_K_M file's Q6_K V), one
 * cuda_matmul_multi on a path: on the int8 path at 1 and 2 tokens one
 * launch runs both types side by side, at 3 two launches do; on mmt.cu's
 * one launch at every count. Row counts cut the warps' row groups and
 * mmt.cu's 16-row tiles unevenly; a long row (8,192) takes the integer
 * kernel's wide shape.
 */
static void
two_types(enum cuda_probe_path path, const uint32_t *types, size_t n_types)
{
	static const struct { int n, n2, n_tok; int64_t k; } shapes[] = {
		{ 37, 9, 1, 256 * 5 }, { 130, 33, 2, 256 * 5 }, { 4100, 17, 1, 256 * 3 }, { 9, 513, 2, 256 * 32 },
		{ 66, 100, 1, 256 * 32 }, { 20, 7, 3, 256 * 2 }, { 5100, 1030, 8, 256 * 2 }, { 64, 48, 5, 256 * 9 },
	};
	for (size_t a = 0; a < n_types; a++)
		for (size_t b = 0; b < n_types; b++) {
			double worst = 0;

			if (a == b)
				continue;
			for (size_t s = 0; s < ARRAY_LEN(shapes); s++) {
				int n = shapes[s].n, n2 = shapes[s].n2, nt = shapes[s].n_tok;
				int64_t k = shapes[s].k;
				float *wf, *wf2, *x = rand_floats((size_t)nt * (size_t)k, -1, 1);
				float *y = nan_floats((size_t)(n * nt)), *y2 = nan_floats((size_t)(n2 * nt));
				struct model_tensor t = random_weight(types[a], k, n, &wf);
				struct model_tensor t2 = random_weight(types[b], k, n2, &wf2);
				struct cuda_probe_weight w = probe_weight(&t), w2 = probe_weight(&t2);
				char err[ERR_LEN];

				if (cuda_probe_matmul_two(probe, &w, &w2, x, nt, path, y, y2, err) != 0)
					fail_msg("%s %s + %s: %s", path_name(path), quant_traits(t.type)->name,
					    quant_traits(t2.type)->name, err);
				worst = fmax(worst, check_product("two types, first", &t, wf, x, nt, y, path_tol(path)));
				worst = fmax(worst, check_product("two types, second", &t2, wf2, x, nt, y2, path_tol(path)));
				free((void *)t.data), free((void *)t2.data), free(wf), free(wf2), free(x), free(y), free(y2);
			}
			print_message("matmul %-10s %-5s + %-5s: max error / sum |w x| %.2e (bound %.0e)\n",
			    path_name(path), quant_traits(types[a])->name, quant_traits(types[b])->name, worst,
			    path_tol(path));
		}
}

static void
test_two_types(void **state)
{
	(void)state;
	two_types(CUDA_PROBE_INT8, int8_types, ARRAY_LEN(int8_types));
	two_types(CUDA_PROBE_FEW, few_types, ARRAY_LEN(few_types));
}

/* ---- norms and GLU ---- */

/* Fails unless every row of got is within TOL_F32 of ref, relative to the row's largest value. */
static double
check_rows(const char *what, const float *got, const float *ref, int n_rows, int n)
{
	double worst = 0;

	for (int r = 0; r < n_rows; r++) {
		double m = max_abs(ref + (size_t)r * n, (size_t)n);

		for (int i = 0; i < n; i++) {
			double e = fabs((double)got[(size_t)r * n + i] - ref[(size_t)r * n + i]) / m;

			if (!(e <= TOL_F32))
				fail_msg("%s: row %d element %d: gpu %g cpu %g", what, r, i, got[(size_t)r * n + i],
				    ref[(size_t)r * n + i]);
			worst = fmax(worst, e);
		}
	}
	return worst;
}

/*
 * Fails unless every fp16-form row (hh, divided by hscale[row]) is ref
 * within fp16's rounding (2^-11 of the value) plus TOL_F32 of the row's
 * largest, and the divisor is 1 unless the row would overflow fp16 (then a
 * power of two that brings it under 32768). Returns the worst error /
 * that bound.
 */
static double
check_rows_f16(const char *what, const uint16_t *hh, const float *hscale, const float *ref, int n_rows, int n)
{
	double worst = 0;

	for (int r = 0; r < n_rows; r++) {
		double m = max_abs(ref + (size_t)r * n, (size_t)n), s = hscale[r];

		if (!(m <= 32768 ? s == 1 : s >= m / 32768 && s < m / 16384 && s == exp2(round(log2(s)))))
			fail_msg("%s: row %d of largest %g: divisor %g", what, r, m, s);
		for (int i = 0; i < n; i++) {
			double ref_i = ref[(size_t)r * n + i], got = fp16_to_fp32(hh[(size_t)r * n + i]) * s;
			double bound = ldexp(fabs(ref_i), -11) + TOL_F32 * m, e = fabs(got - ref_i);

			if (!(e <= bound))
				fail_msg("%s (fp16): row %d element %d: gpu %g cpu %g", what, r, i, got, ref_i);
			worst = fmax(worst, e / bound);
		}
	}
	return worst;
}

/*
 * Fails unless the int8 form of every row (q, qd as cuda_probe_residual_norm
 * gives them) stands for ref: per group of 32, the scale is max |ref| /
 * (127 QLO) and the sum that of ref, each within TOL_F32 of the row's
 * largest; each element, scale (QLO hi + lo), within the scale (twice the
 * rounding of lo) plus TOL_F32 of the row's largest. Returns the worst
 * element error / that bound.
 */
static double
check_rows_q8(const char *what, const int8_t *q, const float *qd, const float *ref, int n_rows, int n)
{
	const double qlo = 254;
	double worst = 0;

	for (int r = 0; r < n_rows; r++) {
		const float *rr = ref + (size_t)r * n;
		const int8_t *hi = q + (size_t)r * 2 * n, *lo = hi + n;
		double m = max_abs(rr, (size_t)n);

		for (int g = 0; g < n / 32; g++) {
			double e = qd[2 * ((size_t)r * (n / 32) + g)], sum = qd[2 * ((size_t)r * (n / 32) + g) + 1];
			double gm = max_abs(rr + 32 * g, 32), rs = 0;

			for (int i = 32 * g; i < 32 * g + 32; i++) {
				double got = e * (qlo * hi[i] + lo[i]), bound = e + TOL_F32 * m;

				if (!(fabs(got - rr[i]) <= bound))
					fail_msg("%s (int8): row %d element %d: gpu %g (hi %d lo %d scale %g) cpu %g", what, r, i,
					    got, hi[i], lo[i], e, rr[i]);
				worst = fmax(worst, fabs(got - rr[i]) / bound);
				rs += rr[i];
			}
			if (!(fabs(e * 127 * qlo - gm) <= TOL_F32 * m && fabs(sum - rs) <= 32 * TOL_F32 * m))
				fail_msg("%s (int8): row %d group %d: scale %g sum %g, cpu largest %g sum %g", what, r, g,
				    e, sum, gm, rs);
		}
	}
	return worst;
}

/* The CPU backend's residual step: x += (post ? rmsnorm(r) * post : r); h = rmsnorm(x) * w. */
static void
cpu_residual_norm(float *x, const float *r, const float *post, const float *w, float *h, int n_rows, int n,
    float offset, float eps)
{
	float *tmp = xmalloc((size_t)n * sizeof *tmp);

	for (int row = 0; row < n_rows; row++) {
		float *xr = x + (size_t)row * n;

		if (r != NULL) {
			memcpy(tmp, r + (size_t)row * n, (size_t)n * sizeof *tmp);
			if (post != NULL)
				cpu_rmsnorm(tmp, post, offset, eps, n, tmp);
			cpu_add(xr, tmp, n);
		}
		if (w != NULL)
			cpu_rmsnorm(xr, w, offset, eps, n, h + (size_t)row * n);
	}
	free(tmp);
}

static void
test_residual_norm(void **state)
{
	static const struct { int r, post, w; } variants[] = {
		{ 0, 0, 1 }, { 1, 0, 1 }, { 1, 1, 1 }, { 1, 1, 0 }, { 1, 0, 0 },
	};
	/* widths in float4s not multiples of a warp, up to rows kept in 16 float4s a thread */
	static const int widths[] = { 4, 252, 1000, 1056, 2308, 14336, 32768 };
	const int n_rows = 5;
	char err[ERR_LEN], what[128];
	double worst = 0, worst16 = 0, worst8 = 0;

	(void)state;
	for (size_t v = 0; v < ARRAY_LEN(variants); v++)
		for (size_t wi = 0; wi < ARRAY_LEN(widths); wi++)
			for (int f16 = 0; f16 < 1 + variants[v].w; f16++) {
				int n = widths[wi];
				size_t all = (size_t)n_rows * n;
				float offset = wi % 2 ? 1.0f : 0.0f, eps = 1e-6f;
				float *x = rand_floats(all, -3, 3), *xr = xmalloc(all * sizeof *xr);
				float *r = variants[v].r ? rand_floats(all, -3, 3) : NULL;
				float *post = variants[v].post ? rand_floats((size_t)n, -1, 1) : NULL;
				float *w = variants[v].w ? rand_floats((size_t)n, -1, 1) : NULL;
				float *h = nan_floats(all), *hr = nan_floats(all), hs[5];
				uint16_t *hh = xmalloc(all * sizeof *hh);
				/* the int8 form beside the floats, where the width is whole groups */
				int want8 = w != NULL && !f16 && n % 32 == 0;
				int8_t *q = want8 ? xmalloc(2 * all) : NULL;
				float *qd = want8 ? nan_floats(all / 16) : NULL;

				/* a row past fp16's range: the fp16 form divides it by a power of two */
				for (int i = 0; w != NULL && i < n; i++)
					w[i] *= i % 3 == 0 ? 1e5f : 1.0f;
				memcpy(xr, x, all * sizeof *x);
				snprintf(what, sizeof what, "residual_norm r %d post %d w %d, width %d, offset %g",
				    variants[v].r, variants[v].post, variants[v].w, n, offset);
				if (cuda_probe_residual_norm(probe, x, r, post, w, w && !f16 ? h : NULL, f16 ? hh : NULL,
				    f16 ? hs : NULL, q, qd, n_rows, n, offset, eps, err) != 0)
					fail_msg("%s: %s", what, err);
				cpu_residual_norm(xr, r, post, w, hr, n_rows, n, offset, eps);
				worst = fmax(worst, check_rows(what, x, xr, n_rows, n));
				if (w != NULL && !f16)
					worst = fmax(worst, check_rows(what, h, hr, n_rows, n));
				if (f16)
					worst16 = fmax(worst16, check_rows_f16(what, hh, hs, hr, n_rows, n));
				if (want8)
					worst8 = fmax(worst8, check_rows_q8(what, q, qd, hr, n_rows, n));
				free(x), free(xr), free(r), free(post), free(w), free(h), free(hr), free(hh), free(q), free(qd);
			}
	print_message("residual_norm: max relative error %.2e (bound %.0e); fp16 form %.2f, int8 form %.2f of their "
	    "bounds\n", worst, TOL_F32, worst16, worst8);
}

/*
 * The residual norm and the router in one launch (cuda_norm_router), for
 * 1, 3 and 8 tokens of qwen3-30b-a3b's and gpt-oss-20b's widths, with and
 * without a bias: h, its int8 form and the logits against the CPU's
 * residual add, RMSNorm and dot products in double.
 */
static void
test_norm_router(void **state)
{
	static const struct { int n, n_expert, bias; } shapes[] = { { 2048, 128, 0 }, { 2880, 32, 1 } };
	static const int toks[] = { 1, 3, 8 };
	double worst = 0, worst_l = 0, worst8 = 0;
	char err[ERR_LEN], what[96];

	(void)state;
	for (size_t si = 0; si < ARRAY_LEN(shapes); si++)
		for (size_t ti = 0; ti < ARRAY_LEN(toks); ti++) {
			int n = shapes[si].n, E = shapes[si].n_expert, T = toks[ti];
			size_t all = (size_t)T * n;
			float *x = rand_floats(all, -3, 3), *x0 = xmalloc(all * sizeof *x0), *r = rand_floats(all, -3, 3);
			float *bias = shapes[si].bias ? rand_floats((size_t)n, -1, 1) : NULL, *w = rand_floats((size_t)n, -1, 1);
			float *router = rand_floats((size_t)E * n, -0.1f, 0.1f), *lg = nan_floats((size_t)T * E);
			float *h = nan_floats(all), *hr = nan_floats(all), *qd = nan_floats(all / 16);
			int8_t *q = xmalloc(2 * all);
			double top = 0, e = 0;

			memcpy(x0, x, all * sizeof *x);
			snprintf(what, sizeof what, "norm_router width %d, %d experts, %d tokens", n, E, T);
			if (cuda_probe_norm_router(probe, x, r, bias, w, router, E, lg, h, q, qd, T, n, 0.0f, 1e-6f, err) != 0)
				fail_msg("%s: %s", what, err);
			for (int t = 0; t < T; t++) {
				float *xr = x0 + (size_t)t * n;

				cpu_add(xr, r + (size_t)t * n, n);
				if (bias != NULL)
					cpu_add(xr, bias, n);
				cpu_rmsnorm(xr, w, 0.0f, 1e-6f, n, hr + (size_t)t * n);
			}
			worst = fmax(worst, check_rows(what, h, hr, T, n));
			worst8 = fmax(worst8, check_rows_q8(what, q, qd, hr, T, n));
			for (int t = 0; t < T; t++)
				for (int ex = 0; ex < E; ex++) {
					double d = 0;

					for (int i = 0; i < n; i++)
						d += (double)router[(size_t)ex * n + i] * hr[(size_t)t * n + i];
					top = fmax(top, fabs(d));
					e = fmax(e, fabs(lg[(size_t)t * E + ex] - d));
				}
			if (!(e <= TOL_F32 * top))
				fail_msg("%s: logits %.2e of their largest off (bound %.0e)", what, e / top, TOL_F32);
			worst_l = fmax(worst_l, e / top);
			free(x), free(x0), free(r), free(bias), free(w), free(router), free(lg), free(h), free(hr), free(qd), free(q);
		}
	print_message("norm_router: h %.2e, logits %.2e of their largest (bound %.0e); int8 form %.2f of its bound\n",
	    worst, worst_l, TOL_F32, worst8);
}

static void
test_norm_rows(void **state)
{
	const int n_x = 9, n = 1000, n_rows = 4;
	const int32_t rows[4] = { 8, 0, 3, 3 };
	float *x = rand_floats((size_t)n_x * n, -2, 2), *w = rand_floats((size_t)n, -1, 1);
	float *h = nan_floats((size_t)n_rows * n), *hr = nan_floats((size_t)n_rows * n);
	char err[ERR_LEN];
	double worst;

	(void)state;
	if (cuda_probe_norm_rows(probe, x, n_x, rows, n_rows, n, w, 1.0f, 1e-6f, h, err) != 0)
		fail_msg("norm_rows: %s", err);
	for (int i = 0; i < n_rows; i++)
		cpu_rmsnorm(x + (size_t)rows[i] * n, w, 1.0f, 1e-6f, n, hr + (size_t)i * n);
	worst = check_rows("norm_rows", h, hr, n_rows, n);
	print_message("norm_rows: max relative error %.2e (bound %.0e)\n", worst, TOL_F32);
	free(x), free(w), free(h), free(hr);
}

/*
 * The GLU of 3 rows (the fp16 form: on sm_90 a cluster of blocks a row,
 * one row's largest magnitude, past fp16's range, in the sixth block's
 * part) and of 20 (a block a row), against cpu_glu.
 */
static void
test_glu(void **state)
{
	const int n = 3008;
	char err[ERR_LEN];

	(void)state;
	for (int c = 0; c < 4; c++) {
		int gelu = c % 2, n_rows = c < 2 ? 3 : 20;
		size_t all = (size_t)n_rows * n;
		float *a = rand_floats(all, -10, 10), *b = rand_floats(all, -2, 2), *hs = nan_floats((size_t)n_rows);
		float *g = xmalloc(all * sizeof *g), *r = xmalloc(all * sizeof *r);
		uint16_t *hh = xmalloc(all * sizeof *hh);
		int8_t *q = xmalloc(2 * all);
		float *qd = nan_floats(all / 16);
		double worst = 0, worst16, worst8;

		a[n + 5 * n / 8 + 7] = 1e5f, b[n + 5 * n / 8 + 7] = 1.5f;
		memcpy(g, a, all * sizeof *a);
		memcpy(r, a, all * sizeof *a);
		if (cuda_probe_glu(probe, g, b, n_rows, n, gelu, NULL, NULL, q, qd, err) != 0)
			fail_msg("glu: %s", err);
		cpu_glu(r, b, (int64_t)all, gelu);
		for (size_t i = 0; i < all; i++) {
			/* relative, but absolute near 0 where 1 + tanh or 1 + exp cancel */
			double bound = TOL_F32 * fabs((double)r[i]) + 0.1 * TOL_F32 * fabs((double)a[i] * b[i]);
			double e = fabs((double)g[i] - r[i]);

			if (!(e <= bound))
				fail_msg("glu %s: element %zu (a %g, b %g): gpu %g cpu %g", gelu ? "gelu" : "silu", i, a[i],
				    b[i], g[i], r[i]);
			worst = fmax(worst, e / (bound / TOL_F32));
		}
		worst8 = check_rows_q8(gelu ? "glu gelu" : "glu silu", q, qd, r, n_rows, n);
		memcpy(g, a, all * sizeof *a);
		if (cuda_probe_glu(probe, g, b, n_rows, n, gelu, hh, hs, NULL, NULL, err) != 0)
			fail_msg("glu fp16: %s", err);
		worst16 = check_rows_f16(gelu ? "glu gelu" : "glu silu", hh, hs, r, n_rows, n);
		print_message("glu %s, %2d rows: max error %.2e of the bound's scale (bound %.0e); fp16 form %.2f, int8 "
		    "form %.2f of their bounds\n", gelu ? "gelu" : "silu", n_rows, worst, TOL_F32, worst16, worst8);
		free(a), free(b), free(g), free(r), free(hh), free(hs), free(q), free(qd);
	}
}

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

/* A KV pool on the host: fp16 bits, or floats (f32) as the exact mode keeps them. */
struct kv_pool {
	void *data;
	size_t n;
	int f32;
};

/* n elements, all poison. */
static struct kv_pool
pool_new(size_t n, int f32)
{
	struct kv_pool kp = { xmalloc(n * (f32 ? 4 : 2)), n, f32 };

	for (size_t i = 0; i < n; i++)
		if (f32)
			((uint32_t *)kp.data)[i] = POISON32;
		else
			((uint16_t *)kp.data)[i] = POISON16;
	return kp;
}

static double
pool_get(const struct kv_pool *kp, size_t i)
{
	return kp->f32 ? (double)((const float *)kp->data)[i] : fp16_to_fp32(((const uint16_t *)kp->data)[i]);
}

/* Stores x as the pool's type holds it. */
static void
pool_set(struct kv_pool *kp, size_t i, float x)
{
	if (kp->f32)
		((float *)kp->data)[i] = x;
	else
		((uint16_t *)kp->data)[i] = fp32_to_fp16(x);
}

static int
pool_poisoned(const struct kv_pool *kp, size_t i)
{
	return kp->f32 ? ((const uint32_t *)kp->data)[i] == POISON32 : ((const uint16_t *)kp->data)[i] == POISON16;
}

static struct cuda_probe_kv
probe_kv(struct place *pl, struct kv_pool *kp, int split, int flash)
{
	struct cuda_probe_kv kv = { kp->data, pl->n_blocks, N_LAYER, 1, pl->tok_pos, pl->tok_tab, pl->tables,
		pl->n_tables, kp->f32, split, flash };

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
};

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
 * allowed in an fp16 pool); marks it written.
 */
static double
check_pool_head(const char *what, const struct kv_pool *kp, uint8_t *written, const float *ref,
    const struct cuda_probe_heads *hd, const struct place *pl, int t, int kv, int h)
{
	double m = max_abs(ref, (size_t)hd->head_dim), worst = 0;

	for (int i = 0; i < hd->head_dim; i++) {
		size_t at = pool_at(hd, pl, pl->tok_tab[t], pl->tok_pos[t], kv, h, i);
		double g = pool_get(kp, at);
		double bound = (kp->f32 ? 0 : ldexp(fabs((double)ref[i]), -11)) + TOL_F32 * m;

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
qk_case(size_t c, int f32)
{
	struct place pl;
	float *bq = rand_floats(8 * 256, -0.5f, 0.5f), *bk = rand_floats(8 * 256, -0.5f, 0.5f);
	float *bv = rand_floats(8 * 256, -0.5f, 0.5f), *qn = rand_floats(256, 0.5f, 1.5f);
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
	kp = pool_new(np, f32);
	written = xcalloc(np, 1);
	kv = probe_kv(&pl, &kp, 0, 0);
	snprintf(what, sizeof what, "qk head_dim %d, %d/%d heads, neox %d, bias %d, qk_norm %d, %s pool", d,
	    hd.n_head, hd.n_head_kv, hd.neox, hd.bq != NULL, hd.q_norm != NULL, f32 ? "fp32" : "fp16");
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
	for (int f32 = 0; f32 < 2; f32++) {
		double worst = 0;

		for (size_t c = 0; c < ARRAY_LEN(head_cfgs); c++)
			worst = fmax(worst, qk_case(c, f32));
		print_message("qk, %s pool: max error / head max %.2e (bound %.0e%s)\n", f32 ? "fp32" : "fp16",
		    worst, TOL_F32, f32 ? "" : ", plus fp16 rounding in the pool");
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
	kp = pool_new(np, 0), kpr = pool_new(np, 0);
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

/* cuda_matmul_qkv must refuse these heads, this pool (fp32 if f32) or this many tokens on a path, and write nothing. */
static void
qkv_refused(const struct cuda_probe_heads *hd, const struct seq_spec *seqs, int n_seqs, int f32,
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
	kp = pool_new(pool_len(hd, &pl), f32);
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
	float *bq = rand_floats(8 * 256, -0.5f, 0.5f), *bk = rand_floats(8 * 256, -0.5f, 0.5f);
	float *bv = rand_floats(8 * 256, -0.5f, 0.5f), *qn = rand_floats(256, 0.5f, 1.5f);
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
		qkv_refused(&hd, one, 1, 1, CUDA_PROBE_INT8);
		qkv_refused(&hd, two, 2, 1, CUDA_PROBE_FEW);
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
 * of split attention. Without prefill tiles the output's int8 form is
 * asked for too (and from an fp16 pool its fp16 form), and checked
 * against the floats the kernel wrote.
 */
static double
attention_case(size_t c, const struct seq_spec *seqs, int n_seqs, int f32, int split, int flash)
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

	place_seqs(&pl, seqs, n_seqs);
	kp = pool_new(pool_len(&hd, &pl), f32);
	for (int s = 0; s < pl.n_seqs; s++)
		for (int p = 0; p < pl.len[s]; p++)
			for (int kvs = 0; kvs < 2; kvs++)
				for (int h = 0; h < hd.n_head_kv; h++)
					for (int i = 0; i < d; i++)
						pool_set(&kp, pool_at(&hd, &pl, pl.tab0[s], p, kvs, h, i), unif(-1, 1));
	/* queries large enough that the softmax is far from uniform */
	q = rand_floats((size_t)pl.n_tok * nq, -4, 4);
	out = nan_floats((size_t)pl.n_tok * nq);
	struct cuda_probe_kv kv = probe_kv(&pl, &kp, split, flash);
	double tol = flash ? TOL_FLASH : TOL_ATTN;
	if (!flash)
		q8 = xmalloc((size_t)pl.n_tok * 2 * nq), q8d = nan_floats((size_t)pl.n_tok * nq / 16);
	if (!flash && !f32)
		h16 = xmalloc((size_t)pl.n_tok * nq * sizeof *h16), h16s = nan_floats((size_t)pl.n_tok);
	if (cuda_probe_attention(probe, &hd, &kv, q, pl.n_tok, out, q8, q8d, h16, h16s, err) != 0)
		fail_msg("attention head_dim %d, %s pool, split %d, flash %d: %s", d, f32 ? "fp32" : "fp16", split,
		    flash, err);
	if (q8 != NULL) /* fails on any element outside its bound; the floats' error is what this case reports */
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
					fail_msg("attention head_dim %d, %d/%d heads, window %d, %s pool, split %d, flash %d: "
					    "token %d (position %d) head %d element %d: gpu %g reference %g", d, hd.n_head,
					    hd.n_head_kv, hd.window, f32 ? "fp32" : "fp16", split, flash, t, pl.tok_pos[t], h,
					    i, got[i], ref[i]);
				worst = fmax(worst, e);
			}
		}
	free(q), free(out), free(q8), free(q8d), free(h16), free(h16s), free(ref), free(kp.data);
	return worst;
}

/* Decodes only: one token each over long contexts, where split attention cuts them into many pieces. */
static const struct seq_spec decode_seqs[] = { { 700, 1 }, { 1, 1 }, { 130, 1 } };

static void
test_attention(void **state)
{
	(void)state;
	for (int f32 = 0; f32 < 2; f32++)
		for (int split = 0; split < 2; split++) {
			double worst = 0;

			for (size_t c = 0; c < ARRAY_LEN(head_cfgs); c++) {
				worst = fmax(worst, attention_case(c, step_seqs, (int)ARRAY_LEN(step_seqs), f32, split, 0));
				worst = fmax(worst, attention_case(c, decode_seqs, (int)ARRAY_LEN(decode_seqs), f32,
				    split, 0));
			}
			print_message("attention, %s pool, %s: max error / max |V| %.2e (bound %.0e)\n",
			    f32 ? "fp32" : "fp16", split ? "split and merged" : "one piece", worst, TOL_ATTN);
		}
}

/* Prefill chunks long enough for the tensor-core kernel (one past a window, one exactly the minimum) beside decodes. */
static const struct seq_spec prefill_seqs[] = { { 300, 100 }, { 70, 17 }, { 16, 16 }, { 1, 1 }, { 40, 3 } };

/* The tensor-core prefill kernel (fp16 pool only) beside the split kernel, which takes the other tokens. */
static void
test_flash(void **state)
{
	(void)state;
	for (int split = 0; split < 2; split++) {
		double worst = 0;

		for (size_t c = 0; c < ARRAY_LEN(head_cfgs); c++) {
			worst = fmax(worst, attention_case(c, prefill_seqs, (int)ARRAY_LEN(prefill_seqs), 0, split, 1));
			worst = fmax(worst, attention_case(c, step_seqs, (int)ARRAY_LEN(step_seqs), 0, split, 1));
		}
		print_message("attention, fp16 pool, prefill on the tensor cores, %s: max error / max |V| %.2e "
		    "(bound %.0e)\n", split ? "decodes split and merged" : "decodes in one piece", worst, TOL_FLASH);
	}
}

/* ---- greedy argmax ---- */

static void
test_argmax(void **state)
{
	/* rows of a vocabulary's width and odd ones; small integers, so that maxima tie */
	static const int widths[] = { 1, 31, 1000, 262144 + 7 };

	(void)state;
	for (size_t wi = 0; wi < ARRAY_LEN(widths); wi++) {
		int n = widths[wi], n_rows = 5;
		float *x = xmalloc((size_t)n_rows * n * sizeof *x);
		int32_t ids[5];
		char err[ERR_LEN];

		for (size_t i = 0; i < (size_t)n_rows * n; i++)
			x[i] = (float)(int)unif(-20, 20);
		x[(size_t)(n_rows - 1) * n + n - 1] = 100; /* the last element of the last row alone */
		if (cuda_probe_argmax(probe, x, n_rows, n, ids, err) != 0)
			fail_msg("argmax of %d: %s", n, err);
		for (int r = 0; r < n_rows; r++) {
			const float *row = x + (size_t)r * n;
			int best = 0;

			for (int i = 1; i < n; i++)
				if (row[i] > row[best])
					best = i;
			if (ids[r] != best)
				fail_msg("argmax row %d of %d: gpu %d (%g), cpu %d (%g)", r, n, ids[r], row[ids[r]], best,
				    row[best]);
		}
		free(x);
	}
}

/* ---- sampled picks ---- */

/* How each row of test_pick draws: sample_params' fields, and whether it wants the log-probability. */
static const struct {
	float t, top_p, min_p;
	int32_t k;
	float rep, presence, frequency;
	int logprob;
} pick_cases[] = {
	{ 0.8f, 0.95f, 0.05f, 40, 1.0f, 0, 0, 0 }, { 1.5f, 1.0f, 0.0f, 64, 1.0f, 0, 0, 1 },
	{ 0.3f, 1.0f, 0.0f, 1, 1.0f, 0, 0, 0 }, { 0.0f, 1.0f, 0.0f, 40, 1.0f, 0, 0, 1 },
	{ 2.0f, 0.5f, 0.0f, 10, 1.0f, 0, 0, 0 }, { 1.0f, 1.0f, 0.2f, 64, 1.0f, 0, 0, 0 },
	{ 0.8f, 0.95f, 0.05f, 40, 1.3f, 0.5f, 0.25f, 1 }, { 0.0f, 1.0f, 0.0f, 40, 1.5f, 0, 0.5f, 0 },
};
#define PICK_ROWS ((int)ARRAY_LEN(pick_cases))

/* A history that repeats the rows' tied best tokens (0, 7, 14) and some others. */
static const int32_t pick_hist[] = { 3, 7, 0, 7, 2, 14, 7, 1, 4, 0 };

/* Row r's sampler and fwd_pick for draw d of width n, its penalty window appended to tok / cnt at *np. */
static void
pick_row(int r, int d, int n, struct sampler *sm, struct fwd_pick *fp, int32_t *tok, int32_t *cnt, int *np)
{
	struct sample_params p;
	struct sampler copy;
	int32_t m;

	sample_params_default(&p);
	p.temperature = pick_cases[r].t, p.top_p = pick_cases[r].top_p, p.min_p = pick_cases[r].min_p;
	p.top_k = pick_cases[r].k, p.repeat_penalty = pick_cases[r].rep;
	p.presence_penalty = pick_cases[r].presence, p.frequency_penalty = pick_cases[r].frequency;
	p.seed = (uint64_t)(1000 * n + 10 * d + r);
	sampler_init(sm, &p, n);
	m = sampler_penalized(sm) ? sampler_window(sm, pick_hist, ARRAY_LEN(pick_hist), tok + *np, cnt + *np,
	    FWD_PICK_PENALTY_MAX) : 0;
	copy = *sm;
	*fp = (struct fwd_pick){ p.temperature > 0 ? sampler_draw(&copy) : 0, p.temperature, p.top_p, p.min_p, p.top_k,
		p.repeat_penalty, p.presence_penalty, p.frequency_penalty, *np, m, pick_cases[r].logprob,
		pick_cases[r].logprob ? 3 + 17 * (r & 1) : 0 };
	*np += m;
}

/*
 * Draws on the GPU against the host sampler's draws with the same u, over
 * rows whose best logits tie (the lower id first; -0 with +0), with and without
 * penalties and log-probabilities, vocabularies narrower than top_k and
 * Gemma 3's 262,144: the same token every time, the same log-probability
 * to float rounding; the same most likely tokens (3 or 20) in the same
 * order, theirs likewise.
 */
static void
test_pick(void **state)
{
	static const int widths[] = { 5, 1000, 128256, 262144 };
	enum { DRAWS = 8 };
	int same = 0, all = 0;
	double worst_lp = 0;

	(void)state;
	for (size_t wi = 0; wi < ARRAY_LEN(widths); wi++) {
		int n = widths[wi];
		float *x = xmalloc((size_t)PICK_ROWS * n * sizeof *x), *row = xmalloc((size_t)n * sizeof *row);
		char err[ERR_LEN];

		for (size_t i = 0; i < (size_t)PICK_ROWS * n; i++)
			x[i] = unif(-4, 4) + unif(-4, 4); /* a wide, peaked spread: many within top-k's reach */
		for (int r = 0; r < PICK_ROWS; r++)
			for (int i = 0; i < 3 && 7 * i < n; i++)
				x[(size_t)r * n + 7 * i] = 9.5f; /* the best, three times */
		for (int i = 0; i < n; i++) /* row 2 (top-k 1): -0 and +0 the best, which tie (the lower id) */
			x[2 * (size_t)n + i] = i == 1 ? -0.0f : i == 3 ? 0.0f : -1.0f - fabsf(x[2 * (size_t)n + i]);
		for (int d = 0; d < DRAWS; d++) {
			struct sampler sm[PICK_ROWS];
			struct fwd_pick fp[PICK_ROWS];
			int32_t ids[PICK_ROWS], tok[PICK_ROWS * FWD_PICK_PENALTY_MAX], cnt[PICK_ROWS * FWD_PICK_PENALTY_MAX];
			int32_t top_ids[PICK_ROWS * FWD_TOP_LOGPROBS], host_top[SAMPLE_TOP];
			float lp[PICK_ROWS], host_lp, top_lp[PICK_ROWS * FWD_TOP_LOGPROBS], host_top_lp[SAMPLE_TOP], top_pick_lp;
			int np = 0;

			for (int r = 0; r < PICK_ROWS; r++)
				pick_row(r, d, n, &sm[r], &fp[r], tok, cnt, &np);
			if (cuda_probe_pick(probe, x, PICK_ROWS, n, fp, tok, cnt, np, ids, lp, top_ids, top_lp, err) != 0)
				fail_msg("picks of %d: %s", n, err);
			for (int r = 0; r < PICK_ROWS; r++) {
				int32_t host;

				memcpy(row, x + (size_t)r * n, (size_t)n * sizeof *row);
				host = sampler_pick(&sm[r], row, pick_hist, ARRAY_LEN(pick_hist), &host_lp);
				if (ids[r] != host)
					fail_msg("pick of row %d of %d (t %g, k %d, u %.9f): gpu %d (%g), cpu %d (%g)", r, n,
					    (double)fp[r].temperature, fp[r].top_k, fp[r].u, ids[r], row[ids[r]], host, row[host]);
				if (fp[r].logprob && !(fabs(lp[r] - host_lp) <= 1e-5 + 1e-6 * fabs(host_lp)))
					fail_msg("log-probability of row %d of %d: gpu %.7g, cpu %.7g", r, n, lp[r], host_lp);
				if (fp[r].logprob)
					worst_lp = fmax(worst_lp, fabs(lp[r] - host_lp));
				assert_int_equal(sampler_top(&sm[r], row, fp[r].top, host, host_top, host_top_lp, &top_pick_lp),
				    MIN(fp[r].top, n));
				assert_true(fabs(top_pick_lp - host_lp) <= 1e-6 + 1e-7 * fabs(host_lp)); /* one sum serves both */
				for (int j = 0; j < MIN(fp[r].top, n); j++) {
					int32_t g = top_ids[r * FWD_TOP_LOGPROBS + j];
					float gl = top_lp[r * FWD_TOP_LOGPROBS + j];

					if (g != host_top[j] || !(fabs(gl - host_top_lp[j]) <= 1e-5 + 1e-6 * fabs(host_top_lp[j])))
						fail_msg("row %d of %d, likely token %d: gpu %d (%.7g), cpu %d (%.7g)", r, n, j, g, gl,
						    host_top[j], host_top_lp[j]);
					worst_lp = fmax(worst_lp, fabs(gl - host_top_lp[j]));
				}
				same += ids[r] == host;
				all++;
				sampler_free(&sm[r]);
			}
		}
		free(x), free(row);
	}
	print_message("sampled picks: %d of %d the host sampler's; log-probabilities within %.2e\n", same, all,
	    worst_lp);
}

/* ---- experts ---- */

/* A test layer of experts: its stored weights (mo), their floats, and its shape. */
struct moe_case {
	struct cuda_probe_moe mo;
	struct model_tensor rt, gu, dn;
	float *rf, *guf, *dnf, *bias[4];
	int64_t d, f;
};

/* Where e is among the n chosen experts, or -1. */
static int
ex_index(const int *ex, int n, int e)
{
	for (int j = 0; j < n; j++)
		if (ex[j] == e)
			return j;
	return -1;
}

/* Silu, gelu or gpt-oss's gate of g and u, as cpu_ops. */
static double
moe_act(const struct cuda_probe_moe *mo, double g, double u)
{
	if (mo->act == ACT_SWIGLU_OAI) {
		g = fmin(g, mo->limit);
		u = fmax(-mo->limit, fmin(u, mo->limit));
		return (u + 1) * g / (1 + exp(-mo->alpha * g));
	}
	if (mo->act == ACT_GELU)
		return 0.5 * g * (1 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
	return g / (1 + exp(-g)) * u;
}

/* Token x's router logits in double (with the router's bias); the chosen experts, largest first. */
static void
moe_route(const struct moe_case *c, const float *x, double *lg, int *ex, double *w)
{
	const struct cuda_probe_moe *mo = &c->mo;
	double sum = 0;

	for (int e = 0; e < mo->n_expert; e++) {
		lg[e] = mo->router_b != NULL ? mo->router_b[e] : 0;
		for (int64_t i = 0; i < c->d; i++)
			lg[e] += (double)c->rf[e * c->d + i] * x[i];
	}
	for (int j = 0; j < mo->n_used; j++) {
		ex[j] = -1;
		for (int e = 0; e < mo->n_expert; e++) {
			int i;

			for (i = 0; i < j && ex[i] != e; i++)
				;
			if (i == j && (ex[j] < 0 || lg[e] > lg[ex[j]]))
				ex[j] = e;
		}
	}
	for (int j = 0; j < mo->n_used; j++)
		sum += w[j] = exp(lg[ex[j]] - lg[ex[0]]);
	if (!mo->norm)
		for (int e = 0; e < mo->n_expert; e++)
			sum += ex_index(ex, mo->n_used, e) < 0 ? exp(lg[e] - lg[ex[0]]) : 0;
	for (int j = 0; j < mo->n_used; j++)
		w[j] /= sum;
}

/* The reference output of token x (d floats) into out. */
static void
moe_ref(const struct moe_case *c, const float *x, const int *ex, const double *w, double *out)
{
	const struct cuda_probe_moe *mo = &c->mo;
	double *h = xmalloc((size_t)c->f * sizeof *h);

	for (int64_t o = 0; o < c->d; o++)
		out[o] = 0;
	for (int j = 0; j < mo->n_used; j++) {
		const float *g = c->guf + (size_t)ex[j] * 2 * c->f * c->d, *u = g + c->f * c->d;
		const float *dw = c->dnf + (size_t)ex[j] * c->d * c->f;

		for (int64_t r = 0; r < c->f; r++) {
			double gs = mo->gate_b != NULL ? mo->gate_b[ex[j] * c->f + r] : 0;
			double us = mo->up_b != NULL ? mo->up_b[ex[j] * c->f + r] : 0;

			for (int64_t i = 0; i < c->d; i++)
				gs += (double)g[r * c->d + i] * x[i], us += (double)u[r * c->d + i] * x[i];
			h[r] = moe_act(mo, gs, us);
		}
		for (int64_t o = 0; o < c->d; o++) {
			double y = mo->down_b != NULL ? mo->down_b[ex[j] * c->d + o] : 0;

			for (int64_t r = 0; r < c->f; r++)
				y += (double)dw[o * c->f + r] * h[r];
			out[o] += w[j] * y;
		}
	}
	free(h);
}

/*
 * Tokens whose choice is clear: the last chosen expert's logit at least
 * 0.05 above the next one's, so that the GPU's float sums (another order)
 * choose alike. A token near a tie is drawn again.
 */
static float *
moe_tokens(const struct moe_case *c, int n_tok)
{
	float *x = xmalloc((size_t)(n_tok * c->d) * sizeof *x);
	double *lg = xmalloc((size_t)c->mo.n_expert * sizeof *lg), w[64], next;
	int ex[64];

	for (int t = 0; t < n_tok; t++) {
		do {
			for (int64_t i = 0; i < c->d; i++)
				x[t * c->d + i] = unif(-1, 1);
			moe_route(c, x + t * c->d, lg, ex, w);
			next = -INFINITY;
			for (int e = 0; e < c->mo.n_expert; e++)
				if (ex_index(ex, c->mo.n_used, e) < 0)
					next = fmax(next, lg[e]);
		} while (lg[ex[c->mo.n_used - 1]] - next < 0.05);
	}
	free(lg);
	return x;
}

/* A layer of experts: gate/up of type gt, down of type dt, an F32 router, biases with gpt-oss's activation. */
static struct moe_case
moe_case(int n_expert, int n_used, int64_t d, int64_t f, uint32_t gt, uint32_t dt, int act, int norm)
{
	struct moe_case c;

	memset(&c, 0, sizeof c);
	c.d = d, c.f = f;
	c.rt = random_weight(TT_F32, d, n_expert, &c.rf);
	for (int64_t i = 0; i < d * n_expert; i++) /* logits of sd ~3: each token's choice mostly clear */
		c.rf[i] *= 10.0f / sqrtf((float)d);
	free((void *)c.rt.data);
	c.rt.data = c.rf;
	c.gu = random_weight(gt, d, 2 * f * n_expert, &c.guf);
	c.dn = random_weight(dt, f, d * n_expert, &c.dnf);
	c.mo = (struct cuda_probe_moe){ n_expert, n_used, norm, act, 1.702f, 7.0f, probe_weight(&c.rt),
		probe_weight(&c.gu), probe_weight(&c.dn), NULL, NULL, NULL, NULL };
	if (act == ACT_SWIGLU_OAI) {
		c.mo.router_b = c.bias[0] = rand_floats((size_t)n_expert, -0.5f, 0.5f);
		c.mo.gate_b = c.bias[1] = rand_floats((size_t)(n_expert * f), -0.5f, 0.5f);
		c.mo.up_b = c.bias[2] = rand_floats((size_t)(n_expert * f), -0.5f, 0.5f);
		c.mo.down_b = c.bias[3] = rand_floats((size_t)(n_expert * d), -0.5f, 0.5f);
	}
	return c;
}

static void
moe_case_free(struct moe_case *c)
{
	free(c->rf), free(c->guf), free(c->dnf), free((void *)c->gu.data), free((void *)c->dn.data);
	for (int i = 0; i < 4; i++)
		free(c->bias[i]);
}

/*
 * One run on a path: the GPU's choices must be the reference's, their
 * weights within 1e-5, each token's output within tol of its largest
 * value. Returns the worst error.
 */
static double
moe_check(const struct moe_case *c, int n_tok, enum cuda_probe_path path, double tol)
{
	const struct cuda_probe_moe *mo = &c->mo;
	int k = mo->n_used, ex[64];
	float *x = moe_tokens(c, n_tok), *out = nan_floats((size_t)(n_tok * c->d)), *wt = nan_floats((size_t)(n_tok * k));
	int32_t *gex = xmalloc((size_t)(n_tok * k) * sizeof *gex);
	double *lg = xmalloc((size_t)mo->n_expert * sizeof *lg), *ref = xmalloc((size_t)c->d * sizeof *ref), w[64];
	double worst = 0;
	char err[ERR_LEN];

	if (cuda_probe_moe(probe, mo, x, n_tok, path, out, gex, wt, err) != 0)
		fail_msg("experts, %s, %d tokens: %s", path_name(path), n_tok, err);
	for (int t = 0; t < n_tok; t++) {
		double top = 0, e = 0;

		moe_route(c, x + t * c->d, lg, ex, w);
		moe_ref(c, x + t * c->d, ex, w, ref);
		for (int j = 0; j < k; j++)
			if (gex[t * k + j] != ex[j] || !(fabs(wt[t * k + j] - w[j]) <= 1e-5))
				fail_msg("experts, %s, token %d of %d: choice %d is expert %d (weight %g), the CPU's %d (%g)",
				    path_name(path), t, n_tok, j, gex[t * k + j], wt[t * k + j], ex[j], w[j]);
		for (int64_t o = 0; o < c->d; o++)
			top = fmax(top, fabs(ref[o]));
		for (int64_t o = 0; o < c->d; o++)
			e = fmax(e, isfinite(out[t * c->d + o]) ? fabs(out[t * c->d + o] - ref[o]) / top : INFINITY);
		if (!(e <= tol))
			fail_msg("experts, %s, %s/%s, token %d of %d: error %.2e of its largest value (bound %g)",
			    path_name(path), quant_traits(c->gu.type)->name, quant_traits(c->dn.type)->name, t, n_tok, e, tol);
		worst = fmax(worst, e);
	}
	free(x), free(out), free(wt), free(gex), free(lg), free(ref);
	return worst;
}

/*
 * Layers of experts on the GPU (cuda_moe_ffn) against a reference in
 * double from the same weights and tokens: the routing (each token's
 * choices and weights, exactly), then the output on every path, for 1, 2,
 * 5, 8, 9 and 37 tokens (the slots route their own tokens up to 8; uneven
 * loads: many experts get none, a few several tiles). The
 * Qwen3-MoE-like layers' Q4_K gate/up and Q8_0 or Q6_K down (8 of 16
 * experts a token, as qwen3's 8 of 128), and gpt-oss's MXFP4
 * (with biases and its clamped activation), take the grouped tensor-core
 * kernels on the gemm path and the grouped integer kernel on the few
 * path; float experts stay slots on every path.
 */
static void
test_moe(void **state)
{
	static const struct { int e, k; int64_t d, f; uint32_t gt, dt; int act, norm; } cases[] = {
		{ 16, 4, 256, 128, TT_Q4_K, TT_Q8_0, ACT_SILU, 1 },
		{ 16, 8, 256, 256, TT_Q4_K, TT_Q6_K, ACT_SILU, 1 },
		{ 8, 2, 256, 256, TT_MXFP4, TT_MXFP4, ACT_SWIGLU_OAI, 1 },
		{ 8, 3, 128, 96, TT_F16, TT_BF16, ACT_SILU, 0 },
	};
	static const int toks[] = { 1, 2, 5, 8, 9, 37 };
	static const struct { enum cuda_probe_path path; double tol; } paths[] = {
		{ CUDA_PROBE_MATVEC, 1e-4 }, { CUDA_PROBE_INT8, 3e-3 }, { CUDA_PROBE_GEMM, 1e-2 }, { CUDA_PROBE_FEW, 3e-3 },
	};

	(void)state;
	for (size_t ci = 0; ci < ARRAY_LEN(cases); ci++) {
		struct moe_case c = moe_case(cases[ci].e, cases[ci].k, cases[ci].d, cases[ci].f, cases[ci].gt, cases[ci].dt,
		    cases[ci].act, cases[ci].norm);
		double worst[ARRAY_LEN(paths)] = { 0 };

		for (size_t pi = 0; pi < ARRAY_LEN(paths); pi++)
			for (size_t ti = 0; ti < ARRAY_LEN(toks); ti++)
				worst[pi] = fmax(worst[pi], moe_check(&c, toks[ti], paths[pi].path, paths[pi].tol));
		print_message("experts %s/%s, %d of %d: worst error matvec %.2e, int8 %.2e, gemm %.2e, few %.2e\n",
		    quant_traits(cases[ci].gt)->name, quant_traits(cases[ci].dt)->name, cases[ci].k, cases[ci].e, worst[0],
		    worst[1], worst[2], worst[3]);
		moe_case_free(&c);
	}
}

/* ---- setup ---- */

static int
group_setup(void **state)
{
	char err[ERR_LEN];

	(void)state;
	if (cuda_probe_open(&probe, err) != 0) {
		print_error("cuda_probe_open: %s\n", err);
		return -1;
	}
	cpu_ops_init();
	pool = cpu_pool_new(CPU_THREADS);
	return 0;
}

static int
group_teardown(void **state)
{
	(void)state;
	cuda_probe_close(probe);
	cpu_pool_free(pool);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_embed),
		cmocka_unit_test(test_matvec),
		cmocka_unit_test(test_gemm),
		cmocka_unit_test(test_gemm_waves),
		cmocka_unit_test(test_gemm_whole),
		cmocka_unit_test(test_few),
		cmocka_unit_test(test_int8),
		cmocka_unit_test(test_two_types),
		cmocka_unit_test(test_residual_norm),
		cmocka_unit_test(test_norm_rows),
		cmocka_unit_test(test_norm_router),
		cmocka_unit_test(test_glu),
		cmocka_unit_test(test_qk),
		cmocka_unit_test(test_qkv),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_flash),
		cmocka_unit_test(test_argmax),
		cmocka_unit_test(test_pick),
		cmocka_unit_test(test_moe),
	};
	const char *s = getenv("TEST_CUDA_OPS_SEED"), *only = getenv("TEST_CUDA_OPS_ONLY");
	uint64_t seed;

	if (cuda_backend_devices() <= 0) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	seed = s != NULL && *s != '\0' ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	printf("test_cuda_ops: seed %llu (TEST_CUDA_OPS_SEED=%llu repeats this run)\n", (unsigned long long)seed,
	    (unsigned long long)seed);
	fflush(stdout);
	rng_state = seed;
	if (only != NULL && *only != '\0')
		cmocka_set_test_filter(only);
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
