/* guess.c: whether a model's decode steps guess, from measured rates (guess.h). */
#include "config.h"
#include "guess.h"
#include "util.h"

static int
bucket(int n_dec)
{
	int b = 0;

	while (n_dec > 1 && b < GUESS_BUCKETS - 1)
		n_dec >>= 1, b++;
	return b;
}

/* Bucket b's steps between tries of the other way (a wait not set yet is the first one). */
static int
bucket_wait(const struct guess *g, int b)
{
	return g->wait[b] > 0 ? g->wait[b] : GUESS_EXPLORE;
}

int
guess_allow(struct guess *g, int n_dec)
{
	int b = bucket(n_dec);

	if (g->rate[1][b] <= 0 || g->rate[0][b] <= 0) {
		/* measure the way with guesses first, then the way without */
		g->trying[b] = 0;
		return g->rate[1][b] <= 0;
	}
	g->best[b] = g->rate[1][b] >= g->rate[0][b];
	g->trying[b] = g->steps[b] >= bucket_wait(g, b) - 1;
	return g->trying[b] ? !g->best[b] : g->best[b];
}

void
guess_done(struct guess *g, int n_dec, int guessed, int32_t produced, double seconds)
{
	int b = bucket(n_dec), wait = bucket_wait(g, b);
	double r, *m = &g->rate[guessed != 0][b], other = g->rate[guessed == 0][b], lost;

	if (seconds <= 0 || produced <= 0)
		return;
	r = produced / seconds;
	/* a try's measure weighs more: the way's average is as old as the wait */
	*m = *m <= 0 ? r : g->trying[b] ? 0.5 * *m + 0.5 * r : 0.75 * *m + 0.25 * r;
	if (!g->trying[b]) {
		g->steps[b]++;
		return;
	}
	/*
	 * a try that lost again waits twice as long for the next, and long enough that what it lost (the steps
	 * of the other way its tokens would have taken less) is a small share; one that turned the choice, as at first
	 */
	g->trying[b] = 0;
	g->steps[b] = 0;
	if ((g->rate[1][b] >= g->rate[0][b]) != g->best[b]) {
		g->wait[b] = GUESS_EXPLORE;
		return;
	}
	lost = other > r ? other / r - 1 : 0;
	g->wait[b] = MAX(MIN(2 * wait, GUESS_EXPLORE_MAX), (int)MIN(lost * GUESS_TRY_SHARE, (double)GUESS_COSTLY_MAX));
}
