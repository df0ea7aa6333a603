/*
 * kv.h: the KV cache's blocks (the data lives in the backend) and the
 * prefix cache over them.
 *
 * Blocks are reference-counted: sequences with a common prefix hold the
 * same blocks. A full block can also be *cached*: entered in a table under
 * the chained hash of every token up to its end (kv_chain), so that any
 * later sequence whose tokens start the same way finds it (kv_find). A
 * cached block that nobody holds is *idle*: it keeps its K/V and is reused
 * only when no free block is left, least recently released first. Whoever
 * holds a cached block holds its whole chain and releases it in one call
 * (kv_release), so a parent is never released before its children: the
 * order takes the leaves of the prefix tree first and a cached block's
 * parent is always cached too. Cached blocks are never written again: a sequence that must
 * write into one copies it first (copy on write, engine.c).
 *
 * A lookup checks more than the hash: the block's own tokens, its depth, its
 * parent block and, at depth 0, the chain's root, so two prefixes that hash
 * alike are still told apart.
 */
#ifndef RESIDENT_KV_H
#define RESIDENT_KV_H

#include <stdint.h>

#include "kernels.h"

#define KV_NONE (-1)

struct kv_block {
	uint64_t key;        /* chained hash of the prefix the block ends (when cached) */
	uint64_t root;       /* the chain's seed: model, numerics, user (kv_root) */
	uint64_t tick;       /* when it was last released */
	int32_t parent;      /* the block of the 16 tokens before, or KV_NONE at depth 0 */
	int32_t depth;       /* position in its chain: tokens depth*16 .. depth*16+15 */
	int32_t n_children;  /* cached blocks whose parent it is */
	int32_t heap_pos;    /* its place in the idle heap, or -1 */
	uint16_t ref;        /* holders */
	uint8_t cached;      /* in the table */
	int32_t tokens[KV_BLOCK_TOKENS];
};

/*
 * evict, if set, is called with an idle cached block just before it is
 * taken for reuse (kv_alloc), while its K/V and metadata are still there:
 * the engine copies it to the host tier.
 */
struct kv_pool {
	int32_t n_blocks;
	int32_t n_free;
	int32_t n_cached;      /* blocks in the table, held or idle */
	int32_t n_idle;        /* cached blocks no one holds */
	int32_t *free_list;    /* a stack of free block ids */
	struct kv_block *b;
	int32_t *slots;        /* the table: open addressing, key -> block id or KV_NONE */
	uint32_t mask;
	int32_t *heap;         /* idle blocks, least recently released (then deepest) first */
	uint64_t tick;
	uint64_t evictions;    /* idle blocks taken for reuse */
	void (*evict)(void *arg, const struct kv_pool *kv, int32_t block);
	void *evict_arg;
};

void kv_init(struct kv_pool *kv, int32_t n_blocks);
void kv_destroy(struct kv_pool *kv);

/* The seed of a chain: a hash of what makes K/V comparable (model, numerics) and the user. */
uint64_t kv_root(uint64_t identity, uint64_t ns);
/* The key of a block: its tokens chained onto the key of the block before (or the root). */
uint64_t kv_chain(uint64_t prev, const int32_t *tokens);
/* The key of the n-th block of tokens (n blocks chained onto key; n 0: key itself). */
uint64_t kv_chain_n(uint64_t key, const int32_t *tokens, int32_t n);

/*
 * A block with one holder: a free one, else the least recently released
 * idle one (evict is told first, then it leaves the table). -1 when every
 * block is held.
 */
int32_t kv_alloc(struct kv_pool *kv);
/* One more holder of a block (an idle one stops being idle). */
void kv_ref(struct kv_pool *kv, int32_t block);
/*
 * One holder fewer for each of n blocks, all at the same moment: a block
 * left without holders becomes idle if cached, free if not.
 */
void kv_release(struct kv_pool *kv, const int32_t *blocks, int32_t n);
/* Blocks that kv_alloc can hand out: free and idle ones. */
int32_t kv_available(const struct kv_pool *kv);

/*
 * The cached block that holds tokens at depth in the chain of root, after
 * the block parent (KV_NONE at depth 0), under key; KV_NONE if there is
 * none. It takes no hold.
 */
int32_t kv_find(const struct kv_pool *kv, uint64_t root, uint64_t key, int32_t parent, int32_t depth,
    const int32_t *tokens);
/*
 * Enters a full block the caller holds into the table. If an equal block
 * is cached already, the caller's hold moves to that one and it is
 * returned (the caller's block is released); otherwise block is returned,
 * cached. The caller must hold parent.
 */
int32_t kv_publish(struct kv_pool *kv, int32_t block, uint64_t root, uint64_t key, int32_t parent,
    int32_t depth, const int32_t *tokens);

#endif
