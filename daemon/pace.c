/* pace.c: the prefill chunk of a step, from measured step times (pace.h). */
#include "config.h"
#include "pace.h"
#include "util.h"

/* 1 if a decode-only measure taken with measured decoders stands for n of them. */
static int
comparable(int measured, int n)
{
	return 4 * n >= 3 * measured && 3 * n <= 4 * measured;
}

int32_t
pace_budget(struct pace *p, int n_dec, int n_pre)
{
	if (n_dec == 0 || n_pre == 0)
		return -1;
	if (p->t_dec <= 0 || !comparable(p->n_dec, n_dec) || p->mixed >= PACE_REMEASURE)
		return 0;
	return p->chunk;
}

/* Adds a decode-only step's seconds to the measure (target: the step the chunk may make). */
static void
measure(struct pace *p, int n_dec, double target, double seconds)
{
	if (p->n_samples == 0 || !comparable(p->n_dec, n_dec))
		p->n_samples = p->next = 0, p->n_dec = n_dec;
	p->samples[p->next] = seconds;
	p->next = (p->next + 1) % PACE_SAMPLES;
	p->n_samples = MIN(p->n_samples + 1, PACE_SAMPLES);
	p->t_dec = seconds;
	for (int i = 0; i < p->n_samples; i++)
		p->t_dec = MIN(p->t_dec, p->samples[i]);
	p->mixed = 0;
	if (p->chunk == 0)
		p->chunk = MAX(1, (int32_t)(n_dec * (target - 1) / 2));
}

void
pace_done(struct pace *p, int n_dec, int n_pre, int32_t n_prefill, double seconds, int32_t max_tokens)
{
	double r, target = PACE_TARGET * (n_dec + n_pre) / MAX(n_dec, 1);

	if (n_dec == 0)
		return;
	if (n_prefill == 0) {
		measure(p, n_dec, target, seconds);
		return;
	}
	if (p->t_dec <= 0)
		return;
	p->mixed++;
	r = seconds / p->t_dec;
	/*
	 * In proportion to what the step carried (the prompt's end may have been
	 * less than the chunk), but by half at most: a step that another process
	 * held up for long says little about the chunk.
	 */
	if (r > target * 1.05)
		p->chunk = MAX(1, (int32_t)((double)MIN(n_prefill, p->chunk) * MAX(0.5, (target - 1) / (r - 1))));
	else if (r < 1 + (target - 1) / 4 && n_prefill >= p->chunk)
		p->chunk = MIN(max_tokens, 2 * p->chunk);
	else if (r < 1 + (target - 1) / 1.25 && n_prefill >= p->chunk)
		p->chunk = MIN(max_tokens, p->chunk + p->chunk / 4 + 1);
}
