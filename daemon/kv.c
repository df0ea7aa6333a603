/* kv.c: reference-counted KV blocks over a free stack. */
#include "config.h"
#include "kv.h"
#include "util.h"

#include <stdlib.h>

void
kv_init(struct kv_pool *kv, int32_t n_blocks)
{
	int32_t i;

	kv->n_blocks = n_blocks;
	kv->n_free = n_blocks;
	kv->free_list = xmalloc((size_t)n_blocks * sizeof *kv->free_list);
	kv->ref = xcalloc((size_t)n_blocks, sizeof *kv->ref);
	/* low ids on top, so a fresh pool hands out 0, 1, 2... */
	for (i = 0; i < n_blocks; i++)
		kv->free_list[i] = n_blocks - 1 - i;
}

void
kv_destroy(struct kv_pool *kv)
{
	free(kv->free_list);
	free(kv->ref);
}

int32_t
kv_alloc(struct kv_pool *kv)
{
	int32_t b;

	if (kv->n_free == 0)
		return -1;
	b = kv->free_list[--kv->n_free];
	kv->ref[b] = 1;
	return b;
}

void
kv_ref(struct kv_pool *kv, int32_t block)
{
	if (kv->ref[block] == 0 || kv->ref[block] == UINT16_MAX)
		fatal("kv_ref: block %d has %u holders", block, kv->ref[block]);
	kv->ref[block]++;
}

void
kv_unref(struct kv_pool *kv, int32_t block)
{
	if (kv->ref[block] == 0)
		fatal("kv_unref: block %d is already free", block);
	if (--kv->ref[block] == 0)
		kv->free_list[kv->n_free++] = block;
}
