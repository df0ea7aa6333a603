/*
 * guess.h: whether a model's decode steps guess tokens ahead (speculative
 * decoding, engine.c), decided by what it measured.
 *
 * Checking guesses is nearly free where a step reads the weights once for
 * all its tokens (a GPU, few sequences) and costs about as much as the
 * tokens it accepts where the step is compute-bound (a CPU with several
 * sequences, a GPU with many): whether it pays depends on the device, the
 * model, the batch and how often the requests' guesses are accepted, so
 * it is measured, not modelled. For each batch size (in powers of two) the
 * tokens a decode-only step produced per second are kept with guesses and
 * without (a moving average each); a step guesses when that is the faster
 * of the two, or has no measure yet, and the other way is tried again
 * after GUESS_EXPLORE steps of that batch size, since the requests change.
 * Each try that loses again doubles that wait, up to GUESS_EXPLORE_MAX,
 * and makes it at least GUESS_TRY_SHARE times what the try lost (in steps
 * of the faster way), up to GUESS_COSTLY_MAX: a try of a draft model that
 * seldom pays costs its draft steps as well (on a GPU a 1B draft's 7 steps
 * and the check cost about two of an 8B model's at one sequence, four at
 * sixteen), which a try in every 16 steps made a tenth of the time.
 */
#ifndef RESIDENT_GUESS_H
#define RESIDENT_GUESS_H

#include <stdint.h>

#define GUESS_BUCKETS 8     /* batch sizes 1, 2-3, 4-7, ... 128 and more */
#define GUESS_EXPLORE 16
#define GUESS_EXPLORE_MAX 256
#define GUESS_COSTLY_MAX 1024
#define GUESS_TRY_SHARE 64  /* a losing try costs at most 1/64 of the steps until the next */

struct guess {
	double rate[2][GUESS_BUCKETS];  /* tokens a second of decode-only steps without [0] and with [1] guesses */
	int steps[GUESS_BUCKETS];       /* decode-only steps of that batch size since the other way was tried */
	int wait[GUESS_BUCKETS];        /* steps between tries of the other way (0: GUESS_EXPLORE) */
	int8_t trying[GUESS_BUCKETS];   /* the step allowed last tries the slower way */
	int8_t best[GUESS_BUCKETS];     /* the faster way then */
};

/* 1 if the next decode step of n_dec sequences may guess. */
int guess_allow(struct guess *g, int n_dec);
/*
 * What that step did: whether it checked guesses (a step that was allowed
 * to but had none counts as one without), the tokens its sequences took
 * and its seconds (a draft model's work included).
 */
void guess_done(struct guess *g, int n_dec, int guessed, int32_t produced, double seconds);

#endif
