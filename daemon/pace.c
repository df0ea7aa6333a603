/* pace.c: the prefill chunk of a step, from measured step times (pace.h). */
#include "config.h"
#include "pace.h"
#include "util.h"

#include <math.h>

/*
 * 1 if the decode-only measure stands for n_dec decoders run as dec_tokens:
 * about as many tokens as the device ran, and at most twice or half the
 * decoders (what each one costs apart from the tiles, its attention, grows
 * with them).
 */
static int
comparable(const struct pace *p, int n_dec, int32_t dec_tokens)
{
	return 4 * dec_tokens >= 3 * p->dec_tokens && 3 * dec_tokens <= 4 * p->dec_tokens &&
	    2 * n_dec >= p->n_dec && n_dec <= 2 * p->n_dec;
}

/* The step a mixed one may take, in decode-only steps. */
static double
target_of(int n_dec, int n_pre)
{
	return PACE_TARGET * (n_dec + n_pre) / MAX(n_dec, 1);
}

/* A prompt token's time: learned, or a decoding token's time twice (half the margin, a CPU's guess). */
static double
token_time(const struct pace *p, int n_dec)
{
	return p->t_tok > 0 ? p->t_tok : 2 * p->t_dec / MAX(n_dec, 1);
}

int32_t
pace_budget(struct pace *p, int n_dec, int32_t dec_tokens, int n_pre)
{
	double chunk;

	if (n_dec == 0 || n_pre == 0)
		return -1;
	if (p->t_dec <= 0 || !comparable(p, n_dec, dec_tokens) || p->mixed >= PACE_REMEASURE || p->debt > 0)
		return 0;
	/* the small epsilon keeps a whole number of tokens whole through the division */
	chunk = (target_of(n_dec, n_pre) - 1) * p->t_dec / token_time(p, n_dec) + 1e-9;
	p->chunk = (int32_t)MAX(1.0, MIN(chunk, (double)(1 << 30)));
	return p->chunk;
}

/* Adds a decode-only step's seconds to the measure. */
static void
measure(struct pace *p, int n_dec, int32_t dec_tokens, double seconds)
{
	if (p->n_samples == 0 || !comparable(p, n_dec, dec_tokens))
		p->n_samples = p->next = 0, p->n_dec = n_dec, p->dec_tokens = dec_tokens;
	p->samples[p->next] = seconds;
	p->next = (p->next + 1) % PACE_SAMPLES;
	p->n_samples = MIN(p->n_samples + 1, PACE_SAMPLES);
	p->t_dec = seconds;
	for (int i = 0; i < p->n_samples; i++)
		p->t_dec = MIN(p->t_dec, p->samples[i]);
	p->mixed = 0;
}

/*
 * Adds what a step took beyond its target (or gave back under it): a
 * debt of a decode-only step at most (a step another process held up
 * costs a few decode-only steps, not a stall), a credit of a step's
 * margin at most.
 */
static void
owe(struct pace *p, double target, double seconds)
{
	p->debt = MAX(-(target - 1) * p->t_dec, MIN(p->t_dec, p->debt + seconds - target * p->t_dec));
}

void
pace_done(struct pace *p, int n_dec, int32_t dec_tokens, int n_pre, int32_t n_prefill, double seconds,
    int32_t max_tokens)
{
	double r, seen, cur, target = target_of(n_dec, n_pre);

	if (n_dec == 0 || n_pre == 0)
		p->debt = 0; /* nothing was held back for anyone */
	if (n_dec == 0) {
		if (n_prefill > 0 && p->t_tok <= 0)
			p->t_tok = 2 * seconds / n_prefill;
		return;
	}
	if (n_prefill == 0) {
		measure(p, n_dec, dec_tokens, seconds);
		if (n_pre > 0)
			owe(p, target, seconds);
		return;
	}
	if (p->t_dec <= 0)
		return;
	owe(p, target, seconds);
	p->mixed++;
	r = seconds / p->t_dec;
	seen = MAX(seconds - p->t_dec, 0) / n_prefill;
	cur = token_time(p, n_dec);
	/*
	 * Over: what the step showed, but the chunk at least half of what it
	 * carried (a step that another process held up says little about the
	 * chunk). Under, with the whole chunk carried or a full step (a
	 * prompt's end says nothing about growing it): halfway there, at most
	 * doubling.
	 */
	if (r > target * 1.05)
		p->t_tok = MIN(seen, 2 * (target - 1) * p->t_dec / n_prefill);
	else if (r < 1 + (target - 1) / 1.25 && n_prefill >= MIN(p->chunk, max_tokens - n_dec))
		p->t_tok = sqrt(MAX(seen, cur / 4) * cur);
}
