/*
 * draft.h: guesses of the tokens that come next, read from a sequence's own
 * text (prompt lookup): where its last few tokens occurred before, the
 * tokens that followed them there. Rewriting a file, quoting a document or
 * repeating a list, a model copies long runs of its prompt; speculative
 * decoding (engine.c) checks such a guess in one step and keeps what the
 * model would have written anyway.
 *
 * The index maps each run of DRAFT_NGRAM_MIN..DRAFT_NGRAM_MAX tokens to
 * where it last ended, filled as the sequence grows (each token is indexed
 * once), so that a guess costs a few lookups however long the context.
 */
#ifndef RESIDENT_DRAFT_H
#define RESIDENT_DRAFT_H

#include <stdint.h>

#define DRAFT_NGRAM_MIN 2
#define DRAFT_NGRAM_MAX 4

/* Whether a request's sequences guess (its `speculative`). */
enum spec_mode {
	SPEC_OFF,
	SPEC_AUTO,          /* where the daemon measured that guessing pays (guess.h) */
	SPEC_ON,            /* in every step that has rows for guesses */
};

struct draft_index {
	uint32_t *key;      /* a run's hash (0: an empty slot) */
	int32_t *end;       /* the index of its last token where it last occurred */
	uint32_t cap, used; /* slots (a power of two, or 0), and those taken */
	int32_t n_done;     /* runs ending before this index are in */
};

/*
 * Up to k tokens that followed the longest run (DRAFT_NGRAM_MAX tokens
 * down to DRAFT_NGRAM_MIN) that t[0..n) ends with, where it occurred last
 * before, into out. Indexes t first: t[0..n) must extend what the index
 * saw (draft_reset after anything else). Returns how many (0: no run of
 * the end occurred before).
 */
int32_t draft_guess(struct draft_index *x, const int32_t *t, int32_t n, int32_t k, int32_t *out);
/* Forgets every run (the tokens changed); keeps the memory. */
void draft_reset(struct draft_index *x);
/* Frees the index; a zeroed one is allowed. */
void draft_free(struct draft_index *x);

#endif
