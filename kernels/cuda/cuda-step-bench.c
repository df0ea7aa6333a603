/*
 * cuda-step-bench: the CUDA backend's forward step alone, without the
 * engine (no sampling, no detokenizing): a prefill of P tokens into one
 * sequence, then decode steps of B sequences that each add one token at
 * context depth D, for every B given. Each row is the median of the timed
 * steps; RESIDENT_CUDA_TIMING=1 adds the backend's GPU time per phase.
 * Decode is timed twice: with the logits copied back, and with only their
 * argmax (the engine's greedy path); a first step asks for both and
 * checks the GPU's argmax against the host's (the bench fails on a
 * difference).
 *
 *   cuda-step-bench MODEL [P [D [B ...]]]     (defaults: 512 128 1 8 16 64)
 */
#include "config.h"
#include "kernels.h"
#include "model.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_B 256
#define REPS 20

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median of n doubles (sorts them). */
static double
median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return v[n / 2];
}

/* Deterministic token ids. */
static int32_t
tok(int s, int i, int32_t n_vocab)
{
	return (int32_t)(((uint32_t)s * 7919u + (uint32_t)i * 104729u + 17u) % (uint32_t)n_vocab);
}

/* Index of the largest of n floats, the first of equals (the host sampler's rule). */
static int32_t
host_argmax(const float *v, int32_t n)
{
	int32_t best = 0;

	for (int32_t i = 1; i < n; i++)
		if (v[i] > v[best])
			best = i;
	return best;
}

/*
 * n_seqs sequences at positions pos0 (n_new tokens each, blocks nb apart),
 * last-token logits when want, into logits and/or (if not NULL) their
 * argmax into ids; returns the seconds the step took.
 */
static double
step(struct backend *be, const struct model_desc *m, int n_seqs, int pos0, int n_new, int nb,
    int32_t *tables, int want, float *logits, int32_t *ids)
{
	struct fwd_seq *fs = xcalloc((size_t)n_seqs, sizeof *fs);
	int32_t *toks = xmalloc((size_t)n_seqs * (size_t)n_new * sizeof *toks);
	struct fwd_batch b = { .n_seqs = n_seqs, .seqs = fs, .n_tokens = n_seqs * n_new, .tokens = toks, .argmax = ids };
	char err[ERR_LEN];
	uint64_t t0;
	int s, i;

	for (s = 0; s < n_seqs; s++) {
		fs[s] = (struct fwd_seq){ n_new, pos0, tables + (size_t)s * nb, nb, want, 0, 0 };
		for (i = 0; i < n_new; i++)
			toks[s * n_new + i] = tok(s, pos0 + i, m->hp.n_vocab);
	}
	t0 = now_ns();
	if (cuda_backend.forward(be, &b, logits, err) != 0) {
		fprintf(stderr, "forward: %s\n", err);
		exit(1);
	}
	t0 = now_ns() - t0;
	free(fs);
	free(toks);
	return (double)t0 / 1e9;
}

/* Loads the model for n_seqs sequences of len positions and steps of max_tokens. */
static struct backend *
load(const struct model_desc *m, int n_seqs, int len, int max_tokens, int32_t **tables, int *nb)
{
	struct backend_opts o = { 0 };
	struct backend *be;
	char err[ERR_LEN];
	int i;

	*nb = (len + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	o.kv_blocks = (int64_t)n_seqs * *nb;
	o.max_tokens = max_tokens;
	o.max_seqs = n_seqs;
	if (cuda_backend.load(m, &o, &be, err) != 0) {
		fprintf(stderr, "load: %s\n", err);
		exit(1);
	}
	*tables = xmalloc((size_t)o.kv_blocks * sizeof **tables);
	for (i = 0; i < o.kv_blocks; i++)
		(*tables)[i] = i;
	return be;
}

/* Prefill of p tokens into one sequence, logits of the last. */
static void
bench_prefill(const struct model_desc *m, int p, float *logits)
{
	int32_t *tables;
	int nb, r;
	struct backend *be = load(m, 1, p, p, &tables, &nb);
	double t[REPS];

	step(be, m, 1, 0, p, nb, tables, 1, logits, NULL); /* warm-up */
	for (r = 0; r < 5; r++)
		t[r] = step(be, m, 1, 0, p, nb, tables, 1, logits, NULL);
	printf("| prefill  | %5d | %5d | %9.3f | %10.1f |           |\n", p, 1, median(t, 5) * 1e3,
	    p / median(t, 5));
	fflush(stdout);
	cuda_backend.free(be);
	free(tables);
}

/* b sequences with depth positions of context, each decoding one token a step. */
static void
bench_decode(const struct model_desc *m, int b, int depth, float *logits)
{
	int32_t *tables, ids[MAX_B];
	int nb, r, s, chunk = MAX(1, 512 / depth);
	struct backend *be = load(m, b, depth + 2 * REPS + 4, MAX(b, MIN(b, chunk) * depth), &tables, &nb);
	double t[REPS], tg[REPS], tl, ta;

	for (r = 0; r < b; r += chunk) /* the context, several sequences a step */
		step(be, m, MIN(chunk, b - r), 0, depth, nb, tables + (size_t)r * nb, 0, logits, NULL);
	for (r = 0; r < 3; r++)
		step(be, m, b, depth + r, 1, nb, tables, 1, logits, ids);
	for (s = 0; s < b; s++)
		if (ids[s] != host_argmax(logits + (size_t)s * m->hp.n_vocab, m->hp.n_vocab)) {
			fprintf(stderr, "row %d: GPU argmax %d, host %d\n", s, ids[s],
			    host_argmax(logits + (size_t)s * m->hp.n_vocab, m->hp.n_vocab));
			exit(1);
		}
	for (r = 0; r < REPS; r++)
		t[r] = step(be, m, b, depth + 3 + r, 1, nb, tables, 1, logits, NULL);
	for (r = 0; r < REPS; r++)
		tg[r] = step(be, m, b, depth + 3 + REPS + r, 1, nb, tables, 1, NULL, ids);
	tl = median(t, REPS);
	ta = median(tg, REPS);
	printf("| decode   | %5d | %5d | %9.3f | %10.1f | %9.3f |\n", depth, b, tl * 1e3, b / tl, ta * 1e3);
	fflush(stdout);
	cuda_backend.free(be);
	free(tables);
}

int
main(int argc, char **argv)
{
	struct model_desc *m;
	char err[ERR_LEN];
	int p = argc > 2 ? atoi(argv[2]) : 512, depth = argc > 3 ? atoi(argv[3]) : 128, i;
	static const int def_b[] = { 1, 8, 16, 64 };
	float *logits;

	if (argc < 2 || p < 1 || depth < 1) {
		fprintf(stderr, "usage: cuda-step-bench MODEL [P [D [B ...]]]\n");
		return 2;
	}
	if (model_open(argv[1], &m, err) != 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	logits = xmalloc((size_t)MAX_B * (size_t)m->hp.n_vocab * sizeof *logits);
	printf("| step     | ctx   | seqs  | ms/step   | tokens/s   | ms argmax |\n");
	printf("|----------|-------|-------|-----------|------------|-----------|\n");
	bench_prefill(m, p, logits);
	for (i = 0; i < (argc > 4 ? argc - 4 : 4); i++) {
		int b = argc > 4 ? atoi(argv[4 + i]) : def_b[i];

		if (b >= 1 && b <= MAX_B)
			bench_decode(m, b, depth, logits);
	}
	free(logits);
	model_close(m);
	return 0;
}
