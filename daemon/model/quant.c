/*
 * quant.c: GGML tensor types: block layouts, fp16/bf16 conversion,
 * dequantization and the reference (non-imatrix) quantizers.
 *
 * Two kinds of exactness are kept here, and both decide how the arithmetic
 * is written:
 * - dequantization gives the same float32 bits as the PyPI gguf package
 *   (gguf.quants.dequantize), so every product and sum is done in float, in
 *   the order numpy does it (e.g. Q4_K is (d*sc)*q - dmin*m, two roundings);
 * - quantization gives the same bytes as ggml's quantize_row_*_ref, so files
 *   we write load as llama.cpp's would: its loops, sums and divisions are
 *   kept in its order, even where a reciprocal would be cheaper.
 * Neither holds if the compiler fuses a*b+c into one FMA: gcc does not under
 * -std=c11, clang is told below. Blocks are read in host order: little-endian,
 * as GGUF stores them.
 */
#include "config.h"
#include "quant.h"
#include "quant_blocks.h"
#include "util.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define GROUP_MAX_EPS 1e-15f  /* ggml's "all zero" threshold */

/* Converters over nb whole blocks. */
typedef void (*dequant_fn)(const void *src, float *y, int64_t nb);
typedef void (*quant_fn)(const float *x, void *dst, int64_t nb);

static void deq_f32(const void *, float *, int64_t);
static void deq_f16(const void *, float *, int64_t);
static void deq_bf16(const void *, float *, int64_t);
static void deq_q4_0(const void *, float *, int64_t);
static void deq_q4_1(const void *, float *, int64_t);
static void deq_q5_0(const void *, float *, int64_t);
static void deq_q5_1(const void *, float *, int64_t);
static void deq_q8_0(const void *, float *, int64_t);
static void deq_q8_1(const void *, float *, int64_t);
static void deq_q2_K(const void *, float *, int64_t);
static void deq_q3_K(const void *, float *, int64_t);
static void deq_q4_K(const void *, float *, int64_t);
static void deq_q5_K(const void *, float *, int64_t);
static void deq_q6_K(const void *, float *, int64_t);
static void deq_q8_K(const void *, float *, int64_t);
static void deq_mxfp4(const void *, float *, int64_t);

static void q_f32(const float *, void *, int64_t);
static void q_f16(const float *, void *, int64_t);
static void q_bf16(const float *, void *, int64_t);
static void q_q5_0(const float *, void *, int64_t);
static void q_q8_0(const float *, void *, int64_t);
static void q_q4_K(const float *, void *, int64_t);
static void q_q5_K(const float *, void *, int64_t);
static void q_q6_K(const float *, void *, int64_t);
static void q_q8_K(const float *, void *, int64_t);
static void q_mxfp4(const float *, void *, int64_t);

struct qtype {
	struct quant_traits t;
	dequant_fn dequant;
	quant_fn quant; /* NULL: we do not write this type */
};

#define QT(name, elems, blk, deq, q) { { name, elems, (int)sizeof(blk) }, deq, q }
static const struct qtype qtypes[TT_COUNT_] = {
	[TT_F32] = QT("F32", 1, float, deq_f32, q_f32),
	[TT_F16] = QT("F16", 1, uint16_t, deq_f16, q_f16),
	[TT_BF16] = QT("BF16", 1, uint16_t, deq_bf16, q_bf16),
	[TT_Q4_0] = QT("Q4_0", QK_0, struct blk_q4_0, deq_q4_0, NULL),
	[TT_Q4_1] = QT("Q4_1", QK_0, struct blk_q4_1, deq_q4_1, NULL),
	[TT_Q5_0] = QT("Q5_0", QK_0, struct blk_q5_0, deq_q5_0, q_q5_0),
	[TT_Q5_1] = QT("Q5_1", QK_0, struct blk_q5_1, deq_q5_1, NULL),
	[TT_Q8_0] = QT("Q8_0", QK_0, struct blk_q8_0, deq_q8_0, q_q8_0),
	[TT_Q8_1] = QT("Q8_1", QK_0, struct blk_q8_1, deq_q8_1, NULL),
	[TT_Q2_K] = QT("Q2_K", QK_K, struct blk_q2_K, deq_q2_K, NULL),
	[TT_Q3_K] = QT("Q3_K", QK_K, struct blk_q3_K, deq_q3_K, NULL),
	[TT_Q4_K] = QT("Q4_K", QK_K, struct blk_q4_K, deq_q4_K, q_q4_K),
	[TT_Q5_K] = QT("Q5_K", QK_K, struct blk_q5_K, deq_q5_K, q_q5_K),
	[TT_Q6_K] = QT("Q6_K", QK_K, struct blk_q6_K, deq_q6_K, q_q6_K),
	[TT_Q8_K] = QT("Q8_K", QK_K, struct blk_q8_K, deq_q8_K, q_q8_K),
	[TT_MXFP4] = QT("MXFP4", QK_0, struct blk_mxfp4, deq_mxfp4, q_mxfp4),
};
#undef QT

/* ---- types ---- */

/* The entry for a type id, or NULL. */
static const struct qtype *
type_entry(uint32_t type)
{
	if (type >= TT_COUNT_ || qtypes[type].t.name == NULL)
		return NULL;
	return &qtypes[type];
}

/* Public face of type_entry(). */
const struct quant_traits *
quant_traits(uint32_t type)
{
	const struct qtype *q = type_entry(type);

	return q ? &q->t : NULL;
}

/* Linear search: there are sixteen names. */
int
quant_type_from_name(const char *name)
{
	for (int i = 0; i < TT_COUNT_; i++) {
		if (qtypes[i].t.name != NULL &&
		    strcasecmp(qtypes[i].t.name, name) == 0)
			return i;
	}
	return -1;
}

/* llama.cpp's llama_ftype (and gguf-py's LlamaFileType); 4 to 6 were removed. */
static const char *const file_types[] = {
	[0] = "F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [7] = "Q8_0", [8] = "Q5_0", [9] = "Q5_1",
	[10] = "Q2_K", [11] = "Q3_K_S", [12] = "Q3_K_M", [13] = "Q3_K_L", [14] = "Q4_K_S", [15] = "Q4_K_M",
	[16] = "Q5_K_S", [17] = "Q5_K_M", [18] = "Q6_K", [19] = "IQ2_XXS", [20] = "IQ2_XS", [21] = "Q2_K_S",
	[22] = "IQ3_XS", [23] = "IQ3_XXS", [24] = "IQ1_S", [25] = "IQ4_NL", [26] = "IQ3_S", [27] = "IQ3_M",
	[28] = "IQ2_S", [29] = "IQ2_M", [30] = "IQ4_XS", [31] = "IQ1_M", [32] = "BF16", [38] = "MXFP4_MOE",
};

const char *
quant_file_type_name(uint32_t file_type)
{
	return file_type < ARRAY_LEN(file_types) ? file_types[file_type] : NULL;
}

/* Whole blocks only; the product is checked for overflow. */
int
quant_row_bytes(uint32_t type, int64_t n, size_t *bytes)
{
	const struct qtype *q = type_entry(type);

	if (q == NULL || n < 0 || n % q->t.block_elems != 0)
		return ERR_INVAL;
	if ((uint64_t)(n / q->t.block_elems) > SIZE_MAX)
		return ERR_INVAL;
	if (mul_size((size_t)(n / q->t.block_elems), (size_t)q->t.block_bytes,
	    bytes) != 0)
		return ERR_INVAL;
	return 0;
}

/*
 * Callers size their buffers with quant_row_bytes first, so a bad type or
 * count here is a broken invariant, not an input error.
 */
void
quant_dequantize(uint32_t type, const void *src, float *dst, int64_t n)
{
	const struct qtype *q = type_entry(type);

	if (q == NULL || n < 0 || n % q->t.block_elems != 0)
		fatal("quant_dequantize: type %u with %lld elements",
		    type, (long long)n);
	q->dequant(src, dst, n / q->t.block_elems);
}

/* Checks the request, then runs the type's quantizer over whole blocks. */
int
quant_quantize(uint32_t type, const float *src, void *dst, int64_t n)
{
	const struct qtype *q = type_entry(type);

	if (q == NULL || q->quant == NULL)
		return ERR_UNSUPPORTED;
	if (n < 0 || n % q->t.block_elems != 0)
		return ERR_INVAL;
	/* A block's scale is fitted to its values: one inf or NaN ruins it. */
	for (int64_t i = 0; q->t.block_elems > 1 && i < n; i++)
		if (!isfinite(src[i]))
			return ERR_INVAL;
	q->quant(src, dst, n / q->t.block_elems);
	return 0;
}

/* ---- fp16, bf16 ---- */

/* The bits of a float. */
static uint32_t
f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof u);
	return u;
}

/* The float of some bits. */
static float
f32_from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof f);
	return f;
}

/*
 * Exact widening. A NaN keeps its payload as is (a signalling one stays
 * signalling), which is what numpy does and so what gguf-py returns.
 */
float
fp16_to_fp32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t mant = h & 0x3ff;
	float f;

	if (exp == 0x1f)
		return f32_from_bits(sign | 0x7f800000 | mant << 13);
	if (exp != 0)
		return f32_from_bits(sign | (exp + 112) << 23 | mant << 13);
	f = (float)mant * 0x1p-24f; /* subnormal or zero: exact */
	return sign ? -f : f;
}

/*
 * Round to nearest, ties to even, as ggml's fp32_to_fp16; overflow gives
 * inf, and every NaN becomes ggml's quiet 0x7e00 with its sign.
 */
uint16_t
fp32_to_fp16(float f)
{
	uint32_t w = f32_bits(f);
	uint16_t sign = (uint16_t)(w >> 16 & 0x8000);
	uint32_t a = w & 0x7fffffff;
	float r;

	if (a > 0x7f800000)
		return sign | 0x7e00;
	if (a >= 0x477ff000) /* 65520 and up round to inf */
		return sign | 0x7c00;
	if (a < 0x38800000) {
		/*
		 * Below 2^-14 the result is subnormal, a multiple of 2^-24:
		 * adding 0.5 (whose ulp is 2^-24) makes the FPU round it, to
		 * even, and the count of ulps above 0.5 is the mantissa.
		 */
		r = f32_from_bits(a) + 0.5f;
		return sign | (uint16_t)(f32_bits(r) - 0x3f000000);
	}
	/* Rebias the exponent (127 -> 15) and round off 13 mantissa bits. */
	return sign | (uint16_t)((a - 0x38000000 + 0xfff + (a >> 13 & 1)) >> 13);
}

/* Exact: a bf16 is the top half of a float32. */
float
bf16_to_fp32(uint16_t h)
{
	return f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even as ggml's fp32_to_bf16; a NaN is made quiet. */
uint16_t
fp32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)(u >> 16 | 64);
	return (uint16_t)((u + 0x7fff + (u >> 16 & 1)) >> 16);
}

/* ---- dequantization ---- */

/* F32 is copied bit for bit (memcpy: a NaN is not touched). */
static void
deq_f32(const void *src, float *y, int64_t nb)
{
	memcpy(y, src, (size_t)nb * sizeof(float));
}

/* F16: one element per block. */
static void
deq_f16(const void *src, float *y, int64_t nb)
{
	const uint16_t *h = src;

	for (int64_t i = 0; i < nb; i++)
		y[i] = fp16_to_fp32(h[i]);
}

/* BF16: one element per block. */
static void
deq_bf16(const void *src, float *y, int64_t nb)
{
	const uint16_t *h = src;

	for (int64_t i = 0; i < nb; i++)
		y[i] = bf16_to_fp32(h[i]);
}

/* Q4_0: d * (q - 8); low nibbles are elements 0..15, high ones 16..31. */
static void
deq_q4_0(const void *src, float *y, int64_t nb)
{
	const struct blk_q4_0 *b = src;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_0) {
		float d = fp16_to_fp32(b->d);

		for (int j = 0; j < QK_0 / 2; j++) {
			y[j] = d * (float)((b->qs[j] & 0xf) - 8);
			y[j + QK_0 / 2] = d * (float)((b->qs[j] >> 4) - 8);
		}
	}
}

/* Q4_1: d * q + m. */
static void
deq_q4_1(const void *src, float *y, int64_t nb)
{
	const struct blk_q4_1 *b = src;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_0) {
		float d = fp16_to_fp32(b->d), m = fp16_to_fp32(b->m);

		for (int j = 0; j < QK_0 / 2; j++) {
			y[j] = d * (float)(b->qs[j] & 0xf) + m;
			y[j + QK_0 / 2] = d * (float)(b->qs[j] >> 4) + m;
		}
	}
}

/* The 5-bit values of a Q5_0/Q5_1 block: nibbles plus bit j of qh. */
static void
q5_values(const uint8_t *qs, const uint8_t qh_bytes[4], int q[QK_0])
{
	uint32_t qh;

	memcpy(&qh, qh_bytes, sizeof qh);
	for (int j = 0; j < QK_0 / 2; j++) {
		q[j] = (qs[j] & 0xf) | (int)(qh >> j & 1) << 4;
		q[j + QK_0 / 2] = (qs[j] >> 4) | (int)(qh >> (j + QK_0 / 2) & 1) << 4;
	}
}

/* Q5_0: d * (q - 16). */
static void
deq_q5_0(const void *src, float *y, int64_t nb)
{
	const struct blk_q5_0 *b = src;
	int q[QK_0];

	for (int64_t i = 0; i < nb; i++, b++, y += QK_0) {
		float d = fp16_to_fp32(b->d);

		q5_values(b->qs, b->qh, q);
		for (int j = 0; j < QK_0; j++)
			y[j] = d * (float)(q[j] - 16);
	}
}

/* Q5_1: d * q + m. */
static void
deq_q5_1(const void *src, float *y, int64_t nb)
{
	const struct blk_q5_1 *b = src;
	int q[QK_0];

	for (int64_t i = 0; i < nb; i++, b++, y += QK_0) {
		float d = fp16_to_fp32(b->d), m = fp16_to_fp32(b->m);

		q5_values(b->qs, b->qh, q);
		for (int j = 0; j < QK_0; j++)
			y[j] = d * (float)q[j] + m;
	}
}

/* Q8_0: d * q. */
static void
deq_q8_0(const void *src, float *y, int64_t nb)
{
	const struct blk_q8_0 *b = src;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_0) {
		float d = fp16_to_fp32(b->d);

		for (int j = 0; j < QK_0; j++)
			y[j] = d * (float)b->qs[j];
	}
}

/* Q8_1: d * q; s (d times the sum of q) only serves dot products. */
static void
deq_q8_1(const void *src, float *y, int64_t nb)
{
	const struct blk_q8_1 *b = src;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_0) {
		float d = fp16_to_fp32(b->d);

		for (int j = 0; j < QK_0; j++)
			y[j] = d * (float)b->qs[j];
	}
}

/*
 * The 2-bit field of element e (0..255) in a Q2_K/Q3_K qs array: each
 * 128-element half has 32 bytes, and group g (32 elements) of the half
 * sits at bit 2*(g%4).
 */
static int
k_2bit(const uint8_t *qs, int e)
{
	int g = e / 32;

	return qs[g / 4 * 32 + e % 32] >> 2 * (g % 4) & 3;
}

/* Q2_K: (d * sc) * q - dmin * m, sc and m 4 bits per 16 elements. */
static void
deq_q2_K(const void *src, float *y, int64_t nb)
{
	const struct blk_q2_K *b = src;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_K) {
		float d = fp16_to_fp32(b->d), dmin = fp16_to_fp32(b->dmin);

		for (int s = 0; s < QK_K / 16; s++) {
			float dl = d * (float)(b->scales[s] & 0xf);
			float ml = dmin * (float)(b->scales[s] >> 4);

			for (int e = 16 * s; e < 16 * s + 16; e++)
				y[e] = dl * (float)k_2bit(b->qs, e) - ml;
		}
	}
}

/*
 * Q3_K's 16 signed scales: low nibbles in bytes 0..7 (j < 8 low, else high
 * nibble of byte j-8), top two bits in bytes 8..11 (byte j%4, bits 2*(j/4)).
 */
static void
q3_K_scales(const uint8_t sc[12], int out[16])
{
	for (int j = 0; j < 16; j++) {
		int lo = j < 8 ? sc[j] & 0xf : sc[j - 8] >> 4;
		int hi = sc[8 + j % 4] >> 2 * (j / 4) & 3;

		out[j] = (lo | hi << 4) - 32;
	}
}

/* Q3_K: (d * sc) * (q - 4 unless the element's hmask bit is set). */
static void
deq_q3_K(const void *src, float *y, int64_t nb)
{
	const struct blk_q3_K *b = src;
	int sc[16];

	for (int64_t i = 0; i < nb; i++, b++, y += QK_K) {
		float d = fp16_to_fp32(b->d);

		q3_K_scales(b->scales, sc);
		for (int s = 0; s < QK_K / 16; s++) {
			float dl = d * (float)sc[s];

			for (int e = 16 * s; e < 16 * s + 16; e++) {
				int hbit = b->hmask[e % 32] >> e / 32 & 1;

				y[e] = dl * (float)(k_2bit(b->qs, e) - (hbit ? 0 : 4));
			}
		}
	}
}

/* The 4-bit field of element e in Q4_K/Q5_K qs: 32-byte runs, low nibbles first. */
static int
k_4bit(const uint8_t *qs, int e)
{
	int g = e / 32;

	return qs[g / 2 * 32 + e % 32] >> 4 * (g % 2) & 0xf;
}

/* Q4_K: (d * sc) * q - dmin * m, per sub-block of 32. */
static void
deq_q4_K(const void *src, float *y, int64_t nb)
{
	const struct blk_q4_K *b = src;
	uint8_t sc, m;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_K) {
		float d = fp16_to_fp32(b->d), dmin = fp16_to_fp32(b->dmin);

		for (int g = 0; g < QK_K / 32; g++) {
			k4_scale_min(g, b->scales, &sc, &m);
			float dl = d * (float)sc, ml = dmin * (float)m;

			for (int e = 32 * g; e < 32 * g + 32; e++)
				y[e] = dl * (float)k_4bit(b->qs, e) - ml;
		}
	}
}

/* Q5_K: as Q4_K with a fifth bit, bit g of qh[e % 32] for sub-block g. */
static void
deq_q5_K(const void *src, float *y, int64_t nb)
{
	const struct blk_q5_K *b = src;
	uint8_t sc, m;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_K) {
		float d = fp16_to_fp32(b->d), dmin = fp16_to_fp32(b->dmin);

		for (int g = 0; g < QK_K / 32; g++) {
			k4_scale_min(g, b->scales, &sc, &m);
			float dl = d * (float)sc, ml = dmin * (float)m;

			for (int e = 32 * g; e < 32 * g + 32; e++) {
				int q = k_4bit(b->qs, e) | (b->qh[e % 32] >> g & 1) << 4;

				y[e] = dl * (float)q - ml;
			}
		}
	}
}

/*
 * The 6-bit value of element e of a Q6_K block, 0..63. In each half of 128,
 * quarter s (32 elements) takes nibble s/2 of ql[(s%2)*32 + l] and bits 2s
 * of qh[l].
 */
static int
q6_K_value(const struct blk_q6_K *b, int e)
{
	int h = e / 128, s = e % 128 / 32, l = e % 32;
	int lo = b->ql[h * 64 + s % 2 * 32 + l] >> 4 * (s / 2) & 0xf;
	int hi = b->qh[h * 32 + l] >> 2 * s & 3;

	return lo | hi << 4;
}

/* Q6_K: (d * sc) * (q - 32), sc a signed byte per 16 elements. */
static void
deq_q6_K(const void *src, float *y, int64_t nb)
{
	const struct blk_q6_K *b = src;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_K) {
		float d = fp16_to_fp32(b->d);

		for (int s = 0; s < QK_K / 16; s++) {
			float dl = d * (float)b->scales[s];

			for (int e = 16 * s; e < 16 * s + 16; e++)
				y[e] = dl * (float)(q6_K_value(b, e) - 32);
		}
	}
}

/* Q8_K: d * q, with a float32 d. */
static void
deq_q8_K(const void *src, float *y, int64_t nb)
{
	const struct blk_q8_K *b = src;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_K)
		for (int j = 0; j < QK_K; j++)
			y[j] = b->d * (float)b->qs[j];
}

/* MXFP4: the block's halved power-of-two scale times the doubled e2m1 value. */
static void
deq_mxfp4(const void *src, float *y, int64_t nb)
{
	const struct blk_mxfp4 *b = src;

	for (int64_t i = 0; i < nb; i++, b++, y += QK_0) {
		float d = mxfp4_scale(b->e);

		for (int j = 0; j < QK_0 / 2; j++) {
			y[j] = d * (float)mxfp4_values[b->qs[j] & 0xf];
			y[j + QK_0 / 2] = d * (float)mxfp4_values[b->qs[j] >> 4];
		}
	}
}

/* ---- quantization: the float types and Q8_0 ---- */

/* F32: a copy. */
static void
q_f32(const float *x, void *dst, int64_t nb)
{
	memcpy(dst, x, (size_t)nb * sizeof(float));
}

/* F16, rounded to nearest even. */
static void
q_f16(const float *x, void *dst, int64_t nb)
{
	uint16_t *h = dst;

	for (int64_t i = 0; i < nb; i++)
		h[i] = fp32_to_fp16(x[i]);
}

/* BF16, rounded to nearest even. */
static void
q_bf16(const float *x, void *dst, int64_t nb)
{
	uint16_t *h = dst;

	for (int64_t i = 0; i < nb; i++)
		h[i] = fp32_to_bf16(x[i]);
}

/* Q8_0 (ggml's quantize_row_q8_0_ref): d = amax/127, q = roundf(x/d). */
/*
 * Q5_0, as llama.cpp's Q4_K_M stores K-quant tensors whose rows are not a
 * multiple of 256: the signed extreme maps to -16, values to 0..31.
 */
static void
q_q5_0(const float *x, void *dst, int64_t nb)
{
	struct blk_q5_0 *b = dst;

	for (int64_t i = 0; i < nb; i++, b++, x += QK_0) {
		float amax = 0, max = 0;
		uint32_t qh = 0;

		for (int j = 0; j < QK_0; j++) {
			if (amax < fabsf(x[j])) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		float d = max / -16;
		float id = d != 0 ? 1.0f / d : 0.0f;

		b->d = fp32_to_fp16(d);
		for (int j = 0; j < QK_0 / 2; j++) {
			int v0 = MIN(31, (int)(int8_t)(x[j] * id + 16.5f));
			int v1 = MIN(31, (int)(int8_t)(x[QK_0 / 2 + j] * id + 16.5f));

			b->qs[j] = (uint8_t)((v0 & 0x0f) | ((v1 & 0x0f) << 4));
			qh |= (uint32_t)((v0 & 0x10) >> 4) << j;
			qh |= (uint32_t)((v1 & 0x10) >> 4) << (j + QK_0 / 2);
		}
		memcpy(b->qh, &qh, sizeof qh);
	}
}

static void
q_q8_0(const float *x, void *dst, int64_t nb)
{
	struct blk_q8_0 *b = dst;

	for (int64_t i = 0; i < nb; i++, b++, x += QK_0) {
		float amax = 0;

		for (int j = 0; j < QK_0; j++)
			amax = MAX(amax, fabsf(x[j]));
		float d = amax / 127;
		float id = d != 0 ? 1.0f / d : 0.0f;

		b->d = fp32_to_fp16(d);
		for (int j = 0; j < QK_0; j++)
			b->qs[j] = (int8_t)roundf(x[j] * id);
	}
}

/* ---- quantization: the K types ---- */

/*
 * Round to nearest, ties to even, for |f| < 2^22: adding 1.5*2^23 leaves the
 * integer in the low mantissa bits. ggml's nearest_int; lrintf would do the
 * same but only under the default rounding mode.
 */
static int
nearest_int(float f)
{
	float v = f + 12582912.f;
	int32_t i;

	memcpy(&i, &v, sizeof i);
	return (i & 0x007fffff) - 0x00400000;
}

/* Weighted squared error of levels L under scale and (negative) min. */
static float
fit_error(int n, const float *x, const float *w, const uint8_t *L,
    float scale, float min)
{
	float err = 0;

	for (int i = 0; i < n; i++) {
		float diff = scale * L[i] + min - x[i];

		err += w[i] * (diff * diff);
	}
	return err;
}

/*
 * One step of the search below: levels for iscale, then the weighted least
 * squares (scale, min) for those levels. Returns 0 if the system is
 * singular (the step is skipped).
 */
static int
fit_step(int n, int nmax, const float *x, const float *w, float iscale,
    float xmin, float sum_w, float sum_x, uint8_t *Laux, float *scale,
    float *min)
{
	float sum_l = 0, sum_l2 = 0, sum_xl = 0, D;

	for (int i = 0; i < n; i++) {
		int l = MAX(0, MIN(nmax, nearest_int(iscale * (x[i] - xmin))));

		Laux[i] = (uint8_t)l;
		sum_l += w[i] * l;
		sum_l2 += w[i] * l * l;
		sum_xl += w[i] * l * x[i];
	}
	D = sum_w * sum_l2 - sum_l * sum_l;
	if (!(D > 0))
		return 0;
	*scale = (sum_w * sum_xl - sum_x * sum_l) / D;
	*min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
	if (*min > 0) {
		*min = 0;
		*scale = sum_xl / sum_l2;
	}
	return 1;
}

/*
 * Levels 0..nmax, a scale and a min for n values such that x ~ scale*L -
 * *the_min, minimizing the weighted squared error over nstep+1 trial
 * scales (ggml's make_qkx2_quants without use_mad). Returns the scale.
 */
static float
fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
    float *the_min, float rmin, float rdelta, int nstep)
{
	float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
	float iscale, scale, best, err, s, m;
	uint8_t Laux[32];

	for (int i = 1; i < n; i++) {
		min = x[i] < min ? x[i] : min;
		max = x[i] > max ? x[i] : max;
		sum_w += w[i];
		sum_x += w[i] * x[i];
	}
	if (min > 0)
		min = 0;
	if (max == min) {
		memset(L, 0, (size_t)n);
		*the_min = -min;
		return 0;
	}
	iscale = nmax / (max - min);
	scale = 1 / iscale;
	for (int i = 0; i < n; i++)
		L[i] = (uint8_t)MAX(0, MIN(nmax, nearest_int(iscale * (x[i] - min))));
	best = fit_error(n, x, w, L, scale, min);
	for (int is = 0; is <= nstep; is++) {
		iscale = (rmin + rdelta * is + nmax) / (max - min);
		if (!fit_step(n, nmax, x, w, iscale, min, sum_w, sum_x, Laux, &s, &m))
			continue;
		if ((err = fit_error(n, x, w, Laux, s, m)) < best) {
			memcpy(L, Laux, (size_t)n);
			best = err;
			scale = s;
			min = m;
		}
	}
	*the_min = -min;
	return scale;
}

/*
 * Stores the 8 six-bit scales and mins of a Q4_K/Q5_K block (see
 * k4_scale_min for the packing), quantized against their maxima.
 */
static void
k4_pack_scales(uint8_t q[12], const float *scales, const float *mins,
    float max_scale, float max_min)
{
	float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
	float inv_min = max_min > 0 ? 63.f / max_min : 0.f;

	for (int j = 0; j < QK_K / 32; j++) {
		uint8_t ls = MIN(63, (uint8_t)nearest_int(inv_scale * scales[j]));
		uint8_t lm = MIN(63, (uint8_t)nearest_int(inv_min * mins[j]));

		if (j < 4) {
			q[j] = ls;
			q[j + 4] = lm;
		} else {
			q[j + 4] = (ls & 0xf) | (lm & 0xf) << 4;
			q[j - 4] |= (ls >> 4) << 6;
			q[j] |= (lm >> 4) << 6;
		}
	}
}

/*
 * The levels of a Q4_K/Q5_K block (0..nmax) given its stored d, dmin and
 * scales, so the quants match what the rounding of the scales left. A
 * sub-block whose scale is 0 keeps the levels the fit chose.
 */
static void
k4_requantize(const float *x, int nmax, uint16_t d16, uint16_t dmin16,
    const uint8_t q[12], uint8_t *L)
{
	uint8_t sc, m;

	for (int j = 0; j < QK_K / 32; j++) {
		k4_scale_min(j, q, &sc, &m);
		float d = fp16_to_fp32(d16) * sc;
		if (d == 0)
			continue;
		float dm = fp16_to_fp32(dmin16) * m;
		for (int i = 32 * j; i < 32 * j + 32; i++)
			L[i] = (uint8_t)MAX(0, MIN(nmax, nearest_int((x[i] + dm) / d)));
	}
}

/*
 * The shared part of Q4_K and Q5_K (ggml's quantize_row_q{4,5}_K_ref):
 * fits each sub-block of 32 with weights av|x| + |x|, then stores d, dmin
 * and the scales and leaves the levels in L.
 */
static void
k4_fit_block(const float *x, int nmax, float rmin, float rdelta, int nstep,
    uint16_t *d, uint16_t *dmin, uint8_t q[12], uint8_t L[QK_K])
{
	float scales[QK_K / 32], mins[QK_K / 32], w[32];
	float max_scale = 0, max_min = 0;

	for (int j = 0; j < QK_K / 32; j++) {
		const float *xs = x + 32 * j;
		float sum_x2 = 0, av_x;

		for (int l = 0; l < 32; l++)
			sum_x2 += xs[l] * xs[l];
		av_x = sqrtf(sum_x2 / 32);
		for (int l = 0; l < 32; l++)
			w[l] = av_x + fabsf(xs[l]);
		scales[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j],
		    rmin, rdelta, nstep);
		max_scale = scales[j] > max_scale ? scales[j] : max_scale;
		max_min = mins[j] > max_min ? mins[j] : max_min;
	}
	k4_pack_scales(q, scales, mins, max_scale, max_min);
	*d = fp32_to_fp16(max_scale / 63.f);
	*dmin = fp32_to_fp16(max_min / 63.f);
	k4_requantize(x, nmax, *d, *dmin, q, L);
}

/* Q4_K: levels 0..15, two per byte (element l low, l+32 high, per 64). */
static void
q_q4_K(const float *x, void *dst, int64_t nb)
{
	struct blk_q4_K *b = dst;
	uint8_t L[QK_K];

	for (int64_t i = 0; i < nb; i++, b++, x += QK_K) {
		k4_fit_block(x, 15, -1.f, 0.1f, 20, &b->d, &b->dmin, b->scales, L);
		for (int j = 0; j < QK_K; j += 64)
			for (int l = 0; l < 32; l++)
				b->qs[j / 2 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
	}
}

/* Q5_K: levels 0..31: low nibbles as Q4_K, bit 4 of sub-block g in qh bit g. */
static void
q_q5_K(const float *x, void *dst, int64_t nb)
{
	struct blk_q5_K *b = dst;
	uint8_t L[QK_K];

	for (int64_t i = 0; i < nb; i++, b++, x += QK_K) {
		memset(b->qh, 0, sizeof b->qh);
		k4_fit_block(x, 31, -0.5f, 0.1f, 15, &b->d, &b->dmin, b->scales, L);
		for (int e = 0; e < QK_K; e++)
			b->qh[e % 32] |= (uint8_t)((L[e] >> 4) << (e / 32));
		for (int j = 0; j < QK_K; j += 64)
			for (int l = 0; l < 32; l++)
				b->qs[j / 2 + l] = (uint8_t)((L[j + l] & 0xf) |
				    (L[j + l + 32] & 0xf) << 4);
	}
}

/* Sums sum(w*x*l) and sum(w*l*l), w = x^2, of the levels for iscale. */
static void
sym_sums(int n, int nmax, const float *x, float iscale, float *sumlx,
    float *suml2)
{
	*sumlx = *suml2 = 0;
	for (int i = 0; i < n; i++) {
		int l = MAX(-nmax, MIN(nmax - 1, nearest_int(iscale * x[i])));
		float w = x[i] * x[i];

		*sumlx += w * x[i] * l;
		*suml2 += w * l * l;
	}
}

/* Stores the levels for iscale, offset to 0..2*nmax-1. */
static void
sym_levels(int n, int nmax, const float *x, float iscale, int8_t *L)
{
	for (int i = 0; i < n; i++)
		L[i] = (int8_t)(nmax + MAX(-nmax, MIN(nmax - 1,
		    nearest_int(iscale * x[i]))));
}

/*
 * Levels -nmax..nmax-1 (stored +nmax) and a scale for n values, the best
 * of 19 trial scales under weights x^2 (ggml's make_qx_quants with
 * rmse_type 1 and no importance). Returns the scale.
 */
static float
fit_scale_sym(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0, amax = 0, iscale, scale, best, sumlx, suml2;

	for (int i = 0; i < n; i++) {
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	}
	if (amax < GROUP_MAX_EPS) {
		memset(L, 0, (size_t)n);
		return 0;
	}
	iscale = -nmax / max;
	sym_levels(n, nmax, x, iscale, L);
	sym_sums(n, nmax, x, iscale, &sumlx, &suml2);
	scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
	best = scale * sumlx;
	for (int is = -9; is <= 9; is++) {
		if (is == 0)
			continue;
		iscale = -(nmax + 0.1f * is) / max;
		sym_sums(n, nmax, x, iscale, &sumlx, &suml2);
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			sym_levels(n, nmax, x, iscale, L);
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

/* Packs Q6_K levels 0..63 (see q6_K_value for the layout). */
static void
q6_K_pack(struct blk_q6_K *b, const int8_t L[QK_K])
{
	for (int h = 0; h < 2; h++) {
		const int8_t *Lh = L + 128 * h;
		uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;

		for (int l = 0; l < 32; l++) {
			ql[l] = (uint8_t)((Lh[l] & 0xf) | (Lh[l + 64] & 0xf) << 4);
			ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xf) | (Lh[l + 96] & 0xf) << 4);
			qh[l] = (uint8_t)(Lh[l] >> 4 | (Lh[l + 32] >> 4) << 2 |
			    (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
		}
	}
}

/*
 * Q6_K (ggml's quantize_row_q6_K_ref): a symmetric fit per 16 elements,
 * the scales stored as signed bytes against the largest, then the levels
 * redone against the stored scales.
 */
static void
q_q6_K(const float *x, void *dst, int64_t nb)
{
	struct blk_q6_K *b = dst;
	float scales[QK_K / 16];
	int8_t L[QK_K];

	for (int64_t i = 0; i < nb; i++, b++, x += QK_K) {
		float max_scale = 0, max_abs_scale = 0, iscale;

		for (int s = 0; s < QK_K / 16; s++) {
			scales[s] = fit_scale_sym(16, 32, x + 16 * s, L + 16 * s);
			if (fabsf(scales[s]) > max_abs_scale) {
				max_abs_scale = fabsf(scales[s]);
				max_scale = scales[s];
			}
		}
		if (max_abs_scale < GROUP_MAX_EPS) {
			memset(b, 0, sizeof *b);
			continue;
		}
		iscale = -128.f / max_scale;
		b->d = fp32_to_fp16(1 / iscale);
		for (int s = 0; s < QK_K / 16; s++)
			b->scales[s] = (int8_t)MIN(127, nearest_int(iscale * scales[s]));
		for (int s = 0; s < QK_K / 16; s++) {
			float d = fp16_to_fp32(b->d) * b->scales[s];
			if (d == 0)
				continue;
			for (int e = 16 * s; e < 16 * s + 16; e++)
				L[e] = (int8_t)(32 + MAX(-32, MIN(31, nearest_int(x[e] / d))));
		}
		q6_K_pack(b, L);
	}
}

/*
 * Q8_K (ggml's quantize_row_q8_K_ref): q = round(-127/max * x), d its
 * float32 inverse, plus the sums of each 16 quants. An all-zero block is
 * all zero bytes (ggml leaves its bsums unset).
 */
static void
q_q8_K(const float *x, void *dst, int64_t nb)
{
	struct blk_q8_K *b = dst;

	for (int64_t i = 0; i < nb; i++, b++, x += QK_K) {
		float max = 0, amax = 0, iscale;

		for (int j = 0; j < QK_K; j++) {
			if (fabsf(x[j]) > amax) {
				amax = fabsf(x[j]);
				max = x[j];
			}
		}
		memset(b, 0, sizeof *b);
		if (amax == 0)
			continue;
		iscale = -127.f / max;
		for (int j = 0; j < QK_K; j++)
			b->qs[j] = (int8_t)MIN(127, nearest_int(iscale * x[j]));
		for (int s = 0; s < QK_K / 16; s++) {
			int sum = 0;

			for (int j = 16 * s; j < 16 * s + 16; j++)
				sum += b->qs[j];
			b->bsums[s] = (int16_t)sum;
		}
		b->d = 1 / iscale;
	}
}

/* The MXFP4 value nearest x / d, the first of equals (ggml's best_index_mxfp4). */
static uint8_t
mxfp4_nearest(float x, float d)
{
	float best = fabsf((float)mxfp4_values[0] * d - x), e;
	uint8_t k = 0;

	for (uint8_t i = 1; i < 16; i++)
		if ((e = fabsf((float)mxfp4_values[i] * d - x)) < best) {
			best = e;
			k = i;
		}
	return k;
}

/* MXFP4 (ggml's quantize_row_mxfp4_ref): the scale from the largest magnitude's exponent, values to the nearest. */
static void
q_mxfp4(const float *x, void *dst, int64_t nb)
{
	struct blk_mxfp4 *b = dst;

	for (int64_t i = 0; i < nb; i++, b++, x += QK_0) {
		float amax = 0, d;

		for (int j = 0; j < QK_0; j++)
			amax = MAX(amax, fabsf(x[j]));
		b->e = amax > 0 ? (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0;
		d = mxfp4_scale(b->e);
		for (int j = 0; j < QK_0 / 2; j++)
			b->qs[j] = (uint8_t)(mxfp4_nearest(x[j], d) | mxfp4_nearest(x[j + QK_0 / 2], d) << 4);
	}
}
