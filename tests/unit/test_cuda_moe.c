/*
 * test_cuda_moe.c: the CUDA backend's layers of experts (cuda_moe_ffn:
 * the routing, then the experts' feed-forward as slots or grouped
 * products) on every path, through kernels/cuda/cuda_probe.h, against a
 * reference in double. The inputs, tolerances and the skip without a GPU
 * are cuda_ops_common.h's.
 */
#include "config.h"
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
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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
 * path; float experts stay slots on every path. qwen3-30b-a3b's widths
 * (rows of 2,048 and 768, down in Q4_K or Q6_K) take the slot shapes
 * tuned for them; gpt-oss-20b's (2,880) is one of the MXFP4 layers.
 */
static void
test_moe(void **state)
{
	static const struct { int e, k; int64_t d, f; uint32_t gt, dt; int act, norm; } cases[] = {
		{ 16, 4, 256, 128, TT_Q4_K, TT_Q8_0, ACT_SILU, 1 },
		{ 16, 8, 256, 256, TT_Q4_K, TT_Q6_K, ACT_SILU, 1 },
		{ 8, 2, 256, 256, TT_MXFP4, TT_MXFP4, ACT_SWIGLU_OAI, 1 },
		{ 8, 3, 128, 96, TT_F16, TT_BF16, ACT_SILU, 0 },
		{ 16, 8, 2048, 768, TT_Q4_K, TT_Q4_K, ACT_SILU, 1 },
		{ 16, 8, 2048, 768, TT_Q4_K, TT_Q6_K, ACT_SILU, 1 },
		{ 8, 4, 2880, 256, TT_MXFP4, TT_MXFP4, ACT_SWIGLU_OAI, 1 },
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_moe),
	};

	return cuda_ops_run("test_cuda_moe", tests, ARRAY_LEN(tests));
}
