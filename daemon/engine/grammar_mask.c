/*
 * grammar_mask.c: the tokens that may come next (grammar.h's gram_vocab,
 * gram_index and gram_mask), over the positions grammar_state.c keeps.
 *
 * A mask walks the vocabulary's bytes as a trie stored in preorder (each
 * node its depth and the end of its subtree), one pass over an array that
 * skips the subtrees no stack accepts, feeding each byte to the matcher
 * (gram_feed, grammar_int.h). The index (gram_index) keeps that walk's
 * result per position's top part, so that a step walks only the tokens
 * that reach below it. The index is made whole when it is created
 * (index_fill: every key a position can have, a character half read
 * keyed by its class, found on one thread, then the keys' walks of the
 * vocabulary shared among threads); masks then read it without a lock,
 * and keep their scratch in it between calls.
 */
#include "config.h"
#include "grammar.h"
#include "grammar_int.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The 32-bit words of a mask over v. */
static uint32_t
mask_words(const struct gram_vocab *v)
{
	return ((uint32_t)v->n_tokens + 31) / 32;
}

/* ---- masks ---- */

/* Levels of a walk: the position after each depth's byte. */
struct levels {
	struct gpos *lv;
	uint8_t *hit; /* entry builds: a stack reached the context at or above this depth */
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
	gram_pos_copy(from, &l->lv[0]);
	for (uint32_t i = 0; i < tr->n_node && !c->overflow;) {
		const struct tnode *nd = &tr->node[i];

		if (!gram_feed(c, &l->lv[nd->depth - 1], nd->byte, &l->lv[nd->depth])) {
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
 * the bytes of a character half read, the context what lies below. acc:
 * the tokens the key takes whole without reaching the context (or
 * reaching it exactly at their end); unc: those that reach it with bytes
 * left, checked against the real stack at run time. maxrel: the deepest
 * nesting the key's walks made.
 *
 * A character half read whose every possible code point (gram_part_range) is
 * in the top's set is keyed by its class (uni): its length, the bytes
 * read, and its first byte only where that bounds the next (E0 ED F0 F4).
 * Every character of a class takes the same continuation bytes and then
 * goes on past the top alike, so one entry serves the class: at most ten
 * a key. One whose span the set splits keys its own bytes: a span that
 * holds the first code point of one of the set's ranges or the one past
 * its end, at most three a boundary. One whose span the set misses takes
 * nothing (no entry).
 */
struct gkey {
	const struct gelem *pos[GRAM_MAX_NEST + 2];
	uint32_t n;
	uint8_t part[4], pn, need; /* a character half read at the position (pn 0: none) */
	uint8_t uni;               /* part stands for its class (above) */
};

/* An entry's acc as a bitmask over the vocabulary; otherwise n_acc pairs (word, bits). */
#define ACC_DENSE UINT32_MAX

struct gentry {
	struct gkey key;
	uint64_t hash;
	uint32_t *acc;
	uint32_t n_acc;      /* ACC_DENSE, or the pairs in acc */
	struct trie unc;
	uint32_t maxrel;
	int walk_all;        /* positions overflowed while building: walk every token at run time */
	struct gentry *next;
};

/* Entries by key. */
struct etab {
	struct gentry **tab;
	uint32_t cap, n;
};

/* A mask's scratch, kept between masks (in gram_index's spare slots): frames, walk levels, a set's table. */
struct mscratch {
	struct fpool pool;
	struct levels l;
	const void **seen;
	uint32_t seen_cap;
};

#define SCRATCH_SLOTS 8

struct gram_index {
	const struct grammar *g;
	const struct gram_vocab *v;
	uint8_t *cut;        /* per element: it belongs to a cut rule (a key ends at its frame) */
	struct etab all;     /* every key's entry, made by gram_index_new: read without a lock */
	struct etab late;    /* keys the enumeration did not find (none known), built on first use, under mu */
	pthread_mutex_t mu;
	_Atomic(struct mscratch *) spare[SCRATCH_SLOTS]; /* scratch no mask is using */
};

/* k: the key of the stack whose top is f at position p (its half-read character); *base the frame below it. */
static void
key_of(const struct gram_index *x, const struct gframe *f, const struct gpos *p, struct gkey *k,
    const struct gframe **base)
{
	memset(k, 0, sizeof *k);
	for (; f != NULL && f != &gram_ctx_frame; f = f->up) {
		k->pos[k->n++] = f->pos;
		if (x->cut[f->pos - x->g->elems] || k->n == GRAM_MAX_NEST + 2) {
			f = f->up;
			break;
		}
	}
	*base = f;
	memcpy(k->part, p->part, p->pn);
	k->pn = p->pn, k->need = p->pn > 0 ? p->need : 0; /* need is stale once pn is back to 0 */
}

/* How a character half read (pn of need bytes in part) meets set: 0 none of its span, 1 all of it, 2 some. */
static int
half_class(const struct grammar *g, uint32_t set, const uint8_t *part, int pn, int need)
{
	uint32_t lo, hi;

	gram_part_range(part, pn, need, &lo, &hi);
	if (!gram_set_meets(g, set, lo, hi))
		return 0;
	return gram_set_covers(g, set, lo, hi) ? 1 : 2;
}

/* k's half-read character made its class's (half_class 1). */
static void
key_uni(struct gkey *k)
{
	uint8_t lead = k->part[0];

	memset(k->part, 0, sizeof k->part);
	if (k->pn == 1 && (lead == 0xe0 || lead == 0xed || lead == 0xf0 || lead == 0xf4))
		k->part[0] = lead;
	k->uni = 1;
}

static uint64_t
key_hash(const struct gkey *k)
{
	uint64_t h = 1469598103934665603ull;

	for (uint32_t i = 0; i < k->n; i++)
		h = (h ^ (uint64_t)(uintptr_t)k->pos[i]) * 1099511628211ull;
	h = (h ^ ((uint64_t)k->pn << 8 | (uint64_t)k->need << 16 | (uint64_t)k->uni << 24)) * 1099511628211ull;
	for (uint32_t i = 0; i < k->pn; i++)
		h = (h ^ k->part[i]) * 1099511628211ull;
	return h ^ h >> 31;
}

static int
key_equal(const struct gkey *a, const struct gkey *b)
{
	return a->n == b->n && a->pn == b->pn && a->need == b->need && a->uni == b->uni &&
	    memcmp(a->pos, b->pos, a->n * sizeof *a->pos) == 0 && memcmp(a->part, b->part, sizeof a->part) == 0;
}

static struct gentry *
etab_find(const struct etab *t, const struct gkey *k, uint64_t h)
{
	if (t->cap == 0)
		return NULL;
	for (struct gentry *e = t->tab[h & (t->cap - 1)]; e != NULL; e = e->next)
		if (e->hash == h && key_equal(&e->key, k))
			return e;
	return NULL;
}

static void
etab_add(struct etab *t, struct gentry *e)
{
	if (2 * (t->n + 1) > t->cap) {
		uint32_t cap = t->cap ? 2 * t->cap : 64;
		struct gentry **tab = xcalloc(cap, sizeof *tab);

		for (uint32_t i = 0; i < t->cap; i++)
			while (t->tab[i] != NULL) {
				struct gentry *m = t->tab[i];

				t->tab[i] = m->next;
				m->next = tab[m->hash & (cap - 1)], tab[m->hash & (cap - 1)] = m;
			}
		free(t->tab);
		t->tab = tab, t->cap = cap;
	}
	e->next = t->tab[e->hash & (t->cap - 1)], t->tab[e->hash & (t->cap - 1)] = e;
	t->n++;
}

static void
etab_free(struct etab *t)
{
	for (uint32_t i = 0; i < t->cap; i++)
		while (t->tab[i] != NULL) {
			struct gentry *e = t->tab[i];

			t->tab[i] = e->next;
			trie_free(&e->unc);
			free(e->acc), free(e);
		}
	free(t->tab);
	memset(t, 0, sizeof *t);
}

/* An entry build's scratch, for the index's vocabulary: walk levels, frames, a bitmask, the uncertain tokens. */
struct bscratch {
	struct levels l;
	struct fpool pool;
	const void **seen;
	uint32_t seen_cap;
	uint32_t *acc;
	struct vtok *unc;
};

static void
bscratch_init(struct bscratch *bs, const struct gram_vocab *v)
{
	memset(bs, 0, sizeof *bs);
	levels_init(&bs->l, v->all.max_depth);
	bs->acc = xmalloc((size_t)mask_words(v) * sizeof *bs->acc);
	bs->unc = xmalloc(((size_t)v->n_tokens + 1) * sizeof *bs->unc);
}

static void
bscratch_free(struct bscratch *bs)
{
	levels_free(&bs->l);
	gram_pool_free(&bs->pool);
	free(bs->seen), free(bs->acc), free(bs->unc);
}

/* The walk of an entry's build, over every token from the key's stack: acc and the uncertain tokens' ids. */
static void
build_walk(struct gctx *c, const struct trie *tr, const struct gpos *from, struct bscratch *bs, int *n_unc,
    const struct gram_vocab *v)
{
	struct levels *l = &bs->l;

	gram_pos_copy(from, &l->lv[0]);
	for (uint32_t i = 0; i < tr->n_node && !c->overflow;) {
		const struct tnode *nd = &tr->node[i];
		const struct gpos *up = &l->lv[nd->depth - 1];
		int hit = l->hit[nd->depth - 1], alive;

		for (uint32_t k = 0; k < up->n && !hit; k++)
			hit = up->st[k] == &gram_ctx_frame;
		alive = gram_feed(c, up, nd->byte, &l->lv[nd->depth]);
		l->hit[nd->depth] = (uint8_t)hit;
		if (alive) {
			set_bits(bs->acc, tr, nd);
			i++;
			continue;
		}
		for (uint32_t j = hit ? i : nd->end; j < nd->end; j++) /* a dead subtree: uncertain where it met the context */
			for (uint32_t k = 0; k < tr->node[j].tok_n; k++) {
				int32_t id = tr->tok[tr->node[j].tok_first + k];

				bs->unc[(*n_unc)++] = (struct vtok){ v->bytes[id], v->len[id], id };
			}
		i = nd->end;
	}
}

/* An entry of key k (hash h), not yet walked (entry_walk). */
static struct gentry *
entry_new(const struct gkey *k, uint64_t h)
{
	struct gentry *e = xcalloc(1, sizeof *e);

	e->key = *k, e->hash = h;
	return e;
}

/*
 * Fills e (entry_new's) by a walk from its key's frames with the half-read
 * bytes part (k->pn of them). Reads only x's grammar and vocabulary and
 * writes only e and bs: entries are walked on several threads at once.
 */
static void
entry_walk(const struct gram_index *x, struct gentry *e, const uint8_t *part, struct bscratch *bs)
{
	const struct gkey *k = &e->key;
	uint32_t words = mask_words(x->v), nz = 0;
	struct gctx c = { x->g, &bs->pool, NULL, bs->seen, bs->seen_cap, 0, 0, 0 };
	struct gframe *top = &gram_ctx_frame;
	struct gpos from = { &top, 1, 1, { 0 }, k->pn, k->need };
	int n_unc = 0;

	for (uint32_t i = k->n; i-- > 0;)
		top = gram_intern(&c, k->pos[i], top);
	memcpy(from.part, part, k->pn);
	memset(bs->acc, 0, words * sizeof *bs->acc);
	build_walk(&c, &x->v->all, &from, bs, &n_unc, x->v);
	e->walk_all = c.overflow;
	trie_build(&e->unc, bs->unc, n_unc); /* the walk met them in the trie's order: sorted */
	for (struct fchunk *ch = bs->pool.chunks; ch != NULL; ch = ch->next)
		for (uint32_t j = 0; j < (ch == bs->pool.chunks ? bs->pool.used : GRAM_POOL_CHUNK); j++)
			e->maxrel = MAX(e->maxrel, ch->f[j].depth);
	for (uint32_t w = 0; w < words; w++)
		nz += bs->acc[w] != 0;
	if (2 * nz < words) { /* few words set (most positions): the pairs, smaller and quicker to apply */
		e->acc = xmalloc(2 * ((size_t)nz + 1) * sizeof *e->acc);
		for (uint32_t w = 0; w < words; w++)
			if (bs->acc[w] != 0)
				e->acc[2 * e->n_acc] = w, e->acc[2 * e->n_acc + 1] = bs->acc[w], e->n_acc++;
	} else {
		e->acc = xmalloc(words * sizeof *e->acc);
		memcpy(e->acc, bs->acc, words * sizeof *e->acc);
		e->n_acc = ACC_DENSE;
	}
	gram_seen_reset(&c);
	bs->seen = c.seen, bs->seen_cap = c.seen_cap;
	gram_pool_reset(&bs->pool);
}

/*
 * The index's enumeration (index_fill): points from which matching goes
 * on, each a chain of frame positions over the context: past the top's
 * character (a key's), or at the top frame itself (resume: a rule below
 * it finished).
 */
struct point {
	const struct gkey *k;
	int resume;
};

/* An entry the enumeration found, to be walked (entry_walk) from the half-read bytes part. */
struct pending {
	struct gentry *e;
	uint8_t part[4];
};

struct fill {
	struct gram_index *x;
	struct fpool pool;
	struct gctx c;
	struct gctx below;   /* only its set: frames whose chains down to the context were looked at */
	struct etab resumed; /* the chains of resume points (keys only) */
	struct point *queue;
	uint32_t n, cap;
	struct pending *todo; /* the entries added, in order, walked once all are found (index_walk) */
	uint32_t n_todo, cap_todo;
};

static void
fill_queue(struct fill *f, const struct gkey *k, int resume)
{
	f->queue = xgrow(f->queue, &f->cap, f->n + 1, sizeof *f->queue);
	f->queue[f->n++] = (struct point){ k, resume };
}

/*
 * The entry of key k (hash h) into the index unless it holds one, its walk
 * left for later; part: the half-read bytes to walk from. (The enumeration
 * needs only the keys, not what their walks find.)
 */
static struct gentry *
fill_entry(struct fill *f, const struct gkey *k, uint64_t h, const uint8_t *part)
{
	struct gentry *e;

	if (etab_find(&f->x->all, k, h) != NULL)
		return NULL;
	e = entry_new(k, h);
	etab_add(&f->x->all, e);
	f->todo = xgrow(f->todo, &f->cap_todo, f->n_todo + 1, sizeof *f->todo);
	f->todo[f->n_todo].e = e;
	memcpy(f->todo[f->n_todo].part, part, sizeof f->todo[f->n_todo].part);
	f->n_todo++;
	return e;
}

/*
 * The classes of half-read characters (gkey): the code points of a
 * class's characters are blocks of size, aligned, in [lo, hi] less
 * [xlo, xhi] (another class's, or surrogates); a class of one first byte
 * (lead) is one block, its bounded span.
 */
static const struct hclass {
	uint8_t need, pn, lead;
	uint32_t lo, hi, size, xlo, xhi;
} hclasses[] = {
	{ 2, 1, 0, 0x80, 0x7ff, 0x40, 1, 0 },
	{ 3, 1, 0xe0, 0x800, 0xfff, 0x800, 1, 0 },
	{ 3, 1, 0xed, 0xd000, 0xd7ff, 0x800, 1, 0 },
	{ 3, 1, 0, 0x1000, 0xffff, 0x1000, 0xd000, 0xdfff },
	{ 3, 2, 0, 0x800, 0xffff, 0x40, 0xd800, 0xdfff },
	{ 4, 1, 0xf0, 0x10000, 0x3ffff, 0x30000, 1, 0 },
	{ 4, 1, 0xf4, 0x100000, 0x10ffff, 0x10000, 1, 0 },
	{ 4, 1, 0, 0x40000, 0xfffff, 0x40000, 1, 0 },
	{ 4, 2, 0, 0x10000, 0x10ffff, 0x1000, 1, 0 },
	{ 4, 3, 0, 0x10000, 0x10ffff, 0x40, 1, 0 },
};

/* 1 if the block of class hc at s is one of its own and wholly in set. */
static int
hclass_block(const struct grammar *g, uint32_t set, const struct hclass *hc, uint64_t s)
{
	uint64_t e = s + hc->size - 1;

	if (s < hc->lo || e > hc->hi || (hc->lead == 0 && s % hc->size != 0) || (s <= hc->xhi && e >= hc->xlo))
		return 0;
	return gram_set_covers(g, set, (uint32_t)s, (uint32_t)e);
}

/* Boundary i of set st: the first code point of its range i / 2 (i even), or the one past its end (odd). */
static uint64_t
set_edge(const struct grammar *g, const struct gset *st, uint32_t i)
{
	const struct grange *r = &g->ranges[st->first + i / 2];

	return i % 2 == 0 ? r->lo : (uint64_t)r->hi + 1;
}

/*
 * The entries of key k0 (no character half read) with a character half
 * read at its top: one per class some of whose characters the top's set
 * takes whole (found among the blocks at the class's start, past its
 * excluded span, and at or past each boundary of the set's ranges), and
 * one per character whose span the set splits (its bytes a prefix of a
 * boundary's).
 */
static void
fill_half(struct fill *f, const struct gkey *k0)
{
	const struct grammar *g = f->x->g;
	uint32_t set = k0->pos[0]->arg;
	const struct gset *st = &g->sets[set];
	struct gkey k;
	uint8_t b[4];

	if (!gram_set_meets(g, set, 0x80, 0x10ffff))
		return;
	for (size_t c = 0; c < ARRAY_LEN(hclasses); c++) {
		const struct hclass *hc = &hclasses[c];
		uint64_t s = hc->lo;
		int found = hclass_block(g, set, hc, s) || hclass_block(g, set, hc, s = (uint64_t)hc->xhi + 1);

		for (uint32_t i = 0; i < 2 * st->n && !found; i++) {
			uint64_t at = set_edge(g, st, i);

			s = (at + hc->size - 1) / hc->size * hc->size;
			found = hclass_block(g, set, hc, s);
		}
		if (!found)
			continue;
		k = *k0;
		utf8_encode((uint32_t)s, k.part);
		memcpy(b, k.part, sizeof b);
		k.pn = hc->pn, k.need = hc->need;
		memset(k.part + k.pn, 0, sizeof k.part - k.pn);
		key_uni(&k);
		fill_entry(f, &k, key_hash(&k), b);
	}
	for (uint32_t i = 0; i < 2 * st->n; i++) {
		uint64_t at = set_edge(g, st, i);
		int n;

		if (at < 0x80 || at > 0x10ffff || (at >= 0xd800 && at <= 0xdfff))
			continue;
		n = utf8_encode((uint32_t)at, b);
		for (int pn = 1; pn < n; pn++) {
			if (half_class(g, set, b, pn, n) != 2)
				continue;
			k = *k0;
			memset(k.part, 0, sizeof k.part);
			memcpy(k.part, b, (size_t)pn);
			k.pn = (uint8_t)pn, k.need = (uint8_t)n;
			fill_entry(f, &k, key_hash(&k), b);
		}
	}
}

/*
 * Each stack of p: its key's entry (with those of its half-read
 * characters) and the key queued past its character, if new; and each
 * frame below the key, where matching goes on once the rules above it
 * are done (its chain down to its first cut frame queued, if new).
 */
static void
fill_stacks(struct fill *f, const struct gpos *p)
{
	static const struct gpos none;
	const struct gframe *base;
	struct gkey k;

	for (uint32_t i = 0; i < p->n; i++) {
		struct gentry *e;

		if (p->st[i] == NULL || p->st[i] == &gram_ctx_frame)
			continue;
		key_of(f->x, p->st[i], p, &k, &base);
		if ((e = fill_entry(f, &k, key_hash(&k), k.part)) != NULL) {
			fill_queue(f, &e->key, 0);
			fill_half(f, &e->key);
		}
		for (const struct gframe *d = base; d != NULL && d != &gram_ctx_frame && gram_seen_first(&f->below, d); d = d->up) {
			const struct gframe *below;
			uint64_t h;

			key_of(f->x, d, &none, &k, &below);
			if (etab_find(&f->resumed, &k, h = key_hash(&k)) == NULL) {
				struct gentry *r = xcalloc(1, sizeof *r);

				r->key = k, r->hash = h;
				etab_add(&f->resumed, r);
				fill_queue(f, &r->key, 1);
			}
		}
	}
}

/* The walks of the entries the enumeration found: n threads take them one at a time. */
struct walks {
	const struct gram_index *x;
	const struct pending *todo;
	uint32_t n;
	_Atomic uint32_t next;
};

static void *
walks_run(void *arg)
{
	struct walks *w = arg;
	struct bscratch bs;
	uint32_t i;

	bscratch_init(&bs, w->x->v);
	while ((i = atomic_fetch_add_explicit(&w->next, 1, memory_order_relaxed)) < w->n)
		entry_walk(w->x, w->todo[i].e, w->todo[i].part, &bs);
	bscratch_free(&bs);
	return NULL;
}

/* The threads to use for n_threads (0: every online CPU), at most one per walk. */
static int
walk_threads(int n_threads, uint32_t n_walks)
{
	if (n_threads <= 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);

		n_threads = cpus > 0 ? (int)MIN(cpus, GRAM_MAX_THREADS) : 1;
	}
	n_threads = MIN(n_threads, GRAM_MAX_THREADS);
	return (int)MIN((uint32_t)n_threads, MAX(n_walks, 1u));
}

/*
 * Walks the n entries of todo on n_threads threads (this one among them).
 * Each walk reads only the grammar, the vocabulary and its key, and writes
 * only its entry, so the index is the same whatever the threads and
 * however they share the walks. A thread that cannot be started leaves
 * its share to the others.
 */
static void
index_walk(const struct gram_index *x, const struct pending *todo, uint32_t n, int n_threads)
{
	struct walks w = { x, todo, n, 0 };
	int nt = walk_threads(n_threads, n), started = 0;
	pthread_t *th = nt > 1 ? xmalloc((size_t)(nt - 1) * sizeof *th) : NULL;

	atomic_init(&w.next, 0);
	for (int t = 0; t < nt - 1; t++)
		if (pthread_create(&th[started], NULL, walks_run, &w) == 0)
			started++;
	walks_run(&w);
	for (int t = 0; t < started; t++)
		pthread_join(th[t], NULL);
	free(th);
}

/* 1 when the enumeration has found more than the index may hold (GRAM_MAX_INDEX). */
static int
fill_full(const struct fill *f)
{
	return f->n_todo > GRAM_MAX_INDEX || f->n > 4 * (uint32_t)GRAM_MAX_INDEX;
}

/*
 * Every key the grammar's positions can have, each entry built now (not
 * in a step): from each cut rule's start, then from each point found
 * (past a key's character, or where a frame below a key goes on), until
 * no point is new. Each point is matched over the context frame, so that
 * a key is found whatever lies below it; what lies below is reached as
 * the resume points of the frames below the keys (struct point). The
 * enumeration needs only keys, so it runs first, on this thread (a few
 * milliseconds); then the entries' walks of the vocabulary, nearly all of
 * the time, on n_threads threads (index_walk).
 */
static int
index_fill(struct gram_index *x, int n_threads, char *err)
{
	struct fill f = { .x = x };
	struct gpos p = { 0 };
	int full = 0;

	f.c = (struct gctx){ x->g, &f.pool, NULL, NULL, 0, 0, 0, 0 };
	for (uint32_t r = 0; r < x->g->n_rules && !f.c.overflow && !full; r++) {
		if (!x->cut[x->g->rules[r].first])
			continue;
		p.n = 0;
		gram_seen_reset(&f.c);
		for (uint32_t a = 0; a < x->g->rules[r].n_alt && !f.c.overflow; a++)
			gram_expand(&f.c, &x->g->elems[x->g->alts[x->g->rules[r].alt_first + a]], &gram_ctx_frame, &p);
		fill_stacks(&f, &p);
		full = fill_full(&f);
	}
	for (uint32_t q = 0; q < f.n && !f.c.overflow && !full; q++) {
		const struct gkey *k = f.queue[q].k;
		struct gframe *top = &gram_ctx_frame;

		for (uint32_t i = k->n; i-- > 0;)
			top = gram_intern(&f.c, k->pos[i], top);
		p.n = 0;
		gram_seen_reset(&f.c);
		gram_expand(&f.c, f.queue[q].resume ? top->pos : top->pos + 1, top->up, &p);
		fill_stacks(&f, &p);
		full = fill_full(&f);
	}
	if (!f.c.overflow && !full)
		index_walk(x, f.todo, f.n_todo, n_threads);
	free(f.queue), free(f.todo), free(p.st), free(f.c.seen), free(f.below.seen);
	etab_free(&f.resumed);
	gram_pool_free(&f.pool);
	if (full)
		return err_set(err, ERR_RANGE, "grammar: more than %d positions to prepare (nested repetitions or "
		    "alternatives multiply them); simplify it", GRAM_MAX_INDEX);
	return f.c.overflow ? gram_overflow_err(err) : 0;
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
	return gram_index_new_threads(g, v, 0, out, err);
}

int
gram_index_new_threads(const struct grammar *g, const struct gram_vocab *v, int n_threads, struct gram_index **out,
    char *err)
{
	struct gram_index *x = xcalloc(1, sizeof *x);
	int rc;

	x->g = g, x->v = v;
	x->cut = cut_rules(g);
	pthread_mutex_init(&x->mu, NULL);
	for (int i = 0; i < SCRATCH_SLOTS; i++)
		atomic_init(&x->spare[i], NULL);
	if ((rc = index_fill(x, n_threads, err)) != 0) {
		gram_index_free(x);
		*out = NULL;
		return rc;
	}
	*out = x;
	return 0;
}

static void
scratch_free(struct mscratch *sc)
{
	gram_pool_free(&sc->pool);
	levels_free(&sc->l);
	free(sc->seen), free(sc);
}

void
gram_index_free(struct gram_index *x)
{
	if (x == NULL)
		return;
	etab_free(&x->all);
	etab_free(&x->late);
	for (int i = 0; i < SCRATCH_SLOTS; i++) {
		struct mscratch *sc = atomic_load(&x->spare[i]);

		if (sc != NULL)
			scratch_free(sc);
	}
	pthread_mutex_destroy(&x->mu);
	free(x->cut);
	free(x);
}

uint32_t
gram_index_size(const struct gram_index *x)
{
	return x->all.n;
}

uint32_t
gram_index_late(struct gram_index *x)
{
	uint32_t n;

	pthread_mutex_lock(&x->mu);
	n = x->late.n;
	pthread_mutex_unlock(&x->mu);
	return n;
}

/* 1 if e and f (of one key) hold the same tokens: acc, the uncertain trie, maxrel, walk_all. */
static int
entry_same(const struct gentry *e, const struct gentry *f, uint32_t words)
{
	size_t n_tok = 0;

	if (e->n_acc != f->n_acc || e->maxrel != f->maxrel || e->walk_all != f->walk_all ||
	    memcmp(e->acc, f->acc, (e->n_acc == ACC_DENSE ? words : 2 * e->n_acc) * sizeof *e->acc) != 0 ||
	    e->unc.n_node != f->unc.n_node || e->unc.max_depth != f->unc.max_depth)
		return 0;
	for (uint32_t i = 0; i < e->unc.n_node; i++) {
		const struct tnode *a = &e->unc.node[i], *b = &f->unc.node[i];

		if (a->end != b->end || a->tok_first != b->tok_first || a->tok_n != b->tok_n || a->depth != b->depth ||
		    a->byte != b->byte)
			return 0;
		n_tok += a->tok_n;
	}
	return n_tok == 0 || memcmp(e->unc.tok, f->unc.tok, n_tok * sizeof *e->unc.tok) == 0;
}

int
gram_index_same(const struct gram_index *a, const struct gram_index *b)
{
	uint32_t words = mask_words(a->v);

	if (a->g != b->g || a->v != b->v || a->all.n != b->all.n)
		return 0;
	for (uint32_t i = 0; i < a->all.cap; i++)
		for (const struct gentry *e = a->all.tab[i]; e != NULL; e = e->next) {
			const struct gentry *f = etab_find(&b->all, &e->key, e->hash);

			if (f == NULL || !entry_same(e, f, words))
				return 0;
		}
	return 1;
}

/* A mask's scratch: a spare one of x's if any (no lock: each slot taken by an exchange), or a new one. */
static struct mscratch *
scratch_take(struct gram_index *x)
{
	struct mscratch *sc;

	for (int i = 0; i < SCRATCH_SLOTS; i++)
		if ((sc = atomic_exchange_explicit(&x->spare[i], NULL, memory_order_acquire)) != NULL)
			return sc;
	sc = xcalloc(1, sizeof *sc);
	levels_init(&sc->l, x->v->all.max_depth); /* the deepest: every trie here holds some of its tokens */
	return sc;
}

/* The most slots a spare scratch's set table keeps (its whole table is cleared per character advanced). */
#define SCRATCH_KEEP_SEEN 256

/* sc emptied and put back in a free slot of x (freed when every slot is taken). */
static void
scratch_give(struct gram_index *x, struct mscratch *sc)
{
	gram_pool_reset(&sc->pool);
	if (sc->seen_cap > SCRATCH_KEEP_SEEN) {
		free(sc->seen);
		sc->seen = NULL, sc->seen_cap = 0;
	}
	for (int i = 0; i < SCRATCH_SLOTS; i++) {
		struct mscratch *none = NULL;

		if (atomic_compare_exchange_strong_explicit(&x->spare[i], &none, sc, memory_order_release,
		    memory_order_relaxed))
			return;
	}
	scratch_free(sc);
}

/* The entry of key k (hash h) that the index's enumeration did not make: built now, once, under x->mu. */
static const struct gentry *
entry_late(struct gram_index *x, const struct gkey *k, uint64_t h, const uint8_t *part)
{
	struct gentry *e;

	pthread_mutex_lock(&x->mu);
	if ((e = etab_find(&x->late, k, h)) == NULL) {
		struct bscratch bs;

		bscratch_init(&bs, x->v);
		e = entry_new(k, h);
		entry_walk(x, e, part, &bs);
		bscratch_free(&bs);
		etab_add(&x->late, e);
	}
	pthread_mutex_unlock(&x->mu);
	return e;
}

/* The tokens stack f allows into mask: its entry's, then its uncertain ones checked from f itself. */
static void
mask_stack(struct gram_index *x, struct gctx *c, struct levels *l, const struct gpos *at, struct gframe *f,
    uint32_t *mask)
{
	struct gpos one = { &f, 1, 1, { 0 }, at->pn, at->need };
	const struct gframe *base;
	const struct gentry *e;
	struct gkey k;
	uint64_t h;

	memcpy(one.part, at->part, sizeof one.part);
	key_of(x, f, at, &k, &base);
	if (at->pn > 0) {
		int cls = half_class(x->g, f->pos->arg, at->part, at->pn, at->need);

		if (cls == 0)
			return; /* no character the bytes can become goes on from f */
		if (cls == 1)
			key_uni(&k);
	}
	h = key_hash(&k);
	if ((e = etab_find(&x->all, &k, h)) == NULL)
		e = entry_late(x, &k, h, at->part);
	if (e->walk_all || (base != NULL ? base->depth : 0) + e->maxrel > GRAM_MAX_DEPTH) {
		walk(c, l, &one, &x->v->all, mask);
		return;
	}
	if (e->n_acc == ACC_DENSE) {
		uint32_t words = mask_words(x->v);

		for (uint32_t w = 0; w < words; w++)
			mask[w] |= e->acc[w];
	} else {
		for (uint32_t i = 0; i < e->n_acc; i++)
			mask[e->acc[2 * i]] |= e->acc[2 * i + 1];
	}
	walk(c, l, &one, &e->unc, mask);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("popcnt"))) static int
popcount_hw(const uint32_t *m, uint32_t words)
{
	int n = 0;

	for (uint32_t w = 0; w < words; w++)
		n += __builtin_popcount(m[w]);
	return n;
}
#endif

/*
 * The bits set in words of m: by the popcnt instruction where the CPU has
 * it (without it, __builtin_popcount is a call into libgcc that looks up
 * each byte, half of a mask's time on a 128,256-token vocabulary).
 */
static int
popcount_words(const uint32_t *m, uint32_t words)
{
	int n = 0;

#if defined(__x86_64__) && defined(__GNUC__)
	if (__builtin_cpu_supports("popcnt"))
		return popcount_hw(m, words);
#endif
	for (uint32_t w = 0; w < words; w++) {
		uint32_t b = m[w] - (m[w] >> 1 & 0x55555555u);

		b = (b & 0x33333333u) + (b >> 2 & 0x33333333u);
		n += (int)(((b + (b >> 4)) & 0x0f0f0f0fu) * 0x01010101u >> 24);
	}
	return n;
}

int
gram_mask(const struct gram_state *s, struct gram_index *x, uint32_t *mask, char *err)
{
	const struct gram_vocab *v = x->v;
	uint32_t words = mask_words(v);
	struct mscratch *sc = scratch_take(x);
	struct gctx c = { s->g, &sc->pool, &s->pool, sc->seen, sc->seen_cap, 0, 0, 0 };
	int count = 0;

	memset(mask, 0, words * sizeof *mask);
	for (uint32_t i = 0; i < s->at.n && !c.overflow; i++)
		if (s->at.st[i] != NULL)
			mask_stack(x, &c, &sc->l, &s->at, s->at.st[i], mask);
	if (!c.overflow && gram_complete(s))
		for (int k = 0; k < v->n_ends; k++)
			mask[v->ends[k] / 32] |= 1u << (v->ends[k] % 32);
	count = popcount_words(mask, words);
	gram_seen_reset(&c);
	sc->seen = c.seen, sc->seen_cap = c.seen_cap;
	scratch_give(x, sc);
	return c.overflow ? gram_overflow_err(err) : count;
}
