/*
 * quant_blocks.h: the GGML block layouts, field for field as in
 * ggml-common.h (f16 fields are raw bits), for the code that reads blocks
 * directly: quant.c and the CPU kernels.
 */
#ifndef RESIDENT_QUANT_BLOCKS_H
#define RESIDENT_QUANT_BLOCKS_H

#include "quant.h"

#include <stdint.h>
#include <string.h>

#define QK_0 32 /* elements per block of the non-K types */

struct blk_q4_0 { uint16_t d; uint8_t qs[QK_0 / 2]; };
struct blk_q4_1 { uint16_t d, m; uint8_t qs[QK_0 / 2]; };
struct blk_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK_0 / 2]; };
struct blk_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK_0 / 2]; };
struct blk_q8_0 { uint16_t d; int8_t qs[QK_0]; };
/* ggml's current Q8_1, fp16 d and s (the gguf package's size table still
 * has the older float d, s: 40 bytes); only dot products use it. */
struct blk_q8_1 { uint16_t d, s; int8_t qs[QK_0]; };
struct blk_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
struct blk_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct blk_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
struct blk_q5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct blk_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
struct blk_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
/* e: the scale's exponent (e8m0); qs: element j in the low nibble of byte j, j + 16 in the high one */
struct blk_mxfp4 { uint8_t e; uint8_t qs[QK_0 / 2]; };

_Static_assert(sizeof(struct blk_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(struct blk_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(struct blk_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(struct blk_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(struct blk_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(struct blk_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(struct blk_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(struct blk_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(struct blk_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(struct blk_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(struct blk_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(struct blk_q8_K) == 292, "q8_K layout");
_Static_assert(sizeof(struct blk_mxfp4) == 17, "mxfp4 layout");

/*
 * Scale and min of sub-block j of a Q4_K/Q5_K block, 6 bits each: j < 4 in
 * the low bits of bytes j and j+4; j >= 4 in the nibbles of byte j+4 and the
 * top two bits of bytes j-4 and j.
 */
static inline void
k4_scale_min(int j, const uint8_t q[12], uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 0xf) | (q[j - 4] >> 6) << 4;
		*m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
	}
}

/*
 * All 8 scales, then all 8 mins, of a Q4_K/Q5_K block into out[16]: what
 * k4_scale_min gives, four fields at a time (as ggml unpacks them).
 */
static inline void
k4_unpack(const uint8_t q[12], uint8_t out[16])
{
	uint32_t u[4], aux;

	memcpy(u, q, 12);
	u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 6) & 0x03030303) << 4;
	aux = u[1] & 0x3f3f3f3f;
	u[1] = (u[2] & 0x0f0f0f0f) | ((u[0] >> 6) & 0x03030303) << 4;
	u[2] = aux;
	u[0] &= 0x3f3f3f3f;
	memcpy(out, u, 16);
}

/* The e2m1 values of MXFP4, doubled (as ggml's kvalues_mxfp4): halved scales make them exact. */
static const int8_t mxfp4_values[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

/* Half of 2^(e - 127), an MXFP4 block's scale for the doubled values (ggml_e8m0_to_fp32_half). */
static inline float
mxfp4_scale(uint8_t e)
{
	uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
	float f;

	memcpy(&f, &bits, sizeof f);
	return f;
}

#endif
