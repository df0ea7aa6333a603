/*
 * test_chat_reason.c: the reasoning/answer splitter (daemon/model/chat_reason.c).
 *
 * Generations are fed as the scheduler will feed them: token ids with the
 * pieces tok_stream_push gives, on generated vocabularies of the qwen3 and
 * harmony flavours (contrib/tools/genvocab.c), or as pieces cut anywhere
 * between characters, which is how a tag spelled by several tokens
 * arrives. A random test checks that what Qwen3's template renders from a
 * reasoning and an answer splits back into them, however it is cut.
 */
#include "config.h"
#include "chat_reason.h"
#include "gen_tok.h"
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

/* What a whole generation split into: each part's text, concatenated. */
struct parts {
	char text[CHAT_N_PARTS][4096];
	size_t len[CHAT_N_PARTS];
};

/* Appends one call's split to the parts, checking that each part is whole UTF-8. */
static void
collect(struct parts *p, const struct chat_split *s)
{
	int k;

	for (k = 0; k < CHAT_N_PARTS; k++) {
		assert_true(utf8_valid(s->text[k] != NULL ? s->text[k] : "", s->len[k]));
		assert_true(p->len[k] + s->len[k] < sizeof p->text[k]);
		if (s->len[k] > 0)
			memcpy(p->text[k] + p->len[k], s->text[k], s->len[k]);
		p->len[k] += s->len[k];
		p->text[k][p->len[k]] = '\0';
	}
}

/* Feeds pieces (id 0, as for a text-only machine), then flushes. */
static void
feed_pieces(struct chat_reason *r, const char *const *pieces, size_t n, struct parts *p)
{
	struct chat_split s;
	size_t i;

	memset(p, 0, sizeof *p);
	for (i = 0; i < n; i++) {
		assert_int_equal(chat_reason_feed(r, 0, pieces[i], strlen(pieces[i]), &s), 0);
		collect(p, &s);
	}
	chat_reason_flush(r, &s);
	collect(p, &s);
}

/* Splits pieces with a fresh machine for template t and checks the parts. */
static void
check_pieces(enum chat_tmpl t, int in_reasoning, const char *const *pieces, size_t n,
    const char *reasoning, const char *answer)
{
	struct chat_reason r;
	struct parts p;
	char err[ERR_LEN];

	assert_int_equal(chat_reason_init(&r, t, qwen3, in_reasoning, err), 0);
	feed_pieces(&r, pieces, n, &p);
	chat_reason_free(&r);
	assert_string_equal(p.text[CHAT_PART_REASONING], reasoning);
	assert_string_equal(p.text[CHAT_PART_ANSWER], answer);
	assert_int_equal(p.len[CHAT_PART_TOOL], 0);
}

/* Generates text as a model would: encoded with parse_special, fed token by token with its pieces. */
static void
generate(struct chat_reason *r, const struct tokenizer *t, const char *text, struct parts *p)
{
	size_t cap = tok_stream_cap(t), i, n;
	char err[ERR_LEN], *piece = xmalloc(cap);
	struct tok_stream st;
	struct chat_split s;
	int32_t *ids;
	int w;

	memset(p, 0, sizeof *p);
	assert_int_equal(tok_encode(t, text, strlen(text), 1, 0, &ids, &n, err), 0);
	tok_stream_init(&st);
	for (i = 0; i < n; i++) {
		w = tok_stream_push(t, &st, ids[i], 0, piece, cap);
		assert_true(w >= 0);
		assert_int_equal(chat_reason_feed(r, ids[i], piece, (size_t)w, &s), 0);
		collect(p, &s);
	}
	chat_reason_flush(r, &s);
	collect(p, &s);
	free(ids);
	free(piece);
}

/* A Qwen3 reply through its tokenizer: the reasoning, then the answer without the template's newlines. */
static void
test_qwen3_tokens(void **state)
{
	struct chat_reason r;
	struct parts p;
	char err[ERR_LEN];

	(void)state;
	assert_int_equal(chat_reason_init(&r, CHAT_QWEN3, qwen3, 0, err), 0);
	generate(&r, qwen3, "<think>\nThe user greets me.\n\nI greet back.\n</think>\n\n  Hello! "
	    "\xe4\xbd\xa0\xe5\xa5\xbd<|im_end|>", &p);
	chat_reason_free(&r);
	assert_string_equal(p.text[CHAT_PART_REASONING], "The user greets me.\n\nI greet back.");
	assert_string_equal(p.text[CHAT_PART_ANSWER], "  Hello! \xe4\xbd\xa0\xe5\xa5\xbd");
}

/* Tags cut over several pieces are found; held bytes come out with the next piece. */
static void
test_qwen3_split_tags(void **state)
{
	static const char *const cut[] = { "\n<", "th", "ink>", "\n", "x <", "/thi", "ng> y", "\n</", "think",
	    ">\n", "\nAnswer" };
	static const char *const not_think[] = { "<", "thx>", " and <think>" };
	static const char *const started[] = { "plan", "\n</think>", "\n\nok" };
	struct chat_reason r;
	struct chat_split s;
	char err[ERR_LEN];

	(void)state;
	check_pieces(CHAT_QWEN3, 0, cut, ARRAY_LEN(cut), "x </thing> y", "Answer");
	/* not a tag: the held "<" goes out with what shows it; later tags are answer text */
	check_pieces(CHAT_QWEN3, 0, not_think, ARRAY_LEN(not_think), "", "<thx> and <think>");
	/* a prompt that ended with "<think>\n" */
	check_pieces(CHAT_QWEN3, 1, started, ARRAY_LEN(started), "plan", "ok");
	/* what is held is held: "<th" gives nothing until "ink>" settles it */
	assert_int_equal(chat_reason_init(&r, CHAT_QWEN3, qwen3, 0, err), 0);
	assert_int_equal(chat_reason_feed(&r, 0, "<th", 3, &s), 0);
	assert_int_equal(s.len[CHAT_PART_ANSWER] + s.len[CHAT_PART_REASONING], 0);
	assert_int_equal(chat_reason_feed(&r, 0, "ink>a</", 7, &s), 0);
	assert_int_equal(s.len[CHAT_PART_REASONING], 1);
	assert_memory_equal(s.text[CHAT_PART_REASONING], "a", 1);
	chat_reason_free(&r);
}

/* The end of a generation releases what was held, to the part it was in. */
static void
test_qwen3_flush(void **state)
{
	static const char *const mid_tag[] = { "<think>", "why\n\n</thi" };
	static const char *const early[] = { "\n<thi" };

	(void)state;
	check_pieces(CHAT_QWEN3, 0, mid_tag, ARRAY_LEN(mid_tag), "why\n\n</thi", "");
	check_pieces(CHAT_QWEN3, 0, early, ARRAY_LEN(early), "", "\n<thi");
}

/* More newlines than can be held: the first go out as reasoning, the tag is still found. */
static void
test_qwen3_newline_run(void **state)
{
	char nl[41], want[41];
	const char *pieces[] = { "<think>", "a", nl, "</think>", "b" };

	(void)state;
	memset(nl, '\n', 40);
	nl[40] = '\0';
	/* all but the last CHAT_REASON_HOLD - strlen("</think>") newlines were released */
	memset(want, 0, sizeof want);
	want[0] = 'a';
	memset(want + 1, '\n', 40 - (CHAT_REASON_HOLD - 8));
	check_pieces(CHAT_QWEN3, 0, pieces, ARRAY_LEN(pieces), want, "b");
}

/*
 * What Qwen3's template renders from a reasoning R and an answer A,
 * "<think>\n" R "\n</think>\n\n" A, splits back into R and A, cut into
 * pieces anywhere between characters, for random R and A made of
 * characters, newlines and tag look-alikes (R holds no "</think>" and
 * neither starts nor ends with a newline, A does not start with one).
 */
static void
test_qwen3_roundtrip(void **state)
{
	static const char *const frags[] = { "a", "Z", " ", "\n", "\n\n", "<", "</", "<think",
	    "</thin", "think>", ">", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "<think>", "/" };
	char r_txt[512], a_txt[512], full[1200], *pieces[1200];
	struct chat_reason r;
	struct parts p;
	char err[ERR_LEN];
	unsigned seed = 7;
	size_t n_p, i, k, at, len, rl, al;
	int iter;

	(void)state;
	for (iter = 0; iter < 3000; iter++) {
		rl = al = 0;
		for (k = (size_t)(rand_r(&seed) % 40); k > 0; k--) {
			const char *f = frags[rand_r(&seed) % ARRAY_LEN(frags)];

			memcpy(r_txt + rl, f, strlen(f) + 1);
			rl += strlen(f);
			f = frags[rand_r(&seed) % ARRAY_LEN(frags)];
			memcpy(a_txt + al, f, strlen(f) + 1);
			al += strlen(f);
		}
		r_txt[rl] = a_txt[al] = '\0';
		/* the template's strip('\n') and lstrip('\n'); R never closes the block itself */
		while (strstr(r_txt, "</think>") != NULL)
			memcpy(strstr(r_txt, "</think>"), "<xthink>", 8);
		while (rl > 0 && r_txt[rl - 1] == '\n')
			r_txt[--rl] = '\0';
		for (i = 0; r_txt[i] == '\n'; i++)
			;
		memmove(r_txt, r_txt + i, rl - i + 1);
		for (i = 0; a_txt[i] == '\n'; i++)
			;
		memmove(a_txt, a_txt + i, al - i + 1);
		snprintf(full, sizeof full, "<think>\n%s\n</think>\n\n%s", r_txt, a_txt);
		/* cut between characters, 1 to 12 bytes a piece */
		len = strlen(full);
		for (n_p = 0, at = 0; at < len; n_p++) {
			k = MIN(len - at, 1 + (size_t)(rand_r(&seed) % 12));
			while (at + k < len && (full[at + k] & 0xc0) == 0x80)
				k++;
			pieces[n_p] = xstrndup(full + at, k);
			at += k;
		}
		assert_int_equal(chat_reason_init(&r, CHAT_QWEN3, qwen3, 0, err), 0);
		feed_pieces(&r, (const char *const *)pieces, n_p, &p);
		chat_reason_free(&r);
		if (strcmp(p.text[CHAT_PART_REASONING], r_txt) != 0 ||
		    strcmp(p.text[CHAT_PART_ANSWER], a_txt) != 0)
			fail_msg("'%s' split into '%s' and '%s'", full, p.text[CHAT_PART_REASONING],
			    p.text[CHAT_PART_ANSWER]);
		for (i = 0; i < n_p; i++)
			free(pieces[i]);
	}
}

/* A gpt-oss reply: analysis is reasoning, final the answer; markers and headers go nowhere. */
static void
test_harmony(void **state)
{
	static const struct {
		const char *text;
		int in_reasoning;
		const char *reasoning, *answer, *tool;
	} cases[] = {
		{ "<|channel|>analysis<|message|>We need 2+2.<|end|><|start|>assistant<|channel|>final"
		  "<|message|>It is 4.<|return|>", 0, "We need 2+2.", "It is 4.", "" },
		{ "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
		  "{\"city\":\"Paris\"}<|call|>", 0, "", "", "{\"city\":\"Paris\"}" },
		{ "still thinking<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>", 1,
		  "still thinking", "Done.", "" },
		{ "<|message|>No channel.<|return|>", 0, "", "No channel.", "" },
		{ "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b"
		  "<|end|>", 0, "ab", "", "" },
	};
	struct chat_reason r;
	struct parts p;
	char err[ERR_LEN];
	size_t k;

	(void)state;
	for (k = 0; k < ARRAY_LEN(cases); k++) {
		assert_int_equal(chat_reason_init(&r, CHAT_HARMONY, harmony, cases[k].in_reasoning, err), 0);
		generate(&r, harmony, cases[k].text, &p);
		chat_reason_free(&r);
		assert_string_equal(p.text[CHAT_PART_REASONING], cases[k].reasoning);
		assert_string_equal(p.text[CHAT_PART_ANSWER], cases[k].answer);
		assert_string_equal(p.text[CHAT_PART_TOOL], cases[k].tool);
	}
}

/* Families without reasoning: everything is answer, tags included. */
/*
 * Qwen's <tool_call> blocks, tags cut over pieces, are tool text, tags
 * included; a tag's start left at the end stays where it stands; Qwen3's
 * answer may open with a call at once, or after its reasoning.
 */
static void
test_qwen_tool_calls(void **state)
{
	static const char *const cut[] = { "Sure.\n<tool", "_call>\n{\"name\": \"f\", ", "\"arguments\": {}}\n</tool_",
	    "call>\n<tool_call>\n{}\n</tool_call>", " done <tool" };
	static const char *const first[] = { "<tool_call>", "\n{}\n</tool_call" };
	static const char *const texts[][3] = {
		{ "<think>\nx\n</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call><|im_end|>", "x",
		  "<tool_call>\n{\"name\": \"f\"}\n</tool_call>" },
		{ "<tool_call>\n{}\n</tool_call>", "", "<tool_call>\n{}\n</tool_call>" },
		{ "<t <tool_call>{}</tool_call>", "", "<tool_call>{}</tool_call>" },
	};
	struct chat_reason r;
	struct parts p;
	char err[ERR_LEN];
	size_t i;

	(void)state;
	assert_int_equal(chat_reason_init(&r, CHAT_CHATML, qwen3, 0, err), 0);
	feed_pieces(&r, cut, ARRAY_LEN(cut), &p);
	chat_reason_free(&r);
	assert_string_equal(p.text[CHAT_PART_TOOL], "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"
	    "<tool_call>\n{}\n</tool_call>");
	assert_string_equal(p.text[CHAT_PART_ANSWER], "Sure.\n\n done <tool");
	assert_int_equal(chat_reason_init(&r, CHAT_QWEN3, qwen3, 0, err), 0);
	feed_pieces(&r, first, ARRAY_LEN(first), &p);
	chat_reason_free(&r);
	/* an unclosed call's held tag start is the call's */
	assert_string_equal(p.text[CHAT_PART_TOOL], "<tool_call>\n{}\n</tool_call");
	assert_string_equal(p.text[CHAT_PART_ANSWER], "");
	for (i = 0; i < ARRAY_LEN(texts); i++) {
		assert_int_equal(chat_reason_init(&r, CHAT_QWEN3, qwen3, 0, err), 0);
		generate(&r, qwen3, texts[i][0], &p);
		chat_reason_free(&r);
		assert_string_equal(p.text[CHAT_PART_REASONING], texts[i][1]);
		assert_string_equal(p.text[CHAT_PART_TOOL], texts[i][2]);
	}
	assert_string_equal(p.text[CHAT_PART_ANSWER], "<t ");
}

static void
test_other_families(void **state)
{
	static const char *const pieces[] = { "<think>", "hi", "</think>", "\n\nthere" };
	struct chat_reason r;
	struct parts p;
	char err[ERR_LEN];

	(void)state;
	check_pieces(CHAT_CHATML, 1, pieces, ARRAY_LEN(pieces), "", "<think>hi</think>\n\nthere");
	assert_int_equal(chat_reason_init(&r, CHAT_LLAMA3, harmony, 0, err), 0);
	generate(&r, harmony, "<|channel|>final<|message|>x", &p);
	chat_reason_free(&r);
	assert_string_equal(p.text[CHAT_PART_ANSWER], "finalx");
}

/* A harmony splitter needs harmony's markers; a Qwen3 one refuses a piece longer than a token's. */
static void
test_errors(void **state)
{
	struct chat_reason r;
	struct chat_split s;
	char err[ERR_LEN], *big;
	size_t cap = tok_stream_cap(qwen3);

	(void)state;
	assert_int_equal(chat_reason_init(&r, CHAT_HARMONY, qwen3, 0, err), ERR_UNSUPPORTED);
	assert_non_null(strstr(err, "needs a vocabulary with <|start|>"));
	chat_reason_free(&r);
	big = xmalloc(cap + 1);
	memset(big, 'a', cap + 1);
	assert_int_equal(chat_reason_init(&r, CHAT_QWEN3, qwen3, 0, err), 0);
	assert_int_equal(chat_reason_feed(&r, 0, big, cap + 1, &s), ERR_RANGE);
	assert_int_equal(chat_reason_feed(&r, 0, big, cap, &s), 0);
	assert_int_equal(s.len[CHAT_PART_ANSWER], cap);
	chat_reason_free(&r);
	free(big);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qwen3_tokens),
		cmocka_unit_test(test_qwen3_split_tags),
		cmocka_unit_test(test_qwen3_flush),
		cmocka_unit_test(test_qwen3_newline_run),
		cmocka_unit_test(test_qwen3_roundtrip),
		cmocka_unit_test(test_harmony),
		cmocka_unit_test(test_qwen_tool_calls),
		cmocka_unit_test(test_other_families),
		cmocka_unit_test(test_errors),
	};

	return cmocka_run_group_tests(tests, gen_tok_setup, gen_tok_teardown);
}
