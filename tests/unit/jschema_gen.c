/*
 * jschema_gen.c: random schemas of the subset jschema.h supports, and
 * random valid instances of each (jschema_gen.h), for test_jschema.c,
 * which checks that a schema's grammar accepts every instance made here.
 * An instance is made from the schema's meaning, never from its grammar,
 * so that a grammar that loses a valid value or spelling fails; it is
 * spelled only as jschema.h promises (members in its order, its
 * whitespace and escapes), choosing among those spellings at random to
 * reach as many as it can. A pattern is made as a tree, written out as
 * its text and sampled from the tree, so that making a match needs no
 * second regular expression engine.
 */
#include "config.h"
#include "jschema.h"
#include "util.h"
#include "jschema_gen.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <limits.h>
#include <math.h>

uint64_t rng_state;

uint32_t
rng(void)
{
	rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 11);
}

/* A uniform integer in [0, n). */
uint32_t
rnd(uint32_t n)
{
	return rng() % n;
}

json_t *
parse(const char *text)
{
	json_error_t je;
	json_t *j = json_loads(text, JSON_DECODE_ANY, &je);

	if (j == NULL)
		fail_msg("bad test JSON (%s): %s", je.text, text);
	return j;
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

void
rpat_free(struct rpat *p)
{
	for (int a = 0; a < p->nalt; a++)
		for (int i = 0; p->alt[a][i] != NULL; i++)
			rn_free(p->alt[a][i]);
	free(p->text);
}

static const char *const key_pool[] = { "a", "b", "name", "a\"b", "\xc3\xa9", "\n", "", "x y", "id", "k1", "\\",
	"\xce\xa9", "ab" };
static const char *const extra_pool[] = { "x", "zz", "\xc3\xa9" "1", "a1", "k", "name2", " ", "aa",
	"\xf0\x9f\x98\x80" };

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

json_t *
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

void
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
