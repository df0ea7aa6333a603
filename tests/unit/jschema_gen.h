/*
 * jschema_gen.h: random JSON Schemas of the subset jschema.h supports,
 * and random valid instances of each, for test_jschema.c (jschema_gen.c).
 * The seeded random source and the reader of test JSON are here because
 * the generator draws on them; the test's own cases use them too, so that
 * one seed (TEST_JSCHEMA_SEED) repeats a whole run.
 */
#ifndef RESIDENT_TEST_JSCHEMA_GEN_H
#define RESIDENT_TEST_JSCHEMA_GEN_H

#include <jansson.h>
#include <stdint.h>

struct strbuf;
struct rnode;

/* A random pattern: top alternatives, each maybe anchored; its text and tree. */
struct rpat {
	char *text;
	struct rnode *alt[2][5];
	int nalt, start[2], end[2];
};

/* What random schemas share: the root's $defs, the patterns made (their trees, by text). */
struct rgen {
	json_t *defs;
	int n_defs;
	struct rpat pats[64];
	int n_pats;
};

/* xorshift's state: set it (not to 0) before the first draw. */
extern uint64_t rng_state;
uint32_t rng(void);
uint32_t rnd(uint32_t n);

/* text as JSON (any value); the test fails if it is not. */
json_t *parse(const char *text);

/*
 * A random schema, depth levels down; definitions it refers to go to
 * g->defs, for the caller to set as the root's $defs.
 */
json_t *gen_schema(struct rgen *g, int depth);
/* A random instance of s (made with g), spelled as jschema.h promises, onto b. */
void gen_inst(struct rgen *g, const json_t *s, int depth, struct strbuf *b);
/* Frees a pattern gen_schema made (g->pats). */
void rpat_free(struct rpat *p);

#endif
