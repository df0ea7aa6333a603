/*
 * test_kv.c: the block pool and the prefix table (daemon/kv.c): chained
 * keys, lookups that check more than the key, holders, idle blocks reused
 * least recently released and leaves first, the eviction hook, and a table
 * that stays consistent through colliding keys and removals.
 */
#include "config.h"
#include "kv.h"
#include "kv_tokens.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

/* Allocates a block and publishes it as the next of a chain. */
static int32_t
add(struct kv_pool *kv, uint64_t root, uint64_t key, int32_t parent, int32_t depth, int32_t v)
{
	int32_t b = kv_alloc(kv);

	assert_true(b >= 0);
	return kv_publish(kv, b, root, key, parent, depth, toks(v));
}

static void
test_keys_chain(void **state)
{
	uint64_t r1 = kv_root(7, 1), r2 = kv_root(7, 2), r3 = kv_root(8, 1);
	int32_t a[KV_BLOCK_TOKENS], b[KV_BLOCK_TOKENS];

	assert_true(r1 != r2 && r1 != r3 && r2 != r3);
	assert_int_equal(kv_root(7, 1), r1);
	memcpy(a, toks(10), sizeof a);
	memcpy(b, toks(10), sizeof b);
	assert_int_equal(kv_chain(r1, a), kv_chain(r1, b));
	/* the same block after another prefix, or with one token changed, is another key */
	assert_true(kv_chain(r1, a) != kv_chain(r2, a));
	assert_true(kv_chain(kv_chain(r1, a), a) != kv_chain(r1, a));
	b[15]++;
	assert_true(kv_chain(r1, a) != kv_chain(r1, b));
}

static void
test_find_checks_everything(void **state)
{
	struct kv_pool kv;
	uint64_t root = kv_root(1, 1), k0 = kv_chain(root, toks(0)), k1 = kv_chain(k0, toks(16));
	int32_t b0, b1;

	kv_init(&kv, 8);
	b0 = add(&kv, root, k0, KV_NONE, 0, 0);
	b1 = add(&kv, root, k1, b0, 1, 16);
	assert_int_equal(kv.n_cached, 2);
	assert_int_equal(kv_find(&kv, root, k0, KV_NONE, 0, toks(0)), b0);
	assert_int_equal(kv_find(&kv, root, k1, b0, 1, toks(16)), b1);
	/* the right key with anything else wrong finds nothing */
	assert_int_equal(kv_find(&kv, root, k1, b0, 1, toks(17)), KV_NONE);
	assert_int_equal(kv_find(&kv, root, k1, b1, 1, toks(16)), KV_NONE);
	assert_int_equal(kv_find(&kv, root, k1, b0, 2, toks(16)), KV_NONE);
	assert_int_equal(kv_find(&kv, kv_root(1, 2), k0, KV_NONE, 0, toks(0)), KV_NONE);
	assert_int_equal(kv_find(&kv, root, k0 + 1, KV_NONE, 0, toks(0)), KV_NONE);
	kv_destroy(&kv);
}

static void
test_holders_and_sharing(void **state)
{
	struct kv_pool kv;
	uint64_t root = kv_root(1, 1), k0 = kv_chain(root, toks(0));
	int32_t b0, dup, got, plain;

	kv_init(&kv, 4);
	b0 = add(&kv, root, k0, KV_NONE, 0, 0);
	/* a second sequence that computed the same block gets the cached one */
	dup = kv_alloc(&kv);
	got = kv_publish(&kv, dup, root, k0, KV_NONE, 0, toks(0));
	assert_int_equal(got, b0);
	assert_int_equal(kv.b[b0].ref, 2);
	assert_int_equal(kv.n_free, 3); /* the duplicate went back */
	/* released by both, it stays cached, idle, still found */
	kv_release(&kv, &b0, 1);
	kv_release(&kv, &b0, 1);
	assert_int_equal(kv.n_idle, 1);
	assert_int_equal(kv_available(&kv), 4);
	assert_int_equal(kv_find(&kv, root, k0, KV_NONE, 0, toks(0)), b0);
	kv_ref(&kv, b0);
	assert_int_equal(kv.n_idle, 0);
	assert_int_equal(kv_available(&kv), 3);
	kv_release(&kv, &b0, 1);
	/* a block never published is free again when released */
	plain = kv_alloc(&kv);
	assert_int_equal(kv.n_free, 2);
	kv_release(&kv, &plain, 1);
	assert_int_equal(kv.n_free, 3);
	kv_destroy(&kv);
}

struct evicted {
	int32_t blocks[16];
	uint64_t keys[16];
	int n;
};

static void
on_evict(void *arg, const struct kv_pool *kv, int32_t b)
{
	struct evicted *ev = arg;

	/* told while the block is still cached, metadata intact */
	assert_true(kv->b[b].cached);
	ev->keys[ev->n] = kv->b[b].key;
	ev->blocks[ev->n++] = b;
}

static void
test_lru_leaves_first(void **state)
{
	struct kv_pool kv;
	struct evicted ev = { .n = 0 };
	uint64_t root = kv_root(1, 1), ka0, ka1, ka2, kb1;
	int32_t a0, a1, a2, b1, chain_a[3], chain_b[2], x, i;

	kv_init(&kv, 5);
	kv.evict = on_evict;
	kv.evict_arg = &ev;
	/* two chains sharing their first block: a0 a1 a2 and a0 b1 */
	ka0 = kv_chain(root, toks(0));
	ka1 = kv_chain(ka0, toks(16));
	ka2 = kv_chain(ka1, toks(32));
	kb1 = kv_chain(ka0, toks(100));
	a0 = add(&kv, root, ka0, KV_NONE, 0, 0);
	a1 = add(&kv, root, ka1, a0, 1, 16);
	a2 = add(&kv, root, ka2, a1, 2, 32);
	kv_ref(&kv, a0);
	b1 = add(&kv, root, kb1, a0, 1, 100);
	assert_int_equal(kv.b[a0].n_children, 2);
	/* chain a released first, then chain b: a's leaf, then a1; a0 only after b1 */
	chain_a[0] = a0, chain_a[1] = a1, chain_a[2] = a2;
	chain_b[0] = a0, chain_b[1] = b1;
	kv_release(&kv, chain_a, 3);
	kv_release(&kv, chain_b, 2);
	assert_int_equal(kv.n_idle, 4);
	assert_int_equal(kv.n_free, 1);
	x = kv_alloc(&kv); /* the free one first */
	assert_int_equal(ev.n, 0);
	for (i = 0; i < 4; i++)
		assert_true(kv_alloc(&kv) >= 0);
	assert_int_equal(ev.n, 4);
	assert_int_equal(ev.blocks[0], a2);
	assert_int_equal(ev.blocks[1], a1);
	assert_int_equal(ev.blocks[2], b1);
	assert_int_equal(ev.blocks[3], a0);
	assert_int_equal(ev.keys[0], ka2);
	assert_int_equal(kv.n_cached, 0);
	assert_int_equal(kv.evictions, 4);
	assert_int_equal(kv_alloc(&kv), -1); /* all held now */
	(void)x;
	kv_destroy(&kv);
}

static void
test_touch_moves_to_the_back(void **state)
{
	struct kv_pool kv;
	struct evicted ev = { .n = 0 };
	uint64_t r = kv_root(1, 1);
	int32_t p = KV_NONE, b[3], i, hit;

	kv_init(&kv, 3);
	kv.evict = on_evict;
	kv.evict_arg = &ev;
	/* three one-block chains released in order 0, 1, 2 */
	for (i = 0; i < 3; i++) {
		b[i] = add(&kv, r, kv_chain(r, toks(i * 100)), p, 0, i * 100);
		kv_release(&kv, &b[i], 1);
	}
	/* block 0 used again: block 1 is now the least recently used */
	hit = kv_find(&kv, r, kv_chain(r, toks(0)), KV_NONE, 0, toks(0));
	assert_int_equal(hit, b[0]);
	kv_ref(&kv, hit);
	kv_release(&kv, &hit, 1);
	kv_alloc(&kv);
	kv_alloc(&kv);
	assert_int_equal(ev.blocks[0], b[1]);
	assert_int_equal(ev.blocks[1], b[2]);
	kv_destroy(&kv);
}

static void
test_table_through_collisions(void **state)
{
	enum { N = 64 };
	struct kv_pool kv;
	uint64_t r = kv_root(1, 1), keys[N];
	int32_t b[N], i, j;

	kv_init(&kv, N);
	/* keys that all land in a few home slots: long probe runs, wrapping at the end */
	for (i = 0; i < N; i++) {
		keys[i] = (uint64_t)(i % 3) * 0x1000 + kv.mask - (uint64_t)(i % 2) + ((uint64_t)i << 40);
		b[i] = add(&kv, r, keys[i], KV_NONE, 0, i * 1000);
		kv_release(&kv, &b[i], 1);
	}
	/* the older half taken for reuse: the rest must still be found past the holes */
	for (i = 0; i < N / 2; i++)
		assert_true(kv_alloc(&kv) >= 0);
	for (i = 0, j = 0; i < N; i++) {
		int32_t f = kv_find(&kv, r, keys[i], KV_NONE, 0, toks(i * 1000));

		if (i < N / 2) {
			assert_int_equal(f, KV_NONE);
		} else {
			assert_int_equal(f, b[i]);
			j++;
		}
	}
	assert_int_equal(j, N / 2);
	assert_int_equal(kv.n_cached, N / 2);
	kv_destroy(&kv);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keys_chain),
		cmocka_unit_test(test_find_checks_everything),
		cmocka_unit_test(test_holders_and_sharing),
		cmocka_unit_test(test_lru_leaves_first),
		cmocka_unit_test(test_touch_moves_to_the_back),
		cmocka_unit_test(test_table_through_collisions),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
