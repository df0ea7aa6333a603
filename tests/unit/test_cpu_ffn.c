/*
 * test_cpu_ffn.c: a layer of experts computed by the host from a routing
 * made elsewhere (cpu_ffn_run_routed), as the CUDA backend's host layers do
 * when the device holds some of their experts (hot experts): given the
 * routing cpu_ffn_run makes itself, it gives cpu_ffn_run's rows; split
 * between two complementary sets of experts held elsewhere, its two
 * halves add up to them; with every expert held elsewhere it adds nothing;
 * and cpu_ffn_chosen counts every token's choices, once a choice.
 *
 * The routing is worked out here from the router's float rows, as the
 * model's family defines it (the largest logits, lowest index first among
 * equals; softmax over the chosen or over all), on generated models in
 * f32 with the exact numerics: the two sides differ by summation order
 * alone (TOL).
 */
#include "config.h"
#include "cpu_ffn.h"
#include "cpu_ops.h"
#include "cpu_pool.h"
#include "genmodel.h"
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
#include <unistd.h>

#include <cmocka.h>

#define T 5          /* tokens of the step */
#define TOL 1e-5     /* of a row's largest magnitude */

struct fixture {
	char dir[64], path[128];
	struct model_desc *m;
	struct cpu_pool *pool;
	struct cpu_ffn *f;
};

static int
setup(void **state, const char *shape)
{
	struct fixture *x = xcalloc(1, sizeof *x);
	struct genmodel_opts o = { .shape = shape, .format = "gguf", .type = "f32", .seed = 3, .threads = 2 };
	char err[ERR_LEN];

	snprintf(x->dir, sizeof x->dir, "/tmp/test_cpu_ffn_XXXXXX");
	assert_non_null(mkdtemp(x->dir));
	snprintf(x->path, sizeof x->path, "%s/m.gguf", x->dir);
	o.out = x->path;
	if (genmodel_run(&o, err) != 0 || model_open(x->path, &x->m, err) != 0)
		fail_msg("%s: %s", shape, err);
	cpu_ops_init();
	x->pool = cpu_pool_new(2, 0);
	if ((x->f = cpu_ffn_new(x->m, NULL, T, 1, x->pool, err)) == NULL)
		fail_msg("cpu_ffn_new: %s", err);
	*state = x;
	return 0;
}

static int
setup_gptoss(void **state)
{
	return setup(state, "tiny-gptoss");
}

static int
setup_qwen3moe(void **state)
{
	return setup(state, "tiny-qwen3moe");
}

static int
teardown(void **state)
{
	struct fixture *x = *state;

	cpu_ffn_free(x->f);
	cpu_pool_free(x->pool);
	model_close(x->m);
	unlink(x->path);
	rmdir(x->dir);
	free(x);
	return 0;
}

/* Token t's routing of layer l for its row h: k experts, largest logit first, and their weights. */
static void
route(const struct model_desc *m, int l, const float *h, int32_t *ex, float *wt)
{
	const struct model_hparams *hp = &m->hp;
	const struct model_layer *L = &m->layers[l];
	const float *w = L->router->data, *bias = L->router_b != NULL ? L->router_b->data : NULL;
	float lg[64], sum = 0;
	int E = hp->n_expert, k = hp->n_expert_used, j, e, i;

	assert_true(E <= 64);
	assert_int_equal(L->router->type, TT_F32);
	for (e = 0; e < E; e++) {
		double s = bias != NULL ? bias[e] : 0;

		for (i = 0; i < hp->n_embd; i++)
			s += (double)w[(size_t)e * hp->n_embd + i] * h[i];
		lg[e] = (float)s;
	}
	for (j = 0; j < k; j++)
		for (ex[j] = -1, e = 0; e < E; e++) {
			for (i = 0; i < j && ex[i] != e; i++)
				;
			if (i == j && (ex[j] < 0 || lg[e] > lg[ex[j]]))
				ex[j] = e;
		}
	for (j = 0; j < k; j++)
		sum += wt[j] = expf(lg[ex[j]] - lg[ex[0]]);
	if (!hp->expert_norm)
		for (sum = 0, e = 0; e < E; e++)
			sum += expf(lg[e] - lg[ex[0]]);
	for (j = 0; j < k; j++)
		wt[j] /= sum;
}

/* max |a - b| over a row, against the row's largest |b|. */
static double
row_err(const float *a, const float *b, int n)
{
	double d = 0, big = 1e-30;

	for (int i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		big = fmax(big, fabs((double)b[i]));
	}
	return d / big;
}

static void
test_routed(void **state)
{
	struct fixture *x = *state;
	const struct model_hparams *hp = &x->m->hp;
	int D = hp->n_embd, E = hp->n_expert, k = hp->n_expert_used, l = hp->n_layer - 1;
	float *h = xmalloc((size_t)T * D * sizeof *h), *ref = xmalloc((size_t)T * D * sizeof *ref);
	float *a = xmalloc((size_t)T * D * sizeof *a), *b = xmalloc((size_t)T * D * sizeof *b);
	float *wt = xmalloc((size_t)T * k * sizeof *wt), before[64], *c;
	int32_t *ex = xmalloc((size_t)T * k * sizeof *ex), even[64], odd[64], all[64], none[64];
	uint64_t s = 12345;

	for (int i = 0; i < T * D; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		h[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
	}
	for (int t = 0; t < T; t++)
		route(x->m, l, h + (size_t)t * D, ex + (size_t)t * k, wt + (size_t)t * k);
	for (int e = 0; e < E; e++)
		even[e] = e % 2 == 0 ? e / 2 : -1, odd[e] = e % 2 ? e / 2 : -1, all[e] = e, none[e] = -1;

	assert_non_null(c = cpu_ffn_chosen(x->f, l));
	memcpy(before, c, (size_t)E * sizeof *c);
	cpu_ffn_run(x->f, l, h, T, ref);
	for (int e = 0; e < E; e++) {
		int n = 0;

		for (int j = 0; j < T * k; j++)
			n += ex[j] == e;
		assert_float_equal(c[e] - before[e], (float)n, 0); /* the module routed as route() does */
	}

	cpu_ffn_run_routed(x->f, l, h, T, ex, wt, none, a);
	for (int t = 0; t < T; t++)
		assert_true(row_err(a + (size_t)t * D, ref + (size_t)t * D, D) < TOL);

	cpu_ffn_run_routed(x->f, l, h, T, ex, wt, even, a);
	cpu_ffn_run_routed(x->f, l, h, T, ex, wt, odd, b);
	for (int i = 0; i < T * D; i++)
		a[i] += b[i];
	for (int t = 0; t < T; t++)
		assert_true(row_err(a + (size_t)t * D, ref + (size_t)t * D, D) < TOL);

	cpu_ffn_run_routed(x->f, l, h, T, ex, wt, all, a);
	for (int i = 0; i < T * D; i++)
		assert_float_equal(a[i], 0.0f, 0);
	free(h), free(ref), free(a), free(b), free(wt), free(ex);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_routed, setup_gptoss, teardown),
		cmocka_unit_test_setup_teardown(test_routed, setup_qwen3moe, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
