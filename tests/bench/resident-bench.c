/*
 * resident-bench: prompt and generation throughput of the engine, printed as
 * one table in the style of llama-bench, under a line naming the device and
 * its measured read bandwidth.
 *
 *   resident-bench -m MODEL [-p 128,...] [-n 32] [-b 1,4,...] [-d 0,4096,...]
 *                  [-r REPS] [-s] [-t THREADS] [-c CTX] [--device cpu|cuda]
 *                  [--grammar FILE | --json-schema FILE]
 *
 * ppN: N prompt tokens prefilled into one sequence (in steps of the
 * engine's step size); TTFT is the time from submitting the prompt to its
 * first sampled token. tgN: N tokens generated greedily by each of B
 * sequences decoding together (batch B), each already holding DEPTH tokens
 * of context (prefilled first, not timed; depth 0 is a one-token prompt).
 * With -s ("tgN s") they sample as a chat request does by default, so the
 * row counts the sampler's time per token too (a sampled end-of-text token
 * ends a sequence early: the tokens made are counted). Token ids are
 * random (seeded), so no text is needed; throughput does not depend on
 * the ids. With a grammar or a JSON Schema each tg row is followed by the
 * same test constrained by it ("tgN c"): every sequence's draws masked
 * (engine_grammar), a sequence whose grammar ends stopping there (the
 * tokens made are counted).
 *
 * For tg rows, GB/s is the bytes a decode step must read (the weights, less
 * the embedding rows it does not look up unless the output is tied to them,
 * plus every sequence's K and V over its context, sliding-window layers
 * capped at the window) times steps per second; "% bw" is that against the
 * device's read bandwidth measured here (CUDA: a read-only reduction kernel,
 * kernels/cuda/cuda_bw.cu; CPU: threads summing a buffer far beyond the L3).
 */
#include "config.h"
#include "engine.h"
#include "model.h"
#include "util.h"

#include "kernels.h"

#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_LIST 16
#define MAX_REPS 64
#define BW_RUNS 5
#define BW_MIN_BYTES ((size_t)1 << 30)

struct bench_opts {
	const char *model;
	struct engine_opts eng;
	int pp[MAX_LIST], n_pp;
	int tg, batch[MAX_LIST], n_batch;
	int depth[MAX_LIST], n_depth;
	int reps;
	int chat;               /* tg rows sample as a chat does by default, not greedily */
	const char *grammar_file, *schema_file; /* tg rows are repeated constrained by it */
	struct cons_gram *grammar;
	uint64_t device_memory;  /* bytes the engine may take on the device; 0: no limit */
};

/* The device the engine runs on: its name and measured read bandwidth. */
struct bench_dev {
	char name[128];
	double gb_s;
	char how[96];
};

/* Timings of one rep: seconds for the test, and for pp the time to first token. */
struct bench_time {
	double dt, ttft;
	double tokens;          /* made in dt: a sampled sequence can end early */
};

/* Parses a size with an M or G suffix ("2560M", "8G") into bytes; 0 if it is none. */
static uint64_t
parse_mib(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || v <= 0 || (end[0] != 'M' && end[0] != 'G') || end[1] != '\0')
		return 0;
	return (uint64_t)(v * (end[0] == 'G' ? 1073741824.0 : 1048576.0));
}

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

/*
 * No stops, max_tokens generated (fewer only where a sampled token or the
 * grammar ends the text); greedy unless chat.
 */
static void
bench_params(struct seq_params *p, int32_t max_tokens, int chat, struct cons_gram *g)
{
	memset(p, 0, sizeof *p);
	p->grammar = g;
	if (chat)
		sample_params_chat(&p->sample);
	else
		sample_params_default(&p->sample);
	p->max_tokens = max_tokens;
}

/* Steps the sequences until none is in PREFILL. */
static int
prefill_all(struct engine *e, struct seq **s, int n, char *err)
{
	int i, busy = 1;

	while (busy) {
		if (engine_step(e, s, n, -1, err) < 0)
			return -1;
		for (busy = 0, i = 0; i < n; i++)
			busy |= s[i]->state == SEQ_PREFILL;
	}
	return 0;
}

/*
 * Prefills n tokens into a new sequence: t->dt the prefill steps, t->ttft
 * from submitting the prompt to its first sampled token (the last prefill
 * step samples it).
 */
static int
run_pp(struct engine *e, int n, struct bench_time *t, char *err)
{
	int32_t *tok = xmalloc((size_t)n * sizeof *tok);
	struct seq_params p;
	struct seq *s;
	uint64_t t0, t1;
	int rc;

	random_tokens(tok, n, engine_model(e)->hp.n_vocab, 42);
	bench_params(&p, 1, 0, NULL);
	t0 = now_ns();
	if ((rc = engine_seq_new(e, tok, n, &p, &s, err)) == 0) {
		t1 = now_ns();
		if ((rc = prefill_all(e, &s, 1, err)) == 0 && s->new_token < 0)
			rc = err_set(err, ERR_INVAL, "pp%d: the prefill sampled no token", n);
		t->dt = (double)(now_ns() - t1) / 1e9;
		t->ttft = (double)(now_ns() - t0) / 1e9;
		t->tokens = n;
		engine_seq_free(e, s);
	}
	free(tok);
	return rc;
}

/*
 * Seconds for b sequences (each with depth tokens of context) to generate n
 * tokens each (chat: sampled; g: constrained by it).
 */
static int
run_tg(struct engine *e, int n, int b, int depth, int chat, struct cons_gram *g, struct bench_time *t, char *err)
{
	int32_t plen = MAX(depth, 1), *tok = xmalloc((size_t)plen * sizeof *tok);
	struct seq **s = xcalloc((size_t)b, sizeof *s);
	struct seq_params p;
	int i, made = 0, live, rc = 0;
	uint64_t t0;

	bench_params(&p, n + 1, chat, g);
	for (i = 0; i < b && rc == 0; i++) {
		random_tokens(tok, plen, engine_model(e)->hp.n_vocab, 1000 + (uint64_t)i);
		if ((rc = engine_seq_new(e, tok, plen, &p, &s[i], err)) == 0)
			made++;
	}
	/* the first token comes from the prefill: time only the n decode steps */
	if (rc == 0)
		rc = prefill_all(e, s, b, err);
	t0 = now_ns();
	for (live = rc == 0; live;) {
		if ((rc = engine_step(e, s, b, -1, err)) < 0)
			break;
		for (live = 0, i = 0; i < b; i++)
			live |= s[i]->state != SEQ_DONE;
	}
	t->dt = (double)(now_ns() - t0) / 1e9;
	t->ttft = 0;
	t->tokens = 0;
	for (i = 0; i < made; i++) {
		t->tokens += s[i]->n_generated - 1;
		engine_seq_free(e, s[i]);
	}
	free(s);
	free(tok);
	return rc < 0 ? rc : 0;
}

/* Mean and standard deviation of n values. */
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

/* Bytes of K and V of one position in one layer (the pool's element type). */
static double
kv_bytes_per_token_layer(const struct engine *e)
{
	const struct model_hparams *hp = &engine_model(e)->hp;

	return (double)engine_kv_bytes(e) / ((double)engine_kv_blocks(e) * KV_BLOCK_TOKENS * hp->n_layer);
}

/*
 * Bytes one decode step of b sequences reads, averaged over the n steps of
 * a tg run at depth: the weights (a tied embedding is read whole by the
 * output; an untied one only at the b rows looked up; of a layer's
 * experts, those the b tokens choose: n_expert_used of them for one, and
 * for more the share of experts that b uniform draws of n_expert_used
 * leave chosen, 1 - (1 - used / experts)^b), and each sequence's K and V
 * of every position it attends to. For a mixture of experts this is the
 * active-bytes roofline: what a step must read, not the file's size.
 */
static double
step_bytes(const struct engine *e, int n, int b, int depth)
{
	const struct model_desc *m = engine_model(e);
	const struct model_hparams *hp = &m->hp;
	double w = (double)m->weight_bytes, kv = 0, per = kv_bytes_per_token_layer(e);
	int k, l, plen = MAX(depth, 1);

	if (!hp->tied_embd)
		w -= (double)m->tok_embd->bytes * (1.0 - (double)b / hp->n_vocab);
	for (l = 0; hp->n_expert > 0 && l < hp->n_layer; l++) {
		double used = (double)hp->n_expert_used / hp->n_expert;
		double all = (double)model_expert_bytes(m, l) / used;

		w -= all * (1.0 - (b == 1 ? used : 1.0 - pow(1.0 - used, b)));
	}
	/* decode step k feeds position plen + k, attending to plen + k + 1 positions */
	for (k = 0; k < n; k++)
		for (l = 0; l < hp->n_layer; l++)
			kv += model_layer_is_swa(hp, l) ? MIN(plen + k + 1, hp->sliding_window) : plen + k + 1;
	return w + (double)b * per * kv / MAX(n, 1);
}

/* What the loaded model holds on its device, as the engine planned it, and a blank line. */
static void
print_memory(const struct engine *e)
{
	double mib = 1 << 20, all = (double)engine_mem_bytes(e), kv = (double)engine_kv_bytes(e);
	double w = (double)engine_model(e)->weight_bytes;
	uint64_t host;
	int32_t layers = engine_host_layers(e, &host);

	if (layers > 0)
		printf("memory: %.1f MiB held on the device (KV pool %.1f); %.1f MiB in host memory, the feed-forwards of "
		    "%d of %d layers (weights as stored %.1f MiB in all)\n\n", all / mib, kv / mib, host / mib, layers,
		    engine_model(e)->hp.n_layer, w / mib);
	else
		printf("memory: %.1f MiB held (weights as stored %.1f, KV pool %.1f, activations, scratch and padding "
		    "%.1f)\n\n", all / mib, w / mib, kv / mib, (all - w - kv) / mib);
}

/* Prints the table's head. */
static void
table_head(void)
{
	printf("| %-24s | %12s | %-7s | %-8s | %5s | %6s | %19s | %9s | %8s | %6s |\n", "model", "size",
	    "backend", "test", "batch", "depth", "t/s", "TTFT ms", "GB/s", "% bw");
	printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", "--------------------------", "-------------:",
	    "---------", "----------", "------:", "-------:", "--------------------:", "----------:", "---------:",
	    "-------:");
}

/*
 * Prints one row: tokens/s (mean ± sd) from the reps' times and, for pp,
 * the mean TTFT; for tg (bytes > 0) the achieved bandwidth of the mean.
 */
static void
row(const struct engine *e, const struct bench_dev *dev, const char *test, int batch, int depth,
    const struct bench_time *t, int n, double bytes)
{
	const struct model_desc *m = engine_model(e);
	double tps[MAX_REPS], ttft[MAX_REPS], mean, sd, tmean, tsd, gb_s;
	char c_ttft[16] = "-", c_gb[16] = "-", c_pct[16] = "-";
	int i;

	for (i = 0; i < n; i++) {
		tps[i] = t[i].tokens / t[i].dt;
		ttft[i] = t[i].ttft * 1e3;
	}
	stats(tps, n, &mean, &sd);
	stats(ttft, n, &tmean, &tsd);
	if (bytes > 0) {
		gb_s = bytes * (mean / batch) / 1e9; /* bytes per step x steps per second */
		snprintf(c_gb, sizeof c_gb, "%.1f", gb_s);
		if (dev->gb_s > 0)
			snprintf(c_pct, sizeof c_pct, "%.1f", 100 * gb_s / dev->gb_s);
	} else {
		snprintf(c_ttft, sizeof c_ttft, "%.1f", tmean);
	}
	printf("| %-24.24s | %8.1f MiB | %-7s | %-8s | %5d | %6d | %9.2f ± %-7.2f | %9s | %8s | %6s |\n", m->name,
	    (double)m->weight_bytes / (1 << 20), engine_device(e), test, batch, depth, mean, sd, c_ttft, c_gb,
	    c_pct);
	fflush(stdout);
}

/* ---- the device's read bandwidth ---- */

/* Where the read loops leave their sums, so that the reads cannot be optimized away. */
static volatile uint64_t bw_sink;

struct bw_part {
	const uint64_t *p;
	size_t n;
	uint64_t sum;
};

/* Sums a slice of the buffer; four sums keep several loads in flight. */
static void *
bw_read_part(void *arg)
{
	struct bw_part *w = arg;
	uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	size_t i;

	for (i = 0; i + 4 <= w->n; i += 4) {
		s0 += w->p[i], s1 += w->p[i + 1];
		s2 += w->p[i + 2], s3 += w->p[i + 3];
	}
	w->sum = s0 + s1 + s2 + s3;
	return NULL;
}

/* The CPU's name, from /proc/cpuinfo (Linux), or "CPU". */
static void
cpu_name(char *out, size_t len)
{
	FILE *fp = fopen("/proc/cpuinfo", "r");
	char line[256], *v;

	snprintf(out, len, "CPU");
	while (fp != NULL && fgets(line, sizeof line, fp) != NULL) {
		if (strncmp(line, "model name", 10) == 0 && (v = strchr(line, ':')) != NULL) {
			v += strspn(v + 1, " \t") + 1;
			v[strcspn(v, "\n")] = 0;
			snprintf(out, len, "%s", v);
			break;
		}
	}
	if (fp != NULL)
		fclose(fp);
}

/*
 * Read bandwidth of the CPU's memory: n_threads threads each sum their part
 * of a buffer at least 4 times the L3 (1 GiB at least), best of BW_RUNS.
 * Huge pages, where the kernel gives them, make faulting the buffer in
 * quick and keep TLB misses out of the timing.
 */
static int
cpu_bw_measure(int n_threads, struct bench_dev *dev, char *err)
{
	long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
	size_t bytes = MAX(BW_MIN_BYTES, l3 > 0 ? 4 * (size_t)l3 : 0), words = bytes / sizeof(uint64_t);
	uint64_t *buf = NULL, t0;
	struct bw_part *w;
	pthread_t *th;
	double best = 1e30;
	int r, i, nt = n_threads > 0 ? n_threads : (int)MAX(1, sysconf(_SC_NPROCESSORS_ONLN));

	if (posix_memalign((void **)&buf, (size_t)2 << 20, bytes) != 0)
		return err_set(err, ERR_NOMEM, "bandwidth test: no memory for %zu MiB", bytes >> 20);
	madvise(buf, bytes, MADV_HUGEPAGE);
	memset(buf, 1, bytes); /* fault the pages in before timing */
	w = xcalloc((size_t)nt, sizeof *w);
	th = xcalloc((size_t)nt, sizeof *th);
	for (i = 0; i < nt; i++) {
		w[i].p = buf + words / nt * i;
		w[i].n = i == nt - 1 ? words - words / nt * i : words / nt;
	}
	for (r = 0; r < BW_RUNS; r++) {
		t0 = now_ns();
		for (i = 0; i < nt; i++)
			pthread_create(&th[i], NULL, bw_read_part, &w[i]);
		for (i = 0; i < nt; i++)
			pthread_join(th[i], NULL);
		best = MIN(best, (double)(now_ns() - t0) / 1e9);
	}
	for (i = 0; i < nt; i++)
		bw_sink += w[i].sum;
	cpu_name(dev->name, sizeof dev->name);
	dev->gb_s = (double)bytes / best / 1e9;
	snprintf(dev->how, sizeof dev->how, "%d threads reading %zu MiB, best of %d", nt, bytes >> 20, BW_RUNS);
	free(w), free(th), free(buf);
	return 0;
}

/* The device of the engine and its read bandwidth. */
static int
measure_device(const struct engine *e, const struct bench_opts *o, struct bench_dev *dev, char *err)
{
	memset(dev, 0, sizeof *dev);
#ifdef HAVE_CUDA
	if (strcmp(engine_device(e), "cuda") == 0) {
		snprintf(dev->how, sizeof dev->how, "read-only reduction kernel over up to 4 GiB, best of 10");
		return cuda_bw_measure(0, &dev->gb_s, dev->name, sizeof dev->name, err);
	}
#endif
	return cpu_bw_measure(o->eng.n_threads, dev, err);
}

static void
usage(FILE *fp)
{
	fprintf(fp,
	    "usage: resident-bench -m MODEL [options]\n"
	    "  -m PATH              model (.gguf file or Hugging Face directory)\n"
	    "  -p N,...             prompt sizes: a ppN row each, with time to first token (default 128;\n"
	    "                       -p '' for none)\n"
	    "  -n N                 tokens generated per sequence in tg rows (default 32; 0: no tg rows)\n"
	    "  -b B,...             batches: sequences decoding together (default 1)\n"
	    "  -d D,...             depths: tokens already in each sequence's KV cache before tg is\n"
	    "                       timed (prefilled first, not timed; default 0)\n"
	    "  -r N                 repetitions of each test (default 3; t/s is mean ± sd)\n"
	    "  -s, --sample         tg rows sample as a chat request does by default (temperature\n"
	    "                       0.8, top-k 40, top-p 0.95, min-p 0.05), test 'tgN s'; default:\n"
	    "                       greedy\n"
	    "  -t N                 CPU threads (default: all cores)\n"
	    "  -c N                 context length (default: what the largest test needs)\n"
	    "      --device cpu|cuda  backend (default: cuda when built with it and a GPU is present)\n"
	    "      --grammar FILE   each tg row again with every sequence constrained by the grammar\n"
	    "                       in FILE (test 'tgN c'; a sequence stops where its grammar ends)\n"
	    "      --json-schema FILE  the same with the grammar of a JSON Schema\n"
	    "      --device-memory M  the device memory the model may take (a size: 8G, 2560M); what does\n"
	    "                       not fit keeps feed-forwards in host memory, computed there\n"
	    "      --exact          float activations in every product (default: 8-bit ones for\n"
	    "                       quantized weights on the CPU; on CUDA fp16 ones for long\n"
	    "                       prompts and an fp16 KV cache, here fp32)\n"
	    "      --kv-type f16|q8_0  how the KV cache holds keys and values (default f16; q8_0: 8 bits\n"
	    "                       and a scale for each 32)\n"
	    "  -h, --help\n"
	    "A header line names the device and its measured read bandwidth; tg rows show the\n"
	    "bytes a decode step reads (weights + KV) per second, and that as %% of the bandwidth.\n");
}

/* 0, 1 for --help, -1 for bad usage. */
static int
parse_opts(int argc, char **argv, struct bench_opts *o)
{
	static const struct option lo[] = { { "device", required_argument, NULL, 'D' },
		{ "exact", no_argument, NULL, 'E' }, { "sample", no_argument, NULL, 's' },
		{ "grammar", required_argument, NULL, 'G' }, { "json-schema", required_argument, NULL, 'J' },
		{ "device-memory", required_argument, NULL, 'M' }, { "help", no_argument, NULL, 'h' },
		{ "kv-type", required_argument, NULL, 'K' },
		{ NULL, 0, NULL, 0 } };
	char err[ERR_LEN];
	int c;

	memset(o, 0, sizeof *o);
	o->pp[0] = 128, o->n_pp = 1;
	o->tg = 32;
	o->batch[0] = 1, o->n_batch = 1;
	o->n_depth = 1;
	o->reps = 3;
	while ((c = getopt_long(argc, argv, "m:p:n:b:t:d:r:c:sh", lo, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 'p': if ((o->n_pp = parse_list(optarg, o->pp)) < 0) return -1; break;
		case 'n': o->tg = atoi(optarg); break;
		case 'b': if ((o->n_batch = parse_list(optarg, o->batch)) < 1) return -1; break;
		case 'd': if ((o->n_depth = parse_list(optarg, o->depth)) < 1) return -1; break;
		case 't': o->eng.n_threads = atoi(optarg); break;
		case 'r': o->reps = MAX(1, MIN(atoi(optarg), MAX_REPS)); break;
		case 'c': o->eng.n_ctx = atoi(optarg); break;
		case 'D': o->eng.device = optarg; break;
		case 'E': o->eng.exact = 1; break;
		case 'K':
			if (kv_type_parse(optarg, &o->eng.kv_type, err) != 0) {
				fprintf(stderr, "--kv-type: %s\n", err);
				return -1;
			}
			break;
		case 'M': if ((o->device_memory = parse_mib(optarg)) == 0) return -1; break;
		case 'G': o->grammar_file = optarg; break;
		case 'J': o->schema_file = optarg; break;
		case 's': o->chat = 1; break;
		case 'h': return 1;
		default: return -1;
		}
	}
	for (c = 0; c < o->n_batch; c++)
		if (o->batch[c] < 1)
			return -1;
	return o->model && o->tg >= 0 && !(o->grammar_file && o->schema_file) ? 0 : -1;
}

/* Sizes the context and KV pool for the largest test. */
static void
size_engine(struct bench_opts *o)
{
	int i, need = o->tg + 32, bmax = 1, dmax = 0;

	for (i = 0; i < o->n_pp; i++)
		need = MAX(need, o->pp[i] + 2);
	for (i = 0; i < o->n_depth; i++)
		dmax = MAX(dmax, o->depth[i]);
	for (i = 0; i < o->n_batch; i++)
		bmax = MAX(bmax, o->batch[i]);
	need = MAX(need, dmax + o->tg + 2);
	if (o->eng.n_ctx == 0)
		o->eng.n_ctx = need;
	/* every sequence of the largest batch holds depth + tg tokens, in whole blocks */
	o->eng.kv_tokens = MAX(o->eng.n_ctx, bmax * (dmax + o->tg + 2 * KV_BLOCK_TOKENS));
	o->eng.max_seqs = MAX(64, bmax);
}

/*
 * Untimed: the first steps pay for one-off set-up (cuBLAS handles and the
 * kernels it loads on their first call, about 65 ms for a full step of
 * llama3-8b on an H200; graph captures, page faults), so the warm-up
 * prefills a full step where the context allows.
 */
static int
warm_up(struct engine *e, char *err)
{
	struct bench_time t;
	int rc;

	if ((rc = run_pp(e, MAX(32, MIN(engine_max_step_tokens(e), engine_n_ctx(e) - 2)), &t, err)) != 0)
		return rc;
	return run_tg(e, 4, 1, 1, 0, NULL, &t, err);
}

static int
bench_pp(struct engine *e, const struct bench_opts *o, const struct bench_dev *dev, char *err)
{
	struct bench_time t[MAX_REPS];
	char name[32];
	int i, r, rc;

	for (i = 0; i < o->n_pp; i++) {
		for (r = 0; r < o->reps; r++)
			if ((rc = run_pp(e, o->pp[i], &t[r], err)) != 0)
				return rc;
		snprintf(name, sizeof name, "pp%d", o->pp[i]);
		row(e, dev, name, 1, 0, t, o->reps, 0);
	}
	return 0;
}

static int
bench_tg(struct engine *e, const struct bench_opts *o, const struct bench_dev *dev, char *err)
{
	struct bench_time t[MAX_REPS];
	char name[32];
	int d, j, r, rc, b;

	for (d = 0; d < o->n_depth && o->tg > 0; d++) {
		for (j = 0; j < o->n_batch; j++) {
			b = o->batch[j];
			for (int c = 0; c <= (o->grammar != NULL); c++) {
				snprintf(name, sizeof name, "tg%d%s%s", o->tg, o->chat ? " s" : "", c ? " c" : "");
				for (r = 0; r < o->reps; r++)
					if ((rc = run_tg(e, o->tg, b, o->depth[d], o->chat, c ? o->grammar : NULL, &t[r],
					    err)) != 0)
						return rc;
				row(e, dev, name, b, o->depth[d], t, o->reps, step_bytes(e, o->tg, b, o->depth[d]));
			}
		}
	}
	return 0;
}

/* The --grammar or --json-schema file as a grammar over e's vocabulary (o->grammar), and how long that took. */
static int
load_grammar(struct engine *e, struct bench_opts *o, char *err)
{
	const char *file = o->grammar_file ? o->grammar_file : o->schema_file;
	char *data = NULL;
	uint64_t t0 = now_ns();
	size_t len;
	int rc;

	if (file == NULL)
		return 0;
	if ((rc = read_file(file, &data, &len, err)) != 0)
		return rc;
	rc = o->schema_file != NULL ? engine_schema(e, data, len, &o->grammar, err) :
	    engine_grammar(e, data, len, &o->grammar, err);
	free(data);
	if (rc != 0)
		return err_prefix(err, rc, "%s", file);
	printf("grammar: %s compiled and indexed over the vocabulary in %.1f ms\n", file, (double)(now_ns() - t0) / 1e6);
	return 0;
}

int
main(int argc, char **argv)
{
	struct bench_opts o;
	struct bench_dev dev;
	struct engine *e;
	char err[ERR_LEN];
	int rc;

	if ((rc = parse_opts(argc, argv, &o)) != 0) {
		usage(rc > 0 ? stdout : stderr);
		return rc > 0 ? 0 : 2;
	}
	size_engine(&o);
	if (engine_prepare(o.model, &o.eng, &e, err) != 0) {
		fprintf(stderr, "resident-bench: %s\n", err);
		return 1;
	}
	if ((rc = engine_load(e, o.device_memory, err)) != 0)
		goto out;
	if ((rc = measure_device(e, &o, &dev, err)) != 0 || (rc = warm_up(e, err)) != 0 ||
	    (rc = load_grammar(e, &o, err)) != 0)
		goto out;
	printf("device: %s, read bandwidth %.1f GB/s (%s)\n", dev.name, dev.gb_s, dev.how);
	print_memory(e);
	table_head();
	if ((rc = bench_pp(e, &o, &dev, err)) == 0)
		rc = bench_tg(e, &o, &dev, err);
out:
	if (rc != 0)
		fprintf(stderr, "resident-bench: %s\n", err);
	if (o.grammar != NULL)
		engine_grammar_put(e, o.grammar);
	engine_close(e);
	return rc != 0;
}
