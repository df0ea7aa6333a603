/*
 * cpu_q8.c: integer dot products for the fast products of the CPU backend.
 *
 * The float path (cpu_ops.c) converts every weight to float for every
 * token, and that conversion, not memory, bounds its decoding. Here the
 * activations of a product come quantized to 8 bits a block (blocks of 32
 * with a float scale for the 32-element types, Q8_K for the K types, as
 * llama.cpp pairs them) and a weight block meets them in integer
 * multiply-adds: only one sum per block becomes float (per 32 elements for
 * the 32-element types, per 256 for the K types). The price is the
 * activations' rounding: Gemma 3 270M's perplexity 10.49 against 10.46.
 *
 * Integer sums are exact and the block sums are added in one fixed order,
 * so a result depends only on the row and the token's 8-bit copy: batches
 * stay invariant. The AVX2 and portable kernels differ only in the float
 * order of those block sums.
 */
#include "config.h"
#include "cpu_q8.h"
#include "cpu_simd.h"
#include "quant.h"
#include "quant_blocks.h"
#include "util.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Asks for a row ahead of its use: the hardware prefetcher alone lags. */
static inline void
prefetch_row(const uint8_t *p, size_t bytes)
{
	for (size_t o = 0; o < bytes; o += 64)
		__builtin_prefetch(p + o);
}

/* ---- portable C: one row and one token at a time ---- */

static float
dot_q4_0_c(const void *w, const void *a, int64_t nb)
{
	const struct blk_q4_0 *x = w;
	const struct q8_act32 *y = a;
	float sum = 0;

	for (int64_t i = 0; i < nb; i++) {
		int s = 0;

		for (int j = 0; j < QK_0 / 2; j++)
			s += ((x[i].qs[j] & 15) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
		sum += fp16_to_fp32(x[i].d) * y[i].d * (float)s;
	}
	return sum;
}

static float
dot_q5_0_c(const void *w, const void *a, int64_t nb)
{
	const struct blk_q5_0 *x = w;
	const struct q8_act32 *y = a;
	float sum = 0;
	uint32_t qh;

	for (int64_t i = 0; i < nb; i++) {
		int s = 0;

		memcpy(&qh, x[i].qh, sizeof qh);
		for (int j = 0; j < QK_0 / 2; j++) {
			int q0 = (x[i].qs[j] & 15) | (int)((qh >> j) << 4 & 0x10);
			int q1 = (x[i].qs[j] >> 4) | (int)(qh >> (j + 12) & 0x10);

			s += (q0 - 16) * y[i].qs[j] + (q1 - 16) * y[i].qs[j + 16];
		}
		sum += fp16_to_fp32(x[i].d) * y[i].d * (float)s;
	}
	return sum;
}

static float
dot_q8_0_c(const void *w, const void *a, int64_t nb)
{
	const struct blk_q8_0 *x = w;
	const struct q8_act32 *y = a;
	float sum = 0;

	for (int64_t i = 0; i < nb; i++) {
		int s = 0;

		for (int j = 0; j < QK_0; j++)
			s += x[i].qs[j] * y[i].qs[j];
		sum += fp16_to_fp32(x[i].d) * y[i].d * (float)s;
	}
	return sum;
}

/* Q4_K and Q5_K (qh non-NULL): sum of sc_j * (levels . y) and of m_j * (sum of y), per block. */
static float
k4_block_c(const uint8_t scales[12], uint16_t d, uint16_t dmin, const uint8_t *qs,
    const uint8_t *qh, const struct blk_q8_K *y)
{
	uint8_t sm[16];
	int s = 0, m = 0;

	k4_unpack(scales, sm);
	for (int j = 0; j < 8; j++) {
		const uint8_t *q = qs + 32 * (j / 2);
		int t = 0;

		for (int l = 0; l < 32; l++) {
			int v = j % 2 ? q[l] >> 4 : q[l] & 15;

			if (qh != NULL)
				v |= (qh[l] >> j & 1) << 4;
			t += v * y->qs[32 * j + l];
		}
		s += sm[j] * t;
		m += sm[8 + j] * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
	}
	return fp16_to_fp32(d) * y->d * (float)s - fp16_to_fp32(dmin) * y->d * (float)m;
}

static float
dot_q4_K_c(const void *w, const void *a, int64_t nb)
{
	const struct blk_q4_K *x = w;
	const struct blk_q8_K *y = a;
	float sum = 0;

	for (int64_t i = 0; i < nb; i++)
		sum += k4_block_c(x[i].scales, x[i].d, x[i].dmin, x[i].qs, NULL, &y[i]);
	return sum;
}

static float
dot_q5_K_c(const void *w, const void *a, int64_t nb)
{
	const struct blk_q5_K *x = w;
	const struct blk_q8_K *y = a;
	float sum = 0;

	for (int64_t i = 0; i < nb; i++)
		sum += k4_block_c(x[i].scales, x[i].d, x[i].dmin, x[i].qs, x[i].qh, &y[i]);
	return sum;
}

/* Element 128h + 32s + l of a Q6_K block: see q6_K_levels. */
static float
dot_q6_K_c(const void *w, const void *a, int64_t nb)
{
	const struct blk_q6_K *x = w;
	const struct blk_q8_K *y = a;
	float sum = 0;

	for (int64_t i = 0; i < nb; i++) {
		int s = 0;

		for (int h = 0; h < 2; h++)
			for (int q = 0; q < 4; q++)
				for (int l = 0; l < 32; l++) {
					int v = (x[i].ql[64 * h + 32 * (q % 2) + l] >> 4 * (q / 2) & 15) |
					    (x[i].qh[32 * h + l] >> 2 * q & 3) << 4;

					s += x[i].scales[8 * h + 2 * q + l / 16] * (v - 32) *
					    y[i].qs[128 * h + 32 * q + l];
				}
		sum += fp16_to_fp32(x[i].d) * y[i].d * (float)s;
	}
	return sum;
}

/* nr rows by n_tok tokens by one of the dots above. */
#define MM_C(name) \
static void \
mm_##name##_c(const uint8_t *w, size_t rb, int64_t nr, const uint8_t *a, size_t ab, int n_tok, \
    int64_t nb, float *y, int64_t ldy) \
{ \
	for (int t = 0; t < n_tok; t++) \
		for (int64_t r = 0; r < nr; r++) \
			y[t * ldy + r] = dot_##name##_c(w + r * rb, a + t * ab, nb); \
}
MM_C(q4_0)
MM_C(q5_0)
MM_C(q8_0)
MM_C(q4_K)
MM_C(q5_K)
MM_C(q6_K)
#undef MM_C

/* ---- AVX2 ---- */

#ifdef HAVE_X86
/*
 * The kernels below take one weight row and T <= Q8_TILE tokens (8 for
 * the 32-element types, 4 for the K types, whose tiles hold more
 * registers a token): each block is decoded once for the T tokens, and
 * each token keeps its own accumulators, fed in the same order whatever T
 * is, so a result does not depend on the tokens beside it.
 */
#define Q8_TILE 8

/* The activation block i of token t: rows ab bytes apart. */
#define ACT(type, a, ab, t, i) ((const type *)((a) + (size_t)(t) * (ab)) + (i))

/*
 * The 32-element types: levels(block) gives the signed levels, whose sign
 * moves onto the activations so that maddubs sees unsigned times signed
 * (the absolute value of -128 reads as 128 unsigned: still right).
 */
#define TILE_32(name, blk_t, levels) \
F16C_INLINE void \
tile_##name(const blk_t *x, const uint8_t *a, size_t ab, int64_t nb, float *y, int64_t ldy, \
    const int T) \
{ \
	const __m256i ones = _mm256_set1_epi16(1); \
	__m256 acc[Q8_TILE]; \
	__m256i q, u, p; \
	float dw; \
	_Pragma("GCC unroll 8") for (int t = 0; t < T; t++) \
		acc[t] = _mm256_setzero_ps(); \
	for (int64_t i = 0; i < nb; i++) { \
		q = levels(&x[i]); \
		u = _mm256_sign_epi8(q, q); \
		dw = scale_f16(x[i].d); \
		_Pragma("GCC unroll 8") for (int t = 0; t < T; t++) { \
			const struct q8_act32 *yb = ACT(struct q8_act32, a, ab, t, i); \
			p = _mm256_maddubs_epi16(u, _mm256_sign_epi8( \
			    _mm256_loadu_si256((const __m256i *)yb->qs), q)); \
			acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * yb->d), \
			    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[t]); \
		} \
	} \
	_Pragma("GCC unroll 8") for (int t = 0; t < T; t++) \
		y[t * ldy] = hsum_avx2(acc[t]); \
}

AVX2_INLINE __m256i
q4_0_levels(const struct blk_q4_0 *b)
{
	return _mm256_sub_epi8(nibbles(b->qs), _mm256_set1_epi8(8));
}

AVX2_INLINE __m256i
q8_0_levels(const struct blk_q8_0 *b)
{
	return _mm256_loadu_si256((const __m256i *)b->qs);
}

TILE_32(q4_0, struct blk_q4_0, q4_0_levels)
TILE_32(q5_0, struct blk_q5_0, q5_0_levels)
TILE_32(q8_0, struct blk_q8_0, q8_0_levels)
#undef TILE_32

/*
 * m_j * (sum of y over sub-block j), the 8 terms of a Q4_K/Q5_K block, in
 * one madd: mins16 holds each min twice, against y's two sums of 16.
 */
AVX2_INLINE __m256i
k4_mins(__m256i mins16, const struct blk_q8_K *y)
{
	return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mins16);
}

/* int16 j of v's low lane in every int16 of that lane, int16 k of its high lane in the high one. */
AVX2_INLINE __m256i
lanes_i16(__m256i v, int j, int k)
{
	return _mm256_shuffle_epi8(v, _mm256_set_m128i(_mm_set1_epi16((short)((2 * k + 1) << 8 | 2 * k)),
	    _mm_set1_epi16((short)((2 * j + 1) << 8 | 2 * j))));
}

/*
 * Masks for the Q4_K/Q5_K scales: int16 j of each lane into all of that
 * lane's int16. A table, so that each is one load folded into vpshufb: in
 * tile_k4 gcc builds lanes_i16's constants anew every block (measured:
 * Q4_K one token 13.5 -> 15.5 GB/s from cache with the table; Q6_K, whose
 * constants gcc keeps, got slower with it).
 */
static _Alignas(32) uint8_t k4_pick[8][32];

static void
k4_pick_init(void)
{
	for (int j = 0; j < 8; j++)
		for (int b = 0; b < 32; b++)
			k4_pick[j][b] = (uint8_t)(2 * j + (b & 1));
}

/* Sub-block levels q (unsigned) times y's 32 bytes at yq, times the scale in sc, added to s. */
AVX2_INLINE __m256i
k_sub(__m256i s, __m256i q, const int8_t *yq, __m256i sc)
{
	__m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)yq));

	return _mm256_add_epi32(s, _mm256_madd_epi16(p, sc));
}

/*
 * Q4_K and Q5_K (q5 set): the levels of sub-blocks 2k and 2k+1 decoded
 * once, met by every token; then acc += d * sum, macc += dmin * mins.
 */
F16C_INLINE void
tile_k4(const uint8_t *x, size_t bb, const uint8_t *a, size_t ab, int64_t nb, float *y,
    int64_t ldy, const int T, const int q5)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256 acc[Q8_TILE], macc[Q8_TILE];
	__m256i s[Q8_TILE], q, h = _mm256_setzero_si256(), lo, hi, sc16, mins, sl, sh;
	__m128i v;
	uint8_t sm[16];

#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		acc[t] = macc[t] = _mm256_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		const struct blk_q4_K *b4 = (const struct blk_q4_K *)(x + i * bb);
		const struct blk_q5_K *b5 = (const struct blk_q5_K *)(x + i * bb);

		k4_unpack(b4->scales, sm); /* d, dmin, scales: the same place in both */
		v = _mm_loadu_si128((const __m128i *)sm);
		sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v));
		mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(v, v)); /* m0 m0 m1 m1 .. m7 m7 */
		if (q5)
			h = _mm256_loadu_si256((const __m256i *)b5->qh);
#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			s[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
		for (int k = 0; k < 4; k++) {
			if (q5) {
				q5_K_levels(b5, h, k, &lo, &hi);
			} else {
				q = _mm256_loadu_si256((const __m256i *)(b4->qs + 32 * k));
				lo = _mm256_and_si256(q, m4);
				hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
			}
			sl = _mm256_shuffle_epi8(sc16, _mm256_load_si256((const __m256i *)k4_pick[2 * k]));
			sh = _mm256_shuffle_epi8(sc16, _mm256_load_si256((const __m256i *)k4_pick[2 * k + 1]));
#pragma GCC unroll 4
			for (int t = 0; t < T; t++) {
				const int8_t *yq = ACT(struct blk_q8_K, a, ab, t, i)->qs + 64 * k;

				s[t] = k_sub(k_sub(s[t], lo, yq, sl), hi, yq + 32, sh);
			}
		}
#pragma GCC unroll 4
		for (int t = 0; t < T; t++) {
			const struct blk_q8_K *yb = ACT(struct blk_q8_K, a, ab, t, i);

			acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(scale_f16(b4->d) * yb->d),
			    _mm256_cvtepi32_ps(s[t]), acc[t]);
			macc[t] = _mm256_fmadd_ps(_mm256_set1_ps(scale_f16(b4->dmin) * yb->d),
			    _mm256_cvtepi32_ps(k4_mins(mins, yb)), macc[t]);
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		y[t * ldy] = hsum_avx2(acc[t]) - hsum_avx2(macc[t]);
}

F16C_INLINE void
tile_q4_K(const struct blk_q4_K *x, const uint8_t *a, size_t ab, int64_t nb, float *y, int64_t ldy,
    const int T)
{
	tile_k4((const uint8_t *)x, sizeof *x, a, ab, nb, y, ldy, T, 0);
}

F16C_INLINE void
tile_q5_K(const struct blk_q5_K *x, const uint8_t *a, size_t ab, int64_t nb, float *y, int64_t ldy,
    const int T)
{
	tile_k4((const uint8_t *)x, sizeof *x, a, ab, nb, y, ldy, T, 1);
}

/*
 * Q6_K: levels 0..63 times y, each 16 by its scale, less 32 * sc * (sum of
 * y over those 16) for the offset of the levels.
 */
F16C_INLINE void
tile_q6_K(const struct blk_q6_K *x, const uint8_t *a, size_t ab, int64_t nb, float *y, int64_t ldy,
    const int T)
{
	__m256 acc[Q8_TILE];
	__m256i s[Q8_TILE], ql[2], qh, q, sc, sc16, half[2];

#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		acc[t] = _mm256_setzero_ps();
	for (int64_t i = 0; i < nb; i++) {
		sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
		half[0] = _mm256_permute2x128_si256(sc16, sc16, 0x00); /* scales 0..7 in both lanes */
		half[1] = _mm256_permute2x128_si256(sc16, sc16, 0x11); /* 8..15 */
#pragma GCC unroll 4
		for (int t = 0; t < T; t++) {
			s[t] = _mm256_madd_epi16(_mm256_loadu_si256(
			    (const __m256i *)ACT(struct blk_q8_K, a, ab, t, i)->bsums), sc16);
			s[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s[t], 5));
		}
#pragma GCC unroll 2
		for (int h = 0; h < 2; h++) {
			ql[0] = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
			ql[1] = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
			qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
			for (int k = 0; k < 4; k++) {
				q = q6_K_levels(ql, qh, k);
				sc = lanes_i16(half[h], 2 * k, 2 * k + 1);
#pragma GCC unroll 4
				for (int t = 0; t < T; t++) {
					s[t] = k_sub(s[t], q, ACT(struct blk_q8_K, a, ab, t, i)->qs + 128 * h + 32 * k,
					    sc);
				}
			}
		}
#pragma GCC unroll 4
		for (int t = 0; t < T; t++)
			acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(scale_f16(x[i].d) *
			    ACT(struct blk_q8_K, a, ab, t, i)->d), _mm256_cvtepi32_ps(s[t]), acc[t]);
	}
#pragma GCC unroll 4
	for (int t = 0; t < T; t++)
		y[t * ldy] = hsum_avx2(acc[t]);
}

/* Tiles of S tokens from token *t on, over all nr rows. */
#define TILES(name, blk_t, S) \
	for (; *t + (S) <= n_tok; *t += (S)) \
		for (int64_t r = 0; r < nr; r++) \
			tile_##name((const blk_t *)(w + r * rb), a + *t * ab, ab, nb, y + *t * ldy + r, \
			    ldy, (S))

/*
 * A kernel for nr rows by n_tok tokens: tiles of TT tokens over all the
 * rows (which the caller keeps few enough to stay in L1), then of 4, 2
 * and 1 for the rest. A single token asks for the next row ahead of use.
 */
#define MM_AVX2(name, blk_t, TT) \
F16C static void \
mm_##name##_avx2(const uint8_t *w, size_t rb, int64_t nr, const uint8_t *a, size_t ab, int n_tok, \
    int64_t nb, float *y, int64_t ldy) \
{ \
	int t0 = 0, *t = &t0; \
	if (n_tok == 1) { \
		for (int64_t r = 0; r < nr; r++) { \
			if (r + 1 < nr) \
				prefetch_row(w + (r + 1) * rb, rb); \
			tile_##name((const blk_t *)(w + r * rb), a, ab, nb, y + r, ldy, 1); \
		} \
		return; \
	} \
	TILES(name, blk_t, TT); \
	if ((TT) > 4) \
		TILES(name, blk_t, 4); \
	TILES(name, blk_t, 2); \
	TILES(name, blk_t, 1); \
}
MM_AVX2(q4_0, struct blk_q4_0, 8)
MM_AVX2(q5_0, struct blk_q5_0, 8)
MM_AVX2(q8_0, struct blk_q8_0, 8)
MM_AVX2(q4_K, struct blk_q4_K, 4)
MM_AVX2(q5_K, struct blk_q5_K, 4)
MM_AVX2(q6_K, struct blk_q6_K, 4)
#undef MM_AVX2
#endif

/* ---- activations ---- */

/* Q8_ACT_32 blocks, portable: the AVX2 twin below gives the same bytes. */
static int
quantize32_c(const float *x, int64_t nb, struct q8_act32 *y)
{
	for (int64_t i = 0; i < nb; i++, x += 32) {
		float amax = 0, d, id;

		for (int j = 0; j < 32; j++) {
			if (!isfinite(x[j]))
				return ERR_INVAL;
			amax = fmaxf(amax, fabsf(x[j]));
		}
		d = amax / 127;
		id = d != 0 ? 1.0f / d : 0.0f;
		y[i].d = d;
		for (int j = 0; j < 32; j++)
			y[i].qs[j] = (int8_t)lrintf(x[j] * id);
	}
	return 0;
}

#ifdef HAVE_X86
/* 32 int32 of q (4 vectors of 8) as 32 bytes in order: packs interleave the 128-bit lanes. */
AVX2_INLINE __m256i
pack_i8(const __m256i q[4])
{
	__m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));

	return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2 static int
quantize32_avx2(const float *x, int64_t nb, struct q8_act32 *y)
{
	const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
	__m256 v[4], m;
	__m128 h;
	__m256i q[4];
	float amax, d, id;

	for (int64_t i = 0; i < nb; i++, x += 32) {
		m = _mm256_setzero_ps();
		for (int k = 0; k < 4; k++) {
			v[k] = _mm256_loadu_ps(x + 8 * k);
			if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v[k]), big, _CMP_NLE_UQ)))
				return ERR_INVAL;
			m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
		}
		h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
		h = _mm_max_ps(h, _mm_movehl_ps(h, h));
		amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
		d = amax / 127;
		id = d != 0 ? 1.0f / d : 0.0f;
		y[i].d = d;
		for (int k = 0; k < 4; k++)
			q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
		_mm256_storeu_si256((__m256i *)y[i].qs, pack_i8(q));
	}
	return 0;
}

/*
 * Q8_K blocks with quant.c's bytes (q_q8_K): the scale from the first
 * element of the largest magnitude, levels rounded to nearest even, and
 * the sums of each 16.
 */
AVX2 static int
quantize_k_avx2(const float *x, int64_t nb, struct blk_q8_K *y)
{
	const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
	const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
	__m256 m, v, is;
	__m256i q[4], p;
	__m128i s;
	__m128 h;
	float amax, max = 0;

	for (int64_t i = 0; i < nb; i++, x += QK_K) {
		m = _mm256_setzero_ps();
		for (int k = 0; k < QK_K; k += 8) {
			v = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k));
			if (_mm256_movemask_ps(_mm256_cmp_ps(v, big, _CMP_NLE_UQ)))
				return ERR_INVAL;
			m = _mm256_max_ps(m, v);
		}
		h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
		h = _mm_max_ps(h, _mm_movehl_ps(h, h));
		amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
		memset(&y[i], 0, sizeof y[i]);
		if (amax == 0)
			continue;
		for (int j = 0; j < QK_K; j++)
			if (fabsf(x[j]) == amax) {
				max = x[j];
				break;
			}
		is = _mm256_set1_ps(-127.f / max);
		for (int k = 0; k < QK_K; k += 32) {
			for (int c = 0; c < 4; c++)
				q[c] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * c), is));
			p = pack_i8(q);
			_mm256_storeu_si256((__m256i *)(y[i].qs + k), p);
			/* sums of 16: bytes in pairs, pairs in fours, then the two halves' fours */
			p = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
			s = _mm_hadd_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
			s = _mm_hadd_epi32(s, s);
			y[i].bsums[k / 16] = (int16_t)_mm_cvtsi128_si32(s);
			y[i].bsums[k / 16 + 1] = (int16_t)_mm_extract_epi32(s, 1);
		}
		y[i].d = 1 / (-127.f / max);
	}
	return 0;
}
#endif

static int
quantize_k_c(const float *x, int64_t nb, struct blk_q8_K *y)
{
	return quant_quantize(TT_Q8_K, x, y, nb * QK_K);
}

static int (*quantize32)(const float *, int64_t, struct q8_act32 *) = quantize32_c;
static int (*quantize_k)(const float *, int64_t, struct blk_q8_K *) = quantize_k_c;

size_t
cpu_q8_act_bytes(int act, int64_t n)
{
	if (act == Q8_ACT_32)
		return (size_t)(n / 32) * sizeof(struct q8_act32);
	return (size_t)(n / QK_K) * sizeof(struct blk_q8_K);
}

int
cpu_q8_quantize(int act, const float *x, int64_t n, void *dst)
{
	if (act == Q8_ACT_32)
		return quantize32(x, n / 32, dst);
	return quantize_k(x, n / QK_K, dst);
}

/* ---- a q8_0 KV cache's rows ---- */

void
cpu_q8_dequant32(const struct q8_act32 *x, int64_t nb, float *y)
{
	for (int64_t i = 0; i < nb; i++, y += 32)
		for (int j = 0; j < 32; j++)
			y[j] = x[i].d * (float)x[i].qs[j];
}

/* ---- choice ---- */

static cpu_q8_mm_fn mm_impl[TT_COUNT_];

int
cpu_q8_act_type(uint32_t wtype)
{
	switch (wtype) {
	case TT_Q4_0:
	case TT_Q5_0:
	case TT_Q8_0:
		return Q8_ACT_32;
	case TT_Q4_K:
	case TT_Q5_K:
	case TT_Q6_K:
		return Q8_ACT_K;
	default:
		return Q8_ACT_NONE;
	}
}

cpu_q8_mm_fn
cpu_q8_mm(uint32_t wtype)
{
	return wtype < TT_COUNT_ ? mm_impl[wtype] : NULL;
}

void
cpu_q8_init(int avx2)
{
	k4_pick_init();
	mm_impl[TT_Q4_0] = mm_q4_0_c;
	mm_impl[TT_Q5_0] = mm_q5_0_c;
	mm_impl[TT_Q8_0] = mm_q8_0_c;
	mm_impl[TT_Q4_K] = mm_q4_K_c;
	mm_impl[TT_Q5_K] = mm_q5_K_c;
	mm_impl[TT_Q6_K] = mm_q6_K_c;
	quantize32 = quantize32_c;
	quantize_k = quantize_k_c;
#ifdef HAVE_X86
	if (avx2) {
		quantize32 = quantize32_avx2;
		quantize_k = quantize_k_avx2;
		mm_impl[TT_Q4_0] = mm_q4_0_avx2;
		mm_impl[TT_Q5_0] = mm_q5_0_avx2;
		mm_impl[TT_Q8_0] = mm_q8_0_avx2;
		mm_impl[TT_Q4_K] = mm_q4_K_avx2;
		mm_impl[TT_Q5_K] = mm_q5_K_avx2;
		mm_impl[TT_Q6_K] = mm_q6_K_avx2;
	}
#else
	(void)avx2;
#endif
}
