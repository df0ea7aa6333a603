/*
 * sample.c: penalties, then temperature, top-k, top-p and min-p, then a draw.
 * The order is llama.cpp's default chain, so that users' habits carry over.
 * The generator is xoshiro256**, seeded from the request, so a seeded
 * request repeats exactly; its one draw a token keys a race among the kept
 * candidates (fwd_race_uniform, kernels.h), which the GPU's picks run alike.
 */
#include "config.h"
#include "sample.h"
#include "kernels.h"
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

void
sample_params_chat(struct sample_params *p)
{
	sample_params_default(p);
	p->temperature = 0.8f;
	p->top_k = 40;
	p->top_p = 0.95f;
	p->min_p = 0.05f;
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

uint64_t
sampler_key(struct sampler *s)
{
	return rng_next(s->rng);
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
	s->order = xmalloc((size_t)n_vocab * sizeof *s->order);
	s->count = xcalloc((size_t)n_vocab, sizeof *s->count);
}

void
sampler_free(struct sampler *s)
{
	free(s->idx);
	free(s->prob);
	free(s->order);
	free(s->count);
	memset(s, 0, sizeof *s);
}

int
sampler_penalized(const struct sampler *s)
{
	const struct sample_params *p = &s->p;

	return p->repeat_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0;
}

int32_t
sampler_window(struct sampler *s, const int32_t *hist, size_t n, int32_t *tok, int32_t *cnt, int32_t cap)
{
	size_t i, start;
	int32_t t, m = 0;

	start = s->p.penalty_last_n < 0 || (size_t)s->p.penalty_last_n >= n ? 0 : n - (size_t)s->p.penalty_last_n;
	for (i = start; i < n; i++)
		if (hist[i] >= 0 && hist[i] < s->n_vocab)
			s->count[hist[i]]++;
	for (i = start; i < n; i++) {
		t = hist[i];
		if (t < 0 || t >= s->n_vocab || s->count[t] == 0)
			continue;
		if (m < cap)
			tok[m] = t, cnt[m] = s->count[t];
		m++;
		s->count[t] = 0; /* each token once; also leaves count[] zeroed for next time */
	}
	return m <= cap ? m : -1;
}

float
sample_penalize(const struct sample_params *p, float l, int32_t count)
{
	l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
	return l - (p->presence_penalty + p->frequency_penalty * (float)count);
}

/* Repetition, presence and frequency penalties over the recent tokens. */
static void
apply_penalties(struct sampler *s, float *logits, const int32_t *hist, size_t n)
{
	int32_t m;

	if (!sampler_penalized(s))
		return;
	m = sampler_window(s, hist, n, s->idx, s->order, s->n_vocab);
	for (int32_t i = 0; i < m; i++)
		logits[s->idx[i]] = sample_penalize(&s->p, logits[s->idx[i]], s->order[i]);
}

/* Index of the largest logit (the first of equals). */
static int32_t
argmax(const float *logits, int32_t n)
{
	int32_t i, best = 0;
	float bv = logits[0]; /* in a register: logits[best] was a load a step */

	for (i = 1; i < n; i++)
		if (logits[i] > bv)
			bv = logits[i], best = i;
	return best;
}

/*
 * The log of the sum of exp((l - mx) / temp) over the row, mx its largest
 * logit: log softmax's normalizer. The exponentials in float (summed in
 * double): a third of the time of double ones over a vocabulary of 262,144,
 * and the same to float rounding.
 */
static double
log_norm(const float *logits, int32_t n, float temp, float mx)
{
	double sum = 0;
	int32_t i;

	for (i = 0; i < n; i++)
		sum += expf((logits[i] - mx) / temp);
	return log(sum);
}

/* log softmax of logit l at temperature temp, of a row of normalizer norm (log_norm) and largest logit mx. */
static float
log_softmax(float l, float temp, float mx, double norm)
{
	return (float)((double)(l - mx) / temp - norm);
}

static float
log_softmax_at(const float *logits, int32_t n, int32_t k, float temp, float mx)
{
	return log_softmax(logits[k], temp, mx, log_norm(logits, n, temp, mx));
}

/* 1 if token a ranks before token b: the higher logit, then the lower id (so that draws repeat). */
static int
ranks_before(const float *l, int32_t a, int32_t b)
{
	return l[a] != l[b] ? l[a] > l[b] : a < b;
}

/*
 * Sifts node i of the heap h[0..n) down. best_top: each node ranks before
 * its children (popped best first); else after them (the worst of a kept
 * set on top, where a better token replaces it).
 */
static void
heap_down(const float *l, int32_t *h, int32_t n, int32_t i, int best_top)
{
	for (int32_t c = 2 * i + 1; c < n; i = c, c = 2 * i + 1) {
		int32_t t;

		if (c + 1 < n && ranks_before(l, h[c + 1], h[c]) == best_top)
			c++;
		if (ranks_before(l, h[c], h[i]) != best_top)
			return;
		t = h[i], h[i] = h[c], h[c] = t;
	}
}

static void
heapify(const float *l, int32_t *h, int32_t n, int best_top)
{
	for (int32_t i = n / 2 - 1; i >= 0; i--)
		heap_down(l, h, n, i, best_top);
}

/* Takes the top of the heap h[0..*n) off (its last node fills the top), and returns it. */
static int32_t
heap_pop(const float *l, int32_t *h, int32_t *n, int best_top)
{
	int32_t top = h[0];

	h[0] = h[--*n];
	heap_down(l, h, *n, 0, best_top);
	return top;
}

/*
 * The k best tokens in s->idx, best first (a heap of the k kept, its worst
 * on top: one pass over the vocabulary, where sorting all of it took
 * milliseconds), less those whose probability relative to the best is
 * below e^-40, which cannot change a float32 softmax. Returns how many.
 */
static int32_t
top_k(struct sampler *s, const float *l, int32_t k)
{
	int32_t i, m, n = MIN(k, s->n_vocab);
	float worst, floor;

	for (i = 0; i < n; i++)
		s->idx[i] = i;
	heapify(l, s->idx, n, 0);
	worst = l[s->idx[0]];
	for (; i < s->n_vocab; i++)
		if (l[i] > worst) { /* an equal logit of a later id ranks after */
			s->idx[0] = i;
			heap_down(l, s->idx, n, 0, 0);
			worst = l[s->idx[0]];
		}
	for (m = n; m > 0;) { /* the worst left goes last: best first */
		int32_t worst_id = heap_pop(l, s->idx, &m, 0);

		s->idx[m] = worst_id;
	}
	floor = l[s->idx[0]] - 40.0f * s->p.temperature;
	while (n > 1 && l[s->idx[n - 1]] < floor)
		n--;
	return n;
}

/* Every token within e^-40 of the best's probability (logit mx) into s->idx, in id order. Returns how many. */
static int32_t
all_candidates(struct sampler *s, const float *l, float mx)
{
	float floor = mx - 40.0f * s->p.temperature;
	int32_t i, n = 0;

	for (i = 0; i < s->n_vocab; i++)
		if (l[i] >= floor)
			s->idx[n++] = i;
	return n;
}

/*
 * Softmax (best logit mx) over the n candidates of s->idx, best first when
 * top_k chose them, else in id order; then the min-p and top-p cuts, which
 * keep a run of the best: taken in order from a heap, so that only what
 * they keep is sorted. The kept ones go to the front of s->idx, their
 * probabilities to s->prob. Returns how many.
 */
static int32_t
cut_candidates(struct sampler *s, const float *l, int32_t n, float mx)
{
	float t = s->p.temperature, p;
	double sum = 0, cum = 0;
	int32_t i, id, keep = 0, h = n, sorted = s->p.top_k > 0;

	for (i = 0; i < n; i++)
		sum += s->prob[i] = expf((l[s->idx[i]] - mx) / t);
	if (!sorted && s->p.min_p <= 0 && s->p.top_p >= 1) { /* no cut: any order draws the same way */
		for (i = 0; i < n; i++)
			s->prob[i] = (float)(s->prob[i] / sum);
		return n;
	}
	if (!sorted) {
		/*
		 * A token below min_p of the best's probability is never kept: none
		 * such goes in the heap (with a margin for the float rounding of
		 * the floor and of the comparison that decides).
		 */
		float keep_floor = s->p.min_p > 0 ? mx + t * (logf(s->p.min_p) - 1e-4f) - fabsf(mx) * 1e-6f : -INFINITY;

		for (i = 0, h = 0; i < n; i++)
			if (l[s->idx[i]] >= keep_floor)
				s->idx[h++] = s->idx[i];
		heapify(l, s->idx, h, 1);
	}
	while (sorted ? keep < n : h > 0) {
		id = sorted ? s->idx[keep] : heap_pop(l, s->idx, &h, 1);
		p = (float)(expf((l[id] - mx) / t) / sum);
		if (keep > 0 && p < s->p.min_p * s->prob[0])
			break;
		s->order[keep] = id;
		s->prob[keep++] = p;
		cum += p;
		if (s->p.top_p < 1 && cum >= s->p.top_p)
			break;
	}
	memcpy(s->idx, s->order, (size_t)keep * sizeof *s->idx);
	return keep;
}

int32_t
sampler_top(const struct sampler *s, const float *logits, int32_t k, int32_t pick, int32_t *ids, float *lps,
    float *pick_lp)
{
	float t = s->p.temperature > 0 ? s->p.temperature : 1.0f, mx;
	int32_t i, j, m = 0;
	double norm;

	k = MIN(MIN(k, SAMPLE_TOP), s->n_vocab);
	for (i = 0; i < s->n_vocab && k > 0; i++) {
		if (m == k && !ranks_before(logits, i, ids[m - 1]))
			continue;
		for (j = m < k ? m++ : m - 1; j > 0 && ranks_before(logits, i, ids[j - 1]); j--)
			ids[j] = ids[j - 1];
		ids[j] = i;
	}
	mx = logits[m > 0 ? ids[0] : argmax(logits, s->n_vocab)];
	norm = log_norm(logits, s->n_vocab, t, mx);
	for (j = 0; j < m; j++)
		lps[j] = log_softmax(logits[ids[j]], t, mx, norm);
	*pick_lp = log_softmax(logits[pick], t, mx, norm);
	return m;
}

int32_t
sampler_pick(struct sampler *s, float *logits, const int32_t *history, size_t n_history,
    float *logprob)
{
	int32_t n, i, pick;
	uint64_t key;
	double t, best;
	float mx;

	apply_penalties(s, logits, history, n_history);
	if (s->p.temperature == 0) {
		pick = argmax(logits, s->n_vocab);
		if (logprob != NULL)
			*logprob = log_softmax_at(logits, s->n_vocab, pick, 1.0f, logits[pick]);
		return pick;
	}
	if (s->p.top_k > 0) {
		n = top_k(s, logits, s->p.top_k);
		mx = logits[s->idx[0]];
	} else {
		mx = logits[argmax(logits, s->n_vocab)];
		n = all_candidates(s, logits, mx);
	}
	n = cut_candidates(s, logits, n, mx);
	key = sampler_key(s);
	for (i = 0, pick = s->idx[0], best = INFINITY; i < n; i++) {
		double u = fwd_race_uniform(key, s->idx[i]), p = s->prob[i];

		/* -log u >= 1 - u: most of a wide row cannot arrive first, seen without a log (a margin for rounding) */
		if (1 - u > best * p * (1 + 1e-9))
			continue;
		if ((t = -log(u) / p) < best)
			best = t, pick = s->idx[i];
	}
	if (logprob != NULL)
		*logprob = log_softmax_at(logits, s->n_vocab, pick, s->p.temperature, mx);
	return pick;
}
