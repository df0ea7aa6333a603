/* test_sample.c: greedy, seeded draws, the cuts and the penalties. */
#include "config.h"
#include "sample.h"
#include "util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#define V 8

/* Logits of a fixed, clearly ordered distribution: token 3 best, then 5, 1... */
static void
fill(float *l)
{
	static const float base[V] = { -1.0f, 2.0f, 0.0f, 4.0f, -3.0f, 3.0f, 1.0f, -2.0f };

	memcpy(l, base, sizeof base);
}

/* Picks n times with the parameters; counts each token. */
static void
draw(const struct sample_params *p, int n, int counts[V])
{
	struct sampler s;
	float l[V];
	int i;

	memset(counts, 0, V * sizeof *counts);
	sampler_init(&s, p, V);
	for (i = 0; i < n; i++) {
		fill(l);
		counts[sampler_pick(&s, l, NULL, 0, NULL)]++;
	}
	sampler_free(&s);
}

static void
test_greedy(void **state)
{
	struct sample_params p;
	int c[V];
	float lp;
	struct sampler s;
	float l[V];

	sample_params_default(&p);
	draw(&p, 10, c);
	assert_int_equal(c[3], 10);
	sampler_init(&s, &p, V);
	fill(l);
	assert_int_equal(sampler_pick(&s, l, NULL, 0, &lp), 3);
	/* log softmax of the best: 4 - log(sum exp) */
	assert_true(fabsf(lp - (4.0f - logf(expf(-1) + expf(2) + 1 + expf(4) + expf(-3) + expf(3) +
	    expf(1) + expf(-2)))) < 1e-5f);
	sampler_free(&s);
}

static void
test_seed_reproducible(void **state)
{
	struct sample_params p;
	struct sampler a, b;
	float la[V], lb[V];
	int i, same_seed_diff = 0, other_seed_diff = 0;

	sample_params_default(&p);
	p.temperature = 1.5f;
	p.seed = 1234;
	sampler_init(&a, &p, V);
	sampler_init(&b, &p, V);
	for (i = 0; i < 200; i++) {
		fill(la), fill(lb);
		same_seed_diff += sampler_pick(&a, la, NULL, 0, NULL) != sampler_pick(&b, lb, NULL, 0, NULL);
	}
	sampler_free(&b);
	p.seed = 99;
	sampler_init(&b, &p, V);
	for (i = 0; i < 200; i++) {
		fill(la), fill(lb);
		other_seed_diff += sampler_pick(&a, la, NULL, 0, NULL) != sampler_pick(&b, lb, NULL, 0, NULL);
	}
	sampler_free(&a);
	sampler_free(&b);
	assert_int_equal(same_seed_diff, 0);
	assert_true(other_seed_diff > 0);
}

static void
test_cuts(void **state)
{
	struct sample_params p;
	int c[V], i;

	sample_params_default(&p);
	p.temperature = 5.0f; /* nearly flat: every token would appear */
	draw(&p, 4000, c);
	for (i = 0; i < V; i++)
		assert_true(c[i] > 0);
	p.top_k = 2;
	draw(&p, 2000, c);
	assert_int_equal(c[3] + c[5], 2000);
	assert_true(c[3] > 0 && c[5] > 0);
	p.top_k = 0;
	p.temperature = 1.0f;
	p.top_p = 0.5f; /* token 3 alone holds ~0.64 */
	draw(&p, 500, c);
	assert_int_equal(c[3], 500);
	p.top_p = 1.0f;
	p.min_p = 0.3f; /* 5 has e^-1 = 0.37 of 3's probability, 1 has e^-2 */
	draw(&p, 2000, c);
	assert_int_equal(c[3] + c[5], 2000);
	assert_true(c[5] > 300);
}

static void
test_frequencies(void **state)
{
	struct sample_params p;
	int c[V];
	double p3 = 1.0 / (1.0 + expf(-1.0f)); /* top-2 at temperature 1: 3 vs 5 */

	sample_params_default(&p);
	p.temperature = 1.0f;
	p.top_k = 2;
	p.seed = 7;
	draw(&p, 20000, c);
	/* binomial: 5 standard deviations is about 0.016 here */
	assert_true(fabs((double)c[3] / 20000 - p3) < 0.016);
}

static void
test_penalties(void **state)
{
	struct sample_params p;
	struct sampler s;
	float l[V];
	int32_t hist[] = { 3, 3, 3, 6 };

	sample_params_default(&p);
	p.repeat_penalty = 2.0f; /* 4 -> 2: token 5 (3) wins */
	sampler_init(&s, &p, V);
	fill(l);
	assert_int_equal(sampler_pick(&s, l, hist, 4, NULL), 5);
	assert_true(l[3] == 2.0f && l[6] == 0.5f && l[5] == 3.0f);
	sampler_free(&s);
	sample_params_default(&p);
	p.frequency_penalty = 0.5f; /* 3 seen three times: 4 - 1.5 = 2.5 */
	p.presence_penalty = 0.25f;
	sampler_init(&s, &p, V);
	fill(l);
	assert_int_equal(sampler_pick(&s, l, hist, 4, NULL), 5);
	assert_true(l[3] == 4.0f - 0.25f - 1.5f);
	/* the window: only the last token counts */
	sampler_free(&s);
	p.penalty_last_n = 1;
	sampler_init(&s, &p, V);
	fill(l);
	assert_int_equal(sampler_pick(&s, l, hist, 4, NULL), 3);
	assert_true(l[3] == 4.0f && l[6] == 1.0f - 0.75f);
	sampler_free(&s);
}

static void
test_param_checks(void **state)
{
	struct sample_params p;
	char err[ERR_LEN];

	sample_params_default(&p);
	assert_int_equal(sample_params_check(&p, err), 0);
	p.temperature = -1;
	assert_int_equal(sample_params_check(&p, err), ERR_INVAL);
	assert_non_null(strstr(err, "temperature"));
	sample_params_default(&p);
	p.top_p = 0;
	assert_int_equal(sample_params_check(&p, err), ERR_INVAL);
	sample_params_default(&p);
	p.min_p = NAN;
	assert_int_equal(sample_params_check(&p, err), ERR_INVAL);
	sample_params_default(&p);
	p.top_k = -3;
	assert_int_equal(sample_params_check(&p, err), ERR_INVAL);
	sample_params_default(&p);
	p.repeat_penalty = 0;
	assert_int_equal(sample_params_check(&p, err), ERR_INVAL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy),
		cmocka_unit_test(test_seed_reproducible),
		cmocka_unit_test(test_cuts),
		cmocka_unit_test(test_frequencies),
		cmocka_unit_test(test_penalties),
		cmocka_unit_test(test_param_checks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
