/*
 * test_gguf.c: the GGUF reader on good files and on hostile ones.
 *
 * Hostile files are built byte by byte so that each case breaks exactly one
 * rule; every one must be refused with a message, and (under ASan) without
 * a read outside the buffer, which is always malloc'd at its exact size.
 */
#include "config.h"
#include "gguf.h"
#include "quant.h"
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* A growable byte buffer for building files by hand. */
struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void
put(struct buf *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = xrealloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

static void
put_u32(struct buf *b, uint32_t v)
{
	put(b, &v, 4);
}

static void
put_u64(struct buf *b, uint64_t v)
{
	put(b, &v, 8);
}

static void
put_str(struct buf *b, const char *s)
{
	put_u64(b, strlen(s));
	put(b, s, strlen(s));
}

static void
put_pad(struct buf *b, size_t align)
{
	static const uint8_t z[64];

	put(b, z, (align - b->n % align) % align);
}

static void
put_header(struct buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
	put(b, "GGUF", 4);
	put_u32(b, version);
	put_u64(b, n_tensors);
	put_u64(b, n_kv);
}

/* A 1-D or 2-D tensor directory entry. */
static void
put_tensor(struct buf *b, const char *name, uint32_t type, uint64_t ne0, uint64_t ne1, uint64_t off)
{
	put_str(b, name);
	put_u32(b, ne1 ? 2 : 1);
	put_u64(b, ne0);
	if (ne1)
		put_u64(b, ne1);
	put_u32(b, type);
	put_u64(b, off);
}

/* Opens an exact-size copy of the buffer; returns the reader's code. */
static int
try_open(const uint8_t *p, size_t n, char *err)
{
	uint8_t *copy = xmalloc(n);
	struct gguf_file *f = NULL;
	int rc;

	memcpy(copy, p, n);
	err[0] = '\0';
	rc = gguf_open_mem(copy, n, &f, err);
	if (rc == 0)
		gguf_close(f);
	free(copy);
	return rc;
}

/* Asserts the buffer is refused and the message mentions `needle`. */
static void
expect_refused(struct buf *b, const char *needle)
{
	char err[ERR_LEN];
	int rc = try_open(b->p, b->n, err);

	if (rc == 0 || strstr(err, needle) == NULL)
		fail_msg("expected an error containing '%s', got rc %d '%s'", needle, rc, err);
	free(b->p);
	memset(b, 0, sizeof *b);
}

/* A small valid file: two keys, two F32 tensors, [4] and [4 x 2]. */
static void
build_valid(struct buf *b)
{
	float data[12];
	int i;

	for (i = 0; i < 12; i++)
		data[i] = (float)i;
	put_header(b, 3, 2, 2);
	put_str(b, "general.architecture");
	put_u32(b, GGUF_STRING);
	put_str(b, "llama");
	put_str(b, "test.list");
	put_u32(b, GGUF_ARRAY);
	put_u32(b, GGUF_I32);
	put_u64(b, 3);
	put_u32(b, 7), put_u32(b, 8), put_u32(b, (uint32_t)-9);
	put_tensor(b, "a", TT_F32, 4, 0, 0);
	put_tensor(b, "b", TT_F32, 4, 2, 32);
	put_pad(b, 32);
	put(b, data, 16);
	put_pad(b, 32);
	put(b, data + 4, 32);
}

static void
test_valid(void **state)
{
	struct buf b = { 0 };
	struct gguf_file *f;
	const struct gguf_tensor *t;
	struct gguf_str s;
	char err[ERR_LEN];
	float v;

	build_valid(&b);
	assert_int_equal(gguf_open_mem(b.p, b.n, &f, err), 0);
	assert_int_equal(gguf_version(f), 3);
	assert_int_equal(gguf_n_kv(f), 2);
	assert_int_equal(gguf_get_str(f, "general.architecture", &s, err), 0);
	assert_true(gguf_str_eq(s, "llama"));
	assert_int_equal(gguf_find_key(f, "nope"), -1);
	assert_int_equal(gguf_get_str(f, "test.list", &s, err), ERR_FORMAT);
	assert_int_equal(gguf_arr_n(f, 1), 3);
	assert_int_equal(gguf_arr_i64(f, 1, 2), -9);
	assert_int_equal(gguf_n_tensors(f), 2);
	t = gguf_find_tensor(f, "b");
	assert_non_null(t);
	assert_int_equal(t->ne[0], 4);
	assert_int_equal(t->ne[1], 2);
	assert_int_equal(t->bytes, 32);
	memcpy(&v, (const float *)t->data + 7, 4);
	assert_true(v == 11.0f);
	assert_null(gguf_find_tensor(f, "c"));
	gguf_close(f);
	free(b.p);
}

/* Every prefix of a valid file is refused. */
static void
test_truncated_everywhere(void **state)
{
	struct buf b = { 0 };
	char err[ERR_LEN];
	size_t n;

	build_valid(&b);
	for (n = 0; n < b.n; n++) {
		if (try_open(b.p, n, err) == 0)
			fail_msg("a file truncated to %zu of %zu bytes was accepted", n, b.n);
		assert_true(err[0] != '\0');
	}
	free(b.p);
}

static void
test_bad_header(void **state)
{
	struct buf b = { 0 };

	put(&b, "GGUX", 4), put_u32(&b, 3), put_u64(&b, 0), put_u64(&b, 0);
	expect_refused(&b, "magic");
	put_header(&b, 1, 0, 0);
	expect_refused(&b, "version 1");
	put_header(&b, 4, 0, 0);
	expect_refused(&b, "version 4");
}

static void
test_absurd_counts(void **state)
{
	struct buf b = { 0 };

	put_header(&b, 3, 0, UINT64_MAX);
	expect_refused(&b, "cannot fit");
	put_header(&b, 3, (uint64_t)1 << 62, 0);
	expect_refused(&b, "cannot fit");
	/* a string longer than the file */
	put_header(&b, 3, 0, 1);
	put_u64(&b, (uint64_t)1 << 40);
	put(&b, "abcdefghijklmnopqrstuvwxyz", 26);
	expect_refused(&b, "too long");
	put_header(&b, 3, 0, 1);
	put_str(&b, "k"), put_u32(&b, GGUF_STRING), put_u64(&b, 1000), put(&b, "x", 1);
	expect_refused(&b, "truncated");
	/* an array of 2^61 u64 */
	put_header(&b, 3, 0, 1);
	put_str(&b, "k"), put_u32(&b, GGUF_ARRAY), put_u32(&b, GGUF_U64), put_u64(&b, (uint64_t)1 << 61);
	expect_refused(&b, "cannot fit");
	/* an array of 2^40 strings */
	put_header(&b, 3, 0, 1);
	put_str(&b, "k"), put_u32(&b, GGUF_ARRAY), put_u32(&b, GGUF_STRING), put_u64(&b, (uint64_t)1 << 40);
	expect_refused(&b, "cannot fit");
}

static void
test_bad_values(void **state)
{
	struct buf b = { 0 };

	put_header(&b, 3, 0, 1);
	put_str(&b, "k"), put_u32(&b, 13), put_u32(&b, 0);
	expect_refused(&b, "unknown value type 13");
	put_header(&b, 3, 0, 1);
	put_str(&b, "k"), put_u32(&b, GGUF_ARRAY), put_u32(&b, GGUF_ARRAY), put_u64(&b, 1);
	put_u32(&b, GGUF_U8), put_u64(&b, 0);
	expect_refused(&b, "nested");
	put_header(&b, 3, 0, 1);
	put_str(&b, "k"), put_u32(&b, GGUF_ARRAY), put_u32(&b, 77), put_u64(&b, 1);
	expect_refused(&b, "element type");
	put_header(&b, 3, 0, 1);
	put_str(&b, "k"), put_u32(&b, GGUF_BOOL), put(&b, "\2", 1);
	expect_refused(&b, "bool");
	put_header(&b, 3, 0, 2);
	put_str(&b, "k"), put_u32(&b, GGUF_U32), put_u32(&b, 1);
	put_str(&b, "k"), put_u32(&b, GGUF_U32), put_u32(&b, 2);
	expect_refused(&b, "duplicate key");
}

static void
test_bad_alignment(void **state)
{
	struct buf b = { 0 };

	put_header(&b, 3, 0, 1);
	put_str(&b, "general.alignment"), put_u32(&b, GGUF_U32), put_u32(&b, 24);
	expect_refused(&b, "power of two");
	put_header(&b, 3, 0, 1);
	put_str(&b, "general.alignment"), put_u32(&b, GGUF_U32), put_u32(&b, 0);
	expect_refused(&b, "power of two");
	put_header(&b, 3, 0, 1);
	put_str(&b, "general.alignment"), put_u32(&b, GGUF_STRING), put_str(&b, "32");
	expect_refused(&b, "general.alignment");
	/* a tensor offset that is not a multiple of the alignment */
	put_header(&b, 3, 1, 0);
	put_tensor(&b, "t", TT_F32, 4, 0, 4);
	put_pad(&b, 32);
	put(&b, "0123456789abcdef0123456789abcdef", 32);
	expect_refused(&b, "not aligned");
}

/* One tensor entry followed by `data` bytes of data section. */
static void
one_tensor(struct buf *b, uint32_t type, uint64_t ne0, uint64_t ne1, uint64_t off, size_t data)
{
	static const uint8_t z[256];

	put_header(b, 3, 1, 0);
	put_tensor(b, "t", type, ne0, ne1, off);
	put_pad(b, 32);
	put(b, z, data);
}

static void
test_bad_tensors(void **state)
{
	static const uint8_t z[128];
	struct buf b = { 0 };

	one_tensor(&b, 99, 4, 0, 0, 16);
	expect_refused(&b, "unsupported tensor type 99");
	one_tensor(&b, TT_F32, 0, 0, 0, 16);
	expect_refused(&b, "zero or too large");
	one_tensor(&b, TT_F32, (uint64_t)1 << 40, (uint64_t)1 << 40, 0, 16);
	expect_refused(&b, "zero or too large");
	one_tensor(&b, TT_F32, UINT64_MAX, 0, 0, 16);
	expect_refused(&b, "zero or too large");
	one_tensor(&b, TT_F32, 1024, 0, 0, 16);
	expect_refused(&b, "outside the data section");
	one_tensor(&b, TT_F32, 4, 0, (uint64_t)1 << 60, 16);
	expect_refused(&b, "outside the data section");
	one_tensor(&b, TT_Q4_K, 100, 0, 0, 256);
	expect_refused(&b, "not a multiple");
	put_header(&b, 3, 1, 0);
	put_str(&b, "t"), put_u32(&b, 5);
	put(&b, z, 64);
	expect_refused(&b, "dimensions");
	/* overlap: b starts inside a */
	put_header(&b, 3, 2, 0);
	put_tensor(&b, "a", TT_F32, 16, 0, 0);
	put_tensor(&b, "b", TT_F32, 16, 0, 32);
	put_pad(&b, 32);
	put(&b, z, 128);
	expect_refused(&b, "overlap");
	put_header(&b, 3, 2, 0);
	put_tensor(&b, "a", TT_F32, 4, 0, 0);
	put_tensor(&b, "a", TT_F32, 4, 0, 32);
	put_pad(&b, 32);
	put(&b, z, 64);
	expect_refused(&b, "duplicate tensor");
}

/* Random byte changes to a valid file: refused or accepted, never a crash or a bad read. */
static void
test_mutations(void **state)
{
	struct buf b = { 0 };
	struct gguf_file *f;
	uint8_t *copy;
	char err[ERR_LEN];
	uint64_t x = 88172645463325252ull;
	int i, k, accepted = 0;
	int64_t j;

	build_valid(&b);
	copy = xmalloc(b.n);
	for (i = 0; i < 20000; i++) {
		memcpy(copy, b.p, b.n);
		for (k = 0; k < 1 + i % 4; k++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			copy[x % b.n] = (uint8_t)(x >> 32);
		}
		if (gguf_open_mem(copy, b.n, &f, err) != 0)
			continue;
		accepted++;
		for (j = 0; j < gguf_n_tensors(f); j++) {
			const struct gguf_tensor *t = gguf_tensor(f, j);
			volatile uint8_t last = ((const uint8_t *)t->data)[t->bytes - 1];
			(void)last;
		}
		gguf_close(f);
	}
	/* changes inside tensor data keep the file valid: some must be accepted */
	assert_true(accepted > 0);
	free(copy);
	free(b.p);
}

/* The writer's output reads back with the same keys, shapes and bytes. */
static void
test_writer_roundtrip(void **state)
{
	char path[] = "/tmp/test_gguf_XXXXXX", err[ERR_LEN];
	const char *strs[] = { "a", "", "ü" };
	int64_t ne[2] = { 32, 3 };
	uint8_t q[3 * 34];
	struct gguf_writer *w = gguf_writer_new();
	struct gguf_file *f;
	const struct gguf_tensor *t;
	float v;
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	close(fd);
	memset(q, 0x5a, sizeof q);
	gguf_w_str(w, "general.architecture", "qwen3");
	gguf_w_f32(w, "x.f", 0.5f);
	gguf_w_arr_str(w, "x.s", strs, 3);
	assert_int_equal(gguf_w_tensor(w, "q", TT_Q8_0, 2, ne, err), 0);
	assert_int_equal(gguf_w_tensor(w, "bad", TT_Q8_0, 1, (int64_t[]){ 33 }, err), ERR_INVAL);
	assert_int_equal(gguf_writer_begin(w, path, err), 0);
	assert_int_equal(gguf_writer_data(w, q, 10, err), ERR_INVAL);
	assert_int_equal(gguf_writer_data(w, q, sizeof q, err), 0);
	assert_int_equal(gguf_writer_end(w, err), 0);
	gguf_writer_free(w);
	assert_int_equal(gguf_open(path, &f, err), 0);
	assert_int_equal(gguf_get_f32(f, "x.f", &v, err), 0);
	assert_true(v == 0.5f);
	assert_true(gguf_str_eq(gguf_arr_str(f, gguf_find_key(f, "x.s"), 2), "ü"));
	t = gguf_find_tensor(f, "q");
	assert_non_null(t);
	assert_int_equal(t->bytes, sizeof q);
	assert_memory_equal(t->data, q, sizeof q);
	gguf_close(f);
	unlink(path);
	assert_int_equal(gguf_open(path, &f, err), ERR_IO);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_truncated_everywhere),
		cmocka_unit_test(test_bad_header),
		cmocka_unit_test(test_absurd_counts),
		cmocka_unit_test(test_bad_values),
		cmocka_unit_test(test_bad_alignment),
		cmocka_unit_test(test_bad_tensors),
		cmocka_unit_test(test_mutations),
		cmocka_unit_test(test_writer_roundtrip),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
