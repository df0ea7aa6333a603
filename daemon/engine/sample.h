/* sample.h: choosing the next token from logits. */
#ifndef RESIDENT_SAMPLE_H
#define RESIDENT_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

struct sample_params {
	float temperature;      /* 0: greedy */
	int32_t top_k;          /* 0: off */
	float top_p;            /* 1: off */
	float min_p;            /* 0: off */
	float repeat_penalty;   /* 1: off; divides positive logits of seen tokens, multiplies negative */
	float presence_penalty; /* 0: off; subtracted once from each seen token */
	float frequency_penalty;/* 0: off; subtracted per occurrence */
	int32_t penalty_last_n; /* how many recent tokens the penalties look at; -1: all */
	uint64_t seed;
};

/* Defaults: greedy, no penalties, seed 0. */
void sample_params_default(struct sample_params *p);
/* What a request gets unless it says otherwise: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05. */
void sample_params_chat(struct sample_params *p);
/* Checks ranges; ERR_INVAL with a message naming the parameter. */
int sample_params_check(const struct sample_params *p, char *err);

struct sampler {
	struct sample_params p;
	uint64_t rng[4];
	/* scratch, n_vocab long */
	int32_t *idx;           /* candidates */
	int32_t *order;         /* the kept ones, best first, as the cuts take them */
	float *prob;
	int32_t *count;         /* occurrences in the penalty window */
	int32_t n_vocab;
};

void sampler_init(struct sampler *s, const struct sample_params *p, int32_t n_vocab);
void sampler_free(struct sampler *s);

/* 1 if s's parameters penalize repeated tokens. */
int sampler_penalized(const struct sampler *s);
/*
 * The tokens of s's penalty window (the last penalty_last_n of hist[0..n))
 * once each, in order of first appearance there, with their counts, into
 * tok[] and cnt[] (at most cap): returns how many, or -1 when they are more than cap.
 */
int32_t sampler_window(struct sampler *s, const int32_t *hist, size_t n, int32_t *tok, int32_t *cnt, int32_t cap);
/* A logit l of a token seen count times in the window, penalized (the same float operations on the GPU). */
float sample_penalize(const struct sample_params *p, float l, int32_t count);

/*
 * The k (at most SAMPLE_TOP) most likely tokens of logits (n_vocab),
 * best first (the higher logit, then the lower id), into ids, their
 * log-probabilities at s's temperature (1 for greedy) into lps, and the
 * drawn token pick's into *pick_lp, as sampler_pick's *logprob (one pass
 * over the row for all of them: call sampler_pick without it). Call it on
 * the logits sampler_pick left (penalized). Returns how many.
 */
#define SAMPLE_TOP 20
int32_t sampler_top(const struct sampler *s, const float *logits, int32_t k, int32_t pick, int32_t *ids, float *lps,
    float *pick_lp);

/* The generator's next draw, the key of the race sampler_pick would run (for a backend that draws). */
uint64_t sampler_key(struct sampler *s);

/*
 * Picks a token from logits (n_vocab, modified in place by the penalties)
 * given the tokens so far (for the penalties). With a fixed seed the same
 * logits and history give the same token. *logprob, if not NULL, gets the
 * log-probability of the pick under the temperature-scaled distribution
 * (temperature 1 for greedy).
 */
int32_t sampler_pick(struct sampler *s, float *logits, const int32_t *history, size_t n_history,
    float *logprob);

#endif
