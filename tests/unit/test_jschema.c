/*
 * test_jschema.c: JSON Schema -> grammar (daemon/engine/jschema.c). Each
 * schema's grammar text is compiled by grammar.c and whole instances are
 * matched against it, fed at once and a byte at a time: those that
 * validate must be accepted in the spellings the header promises, and
 * those that do not (or are spelled otherwise) refused. Refusals name
 * the exact JSON pointer; hostile schemas are refused quickly; and a
 * seeded generator of random schemas of the supported subset, with
 * random valid instances of each, checks that every one is accepted.
 * TEST_JSCHEMA_SEED=N repeats a run.
 */
#include "config.h"
#include "jschema.h"
#include "grammar.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <limits.h>
#include <math.h>

static uint64_t rng_state;

static uint32_t
rng(void)
{
	rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 11);
}

/* A uniform integer in [0, n). */
static uint32_t
rnd(uint32_t n)
{
	return rng() % n;
}

static json_t *
parse(const char *text)
{
	json_error_t je;
	json_t *j = json_loads(text, JSON_DECODE_ANY, &je);

	if (j == NULL)
		fail_msg("bad test JSON (%s): %s", je.text, text);
	return j;
}

/* The grammar of schema s, compiled; the text into *text if not NULL. */
static struct grammar *
compile_json(const json_t *s, char **text)
{
	struct grammar *g;
	char err[ERR_LEN], *t;

	if (jschema_grammar(s, &t, err) != 0) {
		char *d = json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY);

		fail_msg("schema refused: %s\n%.2000s", err, d);
	}
	if (grammar_compile(t, strlen(t), &g, err) != 0)
		fail_msg("grammar refused: %s\n%s", err, t);
	if (text != NULL)
		*text = t;
	else
		free(t);
	return g;
}

/* 1 if text, fed in pieces of at most piece bytes, is a whole match of g. */
static int
matches(const struct grammar *g, const char *text, size_t n, size_t piece)
{
	struct gram_state *s;
	char err[ERR_LEN];
	int ok = 1;

	if (gram_state_new(g, &s, err) != 0)
		fail_msg("no state: %s", err);
	for (size_t i = 0; i < n && ok; i += piece)
		ok = gram_accept(s, text + i, MIN(piece, n - i), err) == 0;
	if (!ok && strstr(err, "positions at once") != NULL)
		fail_msg("the grammar overflowed on '%s': %s", text, err);
	ok = ok && gram_complete(s);
	gram_state_free(s);
	return ok;
}

static int
matches_both(const struct grammar *g, const char *text)
{
	size_t n = strlen(text);
	int whole = matches(g, text, n, n + 1), bytes = matches(g, text, n, 1);

	if (whole != bytes)
		fail_msg("'%s' matched %d whole but %d a byte at a time", text, whole, bytes);
	return whole;
}

/* Each of yes is accepted by schema's grammar, none of no. */
static void
check(const char *schema, const char *const *yes, const char *const *no)
{
	json_t *s = parse(schema);
	char *text;
	struct grammar *g = compile_json(s, &text);

	for (; *yes != NULL; yes++)
		if (!matches_both(g, *yes))
			fail_msg("'%s' should match %s\n%s", *yes, schema, text);
	for (; no != NULL && *no != NULL; no++)
		if (matches_both(g, *no))
			fail_msg("'%s' should not match %s\n%s", *no, schema, text);
	grammar_free(g);
	free(text);
	json_decref(s);
}

#define YES(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define NO(...) ((const char *const[]){ __VA_ARGS__, NULL })
#define NONE ((const char *const[]){ NULL })

/* schema (a json_t, taken) is refused with code, err starting with what. */
static void
refused_json(json_t *s, int code, const char *what)
{
	char err[ERR_LEN] = "", *t = NULL;
	int rc = jschema_grammar(s, &t, err);

	if (rc != code || t != NULL || strncmp(err, what, strlen(what)) != 0)
		fail_msg("expected %d '%s...', got %d '%s'", code, what, rc, err);
	json_decref(s);
}

static void
refused(const char *schema, int code, const char *what)
{
	refused_json(parse(schema), code, what);
}

static void
test_scalars(void **state)
{
	(void)state;
	check("{\"type\":\"null\"}", YES("null"), NO("nul", "null ", " null", "0", "\"null\""));
	check("{\"type\":\"boolean\"}", YES("true", "false"), NO("null", "True", "1"));
	check("{\"type\":[\"boolean\",\"null\"]}", YES("true", "null"), NO("0", "\"\""));
	check("true", YES("1", "{\"a\":[1,{},\"x\"]}", "null", "-2.5e+3", "\"\\u00e9\""), NO("", "nul", "{a:1}", "01"));
	check("{}", YES("[]", "false", "{ \"a\" :\n  1 }"), NO("[1,]", "\"\\x\""));
	check("{\"title\":\"t\",\"description\":\"d\",\"$comment\":\"c\",\"default\":1,\"examples\":[2],"
	    "\"deprecated\":false,\"readOnly\":true,\"writeOnly\":false,\"$schema\":\"x\",\"$id\":\"y\"}",
	    YES("1", "\"s\""), NO("x"));
	check("false", NONE, NO("null", "1", "{}", ""));
	check("{\"type\":\"integer\"}", YES("0", "-0", "17", "-123456789012345678901234"),
	    NO("1.0", "01", "1e3", "+1", "-"));
	check("{\"type\":\"number\"}", YES("0", "-0.5", "1e3", "2.5E-07", "12"), NO(".5", "1.", "1e", "--1", "0x1"));
	check("{\"type\":[\"integer\",\"number\"]}", YES("1", "1.5"), NO("a"));
	check("{\"type\":\"string\"}",
	    YES("\"\"", "\"a b\"", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\u00e9\\u20AC\"", "\"\\ud83d\\ude00\"",
	    "\"\xc3\xa9\"", "\"\xf0\x9f\x98\x80\""),
	    NO("\"", "\"\\u0000\"", "\"\\ud83d\"", "\"\\ude00\"", "\"\\ud83d\\u0041\"", "\"\\x41\"", "\"a\nb\"",
	    "\"\t\"", "'a'"));
	/* without type: the types whose keywords appear */
	check("{\"minimum\":0}", YES("0", "1.5", "7"), NO("-1", "\"a\"", "null", "[]"));
	check("{\"minLength\":2}", YES("\"ab\""), NO("\"a\"", "12", "true"));
	check("{\"maxItems\":1,\"minimum\":3}", YES("[]", "[1]", "3", "4.5"), NO("[1,2]", "2", "\"x\""));
	check("{\"required\":[\"a\"]}", YES("{\"a\":1}"), NO("{}", "[]"));
}

static void
test_objects(void **state)
{
	(void)state;
	check("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
	    "\"required\":[\"a\"]}",
	    YES("{\"a\":1}", "{\"a\":1,\"b\":\"x\"}", "{ \"a\" : 1 , \"b\" : \"x\" }",
	    "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"),
	    NO("{}", "{\"b\":\"x\"}", "{\"b\":\"x\",\"a\":1}", "{\"a\":1,\"c\":2}", "{\"a\":\"1\"}", "{\"a\":1,}",
	    "{\"a\":1 \"b\":\"x\"}", "{\"a\":1,\"a\":1}", "{\"\\u0061\":1}"));
	/* nested, all optional */
	check("{\"properties\":{\"p\":{\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"type\":\"number\"}},"
	    "\"required\":[\"y\"]},\"q\":{\"type\":\"boolean\"},\"r\":{\"type\":\"null\"}}}",
	    YES("{}", "{\"p\":{\"y\":2}}", "{\"p\":{\"x\":1,\"y\":2},\"r\":null}", "{\"q\":true}",
	    "{\"q\":false,\"r\":null}", "{\"p\":{\"x\":1.5,\"y\":-2},\"q\":true,\"r\":null}"),
	    NO("{\"p\":{}}", "{\"p\":{\"x\":1}}", "{\"r\":null,\"q\":true}", "{,}", "{\"q\":true,}", "{\"s\":1}"));
	check("{\"properties\":{\"a\":{}},\"additionalProperties\":false}", YES("{}", "{\"a\":[1]}"),
	    NO("{\"b\":1}", "{\"a\":1,\"b\":1}"));
	check("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
	    YES("{\"a\":1,\"b\":[1]}", "{\"b\":\"x\",\"c\":null}", "{\"ab\":1}", "{\"\":1}", "{\"A\":1}", "{\"a1\":{}}",
	    "{}"),
	    NO("{\"a\":1,\"a\":2}", "{\"b\":1,\"a\":2}", "{\"a\":\"x\"}", "{\"\\u0062\":1}", "{\"a\\\"\":1}"));
	check("{\"properties\":{\"id\":{\"type\":\"integer\"},\"idx\":{}},\"required\":[\"id\"],"
	    "\"additionalProperties\":{\"type\":\"string\"}}",
	    YES("{\"id\":1,\"x\":\"y\"}", "{\"id\":1,\"i\":\"a\",\"idd\":\"b\",\"x\":\"c\",\"idxx\":\"d\",\"\":\"e\"}",
	    "{\"id\":1,\"idx\":2}"),
	    NO("{\"id\":1,\"x\":1}", "{\"id\":1,\"id\":\"s\"}", "{\"id\":1,\"idx\":2,\"idx\":\"s\"}", "{\"x\":\"y\"}"));
	/* required names missing from properties take additionalProperties */
	check("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"b\",\"b\"],"
	    "\"additionalProperties\":{\"type\":\"boolean\"}}",
	    YES("{\"b\":true}", "{\"a\":1,\"b\":false}", "{\"a\":1,\"b\":false,\"c\":true}"),
	    NO("{\"a\":1}", "{\"b\":1}", "{\"b\":true,\"b\":true}", "{\"b\":true,\"a\":1}"));
	check("{\"required\":[\"x\",\"y\"]}", YES("{\"x\":1,\"y\":[]}", "{\"x\":{\"y\":1},\"y\":null}"),
	    NO("{\"y\":1,\"x\":2}", "{\"x\":1}", "{\"x\":1,\"y\":2,\"z\":3}"));
	check("{\"properties\":{\"a\":false,\"b\":{}},\"additionalProperties\":true}",
	    YES("{\"b\":1}", "{\"c\":1}", "{}"),
	    NO("{\"a\":1}", "{\"b\":1,\"a\":1}"));
	check("{\"properties\":{\"a\":false},\"required\":[\"a\"]}", NONE, NO("{}", "{\"a\":1}"));
	check("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", YES("{}", "{\"a\":1,\"b\":2}"),
	    NO("{\"a\":\"x\"}"));
	check("{\"type\":\"object\",\"additionalProperties\":false}", YES("{}", "{ }"), NO("{\"a\":1}"));
	/* keys as jansson spells them */
	check("{\"properties\":{\"a\\\"b\":{},\"\xc3\xa9\":{},\"\\n\":{},\"\\u0001\":{}},\"required\":[\"a\\\"b\"]}",
	    YES("{\"a\\\"b\":1}", "{\"a\\\"b\":1,\"\xc3\xa9\":2,\"\\n\":3,\"\\u0001\":4}"),
	    NO("{\"a\\u0022b\":1}", "{\"a\\\"b\":1,\"\\u00e9\":2}", "{\"a\\\"b\":1,\"\\u000a\":3}"));
	check("{\"type\":\"object\"}", YES("{}", "{\"\\u00e9\":{\"b\":[]}}", "{\"a\":1,\"a\":2}"), NO("{1:2}", "[]"));
}

static void
test_enum_const(void **state)
{
	(void)state;
	check("{\"enum\":[\"red\",\"green\",1,null,[1,2],{\"a\":1},true,1.5,-3]}",
	    YES("\"red\"", "\"green\"", "1", "null", "[1,2]", "{\"a\":1}", "true", "1.5", "-3"),
	    NO("\"blue\"", "\"re\"", "\"redd\"", "1.0", "[1, 2]", "{\"a\": 1}", "2", "false", "3"));
	check("{\"const\":\"x\"}", YES("\"x\""), NO("\"y\"", "x"));
	check("{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}", YES("\"a\"", "\"b\""), NO("1"));
	check("{\"type\":\"integer\",\"enum\":[\"a\",1,2.0,2.5]}", YES("1", "2.0"), NO("2.5", "\"a\"", "2"));
	check("{\"enum\":[1,2,3],\"const\":2}", YES("2"), NO("1", "3"));
	check("{\"enum\":[\"ab\",\"abc\",\"a\",\"b\",\"abd\"]}", YES("\"ab\"", "\"abc\"", "\"a\"", "\"b\"", "\"abd\""),
	    NO("\"abcd\"", "\"\"", "\"ac\"", "\"abe\""));
	check("{\"enum\":[\"\xc3\xa9\",\"a\\nb\",\"\\u0001\\\\\"]}",
	    YES("\"\xc3\xa9\"", "\"a\\nb\"", "\"\\u0001\\\\\""),
	    NO("\"\\u00e9\"", "\"a\\u000ab\""));
	check("{\"const\":{\"k\":[true,{\"z\":null}]},\"title\":\"t\"}", YES("{\"k\":[true,{\"z\":null}]}"),
	    NO("{\"k\":[true,{\"z\":null}] }", "{\"k\":[true]}"));
}

static void
test_arrays(void **state)
{
	(void)state;
	check("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
	    YES("[1]", "[1,2,3]", "[ 1 , 2 ]", "[\n 1,\n 2\n]"),
	    NO("[]", "[1,2,3,4]", "[1,\"a\"]", "[1,]", "[,1]", "[1 2]"));
	check("{\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}",
	    YES("[]", "[\"a\"]", "[\"a\",1]"), NO("[\"a\",1,2]", "[1]", "[\"a\",\"b\"]"));
	check("{\"prefixItems\":[{\"const\":\"x\"}],\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":4}",
	    YES("[\"x\",true]", "[\"x\",true,false,true]", "[ \"x\" , true ]"),
	    NO("[\"x\"]", "[\"x\",true,false,true,false]", "[true,true]", "[]"));
	check("{\"prefixItems\":[{\"type\":\"null\"},{},{}],\"maxItems\":2}", YES("[]", "[null]", "[null,2]"),
	    NO("[null,2,3]", "[1]"));
	check("{\"prefixItems\":[{\"type\":\"null\"},{\"type\":\"null\"}],\"minItems\":1}",
	    YES("[null]", "[null,null]", "[null,null,{}]"),
	    NO("[]", "[1]"));
	check("{\"prefixItems\":[{}],\"items\":false,\"minItems\":2}", NONE, NO("[]", "[1]", "[1,2]"));
	check("{\"type\":\"array\",\"maxItems\":0}", YES("[]", "[ ]"), NO("[1]"));
	check("{\"minItems\":2,\"uniqueItems\":false}", YES("[1,1]", "[[],{}]"), NO("[1]", "[]"));
	check("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":1}}",
	    YES("[]", "[[]]", "[[\"a\"],[]]"), NO("[[\"a\",\"b\"]]", "[[1]]"));
	check("{\"type\":\"array\",\"items\":true,\"minItems\":1000}", NONE, NO("[]"));
}

static void
test_combinators(void **state)
{
	(void)state;
	check("{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\",\"minimum\":5}]}", YES("\"a\"", "5", "50"),
	    NO("4", "null", "5.5"));
	check("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", YES("\"a\"", "null"), NO("1"));
	check("{\"oneOf\":[{\"enum\":[1,2]},{\"enum\":[3,\"a\"]},{\"const\":[1]}]}", YES("1", "3", "\"a\"", "[1]"),
	    NO("4"));
	check("{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"cat\"},"
	    "\"lives\":{\"type\":\"integer\"}},"
	    "\"required\":[\"kind\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"dog\",\"wolf\"]},"
	    "\"bark\":{\"type\":\"boolean\"}},\"required\":[\"kind\"]},{\"type\":\"string\"}]}",
	    YES("{\"kind\":\"cat\",\"lives\":9}", "{\"kind\":\"dog\"}", "{\"kind\":\"wolf\",\"bark\":true}", "\"s\""),
	    NO("{\"kind\":\"cat\",\"bark\":true}", "{}", "{\"kind\":\"cow\"}"));
	/* branches through $ref, a discriminator through $ref too */
	check("{\"$defs\":{\"k1\":{\"const\":1},\"a\":{\"properties\":{\"k\":{\"$ref\":\"#/$defs/k1\"}},"
	    "\"required\":[\"k\"]},"
	    "\"b\":{\"properties\":{\"k\":{\"const\":2}},\"required\":[\"k\"]}},"
	    "\"oneOf\":[{\"$ref\":\"#/$defs/a\"},{\"$ref\":\"#/$defs/b\"}]}",
	    YES("{\"k\":1}", "{\"k\":2}"), NO("{\"k\":3}"));
	check("{\"allOf\":[{\"description\":\"x\"},{\"type\":\"integer\"},true]}", YES("1"), NO("\"a\""));
	check("{\"allOf\":[true,{\"title\":\"only annotations\"}]}", YES("1", "[]"), NONE);
	check("{\"anyOf\":[false,{\"type\":\"null\"}]}", YES("null"), NO("1"));
	check("{\"oneOf\":[false,{}]}", YES("null", "1"), NONE);
}

static void
test_refs(void **state)
{
	(void)state;
	check("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
	    "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"value\"],"
	    "\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
	    YES("{\"value\":1}", "{\"value\":1,\"children\":[]}", "{\"value\":1,\"children\":[{\"value\":2},"
	    "{\"value\":3,\"children\":[{\"value\":4,\"children\":[]}]}]}"),
	    NO("{\"children\":[]}", "{\"value\":1,\"children\":[{}]}",
	    "{\"value\":1,\"children\":[{\"value\":\"x\"}]}"));
	check("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", YES("[]", "[[],[[]]]", "[[[[[[]]]]]]"),
	    NO("[1]", "[[1]]"));
	check("{\"definitions\":{\"a/b\":{\"type\":\"null\"},\"c~d\":{\"type\":\"boolean\"},\"e f\":{\"const\":1}},"
	    "\"anyOf\":[{\"$ref\":\"#/definitions/a~1b\"},{\"$ref\":\"#/definitions/c~0d\"},"
	    "{\"$ref\":\"#/definitions/e%20f\"}]}",
	    YES("null", "true", "1"), NO("2"));
	check("{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\",\"items\":{\"$ref\":\"#/anyOf/0\"}}]}",
	    YES("null", "[null,null]"), NO("[[]]"));
	/* a linked list through properties */
	check("{\"$defs\":{\"l\":{\"anyOf\":[{\"type\":\"null\"},{\"properties\":{\"h\":{\"type\":\"integer\"},"
	    "\"t\":{\"$ref\":\"#/$defs/l\"}},"
	    "\"required\":[\"h\",\"t\"]}]}},\"$ref\":\"#/$defs/l\"}",
	    YES("null", "{\"h\":1,\"t\":{\"h\":2,\"t\":null}}"), NO("{\"h\":1}", "{\"h\":1,\"t\":{\"h\":2}}"));
}

/* Every integer in windows around lo, hi (inclusive; INT64_MIN/MAX: none), 0 and a few inside, against schema. */
static void
int_window(const char *schema, int64_t lo, int64_t hi)
{
	json_t *s = parse(schema);
	char *text, num[32];
	struct grammar *g = compile_json(s, &text);
	int64_t centre[5] = { lo, hi, 0, lo / 2 + hi / 2, lo / 2 + hi / 2 + (int64_t)rnd(1000) - 500 };

	for (int k = 0; k < 5; k++)
		for (int64_t d = -40; d <= 40; d++) {
			int64_t v;
			int want;

			if (__builtin_add_overflow(centre[k], d, &v))
				continue;
			want = v >= lo && v <= hi;
			snprintf(num, sizeof num, "%lld", (long long)v);
			if (matches_both(g, num) != want)
				fail_msg("%s: %s should %smatch\n%s", schema, num, want ? "" : "not ", text);
		}
	if (hi == INT64_MAX && !matches_both(g, "123456789012345678901234567890"))
		fail_msg("%s: a huge integer should match\n%s", schema, text);
	if (lo == INT64_MIN && !matches_both(g, "-123456789012345678901234567890"))
		fail_msg("%s: a huge negative integer should match\n%s", schema, text);
	if (hi != INT64_MAX && lo != INT64_MIN &&
	    (matches_both(g, "1.0") || matches_both(g, "1e0") || matches_both(g, "01")))
		fail_msg("%s: a spelling not an integer's matched\n%s", schema, text);
	grammar_free(g);
	free(text);
	json_decref(s);
}

static void
test_integers(void **state)
{
	char schema[256];

	(void)state;
	int_window("{\"type\":\"integer\",\"minimum\":-15,\"exclusiveMaximum\":250}", -15, 249);
	int_window("{\"type\":\"integer\",\"exclusiveMinimum\":-100,\"maximum\":-7}", -99, -7);
	int_window("{\"type\":\"integer\",\"minimum\":7,\"maximum\":100}", 7, 100);
	int_window("{\"type\":\"integer\",\"minimum\":-123,\"maximum\":-123}", -123, -123);
	int_window("{\"type\":\"integer\",\"minimum\":0,\"maximum\":0}", 0, 0);
	int_window("{\"type\":\"integer\",\"minimum\":9,\"maximum\":10}", 9, 10);
	int_window("{\"type\":\"integer\",\"minimum\":99,\"maximum\":1000}", 99, 1000);
	int_window("{\"type\":\"integer\",\"minimum\":-1000,\"maximum\":1000}", -1000, 1000);
	int_window("{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":7.9}", 2, 7);
	int_window("{\"type\":\"integer\",\"exclusiveMinimum\":-1.5,\"exclusiveMaximum\":2.0}", -1, 1);
	int_window("{\"type\":\"integer\",\"minimum\":3,\"exclusiveMinimum\":true,\"maximum\":8,"
	    "\"exclusiveMaximum\":true}", 4, 7);
	int_window("{\"type\":\"integer\",\"minimum\":3,\"exclusiveMinimum\":false,\"maximum\":8}", 3, 8);
	int_window("{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":5}", 6, INT64_MAX);
	int_window("{\"type\":\"integer\",\"exclusiveMinimum\":2,\"minimum\":6}", 6, INT64_MAX);
	int_window("{\"type\":\"integer\",\"minimum\":-37}", -37, INT64_MAX);
	int_window("{\"type\":\"integer\",\"exclusiveMaximum\":-37}", INT64_MIN, -38);
	int_window("{\"type\":\"integer\",\"maximum\":5}", INT64_MIN, 5);
	int_window("{\"type\":\"integer\",\"maximum\":0,\"exclusiveMinimum\":-1}", 0, 0);
	int_window("{\"type\":\"integer\",\"minimum\":123456789,\"maximum\":987654321}", 123456789, 987654321);
	int_window("{\"type\":\"integer\",\"minimum\":-9000000000000000000,\"maximum\":9000000000000000000}",
	    -9000000000000000000LL, 9000000000000000000LL);
	int_window("{\"type\":\"integer\",\"minimum\":1000000000000000000}", 1000000000000000000LL, INT64_MAX);
	for (int i = 0; i < 40; i++) { /* random ranges of every magnitude */
		int64_t a = (int64_t)(((uint64_t)rng() << 32 | rng()) % 9000000000000000000ULL), b;
		int da = 1 + (int)rnd(19), db = 1 + (int)rnd(19);

		for (int k = da; k < 19; k++)
			a /= 10;
		b = (int64_t)(((uint64_t)rng() << 32 | rng()) % 9000000000000000000ULL);
		for (int k = db; k < 19; k++)
			b /= 10;
		a = rnd(2) ? -a : a, b = rnd(3) == 0 ? -b : b;
		if (a > b) {
			int64_t t = a;

			a = b, b = t;
		}
		snprintf(schema, sizeof schema, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}",
		    (long long)a, (long long)b);
		int_window(schema, a, b);
	}
}

/* Spellings of numbers around the bounds: whole, with fractions; each matches exactly when within (lo, hi). */
static void
num_window(const char *schema, double lo, int lo_excl, double hi, int hi_excl)
{
	static const char *const fracs[] = { "", ".0", ".00", ".5", ".001", ".999", ".000001", ".10" };
	json_t *s = parse(schema);
	char *text, num[64];
	struct grammar *g = compile_json(s, &text);
	double centre[3] = { lo, hi, 0 };

	for (int k = 0; k < 3; k++)
		for (int d = -12; d <= 12; d++)
			for (size_t f = 0; f < ARRAY_LEN(fracs); f++) {
				double whole = centre[k] + d, v;
				int want;

				if (!(fabs(whole) < 1e15))
					continue;
				snprintf(num, sizeof num, "%s%.0f%s", whole < 0 ? "-" : "", fabs(whole), fracs[f]);
				v = strtod(num, NULL);
				if (v == 0 && num[0] == '-')
					continue; /* -0 is not generated */
				want = (lo_excl ? v > lo : v >= lo) && (hi_excl ? v < hi : v <= hi);
				if (matches_both(g, num) != want)
					fail_msg("%s: %s should %smatch\n%s", schema, num, want ? "" : "not ", text);
			}
	if (matches_both(g, "1e0") || matches_both(g, "0e1"))
		fail_msg("%s: an exponent matched\n%s", schema, text);
	grammar_free(g);
	free(text);
	json_decref(s);
}

static void
test_numbers(void **state)
{
	(void)state;
	num_window("{\"type\":\"number\",\"minimum\":-1,\"exclusiveMaximum\":3}", -1, 0, 3, 1);
	num_window("{\"type\":\"number\",\"exclusiveMinimum\":0}", 0, 1, INFINITY, 0);
	num_window("{\"type\":\"number\",\"maximum\":0}", -INFINITY, 0, 0, 0);
	num_window("{\"type\":\"number\",\"exclusiveMaximum\":0}", -INFINITY, 0, 0, 1);
	num_window("{\"type\":\"number\",\"exclusiveMinimum\":-5,\"exclusiveMaximum\":-2}", -5, 1, -2, 1);
	num_window("{\"type\":\"number\",\"minimum\":10,\"maximum\":10}", 10, 0, 10, 0);
	num_window("{\"type\":\"number\",\"minimum\":-20,\"maximum\":123.0}", -20, 0, 123, 0);
	num_window("{\"type\":\"number\",\"minimum\":-20,\"exclusiveMinimum\":true,\"maximum\":-3,"
	    "\"exclusiveMaximum\":true}",
	    -20, 1, -3, 1);
	num_window("{\"type\":\"number\",\"exclusiveMinimum\":7,\"exclusiveMaximum\":8}", 7, 1, 8, 1);
	num_window("{\"minimum\":-1000000,\"maximum\":99999}", -1000000, 0, 99999, 0);
}

static void
test_strings(void **state)
{
	(void)state;
	check("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
	    YES("\"ab\"", "\"\xc3\xa9\xe2\x82\xac\"", "\"a\xf0\x9f\x98\x80z\"", "\"\\u00e9\\ud83d\\ude00\"",
	    "\"\\n\\t\\\\\"", "\"a\\\"\""),
	    NO("\"a\"", "\"abcd\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"", "\"\\ud83d\\ude00\"",
	    "\"\xf0\x9f\x98\x80\"", "\"\""));
	check("{\"maxLength\":0}", YES("\"\""), NO("\"a\"", "\"\\u0041\""));
	check("{\"type\":\"string\",\"minLength\":1000}", NONE, NO("\"a\""));
	check("{\"type\":\"string\",\"minLength\":3}",
	    YES("\"abc\"", "\"\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97\"", "\"abcdefgh\""),
	    NO("\"\xe4\xb8\xad\xe6\x96\x87\""));
}

static void
test_patterns(void **state)
{
	(void)state;
	check("{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\\d{2,3}$\"}", YES("\"ab12\"", "\"z999\""),
	    NO("\"ab1\"", "\"ab1234\"", "\"AB12\"", "\"ab12x\"", "\"12\""));
	check("{\"pattern\":\"foo\"}", YES("\"foo\"", "\"xfooy\"", "\"afoo\"", "\"\\n\\\"foo\\\\\""),
	    NO("\"fo\"", "\"\"", "\"f\\u006fo\""));
	check("{\"pattern\":\"^a|b$\"}", YES("\"a\"", "\"axx\"", "\"b\"", "\"xxb\""), NO("\"xa\"", "\"bx\""));
	check("{\"pattern\":\"^(ab|cd)*e?$\"}", YES("\"\"", "\"ab\"", "\"abcd\"", "\"cde\"", "\"e\""),
	    NO("\"a\"", "\"abc\"", "\"ee\""));
	check("{\"pattern\":\"^(?<y>\\\\d{4})-(?:0[1-9]|1[0-2])$\"}", YES("\"2024-01\"", "\"1999-12\""),
	    NO("\"2024-13\"", "\"224-01\""));
	check("{\"pattern\":\"^a+?b*?c{2,}?$\"}", YES("\"aabcc\"", "\"accc\""), NO("\"bcc\"", "\"ac\""));
	check("{\"pattern\":\"^.$\"}",
	    YES("\"a\"", "\"\xc3\xa9\"", "\"\xf0\x9f\x98\x80\"", "\"\\\"\"", "\"\\t\"", "\"\\u0001\"", "\"\\u001F\""),
	    NO("\"\\n\"", "\"\\r\"", "\"\xe2\x80\xa8\"", "\"ab\"", "\"\""));
	check("{\"pattern\":\"^[^a-c]$\"}", YES("\"d\"", "\"\\\\\"", "\"\\u0001\"", "\"\\b\"", "\"\\u0008\""),
	    NO("\"a\"", "\"b\"", "\"\\u0062\""));
	check("{\"pattern\":\"^\\\\w\\\\s\\\\D\\\\S$\"}", YES("\"a x-\"", "\"_\xc2\xa0..\"", "\"Z\\tab\""),
	    NO("\"a 1x\"", "\"a x \"", "\"\xc3\xa9 xx\""));
	check("{\"pattern\":\"^[\\\\d\\\\s-]+$\"}", YES("\"1 2-3\""), NO("\"a\""));
	check("{\"pattern\":\"^\\\\.\\\\*\\\\u00e9\\\\x41\\\\/\\\\ud83d\\\\ude00$\"}",
	    YES("\".*\xc3\xa9" "A/\xf0\x9f\x98\x80\""), NO("\"a*\xc3\xa9" "A/\xf0\x9f\x98\x80\""));
	check("{\"pattern\":\"^\\\"\\\\\\\\$\"}", YES("\"\\\"\\\\\""), NO("\"\\\"\"", "\"\\\\\""));
	check("{\"pattern\":\"^a\\\\nb\\\\tc$\"}", YES("\"a\\nb\\tc\"", "\"a\\u000ab\\u0009c\"", "\"a\\u000Ab\\tc\""),
	    NO("\"a\nb\tc\"", "\"anbtc\""));
	check("{\"pattern\":\"^[]a]$\"}", NONE, NO("\"a\"", "\"]a\""));
	check("{\"pattern\":\"^[^]$\"}", YES("\"x\"", "\"\\n\""), NO("\"\""));
	check("{\"pattern\":\"^x{3}y{1,2}z{0}$\"}", YES("\"xxxy\"", "\"xxxyy\""),
	    NO("\"xxy\"", "\"xxxyyy\"", "\"xxxyz\""));
	check("{\"pattern\":\"^(a?){3}$\"}", YES("\"\"", "\"a\"", "\"aaa\""), NO("\"aaaa\""));
	check("{\"pattern\":\"^[\\\\b]}]$\"}", YES("\"\\b}]\""), NO("\"b}]\""));
	check("{\"pattern\":\"\"}", YES("\"\"", "\"anything\""), NONE);
	check("{\"pattern\":\"^$\"}", YES("\"\""), NO("\"a\""));
}

static void
test_formats(void **state)
{
	(void)state;
	check("{\"format\":\"date\"}",
	    YES("\"2024-02-29\"", "\"2023-02-28\"", "\"2000-02-29\"", "\"0004-02-29\"", "\"1999-12-31\"",
	    "\"2024-04-30\"", "\"0001-01-01\"", "\"9999-12-31\"", "\"2400-02-29\""),
	    NO("\"2023-02-29\"", "\"1900-02-29\"", "\"2100-02-29\"", "\"2024-04-31\"", "\"2024-13-01\"",
	    "\"0000-01-01\"", "\"2024-1-01\"", "\"2024-02-30\"", "\"2024-00-10\"", "\"2024-01-00\"", "\"0000-02-29\""));
	check("{\"type\":\"string\",\"format\":\"time\"}",
	    YES("\"23:59:59Z\"", "\"00:00:00.123+05:30\"", "\"12:00:00-00:00\""),
	    NO("\"24:00:00Z\"", "\"23:60:00Z\"", "\"23:59:60Z\"", "\"12:00:00z\"", "\"12:00:00\"", "\"12:00:00.Z\"",
	    "\"12:00:00+24:00\""));
	check("{\"format\":\"date-time\"}", YES("\"2024-02-29T23:59:59.5Z\"", "\"1970-01-01T00:00:00+01:00\""),
	    NO("\"2024-02-29t23:59:59Z\"", "\"2024-02-29 23:59:59Z\"", "\"2023-02-29T00:00:00Z\""));
	check("{\"format\":\"uuid\"}",
	    YES("\"123e4567-e89b-12d3-a456-426614174000\"", "\"123E4567-E89B-12D3-A456-426614174000\""),
	    NO("\"123e4567e89b-12d3-a456-426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\"",
	    "\"g23e4567-e89b-12d3-a456-426614174000\""));
}

static void
test_whitespace(void **state)
{
	char text[64];

	(void)state;
	snprintf(text, sizeof text, "[\n%*s1]", JSCHEMA_MAX_INDENT, "");
	check("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}",
	    YES("[1,2]", "[ 1 ]", "[\n\t1\n]", "[\t1,\n  2\t]", text),
	    NO(" [1]", "[1] ", "[  1]", "[1\r\n]", "[\n\n1]", "[ \n1]"));
	snprintf(text, sizeof text, "[\n%*s1]", JSCHEMA_MAX_INDENT + 1, "");
	check("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}", NONE, NO(text));
	snprintf(text, sizeof text, "{\n%*s\"a\"\n:\t1\n}", JSCHEMA_MAX_INDENT, "");
	check("{\"properties\":{\"a\":{}},\"additionalProperties\":false}", YES(text, "{ }", "{\"a\" : 1 }"),
	    NO("{  }", "{\"a\"  :1}", " {}", "{} "));
	check("{}", YES("{\n \"a\": [\n  1\n ]\n}"), NO("{\"a\": [1 ]  }", "\n{}"));
}

static void
test_refusals(void **state)
{
	(void)state;
	refused("{\"type\":\"string\",\"format\":\"email\"}", ERR_UNSUPPORTED, "json_schema at /format: ");
	refused("{\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"email\"}}}", ERR_UNSUPPORTED,
	    "json_schema at /properties/when/format: ");
	refused("{\"type\":\"object\",\"patternProperties\":{}}", ERR_UNSUPPORTED,
	    "json_schema at /patternProperties: ");
	refused("{\"properties\":{\"a/b~\":{\"multipleOf\":2}}}", ERR_UNSUPPORTED,
	    "json_schema at /properties/a~1b~0/multipleOf: ");
	refused("{\"items\":{\"not\":{}}}", ERR_UNSUPPORTED, "json_schema at /items/not: ");
	refused("{\"type\":\"strin\"}", ERR_INVAL, "json_schema at /type: ");
	refused("{\"type\":[]}", ERR_INVAL, "json_schema at /type: ");
	refused("{\"$ref\":\"#/$defs/missing\"}", ERR_INVAL, "json_schema at /$ref: a $ref to nothing");
	refused("{\"$ref\":\"other.json#/a\"}", ERR_UNSUPPORTED, "json_schema at /$ref: ");
	refused("{\"$ref\":\"#anchor\"}", ERR_UNSUPPORTED, "json_schema at /$ref: ");
	refused("{\"$defs\":{\"a\":{}},\"$ref\":\"#/$defs/a\",\"type\":\"string\"}", ERR_UNSUPPORTED,
	    "json_schema at /type: $ref stands alone");
	refused("{\"anyOf\":[{}],\"oneOf\":[{}]}", ERR_UNSUPPORTED, "json_schema at /oneOf: anyOf stands alone");
	refused("{\"anyOf\":[]}", ERR_INVAL, "json_schema at /anyOf: ");
	refused("{\"enum\":[1],\"minimum\":0}", ERR_UNSUPPORTED, "json_schema at /minimum: enum and const");
	refused("{\"enum\":[]}", ERR_INVAL, "json_schema at /enum: ");
	refused("{\"type\":\"string\",\"enum\":[1]}", ERR_INVAL, "json_schema at /enum: no value");
	refused("{\"enum\":[1,2],\"const\":3}", ERR_INVAL,
	    "json_schema at /enum: no value satisfies enum, const and type");
	refused("{\"type\":\"string\",\"const\":1}", ERR_INVAL, "json_schema at /const: no value");
	refused("{\"type\":\"string\",\"pattern\":\"a\",\"minLength\":1}", ERR_UNSUPPORTED,
	    "json_schema at /minLength: ");
	refused("{\"type\":\"string\",\"pattern\":\"a\",\"format\":\"date\"}", ERR_UNSUPPORTED,
	    "json_schema at /format: ");
	refused("{\"type\":\"string\",\"format\":\"date\",\"maxLength\":1}", ERR_UNSUPPORTED,
	    "json_schema at /maxLength: ");
	refused("{\"pattern\":\"(?=a)\"}", ERR_UNSUPPORTED, "json_schema at /pattern: lookaround");
	refused("{\"pattern\":\"(?<!a)b\"}", ERR_UNSUPPORTED, "json_schema at /pattern: lookaround");
	refused("{\"pattern\":\"(a)\\\\1\"}", ERR_UNSUPPORTED, "json_schema at /pattern: backreferences");
	refused("{\"pattern\":\"a**\"}", ERR_INVAL, "json_schema at /pattern: a quantifier with nothing");
	refused("{\"pattern\":\"*a\"}", ERR_INVAL,
	    "json_schema at /pattern: a quantifier with nothing to repeat (at byte 1 ");
	refused("{\"pattern\":\"(a\"}", ERR_INVAL, "json_schema at /pattern: a '(' without");
	refused("{\"pattern\":\"a)\"}", ERR_INVAL, "json_schema at /pattern: a ')' without");
	refused("{\"pattern\":\"[a\"}", ERR_INVAL, "json_schema at /pattern: a '[' without");
	refused("{\"pattern\":\"[z-a]\"}", ERR_INVAL, "json_schema at /pattern: a class range that runs backwards");
	refused("{\"pattern\":\"(a*)*\"}", ERR_UNSUPPORTED, "json_schema at /pattern: a repetition without bound");
	refused("{\"pattern\":\"(a|)+\"}", ERR_UNSUPPORTED, "json_schema at /pattern: a repetition without bound");
	refused("{\"pattern\":\"a{2000}\"}", ERR_RANGE, "json_schema at /pattern: a count above");
	refused("{\"pattern\":\"a{3,2}\"}", ERR_INVAL, "json_schema at /pattern: a count {n,m}");
	refused("{\"pattern\":\"a{x}\"}", ERR_UNSUPPORTED, "json_schema at /pattern: a '{'");
	refused("{\"pattern\":\"\\\\bx\"}", ERR_UNSUPPORTED, "json_schema at /pattern: word boundaries");
	refused("{\"pattern\":\"a^b\"}", ERR_UNSUPPORTED, "json_schema at /pattern: '^' and '$'");
	refused("{\"pattern\":\"(a$)\"}", ERR_UNSUPPORTED, "json_schema at /pattern: '^' and '$'");
	refused("{\"pattern\":\"\\\\p{L}\"}", ERR_UNSUPPORTED, "json_schema at /pattern: an escape");
	refused("{\"pattern\":\"\\\\ud800\"}", ERR_UNSUPPORTED, "json_schema at /pattern: an unpaired surrogate");
	refused("{\"pattern\":\"[\\\\d-z]\"}", ERR_UNSUPPORTED, "json_schema at /pattern: a class range");
	refused("{\"pattern\":1}", ERR_INVAL, "json_schema at /pattern: ");
	refused("{\"type\":\"integer\",\"minimum\":1e19}", ERR_RANGE, "json_schema at /minimum: ");
	refused("{\"type\":\"integer\",\"maximum\":-9000000000000000001}", ERR_RANGE, "json_schema at /maximum: ");
	refused("{\"type\":\"number\",\"minimum\":0.5}", ERR_UNSUPPORTED, "json_schema at /minimum: ");
	refused("{\"exclusiveMaximum\":0.5}", ERR_UNSUPPORTED, "json_schema at /exclusiveMaximum: ");
	refused("{\"type\":\"integer\",\"minimum\":\"1\"}", ERR_INVAL, "json_schema at /minimum: ");
	refused("{\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}}}", ERR_INVAL,
	    "json_schema at /properties/n: no integer lies within");
	refused("{\"type\":\"number\",\"exclusiveMinimum\":3,\"maximum\":3}", ERR_INVAL,
	    "json_schema: no number lies within");
	refused("{\"type\":\"array\",\"items\":[{}]}", ERR_UNSUPPORTED, "json_schema at /items: ");
	refused("{\"uniqueItems\":true}", ERR_UNSUPPORTED, "json_schema at /uniqueItems: ");
	refused("{\"maxLength\":1001}", ERR_RANGE, "json_schema at /maxLength: ");
	refused("{\"minLength\":-1}", ERR_INVAL, "json_schema at /minLength: ");
	refused("{\"minItems\":3,\"maxItems\":2}", ERR_INVAL, "json_schema at /maxItems: ");
	refused("{\"properties\":[]}", ERR_INVAL, "json_schema at /properties: ");
	refused("{\"required\":[1]}", ERR_INVAL, "json_schema at /required: ");
	refused("{\"properties\":{\"a\":1}}", ERR_INVAL, "json_schema at /properties/a: a schema must be");
	refused("{\"prefixItems\":[{}],\"items\":{\"additionalProperties\":3}}", ERR_INVAL,
	    "json_schema at /items/additionalProperties: ");
	refused("[]", ERR_INVAL, "json_schema: a schema must be");
	refused("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"maxLength\":3}]}", ERR_UNSUPPORTED,
	    "json_schema at /oneOf/1: a value may match this and oneOf/0");
	refused("{\"oneOf\":[{\"type\":\"null\"},{\"type\":\"integer\"},{\"type\":\"number\"}]}", ERR_UNSUPPORTED,
	    "json_schema at /oneOf/2: a value may match this and oneOf/1");
	refused("{\"oneOf\":[{\"enum\":[1,2]},{\"enum\":[2.0,3]}]}", ERR_UNSUPPORTED, "json_schema at /oneOf/1: ");
	refused("{\"oneOf\":[{\"enum\":[{\"a\":1,\"b\":[2]}]},{\"const\":{\"b\":[2.0],\"a\":1}}]}", ERR_UNSUPPORTED,
	    "json_schema at /oneOf/1: ");
	refused("{\"oneOf\":[{\"enum\":[\"a\"]},{\"type\":\"string\"}]}", ERR_UNSUPPORTED, "json_schema at /oneOf/1: ");
	refused("{\"oneOf\":[{\"properties\":{\"k\":{\"const\":1}},\"required\":[\"k\"]},"
	    "{\"properties\":{\"k\":{\"enum\":[2,1]}},\"required\":[\"k\"]}]}", ERR_UNSUPPORTED,
	    "json_schema at /oneOf/1: ");
	refused("{\"oneOf\":[{\"type\":[\"object\",\"string\"],\"properties\":{\"k\":{\"const\":1}},"
	    "\"required\":[\"k\"]},"
	    "{\"type\":[\"object\",\"string\"],\"properties\":{\"k\":{\"const\":2}},\"required\":[\"k\"]}]}",
	    ERR_UNSUPPORTED,
	    "json_schema at /oneOf/1: ");
	refused("{\"oneOf\":[{\"properties\":{\"k\":{\"const\":1}}},{\"properties\":{\"k\":{\"const\":2}}}]}",
	    ERR_UNSUPPORTED,
	    "json_schema at /oneOf/1: ");
	refused("{\"allOf\":[{\"type\":\"string\"},{\"minLength\":1}]}", ERR_UNSUPPORTED, "json_schema at /allOf/1: ");
	refused("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
	    ERR_UNSUPPORTED,
	    "json_schema at /$defs/b/$ref: a cycle");
	refused("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", ERR_UNSUPPORTED,
	    "json_schema at /anyOf/0/$ref: a cycle");
	refused("{\"$defs\":{\"a\":{\"allOf\":[{\"$ref\":\"#/$defs/b\"}]},\"b\":{\"oneOf\":[{\"type\":\"null\"},"
	    "{\"$ref\":\"#/$defs/a\"}]}},"
	    "\"items\":{\"$ref\":\"#/$defs/a\"}}", ERR_UNSUPPORTED, "json_schema at /$defs/b/oneOf/1/$ref: a cycle");
	refused("{\"prefixItems\":[{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},"
	    "{},{},{},{},{}]}",
	    ERR_RANGE, "json_schema at /prefixItems: ");
}

static double
now_s(void)
{
	return 1e-9 * (double)now_ns();
}

/* schema (taken) refused with code, err starting with what and holding also (if not NULL), within a second. */
static void
refused_fast(json_t *s, int code, const char *what, const char *also)
{
	char err[ERR_LEN] = "", *t = NULL;
	double t0 = now_s();
	int rc = jschema_grammar(s, &t, err);
	double dt = now_s() - t0;

	if (rc != code || t != NULL || strncmp(err, what, strlen(what)) != 0 ||
	    (also != NULL && strstr(err, also) == NULL))
		fail_msg("expected %d '%s...%s', got %d '%s'", code, what, also != NULL ? also : "", rc, err);
	if (dt > 1.0)
		fail_msg("'%s' took %.2f s", err, dt);
	json_decref(s);
}

/* s (taken) wrapped depth times as {key: {"a": s}} (inner NULL) or {key: s}. */
static json_t *
nest(json_t *s, const char *key, const char *inner, int depth)
{
	for (int i = 0; i < depth; i++) {
		json_t *o = json_object();

		if (inner != NULL) {
			json_t *m = json_object();

			json_object_set_new(m, inner, s);
			s = m;
		}
		json_object_set_new(o, key, s);
		s = o;
	}
	return s;
}

static void
test_hostile(void **state)
{
	json_t *s, *defs, *arr, *props;
	char key[1200], *pat;

	(void)state;
	/* a cycle of references through $defs, two long and 20 long */
	refused_fast(parse("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},"
	    "\"$ref\":\"#/$defs/a\"}"),
	    ERR_UNSUPPORTED, "json_schema at /$defs/b/$ref: a cycle", NULL);
	defs = json_object();
	for (int i = 0; i < 20; i++) {
		snprintf(key, sizeof key, "{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/$defs/d%d\"}]}", (i + 1) % 20);
		snprintf(key + 600, 32, "d%d", i);
		json_object_set_new(defs, key + 600, parse(key));
	}
	s = parse("{\"$ref\":\"#/$defs/d0\"}");
	json_object_set_new(s, "$defs", defs);
	refused_fast(s, ERR_UNSUPPORTED, "json_schema at /$defs/d19/anyOf/1/$ref: a cycle", NULL);
	/* nesting 10,000 deep, through properties, items, anyOf and $ref */
	refused_fast(nest(parse("{\"type\":\"null\"}"), "properties", "a", 10000), ERR_RANGE, "json_schema at .../",
	    "/properties/a: schemas nested deeper than the limit of 64");
	refused_fast(nest(json_true(), "items", NULL, 10000), ERR_RANGE, "json_schema at .../",
	    "/items/items: schemas nested deeper");
	s = json_true();
	for (int i = 0; i < 10000; i++) {
		json_t *o = json_object();

		arr = json_array();
		json_array_append_new(arr, s);
		json_object_set_new(o, "anyOf", arr);
		s = o;
	}
	refused_fast(s, ERR_RANGE, "json_schema at .../", "/anyOf/0/anyOf/0: schemas nested deeper");
	defs = json_object();
	for (int i = 0; i < 10000; i++) {
		snprintf(key, sizeof key, "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/d%d\"}}", i + 1);
		snprintf(key + 600, 32, "d%d", i);
		json_object_set_new(defs, key + 600, parse(key));
	}
	json_object_set_new(defs, "d10000", json_true());
	s = parse("{\"$ref\":\"#/$defs/d0\"}");
	json_object_set_new(s, "$defs", defs);
	refused_fast(s, ERR_RANGE, "json_schema at /$defs/d", "nested deeper");
	/* an enum of 100,000 values; one of 4,096 is fine */
	arr = json_array();
	for (int i = 0; i < 100000; i++)
		json_array_append_new(arr, json_integer(i));
	s = json_object();
	json_object_set_new(s, "enum", arr);
	refused_fast(s, ERR_RANGE, "json_schema at /enum: 100000 values, above the limit of 4096", NULL);
	arr = json_array();
	for (int i = 0; i < JSCHEMA_MAX_ENUM; i++) {
		snprintf(key, sizeof key, "v%d", i * 7919 % 100000);
		json_array_append_new(arr, json_string(key));
	}
	s = json_object();
	json_object_set_new(s, "enum", arr);
	{
		double t0 = now_s();
		struct grammar *g = compile_json(s, NULL);

		assert_true(matches_both(g, "\"v0\"") && matches_both(g, "\"v7919\"") && !matches_both(g, "\"v1\""));
		grammar_free(g);
		assert_true(now_s() - t0 < 1.0);
	}
	json_decref(s);
	/* huge properties: past the count, or past the text's limit with long names */
	props = json_object();
	for (int i = 0; i < 100000; i++) {
		snprintf(key, sizeof key, "p%d", i);
		json_object_set_new(props, key, json_true());
	}
	s = json_object();
	json_object_set_new(s, "properties", props);
	refused_fast(s, ERR_RANGE, "json_schema at /properties: more than 1024 named properties", NULL);
	props = json_object();
	for (int i = 0; i < JSCHEMA_MAX_PROPERTIES; i++) {
		memset(key, 'k', 1100);
		snprintf(key + 1100, 32, "%d", i);
		json_object_set_new(props, key, json_true());
	}
	s = json_object();
	json_object_set_new(s, "properties", props);
	json_object_set_new(s, "additionalProperties", json_false());
	refused_fast(s, ERR_RANGE, "json_schema: the grammar would exceed its limit of 1048576 bytes", NULL);
	/* rules: many small objects */
	props = json_object();
	for (int i = 0; i < 1000; i++) {
		snprintf(key, sizeof key, "p%d", i);
		json_object_set_new(props, key,
		    parse("{\"properties\":{\"a\":{},\"b\":{},\"c\":{},\"d\":{},\"e\":{}}}"));
	}
	s = json_object();
	json_object_set_new(s, "properties", props);
	refused_fast(s, ERR_RANGE, "json_schema at /properties/p", "the grammar needs more than 16384 rules");
	/* groups in a pattern 10,000 deep; a pattern past the text's limit */
	pat = xmalloc(400001);
	memset(pat, '(', 10000), pat[10000] = 'a', memset(pat + 10001, ')', 10000), pat[20001] = '\0';
	s = json_object();
	json_object_set_new(s, "pattern", json_string(pat));
	refused_fast(s, ERR_RANGE, "json_schema at /pattern: groups nested deeper than the limit of 64", NULL);
	memset(pat, 'a', 400000), pat[400000] = '\0';
	s = json_object();
	json_object_set_new(s, "pattern", json_string(pat));
	refused_fast(s, ERR_RANGE, "json_schema: the grammar would exceed", NULL);
	free(pat);
	/* 257 branches; 256 oneOf branches of disjoint enums are checked quickly */
	arr = json_array();
	for (int i = 0; i <= JSCHEMA_MAX_BRANCHES; i++)
		json_array_append_new(arr, json_true());
	s = json_object();
	json_object_set_new(s, "anyOf", arr);
	refused_fast(s, ERR_RANGE, "json_schema at /anyOf: more than 256 branches", NULL);
	arr = json_array();
	for (int i = 0; i < JSCHEMA_MAX_BRANCHES; i++) {
		json_t *en = json_array(), *b = json_object();

		for (int k = 0; k < 64; k++)
			json_array_append_new(en, json_integer(i * 64 + k));
		json_object_set_new(b, "enum", en);
		json_array_append_new(arr, b);
	}
	json_array_append_new(json_object_get(json_array_get(arr, 255), "enum"), json_real(3.0));
	s = json_object();
	json_object_set_new(s, "oneOf", arr);
	refused_fast(s, ERR_UNSUPPORTED, "json_schema at /oneOf/255: a value may match this and oneOf/0", NULL);
	/* counts that grammar.c would expand past its limits: refused here, where the schema is known */
	props = json_object();
	for (int i = 0; i < 100; i++) {
		snprintf(key, sizeof key, "{\"type\":\"string\",\"maxLength\":%d}", 900 + i);
		snprintf(key + 600, 32, "p%d", i);
		json_object_set_new(props, key + 600, parse(key));
	}
	s = json_object();
	json_object_set_new(s, "properties", props);
	refused_fast(s, ERR_RANGE, "json_schema at /properties/p", "counts would expand past grammar.c's limits");
	/* one long string count shared by a hundred properties */
	props = json_object();
	for (int i = 0; i < 100; i++) {
		snprintf(key, sizeof key, "p%d", i);
		json_object_set_new(props, key, parse("{\"type\":\"string\",\"maxLength\":1000}"));
	}
	s = json_object();
	json_object_set_new(s, "properties", props);
	{
		struct grammar *g = compile_json(s, NULL);

		assert_true(matches_both(g, "{\"p0\":\"a\",\"p99\":\"b\"}"));
		grammar_free(g);
	}
	json_decref(s);
}

/* ---- random schemas and instances ---- */

/* Appends code point cp as UTF-8. */
static void
tb_utf8(struct strbuf *b, uint32_t cp)
{
	static const unsigned char lead[5] = { 0, 0, 0xc0, 0xe0, 0xf0 };
	char u[4];
	size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;

	for (size_t i = n; i-- > 1; cp >>= 6)
		u[i] = (char)(0x80 | (cp & 0x3f));
	u[0] = (char)(lead[n] | cp);
	strbuf_add(b, u, n);
}

/* Whitespace between tokens, within the bound: none, a space or tab, or a newline and an indent. */
static void
ws(struct strbuf *b)
{
	switch (rnd(6)) {
	case 0: strbuf_cat(b, " "); break;
	case 1: strbuf_cat(b, "\t"); break;
	case 2:
		strbuf_cat(b, "\n");
		for (uint32_t n = rnd(JSCHEMA_MAX_INDENT + 1); n > 0; n--)
			strbuf_cat(b, rnd(4) ? " " : "\t");
		break;
	default: break;
	}
}

/* Code points strings are made of: ASCII, what JSON escapes, several lengths of UTF-8. */
static const uint32_t pool[] = { 'a', 'b', 'z', 'Q', '0', '5', ' ', '.', '-', '"', '\\', '/', '(', ']', '{', '|', '^',
	'$', '*', '+', '?', '\n', '\t', 0x01, 0x1f, 0x7f, 0xe9, 0x20ac, 0x4e2d, 0x1f600, 0xa0, 0xffff, 0x10ffff };

/* One code point inside a JSON string; any: also as \uXXXX (a surrogate pair past U+FFFF) or \/. */
static void
spell_cp(struct strbuf *b, uint32_t cp, int any)
{
	static const char short_esc[32] = { ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't' };

	if (cp == '"' || cp == '\\')
		strbuf_cat(b, cp == '"' ? "\\\"" : "\\\\");
	else if (cp < 0x20 && short_esc[cp] != 0 && rnd(2))
		strbuf_printf(b, "\\%c", short_esc[cp]);
	else if (cp < 0x20)
		strbuf_printf(b, rnd(2) ? "\\u%04x" : "\\u%04X", cp);
	else if (any && cp == '/' && rnd(2))
		strbuf_cat(b, "\\/");
	else if (any && rnd(4) == 0 && cp >= 0x10000)
		strbuf_printf(b, "\\u%04x\\u%04X", 0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
	else if (any && rnd(4) == 0 && cp < 0x10000)
		strbuf_printf(b, "\\u%04X", cp);
	else
		tb_utf8(b, cp);
}

/* Any JSON value, small, spelled with whitespace. */
static void
any_value(struct strbuf *b, int depth)
{
	uint32_t k = rnd(depth > 2 ? 6 : 8), n;

	switch (k) {
	case 0: strbuf_cat(b, "null"); break;
	case 1: strbuf_cat(b, rnd(2) ? "true" : "false"); break;
	case 2: strbuf_printf(b, "%d", (int)rnd(2001) - 1000); break;
	case 3:
		strbuf_printf(b, "%s%u.%02ue%s%u", rnd(2) ? "-" : "", rnd(100), rnd(100), rnd(2) ? "-" : "+", rnd(30));
		break;
	case 4:
	case 5:
		strbuf_cat(b, "\"");
		for (n = rnd(6); n > 0; n--)
			spell_cp(b, pool[rnd(ARRAY_LEN(pool))], 1);
		strbuf_cat(b, "\"");
		break;
	case 6:
		strbuf_cat(b, "["), ws(b);
		for (n = rnd(4); n > 0; n--) {
			any_value(b, depth + 1);
			if (n > 1)
				ws(b), strbuf_cat(b, ","), ws(b);
		}
		strbuf_cat(b, "]");
		break;
	default:
		strbuf_cat(b, "{"), ws(b);
		for (n = rnd(4); n > 0; n--) {
			strbuf_cat(b, "\"");
			spell_cp(b, pool[rnd(ARRAY_LEN(pool))], 1);
			strbuf_printf(b, "%u\"", n);
			ws(b), strbuf_cat(b, ":"), ws(b);
			any_value(b, depth + 1);
			if (n > 1)
				ws(b), strbuf_cat(b, ","), ws(b);
		}
		strbuf_cat(b, "}");
	}
}

/* A random pattern's tree: what it is written as, and what it matches, for sampling. */
enum { RN_CHAR, RN_SET, RN_DOT, RN_ESC, RN_GROUP, RN_QUANT };

struct rnode {
	int kind;
	uint32_t cp;                  /* RN_CHAR */
	uint32_t lo[3], hi[3];        /* RN_SET: ranges */
	int nr, neg;
	char esc;                     /* RN_ESC: d w s D W S */
	struct rnode *alt[3][4];      /* RN_GROUP: alternatives of items (NULL ends) */
	int nalt, style;              /* style: (, (?:, (?<n> */
	struct rnode *kid;            /* RN_QUANT */
	int qlo, qhi, lazy, form;     /* qhi -1: no bound; form: * + ? {n} {n,} {n,m} */
};

/* The code points of a sample. */
struct cps {
	uint32_t v[4096];
	int n;
};

/* 1 if cp is in the class of escape e (d w s, or D W S their complements), as ECMA-262 has them. */
static int
esc_has(char e, uint32_t cp)
{
	int digit = cp >= '0' && cp <= '9', in;

	if ((e | 0x20) == 'd')
		in = digit;
	else if ((e | 0x20) == 'w')
		in = digit || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') || cp == '_';
	else
		in = (cp >= 9 && cp <= 13) || cp == ' ' || cp == 0xa0 || cp == 0x1680 ||
		    (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
		    cp == 0x3000 || cp == 0xfeff;
	return e >= 'a' ? in : !in;
}

static int
set_has(const struct rnode *r, uint32_t cp)
{
	int in = 0;

	for (int i = 0; i < r->nr; i++)
		in |= cp >= r->lo[i] && cp <= r->hi[i];
	return in != r->neg;
}

static int
rn_nullable(const struct rnode *r)
{
	if (r->kind == RN_QUANT)
		return r->qlo == 0 || rn_nullable(r->kid);
	if (r->kind != RN_GROUP)
		return 0;
	for (int a = 0; a < r->nalt; a++) {
		int all = 1;

		for (int i = 0; r->alt[a][i] != NULL; i++)
			all &= rn_nullable(r->alt[a][i]);
		if (all)
			return 1;
	}
	return 0;
}

static struct rnode *rn_gen(int depth);

static void
rn_seq(struct rnode **seq, int depth, int max)
{
	int n = (int)rnd((uint32_t)max + 1), i;

	for (i = 0; i < n; i++)
		seq[i] = rn_gen(depth);
	seq[i] = NULL;
}

static struct rnode *
rn_gen(int depth)
{
	static const uint32_t ranges[][2] = { { 'a', 'f' }, { '0', '9' }, { 'x', 'x' }, { '-', '-' }, { ']', ']' },
		{ '\\', '\\' }, { '"', '"' }, { 0xe9, 0xe9 }, { 0x4e00, 0x4eff }, { '\n', '\n' }, { '^', '^' } };
	struct rnode *r = xcalloc(1, sizeof *r);
	uint32_t k = rnd(depth >= 2 ? 5 : 8);

	if (k <= 1) {
		r->kind = RN_CHAR, r->cp = pool[rnd(ARRAY_LEN(pool))];
	} else if (k == 2) {
		r->kind = RN_SET, r->nr = 1 + (int)rnd(3), r->neg = rnd(4) == 0;
		for (int i = 0; i < r->nr; i++) {
			uint32_t j = rnd(ARRAY_LEN(ranges));

			r->lo[i] = ranges[j][0], r->hi[i] = ranges[j][1];
		}
	} else if (k == 3) {
		r->kind = rnd(3) ? RN_ESC : RN_DOT, r->esc = "dwsDWS"[rnd(6)];
	} else if (k == 4) {
		r->kind = RN_QUANT, r->kid = rn_gen(depth + 1), r->form = (int)rnd(6), r->lazy = rnd(3) == 0;
		if (rn_nullable(r->kid) && (r->form == 0 || r->form == 1 || r->form == 4))
			r->form = 2; /* no unbounded repetition of what may match nothing */
		r->qlo = r->form == 1 ? 1 : r->form >= 3 ? (int)rnd(3) : 0;
		r->qhi = r->form == 2 ? 1 : r->form == 3 ? r->qlo : r->form == 5 ? r->qlo + (int)rnd(3) : -1;
	} else {
		r->kind = RN_GROUP, r->nalt = k == 5 ? 1 : 1 + (int)rnd(3), r->style = k == 5 ? 1 : (int)rnd(3);
		for (int a = 0; a < r->nalt; a++)
			rn_seq(r->alt[a], depth + 1, 3);
	}
	return r;
}

static void
rn_free(struct rnode *r)
{
	if (r == NULL)
		return;
	for (int a = 0; a < r->nalt; a++)
		for (int i = 0; r->alt[a][i] != NULL; i++)
			rn_free(r->alt[a][i]);
	rn_free(r->kid);
	free(r);
}

/* A code point in a pattern; in a class, its own marks escaped. */
static void
rn_write_cp(struct strbuf *b, uint32_t cp, int in_class)
{
	if (cp == '\n' || cp == '\t')
		strbuf_cat(b, cp == '\n' ? "\\n" : "\\t");
	else if (cp < 0x20 || cp == 0x7f)
		strbuf_printf(b, rnd(2) ? "\\x%02x" : "\\u%04X", cp);
	else if (strchr(in_class ? "]\\-^" : "^$\\.*+?()[]{}|/", (int)cp) != NULL && cp < 0x80)
		strbuf_printf(b, "\\%c", (char)cp);
	else if (cp >= 0x10000 && rnd(2))
		strbuf_printf(b, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
	else if (cp >= 0x80 && cp < 0x10000 && rnd(2))
		strbuf_printf(b, "\\u%04x", cp);
	else
		tb_utf8(b, cp);
}

static void
rn_write(struct strbuf *b, const struct rnode *r)
{
	static const char *const forms[] = { "*", "+", "?" };

	switch (r->kind) {
	case RN_CHAR: rn_write_cp(b, r->cp, 0); break;
	case RN_DOT: strbuf_cat(b, "."); break;
	case RN_ESC: strbuf_printf(b, "\\%c", r->esc); break;
	case RN_SET:
		strbuf_cat(b, r->neg ? "[^" : "[");
		for (int i = 0; i < r->nr; i++) {
			rn_write_cp(b, r->lo[i], 1);
			if (r->hi[i] != r->lo[i])
				strbuf_cat(b, "-"), rn_write_cp(b, r->hi[i], 1);
		}
		strbuf_cat(b, "]");
		break;
	case RN_GROUP:
		strbuf_cat(b, r->style == 0 ? "(" : r->style == 1 ? "(?:" : "(?<n1>");
		for (int a = 0; a < r->nalt; a++) {
			if (a > 0)
				strbuf_cat(b, "|");
			for (int i = 0; r->alt[a][i] != NULL; i++)
				rn_write(b, r->alt[a][i]);
		}
		strbuf_cat(b, ")");
		break;
	default:
		if (r->kid->kind == RN_QUANT) /* a quantifier on a quantifier: group it */
			strbuf_cat(b, "(?:"), rn_write(b, r->kid), strbuf_cat(b, ")");
		else
			rn_write(b, r->kid);
		if (r->form < 3)
			strbuf_cat(b, forms[r->form]);
		else if (r->form == 3)
			strbuf_printf(b, "{%d}", r->qlo);
		else if (r->form == 4)
			strbuf_printf(b, "{%d,}", r->qlo);
		else
			strbuf_printf(b, "{%d,%d}", r->qlo, r->qhi);
		if (r->lazy)
			strbuf_cat(b, "?");
	}
}

/* A pool code point in a set or escape class (one exists for those generated), or outside them. */
static uint32_t
pool_pick(int (*has)(const void *, uint32_t), const void *arg)
{
	uint32_t k = rnd(ARRAY_LEN(pool));

	for (uint32_t i = 0; i < ARRAY_LEN(pool); i++)
		if (has(arg, pool[(k + i) % ARRAY_LEN(pool)]))
			return pool[(k + i) % ARRAY_LEN(pool)];
	return 0;
}

static int
has_set(const void *r, uint32_t cp)
{
	return set_has(r, cp);
}

static int
has_esc(const void *r, uint32_t cp)
{
	return esc_has(((const struct rnode *)r)->esc, cp);
}

static int
has_dot(const void *r, uint32_t cp)
{
	(void)r;
	return cp != '\n' && cp != '\r';
}

static void
cps_add(struct cps *c, uint32_t cp)
{
	if (c->n < (int)ARRAY_LEN(c->v))
		c->v[c->n++] = cp;
}

static void
rn_sample(const struct rnode *r, struct cps *out)
{
	int n;

	switch (r->kind) {
	case RN_CHAR: cps_add(out, r->cp); break;
	case RN_DOT: cps_add(out, pool_pick(has_dot, r)); break;
	case RN_ESC: cps_add(out, pool_pick(has_esc, r)); break;
	case RN_SET: {
		int i = (int)rnd((uint32_t)r->nr);

		cps_add(out, r->neg ? pool_pick(has_set, r) : r->lo[i] + rnd(r->hi[i] - r->lo[i] + 1));
		break;
	}
	case RN_GROUP: {
		int a = (int)rnd((uint32_t)r->nalt);

		for (int i = 0; r->alt[a][i] != NULL; i++)
			rn_sample(r->alt[a][i], out);
		break;
	}
	default:
		n = r->qlo + (int)rnd(r->qhi < 0 ? 3 : (uint32_t)(r->qhi - r->qlo + 1));
		for (int i = 0; i < n; i++)
			rn_sample(r->kid, out);
	}
}

/* A random pattern: top alternatives, each maybe anchored; its text and tree. */
struct rpat {
	char *text;
	struct rnode *alt[2][5];
	int nalt, start[2], end[2];
};

static void
rpat_gen(struct rpat *p)
{
	struct strbuf b = { 0 };

	p->nalt = 1 + (rnd(4) == 0);
	for (int a = 0; a < p->nalt; a++) {
		p->start[a] = rnd(4) != 0, p->end[a] = rnd(4) != 0;
		rn_seq(p->alt[a], 0, 4);
		if (a > 0)
			strbuf_cat(&b, "|");
		strbuf_cat(&b, p->start[a] ? "^" : "");
		for (int i = 0; p->alt[a][i] != NULL; i++)
			rn_write(&b, p->alt[a][i]);
		strbuf_cat(&b, p->end[a] ? "$" : "");
	}
	strbuf_cat(&b, "");
	p->text = b.s;
}

/* A sample of p as a JSON string: any text around an unanchored side. */
static void
rpat_sample(const struct rpat *p, struct strbuf *b)
{
	struct cps *c = xcalloc(1, sizeof *c);
	int a = (int)rnd((uint32_t)p->nalt);

	for (uint32_t n = p->start[a] ? 0 : rnd(3); n > 0; n--)
		cps_add(c, pool[rnd(ARRAY_LEN(pool))]);
	for (int i = 0; p->alt[a][i] != NULL; i++)
		rn_sample(p->alt[a][i], c);
	for (uint32_t n = p->end[a] ? 0 : rnd(3); n > 0; n--)
		cps_add(c, pool[rnd(ARRAY_LEN(pool))]);
	strbuf_cat(b, "\"");
	for (int i = 0; i < c->n; i++)
		spell_cp(b, c->v[i], 0);
	strbuf_cat(b, "\"");
	free(c);
}

static void
rpat_free(struct rpat *p)
{
	for (int a = 0; a < p->nalt; a++)
		for (int i = 0; p->alt[a][i] != NULL; i++)
			rn_free(p->alt[a][i]);
	free(p->text);
}

/* What random schemas share: the root's $defs, the patterns made (their trees, by text). */
struct rgen {
	json_t *defs;
	int n_defs;
	struct rpat pats[64];
	int n_pats;
};

static const char *const key_pool[] = { "a", "b", "name", "a\"b", "\xc3\xa9", "\n", "", "x y", "id", "k1", "\\",
	"\xce\xa9", "ab" };
static const char *const extra_pool[] = { "x", "zz", "\xc3\xa9" "1", "a1", "k", "name2", " ", "aa",
	"\xf0\x9f\x98\x80" };

static json_t *gen_schema(struct rgen *g, int depth);

static int64_t
rnd_signed(int digits)
{
	int64_t v = (int64_t)(((uint64_t)rng() << 32 | rng()) % 1000000000000000000ULL);

	for (int i = digits; i < 18; i++)
		v /= 10;
	return rnd(2) ? -v : v;
}

/* Sets the lower (upper: hi) bound v of integers in one of the ways that say it. */
static void
int_bound(json_t *s, int64_t v, int hi)
{
	const char *incl = hi ? "maximum" : "minimum", *excl = hi ? "exclusiveMaximum" : "exclusiveMinimum";
	int64_t out = hi ? v + 1 : v - 1;
	double half = hi ? (double)v + 0.5 : (double)v - 0.5;

	switch (llabs(v) < 1000000000000LL ? rnd(5) : rnd(3)) {
	case 0: json_object_set_new(s, incl, json_integer(v)); break;
	case 1: json_object_set_new(s, excl, json_integer(out)); break;
	case 2: json_object_set_new(s, incl, json_integer(out)), json_object_set_new(s, excl, json_true()); break;
	case 3: json_object_set_new(s, incl, json_real(half)); break;
	default: json_object_set_new(s, excl, json_real(hi ? half + 0.25 : half - 0.25)); break;
	}
}

static json_t *
gen_int(void)
{
	json_t *s = parse("{\"type\":\"integer\"}");
	int64_t lo = rnd_signed(1 + (int)rnd(18)), hi = lo + (rnd(4) == 0 ? 0 : llabs(rnd_signed(1 + (int)rnd(18))));
	uint32_t mode = rnd(4);

	if (hi > 8000000000000000000LL)
		hi = 8000000000000000000LL, lo = MIN(lo, hi);
	if (mode & 1)
		int_bound(s, lo, 0);
	if (mode & 2)
		int_bound(s, hi, 1);
	return s;
}

static json_t *
gen_num(void)
{
	json_t *s = parse("{\"type\":\"number\"}");
	int64_t lo = rnd_signed(1 + (int)rnd(9)), hi = lo + 1 + llabs(rnd_signed(1 + (int)rnd(9)));
	uint32_t mode = rnd(4);

	if (mode & 1) {
		if (rnd(3) == 0) {
			json_object_set_new(s, "minimum", json_integer(lo));
			json_object_set_new(s, "exclusiveMinimum", json_true());
		} else {
			json_object_set_new(s, rnd(2) ? "minimum" : "exclusiveMinimum",
			    rnd(2) ? json_integer(lo) : json_real((double)lo));
		}
	}
	if (mode & 2)
		json_object_set_new(s, rnd(2) ? "maximum" : "exclusiveMaximum", json_integer(hi));
	return s;
}

static json_t *
gen_str(struct rgen *g)
{
	static const char *const formats[] = { "date", "time", "date-time", "uuid" };
	json_t *s = parse("{\"type\":\"string\"}");
	int lo = (int)rnd(4);

	switch (rnd(5)) {
	case 0: break;
	case 1:
		if (rnd(3))
			json_object_set_new(s, "minLength", json_integer(lo));
		if (rnd(3))
			json_object_set_new(s, "maxLength", json_integer(lo + (int)rnd(5)));
		break;
	case 2: json_object_set_new(s, "format", json_string(formats[rnd(4)])); break;
	default:
		if (g->n_pats < (int)ARRAY_LEN(g->pats)) {
			rpat_gen(&g->pats[g->n_pats]);
			json_object_set_new(s, "pattern", json_string(g->pats[g->n_pats++].text));
		}
	}
	return s;
}

/* A random JSON value for enum and const. */
static json_t *
gen_value(int depth)
{
	struct strbuf b = { 0 };
	json_t *v;

	switch (rnd(depth > 0 ? 7 : 9)) {
	case 0: return json_null();
	case 1: return json_boolean(rnd(2));
	case 2: return json_integer(rnd_signed(1 + (int)rnd(12)));
	case 3: return json_real((double)((int)rnd(2001) - 1000) / 8);
	case 4: return json_real(rnd(2) ? 1e21 : -2.5e-7);
	case 5:
	case 6:
		for (uint32_t n = rnd(5); n > 0; n--)
			tb_utf8(&b, pool[rnd(ARRAY_LEN(pool))]);
		strbuf_cat(&b, "");
		v = json_string(b.s);
		free(b.s);
		return v;
	case 7:
		v = json_array();
		for (uint32_t n = rnd(3); n > 0; n--)
			json_array_append_new(v, gen_value(depth + 1));
		return v;
	default:
		v = json_object();
		for (uint32_t n = rnd(3); n > 0; n--)
			json_object_set_new(v, key_pool[rnd(ARRAY_LEN(key_pool))], gen_value(depth + 1));
		return v;
	}
}

/* The JSON type name of v (integer for whole reals too). */
static const char *
type_name(const json_t *v)
{
	static const char *const names[] = { "object", "array", "string", "integer", "number", "boolean", "boolean",
		"null" };

	if (json_is_real(v))
		return json_real_value(v) == floor(json_real_value(v)) ? "integer" : "number";
	return names[json_typeof(v)];
}

static int
type_has(const char *type, const json_t *v)
{
	return strcmp(type, type_name(v)) == 0 || (strcmp(type, "number") == 0 && strcmp(type_name(v), "integer") == 0);
}

static json_t *
gen_enum(int is_const)
{
	json_t *s = json_object(), *arr = json_array();
	uint32_t n = is_const ? 1 : 1 + rnd(6);

	for (uint32_t i = 0; i < n; i++)
		json_array_append_new(arr, gen_value(0));
	if (rnd(4) == 0) /* a type that one value has */
		json_object_set_new(s, "type", json_string(type_name(json_array_get(arr, rnd(n)))));
	json_object_set(s, is_const ? "const" : "enum", is_const ? json_array_get(arr, 0) : arr);
	json_decref(arr);
	return s;
}

static json_t *
gen_obj(struct rgen *g, int depth)
{
	json_t *s = parse("{\"type\":\"object\"}"), *props = json_object(), *req = json_array();
	uint32_t n = rnd(5), addl = rnd(4);

	for (uint32_t i = 0; i < n; i++) {
		const char *k = key_pool[rnd(ARRAY_LEN(key_pool))];

		if (json_object_get(props, k) != NULL)
			continue;
		if (rnd(8) == 0) { /* a property that must be absent */
			json_object_set_new(props, k, json_false());
			continue;
		}
		json_object_set_new(props, k, gen_schema(g, depth + 1));
		if (rnd(2))
			json_array_append_new(req, json_string(k));
	}
	if (addl != 1 && rnd(4) == 0)
		json_array_append_new(req, json_string("req-only"));
	if (n > 0 || rnd(2))
		json_object_set_new(s, "properties", props);
	else
		json_decref(props);
	if (json_array_size(req) > 0 || rnd(4) == 0)
		json_object_set_new(s, "required", req);
	else
		json_decref(req);
	if (addl == 1)
		json_object_set_new(s, "additionalProperties", json_false());
	else if (addl == 2)
		json_object_set_new(s, "additionalProperties", rnd(2) ? json_true() : gen_schema(g, depth + 1));
	return s;
}

static json_t *
gen_arr(struct rgen *g, int depth)
{
	json_t *s = parse("{\"type\":\"array\"}"), *prefix = json_array();
	uint32_t k = rnd(3) == 0 ? 1 + rnd(3) : 0, items = rnd(4);
	long lo = (long)rnd(3), hi;

	for (uint32_t i = 0; i < k; i++)
		json_array_append_new(prefix, gen_schema(g, depth + 1));
	if (k > 0)
		json_object_set_new(s, "prefixItems", prefix);
	else
		json_decref(prefix);
	if (items == 1 && k > 0)
		json_object_set_new(s, "items", json_false()), lo = MIN(lo, (long)k);
	else if (items >= 2)
		json_object_set_new(s, "items", gen_schema(g, depth + 1));
	hi = lo + (long)rnd(4);
	if (rnd(2))
		json_object_set_new(s, "minItems", json_integer(lo));
	if (rnd(2))
		json_object_set_new(s, "maxItems", json_integer(hi));
	if (rnd(6) == 0)
		json_object_set_new(s, "uniqueItems", json_false());
	return s;
}

/* A schema of JSON type t (0 null .. 5 object). */
static json_t *
gen_typed(struct rgen *g, int t, int depth)
{
	switch (t) {
	case 0: return parse("{\"type\":\"null\"}");
	case 1: return parse("{\"type\":\"boolean\"}");
	case 2: return gen_int();
	case 3: return gen_str(g);
	case 4: return gen_arr(g, depth);
	default: return gen_obj(g, depth);
	}
}

/* A new definition in the root's $defs and a $ref to it; some are trees that recurse through it. */
static json_t *
gen_ref(struct rgen *g, int depth)
{
	char name[32], ref[64], tree[512];
	json_t *def;

	snprintf(name, sizeof name, "d%d", g->n_defs++);
	snprintf(ref, sizeof ref, "{\"$ref\":\"#/$defs/%s\"}", name);
	if (g->defs == NULL)
		g->defs = json_object();
	if (rnd(3) == 0) {
		snprintf(tree, sizeof tree, "{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\","
		    "\"items\":{\"$ref\":\"#/$defs/%s\"},\"maxItems\":2}},\"additionalProperties\":false}", name);
		def = parse(tree);
		json_object_set_new(json_object_get(def, "properties"), "v", gen_schema(g, depth + 1));
	} else {
		def = gen_schema(g, depth + 1);
	}
	json_object_set_new(g->defs, name, def);
	return parse(ref);
}

/* oneOf of branches none of whose values meet: distinct types but object, and objects told apart by "kind". */
static json_t *
gen_one(struct rgen *g, int depth)
{
	json_t *arr = json_array();
	int types[6] = { 0, 1, 2, 3, 4, 5 }, n = 2 + (int)rnd(3);

	for (int i = 5; i > 0; i--) {
		int j = (int)rnd((uint32_t)i + 1), t = types[i];

		types[i] = types[j], types[j] = t;
	}
	for (int i = 0; i < n; i++) {
		json_t *b, *props;
		char kind[16];

		if (types[i] != 5 && rnd(2)) {
			json_array_append_new(arr, gen_typed(g, types[i], depth + 1));
			continue;
		}
		b = gen_obj(g, depth + 1);
		if ((props = json_object_get(b, "properties")) == NULL)
			json_object_set_new(b, "properties", props = json_object());
		if (json_object_get(b, "required") == NULL)
			json_object_set_new(b, "required", json_array());
		snprintf(kind, sizeof kind, "k%d", i);
		json_object_set_new(props, "kind",
		    rnd(2) ? json_pack("{s:s}", "const", kind) : json_pack("{s:[s,i]}", "enum", kind, i));
		json_array_append_new(json_object_get(b, "required"), json_string("kind"));
		json_array_append_new(arr, b);
	}
	return json_pack("{s:o}", "oneOf", arr);
}

static json_t *
gen_schema(struct rgen *g, int depth)
{
	json_t *s, *arr;

	switch (rnd(depth >= 3 ? 8 : 17)) {
	case 0: s = parse("{\"type\":\"null\"}"); break;
	case 1: s = parse("{\"type\":\"boolean\"}"); break;
	case 2: s = gen_int(); break;
	case 3: s = gen_num(); break;
	case 4:
	case 5: s = gen_str(g); break;
	case 6: s = gen_enum(0); break;
	case 7: s = rnd(2) ? gen_enum(1) : rnd(2) ? json_true() : parse("{}"); break;
	case 8:
	case 9: s = gen_obj(g, depth); break;
	case 10: s = gen_arr(g, depth); break;
	case 11:
		s = json_object(), arr = json_array();
		for (uint32_t n = 2 + rnd(2); n > 0; n--)
			json_array_append_new(arr, gen_schema(g, depth + 1));
		json_object_set_new(s, "anyOf", arr);
		break;
	case 12: s = gen_one(g, depth); break;
	case 13:
		s = json_pack("{s:[{s:s},o,b]}", "allOf", "description", "d", gen_schema(g, depth + 1), 1);
		break;
	case 14:
	case 15: s = gen_ref(g, depth); break;
	default:
		switch (rnd(5)) {
		case 0: s = parse("{\"type\":[\"string\",\"null\"],\"maxLength\":3}"); break;
		case 1: s = parse("{\"type\":[\"integer\",\"boolean\"],\"minimum\":-5,\"maximum\":5}"); break;
		case 2: s = parse("{\"minimum\":-5,\"minLength\":1}"); break;
		case 3: s = parse("{\"maxItems\":2,\"required\":[\"a\"]}"); break;
		default: s = parse("{\"type\":[\"array\",\"object\",\"number\"],\"exclusiveMaximum\":0}");
		}
	}
	if (json_is_object(s) && rnd(5) == 0)
		json_object_set_new(s, "title", json_string("t"));
	return s;
}

/* ---- instances of random schemas ---- */

static void gen_inst(struct rgen *g, const json_t *s, int depth, struct strbuf *b);

/* A bound of integers as an inclusive integer (lower: ceilings; upper: floors); 0 if none. */
static int
int_bound_of(const json_t *s, int hi, int64_t *v)
{
	const json_t *m = json_object_get(s, hi ? "maximum" : "minimum");
	const json_t *e = json_object_get(s, hi ? "exclusiveMaximum" : "exclusiveMinimum");
	int set = 0;

	if (json_is_number(m)) {
		int excl = json_is_true(e);
		double d = json_number_value(m);
		int64_t x = json_is_integer(m) ? json_integer_value(m) : (int64_t)(hi ? floor(d) : ceil(d));

		if (excl)
			x = json_is_integer(m) || d == floor(d) ? x + (hi ? -1 : 1) : x;
		*v = x, set = 1;
	}
	if (json_is_number(e)) {
		double d = json_number_value(e);
		int64_t x = json_is_integer(e) ? json_integer_value(e) + (hi ? -1 : 1) :
		    (int64_t)(hi ? ceil(d) - 1 : floor(d) + 1);

		*v = !set ? x : hi ? MIN(*v, x) : MAX(*v, x), set = 1;
	}
	return set;
}

static void
inst_int(const json_t *s, struct strbuf *b)
{
	int64_t lo = 0, hi = 0;
	int has_lo = int_bound_of(s, 0, &lo), has_hi = int_bound_of(s, 1, &hi);
	uint64_t span;

	if (!has_lo && !has_hi)
		lo = rnd_signed(1 + (int)rnd(18)), hi = lo;
	else if (!has_lo)
		lo = hi - (int64_t)rnd(1000);
	else if (!has_hi)
		hi = lo + (int64_t)rnd(1000);
	span = (uint64_t)hi - (uint64_t)lo; /* below 2^64 - 1: bounds are within 9e18 */
	if (rnd(3) == 0)
		strbuf_printf(b, "%lld", (long long)(rnd(2) ? lo : hi));
	else
		strbuf_printf(b, "%lld", (long long)((uint64_t)lo + ((uint64_t)rng() << 32 | rng()) % (span + 1)));
}

/* Numbers (whole bounds, maybe exclusive), spelled without exponent, never -0. */
static void
inst_num(const json_t *s, struct strbuf *b)
{
	static const char *const fracs[] = { "", ".5", ".25", ".0", ".125", ".000" };
	const json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
	const json_t *emn = json_object_get(s, "exclusiveMinimum"), *emx = json_object_get(s, "exclusiveMaximum");
	double lo = -1e9, hi = 1e9;
	int lo_x = 0, hi_x = 0;
	char num[64];

	if (json_is_number(mn))
		lo = json_number_value(mn), lo_x = json_is_true(emn);
	if (json_is_number(emn) && (!json_is_number(mn) || json_number_value(emn) >= lo))
		lo = json_number_value(emn), lo_x = 1;
	if (json_is_number(mx))
		hi = json_number_value(mx), hi_x = json_is_true(emx);
	if (json_is_number(emx) && (!json_is_number(mx) || json_number_value(emx) <= hi))
		hi = json_number_value(emx), hi_x = 1;
	for (int tries = 0; tries < 100; tries++) {
		double whole = rnd(2) ? lo + (int)rnd(5) - 1 : hi - (int)rnd(5) + 1, v;

		snprintf(num, sizeof num, "%s%.0f%s", whole < 0 ? "-" : "", fabs(whole), fracs[rnd(ARRAY_LEN(fracs))]);
		v = strtod(num, NULL);
		if ((lo_x ? v > lo : v >= lo) && (hi_x ? v < hi : v <= hi) && !(v == 0 && num[0] == '-')) {
			strbuf_cat(b, num);
			return;
		}
	}
	snprintf(num, sizeof num, "%.1f", lo + 0.5); /* lo + 1 <= hi: always within */
	strbuf_cat(b, strcmp(num, "-0.0") == 0 ? "0.0" : num);
}

static void
inst_date(struct strbuf *b)
{
	static const int days[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	int y = 1 + (int)rnd(9999), m = 1 + (int)rnd(12), leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
	int d = 1 + (int)rnd((uint32_t)(days[m - 1] + (m == 2 && leap)));

	if (rnd(8) == 0)
		y = 2000 + 4 * (int)rnd(25), m = 2, d = 29;
	strbuf_printf(b, "%04d-%02d-%02d", y, m, d);
}

static void
inst_time(struct strbuf *b)
{
	strbuf_printf(b, "%02u:%02u:%02u", rnd(24), rnd(60), rnd(60));
	if (rnd(2))
		strbuf_printf(b, ".%u", rnd(1000000));
	if (rnd(2))
		strbuf_cat(b, "Z");
	else
		strbuf_printf(b, "%c%02u:%02u", rnd(2) ? '+' : '-', rnd(24), rnd(60));
}

static void
inst_str(struct rgen *g, const json_t *s, struct strbuf *b)
{
	const json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
	const json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
	int lo = mn != NULL ? (int)json_integer_value(mn) : 0, hi = mx != NULL ? (int)json_integer_value(mx) : lo + 6;

	if (pat != NULL) {
		for (int i = 0; i < g->n_pats; i++)
			if (strcmp(g->pats[i].text, json_string_value(pat)) == 0) {
				rpat_sample(&g->pats[i], b);
				return;
			}
		fail_msg("a pattern not made here: %s", json_string_value(pat));
	}
	strbuf_cat(b, "\"");
	if (fmt != NULL && strcmp(json_string_value(fmt), "uuid") == 0) {
		for (int i = 0; i < 32; i++)
			strbuf_printf(b, "%s%c", i == 8 || i == 12 || i == 16 || i == 20 ? "-" : "",
			    "0123456789abcdefABCDEF"[rnd(22)]);
	} else if (fmt != NULL) {
		if (strcmp(json_string_value(fmt), "time") != 0)
			inst_date(b);
		if (strcmp(json_string_value(fmt), "date-time") == 0)
			strbuf_cat(b, "T");
		if (strcmp(json_string_value(fmt), "date") != 0)
			inst_time(b);
	} else {
		for (int n = lo + (int)rnd((uint32_t)(MIN(hi, lo + 6) - lo + 1)); n > 0; n--)
			spell_cp(b, pool[rnd(ARRAY_LEN(pool))], 1);
	}
	strbuf_cat(b, "\"");
}

static void
inst_key(struct strbuf *b, const char *k)
{
	json_t *j = json_string(k);
	char *sp = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);

	strbuf_cat(b, sp);
	free(sp);
	json_decref(j);
}

/* "," and whitespace before a member or element but the first. */
static void
sep(struct strbuf *b, int *first)
{
	if (!*first)
		ws(b), strbuf_cat(b, ","), ws(b);
	*first = 0;
}

static void
inst_member(struct rgen *g, struct strbuf *b, const char *k, const json_t *v, int depth, int *first)
{
	sep(b, first);
	inst_key(b, k), ws(b), strbuf_cat(b, ":"), ws(b);
	gen_inst(g, v, depth + 1, b);
}

static int
named(const json_t *s, const char *k)
{
	const json_t *req = json_object_get(s, "required");

	for (size_t i = 0; i < json_array_size(req); i++)
		if (strcmp(json_string_value(json_array_get(req, i)), k) == 0)
			return 1;
	return json_object_get(json_object_get(s, "properties"), k) != NULL;
}

static void
inst_obj(struct rgen *g, const json_t *s, int depth, struct strbuf *b)
{
	const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
	const json_t *addl = json_object_get(s, "additionalProperties");
	const char *k;
	json_t *v;
	int first = 1;

	strbuf_cat(b, "{"), ws(b);
	json_object_foreach((json_t *)props, k, v) {
		int required = 0;

		for (size_t i = 0; i < json_array_size(req); i++)
			required |= strcmp(json_string_value(json_array_get(req, i)), k) == 0;
		if (required || (!json_is_false(v) && depth < 6 && rnd(2)))
			inst_member(g, b, k, v, depth, &first);
	}
	for (size_t i = 0; i < json_array_size(req); i++) {
		const char *r = json_string_value(json_array_get(req, i));
		int dup = json_object_get(props, r) != NULL;

		for (size_t j = 0; j < i; j++)
			dup |= strcmp(json_string_value(json_array_get(req, j)), r) == 0;
		if (!dup)
			inst_member(g, b, r, addl != NULL ? addl : json_true(), depth, &first);
	}
	if ((addl == NULL && props == NULL && req == NULL) || (addl != NULL && !json_is_false(addl)))
		for (uint32_t n = depth < 6 ? rnd(3) : 0; n > 0; n--) {
			const char *x = extra_pool[rnd(ARRAY_LEN(extra_pool))];

			if (!named(s, x))
				inst_member(g, b, x, addl != NULL ? addl : json_true(), depth, &first);
		}
	if (!first) /* one whitespace between "{" and "}" */
		ws(b);
	strbuf_cat(b, "}");
}

static void
inst_arr(struct rgen *g, const json_t *s, int depth, struct strbuf *b)
{
	const json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
	const json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
	long k = (long)json_array_size(prefix), lo = mn != NULL ? (long)json_integer_value(mn) : 0;
	long hi = mx != NULL ? (long)json_integer_value(mx) : LONG_MAX;
	long top = MIN(hi, json_is_false(items) ? k : MAX(lo, k) + 2);
	long n = depth >= 6 ? lo : lo + (long)rnd((uint32_t)(top - lo + 1));
	int first = 1;

	strbuf_cat(b, "["), ws(b);
	for (long i = 0; i < n; i++) {
		sep(b, &first);
		gen_inst(g, i < k ? json_array_get(prefix, (size_t)i) : items != NULL ? items : json_true(), depth + 1,
		    b);
	}
	if (!first)
		ws(b);
	strbuf_cat(b, "]");
}

/* 1 if s constrains nothing (true, or annotations only). */
static int
is_trivial(const json_t *s)
{
	size_t n = json_object_size(s);

	if (json_is_true(s) || (json_is_object(s) && n == 0))
		return 1;
	return n == 1 && (json_object_get(s, "description") != NULL || json_object_get(s, "title") != NULL);
}

/* The types of a schema without type: those whose keywords it has, or any. */
static const char *
pick_type(const json_t *s)
{
	static const char *const names[] = { "null", "boolean", "object", "array", "string", "integer", "number" };
	const json_t *t = json_object_get(s, "type");
	const char *kinds[4];
	int n = 0;

	if (json_is_string(t))
		return json_string_value(t);
	if (json_is_array(t))
		return json_string_value(json_array_get(t, rnd((uint32_t)json_array_size(t))));
	if (json_object_get(s, "required") || json_object_get(s, "properties") ||
	    json_object_get(s, "additionalProperties"))
		kinds[n++] = "object";
	if (json_object_get(s, "maxItems") || json_object_get(s, "minItems") || json_object_get(s, "items"))
		kinds[n++] = "array";
	if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
		kinds[n++] = "string";
	if (json_object_get(s, "minimum") || json_object_get(s, "exclusiveMaximum"))
		kinds[n++] = "number";
	return n > 0 ? kinds[rnd((uint32_t)n)] : names[rnd(ARRAY_LEN(names))];
}

static void
gen_inst(struct rgen *g, const json_t *s, int depth, struct strbuf *b)
{
	const json_t *v, *en = json_object_get(s, "enum");
	const char *t;

	if (json_is_true(s) || (is_trivial(s) && rnd(2))) {
		any_value(b, depth > 4 ? 3 : 0);
	} else if ((v = json_object_get(s, "$ref")) != NULL) {
		gen_inst(g, json_object_get(g->defs, json_string_value(v) + strlen("#/$defs/")), depth + 1, b);
	} else if ((v = json_object_get(s, "anyOf")) != NULL || (v = json_object_get(s, "oneOf")) != NULL) {
		gen_inst(g, json_array_get(v, rnd((uint32_t)json_array_size(v))), depth + 1, b);
	} else if ((v = json_object_get(s, "allOf")) != NULL) {
		const json_t *only = json_true(); /* the branch that constrains, if one does */

		for (size_t i = 0; i < json_array_size(v); i++)
			if (!is_trivial(json_array_get(v, i)))
				only = json_array_get(v, i);
		gen_inst(g, only, depth + 1, b);
	} else if (en != NULL || json_object_get(s, "const") != NULL) {
		const char *type = json_string_value(json_object_get(s, "type"));
		const json_t *pick = json_object_get(s, "const");
		char *sp;

		do /* a value of the type, if one is given */
			pick = en != NULL ? json_array_get(en, rnd((uint32_t)json_array_size(en))) : pick;
		while (type != NULL && !type_has(type, pick));
		sp = json_dumps(pick, JSON_COMPACT | JSON_ENCODE_ANY);
		strbuf_cat(b, sp);
		free(sp);
	} else if (strcmp(t = pick_type(s), "null") == 0 || strcmp(t, "boolean") == 0) {
		strbuf_cat(b, t[0] == 'n' ? "null" : rnd(2) ? "true" : "false");
	} else if (strcmp(t, "integer") == 0) {
		inst_int(s, b);
	} else if (strcmp(t, "number") == 0) {
		inst_num(s, b);
	} else if (strcmp(t, "string") == 0) {
		inst_str(g, s, b);
	} else if (strcmp(t, "array") == 0) {
		inst_arr(g, s, depth, b);
	} else {
		inst_obj(g, s, depth, b);
	}
}

static void
test_random(void **state)
{
	int n_schemas = 1000, n_inst = 0;
	double t0 = now_s();

	(void)state;
	for (int i = 0; i < n_schemas; i++) {
		struct rgen g = { 0 };
		json_t *s = gen_schema(&g, 0);
		struct grammar *gr;
		char *text, *sch;

		if (g.defs != NULL) {
			if (!json_is_object(s))
				s = json_pack("{s:[o]}", "anyOf", s);
			json_object_set_new(s, "$defs", g.defs);
		}
		sch = json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY);
		gr = compile_json(s, &text);
		for (int k = 0; k < 4; k++, n_inst++) {
			struct strbuf b = { 0 };
			json_t *parsed;

			gen_inst(&g, s, 0, &b);
			if ((parsed = json_loads(b.s, JSON_DECODE_ANY, NULL)) == NULL)
				fail_msg("the instance is not JSON: %s\nschema %s", b.s, sch);
			json_decref(parsed);
			if (!matches_both(gr, b.s))
				fail_msg("schema %d: %s\ninstance %s\n%s", i, sch, b.s, text);
			free(b.s);
		}
		grammar_free(gr);
		free(text), free(sch);
		for (int k = 0; k < g.n_pats; k++)
			rpat_free(&g.pats[k]);
		json_decref(s);
	}
	print_message("random: %d schemas, %d instances, %.2f s\n", n_schemas, n_inst, now_s() - t0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scalars),
		cmocka_unit_test(test_objects),
		cmocka_unit_test(test_enum_const),
		cmocka_unit_test(test_arrays),
		cmocka_unit_test(test_combinators),
		cmocka_unit_test(test_refs),
		cmocka_unit_test(test_integers),
		cmocka_unit_test(test_numbers),
		cmocka_unit_test(test_strings),
		cmocka_unit_test(test_patterns),
		cmocka_unit_test(test_formats),
		cmocka_unit_test(test_whitespace),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_hostile),
		cmocka_unit_test(test_random),
	};
	const char *seed = getenv("TEST_JSCHEMA_SEED");

	rng_state = seed != NULL && *seed != '\0' ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL) * 2654435761u + 1;
	rng_state += rng_state == 0; /* xorshift stays at 0 */
	printf("test_jschema: seed %llu (TEST_JSCHEMA_SEED=%llu repeats this run)\n", (unsigned long long)rng_state,
	    (unsigned long long)rng_state);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
