/*
 * test_hist.c: status's histograms (daemon/hist.c): a value equal to a
 * bound is in that bound's bucket (Prometheus' le), one above the last in
 * the extra bucket, the sum exact; the fixed bounds ascend from and to
 * what PROTOCOL.md says.
 */
#include "config.h"
#include "hist.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static void
test_buckets(void **state)
{
	struct hist h = { { 0 }, 0 };

	hist_add(&h, &hist_batch, 0);       /* below the first bound */
	hist_add(&h, &hist_batch, 1);       /* on it */
	hist_add(&h, &hist_batch, 2);
	hist_add(&h, &hist_batch, 3);       /* (2, 4] */
	hist_add(&h, &hist_batch, 256);     /* the last bound */
	hist_add(&h, &hist_batch, 257);     /* above it */
	assert_int_equal(h.count[0], 2);
	assert_int_equal(h.count[1], 1);
	assert_int_equal(h.count[2], 1);
	assert_int_equal(h.count[8], 1);
	assert_int_equal(h.count[9], 1);
	assert_int_equal(h.sum, 0 + 1 + 2 + 3 + 256 + 257);
}

static void
test_times(void **state)
{
	struct hist h = { { 0 }, 0 };

	hist_add(&h, &hist_ttft, 5000);     /* 5 ms: the first bucket */
	hist_add(&h, &hist_ttft, 5001);
	hist_add(&h, &hist_ttft, 61000000); /* over a minute */
	assert_int_equal(h.count[0], 1);
	assert_int_equal(h.count[1], 1);
	assert_int_equal(h.count[hist_ttft.n], 1);
	hist_add(&h, &hist_itl, 999);
	assert_int_equal(h.count[0], 2);
}

/* Each spec's bounds ascend, at most about 3 times the one before, between the documented ends. */
static void
test_specs(void **state)
{
	const struct hist_spec *specs[] = { &hist_ttft, &hist_itl, &hist_batch };
	const uint64_t first[] = { 5000, 1000, 1 }, last[] = { 60000000, 5000000, 256 };
	int i, k;

	for (k = 0; k < 3; k++) {
		assert_true(specs[k]->n > 1 && specs[k]->n <= HIST_MAX);
		assert_int_equal(specs[k]->le[0], first[k]);
		assert_int_equal(specs[k]->le[specs[k]->n - 1], last[k]);
		for (i = 1; i < specs[k]->n; i++)
			assert_true(specs[k]->le[i] > specs[k]->le[i - 1] && specs[k]->le[i] <= 3 * specs[k]->le[i - 1]);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_buckets),
		cmocka_unit_test(test_times),
		cmocka_unit_test(test_specs),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
