/*
 * gguf.c: GGUF reader and writer.
 *
 * The reader maps the file and validates all of it before anything else
 * looks inside: every length is checked against the bytes left, every count
 * against the smallest size its elements can have (so a hostile count cannot
 * make us allocate more than the file could describe), every tensor against
 * the data section. After gguf_open succeeds, accessors need no checks.
 */
#include "config.h"
#include "gguf.h"
#include "quant.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
/* Keys and tensor names longer than this are certainly not real. */
#define GGUF_MAX_NAME 65535

/*
 * Names (keys, tensor names) are looked up through an open-addressing hash
 * table of indices, so that neither lookups nor the duplicate checks of a
 * file with many entries cost quadratic time.
 */
struct name_index {
	int64_t *slot; /* index + 1; 0 means empty */
	size_t mask;
};

struct gguf_kv {
	struct gguf_str key;
	enum gguf_vtype type;
	const uint8_t *val;      /* scalar bytes, string length field, or first array element */
	enum gguf_vtype arr_type;
	uint64_t arr_n;
	const uint8_t **arr_str; /* for string arrays: where each element starts */
};

struct gguf_file {
	const uint8_t *base;
	size_t size;
	int mapped;
	uint32_t version;
	uint32_t alignment;
	size_t data_offset;
	int64_t n_kv;
	struct gguf_kv *kv;
	struct name_index kv_index;
	int64_t n_tensors;
	struct gguf_tensor *tensors;
	struct name_index tensor_index;
};

/* A read position with the error buffer, for the parser. */
struct cursor {
	const uint8_t *base;
	size_t size;
	size_t pos;
	char *err;
};

static const size_t vtype_size[GGUF_VTYPE_COUNT_] = {
	[GGUF_U8] = 1, [GGUF_I8] = 1, [GGUF_U16] = 2, [GGUF_I16] = 2,
	[GGUF_U32] = 4, [GGUF_I32] = 4, [GGUF_F32] = 4, [GGUF_BOOL] = 1,
	[GGUF_STRING] = 8, /* its length field: the minimum a string takes */
	[GGUF_ARRAY] = 12, /* element type + count */
	[GGUF_U64] = 8, [GGUF_I64] = 8, [GGUF_F64] = 8,
};

static const char *const vtype_name[GGUF_VTYPE_COUNT_] = {
	"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
	"array", "u64", "i64", "f64",
};

/* Sizes the table for n names (at most half full). */
static void
index_init(struct name_index *ix, int64_t n)
{
	size_t cap = 16;

	while (cap < (size_t)n * 2)
		cap *= 2;
	ix->slot = xcalloc(cap, sizeof *ix->slot);
	ix->mask = cap - 1;
}

/*
 * Finds the name in the table; name_of gives the name stored at an index.
 * Returns the index, or -1 and, if slot_out, the empty slot where it belongs.
 */
static int64_t
index_find(const struct name_index *ix, const struct gguf_str *(*name_of)(const void *, int64_t),
    const void *arr, const char *s, uint64_t n, size_t *slot_out)
{
	size_t h;
	const struct gguf_str *cand;

	if (ix->slot == NULL)
		return -1;
	for (h = hash64(HASH64_START, s, (size_t)n) & ix->mask;; h = (h + 1) & ix->mask) {
		if (ix->slot[h] == 0) {
			if (slot_out != NULL)
				*slot_out = h;
			return -1;
		}
		cand = name_of(arr, ix->slot[h] - 1);
		if (cand->n == n && memcmp(cand->s, s, n) == 0)
			return ix->slot[h] - 1;
	}
}

static const struct gguf_str *
kv_name(const void *arr, int64_t i)
{
	return &((const struct gguf_kv *)arr)[i].key;
}

static const struct gguf_str *
tensor_name(const void *arr, int64_t i)
{
	return &((const struct gguf_tensor *)arr)[i].name;
}

/* Bytes left after the cursor. */
static size_t
cur_left(const struct cursor *c)
{
	return c->size - c->pos;
}

/* Takes n bytes, or fails naming what was being read. */
static int
cur_take(struct cursor *c, size_t n, const void **p, const char *what)
{
	if (n > cur_left(c))
		return err_set(c->err, ERR_FORMAT,
		    "truncated file: %s at offset %zu needs %zu bytes, %zu left",
		    what, c->pos, n, cur_left(c));
	*p = c->base + c->pos;
	c->pos += n;
	return 0;
}

static int
cur_u32(struct cursor *c, uint32_t *v, const char *what)
{
	const void *p = NULL;
	int rc = cur_take(c, 4, &p, what);

	if (rc == 0)
		memcpy(v, p, 4);
	return rc;
}

static int
cur_u64(struct cursor *c, uint64_t *v, const char *what)
{
	const void *p = NULL;
	int rc = cur_take(c, 8, &p, what);

	if (rc == 0)
		memcpy(v, p, 8);
	return rc;
}

/* Reads a length-prefixed string; names longer than maxlen are refused. */
static int
cur_str(struct cursor *c, struct gguf_str *s, uint64_t maxlen, const char *what)
{
	const void *p = NULL;
	uint64_t n;
	int rc;

	if ((rc = cur_u64(c, &n, what)) != 0)
		return rc;
	if (n > maxlen)
		return err_set(c->err, ERR_FORMAT, "%s at offset %zu: length %llu is too long",
		    what, c->pos - 8, (unsigned long long)n);
	if ((rc = cur_take(c, (size_t)n, &p, what)) != 0)
		return rc;
	s->s = p;
	s->n = n;
	return 0;
}

/* Checks that count elements of at least min_size bytes each can fit. */
static int
cur_fits(struct cursor *c, uint64_t count, size_t min_size, const char *what)
{
	if (min_size != 0 && count > cur_left(c) / min_size)
		return err_set(c->err, ERR_FORMAT,
		    "%s: count %llu at offset %zu cannot fit in the %zu bytes left",
		    what, (unsigned long long)count, c->pos, cur_left(c));
	return 0;
}

/* Reads an array value: element type, count, elements. */
static int
parse_array(struct cursor *c, struct gguf_kv *kv)
{
	uint32_t et;
	uint64_t n, j;
	struct gguf_str s;
	const void *p = NULL;
	int rc;

	if ((rc = cur_u32(c, &et, "array type")) != 0 || (rc = cur_u64(c, &n, "array count")) != 0)
		return rc;
	if (et >= GGUF_VTYPE_COUNT_)
		return err_set(c->err, ERR_FORMAT, "unknown array element type %u", et);
	if (et == GGUF_ARRAY)
		return err_set(c->err, ERR_UNSUPPORTED, "nested arrays are not supported");
	if ((rc = cur_fits(c, n, vtype_size[et], "array")) != 0)
		return rc;
	kv->arr_type = et;
	kv->arr_n = n;
	kv->val = c->base + c->pos;
	if (et != GGUF_STRING)
		return cur_take(c, (size_t)n * vtype_size[et], &p, "array data");
	kv->arr_str = xmalloc((size_t)(n ? n : 1) * sizeof *kv->arr_str);
	for (j = 0; j < n; j++) {
		kv->arr_str[j] = c->base + c->pos;
		if ((rc = cur_str(c, &s, UINT64_MAX, "array string")) != 0)
			return rc;
	}
	return 0;
}

/* Reads the value of one key/value pair. */
static int
parse_value(struct cursor *c, struct gguf_kv *kv)
{
	struct gguf_str s;
	const void *p = NULL;
	int rc;

	kv->val = c->base + c->pos;
	switch (kv->type) {
	case GGUF_STRING:
		return cur_str(c, &s, UINT64_MAX, "string value");
	case GGUF_ARRAY:
		return parse_array(c, kv);
	case GGUF_BOOL:
		if ((rc = cur_take(c, 1, &p, "bool value")) != 0)
			return rc;
		if (*(const uint8_t *)p > 1)
			return err_set(c->err, ERR_FORMAT, "bool value %u is neither 0 nor 1",
			    *(const uint8_t *)p);
		return 0;
	default:
		return cur_take(c, vtype_size[kv->type], &p, "value");
	}
}

/* Reads every key/value pair and checks the keys are unique. */
static int
parse_kvs(struct gguf_file *f, struct cursor *c, uint64_t n_kv)
{
	uint32_t type;
	int64_t i;
	int rc;

	/* key length + type: 12 bytes, plus at least one byte of value */
	if ((rc = cur_fits(c, n_kv, 13, "key/value count")) != 0)
		return rc;
	f->kv = xcalloc((size_t)(n_kv ? n_kv : 1), sizeof *f->kv);
	index_init(&f->kv_index, (int64_t)n_kv);
	for (i = 0; i < (int64_t)n_kv; i++) {
		struct gguf_kv *kv = &f->kv[i];
		size_t slot = 0; /* set by index_find: the table exists here */

		f->n_kv = i + 1; /* so that gguf_close frees what was allocated */
		if ((rc = cur_str(c, &kv->key, GGUF_MAX_NAME, "key")) != 0 ||
		    (rc = cur_u32(c, &type, "value type")) != 0)
			return rc;
		if (type >= GGUF_VTYPE_COUNT_)
			return err_set(c->err, ERR_FORMAT, "key '%.*s': unknown value type %u",
			    (int)MIN(kv->key.n, 64), kv->key.s, type);
		kv->type = type;
		if ((rc = parse_value(c, kv)) != 0)
			return err_prefix(c->err, rc, "key '%.*s'", (int)MIN(kv->key.n, 64), kv->key.s);
		if (index_find(&f->kv_index, kv_name, f->kv, kv->key.s, kv->key.n, &slot) >= 0)
			return err_set(c->err, ERR_FORMAT, "duplicate key '%.*s'",
			    (int)MIN(kv->key.n, 64), kv->key.s);
		f->kv_index.slot[slot] = i + 1;
	}
	return 0;
}

/* Reads one tensor's directory entry and checks its shape and type. */
static int
parse_tensor_info(struct cursor *c, struct gguf_tensor *t)
{
	const struct quant_traits *qt;
	uint64_t d;
	uint32_t i;
	int rc;

	if ((rc = cur_str(c, &t->name, GGUF_MAX_NAME, "tensor name")) != 0 ||
	    (rc = cur_u32(c, &t->n_dims, "tensor dimension count")) != 0)
		return rc;
	if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
		return err_set(c->err, ERR_FORMAT, "%u dimensions (1..%d allowed)",
		    t->n_dims, GGUF_MAX_DIMS);
	t->n_elems = 1;
	for (i = 0; i < GGUF_MAX_DIMS; i++) {
		t->ne[i] = 1;
		if (i >= t->n_dims)
			continue;
		if ((rc = cur_u64(c, &d, "tensor dimension")) != 0)
			return rc;
		if (d == 0 || d > (uint64_t)INT64_MAX / (uint64_t)t->n_elems)
			return err_set(c->err, ERR_FORMAT, "dimension %u is %llu (zero or too large)",
			    i, (unsigned long long)d);
		t->ne[i] = (int64_t)d;
		t->n_elems *= (int64_t)d;
	}
	if ((rc = cur_u32(c, &t->type, "tensor type")) != 0 ||
	    (rc = cur_u64(c, &t->offset, "tensor offset")) != 0)
		return rc;
	if ((qt = quant_traits(t->type)) == NULL)
		return err_set(c->err, ERR_UNSUPPORTED, "unknown or unsupported tensor type %u", t->type);
	if (t->ne[0] % qt->block_elems != 0)
		return err_set(c->err, ERR_FORMAT, "row length %lld is not a multiple of the %s block size %d",
		    (long long)t->ne[0], qt->name, qt->block_elems);
	if (mul_size((size_t)(t->n_elems / qt->block_elems), (size_t)qt->block_bytes, &t->bytes) != 0)
		return err_set(c->err, ERR_FORMAT, "tensor size overflows");
	return 0;
}

/* Reads the tensor directory; names must be unique. */
static int
parse_tensors(struct gguf_file *f, struct cursor *c, uint64_t n)
{
	int64_t i;
	size_t slot = 0; /* set by index_find: the table exists here */
	int rc;

	/* name length + n_dims + one dim + type + offset: 32 bytes at least */
	if ((rc = cur_fits(c, n, 32, "tensor count")) != 0)
		return rc;
	f->tensors = xcalloc((size_t)(n ? n : 1), sizeof *f->tensors);
	f->n_tensors = (int64_t)n;
	index_init(&f->tensor_index, (int64_t)n);
	for (i = 0; i < (int64_t)n; i++) {
		struct gguf_tensor *t = &f->tensors[i];

		if ((rc = parse_tensor_info(c, t)) != 0)
			return err_prefix(c->err, rc, "tensor %lld '%.*s'", (long long)i,
			    (int)MIN(t->name.n, 64), t->name.s ? t->name.s : "");
		if (index_find(&f->tensor_index, tensor_name, f->tensors, t->name.s, t->name.n, &slot) >= 0)
			return err_set(c->err, ERR_FORMAT, "duplicate tensor name '%.*s'",
			    (int)MIN(t->name.n, 64), t->name.s);
		f->tensor_index.slot[slot] = i + 1;
	}
	return 0;
}

/* Reads general.alignment if present: a power of two. */
static int
read_alignment(struct gguf_file *f, char *err)
{
	uint32_t a = GGUF_DEFAULT_ALIGNMENT;
	int rc = gguf_get_u32(f, "general.alignment", &a, err);

	if (rc != 0 && rc != ERR_NOTFOUND)
		return rc;
	if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
		return err_set(err, ERR_FORMAT, "general.alignment %u is not a power of two", a);
	f->alignment = a;
	return 0;
}

/* Orders tensor pointers by offset, for the overlap check. */
static int
cmp_offset(const void *a, const void *b)
{
	const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
	const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;

	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Places every tensor in the data section: aligned, inside the file, no overlaps. */
static int
place_tensors(struct gguf_file *f, char *err)
{
	struct gguf_tensor **by_off;
	size_t data_size = f->size - f->data_offset;
	int64_t i;
	int rc = 0;

	for (i = 0; i < f->n_tensors; i++) {
		struct gguf_tensor *t = &f->tensors[i];

		if (t->offset % f->alignment != 0)
			return err_set(err, ERR_FORMAT, "tensor '%.*s': offset %llu is not aligned to %u",
			    (int)MIN(t->name.n, 64), t->name.s, (unsigned long long)t->offset, f->alignment);
		if (t->offset > data_size || t->bytes > data_size - t->offset)
			return err_set(err, ERR_FORMAT,
			    "tensor '%.*s': bytes %llu..%llu lie outside the data section (%zu bytes; file truncated?)",
			    (int)MIN(t->name.n, 64), t->name.s, (unsigned long long)t->offset,
			    (unsigned long long)t->offset + t->bytes, data_size);
		t->data = f->base + f->data_offset + t->offset;
	}
	by_off = xmalloc((size_t)(f->n_tensors ? f->n_tensors : 1) * sizeof *by_off);
	for (i = 0; i < f->n_tensors; i++)
		by_off[i] = &f->tensors[i];
	qsort(by_off, (size_t)f->n_tensors, sizeof *by_off, cmp_offset);
	for (i = 1; i < f->n_tensors && rc == 0; i++) {
		if (by_off[i - 1]->offset + by_off[i - 1]->bytes > by_off[i]->offset)
			rc = err_set(err, ERR_FORMAT, "tensors '%.*s' and '%.*s' overlap",
			    (int)MIN(by_off[i - 1]->name.n, 64), by_off[i - 1]->name.s,
			    (int)MIN(by_off[i]->name.n, 64), by_off[i]->name.s);
	}
	free(by_off);
	return rc;
}

/* Parses the header, metadata and directory of a mapped file. */
static int
gguf_parse(struct gguf_file *f, char *err)
{
	struct cursor c = { f->base, f->size, 0, err };
	const void *magic = NULL;
	uint64_t n_tensors, n_kv;
	size_t pad;
	int rc;

	if ((rc = cur_take(&c, 4, &magic, "magic")) != 0)
		return rc;
	if (memcmp(magic, GGUF_MAGIC, 4) != 0)
		return err_set(err, ERR_FORMAT, "not a GGUF file (bad magic)");
	if ((rc = cur_u32(&c, &f->version, "version")) != 0)
		return rc;
	if (f->version != 2 && f->version != 3)
		return err_set(err, ERR_UNSUPPORTED, "GGUF version %u is not supported (2 and 3 are)",
		    f->version);
	if ((rc = cur_u64(&c, &n_tensors, "tensor count")) != 0 ||
	    (rc = cur_u64(&c, &n_kv, "key/value count")) != 0 ||
	    (rc = parse_kvs(f, &c, n_kv)) != 0 ||
	    (rc = read_alignment(f, err)) != 0 ||
	    (rc = parse_tensors(f, &c, n_tensors)) != 0)
		return rc;
	pad = (f->alignment - c.pos % f->alignment) % f->alignment;
	if (n_tensors > 0 && pad > cur_left(&c))
		return err_set(err, ERR_FORMAT, "truncated file: no data section after the tensor directory");
	f->data_offset = MIN(c.pos + pad, f->size);
	return place_tensors(f, err);
}

int
gguf_open_mem(const void *data, size_t size, struct gguf_file **out, char *err)
{
	struct gguf_file *f = xcalloc(1, sizeof *f);
	int rc;

	f->base = data;
	f->size = size;
	f->alignment = GGUF_DEFAULT_ALIGNMENT;
	if ((rc = gguf_parse(f, err)) != 0) {
		gguf_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

int
gguf_open(const char *path, struct gguf_file **out, char *err)
{
	struct stat st;
	void *map;
	int fd, rc;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return err_set(err, ERR_IO, "%s: not a regular file", path);
	}
	if (st.st_size == 0) {
		close(fd);
		return err_set(err, ERR_FORMAT, "%s: empty file", path);
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return err_set(err, ERR_IO, "%s: mmap: %s", path, strerror(errno));
	if ((rc = gguf_open_mem(map, (size_t)st.st_size, out, err)) != 0) {
		munmap(map, (size_t)st.st_size);
		return err_prefix(err, rc, "%s", path);
	}
	(*out)->mapped = 1;
	return 0;
}

void
gguf_close(struct gguf_file *f)
{
	int64_t i;

	if (f == NULL)
		return;
	for (i = 0; i < f->n_kv; i++)
		free(f->kv[i].arr_str);
	free(f->kv);
	free(f->kv_index.slot);
	free(f->tensors);
	free(f->tensor_index.slot);
	if (f->mapped)
		munmap((void *)f->base, f->size);
	free(f);
}

/* ---- accessors ---- */

uint32_t
gguf_version(const struct gguf_file *f)
{
	return f->version;
}

uint32_t
gguf_alignment(const struct gguf_file *f)
{
	return f->alignment;
}

size_t
gguf_data_offset(const struct gguf_file *f)
{
	return f->data_offset;
}

const void *
gguf_base(const struct gguf_file *f, size_t *size)
{
	if (size != NULL)
		*size = f->size;
	return f->base;
}

int64_t
gguf_n_kv(const struct gguf_file *f)
{
	return f->n_kv;
}

int64_t
gguf_find_key(const struct gguf_file *f, const char *key)
{
	return index_find(&f->kv_index, kv_name, f->kv, key, strlen(key), NULL);
}

struct gguf_str
gguf_kv_key(const struct gguf_file *f, int64_t i)
{
	return f->kv[i].key;
}

enum gguf_vtype
gguf_kv_type(const struct gguf_file *f, int64_t i)
{
	return f->kv[i].type;
}

enum gguf_vtype
gguf_arr_type(const struct gguf_file *f, int64_t i)
{
	return f->kv[i].arr_type;
}

uint64_t
gguf_arr_n(const struct gguf_file *f, int64_t i)
{
	return f->kv[i].type == GGUF_ARRAY ? f->kv[i].arr_n : 0;
}

/* A length-prefixed string at p (validated at open). */
static struct gguf_str
str_at(const uint8_t *p)
{
	struct gguf_str s;

	memcpy(&s.n, p, 8);
	s.s = (const char *)p + 8;
	return s;
}

struct gguf_str
gguf_arr_str(const struct gguf_file *f, int64_t i, uint64_t j)
{
	return str_at(f->kv[i].arr_str[j]);
}

const void *
gguf_arr_data(const struct gguf_file *f, int64_t i)
{
	return f->kv[i].val;
}

/* Widens a scalar of type t at p. */
static double
scalar_f64(enum gguf_vtype t, const uint8_t *p)
{
	union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
		float f32; uint64_t u64; int64_t i64; double f64; } v;

	memcpy(&v, p, vtype_size[t] <= 8 ? vtype_size[t] : 8);
	switch (t) {
	case GGUF_U8: case GGUF_BOOL: return v.u8;
	case GGUF_I8: return v.i8;
	case GGUF_U16: return v.u16;
	case GGUF_I16: return v.i16;
	case GGUF_U32: return v.u32;
	case GGUF_I32: return v.i32;
	case GGUF_F32: return v.f32;
	case GGUF_U64: return (double)v.u64;
	case GGUF_I64: return (double)v.i64;
	case GGUF_F64: return v.f64;
	default: return 0;
	}
}

/* Integer scalar of type t at p, exact for 64-bit types; *ok = 0 if not an integer type. */
static int64_t
scalar_i64(enum gguf_vtype t, const uint8_t *p, int *ok)
{
	uint64_t u;
	int64_t i;

	*ok = 1;
	switch (t) {
	case GGUF_U64: memcpy(&u, p, 8); *ok = u <= INT64_MAX; return (int64_t)u;
	case GGUF_I64: memcpy(&i, p, 8); return i;
	case GGUF_U8: case GGUF_I8: case GGUF_U16: case GGUF_I16: case GGUF_U32: case GGUF_I32:
	case GGUF_BOOL:
		return (int64_t)scalar_f64(t, p);
	default:
		*ok = 0;
		return 0;
	}
}

double
gguf_kv_f64(const struct gguf_file *f, int64_t i)
{
	return scalar_f64(f->kv[i].type, f->kv[i].val);
}

int64_t
gguf_kv_i64(const struct gguf_file *f, int64_t i)
{
	int ok;

	return scalar_i64(f->kv[i].type, f->kv[i].val, &ok);
}

uint64_t
gguf_kv_u64(const struct gguf_file *f, int64_t i)
{
	uint64_t u;

	if (f->kv[i].type == GGUF_U64) {
		memcpy(&u, f->kv[i].val, 8);
		return u;
	}
	return (uint64_t)gguf_kv_i64(f, i);
}

struct gguf_str
gguf_kv_str(const struct gguf_file *f, int64_t i)
{
	return str_at(f->kv[i].val);
}

double
gguf_arr_f64(const struct gguf_file *f, int64_t i, uint64_t j)
{
	return scalar_f64(f->kv[i].arr_type, f->kv[i].val + j * vtype_size[f->kv[i].arr_type]);
}

int64_t
gguf_arr_i64(const struct gguf_file *f, int64_t i, uint64_t j)
{
	int ok;

	return scalar_i64(f->kv[i].arr_type, f->kv[i].val + j * vtype_size[f->kv[i].arr_type], &ok);
}

/* Finds key and checks its type is one of the allowed; returns its index or a code. */
static int64_t
typed_key(const struct gguf_file *f, const char *key, unsigned allowed_mask, char *err)
{
	int64_t i = gguf_find_key(f, key);

	if (i < 0)
		return ERR_NOTFOUND;
	if (!(allowed_mask & (1u << f->kv[i].type)))
		return err_set(err, ERR_FORMAT, "key %s has type %s, not the one expected",
		    key, vtype_name[f->kv[i].type]);
	return i;
}

#define INT_TYPES ((1u << GGUF_U8) | (1u << GGUF_I8) | (1u << GGUF_U16) | (1u << GGUF_I16) | \
	(1u << GGUF_U32) | (1u << GGUF_I32) | (1u << GGUF_U64) | (1u << GGUF_I64))

int
gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *v, char *err)
{
	int64_t i = typed_key(f, key, INT_TYPES, err);
	int ok;
	int64_t x;

	if (i < 0)
		return (int)i;
	x = scalar_i64(f->kv[i].type, f->kv[i].val, &ok);
	if (!ok)
		return err_set(err, ERR_RANGE, "key %s: value out of range", key);
	*v = x;
	return 0;
}

int
gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *v, char *err)
{
	int64_t x;
	int rc = gguf_get_i64(f, key, &x, err);

	if (rc != 0)
		return rc;
	if (x < 0 || x > UINT32_MAX)
		return err_set(err, ERR_RANGE, "key %s: value %lld out of range", key, (long long)x);
	*v = (uint32_t)x;
	return 0;
}

int
gguf_get_f32(const struct gguf_file *f, const char *key, float *v, char *err)
{
	int64_t i = typed_key(f, key, (1u << GGUF_F32) | (1u << GGUF_F64) | INT_TYPES, err);

	if (i < 0)
		return (int)i;
	*v = (float)scalar_f64(f->kv[i].type, f->kv[i].val);
	return 0;
}

int
gguf_hp_i32(const struct gguf_file *f, const char *arch, const char *key, int32_t *v,
    int required, char *err)
{
	char full[128];
	int64_t x;
	int rc;

	snprintf(full, sizeof full, "%s.%s", arch, key);
	rc = gguf_get_i64(f, full, &x, err);
	if (rc == ERR_NOTFOUND && !required)
		return 0;
	if (rc == ERR_NOTFOUND)
		return err_set(err, rc, "missing metadata key %s", full);
	if (rc != 0)
		return rc;
	if (x < 0 || x > INT32_MAX)
		return err_set(err, ERR_RANGE, "%s = %lld is out of range", full, (long long)x);
	*v = (int32_t)x;
	return 0;
}

int
gguf_hp_f32(const struct gguf_file *f, const char *arch, const char *key, float *v, char *err)
{
	char full[128];
	int rc;

	snprintf(full, sizeof full, "%s.%s", arch, key);
	rc = gguf_get_f32(f, full, v, err);
	return rc == ERR_NOTFOUND ? 0 : rc;
}

int
gguf_get_bool(const struct gguf_file *f, const char *key, int *v, char *err)
{
	int64_t i = typed_key(f, key, 1u << GGUF_BOOL, err);

	if (i < 0)
		return (int)i;
	*v = f->kv[i].val[0] != 0;
	return 0;
}

int
gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *v, char *err)
{
	int64_t i = typed_key(f, key, 1u << GGUF_STRING, err);

	if (i < 0)
		return (int)i;
	*v = str_at(f->kv[i].val);
	return 0;
}

int64_t
gguf_n_tensors(const struct gguf_file *f)
{
	return f->n_tensors;
}

const struct gguf_tensor *
gguf_tensor(const struct gguf_file *f, int64_t i)
{
	return &f->tensors[i];
}

const struct gguf_tensor *
gguf_find_tensor(const struct gguf_file *f, const char *name)
{
	int64_t i = index_find(&f->tensor_index, tensor_name, f->tensors, name, strlen(name), NULL);

	return i < 0 ? NULL : &f->tensors[i];
}

int
gguf_str_eq(struct gguf_str a, const char *s)
{
	size_t n = strlen(s);

	return a.n == n && memcmp(a.s, s, n) == 0;
}

/* ---- writer ---- */

struct gguf_w_tensor_info {
	char *name;
	uint32_t type;
	int n_dims;
	int64_t ne[GGUF_MAX_DIMS];
	size_t bytes;
	uint64_t offset;
};

struct gguf_writer {
	uint8_t *kv;             /* the serialized key/value section */
	size_t kv_len, kv_cap;
	uint64_t n_kv;
	struct gguf_w_tensor_info *t;
	size_t n_t, cap_t;
	FILE *fp;
	char *path;
	size_t next;             /* index of the tensor whose data comes next */
	uint64_t pos;            /* bytes written to the data section */
};

struct gguf_writer *
gguf_writer_new(void)
{
	return xcalloc(1, sizeof(struct gguf_writer));
}

void
gguf_writer_free(struct gguf_writer *w)
{
	size_t i;

	if (w == NULL)
		return;
	if (w->fp != NULL)
		fclose(w->fp);
	for (i = 0; i < w->n_t; i++)
		free(w->t[i].name);
	free(w->t);
	free(w->kv);
	free(w->path);
	free(w);
}

/* Appends raw bytes to the key/value section. */
static void
w_bytes(struct gguf_writer *w, const void *p, size_t n)
{
	if (w->kv_len + n > w->kv_cap) {
		w->kv_cap = MAX(w->kv_cap * 2, w->kv_len + n + 4096);
		w->kv = xrealloc(w->kv, w->kv_cap);
	}
	memcpy(w->kv + w->kv_len, p, n);
	w->kv_len += n;
}

static void
w_u32(struct gguf_writer *w, uint32_t v)
{
	w_bytes(w, &v, 4);
}

static void
w_u64(struct gguf_writer *w, uint64_t v)
{
	w_bytes(w, &v, 8);
}

static void
w_string(struct gguf_writer *w, const char *s)
{
	size_t n = strlen(s);

	w_u64(w, n);
	w_bytes(w, s, n);
}

/* Starts a key/value pair: key and type. */
static void
w_key(struct gguf_writer *w, const char *key, enum gguf_vtype t)
{
	w_string(w, key);
	w_u32(w, t);
	w->n_kv++;
}

void
gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
	w_key(w, key, GGUF_U32);
	w_u32(w, v);
}

void
gguf_w_i32(struct gguf_writer *w, const char *key, int32_t v)
{
	w_key(w, key, GGUF_I32);
	w_bytes(w, &v, 4);
}

void
gguf_w_f32(struct gguf_writer *w, const char *key, float v)
{
	w_key(w, key, GGUF_F32);
	w_bytes(w, &v, 4);
}

void
gguf_w_bool(struct gguf_writer *w, const char *key, int v)
{
	uint8_t b = v != 0;

	w_key(w, key, GGUF_BOOL);
	w_bytes(w, &b, 1);
}

void
gguf_w_str(struct gguf_writer *w, const char *key, const char *v)
{
	w_key(w, key, GGUF_STRING);
	w_string(w, v);
}

void
gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *v, size_t n)
{
	size_t i;

	w_key(w, key, GGUF_ARRAY);
	w_u32(w, GGUF_STRING);
	w_u64(w, n);
	for (i = 0; i < n; i++)
		w_string(w, v[i]);
}

void
gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, size_t n)
{
	w_key(w, key, GGUF_ARRAY);
	w_u32(w, GGUF_F32);
	w_u64(w, n);
	w_bytes(w, v, n * 4);
}

void
gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, size_t n)
{
	w_key(w, key, GGUF_ARRAY);
	w_u32(w, GGUF_I32);
	w_u64(w, n);
	w_bytes(w, v, n * 4);
}

int
gguf_w_tensor(struct gguf_writer *w, const char *name, uint32_t type,
    int n_dims, const int64_t *ne, char *err)
{
	struct gguf_w_tensor_info *t;
	int64_t n = 1;
	int i, rc;

	if (w->fp != NULL)
		return err_set(err, ERR_INVAL, "tensor %s declared after writing began", name);
	if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
		return err_set(err, ERR_INVAL, "tensor %s: %d dimensions", name, n_dims);
	if (w->n_t == w->cap_t) {
		w->cap_t = w->cap_t ? w->cap_t * 2 : 64;
		w->t = xrealloc(w->t, w->cap_t * sizeof *w->t);
	}
	t = &w->t[w->n_t];
	for (i = 0; i < GGUF_MAX_DIMS; i++) {
		t->ne[i] = i < n_dims ? ne[i] : 1;
		n *= t->ne[i];
	}
	if ((rc = quant_row_bytes(type, n, &t->bytes)) != 0)
		return err_set(err, rc, "tensor %s: %lld elements cannot be stored as type %u",
		    name, (long long)n, type);
	t->name = xstrdup(name);
	t->type = type;
	t->n_dims = n_dims;
	w->n_t++;
	return 0;
}

/* Writes n zero bytes of padding. */
static int
w_pad(FILE *fp, size_t n)
{
	static const uint8_t zeros[GGUF_DEFAULT_ALIGNMENT];

	return fwrite(zeros, 1, n, fp) == n ? 0 : -1;
}

/* Serializes the tensor directory after the key/values, assigning offsets. */
static void
w_directory(struct gguf_writer *w)
{
	uint64_t off = 0;
	size_t i;
	int d;

	for (i = 0; i < w->n_t; i++) {
		struct gguf_w_tensor_info *t = &w->t[i];

		t->offset = off;
		off += (t->bytes + GGUF_DEFAULT_ALIGNMENT - 1) / GGUF_DEFAULT_ALIGNMENT * GGUF_DEFAULT_ALIGNMENT;
		w_string(w, t->name);
		w_u32(w, (uint32_t)t->n_dims);
		for (d = 0; d < t->n_dims; d++)
			w_u64(w, (uint64_t)t->ne[d]);
		w_u32(w, t->type);
		w_u64(w, t->offset);
	}
}

int
gguf_writer_begin(struct gguf_writer *w, const char *path, char *err)
{
	uint32_t version = 3;
	uint64_t n_t = w->n_t;
	size_t head;

	if ((w->fp = fopen(path, "wb")) == NULL)
		return err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
	w->path = xstrdup(path);
	w_directory(w);
	head = 4 + 4 + 8 + 8 + w->kv_len;
	if (fwrite(GGUF_MAGIC, 1, 4, w->fp) != 4 || fwrite(&version, 4, 1, w->fp) != 1 ||
	    fwrite(&n_t, 8, 1, w->fp) != 1 || fwrite(&w->n_kv, 8, 1, w->fp) != 1 ||
	    fwrite(w->kv, 1, w->kv_len, w->fp) != w->kv_len ||
	    w_pad(w->fp, (GGUF_DEFAULT_ALIGNMENT - head % GGUF_DEFAULT_ALIGNMENT) % GGUF_DEFAULT_ALIGNMENT) != 0)
		return err_set(err, ERR_IO, "%s: write: %s", path, strerror(errno));
	return 0;
}

int
gguf_writer_data(struct gguf_writer *w, const void *data, size_t bytes, char *err)
{
	struct gguf_w_tensor_info *t;

	if (w->fp == NULL || w->next >= w->n_t)
		return err_set(err, ERR_INVAL, "no tensor is waiting for data");
	t = &w->t[w->next];
	if (bytes != t->bytes)
		return err_set(err, ERR_INVAL, "tensor %s: %zu bytes given, %zu expected",
		    t->name, bytes, t->bytes);
	if (w_pad(w->fp, (size_t)(t->offset - w->pos)) != 0 ||
	    fwrite(data, 1, bytes, w->fp) != bytes)
		return err_set(err, ERR_IO, "%s: write: %s", w->path, strerror(errno));
	w->pos = t->offset + bytes;
	w->next++;
	return 0;
}

int
gguf_writer_end(struct gguf_writer *w, char *err)
{
	int rc;

	if (w->fp == NULL)
		return err_set(err, ERR_INVAL, "writing never began");
	if (w->next != w->n_t)
		return err_set(err, ERR_INVAL, "%zu of %zu tensors written", w->next, w->n_t);
	rc = fclose(w->fp);
	w->fp = NULL;
	if (rc != 0)
		return err_set(err, ERR_IO, "%s: close: %s", w->path, strerror(errno));
	return 0;
}
