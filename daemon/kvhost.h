/*
 * kvhost.h: the host-memory tier of the KV cache. Blocks that the device
 * pool gives up (kv.h: idle cached blocks taken for reuse) are copied here,
 * under the same chained key, until a byte budget is full; then the least
 * recently stored leave. A lookup takes a block out (it goes back to the
 * device pool), checking, as kv_find does, its tokens, depth, root and the
 * key of the block before it.
 *
 * One tier serves every model (a key's root holds the model's identity).
 * Used from the engine thread only.
 */
#ifndef RESIDENT_KVHOST_H
#define RESIDENT_KVHOST_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

struct kvhost_block {
	uint64_t key, prev, root;   /* prev: the key of the block before (the root at depth 0) */
	int32_t depth;
	int32_t tokens[KV_BLOCK_TOKENS];
	size_t bytes;
	void *data;                 /* the block's K/V as the backend's kv_read wrote them */
	struct kvhost_block *older, *newer, *next_in_slot;
};

struct kvhost {
	uint64_t budget, used;
	struct kvhost_block *oldest, *newest;
	struct kvhost_block **slots;
	uint32_t mask;
	int64_t n;
	uint64_t dropped;           /* blocks that left for lack of room */
};

void kvhost_init(struct kvhost *h, uint64_t budget);
/* Frees every block. */
void kvhost_destroy(struct kvhost *h);
/* Whether a block of this many bytes may be stored at all (the budget is not 0 and holds it). */
int kvhost_fits(const struct kvhost *h, size_t bytes);
/*
 * Stores a block (b's data is malloc'd and becomes the tier's), making room
 * by dropping the oldest. A block already there under the same key is
 * replaced.
 */
void kvhost_put(struct kvhost *h, struct kvhost_block *b);
/* Takes out the block that matches all of these, or returns NULL; the caller frees it (kvhost_free). */
struct kvhost_block *kvhost_take(struct kvhost *h, uint64_t key, uint64_t prev, uint64_t root, int32_t depth,
    const int32_t *tokens);
void kvhost_free(struct kvhost_block *b);

#endif
