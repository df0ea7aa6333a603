/* test_sample.c: greedy, seeded draws, the cuts and the penalties. */
#include "config.h"
#include "sample.h"
#include "util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
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

/* Large vocabularies: what the selection keeps, against sorting every logit. */
#define BIG 20000

static const float *rank_logits;

static int
rank_desc(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	if (rank_logits[x] != rank_logits[y])
		return rank_logits[x] > rank_logits[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* Logits of BIG tokens, pseudo-random, with runs of equal values (ties are broken by id). */
static void
fill_big(float *l, int32_t *rank)
{
	uint32_t x = 12345;

	for (int32_t i = 0; i < BIG; i++) {
		x = x * 1664525u + 1013904223u;
		l[i] = (float)(x >> 8) / (float)(1u << 24) * 8.0f;
		rank[i] = i;
	}
	for (int32_t i = 0; i < BIG; i += 97)
		l[i] = l[BIG / 2]; /* many equal to one value */
	rank_logits = l;
	qsort(rank, BIG, sizeof *rank, rank_desc);
}

/* Draws n tokens; seen[i] counts token i. */
static void
draw_big(const struct sample_params *p, const float *l, int n, int *seen)
{
	struct sampler s;
	float *w = malloc(BIG * sizeof *w);

	memset(seen, 0, BIG * sizeof *seen);
	sampler_init(&s, p, BIG);
	for (int i = 0; i < n; i++) {
		memcpy(w, l, BIG * sizeof *w);
		seen[sampler_pick(&s, w, NULL, 0, NULL)]++;
	}
	sampler_free(&s);
	free(w);
}

static void
test_large_vocab(void **state)
{
	float *l = malloc(BIG * sizeof *l);
	int32_t *rank = malloc(BIG * sizeof *rank), i;
	int *seen = malloc(BIG * sizeof *seen), in = 0, m;
	struct sample_params p;
	double sum = 0, cum;
	float lo, hi;

	fill_big(l, rank);
	sample_params_default(&p);
	p.temperature = 100.0f; /* all but flat: every kept token shows up */
	p.top_k = 40;
	draw_big(&p, l, 1200, seen);
	for (i = 0; i < 40; i++)
		in += seen[rank[i]] > 0;
	assert_int_equal(in, 40);
	for (i = 40; i < BIG; i++)
		assert_int_equal(seen[rank[i]], 0);
	/* no top-k: min-p keeps the tokens within t ln(1 / min_p) of the best logit */
	p.top_k = 0;
	p.temperature = 1.0f;
	p.min_p = 0.5f;
	draw_big(&p, l, 400, seen);
	for (i = 0, lo = INFINITY, hi = -INFINITY; i < BIG; i++)
		if (seen[i] > 0) {
			assert_true(l[i] >= l[rank[0]] + logf(0.5f) - 1e-3f);
			lo = MIN(lo, l[i]), hi = MAX(hi, l[i]);
		}
	/* the ~1,700 kept tokens are drawn over their whole range: some within 0.1 of either end */
	assert_true(hi >= l[rank[0]] - 0.1f && lo <= l[rank[0]] + logf(0.5f) + 0.1f);
	/* top-p alone: the fewest best tokens whose mass reaches it, each of them drawn */
	p.min_p = 0;
	p.top_p = 0.001f;
	for (i = 0; i < BIG; i++)
		sum += exp((double)(l[i] - l[rank[0]]));
	for (m = 0, cum = 0; cum < p.top_p; m++)
		cum += exp((double)(l[rank[m]] - l[rank[0]])) / sum;
	assert_true(m > 2 && m < 40);
	draw_big(&p, l, 60 * m, seen);
	for (i = 0, in = 0; i < m; i++)
		in += seen[rank[i]] > 0;
	assert_int_equal(in, m);
	for (i = m; i < BIG; i++)
		assert_int_equal(seen[rank[i]], 0);
	free(l), free(rank), free(seen);
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
		cmocka_unit_test(test_large_vocab),
		cmocka_unit_test(test_penalties),
		cmocka_unit_test(test_param_checks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
