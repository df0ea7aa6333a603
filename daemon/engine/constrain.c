/*
 * constrain.c: the grammars of one model, shared by text (constrain.h).
 *
 * Entries are a short list: a model sees a handful of distinct schemas at a
 * time (an app's few response formats and tool sets), so a hash and a walk
 * of the list find one. The slow part, compiling and indexing a new text,
 * runs without the lock, so that other requests' lookups do not wait for
 * it (the engine thread's masks take no lock); two requests that race on one new text both build it and
 * the second keeps the first's.
 */
#include "config.h"
#include "constrain.h"
#include "grammar.h"
#include "jschema.h"
#include "tokenizer.h"
#include "util.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

struct cons_gram {
	struct cons_gram *next;
	uint32_t hash;
	char *text;
	size_t len;
	struct grammar *g;
	struct gram_index *x;
	int refs;
	uint64_t used;          /* the cons's clock when last taken: the oldest unheld goes first */
};

struct cons {
	const struct tokenizer *tok;
	int n_threads;          /* an index's threads (gram_index_new_threads) */
	pthread_mutex_t mu;
	struct gram_vocab *v;   /* NULL until the first grammar */
	const char **bytes;     /* each token's bytes (the tokenizer's), for v */
	uint32_t *len;
	uint8_t *skip, *end;
	struct cons_gram *grams;
	uint64_t clock;
};

struct cons *
cons_new(const struct tokenizer *t, int n_threads)
{
	struct cons *c = xcalloc(1, sizeof *c);

	c->tok = t;
	c->n_threads = n_threads;
	pthread_mutex_init(&c->mu, NULL);
	return c;
}

static void
gram_free(struct cons_gram *g)
{
	gram_index_free(g->x);
	grammar_free(g->g);
	free(g->text);
	free(g);
}

void
cons_free(struct cons *c)
{
	struct cons_gram *g, *next;

	if (c == NULL)
		return;
	for (g = c->grams; g != NULL; g = next) {
		next = g->next;
		gram_free(g);
	}
	gram_vocab_free(c->v);
	free(c->bytes), free(c->len), free(c->skip), free(c->end);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/*
 * The vocabulary as the masks see it (under the lock): control, unknown and
 * unused tokens are never text; the tokens that end a turn end the output.
 */
static int
vocab(struct cons *c, char *err)
{
	int32_t i, n = tok_n_vocab(c->tok);
	size_t len;

	if (c->v != NULL)
		return 0;
	c->bytes = xcalloc((size_t)n, sizeof *c->bytes);
	c->len = xcalloc((size_t)n, sizeof *c->len);
	c->skip = xcalloc((size_t)n, 1);
	c->end = xcalloc((size_t)n, 1);
	for (i = 0; i < n; i++) {
		enum tok_type ty = tok_type(c->tok, i);

		c->bytes[i] = tok_bytes(c->tok, i, &len);
		c->len[i] = (uint32_t)len;
		c->skip[i] = ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_UNUSED;
		c->end[i] = (uint8_t)tok_is_eog(c->tok, i);
	}
	return gram_vocab_new(n, c->bytes, c->len, c->skip, c->end, &c->v, err);
}

/* Freed memory back to the system: an index of many positions leaves its pages with malloc otherwise. */
static void
give_back(void)
{
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}

/* 1 if g, unheld, is worth keeping for a later request (its index is not a large one). */
static int
keep(const struct cons_gram *g)
{
	return gram_index_size(g->x) <= CONS_KEEP_POSITIONS;
}

/*
 * Unheld entries too large to keep are freed, then those past the
 * CONS_KEEP most recently used (under the lock).
 */
static void
trim(struct cons *c)
{
	struct cons_gram *g;
	int large = 0;

	for (struct cons_gram **p = &c->grams; (g = *p) != NULL;) {
		if (g->refs == 0 && !keep(g)) {
			*p = g->next;
			gram_free(g);
			large = 1;
		} else {
			p = &g->next;
		}
	}
	if (large)
		give_back();
	for (;;) {
		struct cons_gram **oldest = NULL;
		int unheld = 0;

		for (struct cons_gram **p = &c->grams; (g = *p) != NULL; p = &g->next)
			if (g->refs == 0) {
				unheld++;
				if (oldest == NULL || g->used < (*oldest)->used)
					oldest = p;
			}
		if (unheld <= CONS_KEEP)
			return;
		g = *oldest;
		*oldest = g->next;
		gram_free(g);
	}
}

/* The entry of this text, held (under the lock), or NULL. */
static struct cons_gram *
find(struct cons *c, uint32_t hash, const char *text, size_t len)
{
	for (struct cons_gram *g = c->grams; g != NULL; g = g->next)
		if (g->hash == hash && g->len == len && memcmp(g->text, text, len) == 0) {
			g->refs++;
			g->used = ++c->clock;
			return g;
		}
	return NULL;
}

/* A new entry, compiled and indexed (without the lock: the index takes seconds, on c->n_threads threads). */
static int
build(struct cons *c, uint32_t hash, const char *text, size_t len, struct cons_gram **out, char *err)
{
	struct cons_gram *g = xcalloc(1, sizeof *g);
	int rc;

	if ((rc = grammar_compile(text, len, &g->g, err)) != 0 ||
	    (rc = gram_index_new_threads(g->g, c->v, c->n_threads, &g->x, err)) != 0) {
		gram_free(g);
		give_back(); /* a refused index may have taken a GiB before it stopped */
		return rc;
	}
	g->hash = hash;
	g->text = xmalloc(len + 1);
	memcpy(g->text, text, len);
	g->text[len] = '\0';
	g->len = len;
	*out = g;
	return 0;
}

int
cons_get(struct cons *c, const char *text, size_t len, struct cons_gram **out, char *err)
{
	uint32_t hash = hash32(text, len);
	struct cons_gram *g, *mine;
	int rc;

	pthread_mutex_lock(&c->mu);
	rc = vocab(c, err);
	g = rc == 0 ? find(c, hash, text, len) : NULL;
	pthread_mutex_unlock(&c->mu);
	if (rc != 0 || g != NULL) {
		*out = g;
		return rc;
	}
	if ((rc = build(c, hash, text, len, &mine, err)) != 0)
		return rc;
	pthread_mutex_lock(&c->mu);
	if ((g = find(c, hash, text, len)) != NULL) {
		gram_free(mine);
	} else {
		g = mine;
		g->refs = 1;
		g->used = ++c->clock;
		g->next = c->grams;
		c->grams = g;
	}
	pthread_mutex_unlock(&c->mu);
	*out = g;
	return 0;
}

int
cons_get_schema(struct cons *c, const char *text, size_t len, struct cons_gram **out, char *err)
{
	json_error_t je;
	json_t *schema = json_loadb(text, len, JSON_DECODE_ANY, &je);
	char *g = NULL;
	int rc;

	if (schema == NULL)
		return err_set(err, ERR_INVAL, "not JSON: %s (line %d, column %d)", je.text, je.line, je.column);
	if ((rc = jschema_grammar(schema, &g, err)) == 0)
		rc = cons_get(c, g, strlen(g), out, err);
	json_decref(schema);
	free(g);
	return rc;
}

struct cons_gram *
cons_hold(struct cons *c, struct cons_gram *g)
{
	pthread_mutex_lock(&c->mu);
	g->refs++;
	pthread_mutex_unlock(&c->mu);
	return g;
}

void
cons_put(struct cons *c, struct cons_gram *g)
{
	if (g == NULL)
		return;
	pthread_mutex_lock(&c->mu);
	g->refs--;
	trim(c);
	pthread_mutex_unlock(&c->mu);
}

const struct grammar *
cons_grammar(const struct cons_gram *g)
{
	return g->g;
}

struct gram_index *
cons_index(struct cons_gram *g)
{
	return g->x;
}

int
cons_accept(const struct cons *c, struct gram_state *s, int32_t tok, char *err)
{
	size_t len;
	const char *b = tok_bytes(c->tok, tok, &len);

	if (b == NULL)
		return err_set(err, ERR_INVAL, "token %d is outside the vocabulary", tok);
	return gram_accept(s, b, len, err);
}
