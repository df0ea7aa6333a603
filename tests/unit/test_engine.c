/*
 * test_engine.c: sequences through the engine on a generated model: streamed
 * text, stop strings, limits, a next turn that reuses the cache, a fork of a
 * sequence whose prompt was just computed (one prefill for several choices),
 * many sequences at once, a full KV pool; the prefix cache: sharing between
 * sequences of one namespace only, copy on write of cached blocks, parked
 * sequences, eviction under pressure, each giving the output of a sequence
 * computed without it; the disk tier: a session's blocks written after each
 * turn and loaded by another engine.
 */
#include "config.h"
#include "engine.h"
#include "kvdisk.h"
#include "model.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tiny_model.h"

static void
greedy(struct seq_params *p, int max_tokens)
{
	memset(p, 0, sizeof *p);
	sample_params_default(&p->sample);
	p->max_tokens = max_tokens;
}

/* A sequence's answer: the whole text of a turn without reasoning (gentext.h). */
#define ANSWER(s) (&(s)->out.part[CHAT_PART_ANSWER])

/* Steps one sequence to the end; returns the concatenated pieces (malloc'd). */
static char *
run_to_end(struct engine *e, struct seq *s)
{
	const struct gentext_part *a = ANSWER(s);
	char err[ERR_LEN], *out = xcalloc(1, 1);
	size_t len = 0;

	while (s->state != SEQ_DONE) {
		if (engine_step(e, &s, 1, -1, err) < 0)
			fail_msg("step: %s", err);
		assert_true(utf8_valid(a->piece, a->piece_len));
		out = xrealloc(out, len + a->piece_len + 1);
		memcpy(out + len, a->piece, a->piece_len);
		len += a->piece_len;
		out[len] = '\0';
	}
	return out;
}

static const int32_t prompt[] = { 5, 77, 300, 12, 901, 44, 3 };
#define NP ((int32_t)ARRAY_LEN(prompt))

static void
test_stream_and_length(void **state)
{
	struct engine *e = tiny_engine(256, 1024);
	struct seq_params p;
	struct seq *s;
	char err[ERR_LEN], *text;

	greedy(&p, 12);
	assert_int_equal(engine_seq_new(e, prompt, NP, &p, &s, err), 0);
	text = run_to_end(e, s);
	assert_int_equal(s->finish, FINISH_LENGTH);
	assert_int_equal(s->n_generated, 12);
	assert_string_equal(text, ANSWER(s)->text);
	assert_int_equal(s->n_tokens, NP + 12);
	free(text);
	engine_seq_free(e, s);
	engine_close(e);
}

static void
test_stop_string(void **state)
{
	struct engine *e = tiny_engine(256, 1024);
	struct seq_params p;
	struct seq *s;
	char err[ERR_LEN], stop[8], *full, *text;
	const char *stops[1] = { stop };
	size_t at;

	greedy(&p, 40);
	assert_int_equal(engine_seq_new(e, prompt, NP, &p, &s, err), 0);
	full = run_to_end(e, s);
	engine_seq_free(e, s);
	assert_true(strlen(full) > 12);
	/* a stop string taken from the middle of what greedy decoding writes */
	at = strlen(full) / 2;
	while (at > 0 && ((unsigned char)full[at] & 0xc0) == 0x80)
		at--;
	memcpy(stop, full + at, 3);
	stop[3] = '\0';
	while (!utf8_valid(stop, strlen(stop)))
		stop[strlen(stop) - 1] = '\0';
	p.stop = stops;
	p.n_stop = 1;
	assert_int_equal(engine_seq_new(e, prompt, NP, &p, &s, err), 0);
	text = run_to_end(e, s);
	assert_int_equal(s->finish, FINISH_STOP);
	assert_int_equal(strncmp(text, full, strlen(text)), 0);
	assert_ptr_equal(strstr(full, stop), full + strlen(text));
	free(text);
	free(full);
	engine_seq_free(e, s);
	engine_close(e);
}

/* Greedy continuation of a fresh sequence over tokens. */
static char *
fresh(struct engine *e, const int32_t *t, int32_t n, const struct seq_params *p, struct seq **out)
{
	char err[ERR_LEN];

	assert_int_equal(engine_seq_new(e, t, n, p, out, err), 0);
	return run_to_end(e, *out);
}

static void
test_next_turn_reuses_cache(void **state)
{
	struct engine *e = tiny_engine(256, 1024);
	struct seq_params p;
	struct seq *a, *b;
	char err[ERR_LEN], *ta, *tb;
	const int32_t more[] = { 9, 10, 11 };
	int32_t *all, n;

	greedy(&p, 6);
	free(fresh(e, prompt, NP, &p, &a));
	n = a->n_tokens + 3;
	all = xmalloc((size_t)n * sizeof *all);
	memcpy(all, a->tokens, (size_t)a->n_tokens * sizeof *all);
	memcpy(all + a->n_tokens, more, sizeof more);
	/* everything but the last sampled token was in the cache */
	assert_int_equal(engine_seq_reuse(e, a, all, n, &p, err), NP + 5);
	ta = run_to_end(e, a);
	/* the same history as one fresh prompt gives the same continuation */
	tb = fresh(e, all, n, &p, &b);
	assert_string_equal(ta, tb);
	assert_int_equal(a->finish, b->finish);
	assert_int_equal(a->n_tokens, b->n_tokens);
	assert_memory_equal(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t));
	/* a history that departs early keeps only the common prefix */
	all[2] ^= 1;
	assert_int_equal(engine_seq_reuse(e, a, all, n, &p, err), 2);
	assert_int_equal(engine_seq_reuse(e, a, all, n, &p, err), ERR_INVAL); /* still prefilling */
	free(ta), free(tb), free(all);
	engine_seq_free(e, a);
	engine_seq_free(e, b);
	engine_close(e);
}

static void
test_fork_shares_blocks(void **state)
{
	struct engine *e = tiny_engine(256, 1024);
	struct seq_params p;
	struct seq *a, *c, *x, *y;
	char err[ERR_LEN], *tc, *tx, *ta, *ty;
	int32_t base[40], ta_toks[43], tc_toks[43], i, free0;

	greedy(&p, 1);
	for (i = 0; i < 40; i++)
		base[i] = 100 + i * 3;
	free(fresh(e, base, 40, &p, &a));
	free0 = engine_free_blocks(e);
	c = engine_seq_fork(e, a);
	assert_int_equal(engine_free_blocks(e), free0); /* nothing copied yet */
	memcpy(ta_toks, a->tokens, 41 * sizeof(int32_t));
	memcpy(tc_toks, a->tokens, 41 * sizeof(int32_t));
	ta_toks[41] = 7, ta_toks[42] = 8;
	tc_toks[41] = 9, tc_toks[42] = 10;
	greedy(&p, 5);
	assert_int_equal(engine_seq_reuse(e, a, ta_toks, 43, &p, err), 40);
	assert_int_equal(engine_seq_reuse(e, c, tc_toks, 43, &p, err), 40);
	ta = run_to_end(e, a);
	tc = run_to_end(e, c);
	/* the partly filled last block was copied for one of them, the full ones still shared */
	tx = fresh(e, ta_toks, 43, &p, &x);
	ty = fresh(e, tc_toks, 43, &p, &y);
	assert_string_equal(ta, tx);
	assert_string_equal(tc, ty);
	engine_seq_free(e, a), engine_seq_free(e, c), engine_seq_free(e, x), engine_seq_free(e, y);
	assert_int_equal(engine_free_blocks(e), 1024 / 16);
	free(ta), free(tc), free(tx), free(ty);
	engine_close(e);
}

/*
 * A sequence forked as soon as its prompt is in the KV cache (the daemon's
 * several choices): it computes only the prompt's last token again and,
 * greedy beside its parent, writes the same text; the shared last block is
 * copied for whichever writes first. Prompts ending inside a block, at its
 * end and one past it.
 */
static void
test_fork_after_prefill(void **state)
{
	static const int32_t lens[] = { 40, 32, 33 };
	struct engine *e = tiny_engine(256, 1024);
	struct engine_cache_stats st0, st1;
	struct seq_params p;
	struct seq *a, *c, *both[2];
	char err[ERR_LEN];
	int32_t base[40], i;
	size_t k;

	for (i = 0; i < 40; i++)
		base[i] = 200 + i * 7;
	greedy(&p, 8);
	for (k = 0; k < ARRAY_LEN(lens); k++) {
		assert_int_equal(engine_seq_new(e, base, lens[k], &p, &a, err), 0);
		assert_int_equal(engine_step(e, &a, 1, -1, err), lens[k]);
		assert_int_equal(a->state, SEQ_DECODE);
		engine_cache_stats(e, &st0);
		c = engine_seq_fork(e, a);
		assert_int_equal(engine_seq_reuse(e, c, a->tokens, lens[k], &p, err), lens[k] - 1);
		engine_cache_stats(e, &st1);
		assert_int_equal(st1.miss - st0.miss, 1);
		both[0] = a, both[1] = c;
		while (a->state != SEQ_DONE || c->state != SEQ_DONE)
			if (engine_step(e, both, 2, -1, err) < 0)
				fail_msg("step: %s", err);
		assert_int_equal(c->finish, FINISH_LENGTH);
		assert_string_equal(ANSWER(a)->text, ANSWER(c)->text);
		assert_memory_equal(a->tokens, c->tokens, (size_t)a->n_tokens * sizeof(int32_t));
		engine_seq_free(e, a), engine_seq_free(e, c);
		assert_int_equal(engine_free_blocks(e), 1024 / 16);
	}
	engine_close(e);
}

static void
test_many_at_once(void **state)
{
	struct engine *e = tiny_engine(256, 2048);
	struct seq_params p;
	struct seq *s[16], *one;
	char err[ERR_LEN], *alone[16];
	int32_t pr[16][5];
	int i, j, live;

	greedy(&p, 10);
	for (i = 0; i < 16; i++) {
		for (j = 0; j < 5; j++)
			pr[i][j] = (i * 31 + j * 7) % 1000 + 3;
		assert_int_equal(engine_seq_new(e, pr[i], 5, &p, &one, err), 0);
		alone[i] = run_to_end(e, one);
		engine_seq_free(e, one);
		assert_int_equal(engine_seq_new(e, pr[i], 5, &p, &s[i], err), 0);
	}
	for (live = 1; live;) {
		assert_true(engine_step(e, s, 16, -1, err) >= 0);
		for (live = 0, i = 0; i < 16; i++)
			live |= s[i]->state != SEQ_DONE;
	}
	for (i = 0; i < 16; i++) {
		assert_string_equal(ANSWER(s[i])->text, alone[i]);
		free(alone[i]);
		engine_seq_free(e, s[i]);
	}
	assert_int_equal(engine_free_blocks(e), 2048 / 16);
	engine_close(e);
}

/* A caching sequence's parameters in namespace ns. */
static void
cached(struct seq_params *p, int max_tokens, uint64_t ns)
{
	greedy(p, max_tokens);
	p->cache = 1;
	p->cache_ns = ns;
}

/* n tokens: a common run of 40, then a tail that depends on variant. */
static void
shared_prompt(int32_t *t, int32_t n, int variant)
{
	for (int32_t i = 0; i < n; i++)
		t[i] = i < 40 ? 100 + i * 3 : 500 + variant * 17 + i;
}

/* The text of tokens run without the cache, on a fresh engine. */
static char *
uncached_text(const int32_t *t, int32_t n, int max_tokens)
{
	struct engine *e = tiny_engine(256, 1024);
	struct seq_params p;
	struct seq *s;
	char *text;

	greedy(&p, max_tokens);
	text = fresh(e, t, n, &p, &s);
	engine_seq_free(e, s);
	engine_close(e);
	return text;
}

static void
test_prefix_shared_within_namespace(void **state)
{
	struct engine *e = tiny_engine(256, 1024);
	struct seq_params p;
	struct seq *a, *b, *c, *d;
	char err[ERR_LEN], *ta, *tb, *tc, *want;
	int32_t pa[50], pb[45];
	struct engine_cache_stats st;

	shared_prompt(pa, 50, 0);
	shared_prompt(pb, 45, 1);
	cached(&p, 6, 1);
	ta = fresh(e, pa, 50, &p, &a);
	assert_int_equal(a->n_keyed, 3); /* 50 + 5 generated in the cache: 3 full blocks */
	/* while a holds them, b (same namespace) starts from its first two blocks */
	assert_int_equal(engine_seq_new(e, pb, 45, &p, &b, err), 0);
	assert_int_equal(b->n_cached, 32);
	assert_int_equal(b->blocks[0], a->blocks[0]);
	assert_int_equal(b->blocks[1], a->blocks[1]);
	tb = run_to_end(e, b);
	want = uncached_text(pb, 45, 6);
	assert_string_equal(tb, want);
	free(want);
	/* another namespace finds nothing */
	cached(&p, 6, 2);
	assert_int_equal(engine_seq_new(e, pb, 45, &p, &c, err), 0);
	assert_int_equal(c->n_cached, 0);
	tc = run_to_end(e, c);
	assert_string_equal(tc, tb);
	/* released, a's blocks stay cached: the same prompt again finds 48 of its 50 tokens */
	engine_seq_free(e, a);
	cached(&p, 6, 1);
	assert_int_equal(engine_seq_new(e, pa, 50, &p, &d, err), 0);
	assert_int_equal(d->n_cached, 48);
	free(tc);
	tc = run_to_end(e, d);
	assert_string_equal(tc, ta);
	engine_cache_stats(e, &st);
	assert_int_equal(st.hit, 32 + 48);
	assert_int_equal(st.miss, 50 + 13 + 45 + 2);
	engine_seq_free(e, b), engine_seq_free(e, c), engine_seq_free(e, d);
	/* everything released: every block free or idle */
	assert_int_equal(engine_free_blocks(e), 1024 / 16);
	engine_cache_stats(e, &st);
	assert_int_equal(st.cached, st.idle);
	free(ta), free(tb), free(tc);
	engine_close(e);
}

static void
test_cached_block_copied_on_write(void **state)
{
	struct engine *e = tiny_engine(256, 1024);
	struct seq_params p;
	struct seq *a, *b;
	char err[ERR_LEN], *ta, *tb, *want;
	int32_t pa[50], turn[50], blk1;

	shared_prompt(pa, 50, 0);
	cached(&p, 4, 1);
	ta = fresh(e, pa, 50, &p, &a);
	blk1 = a->blocks[1];
	/* a's next turn departs inside its second (cached) block: that block is copied */
	memcpy(turn, a->tokens, 50 * sizeof *turn);
	turn[20] ^= 1;
	assert_int_equal(engine_seq_reuse(e, a, turn, 50, &p, err), 20);
	free(run_to_end(e, a));
	assert_true(a->blocks[1] != blk1);
	/* the cached block still holds the original prefix: b finds it and answers as before */
	assert_int_equal(engine_seq_new(e, pa, 50, &p, &b, err), 0);
	assert_int_equal(b->n_cached, 48);
	assert_int_equal(b->blocks[1], blk1);
	tb = run_to_end(e, b);
	assert_string_equal(ta, tb);
	want = uncached_text(turn, 50, 4);
	assert_string_equal(ANSWER(a)->text, want);
	engine_seq_free(e, a), engine_seq_free(e, b);
	free(ta), free(tb), free(want);
	engine_close(e);
}

static void
test_parked_sequence(void **state)
{
	struct engine *e = tiny_engine(256, 1024);
	struct seq_params p;
	struct seq *a, *x;
	char err[ERR_LEN], *want;
	int32_t pa[50], *next, n, i, big[200];
	struct engine_cache_stats st;

	shared_prompt(pa, 50, 0);
	cached(&p, 4, 1);
	free(fresh(e, pa, 50, &p, &a));
	/* 53 tokens in the cache: 3 cached blocks and a partial one, which parking keeps */
	engine_seq_park(e, a);
	engine_cache_stats(e, &st);
	assert_int_equal(st.idle, 3);
	assert_int_equal(engine_free_blocks(e), engine_kv_blocks(e) - 1);
	n = a->n_tokens + 3;
	next = xmalloc((size_t)(n + 8) * sizeof *next);
	memcpy(next, a->tokens, (size_t)a->n_tokens * sizeof *next);
	next[n - 3] = 1, next[n - 2] = 2, next[n - 1] = 3;
	/* the next turn takes its blocks back, partial one included */
	assert_int_equal(engine_seq_reuse(e, a, next, n, &p, err), 53);
	free(run_to_end(e, a));
	want = uncached_text(next, n, 4);
	assert_string_equal(ANSWER(a)->text, want);
	free(want);
	/* parked again, then others' prompts take every idle block: its next turn computes it all */
	engine_seq_park(e, a);
	for (i = 0; i < 200; i++)
		big[i] = 700 + i;
	for (i = 0; i < 6; i++) { /* 6 x 13 blocks of a pool of 64 */
		cached(&p, 4, 10 + (uint64_t)i);
		free(fresh(e, big, 200, &p, &x));
		engine_seq_free(e, x);
	}
	n = a->n_tokens + 2;
	memcpy(next, a->tokens, (size_t)a->n_tokens * sizeof *next);
	next[n - 2] = 4, next[n - 1] = 5;
	cached(&p, 4, 1);
	assert_int_equal(engine_seq_reuse(e, a, next, n, &p, err), 0);
	free(run_to_end(e, a));
	want = uncached_text(next, n, 4);
	assert_string_equal(ANSWER(a)->text, want);
	engine_seq_free(e, a);
	assert_int_equal(engine_free_blocks(e), engine_kv_blocks(e));
	free(want), free(next);
	engine_close(e);
}

static void
wake_nop(void *arg)
{
	(void)arg;
}

/* Waits for the disk tier's jobs of e and hands them back. */
static void
io_wait(struct kvdisk *d, struct engine *e)
{
	struct kvdisk_job *j, *next;

	for (j = kvdisk_drain(d, e); j != NULL; j = next) {
		next = j->next;
		engine_io_done(e, j);
	}
}

static void
test_disk_tier(void **state)
{
	static const char *const name = "0badc0de-0000-4000-8000-00000000d15c";
	char kvdir[64], err[ERR_LEN], note[ERR_LEN], cmd[128], *want;
	struct engine_opts o = { .device = "cpu", .n_threads = 2, .n_ctx = 256, .kv_tokens = 256, .max_step_tokens = 64 };
	struct engine *e;
	struct seq_params p;
	struct seq *a, *x;
	struct kvdisk *d;
	struct engine_cache_stats st;
	int32_t pa[50], *next, n, big[200], i;

	snprintf(kvdir, sizeof kvdir, "/tmp/test_engine_kv_XXXXXX");
	assert_non_null(mkdtemp(kvdir));
	assert_int_equal(kvdisk_open(kvdir, 1 << 30, wake_nop, NULL, &d, note, err), 0);
	o.disk = d;
	if (engine_open(tiny_path, &o, &e, err) != 0)
		fail_msg("%s", err);
	shared_prompt(pa, 50, 0);
	cached(&p, 4, 1);
	free(fresh(e, pa, 50, &p, &a));
	/* turn 1 written, turn 2 appended: the second write holds the whole chain, not only its part */
	engine_seq_save(e, a, name);
	engine_seq_park(e, a);
	io_wait(d, e);
	n = a->n_tokens + 20;
	next = xmalloc((size_t)n * sizeof *next);
	memcpy(next, a->tokens, (size_t)a->n_tokens * sizeof *next);
	for (i = a->n_tokens; i < n; i++)
		next[i] = 40 + i;
	assert_true(engine_seq_reuse(e, a, next, n, &p, err) > 0);
	free(run_to_end(e, a));
	engine_seq_save(e, a, name);
	engine_seq_park(e, a);
	io_wait(d, e);
	/* others take every idle block (least recently released, leaves first) */
	for (i = 0; i < 200; i++)
		big[i] = 700 + i;
	cached(&p, 4, 2);
	free(fresh(e, big, 200, &p, &x));
	engine_seq_free(e, x);
	memcpy(next, a->tokens, (size_t)(n - 2) * sizeof *next);
	engine_seq_free(e, a);
	engine_close(e);
	/* another engine (a restart) loads what the caches lost */
	if (engine_open(tiny_path, &o, &e, err) != 0)
		fail_msg("%s", err);
	cached(&p, 4, 1);
	assert_int_equal(engine_seq_new(e, next, n - 2, &p, &a, err), 0);
	assert_int_equal(a->n_cached, 0);
	assert_int_equal(engine_seq_load(e, a, name, n - 2), 1);
	assert_int_equal(a->state, SEQ_LOAD);
	io_wait(d, e);
	assert_int_equal(a->state, SEQ_PREFILL);
	assert_int_equal(a->n_cached, (n - 3) / 16 * 16);
	assert_int_equal(a->n_hit, a->n_cached);
	engine_cache_stats(e, &st);
	assert_int_equal(st.disk_hit, (uint64_t)a->n_cached);
	free(run_to_end(e, a));
	want = uncached_text(next, n - 2, 4);
	assert_string_equal(ANSWER(a)->text, want);
	engine_seq_free(e, a);
	engine_close(e);
	kvdisk_close(d);
	free(want), free(next);
	snprintf(cmd, sizeof cmd, "rm -rf %s", kvdir);
	assert_int_equal(system(cmd), 0);
}

static void
test_bad_input_and_full_pool(void **state)
{
	struct engine *e = tiny_engine(256, 256);
	struct seq_params p;
	struct seq *s, *t;
	char err[ERR_LEN];
	int32_t bad[] = { 1, 5000 }, *big;
	int i;

	greedy(&p, 4);
	assert_int_equal(engine_seq_new(e, bad, 2, &p, &s, err), ERR_INVAL);
	assert_non_null(strstr(err, "vocabulary"));
	assert_int_equal(engine_seq_new(e, bad, 0, &p, &s, err), ERR_INVAL);
	big = xcalloc(300, sizeof *big);
	assert_int_equal(engine_seq_new(e, big, 300, &p, &s, err), ERR_RANGE);
	p.sample.temperature = -2;
	assert_int_equal(engine_seq_new(e, prompt, NP, &p, &s, err), ERR_INVAL);
	greedy(&p, 4);
	/* two sequences of 200 tokens cannot both fit a pool of 256 */
	for (i = 0; i < 200; i++)
		big[i] = i + 1;
	assert_int_equal(engine_seq_new(e, big, 200, &p, &s, err), 0);
	assert_int_equal(engine_seq_new(e, big, 200, &p, &t, err), 0);
	free(run_to_end(e, s));
	free(run_to_end(e, t));
	assert_int_equal(s->finish, FINISH_LENGTH);
	assert_int_equal(t->finish, FINISH_ERROR);
	assert_non_null(strstr(t->error, "KV cache"));
	engine_seq_free(e, t);
	engine_seq_free(e, s);
	assert_int_equal(engine_free_blocks(e), 16);
	free(big);
	engine_close(e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stream_and_length),
		cmocka_unit_test(test_stop_string),
		cmocka_unit_test(test_next_turn_reuses_cache),
		cmocka_unit_test(test_fork_shares_blocks),
		cmocka_unit_test(test_fork_after_prefill),
		cmocka_unit_test(test_many_at_once),
		cmocka_unit_test(test_bad_input_and_full_pool),
		cmocka_unit_test(test_prefix_shared_within_namespace),
		cmocka_unit_test(test_cached_block_copied_on_write),
		cmocka_unit_test(test_parked_sequence),
		cmocka_unit_test(test_disk_tier),
	};

	return cmocka_run_group_tests(tests, tiny_model_setup, tiny_model_teardown);
}
