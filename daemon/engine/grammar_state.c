/*
 * grammar_state.c: where a sequence's text is in its grammar (grammar.h's
 * gram_state: new, clone, accept, complete, finished).
 *
 * A position in the text is a set of stacks. A stack is a chain of frames,
 * each an element still to match and the frame to return to; its top is
 * always a character set (GE_CHAR), and an empty stack (NULL) means the
 * root is complete. Frames are interned (one frame per element and parent)
 * so that stacks share their tails and equal stacks are equal pointers;
 * a reference at the end of an alternative pushes no frame (a tail call),
 * so a repetition does not deepen the stack. Characters are code points:
 * bytes are decoded as they come, and a character split across tokens is
 * held until its last byte, its possible code points checked meanwhile.
 *
 * This file knows nothing of tokens: it is the matcher, byte by byte.
 * grammar_mask.c, which decides the tokens that may come next, drives the
 * same matcher over the vocabulary's bytes, through the frames, positions
 * and steps grammar_int.h declares (gram_expand, gram_feed and their
 * helpers). The two were one file until the index grew it past 1,600
 * lines; they change for different reasons (what text matches, and how
 * the tokens are found quickly).
 */
#include "config.h"
#include "grammar.h"
#include "grammar_int.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* The deepest chain of references expanded without a character between them. */
#define GRAM_MAX_EXPAND 8192

static size_t
frame_hash(const struct gelem *pos, const struct gframe *up)
{
	uint64_t h = (uint64_t)(uintptr_t)pos * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)up * 0xc2b2ae3d27d4eb4full;

	return (size_t)(h ^ h >> 29);
}

static struct gframe *
pool_find(const struct fpool *p, const struct gelem *pos, const struct gframe *up)
{
	if (p == NULL || p->cap == 0)
		return NULL;
	for (size_t i = frame_hash(pos, up) & (p->cap - 1); p->tab[i] != NULL; i = (i + 1) & (p->cap - 1))
		if (p->tab[i]->pos == pos && p->tab[i]->up == up)
			return p->tab[i];
	return NULL;
}

static void
pool_put(struct fpool *p, struct gframe *f)
{
	size_t i;

	for (i = frame_hash(f->pos, f->up) & (p->cap - 1); p->tab[i] != NULL; i = (i + 1) & (p->cap - 1))
		;
	p->tab[i] = f;
}

struct gframe *
gram_intern(struct gctx *c, const struct gelem *pos, struct gframe *up)
{
	struct fpool *p = c->pool;
	struct gframe *f = pool_find(c->base, pos, up);

	if (f != NULL || (f = pool_find(p, pos, up)) != NULL)
		return f;
	if (2 * (p->n + 1) > p->cap) {
		struct gframe **old = p->tab;
		size_t oc = p->cap;

		p->cap = p->cap ? 2 * p->cap : 256;
		p->tab = xcalloc(p->cap, sizeof *p->tab);
		for (size_t i = 0; i < oc; i++)
			if (old[i] != NULL)
				pool_put(p, old[i]);
		free(old);
	}
	if (p->chunks == NULL || p->used == GRAM_POOL_CHUNK) {
		struct fchunk *ch = p->spare;

		if (ch != NULL)
			p->spare = ch->next, p->n_spare--;
		else
			ch = xmalloc(sizeof *ch);
		ch->next = p->chunks, p->chunks = ch, p->used = 0;
	}
	f = &p->chunks->f[p->used++];
	*f = (struct gframe){ pos, up, up != NULL ? up->depth + 1 : 1 };
	pool_put(p, f);
	p->n++;
	return f;
}

void
gram_pool_free(struct fpool *p)
{
	while (p->chunks != NULL) {
		struct fchunk *next = p->chunks->next;

		free(p->chunks);
		p->chunks = next;
	}
	while (p->spare != NULL) {
		struct fchunk *next = p->spare->next;

		free(p->spare);
		p->spare = next;
	}
	free(p->tab);
	memset(p, 0, sizeof *p);
}

/* The most chunks and table slots an emptied pool keeps for its next use. */
#define POOL_KEEP_CHUNKS 16
#define POOL_KEEP_TAB 4096

/* Empties p, keeping some of its memory (a mask's scratch frames, between masks). */
void
gram_pool_reset(struct fpool *p)
{
	while (p->chunks != NULL) {
		struct fchunk *ch = p->chunks;

		p->chunks = ch->next;
		if (p->n_spare < POOL_KEEP_CHUNKS)
			ch->next = p->spare, p->spare = ch, p->n_spare++;
		else
			free(ch);
	}
	if (p->cap > POOL_KEEP_TAB) {
		free(p->tab);
		p->tab = NULL, p->cap = 0;
	} else if (p->n > 0) {
		memset(p->tab, 0, p->cap * sizeof *p->tab);
	}
	p->n = 0, p->used = 0;
}

/* The slot of c->seen (a table of some size) that holds top, or the free one where it would go. */
static size_t
seen_slot(const struct gctx *c, const void *top)
{
	size_t i = frame_hash(NULL, top) & (c->seen_cap - 1);

	while (c->seen[i] != NULL && c->seen[i] != top)
		i = (i + 1) & (c->seen_cap - 1);
	return i;
}

/* 1 if top is in the set being built. */
static int
seen_has(const struct gctx *c, const void *top)
{
	return c->seen_n > 0 && c->seen[seen_slot(c, top)] != NULL;
}

/* 1 the first time top is added to the set being built (c->seen, reset per set). */
int
gram_seen_first(struct gctx *c, const void *top)
{
	size_t i;

	if (2 * (c->seen_n + 1) > c->seen_cap) {
		const void **old = c->seen;
		uint32_t oc = c->seen_cap;

		c->seen_cap = c->seen_cap ? 2 * c->seen_cap : 64;
		c->seen = xcalloc(c->seen_cap, sizeof *c->seen);
		c->seen_n = 0;
		for (uint32_t k = 0; k < oc; k++)
			if (old[k] != NULL)
				gram_seen_first(c, old[k]);
		free(old);
	}
	if (c->seen[i = seen_slot(c, top)] != NULL)
		return 0;
	c->seen[i] = top;
	c->seen_n++;
	return 1;
}

void
gram_seen_reset(struct gctx *c)
{
	if (c->seen_n > 0)
		memset(c->seen, 0, c->seen_cap * sizeof *c->seen);
	c->seen_n = 0;
}

/*
 * The frame below the stacks of an index's key (gram_index): where a
 * stack goes on into the context the key leaves out. A position's walk
 * keeps it as a top once reached; it takes no character.
 */
struct gframe gram_ctx_frame;

/* The address standing for the empty stack in c->seen (NULL marks free slots). */
static const char empty_stack;

static void
add_top(struct gctx *c, struct gpos *out, struct gframe *top)
{
	if (!gram_seen_first(c, top != NULL ? (const void *)top : &empty_stack))
		return;
	if (out->n >= GRAM_MAX_STACKS) {
		c->overflow = 1;
		return;
	}
	if (out->n == out->cap) {
		out->cap = out->cap ? 2 * out->cap : 16;
		out->st = xrealloc(out->st, out->cap * sizeof *out->st);
	}
	out->st[out->n++] = top;
}

/*
 * The stacks that matching from pos (then up) can reach before its next
 * character, into out: rules entered, rules finished popped.
 *
 * A rule entered again with the same frame to come back to (cont) within
 * one set adds nothing new, and is not expanded again: else a chain of
 * rules of two alternatives that both name the next (a diamond, as
 * anyOf of two $refs makes) took 2^depth expansions. The mark is the
 * frame of the rule's first alternative's start over cont, set in c->seen
 * once the rule is expanded (if that start is a character, that frame is
 * a stack of the set already; no other way makes it one).
 */
void
gram_expand(struct gctx *c, const struct gelem *pos, struct gframe *up, struct gpos *out)
{
	if (++c->level > GRAM_MAX_EXPAND) {
		c->overflow = 1;
	} else if (pos->kind == GE_CHAR) {
		add_top(c, out, gram_intern(c, pos, up));
	} else if (pos->kind != GE_RULE) { /* the end of an alternative: back to the rule below */
		if (up == NULL || up == &gram_ctx_frame)
			add_top(c, out, up);
		else
			gram_expand(c, up->pos, up->up, out);
	} else {
		const struct grule *r = &c->g->rules[pos->arg];
		struct gframe *cont = up, *entered;

		if (pos[1].kind == GE_RULE || pos[1].kind == GE_CHAR) { /* else a tail call: nothing to come back to */
			if (up != NULL && up->depth >= GRAM_MAX_DEPTH) {
				c->level--;
				return; /* nesting past the limit: no text goes there */
			}
			cont = gram_intern(c, pos + 1, up);
		}
		entered = gram_intern(c, &c->g->elems[c->g->alts[r->alt_first]], cont);
		if (!seen_has(c, entered)) {
			for (uint32_t a = 0; a < r->n_alt && !c->overflow; a++)
				gram_expand(c, &c->g->elems[c->g->alts[r->alt_first + a]], cont, out);
			gram_seen_first(c, entered);
		}
	}
	c->level--;
}

/* A set's ranges are sorted, disjoint and apart (grammar_int.h): the answers below are exact. */
static int
set_has(const struct grammar *g, uint32_t set, uint32_t cp)
{
	const struct gset *s = &g->sets[set];

	for (uint32_t i = 0; i < s->n && cp >= g->ranges[s->first + i].lo; i++)
		if (cp <= g->ranges[s->first + i].hi)
			return !s->neg;
	return s->neg;
}

/*
 * 1 if one of set's ranges (its sign aside) holds all of [lo, hi] (all
 * 1), or some of it (all 0). The ranges are apart, so one range holds
 * the whole span or none does.
 */
static int
ranges_reach(const struct grammar *g, const struct gset *s, uint32_t lo, uint32_t hi, int all)
{
	for (uint32_t i = 0; i < s->n; i++) {
		const struct grange *r = &g->ranges[s->first + i];

		if (all ? r->lo <= lo && r->hi >= hi : r->lo <= hi && r->hi >= lo)
			return 1;
	}
	return 0;
}

/* 1 if set holds some code point of [lo, hi] (for a character half read). */
int
gram_set_meets(const struct grammar *g, uint32_t set, uint32_t lo, uint32_t hi)
{
	const struct gset *s = &g->sets[set];

	return s->neg ? !ranges_reach(g, s, lo, hi, 1) : ranges_reach(g, s, lo, hi, 0);
}

/* 1 if set holds every code point of [lo, hi]. */
int
gram_set_covers(const struct grammar *g, uint32_t set, uint32_t lo, uint32_t hi)
{
	const struct gset *s = &g->sets[set];

	return s->neg ? !ranges_reach(g, s, lo, hi, 0) : ranges_reach(g, s, lo, hi, 1);
}

/* out: the stacks of in that take code point cp, moved past it. */
static void
advance(struct gctx *c, const struct gpos *in, uint32_t cp, struct gpos *out)
{
	out->n = 0, out->pn = 0;
	gram_seen_reset(c);
	for (uint32_t i = 0; i < in->n && !c->overflow; i++) {
		const struct gframe *f = in->st[i];

		if (f != NULL && f != &gram_ctx_frame && set_has(c->g, f->pos->arg, cp))
			gram_expand(c, f->pos + 1, f->up, out);
	}
}

/* A UTF-8 sequence's length from its first byte; 0 if no sequence starts so. */
static int
u8_need(uint8_t b)
{
	return b < 0x80 ? 1 : b < 0xc2 ? 0 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : b < 0xf5 ? 4 : 0;
}

/* 1 if b may follow the pn bytes of part (no overlong forms, no surrogates, nothing past U+10FFFF). */
static int
u8_follows(const uint8_t *part, int pn, uint8_t b)
{
	if ((b & 0xc0) != 0x80)
		return 0;
	if (pn == 1)
		return !((part[0] == 0xe0 && b < 0xa0) || (part[0] == 0xed && b > 0x9f) ||
		    (part[0] == 0xf0 && b < 0x90) || (part[0] == 0xf4 && b > 0x8f));
	return 1;
}

/* The code point of an n-byte sequence whose first have bytes are b, the rest fill. */
static uint32_t
u8_decode(const uint8_t *b, int have, int n, uint8_t fill)
{
	uint32_t cp = n == 1 ? b[0] : n == 2 ? b[0] & 0x1fu : n == 3 ? b[0] & 0x0fu : b[0] & 0x07u;

	for (int i = 1; i < n; i++)
		cp = cp << 6 | ((i < have ? b[i] : fill) & 0x3fu);
	return cp;
}

/* Copies in's stacks into out (the same position, its own array). */
void
gram_pos_copy(const struct gpos *in, struct gpos *out)
{
	if (out->cap < in->n) {
		out->cap = in->n;
		out->st = xrealloc(out->st, out->cap * sizeof *out->st);
	}
	memcpy(out->st, in->st, in->n * sizeof *in->st);
	out->n = in->n;
	memcpy(out->part, in->part, sizeof in->part);
	out->pn = in->pn, out->need = in->need;
}

/*
 * The code points [*lo, *hi] that a character half read (pn of its need
 * bytes in part) can still become: no overlong forms, no surrogates,
 * nothing past U+10FFFF (u8_follows holds the later bytes to that, the
 * bounds here the first's).
 */
void
gram_part_range(const uint8_t *part, int pn, int need, uint32_t *lo, uint32_t *hi)
{
	static const uint32_t least[5] = { 0, 0, 0x80, 0x800, 0x10000 };

	*lo = MAX(u8_decode(part, pn, need, 0x80), least[need]);
	*hi = MIN(u8_decode(part, pn, need, 0xbf), 0x10ffffu);
	if (pn == 1 && part[0] == 0xed)
		*hi = MIN(*hi, 0xd7ffu);
}

/* 1 if some stack of p may take the character p holds half read. */
static int
half_viable(const struct grammar *g, const struct gpos *p)
{
	uint32_t lo, hi;

	gram_part_range(p->part, p->pn, p->need, &lo, &hi);
	for (uint32_t i = 0; i < p->n; i++)
		if (p->st[i] != NULL && p->st[i] != &gram_ctx_frame && gram_set_meets(g, p->st[i]->pos->arg, lo, hi))
			return 1;
	return 0;
}

/* out: in after byte b. Returns 1, or 0 when no stack survives it. */
int
gram_feed(struct gctx *c, const struct gpos *in, uint8_t b, struct gpos *out)
{
	if (in->pn == 0) {
		int need = u8_need(b);

		if (need == 1) {
			advance(c, in, b, out);
			return out->n > 0;
		}
		if (need == 0)
			return 0;
		gram_pos_copy(in, out);
		out->part[0] = b, out->pn = 1, out->need = (uint8_t)need;
		return half_viable(c->g, out);
	}
	if (!u8_follows(in->part, in->pn, b))
		return 0;
	if (in->pn + 1 == in->need) {
		uint8_t full[4];

		memcpy(full, in->part, in->pn);
		full[in->pn] = b;
		advance(c, in, u8_decode(full, in->need, in->need, 0), out);
		return out->n > 0;
	}
	gram_pos_copy(in, out);
	out->part[out->pn++] = b;
	return half_viable(c->g, out);
}

int
gram_overflow_err(char *err)
{
	return err_set(err, ERR_RANGE, "grammar: more than %d positions at once, or references nested past %d "
	    "(an ambiguous or degenerate grammar)", GRAM_MAX_STACKS, GRAM_MAX_EXPAND);
}

/* A copy of frame f's chain interned into c's pool. */
static struct gframe *
frame_copy(struct gctx *c, const struct gframe *f)
{
	return f == NULL ? NULL : gram_intern(c, f->pos, frame_copy(c, f->up));
}

/* s's frames kept to those its stacks use (frames of text long past are dropped). */
static void
compact(struct gram_state *s)
{
	struct fpool fresh = { 0 };
	struct gctx c = { s->g, &fresh, NULL, NULL, 0, 0, 0, 0 };

	for (uint32_t i = 0; i < s->at.n; i++)
		s->at.st[i] = frame_copy(&c, s->at.st[i]);
	gram_pool_free(&s->pool);
	s->pool = fresh;
	s->kept = fresh.n;
	free(c.seen);
}

int
gram_state_new(const struct grammar *g, struct gram_state **out, char *err)
{
	struct gram_state *s = xcalloc(1, sizeof *s);
	struct gctx c = { g, &s->pool, NULL, NULL, 0, 0, 0, 0 };
	const struct grule *r = &g->rules[g->root];

	s->g = g;
	for (uint32_t a = 0; a < r->n_alt && !c.overflow; a++)
		gram_expand(&c, &g->elems[g->alts[r->alt_first + a]], NULL, &s->at);
	free(c.seen);
	if (c.overflow) {
		gram_state_free(s);
		*out = NULL;
		return gram_overflow_err(err);
	}
	s->kept = s->pool.n;
	*out = s;
	return 0;
}

int
gram_state_clone(const struct gram_state *s, struct gram_state **out, char *err)
{
	struct gram_state *t = xcalloc(1, sizeof *t);

	(void)err;
	t->g = s->g;
	gram_pos_copy(&s->at, &t->at);
	compact(t); /* its own frames: copies of s's */
	*out = t;
	return 0;
}

void
gram_state_free(struct gram_state *s)
{
	if (s == NULL)
		return;
	gram_pool_free(&s->pool);
	free(s->at.st);
	free(s);
}

int
gram_accept(struct gram_state *s, const char *bytes, size_t n, char *err)
{
	struct gpos p[2] = { { 0 }, { 0 } };
	struct gctx c = { s->g, &s->pool, NULL, NULL, 0, 0, 0, 0 };
	int cur = 0, ok = 1;

	gram_pos_copy(&s->at, &p[0]);
	for (size_t i = 0; i < n && ok; i++, cur ^= 1)
		ok = gram_feed(&c, &p[cur], (uint8_t)bytes[i], &p[cur ^ 1]) && !c.overflow;
	free(c.seen);
	if (!ok) {
		free(p[0].st), free(p[1].st);
		return c.overflow ? gram_overflow_err(err) :
			err_set(err, ERR_INVAL, "grammar: the text does not match here");
	}
	free(s->at.st);
	s->at = p[cur];
	free(p[cur ^ 1].st);
	if (s->pool.n > 4 * s->kept + 4096)
		compact(s);
	return 0;
}

int
gram_complete(const struct gram_state *s)
{
	if (s->at.pn != 0)
		return 0;
	for (uint32_t i = 0; i < s->at.n; i++)
		if (s->at.st[i] == NULL)
			return 1;
	return 0;
}

int
gram_finished(const struct gram_state *s)
{
	return s->at.pn == 0 && s->at.n == 1 && s->at.st[0] == NULL;
}
