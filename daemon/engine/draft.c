/*
 * draft.c: prompt-lookup guesses (draft.h). An open-addressing table of
 * run keys; a key found is checked against the tokens, so that a
 * collision never becomes a guess.
 */
#include "draft.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

/*
 * The key of the g tokens ending at t[end]: their hash, its two low bits
 * the run's length (1 for DRAFT_NGRAM_MIN on, never 0: an empty slot's).
 */
static uint32_t
run_key(const int32_t *t, int32_t end, int32_t g)
{
	uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)g;

	for (int32_t i = end - g + 1; i <= end; i++) {
		h ^= (uint32_t)t[i];
		h *= 0xff51afd7ed558ccdull;
		h ^= h >> 32;
	}
	return ((uint32_t)h & ~3u) | (uint32_t)(g - DRAFT_NGRAM_MIN + 1);
}

static int32_t
key_len(uint32_t key)
{
	return (int32_t)(key & 3u) + DRAFT_NGRAM_MIN - 1;
}

/* 1 if the g tokens ending at a equal those ending at b. */
static int
same_run(const int32_t *t, int32_t a, int32_t b, int32_t g)
{
	return memcmp(t + a - g + 1, t + b - g + 1, (size_t)g * sizeof *t) == 0;
}

static void
put(struct draft_index *x, uint32_t h, int32_t end, const int32_t *t, int32_t g)
{
	uint32_t i = h & (x->cap - 1);

	/* the same run seen again keeps one slot, now at its latest end */
	while (x->key[i] != 0 && !(x->key[i] == h && same_run(t, x->end[i], end, g)))
		i = (i + 1) & (x->cap - 1);
	x->used += x->key[i] == 0;
	x->key[i] = h, x->end[i] = end;
}

/* Room for more entries: the table doubled (or made) and filled again, at most half full. */
static void
grow(struct draft_index *x, const int32_t *t, uint32_t more)
{
	uint32_t old = x->cap, *key = x->key;
	int32_t *end = x->end;

	if (2 * (x->used + more) <= x->cap)
		return;
	while (2 * (x->used + more) > x->cap)
		x->cap = x->cap ? 2 * x->cap : 1024;
	x->key = xcalloc(x->cap, sizeof *x->key);
	x->end = xmalloc(x->cap * sizeof *x->end);
	x->used = 0;
	for (uint32_t i = 0; i < old; i++)
		if (key[i] != 0)
			put(x, key[i], end[i], t, key_len(key[i]));
	free(key), free(end);
}

/* Indexes the runs ending at t[x->n_done .. upto). */
static void
index_to(struct draft_index *x, const int32_t *t, int32_t upto)
{
	if (upto <= x->n_done)
		return;
	grow(x, t, (uint32_t)(upto - x->n_done) * (DRAFT_NGRAM_MAX - DRAFT_NGRAM_MIN + 1));
	for (int32_t e = x->n_done; e < upto; e++)
		for (int32_t g = DRAFT_NGRAM_MIN; g <= DRAFT_NGRAM_MAX && g <= e + 1; g++)
			put(x, run_key(t, e, g), e, t, g);
	x->n_done = upto;
}

/* Where the g tokens ending t[0..n) last ended before, or -1. */
static int32_t
find(const struct draft_index *x, const int32_t *t, int32_t n, int32_t g)
{
	uint32_t h = run_key(t, n - 1, g), i = h & (x->cap - 1);

	for (; x->key[i] != 0; i = (i + 1) & (x->cap - 1))
		if (x->key[i] == h && same_run(t, x->end[i], n - 1, g))
			return x->end[i];
	return -1;
}

int32_t
draft_guess(struct draft_index *x, const int32_t *t, int32_t n, int32_t k, int32_t *out)
{
	int32_t g, p = -1, m;

	if (n < x->n_done)
		draft_reset(x);
	/* not the run ending at the last token: it would find itself */
	index_to(x, t, n - 1);
	if (x->cap == 0 || k <= 0)
		return 0;
	for (g = MIN(DRAFT_NGRAM_MAX, n); g >= DRAFT_NGRAM_MIN && p < 0; g--)
		p = find(x, t, n, g);
	if (p < 0)
		return 0;
	m = MIN(k, n - 1 - p);
	memcpy(out, t + p + 1, (size_t)m * sizeof *out);
	return m;
}

void
draft_reset(struct draft_index *x)
{
	if (x->cap > 0)
		memset(x->key, 0, x->cap * sizeof *x->key);
	x->used = 0;
	x->n_done = 0;
}

void
draft_free(struct draft_index *x)
{
	free(x->key), free(x->end);
	memset(x, 0, sizeof *x);
}
