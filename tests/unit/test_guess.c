/*
 * test_guess.c: whether decode steps guess (guess.h): a batch size with no
 * measure guesses first, then measures the way without; the faster way
 * wins afterwards; after GUESS_EXPLORE steps the other way is tried again,
 * so that a change of the requests turns the choice, and each try that
 * loses doubles the wait for the next, up to GUESS_EXPLORE_MAX, or waits
 * GUESS_TRY_SHARE times the steps it lost where that is longer; batch
 * sizes in different powers of two are kept apart.
 */
#include "config.h"
#include "guess.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

/* n decode steps of n_dec sequences, each producing per_s tokens a second with guesses or off without. */
static int
run(struct guess *g, int n_dec, int n, double on, double off)
{
	int guessed = 0;

	for (int i = 0; i < n; i++) {
		int way = guess_allow(g, n_dec);

		guessed += way;
		guess_done(g, n_dec, way, 100, 100 / (way ? on : off));
	}
	return guessed;
}

static void
test_choice(void **state)
{
	struct guess g = { 0 };

	(void)state;
	assert_int_equal(guess_allow(&g, 1), 1);     /* nothing measured: guess */
	guess_done(&g, 1, 1, 100, 1.0);               /* 100 t/s with guesses */
	assert_int_equal(guess_allow(&g, 1), 0);     /* then the way without */
	guess_done(&g, 1, 0, 100, 2.0);               /* 50 t/s */
	/*
	 * guessing is faster at one sequence: it guesses, but for a try without after 16 steps, then 64 (a try
	 * without loses a step: 64 at least until the next), 128, ...
	 */
	assert_int_equal(run(&g, 1, 16 + 64 + 128 + 256, 100, 50), 16 + 64 + 128 + 256 - 4);
	assert_int_equal(run(&g, 1, 4 * GUESS_EXPLORE_MAX, 100, 50), 4 * GUESS_EXPLORE_MAX - 4);
	/* sixteen sequences are a batch size of their own: no measure, guess first */
	assert_int_equal(guess_allow(&g, 16), 1);
	/* there guessing is slower: after its first measures it seldom does (tries after 16, 32, ... 256) */
	assert_int_equal(run(&g, 16, 2 + 16 + 32 + 64 + 128 + 256, 100, 130), 1 + 5);
	/* the requests change (their guesses are accepted now): the next try turns it, and it stays */
	run(&g, 16, GUESS_EXPLORE_MAX, 200, 130);
	assert_true(run(&g, 16, 10 * GUESS_EXPLORE, 200, 130) >= 10 * GUESS_EXPLORE - 3);
	/* and change back: the way taken, measured every step, falls behind the other within a few */
	assert_true(run(&g, 16, GUESS_EXPLORE_MAX, 100, 130) <= 8);
	assert_int_equal(run(&g, 16, 2 * GUESS_EXPLORE, 100, 130), 0);
	/*
	 * a draft that never pays at 32 sequences: a try's step takes 130 / 20 times as long as the way without
	 * would for its tokens, 5.5 steps lost, so after the first try the next waits 64 x 5.5 = 352 steps, not
	 * 32, 64, 128, 256, 256: its first step guesses, the tries are its steps 15, 367 and 719
	 */
	assert_int_equal(guess_allow(&g, 32), 1);
	assert_int_equal(run(&g, 32, 719, 20, 130), 1 + 2);
	assert_int_equal(run(&g, 32, 2, 20, 130), 1);
	/* a step allowed to guess that had none counts as one without */
	struct guess h = { 0 };
	guess_done(&h, 4, 0, 100, 1.0);
	assert_int_equal(guess_allow(&h, 4), 1);
	assert_true(h.rate[0][2] > 0 && h.rate[1][2] == 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_choice),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
