/*
 * kvhost.h: the host-memory tier of the KV cache. Blocks that the device
 * pool gives up (kv.h: idle cached blocks taken for reuse) are copied here,
 * under the same chained key, until a byte budget is full; then the least
 * recently stored leave. A lookup takes a block out (it goes back to the
 * device pool), checking, as kv_find does, its tokens, depth, root and the
 * key of the block before it.
 *
 * Blocks live in the backends' host memory (host_alloc: pinned on CUDA, so
 * that a resumed conversation's blocks cross the bus in one copy at its
 * speed). Pinning costs the driver time, so buffers are reused: the oldest
 * block's for the newest, and a taken block's kept as a spare within the
 * budget.
 *
 * One tier serves every model (a key's root holds the model's identity).
 * Used from the engine thread only.
 */
#ifndef RESIDENT_KVHOST_H
#define RESIDENT_KVHOST_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "worker.h"

struct kvhost_block {
	uint64_t key, prev, root;   /* prev: the key of the block before (the root at depth 0) */
	int32_t depth;
	int32_t tokens[KV_BLOCK_TOKENS];
	size_t bytes;
	void *data;                 /* the block's K/V as the backend's kv_move wrote them (kvhost_buffer's) */
	void (*free_fn)(void *);    /* gives data back (the backend's host_free) */
	struct kvhost_block *older, *newer, *next_in_slot;
};

/* A buffer no block holds, kept for the next block of its size and kind (pinning costs the driver time). */
struct kvhost_spare {
	void *data;
	size_t bytes;
	void (*free_fn)(void *);
	struct kvhost_spare *next;
};

/* A spare buffer being made on the pinning thread (kvhost_reserve). */
struct kvhost_pin {
	struct work w;
	size_t bytes;
	void *(*alloc)(size_t);
	void (*free_fn)(void *);
	void *data;                 /* NULL if alloc failed */
};

struct kvhost {
	uint64_t budget;
	uint64_t used;              /* bytes of the blocks stored, taken out or being filled */
	uint64_t spare_bytes;       /* of spare and of the pins under way: used + spare_bytes <= budget */
	struct kvhost_block *oldest, *newest;
	struct kvhost_block **slots;
	uint32_t mask;
	int64_t n;
	uint64_t dropped;           /* blocks that left for lack of room */
	struct kvhost_spare *spare;
	/*
	 * Where spare buffers are made (pinning costs the driver about 1 ms a
	 * 2 MiB buffer), so that the engine thread does not wait for it;
	 * started by the first kvhost_reserve.
	 */
	struct worker pinner;
	int n_pinning;              /* pins submitted, not yet taken back */
};

void kvhost_init(struct kvhost *h, uint64_t budget);
/* Frees every block and spare buffer (the pinning thread stopped first). */
void kvhost_destroy(struct kvhost *h);
/* Whether a block of this many bytes may be stored at all (the budget is not 0 and holds it). */
int kvhost_fits(const struct kvhost *h, size_t bytes);
/*
 * A buffer of bytes for a block, counted as used from now on: a spare one
 * of the same size and free_fn, else the oldest block's if it is one (the
 * block leaves), else one from alloc once the oldest blocks have made
 * room. NULL when the budget cannot hold it or alloc fails.
 */
void *kvhost_buffer(struct kvhost *h, size_t bytes, void *(*alloc)(size_t), void (*free_fn)(void *));
/*
 * Has spare buffers of this size and kind made, on a thread of the tier's,
 * until there are n (with those under way) or the budget has no room left
 * without dropping a block, so that the blocks the pool gives up, and
 * those a run that comes back pushes out, find buffers ready.
 */
void kvhost_reserve(struct kvhost *h, size_t bytes, int n, void *(*alloc)(size_t), void (*free_fn)(void *));
/* Waits for the spare buffers being made, and takes them. */
void kvhost_pins_wait(struct kvhost *h);
/*
 * Stores a block whose data, bytes and free_fn came from kvhost_buffer
 * (or kvhost_take). A block already there under the same key is replaced.
 */
void kvhost_put(struct kvhost *h, struct kvhost_block *b);
/*
 * Takes out the block that matches all of these, or returns NULL. It
 * stays counted as used until the caller puts it back (kvhost_put) or
 * releases it.
 */
struct kvhost_block *kvhost_take(struct kvhost *h, uint64_t key, uint64_t prev, uint64_t root, int32_t depth,
    const int32_t *tokens);
/* Frees a block taken out or never put; its buffer stays as a spare where the budget allows. */
void kvhost_release(struct kvhost *h, struct kvhost_block *b);

#endif
