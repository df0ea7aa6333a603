/*
 * test_constrain.c: constrained decoding through the engine on a generated
 * model, on the CPU and, where there is a GPU, on CUDA (its draws on the
 * device, and its logits handed to the host sampler): sampled output
 * always matches its grammar and ends when the grammar does; greedy output
 * under a grammar that the unconstrained greedy output already matches is
 * that output, also beside an unconstrained sequence in the same steps; a
 * grammar that leaves no token ends its sequence with an error; grammars
 * are shared by text; log-probabilities and the most likely tokens are
 * those of the masked distribution.
 */
#include "config.h"
#include "engine.h"
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

/* The backends to run on: the CPU, and CUDA drawing on the device or handing its logits out. */
static const struct dev {
	const char *name, *device;
	int host_picks;
} devs[] = { { "cpu", "cpu", 0 }, { "cuda", "cuda", 0 }, { "cuda, host sampling", "cuda", 1 } };

/* An engine on d, or NULL (saying why) when there is no such device. */
static struct engine *
open_on(const struct dev *d)
{
	struct engine_opts o = { .device = d->device, .n_threads = 2, .n_ctx = 256, .kv_tokens = 2048,
		.max_step_tokens = 64 };
	struct engine *e;
	char err[ERR_LEN];

	setenv("RESIDENT_HOST_SAMPLING", d->host_picks ? "1" : "0", 1);
	if (engine_open(tiny_path, &o, &e, err) != 0) {
		if (strcmp(d->device, "cpu") == 0)
			fail_msg("%s", err);
		print_message("[  SKIP    ] %s: %s\n", d->name, err);
		return NULL;
	}
	return e;
}

static void
params(struct seq_params *p, float temperature, uint64_t seed, int max_tokens, struct cons_gram *g)
{
	memset(p, 0, sizeof *p);
	sample_params_default(&p->sample);
	p->sample.temperature = temperature;
	p->sample.top_k = temperature > 0 ? 40 : 0;
	p->sample.seed = seed;
	p->max_tokens = max_tokens;
	p->grammar = g;
}

static const int32_t prompt[] = { 5, 77, 300, 12, 901, 44, 3 };
#define NP ((int32_t)ARRAY_LEN(prompt))

/* Steps the sequences together until all are done. */
static void
run_all(struct engine *e, struct seq **s, int n)
{
	char err[ERR_LEN];
	int left;

	do {
		assert_true(engine_step(e, s, n, -1, err) >= 0);
		left = 0;
		for (int i = 0; i < n; i++)
			left += s[i]->state != SEQ_DONE;
	} while (left > 0);
}

/* The raw bytes of a sequence's first n generated tokens (end tokens left out), malloc'd and NUL-terminated. */
static char *
raw_tokens(struct engine *e, const struct seq *s, int32_t n)
{
	const struct tokenizer *t = engine_model(e)->tok;
	struct strbuf b = { 0 };
	size_t len;

	strbuf_add(&b, "", 0);
	for (int32_t i = s->turn_start; i < s->turn_start + n; i++) {
		const char *bytes = tok_bytes(t, s->tokens[i], &len);

		if (!tok_is_eog(t, s->tokens[i]))
			strbuf_add(&b, bytes, len);
	}
	return b.s;
}

static char *
raw_output(struct engine *e, const struct seq *s)
{
	return raw_tokens(e, s, s->n_generated);
}

#define RECORD "root ::= \"{\\\"n\\\": \" [1-9] [0-9]{0,2} \", \\\"s\\\": \\\"\" [a-z]{1,6} \"\\\"}\""
#define RECORD_RE "^\\{\"n\": [1-9][0-9]{0,2}, \"s\": \"[a-z]{1,6}\"\\}$"

/* Sampled hot (temperature 1.5), every output matches and ends with its grammar, its text what the tokens say. */
static void
test_sampled_matches(void **state)
{
	regex_t re;

	assert_int_equal(regcomp(&re, RECORD_RE, REG_EXTENDED | REG_NOSUB), 0);
	for (size_t d = 0; d < ARRAY_LEN(devs); d++) {
		struct engine *e = open_on(&devs[d]);
		struct cons_gram *g;

		if (e == NULL)
			continue;
		g = tiny_grammar(e, RECORD);
		for (uint64_t seed = 1; seed <= 12; seed++) {
			struct seq_params p;
			struct seq *s[4];
			char err[ERR_LEN];

			for (int i = 0; i < 4; i++) {
				params(&p, 1.5f, seed * 10 + (uint64_t)i, 60, g);
				p.logprobs = i == 3; /* a draw the device makes with its log-probability */
				assert_int_equal(engine_seq_new(e, prompt, NP - i, &p, &s[i], err), 0);
			}
			run_all(e, s, 4);
			for (int i = 0; i < 4; i++) {
				char *raw = raw_output(e, s[i]);

				if (regexec(&re, raw, 0, NULL, 0) != 0 || s[i]->finish != FINISH_STOP)
					fail_msg("%s, seed %llu, sequence %d: \"%s\" (finish %s: %s)", devs[d].name,
					    (unsigned long long)seed, i, raw, engine_finish_name(s[i]->finish), s[i]->error);
				assert_string_equal(s[i]->out.part[CHAT_PART_ANSWER].text, raw);
				free(raw);
				engine_seq_free(e, s[i]);
			}
		}
		engine_grammar_put(e, g);
		engine_close(e);
	}
	regfree(&re);
}

/* A grammar of exactly this text: a literal, with the grammar's escapes where it needs them. */
static char *
literal_grammar(const char *text)
{
	struct strbuf b = { 0 };

	strbuf_cat(&b, "root ::= \"");
	for (const char *c = text; *c; c++)
		if (*c == '"' || *c == '\\')
			strbuf_printf(&b, "\\%c", *c);
		else if ((unsigned char)*c < 0x20)
			strbuf_printf(&b, "\\x%02x", (unsigned char)*c);
		else
			strbuf_add(&b, c, 1);
	strbuf_cat(&b, "\"");
	return b.s;
}

/*
 * Greedy under a grammar that allows just what greedy decoding writes
 * anyway: the same tokens (no allowed token was left out of a mask), the
 * output ending where the grammar does; an unconstrained sequence in the
 * same steps writes what it writes alone.
 */
static void
test_greedy_unchanged(void **state)
{
	for (size_t d = 0; d < ARRAY_LEN(devs); d++) {
		struct engine *e = open_on(&devs[d]);
		struct seq_params p;
		struct seq *s[2];
		char err[ERR_LEN], *free_text, *lit;
		struct cons_gram *g;
		int32_t n_free, pr[NP];

		if (e == NULL)
			continue;
		memcpy(pr, prompt, sizeof pr);
		/* a prompt whose greedy output is whole UTF-8 for long enough (a grammar's literal is characters) */
		for (int32_t first = 0;; first++) {
			params(&p, 0, 0, 24, NULL);
			pr[0] = first;
			assert_int_equal(engine_seq_new(e, pr, NP, &p, &s[0], err), 0);
			run_all(e, s, 1);
			for (n_free = s[0]->n_generated; n_free > 0; n_free--) {
				free_text = raw_tokens(e, s[0], n_free);
				if (utf8_valid(free_text, strlen(free_text)))
					break;
				free(free_text);
			}
			if (n_free >= 8)
				break;
			if (n_free > 0)
				free(free_text);
			engine_seq_free(e, s[0]);
			assert_true(first < 1000);
		}
		print_message("prompt %d: %d tokens\n", pr[0], n_free);
		engine_seq_free(e, s[0]);

		lit = literal_grammar(free_text);
		g = tiny_grammar(e, lit);
		params(&p, 0, 0, 40, g);
		assert_int_equal(engine_seq_new(e, pr, NP, &p, &s[0], err), 0);
		params(&p, 0, 0, n_free, NULL);
		assert_int_equal(engine_seq_new(e, pr, NP, &p, &s[1], err), 0);
		engine_grammar_put(e, g); /* the sequence holds it */
		run_all(e, s, 2);
		for (int i = 0; i < 2; i++) {
			char *raw = raw_output(e, s[i]);

			if (strcmp(raw, free_text) != 0)
				fail_msg("%s, %s sequence: \"%s\", alone unconstrained \"%s\"", devs[d].name,
				    i == 0 ? "constrained" : "free", raw, free_text);
			free(raw);
		}
		assert_int_equal(s[0]->finish, FINISH_STOP);
		assert_int_equal(s[0]->n_generated, n_free);
		engine_seq_free(e, s[0]);
		engine_seq_free(e, s[1]);
		free(lit);
		free(free_text);
		engine_close(e);
	}
}

/* A grammar whose second character no text can be: the sequence ends with the request's error, and the next goes on. */
static void
test_no_token_left(void **state)
{
	for (size_t d = 0; d < ARRAY_LEN(devs); d++) {
		struct engine *e = open_on(&devs[d]);
		struct seq_params p;
		struct seq *s[2];
		char err[ERR_LEN];
		struct cons_gram *g;

		if (e == NULL)
			continue;
		g = tiny_grammar(e, "root ::= \"a\" [^\\x00-\\U0010FFFF]");
		params(&p, 0.7f, 3, 20, g);
		assert_int_equal(engine_seq_new(e, prompt, NP, &p, &s[0], err), 0);
		params(&p, 0, 0, 8, NULL);
		assert_int_equal(engine_seq_new(e, prompt, NP, &p, &s[1], err), 0);
		run_all(e, s, 2);
		assert_int_equal(s[0]->finish, FINISH_ERROR);
		assert_true(s[0]->req_error);
		assert_non_null(strstr(s[0]->error, "grammar allows no token"));
		assert_int_equal(s[0]->n_generated, 1);
		assert_int_equal(s[1]->finish, FINISH_LENGTH);
		engine_seq_free(e, s[0]);
		engine_seq_free(e, s[1]);
		engine_grammar_put(e, g);
		engine_close(e);
	}
}

/*
 * With logprobs and 20 most likely tokens, greedy under a grammar: the
 * drawn token is the first of them, with its log-probability; they come
 * best first and weigh at most 1; at the first step every one the grammar
 * does not allow is -inf (only prefixes of the record's opening may come).
 */
static void
test_logprobs_masked(void **state)
{
	static const char open_text[] = "{\"n\": ";

	for (size_t d = 0; d < ARRAY_LEN(devs); d++) {
		struct engine *e = open_on(&devs[d]);
		const struct tokenizer *t;
		struct cons_gram *g;
		struct seq_params p;
		struct seq *s;
		char err[ERR_LEN];
		int step = 0;

		if (e == NULL)
			continue;
		t = engine_model(e)->tok;
		g = tiny_grammar(e, RECORD);
		params(&p, 0, 0, 30, g);
		p.logprobs = 1, p.top_logprobs = 20;
		assert_int_equal(engine_seq_new(e, prompt, NP, &p, &s, err), 0);
		engine_grammar_put(e, g);
		while (s->state != SEQ_DONE) {
			double mass = 0;

			assert_true(engine_step(e, &s, 1, -1, err) >= 0);
			if (s->new_token < 0)
				continue;
			assert_int_equal(s->n_top, 20);
			assert_int_equal(s->top_ids[0], s->new_token);
			assert_true(fabsf(s->top_lp[0] - s->new_logprob) <= 1e-6f);
			for (int i = 0; i < s->n_top; i++) {
				size_t len;
				const char *b = tok_bytes(t, s->top_ids[i], &len);

				assert_true(i == 0 || s->top_lp[i] <= s->top_lp[i - 1]);
				mass += exp(s->top_lp[i]);
				if (step == 0 && isfinite(s->top_lp[i]) && len <= strlen(open_text) &&
				    strncmp(b, open_text, len) != 0)
					fail_msg("%s: token %d (\"%.*s\") at %g where the grammar allows none", devs[d].name,
					    s->top_ids[i], (int)len, b, (double)s->top_lp[i]);
			}
			assert_true(mass <= 1 + 1e-4);
			step++;
		}
		assert_int_equal(s->finish, FINISH_STOP);
		engine_seq_free(e, s);
		engine_close(e);
	}
}

/* One text, one grammar; a bad text is refused with where it is wrong. */
static void
test_shared_by_text(void **state)
{
	struct engine *e = open_on(&devs[0]);
	struct cons_gram *a, *b, *c;
	char err[ERR_LEN];

	a = tiny_grammar(e, RECORD);
	b = tiny_grammar(e, RECORD);
	c = tiny_grammar(e, "root ::= [0-9]+");
	assert_ptr_equal(a, b);
	assert_ptr_not_equal(a, c);
	engine_grammar_put(e, c);
	assert_int_equal(engine_grammar(e, "root ::= (", 10, &c, err), ERR_INVAL);
	assert_non_null(strstr(err, "column"));
	engine_grammar_put(e, a);
	engine_grammar_put(e, b);
	engine_close(e);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sampled_matches),
		cmocka_unit_test(test_greedy_unchanged),
		cmocka_unit_test(test_no_token_left),
		cmocka_unit_test(test_logprobs_masked),
		cmocka_unit_test(test_shared_by_text),
	};

	return cmocka_run_group_tests(tests, tiny_model_setup, tiny_model_teardown);
}
