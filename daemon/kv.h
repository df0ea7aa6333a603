/* kv.h: the KV cache's block allocator (the blocks live in the backend). */
#ifndef RESIDENT_KV_H
#define RESIDENT_KV_H

#include <stdint.h>

/*
 * Blocks are reference-counted so that sequences with a common prefix can
 * share the blocks that hold it; a block returns to the free list when its
 * last holder lets go.
 */
struct kv_pool {
	int32_t n_blocks;
	int32_t n_free;
	int32_t *free_list;  /* a stack of free block ids */
	uint16_t *ref;       /* holders of each block */
};

void kv_init(struct kv_pool *kv, int32_t n_blocks);
void kv_destroy(struct kv_pool *kv);
/* A free block with one holder, or -1 when the pool is full. */
int32_t kv_alloc(struct kv_pool *kv);
/* One more holder of a block. */
void kv_ref(struct kv_pool *kv, int32_t block);
/* One holder fewer; the block is free again when none is left. */
void kv_unref(struct kv_pool *kv, int32_t block);

#endif
