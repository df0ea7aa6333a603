/*
 * jschema_text.c: the grammar text of what a keyword narrows inside one
 * value's spelling (jschema_int.h): integers and numbers within bounds,
 * and strings that match a pattern. Each depends on its keyword's value
 * alone, not on the schema around it, and each is a small compiler of
 * its own (digit ranges, sets of code points, an ECMA-262 subset), so
 * they live apart from the walk over schemas (jschema.c), which asks for
 * an item and gets a rule's name back.
 *
 * A grammar cannot compare numbers, so a bound becomes the exact digit
 * strings of its range: split by length, then by leading digit, the
 * ranges of the digits after it rules shared by their bodies, so that
 * the rules grow with the bounds' digits, not with the range. A pattern
 * constrains a string's code points while the grammar matches the JSON
 * text that spells them, so each set of code points is spelled as that
 * text: raw where JSON allows it, escaped where it must be.
 */
#include "config.h"
#include "jschema.h"
#include "jschema_int.h"
#include "grammar.h"
#include "util.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- integer and number ranges ---- */

#define NO_TOP UINT64_MAX

/* The digits from lo to hi: a literal when one. */
static void
digit_class(struct strbuf *b, char lo, char hi)
{
	strbuf_printf(b, lo == hi ? "\"%c\"" : "[%c-%c]", lo, hi);
}

/* Into b (empty): the decimal spellings of [lo, hi], both of n digits (lo, hi as digits). */
static int
same_len(struct jsc *c, const char *lo, const char *hi, int n, struct strbuf *b)
{
	char nines[24], zeros[24], name[NAME_LEN];
	struct strbuf sub = { 0 };
	int lo_full = 1, hi_full = 1, rc = 0;

	if (n == 1) {
		digit_class(b, lo[0], hi[0]);
		return 0;
	}
	if (lo[0] == hi[0]) {
		if ((rc = same_len(c, lo + 1, hi + 1, n - 1, &sub)) == 0 && (rc = js_rule_shared(c, sub.s, name)) == 0)
			strbuf_printf(b, "\"%c\" %s", lo[0], name);
		free(sub.s);
		return rc;
	}
	memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
	for (int i = 1; i < n; i++)
		lo_full &= lo[i] == '0', hi_full &= hi[i] == '9';
	if (!lo_full) { /* lo's first digit, then what follows lo */
		if ((rc = same_len(c, lo + 1, nines, n - 1, &sub)) == 0 && (rc = js_rule_shared(c, sub.s, name)) == 0)
			strbuf_printf(b, "\"%c\" %s", lo[0], name);
	}
	if (rc == 0 && lo[0] + !lo_full <= hi[0] - !hi_full) {
		js_alt(b);
		digit_class(b, (char)(lo[0] + !lo_full), (char)(hi[0] - !hi_full));
		strbuf_printf(b, " [0-9]{%d}", n - 1);
	}
	if (rc == 0 && !hi_full) {
		js_sb_clear(&sub);
		if ((rc = same_len(c, zeros, hi + 1, n - 1, &sub)) == 0 && (rc = js_rule_shared(c, sub.s, name)) == 0) {
			js_alt(b);
			strbuf_printf(b, "\"%c\" %s", hi[0], name);
		}
	}
	free(sub.s);
	return rc;
}

static int
n_digits(uint64_t v)
{
	int n = 1;

	while (v >= 10)
		v /= 10, n++;
	return n;
}

/* Into b: the spellings without leading zeros of the integers in [lo, hi] (hi NO_TOP: no end). */
static int
digits_range(struct jsc *c, uint64_t lo, uint64_t hi, struct strbuf *b)
{
	int top = hi == NO_TOP ? n_digits(lo) : n_digits(hi), rc = 0;
	uint64_t p = 1; /* 10^(len - 1) */
	struct strbuf one = { 0 };

	for (int len = 1; len <= top; len++, p *= 10) {
		uint64_t x = MAX(lo, len == 1 ? 0 : p), y = MIN(hi, p * 10 - 1);
		char xs[24], ys[24];

		if (x > y)
			continue;
		snprintf(xs, sizeof xs, "%llu", (unsigned long long)x);
		snprintf(ys, sizeof ys, "%llu", (unsigned long long)y);
		js_sb_clear(&one);
		if ((rc = same_len(c, xs, ys, len, &one)) != 0)
			break;
		js_alt(b);
		strbuf_cat(b, one.s);
	}
	free(one.s);
	if (rc != 0)
		return rc;
	if (hi == NO_TOP) {
		js_alt(b);
		strbuf_printf(b, "[1-9] [0-9]{%d,}", top);
	}
	return 0;
}

/* Appends the item of the integers in [lo, hi] (a shared rule) to b, after prefix. */
static int
digits_item(struct jsc *c, uint64_t lo, uint64_t hi, const char *prefix, struct strbuf *b)
{
	struct strbuf sub = { 0 };
	char name[NAME_LEN];
	int rc;

	if ((rc = digits_range(c, lo, hi, &sub)) == 0 && (rc = js_rule_shared(c, sub.s, name)) == 0) {
		js_alt(b);
		strbuf_printf(b, "%s%s", prefix, name);
	}
	free(sub.s);
	return rc;
}

/* A bound of a number: its value when set, whole or not, exclusive or not. */
struct bound {
	int set, excl, whole;
	int64_t v; /* whole: the value; else its floor */
};

/* Reads the number at key into *b (excl as given). */
static int
bound_read(struct jsc *c, const json_t *s, const char *key, int excl, struct bound *b)
{
	const json_t *v = json_object_get(s, key);
	double d;

	if (v == NULL || json_is_boolean(v))
		return 0;
	if (!json_is_number(v))
		return js_err(c, ERR_INVAL, key, "%s must be a number", key);
	if (json_is_integer(v)) {
		if (json_integer_value(v) > JSCHEMA_MAX_BOUND || json_integer_value(v) < -JSCHEMA_MAX_BOUND)
			return js_err(c, ERR_RANGE, key, "a bound beyond the limit of %lld", JSCHEMA_MAX_BOUND);
		*b = (struct bound){ 1, excl, 1, json_integer_value(v) };
		return 0;
	}
	d = json_real_value(v);
	if (!(fabs(d) <= (double)JSCHEMA_MAX_BOUND))
		return js_err(c, ERR_RANGE, key, "a bound beyond the limit of %lld", JSCHEMA_MAX_BOUND);
	*b = (struct bound){ 1, excl, floor(d) == d, (int64_t)floor(d) };
	return 0;
}

/* 1 if a is a stricter lower bound than b (upper: hi), both whole. */
static int
stricter(const struct bound *a, const struct bound *b, int hi)
{
	if (!b->set)
		return a->set;
	if (!a->set || a->v == b->v)
		return a->set && a->excl && !b->excl;
	return hi ? a->v < b->v : a->v > b->v;
}

/*
 * The bounds of s into lo and hi: minimum, exclusiveMinimum (a number, or
 * draft 4's boolean beside minimum), and the same for the maximum. As
 * integers (integers set): inclusive and whole; else refused unless whole.
 */
static int
bounds(struct jsc *c, const json_t *s, int integers, struct bound *lo, struct bound *hi)
{
	static const char *const keys[4] = { "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum" };
	struct bound b[4] = { { 0 } };
	int rc;

	for (int i = 0; i < 4; i++) {
		/* the exclusive keywords, or draft 4's boolean beside minimum or maximum */
		int excl = i % 2 == 1 ? 1 : json_is_true(json_object_get(s, keys[i + 1]));

		if ((rc = bound_read(c, s, keys[i], excl, &b[i])) != 0)
			return rc;
		if (b[i].set && integers) { /* to inclusive integers: ceilings below, floors above */
			if (i < 2 && (!b[i].whole || b[i].excl))
				b[i].v++;
			else if (i >= 2 && b[i].whole && b[i].excl)
				b[i].v--;
			b[i].whole = 1, b[i].excl = 0;
		} else if (b[i].set && !b[i].whole) {
			return js_err(c, ERR_UNSUPPORTED, keys[i], "a bound of a number that is not a whole number");
		}
	}
	*lo = stricter(&b[1], &b[0], 0) ? b[1] : b[0];
	*hi = stricter(&b[3], &b[2], 1) ? b[3] : b[2];
	return 0;
}

/* Into b: the integers in [lo, hi] (each bound if set, inclusive). */
static int
int_alts(struct jsc *c, const struct bound *lo, const struct bound *hi, struct strbuf *b)
{
	int rc = 0;

	if (!lo->set || lo->v < 0) { /* negatives: their magnitudes, no -0 */
		uint64_t mlo = hi->set && hi->v < 0 ? (uint64_t)-hi->v : 1, mhi = lo->set ? (uint64_t)-lo->v : NO_TOP;

		if (mlo <= mhi)
			rc = digits_item(c, mlo, mhi, "\"-\" ", b);
	}
	if (rc == 0 && (!hi->set || hi->v >= 0)) {
		uint64_t nlo = lo->set && lo->v > 0 ? (uint64_t)lo->v : 0, nhi = hi->set ? (uint64_t)hi->v : NO_TOP;

		if (nlo <= nhi)
			rc = digits_item(c, nlo, nhi, "", b);
	}
	return rc;
}

/*
 * Into b, after prefix: the magnitudes (an integer part, maybe a
 * fraction) in the interval from a to z, each end exclusive or not (z
 * unset: no end). The integer parts strictly inside take any fraction,
 * an exclusive a a fraction not all zeros, an inclusive z one all zeros.
 */
static int
mag_alts(struct jsc *c, const struct bound *a, const struct bound *z, const char *prefix, struct strbuf *b)
{
	uint64_t first = (uint64_t)a->v + (a->excl ? 1 : 0);
	struct strbuf sub = { 0 };
	char name[NAME_LEN];
	int rc = 0;

	if (!z->set || (z->v >= 1 && first <= (uint64_t)z->v - 1)) {
		if ((rc = digits_range(c, first, z->set ? (uint64_t)z->v - 1 : NO_TOP, &sub)) == 0 &&
		    (rc = js_rule_shared(c, sub.s, name)) == 0) {
			js_alt(b);
			strbuf_printf(b, "%s%s %s?", prefix, name, js_fixed(c, FX_FRAC));
		}
	}
	if (rc == 0 && a->excl && (!z->set || a->v < z->v)) {
		js_alt(b);
		strbuf_printf(b, "%s\"%lld\" %s", prefix, (long long)a->v, js_fixed(c, FX_FRACNZ));
	}
	if (rc == 0 && z->set && !z->excl && (z->v > a->v || (z->v == a->v && !a->excl))) {
		js_alt(b);
		strbuf_printf(b, "%s\"%lld\" %s?", prefix, (long long)z->v, js_fixed(c, FX_FRACZ));
	}
	free(sub.s);
	return rc;
}

/* Into b: the numbers without exponent within lo and hi (whole bounds); no -0. */
static int
num_alts(struct jsc *c, const struct bound *lo, const struct bound *hi, struct strbuf *b)
{
	int rc = 0;

	if (!lo->set || lo->v < 0) {
		struct bound a = { 1, 1, 1, 0 }, z = { 0 };

		if (hi->set && hi->v < 0)
			a = (struct bound){ 1, hi->excl, 1, -hi->v };
		if (lo->set)
			z = (struct bound){ 1, lo->excl, 1, -lo->v };
		rc = mag_alts(c, &a, &z, "\"-\" ", b);
	}
	if (rc == 0 && (!hi->set || hi->v > 0 || (hi->v == 0 && !hi->excl))) {
		struct bound a = { 1, 0, 1, 0 };

		if (lo->set && lo->v >= 0)
			a = *lo;
		rc = mag_alts(c, &a, hi, "", b);
	}
	return rc;
}

/* The item of s's integers (integers set) or numbers into b. */
int
js_number_item(struct jsc *c, const json_t *s, int integers, struct strbuf *b)
{
	struct bound lo = { 0 }, hi = { 0 }; /* bounds() sets both unless it fails; for gcc -Wmaybe-uninitialized */
	struct strbuf sub = { 0 };
	char name[NAME_LEN];
	int rc;

	if ((rc = bounds(c, s, integers, &lo, &hi)) != 0)
		return rc;
	if (!lo.set && !hi.set) {
		strbuf_cat(b, js_fixed(c, integers ? FX_INTEGER : FX_NUMBER));
		return 0;
	}
	rc = integers ? int_alts(c, &lo, &hi, &sub) : num_alts(c, &lo, &hi, &sub);
	if (rc == 0 && sub.n == 0)
		rc = js_err(c, ERR_INVAL, NULL, "no %s lies within the bounds", integers ? "integer" : "number");
	if (rc == 0 && (rc = js_rule_shared(c, sub.s, name)) == 0)
		strbuf_cat(b, name);
	free(sub.s);
	return rc;
}

/* ---- sets of code points, spelled as JSON spells them in a string ---- */

struct crange {
	uint32_t lo, hi;
};

struct cset {
	struct crange *r;
	uint32_t n, cap;
};

static void
cs_add(struct cset *s, uint32_t lo, uint32_t hi)
{
	s->r = xgrow(s->r, &s->cap, s->n + 1, sizeof *s->r);
	s->r[s->n++] = (struct crange){ lo, hi };
}

static int
range_cmp(const void *a, const void *b)
{
	const struct crange *x = a, *y = b;

	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges s's ranges. */
static void
cs_norm(struct cset *s)
{
	uint32_t k = 0;

	if (s->n > 1)
		qsort(s->r, s->n, sizeof *s->r, range_cmp);
	for (uint32_t i = 0; i < s->n; i++)
		if (k > 0 && s->r[i].lo <= s->r[k - 1].hi + 1)
			s->r[k - 1].hi = MAX(s->r[k - 1].hi, s->r[i].hi);
		else
			s->r[k++] = s->r[i];
	s->n = k;
}

/* s's complement within U+0000..U+10FFFF. */
static void
cs_neg(struct cset *s)
{
	struct cset t = { 0 };
	uint32_t next = 0;

	cs_norm(s);
	for (uint32_t i = 0; i < s->n; i++) {
		if (s->r[i].lo > next)
			cs_add(&t, next, s->r[i].lo - 1);
		next = s->r[i].hi + 1;
	}
	if (next <= 0x10ffff)
		cs_add(&t, next, 0x10ffff);
	free(s->r);
	*s = t;
}

static int
cs_has(const struct cset *s, uint32_t cp)
{
	for (uint32_t i = 0; i < s->n; i++)
		if (cp >= s->r[i].lo && cp <= s->r[i].hi)
			return 1;
	return 0;
}

/* The class of s's code points that a string holds raw (all but controls, '"', '\'), into b; 0 if none. */
static int
raw_class(const struct cset *s, struct strbuf *b)
{
	static const struct crange raw[3] = { { 0x20, 0x21 }, { 0x23, 0x5b }, { 0x5d, 0x10ffff } };
	uint32_t n = 0, one = 0;
	struct strbuf cls = { 0 };

	for (uint32_t i = 0; i < s->n; i++)
		for (int k = 0; k < 3; k++) {
			uint32_t lo = MAX(s->r[i].lo, raw[k].lo), hi = MIN(s->r[i].hi, raw[k].hi);

			if (lo > hi)
				continue;
			n += hi - lo + 1, one = lo;
			js_gl_cp(&cls, lo);
			if (hi > lo) {
				strbuf_cat(&cls, "-");
				js_gl_cp(&cls, hi);
			}
		}
	if (n == 1) {
		strbuf_cat(b, "\"");
		js_gl_cp(b, one);
		strbuf_cat(b, "\"");
	} else if (n > 1) {
		strbuf_printf(b, "[%s]", cls.s);
	}
	free(cls.s);
	return n > 0;
}

/*
 * Appends one item matching the spellings in a JSON string of s's code
 * points: raw, or \" and \\, controls as \b \f \n \r \t or \u00XX (U+0000
 * never).
 */
static int
spell_set(struct jsc *c, struct cset *s, struct strbuf *b)
{
	static const char short_esc[32] = { ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't' };
	struct strbuf alts = { 0 };
	char name[NAME_LEN];
	int n = 0, ctl = 0, rc = 0;

	cs_norm(s);
	n += raw_class(s, &alts);
	if (cs_has(s, '"')) {
		js_alt(&alts), n++;
		strbuf_cat(&alts, "\"\\x5C\\x22\"");
	}
	if (cs_has(s, '\\')) {
		js_alt(&alts), n++;
		strbuf_cat(&alts, "\"\\x5C\\x5C\"");
	}
	for (uint32_t cp = 1; cp < 0x20; cp++)
		ctl += cs_has(s, cp);
	if (ctl == 0x1f) {
		js_alt(&alts), n++;
		strbuf_cat(&alts, js_fixed(c, FX_CTL));
	} else {
		for (uint32_t cp = 1; cp < 0x20; cp++) {
			if (!cs_has(s, cp))
				continue;
			js_alt(&alts), n++;
			if (short_esc[cp] != 0)
				strbuf_printf(&alts, "\"\\x5C%c\" | ", short_esc[cp]);
			strbuf_printf(&alts, "\"\\x5Cu00%u\" [%X%x]", cp >> 4, cp & 15, cp & 15);
		}
	}
	if (n == 0)
		strbuf_cat(b, js_fixed(c, FX_NEVER));
	else if (n == 1 && (ctl == 0 || ctl == 0x1f)) /* one item: a literal, a class or ctl */
		strbuf_cat(b, alts.s);
	else if ((rc = js_rule_shared(c, alts.s, name)) == 0)
		strbuf_cat(b, name);
	free(alts.s);
	return rc;
}

/* ---- patterns (an ECMA-262 subset) ---- */

struct rx {
	struct jsc *c;
	const char *s, *p, *end;
	int depth;
};

static int rx_alts(struct rx *x, struct strbuf *b, int *nullable, int top);

static int
rx_err(struct rx *x, int code, const char *msg)
{
	return js_err(x->c, code, "pattern", "%s (at byte %td of the pattern)", msg, x->p - x->s + 1);
}

static int
rx_peek(const struct rx *x, char ch)
{
	return x->p < x->end && *x->p == ch;
}

static uint32_t
rx_next(struct rx *x)
{
	int len;
	uint32_t cp = js_utf8_cp(x->p, (size_t)(x->end - x->p), &len);

	x->p += len;
	return cp;
}

/* ECMA's \d, \w or \s (its white space and line terminators) into s; neg: the complement. */
static void
rx_class_escape(char e, struct cset *s)
{
	static const struct crange space[] = { { 9, 13 }, { 32, 32 }, { 0xa0, 0xa0 }, { 0x1680, 0x1680 },
		{ 0x2000, 0x200a }, { 0x2028, 0x2029 }, { 0x202f, 0x202f }, { 0x205f, 0x205f }, { 0x3000, 0x3000 },
		{ 0xfeff, 0xfeff } };
	struct cset t = { 0 };

	switch (e | 0x20) {
	case 'd':
		cs_add(&t, '0', '9');
		break;
	case 'w':
		cs_add(&t, '0', '9'), cs_add(&t, 'A', 'Z'), cs_add(&t, 'a', 'z'), cs_add(&t, '_', '_');
		break;
	default:
		for (size_t i = 0; i < ARRAY_LEN(space); i++)
			cs_add(&t, space[i].lo, space[i].hi);
	}
	if (e >= 'A' && e <= 'Z')
		cs_neg(&t);
	for (uint32_t i = 0; i < t.n; i++)
		cs_add(s, t.r[i].lo, t.r[i].hi);
	free(t.r);
}

static int
rx_hex(struct rx *x, int n, uint32_t *cp)
{
	*cp = 0;
	for (int i = 0; i < n; i++, x->p++) {
		int v = x->p < x->end ? js_hex_val(*x->p) : -1;

		if (v < 0)
			return rx_err(x, ERR_INVAL, "an escape without its hexadecimal digits");
		*cp = *cp << 4 | (uint32_t)v;
	}
	return 0;
}

/* \uXXXX, a surrogate pair's two as one code point. */
static int
rx_unicode(struct rx *x, uint32_t *cp)
{
	uint32_t lo;
	int rc;

	if (rx_peek(x, '{'))
		return rx_err(x, ERR_UNSUPPORTED, "\\u{...} (it needs the u flag)");
	if ((rc = rx_hex(x, 4, cp)) != 0)
		return rc;
	if (*cp < 0xd800 || *cp > 0xdfff)
		return 0;
	if (*cp > 0xdbff || x->end - x->p < 6 || x->p[0] != '\\' || x->p[1] != 'u')
		return rx_err(x, ERR_UNSUPPORTED, "an unpaired surrogate");
	x->p += 2;
	if ((rc = rx_hex(x, 4, &lo)) != 0)
		return rc;
	if (lo < 0xdc00 || lo > 0xdfff)
		return rx_err(x, ERR_UNSUPPORTED, "an unpaired surrogate");
	*cp = 0x10000 + ((*cp - 0xd800) << 10) + (lo - 0xdc00);
	return 0;
}

/*
 * The escape after a '\' into s (a class escape or one code point; *one:
 * whether it was one, and which). In a class, \b is a backspace.
 */
static int
rx_escape(struct rx *x, int in_class, struct cset *s, int *one, uint32_t *cp)
{
	static const char syntax[] = "^$\\.*+?()[]{}|/-";
	char e;

	if (x->p >= x->end)
		return rx_err(x, ERR_INVAL, "a pattern that ends in '\\'");
	e = *x->p++;
	*one = 1;
	switch (e) {
	case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
		*one = 0;
		rx_class_escape(e, s);
		return 0;
	case 't': *cp = '\t'; break;
	case 'n': *cp = '\n'; break;
	case 'r': *cp = '\r'; break;
	case 'f': *cp = '\f'; break;
	case 'v': *cp = '\v'; break;
	case 'x':
	case 'u': {
		int rc = e == 'x' ? rx_hex(x, 2, cp) : rx_unicode(x, cp);

		if (rc != 0)
			return rc;
		break;
	}
	case '0':
		if (rx_peek(x, '0') || (x->p < x->end && *x->p >= '1' && *x->p <= '9'))
			return rx_err(x, ERR_UNSUPPORTED, "octal escapes");
		*cp = 0;
		break;
	case 'b':
		if (!in_class)
			return rx_err(x, ERR_UNSUPPORTED, "word boundaries (\\b)");
		*cp = '\b';
		break;
	default:
		if (e >= '1' && e <= '9')
			return rx_err(x, ERR_UNSUPPORTED, "backreferences");
		if (e == '\0' || strchr(syntax, e) == NULL)
			return rx_err(x, ERR_UNSUPPORTED, "an escape outside the supported set (\\d \\w \\s, their "
			    "negations, \\t \\n \\r \\f \\v \\0 \\xHH \\uHHHH, \\b in a class, "
			    "escaped syntax characters)");
		*cp = (unsigned char)e;
	}
	cs_add(s, *cp, *cp);
	return 0;
}

/* One member of a class (a code point or a class escape) into s. */
static int
rx_class_atom(struct rx *x, struct cset *s, int *one, uint32_t *cp)
{
	if (x->p >= x->end)
		return rx_err(x, ERR_INVAL, "a '[' without its ']'");
	if (*x->p == '\\') {
		x->p++;
		return rx_escape(x, 1, s, one, cp);
	}
	*one = 1;
	*cp = rx_next(x);
	cs_add(s, *cp, *cp);
	return 0;
}

/* A class [...] (the '[' read) into s. */
static int
rx_class(struct rx *x, struct cset *s)
{
	int neg = rx_peek(x, '^'), one, rc;
	uint32_t lo, hi;

	x->p += neg;
	while (!rx_peek(x, ']')) {
		if ((rc = rx_class_atom(x, s, &one, &lo)) != 0)
			return rc;
		if (x->end - x->p < 2 || x->p[0] != '-' || x->p[1] == ']')
			continue;
		if (!one)
			return rx_err(x, ERR_UNSUPPORTED, "a class range with \\d, \\w or \\s at an end");
		x->p++;
		s->n--; /* lo alone was added: the range replaces it */
		if ((rc = rx_class_atom(x, s, &one, &hi)) != 0)
			return rc;
		if (!one)
			return rx_err(x, ERR_UNSUPPORTED, "a class range with \\d, \\w or \\s at an end");
		if (hi < lo)
			return rx_err(x, ERR_INVAL, "a class range that runs backwards");
		s->r[s->n - 1].lo = lo;
	}
	x->p++;
	if (neg)
		cs_neg(s);
	return 0;
}

/* A group (the '(' read) as a rule's name into b. */
static int
rx_group(struct rx *x, struct strbuf *b, int *nullable)
{
	struct strbuf sub = { 0 };
	char name[NAME_LEN];
	int rc;

	if (++x->depth > JSCHEMA_MAX_DEPTH)
		return rx_err(x, ERR_RANGE, "groups nested deeper than the limit of " STR(JSCHEMA_MAX_DEPTH));
	if (rx_peek(x, '?')) {
		if (x->end - x->p >= 2 && x->p[1] == ':') {
			x->p += 2;
		} else if (x->end - x->p >= 3 && x->p[1] == '<' && x->p[2] != '=' && x->p[2] != '!') {
			while (x->p < x->end && *x->p != '>')
				x->p++;
			if (x->p++ >= x->end)
				return rx_err(x, ERR_INVAL, "a group's name without its '>'");
		} else {
			return rx_err(x, ERR_UNSUPPORTED, "lookaround and other (? groups but (?: and (?<name>");
		}
	}
	if ((rc = rx_alts(x, &sub, nullable, 0)) == 0 && !rx_peek(x, ')'))
		rc = rx_err(x, ERR_INVAL, "a '(' without its ')'");
	if (rc == 0 && (rc = js_rule_shared(x->c, sub.s, name)) == 0) {
		strbuf_cat(b, name);
		x->p++, x->depth--;
	}
	free(sub.s);
	return rc;
}

/* One atom as one grammar item into b. */
static int
rx_atom(struct rx *x, struct strbuf *b, int *nullable)
{
	struct cset s = { 0 };
	uint32_t cp;
	int rc = 0, one;

	*nullable = 0;
	switch (*x->p) {
	case '(':
		x->p++;
		return rx_group(x, b, nullable);
	case '*': case '+': case '?':
		return rx_err(x, ERR_INVAL, "a quantifier with nothing to repeat");
	case '{':
		return rx_err(x, ERR_UNSUPPORTED, "a '{' that does not follow an item");
	case '[':
		x->p++;
		rc = rx_class(x, &s);
		break;
	case '.':
		x->p++;
		cs_add(&s, '\n', '\n'), cs_add(&s, '\r', '\r'), cs_add(&s, 0x2028, 0x2029);
		cs_neg(&s);
		break;
	case '\\':
		x->p++;
		rc = rx_escape(x, 0, &s, &one, &cp);
		break;
	default:
		cp = rx_next(x);
		cs_add(&s, cp, cp);
	}
	if (rc == 0)
		rc = spell_set(x->c, &s, b);
	free(s.r);
	return rc;
}

/* Digits of a count; -1 if none. */
static long
rx_count(struct rx *x)
{
	long v = -1;

	for (; x->p < x->end && *x->p >= '0' && *x->p <= '9'; x->p++)
		v = MIN((v < 0 ? 0 : v * 10) + (*x->p - '0'), GRAM_MAX_REPEAT + 1); /* past the limit: the limit + 1 */
	return v;
}

/* A quantifier after an item, if any, onto b (the item's nullable updated); lazy ones match the same. */
static int
rx_quantifier(struct rx *x, struct strbuf *b, int *nullable)
{
	long lo, hi;

	if (x->p >= x->end || strchr("*+?{", *x->p) == NULL)
		return 0;
	if (*x->p == '{') {
		x->p++;
		lo = hi = rx_count(x);
		if (rx_peek(x, ',')) {
			x->p++;
			hi = rx_peek(x, '}') ? LONG_MAX : rx_count(x);
		}
		if (lo < 0 || hi < 0 || !rx_peek(x, '}'))
			return rx_err(x, ERR_UNSUPPORTED, "a '{' that is not a count {n}, {n,} or {n,m}");
		if (lo > GRAM_MAX_REPEAT || (hi != LONG_MAX && hi > GRAM_MAX_REPEAT))
			return rx_err(x, ERR_RANGE, "a count above the limit of " STR(GRAM_MAX_REPEAT));
		if (hi < lo)
			return rx_err(x, ERR_INVAL, "a count {n,m} with m below n");
	} else {
		lo = *x->p == '+', hi = *x->p == '?' ? 1 : LONG_MAX;
	}
	x->p++;
	x->p += rx_peek(x, '?');
	if (hi == LONG_MAX && *nullable)
		return rx_err(x, ERR_UNSUPPORTED, "a repetition without bound of what may match nothing");
	if (hi == LONG_MAX)
		strbuf_printf(b, "{%ld,}", lo);
	else
		strbuf_printf(b, "{%ld,%ld}", lo, hi);
	*nullable = *nullable || lo == 0;
	if (x->p < x->end && strchr("*+?{", *x->p) != NULL)
		return rx_err(x, ERR_INVAL, "a quantifier with nothing to repeat");
	return 0;
}

/*
 * A sequence up to '|', ')' or the end into b. At the top, a '^' first
 * and a '$' last anchor it; without them any text may come before or after.
 */
static int
rx_seq(struct rx *x, struct strbuf *b, int *nullable, int top)
{
	int start = top && rx_peek(x, '^'), end = 0, nl, rc;

	x->p += start;
	*nullable = 1;
	if (top && !start)
		strbuf_printf(b, "%s* ", js_fixed(x->c, FX_PCHAR));
	while (x->p < x->end && *x->p != '|' && *x->p != ')') {
		if (*x->p == '$' && top && (x->p + 1 == x->end || x->p[1] == '|')) {
			x->p++, end = 1;
			break;
		}
		if (*x->p == '$' || *x->p == '^')
			return rx_err(x, ERR_UNSUPPORTED, "'^' and '$' only at the start and the end");
		if ((rc = rx_atom(x, b, &nl)) != 0 || (rc = rx_quantifier(x, b, &nl)) != 0)
			return rc;
		strbuf_cat(b, " ");
		*nullable = *nullable && nl;
	}
	if (top && !end)
		strbuf_printf(b, "%s*", js_fixed(x->c, FX_PCHAR));
	else if (b->n == 0)
		strbuf_cat(b, "\"\"");
	return 0;
}

/* Alternatives up to ')' or the end into b. */
static int
rx_alts(struct rx *x, struct strbuf *b, int *nullable, int top)
{
	struct strbuf seq = { 0 };
	int nl, rc;

	*nullable = 0;
	for (;;) {
		js_sb_clear(&seq);
		if ((rc = rx_seq(x, &seq, &nl, top)) != 0)
			break;
		js_alt(b);
		strbuf_cat(b, seq.s);
		*nullable = *nullable || nl;
		if (!rx_peek(x, '|'))
			break;
		x->p++;
	}
	free(seq.s);
	return rc;
}

/* The item of the strings that pattern (n bytes) matches, into b. */
int
js_pattern_item(struct jsc *c, const char *pattern, size_t n, struct strbuf *b)
{
	struct rx x = { c, pattern, pattern, pattern + n, 0 };
	struct strbuf body = { 0 };
	char name[NAME_LEN];
	int nl, rc;

	if ((rc = rx_alts(&x, &body, &nl, 1)) == 0 && x.p < x.end)
		rc = rx_err(&x, ERR_INVAL, "a ')' without its '('");
	if (rc == 0 && (rc = js_rule_shared(c, body.s, name)) == 0) {
		js_sb_clear(&body);
		strbuf_printf(&body, "\"\\x22\" %s \"\\x22\"", name);
		rc = js_rule_shared(c, body.s, name);
	}
	if (rc == 0)
		strbuf_cat(b, name);
	free(body.s);
	return rc;
}
