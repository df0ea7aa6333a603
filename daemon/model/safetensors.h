/*
 * safetensors.h: a bounds-checked reader of a Hugging Face model
 * directory's weights (model.safetensors, or the shards that
 * model.safetensors.index.json lists), over mmap; and a writer.
 */
#ifndef RESIDENT_SAFETENSORS_H
#define RESIDENT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 4
/* Header (and index file) size limit: the reference implementation's. */
#define ST_MAX_HEADER 100000000u

struct st_tensor {
	const char *name;          /* NUL-terminated, owned by the model */
	uint32_t type;             /* TT_F32, TT_F16 or TT_BF16 (quant.h) */
	int n_dims;                /* 0 (a scalar) to ST_MAX_DIMS */
	/*
	 * GGML order, reversed from the safetensors shape: ne[0] is the LAST
	 * safetensors dimension, the contiguous one; a [rows, cols] matrix has
	 * ne[0] = cols, ne[1] = rows. Unused dimensions are 1.
	 */
	int64_t ne[ST_MAX_DIMS];
	int64_t n_elems;
	size_t bytes;
	/*
	 * In the mapping, validated to lie inside the file. Files we write keep
	 * every tensor aligned to its element size; the format does not demand
	 * it, so data from other writers may be unaligned.
	 */
	const void *data;
};

struct st_model;

/*
 * Opens the weights of a model directory: model.safetensors if present,
 * else model.safetensors.index.json and every shard its weight_map names.
 * Everything is validated as hostile: header length within the file and
 * under ST_MAX_HEADER, the header valid JSON without duplicate names,
 * dtypes, shapes (up to 4 dims), data_offsets covering the data section
 * exactly, without gap or overlap, each as long as shape x dtype size
 * (overflow-checked); shard names without '/' or ".."; index and shards
 * agreeing on every tensor, none twice (the index's "metadata" and the
 * files' "__metadata__" are ignored). Returns 0 and *out; ERR_NOTFOUND if
 * the directory has neither file; ERR_UNSUPPORTED for a tensor of a dtype
 * other than F32, F16, BF16 (naming both) or of more than 4 dimensions;
 * ERR_FORMAT, ERR_IO otherwise, with a message naming the file and what is
 * wrong.
 */
int st_open_dir(const char *dir, struct st_model **out, char *err);

/* The same for one .safetensors file. */
int st_open_file(const char *path, struct st_model **out, char *err);

void st_close(struct st_model *m);

/* Tensors, shard by shard (in name order), each in file order. */
int64_t st_n_tensors(const struct st_model *m);
const struct st_tensor *st_tensor(const struct st_model *m, int64_t i);
/* The tensor named name, or NULL. */
const struct st_tensor *st_find(const struct st_model *m, const char *name);

/* ---- writer ---- */
struct st_writer;

struct st_writer *st_writer_new(void);
void st_writer_free(struct st_writer *w);

/*
 * Adds a tensor. type is TT_F32, TT_F16 or TT_BF16; ne is in GGML order
 * (ne[0] the contiguous dimension), n_dims 0..4; data, `bytes` long, must
 * hold exactly the product of ne elements. The data is COPIED, so the
 * caller may free it at once. Returns 0, or ERR_INVAL for a bad or
 * duplicate name, type, shape or size.
 */
int st_w_tensor(struct st_writer *w, const char *name, uint32_t type,
    int n_dims, const int64_t *ne, const void *data, size_t bytes, char *err);

/*
 * Writes the file as the `safetensors` package does, byte for byte:
 * tensors sorted by dtype (F32, BF16, F16) then name, so that each is
 * aligned; compact JSON header padded with spaces to a multiple of 8;
 * __metadata__ {"format": "pt"}, which transformers wants. The file
 * appears complete or not at all (written to path.tmp, then renamed).
 */
int st_writer_save(struct st_writer *w, const char *path, char *err);

#endif
