/*
 * test_batch.c: batch invariance of the CPU backend, for every family.
 *
 * A sequence's logits must not depend on what else shares its steps: the
 * same whether its prompt is prefilled in one chunk or in chunks of 7, and
 * whether it decodes alone or beside 15 other sequences (some prefilling,
 * some decoding). Models are generated into a temporary directory. Both
 * CPU modes: the default one (quantized weights meet 8-bit activations)
 * and the exact one (float activations), with a float KV cache and a q8_0
 * one. An embedding model's bidirectional sequence's hidden states
 * likewise, beside others. A q8_0 cache's logits stay near the float
 * cache's, and its blocks copy and move whole.
 */
#include "config.h"
#include "genmodel.h"
#include "kernels.h"
#include "model.h"
#include "util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define PROMPT 23
#define OTHERS 15
#define MAX_BLOCKS 8
#define TOL 1e-5

struct fixture {
	char dir[64];
	char path[128];
	struct model_desc *m;
	struct backend *be;
	int32_t n_vocab;
};

/* The backend's options: a pool for every sequence of the tests. */
static struct backend_opts
opts(int exact, enum kv_type kv)
{
	return (struct backend_opts){ .n_threads = 2, .kv_type = kv, .kv_blocks = (OTHERS + 1) * MAX_BLOCKS,
		.max_tokens = 256, .max_seqs = OTHERS + 1, .exact = exact };
}

/* Generates SHAPE as GGUF of type and loads it on the CPU backend. */
static int
setup_kv(void **state, const char *shape, const char *type, int exact, enum kv_type kv)
{
	struct fixture *f = xcalloc(1, sizeof *f);
	struct genmodel_opts o = { .shape = shape, .format = "gguf", .type = type, .seed = 3, .threads = 2 };
	struct backend_opts bo = opts(exact, kv);
	char err[ERR_LEN];

	snprintf(f->dir, sizeof f->dir, "/tmp/test_batch_XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof f->path, "%s/m.gguf", f->dir);
	o.out = f->path;
	if (genmodel_run(&o, err) != 0 || model_open(f->path, &f->m, err) != 0 ||
	    cpu_backend.load(f->m, &bo, &f->be, err) != 0)
		fail_msg("%s: %s", shape, err);
	f->n_vocab = f->m->hp.n_vocab;
	*state = f;
	return 0;
}

static int
setup_shape(void **state, const char *shape, const char *type, int exact)
{
	return setup_kv(state, shape, type, exact, KV_F16);
}

/* The default mode (8-bit activations for quantized weights), and --exact; an embedding model; q8_0 KV. */
static int setup_llama(void **s) { return setup_shape(s, "tiny", "q8_0", 0); }
static int setup_qwen2(void **s) { return setup_shape(s, "tiny-qwen2", "f16", 0); }
static int setup_qwen3(void **s) { return setup_shape(s, "tiny-qwen3", "q4_k_m", 0); }
static int setup_qwen3_q5km(void **s) { return setup_shape(s, "tiny-qwen3", "q5_k_m", 0); }
static int setup_gemma3(void **s) { return setup_shape(s, "tiny-gemma3", "q4_k_m", 0); }
static int setup_llama_exact(void **s) { return setup_shape(s, "tiny", "q8_0", 1); }
static int setup_gemma3_exact(void **s) { return setup_shape(s, "tiny-gemma3", "q4_k_m", 1); }
static int setup_gemma3_embed(void **s) { return setup_shape(s, "tiny-gemma3-embed", "q8_0", 0); }
static int setup_llama_q8kv(void **s) { return setup_kv(s, "tiny", "q8_0", 0, KV_Q8_0); }
static int setup_gemma3_q8kv(void **s) { return setup_kv(s, "tiny-gemma3", "q4_k_m", 0, KV_Q8_0); }
static int setup_gemma3_exact_q8kv(void **s) { return setup_kv(s, "tiny-gemma3", "q4_k_m", 1, KV_Q8_0); }

static int
teardown(void **state)
{
	struct fixture *f = *state;

	cpu_backend.free(f->be);
	model_close(f->m);
	unlink(f->path);
	rmdir(f->dir);
	free(f);
	return 0;
}

/* Block table of sequence s: its own MAX_BLOCKS blocks. */
static int32_t *
table_of(int s)
{
	static int32_t t[OTHERS + 1][MAX_BLOCKS];
	int i;

	for (i = 0; i < MAX_BLOCKS; i++)
		t[s][i] = s * MAX_BLOCKS + i;
	return t[s];
}

/* Deterministic token ids of sequence s. */
static int32_t
tok(int s, int i, int32_t n_vocab)
{
	return (int32_t)(((uint32_t)s * 7919u + (uint32_t)i * 104729u + 17u) % (uint32_t)n_vocab);
}

/*
 * Runs one step: sequence k (k < n) gets new[k] tokens from position pos[k],
 * with every row's logits. Returns the logits (malloc'd), rows in order.
 */
static float *
step(struct fixture *f, int n, const int *seq_id, const int *pos, const int *n_new)
{
	struct fwd_seq fs[OTHERS + 1];
	int32_t toks[256];
	int k, i, t = 0;
	struct fwd_batch b = { .n_seqs = n, .seqs = fs, .tokens = toks };
	float *logits;
	char err[ERR_LEN];

	for (k = 0; k < n; k++) {
		fs[k] = (struct fwd_seq){ n_new[k], pos[k], table_of(seq_id[k]), MAX_BLOCKS, n_new[k], 0, 0 };
		for (i = 0; i < n_new[k]; i++)
			toks[t++] = tok(seq_id[k], pos[k] + i, f->n_vocab);
	}
	b.n_tokens = t;
	logits = xmalloc((size_t)t * (size_t)f->n_vocab * sizeof *logits);
	if (cpu_backend.forward(f->be, &b, logits, err) != 0)
		fail_msg("forward: %s", err);
	return logits;
}

/* max |a - b| / max |b| over one row. */
static double
rel_err(const float *a, const float *b, int32_t n)
{
	double d = 0, m = 0;
	int32_t i;

	for (i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	return d / m;
}

/* Sequence 0 alone: its prompt in one chunk, then one decode token. */
static float *
alone(struct fixture *f, float **decode)
{
	int id = 0, pos = 0, n = PROMPT, one = 1;
	float *prompt = step(f, 1, &id, &pos, &n);

	pos = PROMPT;
	*decode = step(f, 1, &id, &pos, &one);
	return prompt;
}

static void
test_chunked_prefill(void **state)
{
	struct fixture *f = *state;
	float *ref_dec, *ref = alone(f, &ref_dec), *got;
	int id = 0, pos, n, r;

	for (pos = 0; pos < PROMPT; pos += n) {
		n = MIN(7, PROMPT - pos);
		got = step(f, 1, &id, &pos, &n);
		for (r = 0; r < n; r++)
			if (rel_err(got + (size_t)r * f->n_vocab, ref + (size_t)(pos + r) * f->n_vocab, f->n_vocab) > TOL)
				fail_msg("position %d differs when prefilled in chunks of 7", pos + r);
		free(got);
	}
	free(ref);
	free(ref_dec);
}

static void
test_batched_with_others(void **state)
{
	struct fixture *f = *state;
	float *ref_dec, *ref = alone(f, &ref_dec), *got;
	int ids[OTHERS + 1], pos[OTHERS + 1], n_new[OTHERS + 1], k, r, row;

	/* prompt of sequence 0 beside 15 prompts of other lengths */
	for (k = 0; k <= OTHERS; k++) {
		ids[k] = k;
		pos[k] = 0;
		n_new[k] = k == 0 ? PROMPT : 1 + (k * 5) % 13;
	}
	got = step(f, OTHERS + 1, ids, pos, n_new);
	for (r = 0; r < PROMPT; r++)
		if (rel_err(got + (size_t)r * f->n_vocab, ref + (size_t)r * f->n_vocab, f->n_vocab) > TOL)
			fail_msg("prompt position %d differs in a batch of 16", r);
	free(got);
	/* then a decode step of sequence 0 in the middle of 15 others, some decoding, some prefilling */
	for (k = 0; k <= OTHERS; k++) {
		ids[k] = (k + 7) % (OTHERS + 1);
		pos[k] = ids[k] == 0 ? PROMPT : 1 + (ids[k] * 5) % 13;
		n_new[k] = ids[k] == 0 || k % 2 ? 1 : 3;
	}
	got = step(f, OTHERS + 1, ids, pos, n_new);
	for (k = 0, row = 0; ids[k] != 0; k++)
		row += n_new[k];
	if (rel_err(got + (size_t)row * f->n_vocab, ref_dec, f->n_vocab) > TOL)
		fail_msg("the decode token differs in a batch of 16");
	free(got);
	free(ref);
	free(ref_dec);
}

/*
 * The hidden states of sequence 0's PROMPT tokens (every row, after the
 * output norm) with bidirectional attention (bidir) or causal, beside
 * `others` causal sequences that want logits. Returns its rows (malloc'd).
 */
static float *
hidden(struct fixture *f, int bidir, int others)
{
	struct fwd_seq fs[OTHERS + 1];
	int32_t toks[256], d = f->m->hp.n_embd;
	int k, i, t = 0, n;
	float *rows = xmalloc((size_t)PROMPT * (size_t)d * sizeof *rows), *logits;
	struct fwd_batch b = { .n_seqs = others + 1, .seqs = fs, .tokens = toks, .embd = rows };
	char err[ERR_LEN];

	for (k = 0; k <= others; k++) {
		n = k == 0 ? PROMPT : 1 + (k * 5) % 13;
		fs[k] = (struct fwd_seq){ n, 0, table_of(k), MAX_BLOCKS, k == 0 ? 0 : 1, k == 0 ? n : 0, k == 0 && bidir };
		for (i = 0; i < n; i++)
			toks[t++] = tok(k, i, f->n_vocab);
	}
	b.n_tokens = t;
	logits = xmalloc((size_t)(others + 1) * (size_t)f->n_vocab * sizeof *logits);
	if (cpu_backend.forward(f->be, &b, logits, err) != 0)
		fail_msg("forward: %s", err);
	free(logits);
	return rows;
}

/*
 * An embedding model's bidirectional sequence: its hidden states are the
 * same beside 15 other sequences as alone; its first token's differs from
 * the causal one's (it sees the tokens after it, the window's half of them
 * in a sliding layer); and a step that asks for hidden states nowhere to go,
 * or for bidirectional attention over part of a sequence, is refused.
 */
static void
test_bidirectional(void **state)
{
	struct fixture *f = *state;
	int32_t d = f->m->hp.n_embd, r, toks[PROMPT] = { 0 };
	float *ref = hidden(f, 1, 0), *got = hidden(f, 1, OTHERS), *causal = hidden(f, 0, 0);
	struct fwd_seq fs = { PROMPT, 0, table_of(0), MAX_BLOCKS, 0, PROMPT, 1 };
	struct fwd_batch b = { .n_seqs = 1, .seqs = &fs, .n_tokens = PROMPT, .tokens = toks };
	char err[ERR_LEN];
	int64_t len, tab;

	for (r = 0; r < PROMPT; r++)
		if (rel_err(got + (size_t)r * d, ref + (size_t)r * d, d) > TOL)
			fail_msg("bidirectional row %d differs in a batch of 16", r);
	if (rel_err(causal, ref, d) < 1e-3)
		fail_msg("the first token's hidden state is the same with and without bidirectional attention");
	assert_int_equal(fwd_batch_check(&b, 256, (OTHERS + 1) * MAX_BLOCKS, f->n_vocab, &len, &tab, err), ERR_INVAL);
	b.embd = ref;
	fs.pos0 = 1;
	assert_int_equal(fwd_batch_check(&b, 256, (OTHERS + 1) * MAX_BLOCKS, f->n_vocab, &len, &tab, err), ERR_INVAL);
	fs.pos0 = 0;
	assert_int_equal(fwd_batch_check(&b, 256, (OTHERS + 1) * MAX_BLOCKS, f->n_vocab, &len, &tab, err), 0);
	free(ref), free(got), free(causal);
}

/*
 * A q8_0 cache (the fixture's) against a float one on the same model: its
 * rows take 36 bytes a 32 values; the same logits within Q8KV_TOL, though
 * not the same (the cache is quantized); a block copied and moved out and
 * back whole, bytes and logits.
 */
#define Q8KV_TOL 0.05
static void
test_q8kv(void **state)
{
	struct fixture *f = *state;
	const struct model_hparams *hp = &f->m->hp;
	struct backend_opts bo = opts(0, KV_F16);
	struct backend *fb;
	float *p8, *d8, *pf, *df, *d2;
	size_t per = (size_t)hp->n_layer * 2 * KV_BLOCK_TOKENS * cpu_backend.kv_row_bytes(f->be);
	uint8_t *out = xmalloc(per), *back = xmalloc(per);
	int32_t blk = 0, spare = MAX_BLOCKS - 1;
	int id = 0, pos = PROMPT, one = 1;
	char err[ERR_LEN];
	double e;

	assert_int_equal(cpu_backend.kv_row_bytes(f->be), (size_t)hp->n_head_kv * hp->head_dim / 32 * 36);
	if (cpu_backend.load(f->m, &bo, &fb, err) != 0)
		fail_msg("%s", err);
	p8 = alone(f, &d8);
	{
		struct fixture g = *f;

		g.be = fb;
		pf = alone(&g, &df);
	}
	e = rel_err(d8, df, f->n_vocab);
	print_message("q8_0 KV against float KV: relative error %.2e\n", e);
	assert_true(e > 0 && e < Q8KV_TOL);
	/* block 0 out, copied into the spare, the spare moved in: the decode step reads the same */
	if (cpu_backend.kv_move(f->be, &blk, 1, (void *const[]){ out }, NULL, err) != 0 ||
	    cpu_backend.kv_copy(f->be, blk, spare, KV_BLOCK_TOKENS, err) != 0 ||
	    cpu_backend.kv_move(f->be, &spare, 1, (void *const[]){ back }, NULL, err) != 0)
		fail_msg("%s", err);
	assert_memory_equal(out, back, per);
	if (cpu_backend.kv_move(f->be, &blk, 1, NULL, (const void *const[]){ back }, err) != 0)
		fail_msg("%s", err);
	d2 = step(f, 1, &id, &pos, &one);
	assert_memory_equal(d2, d8, (size_t)f->n_vocab * sizeof *d2);
	cpu_backend.free(fb);
	free(p8), free(d8), free(pf), free(df), free(d2), free(out), free(back);
}

/* A model whose heads are not whole q8_0 blocks: refused, saying why. */
static void
test_q8kv_refused(void **state)
{
	struct fixture *f = *state;
	struct model_desc m = *f->m;
	struct backend_opts bo = opts(0, KV_Q8_0);
	struct backend *be = NULL;
	char err[ERR_LEN] = "";

	m.hp.head_dim = 48;
	assert_int_equal(cpu_backend.load(&m, &bo, &be, err), ERR_UNSUPPORTED);
	assert_null(be);
	assert_non_null(strstr(err, "q8_0 KV cache"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_chunked_prefill, setup_llama, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_llama, teardown),
		cmocka_unit_test_setup_teardown(test_chunked_prefill, setup_qwen2, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_qwen2, teardown),
		cmocka_unit_test_setup_teardown(test_chunked_prefill, setup_qwen3, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_qwen3, teardown),
		cmocka_unit_test_setup_teardown(test_chunked_prefill, setup_qwen3_q5km, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_qwen3_q5km, teardown),
		cmocka_unit_test_setup_teardown(test_chunked_prefill, setup_gemma3, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_gemma3, teardown),
		cmocka_unit_test_setup_teardown(test_chunked_prefill, setup_llama_exact, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_llama_exact, teardown),
		cmocka_unit_test_setup_teardown(test_chunked_prefill, setup_gemma3_exact, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_gemma3_exact, teardown),
		cmocka_unit_test_setup_teardown(test_bidirectional, setup_gemma3_embed, teardown),
		cmocka_unit_test_setup_teardown(test_chunked_prefill, setup_llama_q8kv, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_llama_q8kv, teardown),
		cmocka_unit_test_setup_teardown(test_chunked_prefill, setup_gemma3_q8kv, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_gemma3_q8kv, teardown),
		cmocka_unit_test_setup_teardown(test_batched_with_others, setup_gemma3_exact_q8kv, teardown),
		cmocka_unit_test_setup_teardown(test_q8kv, setup_gemma3_q8kv, teardown),
		cmocka_unit_test_setup_teardown(test_q8kv, setup_llama_q8kv, teardown),
		cmocka_unit_test_setup_teardown(test_q8kv_refused, setup_llama_q8kv, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
