/*
 * sample.c: penalties, then temperature, top-k, top-p and min-p, then a draw.
 * The order is llama.cpp's default chain, so that users' habits carry over.
 * The generator is xoshiro256**, seeded from the request, so a seeded
 * request repeats exactly.
 */
#include "config.h"
#include "sample.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void
sample_params_default(struct sample_params *p)
{
	memset(p, 0, sizeof *p);
	p->top_p = 1.0f;
	p->repeat_penalty = 1.0f;
	p->penalty_last_n = 64;
}

int
sample_params_check(const struct sample_params *p, char *err)
{
	if (!(p->temperature >= 0 && p->temperature <= 100))
		return err_set(err, ERR_INVAL, "temperature must be between 0 and 100");
	if (p->top_k < 0)
		return err_set(err, ERR_INVAL, "top_k must not be negative");
	if (!(p->top_p > 0 && p->top_p <= 1))
		return err_set(err, ERR_INVAL, "top_p must be in (0, 1]");
	if (!(p->min_p >= 0 && p->min_p < 1))
		return err_set(err, ERR_INVAL, "min_p must be in [0, 1)");
	if (!(p->repeat_penalty > 0 && p->repeat_penalty <= 10))
		return err_set(err, ERR_INVAL, "repeat_penalty must be in (0, 10]");
	if (!(fabsf(p->presence_penalty) <= 10) || !(fabsf(p->frequency_penalty) <= 10))
		return err_set(err, ERR_INVAL, "presence and frequency penalties must be within [-10, 10]");
	if (p->penalty_last_n < -1)
		return err_set(err, ERR_INVAL, "penalty_last_n must be -1 (all) or more");
	return 0;
}

/* xoshiro256** */
static uint64_t
rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t
rng_next(uint64_t s[4])
{
	uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return r;
}

/* A uniform double in [0, 1). */
static double
rng_uniform(uint64_t s[4])
{
	return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

void
sampler_init(struct sampler *s, const struct sample_params *p, int32_t n_vocab)
{
	uint64_t x = p->seed;
	int i;

	memset(s, 0, sizeof *s);
	s->p = *p;
	s->n_vocab = n_vocab;
	for (i = 0; i < 4; i++) {
		/* splitmix64 to spread the seed over the state */
		x += 0x9e3779b97f4a7c15ull;
		uint64_t z = x;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		s->rng[i] = z ^ (z >> 31);
	}
	s->idx = xmalloc((size_t)n_vocab * sizeof *s->idx);
	s->prob = xmalloc((size_t)n_vocab * sizeof *s->prob);
	s->count = xcalloc((size_t)n_vocab, sizeof *s->count);
}

void
sampler_free(struct sampler *s)
{
	free(s->idx);
	free(s->prob);
	free(s->count);
	memset(s, 0, sizeof *s);
}

/* Repetition, presence and frequency penalties over the recent tokens. */
static void
apply_penalties(struct sampler *s, float *logits, const int32_t *hist, size_t n)
{
	const struct sample_params *p = &s->p;
	size_t i, start;
	int32_t t;

	if (p->repeat_penalty == 1.0f && p->presence_penalty == 0 && p->frequency_penalty == 0)
		return;
	start = p->penalty_last_n < 0 || (size_t)p->penalty_last_n >= n ? 0 : n - (size_t)p->penalty_last_n;
	for (i = start; i < n; i++)
		if (hist[i] >= 0 && hist[i] < s->n_vocab)
			s->count[hist[i]]++;
	for (i = start; i < n; i++) {
		t = hist[i];
		if (t < 0 || t >= s->n_vocab || s->count[t] == 0)
			continue;
		if (logits[t] > 0)
			logits[t] /= p->repeat_penalty;
		else
			logits[t] *= p->repeat_penalty;
		logits[t] -= p->presence_penalty + p->frequency_penalty * (float)s->count[t];
		s->count[t] = 0; /* each token once; also leaves count[] zeroed for next time */
	}
}

/* Index of the largest logit (the first of equals). */
static int32_t
argmax(const float *logits, int32_t n)
{
	int32_t i, best = 0;

	for (i = 1; i < n; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

/* log softmax of logits[k] at temperature temp. */
static float
log_softmax_at(const float *logits, int32_t n, int32_t k, float temp)
{
	float mx = logits[argmax(logits, n)];
	double sum = 0;
	int32_t i;

	for (i = 0; i < n; i++)
		sum += exp((double)(logits[i] - mx) / temp);
	return (float)((double)(logits[k] - mx) / temp - log(sum));
}

/* Orders candidate indices by logit, descending (ties by id, for determinism). */
static const float *sort_logits;

static int
cmp_desc(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	if (sort_logits[x] != sort_logits[y])
		return sort_logits[x] > sort_logits[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

/*
 * The candidates in idx[], best first, at most k of them (k <= 0: no
 * limit). Tokens whose probability relative to the best is below e^-40
 * cannot change a float32 softmax, so they are dropped before sorting: with
 * a vocabulary of 262144 that leaves a few hundred to sort.
 */
static int32_t
top_candidates(struct sampler *s, const float *logits, int32_t k)
{
	float floor = logits[argmax(logits, s->n_vocab)] - 40.0f * s->p.temperature;
	int32_t i, n = 0;

	for (i = 0; i < s->n_vocab; i++)
		if (logits[i] >= floor)
			s->idx[n++] = i;
	sort_logits = logits;
	qsort(s->idx, (size_t)n, sizeof *s->idx, cmp_desc);
	return k > 0 && k < n ? k : n;
}

/* Softmax over the candidates, then the top-p and min-p cuts. Returns how many remain. */
static int32_t
cut_candidates(struct sampler *s, const float *logits, int32_t n)
{
	float mx = logits[s->idx[0]], t = s->p.temperature;
	double sum = 0, cum = 0;
	int32_t i, keep = n;

	for (i = 0; i < n; i++) {
		s->prob[i] = expf((logits[s->idx[i]] - mx) / t);
		sum += s->prob[i];
	}
	for (i = 0; i < n; i++)
		s->prob[i] = (float)(s->prob[i] / sum);
	if (s->p.min_p > 0)
		for (keep = 1; keep < n && s->prob[keep] >= s->p.min_p * s->prob[0]; keep++)
			;
	for (i = 0; i < keep && s->p.top_p < 1; i++) {
		cum += s->prob[i];
		if (cum >= s->p.top_p) {
			keep = i + 1;
			break;
		}
	}
	return keep;
}

int32_t
sampler_pick(struct sampler *s, float *logits, const int32_t *history, size_t n_history,
    float *logprob)
{
	int32_t n, i, pick;
	double r, sum = 0;

	apply_penalties(s, logits, history, n_history);
	if (s->p.temperature == 0) {
		pick = argmax(logits, s->n_vocab);
		if (logprob != NULL)
			*logprob = log_softmax_at(logits, s->n_vocab, pick, 1.0f);
		return pick;
	}
	n = top_candidates(s, logits, s->p.top_k);
	n = cut_candidates(s, logits, n);
	for (i = 0; i < n; i++)
		sum += s->prob[i];
	r = rng_uniform(s->rng) * sum;
	for (i = 0; i < n - 1; i++) {
		r -= s->prob[i];
		if (r < 0)
			break;
	}
	pick = s->idx[i];
	if (logprob != NULL)
		*logprob = log_softmax_at(logits, s->n_vocab, pick, s->p.temperature);
	return pick;
}
