/*
 * test_gentext.c: a turn's text as the engine builds it (daemon/engine/gentext.c),
 * driven with fake generations: texts encoded into token ids on generated
 * qwen3 and harmony vocabularies, fed one id at a time as seq_accept feeds
 * them. What each step hands out is checked as a client would see it:
 * the pieces of each part add up to its whole text, the answer is held back
 * only while it could become a stop string, and stop strings are looked for
 * in the answer alone.
 */
#include "config.h"
#include "gen_tok.h"
#include "gentext.h"
#include "tokenizer.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* What the steps of a generation handed out. */
struct seen {
	char text[CHAT_N_PARTS][4096];  /* each part's pieces, concatenated */
	size_t len[CHAT_N_PARTS];
	int stopped;                    /* a stop string ended it */
	size_t steps;                   /* tokens fed */
	size_t answer_at;               /* the step whose piece first had answer text; 0: none */
};

/* Appends a step's pieces, each whole UTF-8. */
static void
collect(struct seen *s, const struct gentext *g)
{
	const struct gentext_part *p;
	int k;

	for (k = 0; k < CHAT_N_PARTS; k++) {
		p = &g->part[k];
		assert_true(utf8_valid(p->piece, p->piece_len));
		assert_true(s->len[k] + p->piece_len < sizeof s->text[k]);
		memcpy(s->text[k] + s->len[k], p->piece, p->piece_len);
		s->len[k] += p->piece_len;
		s->text[k][s->len[k]] = '\0';
	}
	if (s->answer_at == 0 && g->part[CHAT_PART_ANSWER].piece_len > 0)
		s->answer_at = s->steps;
}

/*
 * Generates text (encoded with its special tokens) as the engine does: a
 * token at a time, the last one ending the turn, stopping at a stop
 * string. The whole texts must be what the pieces added up to.
 */
static void
generate(struct gentext *g, const struct tokenizer *t, const char *text, struct seen *s)
{
	char err[ERR_LEN];
	int32_t *ids;
	size_t n, i;
	int over = 0, k;

	memset(s, 0, sizeof *s);
	assert_int_equal(tok_encode(t, text, strlen(text), 1, 0, &ids, &n, err), 0);
	for (i = 0; i < n && !over; i++) {
		s->steps++;
		s->stopped = gentext_token(g, ids[i]);
		over = s->stopped || i == n - 1;
		if (over && !s->stopped)
			s->stopped = gentext_end(g);
		gentext_emit(g, over);
		collect(s, g);
	}
	for (k = 0; k < CHAT_N_PARTS; k++)
		assert_string_equal(s->text[k], g->part[k].text);
	free(ids);
}

/* One generation through a fresh gentext; its whole parts must be as given. */
static void
check(const struct tokenizer *t, enum chat_tmpl split, const char *const *stop, int n_stop, const char *text,
    const char *reasoning, const char *answer, const char *tool, struct seen *s)
{
	struct gentext g;
	char err[ERR_LEN];

	assert_int_equal(gentext_init(&g, t, split, stop, n_stop, err), 0);
	generate(&g, t, text, s);
	assert_string_equal(g.part[CHAT_PART_REASONING].text, reasoning);
	assert_string_equal(g.part[CHAT_PART_ANSWER].text, answer);
	assert_string_equal(g.part[CHAT_PART_TOOL].text, tool);
	gentext_free(&g);
}

/* A raw prompt's output, or a family without reasoning: all answer, tags included. */
static void
test_all_answer(void **state)
{
	static const char text[] = "<think>\nhm\n</think>\n\nHello there";
	struct seen s;

	(void)state;
	check(qwen3, CHAT_RAW, NULL, 0, text, "", text, "", &s);
	check(qwen3, CHAT_CHATML, NULL, 0, text, "", text, "", &s);
	assert_false(s.stopped);
}

/* Qwen3: the reasoning streams as it comes, apart from the answer; the tags go nowhere. */
static void
test_qwen3(void **state)
{
	struct seen s;

	(void)state;
	check(qwen3, CHAT_QWEN3, NULL, 0, "<think>\nFirst this.\nThen that.\n</think>\n\nThe answer.<|im_end|>",
	    "First this.\nThen that.", "The answer.", "", &s);
	assert_false(s.stopped);
	assert_true(s.answer_at > 1);
}

/*
 * Stop strings are the answer's: reasoning that spells one goes on (and is
 * not held back), the answer stops before one, cut even where it straddles
 * tokens.
 */
static void
test_stop_in_answer_only(void **state)
{
	static const char *const stop[] = { "STOP", "\n\n\n" };
	struct seen s;

	(void)state;
	check(qwen3, CHAT_QWEN3, stop, 2, "<think>\nI must not say STOP\n\n\nyet.\n</think>\n\nGo on. STOP here.",
	    "I must not say STOP\n\n\nyet.", "Go on. ", "", &s);
	assert_true(s.stopped);
	check(qwen3, CHAT_RAW, stop, 2, "<think>STOP</think>", "", "<think>", "", &s);
	assert_true(s.stopped);
}

/* The answer's end that may begin a stop string is held back, then handed out when it does not. */
static void
test_hold_back(void **state)
{
	static const char *const stop[] = { "Hello world" };
	struct gentext g;
	char err[ERR_LEN];
	int32_t *ids;
	size_t n, i;

	(void)state;
	assert_int_equal(gentext_init(&g, qwen3, CHAT_QWEN3, stop, 1, err), 0);
	assert_int_equal(tok_encode(qwen3, "Hello", 5, 1, 0, &ids, &n, err), 0);
	for (i = 0; i < n; i++) {
		assert_int_equal(gentext_token(&g, ids[i]), 0);
		gentext_emit(&g, 0);
	}
	assert_int_equal(g.part[CHAT_PART_ANSWER].emitted, 0);
	assert_int_equal(gentext_end(&g), 0);
	gentext_emit(&g, 1);
	assert_int_equal(g.part[CHAT_PART_ANSWER].emitted, 5);
	free(ids);
	gentext_free(&g);
}

/*
 * The end releases what was held: a tag's start that never became one,
 * and the bytes of an unfinished character, in the part they were in.
 */
static void
test_end_flush(void **state)
{
	int32_t think = tok_find(qwen3, "<think>"), c3 = tok_find(qwen3, "\xc3\x83"); /* the byte C3 */
	struct gentext g;
	struct seen s;
	char err[ERR_LEN];

	(void)state;
	check(qwen3, CHAT_QWEN3, NULL, 0, "<think>\nstill going\n</thi", "still going\n</thi", "", "", &s);
	assert_true(think >= 0 && c3 >= 0);
	assert_int_equal(gentext_init(&g, qwen3, CHAT_QWEN3, NULL, 0, err), 0);
	gentext_token(&g, think);
	gentext_token(&g, c3);
	gentext_emit(&g, 0);
	assert_int_equal(g.part[CHAT_PART_REASONING].piece_len, 0);
	assert_int_equal(gentext_end(&g), 0);
	gentext_emit(&g, 1);
	assert_string_equal(g.part[CHAT_PART_REASONING].text, "\xef\xbf\xbd");
	gentext_free(&g);
}

/* Harmony: analysis is reasoning, final the answer, commentary the tool part; stops are the final's. */
static void
test_harmony(void **state)
{
	static const char *const stop[] = { "2+2" };
	struct seen s;

	(void)state;
	check(harmony, CHAT_HARMONY, stop, 1, "<|channel|>analysis<|message|>We need 2+2.<|end|><|start|>assistant"
	    "<|channel|>commentary to=functions.add<|message|>{\"a\":2}<|end|><|start|>assistant<|channel|>final"
	    "<|message|>It is 4, as 2+2 is.<|return|>", "We need 2+2.", "It is 4, as ", "{\"a\":2}", &s);
	assert_true(s.stopped);
}

/* A U+0000 generated is a U+FFFD in every part, which the protocol's strings cannot hold. */
static void
test_nul(void **state)
{
	int32_t nul = tok_find(harmony, "\xc4\x80");  /* the byte-level alphabet's character of byte 0 */
	int32_t seq[3] = { tok_find(harmony, "<|channel|>"), -1, tok_find(harmony, "<|message|>") };
	struct gentext g;
	char err[ERR_LEN];
	int32_t *ids;
	size_t n, i;

	(void)state;
	assert_true(nul >= 0 && seq[0] >= 0 && seq[2] >= 0);
	assert_int_equal(tok_encode(harmony, "analysis", 8, 0, 0, &ids, &n, err), 0);
	assert_int_equal(gentext_init(&g, harmony, CHAT_HARMONY, NULL, 0, err), 0);
	gentext_token(&g, seq[0]);
	for (i = 0; i < n; i++)
		gentext_token(&g, ids[i]);
	gentext_token(&g, seq[2]);
	gentext_token(&g, nul);
	gentext_end(&g);
	gentext_emit(&g, 1);
	assert_string_equal(g.part[CHAT_PART_REASONING].text, "\xef\xbf\xbd");
	free(ids);
	gentext_free(&g);
}

/* A harmony split needs harmony's markers: the error is chat_reason_init's, with nothing to free. */
static void
test_errors(void **state)
{
	struct gentext g;
	char err[ERR_LEN];

	(void)state;
	assert_int_equal(gentext_init(&g, qwen3, CHAT_HARMONY, NULL, 0, err), ERR_UNSUPPORTED);
	assert_non_null(strstr(err, "harmony"));
	gentext_free(&g);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_all_answer),
		cmocka_unit_test(test_qwen3),
		cmocka_unit_test(test_stop_in_answer_only),
		cmocka_unit_test(test_hold_back),
		cmocka_unit_test(test_end_flush),
		cmocka_unit_test(test_harmony),
		cmocka_unit_test(test_nul),
		cmocka_unit_test(test_errors),
	};

	return cmocka_run_group_tests(tests, gen_tok_setup, gen_tok_teardown);
}
