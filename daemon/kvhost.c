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

void
kvhost_free(struct kvhost_block *b)
{
	if (b != NULL)
		free(b->data);
	free(b);
}

void
kvhost_destroy(struct kvhost *h)
{
	struct kvhost_block *b, *next;

	for (b = h->oldest; b != NULL; b = next) {
		next = b->newer;
		kvhost_free(b);
	}
	free(h->slots);
	memset(h, 0, sizeof *h);
}

int
kvhost_fits(const struct kvhost *h, size_t bytes)
{
	return bytes > 0 && bytes <= h->budget;
}

/* Unlinks b from its slot and the age list. */
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
	h->used -= b->bytes;
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

void
kvhost_put(struct kvhost *h, struct kvhost_block *b)
{
	struct kvhost_block *old;

	if (!kvhost_fits(h, b->bytes)) {
		kvhost_free(b);
		h->dropped++;
		return;
	}
	if ((old = kvhost_take(h, b->key, b->prev, b->root, b->depth, b->tokens)) != NULL)
		kvhost_free(old);
	while (h->used + b->bytes > h->budget) {
		old = h->oldest;
		unlink_block(h, old);
		kvhost_free(old);
		h->dropped++;
	}
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
	h->used += b->bytes;
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
