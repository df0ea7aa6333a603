/*
 * test_cuda_ops.c: the CUDA backend's embedding rows, products (every
 * path: matrix-vector, integer, tensor cores, mmt.cu's few tokens, two
 * types in one launch, cuBLAS on dequantized tiles), row kernels (the residual norm, the norm with the
 * router, norms of chosen rows, GLU, argmax) and sampled picks, one at a
 * time against the CPU backend's or a plain reference, through
 * kernels/cuda/cuda_probe.h. Attention is test_cuda_attn.c's, experts
 * test_cuda_moe.c's; the inputs, tolerances and the skip without a GPU
 * are cuda_ops_common.h's.
 */
#include "config.h"
#include "cpu_ops.h"
#include "cpu_pool.h"
#include "cuda_ops_common.h"
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

#include <cmocka.h>

/* ---- weights ---- */

static const uint32_t all_types[] = {
	TT_F32, TT_F16, TT_BF16, TT_Q8_0, TT_Q4_0, TT_Q5_0, TT_Q4_K, TT_Q5_K, TT_Q6_K, TT_MXFP4,
};

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
	/* and on the wgmma form, where the device runs it: grids of many tiles, each K whole */
	enum cuda_probe_path paths[2] = { CUDA_PROBE_GEMM, CUDA_PROBE_WG };

	(void)state;
	for (int pi = 0; pi < (cuda_probe_wg(probe) ? 2 : 1); pi++)
		for (size_t ti = 0; ti < ARRAY_LEN(types); ti++)
			for (size_t si = 0; si < ARRAY_LEN(shapes); si++) {
				int n = shapes[si][0], n_tok = shapes[si][1];
				int64_t k = 2 * MAX(quant_traits(types[ti])->block_elems, 64); /* two of qgemm's units */
				float *wf, *x = rand_floats((size_t)n_tok * (size_t)k, -1, 1);
				struct model_tensor t = random_weight(types[ti], k, n, &wf);
				double worst = check_matmul(&t, wf, x, n_tok, paths[pi], 0, 0, 3);

				print_message("matmul %-10s %-5s %d x %d: max error / sum |w x| %.2e (bound %.0e)\n",
				    path_name(paths[pi]), quant_traits(types[ti])->name, n, n_tok, worst, path_tol(paths[pi]));
				free((void *)t.data), free(wf), free(x);
			}
}

/* Every type dequantized for cuBLAS: whole, and (the shapes' tile rows) in tiles that cut the rows unevenly. */
static void
test_blas(void **state)
{
	(void)state;
	matmul_path(CUDA_PROBE_BLAS);
}

/* qgemm's wgmma form (sm_90a) on every type: the types it takes on it, the others as on gemm. */
static void
test_wg(void **state)
{
	(void)state;
	if (!cuda_probe_wg(probe)) {
		print_message("skipped: this device or build does not run qgemm's wgmma form (sm_90a)\n");
		skip();
	}
	matmul_path(CUDA_PROBE_WG);
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
	/* widths in float4s not multiples of a warp, up to rows kept in 16 float4s a thread; qwen3's and gpt-oss's */
	static const int widths[] = { 4, 252, 1000, 1056, 2048, 2308, 2880, 14336, 32768 };
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

/*
 * The GLU form (gate and up in one wgmma launch that stores act(gate) *
 * up as fp16, then cuda_glu_fix): the same rows and divisors, bit for
 * bit, as the two products on the wgmma form (K whole, as the form runs)
 * followed by cuda_glu, on each tile shape's token counts (a partial last
 * tile of tokens too), silu and gelu, with a last token whose row passes
 * fp16's range (there, a quotient below fp16's normal range one rounding
 * step away at most: cuda_glu_fix's).
 */
static void
test_glu_form(void **state)
{
	static const uint32_t types[] = { TT_Q4_K, TT_Q5_K, TT_Q6_K };
	static const int toks[] = { 45, 64, 100, 200, 300 };
	const int ff = 320, k = 512; /* five tiles of 64 rows; two units of K */
	char err[ERR_LEN];

	(void)state;
	if (!cuda_probe_wg(probe)) {
		print_message("skipped: this device or build does not run qgemm's wgmma form (sm_90a)\n");
		skip();
	}
	for (size_t ti = 0; ti < ARRAY_LEN(types); ti++)
		for (size_t si = 0; si < ARRAY_LEN(toks); si++) {
			int n_tok = toks[si], gelu = (int)(si % 2), flagged = 0;
			size_t all = (size_t)n_tok * ff;
			float *wf, *x = rand_floats((size_t)n_tok * k, -1, 1), *y = nan_floats(2 * all);
			float *g = xmalloc(all * sizeof *g), *u = xmalloc(all * sizeof *u);
			float *hs = nan_floats((size_t)n_tok), *rs = nan_floats((size_t)n_tok);
			uint16_t *hh = xmalloc(all * sizeof *hh), *rh = xmalloc(all * sizeof *rh);
			struct model_tensor t = random_weight(types[ti], k, 2 * ff, &wf);
			struct cuda_probe_weight w = probe_weight(&t);

			for (int i = 0; i < k; i++)
				x[(size_t)(n_tok - 1) * k + i] *= 1e3f;
			if (cuda_probe_matmul_glu(probe, &w, x, n_tok, gelu, hh, hs, err) != 0)
				fail_msg("GLU form %s, %d tokens: %s", quant_traits(types[ti])->name, n_tok, err);
			if (cuda_probe_matmul(probe, &w, 1, x, n_tok, CUDA_PROBE_WG_WHOLE, 0, 0, y, err) != 0)
				fail_msg("matmul wgmma-whole: %s", err);
			for (int r = 0; r < n_tok; r++) {
				memcpy(g + (size_t)r * ff, y + (size_t)r * 2 * ff, ff * sizeof *g);
				memcpy(u + (size_t)r * ff, y + (size_t)r * 2 * ff + ff, ff * sizeof *u);
			}
			if (cuda_probe_glu(probe, g, u, n_tok, ff, gelu, rh, rs, NULL, NULL, err) != 0)
				fail_msg("glu: %s", err);
			for (int r = 0; r < n_tok; r++) {
				if (hs[r] != rs[r])
					fail_msg("GLU form %s, %d tokens: row %d's divisor %g, the GLU's %g",
					    quant_traits(types[ti])->name, n_tok, r, hs[r], rs[r]);
				flagged += rs[r] != 1;
			}
			for (size_t i = 0; i < all; i++) {
				double s = rs[i / ff], d = fabs((double)fp16_to_fp32(hh[i]) - fp16_to_fp32(rh[i])) * s;

				if (hh[i] != rh[i] && !(s != 1 && d <= ldexp(s, -24)))
					fail_msg("GLU form %s, %d tokens: row %zu element %zu: %#06x, the GLU's %#06x",
					    quant_traits(types[ti])->name, n_tok, i / ff, i % ff, hh[i], rh[i]);
			}
			if (flagged != 1)
				fail_msg("GLU form: %d rows divided, 1 meant", flagged);
			print_message("GLU form %-5s %3d tokens %s: the products and cuda_glu's, bit for bit\n",
			    quant_traits(types[ti])->name, n_tok, gelu ? "gelu" : "silu");
			free((void *)t.data), free(wf), free(x), free(y), free(g), free(u), free(hs), free(rs), free(hh), free(rh);
		}
}

/*
 * cuda_glu_fix alone, on rows of 320: a row where one run of 64 passed
 * fp16's range (its floats apart, infinities in their places) and the
 * rest is fp16, one with a non-finite value, and one not flagged (left as
 * it is). Each flagged row must come out as fp16(v / s), v the
 * row's values as the form left them, s the power of two cuda_glu divides
 * by, and every flag cleared.
 */
static void
test_glu_fix(void **state)
{
	const int n = 320, n_rows = 3;
	size_t all = (size_t)n_rows * n;
	float *v = rand_floats(all, -100, 100), *f = nan_floats(all), hs[3] = { 1, 1, 1 };
	uint16_t *hh = xmalloc(all * sizeof *hh), *want = xmalloc(all * sizeof *want);
	int big[3] = { 1, 1, 0 };
	char err[ERR_LEN];

	(void)state;
	v[2 * 64 + 7] = 2.5e5f;              /* row 0, tile 2 */
	v[n + 4 * 64 + 1] = INFINITY;        /* row 1, tile 4 */
	v[2 * n + 9] = 1e5f;                 /* row 2: not flagged, left as fp16 of it (an infinity) */
	for (size_t i = 0; i < all; i++) {
		int r = (int)(i / n), tile = (int)(i % n) / 64;
		int flagged = (r == 0 && tile == 2) || (r == 1 && tile == 4);

		hh[i] = flagged ? fp32_to_fp16(INFINITY) : fp32_to_fp16(v[i]);
		if (flagged)
			f[i] = v[i];
	}
	for (int r = 0; r < n_rows; r++) {
		double m = 0, s;

		for (int i = 0; i < n; i++) {
			size_t j = (size_t)r * n + i;
			float x = hh[j] == fp32_to_fp16(INFINITY) ? f[j] : fp16_to_fp32(hh[j]);

			m = isfinite(x) ? fmax(m, fabs(x)) : m;
		}
		s = r == 2 || !(m > 32768) ? 1 : exp2(ceil(log2(m / 32768)));
		for (int i = 0; i < n; i++) {
			size_t j = (size_t)r * n + i;
			float x = hh[j] == fp32_to_fp16(INFINITY) && r != 2 ? f[j] : fp16_to_fp32(hh[j]);

			want[j] = r == 2 ? hh[j] : fp32_to_fp16((float)(x / s));
		}
		if (r == 0 && s != 8)
			fail_msg("glu fix: the test's row 0 wants divisor 8, got %g", s);
	}
	if (cuda_probe_glu_fix(probe, hh, f, big, hs, n_rows, n, err) != 0)
		fail_msg("glu fix: %s", err);
	if (hs[0] != 8 || hs[1] != 1 || hs[2] != 1)
		fail_msg("glu fix: divisors %g %g %g, want 8 1 1", hs[0], hs[1], hs[2]);
	for (size_t i = 0; i < all; i++)
		if (hh[i] != want[i] && !(isnan(fp16_to_fp32(hh[i])) && isnan(fp16_to_fp32(want[i]))))
			fail_msg("glu fix: row %zu element %zu: %#06x, want %#06x", i / n, i % n, hh[i], want[i]);
	print_message("glu fix: a row with one tile past fp16's range divided by 8, a non-finite one by 1, an "
	    "unflagged one left\n");
	free(v), free(f), free(hh), free(want);
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
	*fp = (struct fwd_pick){ p.temperature > 0 ? sampler_key(&copy) : 0, p.temperature, p.top_p, p.min_p, p.top_k,
		p.repeat_penalty, p.presence_penalty, p.frequency_penalty, *np, m, pick_cases[r].logprob,
		pick_cases[r].logprob ? 3 + 17 * (r & 1) : 0 };
	*np += m;
}

/*
 * Draws on the GPU against the host sampler's draws with the same key, over
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
					fail_msg("pick of row %d of %d (t %g, k %d, key %016llx): gpu %d (%g), cpu %d (%g)", r, n,
					    (double)fp[r].temperature, fp[r].top_k, (unsigned long long)fp[r].key, ids[r], row[ids[r]], host, row[host]);
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_embed),
		cmocka_unit_test(test_matvec),
		cmocka_unit_test(test_gemm),
		cmocka_unit_test(test_gemm_waves),
		cmocka_unit_test(test_gemm_whole),
		cmocka_unit_test(test_blas),
		cmocka_unit_test(test_wg),
		cmocka_unit_test(test_few),
		cmocka_unit_test(test_int8),
		cmocka_unit_test(test_two_types),
		cmocka_unit_test(test_residual_norm),
		cmocka_unit_test(test_norm_rows),
		cmocka_unit_test(test_norm_router),
		cmocka_unit_test(test_glu),
		cmocka_unit_test(test_glu_form),
		cmocka_unit_test(test_glu_fix),
		cmocka_unit_test(test_argmax),
		cmocka_unit_test(test_pick),
	};

	return cuda_ops_run("test_cuda_ops", tests, ARRAY_LEN(tests));
}
