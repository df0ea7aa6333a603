/* gguf.h: a bounds-checked GGUF (v2, v3) reader over mmap, and a writer. */
#ifndef RESIDENT_GGUF_H
#define RESIDENT_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum gguf_vtype {
	GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3,
	GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7,
	GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11,
	GGUF_F64 = 12,
	GGUF_VTYPE_COUNT_
};

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_str {
	const char *s; /* points into the mapping: NOT NUL-terminated */
	uint64_t n;
};

struct gguf_tensor {
	struct gguf_str name;
	uint32_t type;             /* enum tensor_type */
	uint32_t n_dims;
	int64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
	int64_t n_elems;
	uint64_t offset;           /* relative to the data section */
	size_t bytes;
	const void *data;          /* in the mapping, validated to lie inside the file */
};

struct gguf_file;

/*
 * Maps and validates the whole file: header, every key/value, the tensor
 * directory (types, dims, sizes, alignment, offsets inside the file, no two
 * tensors overlapping). Returns 0 and *out, or a negative code with a
 * message naming what is wrong.
 */
int gguf_open(const char *path, struct gguf_file **out, char *err);

/* The same over a caller-owned buffer, which must outlive the handle. */
int gguf_open_mem(const void *data, size_t size, struct gguf_file **out, char *err);

void gguf_close(struct gguf_file *f);

uint32_t gguf_version(const struct gguf_file *f);
uint32_t gguf_alignment(const struct gguf_file *f);
size_t gguf_data_offset(const struct gguf_file *f);
const void *gguf_base(const struct gguf_file *f, size_t *size);

/* Key/value metadata. Keys are indexed 0..n-1 in file order. */
int64_t gguf_n_kv(const struct gguf_file *f);
/* Index of the key, or -1 if it is not found. */
int64_t gguf_find_key(const struct gguf_file *f, const char *key);
struct gguf_str gguf_kv_key(const struct gguf_file *f, int64_t i);
enum gguf_vtype gguf_kv_type(const struct gguf_file *f, int64_t i);
/* For arrays: the element type and count. */
enum gguf_vtype gguf_arr_type(const struct gguf_file *f, int64_t i);
uint64_t gguf_arr_n(const struct gguf_file *f, int64_t i);
/* Element j of a string array (j < gguf_arr_n). */
struct gguf_str gguf_arr_str(const struct gguf_file *f, int64_t i, uint64_t j);
/* Pointer to the packed elements of a numeric array (unaligned: memcpy out). */
const void *gguf_arr_data(const struct gguf_file *f, int64_t i);

/*
 * Typed lookups by key. Each returns 0 and fills *v, ERR_NOTFOUND if the key
 * is missing (v untouched), or ERR_FORMAT if the key holds another type.
 * Integer getters accept any integer type whose value fits.
 */
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *v, char *err);
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *v, char *err);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *v, char *err);
int gguf_get_bool(const struct gguf_file *f, const char *key, int *v, char *err);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *v, char *err);
/*
 * "<prefix>.<key>" (an architecture's hyperparameter): as an int32 in
 * 0..INT32_MAX, a missing key keeping *v unless required (then
 * ERR_NOTFOUND naming it); as a float, a missing key keeping *v.
 */
int gguf_hp_i32(const struct gguf_file *f, const char *prefix, const char *key, int32_t *v, int required,
    char *err);
int gguf_hp_f32(const struct gguf_file *f, const char *prefix, const char *key, float *v, char *err);
/* Scalar value i as double / int64 (for dumps); arrays and strings are not scalars. */
double gguf_kv_f64(const struct gguf_file *f, int64_t i);
int64_t gguf_kv_i64(const struct gguf_file *f, int64_t i);
uint64_t gguf_kv_u64(const struct gguf_file *f, int64_t i);
struct gguf_str gguf_kv_str(const struct gguf_file *f, int64_t i);
/* Element j of a numeric array, widened. */
double gguf_arr_f64(const struct gguf_file *f, int64_t i, uint64_t j);
int64_t gguf_arr_i64(const struct gguf_file *f, int64_t i, uint64_t j);

/* Tensors, in file order. */
int64_t gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor(const struct gguf_file *f, int64_t i);
/* The tensor named name, or NULL. */
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* 1 if the string equals the NUL-terminated s. */
int gguf_str_eq(struct gguf_str a, const char *s);

/* ---- writer ---- */
struct gguf_writer;

struct gguf_writer *gguf_writer_new(void);
void gguf_writer_free(struct gguf_writer *w);
void gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v);
void gguf_w_i32(struct gguf_writer *w, const char *key, int32_t v);
void gguf_w_f32(struct gguf_writer *w, const char *key, float v);
void gguf_w_bool(struct gguf_writer *w, const char *key, int v);
void gguf_w_str(struct gguf_writer *w, const char *key, const char *v);
void gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *v, size_t n);
void gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, size_t n);
void gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, size_t n);
/*
 * Writing is two-phase so that a large model never sits in memory whole:
 * declare every tensor, then begin (writes header, metadata and tensor
 * directory), then hand over each tensor's data in declaration order.
 */
int gguf_w_tensor(struct gguf_writer *w, const char *name, uint32_t type,
    int n_dims, const int64_t *ne, char *err);
int gguf_writer_begin(struct gguf_writer *w, const char *path, char *err);
/* The data of the next declared tensor, in its type's layout. */
int gguf_writer_data(struct gguf_writer *w, const void *data, size_t bytes, char *err);
/* Checks all tensors were written, closes the file. */
int gguf_writer_end(struct gguf_writer *w, char *err);

#endif
