/*
 * kvhost.c: blocks in host memory, in a hash table of chains by key and a
 * list from the oldest stored to the newest. The table doubles as it fills.
 *
 * The device pool gives up a prefix's deepest blocks first (kv.c), so its
 * beginning is stored last and leaves this tier last too.
 */
#include "config.h"
#include "kvhost.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

void
kvhost_init(struct kvhost *h, uint64_t budget)
{
	memset(h, 0, sizeof *h);
	h->budget = budget;
	h->mask = 255;
	h->slots = xcalloc(h->mask + 1, sizeof *h->slots);
}

static void pins_collect(struct kvhost *h, int wait);

/* Frees a block that no list holds, and its buffer. */
static void
block_free(struct kvhost_block *b)
{
	b->free_fn(b->data);
	free(b);
}

/* Frees the first spare buffer. */
static void
spare_drop(struct kvhost *h)
{
	struct kvhost_spare *s = h->spare;

	h->spare = s->next;
	h->spare_bytes -= s->bytes;
	s->free_fn(s->data);
	free(s);
}

void
kvhost_destroy(struct kvhost *h)
{
	struct kvhost_block *b, *next;

	worker_stop(&h->pinner);    /* what it was making becomes spares, freed below */
	pins_collect(h, 0);
	for (b = h->oldest; b != NULL; b = next) {
		next = b->newer;
		block_free(b);
	}
	while (h->spare != NULL)
		spare_drop(h);
	free(h->slots);
	memset(h, 0, sizeof *h);
}

int
kvhost_fits(const struct kvhost *h, size_t bytes)
{
	return bytes > 0 && bytes <= h->budget;
}

/* Unlinks b from its slot and the age list; its bytes stay counted. */
static void
unlink_block(struct kvhost *h, struct kvhost_block *b)
{
	struct kvhost_block **pp = &h->slots[(uint32_t)b->key & h->mask];

	while (*pp != b)
		pp = &(*pp)->next_in_slot;
	*pp = b->next_in_slot;
	if (b->older != NULL)
		b->older->newer = b->newer;
	else
		h->oldest = b->newer;
	if (b->newer != NULL)
		b->newer->older = b->older;
	else
		h->newest = b->older;
	h->n--;
}

/* Doubles the table when it holds more blocks than slots. */
static void
grow(struct kvhost *h)
{
	uint32_t mask = h->mask * 2 + 1;
	struct kvhost_block **slots = xcalloc((size_t)mask + 1, sizeof *slots), *b;

	for (b = h->oldest; b != NULL; b = b->newer) {
		b->next_in_slot = slots[(uint32_t)b->key & mask];
		slots[(uint32_t)b->key & mask] = b;
	}
	free(h->slots);
	h->slots = slots;
	h->mask = mask;
}

/* A spare buffer of this size and kind, taken off the list, or NULL. */
static void *
spare_take(struct kvhost *h, size_t bytes, void (*free_fn)(void *))
{
	struct kvhost_spare **pp, *s;
	void *data;

	for (pp = &h->spare; (s = *pp) != NULL; pp = &s->next) {
		if (s->bytes == bytes && s->free_fn == free_fn) {
			*pp = s->next;
			h->spare_bytes -= bytes;
			data = s->data;
			free(s);
			return data;
		}
	}
	return NULL;
}

void *
kvhost_buffer(struct kvhost *h, size_t bytes, void *(*alloc)(size_t), void (*free_fn)(void *))
{
	struct kvhost_block *old;
	void *data;

	if (!kvhost_fits(h, bytes))
		return NULL;
	pins_collect(h, 0);
	if ((data = spare_take(h, bytes, free_fn)) != NULL) {
		h->used += bytes;
		return data;
	}
	while (h->used + h->spare_bytes + bytes > h->budget) {
		if (h->spare != NULL) {
			spare_drop(h);
			continue;
		}
		if ((old = h->oldest) == NULL)
			return NULL;   /* the rest is taken out, being filled or copied */
		unlink_block(h, old);
		h->dropped++;
		if (old->bytes == bytes && old->free_fn == free_fn) {
			data = old->data;    /* counted as used already */
			free(old);
			return data;
		}
		h->used -= old->bytes;
		block_free(old);
	}
	if ((data = alloc(bytes)) != NULL)
		h->used += bytes;
	return data;
}

/* Adds a buffer to the spares (its bytes already counted in spare_bytes or freed from used by the caller). */
static void
spare_push(struct kvhost *h, void *data, size_t bytes, void (*free_fn)(void *))
{
	struct kvhost_spare *s = xmalloc(sizeof *s);

	*s = (struct kvhost_spare){ data, bytes, free_fn, h->spare };
	h->spare = s;
}

static void
pin_run(struct work *w)
{
	struct kvhost_pin *p = (struct kvhost_pin *)w;

	p->data = p->alloc(p->bytes);
}

/* The pins the thread has made (all of them, with wait), as spares; a failed one gives its bytes back. */
static void
pins_collect(struct kvhost *h, int wait)
{
	struct work *w, *next;

	if (h->n_pinning == 0)
		return;  /* the thread has nothing of ours (it may never have started) */
	for (w = wait ? worker_drain(&h->pinner, h) : worker_take_done(&h->pinner); w != NULL; w = next) {
		struct kvhost_pin *p = (struct kvhost_pin *)w;

		next = w->next;
		h->n_pinning--;
		if (p->data != NULL)
			spare_push(h, p->data, p->bytes, p->free_fn);
		else
			h->spare_bytes -= p->bytes;
		free(p);
	}
}

static void
pin_woken(void *arg)
{
	(void)arg; /* the engine thread takes the pins when it next needs a buffer */
}

void
kvhost_reserve(struct kvhost *h, size_t bytes, int n, void *(*alloc)(size_t), void (*free_fn)(void *))
{
	struct kvhost_spare *s;
	char err[ERR_LEN];
	int have;

	pins_collect(h, 0);
	if (!h->pinner.started && worker_start(&h->pinner, pin_woken, h, err) != 0)
		return;
	for (have = h->n_pinning, s = h->spare; s != NULL; s = s->next) /* pins under way: of this kind alone */
		have += s->bytes == bytes && s->free_fn == free_fn;
	for (; have < n && h->used + h->spare_bytes + bytes <= h->budget; have++) {
		struct kvhost_pin *p = xcalloc(1, sizeof *p);

		*p = (struct kvhost_pin){ { pin_run, h, 0, NULL }, bytes, alloc, free_fn, NULL };
		h->spare_bytes += bytes;
		h->n_pinning++;
		worker_submit(&h->pinner, &p->w);
	}
}

void
kvhost_pins_wait(struct kvhost *h)
{
	pins_collect(h, 1);
}

void
kvhost_release(struct kvhost *h, struct kvhost_block *b)
{
	/* used + spare_bytes never passes the budget, so the buffer always fits as a spare */
	h->used -= b->bytes;
	h->spare_bytes += b->bytes;
	spare_push(h, b->data, b->bytes, b->free_fn);
	free(b);
}

void
kvhost_put(struct kvhost *h, struct kvhost_block *b)
{
	struct kvhost_block *old;

	if ((old = kvhost_take(h, b->key, b->prev, b->root, b->depth, b->tokens)) != NULL)
		kvhost_release(h, old);
	if ((uint64_t)h->n >= (uint64_t)h->mask + 1)
		grow(h);
	b->next_in_slot = h->slots[(uint32_t)b->key & h->mask];
	h->slots[(uint32_t)b->key & h->mask] = b;
	b->older = h->newest;
	b->newer = NULL;
	if (h->newest != NULL)
		h->newest->newer = b;
	else
		h->oldest = b;
	h->newest = b;
	h->n++;
}

struct kvhost_block *
kvhost_take(struct kvhost *h, uint64_t key, uint64_t prev, uint64_t root, int32_t depth, const int32_t *tokens)
{
	struct kvhost_block *b;

	for (b = h->slots[(uint32_t)key & h->mask]; b != NULL; b = b->next_in_slot) {
		if (b->key == key && b->prev == prev && b->root == root && b->depth == depth &&
		    memcmp(b->tokens, tokens, sizeof b->tokens) == 0) {
			unlink_block(h, b);
			return b;
		}
	}
	return NULL;
}
