/*
 * fuzz_safetensors.c: libFuzzer target for the safetensors reader
 * (daemon/model/safetensors.c), both ways a model is opened.
 *
 * Input: byte 0 even: the rest is one .safetensors file (st_open_file).
 * Byte 0 odd: a sharded directory (st_open_dir): bytes 1-2 (big-endian)
 * are the length of model.safetensors.index.json, which follows; then a
 * 4-byte length and the shard a.safetensors; the remaining bytes are the
 * shard b.safetensors (seeds name those two in their weight_map).
 *
 * Whatever the input, the reader refuses it with a message, or every
 * tensor it hands out lies inside the mapping (each byte read here would
 * be an ASan report otherwise) and is found again by its name.
 *
 * Run (from a build configured with --enable-fuzz CC=clang):
 *   tests/fuzz/fuzz_safetensors -max_total_time=600 CORPUS $(SRCDIR)/tests/fuzz/corpus/safetensors
 */
#include "config.h"
#include "fuzz.h"
#include "safetensors.h"
#include "util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The directory of the sharded case, made once per process. */
static const char *
shard_dir(void)
{
	static char dir[64];

	if (dir[0] == '\0') {
		snprintf(dir, sizeof dir, "/dev/shm/fuzz_st.%d.XXXXXX", (int)getpid());
		if (mkdtemp(dir) == NULL) {
			snprintf(dir, sizeof dir, "/tmp/fuzz_st.%d.XXXXXX", (int)getpid());
			FUZZ_CHECK(mkdtemp(dir) != NULL);
		}
	}
	return dir;
}

/* Reads every tensor's first and last byte and looks each up by name. */
static void
touch_all(const struct st_model *m)
{
	volatile unsigned sink = 0;
	int64_t i;

	for (i = 0; i < st_n_tensors(m); i++) {
		const struct st_tensor *t = st_tensor(m, i);

		FUZZ_CHECK(t->name != NULL && st_find(m, t->name) == t);
		FUZZ_CHECK(t->n_dims >= 0 && t->n_dims <= ST_MAX_DIMS && t->n_elems >= 0);
		if (t->bytes > 0)
			sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->bytes - 1];
	}
	(void)sink;
}

/* Opens a sharded directory made of the input's parts. */
static int
open_sharded(const uint8_t *data, size_t size, struct st_model **m, char *err)
{
	const char *dir = shard_dir();
	size_t n_index, n_a;

	if (size < 2)
		return -1;
	n_index = (size_t)data[0] << 8 | data[1];
	data += 2, size -= 2;
	if (n_index > size || size - n_index < 4)
		return -1;
	fuzz_write(dir, "model.safetensors.index.json", data, n_index);
	data += n_index, size -= n_index;
	n_a = (size_t)data[0] << 24 | (size_t)data[1] << 16 | (size_t)data[2] << 8 | data[3];
	data += 4, size -= 4;
	if (n_a > size)
		return -1;
	fuzz_write(dir, "a.safetensors", data, n_a);
	fuzz_write(dir, "b.safetensors", data + n_a, size - n_a);
	return st_open_dir(dir, m, err);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_model *m = NULL;
	char err[ERR_LEN], path[FUZZ_PATH_LEN];
	int fd, rc;

	if (size < 1)
		return 0;
	err[0] = '\0';
	if (data[0] & 1) {
		rc = open_sharded(data + 1, size - 1, &m, err);
		if (rc == -1 && err[0] == '\0')
			return 0;
	} else {
		fd = fuzz_memfile(data + 1, size - 1, path);
		rc = st_open_file(path, &m, err);
		close(fd);
	}
	if (rc == 0) {
		touch_all(m);
		st_close(m);
	} else {
		FUZZ_CHECK(rc < 0 && err[0] != '\0' && memchr(err, '\0', ERR_LEN) != NULL);
	}
	return 0;
}
