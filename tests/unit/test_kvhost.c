/*
 * test_kvhost.c: the host-memory tier (daemon/kvhost.c): a block comes back
 * only to a lookup that matches it whole, the oldest leave when the budget
 * is full (their buffers serving the new blocks), a block taken out stays
 * counted until it is put back or released, released buffers are spares
 * for the next, a budget of 0 keeps nothing, and nothing leaks.
 */
#include "config.h"
#include "kv_tokens.h"
#include "kvhost.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* The tier's allocator: counts what is out, so that the tests see buffers reused and none leaked. */
static int live, made;

static void *
count_alloc(size_t bytes)
{
	live++, made++;
	return xmalloc(bytes);
}

static void
count_free(void *p)
{
	live--;
	free(p);
}

/* A block of 100 bytes, all v, under key, after prev, in a buffer of h's (NULL: none to be had). */
static struct kvhost_block *
block(struct kvhost *h, uint64_t key, uint64_t prev, int v)
{
	void *data = kvhost_buffer(h, 100, count_alloc, count_free);
	struct kvhost_block *b;

	if (data == NULL)
		return NULL;
	b = xcalloc(1, sizeof *b);

	b->key = key;
	b->prev = prev;
	b->root = 7;
	b->depth = 1;
	memcpy(b->tokens, toks(v), sizeof b->tokens);
	b->bytes = 100;
	b->data = data;
	b->free_fn = count_free;
	memset(b->data, v, 100);
	return b;
}

static void
test_take_matches_everything(void **state)
{
	struct kvhost h;
	struct kvhost_block *b;

	live = made = 0;
	kvhost_init(&h, 1000);
	kvhost_put(&h, block(&h, 5, 4, 1));
	assert_int_equal(h.used, 100);
	assert_null(kvhost_take(&h, 5, 3, 7, 1, toks(1)));  /* another parent */
	assert_null(kvhost_take(&h, 5, 4, 8, 1, toks(1)));  /* another root */
	assert_null(kvhost_take(&h, 5, 4, 7, 2, toks(1)));  /* another depth */
	assert_null(kvhost_take(&h, 5, 4, 7, 1, toks(2)));  /* other tokens */
	b = kvhost_take(&h, 5, 4, 7, 1, toks(1));
	assert_non_null(b);
	assert_int_equal(((uint8_t *)b->data)[99], 1);
	assert_int_equal(h.used, 100);                      /* counted until released */
	assert_null(kvhost_take(&h, 5, 4, 7, 1, toks(1)));  /* taken out */
	kvhost_release(&h, b);
	assert_int_equal(h.used, 0);
	assert_int_equal(h.spare_bytes, 100);
	kvhost_destroy(&h);
	assert_int_equal(live, 0);
}

static void
test_budget_drops_oldest(void **state)
{
	struct kvhost h;
	struct kvhost_block *b;
	int i;

	live = made = 0;
	kvhost_init(&h, 350);
	for (i = 0; i < 5; i++)
		kvhost_put(&h, block(&h, (uint64_t)i, 0, i * 20));
	assert_int_equal(h.used, 300);
	assert_int_equal(h.n, 3);
	assert_int_equal(h.dropped, 2);
	assert_int_equal(made, 3);                          /* the oldest's buffers went to the newest */
	assert_null(kvhost_take(&h, 0, 0, 7, 1, toks(0)));
	assert_null(kvhost_take(&h, 1, 0, 7, 1, toks(20)));
	for (i = 2; i < 5; i++) {
		assert_non_null(b = kvhost_take(&h, (uint64_t)i, 0, 7, 1, toks(i * 20)));
		assert_int_equal(((uint8_t *)b->data)[0], i * 20);
		kvhost_release(&h, b);
	}
	/* the same key again replaces the block; spare buffers serve both */
	kvhost_put(&h, block(&h, 9, 0, 1));
	kvhost_put(&h, block(&h, 9, 0, 1));
	assert_int_equal(h.n, 1);
	assert_int_equal(made, 3);
	assert_int_equal(h.used + h.spare_bytes, 300);
	kvhost_destroy(&h);
	assert_int_equal(live, 0);
}

static void
test_put_back_and_sizes(void **state)
{
	struct kvhost h;
	struct kvhost_block *b;
	void *big;

	live = made = 0;
	kvhost_init(&h, 250);
	kvhost_put(&h, block(&h, 1, 0, 1));
	kvhost_put(&h, block(&h, 2, 0, 2));
	/* a taken block put back is stored again, its bytes counted once */
	assert_non_null(b = kvhost_take(&h, 1, 0, 7, 1, toks(1)));
	kvhost_put(&h, b);
	assert_int_equal(h.used, 200);
	assert_int_equal(h.n, 2);
	/* a buffer of another size: spares and the oldest make room, the budget holds */
	big = kvhost_buffer(&h, 200, count_alloc, count_free);
	assert_non_null(big);
	assert_true(h.used + h.spare_bytes <= 250);
	assert_int_equal(h.n, 0);
	assert_int_equal(h.dropped, 2);
	/* nothing the budget cannot hold while that one is out */
	assert_null(kvhost_buffer(&h, 100, count_alloc, count_free));
	b = xcalloc(1, sizeof *b);
	b->data = big, b->bytes = 200, b->free_fn = count_free;
	kvhost_release(&h, b);                              /* a buffer never filled, given back */
	assert_int_equal(h.used, 0);
	assert_int_equal(h.spare_bytes, 200);
	kvhost_destroy(&h);
	assert_int_equal(live, 0);
}

static void
test_reserve(void **state)
{
	struct kvhost h;
	struct kvhost_block *b;
	void *data;

	live = made = 0;
	kvhost_init(&h, 450);
	kvhost_put(&h, block(&h, 1, 0, 1));
	for (int i = 0; i < 5; i++)
		kvhost_reserve(&h, 100, 2, count_alloc, count_free);
	assert_int_equal(h.spare_bytes, 200);               /* two, however often asked, counted while made */
	kvhost_pins_wait(&h);
	assert_int_equal(made, 3);
	assert_int_equal(h.spare_bytes, 200);
	kvhost_put(&h, block(&h, 2, 0, 2));                 /* takes a spare */
	assert_int_equal(made, 3);
	assert_int_equal(h.spare_bytes, 100);
	kvhost_reserve(&h, 100, 3, count_alloc, count_free);
	kvhost_pins_wait(&h);
	assert_int_equal(made, 4);
	assert_int_equal(h.spare_bytes, 200);               /* 200 used + 200 spare: 50 left, no drop */
	assert_int_equal(h.n, 2);
	kvhost_reserve(&h, 60, 1, count_alloc, count_free);
	assert_int_equal(h.spare_bytes, 200);               /* 60 more would not fit: none made */
	data = kvhost_buffer(&h, 60, count_alloc, count_free);
	assert_non_null(data);                              /* a buffer of another size drops spares first */
	assert_int_equal(h.n, 2);
	b = xcalloc(1, sizeof *b);
	b->data = data, b->bytes = 60, b->free_fn = count_free;
	kvhost_release(&h, b);
	kvhost_destroy(&h);
	assert_int_equal(live, 0);
}

static void
test_many_blocks_and_no_budget(void **state)
{
	struct kvhost h;
	struct kvhost_block *b;
	int i;

	live = made = 0;
	kvhost_init(&h, 100 * 1000);
	for (i = 0; i < 1000; i++)  /* past the first table size: it grows */
		kvhost_put(&h, block(&h, (uint64_t)i * 0x10000, 0, i));
	for (i = 0; i < 1000; i += 37) {
		assert_non_null(b = kvhost_take(&h, (uint64_t)i * 0x10000, 0, 7, 1, toks(i)));
		kvhost_release(&h, b);
	}
	kvhost_destroy(&h);
	assert_int_equal(live, 0);
	kvhost_init(&h, 0);
	assert_false(kvhost_fits(&h, 100));
	assert_null(block(&h, 1, 0, 1));
	assert_int_equal(h.n, 0);
	assert_int_equal(made, 1000);
	kvhost_destroy(&h);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_take_matches_everything),
		cmocka_unit_test(test_budget_drops_oldest),
		cmocka_unit_test(test_put_back_and_sizes),
		cmocka_unit_test(test_reserve),
		cmocka_unit_test(test_many_blocks_and_no_budget),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
