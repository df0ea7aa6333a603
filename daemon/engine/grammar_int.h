/*
 * grammar_int.h: a compiled grammar's form, shared by the compiler
 * (grammar.c) and the positions and masks that read it (grammar_state.c,
 * grammar_mask.c), and the matcher's frames and steps that the masks
 * drive over the vocabulary's bytes (grammar_state.c's).
 *
 * Compiled, a grammar is rules of flat elements, as llama.cpp's GBNF
 * engine keeps them: a rule's alternatives one after the other, each ended
 * by GE_ALT (the last by GE_END), each element a character set (GE_CHAR)
 * or a reference to a rule (GE_RULE). Groups and repetitions become rules
 * of their own (x* is R ::= x R | empty), so that matching knows only
 * sequences, alternatives and references.
 */
#ifndef RESIDENT_GRAMMAR_INT_H
#define RESIDENT_GRAMMAR_INT_H

#include <stddef.h>
#include <stdint.h>

enum gram_kind { GE_END, GE_ALT, GE_RULE, GE_CHAR };

struct gelem {
	uint32_t kind;
	uint32_t arg; /* GE_RULE: the rule; GE_CHAR: the set */
};

struct grange {
	uint32_t lo, hi;
};

struct gset {
	uint32_t first, n; /* ranges[first .. first + n): sorted, disjoint, none touching the next */
	int neg;
};

struct grule {
	uint32_t first; /* its elements in elems[] */
	uint32_t alt_first, n_alt; /* its alternatives' first elements, in alts[] */
	int named;      /* defined by name in the text (else a group's or a repetition's) */
};

struct grammar {
	struct gelem *elems;
	uint32_t n_elems;
	uint32_t *alts;
	struct grule *rules;
	uint32_t n_rules, root;
	struct gset *sets;
	uint32_t n_sets;
	struct grange *ranges;
	uint32_t n_ranges;
};

/* ---- the matcher (grammar_state.c), driven by the masks (grammar_mask.c) ---- */

struct gframe {
	const struct gelem *pos; /* a stack's top: GE_CHAR; below: where its rule goes on */
	struct gframe *up;       /* NULL: the root's bottom */
	uint32_t depth;
};

#define GRAM_POOL_CHUNK 1024
struct fchunk {
	struct fchunk *next;
	struct gframe f[GRAM_POOL_CHUNK];
};

/* Interned frames: one frame per (pos, up), in chunks, found by a hash. */
struct fpool {
	struct gframe **tab;
	size_t cap, n, used; /* used: frames taken in the first chunk */
	struct fchunk *chunks;
	struct fchunk *spare; /* chunks emptied by gram_pool_reset, taken before new ones */
	size_t n_spare;
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

struct gram_state {
	const struct grammar *g;
	struct fpool pool;
	struct gpos at;
	size_t kept; /* frames after the last compaction */
};

/*
 * The frame below the stacks of an index's key (gram_index): where a
 * stack goes on into the context the key leaves out. A position's walk
 * keeps it as a top once reached; it takes no character.
 */
extern struct gframe gram_ctx_frame;

/* The frame (pos, up), interned: looked up in c->base, then c->pool, added there if new. */
struct gframe *gram_intern(struct gctx *c, const struct gelem *pos, struct gframe *up);
void gram_pool_free(struct fpool *p);
/* Empties p, keeping some of its memory (a mask's scratch frames, between masks). */
void gram_pool_reset(struct fpool *p);
/* 1 the first time top is added to the set being built (c->seen, reset per set). */
int gram_seen_first(struct gctx *c, const void *top);
void gram_seen_reset(struct gctx *c);
/* The stacks that matching from pos (then up) can reach before its next character, into out. */
void gram_expand(struct gctx *c, const struct gelem *pos, struct gframe *up, struct gpos *out);
/* 1 if set holds some code point of [lo, hi]. */
int gram_set_meets(const struct grammar *g, uint32_t set, uint32_t lo, uint32_t hi);
/* 1 if set holds every code point of [lo, hi]. */
int gram_set_covers(const struct grammar *g, uint32_t set, uint32_t lo, uint32_t hi);
/* Copies in's stacks into out (the same position, its own array). */
void gram_pos_copy(const struct gpos *in, struct gpos *out);
/* The code points [*lo, *hi] that a character half read (pn of its need bytes in part) can still become. */
void gram_part_range(const uint8_t *part, int pn, int need, uint32_t *lo, uint32_t *hi);
/* out: in after byte b. Returns 1, or 0 when no stack survives it. */
int gram_feed(struct gctx *c, const struct gpos *in, uint8_t b, struct gpos *out);
/* The error of a position past GRAM_MAX_STACKS stacks or references expanded too deep (c->overflow). */
int gram_overflow_err(char *err);

/* ---- for tests (grammar_mask.c) ---- */

struct gram_index;

/*
 * The entries of x that masks had to build (keys gram_index_new's
 * enumeration missed): 0 unless that enumeration is incomplete. For tests.
 */
uint32_t gram_index_late(struct gram_index *x);

/*
 * 1 if a and b (of one grammar and vocabulary) hold the same entries: the
 * same keys, each with the same tokens. For tests (an index made on one
 * thread against one made on several).
 */
int gram_index_same(const struct gram_index *a, const struct gram_index *b);

#endif
