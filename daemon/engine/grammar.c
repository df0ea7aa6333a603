/*
 * grammar.c: a grammar's text compiled (grammar.h): the parser, which
 * lowers groups and repetitions to rules of their own (grammar_int.h),
 * and the checks of the whole: every rule defined, a root, no left
 * recursion, the limits.
 */
#include "config.h"
#include "grammar.h"
#include "grammar_int.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* ---- building ---- */

/* A growing array of elements (one rule's while it is parsed). */
struct ebuf {
	struct gelem *e;
	uint32_t n, cap;
};

struct rdef {
	char *name;      /* NULL for the rules groups and repetitions make */
	struct ebuf body;
	int defined;
};

struct build {
	struct rdef *r;
	uint32_t n_r, cap_r;
	uint32_t *names; /* hash of named rules: index + 1, 0 empty */
	uint32_t names_cap;
	struct gset *sets;
	uint32_t n_sets, cap_sets;
	struct grange *ranges;
	uint32_t n_ranges, cap_ranges;
	uint64_t n_elems;
};

struct parser {
	const char *s, *p, *end;
	struct build *b;
	int nest;
	char *err;
};

/* Line and column of p, for messages. */
static void
where(const struct parser *ps, const char *p, int *line, int *col)
{
	*line = 1, *col = 1;
	for (const char *q = ps->s; q < p; q++)
		if (*q == '\n')
			++*line, *col = 1;
		else if (((unsigned char)*q & 0xc0) != 0x80)
			++*col;
}

static int
perr(struct parser *ps, int code, const char *msg)
{
	int line, col;

	where(ps, ps->p, &line, &col);
	return err_set(ps->err, code, "grammar, line %d column %d: %s", line, col, msg);
}

static int
push_elem(struct parser *ps, uint32_t rule, uint32_t kind, uint32_t arg)
{
	struct ebuf *eb = &ps->b->r[rule].body;

	if (++ps->b->n_elems > GRAM_MAX_ELEMS)
		return perr(ps, ERR_RANGE, "more elements than the limit of 2,097,152");
	eb->e = xgrow(eb->e, &eb->cap, eb->n + 1, sizeof *eb->e);
	eb->e[eb->n++] = (struct gelem){ kind, arg };
	return 0;
}

static int
new_rule(struct parser *ps, uint32_t *id)
{
	struct build *b = ps->b;

	if (b->n_r >= GRAM_MAX_RULES)
		return perr(ps, ERR_RANGE, "more rules than the limit of 65,536");
	b->r = xgrow(b->r, &b->cap_r, b->n_r + 1, sizeof *b->r);
	memset(&b->r[b->n_r], 0, sizeof *b->r);
	*id = b->n_r++;
	return 0;
}

/* The rule named s (n bytes), declared on first use. */
static int
rule_named(struct parser *ps, const char *s, size_t n, uint32_t *id)
{
	struct build *b = ps->b;
	uint32_t i;
	int rc;

	if (b->names_cap < 2 * (b->n_r + 1)) { /* rehash at half full */
		uint32_t cap = b->names_cap ? b->names_cap : 256, *t;

		while (cap < 2 * (b->n_r + 1))
			cap *= 2;
		t = xcalloc(cap, sizeof *t);
		for (uint32_t r = 0; r < b->n_r; r++)
			if (b->r[r].name != NULL) {
				for (i = hash32(b->r[r].name, strlen(b->r[r].name)) & (cap - 1); t[i] != 0;
				    i = (i + 1) & (cap - 1))
					;
				t[i] = r + 1;
			}
		free(b->names);
		b->names = t, b->names_cap = cap;
	}
	for (i = hash32(s, n) & (b->names_cap - 1); b->names[i] != 0; i = (i + 1) & (b->names_cap - 1)) {
		const char *nm = b->r[b->names[i] - 1].name;

		if (strlen(nm) == n && memcmp(nm, s, n) == 0) {
			*id = b->names[i] - 1;
			return 0;
		}
	}
	if ((rc = new_rule(ps, id)) != 0)
		return rc;
	b->r[*id].name = xstrndup(s, n);
	b->names[i] = *id + 1;
	return 0;
}

static int
is_name_char(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips spaces, newlines and comments. */
static void
skip_space(struct parser *ps)
{
	while (ps->p < ps->end) {
		if (*ps->p == '#') {
			while (ps->p < ps->end && *ps->p != '\n')
				ps->p++;
		} else if (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') {
			ps->p++;
		} else {
			return;
		}
	}
}

/* 1 if a name followed by ::= starts at p (the next definition). */
static int
at_definition(const struct parser *ps)
{
	struct parser q = *ps;

	while (q.p < q.end && is_name_char((unsigned char)*q.p))
		q.p++;
	if (q.p == ps->p)
		return 0;
	skip_space(&q);
	return q.end - q.p >= 3 && memcmp(q.p, "::=", 3) == 0;
}

static int
hex_digits(struct parser *ps, int n, uint32_t *cp)
{
	*cp = 0;
	for (int i = 0; i < n; i++, ps->p++) {
		int c = ps->p < ps->end ? (unsigned char)*ps->p : 0;
		int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;

		if (v < 0)
			return perr(ps, ERR_INVAL, "a hexadecimal escape needs its digits");
		*cp = *cp * 16 + (uint32_t)v;
	}
	return *cp > 0x10ffff ? perr(ps, ERR_INVAL, "an escape beyond U+10FFFF") : 0;
}

/* One character of a literal or class (escapes decoded) into cp. */
static int
read_char(struct parser *ps, uint32_t *cp)
{
	const unsigned char *u = (const unsigned char *)ps->p;
	int len;

	if (ps->p >= ps->end)
		return perr(ps, ERR_INVAL, "the text ends inside a literal or class");
	if (*u == '\\') {
		ps->p++;
		if (ps->p >= ps->end)
			return perr(ps, ERR_INVAL, "the text ends inside an escape");
		switch (*ps->p++) {
		case 'n': *cp = '\n'; return 0;
		case 'r': *cp = '\r'; return 0;
		case 't': *cp = '\t'; return 0;
		case '\\': *cp = '\\'; return 0;
		case '"': *cp = '"'; return 0;
		case '\'': *cp = '\''; return 0;
		case '[': *cp = '['; return 0;
		case ']': *cp = ']'; return 0;
		case '-': *cp = '-'; return 0;
		case '^': *cp = '^'; return 0;
		case 'x': return hex_digits(ps, 2, cp);
		case 'u': return hex_digits(ps, 4, cp);
		case 'U': return hex_digits(ps, 8, cp);
		default: ps->p--; return perr(ps, ERR_INVAL, "an unknown escape");
		}
	}
	if ((len = utf8_seq_len(u, (size_t)(ps->end - ps->p))) == 0)
		return perr(ps, ERR_INVAL, "text that is not UTF-8");
	*cp = utf8_decode(u, len);
	ps->p += len;
	return 0;
}

static int
range_cmp(const void *pa, const void *pb)
{
	const struct grange *a = pa, *b = pb;

	return a->lo != b->lo ? (a->lo < b->lo ? -1 : 1) : (a->hi < b->hi ? -1 : a->hi > b->hi);
}

/*
 * A set of the ranges added since first (neg: their complement); returns
 * its id in *id. The ranges are sorted and merged where they overlap or
 * touch (grammar_int.h), so that a set's answers for a span of code
 * points (a character half read) are exact.
 */
static int
end_set(struct parser *ps, uint32_t first, int neg, uint32_t *id)
{
	struct build *b = ps->b;
	uint32_t n = 0;

	qsort(b->ranges + first, b->n_ranges - first, sizeof *b->ranges, range_cmp);
	for (uint32_t i = first; i < b->n_ranges; i++) {
		struct grange *last = n > 0 ? &b->ranges[first + n - 1] : NULL;

		if (last != NULL && (uint64_t)b->ranges[i].lo <= (uint64_t)last->hi + 1)
			last->hi = MAX(last->hi, b->ranges[i].hi);
		else
			b->ranges[first + n++] = b->ranges[i];
	}
	b->n_ranges = first + n;
	b->sets = xgrow(b->sets, &b->cap_sets, b->n_sets + 1, sizeof *b->sets);
	b->sets[b->n_sets] = (struct gset){ first, b->n_ranges - first, neg };
	*id = b->n_sets++;
	return 0;
}

static int
add_range(struct parser *ps, uint32_t lo, uint32_t hi)
{
	struct build *b = ps->b;

	if (b->n_ranges >= GRAM_MAX_ELEMS)
		return perr(ps, ERR_RANGE, "more character ranges than the limit of 2,097,152");
	b->ranges = xgrow(b->ranges, &b->cap_ranges, b->n_ranges + 1, sizeof *b->ranges);
	b->ranges[b->n_ranges++] = (struct grange){ lo, hi };
	return 0;
}

/* The element of one character (cp) into rule. */
static int
push_char(struct parser *ps, uint32_t rule, uint32_t lo, uint32_t hi, int neg)
{
	uint32_t first = ps->b->n_ranges, set;
	int rc;

	if ((rc = (lo <= hi ? add_range(ps, lo, hi) : 0)) != 0 || (rc = end_set(ps, first, neg, &set)) != 0)
		return rc;
	return push_elem(ps, rule, GE_CHAR, set);
}

static int
parse_literal(struct parser *ps, uint32_t rule)
{
	uint32_t cp;
	int rc;

	ps->p++; /* the opening quote */
	while (ps->p < ps->end && *ps->p != '"')
		if ((rc = read_char(ps, &cp)) != 0 || (rc = push_char(ps, rule, cp, cp, 0)) != 0)
			return rc;
	if (ps->p >= ps->end)
		return perr(ps, ERR_INVAL, "a literal without its closing quote");
	ps->p++;
	return 0;
}

static int
parse_class(struct parser *ps, uint32_t rule)
{
	uint32_t first = ps->b->n_ranges, lo, hi, set;
	int neg = 0, rc;

	ps->p++; /* [ */
	if (ps->p < ps->end && *ps->p == '^')
		neg = 1, ps->p++;
	while (ps->p < ps->end && *ps->p != ']') {
		if ((rc = read_char(ps, &lo)) != 0)
			return rc;
		hi = lo;
		if (ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
			ps->p++;
			if ((rc = read_char(ps, &hi)) != 0)
				return rc;
			if (hi < lo)
				return perr(ps, ERR_INVAL, "a class range that runs backwards");
		}
		if ((rc = add_range(ps, lo, hi)) != 0)
			return rc;
	}
	if (ps->p >= ps->end)
		return perr(ps, ERR_INVAL, "a class without its closing ]");
	ps->p++;
	if ((rc = end_set(ps, first, neg, &set)) != 0)
		return rc;
	return push_elem(ps, rule, GE_CHAR, set);
}

static int parse_alternatives(struct parser *ps, uint32_t rule);

/* Elements [from, n) of rule as a rule of their own, referenced in their place. */
static int
item_rule(struct parser *ps, uint32_t rule, uint32_t from, uint32_t *item)
{
	struct ebuf *eb;
	uint32_t id;
	int rc;

	if (ps->b->r[rule].body.n - from == 1 && ps->b->r[rule].body.e[from].kind == GE_RULE) {
		*item = ps->b->r[rule].body.e[from].arg;
		ps->b->r[rule].body.n = from;
		return 0;
	}
	if ((rc = new_rule(ps, &id)) != 0)
		return rc;
	eb = &ps->b->r[rule].body;
	for (uint32_t i = from; i < eb->n; i++)
		if ((rc = push_elem(ps, id, eb->e[i].kind, eb->e[i].arg)) != 0)
			return rc;
	ps->b->n_elems -= ps->b->r[rule].body.n - from;
	ps->b->r[rule].body.n = from;
	*item = id;
	return push_elem(ps, id, GE_END, 0);
}

/* A rule of x then (more, a rule; NO_RULE: nothing), or empty. */
#define NO_RULE UINT32_MAX
static int
opt_rule(struct parser *ps, uint32_t x, uint32_t more, uint32_t *id)
{
	int rc;

	if ((rc = new_rule(ps, id)) != 0 || (rc = push_elem(ps, *id, GE_RULE, x)) != 0 ||
	    (more != NO_RULE && (rc = push_elem(ps, *id, GE_RULE, more)) != 0) ||
	    (rc = push_elem(ps, *id, GE_ALT, 0)) != 0)
		return rc;
	return push_elem(ps, *id, GE_END, 0);
}

/* x{lo,hi} (hi UINT32_MAX: unbounded) into rule, x the item's rule. */
static int
repeat(struct parser *ps, uint32_t rule, uint32_t x, uint32_t lo, uint32_t hi)
{
	uint32_t tail = NO_RULE, star;
	int rc;

	for (uint32_t i = 0; i < lo; i++)
		if ((rc = push_elem(ps, rule, GE_RULE, x)) != 0)
			return rc;
	if (hi == UINT32_MAX) { /* R ::= x R | empty */
		if ((rc = new_rule(ps, &star)) != 0 || (rc = push_elem(ps, star, GE_RULE, x)) != 0 ||
		    (rc = push_elem(ps, star, GE_RULE, star)) != 0 || (rc = push_elem(ps, star, GE_ALT, 0)) != 0 ||
		    (rc = push_elem(ps, star, GE_END, 0)) != 0)
			return rc;
		return push_elem(ps, rule, GE_RULE, star);
	}
	for (uint32_t i = lo; i < hi; i++) /* (x (x (x)?)?)? */
		if ((rc = opt_rule(ps, x, tail, &tail)) != 0)
			return rc;
	return tail == NO_RULE ? 0 : push_elem(ps, rule, GE_RULE, tail);
}

static int
read_count(struct parser *ps, uint32_t *n)
{
	uint64_t v = 0;

	if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
		return perr(ps, ERR_INVAL, "a count in { } needs digits");
	while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
		v = v * 10 + (uint64_t)(*ps->p++ - '0');
		if (v > GRAM_MAX_REPEAT)
			return perr(ps, ERR_RANGE, "a count above the limit of 1,000");
	}
	*n = (uint32_t)v;
	return 0;
}

/* The postfix after an item (elements [from, n) of rule), if any. */
static int
parse_postfix(struct parser *ps, uint32_t rule, uint32_t from)
{
	uint32_t lo, hi, x;
	int rc;

	if (ps->p >= ps->end || (*ps->p != '*' && *ps->p != '+' && *ps->p != '?' && *ps->p != '{'))
		return 0;
	if (*ps->p == '{') {
		ps->p++;
		if ((rc = read_count(ps, &lo)) != 0)
			return rc;
		hi = lo;
		if (ps->p < ps->end && *ps->p == ',') {
			ps->p++;
			hi = UINT32_MAX;
			if (ps->p < ps->end && *ps->p != '}' && (rc = read_count(ps, &hi)) != 0)
				return rc;
		}
		if (ps->p >= ps->end || *ps->p != '}')
			return perr(ps, ERR_INVAL, "a count without its closing }");
		if (hi < lo)
			return perr(ps, ERR_INVAL, "a count {n,m} with m below n");
		ps->p++;
	} else {
		lo = *ps->p == '+' ? 1 : 0, hi = *ps->p == '?' ? 1 : UINT32_MAX;
		ps->p++;
	}
	if ((rc = item_rule(ps, rule, from, &x)) != 0)
		return rc;
	return repeat(ps, rule, x, lo, hi);
}

static int
parse_item(struct parser *ps, uint32_t rule)
{
	uint32_t from = ps->b->r[rule].body.n, id;
	int rc;

	switch (*ps->p) {
	case '"':
		rc = parse_literal(ps, rule);
		break;
	case '[':
		rc = parse_class(ps, rule);
		break;
	case '.':
		ps->p++;
		rc = push_char(ps, rule, 1, 0, 1); /* no ranges, negated: any character */
		break;
	case '(':
		if (++ps->nest > GRAM_MAX_NEST)
			return perr(ps, ERR_RANGE, "groups nested deeper than the limit of 64");
		ps->p++;
		if ((rc = new_rule(ps, &id)) != 0 || (rc = parse_alternatives(ps, id)) != 0)
			return rc;
		if (ps->p >= ps->end || *ps->p != ')')
			return perr(ps, ERR_INVAL, "a group without its closing )");
		ps->p++, ps->nest--;
		rc = push_elem(ps, rule, GE_RULE, id);
		break;
	default: {
		const char *s = ps->p;

		while (ps->p < ps->end && is_name_char((unsigned char)*ps->p))
			ps->p++;
		if (ps->p == s)
			return perr(ps, ERR_INVAL, "expected a literal, a class, '.', a group or a rule's name");
		rc = rule_named(ps, s, (size_t)(ps->p - s), &id);
		if (rc == 0)
			rc = push_elem(ps, rule, GE_RULE, id);
	}
	}
	return rc != 0 ? rc : parse_postfix(ps, rule, from);
}

/* Alternatives into rule, up to ')', the next definition or the end; ends the rule. */
static int
parse_alternatives(struct parser *ps, uint32_t rule)
{
	int rc;

	for (;;) {
		skip_space(ps);
		while (ps->p < ps->end && *ps->p != '|' && *ps->p != ')' && !at_definition(ps)) {
			if ((rc = parse_item(ps, rule)) != 0)
				return rc;
			skip_space(ps);
		}
		if (ps->p >= ps->end || *ps->p != '|')
			return push_elem(ps, rule, GE_END, 0);
		ps->p++;
		if ((rc = push_elem(ps, rule, GE_ALT, 0)) != 0)
			return rc;
	}
}

static int
parse_definitions(struct parser *ps)
{
	uint32_t id;
	int rc;

	for (skip_space(ps); ps->p < ps->end; skip_space(ps)) {
		const char *s = ps->p;
		struct rdef *d;

		if (!at_definition(ps))
			return perr(ps, ERR_INVAL, "expected a definition: name ::= ...");
		while (is_name_char((unsigned char)*ps->p))
			ps->p++;
		if ((rc = rule_named(ps, s, (size_t)(ps->p - s), &id)) != 0)
			return rc;
		d = &ps->b->r[id];
		if (d->defined) {
			ps->p = s;
			return perr(ps, ERR_INVAL, "a rule defined twice");
		}
		d->defined = 1;
		skip_space(ps);
		ps->p += 3; /* ::= */
		if ((rc = parse_alternatives(ps, id)) != 0)
			return rc;
		if (ps->p < ps->end && *ps->p == ')')
			return perr(ps, ERR_INVAL, "a ) without its group");
	}
	return 0;
}

/* ---- checks of the whole grammar ---- */

/* Rules that can match no text at all, by fixpoint. */
static uint8_t *
nullable_rules(const struct grammar *g)
{
	uint8_t *nl = xcalloc(g->n_rules, 1);
	int changed = 1;

	while (changed) {
		changed = 0;
		for (uint32_t r = 0; r < g->n_rules; r++) {
			if (nl[r])
				continue;
			for (uint32_t a = 0; a < g->rules[r].n_alt && !nl[r]; a++) {
				const struct gelem *e = &g->elems[g->alts[g->rules[r].alt_first + a]];

				while (e->kind == GE_RULE && nl[e->arg])
					e++;
				if (e->kind == GE_END || e->kind == GE_ALT)
					nl[r] = 1, changed = 1;
			}
		}
	}
	return nl;
}

/*
 * Calls per rule r: the edges r -> s for each reference s at the start of
 * one of r's alternatives, past references to rules that may match
 * nothing. fill NULL: counts them into first[r + 1]; else stores them.
 */
static void
left_edges(const struct grammar *g, const uint8_t *nl, uint32_t *first, uint32_t *fill)
{
	for (uint32_t r = 0; r < g->n_rules; r++) {
		uint32_t k = fill != NULL ? first[r] : 0;

		for (uint32_t a = 0; a < g->rules[r].n_alt; a++)
			for (const struct gelem *e = &g->elems[g->alts[g->rules[r].alt_first + a]]; e->kind == GE_RULE; e++) {
				if (fill != NULL)
					fill[k] = e->arg;
				k++;
				if (!nl[e->arg])
					break;
			}
		if (fill == NULL)
			first[r + 1] = k;
	}
}

/*
 * Refuses left recursion: a rule that reaches itself through left_edges,
 * which the positions would expand forever. Depth first with colours,
 * iteratively (a hostile grammar's chains are long).
 */
static int
check_left_recursion(const struct grammar *g, const struct build *b, char *err)
{
	uint8_t *nl = nullable_rules(g), *colour = xcalloc(g->n_rules, 1);
	uint32_t *first = xcalloc((size_t)g->n_rules + 1, sizeof *first), *edge;
	struct walk { uint32_t rule, next; } *st = xmalloc(((size_t)g->n_rules + 1) * sizeof *st);
	int rc = 0;

	left_edges(g, nl, first, NULL);
	for (uint32_t r = 0; r < g->n_rules; r++)
		first[r + 1] += first[r];
	edge = xmalloc(((size_t)first[g->n_rules] + 1) * sizeof *edge);
	left_edges(g, nl, first, edge);
	for (uint32_t r0 = 0; r0 < g->n_rules && rc == 0; r0++) {
		uint32_t n = 0;

		if (colour[r0] != 0)
			continue;
		st[n++] = (struct walk){ r0, first[r0] }, colour[r0] = 1;
		while (n > 0 && rc == 0) {
			struct walk *w = &st[n - 1];
			uint32_t s;

			if (w->next == first[w->rule + 1]) {
				colour[w->rule] = 2, n--;
				continue;
			}
			s = edge[w->next++];
			if (colour[s] == 0) {
				colour[s] = 1;
				st[n++] = (struct walk){ s, first[s] };
			} else if (colour[s] == 1) {
				const char *nm = b->r[s].name;

				for (uint32_t i = n; i-- > 0 && nm == NULL;)
					nm = b->r[st[i].rule].name;
				rc = err_set(err, ERR_INVAL, "grammar: rule '%s' can reach itself without consuming text "
				    "(left recursion)", nm != NULL ? nm : "?");
			}
		}
	}
	free(nl), free(colour), free(first), free(edge), free(st);
	return rc;
}

/* The builder's rules as one grammar (elements copied flat); checks references and root. */
static int
flatten(struct build *b, struct grammar *g, char *err)
{
	uint32_t n_alt = 0;
	uint32_t root = UINT32_MAX;

	for (uint32_t r = 0; r < b->n_r; r++) {
		if (b->r[r].name != NULL && !b->r[r].defined)
			return err_set(err, ERR_INVAL, "grammar: rule '%s' is used but not defined", b->r[r].name);
		if (b->r[r].name != NULL && strcmp(b->r[r].name, "root") == 0)
			root = r;
		for (uint32_t i = 0; i < b->r[r].body.n; i++)
			n_alt += b->r[r].body.e[i].kind == GE_ALT || b->r[r].body.e[i].kind == GE_END;
	}
	if (root == UINT32_MAX)
		return err_set(err, ERR_INVAL, "grammar: no rule named 'root'");
	g->elems = xmalloc((size_t)(b->n_elems + 1) * sizeof *g->elems);
	g->alts = xmalloc(((size_t)n_alt + 1) * sizeof *g->alts);
	g->rules = xcalloc(b->n_r, sizeof *g->rules);
	g->n_rules = b->n_r, g->root = root;
	n_alt = 0;
	for (uint32_t r = 0; r < b->n_r; r++) {
		struct grule *ru = &g->rules[r];

		ru->first = g->n_elems, ru->alt_first = n_alt, ru->named = b->r[r].name != NULL;
		g->alts[n_alt++] = g->n_elems;
		for (uint32_t i = 0; i < b->r[r].body.n; i++) {
			g->elems[g->n_elems++] = b->r[r].body.e[i];
			if (b->r[r].body.e[i].kind == GE_ALT)
				g->alts[n_alt++] = g->n_elems;
		}
		ru->n_alt = n_alt - ru->alt_first;
	}
	g->sets = b->sets, g->n_sets = b->n_sets, g->ranges = b->ranges, g->n_ranges = b->n_ranges;
	b->sets = NULL, b->ranges = NULL;
	return 0;
}

static void
build_free(struct build *b)
{
	for (uint32_t r = 0; r < b->n_r; r++)
		free(b->r[r].name), free(b->r[r].body.e);
	free(b->r), free(b->names), free(b->sets), free(b->ranges);
}

int
grammar_compile(const char *text, size_t len, struct grammar **out, char *err)
{
	struct build b = { 0 };
	struct parser ps = { text, text, text + len, &b, 0, err };
	struct grammar *g;
	int rc;

	*out = NULL;
	if (len > GRAM_MAX_TEXT)
		return err_set(err, ERR_RANGE, "grammar: %zu bytes, above the limit of %d", len, GRAM_MAX_TEXT);
	g = xcalloc(1, sizeof *g);
	if ((rc = parse_definitions(&ps)) != 0 || (rc = flatten(&b, g, err)) != 0 ||
	    (rc = check_left_recursion(g, &b, err)) != 0) {
		build_free(&b);
		grammar_free(g);
		return rc;
	}
	build_free(&b);
	*out = g;
	return 0;
}

void
grammar_free(struct grammar *g)
{
	if (g == NULL)
		return;
	free(g->elems), free(g->alts), free(g->rules), free(g->sets), free(g->ranges);
	free(g);
}
