/*
 * grammar_int.h: a compiled grammar's form, shared by the compiler
 * (grammar.c) and the positions and masks that read it (grammar_mask.c).
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
