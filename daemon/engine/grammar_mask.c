/*
 * grammar_mask.c: where a sequence's text is in its grammar, and the
 * tokens that may come next (grammar.h).
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
 * A mask walks the vocabulary's bytes as a trie stored in preorder (each
 * node its depth and the end of its subtree), one pass over an array that
 * skips the subtrees no stack accepts. The index (gram_index) keeps that
 * walk's result per position's top part, so that a step walks only the
 * tokens that reach below it.
 */
#include "config.h"
#include "grammar.h"
#include "grammar_int.h"
#include "util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- positions ---- */

struct gframe {
	const struct gelem *pos; /* a stack's top: GE_CHAR; below: where its rule goes on */
	struct gframe *up;       /* NULL: the root's bottom */
	uint32_t depth;
};

#define POOL_CHUNK 1024
struct fchunk {
	struct fchunk *next;
	struct gframe f[POOL_CHUNK];
};

/* Interned frames: one frame per (pos, up), in chunks, found by a hash. */
struct fpool {
	struct gframe **tab;
	size_t cap, n, used; /* used: frames taken in the first chunk */
	struct fchunk *chunks;
};

/* A position: the tops of its stacks (NULL: the root complete) and a character half read. */
struct gpos {
	struct gframe **st;
	uint32_t n, cap;
	uint8_t part[4];
	uint8_t pn, need;
};

/* What expanding needs: the grammar, where new frames go, frames looked up first, dedup of a set. */
struct gctx {
	const struct grammar *g;
	struct fpool *pool;
	const struct fpool *base;
	const void **seen;
	uint32_t seen_cap, seen_n;
	int level, overflow;
};

/* The deepest chain of references expanded without a character between them. */
#define GRAM_MAX_EXPAND 8192

struct gram_state {
	const struct grammar *g;
	struct fpool pool;
	struct gpos at;
	size_t kept; /* frames after the last compaction */
};

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

static struct gframe *
intern(struct gctx *c, const struct gelem *pos, struct gframe *up)
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
	if (p->chunks == NULL || p->used == POOL_CHUNK) {
		struct fchunk *ch = xmalloc(sizeof *ch);

		ch->next = p->chunks, p->chunks = ch, p->used = 0;
	}
	f = &p->chunks->f[p->used++];
	*f = (struct gframe){ pos, up, up != NULL ? up->depth + 1 : 1 };
	pool_put(p, f);
	p->n++;
	return f;
}

static void
pool_free(struct fpool *p)
{
	while (p->chunks != NULL) {
		struct fchunk *next = p->chunks->next;

		free(p->chunks);
		p->chunks = next;
	}
	free(p->tab);
	memset(p, 0, sizeof *p);
}

/* 1 the first time top is added to the set being built (c->seen, reset per set). */
static int
seen_first(struct gctx *c, const void *top)
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
				seen_first(c, old[k]);
		free(old);
	}
	for (i = frame_hash(NULL, top) & (c->seen_cap - 1); c->seen[i] != NULL; i = (i + 1) & (c->seen_cap - 1))
		if (c->seen[i] == top)
			return 0;
	c->seen[i] = top;
	c->seen_n++;
	return 1;
}

static void
seen_reset(struct gctx *c)
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
static struct gframe ctx_frame;

/* The address standing for the empty stack in c->seen (NULL marks free slots). */
static const char empty_stack;

static void
add_top(struct gctx *c, struct gpos *out, struct gframe *top)
{
	if (!seen_first(c, top != NULL ? (const void *)top : &empty_stack))
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
 */
static void
expand(struct gctx *c, const struct gelem *pos, struct gframe *up, struct gpos *out)
{
	if (++c->level > GRAM_MAX_EXPAND) {
		c->overflow = 1;
	} else if (pos->kind == GE_CHAR) {
		add_top(c, out, intern(c, pos, up));
	} else if (pos->kind != GE_RULE) { /* the end of an alternative: back to the rule below */
		if (up == NULL || up == &ctx_frame)
			add_top(c, out, up);
		else
			expand(c, up->pos, up->up, out);
	} else {
		const struct grule *r = &c->g->rules[pos->arg];
		struct gframe *cont = up;

		if (pos[1].kind == GE_RULE || pos[1].kind == GE_CHAR) { /* else a tail call: nothing to come back to */
			if (up != NULL && up->depth >= GRAM_MAX_DEPTH) {
				c->level--;
				return; /* nesting past the limit: no text goes there */
			}
			cont = intern(c, pos + 1, up);
		}
		for (uint32_t a = 0; a < r->n_alt && !c->overflow; a++)
			expand(c, &c->g->elems[c->g->alts[r->alt_first + a]], cont, out);
	}
	c->level--;
}

static int
set_has(const struct grammar *g, uint32_t set, uint32_t cp)
{
	const struct gset *s = &g->sets[set];

	for (uint32_t i = 0; i < s->n; i++)
		if (cp >= g->ranges[s->first + i].lo && cp <= g->ranges[s->first + i].hi)
			return !s->neg;
	return s->neg;
}

/* 1 if set may hold some code point of [lo, hi] (for a character half read). */
static int
set_meets(const struct grammar *g, uint32_t set, uint32_t lo, uint32_t hi)
{
	const struct gset *s = &g->sets[set];

	for (uint32_t i = 0; i < s->n; i++) {
		const struct grange *r = &g->ranges[s->first + i];

		if (s->neg && r->lo <= lo && r->hi >= hi)
			return 0;
		if (!s->neg && r->lo <= hi && r->hi >= lo)
			return 1;
	}
	return s->neg;
}

/* out: the stacks of in that take code point cp, moved past it. */
static void
advance(struct gctx *c, const struct gpos *in, uint32_t cp, struct gpos *out)
{
	out->n = 0, out->pn = 0;
	seen_reset(c);
	for (uint32_t i = 0; i < in->n && !c->overflow; i++) {
		const struct gframe *f = in->st[i];

		if (f != NULL && f != &ctx_frame && set_has(c->g, f->pos->arg, cp))
			expand(c, f->pos + 1, f->up, out);
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
static void
pos_copy(const struct gpos *in, struct gpos *out)
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
 * 1 if some stack of p may take the character p holds half read: one of
 * the code points its bytes so far can still become (no overlong forms,
 * no surrogates, nothing past U+10FFFF: u8_follows holds the later bytes
 * to that, the bounds here the first's).
 */
static int
half_viable(const struct grammar *g, const struct gpos *p)
{
	static const uint32_t least[5] = { 0, 0, 0x80, 0x800, 0x10000 };
	uint32_t lo = u8_decode(p->part, p->pn, p->need, 0x80), hi = u8_decode(p->part, p->pn, p->need, 0xbf);

	lo = MAX(lo, least[p->need]), hi = MIN(hi, 0x10ffffu);
	if (p->pn == 1 && p->part[0] == 0xed)
		hi = MIN(hi, 0xd7ffu);

	for (uint32_t i = 0; i < p->n; i++)
		if (p->st[i] != NULL && p->st[i] != &ctx_frame && set_meets(g, p->st[i]->pos->arg, lo, hi))
			return 1;
	return 0;
}

/* out: in after byte b. Returns 1, or 0 when no stack survives it. */
static int
feed(struct gctx *c, const struct gpos *in, uint8_t b, struct gpos *out)
{
	if (in->pn == 0) {
		int need = u8_need(b);

		if (need == 1) {
			advance(c, in, b, out);
			return out->n > 0;
		}
		if (need == 0)
			return 0;
		pos_copy(in, out);
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
	pos_copy(in, out);
	out->part[out->pn++] = b;
	return half_viable(c->g, out);
}

static int
overflow_err(char *err)
{
	return err_set(err, ERR_RANGE, "grammar: more than %d positions at once, or references nested past %d "
	    "(an ambiguous or degenerate grammar)", GRAM_MAX_STACKS, GRAM_MAX_EXPAND);
}

/* A copy of frame f's chain interned into c's pool. */
static struct gframe *
frame_copy(struct gctx *c, const struct gframe *f)
{
	return f == NULL ? NULL : intern(c, f->pos, frame_copy(c, f->up));
}

/* s's frames kept to those its stacks use (frames of text long past are dropped). */
static void
compact(struct gram_state *s)
{
	struct fpool fresh = { 0 };
	struct gctx c = { s->g, &fresh, NULL, NULL, 0, 0, 0, 0 };

	for (uint32_t i = 0; i < s->at.n; i++)
		s->at.st[i] = frame_copy(&c, s->at.st[i]);
	pool_free(&s->pool);
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
		expand(&c, &g->elems[g->alts[r->alt_first + a]], NULL, &s->at);
	free(c.seen);
	if (c.overflow) {
		gram_state_free(s);
		*out = NULL;
		return overflow_err(err);
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
	pos_copy(&s->at, &t->at);
	compact(t); /* its own frames: copies of s's */
	*out = t;
	return 0;
}

void
gram_state_free(struct gram_state *s)
{
	if (s == NULL)
		return;
	pool_free(&s->pool);
	free(s->at.st);
	free(s);
}

int
gram_accept(struct gram_state *s, const char *bytes, size_t n, char *err)
{
	struct gpos p[2] = { { 0 }, { 0 } };
	struct gctx c = { s->g, &s->pool, NULL, NULL, 0, 0, 0, 0 };
	int cur = 0, ok = 1;

	pos_copy(&s->at, &p[0]);
	for (size_t i = 0; i < n && ok; i++, cur ^= 1)
		ok = feed(&c, &p[cur], (uint8_t)bytes[i], &p[cur ^ 1]) && !c.overflow;
	free(c.seen);
	if (!ok) {
		free(p[0].st), free(p[1].st);
		return c.overflow ? overflow_err(err) :
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

/* ---- the vocabulary ---- */

/* A trie node, in preorder: its byte, depth (1 below the root) and the end of its subtree. */
struct tnode {
	uint32_t end;
	uint32_t tok_first, tok_n; /* the tokens whose bytes end here, in trie.tok */
	uint32_t depth;
	uint8_t byte;
};

/* Token ids by their bytes, as a trie in preorder. */
struct trie {
	struct tnode *node;
	uint32_t n_node, max_depth;
	int32_t *tok;
};

struct gram_vocab {
	int n_tokens;
	const uint8_t **bytes; /* each token's bytes and length, as given (the caller keeps them) */
	const uint32_t *len;
	struct trie all;
	int32_t *ends;
	int n_ends;
};

struct vtok {
	const uint8_t *b;
	uint32_t len;
	int32_t id;
};

static int
vtok_cmp(const void *pa, const void *pb)
{
	const struct vtok *a = pa, *b = pb;
	int c = memcmp(a->b, b->b, MIN(a->len, b->len));

	if (c != 0)
		return c;
	return a->len != b->len ? (a->len < b->len ? -1 : 1) : (a->id < b->id ? -1 : a->id > b->id);
}

/* The trie of t[0 .. n), sorted by vtok_cmp, into tr. */
static void
trie_build(struct trie *tr, const struct vtok *t, int n)
{
	uint32_t *path, depth = 0, cap = 0;
	const struct vtok *prev = NULL;

	memset(tr, 0, sizeof *tr);
	for (int i = 0; i < n; i++)
		tr->max_depth = MAX(tr->max_depth, t[i].len);
	path = xmalloc(((size_t)tr->max_depth + 1) * sizeof *path);
	tr->tok = xmalloc(((size_t)n + 1) * sizeof *tr->tok);
	for (int i = 0; i < n; i++) {
		uint32_t common = 0;

		while (prev != NULL && common < depth && common < t[i].len && prev->b[common] == t[i].b[common])
			common++;
		while (depth > common) /* close the subtrees the new token leaves */
			tr->node[path[depth--]].end = tr->n_node;
		for (; depth < t[i].len; depth++) {
			tr->node = xgrow(tr->node, &cap, tr->n_node + 1, sizeof *tr->node);
			tr->node[tr->n_node] = (struct tnode){ 0, 0, 0, depth + 1, t[i].b[depth] };
			path[depth + 1] = tr->n_node++;
		}
		if (tr->node[path[depth]].tok_n == 0)
			tr->node[path[depth]].tok_first = (uint32_t)i;
		tr->node[path[depth]].tok_n++;
		tr->tok[i] = t[i].id;
		prev = &t[i];
	}
	while (depth > 0)
		tr->node[path[depth--]].end = tr->n_node;
	free(path);
}

static void
trie_free(struct trie *tr)
{
	free(tr->node), free(tr->tok);
	memset(tr, 0, sizeof *tr);
}

int
gram_vocab_new(int n_tokens, const char *const *bytes, const uint32_t *len, const uint8_t *skip,
    const uint8_t *end, struct gram_vocab **out, char *err)
{
	struct gram_vocab *v;
	struct vtok *t;
	int n = 0;

	if (n_tokens <= 0)
		return err_set(err, ERR_INVAL, "grammar: a vocabulary of %d tokens", n_tokens);
	v = xcalloc(1, sizeof *v);
	t = xmalloc((size_t)n_tokens * sizeof *t);
	v->n_tokens = n_tokens, v->bytes = (const uint8_t **)bytes, v->len = len;
	v->ends = xmalloc((size_t)n_tokens * sizeof *v->ends);
	for (int i = 0; i < n_tokens; i++) {
		if (end != NULL && end[i])
			v->ends[v->n_ends++] = i;
		if (len[i] > 0 && !(skip != NULL && skip[i]) && !(end != NULL && end[i]))
			t[n++] = (struct vtok){ (const uint8_t *)bytes[i], len[i], i };
	}
	qsort(t, (size_t)n, sizeof *t, vtok_cmp);
	trie_build(&v->all, t, n);
	free(t);
	*out = v;
	return 0;
}

void
gram_vocab_free(struct gram_vocab *v)
{
	if (v == NULL)
		return;
	trie_free(&v->all);
	free(v->ends);
	free(v);
}

int
gram_vocab_size(const struct gram_vocab *v)
{
	return v->n_tokens;
}

/* ---- masks ---- */

/* Levels of a walk: the position after each depth's byte. */
struct levels {
	struct gpos *lv;
	uint8_t *hit; /* cache builds: a stack reached the context at or above this depth */
	uint32_t n;
};

static void
levels_init(struct levels *l, uint32_t max_depth)
{
	l->n = max_depth + 1;
	l->lv = xcalloc(l->n, sizeof *l->lv);
	l->hit = xcalloc(l->n, 1);
}

static void
levels_free(struct levels *l)
{
	for (uint32_t d = 0; d < l->n; d++)
		free(l->lv[d].st);
	free(l->lv), free(l->hit);
}

static void
set_bits(uint32_t *mask, const struct trie *tr, const struct tnode *nd)
{
	for (uint32_t k = 0; k < nd->tok_n; k++) {
		int32_t id = tr->tok[nd->tok_first + k];

		mask[id / 32] |= 1u << (id % 32);
	}
}

/* Sets in mask the tokens of tr that the position `from` takes whole; l: levels for tr's depth, reused. */
static void
walk(struct gctx *c, struct levels *l, const struct gpos *from, const struct trie *tr, uint32_t *mask)
{
	pos_copy(from, &l->lv[0]);
	for (uint32_t i = 0; i < tr->n_node && !c->overflow;) {
		const struct tnode *nd = &tr->node[i];

		if (!feed(c, &l->lv[nd->depth - 1], nd->byte, &l->lv[nd->depth])) {
			i = nd->end;
			continue;
		}
		set_bits(mask, tr, nd);
		i++;
	}
}

/*
 * What a stack's top part allows whatever lies below it: the key is the
 * positions of its frames from the top down to the first one in a cut
 * rule (the root, or a named rule that can reach itself: value, object,
 * array; the others, which nest only so deep, are part of the key) and
 * the bytes of a character half read, the context what lies below. acc: the tokens the key takes whole
 * without reaching the context (or reaching it exactly at their end);
 * unc: those that reach it with bytes left, checked against the real
 * stack at run time. maxrel: the deepest nesting the key's walks made.
 */
struct gkey {
	const struct gelem *pos[GRAM_MAX_NEST + 2];
	uint32_t n;
	uint8_t part[4], pn, need; /* a character half read at the position (pn 0: none) */
};

struct gentry {
	struct gkey key;
	uint64_t hash;
	uint32_t *acc;       /* a bitmask over the vocabulary */
	struct trie unc;
	uint32_t maxrel;
	int walk_all;        /* positions overflowed while building: walk every token at run time */
	struct gentry *next;
};

struct gram_index {
	const struct grammar *g;
	const struct gram_vocab *v;
	uint8_t *cut;        /* per element: it belongs to a cut rule (a key ends at its frame) */
	struct gentry **tab;
	uint32_t cap, n;
	pthread_mutex_t mu;
};

/* k: the key of the stack whose top is f at position p (its half-read character); *base the frame below it. */
static void
key_of(const struct gram_index *x, const struct gframe *f, const struct gpos *p, struct gkey *k,
    const struct gframe **base)
{
	memset(k, 0, sizeof *k);
	for (; f != NULL && f != &ctx_frame; f = f->up) {
		k->pos[k->n++] = f->pos;
		if (x->cut[f->pos - x->g->elems] || k->n == GRAM_MAX_NEST + 2) {
			f = f->up;
			break;
		}
	}
	*base = f;
	memcpy(k->part, p->part, p->pn);
	k->pn = p->pn, k->need = p->need;
}

static uint64_t
key_hash(const struct gkey *k)
{
	uint64_t h = 1469598103934665603ull;

	for (uint32_t i = 0; i < k->n; i++)
		h = (h ^ (uint64_t)(uintptr_t)k->pos[i]) * 1099511628211ull;
	for (uint32_t i = 0; i < k->pn; i++)
		h = (h ^ k->part[i]) * 1099511628211ull;
	return h ^ h >> 31;
}

static int
key_equal(const struct gkey *a, const struct gkey *b)
{
	return a->n == b->n && a->pn == b->pn && memcmp(a->pos, b->pos, a->n * sizeof *a->pos) == 0 &&
	    memcmp(a->part, b->part, a->pn) == 0;
}

/* The walk of a cache build, over every token from the key's stack: acc and the uncertain tokens' ids. */
static void
build_walk(struct gctx *c, const struct trie *tr, const struct gpos *from, uint32_t *acc, struct vtok *unc, int *n_unc,
    const struct gram_vocab *v)
{
	struct levels l;

	levels_init(&l, tr->max_depth);
	pos_copy(from, &l.lv[0]);
	for (uint32_t i = 0; i < tr->n_node && !c->overflow;) {
		const struct tnode *nd = &tr->node[i];
		const struct gpos *up = &l.lv[nd->depth - 1];
		int hit = l.hit[nd->depth - 1], alive;

		for (uint32_t k = 0; k < up->n && !hit; k++)
			hit = up->st[k] == &ctx_frame;
		alive = feed(c, up, nd->byte, &l.lv[nd->depth]);
		l.hit[nd->depth] = (uint8_t)hit;
		if (alive) {
			set_bits(acc, tr, nd);
			i++;
			continue;
		}
		for (uint32_t j = hit ? i : nd->end; j < nd->end; j++) /* a dead subtree: uncertain where it met the context */
			for (uint32_t k = 0; k < tr->node[j].tok_n; k++) {
				int32_t id = tr->tok[tr->node[j].tok_first + k];

				unc[(*n_unc)++] = (struct vtok){ v->bytes[id], v->len[id], id };
			}
		i = nd->end;
	}
	levels_free(&l);
}

static struct gentry *
entry_build(struct gram_index *x, const struct gkey *k, uint64_t hash)
{
	struct gentry *e = xcalloc(1, sizeof *e);
	struct fpool scratch = { 0 };
	struct gctx c = { x->g, &scratch, NULL, NULL, 0, 0, 0, 0 };
	struct gpos from = { 0 };
	struct gframe *top = &ctx_frame;
	struct vtok *unc = xmalloc(((size_t)x->v->n_tokens + 1) * sizeof *unc);
	int n_unc = 0;

	e->key = *k, e->hash = hash;
	e->acc = xcalloc(((size_t)x->v->n_tokens + 31) / 32, sizeof *e->acc);
	for (uint32_t i = k->n; i-- > 0;)
		top = intern(&c, k->pos[i], top);
	from.st = xmalloc(sizeof *from.st), from.st[0] = top, from.n = from.cap = 1;
	memcpy(from.part, k->part, k->pn);
	from.pn = k->pn, from.need = k->need;
	build_walk(&c, &x->v->all, &from, e->acc, unc, &n_unc, x->v);
	e->walk_all = c.overflow;
	trie_build(&e->unc, unc, n_unc); /* the walk met them in the trie's order: sorted */
	for (struct fchunk *ch = scratch.chunks; ch != NULL; ch = ch->next)
		for (uint32_t j = 0; j < (ch == scratch.chunks ? scratch.used : POOL_CHUNK); j++)
			e->maxrel = MAX(e->maxrel, ch->f[j].depth);
	free(unc), free(from.st), free(c.seen);
	pool_free(&scratch);
	return e;
}

/* The entry of key k, built on first use. Under x->mu. */
static struct gentry *
entry_get(struct gram_index *x, const struct gkey *k)
{
	uint64_t h = key_hash(k);
	struct gentry *e;

	if (x->cap > 0)
		for (e = x->tab[h & (x->cap - 1)]; e != NULL; e = e->next)
			if (e->hash == h && key_equal(&e->key, k))
				return e;
	if (2 * (x->n + 1) > x->cap) {
		uint32_t cap = x->cap ? 2 * x->cap : 64;
		struct gentry **t = xcalloc(cap, sizeof *t);

		for (uint32_t i = 0; i < x->cap; i++)
			while (x->tab[i] != NULL) {
				e = x->tab[i], x->tab[i] = e->next;
				e->next = t[e->hash & (cap - 1)], t[e->hash & (cap - 1)] = e;
			}
		free(x->tab);
		x->tab = t, x->cap = cap;
	}
	e = entry_build(x, k, h);
	e->next = x->tab[h & (x->cap - 1)], x->tab[h & (x->cap - 1)] = e;
	x->n++;
	return e;
}

/* Each top of p (but the context) whose key has no entry yet: its entry, and the key queued. */
static void
enqueue_keys(struct gram_index *x, const struct gpos *p, struct gentry ***queue, uint32_t *n, uint32_t *cap)
{
	const struct gframe *base;
	struct gkey k;

	for (uint32_t i = 0; i < p->n; i++) {
		uint32_t before = x->n;
		struct gentry *e;

		if (p->st[i] == NULL || p->st[i] == &ctx_frame)
			continue;
		key_of(x, p->st[i], p, &k, &base);
		e = entry_get(x, &k);
		if (x->n > before) {
			*queue = xgrow(*queue, cap, *n + 1, sizeof **queue);
			(*queue)[(*n)++] = e;
		}
	}
}

/*
 * Every key the grammar's positions can have, each entry built now (on the
 * thread that compiles, not in a step): from each cut rule's start,
 * then from each key past its character, until no new key appears.
 */
static int
index_fill(struct gram_index *x, char *err)
{
	struct fpool pool = { 0 };
	struct gctx c = { x->g, &pool, NULL, NULL, 0, 0, 0, 0 };
	struct gentry **queue = NULL;
	struct gpos p = { 0 };
	uint32_t n = 0, cap = 0;

	for (uint32_t r = 0; r < x->g->n_rules && !c.overflow; r++) {
		if (!x->cut[x->g->rules[r].first])
			continue;
		p.n = 0;
		seen_reset(&c);
		for (uint32_t a = 0; a < x->g->rules[r].n_alt && !c.overflow; a++)
			expand(&c, &x->g->elems[x->g->alts[x->g->rules[r].alt_first + a]], &ctx_frame, &p);
		enqueue_keys(x, &p, &queue, &n, &cap);
	}
	for (uint32_t q = 0; q < n && !c.overflow; q++) {
		struct gframe *top = &ctx_frame;

		for (uint32_t i = queue[q]->key.n; i-- > 0;)
			top = intern(&c, queue[q]->key.pos[i], top);
		p.n = 0;
		seen_reset(&c);
		expand(&c, top->pos + 1, top->up, &p);
		enqueue_keys(x, &p, &queue, &n, &cap);
	}
	free(queue), free(p.st), free(c.seen);
	pool_free(&pool);
	return c.overflow ? overflow_err(err) : 0;
}

/* Runs body with s each rule that an element of rule r references, in order. */
#define EACH_REF(g, r, s, body) \
	for (const struct gelem *e_ = &(g)->elems[(g)->rules[r].first];; e_++) { \
		if (e_->kind == GE_RULE) { \
			uint32_t s = e_->arg; \
			body; \
		} \
		if (e_->kind == GE_END) \
			break; \
	}

/*
 * Per element, 1 if its rule is cut (gram_index's keys end at its
 * frames): the root, and the named rules in a cycle of references,
 * found as strongly connected components (Kosaraju, iteratively: the
 * reversed graph's components in the order the first pass finished).
 */
static uint8_t *
cut_rules(const struct grammar *g)
{
	uint32_t R = g->n_rules, *order = xmalloc(((size_t)R + 1) * sizeof *order), n_order = 0;
	uint32_t *rfirst = xcalloc((size_t)R + 2, sizeof *rfirst), *redge, *comp = xmalloc(((size_t)R + 1) * sizeof *comp);
	uint32_t *stack = xmalloc(((size_t)R + 1) * sizeof *stack), *size = xcalloc((size_t)R + 1, sizeof *size);
	uint8_t *seen = xcalloc((size_t)R + 1, 1), *self = xcalloc((size_t)R + 1, 1), *cut = xcalloc((size_t)g->n_elems + 1, 1);
	const struct gelem **at = xmalloc(((size_t)R + 1) * sizeof *at);

	for (uint32_t r = 0; r < R; r++) /* the reversed edges, counted then placed */
		EACH_REF(g, r, s, rfirst[s + 2]++; self[r] |= s == r)
	for (uint32_t r = 0; r < R; r++)
		rfirst[r + 2] += rfirst[r + 1];
	redge = xmalloc(((size_t)rfirst[R + 1] + 1) * sizeof *redge);
	for (uint32_t r = 0; r < R; r++)
		EACH_REF(g, r, s, redge[rfirst[s + 1]++] = r)
	for (uint32_t r0 = 0; r0 < R; r0++) { /* finishing order over the references */
		uint32_t n = 0;

		if (seen[r0])
			continue;
		seen[r0] = 1, stack[n] = r0, at[n++] = &g->elems[g->rules[r0].first];
		while (n > 0) {
			const struct gelem *e = at[n - 1];

			if (e->kind == GE_END) {
				order[n_order++] = stack[--n];
				continue;
			}
			at[n - 1] = e + 1;
			if (e->kind == GE_RULE && !seen[e->arg])
				seen[e->arg] = 1, stack[n] = e->arg, at[n++] = &g->elems[g->rules[e->arg].first];
		}
	}
	memset(seen, 0, R);
	for (uint32_t i = R; i-- > 0;) { /* components over the reversed edges */
		uint32_t n = 0, c = order[i];

		if (seen[c])
			continue;
		seen[c] = 1, stack[n++] = c;
		while (n > 0) {
			uint32_t r = stack[--n];

			comp[r] = c, size[c]++;
			for (uint32_t k = rfirst[r]; k < rfirst[r + 1]; k++)
				if (!seen[redge[k]])
					seen[redge[k]] = 1, stack[n++] = redge[k];
		}
	}
	for (uint32_t r = 0; r < R; r++)
		if (r == g->root || (g->rules[r].named && (size[comp[r]] > 1 || self[r])))
			for (const struct gelem *e = &g->elems[g->rules[r].first];; e++) {
				cut[e - g->elems] = 1;
				if (e->kind == GE_END)
					break;
			}
	free(order), free(rfirst), free(redge), free(comp), free(stack), free(size), free(seen), free(self), free(at);
	return cut;
}

int
gram_index_new(const struct grammar *g, const struct gram_vocab *v, struct gram_index **out, char *err)
{
	struct gram_index *x = xcalloc(1, sizeof *x);
	int rc;

	x->g = g, x->v = v;
	x->cut = cut_rules(g);
	pthread_mutex_init(&x->mu, NULL);
	if ((rc = index_fill(x, err)) != 0) {
		gram_index_free(x);
		*out = NULL;
		return rc;
	}
	*out = x;
	return 0;
}

void
gram_index_free(struct gram_index *x)
{
	if (x == NULL)
		return;
	for (uint32_t i = 0; i < x->cap; i++)
		while (x->tab[i] != NULL) {
			struct gentry *e = x->tab[i];

			x->tab[i] = e->next;
			trie_free(&e->unc);
			free(e->acc), free(e);
		}
	pthread_mutex_destroy(&x->mu);
	free(x->tab), free(x->cut);
	free(x);
}

/* The tokens stack f allows into mask: its entry's, then its uncertain ones checked from f itself. */
static void
mask_stack(struct gram_index *x, struct gctx *c, struct levels *l, const struct gpos *at, struct gframe *f,
    uint32_t *mask)
{
	uint32_t words = ((uint32_t)x->v->n_tokens + 31) / 32;
	struct gpos one = { &f, 1, 1, { 0 }, at->pn, at->need };
	const struct gframe *base;
	struct gentry *e;
	struct gkey k;

	memcpy(one.part, at->part, sizeof one.part);
	key_of(x, f, at, &k, &base);
	pthread_mutex_lock(&x->mu);
	e = entry_get(x, &k);
	pthread_mutex_unlock(&x->mu);
	if (e->walk_all || (base != NULL ? base->depth : 0) + e->maxrel > GRAM_MAX_DEPTH) {
		walk(c, l, &one, &x->v->all, mask);
		return;
	}
	for (uint32_t w = 0; w < words; w++)
		mask[w] |= e->acc[w];
	walk(c, l, &one, &e->unc, mask);
}

int
gram_mask(const struct gram_state *s, struct gram_index *x, uint32_t *mask, char *err)
{
	const struct gram_vocab *v = x->v;
	uint32_t words = ((uint32_t)v->n_tokens + 31) / 32;
	struct fpool scratch = { 0 };
	struct gctx c = { s->g, &scratch, &s->pool, NULL, 0, 0, 0, 0 };
	struct levels l;
	int count = 0;

	levels_init(&l, v->all.max_depth); /* the deepest: every trie here holds some of its tokens */
	memset(mask, 0, words * sizeof *mask);
	for (uint32_t i = 0; i < s->at.n && !c.overflow; i++)
		if (s->at.st[i] != NULL)
			mask_stack(x, &c, &l, &s->at, s->at.st[i], mask);
	levels_free(&l);
	if (!c.overflow && gram_complete(s))
		for (int k = 0; k < v->n_ends; k++)
			mask[v->ends[k] / 32] |= 1u << (v->ends[k] % 32);
	for (uint32_t w = 0; w < words; w++)
		count += __builtin_popcount(mask[w]);
	free(c.seen);
	pool_free(&scratch);
	return c.overflow ? overflow_err(err) : count;
}
