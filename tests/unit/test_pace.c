/*
 * test_pace.c: the prefill pacer (daemon/pace.c) against simulated devices:
 * it measures before it lets prefill in, holds mixed steps near PACE_TARGET
 * decode-only steps while a prefill token's cost changes (a prompt's later
 * chunks attend to more), does not believe a decode-only step slowed by
 * something else, measures again when the decoders change or after
 * PACE_REMEASURE mixed steps, and lets requests that arrive together in
 * within a few steps although each one that starts decoding changes the
 * decoders' count (fewer still where the device runs decoders in tiles).
 */
#include "config.h"
#include "pace.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#define MIN_I(a, b) ((a) < (b) ? (a) : (b))

/* A device: seconds of a step with n_dec decoding tokens and n_pre prefill tokens at depth. */
struct device {
	double fixed, per_dec, per_pre, per_pre_depth;
};

static double
step_time(const struct device *d, int n_dec, int n_pre, int64_t depth)
{
	return d->fixed + d->per_dec * n_dec + (d->per_pre + d->per_pre_depth * (double)depth) * n_pre;
}

/*
 * Runs a prompt of prompt tokens through the pacer beside n_dec decoders;
 * returns the largest mixed step in decode-only steps, and the steps taken.
 */
static double
run(const struct device *d, int n_dec, int64_t prompt, int *steps)
{
	struct pace p;
	int64_t done = 0;
	double worst = 0, t, t_dec = step_time(d, n_dec, 0, 0);
	int32_t b;

	memset(&p, 0, sizeof p);
	for (*steps = 0; done < prompt; (*steps)++) {
		b = pace_budget(&p, n_dec, n_dec, 1);
		assert_true(b >= 0);
		b = (int32_t)(b > prompt - done ? prompt - done : b);
		t = step_time(d, n_dec, b, done);
		pace_done(&p, n_dec, n_dec, 1, b, t, 512);
		done += b;
		if (b > 0 && t / t_dec > worst)
			worst = t / t_dec;
	}
	return worst;
}

static void
test_no_limit_without_decoders(void **state)
{
	struct pace p;

	memset(&p, 0, sizeof p);
	assert_int_equal(pace_budget(&p, 0, 0, 1), -1);
	assert_int_equal(pace_budget(&p, 4, 4, 0), -1);
	/* decoders and a prompt: first a decode-only step, to measure */
	assert_int_equal(pace_budget(&p, 16, 16, 1), 0);
	pace_done(&p, 16, 16, 1, 0, 0.010, 512);
	assert_int_equal(pace_budget(&p, 16, 16, 1), (int32_t)(16 * (PACE_TARGET * 17 / 16 - 1) / 2));
}

static void
test_holds_the_target(void **state)
{
	/* a CPU: each token costs the same, decoding or not; attention grows with depth */
	struct device cpu = { 0.0005, 0.0004, 0.0004, 0.0004 / 20000 };
	/* a GPU: a step is mostly reading the weights, tokens are cheap */
	struct device gpu = { 0.012, 0.00002, 0.00003, 0.00003 / 8000 };
	int cpu_steps, gpu_steps;
	double worst;

	double target = PACE_TARGET * 17 / 16;

	worst = run(&cpu, 16, 32000, &cpu_steps);
	print_message("cpu: worst mixed step %.2f decode-only steps, %d steps\n", worst, cpu_steps);
	assert_true(worst <= target * 1.05 + 0.02);
	worst = run(&gpu, 16, 32000, &gpu_steps);
	print_message("gpu: worst mixed step %.2f decode-only steps, %d steps\n", worst, gpu_steps);
	assert_true(worst <= target * 1.05 + 0.02);
	/* where prompt tokens are cheap beside a step, chunks grow to many of them */
	assert_true(gpu_steps * 10 < cpu_steps);
}

/* Makes the pacer's next chunk for n_dec decoding and one prompt c tokens, through its token time. */
static void
set_chunk(struct pace *p, int n_dec, int32_t c)
{
	p->debt = 0;
	p->t_tok = (PACE_TARGET * (n_dec + 1) / n_dec - 1) * p->t_dec / c;
	assert_int_equal(pace_budget(p, n_dec, n_dec, 1), c);
}

static void
test_shortest_decode_step_counts(void **state)
{
	/* 8 decoding, 1 prompt: a mixed step may take PACE_TARGET * 9 / 8 decode-only steps */
	double target = PACE_TARGET * 9 / 8;
	struct pace p;
	int i;

	memset(&p, 0, sizeof p);
	pace_done(&p, 8, 8, 1, 0, 0.010, 512);
	pace_done(&p, 8, 8, 1, 0, 0.050, 512);  /* slowed down by another process */
	assert_true(p.t_dec < 0.0101);
	/* a mixed step over the target shrinks the chunk in proportion to its part, by half at most */
	set_chunk(&p, 8, 100);
	pace_done(&p, 8, 8, 1, 100, 0.018, 512);
	/* and leaves a debt: a decode-only step pays it back first */
	assert_int_equal(pace_budget(&p, 8, 8, 1), 0);
	pace_done(&p, 8, 8, 1, 0, 0.010, 512);
	assert_true(p.debt <= 0);
	assert_int_equal(pace_budget(&p, 8, 8, 1), (int32_t)(100 * (target - 1) / 0.8));
	set_chunk(&p, 8, 100);
	pace_done(&p, 8, 8, 1, 100, 0.050, 512);
	/* the debt is a decode-only step at most: a few steps pay it back */
	for (i = 0; pace_budget(&p, 8, 8, 1) == 0; i++)
		pace_done(&p, 8, 8, 1, 0, 0.010, 512);
	assert_true(i >= 2 && i <= 3);
	assert_int_equal(pace_budget(&p, 8, 8, 1), 50);
	/* steps far under the target double it, steps under it move it halfway to what they showed */
	set_chunk(&p, 8, 40);
	pace_done(&p, 8, 8, 1, 40, 0.011, 512);
	assert_int_equal(pace_budget(&p, 8, 8, 1), 80);
	pace_done(&p, 8, 8, 1, 80, 0.013, 512);
	/* 80 tokens took 3 ms: 108 would fill the margin; halfway (geometrically) is 93 */
	assert_int_equal(pace_budget(&p, 8, 8, 1), 93);
	/* a prompt's end, shorter than the chunk, says nothing about growing it */
	pace_done(&p, 8, 8, 1, 3, 0.0105, 512);
	assert_int_equal(pace_budget(&p, 8, 8, 1), 93);
	/* more prompts waiting: a larger share at once, from the same token time */
	assert_true(pace_budget(&p, 8, 8, 4) > 2 * 93);
	/* measured again after PACE_REMEASURE mixed steps, or when the decoders change much */
	for (i = 0; i < PACE_REMEASURE; i++)
		pace_done(&p, 8, 8, 1, 93, 0.015, 512);
	assert_int_equal(pace_budget(&p, 8, 8, 1), 0);
	for (i = 0; i < 3; i++) /* the measure, and what those steps owe paid back */
		pace_done(&p, 8, 8, 1, 0, 0.010, 512);
	assert_true(pace_budget(&p, 8, 8, 1) > 0);
	assert_true(pace_budget(&p, 7, 7, 1) > 0);
	assert_int_equal(pace_budget(&p, 16, 16, 1), 0);
}

/* The tokens a GPU runs n decoders as (tiled; else n): up to 2 one by one, then tiles of 16, 32, 64, 128. */
static int32_t
gpu_tokens(int tiled, int n)
{
	if (!tiled || n <= 2)
		return n;
	return n <= 16 ? 16 : n <= 32 ? 32 : n <= 64 ? 64 : (n + 127) / 128 * 128;
}

/*
 * n requests of prompt tokens arrive at once beside `streams` decoding
 * ones; each starts decoding when its prompt is done (as in the engine,
 * prompts are prefilled one after the other). The streams' prompts were
 * prefilled alone before. Returns the steps until the last one decodes,
 * and in *dec_only those that only decoded; the device runs the decoders
 * as gpu_tokens(tiled, ...).
 */
static int
arrive_together(const struct device *d, int tiled, int streams, int n, int32_t prompt, int *dec_only)
{
	struct pace p;
	int32_t left = n * prompt, b, t_max = 512;
	int steps = 0, n_dec = streams;

	memset(&p, 0, sizeof p);
	*dec_only = 0;
	/* the streams' own prompts came first, alone */
	pace_done(&p, 0, 0, streams, streams * prompt, step_time(d, 0, streams * prompt, 0), 512);
	while (left > 0 && steps < 10000) {
		int32_t dt = gpu_tokens(tiled, n_dec);

		b = pace_budget(&p, n_dec, dt, n - (n_dec - streams));
		b = b < 0 || b > left ? MIN_I(left, t_max) : MIN_I(b, t_max);
		pace_done(&p, n_dec, dt, n - (n_dec - streams), b, step_time(d, n_dec, b, 0), 512);
		*dec_only += b == 0;
		left -= b;
		n_dec = streams + (n * prompt - left) / prompt;
		steps++;
	}
	return steps;
}

static void
test_arrivals_together(void **state)
{
	/* a GPU: a step mostly reads the weights; a CPU: each token costs the same */
	struct device gpu = { 0.007, 0.00002, 0.00002, 0 }, cpu = { 0.0005, 0.0004, 0.0004, 0 };
	int gd, gtd, cd, g = arrive_together(&gpu, 0, 2, 62, 10, &gd), c = arrive_together(&cpu, 0, 2, 62, 10, &cd);
	int gt = arrive_together(&gpu, 1, 2, 62, 10, &gtd);

	(void)state;
	print_message("62 requests of 10 tokens beside 2 streams: %d steps, %d decode-only (GPU), %d, %d with "
	    "tiles of tokens, %d (CPU)\n", g, gd, gt, gtd, c);
	/* 620 tokens: two steps at full size; the ramp takes more (a decode-only step to measure
	 * each time the decoders grew by a third: 10 and 26), not one a request */
	assert_true(g <= 12);
	assert_true(c <= 30);
	/* where the device runs the decoders in tiles, a measure stands for the tile's counts */
	assert_true(gtd < gd && gt <= g);
}

static void
test_many_new_prompts_go_fast(void **state)
{
	/* one stream and 63 requests just arrived: the step may grow to 64 tokens' worth, and soon does */
	struct device cpu = { 0.0005, 0.0004, 0.0004, 0 };
	struct pace p;
	int steps = 0;
	int64_t left = 63 * 20;
	int32_t b;

	memset(&p, 0, sizeof p);
	while (left > 0) {
		b = pace_budget(&p, 1, 1, 63);
		b = (int32_t)(b < 0 || b > left ? left : b);
		pace_done(&p, 1, 1, 63, b, step_time(&cpu, 1, b, 0), 512);
		left -= b;
		steps++;
	}
	print_message("63 prompts of 20 tokens beside one stream: %d steps\n", steps);
	assert_true(steps <= 12);  /* one step at a time, 630 */
}

/* A GPU whose products run in tiles of 64 tokens: a step's time is its tiles'. */
static double
tiled_time(int n_tok)
{
	return 0.0045 * ((n_tok + 63) / 64) + 0.00002 * n_tok;
}

/*
 * A prompt of `left` tokens beside 63 streams on that GPU, engine_step
 * filling the last tile (backend_ops.step_tokens); returns the steps, *avg
 * gets their mean in decode-only steps.
 */
static int
tiled_run(int32_t left, double *avg)
{
	struct pace p;
	int32_t b;
	int steps = 0;
	double t, sum = 0;

	memset(&p, 0, sizeof p);
	while (left > 0 && steps < 10000) {
		b = pace_budget(&p, 63, gpu_tokens(1, 63), 1);
		if (b > 0)
			b = (63 + b + 63) / 64 * 64 - 63;
		b = MIN_I(b, left);
		t = tiled_time(63 + b);
		pace_done(&p, 63, gpu_tokens(1, 63), 1, b, t, 512);
		left -= b;
		sum += t;
		steps++;
	}
	*avg = sum / steps / tiled_time(63);
	return steps;
}

static void
test_tiles_filled(void **state)
{
	double avg;
	int short_steps = tiled_run(18, &avg), long_steps = tiled_run(20000, &avg);

	(void)state;
	print_message("beside 63 streams, tiles of 64: an 18-token prompt %d steps; 20,000 tokens %d steps, "
	    "%.2f decode-only steps each (target %.2f)\n", short_steps, long_steps, avg, PACE_TARGET * 64 / 63);
	/* one token a step would take 18 (the chunk the target allows beside 63 streams) */
	assert_true(short_steps <= 3);
	/* steps of a whole tile, over the target, are paid back by decode-only ones */
	assert_true(avg <= PACE_TARGET * 64 / 63 * 1.1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_no_limit_without_decoders),
		cmocka_unit_test(test_holds_the_target),
		cmocka_unit_test(test_shortest_decode_step_counts),
		cmocka_unit_test(test_many_new_prompts_go_fast),
		cmocka_unit_test(test_arrivals_together),
		cmocka_unit_test(test_tiles_filled),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
