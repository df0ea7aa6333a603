/*
 * hist.c: the fixed buckets of status's histograms (PROTOCOL.md, status),
 * each about twice the one before, and adding a value.
 */
#include "config.h"
#include "hist.h"

const struct hist_spec hist_ttft = {
	13, { 5000, 10000, 20000, 50000, 100000, 200000, 500000, 1000000, 2000000, 5000000, 10000000, 20000000,
	      60000000 }, 1e6,
};

const struct hist_spec hist_itl = {
	12, { 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000, 1000000, 2000000, 5000000 }, 1e6,
};

const struct hist_spec hist_batch = {
	9, { 1, 2, 4, 8, 16, 32, 64, 128, 256 }, 1,
};

void
hist_add(struct hist *h, const struct hist_spec *spec, uint64_t v)
{
	int i = 0;

	while (i < spec->n && v > spec->le[i])
		i++;
	h->count[i]++;
	h->sum += v;
}
