/*
 * hist.h: counts of values in fixed buckets, which status reports (and
 * resident-http turns into Prometheus histograms). The buckets are fixed
 * so that adding a value costs a short scan of integers and two additions,
 * with nothing allocated: one is added for every token generated.
 */
#ifndef RESIDENT_HIST_H
#define RESIDENT_HIST_H

#include <stdint.h>

#define HIST_MAX 16

/* A histogram's buckets: their upper bounds (inclusive), in the unit added, and what status divides them by. */
struct hist_spec {
	int n;
	uint64_t le[HIST_MAX];
	double unit;                /* 1e6 for microseconds reported as seconds; 1 for a count */
};

/* Time to a request's first token, in microseconds: 5 ms .. 60 s. */
extern const struct hist_spec hist_ttft;
/* Time between two tokens of one sequence, in microseconds: 1 ms .. 5 s. */
extern const struct hist_spec hist_itl;
/* Sequences in one forward step: 1 .. 256. */
extern const struct hist_spec hist_batch;

/*
 * count[i] holds the values in (le[i-1], le[i]] (count[0]: at most le[0]),
 * count[n] those above the last bound. All zero is an empty histogram.
 */
struct hist {
	uint64_t count[HIST_MAX + 1];
	uint64_t sum;
};

void hist_add(struct hist *h, const struct hist_spec *spec, uint64_t v);

#endif
