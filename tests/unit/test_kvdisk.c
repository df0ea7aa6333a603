/*
 * test_kvdisk.c: session KV files (daemon/kvdisk.c) over a pool in host
 * memory: what is written loads back; a record is used only after every
 * record before it, with the session's tokens, the history before them
 * (wherever the load starts), the identity and an intact checksum; a later
 * write truncates after what it keeps; the budget removes the least
 * recently used files; files of another format go at open; a remove takes
 * every identity's file, indexed or not; a second tier on a directory
 * stores nothing, and one with no budget only removes.
 */
#include "config.h"
#include "kv.h"
#include "kvdisk.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#define BLOCK 256
#define POOL 64

/* The pool the jobs copy from and into. */
struct backend {
	uint8_t data[POOL][BLOCK];
};

static int
fake_move(struct backend *b, const int32_t *blocks, int32_t n, void *const *out, const void *const *in, char *err)
{
	for (int32_t i = 0; i < n; i++) {
		if (out != NULL && out[i] != NULL)
			memcpy(out[i], b->data[blocks[i]], BLOCK);
		if (in != NULL)
			memcpy(b->data[blocks[i]], in[i], BLOCK);
	}
	return 0;
}

static pthread_mutex_t copy_mu = PTHREAD_MUTEX_INITIALIZER;
static void *
fake_host_alloc(size_t bytes)
{
	return xmalloc(bytes);
}

static const struct backend_ops fake_ops = { .name = "fake", .kv_move = fake_move, .host_alloc = fake_host_alloc,
	.host_free = free };
static struct backend be;
static char dir[64];
static int wakes;
static pthread_mutex_t wake_mu = PTHREAD_MUTEX_INITIALIZER;

static void
wake(void *arg)
{
	pthread_mutex_lock(&wake_mu);
	wakes++;
	pthread_mutex_unlock(&wake_mu);
}

static const char *const SESSION = "0badc0de-0000-4000-8000-000000000001";

/* The tokens of record i of the session's history (variant changes one of record 3's). */
static void
history(int32_t *t, int32_t first, int32_t n, int variant)
{
	for (int32_t i = 0; i < n * KV_BLOCK_TOKENS; i++)
		t[i] = (first * KV_BLOCK_TOKENS + i) * 7 + 1;
	if (variant && first <= 3 && first + n > 3)
		t[(3 - first) * KV_BLOCK_TOKENS + 5] += 1;
}

/* The records' key before record first of a history (as the engine gives it). */
static uint64_t
prev_key(uint64_t identity, int32_t first, int variant)
{
	int32_t t[KV_BLOCK_TOKENS];
	uint64_t key = kv_root(identity, 0);

	for (int32_t i = 0; i < first; i++) {
		history(t, i, 1, variant);
		key = kv_chain(key, t);
	}
	return key;
}

/* A job over records [first, first + n) from or into pool blocks base.. */
static struct kvdisk_job *
job(enum kvdisk_op op, const char *identity_text, int32_t first, int32_t n, int32_t base, int variant)
{
	struct kvdisk_job *j = xcalloc(1, sizeof *j);

	j->op = op;
	snprintf(j->name, sizeof j->name, "%s", SESSION);
	j->owner = &be;
	j->ops = &fake_ops;
	j->be = &be;
	j->copy_mu = &copy_mu;
	j->identity_text = xstrdup(identity_text);
	j->identity = (uint64_t)strlen(identity_text) * 1000003u + (uint8_t)identity_text[0];
	j->prev = prev_key(j->identity, first, variant);
	j->block_bytes = BLOCK;
	j->first = first;
	j->n = n;
	j->tokens = xmalloc((size_t)MAX(n, 1) * KV_BLOCK_TOKENS * sizeof *j->tokens);
	history(j->tokens, first, n, variant);
	j->blocks = xmalloc((size_t)MAX(n, 1) * sizeof *j->blocks);
	for (int32_t i = 0; i < n; i++)
		j->blocks[i] = base + i;
	return j;
}

/* Runs one job to its end; returns its result (done), or -1 on an error. */
static int32_t
run(struct kvdisk *d, struct kvdisk_job *j)
{
	struct kvdisk_job *got;
	int32_t done;

	kvdisk_submit(d, j);
	got = kvdisk_drain(d, &be);
	assert_ptr_equal(got, j);
	assert_null(got->next);
	done = got->rc == 0 ? got->done : -1;
	kvdisk_job_free(got);
	return done;
}

/* Fills pool blocks [0, n) with a pattern of their own. */
static void
fill_pool(int32_t n)
{
	for (int32_t b = 0; b < n; b++)
		for (int k = 0; k < BLOCK; k++)
			be.data[b][k] = (uint8_t)(b * 31 + k);
}

/* The path of the session's file for an identity text. */
static void
file_of(const char *identity_text, char *path, size_t len)
{
	uint64_t id = (uint64_t)strlen(identity_text) * 1000003u + (uint8_t)identity_text[0];

	snprintf(path, len, "%s/%016llx/%s.kv", dir, (unsigned long long)id, SESSION);
}

static int
setup(void **state)
{
	snprintf(dir, sizeof dir, "/tmp/test_kvdisk_XXXXXX");
	assert_non_null(mkdtemp(dir));
	return 0;
}

static int
teardown(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void
test_write_then_load(void **state)
{
	struct kvdisk *d;
	char err[ERR_LEN], note[ERR_LEN], path[256];
	int32_t b;

	assert_int_equal(kvdisk_open(dir, 1 << 20, wake, NULL, &d, note, err), 0);
	fill_pool(10);
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 0, 6, 0, 0)), 6);
	/* appended: 6..9 after the 6 there */
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 6, 4, 6, 0)), 10);
	assert_int_equal(kvdisk_records(d, 0, "x", BLOCK, SESSION), 0);
	file_of("model A", path, sizeof path);
	assert_int_equal(access(path, R_OK), 0);
	assert_int_equal(kvdisk_records(d, (uint64_t)7 * 1000003u + 'm', "model A", BLOCK, SESSION), 10);
	/* loaded into blocks 20.. they hold what 0.. held */
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 0, 10, 20, 0)), 10);
	for (b = 0; b < 10; b++)
		assert_memory_equal(be.data[20 + b], be.data[b], BLOCK);
	/* from the middle */
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 4, 3, 40, 0)), 3);
	assert_memory_equal(be.data[40], be.data[4], BLOCK);
	/* asking for more than there is */
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 8, 5, 40, 0)), 2);
	/* another identity or other tokens: nothing, or up to the difference */
	assert_int_equal(run(d, job(KVDISK_LOAD, "model B", 0, 10, 20, 0)), 0);
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 0, 10, 20, 1)), 3);
	assert_true(wakes > 0);
	kvdisk_close(d);
}

/* Changes the file: flips a byte at off, or cuts it there (cut). */
static void
damage(const char *path, long off, int cut)
{
	FILE *f = fopen(path, "r+b");
	int c;

	assert_non_null(f);
	if (cut) {
		fclose(f);
		assert_int_equal(truncate(path, off), 0);
		return;
	}
	fseek(f, off, SEEK_SET);
	c = fgetc(f);
	fseek(f, off, SEEK_SET);
	fputc(c ^ 1, f);
	fclose(f);
}

static void
test_damage_and_rewrite(void **state)
{
	struct kvdisk *d;
	char err[ERR_LEN], note[ERR_LEN], path[256];
	struct stat st;
	long rec = 80 + BLOCK + 8, head;

	assert_int_equal(kvdisk_open(dir, 1 << 20, wake, NULL, &d, note, err), 0);
	fill_pool(10);
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 0, 10, 0, 0)), 10);
	file_of("model A", path, sizeof path);
	assert_int_equal(stat(path, &st), 0);
	head = (long)st.st_size - 10 * rec;
	damage(path, head + 6 * rec + 80 + 17, 0);      /* record 6's K/V */
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 0, 10, 20, 0)), 6);
	damage(path, head + 2 * rec + 8, 0);            /* record 2's tokens */
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 0, 10, 20, 0)), 2);
	damage(path, 30, 0);                            /* the header */
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 0, 10, 20, 0)), 0);
	/* a write that starts after a bad header (or a file the budget removed): the file starts
	 * again with its header alone, and the owner learns that it holds no record */
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 4, 6, 4, 0)), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, head);
	unlink(path);
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 4, 6, 4, 0)), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, head);
	/* written again from 0, then cut inside record 8 */
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 0, 10, 0, 0)), 10);
	damage(path, head + 8 * rec + 100, 1);
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 0, 10, 20, 0)), 8);
	/* a write from 9 finds only 8 records: the file keeps 8, the owner learns it */
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 9, 1, 9, 0)), 8);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, head + 8 * rec);
	/* a history that departs in record 3: rewritten from there; the old one now stops there */
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 3, 5, 3, 1)), 8);
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 0, 8, 20, 1)), 8);
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 0, 8, 20, 0)), 3);
	kvdisk_close(d);
}

/* Queues the removal of the session's files. */
static void
remove_session(struct kvdisk *d)
{
	struct kvdisk_job *j = xcalloc(1, sizeof *j);

	j->op = KVDISK_REMOVE;
	snprintf(j->name, sizeof j->name, "%s", SESSION);
	kvdisk_submit(d, j);
}

/*
 * A record whose 16 tokens are the session's but whose history before them
 * is not (a turn that was never committed, then another that departed
 * earlier) is not loaded, wherever the load starts.
 */
static void
test_prefix_checked(void **state)
{
	struct kvdisk *d;
	char err[ERR_LEN], note[ERR_LEN];

	assert_int_equal(kvdisk_open(dir, 1 << 20, wake, NULL, &d, note, err), 0);
	fill_pool(10);
	/* written for the history that differs in record 3 */
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 0, 10, 0, 1)), 10);
	/* records 5.. have the same tokens in both histories, not the same K/V */
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 5, 5, 20, 0)), 0);
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 5, 5, 20, 1)), 5);
	assert_memory_equal(be.data[20], be.data[5], BLOCK);
	/* rewritten from record 3 for the other history: now the first one stops there */
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 3, 7, 3, 0)), 10);
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 5, 5, 20, 0)), 5);
	assert_int_equal(run(d, job(KVDISK_LOAD, "model A", 5, 5, 20, 1)), 0);
	kvdisk_close(d);
}

/* A file of an older version (or with a torn header) is removed at open, not indexed. */
static void
test_old_format(void **state)
{
	struct kvdisk *d;
	char err[ERR_LEN], note[ERR_LEN], path[256], torn[300];
	FILE *f;

	file_of("model A", path, sizeof path);
	*strrchr(path, '/') = '\0';
	assert_int_equal(mkdir(path, 0700) == 0 || errno == EEXIST, 1);
	snprintf(torn, sizeof torn, "%s/0badc0de-0000-4000-8000-000000000002.kv", path);
	file_of("model A", path, sizeof path);
	assert_non_null(f = fopen(path, "wb"));
	fputs("RSKVSES1", f);  /* version 1: records without their history's key */
	for (int i = 0; i < 4000; i++)
		fputc(i, f);
	fclose(f);
	assert_non_null(f = fopen(torn, "wb"));
	fputs("RSKV", f);
	fclose(f);
	assert_int_equal(kvdisk_open(dir, 1 << 20, wake, NULL, &d, note, err), 0);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(access(torn, F_OK), -1);
	assert_non_null(strstr(note, "removed 2 files of another format"));
	assert_int_equal(kvdisk_records(d, (uint64_t)7 * 1000003u + 'm', "model A", BLOCK, SESSION), 0);
	kvdisk_close(d);
}

/*
 * One owner per directory: a second tier on it stores nothing until the
 * first is closed, and it, like a tier without a budget, still removes a
 * session's files, which are not in its index.
 */
static void
test_one_owner(void **state)
{
	struct kvdisk *first, *second, *none;
	char err[ERR_LEN], note[ERR_LEN], path[256];
	uint64_t bytes, budget;

	assert_int_equal(kvdisk_open(dir, 1 << 20, wake, NULL, &first, note, err), 0);
	assert_true(kvdisk_stores(first));
	assert_int_equal(kvdisk_open(dir, 1 << 20, wake, NULL, &second, note, err), 0);
	assert_false(kvdisk_stores(second));
	assert_non_null(strstr(note, "in use by another residentd"));
	assert_int_equal(kvdisk_open(dir, 0, wake, NULL, &none, note, err), 0);
	assert_false(kvdisk_stores(none));
	assert_string_equal(note, "");
	kvdisk_usage(second, &bytes, &budget);
	assert_int_equal(budget, 0);
	fill_pool(4);
	file_of("model A", path, sizeof path);
	assert_int_equal(run(first, job(KVDISK_WRITE, "model A", 0, 4, 0, 0)), 4);
	assert_int_equal(access(path, F_OK), 0);
	remove_session(second);
	kvdisk_close(second);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(run(first, job(KVDISK_WRITE, "model A", 0, 4, 0, 0)), 4);
	remove_session(none);
	kvdisk_close(none);
	assert_int_equal(access(path, F_OK), -1);
	/* the first let go: the next one stores */
	kvdisk_close(first);
	assert_int_equal(kvdisk_open(dir, 1 << 20, wake, NULL, &second, note, err), 0);
	assert_true(kvdisk_stores(second));
	kvdisk_close(second);
}

static void
test_budget_and_remove(void **state)
{
	struct kvdisk *d;
	char err[ERR_LEN], note[ERR_LEN], a[256], b[256], other[2][300];
	uint64_t bytes, budget;
	FILE *f;

	assert_int_equal(kvdisk_open(dir, 1 << 20, wake, NULL, &d, note, err), 0);
	fill_pool(10);
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 0, 10, 0, 0)), 10);
	assert_int_equal(run(d, job(KVDISK_WRITE, "model Bee", 0, 10, 0, 0)), 10);
	file_of("model A", a, sizeof a);
	file_of("model Bee", b, sizeof b);
	kvdisk_usage(d, &bytes, &budget);
	kvdisk_close(d);
	/* files that are not the tier's, each over the budget: neither counted nor removed (a .kv file
	 * outside an identity directory, a file of another name inside one) */
	snprintf(other[0], sizeof other[0], "%s/backup", dir);
	assert_int_equal(mkdir(other[0], 0700), 0);
	snprintf(other[0], sizeof other[0], "%s/backup/notes.kv", dir);
	snprintf(other[1], sizeof other[1], "%.*s/notes.txt", (int)(strrchr(a, '/') - a), a);
	for (int i = 0; i < 2; i++) {
		assert_non_null(f = fopen(other[i], "w"));
		assert_int_equal(fseek(f, (long)bytes, SEEK_SET), 0);
		fputc('x', f);
		fclose(f);
	}
	/* reopened with room for one file: the older goes */
	assert_int_equal(kvdisk_open(dir, bytes / 2 + 1000, wake, NULL, &d, note, err), 0);
	assert_int_equal(access(a, F_OK) == 0 || access(b, F_OK) == 0, 1);
	assert_int_equal(access(a, F_OK) == 0 && access(b, F_OK) == 0, 0);
	assert_int_equal(access(other[0], F_OK), 0);
	assert_int_equal(access(other[1], F_OK), 0);
	/* a remove takes the session's files of every identity */
	assert_int_equal(run(d, job(KVDISK_WRITE, "model A", 0, 2, 0, 0)), 2);
	remove_session(d);
	kvdisk_close(d);  /* finishes the queue */
	assert_int_equal(access(a, F_OK), -1);
	assert_int_equal(access(b, F_OK), -1);
	assert_int_equal(kvdisk_open(dir, 1 << 20, wake, NULL, &d, note, err), 0);
	kvdisk_usage(d, &bytes, &budget);
	assert_int_equal(bytes, 0);
	kvdisk_close(d);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write_then_load),
		cmocka_unit_test(test_damage_and_rewrite),
		cmocka_unit_test(test_budget_and_remove),
		cmocka_unit_test(test_prefix_checked),
		cmocka_unit_test(test_old_format),
		cmocka_unit_test(test_one_owner),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
