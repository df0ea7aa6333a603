/*
 * kv.c: reference-counted KV blocks, the prefix table and the idle heap.
 *
 * The table is open addressing with linear probing over twice as many slots
 * as blocks, so it never fills; a removal shifts the entries after it back
 * (no tombstones). The idle heap is a binary min-heap of block ids ordered
 * by (tick, deeper first); each block knows its place in it, so that a
 * block found by a lookup leaves the heap in O(log n).
 *
 * Why the heap's minimum is always a leaf (kv.h): every holder of a cached
 * block holds its whole chain and releases it in one kv_release, with one
 * tick, so an idle parent was released no earlier than any of its idle
 * children, and at the same tick the deeper block goes first. kv_alloc
 * checks this anyway.
 */
#include "config.h"
#include "kv.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static void heap_push(struct kv_pool *kv, int32_t b);
static void heap_remove(struct kv_pool *kv, int32_t b);

void
kv_init(struct kv_pool *kv, int32_t n_blocks)
{
	uint32_t slots = 2;
	int32_t i;

	memset(kv, 0, sizeof *kv);
	kv->n_blocks = n_blocks;
	kv->n_free = n_blocks;
	kv->free_list = xmalloc((size_t)n_blocks * sizeof *kv->free_list);
	kv->b = xcalloc((size_t)n_blocks, sizeof *kv->b);
	kv->heap = xmalloc((size_t)n_blocks * sizeof *kv->heap);
	while (slots < 2u * (uint32_t)n_blocks)
		slots <<= 1;
	kv->mask = slots - 1;
	kv->slots = xmalloc((size_t)slots * sizeof *kv->slots);
	for (i = 0; i < (int32_t)slots; i++)
		kv->slots[i] = KV_NONE;
	/* low ids on top, so a fresh pool hands out 0, 1, 2... */
	for (i = 0; i < n_blocks; i++) {
		kv->free_list[i] = n_blocks - 1 - i;
		kv->b[i].heap_pos = -1;
	}
}

void
kv_destroy(struct kv_pool *kv)
{
	free(kv->free_list);
	free(kv->b);
	free(kv->heap);
	free(kv->slots);
}

uint64_t
kv_root(uint64_t identity, uint64_t ns)
{
	uint64_t in[2] = { identity, ns };

	return XXH3_64bits(in, sizeof in);
}

uint64_t
kv_chain(uint64_t prev, const int32_t *tokens)
{
	return XXH3_64bits_withSeed(tokens, KV_BLOCK_TOKENS * sizeof *tokens, prev);
}

uint64_t
kv_chain_n(uint64_t key, const int32_t *tokens, int32_t n)
{
	for (int32_t i = 0; i < n; i++)
		key = kv_chain(key, tokens + (size_t)i * KV_BLOCK_TOKENS);
	return key;
}

/* ---- the idle heap ---- */

/* 1 if block a leaves before block b. */
static int
heap_before(const struct kv_pool *kv, int32_t a, int32_t b)
{
	const struct kv_block *x = &kv->b[a], *y = &kv->b[b];

	return x->tick < y->tick || (x->tick == y->tick && x->depth > y->depth);
}

/* Puts block b at heap position i. */
static void
heap_set(struct kv_pool *kv, int32_t i, int32_t b)
{
	kv->heap[i] = b;
	kv->b[b].heap_pos = i;
}

/* Moves the entry at i up or down until the heap is in order again. */
static void
heap_fix(struct kv_pool *kv, int32_t i)
{
	int32_t b = kv->heap[i], c;

	while (i > 0 && heap_before(kv, b, kv->heap[(i - 1) / 2])) {
		heap_set(kv, i, kv->heap[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	for (;;) {
		c = 2 * i + 1;
		if (c >= kv->n_idle)
			break;
		if (c + 1 < kv->n_idle && heap_before(kv, kv->heap[c + 1], kv->heap[c]))
			c++;
		if (!heap_before(kv, kv->heap[c], b))
			break;
		heap_set(kv, i, kv->heap[c]);
		i = c;
	}
	heap_set(kv, i, b);
}

static void
heap_push(struct kv_pool *kv, int32_t b)
{
	heap_set(kv, kv->n_idle++, b);
	heap_fix(kv, kv->n_idle - 1);
}

static void
heap_remove(struct kv_pool *kv, int32_t b)
{
	int32_t i = kv->b[b].heap_pos, last = kv->heap[--kv->n_idle];

	kv->b[b].heap_pos = -1;
	if (i == kv->n_idle)
		return;
	heap_set(kv, i, last);
	heap_fix(kv, i);
}

/* ---- the table ---- */

/* The slot of key's probe sequence that holds block b, or the empty slot ending it. */
static uint32_t
table_slot(const struct kv_pool *kv, uint64_t key, int32_t b)
{
	uint32_t i = (uint32_t)key & kv->mask;

	while (kv->slots[i] != KV_NONE && kv->slots[i] != b)
		i = (i + 1) & kv->mask;
	return i;
}

static void
table_insert(struct kv_pool *kv, int32_t b)
{
	kv->slots[table_slot(kv, kv->b[b].key, KV_NONE)] = b;
	kv->b[b].cached = 1;
	kv->n_cached++;
	if (kv->b[b].parent != KV_NONE)
		kv->b[kv->b[b].parent].n_children++;
}

/* Takes block b out of the table, moving back the entries probed past it. */
static void
table_remove(struct kv_pool *kv, int32_t b)
{
	uint32_t i = table_slot(kv, kv->b[b].key, b), j = i, home;

	for (;;) {
		j = (j + 1) & kv->mask;
		if (kv->slots[j] == KV_NONE)
			break;
		home = (uint32_t)kv->b[kv->slots[j]].key & kv->mask;
		/* the entry at j may fill the hole at i unless its home lies in (i, j] */
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			kv->slots[i] = kv->slots[j];
			i = j;
		}
	}
	kv->slots[i] = KV_NONE;
	kv->b[b].cached = 0;
	kv->n_cached--;
	if (kv->b[b].parent != KV_NONE)
		kv->b[kv->b[b].parent].n_children--;
}

int32_t
kv_find(const struct kv_pool *kv, uint64_t root, uint64_t key, int32_t parent, int32_t depth,
    const int32_t *tokens)
{
	uint32_t i;
	int32_t b;

	for (i = (uint32_t)key & kv->mask; (b = kv->slots[i]) != KV_NONE; i = (i + 1) & kv->mask) {
		const struct kv_block *k = &kv->b[b];

		if (k->key == key && k->root == root && k->parent == parent && k->depth == depth &&
		    memcmp(k->tokens, tokens, sizeof k->tokens) == 0)
			return b;
	}
	return KV_NONE;
}

int32_t
kv_publish(struct kv_pool *kv, int32_t block, uint64_t root, uint64_t key, int32_t parent, int32_t depth,
    const int32_t *tokens)
{
	int32_t have = kv_find(kv, root, key, parent, depth, tokens);
	struct kv_block *k = &kv->b[block];

	if (k->cached)
		fatal("kv_publish: block %d is cached already", block);
	if (have != KV_NONE) {
		kv_ref(kv, have);
		kv_release(kv, &block, 1);
		return have;
	}
	k->key = key;
	k->root = root;
	k->parent = parent;
	k->depth = depth;
	memcpy(k->tokens, tokens, sizeof k->tokens);
	table_insert(kv, block);
	return block;
}

/* ---- holders ---- */

int32_t
kv_alloc(struct kv_pool *kv)
{
	int32_t b;

	if (kv->n_free > 0) {
		b = kv->free_list[--kv->n_free];
	} else if (kv->n_idle > 0) {
		b = kv->heap[0];
		if (kv->b[b].n_children != 0)
			fatal("kv_alloc: idle block %d still has %d cached children", b, kv->b[b].n_children);
		if (kv->evict != NULL)
			kv->evict(kv->evict_arg, kv, b);
		heap_remove(kv, b);
		table_remove(kv, b);
		kv->evictions++;
	} else {
		return -1;
	}
	kv->b[b].ref = 1;
	return b;
}

void
kv_ref(struct kv_pool *kv, int32_t block)
{
	struct kv_block *k = &kv->b[block];

	if (k->ref == UINT16_MAX || (k->ref == 0 && !k->cached))
		fatal("kv_ref: block %d has %u holders", block, k->ref);
	if (k->ref++ == 0)
		heap_remove(kv, block);
}

void
kv_release(struct kv_pool *kv, const int32_t *blocks, int32_t n)
{
	uint64_t tick = ++kv->tick;
	int32_t i;

	for (i = 0; i < n; i++) {
		struct kv_block *k = &kv->b[blocks[i]];

		if (k->ref == 0)
			fatal("kv_release: block %d is not held", blocks[i]);
		if (--k->ref > 0)
			continue;
		k->tick = tick;
		if (k->cached)
			heap_push(kv, blocks[i]);
		else
			kv->free_list[kv->n_free++] = blocks[i];
	}
}

int32_t
kv_available(const struct kv_pool *kv)
{
	return kv->n_free + kv->n_idle;
}
