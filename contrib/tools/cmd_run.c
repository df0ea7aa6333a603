/*
 * cmd_run.c: running a model without the daemon: generate text, dump
 * logits, measure perplexity.
 */
#include "config.h"
#include "cmds.h"
#include "engine.h"
#include "kernels.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOP 16

/* Options shared by the engine-driven commands. */
struct run_opts {
	struct engine_opts eng;
	struct seq_params sp;
	const char *stop[MAX_STOP];
	int chat;
	int ids;
	int prompt_ids;             /* the prompt is token ids, not text */
	int chunk;
	int special;
	const char *out;
};

enum { OPT_TEMP = 256, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REP, OPT_PRES, OPT_FREQ, OPT_SEED,
	OPT_MAXTOK, OPT_STOP, OPT_CHAT, OPT_IDS, OPT_CHUNK, OPT_THREADS, OPT_DEVICE, OPT_CTX,
	OPT_OUT, OPT_SPECIAL, OPT_EXACT, OPT_PROMPT_IDS, OPT_KV_TYPE };

static const struct option run_longopts[] = {
	{ "temp", required_argument, NULL, OPT_TEMP }, { "top-k", required_argument, NULL, OPT_TOPK },
	{ "top-p", required_argument, NULL, OPT_TOPP }, { "min-p", required_argument, NULL, OPT_MINP },
	{ "repeat-penalty", required_argument, NULL, OPT_REP },
	{ "presence-penalty", required_argument, NULL, OPT_PRES },
	{ "frequency-penalty", required_argument, NULL, OPT_FREQ },
	{ "seed", required_argument, NULL, OPT_SEED }, { "max-tokens", required_argument, NULL, OPT_MAXTOK },
	{ "stop", required_argument, NULL, OPT_STOP }, { "chat", no_argument, NULL, OPT_CHAT },
	{ "ids", no_argument, NULL, OPT_IDS }, { "chunk", required_argument, NULL, OPT_CHUNK },
	{ "prompt-ids", no_argument, NULL, OPT_PROMPT_IDS },
	{ "threads", required_argument, NULL, OPT_THREADS }, { "device", required_argument, NULL, OPT_DEVICE },
	{ "ctx", required_argument, NULL, OPT_CTX }, { "out", required_argument, NULL, OPT_OUT },
	{ "special", no_argument, NULL, OPT_SPECIAL }, { "exact", no_argument, NULL, OPT_EXACT },
	{ "kv-type", required_argument, NULL, OPT_KV_TYPE },
	{ NULL, 0, NULL, 0 },
};

/* Parses the options; returns the index of the first operand or -1. */
static int
parse_run_opts(int argc, char **argv, struct run_opts *o)
{
	char err[ERR_LEN];
	int c;

	memset(o, 0, sizeof *o);
	sample_params_default(&o->sp.sample);
	o->sp.max_tokens = 128;
	o->sp.stop = o->stop;
	while ((c = getopt_long(argc, argv, "", run_longopts, NULL)) != -1) {
		switch (c) {
		case OPT_TEMP: o->sp.sample.temperature = strtof(optarg, NULL); break;
		case OPT_TOPK: o->sp.sample.top_k = atoi(optarg); break;
		case OPT_TOPP: o->sp.sample.top_p = strtof(optarg, NULL); break;
		case OPT_MINP: o->sp.sample.min_p = strtof(optarg, NULL); break;
		case OPT_REP: o->sp.sample.repeat_penalty = strtof(optarg, NULL); break;
		case OPT_PRES: o->sp.sample.presence_penalty = strtof(optarg, NULL); break;
		case OPT_FREQ: o->sp.sample.frequency_penalty = strtof(optarg, NULL); break;
		case OPT_SEED: o->sp.sample.seed = strtoull(optarg, NULL, 0); break;
		case OPT_MAXTOK: o->sp.max_tokens = atoi(optarg); break;
		case OPT_STOP:
			if (o->sp.n_stop == MAX_STOP)
				return -1;
			o->stop[o->sp.n_stop++] = optarg;
			break;
		case OPT_CHAT: o->chat = 1; break;
		case OPT_IDS: o->ids = 1; break;
		case OPT_PROMPT_IDS: o->prompt_ids = 1; break;
		case OPT_CHUNK: o->chunk = atoi(optarg); break;
		case OPT_THREADS: o->eng.n_threads = atoi(optarg); break;
		case OPT_DEVICE: o->eng.device = optarg; break;
		case OPT_CTX: o->eng.n_ctx = atoi(optarg); break;
		case OPT_OUT: o->out = optarg; break;
		case OPT_SPECIAL: o->special = 1; break;
		case OPT_EXACT: o->eng.exact = 1; break;
		case OPT_KV_TYPE:
			if (kv_type_parse(optarg, &o->eng.kv_type, err) != 0) {
				fprintf(stderr, "--kv-type: %s\n", err);
				return -1;
			}
			break;
		default: return -1;
		}
	}
	return optind;
}

/* Token ids given as numbers between spaces or commas (--prompt-ids), each inside the vocabulary. */
static int
parse_prompt_ids(const struct model_desc *m, const char *s, int32_t **ids, size_t *n, char *err)
{
	char *end;
	long v;

	*ids = xmalloc((strlen(s) / 2 + 1) * sizeof **ids);
	for (*n = 0; *s != '\0'; s = end) {
		while (*s == ' ' || *s == ',')
			s++;
		if (*s == '\0')
			break;
		v = strtol(s, &end, 10);
		if (end == s || v < 0 || v >= tok_n_vocab(m->tok))
			return err_set(err, ERR_INVAL, "--prompt-ids: '%.20s' is not a token id of the vocabulary", s);
		(*ids)[(*n)++] = (int32_t)v;
	}
	return *n > 0 ? 0 : err_set(err, ERR_INVAL, "--prompt-ids: no ids");
}

/* Turns the prompt into tokens: ids as they are, through the chat template, or as raw text. */
static int
prompt_tokens(const struct model_desc *m, const char *prompt, const struct run_opts *o, int32_t **ids, size_t *n,
    char *err)
{
	struct chat_msg msg = { .role = "user", .content = prompt };
	char *text;
	size_t len;
	int rc;

	if (o->prompt_ids)
		return parse_prompt_ids(m, prompt, ids, n, err);
	if (!o->chat)
		return tok_encode(m->tok, prompt, strlen(prompt), 0, tok_add_bos(m->tok), ids, n, err);
	if (m->chat_error != NULL)
		return err_set(err, ERR_UNSUPPORTED, "%s", m->chat_error);
	if (m->chat == CHAT_RAW)
		return err_set(err, ERR_UNSUPPORTED, "the model has no chat template; run without --chat");
	if ((rc = chat_render(m->chat, &msg, 1, 1, tok_piece(m->tok, tok_bos(m->tok)), &text, &len, err)) != 0)
		return rc;
	rc = tok_encode(m->tok, text, len, 1, 0, ids, n, err);
	free(text);
	return rc;
}

/* Prints what a step produced. */
static void
print_output(const struct seq *s, int ids)
{
	if (s->new_token < 0)
		return;
	if (ids)
		printf("%d ", s->new_token);
	else
		fwrite(s->out.part[CHAT_PART_ANSWER].piece, 1, s->out.part[CHAT_PART_ANSWER].piece_len, stdout);
	fflush(stdout);
}

/* Generates from a prompt and streams it to stdout. */
int
cmd_run(int argc, char **argv)
{
	struct run_opts o;
	struct engine *e;
	struct seq *s;
	int32_t *ids = NULL;
	size_t n = 0;
	char err[ERR_LEN];
	uint64_t t0, t1, t2;
	int i = parse_run_opts(argc, argv, &o), rc;

	if (i < 0 || argc - i != 2) {
		fprintf(stderr, "usage: resident-model run MODEL PROMPT [--chat] [--max-tokens N] [--temp T] "
		    "[--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S] [--stop STR]... "
		    "[--ids] [--prompt-ids] [--threads N] [--ctx N] [--device cpu|cuda] [--exact] [--kv-type f16|q8_0]\n");
		return 2;
	}
	t0 = now_ns();
	if ((rc = engine_open(argv[i], &o.eng, &e, err)) != 0) {
		fprintf(stderr, "resident-model run: %s\n", err);
		return 1;
	}
	t1 = now_ns();
	if ((rc = prompt_tokens(engine_model(e), argv[i + 1], &o, &ids, &n, err)) != 0 ||
	    (rc = engine_seq_new(e, ids, (int32_t)n, &o.sp, &s, err)) != 0) {
		fprintf(stderr, "resident-model run: %s\n", err);
		free(ids);
		engine_close(e);
		return 1;
	}
	while (s->state != SEQ_DONE && (rc = engine_step(e, &s, 1, -1, err)) >= 0)
		print_output(s, o.ids);
	t2 = now_ns();
	putchar('\n');
	if (s->finish == FINISH_ERROR)
		fprintf(stderr, "resident-model run: %s\n", s->error);
	fprintf(stderr, "[%s, %s: load %.2f s; %zu prompt + %d generated tokens in %.2f s; finish: %s]\n",
	    engine_model(e)->name, engine_device(e), (double)(t1 - t0) / 1e9, n, s->n_generated,
	    (double)(t2 - t1) / 1e9, engine_finish_name(s->finish));
	rc = s->finish == FINISH_ERROR;
	engine_seq_free(e, s);
	engine_close(e);
	free(ids);
	return rc;
}

/*
 * Runs the backend eo->device names (the CPU if none) over tokens in
 * chunks of `chunk`, with logits for every position into logits (n x
 * n_vocab). Not through the engine: the engine only asks for the rows it
 * samples from.
 */
static int
forward_all(const struct model_desc *m, const struct engine_opts *eo, const int32_t *tok, int32_t n,
    int32_t chunk, float *logits, char *err)
{
	struct backend_opts bo = { .n_threads = eo->n_threads, .max_seqs = 1, .exact = eo->exact,
		.kv_type = eo->kv_type };
	const struct backend_ops *ops;
	struct backend *be;
	struct fwd_seq fs;
	struct fwd_batch b = { .n_seqs = 1, .seqs = &fs };
	int32_t *table, i, done;
	int rc;

	if ((rc = engine_pick_backend(eo->device ? eo->device : "cpu", &ops, err)) != 0)
		return rc;
	chunk = chunk > 0 ? MIN(chunk, n) : n;
	bo.kv_blocks = (n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	bo.max_tokens = chunk;
	if ((rc = ops->load(m, &bo, &be, err)) != 0)
		return err_prefix(err, rc, "%s backend", ops->name);
	table = xmalloc((size_t)bo.kv_blocks * sizeof *table);
	for (i = 0; i < bo.kv_blocks; i++)
		table[i] = i;
	for (done = 0; done < n && rc == 0; done += b.n_tokens) {
		b.n_tokens = MIN(chunk, n - done);
		b.tokens = tok + done;
		fs = (struct fwd_seq){ b.n_tokens, done, table, (int32_t)bo.kv_blocks, b.n_tokens, 0, 0 };
		rc = ops->forward(be, &b, logits + (size_t)done * (size_t)m->hp.n_vocab, err);
	}
	free(table);
	ops->free(be);
	return rc;
}

/* Parses token ids from argv. */
static int32_t *
parse_ids(int argc, char **argv, int32_t *n)
{
	int32_t *ids = xmalloc((size_t)(argc ? argc : 1) * sizeof *ids);
	int i;

	for (i = 0; i < argc; i++)
		ids[i] = (int32_t)strtol(argv[i], NULL, 10);
	*n = argc;
	return ids;
}

/* Writes the logits of every position of a token sequence as raw float32. */
int
cmd_logits(int argc, char **argv)
{
	struct run_opts o;
	struct model_desc *m;
	int32_t *ids, n;
	float *logits;
	char err[ERR_LEN];
	FILE *fp;
	int i = parse_run_opts(argc, argv, &o), rc;

	if (i < 0 || argc - i < 2 || o.out == NULL) {
		fprintf(stderr, "usage: resident-model logits MODEL --out FILE.f32 [--chunk N] [--threads N] "
		    "[--device cpu|cuda] [--exact] [--kv-type f16|q8_0] ID...\n");
		return 2;
	}
	if (model_open(argv[i], &m, err) != 0) {
		fprintf(stderr, "resident-model logits: %s\n", err);
		return 1;
	}
	ids = parse_ids(argc - i - 1, argv + i + 1, &n);
	logits = xmalloc((size_t)n * (size_t)m->hp.n_vocab * sizeof *logits);
	rc = forward_all(m, &o.eng, ids, n, o.chunk, logits, err);
	if (rc == 0 && ((fp = fopen(o.out, "wb")) == NULL ||
	    fwrite(logits, sizeof *logits, (size_t)n * (size_t)m->hp.n_vocab, fp) !=
	    (size_t)n * (size_t)m->hp.n_vocab || fclose(fp) != 0))
		rc = err_set(err, ERR_IO, "%s: cannot write", o.out);
	if (rc != 0)
		fprintf(stderr, "resident-model logits: %s\n", err);
	free(logits);
	free(ids);
	model_close(m);
	return rc != 0;
}

/* Mean negative log-likelihood of tokens[1..n) given their prefixes. */
static double
mean_nll(const float *logits, const int32_t *tok, int32_t n, int32_t n_vocab)
{
	double total = 0, sum, mx;
	int32_t i, j;

	for (i = 0; i + 1 < n; i++) {
		const float *row = logits + (size_t)i * (size_t)n_vocab;

		for (mx = row[0], j = 1; j < n_vocab; j++)
			mx = MAX(mx, row[j]);
		for (sum = 0, j = 0; j < n_vocab; j++)
			sum += exp(row[j] - mx);
		total += log(sum) + mx - row[tok[i + 1]];
	}
	return total / (n - 1);
}

/* Perplexity of a text file under the model. */
int
cmd_perplexity(int argc, char **argv)
{
	struct run_opts o;
	struct model_desc *m;
	int32_t *ids = NULL;
	size_t n = 0, len;
	float *logits;
	char err[ERR_LEN], *text;
	int i = parse_run_opts(argc, argv, &o), rc;

	if (i < 0 || argc - i != 2) {
		fprintf(stderr, "usage: resident-model perplexity MODEL TEXTFILE [--threads N] [--chunk N] "
		    "[--device cpu|cuda] [--exact] [--kv-type f16|q8_0]\n");
		return 2;
	}
	if ((rc = model_open(argv[i], &m, err)) != 0) {
		fprintf(stderr, "resident-model perplexity: %s\n", err);
		return 1;
	}
	if ((rc = read_file(argv[i + 1], &text, &len, err)) == 0) {
		rc = tok_encode(m->tok, text, len, 0, tok_add_bos(m->tok), &ids, &n, err);
		free(text);
	}
	if (rc == 0 && n < 2)
		rc = err_set(err, ERR_INVAL, "the text has fewer than 2 tokens");
	if (rc == 0) {
		logits = xmalloc(n * (size_t)m->hp.n_vocab * sizeof *logits);
		if ((rc = forward_all(m, &o.eng, ids, (int32_t)n, o.chunk, logits, err)) == 0)
			printf("tokens %zu perplexity %.4f\n", n, exp(mean_nll(logits, ids, (int32_t)n, m->hp.n_vocab)));
		free(logits);
	}
	if (rc != 0)
		fprintf(stderr, "resident-model perplexity: %s\n", err);
	free(ids);
	model_close(m);
	return rc != 0;
}
