/*
 * test_worker.c: the worker thread (daemon/worker.c) runs items of one key
 * in the order they came and lets keys take turns (the smallest key after
 * the last one run, then around), so that one client's backlog does not
 * hold another's item back; items of key 0 alone run in order; drain waits
 * for an owner's items and hands back only theirs, and does not wait for
 * another owner's (an unloading model does not wait for the others' work);
 * drain of NULL waits for everyone's.
 */
#include "config.h"
#include "worker.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

struct item {
	struct work w;           /* first: the work is the item */
	char name[8];
};

/* What ran, in order; the first item holds the thread until the others are queued. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int gate_open;
static char ran[256];

static void
run(struct work *w)
{
	struct item *it = (struct item *)w;

	pthread_mutex_lock(&mu);
	strcat(ran, it->name);
	strcat(ran, " ");
	pthread_mutex_unlock(&mu);
}

static void
run_gated(struct work *w)
{
	pthread_mutex_lock(&mu);
	while (!gate_open)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	run(w);
}

static void
no_wake(void *arg)
{
	(void)arg;
}

/* Runs the items of keys[i] named names[i] behind a gated first item of key first_key; returns the order run. */
static const char *
run_order(uint64_t first_key, const uint64_t *keys, const char *const *names, int n)
{
	static struct item items[16];
	struct worker wk;
	char err[256];
	int owner;

	assert_true(n < 16);
	ran[0] = '\0';
	gate_open = 0;
	assert_int_equal(worker_start(&wk, no_wake, NULL, err), 0);
	items[0] = (struct item){ { run_gated, &owner, first_key, NULL }, "g" };
	worker_submit(&wk, &items[0].w);
	for (int i = 0; i < n; i++) {
		items[i + 1] = (struct item){ { run, &owner, keys[i], NULL }, "" };
		strcpy(items[i + 1].name, names[i]);
		worker_submit(&wk, &items[i + 1].w);
	}
	pthread_mutex_lock(&mu);
	gate_open = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	worker_drain(&wk, &owner);
	worker_stop(&wk);
	return ran;
}

static void
test_keys_take_turns(void **state)
{
	static const uint64_t keys[] = { 1, 1, 1, 2, 2, 3 };
	static const char *const names[] = { "a1", "a2", "a3", "b1", "b2", "c1" };

	(void)state;
	assert_string_equal(run_order(1, keys, names, 6), "g b1 c1 a1 b2 a2 a3 ");
}

static void
test_one_key_in_order(void **state)
{
	static const uint64_t keys[] = { 0, 0, 0, 0 };
	static const char *const names[] = { "j1", "j2", "j3", "j4" };

	(void)state;
	assert_string_equal(run_order(0, keys, names, 4), "g j1 j2 j3 j4 ");
}

/* drain waits for one owner's items and hands back theirs, finished, in order; the others stay. */
static void
test_drain_takes_its_own(void **state)
{
	struct item a[3], b[2];
	struct worker wk;
	struct work *w;
	char err[256];
	int oa, ob, n = 0;

	(void)state;
	ran[0] = '\0';
	assert_int_equal(worker_start(&wk, no_wake, NULL, err), 0);
	for (int i = 0; i < 3; i++) {
		a[i] = (struct item){ { run, &oa, 5, NULL }, "a" };
		worker_submit(&wk, &a[i].w);
		if (i < 2) {
			b[i] = (struct item){ { run, &ob, 6, NULL }, "b" };
			worker_submit(&wk, &b[i].w);
		}
	}
	for (w = worker_drain(&wk, &oa); w != NULL; w = w->next, n++)
		assert_ptr_equal(w, &a[n].w);
	assert_int_equal(n, 3);
	worker_stop(&wk);
	n = 0;
	for (w = worker_take_done(&wk); w != NULL; w = w->next)
		assert_ptr_equal(w, &b[n++].w);
	assert_int_equal(n, 2);
}

/* drain of one owner returns while another owner's item still runs; drain of NULL waits for it */
static void
test_drain_skips_others(void **state)
{
	struct item a, b;
	struct worker wk;
	struct work *w;
	char err[256];
	int oa, ob;

	(void)state;
	ran[0] = '\0';
	gate_open = 0;
	assert_int_equal(worker_start(&wk, no_wake, NULL, err), 0);
	a = (struct item){ { run, &oa, 1, NULL }, "a" };
	b = (struct item){ { run_gated, &ob, 2, NULL }, "b" };
	worker_submit(&wk, &a.w);
	worker_submit(&wk, &b.w);
	w = worker_drain(&wk, &oa); /* b runs, held at its gate: a drain that waited for it would hang */
	assert_ptr_equal(w, &a.w);
	assert_null(w->next);
	pthread_mutex_lock(&mu);
	gate_open = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	w = worker_drain(&wk, NULL);
	assert_ptr_equal(w, &b.w);
	assert_null(w->next);
	assert_string_equal(ran, "a b ");
	worker_stop(&wk);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keys_take_turns),
		cmocka_unit_test(test_one_key_in_order),
		cmocka_unit_test(test_drain_takes_its_own),
		cmocka_unit_test(test_drain_skips_others),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
