/* quant.h: GGML tensor types, their block layouts, (de)quantization. */
#ifndef RESIDENT_QUANT_H
#define RESIDENT_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* Values are GGML's type ids, as stored in GGUF files. */
enum tensor_type {
	TT_F32 = 0,
	TT_F16 = 1,
	TT_Q4_0 = 2,
	TT_Q4_1 = 3,
	TT_Q5_0 = 6,
	TT_Q5_1 = 7,
	TT_Q8_0 = 8,
	TT_Q8_1 = 9,
	TT_Q2_K = 10,
	TT_Q3_K = 11,
	TT_Q4_K = 12,
	TT_Q5_K = 13,
	TT_Q6_K = 14,
	TT_Q8_K = 15,
	TT_BF16 = 30,
	TT_MXFP4 = 39, /* 32 e2m1 values and an e8m0 scale (gpt-oss experts) */
	TT_COUNT_ = 40 /* bound for tables indexed by type */
};

#define QK_K 256

struct quant_traits {
	const char *name;  /* "Q4_K"; NULL for ids we do not support */
	int block_elems;   /* elements per block (1 for float types) */
	int block_bytes;   /* bytes per block */
};

/* Traits of a type, or NULL if the id is unknown or unsupported. */
const struct quant_traits *quant_traits(uint32_t type);

/* Type id by name ("q4_k", case-insensitive), or -1. */
int quant_type_from_name(const char *name);

/*
 * The name of a GGUF general.file_type, llama.cpp's LLAMA_FTYPE: the
 * quantization recipe of the whole file ("Q4_K_M": mostly Q4_K, some
 * tensors Q6_K). NULL for an id it does not know.
 */
const char *quant_file_type_name(uint32_t file_type);

/*
 * Bytes of a row of n elements. Returns 0 and sets *bytes, or ERR_INVAL if
 * the type is unsupported or n is not a multiple of its block size.
 */
int quant_row_bytes(uint32_t type, int64_t n, size_t *bytes);

/* Dequantizes n elements (a multiple of the block size) of src into dst. */
void quant_dequantize(uint32_t type, const void *src, float *dst, int64_t n);

/*
 * Quantizes n elements (a multiple of the block size) of src into dst.
 * Supported targets: F32, F16, BF16, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K, MXFP4. The K-quant
 * search is the one llama.cpp uses without an importance matrix, so files we
 * write dequantize as llama.cpp's would. Returns 0, ERR_UNSUPPORTED, or
 * ERR_INVAL if n is not a whole number of blocks or, for a block type, a
 * value is NaN or infinite (the float types carry those as they are).
 */
int quant_quantize(uint32_t type, const float *src, void *dst, int64_t n);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

#endif
