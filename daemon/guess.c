/* guess.c: whether a model's decode steps guess, from measured rates (guess.h). */
#include "config.h"
#include "guess.h"

static int
bucket(int n_dec)
{
	int b = 0;

	while (n_dec > 1 && b < GUESS_BUCKETS - 1)
		n_dec >>= 1, b++;
	return b;
}

int
guess_allow(struct guess *g, int n_dec)
{
	int b = bucket(n_dec), way;

	if (g->rate[1][b] <= 0)
		way = 1;
	else if (g->rate[0][b] <= 0)
		way = 0;
	else
		way = g->rate[1][b] >= g->rate[0][b];
	if (g->steps[b] % GUESS_EXPLORE == GUESS_EXPLORE - 1)
		way = !way;
	return way;
}

void
guess_done(struct guess *g, int n_dec, int guessed, int32_t produced, double seconds)
{
	int b = bucket(n_dec);
	double r, *m = &g->rate[guessed != 0][b];

	if (seconds <= 0 || produced <= 0)
		return;
	r = produced / seconds;
	*m = *m > 0 ? 0.75 * *m + 0.25 * r : r;
	g->steps[b]++;
}
