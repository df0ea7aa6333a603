/*
 * resident-bench: prompt and generation throughput of the engine, printed as
 * one table in the style of llama-bench.
 *
 *   resident-bench -m MODEL [-p 512,4096] [-n 128] [-b 1,4,16] [-t THREADS]
 *                  [-d DEPTH,...] [--device cpu|cuda] [-r REPS]
 *
 * ppN: N prompt tokens prefilled into one sequence (in steps of the
 * engine's step size). tgN: N tokens generated greedily by each of B
 * sequences decoding together (batch B), after a 16-token prompt, or after
 * DEPTH tokens of context when -d is given. Token ids are random (seeded),
 * so no text is needed; throughput does not depend on the ids.
 */
#include "config.h"
#include "engine.h"
#include "model.h"
#include "util.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 16

struct bench_opts {
	const char *model;
	struct engine_opts eng;
	int pp[MAX_LIST], n_pp;
	int tg, batch[MAX_LIST], n_batch;
	int depth[MAX_LIST], n_depth;
	int reps;
};

/* Parses "1,4,16" into out. Returns the count, or -1. */
static int
parse_list(const char *s, int *out)
{
	int n = 0;
	char *end;

	while (*s && n < MAX_LIST) {
		out[n++] = (int)strtol(s, &end, 10);
		if (end == s || out[n - 1] < 0)
			return -1;
		s = *end == ',' ? end + 1 : end;
	}
	return n;
}

/* Random token ids below n_vocab, avoiding nothing: the engine takes any id. */
static void
random_tokens(int32_t *t, int32_t n, int32_t n_vocab, uint64_t seed)
{
	int32_t i;

	for (i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		t[i] = (int32_t)((seed >> 33) % (uint64_t)n_vocab);
	}
}

/* Greedy, no stops, exactly max_tokens generated. */
static void
bench_params(struct seq_params *p, int32_t max_tokens)
{
	memset(p, 0, sizeof *p);
	sample_params_default(&p->sample);
	p->max_tokens = max_tokens;
}

/* Steps the sequences until none is in PREFILL. */
static int
prefill_all(struct engine *e, struct seq **s, int n, char *err)
{
	int i, busy = 1;

	while (busy) {
		if (engine_step(e, s, n, err) < 0)
			return -1;
		for (busy = 0, i = 0; i < n; i++)
			busy |= s[i]->state == SEQ_PREFILL;
	}
	return 0;
}

/* Seconds to prefill n tokens into a new sequence. */
static double
run_pp(struct engine *e, int n, char *err)
{
	int32_t *t = xmalloc((size_t)n * sizeof *t);
	struct seq_params p;
	struct seq *s;
	uint64_t t0;
	double dt = -1;

	random_tokens(t, n, engine_model(e)->hp.n_vocab, 42);
	bench_params(&p, 1);
	if (engine_seq_new(e, t, n, &p, &s, err) == 0) {
		t0 = now_ns();
		if (prefill_all(e, &s, 1, err) == 0)
			dt = (double)(now_ns() - t0) / 1e9;
		engine_seq_free(e, s);
	}
	free(t);
	return dt;
}

/* Seconds for b sequences (each with depth tokens of context) to generate n tokens each. */
static double
run_tg(struct engine *e, int n, int b, int depth, char *err)
{
	int32_t plen = depth > 0 ? depth : 16, *t = xmalloc((size_t)plen * sizeof *t);
	struct seq **s = xcalloc((size_t)b, sizeof *s);
	struct seq_params p;
	int i, made = 0, live;
	uint64_t t0;
	double dt = -1;

	bench_params(&p, n + 1);
	for (i = 0; i < b; i++, made++) {
		random_tokens(t, plen, engine_model(e)->hp.n_vocab, 1000 + (uint64_t)i);
		if (engine_seq_new(e, t, plen, &p, &s[i], err) != 0)
			goto out;
	}
	/* the first token comes from the prefill: time only the decode steps */
	if (prefill_all(e, s, b, err) != 0)
		goto out;
	t0 = now_ns();
	for (live = 1; live;) {
		if (engine_step(e, s, b, err) < 0)
			goto out;
		for (live = 0, i = 0; i < b; i++)
			live |= s[i]->state != SEQ_DONE;
	}
	dt = (double)(now_ns() - t0) / 1e9;
out:
	for (i = 0; i < made; i++)
		engine_seq_free(e, s[i]);
	free(s);
	free(t);
	return dt;
}

/* Mean and standard deviation of reps runs of tokens/s. */
static void
stats(const double *v, int n, double *mean, double *sd)
{
	double s = 0, q = 0;
	int i;

	for (i = 0; i < n; i++)
		s += v[i];
	*mean = s / n;
	for (i = 0; i < n; i++)
		q += (v[i] - *mean) * (v[i] - *mean);
	*sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

/* Prints one table row. */
static void
row(const struct engine *e, const char *test, int batch, const double *tps, int n)
{
	const struct model_desc *m = engine_model(e);
	double mean, sd;

	stats(tps, n, &mean, &sd);
	printf("| %-24.24s | %8.1f MiB | %-5s | %5d | %-14s | %10.2f ± %-8.2f |\n", m->name,
	    (double)m->weight_bytes / (1 << 20), engine_device(e), batch, test, mean, sd);
}

static int
parse_opts(int argc, char **argv, struct bench_opts *o)
{
	static const struct option lo[] = { { "device", required_argument, NULL, 'D' }, { NULL, 0, NULL, 0 } };
	int c;

	memset(o, 0, sizeof *o);
	o->pp[0] = 512, o->n_pp = 1;
	o->tg = 128;
	o->batch[0] = 1, o->n_batch = 1;
	o->reps = 3;
	while ((c = getopt_long(argc, argv, "m:p:n:b:t:d:r:c:", lo, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'p': if ((o->n_pp = parse_list(optarg, o->pp)) < 0) return -1; break;
		case 'n': o->tg = atoi(optarg); break;
		case 'b': if ((o->n_batch = parse_list(optarg, o->batch)) < 1) return -1; break;
		case 'd': if ((o->n_depth = parse_list(optarg, o->depth)) < 0) return -1; break;
		case 't': o->eng.n_threads = atoi(optarg); break;
		case 'r': o->reps = MAX(1, atoi(optarg)); break;
		case 'c': o->eng.n_ctx = atoi(optarg); break;
		case 'D': o->eng.device = optarg; break;
		default: return -1;
		}
	}
	return o->model ? 0 : -1;
}

/* Sizes the context and KV pool for the largest test. */
static void
size_engine(struct bench_opts *o)
{
	int i, need = o->tg + 32, bmax = 1;

	for (i = 0; i < o->n_pp; i++)
		need = MAX(need, o->pp[i] + 2);
	for (i = 0; i < o->n_depth; i++)
		need = MAX(need, o->depth[i] + o->tg + 2);
	for (i = 0; i < o->n_batch; i++)
		bmax = MAX(bmax, o->batch[i]);
	if (o->eng.n_ctx == 0)
		o->eng.n_ctx = need;
	o->eng.kv_tokens = MAX(o->eng.n_ctx, bmax * (o->tg + 32 + (o->n_depth ? o->depth[o->n_depth - 1] : 0)));
	o->eng.max_seqs = MAX(64, bmax);
}

int
main(int argc, char **argv)
{
	struct bench_opts o;
	struct engine *e;
	char err[ERR_LEN], name[32];
	double tps[64], dt;
	int i, j, r, d;

	if (parse_opts(argc, argv, &o) != 0) {
		fprintf(stderr, "usage: resident-bench -m MODEL [-p 512,4096] [-n 128] [-b 1,4,16] [-d DEPTH,...] "
		    "[-t THREADS] [-r REPS] [--device cpu|cuda]\n");
		return 2;
	}
	size_engine(&o);
	if (engine_open(o.model, &o.eng, &e, err) != 0) {
		fprintf(stderr, "resident-bench: %s\n", err);
		return 1;
	}
	printf("| %-24s | %12s | %-5s | %5s | %-14s | %21s |\n", "model", "size", "dev", "batch", "test", "t/s");
	printf("|%s|%s|%s|%s|%s|%s|\n", "--------------------------", "--------------", "-------", "-------",
	    "----------------", "-----------------------");
	for (i = 0; i < o.n_pp; i++) {
		for (r = 0; r < MIN(o.reps, 64); r++) {
			if ((dt = run_pp(e, o.pp[i], err)) < 0)
				goto fail;
			tps[r] = o.pp[i] / dt;
		}
		snprintf(name, sizeof name, "pp%d", o.pp[i]);
		row(e, name, 1, tps, MIN(o.reps, 64));
	}
	for (d = 0; d < MAX(o.n_depth, 1) && o.tg > 0; d++) {
		for (j = 0; j < o.n_batch; j++) {
			for (r = 0; r < MIN(o.reps, 64); r++) {
				if ((dt = run_tg(e, o.tg, o.batch[j], o.n_depth ? o.depth[d] : 0, err)) < 0)
					goto fail;
				tps[r] = (double)o.tg * o.batch[j] / dt;
			}
			if (o.n_depth)
				snprintf(name, sizeof name, "tg%d @ d%d", o.tg, o.depth[d]);
			else
				snprintf(name, sizeof name, "tg%d", o.tg);
			row(e, name, o.batch[j], tps, MIN(o.reps, 64));
		}
	}
	engine_close(e);
	return 0;
fail:
	fprintf(stderr, "resident-bench: %s\n", err);
	engine_close(e);
	return 1;
}
