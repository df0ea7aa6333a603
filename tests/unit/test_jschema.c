/*
 * test_jschema.c: JSON Schema -> grammar (daemon/engine/jschema.c). Each
 * schema's grammar text is compiled by grammar.c and whole instances are
 * matched against it, fed at once and a byte at a time: those that
 * validate must be accepted in the spellings the header promises, and
 * those that do not (or are spelled otherwise) refused. Refusals name
 * the exact JSON pointer; hostile schemas are refused quickly; and a
 * seeded generator of random schemas of the supported subset, with
 * random valid instances of each (jschema_gen.c), checks that every one
 * is accepted. TEST_JSCHEMA_SEED=N repeats a run.
 */
#include "config.h"
#include "jschema.h"
#include "grammar.h"
#include "util.h"
#include "jschema_gen.h"
#include "rng_seed.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

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
	/* typed branches beside ones that type their values by enum: disjoint */
	check("{\"oneOf\":[{\"type\":\"array\",\"maxItems\":1},{\"enum\":[null,\"a\"]},{\"type\":\"integer\"}]}",
	    YES("[]", "null", "\"a\"", "7"), NO("\"b\"", "true"));
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
	/* $id below the root would make "#/$defs/a" inside it mean its own $defs */
	refused("{\"$defs\":{\"a\":{\"type\":\"string\"}},\"properties\":{\"p\":{\"$id\":\"http://x.example/s\","
	    "\"$defs\":{\"a\":{\"type\":\"integer\"}},\"$ref\":\"#/$defs/a\"}}}", ERR_UNSUPPORTED,
	    "json_schema at /properties/p/$id: $id below the root");
	refused("{\"$defs\":{\"a\":{\"$id\":\"a.json\",\"type\":\"string\"}},\"$ref\":\"#/$defs/a\"}", ERR_UNSUPPORTED,
	    "json_schema at /$defs/a/$id: ");
	/* a branch without type validates every type, whatever it generates: null is valid under both */
	refused("{\"oneOf\":[{\"type\":\"null\"},{\"items\":{\"const\":1}}]}", ERR_UNSUPPORTED,
	    "json_schema at /oneOf/1: a value may match this and oneOf/0");
	refused("{\"oneOf\":[{\"maxItems\":2},{\"type\":\"boolean\"}]}", ERR_UNSUPPORTED,
	    "json_schema at /oneOf/1: a value may match this and oneOf/0");
	refused("{\"oneOf\":[{\"enum\":[1]},{\"maxLength\":3}]}", ERR_UNSUPPORTED, "json_schema at /oneOf/1: ");
	refused("{\"oneOf\":[{\"type\":\"array\"},{\"properties\":{},\"additionalProperties\":false}]}",
	    ERR_UNSUPPORTED, "json_schema at /oneOf/1: ");
	refused("{\"$defs\":{\"o\":{\"properties\":{\"a\":true}}},\"oneOf\":[{\"anyOf\":[{\"$ref\":\"#/$defs/o\"}]},"
	    "{\"type\":\"string\"}]}", ERR_UNSUPPORTED, "json_schema at /oneOf/1: ");
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

/*
 * This thread's CPU seconds: what the bounds below hold, whatever else the
 * machine runs (a loaded 2-core CI machine made a wall-clock bound flaky).
 */
static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A bound in CPU seconds: a second, four under the sanitizers (their checks slow every access). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define FAST_S 4.0
#else
#define FAST_S 1.0
#endif

/* schema (taken) refused with code, err starting with what and holding also (if not NULL), within FAST_S. */
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
	if (dt > FAST_S)
		fail_msg("'%s' took %.2f s of CPU", err, dt);
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
		assert_true(now_s() - t0 < FAST_S);
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

	rng_state = test_seed("test_jschema", "TEST_JSCHEMA_SEED");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
