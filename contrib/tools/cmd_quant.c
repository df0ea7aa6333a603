/*
 * cmd_quant.c: resident-model dequant and quantize. They run our
 * (de)quantizers on plain files, so that tests/py/test_dequant.py can hold
 * them against the gguf Python package, and a person can inspect a model's
 * tensors with numpy.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "gguf.h"
#include "quant.h"
#include "util.h"

static int write_file(const char *path, const void *data, size_t len, char *err);
static int dequant_tensor(const struct gguf_tensor *t, const char *path,
    char *err);
static int quantize_file(uint32_t type, const char *in, const char *out,
    char *err);

/* Writes len bytes to path, replacing it. */
static int
write_file(const char *path, const void *data, size_t len, char *err)
{
	FILE *f = fopen(path, "wb");
	size_t n;
	int bad;

	if (f == NULL)
		return err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
	n = fwrite(data, 1, len, f);
	bad = ferror(f);
	if (fclose(f) != 0 || bad || n != len)
		return err_set(err, ERR_IO, "%s: write failed", path);
	return 0;
}

/* Writes all elements of a tensor, as little-endian float32, to path. */
static int
dequant_tensor(const struct gguf_tensor *t, const char *path, char *err)
{
	size_t bytes;
	float *y;
	int rc;

	if (mul_size((size_t)t->n_elems, sizeof *y, &bytes) != 0)
		return err_set(err, ERR_RANGE, "tensor %.*s is too large",
		    (int)t->name.n, t->name.s);
	y = xmalloc(bytes);
	quant_dequantize(t->type, t->data, y, t->n_elems);
	rc = write_file(path, y, bytes, err);
	free(y);
	return rc;
}

/*
 * dequant FILE OUTDIR: tensor i, in file order, goes to OUTDIR/<i>.f32.
 * gguf_open has checked every tensor's type and size.
 */
int
cmd_dequant(int argc, char **argv)
{
	char err[ERR_LEN], path[4096];
	struct gguf_file *f;
	int64_t i, n;
	int rc = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: resident-model dequant FILE OUTDIR\n");
		return 2;
	}
	if (gguf_open(argv[1], &f, err) != 0) {
		fprintf(stderr, "resident-model dequant: %s\n", err);
		return 1;
	}
	n = gguf_n_tensors(f);
	for (i = 0; i < n && rc == 0; i++) {
		if ((size_t)snprintf(path, sizeof path, "%s/%lld.f32", argv[2],
		    (long long)i) >= sizeof path)
			rc = err_set(err, ERR_RANGE, "%s: path too long", argv[2]);
		else
			rc = dequant_tensor(gguf_tensor(f, i), path, err);
	}
	gguf_close(f);
	if (rc != 0) {
		fprintf(stderr, "resident-model dequant: %s\n", err);
		return 1;
	}
	return 0;
}

/* Quantizes the float32 values of file in to type, as raw blocks in out. */
static int
quantize_file(uint32_t type, const char *in, const char *out, char *err)
{
	const struct quant_traits *qt = quant_traits(type);
	char *data;
	size_t len, bytes;
	void *q;
	int rc;

	if ((rc = read_file(in, &data, &len, err)) != 0)
		return rc;
	if (len % sizeof(float) != 0) {
		free(data);
		return err_set(err, ERR_FORMAT, "%s: %zu bytes is not a whole "
		    "number of float32 values", in, len);
	}
	if (quant_row_bytes(type, (int64_t)(len / sizeof(float)), &bytes) != 0) {
		free(data);
		return err_set(err, ERR_FORMAT, "%s: %zu values are not a whole "
		    "number of %s blocks of %d", in, len / sizeof(float),
		    qt->name, qt->block_elems);
	}
	q = xmalloc(bytes);
	rc = quant_quantize(type, (const float *)data, q,
	    (int64_t)(len / sizeof(float)));
	free(data);
	if (rc == 0)
		rc = write_file(out, q, bytes, err);
	else if (rc == ERR_INVAL)
		err_set(err, rc, "%s: a value is NaN or infinite, which %s cannot "
		    "hold", in, qt->name);
	else
		err_set(err, rc, "cannot quantize to %s", qt->name);
	free(q);
	return rc;
}

/* quantize TYPE IN.f32 OUT.bin: raw float32 in, raw blocks out. */
int
cmd_quantize(int argc, char **argv)
{
	char err[ERR_LEN];
	int type;

	if (argc != 4) {
		fprintf(stderr, "usage: resident-model quantize TYPE IN.f32 OUT.bin\n");
		return 2;
	}
	if ((type = quant_type_from_name(argv[1])) < 0) {
		fprintf(stderr, "resident-model quantize: unknown type %s\n", argv[1]);
		return 1;
	}
	if (quantize_file((uint32_t)type, argv[2], argv[3], err) != 0) {
		fprintf(stderr, "resident-model quantize: %s\n", err);
		return 1;
	}
	return 0;
}
