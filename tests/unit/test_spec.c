/*
 * test_spec.c: speculative decoding on the CPU backend, on a generated
 * model. The lookup index (draft.h) finds the latest earlier occurrence of
 * the longest run the text ends with, grows, and forgets. Through the
 * engine, greedy output with guesses is decoding's without them, token for
 * token and piece for piece: alone and sixteen at once, with stop strings,
 * every max_tokens up to the length (no guess asked for or checked past
 * it), at the end of the context, with a step cut off between the tokens
 * it settled, and under a grammar (guesses cut where it does not allow
 * them, each row masked by the grammar after the guesses before it, and
 * cut guesses lowering the rate so that a draft
 * the grammar never allows is seldom asked); guesses given for a step that
 * did not check them are not checked later; on a backend whose steps run
 * fastest at a multiple of some tokens, steps are made so by dropping
 * guesses, the output unchanged; sixteen guessing sequences share a
 * step's rows for guesses evenly, and one alone guesses as many as its
 * rate asks; the guesses are accepted
 * often enough that these tests check something. Sampled output keeps the
 * model's distribution: the frequencies of the second and third tokens
 * drawn (the first ones guesses decide) over 2,000 seeds at temperature 1
 * match those without guesses within a chi-square bound.
 */
#include "config.h"
#include "draft.h"
#include "engine.h"
#include "engine_int.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"

#include <math.h>
#include <regex.h>
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

/* ---- the index ---- */

static void
test_index(void **state)
{
	struct draft_index x = { 0 };
	int32_t t[4096], g[8], n;

	(void)state;
	/* 10 20 30 40 50 ... 10 20 30: the run 10 20 30 continues with 40 50 60 */
	for (int i = 0; i < 6; i++)
		t[i] = 10 * (i + 1);
	t[6] = 7, t[7] = 10, t[8] = 20, t[9] = 30;
	n = draft_guess(&x, t, 10, 3, g);
	assert_int_equal(n, 3);
	assert_int_equal(g[0], 40), assert_int_equal(g[1], 50), assert_int_equal(g[2], 60);
	/* the last run never occurred before: no guess (a single token is no run) */
	t[10] = 8;
	assert_int_equal(draft_guess(&x, t, 11, 3, g), 0);
	/* the latest occurrence wins: 8 99 5 first, 8 99 6 later, then 8 99 again */
	t[11] = 99, t[12] = 5, t[13] = 8, t[14] = 99, t[15] = 6, t[16] = 2, t[17] = 8, t[18] = 99;
	assert_int_equal(draft_guess(&x, t, 19, 2, g), 2);
	assert_int_equal(g[0], 6), assert_int_equal(g[1], 2);
	/* the longest run wins (8 99 6, not 99 6), and a guess stops at the end of the text */
	t[19] = 6;
	assert_int_equal(draft_guess(&x, t, 20, 8, g), 4);
	assert_int_equal(g[0], 2), assert_int_equal(g[1], 8), assert_int_equal(g[2], 99), assert_int_equal(g[3], 6);
	/* a longer text than the table first held: it grows, and still finds the earliest run's follower */
	for (int i = 0; i < 4000; i++)
		t[i] = 1000 + i;
	t[4000] = 1000, t[4001] = 1001, t[4002] = 1002;
	draft_reset(&x);
	assert_int_equal(draft_guess(&x, t, 4003, 4, g), 4);
	assert_int_equal(g[0], 1003), assert_int_equal(g[3], 1006);
	/* a text shorter than what was indexed (other tokens): forgotten, nothing false found */
	t[0] = 1, t[1] = 2;
	assert_int_equal(draft_guess(&x, t, 2, 4, g), 0);
	draft_free(&x);
}

/* ---- through the engine ---- */

static void
params(struct seq_params *p, int max_tokens, enum spec_mode speculative)
{
	memset(p, 0, sizeof *p);
	sample_params_default(&p->sample);
	p->max_tokens = max_tokens;
	p->speculative = speculative;
}

/* A turn's output: its tokens, and its pieces joined as a client gets them. */
struct run {
	int32_t tok[512];
	int32_t n;
	char text[8192];
	size_t len;
	enum finish_reason finish;
	int32_t drafted, accepted;
};

static void
take_piece(struct run *r, const struct seq *s)
{
	const struct gentext_part *a = &s->out.part[CHAT_PART_ANSWER];

	if (s->new_token >= 0 && r->n < (int32_t)ARRAY_LEN(r->tok))
		r->tok[r->n++] = s->new_token;
	assert_true(r->len + a->piece_len < sizeof r->text);
	memcpy(r->text + r->len, a->piece, a->piece_len);
	r->len += a->piece_len;
	r->text[r->len] = '\0';
}

/*
 * An oracle's guesses for s: the next tokens of want, the output without
 * guesses, every fifth (by position, from the fourth) made wrong, so that
 * steps accept all, some and none of theirs.
 */
static void
oracle(struct seq *s, const struct run *want)
{
	int32_t at = s->n_generated, g[ENGINE_DRAFT_MAX], n = 0;

	if (s->state != SEQ_DECODE)
		return;
	for (; n < ENGINE_DRAFT_MAX && at + n < want->n; n++)
		g[n] = (at + n) % 5 == 3 ? (want->tok[at + n] + 1) % 1000 : want->tok[at + n];
	engine_seq_guess(s, g, n);
}

/* Steps with guesses found a multiple of their backend's step_align. */
static int32_t aligned_steps;

/*
 * A step of t tokens is a multiple of the backend's step_align (when it
 * has one and more tokens) unless its guesses alone could not make it one
 * (trim_guesses).
 */
static void
check_aligned(const struct engine *e, int32_t t)
{
	int32_t a = e->ops->step_align;

	if (a == 0 || t <= a)
		return;
	assert_true(t % a == 0 || engine_step_guesses(e) < t % a);
	aligned_steps += t % a == 0 && engine_step_guesses(e) > 0;
}

/*
 * Steps sequences s[0..n) to their ends, each token's piece taken as the
 * scheduler takes them (engine_seq_more after a step); with want, the
 * oracle guesses for each. With cut, the second sequence's settled tokens
 * are left to the next step, which takes them itself: its pieces are not
 * seen then, only its tokens and whole answer (r gets those).
 */
static void
run_all(struct engine *e, struct seq **s, int n, struct run *r, const struct run *want, int cut)
{
	char err[ERR_LEN];
	int live = 1;
	int32_t t;

	memset(r, 0, (size_t)n * sizeof *r);
	while (live) {
		for (int i = 0; want != NULL && i < n; i++)
			oracle(s[i], &want[i]);
		if ((t = engine_step(e, s, n, -1, err)) < 0)
			fail_msg("step: %s", err);
		check_aligned(e, t);
		live = 0;
		for (int i = 0; i < n; i++) {
			if (s[i]->new_token >= 0)
				take_piece(&r[i], s[i]);
			while (!(cut && i == 1) && engine_seq_more(e, s[i]))
				take_piece(&r[i], s[i]);
			live |= s[i]->state != SEQ_DONE;
		}
	}
	for (int i = 0; i < n; i++) {
		const struct gentext_part *a = &s[i]->out.part[CHAT_PART_ANSWER];

		r[i].finish = s[i]->finish;
		r[i].drafted = s[i]->n_drafted, r[i].accepted = s[i]->n_accepted;
		assert_true(r[i].accepted <= r[i].drafted);
		if (cut && i == 1) {
			r[i].n = s[i]->n_generated;
			memcpy(r[i].tok, s[i]->tokens + s[i]->turn_start, (size_t)r[i].n * sizeof *r[i].tok);
			r[i].len = a->len;
			memcpy(r[i].text, a->text, a->len + 1);
		}
	}
}

/* One sequence over prompt to its end (the oracle guessing want, if not NULL). */
static void
run_one(struct engine *e, const int32_t *t, int32_t n, const struct seq_params *p, struct run *r,
    const struct run *want)
{
	struct seq *s;
	char err[ERR_LEN];

	if (engine_seq_new(e, t, n, p, &s, err) != 0)
		fail_msg("%s", err);
	run_all(e, &s, 1, r, want, 0);
	engine_seq_free(e, s);
}

static void
assert_same(const struct run *a, const struct run *b)
{
	assert_int_equal(a->n, b->n);
	assert_memory_equal(a->tok, b->tok, (size_t)a->n * sizeof *a->tok);
	assert_string_equal(a->text, b->text);
	assert_int_equal(a->finish, b->finish);
}

/* Prompt i of the suite: a few ids, some of them repeated so that lookup finds runs. */
static int32_t
suite_prompt(int i, int32_t *t)
{
	int32_t n = 0;

	for (int j = 0; j < 6 + i % 5; j++)
		t[n++] = (i * 131 + j * 17) % 900 + 3;
	if (i % 2 == 0)
		for (int j = 0; j < 6; j++)
			t[n++] = t[j];
	return n;
}

/* Lookup's guesses: the same output; a random model repeats itself little, but some are accepted. */
static void
test_lookup_same(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct seq_params p;
	struct run off, on;
	int32_t t[64], n, drafted = 0, accepted = 0;

	(void)state;
	for (int i = 0; i < 12; i++) {
		n = suite_prompt(i, t);
		params(&p, 120, SPEC_OFF);
		run_one(e, t, n, &p, &off, NULL);
		assert_int_equal(off.drafted, 0);
		params(&p, 120, SPEC_AUTO);
		run_one(e, t, n, &p, &on, NULL);
		assert_same(&off, &on);
		drafted += on.drafted, accepted += on.accepted;
	}
	print_message("lookup: %d of %d guesses accepted\n", accepted, drafted);
	assert_true(accepted > 0);
	engine_close(e);
}

/* Given guesses, right and wrong: the same output, at every max_tokens too. */
static void
test_given_same(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct seq_params p;
	struct run off, on, cut;
	int32_t t[64], n, drafted = 0, accepted = 0;

	(void)state;
	for (int i = 0; i < 8; i++) {
		n = suite_prompt(i, t);
		params(&p, 100, SPEC_OFF);
		run_one(e, t, n, &p, &off, NULL);
		params(&p, 100, SPEC_AUTO);
		run_one(e, t, n, &p, &on, &off);
		assert_same(&off, &on);
		drafted += on.drafted, accepted += on.accepted;
		for (int m = 1; i < 2 && m <= off.n; m += 1 + m / 8) {
			params(&p, m, SPEC_AUTO);
			run_one(e, t, n, &p, &cut, &off);
			assert_int_equal(cut.n, m);
			assert_memory_equal(cut.tok, off.tok, (size_t)m * sizeof *cut.tok);
			assert_int_equal(cut.finish, FINISH_LENGTH);
		}
	}
	/* four of five right: most accepted, none after a wrong one in its step */
	print_message("given: %d of %d guesses accepted\n", accepted, drafted);
	assert_true(accepted > drafted / 3 && accepted < drafted);
	engine_close(e);
}

/* How many guesses a draft model would be asked for, for s alone in a step. */
static int32_t
draft_want(struct engine *e, struct seq *s)
{
	int drafted = 1;
	int32_t want;

	engine_draft_shares(e, &s, 1, &drafted, &want);
	return want;
}

/*
 * Guesses past max_tokens could never be taken, and the last token needs
 * none after it: at every max_tokens, a draft model is asked for (and a
 * step checks, the oracle's or lookup's) at most the tokens left but one,
 * and none once the last is taken, though the oracle offers seven.
 */
static void
test_max_tokens_cap(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct seq_params p;
	struct run off;
	struct seq *s;
	int32_t t[64], n = suite_prompt(0, t), left, capped = 0;
	char err[ERR_LEN];

	(void)state;
	params(&p, 40, SPEC_OFF);
	run_one(e, t, n, &p, &off, NULL);
	assert_int_equal(off.n, 40);
	for (int m = 1; m <= 2 * ENGINE_DRAFT_MAX; m++)
		for (int given = 0; given < 2; given++) {
			params(&p, m, SPEC_ON);
			assert_int_equal(engine_seq_new(e, t, n, &p, &s, err), 0);
			while (s->state != SEQ_DONE) {
				left = m - s->n_generated;
				if (given)
					oracle(s, &off);
				if (s->state == SEQ_DECODE)
					assert_true(draft_want(e, s) <= left - 1);
				capped += given && s->state == SEQ_DECODE && left - 1 < ENGINE_DRAFT_MAX;
				assert_true(engine_step(e, &s, 1, -1, err) > 0);
				assert_true(engine_step_guesses(e) <= MAX(left - 1, 0));
				while (engine_seq_more(e, s))
					;
			}
			assert_int_equal(s->n_generated, m);
			assert_int_equal(draft_want(e, s), 0);
			engine_seq_free(e, s);
		}
	assert_true(capped > 0);
	engine_close(e);
}

/*
 * A step that left its guesses unchecked (no rows to spare: a scheduler
 * that chose not to guess, engine_auto_guess 0) lets them go: a later
 * step checks no stale guesses from an earlier position, only lookup's, as
 * the same sequence never given any does.
 */
static void
test_given_stale(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct seq_params p;
	struct seq *s[2];
	int32_t t[64], n = suite_prompt(1, t), wrong[ENGINE_DRAFT_MAX];
	char err[ERR_LEN];

	(void)state;
	params(&p, 40, SPEC_AUTO);
	for (int i = 0; i < 2; i++)
		assert_int_equal(engine_seq_new(e, t, n, &p, &s[i], err), 0);
	assert_true(engine_step(e, s, 2, -1, err) > 0);
	assert_int_equal(s[0]->state, SEQ_DECODE);
	for (int k = 0; k < ENGINE_DRAFT_MAX; k++)
		wrong[k] = (s[0]->new_token + 1 + k) % 900 + 3;
	engine_seq_guess(s[0], wrong, ENGINE_DRAFT_MAX);
	engine_auto_guess(e, 0);
	assert_true(engine_step(e, s, 2, -1, err) > 0);
	assert_int_equal(s[0]->n_drafted, 0);
	engine_auto_guess(e, 1);
	for (int k = 0; k < 3; k++)
		assert_true(engine_step(e, s, 2, -1, err) > 0);
	assert_int_equal(s[0]->n_drafted, s[1]->n_drafted);
	assert_int_equal(s[0]->n_accepted, s[1]->n_accepted);
	for (int i = 0; i < 2; i++)
		engine_seq_free(e, s[i]);
	engine_close(e);
}

static void
test_stop_and_context(void **state)
{
	struct engine *e = tiny_engine(96, 4096);
	struct seq_params p;
	struct run off, on;
	int32_t t[64], n = suite_prompt(4, t);
	char stop[8];
	const char *stops[1] = { stop };
	size_t at;

	(void)state;
	/* to the end of a context of 96 */
	params(&p, 0, SPEC_OFF);
	run_one(e, t, n, &p, &off, NULL);
	assert_int_equal(off.finish, FINISH_CONTEXT);
	params(&p, 0, SPEC_AUTO);
	run_one(e, t, n, &p, &on, &off);
	assert_true(on.accepted > 10);
	assert_same(&off, &on);
	/* a stop string from the middle of the output ends both at the same place */
	at = off.len / 2;
	while (at > 0 && ((unsigned char)off.text[at] & 0xc0) == 0x80)
		at--;
	memcpy(stop, off.text + at, 3);
	stop[3] = '\0';
	while (!utf8_valid(stop, strlen(stop)))
		stop[strlen(stop) - 1] = '\0';
	params(&p, 0, SPEC_OFF);
	p.stop = stops, p.n_stop = 1;
	run_one(e, t, n, &p, &on, &off);
	assert_int_equal(on.finish, FINISH_STOP);
	p.speculative = SPEC_AUTO;
	run_one(e, t, n, &p, &off, &on);
	assert_true(off.accepted > 0);
	assert_same(&on, &off);
	engine_close(e);
}

/*
 * Sixteen sequences with the oracle's guesses, each the output it has
 * alone: taking each step's settled tokens, leaving the second's to the
 * next step (cut), and on a backend whose steps run fastest at a multiple
 * of 4 tokens (CUDA's: of 8), where every step of more than 4 tokens is a
 * multiple of 4 if dropping guesses can make it one.
 */
static void
test_many_and_cut(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	const struct backend_ops *cpu = e->ops;
	struct backend_ops ops = *cpu;
	struct seq_params p;
	struct seq *s[16];
	struct run *alone = xcalloc(16, sizeof *alone), *all = xcalloc(16, sizeof *all);
	int32_t t[16][64], n[16];
	char err[ERR_LEN];

	(void)state;
	for (int i = 0; i < 16; i++) {
		n[i] = suite_prompt(i, t[i]);
		params(&p, 60, SPEC_OFF);
		run_one(e, t[i], n[i], &p, &alone[i], NULL);
	}
	aligned_steps = 0;
	for (int pass = 0; pass < 3; pass++) {
		ops.step_align = pass == 2 ? 4 : 0;
		e->ops = &ops;
		for (int i = 0; i < 16; i++) {
			params(&p, 60, SPEC_AUTO);
			assert_int_equal(engine_seq_new(e, t[i], n[i], &p, &s[i], err), 0);
		}
		run_all(e, s, 16, all, alone, pass == 1);
		for (int i = 0; i < 16; i++) {
			assert_true(all[i].accepted > 0);
			assert_same(&alone[i], &all[i]);
			engine_seq_free(e, s[i]);
		}
	}
	print_message("%d steps with guesses made a multiple of 4\n", aligned_steps);
	assert_true(aligned_steps > 0);
	e->ops = cpu;
	free(alone), free(all);
	assert_int_equal(engine_free_blocks(e), 4096 / 16);
	engine_close(e);
}

/*
 * Sixteen sequences that all guess share the step's 48 rows for guesses
 * evenly (three each, not seven for the first six and none for the rest);
 * where half of them offer one guess, the rest take five each. Draft
 * models are asked for as many as the step will check: three each of
 * sixteen, seven of one alone, and with eight drafted and eight given
 * one guess, the step's level for the drafted (five).
 */
static void
test_shared_rows(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct seq_params p;
	struct seq *s[16];
	struct run *alone = xcalloc(16, sizeof *alone);
	int32_t t[16][64], n[16], before[16], g[ENGINE_DRAFT_MAX], want[16];
	char err[ERR_LEN];
	int decoding = 0, drafted[16];

	(void)state;
	assert_int_equal(e->max_rows - 16, 48);
	for (int i = 0; i < 16; i++) {
		n[i] = suite_prompt(i, t[i]);
		params(&p, 60, SPEC_OFF);
		run_one(e, t[i], n[i], &p, &alone[i], NULL);
		params(&p, 60, SPEC_ON);
		assert_int_equal(engine_seq_new(e, t[i], n[i], &p, &s[i], err), 0);
	}
	while (!decoding) {
		assert_true(engine_step(e, s, 16, -1, err) >= 0);
		decoding = 1;
		for (int i = 0; i < 16; i++)
			decoding &= s[i]->state == SEQ_DECODE;
	}
	for (int i = 0; i < 16; i++) {
		drafted[i] = 1;
		s[i]->spec_rate = 1;
	}
	engine_draft_shares(e, s, 16, drafted, want);
	for (int i = 0; i < 16; i++)
		assert_int_equal(want[i], 3);
	engine_draft_shares(e, s, 1, drafted, want);
	assert_int_equal(want[0], ENGINE_DRAFT_MAX);
	for (int i = 0; i < 16; i++) {
		drafted[i] = i % 2 == 0;
		if (i % 2 == 1)
			engine_seq_guess(s[i], alone[i].tok, 1);
	}
	engine_draft_shares(e, s, 16, drafted, want);
	for (int i = 0; i < 16; i++)
		assert_int_equal(want[i], i % 2 == 0 ? 5 : 0);
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 16; i++) {
			while (engine_seq_more(e, s[i]))
				;
			before[i] = s[i]->n_drafted;
			oracle(s[i], &alone[i]);
			if (round == 1 && i % 2 == 1) { /* one guess, the oracle's first */
				memcpy(g, s[i]->given, sizeof g);
				engine_seq_guess(s[i], g, 1);
			}
		}
		assert_int_equal(engine_step(e, s, 16, -1, err), 64);
		for (int i = 0; i < 16; i++)
			assert_int_equal(s[i]->n_drafted - before[i], round == 0 ? 3 : i % 2 == 1 ? 1 : 5);
	}
	for (int i = 0; i < 16; i++)
		engine_seq_free(e, s[i]);
	free(alone);
	engine_close(e);
}

/*
 * A sequence alone guesses what it would with every row to spare: as many
 * as lookup finds of its rate's share of seven (the share applied once,
 * not again to a cap made from it).
 */
static void
test_lone_rate(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct seq_params p;
	struct seq *s;
	int32_t t[64], n = suite_prompt(0, t), g[ENGINE_DRAFT_MAX], want, before, guessed = 0;
	char err[ERR_LEN];

	(void)state;
	params(&p, 150, SPEC_AUTO);
	assert_int_equal(engine_seq_new(e, t, n, &p, &s, err), 0);
	while (s->state != SEQ_DONE) {
		while (engine_seq_more(e, s))
			;
		if (s->state == SEQ_DONE)
			break;
		s->spec_rate = 0.6f;
		want = s->state == SEQ_DECODE && draft_want(e, s) > 0 ?
		    draft_guess(&s->draft, s->tokens, s->n_tokens, draft_want(e, s), g) : 0;
		before = s->n_drafted;
		assert_true(engine_step(e, &s, 1, -1, err) >= 0);
		assert_int_equal(s->n_drafted - before, want);
		guessed += want >= 3;
	}
	print_message("%d steps of three guesses or more at a rate of 0.6\n", guessed);
	assert_true(guessed > 0);
	engine_seq_free(e, s);
	engine_close(e);
}

/* ---- under a grammar ---- */

#define LIST "root ::= \"[\" [a-z]{1,3} (\",\" [a-z]{1,3}){0,30} \"]\""
/* a list of forty: a sequence that decodes long enough to see its guesses' rate fall */
#define LONG_LIST "root ::= \"[\" [a-z]{1,3} (\",\" [a-z]{1,3}){40} \"]\""
#define LIST_RE "^\\[[a-z]{1,3}(,[a-z]{1,3}){0,30}\\]$"

/*
 * Constrained sequences guess only what their grammar allows (the oracle's
 * wrong guesses are cut there), each guess's row masked by the grammar
 * after the guesses before it: greedy output is the same, sampled output
 * matches the grammar; accepted guesses that lead where the grammar allows
 * nothing end the sequence as the next step would have.
 */
static void
test_constrained(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct cons_gram *g = tiny_grammar(e, LIST), *dead = tiny_grammar(e, "root ::= \"abc\" [^\\x00-\\U0010FFFF]");
	struct seq_params p;
	struct run off, on;
	int32_t t[64], n, accepted = 0;
	regex_t re;

	(void)state;
	assert_int_equal(regcomp(&re, LIST_RE, REG_EXTENDED | REG_NOSUB), 0);
	for (int i = 0; i < 6; i++) {
		n = suite_prompt(i, t);
		params(&p, 120, SPEC_OFF);
		p.grammar = g;
		run_one(e, t, n, &p, &off, NULL);
		assert_int_equal(off.finish, FINISH_STOP);
		assert_int_equal(regexec(&re, off.text, 0, NULL, 0), 0);
		p.speculative = SPEC_AUTO;
		run_one(e, t, n, &p, &on, &off);
		assert_same(&off, &on);
		accepted += on.accepted;
		/* sampled with lookup's guesses: still the grammar's */
		params(&p, 120, SPEC_AUTO);
		p.grammar = g;
		p.sample.temperature = 1;
		p.sample.seed = (uint64_t)i;
		run_one(e, t, n, &p, &on, NULL);
		assert_int_equal(on.finish, FINISH_STOP);
		assert_int_equal(regexec(&re, on.text, 0, NULL, 0), 0);
	}
	print_message("constrained: %d guesses accepted\n", accepted);
	assert_true(accepted > 20);
	params(&p, 20, SPEC_OFF);
	p.grammar = dead;
	run_one(e, t, n, &p, &off, NULL);
	p.speculative = SPEC_AUTO;
	run_one(e, t, n, &p, &on, &off);
	assert_int_equal(off.finish, FINISH_ERROR);
	assert_true(on.accepted > 0);
	assert_same(&off, &on);
	regfree(&re);
	engine_grammar_put(e, g);
	engine_grammar_put(e, dead);
	engine_close(e);
}

/*
 * Guesses its grammar does not allow count as guesses not accepted: a
 * draft model whose guesses the grammar always cuts is soon asked for fewer
 * than one token a step (the scheduler drafts lrintf(spec_rate *
 * ENGINE_DRAFT_MAX), each a step of the draft), not seven for nothing.
 */
static void
test_cut_rate(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct cons_gram *g = tiny_grammar(e, LONG_LIST);
	const struct tokenizer *tk = engine_model(e)->tok;
	struct seq_params p;
	struct seq *s;
	int32_t t[64], n, bad = -1, guesses[ENGINE_DRAFT_MAX];
	int asked = 0, decoding = 0, want;
	char err[ERR_LEN];
	size_t len;

	(void)state;
	/* a digit: never in the list's text */
	for (int32_t i = 0; i < tok_n_vocab(tk) && bad < 0; i++)
		if (tok_bytes(tk, i, &len)[0] == '7' && len == 1)
			bad = i;
	assert_true(bad >= 0);
	for (int k = 0; k < ENGINE_DRAFT_MAX; k++)
		guesses[k] = bad;
	n = suite_prompt(0, t);
	params(&p, 100, SPEC_AUTO);
	p.grammar = g;
	assert_int_equal(engine_seq_new(e, t, n, &p, &s, err), 0);
	while (s->state != SEQ_DONE) {
		if (s->state == SEQ_DECODE) {
			decoding++;
			want = (int)lrintf(s->spec_rate * ENGINE_DRAFT_MAX);
			engine_seq_guess(s, guesses, want);
			asked += want;
		}
		assert_true(engine_step(e, &s, 1, -1, err) > 0);
		while (engine_seq_more(e, s))
			;
	}
	engine_seq_free(e, s);
	print_message("cut guesses: %d draft tokens asked for in %d steps\n", asked, decoding);
	assert_true(decoding >= 40);
	assert_true(asked < decoding);
	engine_grammar_put(e, g);
	engine_close(e);
}

/* ---- the distribution ---- */

#define DRAWS 2000
#define TOP_K 4

/*
 * Two-sample chi-square of counts a and b (DRAWS each) over n categories:
 * sum (a - b)^2 / (a + b), categories with fewer than 10 together pooled.
 * Returns the statistic; *df gets its degrees of freedom.
 */
static double
chi2(const int *a, const int *b, int n, int *df)
{
	double x = 0;
	int pa = 0, pb = 0, k = 0;

	for (int i = 0; i < n; i++) {
		if (a[i] + b[i] < 10) {
			pa += a[i], pb += b[i];
			continue;
		}
		x += (double)(a[i] - b[i]) * (a[i] - b[i]) / (a[i] + b[i]);
		k++;
	}
	if (pa + pb > 0)
		x += (double)(pa - pb) * (pa - pb) / (pa + pb), k++;
	*df = k - 1;
	return x;
}

/* Chi-square's 0.999 quantile for df degrees of freedom (Wilson-Hilferty), so the bound fails 1 in 1,000 by chance. */
static double
chi2_bound(int df)
{
	double z = 3.090, h = 2.0 / (9.0 * df), c = 1 - h + z * sqrt(h);

	return df * c * c * c;
}

/*
 * Counts of the tokens drawn at positions 2 and 3 over DRAWS seeds, with or
 * without guesses (want's, the greedy output), by id modulo 64.
 */
static void
draw_counts(struct engine *e, const int32_t *t, int32_t n, const struct run *want, int (*cnt)[64], int32_t *accepted)
{
	struct seq_params p;
	struct run r;

	*accepted = 0;
	for (int d = 0; d < DRAWS; d++) {
		params(&p, 4, want != NULL ? SPEC_AUTO : SPEC_OFF);
		p.sample.temperature = 1;
		p.sample.top_k = TOP_K;
		p.sample.seed = 1000 + (uint64_t)d;
		run_one(e, t, n, &p, &r, want);
		*accepted += r.accepted;
		assert_int_equal(r.n, 4);
		cnt[0][r.tok[1] % 64]++;
		cnt[1][r.tok[2] % 64]++;
	}
}

/*
 * The first token is the prompt's and no guess's; the second and third
 * are guessed as greedy decoding would write them (the likeliest, so often
 * accepted). Accepting a guess more often than the model draws it (or a
 * wrong residual after a rejection) moves their frequencies far past the
 * bound: it is chi-square's 0.999 quantile.
 */
static void
test_distribution(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct seq_params p;
	struct run g;
	int32_t t[16], n = 8, acc_on, acc_off;
	int (*off)[64] = xcalloc(2, sizeof *off), (*on)[64] = xcalloc(2, sizeof *on), df;

	(void)state;
	for (int j = 0; j < n; j++)
		t[j] = (j * 97) % 800 + 5;
	params(&p, 4, SPEC_OFF);
	run_one(e, t, n, &p, &g, NULL);
	draw_counts(e, t, n, NULL, off, &acc_off);
	draw_counts(e, t, n, &g, on, &acc_on);
	assert_int_equal(acc_off, 0);
	print_message("distribution: %d tokens of %d draws came from accepted guesses\n", acc_on, DRAWS);
	assert_true(acc_on > DRAWS / 8);
	for (int k = 0; k < 2; k++) {
		double x = chi2(off[k], on[k], 64, &df);

		print_message("token %d: chi-square %.1f, df %d, bound %.1f\n", k + 2, x, df, chi2_bound(df));
		assert_true(df >= 1);
		assert_true(x < chi2_bound(df));
	}
	free(off), free(on);
	engine_close(e);
}

/*
 * Target q's draft d (on e, the target's own model) brought to q's text and
 * drawing as q will (engine_seq_couple, as sched_draft.c does), then k draft
 * steps: their tokens become q's guesses.
 */
static void
draft_for(struct engine *e, struct seq *q, struct seq **d, int32_t k)
{
	struct seq_params p;
	int32_t g[ENGINE_DRAFT_MAX], n = 0;
	char err[ERR_LEN];

	if (q->state != SEQ_DECODE)
		return;
	params(&p, 0, SPEC_OFF);
	if (*d == NULL ? engine_seq_new(e, q->tokens, q->n_tokens, &p, d, err) != 0 :
	    engine_seq_follow(e, *d, q->tokens, q->n_tokens, err) < 0)
		fail_msg("draft: %s", err);
	engine_seq_couple(*d, q);
	while (n < k && (*d)->state != SEQ_DONE) {
		if (engine_step(e, d, 1, -1, err) < 0)
			fail_msg("draft step: %s", err);
		if ((*d)->new_token >= 0)
			g[n++] = (*d)->new_token;
	}
	engine_seq_guess(q, g, n);
}

/*
 * A draft that samples with its target's generator (engine_seq_couple):
 * the model as its own draft, at temperature 1 and at the chat defaults,
 * over seeds. Its guesses are the very tokens each seed gives, so every
 * one is accepted and the output is the seed's without guesses. A greedy
 * draft of a sampled target is accepted only where the seed draws its
 * likeliest token: the rate this test asks for shows the coupling.
 */
static void
test_coupled_draft(void **state)
{
	struct engine *e = tiny_engine(256, 4096);
	struct seq_params p;
	struct run off, on;
	int32_t t[64], n, drafted = 0, accepted = 0;
	char err[ERR_LEN];

	(void)state;
	for (int i = 0; i < 8; i++) {
		struct seq *q, *d = NULL;

		n = suite_prompt(i, t);
		params(&p, 40, SPEC_OFF);
		if (i % 2)
			sample_params_chat(&p.sample);
		else
			p.sample.temperature = 1;
		p.sample.seed = 77 + (uint64_t)i;
		run_one(e, t, n, &p, &off, NULL);
		p.speculative = SPEC_ON;
		if (engine_seq_new(e, t, n, &p, &q, err) != 0)
			fail_msg("%s", err);
		memset(&on, 0, sizeof on);
		while (q->state != SEQ_DONE) {
			draft_for(e, q, &d, 1 + i % ENGINE_DRAFT_MAX);
			if (engine_step(e, &q, 1, -1, err) < 0)
				fail_msg("step: %s", err);
			if (q->new_token >= 0)
				take_piece(&on, q);
			while (engine_seq_more(e, q))
				take_piece(&on, q);
		}
		on.finish = q->finish;
		assert_same(&off, &on);
		drafted += q->n_drafted, accepted += q->n_accepted;
		engine_seq_free(e, d);
		engine_seq_free(e, q);
	}
	print_message("a coupled draft of the model itself: %d of %d guesses accepted\n", accepted, drafted);
	assert_true(drafted > 100);
	assert_int_equal(accepted, drafted);
	engine_close(e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_index),
		cmocka_unit_test(test_lookup_same),
		cmocka_unit_test(test_given_same),
		cmocka_unit_test(test_max_tokens_cap),
		cmocka_unit_test(test_given_stale),
		cmocka_unit_test(test_stop_and_context),
		cmocka_unit_test(test_many_and_cut),
		cmocka_unit_test(test_shared_rows),
		cmocka_unit_test(test_lone_rate),
		cmocka_unit_test(test_constrained),
		cmocka_unit_test(test_cut_rate),
		cmocka_unit_test(test_distribution),
		cmocka_unit_test(test_coupled_draft),
	};

	return cmocka_run_group_tests(tests, tiny_model_setup, tiny_model_teardown);
}
