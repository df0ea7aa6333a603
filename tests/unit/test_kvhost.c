/*
 * test_kvhost.c: the host-memory tier (daemon/kvhost.c): a block comes back
 * only to a lookup that matches it whole, the oldest leave when the budget
 * is full, a budget of 0 keeps nothing.
 */
#include "config.h"
#include "kv_tokens.h"
#include "kvhost.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

/* A block of 100 bytes, all v, under key, after prev. */
static struct kvhost_block *
block(uint64_t key, uint64_t prev, int v)
{
	struct kvhost_block *b = xcalloc(1, sizeof *b);

	b->key = key;
	b->prev = prev;
	b->root = 7;
	b->depth = 1;
	memcpy(b->tokens, toks(v), sizeof b->tokens);
	b->bytes = 100;
	b->data = xmalloc(100);
	memset(b->data, v, 100);
	return b;
}

static void
test_take_matches_everything(void **state)
{
	struct kvhost h;
	struct kvhost_block *b;

	kvhost_init(&h, 1000);
	kvhost_put(&h, block(5, 4, 1));
	assert_int_equal(h.used, 100);
	assert_null(kvhost_take(&h, 5, 3, 7, 1, toks(1)));  /* another parent */
	assert_null(kvhost_take(&h, 5, 4, 8, 1, toks(1)));  /* another root */
	assert_null(kvhost_take(&h, 5, 4, 7, 2, toks(1)));  /* another depth */
	assert_null(kvhost_take(&h, 5, 4, 7, 1, toks(2)));  /* other tokens */
	b = kvhost_take(&h, 5, 4, 7, 1, toks(1));
	assert_non_null(b);
	assert_int_equal(((uint8_t *)b->data)[99], 1);
	assert_int_equal(h.used, 0);
	assert_null(kvhost_take(&h, 5, 4, 7, 1, toks(1)));  /* taken out */
	kvhost_free(b);
	kvhost_destroy(&h);
}

static void
test_budget_drops_oldest(void **state)
{
	struct kvhost h;
	struct kvhost_block *b;
	int i;

	kvhost_init(&h, 350);
	for (i = 0; i < 5; i++)
		kvhost_put(&h, block((uint64_t)i, 0, i * 20));
	assert_int_equal(h.used, 300);
	assert_int_equal(h.n, 3);
	assert_int_equal(h.dropped, 2);
	assert_null(kvhost_take(&h, 0, 0, 7, 1, toks(0)));
	assert_null(kvhost_take(&h, 1, 0, 7, 1, toks(20)));
	for (i = 2; i < 5; i++) {
		assert_non_null(b = kvhost_take(&h, (uint64_t)i, 0, 7, 1, toks(i * 20)));
		kvhost_free(b);
	}
	/* the same key again replaces the block */
	kvhost_put(&h, block(9, 0, 1));
	kvhost_put(&h, block(9, 0, 1));
	assert_int_equal(h.n, 1);
	kvhost_destroy(&h);
}

static void
test_many_blocks_and_no_budget(void **state)
{
	struct kvhost h;
	struct kvhost_block *b;
	int i;

	kvhost_init(&h, 100 * 1000);
	for (i = 0; i < 1000; i++)  /* past the first table size: it grows */
		kvhost_put(&h, block((uint64_t)i * 0x10000, 0, i));
	for (i = 0; i < 1000; i += 37) {
		assert_non_null(b = kvhost_take(&h, (uint64_t)i * 0x10000, 0, 7, 1, toks(i)));
		kvhost_free(b);
	}
	kvhost_destroy(&h);
	kvhost_init(&h, 0);
	assert_false(kvhost_fits(&h, 100));
	kvhost_put(&h, block(1, 0, 1));
	assert_int_equal(h.n, 0);
	kvhost_destroy(&h);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_take_matches_everything),
		cmocka_unit_test(test_budget_drops_oldest),
		cmocka_unit_test(test_many_blocks_and_no_budget),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
