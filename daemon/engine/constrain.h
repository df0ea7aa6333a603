/*
 * constrain.h: grammars over one model's vocabulary, for the engine's
 * constrained sequences (grammar.h does the grammar; this file ties it to a
 * tokenizer and shares it between requests).
 *
 * The vocabulary's bytes (a gram_vocab) are gathered from the tokenizer on
 * first use. A grammar compiled from text, with its mask index, is shared by
 * every request that gives the same text: it lives while one holds it, and
 * the last CONS_KEEP that none holds are kept for the next request, unless
 * their index holds more than CONS_KEEP_POSITIONS positions (a large one,
 * about a KiB a position, is freed once unheld and its memory given back to
 * the system, so that one hostile or huge schema does not stay in the
 * daemon's memory). An
 * index takes milliseconds to seconds to build on a 128k vocabulary (a
 * nested JSON Schema's, shared among threads), so requests prepare theirs on
 * the prompt worker while the engine thread computes masks with the ones it
 * holds: everything here is thread-safe, and no lock is held while an index
 * is made.
 */
#ifndef RESIDENT_CONSTRAIN_H
#define RESIDENT_CONSTRAIN_H

#include <stddef.h>
#include <stdint.h>

#define CONS_KEEP 8
#define CONS_KEEP_POSITIONS 65536

struct tokenizer;
struct grammar;
struct gram_index;
struct gram_state;
struct cons;
struct cons_gram;

/*
 * Grammars over t's vocabulary (t must outlive it); a new grammar's index
 * is made on n_threads threads (gram_index_new_threads; 0: one per online
 * CPU), the caller's among them.
 */
struct cons *cons_new(const struct tokenizer *t, int n_threads);
void cons_free(struct cons *c);

/*
 * The grammar of len bytes of text, held for the caller (cons_put gives it
 * back). 0, or ERR_INVAL / ERR_RANGE with err saying what is wrong with
 * the text (grammar_compile) or the vocabulary.
 */
int cons_get(struct cons *c, const char *text, size_t len, struct cons_gram **out, char *err);
/*
 * The grammar of a JSON Schema's len bytes of JSON text (jschema.h), held
 * as cons_get's. 0, or ERR_INVAL for text that is not JSON (its line and
 * column in err), or jschema_grammar's and cons_get's errors.
 */
int cons_get_schema(struct cons *c, const char *text, size_t len, struct cons_gram **out, char *err);
/* Another hold on a held grammar (a fork's). */
struct cons_gram *cons_hold(struct cons *c, struct cons_gram *g);
void cons_put(struct cons *c, struct cons_gram *g);

const struct grammar *cons_grammar(const struct cons_gram *g);
struct gram_index *cons_index(struct cons_gram *g);

/*
 * Advances s by the bytes of token tok, which is not an end token. 0, or
 * ERR_INVAL (s unchanged) when the grammar does not allow them there.
 */
int cons_accept(const struct cons *c, struct gram_state *s, int32_t tok, char *err);

#endif
