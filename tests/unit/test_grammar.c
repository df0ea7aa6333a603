/*
 * test_grammar.c: grammars for constrained decoding (daemon/engine/grammar.c).
 * The text's syntax and its refusals (each with its limit); whole texts
 * matched and refused, split anywhere, UTF-8 included; and the masks:
 * at every step of seeded random walks through several grammars, the
 * mask must be exactly the tokens whose bytes the state accepts (checked
 * one token at a time on a copy), the end tokens exactly when the root is
 * complete; the index (gram_index) made whole when it is made, no entry
 * left to a step; masks from several threads at once over one index.
 * TEST_GRAMMAR_SEED=N repeats a run.
 */
#include "config.h"
#include "grammar.h"
#include "grammar_int.h"
#include "util.h"
#include "rng_seed.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

static uint64_t rng_state;

static uint32_t
rng(void)
{
	rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 11);
}

static struct grammar *
compile(const char *text)
{
	struct grammar *g;
	char err[ERR_LEN];

	if (grammar_compile(text, strlen(text), &g, err) != 0)
		fail_msg("grammar refused: %s\n%s", err, text);
	return g;
}

/* 1 if text, fed in pieces of at most piece bytes, is a whole match of g. */
static int
matches(const struct grammar *g, const char *text, size_t piece)
{
	struct gram_state *s;
	size_t n = strlen(text);
	int ok = 1;

	assert_int_equal(gram_state_new(g, &s, NULL), 0);
	for (size_t i = 0; i < n && ok; i += piece)
		ok = gram_accept(s, text + i, MIN(piece, n - i), NULL) == 0;
	ok = ok && gram_complete(s);
	gram_state_free(s);
	return ok;
}

/* Each of yes matches g whole, fed a byte at a time and at once; none of no does. */
static void
check_texts(const char *grammar, const char *const *yes, const char *const *no)
{
	struct grammar *g = compile(grammar);

	for (; *yes != NULL; yes++)
		if (!matches(g, *yes, 1) || !matches(g, *yes, 1000))
			fail_msg("'%s' should match\n%s", *yes, grammar);
	for (; *no != NULL; no++)
		if (matches(g, *no, 1) || matches(g, *no, 1000))
			fail_msg("'%s' should not match\n%s", *no, grammar);
	grammar_free(g);
}

static void
test_syntax(void **state)
{
	(void)state;
	/* classes' ranges out of order, overlapping, touching: merged (grammar_int.h), the same sets */
	check_texts("root ::= [x-za-cb-dd-f]+", (const char *[]){ "abcdefxyz", "fx", NULL },
	    (const char *[]){ "g", "w", "aw", NULL });
	check_texts("root ::= [^\\u0100-\\u01ffb-dc-fa\\u0080-\\u0150]",
	    (const char *[]){ "g", "\x7f", "\xc8\x80", "\xe2\x82\xac", NULL },
	    (const char *[]){ "a", "e", "f", "\xc2\x80", "\xc5\x90", "\xc7\xbf", NULL });
	check_texts("root ::= \"ab\" | \"c\"", (const char *[]){ "ab", "c", NULL },
	    (const char *[]){ "", "a", "abc", "ac", NULL });
	check_texts("root ::= [a-c]+ [^a-z] .", (const char *[]){ "a1x", "cab#\xc3\xa9", NULL },
	    (const char *[]){ "a", "ab", "1x", "aZ", NULL });
	check_texts("root ::= \"x\"{2,4} \"y\"? (\"z\" | \"w\")* \"!\"{3} \"#\"{1,}",
	    (const char *[]){ "xx!!!#", "xxxxyzwz!!!###", NULL },
	    (const char *[]){ "x!!!#", "xxxxx!!!#", "xx!!#", "xx!!!", "xxyy!!!#", NULL });
	check_texts("# a comment\nroot ::= item (\",\" item)*  # trailing\n"
	    "item ::=\n  \"[\" root? \"]\"\n | num\nnum ::= [0-9]{1,3}",
	    (const char *[]){ "1", "[]", "[1,[2,[]]],33", "999", NULL },
	    (const char *[]){ "[", "1,", "1000", "[1]]", NULL });
	check_texts("root ::= \"\\n\\t\\\\\\\"\\x41\\u00e9\\U0001F600\" [\\]\\-]",
	    (const char *[]){ "\n\t\\\"A\xc3\xa9\xf0\x9f\x98\x80]", "\n\t\\\"A\xc3\xa9\xf0\x9f\x98\x80-", NULL },
	    (const char *[]){ "\n\t\\\"A\xc3\xa9\xf0\x9f\x98\x80", NULL });
	check_texts("root ::= [\\u00e0-\\u00ff]+ \"\xe2\x82\xac\"",
	    (const char *[]){ "\xc3\xa0\xc3\xbf\xe2\x82\xac", NULL },
	    (const char *[]){ "a\xe2\x82\xac", "\xc3\xa0\xe2\x82", "\xc3\xa0\xe2\x82\xad", NULL });
	check_texts("root ::= \"a\" b\nb ::= \"\" | \"b\"", (const char *[]){ "a", "ab", NULL },
	    (const char *[]){ "b", "abb", NULL });
}

/* grammar is refused, the message naming what. */
static void
refused(const char *grammar, int code, const char *what)
{
	struct grammar *g = NULL;
	char err[ERR_LEN] = "";

	if (grammar_compile(grammar, strlen(grammar), &g, err) != code || g != NULL || strstr(err, what) == NULL)
		fail_msg("'%s': expected %d with '%s', got '%s'", grammar, code, what, err);
}

static void
test_refusals(void **state)
{
	char *big;
	size_t n = 0;

	(void)state;
	refused("a ::= \"x\"", ERR_INVAL, "no rule named 'root'");
	refused("root ::= a", ERR_INVAL, "rule 'a' is used but not defined");
	refused("root ::= \"x\"\nroot ::= \"y\"", ERR_INVAL, "line 2 column 1: a rule defined twice");
	refused("root ::= \"x", ERR_INVAL, "closing quote");
	refused("root ::= [a-", ERR_INVAL, "class without its closing ]");
	refused("root ::= \"a\\", ERR_INVAL, "inside an escape");
	refused("root ::= [z-a]", ERR_INVAL, "backwards");
	refused("root ::= \"\\q\"", ERR_INVAL, "unknown escape");
	refused("root ::= \"\\xZZ\"", ERR_INVAL, "hexadecimal");
	refused("root ::= (\"a\"", ERR_INVAL, "closing )");
	refused("root ::= \"a\")", ERR_INVAL, "without its group");
	refused("root ::= \"a\"{3,2}", ERR_INVAL, "below n");
	refused("root ::= \"a\"{1001}", ERR_RANGE, "limit of 1,000");
	refused("root ::= \"\xff\"", ERR_INVAL, "not UTF-8");
	refused("root ::= | ::=", ERR_INVAL, "expected");
	refused("root ::= root \"a\" | \"b\"", ERR_INVAL, "rule 'root' can reach itself");
	refused("root ::= a\na ::= b? c\nb ::= \"x\"\nc ::= d* root | \"y\"\nd ::= \"z\"", ERR_INVAL, "left recursion");
	big = xmalloc(70 * 4 + 64);
	n += (size_t)sprintf(big, "root ::= ");
	for (int i = 0; i < 70; i++)
		n += (size_t)sprintf(big + n, "(");
	n += (size_t)sprintf(big + n, "\"a\"");
	for (int i = 0; i < 70; i++)
		n += (size_t)sprintf(big + n, ")");
	refused(big, ERR_RANGE, "limit of 64");
	free(big);
	big = xmalloc(GRAM_MAX_TEXT + 2);
	memset(big, ' ', GRAM_MAX_TEXT + 1);
	big[GRAM_MAX_TEXT + 1] = '\0';
	refused(big, ERR_RANGE, "above the limit");
	/* counts make elements and rules: a short text past either limit */
	n = (size_t)sprintf(big, "root ::= ");
	for (int i = 0; i < 2100; i++)
		n += (size_t)sprintf(big + n, "\"a\"{1000} ");
	refused(big, ERR_RANGE, "more elements than");
	n = (size_t)sprintf(big, "root ::= ");
	for (int i = 0; i < 100; i++)
		n += (size_t)sprintf(big + n, "\"a\"{0,1000} ");
	refused(big, ERR_RANGE, "more rules than");
	free(big);
}

/* A state that rejects text is as it was: what it accepts next is unchanged. */
static void
test_reject_keeps_state(void **state)
{
	struct grammar *g = compile("root ::= \"ab\" \"cd\"");
	struct gram_state *s;
	char err[ERR_LEN];

	(void)state;
	assert_int_equal(gram_state_new(g, &s, NULL), 0);
	assert_int_equal(gram_accept(s, "a", 1, err), 0);
	assert_int_equal(gram_accept(s, "bcx", 3, err), ERR_INVAL);
	assert_non_null(strstr(err, "does not match"));
	assert_int_equal(gram_accept(s, "b", 1, err), 0);
	assert_false(gram_complete(s));
	assert_int_equal(gram_accept(s, "\xc3", 1, err), ERR_INVAL); /* a character no stack takes, refused half read */
	assert_int_equal(gram_accept(s, "cd", 2, err), 0);
	assert_true(gram_complete(s) && gram_finished(s));
	gram_state_free(s);
	grammar_free(g);
}

/* Nesting past GRAM_MAX_DEPTH is not allowed; a repetition by itself does not nest. */
static void
test_depth(void **state)
{
	struct grammar *g = compile("root ::= \"[\" root \"]\" | \"x\"*");
	struct gram_state *s;
	int i, rc = 0;

	(void)state;
	assert_int_equal(gram_state_new(g, &s, NULL), 0);
	for (i = 0; i < 2 * GRAM_MAX_DEPTH && (rc = gram_accept(s, "[", 1, NULL)) == 0; i++)
		;
	assert_int_equal(rc, ERR_INVAL);
	assert_true(i >= GRAM_MAX_DEPTH - 2 && i <= GRAM_MAX_DEPTH + 1);
	gram_state_free(s);
	assert_int_equal(gram_state_new(g, &s, NULL), 0);
	for (i = 0; i < 100000; i++)
		assert_int_equal(gram_accept(s, "x", 1, NULL), 0);
	assert_true(gram_complete(s));
	gram_state_free(s);
	grammar_free(g);
}

/* An ambiguous grammar whose positions double with each character fails with ERR_RANGE, not a hang. */
static void
test_ambiguous(void **state)
{
	struct grammar *g = compile("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"\"");
	struct gram_state *s;
	char err[ERR_LEN] = "";
	int i, rc = 0;

	(void)state;
	assert_int_equal(gram_state_new(g, &s, NULL), 0);
	for (i = 0; i < 64 && (rc = gram_accept(s, "a", 1, err)) == 0; i++)
		;
	assert_int_equal(rc, ERR_RANGE);
	assert_true(i >= 10 && i <= 13); /* 2^12 = 4,096 */
	assert_non_null(strstr(err, "ambiguous"));
	gram_state_free(s);
	grammar_free(g);
}

/* ---- masks ---- */

struct vocab {
	int n;
	char **b;
	uint32_t *len;
	uint8_t *skip, *end;
};

static void
vocab_add(struct vocab *v, const char *b, size_t len, int skip, int end)
{
	v->b = xrealloc(v->b, (size_t)(v->n + 1) * sizeof *v->b);
	v->len = xrealloc(v->len, (size_t)(v->n + 1) * sizeof *v->len);
	v->skip = xrealloc(v->skip, (size_t)(v->n + 1));
	v->end = xrealloc(v->end, (size_t)(v->n + 1));
	v->b[v->n] = xmalloc(len + 1);
	memcpy(v->b[v->n], b, len);
	v->len[v->n] = (uint32_t)len, v->skip[v->n] = (uint8_t)skip, v->end[v->n] = (uint8_t)end;
	v->n++;
}

/*
 * Every byte, then pieces of the texts that cross the grammars' rules
 * ("a, "\":", a character split between two tokens...), random strings
 * over their alphabet, duplicates of some, a control token and an end.
 */
static struct vocab
test_vocab(void)
{
	static const char *pieces[] = { "\"", "\":", "\": ", ", \"", "{\"", "\"}", "true", "false", "null", "12",
		"-3", ".5e", "[[", "]]", "],", "\xc3\xa9", "\xc3", "\xa9\"", "\xe2\x82", "\xac", "\xe2\x82\xac", "ab",
		"abc", "\\n", "\\\"", "  ", "\n", "x", "xx", "xxx" };
	static const char alpha[] = "{}[]\",:0123456789.-eE abtrufnlsx\\";
	struct vocab v = { 0 };
	char b[8];

	for (int i = 0; i < 256; i++) {
		b[0] = (char)i;
		vocab_add(&v, b, 1, 0, 0);
	}
	for (size_t i = 0; i < ARRAY_LEN(pieces); i++)
		vocab_add(&v, pieces[i], strlen(pieces[i]), 0, 0);
	for (int i = 0; i < 600; i++) {
		int len = 2 + (int)(rng() % 5);

		for (int j = 0; j < len; j++)
			b[j] = alpha[rng() % (sizeof alpha - 1)];
		vocab_add(&v, b, (size_t)len, 0, 0);
	}
	vocab_add(&v, "ab", 2, 0, 0);
	vocab_add(&v, "<ctl>", 5, 1, 0);
	vocab_add(&v, "", 0, 0, 1);
	return v;
}

static void
vocab_free(struct vocab *v)
{
	for (int i = 0; i < v->n; i++)
		free(v->b[i]);
	free(v->b), free(v->len), free(v->skip), free(v->end);
}

/* The mask at s against each token tried on a copy of s; returns the allowed ids (n into *n). */
static int *
check_mask(const struct gram_state *s, struct gram_index *gx, const struct vocab *v, int *n)
{
	uint32_t *mask = xcalloc(((size_t)v->n + 31) / 32, sizeof *mask);
	int count = gram_mask(s, gx, mask, NULL), *ids = xmalloc((size_t)v->n * sizeof *ids);

	*n = 0;
	assert_true(count >= 0);
	for (int i = 0; i < v->n; i++) {
		int want = 0, got = (int)(mask[i / 32] >> (i % 32) & 1);

		if (v->end[i]) {
			want = gram_complete(s);
		} else if (!v->skip[i] && v->len[i] > 0) {
			struct gram_state *t;

			assert_int_equal(gram_state_clone(s, &t, NULL), 0);
			want = gram_accept(t, v->b[i], v->len[i], NULL) == 0;
			gram_state_free(t);
		}
		if (want != got)
			fail_msg("token %d '%.*s': mask says %d, accepting it says %d (seed %llu)", i, (int)v->len[i], v->b[i],
			    got, want, (unsigned long long)rng_state);
		if (got)
			ids[(*n)++] = i;
	}
	assert_int_equal(count, *n);
	free(mask);
	return ids;
}

/*
 * Random walks of up to steps tokens through g, each step's mask checked;
 * returns the walks that ended complete. The index is made on one thread
 * and again on several: the same entries, and the same mask at each step.
 */
static int
walks(const char *grammar, int n_walks, int steps)
{
	struct grammar *g = compile(grammar);
	struct vocab v = test_vocab();
	struct gram_vocab *gv;
	struct gram_index *gx, *gxn;
	uint32_t *mask = xmalloc(((size_t)v.n + 31) / 32 * sizeof *mask);
	int done = 0;

	assert_int_equal(gram_vocab_new(v.n, (const char *const *)v.b, v.len, v.skip, v.end, &gv, NULL), 0);
	assert_int_equal(gram_vocab_size(gv), v.n);
	assert_int_equal(gram_index_new_threads(g, gv, 1, &gx, NULL), 0);
	assert_int_equal(gram_index_new_threads(g, gv, 4, &gxn, NULL), 0);
	if (!gram_index_same(gx, gxn) || !gram_index_same(gxn, gx))
		fail_msg("the index made on 4 threads differs from the one made on 1\n%s", grammar);
	for (int w = 0; w < n_walks; w++) {
		struct gram_state *s;

		assert_int_equal(gram_state_new(g, &s, NULL), 0);
		for (int k = 0; k < steps; k++) {
			int n, *ids = check_mask(s, gx, &v, &n), id;

			assert_int_equal(gram_mask(s, gxn, mask, NULL), n);
			for (int i = 0, j = 0; i < v.n; i++) {
				int in = j < n && ids[j] == i;

				assert_int_equal((int)(mask[i / 32] >> (i % 32) & 1), in);
				j += in;
			}

			if (n == 0) /* every byte is a token here: a position the mask allowed must go on */
				fail_msg("an empty mask after %d tokens (seed %llu)\n%s", k, (unsigned long long)rng_state,
				    grammar);
			id = ids[rng() % (uint32_t)n];
			free(ids);
			if (v.end[id]) {
				done++;
				break;
			}
			assert_int_equal(gram_accept(s, v.b[id], v.len[id], NULL), 0);
		}
		gram_state_free(s);
	}
	if (gram_index_late(gx) != 0 || gram_index_late(gxn) != 0) /* every position's entry is made with the index */
		fail_msg("%u entries built by masks, not by gram_index_new (seed %llu)\n%s", gram_index_late(gx),
		    (unsigned long long)rng_state, grammar);
	gram_index_free(gx);
	gram_index_free(gxn);
	free(mask);
	gram_vocab_free(gv);
	vocab_free(&v);
	grammar_free(g);
	return done;
}

static const char json_grammar[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( string \":\" ws value ws (\",\" ws string \":\" ws value ws)* )? \"}\"\n"
    "array  ::= \"[\" ws ( value ws (\",\" ws value ws)* )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt] )* \"\\\"\"\n"
    "number ::= \"-\"? [0-9]+ (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
    "ws     ::= [ \\n]{0,2}\n";

static void
test_masks(void **state)
{
	int done;

	(void)state;
	done = walks(json_grammar, 40, 40);
	print_message("json: %d of 40 walks ended complete\n", done);
	walks("root ::= \"a\" \"bc\" \"d\"? | \"xx\" [0-9]*", 20, 12);
	walks("root ::= ([a-z] | \"\xc3\xa9\" | \"\xe2\x82\xac\")+ \"\\\"\"", 20, 20);
	walks("root ::= \"[\"* \"]\"{0,3}", 10, 30);
	/* characters of three and four bytes whose first byte alone fits several ranges */
	walks("root ::= \"{\" ([\\u0800-\\u0fff] | [\\U00010000-\\U0003ffff] | [\\ud000-\\ud7ff])* \"}\"", 20, 20);
	walks("root ::= \"{\" ([\\U00100000-\\U0010ffff] | [\\U00100000-\\U00100fff] \"!\")* \"}\"", 20, 20);
	/* sets that split a half-read character's span: at a range's start, past its end, in each byte */
	walks("root ::= \"<\" ([\\u00e0-\\u00ef] | [\\u4e00-\\u4e0f\\u4e20] \"!\" | [^\\x00-\\u00e5\\u00e9-\\u4dff] | "
	    "[\\U0001f600-\\U0001f60f] | [\\u00b0-\\u00c5] \"?\" | .)* \">\"", 20, 30);
	/* two ranges that cover a first byte's span only together: that byte is refused, not left a dead end */
	walks("root ::= \"<\" [^\\x00-\\x7f\\u0080-\\u00a0\\u00a1-\\u07ff]* \">\"", 10, 20);
	/* rules that return into frames below a key: a cut rule's own, and a plain rule's below a cut one */
	walks("root ::= a\na ::= \"[\" a \"x\" | \"y\"", 20, 12);
	walks("root ::= g\ng ::= \"<\" r \">\" g?\nr ::= \"(\" r \")\" | \"z\"", 20, 16);
}

/* Several threads take masks over one index at once: each the mask taken alone. */
struct mask_job {
	struct gram_index *gx;
	struct gram_state **st;
	uint32_t **want;
	int n, words, bad;
};

static void *
mask_thread(void *arg)
{
	struct mask_job *j = arg;
	uint32_t *mask = xmalloc((size_t)j->words * sizeof *mask);

	for (int r = 0; r < 20; r++)
		for (int i = 0; i < j->n; i++) {
			int k = (i + r) % j->n;

			if (gram_mask(j->st[k], j->gx, mask, NULL) < 0 ||
			    memcmp(mask, j->want[k], (size_t)j->words * sizeof *mask) != 0)
				j->bad++;
		}
	free(mask);
	return NULL;
}

static void
test_threads(void **state)
{
	static const char *const texts[] = { "", "{\"ke", "{\"key\": ", "{\"key\": [1, 2", "{\"a\": \"\xc3",
		"{\"a\": \"\xe2\x82", "{\"a\": {\"b\": tr", "{\"a\": \"x\"}", "{\"a\": [[], {\"\xc3\xa9\": -1.5e" };
	enum { N = ARRAY_LEN(texts), THREADS = 12 }; /* more threads than the index keeps spare scratch for */
	struct grammar *g = compile(json_grammar);
	struct vocab v = test_vocab();
	struct gram_vocab *gv;
	struct gram_index *gx;
	struct gram_state *st[N];
	uint32_t *want[N];
	struct mask_job jobs[THREADS];
	pthread_t th[THREADS];
	int words = (v.n + 31) / 32;

	(void)state;
	assert_int_equal(gram_vocab_new(v.n, (const char *const *)v.b, v.len, v.skip, v.end, &gv, NULL), 0);
	assert_int_equal(gram_index_new(g, gv, &gx, NULL), 0);
	for (int i = 0; i < (int)N; i++) {
		assert_int_equal(gram_state_new(g, &st[i], NULL), 0);
		assert_int_equal(gram_accept(st[i], texts[i], strlen(texts[i]), NULL), 0);
		want[i] = xmalloc((size_t)words * sizeof *want[i]);
		assert_true(gram_mask(st[i], gx, want[i], NULL) > 0);
	}
	for (int t = 0; t < THREADS; t++) {
		jobs[t] = (struct mask_job){ gx, st, want, (int)N, words, 0 };
		assert_int_equal(pthread_create(&th[t], NULL, mask_thread, &jobs[t]), 0);
	}
	for (int t = 0; t < THREADS; t++) {
		assert_int_equal(pthread_join(th[t], NULL), 0);
		assert_int_equal(jobs[t].bad, 0);
	}
	for (int i = 0; i < (int)N; i++)
		gram_state_free(st[i]), free(want[i]);
	gram_index_free(gx);
	gram_vocab_free(gv);
	vocab_free(&v);
	grammar_free(g);
}

/* A grammar this vocabulary cannot spell leaves an empty mask (the caller's error), not a hang. */
static void
test_empty_mask(void **state)
{
	struct grammar *g = compile("root ::= \"\\u4e2d\"");
	struct vocab v = { 0 };
	struct gram_vocab *gv;
	struct gram_index *gx;
	struct gram_state *s;
	uint32_t mask[1];

	(void)state;
	vocab_add(&v, "a", 1, 0, 0);
	vocab_add(&v, "b", 1, 0, 0);
	vocab_add(&v, "", 0, 0, 1);
	assert_int_equal(gram_vocab_new(v.n, (const char *const *)v.b, v.len, v.skip, v.end, &gv, NULL), 0);
	assert_int_equal(gram_index_new(g, gv, &gx, NULL), 0);
	assert_int_equal(gram_state_new(g, &s, NULL), 0);
	assert_int_equal(gram_mask(s, gx, mask, NULL), 0);
	assert_int_equal(mask[0], 0);
	gram_state_free(s);
	gram_index_free(gx);
	gram_vocab_free(gv);
	vocab_free(&v);
	grammar_free(g);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_syntax),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_reject_keeps_state),
		cmocka_unit_test(test_depth),
		cmocka_unit_test(test_ambiguous),
		cmocka_unit_test(test_masks),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_empty_mask),
	};

	rng_state = test_seed("test_grammar", "TEST_GRAMMAR_SEED");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
