/*
 * jschema.c: JSON Schema -> grammar text (jschema.h). Each schema object
 * becomes one rule `s<N>` (memoised by its address, so that $ref may
 * recurse), its objects, arrays and counts helper rules named after it;
 * rules that only repeat text (integer ranges, patterns' pieces, counted
 * strings) are shared by their bodies; fixed rules (ws, string, value,
 * the formats...) are written once at the end, those used.
 *
 * A reference that consumes no text before it (anyOf, oneOf, allOf, $ref)
 * is an edge of a graph checked once everything is compiled: a cycle
 * there is left recursion, which grammar.c would refuse without saying
 * where in the schema it comes from. The same graph, acyclic then, gives
 * each schema the JSON types it may generate, which is what oneOf's
 * disjointness needs.
 *
 * This file is the walk over schemas (their keywords and references) and
 * the compiler's rules and errors; jschema_graph.c checks the graph once
 * the walk is done. The text inside a value that bounds and patterns narrow reads one
 * keyword's value alone and has grammars of its own (digit ranges, sets
 * of code points, the pattern subset): jschema_text.c spells it, writing
 * its rules through the functions jschema_int.h shares.
 */
#include "config.h"
#include "jschema.h"
#include "jschema_int.h"
#include "grammar.h"
#include "util.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Most bytes of a JSON pointer shown in a message (its last ones). */
#define MAX_SHOWN 96

/* ---- text ---- */

/* Empties b, keeping its memory. */
void
js_sb_clear(struct strbuf *b)
{
	b->n = 0;
	if (b->s != NULL)
		b->s[0] = '\0';
}

/* The string b holds ("" when it never grew). */
static const char *
sb_str(const struct strbuf *b)
{
	return b->s != NULL ? b->s : "";
}

/* One code point inside a grammar literal or class: ASCII letters, digits and a few marks raw, the rest escaped. */
void
js_gl_cp(struct strbuf *b, uint32_t cp)
{
	if (cp < 0x7f && cp >= 0x20 && strchr("\"\\[]-^'#", (int)cp) == NULL)
		strbuf_add(b, (const char *)&(char){ (char)cp }, 1);
	else if (cp < 0x80)
		strbuf_printf(b, "\\x%02X", cp);
	else if (cp <= 0xffff)
		strbuf_printf(b, "\\u%04X", cp);
	else
		strbuf_printf(b, "\\U%08X", cp);
}

/* A grammar literal matching the n bytes of s (UTF-8): ASCII escaped as needed, the rest raw. */
static void
gl_lit(struct strbuf *b, const char *s, size_t n)
{
	strbuf_cat(b, "\"");
	for (size_t i = 0; i < n; i++) {
		unsigned char u = (unsigned char)s[i];

		if (u >= 0x80)
			strbuf_add(b, s + i, 1);
		else
			js_gl_cp(b, u);
	}
	strbuf_cat(b, "\"");
}

/* The code point of the UTF-8 sequence at s (valid, as jansson keeps strings); its length in *len. */
uint32_t
js_utf8_cp(const char *s, size_t avail, int *len)
{
	const unsigned char *u = (const unsigned char *)s;
	int n = utf8_seq_len(u, avail);

	*len = n > 0 ? n : 1;
	return n > 0 ? utf8_decode(u, n) : u[0];
}

/* The value of hexadecimal digit ch; -1 if it is none. */
int
js_hex_val(char ch)
{
	int lower = ch | 0x20;

	return ch >= '0' && ch <= '9' ? ch - '0' : lower >= 'a' && lower <= 'f' ? lower - 'a' + 10 : -1;
}

/* " | " before an alternative, unless b is empty (the first). */
void
js_alt(struct strbuf *b)
{
	if (b->n > 0)
		strbuf_cat(b, " | ");
}

/* ---- fixed rules ---- */

#define B(x) (1ull << (x))

/*
 * In the bodies, \x22 is '"' and \x5C is '\' (what JSON spells with them);
 * deps are the fixed rules a body names.
 */
static const struct {
	const char *name, *body;
	uint64_t deps;
} fixed_rules[FX_COUNT] = {
	[FX_WS] = { "ws", "[ \\t] | \"\\n\" [ \\t]{0," STR(JSCHEMA_MAX_INDENT) "} | \"\"", 0 },
	[FX_HX] = { "hx", "[0-9a-fA-F]", 0 },
	/* \uXXXX: not 0000, a surrogate only as a high one then a low one */
	[FX_JU] = { "ju", "\"000\" [1-9a-fA-F] | \"00\" [1-9a-fA-F] hx | \"0\" [1-9a-fA-F] hx hx | "
	    "[1-9a-cA-CeEfF] hx hx hx | [dD] [0-7] hx hx | "
	    "[dD] [89abAB] hx hx \"\\x5Cu\" [dD] [c-fC-F] hx hx", B(FX_HX) },
	[FX_JESC] = { "jesc", "[\\x22\\x5C/bfnrt] | \"u\" ju", B(FX_JU) },
	[FX_JCHAR] = { "jchar", "[^\\x22\\x5C\\x00-\\x1F] | \"\\x5C\" jesc", B(FX_JESC) },
	[FX_STRING] = { "string", "\"\\x22\" jchar* \"\\x22\"", B(FX_JCHAR) },
	[FX_INTEGER] = { "integer", "\"-\"? ( \"0\" | [1-9] [0-9]* )", 0 },
	[FX_NUMBER] = { "number", "integer ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?", B(FX_INTEGER) },
	[FX_VALUE] = { "value", "object | array | string | number | \"true\" | \"false\" | \"null\"",
	    B(FX_OBJECT) | B(FX_ARRAY) | B(FX_STRING) | B(FX_NUMBER) },
	[FX_OBJECT] = { "object", "\"{\" ws ( \"}\" | member object-more )", B(FX_WS) | B(FX_MEMBER) | B(FX_OBJMORE) },
	[FX_OBJMORE] = { "object-more", "ws ( \"}\" | \",\" ws member object-more )", B(FX_WS) | B(FX_MEMBER) },
	[FX_MEMBER] = { "member", "string ws \":\" ws value", B(FX_STRING) | B(FX_WS) | B(FX_VALUE) },
	[FX_ARRAY] = { "array", "\"[\" ws ( \"]\" | value array-more )", B(FX_WS) | B(FX_VALUE) | B(FX_ARRMORE) },
	[FX_ARRMORE] = { "array-more", "ws ( \"]\" | \",\" ws value array-more )", B(FX_WS) | B(FX_VALUE) },
	[FX_NEVER] = { "never", "[^\\x00-\\U0010FFFF]", 0 },
	[FX_KEYTAIL] = { "key-tail", "[^\\x22\\x5C\\x00-\\x1F]* \"\\x22\"", 0 },
	[FX_KEY] = { "key", "\"\\x22\" key-tail", B(FX_KEYTAIL) },
	[FX_FRAC] = { "frac", "\".\" [0-9]+", 0 },
	[FX_FRACNZ] = { "frac-nz", "\".\" \"0\"* [1-9] [0-9]*", 0 },
	[FX_FRACZ] = { "frac-z", "\".\" \"0\"+", 0 },
	[FX_CTL] = { "ctl", "\"\\x5C\" [bfnrt] | \"\\x5Cu00\" ( \"0\" [1-9a-fA-F] | \"1\" hx )", B(FX_HX) },
	[FX_PCHAR] = { "pchar", "[^\\x22\\x5C\\x00-\\x1F] | \"\\x5C\\x22\" | \"\\x5C\\x5C\" | ctl", B(FX_CTL) },
	[FX_YEAR] = { "year", "\"000\" [1-9] | \"00\" [1-9] [0-9] | \"0\" [1-9] [0-9] [0-9] | "
	    "[1-9] [0-9] [0-9] [0-9]", 0 },
	/* the last two digits of a leap year not divisible by 100 (or the first two of one that is) */
	[FX_LEAPYY] = { "leap-yy", "\"0\" [48] | [2468] [048] | [13579] [26]", 0 },
	[FX_LEAP] = { "leap-year", "[0-9] [0-9] leap-yy | leap-yy \"00\"", B(FX_LEAPYY) },
	[FX_MDAY] = { "month-day", "( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "
	    "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | "
	    "\"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] )", 0 },
	[FX_DATE] = { "date", "year \"-\" month-day | leap-year \"-02-29\"", B(FX_YEAR) | B(FX_LEAP) | B(FX_MDAY) },
	[FX_TIME] = { "time", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] frac? "
	    "( \"Z\" | [-+] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )", B(FX_FRAC) },
	[FX_DATETIME] = { "date-time", "date \"T\" time", B(FX_DATE) | B(FX_TIME) },
	[FX_UUID] = { "uuid", "hx{8} \"-\" hx{4} \"-\" hx{4} \"-\" hx{4} \"-\" hx{12}", B(FX_HX) },
};

/* ---- JSON pointers and errors ---- */

/* Appends "/token" (n bytes, ~ and / escaped) to the pointer b; returns the length to restore. */
static size_t
ptr_push(struct strbuf *b, const char *s, size_t n)
{
	size_t old = b->n;

	strbuf_cat(b, "/");
	for (size_t i = 0; i < n; i++)
		if (s[i] == '~' || s[i] == '/')
			strbuf_cat(b, s[i] == '~' ? "~0" : "~1");
		else
			strbuf_add(b, s + i, 1);
	return old;
}

static size_t
path_push(struct jsc *c, const char *s, size_t n)
{
	return ptr_push(&c->path, s, n);
}

static size_t
path_index(struct jsc *c, size_t i)
{
	size_t old = c->path.n;

	strbuf_printf(&c->path, "/%zu", i);
	return old;
}

static void
path_pop(struct jsc *c, size_t old)
{
	c->path.n = old;
	if (c->path.s != NULL)
		c->path.s[old] = '\0';
}

/* An error at the path (and keyword key, if not NULL): "json_schema at /a/b: message". */
int
js_err(struct jsc *c, int code, const char *key, const char *fmt, ...)
{
	char msg[ERR_LEN];
	size_t old = key != NULL ? path_push(c, key, strlen(key)) : c->path.n;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (c->path.n > MAX_SHOWN) { /* its end, where the fault is, and room for the message */
		const char *tail = c->path.s + c->path.n - MAX_SHOWN;

		if (strchr(tail, '/') != NULL) /* from a token's start */
			tail = strchr(tail, '/');
		while (((unsigned char)*tail & 0xc0) == 0x80)
			tail++;
		err_set(c->err, code, "json_schema at ...%s: %s", tail, msg);
	} else if (c->path.n > 0)
		err_set(c->err, code, "json_schema at %s: %s", sb_str(&c->path), msg);
	else
		err_set(c->err, code, "json_schema: %s", msg);
	path_pop(c, old);
	return code;
}

/* ---- rules ---- */

/*
 * Adds to *rules and *elems what grammar.c makes of a rule's body, at
 * most: a rule per group, and per repetition its item's rule and the
 * optionals or loop that lower it (x{2,5}: two copies of x, three
 * optionals of four elements); an element per byte of text at most.
 */
static void
lowered_size(const char *body, uint64_t *rules, uint64_t *elems)
{
	const char *p = body;

	*rules += 1, *elems += strlen(body) + 1;
	while (*p != '\0') {
		if (*p == '"' || *p == '[') { /* a literal or a class, escapes and all */
			char close = *p == '"' ? '"' : ']';

			for (p++; *p != '\0' && *p != close; p += p[0] == '\\' && p[1] != '\0' ? 2 : 1)
				;
		} else if (*p == '(') {
			*rules += 1;
		} else if (*p == '*' || *p == '+' || *p == '?') {
			*rules += 2, *elems += 8;
		} else if (*p == '{') {
			char *end;
			unsigned long lo = strtoul(p + 1, &end, 10), hi = lo;

			if (*end == ',')
				hi = end[1] == '}' ? lo + 1 : strtoul(end + 1, &end, 10);
			*rules += 2 + (hi - lo), *elems += lo + 4 * (hi - lo) + 8;
		}
		p += *p != '\0';
	}
}

static int
rule_add(struct jsc *c, const char *name, const char *body)
{
	if (++c->n_rules > JSCHEMA_MAX_RULES)
		return js_err(c, ERR_RANGE, NULL, "the grammar needs more than %d rules", JSCHEMA_MAX_RULES);
	lowered_size(body, &c->low_rules, &c->low_elems);
	if (c->low_rules > GRAM_MAX_RULES || c->low_elems > GRAM_MAX_ELEMS)
		return js_err(c, ERR_RANGE, NULL, "the grammar's counts would expand past grammar.c's limits "
		    "(%d rules, %d elements)", GRAM_MAX_RULES, GRAM_MAX_ELEMS);
	if (c->out.n + strlen(name) + strlen(body) + 6 > GRAM_MAX_TEXT)
		return js_err(c, ERR_RANGE, NULL, "the grammar would exceed its limit of %d bytes", GRAM_MAX_TEXT);
	strbuf_cat(&c->out, name);
	strbuf_cat(&c->out, " ::= ");
	strbuf_cat(&c->out, body);
	strbuf_cat(&c->out, "\n");
	return 0;
}

/* The rule whose body is body, made the first time (name: r<id>). */
int
js_rule_shared(struct jsc *c, const char *body, char *name)
{
	uint32_t h = hash32(body, strlen(body)), i;
	int rc;

	if (2 * (c->n_shared + 1) > c->shared_cap) { /* rehash at half full */
		uint32_t cap = c->shared_cap ? 2 * c->shared_cap : 64;
		struct jshared *t = xcalloc(cap, sizeof *t);

		for (uint32_t k = 0; k < c->shared_cap; k++)
			if (c->shared[k].body != NULL) {
				for (i = hash32(c->shared[k].body, strlen(c->shared[k].body)) & (cap - 1);
				    t[i].body != NULL; i = (i + 1) & (cap - 1))
					;
				t[i] = c->shared[k];
			}
		free(c->shared);
		c->shared = t, c->shared_cap = cap;
	}
	for (i = h & (c->shared_cap - 1); c->shared[i].body != NULL; i = (i + 1) & (c->shared_cap - 1))
		if (strcmp(c->shared[i].body, body) == 0) {
			snprintf(name, NAME_LEN, "r%u", c->shared[i].id);
			return 0;
		}
	snprintf(name, NAME_LEN, "r%u", c->n_shared);
	if ((rc = rule_add(c, name, body)) != 0)
		return rc;
	c->shared[i] = (struct jshared){ xstrdup(body), c->n_shared++ };
	return 0;
}

/* The name of fixed rule f, marked used. */
const char *
js_fixed(struct jsc *c, enum fixed_rule f)
{
	c->fixed |= B(f);
	return fixed_rules[f].name;
}

/* Appends the fixed rules used (and those they name). */
static int
fixed_emit(struct jsc *c)
{
	uint64_t prev = 0;
	int rc;

	while (prev != c->fixed) {
		prev = c->fixed;
		for (int f = 0; f < FX_COUNT; f++)
			if (c->fixed & B(f))
				c->fixed |= fixed_rules[f].deps;
	}
	for (int f = 0; f < FX_COUNT; f++)
		if ((c->fixed & B(f)) && (rc = rule_add(c, fixed_rules[f].name, fixed_rules[f].body)) != 0)
			return rc;
	return 0;
}

/* ---- JSON values (enum, const) ---- */

static int
value_type(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_NULL: return T_NULL;
	case JSON_TRUE:
	case JSON_FALSE: return T_BOOL;
	case JSON_OBJECT: return T_OBJ;
	case JSON_ARRAY: return T_ARR;
	case JSON_STRING: return T_STR;
	case JSON_INTEGER: return T_INT;
	default: return json_real_value(v) == floor(json_real_value(v)) ? T_INT : T_FRAC;
	}
}

/* 1 if integer i and real r are the same number (exactly: no rounding of i to a double). */
static int
int_is_real(const json_t *i, const json_t *r)
{
	double d = json_real_value(r);

	return d == floor(d) && fabs(d) < 9.2e18 && (json_int_t)d == json_integer_value(i);
}

/* JSON Schema's equality: numbers by value (1 equals 1.0), objects whatever their order. */
int
js_value_equal(const json_t *a, const json_t *b)
{
	const char *k;
	size_t n, i;
	json_t *v;

	if (json_is_integer(a) && json_is_real(b))
		return int_is_real(a, b);
	if (json_is_real(a) && json_is_integer(b))
		return int_is_real(b, a);
	if (json_typeof(a) != json_typeof(b))
		return 0;
	switch (json_typeof(a)) {
	case JSON_INTEGER:
		return json_integer_value(a) == json_integer_value(b);
	case JSON_REAL:
		return json_real_value(a) == json_real_value(b);
	case JSON_STRING:
		return json_string_length(a) == json_string_length(b) &&
		    memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
	case JSON_ARRAY:
		if (json_array_size(a) != json_array_size(b))
			return 0;
		for (i = 0; i < json_array_size(a); i++)
			if (!js_value_equal(json_array_get(a, i), json_array_get(b, i)))
				return 0;
		return 1;
	case JSON_OBJECT:
		if (json_object_size(a) != json_object_size(b))
			return 0;
		json_object_keylen_foreach((json_t *)a, k, n, v) {
			const json_t *w = json_object_getn(b, k, n);

			if (w == NULL || !js_value_equal(v, w))
				return 0;
		}
		return 1;
	default:
		return 1;
	}
}

/* A hash that equal values (js_value_equal) share. */
uint32_t
js_value_hash(const json_t *v)
{
	const char *k;
	uint32_t h = (uint32_t)json_typeof(v), sum = 0;
	double d;
	size_t n;
	json_t *w;

	switch (json_typeof(v)) {
	case JSON_INTEGER:
	case JSON_REAL:
		d = json_number_value(v) + 0.0; /* -0.0 as 0.0 */
		return hash32(&d, sizeof d) ^ 7u;
	case JSON_STRING:
		return hash32(json_string_value(v), json_string_length(v)) ^ 11u;
	case JSON_ARRAY:
		for (size_t i = 0; i < json_array_size(v); i++)
			h = h * 31 + js_value_hash(json_array_get(v, i));
		return h;
	case JSON_OBJECT:
		json_object_keylen_foreach((json_t *)v, k, n, w)
			sum += (hash32(k, n) ^ 13u) * 2654435761u ^ js_value_hash(w);
		return sum;
	default:
		return h;
	}
}

/*
 * The values s's enum and const allow (both: those of enum equal to
 * const) whose types meet mask, into *out (malloc'd). Returns their
 * number, or a negative ERR_*.
 */
int
js_enum_values(struct jsc *c, const json_t *s, int mask, const json_t ***out)
{
	const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
	const char *key = en != NULL ? "enum" : "const";
	size_t n = en != NULL ? json_array_size(en) : 1;
	int k = 0;

	*out = NULL;
	if (en != NULL && (!json_is_array(en) || n == 0))
		return js_err(c, ERR_INVAL, "enum", "enum must be an array of values");
	if (n > JSCHEMA_MAX_ENUM)
		return js_err(c, ERR_RANGE, "enum", "%zu values, above the limit of %d", n, JSCHEMA_MAX_ENUM);
	*out = xcalloc(n, sizeof **out);
	for (size_t i = 0; i < n; i++) {
		const json_t *v = en != NULL ? json_array_get(en, i) : cn;

		if ((value_type(v) & mask) && (en == NULL || cn == NULL || js_value_equal(v, cn)))
			(*out)[k++] = v;
	}
	if (k == 0) {
		free(*out);
		*out = NULL;
		return js_err(c, ERR_INVAL, key, "no value satisfies enum, const and type together");
	}
	return k;
}

/* ---- tries of spellings (enum values, named keys) ---- */

struct tnode {
	uint32_t cp, child, next; /* child, next: 0 for none (the root is no one's child) */
	int term;
};

struct trie {
	struct tnode *n;
	uint32_t len, cap;
};

static void
trie_add(struct trie *t, const char *s, size_t n)
{
	uint32_t cur = 0, cp, k;
	int len;

	if (t->len == 0) {
		t->n = xgrow(t->n, &t->cap, 1, sizeof *t->n);
		t->n[t->len++] = (struct tnode){ 0, 0, 0, 0 };
	}
	for (size_t i = 0; i < n; i += (size_t)len) {
		cp = js_utf8_cp(s + i, n - i, &len);
		for (k = t->n[cur].child; k != 0 && t->n[k].cp != cp; k = t->n[k].next)
			;
		if (k == 0) {
			t->n = xgrow(t->n, &t->cap, t->len + 1, sizeof *t->n);
			k = t->len++;
			t->n[k] = (struct tnode){ cp, 0, t->n[cur].child, 0 };
			t->n[cur].child = k;
		}
		cur = k;
	}
	t->n[cur].term = 1;
}

/*
 * The alternatives of the spellings in t from node x into b: each child's
 * chain of single children as one literal, then the rule of where it
 * branches (named base-e<k>, queued) or nothing at a leaf.
 */
static void
trie_alts(const struct trie *t, uint32_t x, uint32_t base, uint32_t **queue, uint32_t *nq, uint32_t *cap,
    struct strbuf *b)
{
	for (uint32_t ch = t->n[x].child; ch != 0; ch = t->n[ch].next) {
		uint32_t d = ch;

		if (b->n > 0)
			strbuf_cat(b, " | ");
		strbuf_cat(b, "\"");
		js_gl_cp(b, t->n[d].cp);
		while (!t->n[d].term && t->n[d].child != 0 && t->n[t->n[d].child].next == 0) {
			d = t->n[d].child;
			js_gl_cp(b, t->n[d].cp);
		}
		strbuf_cat(b, "\"");
		if (t->n[d].child != 0) {
			*queue = xgrow(*queue, cap, *nq + 1, sizeof **queue);
			(*queue)[(*nq)++] = d;
			strbuf_printf(b, " s%u-e%u", base, d);
		}
	}
	if (t->n[x].term)
		strbuf_cat(b, b->n > 0 ? " | \"\"" : "\"\"");
}

/* Alternatives matching exactly the compact spellings of vals into body; base names the helper rules. */
static int
enum_body(struct jsc *c, uint32_t base, const json_t *const *vals, int n, struct strbuf *body)
{
	struct trie t = { 0 };
	struct strbuf b = { 0 };
	uint32_t *queue = NULL, nq = 0, cap = 0;
	char name[NAME_LEN];
	int rc = 0;

	for (int i = 0; i < n; i++) {
		char *sp = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY);

		trie_add(&t, sp, strlen(sp));
		free(sp);
	}
	trie_alts(&t, 0, base, &queue, &nq, &cap, body);
	for (uint32_t q = 0; q < nq && rc == 0; q++) {
		js_sb_clear(&b);
		trie_alts(&t, queue[q], base, &queue, &nq, &cap, &b);
		snprintf(name, sizeof name, "s%u-e%u", base, queue[q]);
		rc = rule_add(c, name, b.s);
	}
	free(t.n), free(b.s), free(queue);
	return rc;
}

/* 1 if cp may be in a key spelled without escapes. */
static int
key_char(uint32_t cp)
{
	return cp >= 0x20 && cp != '"' && cp != '\\';
}

/*
 * The rule (base-key) of the keys without escapes that are none of the n
 * named ones: a rule per node of their trie, which leaves it for any
 * other character, and may end where no name does.
 */
static int
other_keys(struct jsc *c, uint32_t base, const char *const *keys, const size_t *lens, int n, char *name)
{
	struct trie t = { 0 };
	struct strbuf b = { 0 };
	char rn[NAME_LEN];
	int rc = 0, len;

	for (int i = 0; i < n; i++) {
		size_t j;

		for (j = 0; j < lens[i] && key_char(js_utf8_cp(keys[i] + j, lens[i] - j, &len)); j += (size_t)len)
			;
		if (j == lens[i])
			trie_add(&t, keys[i], lens[i]);
	}
	if (t.len == 0) {
		snprintf(name, NAME_LEN, "%s", js_fixed(c, FX_KEY));
		return 0;
	}
	for (uint32_t x = 0; x < t.len && rc == 0; x++) {
		js_sb_clear(&b);
		strbuf_cat(&b, t.n[x].term ? "" : "\"\\x22\" | ");
		for (uint32_t ch = t.n[x].child; ch != 0; ch = t.n[ch].next) {
			strbuf_cat(&b, "\"");
			js_gl_cp(&b, t.n[ch].cp);
			strbuf_printf(&b, "\" s%u-x%u | ", base, ch);
		}
		strbuf_cat(&b, "[^\\x22\\x5C\\x00-\\x1F");
		for (uint32_t ch = t.n[x].child; ch != 0; ch = t.n[ch].next)
			js_gl_cp(&b, t.n[ch].cp);
		strbuf_printf(&b, "] %s", js_fixed(c, FX_KEYTAIL));
		snprintf(rn, sizeof rn, "s%u-x%u", base, x);
		rc = rule_add(c, rn, b.s);
	}
	snprintf(name, NAME_LEN, "s%u-key", base);
	snprintf(rn, sizeof rn, "\"\\x22\" s%u-x0", base);
	free(t.n), free(b.s);
	return rc != 0 ? rc : rule_add(c, name, rn);
}

/* ---- strings ---- */

/* A count (a non-negative integer up to GRAM_MAX_REPEAT) at key into *v; *set whether there is one. */
static int
count_read(struct jsc *c, const json_t *s, const char *key, long *v, int *set)
{
	const json_t *j = json_object_get(s, key);

	*set = j != NULL, *v = 0;
	if (j == NULL)
		return 0;
	if (!json_is_integer(j) || json_integer_value(j) < 0)
		return js_err(c, ERR_INVAL, key, "%s must be a non-negative integer", key);
	if (json_integer_value(j) > GRAM_MAX_REPEAT)
		return js_err(c, ERR_RANGE, key, "%s above the limit of %d", key, GRAM_MAX_REPEAT);
	*v = (long)json_integer_value(j);
	return 0;
}

/* Reads the counts at kmin and kmax (max LONG_MAX when absent); *any: neither is there. */
static int
counts_read(struct jsc *c, const json_t *s, const char *kmin, const char *kmax, long *lo, long *hi, int *any)
{
	int set_lo, set_hi, rc;

	if ((rc = count_read(c, s, kmin, lo, &set_lo)) != 0 || (rc = count_read(c, s, kmax, hi, &set_hi)) != 0)
		return rc;
	if (!set_hi)
		*hi = LONG_MAX;
	*any = !set_lo && !set_hi;
	return *lo > *hi ? js_err(c, ERR_INVAL, kmax, "%s below %s", kmax, kmin) : 0;
}

static int
string_item(struct jsc *c, const json_t *s, struct strbuf *b)
{
	static const struct {
		const char *name;
		enum fixed_rule rule;
	} formats[] = { { "date", FX_DATE }, { "time", FX_TIME }, { "date-time", FX_DATETIME }, { "uuid", FX_UUID } };
	const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
	struct strbuf body = { 0 };
	char name[NAME_LEN];
	long lo, hi;
	int none, rc;

	if ((rc = counts_read(c, s, "minLength", "maxLength", &lo, &hi, &none)) != 0)
		return rc;
	if (pat != NULL && fmt != NULL)
		return js_err(c, ERR_UNSUPPORTED, "format",
		    "one of pattern, format, minLength and maxLength at a time");
	if ((pat != NULL || fmt != NULL) && !none)
		return js_err(c, ERR_UNSUPPORTED, json_object_get(s, "minLength") ? "minLength" : "maxLength",
		    "one of pattern, format, minLength and maxLength at a time");
	if (pat != NULL)
		return json_is_string(pat) ? js_pattern_item(c, json_string_value(pat), json_string_length(pat), b) :
		    js_err(c, ERR_INVAL, "pattern", "pattern must be a string");
	if (fmt != NULL) {
		for (size_t i = 0; i < ARRAY_LEN(formats); i++)
			if (json_is_string(fmt) && strcmp(json_string_value(fmt), formats[i].name) == 0)
				strbuf_printf(&body, "\"\\x22\" %s \"\\x22\"", js_fixed(c, formats[i].rule));
		if (body.n == 0)
			return js_err(c, ERR_UNSUPPORTED, "format", "formats but date, time, date-time and uuid");
	} else if (none) {
		strbuf_cat(b, js_fixed(c, FX_STRING));
		return 0;
	} else {
		strbuf_printf(&body, "\"\\x22\" %s{%ld,", js_fixed(c, FX_JCHAR), lo);
		if (hi != LONG_MAX)
			strbuf_printf(&body, "%ld", hi);
		strbuf_cat(&body, "} \"\\x22\"");
	}
	if ((rc = js_rule_shared(c, body.s, name)) == 0)
		strbuf_cat(b, name);
	free(body.s);
	return rc;
}

/* ---- schemas ---- */

static int node(struct jsc *c, const json_t *s, uint32_t *id);

/* The rule name of schema v compiled at path + "/" + key (+ "/" + key2), into name. */
static int
sub_name(struct jsc *c, const json_t *v, const char *key, size_t klen, const char *key2, size_t k2len, char *name)
{
	size_t old = path_push(c, key, klen);
	uint32_t id;
	int rc;

	if (key2 != NULL)
		path_push(c, key2, k2len);
	if ((rc = node(c, v, &id)) == 0)
		snprintf(name, NAME_LEN, "%s", c->ent[id].name);
	path_pop(c, old);
	return rc;
}

static int
sub_index(struct jsc *c, const json_t *v, const char *key, size_t i, char *name)
{
	char num[24];

	snprintf(num, sizeof num, "%zu", i);
	return sub_name(c, v, key, strlen(key), num, strlen(num), name);
}

/* A named member of an object: its key, whether required, its value's rule. */
struct member {
	const char *key;
	size_t klen;
	int required;
	char value[NAME_LEN];
};

int
js_in_strings(const json_t *arr, const char *k, size_t n)
{
	for (size_t i = 0; i < json_array_size(arr); i++) {
		const json_t *v = json_array_get(arr, i);

		if (json_string_length(v) == n && memcmp(json_string_value(v), k, n) == 0)
			return 1;
	}
	return 0;
}

/* What may follow "{" ws or "," ws at member i (K_i) or end the object. */
static void
obj_next(struct strbuf *b, uint32_t base, int has_k, int must, int i, const char *before)
{
	if (!has_k)
		strbuf_cat(b, "\"}\"");
	else if (must)
		strbuf_printf(b, "%ss%u-k%d", before, base, i);
	else
		strbuf_printf(b, "( %ss%u-k%d | \"}\" )", before, base, i);
}

/*
 * The rules of the object with members m[0..n) in order, then (extra)
 * additional ones whose keys are rule addkey and values addv:
 *   base-m<i> ::= key ws ":" ws value
 *   base-k<i> ::= base-m<i> base-t<i+1> | base-k<i+1> (the skip when optional)
 *   base-t<i> ::= ws ( "," ws base-k<i> | "}" ) ("}" when none from i is required)
 * and base-k<n> the additional ones, base-o the object.
 */
static int
obj_rules(struct jsc *c, uint32_t base, const struct member *m, int n, int extra, const char *addkey,
    const char *addv)
{
	struct strbuf b = { 0 }, key = { 0 };
	char name[NAME_LEN];
	int *must = xcalloc((size_t)n + 1, sizeof *must), rc = 0;

	for (int i = n - 1; i >= 0; i--)
		must[i] = must[i + 1] || m[i].required;
	for (int i = 0; i < n && rc == 0; i++) {
		json_t *ks = json_stringn(m[i].key, m[i].klen);
		char *sp = json_dumps(ks, JSON_COMPACT | JSON_ENCODE_ANY);

		js_sb_clear(&b), js_sb_clear(&key);
		gl_lit(&key, sp, strlen(sp));
		free(sp);
		json_decref(ks);
		strbuf_printf(&b, "%s ws \":\" ws %s", key.s, m[i].value);
		snprintf(name, sizeof name, "s%u-m%d", base, i);
		if ((rc = rule_add(c, name, b.s)) != 0)
			break;
		js_sb_clear(&b);
		strbuf_printf(&b, "s%u-m%d s%u-t%d", base, i, base, i + 1);
		if (!m[i].required && (i + 1 < n || extra))
			strbuf_printf(&b, " | s%u-k%d", base, i + 1);
		snprintf(name, sizeof name, "s%u-k%d", base, i);
		if ((rc = rule_add(c, name, b.s)) != 0)
			break;
		js_sb_clear(&b);
		strbuf_cat(&b, "ws ");
		obj_next(&b, base, i + 1 < n || extra, must[i + 1], i + 1, "\",\" ws ");
		snprintf(name, sizeof name, "s%u-t%d", base, i + 1);
		rc = rule_add(c, name, b.s);
	}
	if (rc == 0 && extra) {
		js_sb_clear(&b);
		strbuf_printf(&b, "%s ws \":\" ws %s s%u-ta", addkey, addv, base);
		snprintf(name, sizeof name, "s%u-k%d", base, n);
		if ((rc = rule_add(c, name, b.s)) == 0) {
			js_sb_clear(&b);
			strbuf_printf(&b, "ws ( \",\" ws s%u-k%d | \"}\" )", base, n);
			snprintf(name, sizeof name, "s%u-ta", base);
			rc = rule_add(c, name, b.s);
		}
	}
	if (rc == 0) {
		js_sb_clear(&b);
		strbuf_cat(&b, "\"{\" ws ");
		obj_next(&b, base, n > 0 || extra, must[0], 0, "");
		snprintf(name, sizeof name, "s%u-o", base);
		rc = rule_add(c, name, b.s);
	}
	js_fixed(c, FX_WS);
	free(b.s), free(key.s), free(must);
	return rc;
}

/* The value rule of sub-schema v under key (absent: any value) into name. */
static int
value_rule(struct jsc *c, const json_t *v, const char *key, char *name)
{
	if (v == NULL) {
		snprintf(name, NAME_LEN, "%s", js_fixed(c, FX_VALUE));
		return 0;
	}
	return sub_name(c, v, key, strlen(key), NULL, 0, name);
}

/* Members of properties (but optional false ones), then required names not among them. */
static int
obj_members(struct jsc *c, const json_t *props, const json_t *req, const char *addv, struct member *m, int *n)
{
	const char *k;
	size_t kn;
	json_t *v;
	int rc;

	*n = 0;
	json_object_keylen_foreach((json_t *)props, k, kn, v) {
		struct member *x = &m[*n];

		*x = (struct member){ k, kn, js_in_strings(req, k, kn), "" };
		if (json_is_false(v) && !x->required)
			continue;
		if ((rc = sub_name(c, v, "properties", strlen("properties"), k, kn, x->value)) != 0)
			return rc;
		++*n;
	}
	for (size_t i = 0; i < json_array_size(req); i++) {
		const json_t *r = json_array_get(req, i);
		int seen = json_object_getn(props, json_string_value(r), json_string_length(r)) != NULL;

		for (size_t j = 0; j < i && !seen; j++)
			seen = json_equal(json_array_get(req, j), r);
		if (!seen) {
			m[*n] = (struct member){ json_string_value(r), json_string_length(r), 1, "" };
			snprintf(m[(*n)++].value, NAME_LEN, "%s", addv);
		}
	}
	return 0;
}

static int
object_item(struct jsc *c, const json_t *s, uint32_t base, struct strbuf *b)
{
	const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
	const json_t *addl = json_object_get(s, "additionalProperties");
	struct member *m = NULL;
	const char **keys = NULL;
	size_t *lens = NULL;
	char addv[NAME_LEN], addkey[NAME_LEN];
	int n = 0, n_keys = 0, rc;

	if (props != NULL && !json_is_object(props))
		return js_err(c, ERR_INVAL, "properties", "properties must be an object");
	if (req != NULL && !json_is_array(req))
		return js_err(c, ERR_INVAL, "required", "required must be an array of names");
	for (size_t i = 0; i < json_array_size(req); i++)
		if (!json_is_string(json_array_get(req, i)))
			return js_err(c, ERR_INVAL, "required", "required must be an array of names");
	if (addl != NULL && !json_is_object(addl) && !json_is_boolean(addl))
		return js_err(c, ERR_INVAL, "additionalProperties", "additionalProperties must be a schema");
	if (props == NULL && req == NULL && (addl == NULL || json_is_true(addl))) {
		strbuf_cat(b, js_fixed(c, FX_OBJECT));
		return 0;
	}
	if (json_object_size(props) + json_array_size(req) > JSCHEMA_MAX_PROPERTIES)
		return js_err(c, ERR_RANGE, props != NULL ? "properties" : "required",
		    "more than %d named properties", JSCHEMA_MAX_PROPERTIES);
	if ((rc = value_rule(c, addl, "additionalProperties", addv)) != 0)
		return rc;
	m = xcalloc(json_object_size(props) + json_array_size(req) + 1, sizeof *m);
	if ((rc = obj_members(c, props, req, addv, m, &n)) == 0 && addl != NULL && !json_is_false(addl)) {
		const char *k;
		size_t kn;
		json_t *v;

		keys = xcalloc(json_object_size(props) + json_array_size(req) + 1, sizeof *keys);
		lens = xcalloc(json_object_size(props) + json_array_size(req) + 1, sizeof *lens);
		json_object_keylen_foreach((json_t *)props, k, kn, v)
			keys[n_keys] = k, lens[n_keys++] = kn;
		for (size_t i = 0; i < json_array_size(req); i++)
			keys[n_keys] = json_string_value(json_array_get(req, i)),
			lens[n_keys++] = json_string_length(json_array_get(req, i));
		rc = other_keys(c, base, keys, lens, n_keys, addkey);
	}
	if (rc == 0)
		rc = obj_rules(c, base, m, n, addl != NULL && !json_is_false(addl), addkey, addv);
	if (rc == 0)
		strbuf_printf(b, "s%u-o", base);
	free(m), free(keys), free(lens);
	return rc;
}


/*
 * What follows the first kk elements (the prefix's): more elements of
 * items (rule v) between lo and hi in all, if tail, then "]".
 */
static void
arr_tail(struct jsc *c, struct strbuf *b, const char *sep, int tail, long kk, long lo, long hi)
{
	if (!tail) {
		strbuf_cat(b, kk >= lo ? "ws \"]\"" : js_fixed(c, FX_NEVER));
		return;
	}
	strbuf_printf(b, "%s{%ld,", sep, MAX(lo - kk, 0));
	if (hi != LONG_MAX)
		strbuf_printf(b, "%ld", hi - kk);
	strbuf_cat(b, "} ws \"]\"");
}

/*
 * The rules of the array of prefix elements p[0..kk) then items v, lo to hi in all:
 *   base-r<i> ::= ws ( "," ws p[i] base-r<i+1> | "]" )  after element i ("]" once i >= lo)
 *   base-r<kk> ::= sep{...} ws "]"                    sep ::= ws "," ws v
 * and base-a the array.
 */
static int
arr_rules(struct jsc *c, uint32_t base, char (*p)[NAME_LEN], long kk, const char *v, int tail, long lo,
    long hi)
{
	struct strbuf b = { 0 };
	char name[NAME_LEN], sep[NAME_LEN] = "";
	int rc = 0;

	js_fixed(c, FX_WS);
	if (tail) {
		strbuf_printf(&b, "ws \",\" ws %s", v);
		rc = js_rule_shared(c, b.s, sep);
	}
	for (long i = 1; i <= kk && rc == 0; i++) {
		js_sb_clear(&b);
		if (i < kk)
			strbuf_printf(&b, "ws %s\",\" ws %s s%u-r%ld%s", i >= lo ? "( " : "", p[i], base, i + 1,
			    i >= lo ? " | \"]\" )" : "");
		else
			arr_tail(c, &b, sep, tail, kk, lo, hi);
		snprintf(name, sizeof name, "s%u-r%ld", base, i);
		rc = rule_add(c, name, b.s);
	}
	if (rc == 0) {
		js_sb_clear(&b);
		strbuf_cat(&b, "\"[\" ws ( ");
		if (kk > 0)
			strbuf_printf(&b, "%s s%u-r1", p[0], base);
		else if (tail && hi > 0)
			strbuf_printf(&b, "%s ", v), arr_tail(c, &b, sep, 1, 1, lo, hi);
		else
			strbuf_cat(&b, js_fixed(c, FX_NEVER));
		strbuf_cat(&b, lo == 0 ? " | \"]\" )" : " )");
		snprintf(name, sizeof name, "s%u-a", base);
		rc = rule_add(c, name, b.s);
	}
	free(b.s);
	return rc;
}

static int
array_item(struct jsc *c, const json_t *s, uint32_t base, struct strbuf *b)
{
	const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
	const json_t *uniq = json_object_get(s, "uniqueItems");
	char (*p)[NAME_LEN] = NULL, v[NAME_LEN];
	long lo, hi, k, kk;
	int none, rc;

	if ((rc = counts_read(c, s, "minItems", "maxItems", &lo, &hi, &none)) != 0)
		return rc;
	if (uniq != NULL && !json_is_boolean(uniq))
		return js_err(c, ERR_INVAL, "uniqueItems", "uniqueItems must be a boolean");
	if (json_is_true(uniq))
		return js_err(c, ERR_UNSUPPORTED, "uniqueItems", "uniqueItems true");
	if (prefix != NULL && !json_is_array(prefix))
		return js_err(c, ERR_INVAL, "prefixItems", "prefixItems must be an array of schemas");
	if (json_array_size(prefix) > JSCHEMA_MAX_PREFIX)
		return js_err(c, ERR_RANGE, "prefixItems", "more than %d prefixItems", JSCHEMA_MAX_PREFIX);
	if (prefix == NULL && (items == NULL || json_is_true(items)) && none) {
		strbuf_cat(b, js_fixed(c, FX_ARRAY));
		return 0;
	}
	if (json_is_array(items))
		return js_err(c, ERR_UNSUPPORTED, "items", "items as an array (draft 4's tuples): use prefixItems");
	if ((rc = value_rule(c, items, "items", v)) != 0)
		return rc;
	k = (long)json_array_size(prefix), kk = MIN(k, hi);
	p = xcalloc((size_t)kk + 1, sizeof *p);
	for (long i = 0; i < kk && rc == 0; i++)
		rc = sub_index(c, json_array_get(prefix, (size_t)i), "prefixItems", (size_t)i, p[i]);
	if (rc == 0)
		rc = arr_rules(c, base, p, kk, v, kk == k && !json_is_false(items) && hi > k, lo, hi);
	if (rc == 0)
		strbuf_printf(b, "s%u-a", base);
	free(p);
	return rc;
}

/* ---- keywords ---- */

enum kw_group { KG_ANN, KG_TYPE, KG_ENUM, KG_OBJ, KG_ARR, KG_STR, KG_NUM, KG_REF, KG_ANY, KG_ONE, KG_ALL };

static const struct {
	const char *name;
	enum kw_group group;
} keywords[] = {
	{ "title", KG_ANN }, { "description", KG_ANN }, { "examples", KG_ANN }, { "default", KG_ANN },
	{ "deprecated", KG_ANN }, { "readOnly", KG_ANN }, { "writeOnly", KG_ANN }, { "$schema", KG_ANN },
	{ "$id", KG_ANN }, { "$comment", KG_ANN }, { "$defs", KG_ANN }, { "definitions", KG_ANN },
	{ "type", KG_TYPE }, { "enum", KG_ENUM }, { "const", KG_ENUM },
	{ "properties", KG_OBJ }, { "required", KG_OBJ }, { "additionalProperties", KG_OBJ },
	{ "items", KG_ARR }, { "prefixItems", KG_ARR }, { "minItems", KG_ARR }, { "maxItems", KG_ARR },
	{ "uniqueItems", KG_ARR },
	{ "minLength", KG_STR }, { "maxLength", KG_STR }, { "pattern", KG_STR }, { "format", KG_STR },
	{ "minimum", KG_NUM }, { "maximum", KG_NUM }, { "exclusiveMinimum", KG_NUM }, { "exclusiveMaximum", KG_NUM },
	{ "$ref", KG_REF }, { "anyOf", KG_ANY }, { "oneOf", KG_ONE }, { "allOf", KG_ALL },
};

/* The group of keyword k (n bytes); -1 if unknown. */
static int
kw_group(const char *k, size_t n)
{
	for (size_t i = 0; i < ARRAY_LEN(keywords); i++)
		if (strlen(keywords[i].name) == n && memcmp(keywords[i].name, k, n) == 0)
			return (int)keywords[i].group;
	return -1;
}

/* 1 if s constrains nothing: true, or annotations only. */
static int
trivial(const json_t *s)
{
	const char *k;
	size_t n;
	json_t *v;

	if (!json_is_object(s))
		return json_is_true(s);
	json_object_keylen_foreach((json_t *)s, k, n, v)
		if (kw_group(k, n) != KG_ANN)
			return 0;
	return 1;
}

/* The types that s's `type` names into *mask (all when absent). */
int
js_type_mask(struct jsc *c, const json_t *s, int *mask)
{
	static const struct {
		const char *name;
		int mask;
	} types[] = { { "null", T_NULL }, { "boolean", T_BOOL }, { "object", T_OBJ }, { "array", T_ARR },
		{ "string", T_STR }, { "integer", T_INT }, { "number", T_NUM } };
	const json_t *t = json_object_get(s, "type");
	size_t n = json_is_array(t) ? json_array_size(t) : 1;

	*mask = t == NULL ? T_ALL : 0;
	if (t != NULL && (!json_is_array(t) || n == 0) && !json_is_string(t))
		return js_err(c, ERR_INVAL, "type", "type must be a type's name or an array of them");
	for (size_t i = 0; t != NULL && i < n; i++) {
		const json_t *name = json_is_array(t) ? json_array_get(t, i) : t;
		int m = 0;

		for (size_t k = 0; k < ARRAY_LEN(types); k++)
			if (json_is_string(name) && strcmp(json_string_value(name), types[k].name) == 0)
				m = types[k].mask;
		if (m == 0)
			return js_err(c, ERR_INVAL, "type",
			    "a type but null, boolean, object, array, string, integer and number");
		*mask |= m;
	}
	return 0;
}

/* ---- the graph of references that consume no text ---- */

/* An edge from -> to, where the path (+ "/" + key if not NULL) says. */
static void
edge_add(struct jsc *c, uint32_t from, uint32_t to, const char *key)
{
	size_t old = key != NULL ? path_push(c, key, strlen(key)) : c->path.n;

	c->edge = xgrow(c->edge, &c->cap_edge, c->n_edge + 1, sizeof *c->edge);
	c->edge[c->n_edge++] = (struct jedge){ from, to, xstrdup(sb_str(&c->path)) };
	path_pop(c, old);
}

/* ---- schemas, continued ---- */

/* The rule items of s's types (mask) into body, alternatives; s has no enum, const or combinator. */
static int
typed_body(struct jsc *c, const json_t *s, uint32_t base, int mask, struct strbuf *body)
{
	int rc = 0;

	if (mask == T_ALL && trivial(s)) {
		strbuf_cat(body, js_fixed(c, FX_VALUE));
		return 0;
	}
	if (mask & T_NULL)
		js_alt(body), strbuf_cat(body, "\"null\"");
	if (mask & T_BOOL)
		js_alt(body), strbuf_cat(body, "\"true\" | \"false\"");
	if (mask & T_OBJ)
		js_alt(body), rc = object_item(c, s, base, body);
	if (rc == 0 && (mask & T_ARR))
		js_alt(body), rc = array_item(c, s, base, body);
	if (rc == 0 && (mask & T_STR))
		js_alt(body), rc = string_item(c, s, body);
	if (rc == 0 && (mask & T_NUM))
		js_alt(body), rc = js_number_item(c, s, (mask & T_NUM) == T_INT, body);
	return rc;
}

/* The keyword groups that belong to one JSON type. */
#define TYPED_GROUPS ((1u << KG_OBJ) | (1u << KG_ARR) | (1u << KG_STR) | (1u << KG_NUM))

/*
 * A schema of neither combinators nor $ref: enum/const (beside type
 * alone), or the types it names or whose keywords it has (groups: the
 * keyword groups present, a bit each), each with its keywords.
 */
static int
plain_body(struct jsc *c, const json_t *s, uint32_t id, unsigned groups, struct strbuf *body)
{
	static const int group_types[] = { [KG_OBJ] = T_OBJ, [KG_ARR] = T_ARR, [KG_STR] = T_STR, [KG_NUM] = T_NUM };
	int mask, rc;

	if ((rc = js_type_mask(c, s, &mask)) != 0)
		return rc;
	if (groups & (1u << KG_ENUM)) {
		const json_t **vals;
		int n = js_enum_values(c, s, mask, &vals);

		if (n < 0)
			return n;
		c->ent[id].mask = 0;
		for (int i = 0; i < n; i++)
			c->ent[id].mask |= value_type(vals[i]);
		c->ent[id].acc = c->ent[id].mask; /* those values alone */
		rc = enum_body(c, id, vals, n, body);
		free(vals);
		return rc;
	}
	c->ent[id].acc = mask; /* what `type` names, all without it */
	if (!(groups & (1u << KG_TYPE)) && (groups & TYPED_GROUPS)) {
		mask = 0;
		for (int g = KG_OBJ; g <= KG_NUM; g++)
			if (groups & (1u << g))
				mask |= group_types[g];
	}
	c->ent[id].mask = mask;
	return typed_body(c, s, id, mask, body);
}

/* Resolves the JSON pointer of a $ref ("#/a/b") into *t, its pointer (escaped again) into ptr. */
static int
ref_target(struct jsc *c, const json_t *ref, const json_t **t, struct strbuf *ptr)
{
	const char *p = json_string_value(ref);
	struct strbuf tok = { 0 };

	if (!json_is_string(ref))
		return js_err(c, ERR_INVAL, "$ref", "$ref must be a string");
	if (p[0] != '#' || (p[1] != '\0' && p[1] != '/'))
		return js_err(c, ERR_UNSUPPORTED, "$ref",
		    "a $ref but to \"#\" or a JSON pointer in this document (\"#/...\")");
	*t = c->doc;
	for (p++; *p == '/' && *t != NULL; ptr_push(ptr, tok.s, tok.n)) {
		js_sb_clear(&tok);
		for (p++; *p != '\0' && *p != '/'; p++) {
			if (p[0] == '%' && js_hex_val(p[1]) >= 0 && js_hex_val(p[2]) >= 0) /* a URI fragment's escape */
				strbuf_add(&tok, &(char){ (char)(js_hex_val(p[1]) << 4 | js_hex_val(p[2])) }, 1), p += 2;
			else if (p[0] == '~' && (p[1] == '0' || p[1] == '1'))
				strbuf_cat(&tok, p[1] == '0' ? "~" : "/"), p++;
			else
				strbuf_add(&tok, p, 1);
		}
		if (json_is_object(*t))
			*t = json_object_getn(*t, sb_str(&tok), tok.n);
		else if (json_is_array(*t) && tok.n > 0 && tok.n < 10 && strspn(tok.s, "0123456789") == tok.n &&
		    (tok.s[0] != '0' || tok.n == 1))
			*t = json_array_get(*t, strtoul(tok.s, NULL, 10));
		else
			*t = NULL;
	}
	free(tok.s);
	return *t == NULL ? js_err(c, ERR_INVAL, "$ref", "a $ref to nothing: %s", json_string_value(ref)) : 0;
}

static int
ref_body(struct jsc *c, const json_t *s, uint32_t id, struct strbuf *body)
{
	struct strbuf ptr = { 0 }, saved;
	const json_t *t;
	uint32_t to;
	int rc;

	if ((rc = ref_target(c, json_object_get(s, "$ref"), &t, &ptr)) == 0) {
		saved = c->path, c->path = ptr; /* errors in the target name its own place */
		rc = node(c, t, &to);
		ptr = c->path, c->path = saved;
	}
	if (rc == 0) {
		edge_add(c, id, to, "$ref");
		strbuf_cat(body, c->ent[to].name);
	}
	free(ptr.s);
	return rc;
}

/* anyOf, oneOf (its disjointness checked with the graph) or allOf (one branch that constrains, at most). */
static int
comb_body(struct jsc *c, const json_t *s, uint32_t id, const char *key, int kind, struct strbuf *body)
{
	const json_t *arr = json_object_get(s, key);
	size_t n = json_array_size(arr), first = n;
	int rc = 0;

	if (!json_is_array(arr) || n == 0)
		return js_err(c, ERR_INVAL, key, "%s must be a non-empty array of schemas", key);
	if (n > JSCHEMA_MAX_BRANCHES)
		return js_err(c, ERR_RANGE, key, "more than %d branches", JSCHEMA_MAX_BRANCHES);
	c->ent[id].kind = kind;
	for (size_t i = 0; i < n && rc == 0; i++) {
		const json_t *b = json_array_get(arr, i);
		size_t old;
		uint32_t to;

		if (kind == EK_ALL && trivial(b))
			continue;
		old = path_push(c, key, strlen(key));
		path_index(c, i);
		if (kind == EK_ALL && first < n) {
			rc = js_err(c, ERR_UNSUPPORTED, NULL, "allOf with more than one branch that constrains");
		} else if ((rc = node(c, b, &to)) == 0) {
			edge_add(c, id, to, NULL);
			js_alt(body);
			strbuf_cat(body, c->ent[to].name);
			first = MIN(first, i);
		}
		path_pop(c, old);
	}
	if (rc == 0 && kind == EK_ALL && first == n)
		strbuf_cat(body, js_fixed(c, FX_VALUE));
	return rc;
}

/* The body of schema object s (entry id): its keywords checked, then by what it is. */
static int
node_body(struct jsc *c, const json_t *s, uint32_t id, struct strbuf *body)
{
	static const int comb_kinds[] = { [KG_REF] = EK_REF, [KG_ANY] = EK_ANY, [KG_ONE] = EK_ONE, [KG_ALL] = EK_ALL };
	const char *k, *comb = NULL, *other = NULL, *typed = NULL;
	unsigned groups = 0;
	int g = -1, cg = -1;
	size_t n;
	json_t *v;

	json_object_keylen_foreach((json_t *)s, k, n, v) {
		/* below the root, $id is a new base URI: "#/..." in it would mean its own document */
		if (n == 3 && memcmp(k, "$id", 3) == 0 && s != c->doc)
			return js_err(c, ERR_UNSUPPORTED, "$id", "$id below the root (a new base for $ref)");
		if ((g = kw_group(k, n)) < 0) {
			char *key = xstrndup(k, n);
			int rc = js_err(c, ERR_UNSUPPORTED, key, "an unsupported keyword");

			free(key);
			return rc;
		}
		groups |= 1u << g;
		if (g >= KG_REF && comb == NULL)
			comb = k, cg = g;
		else if (g != KG_ANN && other == NULL)
			other = k;
		if (g >= KG_OBJ && g <= KG_NUM && typed == NULL)
			typed = k;
	}
	if (comb != NULL && other != NULL)
		return js_err(c, ERR_UNSUPPORTED, other, "%s stands alone beside annotations", comb);
	if ((groups & (1u << KG_ENUM)) && typed != NULL)
		return js_err(c, ERR_UNSUPPORTED, typed, "enum and const stand beside type alone");
	if (cg == KG_REF) {
		c->ent[id].kind = EK_REF;
		return ref_body(c, s, id, body);
	}
	if (comb != NULL)
		return comb_body(c, s, id, comb, comb_kinds[cg], body);
	return plain_body(c, s, id, groups, body);
}

/* The entry of schema s (0 if none yet: ent_tab holds entry + 1) and its slot. */
uint32_t
js_ent_find(const struct jsc *c, const json_t *s, uint32_t *slot)
{
	uint32_t i = 0;

	if (c->ent_tab_cap == 0)
		return 0;
	for (i = hash32(&s, sizeof s) & (c->ent_tab_cap - 1); c->ent_tab[i] != 0;
	    i = (i + 1) & (c->ent_tab_cap - 1))
		if (c->ent[c->ent_tab[i] - 1].schema == s)
			break;
	*slot = i;
	return c->ent_tab[i];
}

/* A new entry for s (its rule name set), memoised. */
static uint32_t
ent_new(struct jsc *c, const json_t *s)
{
	uint32_t id = c->n_ent, slot;

	if (2 * (c->n_ent + 1) > c->ent_tab_cap) {
		uint32_t cap = c->ent_tab_cap ? 2 * c->ent_tab_cap : 64;

		free(c->ent_tab);
		c->ent_tab = xcalloc(cap, sizeof *c->ent_tab), c->ent_tab_cap = cap;
		for (uint32_t e = 0; e < c->n_ent; e++) {
			js_ent_find(c, c->ent[e].schema, &slot);
			c->ent_tab[slot] = e + 1;
		}
	}
	js_ent_find(c, s, &slot);
	c->ent_tab[slot] = id + 1;
	c->ent = xgrow(c->ent, &c->cap_ent, c->n_ent + 1, sizeof *c->ent);
	c->ent[c->n_ent++] = (struct jent){ s, "", EK_PLAIN, T_ALL, T_ALL };
	if (json_is_boolean(s))
		snprintf(c->ent[id].name, NAME_LEN, "%s", js_fixed(c, json_is_true(s) ? FX_VALUE : FX_NEVER));
	else
		snprintf(c->ent[id].name, NAME_LEN, "s%u", id);
	c->ent[id].mask = c->ent[id].acc = json_is_false(s) ? 0 : T_ALL;
	return id;
}

/* Compiles schema s (at the path) into its rule, once; its entry into *id. */
static int
node(struct jsc *c, const json_t *s, uint32_t *id)
{
	struct strbuf body = { 0 };
	uint32_t slot, e = js_ent_find(c, s, &slot);
	int rc;

	if (e != 0) {
		*id = e - 1;
		return 0;
	}
	if (!json_is_object(s) && !json_is_boolean(s))
		return js_err(c, ERR_INVAL, NULL, "a schema must be an object or a boolean");
	if (c->depth >= JSCHEMA_MAX_DEPTH)
		return js_err(c, ERR_RANGE, NULL, "schemas nested deeper than the limit of %d", JSCHEMA_MAX_DEPTH);
	*id = ent_new(c, s);
	if (json_is_boolean(s))
		return 0;
	c->depth++;
	if ((rc = node_body(c, s, *id, &body)) == 0)
		rc = rule_add(c, c->ent[*id].name, sb_str(&body));
	c->depth--;
	free(body.s);
	return rc;
}

int
jschema_grammar(const json_t *schema, char **out, char *err)
{
	return jschema_grammar_rule(schema, "root", out, err);
}

int
jschema_grammar_rule(const json_t *schema, const char *rule, char **out, char *err)
{
	struct jsc c = { 0 };
	uint32_t root;
	int rc;

	c.doc = schema, c.err = err;
	*out = NULL;
	if ((rc = node(&c, schema, &root)) == 0 && (rc = js_graph_check(&c)) == 0 &&
	    (rc = rule_add(&c, rule, c.ent[root].name)) == 0 && (rc = fixed_emit(&c)) == 0) {
		*out = c.out.s;
		c.out.s = NULL;
	}
	for (uint32_t k = 0; k < c.n_edge; k++)
		free(c.edge[k].where);
	for (uint32_t k = 0; k < c.shared_cap; k++)
		free(c.shared[k].body);
	free(c.ent), free(c.ent_tab), free(c.edge), free(c.shared), free(c.out.s), free(c.path.s);
	return rc;
}
