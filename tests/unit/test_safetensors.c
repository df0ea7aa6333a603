/*
 * test_safetensors.c: the safetensors reader and writer.
 *
 * The golden file below was written by the `safetensors` package itself
 * (0.8.0: safetensors.numpy.save_file(..., metadata={"format": "pt"})); the
 * writer must reproduce it byte for byte and the reader must read it. The
 * rest are round trips and hostile files: each malformed file must give a
 * negative code and a message saying what is wrong, never a crash (run
 * under ASan with ./configure --enable-asan).
 */
#include "config.h"

#include <dirent.h>
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

#include "quant.h"
#include "safetensors.h"
#include "util.h"

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

/*
 * save_file({"embed.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
 *            "norm": np.array([1, -2, 0.5, 65504], dtype=np.float16),
 *            "z": np.array(7.0, dtype=np.float32)}, path, metadata={"format": "pt"})
 */
static const char golden_header[] =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"z\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[24,28]},"
    "\"norm\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[28,36]}}     ";
static const uint8_t golden_data[] = {
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40,
	0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0x80, 0x40, 0x00, 0x00, 0xa0, 0x40,
	0x00, 0x00, 0xe0, 0x40, 0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0xff, 0x7b,
};

/* A scratch directory per test. */
struct fixture {
	char dir[64];
};

/* Creates the scratch directory. */
static int
setup(void **state)
{
	struct fixture *fx = xcalloc(1, sizeof *fx);

	snprintf(fx->dir, sizeof fx->dir, "/tmp/test_safetensors_XXXXXX");
	if (mkdtemp(fx->dir) == NULL)
		return -1;
	*state = fx;
	return 0;
}

/* Removes the scratch directory and its files (it has no subdirectories). */
static int
teardown(void **state)
{
	struct fixture *fx = *state;
	char path[512];
	struct dirent *de;
	DIR *d = opendir(fx->dir);

	while (d != NULL && (de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof path, "%s/%s", fx->dir, de->d_name);
		unlink(path);
	}
	if (d != NULL)
		closedir(d);
	rmdir(fx->dir);
	free(fx);
	return 0;
}

/* dir/name into a static buffer. */
static const char *
at(const struct fixture *fx, const char *name)
{
	static char path[512];

	snprintf(path, sizeof path, "%s/%s", fx->dir, name);
	return path;
}

/* Writes bytes to dir/name. */
static void
put(const struct fixture *fx, const char *name, const void *data, size_t len)
{
	FILE *f = fopen(at(fx, name), "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

/* Writes dir/model.safetensors: a length field of hlen, the header text, data_len zero bytes. */
static void
put_raw(const struct fixture *fx, uint64_t hlen, const char *header, size_t data_len)
{
	size_t n = strlen(header);
	uint8_t *buf = xcalloc(1, 8 + n + data_len);
	int i;

	for (i = 0; i < 8; i++)
		buf[i] = (uint8_t)(hlen >> (8 * i));
	memcpy(buf + 8, header, n);
	put(fx, "model.safetensors", buf, 8 + n + data_len);
	free(buf);
}

/* Opens the directory expecting code, with needle in the message. */
static void
open_fails(const struct fixture *fx, int code, const char *needle)
{
	struct st_model *m = NULL;
	char err[ERR_LEN] = "";
	int rc = st_open_dir(fx->dir, &m, err);

	if (rc != code || strstr(err, needle) == NULL)
		fail_msg("got %d '%s', want %d with '%s'", rc, err, code, needle);
	assert_null(m);
}

/* Opens the directory, which must succeed. */
static struct st_model *
open_ok(const struct fixture *fx)
{
	struct st_model *m = NULL;
	char err[ERR_LEN] = "";

	if (st_open_dir(fx->dir, &m, err) != 0)
		fail_msg("%s", err);
	return m;
}

/* Reads dir/name whole. */
static char *
slurp(const struct fixture *fx, const char *name, size_t *len)
{
	char err[ERR_LEN];
	char *data;

	if (read_file(at(fx, name), &data, len, err) != 0)
		fail_msg("%s", err);
	return data;
}

/* Adds a tensor, which must succeed. */
static void
add(struct st_writer *w, const char *name, uint32_t type, int n_dims, const int64_t *ne,
    const void *data, size_t bytes)
{
	char err[ERR_LEN];

	if (st_w_tensor(w, name, type, n_dims, ne, data, bytes, err) != 0)
		fail_msg("%s", err);
}

/* Saves the writer to dir/name and frees it. */
static void
save(const struct fixture *fx, struct st_writer *w, const char *name)
{
	char err[ERR_LEN];

	if (st_writer_save(w, at(fx, name), err) != 0)
		fail_msg("%s", err);
	st_writer_free(w);
}

/* The golden file's tensors, added in another order than they are written. */
static struct st_writer *
golden_writer(void)
{
	struct st_writer *w = st_writer_new();
	const int64_t ne_embed[] = { 3, 2 }, ne_norm[] = { 4 };

	add(w, "norm", TT_F16, 1, ne_norm, golden_data + 28, 8);
	add(w, "z", TT_F32, 0, NULL, golden_data + 24, 4);
	add(w, "embed.weight", TT_F32, 2, ne_embed, golden_data, 24);
	return w;
}

/* The writer produces what the safetensors package writes, byte for byte. */
static void
test_writer_matches_package(void **state)
{
	struct fixture *fx = *state;
	size_t hlen = strlen(golden_header), len;
	char *file;

	save(fx, golden_writer(), "model.safetensors");
	file = slurp(fx, "model.safetensors", &len);
	assert_int_equal(len, 8 + hlen + sizeof golden_data);
	assert_int_equal((uint8_t)file[0], hlen);
	assert_memory_equal(file + 1, "\0\0\0\0\0\0\0", 7);
	assert_memory_equal(file + 8, golden_header, hlen);
	assert_memory_equal(file + 8 + hlen, golden_data, sizeof golden_data);
	free(file);
}

/* Writes the golden file as dir/model.safetensors. */
static void
put_golden(const struct fixture *fx)
{
	size_t hlen = strlen(golden_header);
	uint8_t *buf = xcalloc(1, 8 + hlen + sizeof golden_data);

	buf[0] = (uint8_t)hlen;
	memcpy(buf + 8, golden_header, hlen);
	memcpy(buf + 8 + hlen, golden_data, sizeof golden_data);
	put(fx, "model.safetensors", buf, 8 + hlen + sizeof golden_data);
	free(buf);
}

/* The reader reads the package's file: order, GGML shapes, data. */
static void
test_read_golden(void **state)
{
	struct fixture *fx = *state;
	const struct st_tensor *t;
	struct st_model *m;

	put_golden(fx);
	m = open_ok(fx);
	assert_int_equal(st_n_tensors(m), 3);
	t = st_tensor(m, 0);
	assert_string_equal(t->name, "embed.weight");
	assert_int_equal(t->type, TT_F32);
	assert_int_equal(t->n_dims, 2);
	assert_int_equal(t->ne[0], 3);
	assert_int_equal(t->ne[1], 2);
	assert_int_equal(t->ne[2], 1);
	assert_int_equal(t->n_elems, 6);
	assert_int_equal(t->bytes, 24);
	assert_memory_equal(t->data, golden_data, 24);
	t = st_tensor(m, 1);
	assert_string_equal(t->name, "z");
	assert_int_equal(t->n_dims, 0);
	assert_int_equal(t->n_elems, 1);
	assert_memory_equal(t->data, golden_data + 24, 4);
	t = st_find(m, "norm");
	assert_ptr_equal(t, st_tensor(m, 2));
	assert_int_equal(t->type, TT_F16);
	assert_int_equal(t->ne[0], 4);
	assert_memory_equal(t->data, golden_data + 28, 8);
	assert_null(st_find(m, "nor"));
	assert_null(st_find(m, "__metadata__"));
	assert_null(st_tensor(m, 3));
	assert_null(st_tensor(m, -1));
	st_close(m);
}

/* Every type and rank survives a round trip, each tensor aligned to its element size. */
static void
test_roundtrip(void **state)
{
	struct fixture *fx = *state;
	struct st_writer *w = st_writer_new();
	const int64_t ne4[] = { 2, 3, 1, 2 }, ne3[] = { 5, 1, 3 }, ne1[] = { 3 }, ne0[] = { 0, 4 };
	static const char *const order[] = { "b", "empty", "x", "a.bf16", "w.f16" };
	uint16_t h[12], bf[15];
	float f[3] = { 1.5f, -2.0f, 3.25f }, one = 42.0f;
	const struct st_tensor *t;
	struct st_model *m;
	size_t i, len;
	char *file;

	for (i = 0; i < 12; i++)
		h[i] = fp32_to_fp16((float)i - 6.0f);
	for (i = 0; i < 15; i++)
		bf[i] = fp32_to_bf16((float)i * 0.25f);
	add(w, "w.f16", TT_F16, 4, ne4, h, sizeof h);
	add(w, "a.bf16", TT_BF16, 3, ne3, bf, sizeof bf);
	add(w, "x", TT_F32, 1, ne1, f, sizeof f);
	add(w, "empty", TT_F32, 2, ne0, NULL, 0);
	add(w, "b", TT_F32, 0, NULL, &one, sizeof one);
	save(fx, w, "model.safetensors");
	file = slurp(fx, "model.safetensors", &len);
	assert_int_equal(((uint8_t)file[0] | (uint8_t)file[1] << 8) % 8, 0);
	free(file);

	m = open_ok(fx);
	assert_int_equal(st_n_tensors(m), 5);
	for (i = 0; i < 5; i++)
		assert_string_equal(st_tensor(m, (int64_t)i)->name, order[i]);
	t = st_find(m, "w.f16");
	assert_int_equal(t->n_dims, 4);
	assert_memory_equal(t->ne, ne4, sizeof ne4);
	assert_int_equal(t->n_elems, 12);
	assert_memory_equal(t->data, h, sizeof h);
	assert_int_equal((uintptr_t)t->data % 2, 0);
	t = st_find(m, "a.bf16");
	assert_int_equal(t->type, TT_BF16);
	assert_int_equal(t->n_dims, 3);
	assert_int_equal(t->ne[0], 5);
	assert_int_equal(t->ne[2], 3);
	assert_int_equal(t->ne[3], 1);
	assert_memory_equal(t->data, bf, sizeof bf);
	t = st_find(m, "x");
	assert_memory_equal(t->data, f, sizeof f);
	assert_int_equal((uintptr_t)t->data % 4, 0);
	t = st_find(m, "empty");
	assert_int_equal(t->n_elems, 0);
	assert_int_equal(t->bytes, 0);
	assert_int_equal(t->ne[1], 4);
	assert_int_equal(*(const float *)st_find(m, "b")->data, 42.0f);
	st_close(m);
}

/* The writer refuses what it cannot write, saying why. */
static void
test_writer_errors(void **state)
{
	struct st_writer *w = st_writer_new();
	const int64_t ne[] = { 2, 2, 1, 1, 1 }, neg[] = { -1 };
	float f[4] = { 0 };
	char err[ERR_LEN];

	(void)state;
	add(w, "a", TT_F32, 2, ne, f, sizeof f);
	assert_int_equal(st_w_tensor(w, "a", TT_F32, 2, ne, f, sizeof f, err), ERR_INVAL);
	assert_non_null(strstr(err, "added twice"));
	assert_int_equal(st_w_tensor(w, "q", TT_Q4_K, 1, ne, f, sizeof f, err), ERR_INVAL);
	assert_non_null(strstr(err, "cannot be written"));
	assert_int_equal(st_w_tensor(w, "d", TT_F32, 5, ne, f, sizeof f, err), ERR_INVAL);
	assert_non_null(strstr(err, "5 dimensions"));
	assert_int_equal(st_w_tensor(w, "s", TT_F32, 2, ne, f, 12, err), ERR_INVAL);
	assert_non_null(strstr(err, "12 bytes of data for 4 elements"));
	assert_int_equal(st_w_tensor(w, "n", TT_F32, 1, neg, f, 0, err), ERR_INVAL);
	assert_int_equal(st_w_tensor(w, "", TT_F32, 2, ne, f, sizeof f, err), ERR_INVAL);
	assert_int_equal(st_w_tensor(w, "__metadata__", TT_F32, 2, ne, f, sizeof f, err), ERR_INVAL);
	assert_int_equal(st_w_tensor(w, "a\nb", TT_F32, 2, ne, f, sizeof f, err), ERR_INVAL);
	assert_int_equal(st_w_tensor(w, "\xff", TT_F32, 2, ne, f, sizeof f, err), ERR_INVAL);
	st_writer_free(w);
}

/* A file cut at any byte is refused. */
static void
test_truncated(void **state)
{
	struct fixture *fx = *state;
	struct st_model *m;
	char err[ERR_LEN];
	size_t len, cut;
	char *file;

	save(fx, golden_writer(), "full.safetensors");
	file = slurp(fx, "full.safetensors", &len);
	for (cut = 0; cut < len; cut++) {
		put(fx, "model.safetensors", file, cut);
		err[0] = '\0';
		m = NULL;
		if (st_open_dir(fx->dir, &m, err) >= 0)
			fail_msg("a file cut at %zu of %zu bytes was accepted", cut, len);
		assert_null(m);
		assert_true(strlen(err) > 0);
	}
	put(fx, "model.safetensors", file, len);
	st_close(open_ok(fx));
	free(file);
}

/* Malformed headers, each with the code and message it must give. */
static void
test_hostile_headers(void **state)
{
	static const struct {
		const char *header;
		size_t data;
		int code;
		const char *msg;
	} cases[] = {
		{ "{\"a\":", 0, ERR_FORMAT, "not valid JSON" },
		{ "[1,2]", 0, ERR_FORMAT, "not a JSON object" },
		{ " {}", 0, ERR_FORMAT, "not a JSON object" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, ERR_FORMAT,
		  "duplicate" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, ERR_FORMAT,
		  "past the 4 bytes" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, ERR_FORMAT,
		  "'b' at data offset 4 overlaps" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, ERR_FORMAT,
		  "leaves a gap" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, ERR_FORMAT,
		  "leaves a gap" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, ERR_FORMAT,
		  "cover 4 of the 8 bytes" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, ERR_FORMAT,
		  "do not span its 3 elements" },
		{ "{\"a\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, ERR_FORMAT,
		  "end before" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8, ERR_FORMAT,
		  "pair of non-negative" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, ERR_FORMAT,
		  "pair of non-negative" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4, ERR_FORMAT,
		  "pair of non-negative" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, ERR_FORMAT, "pair of non-negative" },
		{ "{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
		  ERR_UNSUPPORTED, "tensor 'a' has dtype I64 (only F32, F16 and BF16" },
		{ "{\"a\":{\"dtype\":\"Q9X\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
		  ERR_UNSUPPORTED, "dtype Q9X" },
		{ "{\"\\u0001x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
		  ERR_UNSUPPORTED, "tensor '?x' has dtype F64" },
		{ "{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT,
		  "no dtype string" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
		  ERR_UNSUPPORTED, "5 dimensions" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT,
		  "dimension 0 is not" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,4]}}", 4, ERR_FORMAT,
		  "shape is not an array" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,2],\"data_offsets\":[0,4]}}",
		  4, ERR_FORMAT, "element count overflows" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
		  4, ERR_FORMAT, "element count overflows" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}",
		  4, ERR_FORMAT, "do not span" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952],\"data_offsets\":[0,4]}}",
		  4, ERR_FORMAT, "do not span" },
		{ "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}",
		  4, ERR_FORMAT, "not valid JSON" },
		{ "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT,
		  "empty name" },
		{ "{\"a\":[1]}", 0, ERR_FORMAT, "'a' is not an object" },
	};
	struct fixture *fx = *state;
	size_t i;

	for (i = 0; i < ARRAY_LEN(cases); i++) {
		put_raw(fx, strlen(cases[i].header), cases[i].header, cases[i].data);
		open_fails(fx, cases[i].code, cases[i].msg);
	}
}

/* Deep nesting is refused by the parser rather than overflowing the stack. */
static void
test_deep_json(void **state)
{
	struct fixture *fx = *state;
	size_t depth = 100000, i;
	char *h = xmalloc(2 * depth + 32);
	char *p = h;

	p += sprintf(p, "{\"__metadata__\":");
	for (i = 0; i < depth; i++)
		*p++ = '[';
	for (i = 0; i < depth; i++)
		*p++ = ']';
	strcpy(p, "}");
	put_raw(fx, strlen(h), h, 0);
	open_fails(fx, ERR_FORMAT, "not valid JSON");
	free(h);
}

/* A length field beyond the limit or the file is refused before anything is parsed. */
static void
test_header_length(void **state)
{
	struct fixture *fx = *state;
	struct st_model *m;

	put_raw(fx, UINT64_MAX, "{}", 0);
	open_fails(fx, ERR_FORMAT, "over the 100000000-byte limit");
	put_raw(fx, (uint64_t)ST_MAX_HEADER + 1, "{}", 0);
	open_fails(fx, ERR_FORMAT, "over the");
	put_raw(fx, 3, "{}", 0);
	open_fails(fx, ERR_FORMAT, "past the end of the 10-byte file");
	put_raw(fx, 0, "", 0);
	open_fails(fx, ERR_FORMAT, "not a JSON object");
	put_raw(fx, 2, "", 0);
	open_fails(fx, ERR_FORMAT, "past the end");
	put(fx, "model.safetensors", "\2\0\0\0", 4);
	open_fails(fx, ERR_FORMAT, "too short");
	/* metadata alone: a valid file without tensors */
	put_raw(fx, 26, "{\"__metadata__\":{\"k\":\"v\"}}", 0);
	m = open_ok(fx);
	assert_int_equal(st_n_tensors(m), 0);
	assert_null(st_find(m, "k"));
	st_close(m);
}

/* Writes the two shards of the sharded tests: a, b in SHARD1; c (and extra, if not NULL) in SHARD2. */
static void
put_shards(const struct fixture *fx, const char *extra)
{
	struct st_writer *w = st_writer_new();
	const int64_t ne[] = { 2 };
	const float fa[2] = { 1, 2 }, fb[2] = { 3, 4 }, fc[2] = { 5, 6 };

	add(w, "a", TT_F32, 1, ne, fa, sizeof fa);
	add(w, "b", TT_F32, 1, ne, fb, sizeof fb);
	save(fx, w, SHARD1);
	w = st_writer_new();
	add(w, "c", TT_F32, 1, ne, fc, sizeof fc);
	if (extra != NULL)
		add(w, extra, TT_F32, 1, ne, fc, sizeof fc);
	save(fx, w, SHARD2);
}

/* Writes the index with this weight_map body. */
static void
put_index(const struct fixture *fx, const char *weight_map)
{
	char buf[1024];

	snprintf(buf, sizeof buf, "{\"metadata\":{\"total_size\":24},\"weight_map\":{%s}}", weight_map);
	put(fx, "model.safetensors.index.json", buf, strlen(buf));
}

#define MAP_AB "\"a\":\"" SHARD1 "\",\"b\":\"" SHARD1 "\""

/* A sharded model reads as one, shard by shard. */
static void
test_sharded(void **state)
{
	struct fixture *fx = *state;
	struct st_model *m;

	put_shards(fx, NULL);
	put_index(fx, "\"c\":\"" SHARD2 "\"," MAP_AB);
	m = open_ok(fx);
	assert_int_equal(st_n_tensors(m), 3);
	assert_string_equal(st_tensor(m, 0)->name, "a");
	assert_string_equal(st_tensor(m, 2)->name, "c");
	assert_int_equal(((const float *)st_find(m, "c")->data)[1], 6.0f);
	assert_int_equal(((const float *)st_find(m, "b")->data)[0], 3.0f);
	st_close(m);
}

/* Index and shards must agree on every tensor. */
static void
test_sharded_mismatch(void **state)
{
	struct fixture *fx = *state;

	put_shards(fx, NULL);
	put_index(fx, MAP_AB ",\"c\":\"" SHARD2 "\",\"d\":\"" SHARD2 "\"");
	open_fails(fx, ERR_FORMAT, "tensor 'd' is not in its shard " SHARD2);
	put_index(fx, "\"a\":\"" SHARD1 "\",\"c\":\"" SHARD2 "\"");
	open_fails(fx, ERR_FORMAT, "tensor 'b' of shard " SHARD1 " is not listed");
	put_index(fx, MAP_AB ",\"c\":\"" SHARD1 "\"");
	open_fails(fx, ERR_FORMAT, "tensor 'c' is not in its shard " SHARD1);
	put_shards(fx, "a");
	put_index(fx, MAP_AB ",\"c\":\"" SHARD2 "\"");
	open_fails(fx, ERR_FORMAT, "tensor 'a' is in both");
	put_shards(fx, "e");
	put_index(fx, MAP_AB ",\"c\":\"" SHARD2 "\",\"e\":\"" SHARD1 "\"");
	open_fails(fx, ERR_FORMAT, "tensor 'e' ");
}

/* Bad index files and shard names outside the directory are refused. */
static void
test_bad_index(void **state)
{
	static const struct {
		const char *index;
		int code;
		const char *msg;
	} cases[] = {
		{ "{\"weight_map\":{\"a\":\"../x.safetensors\"}}", ERR_FORMAT, "'../x.safetensors' is not" },
		{ "{\"weight_map\":{\"a\":\"/etc/passwd\"}}", ERR_FORMAT, "'/etc/passwd' is not" },
		{ "{\"weight_map\":{\"a\":\"sub/x.safetensors\"}}", ERR_FORMAT, "is not a file name" },
		{ "{\"weight_map\":{\"a\":\"..\"}}", ERR_FORMAT, "is not a file name" },
		{ "{\"weight_map\":{\"a\":\".\"}}", ERR_FORMAT, "is not a file name" },
		{ "{\"weight_map\":{\"a\":\"\"}}", ERR_FORMAT, "is not a file name" },
		{ "{\"weight_map\":{\"a\":3}}", ERR_FORMAT, "shard of tensor 'a' is not a string" },
		{ "{\"weight_map\":{}}", ERR_FORMAT, "no weight_map" },
		{ "{\"metadata\":{}}", ERR_FORMAT, "no weight_map" },
		{ "{\"weight_map\":[\"a\"]}", ERR_FORMAT, "no weight_map" },
		{ "{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", ERR_FORMAT, "duplicate" },
		{ "{\"weight_map\":", ERR_FORMAT, "line 1" },
		{ "{\"weight_map\":{\"a\":\"missing.safetensors\"}}", ERR_IO, "missing.safetensors: No such" },
	};
	struct fixture *fx = *state;
	size_t i;

	for (i = 0; i < ARRAY_LEN(cases); i++) {
		put(fx, "model.safetensors.index.json", cases[i].index, strlen(cases[i].index));
		open_fails(fx, cases[i].code, cases[i].msg);
	}
}

/* model.safetensors wins over an index, as in transformers; an empty directory has neither. */
static void
test_dir_choice(void **state)
{
	struct fixture *fx = *state;
	struct st_model *m = NULL;
	char err[ERR_LEN];

	open_fails(fx, ERR_NOTFOUND, "no model.safetensors or model.safetensors.index.json");
	put_index(fx, "\"a\":\"../x\"");
	save(fx, golden_writer(), "model.safetensors");
	m = open_ok(fx);
	assert_int_equal(st_n_tensors(m), 3);
	st_close(m);
	m = NULL;
	assert_int_equal(st_open_file(fx->dir, &m, err), ERR_IO);
	assert_non_null(strstr(err, "not a regular file"));
	assert_null(m);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_writer_matches_package, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_golden, setup, teardown),
		cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
		cmocka_unit_test(test_writer_errors),
		cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hostile_headers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_deep_json, setup, teardown),
		cmocka_unit_test_setup_teardown(test_header_length, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sharded, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sharded_mismatch, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_index, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dir_choice, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
