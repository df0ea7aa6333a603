/*
 * cpu_ops.c: float32 kernels of the CPU backend.
 *
 * Matrix products read the weights in their stored type: a task takes
 * chunks of CPU_MM_ROWS rows, dequantizes each chunk into its scratch and
 * dots its rows with every token, so the dequantization is paid once per
 * step and the model is never expanded in memory. Every y element equals
 * cpu_dot of the dequantized row and the token, bit for bit, whatever
 * computed it: a token's result does not depend on the batch it came in.
 *
 * The AVX2 path, picked at run time, keeps those bits and goes faster:
 * - its dequantizers do the float operations of quant.c's, one for one and
 *   in the same order (a product then a difference, never fused: gcc does
 *   not contract under -std=c11, clang is told below), so the floats are
 *   the same;
 * - register tiles of several rows by several tokens keep, for each pair,
 *   the two accumulators of dot_avx2, fed in its order and reduced by its
 *   code, so each element equals dot_avx2 of the row and the token;
 * - a lone token (decoding) skips the scratch: the quantized types are
 *   decoded a block at a time in registers and fed straight to those
 *   accumulators, in the same order.
 * Only NaN payloads may differ from the old scalar path (FMA picks which
 * NaN operand to propagate by register order, which gcc chooses).
 */
#include "config.h"
#include "cpu_ops.h"
#include "cpu_pool.h"
#include "cpu_q8.h"
#include "model.h"
#include "quant.h"
#include "quant_blocks.h"
#include "util.h"

#include "cpu_simd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Work for one matmul task at least, in multiply-adds: fewer trips to the counter. */
#define MM_TASK_WORK (1 << 16)
/* ... but at least this many tasks per thread, so that they balance. */
#define MM_TASKS_PER_THREAD 8
/* Rows dequantized at a time for one token (several take CPU_MM_ROWS). */
#define MM_SUB_ROWS 4

/* Dequantizes n elements (whole blocks) of one type into dst. */
typedef void (*row_deq_fn)(const void *src, float *dst, int64_t n);
/* y[r] = the dot of row r (of n elements, row_bytes apart) with x, r < nr. */
typedef void (*row_dot1_fn)(const uint8_t *w, size_t row_bytes, int64_t nr, const float *x,
    int64_t n, float *y);

static float dot_portable(const float *, const float *, int64_t);
static void mm_chunk_portable(const float *, int64_t, int, const float *, int64_t, int,
    float *, int64_t);

/* Eight partial sums, combined pairwise: the portable twin of the AVX2 order. */
static float
dot_portable(const float *a, const float *b, int64_t n)
{
	float acc[8] = { 0 };
	int64_t i;
	int k;

	for (i = 0; i + 8 <= n; i += 8)
		for (k = 0; k < 8; k++)
			acc[k] += a[i + k] * b[i + k];
	for (; i < n; i++)
		acc[i % 8] += a[i] * b[i];
	return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* nr rows of n floats, lda apart, dotted with n_tok tokens: one dot each. */
static void
mm_chunk_portable(const float *a, int64_t lda, int nr, const float *x, int64_t ldx, int n_tok,
    float *y, int64_t ldy)
{
	int r, t;

	for (t = 0; t < n_tok; t++)
		for (r = 0; r < nr; r++)
			y[t * ldy + r] = dot_portable(a + r * lda, x + t * ldx, lda);
}

#ifdef HAVE_X86

/* Bounds on the rows and tokens of a register tile (4 x 1 and 2 x 3 are used). */
#define TILE_R 4
#define TILE_T 3


static float dot_avx2(const float *, const float *, int64_t);
static void mm_chunk_avx2(const float *, int64_t, int, const float *, int64_t, int,
    float *, int64_t);
static void deq_f16_avx2(const void *, float *, int64_t);
static void deq_bf16_avx2(const void *, float *, int64_t);
static void deq_q4_0_avx2(const void *, float *, int64_t);
static void deq_q5_0_avx2(const void *, float *, int64_t);
static void deq_q8_0_avx2(const void *, float *, int64_t);
static void deq_q4_K_avx2(const void *, float *, int64_t);
static void deq_q5_K_avx2(const void *, float *, int64_t);
static void deq_q6_K_avx2(const void *, float *, int64_t);
static void dot1_q4_0_avx2(const uint8_t *, size_t, int64_t, const float *, int64_t, float *);
static void dot1_q5_0_avx2(const uint8_t *, size_t, int64_t, const float *, int64_t, float *);
static void dot1_q8_0_avx2(const uint8_t *, size_t, int64_t, const float *, int64_t, float *);
static void dot1_q4_K_avx2(const uint8_t *, size_t, int64_t, const float *, int64_t, float *);
static void dot1_q5_K_avx2(const uint8_t *, size_t, int64_t, const float *, int64_t, float *);
static void dot1_q6_K_avx2(const uint8_t *, size_t, int64_t, const float *, int64_t, float *);

/* The end of dot_avx2: the 8-wide and scalar tails from i, then the sum. */
AVX2_INLINE float
dot_end_avx2(__m256 s0, __m256 s1, const float *a, const float *b, int64_t i, int64_t n)
{
	float tail = 0;

	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
	for (; i < n; i++)
		tail += a[i] * b[i];
	return hsum_avx2(_mm256_add_ps(s0, s1)) + tail;
}

/*
 * Two 8-wide FMA accumulators: s0 takes elements 0-7 of every 16, s1
 * elements 8-15. The tiles below keep this order; change both or neither.
 */
AVX2 static float
dot_avx2(const float *a, const float *b, int64_t n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	int64_t i;

	for (i = 0; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
	}
	return dot_end_avx2(s0, s1, a, b, i, n);
}

/*
 * Pins v to a register: gcc would rather fold its load into every FMA that
 * uses it, which takes a tile of R rows by T tokens from R + T loads per
 * step to R * T + R, more than the two a cycle the core can do.
 */
#define KEEP(v) __asm__("" : "+x"(v))

/*
 * R rows (n floats, lda apart) by T tokens: y[t * ldy + r] = dot_avx2(row r,
 * token t), with the 2 * R * T accumulators in registers, each row vector
 * loaded once for T tokens and each token vector once for R rows.
 */
AVX2_INLINE void
mm_tile_avx2(const float *a, int64_t lda, const float *x, int64_t ldx, float *y, int64_t ldy,
    int64_t n, const int R, const int T)
{
	__m256 s0[TILE_R * TILE_T], s1[TILE_R * TILE_T], xv[TILE_T], av;
	int64_t i;
	int r, t;

#pragma GCC unroll 8
	for (r = 0; r < R * T; r++)
		s0[r] = s1[r] = _mm256_setzero_ps();
	for (i = 0; i + 16 <= n; i += 16) {
#pragma GCC unroll 3
		for (t = 0; t < T; t++) {
			xv[t] = _mm256_loadu_ps(x + t * ldx + i);
			KEEP(xv[t]);
		}
#pragma GCC unroll 4
		for (r = 0; r < R; r++) {
			av = _mm256_loadu_ps(a + r * lda + i);
#pragma GCC unroll 3
			for (t = 0; t < T; t++)
				s0[r * T + t] = _mm256_fmadd_ps(av, xv[t], s0[r * T + t]);
		}
#pragma GCC unroll 3
		for (t = 0; t < T; t++) {
			xv[t] = _mm256_loadu_ps(x + t * ldx + i + 8);
			KEEP(xv[t]);
		}
#pragma GCC unroll 4
		for (r = 0; r < R; r++) {
			av = _mm256_loadu_ps(a + r * lda + i + 8);
#pragma GCC unroll 3
			for (t = 0; t < T; t++)
				s1[r * T + t] = _mm256_fmadd_ps(av, xv[t], s1[r * T + t]);
		}
	}
#pragma GCC unroll 4
	for (r = 0; r < R; r++)
#pragma GCC unroll 3
		for (t = 0; t < T; t++)
			y[t * ldy + r] = dot_end_avx2(s0[r * T + t], s1[r * T + t], a + r * lda,
			    x + t * ldx, i, n);
}

/* Rows [r, nr) for the T tokens at x, two at a time. */
AVX2_INLINE void
mm_pairs_avx2(const float *a, int64_t lda, int r, int nr, const float *x, int64_t ldx, float *y,
    int64_t ldy, const int T)
{
	for (; r + 2 <= nr; r += 2)
		mm_tile_avx2(a + r * lda, lda, x, ldx, y + r, ldy, lda, 2, T);
	if (r < nr)
		mm_tile_avx2(a + r * lda, lda, x, ldx, y + r, ldy, lda, 1, T);
}

/*
 * The AVX2 twin of mm_chunk_portable. One token goes by tiles of 4 rows.
 * Several go by tiles of 2 rows by 3 tokens (12 accumulators, 3 token
 * vectors and a row vector: the 16 registers), over all the rows for each
 * 3 tokens, which then stay in L1.
 */
AVX2 static void
mm_chunk_avx2(const float *a, int64_t lda, int nr, const float *x, int64_t ldx, int n_tok,
    float *y, int64_t ldy)
{
	int r = 0, t;

	if (n_tok == 1) {
		for (; r + 4 <= nr; r += 4)
			mm_tile_avx2(a + r * lda, lda, x, ldx, y + r, ldy, lda, 4, 1);
		mm_pairs_avx2(a, lda, r, nr, x, ldx, y, ldy, 1);
		return;
	}
	for (t = 0; t + 3 <= n_tok; t += 3)
		mm_pairs_avx2(a, lda, 0, nr, x + t * ldx, ldx, y + t * ldy, ldy, 3);
	if (n_tok - t == 2)
		mm_pairs_avx2(a, lda, 0, nr, x + t * ldx, ldx, y + t * ldy, ldy, 2);
	else if (n_tok - t == 1)
		mm_pairs_avx2(a, lda, 0, nr, x + t * ldx, ldx, y + t * ldy, ldy, 1);
}

/* ---- dequantizers: quant.c's arithmetic, eight floats at a time ---- */

/* Eight signed bytes (the low half of v) as floats. */
AVX2_INLINE __m256
i8_ps(__m128i v)
{
	return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

/* The 32 signed bytes of q as four vectors of floats. */
AVX2_INLINE void
i8x32_ps(__m256i q, __m256 v[4])
{
	__m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);

	v[0] = i8_ps(lo);
	v[1] = i8_ps(_mm_unpackhi_epi64(lo, lo));
	v[2] = i8_ps(hi);
	v[3] = i8_ps(_mm_unpackhi_epi64(hi, hi));
}

/*
 * Where a block decoder puts the 32 floats at offset off of its block:
 * stored at y + off (fma 0: x, s0 and s1 unused, maybe NULL), or
 * multiplied by x[off..] and added to the accumulators s0, s1 in the order
 * of dot_avx2 (fma 1: y unused). y and x point at the block's first element.
 */
AVX2_INLINE void
emit(const __m256 v[4], float *y, const float *x, int off, __m256 *s0, __m256 *s1, const int fma)
{
	if (fma) {
		*s0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + off), *s0);
		*s1 = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + off + 8), *s1);
		*s0 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + off + 16), *s0);
		*s1 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + off + 24), *s1);
	} else {
#pragma GCC unroll 4
		for (int k = 0; k < 4; k++)
			_mm256_storeu_ps(y + off + 8 * k, v[k]);
	}
}

/* Lane j of v in every lane. */
AVX2_INLINE __m256
lane(__m256 v, int j)
{
	return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(j));
}

/*
 * The block decoders: block i of a row, each float what quant.c's
 * dequantizer computes for it, by the same float operations, to emit().
 */
#define BLK_ARGS const uint8_t *row, int64_t i, float *y, const float *x, __m256 *s0, __m256 *s1, \
	const int fma

/* Q4_0: d * (float)(q - 8). */
F16C_INLINE void
blk_q4_0(BLK_ARGS)
{
	const struct blk_q4_0 *b = (const struct blk_q4_0 *)row + i;
	__m256 d = _mm256_set1_ps(scale_f16(b->d)), v[4];

	i8x32_ps(_mm256_sub_epi8(nibbles(b->qs), _mm256_set1_epi8(8)), v);
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++)
		v[k] = _mm256_mul_ps(d, v[k]);
	emit(v, y, x, 0, s0, s1, fma);
}

/* Q5_0: d * (float)(q - 16). */
F16C_INLINE void
blk_q5_0(BLK_ARGS)
{
	const struct blk_q5_0 *b = (const struct blk_q5_0 *)row + i;
	__m256 d = _mm256_set1_ps(scale_f16(b->d)), v[4];

	i8x32_ps(q5_0_levels(b), v);
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++)
		v[k] = _mm256_mul_ps(d, v[k]);
	emit(v, y, x, 0, s0, s1, fma);
}

/* Q8_0: d * (float)q. */
F16C_INLINE void
blk_q8_0(BLK_ARGS)
{
	const struct blk_q8_0 *b = (const struct blk_q8_0 *)row + i;
	__m256 d = _mm256_set1_ps(scale_f16(b->d)), v[4];

#pragma GCC unroll 4
	for (int k = 0; k < 4; k++)
		v[k] = _mm256_mul_ps(d, i8_ps(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * k))));
	emit(v, y, x, 0, s0, s1, fma);
}

/*
 * The 8 scales and mins of a Q4_K/Q5_K block times d and dmin: lane j
 * holds quant.c's dl = d * sc and ml = dmin * m of sub-block j. The 6-bit
 * fields are unpacked as ggml does (see k4_scale_min in quant.c).
 */
F16C_INLINE void
k4_scales(const uint8_t scales[12], uint16_t d, uint16_t dmin, __m256 *dl, __m256 *ml)
{
	uint8_t u[16];
	__m128i sm;

	k4_unpack(scales, u);
	sm = _mm_loadu_si128((const __m128i *)u);
	*dl = _mm256_mul_ps(_mm256_set1_ps(scale_f16(d)),
	    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)));
	*ml = _mm256_mul_ps(_mm256_set1_ps(scale_f16(dmin)),
	    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(sm, sm))));
}

/* Sub-block j of a Q4_K/Q5_K block, levels q: dl * (float)q - ml. */
AVX2_INLINE void
k4_emit(__m256i q, __m256 dl, __m256 ml, int j, float *y, const float *x, __m256 *s0, __m256 *s1,
    const int fma)
{
	__m256 v[4];

	dl = lane(dl, j);
	ml = lane(ml, j);
	i8x32_ps(q, v);
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++)
		v[k] = _mm256_sub_ps(_mm256_mul_ps(dl, v[k]), ml);
	emit(v, y, x, 32 * j, s0, s1, fma);
}

/* Q4_K: sub-blocks 2k and 2k+1 are the low and high nibbles of qs[32k..]. */
F16C_INLINE void
blk_q4_K(BLK_ARGS)
{
	const struct blk_q4_K *b = (const struct blk_q4_K *)row + i;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256 dl, ml;
	__m256i q;

	k4_scales(b->scales, b->d, b->dmin, &dl, &ml);
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) {
		q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * k));
		k4_emit(_mm256_and_si256(q, m4), dl, ml, 2 * k, y, x, s0, s1, fma);
		q = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
		k4_emit(q, dl, ml, 2 * k + 1, y, x, s0, s1, fma);
	}
}

/* Q5_K: Q4_K with bit j of qh[l] as bit 4 of sub-block j. */
F16C_INLINE void
blk_q5_K(BLK_ARGS)
{
	const struct blk_q5_K *b = (const struct blk_q5_K *)row + i;
	__m256i h = _mm256_loadu_si256((const __m256i *)b->qh), lo, hi;
	__m256 dl, ml;

	k4_scales(b->scales, b->d, b->dmin, &dl, &ml);
#pragma GCC unroll 4
	for (int k = 0; k < 4; k++) {
		q5_K_levels(b, h, k, &lo, &hi);
		k4_emit(lo, dl, ml, 2 * k, y, x, s0, s1, fma);
		k4_emit(hi, dl, ml, 2 * k + 1, y, x, s0, s1, fma);
	}
}

/*
 * Q6_K: (d * sc) * (float)(q - 32), sc per 16 elements. Quarter s of half
 * h: nibble s/2 of ql[64h + 32(s%2) + l], bits 2s of qh[32h + l].
 */
F16C_INLINE void
blk_q6_K(BLK_ARGS)
{
	const struct blk_q6_K *b = (const struct blk_q6_K *)row + i;
	__m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
	__m256 d = _mm256_set1_ps(scale_f16(b->d)), dl[2], d0, d1, v[4];
	__m256i ql[2], qh, q;

	dl[0] = _mm256_mul_ps(d, i8_ps(sc));
	dl[1] = _mm256_mul_ps(d, i8_ps(_mm_unpackhi_epi64(sc, sc)));
#pragma GCC unroll 2
	for (int h = 0; h < 2; h++) {
		ql[0] = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
		ql[1] = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
		qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
#pragma GCC unroll 4
		for (int s = 0; s < 4; s++) {
			q = q6_K_levels(ql, qh, s);
			i8x32_ps(_mm256_sub_epi8(q, _mm256_set1_epi8(32)), v);
			d0 = lane(dl[h], 2 * s);
			d1 = lane(dl[h], 2 * s + 1);
			v[0] = _mm256_mul_ps(d0, v[0]);
			v[1] = _mm256_mul_ps(d0, v[1]);
			v[2] = _mm256_mul_ps(d1, v[2]);
			v[3] = _mm256_mul_ps(d1, v[3]);
			emit(v, y, x, 128 * h + 32 * s, s0, s1, fma);
		}
	}
}

typedef void (*blk_fn)(BLK_ARGS);
#undef BLK_ARGS

/* n elements (whole blocks of be) of a row into y. */
F16C_INLINE void
deq_blocks(const void *src, float *y, int64_t n, blk_fn blk, const int be)
{
	for (int64_t i = 0; i < n / be; i++)
		blk(src, i, y + i * be, NULL, NULL, NULL, 0);
}

/*
 * y[r] for R rows (row_bytes apart) of n elements and one token, decoded
 * in registers: each block feeds the accumulators as dot_avx2 would from
 * the dequantized row. The same blocks of the R rows at pf are prefetched
 * meanwhile: the hardware prefetcher alone leaves this loop waiting on
 * memory (it runs 1.6 times faster on Gemma's 178 MB output matrix).
 */
F16C_INLINE void
dot1_tile(const uint8_t *w, size_t row_bytes, const uint8_t *pf, const float *x, int64_t n,
    float *y, const int R, blk_fn blk, const int be)
{
	size_t bb = row_bytes / (size_t)(n / be), o;
	__m256 s0[4], s1[4];
	int64_t i;
	int r;

#pragma GCC unroll 4
	for (r = 0; r < R; r++)
		s0[r] = s1[r] = _mm256_setzero_ps();
	for (i = 0; i < n / be; i++)
#pragma GCC unroll 4
		for (r = 0; r < R; r++) {
			for (o = 0; o < bb; o += 64)
				_mm_prefetch((const char *)pf + r * row_bytes + i * bb + o, _MM_HINT_T0);
			blk(w + r * row_bytes, i, NULL, x + i * be, &s0[r], &s1[r], 1);
		}
#pragma GCC unroll 4
	for (r = 0; r < R; r++)
		y[r] = dot_end_avx2(s0[r], s1[r], x, x, n, n); /* n % 32 == 0: no tails */
}

/* nr rows and one token, R at a time, straight from the weights. */
F16C_INLINE void
dot1_rows(const uint8_t *w, size_t row_bytes, int64_t nr, const float *x, int64_t n, float *y,
    blk_fn blk, const int be, const int R)
{
	const uint8_t *t;
	int64_t r;

	for (r = 0; r + R <= nr; r += R) {
		t = w + r * row_bytes;
		dot1_tile(t, row_bytes, r + 2 * R <= nr ? t + R * row_bytes : t, x, n, y + r, R,
		    blk, be);
	}
	for (; r < nr; r++)
		dot1_tile(w + r * row_bytes, row_bytes, w + r * row_bytes, x, n, y + r, 1, blk, be);
}

/* The dequantizer and the one-token product of a type: block be, tiles of R rows. */
#define TYPE_FNS(name, be, R) \
F16C static void \
deq_##name##_avx2(const void *src, float *y, int64_t n) \
{ \
	deq_blocks(src, y, n, blk_##name, be); \
} \
F16C static void \
dot1_##name##_avx2(const uint8_t *w, size_t rb, int64_t nr, const float *x, int64_t n, float *y) \
{ \
	dot1_rows(w, rb, nr, x, n, y, blk_##name, be, R); \
}
TYPE_FNS(q4_0, 32, 4)
TYPE_FNS(q5_0, 32, 4)
TYPE_FNS(q8_0, 32, 4)
TYPE_FNS(q4_K, QK_K, 2)
TYPE_FNS(q5_K, QK_K, 2)
TYPE_FNS(q6_K, QK_K, 2)
#undef TYPE_FNS

/*
 * F16: exact widening by F16C; a NaN is rebuilt from its bits as
 * fp16_to_fp32 does, since F16C would set its quiet bit.
 */
F16C static void
deq_f16_avx2(const void *src, float *y, int64_t n)
{
	const uint16_t *h = src;
	const __m256i abs = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7c00);
	__m128i raw;
	__m256i v, nan;
	int64_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		raw = _mm_loadu_si128((const __m128i *)(h + i));
		v = _mm256_cvtepu16_epi32(raw);
		nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, abs), inf);
		if (_mm256_testz_si256(nan, nan)) {
			_mm256_storeu_ps(y + i, _mm256_cvtph_ps(raw));
			continue;
		}
		for (int k = 0; k < 8; k++)
			y[i + k] = fp16_to_fp32(h[i + k]);
	}
	for (; i < n; i++)
		y[i] = fp16_to_fp32(h[i]);
}

/* BF16: the top half of a float. */
AVX2 static void
deq_bf16_avx2(const void *src, float *y, int64_t n)
{
	const uint16_t *h = src;
	__m256i v;
	int64_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
		_mm256_storeu_si256((__m256i *)(y + i), _mm256_slli_epi32(v, 16));
	}
	for (; i < n; i++)
		y[i] = bf16_to_fp32(h[i]);
}

#endif

/* One element of cpu_glu, by libm. */
static float
glu1(float a, float b, int gelu)
{
	const float k = 0.7978845608028654f; /* sqrt(2 / pi) */

	if (gelu)
		a = 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
	else
		a = a / (1.0f + expf(-a));
	return a * b;
}

static void
glu_portable(float *a, const float *b, int64_t n, int gelu)
{
	for (int64_t i = 0; i < n; i++)
		a[i] = glu1(a[i], b[i], gelu);
}

static float
exp_sum_portable(float *sc, int64_t n, float mx)
{
	float sum = 0;

	for (int64_t i = 0; i < n; i++) {
		sc[i] = expf(sc[i] - mx);
		sum += sc[i];
	}
	return sum;
}

static void
axpy_portable(float *y, float a, const float *x, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		y[i] += a * x[i];
}

#ifdef HAVE_X86
/*
 * exp of 8 floats: 2^n times a degree-7 polynomial of the remainder (the
 * Cephes expf), within 2 ulp of libm over the range; NaN stays NaN.
 */
AVX2_INLINE __m256
exp_avx2(__m256 x)
{
	const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
	__m256 n, r, y;

	x = _mm256_min_ps(_mm256_set1_ps(88.3762626647949f), _mm256_max_ps(_mm256_set1_ps(-87.3365447f), x));
	n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
	    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	r = _mm256_fnmadd_ps(n, c2, _mm256_fnmadd_ps(n, c1, x));
	y = _mm256_set1_ps(1.9875691500e-4f);
	y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
	y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
	y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
	y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
	y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
	y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(
	    _mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)));
}

/* SiLU(a) = a / (1 + e^-a); the tanh GELU is a / (1 + e^-2u), u its tanh argument. */
AVX2 static void
glu_avx2(float *a, const float *b, int64_t n, int gelu)
{
	const __m256 one = _mm256_set1_ps(1.0f), k = _mm256_set1_ps(-2 * 0.7978845608028654f);
	const __m256 c = _mm256_set1_ps(0.044715f);
	__m256 x, e;
	int64_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		x = _mm256_loadu_ps(a + i);
		if (gelu) /* -2u = -2k (x + c x^3) */
			e = _mm256_mul_ps(k, _mm256_fmadd_ps(_mm256_mul_ps(c, x), _mm256_mul_ps(x, x), x));
		else
			e = _mm256_sub_ps(_mm256_setzero_ps(), x);
		x = _mm256_div_ps(x, _mm256_add_ps(one, exp_avx2(e)));
		_mm256_storeu_ps(a + i, _mm256_mul_ps(x, _mm256_loadu_ps(b + i)));
	}
	for (; i < n; i++)
		a[i] = glu1(a[i], b[i], gelu);
}

/* The sum is over 8 lanes, then across them: one fixed order for every n. */
AVX2 static float
exp_sum_avx2(float *sc, int64_t n, float mx)
{
	__m256 m = _mm256_set1_ps(mx), acc = _mm256_setzero_ps(), e;
	float tail[8], sum;
	int64_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(sc + i), m));
		_mm256_storeu_ps(sc + i, e);
		acc = _mm256_add_ps(acc, e);
	}
	sum = hsum_avx2(acc);
	if (i < n) {
		memcpy(tail, sc + i, (size_t)(n - i) * sizeof *tail);
		_mm256_storeu_ps(tail, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(tail), m)));
		for (int64_t j = 0; i + j < n; j++) {
			sc[i + j] = tail[j];
			sum += tail[j];
		}
	}
	return sum;
}

AVX2 static void
axpy_avx2(float *y, float a, const float *x, int64_t n)
{
	__m256 av = _mm256_set1_ps(a);
	int64_t i;

	for (i = 0; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
	for (; i < n; i++)
		y[i] += a * x[i];
}
#endif

static float (*dot_impl)(const float *, const float *, int64_t) = dot_portable;
static void (*mm_chunk_impl)(const float *, int64_t, int, const float *, int64_t, int, float *,
    int64_t) = mm_chunk_portable;
/* SIMD dequantizers by type; NULL: quant_dequantize. */
static row_deq_fn deq_impl[TT_COUNT_];
/* One-token products decoding the weights in registers, by type; or NULL. */
static row_dot1_fn dot1_impl[TT_COUNT_];
static void (*glu_impl)(float *, const float *, int64_t, int) = glu_portable;
static float (*exp_sum_impl)(float *, int64_t, float) = exp_sum_portable;
static void (*axpy_impl)(float *, float, const float *, int64_t) = axpy_portable;
static const char *isa = "portable";

#ifdef HAVE_X86
/* F16C by cpuid: clang's __builtin_cpu_supports does not know it. */
static int
has_f16c(void)
{
	unsigned a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

void
cpu_ops_init(void)
{
	const char *want = getenv("RESIDENT_CPU_ISA");
	int avx2 = 0;

	dot_impl = dot_portable;
	mm_chunk_impl = mm_chunk_portable;
	glu_impl = glu_portable;
	exp_sum_impl = exp_sum_portable;
	axpy_impl = axpy_portable;
	memset(deq_impl, 0, sizeof deq_impl);
	memset(dot1_impl, 0, sizeof dot1_impl);
	isa = "portable";
#ifdef HAVE_X86
	__builtin_cpu_init();
	avx2 = (want == NULL || strcmp(want, "portable") != 0) && __builtin_cpu_supports("avx2") &&
	    __builtin_cpu_supports("fma") && has_f16c();
	if (avx2) {
		dot_impl = dot_avx2;
		mm_chunk_impl = mm_chunk_avx2;
		glu_impl = glu_avx2;
		exp_sum_impl = exp_sum_avx2;
		axpy_impl = axpy_avx2;
		isa = "avx2";
		deq_impl[TT_F16] = deq_f16_avx2;
		deq_impl[TT_BF16] = deq_bf16_avx2;
		deq_impl[TT_Q4_0] = deq_q4_0_avx2;
		deq_impl[TT_Q5_0] = deq_q5_0_avx2;
		deq_impl[TT_Q8_0] = deq_q8_0_avx2;
		deq_impl[TT_Q4_K] = deq_q4_K_avx2;
		deq_impl[TT_Q5_K] = deq_q5_K_avx2;
		deq_impl[TT_Q6_K] = deq_q6_K_avx2;
		dot1_impl[TT_Q4_0] = dot1_q4_0_avx2;
		dot1_impl[TT_Q5_0] = dot1_q5_0_avx2;
		dot1_impl[TT_Q8_0] = dot1_q8_0_avx2;
		dot1_impl[TT_Q4_K] = dot1_q4_K_avx2;
		dot1_impl[TT_Q5_K] = dot1_q5_K_avx2;
		dot1_impl[TT_Q6_K] = dot1_q6_K_avx2;
	}
#else
	(void)want;
#endif
	cpu_q8_init(avx2);
}

const char *
cpu_ops_isa(void)
{
	return isa;
}

float
cpu_dot(const float *a, const float *b, int64_t n)
{
	return dot_impl(a, b, n);
}

/* quant_dequantize, by SIMD where this processor and type have it. */
static void
dequantize(uint32_t type, const void *src, float *dst, int64_t n)
{
	if (type < TT_COUNT_ && deq_impl[type] != NULL)
		deq_impl[type](src, dst, n);
	else
		quant_dequantize(type, src, dst, n);
}

struct mm_ctx {
	const struct model_tensor *w;
	size_t row_bytes;
	const float *x;
	int64_t ldx;
	int n_tok;
	float *y;
	int64_t ldy;
	float *scratch;
	int64_t n_chunks, chunks_per_task;
	row_dot1_fn dot1;	/* one token, decoded in registers; or NULL */
	cpu_q8_mm_fn qmm;	/* the 8-bit path: integer products with xq; or NULL */
	const uint8_t *xq;
	size_t xq_bytes;	/* of one token's 8-bit row */
	int64_t nb;		/* blocks of a weight row */
};

/*
 * A task of the 8-bit path: rows [r, end) by every token. Several tokens
 * go CPU_MM_ROWS rows at a time, which stay in L1 across the tokens.
 */
static void
mm_q8_rows(const struct mm_ctx *c, int64_t r, int64_t end)
{
	const uint8_t *w = (const uint8_t *)c->w->data;
	int64_t n = c->n_tok == 1 ? end - r : CPU_MM_ROWS;

	for (; r < end; r += n)
		c->qmm(w + (size_t)r * c->row_bytes, c->row_bytes, MIN(n, end - r), c->xq, c->xq_bytes,
		    c->n_tok, c->nb, c->y + r, c->ldy);
}

/*
 * One task: chunks_per_task chunks of CPU_MM_ROWS output rows, every token.
 * One token of a type with a dot1 kernel reads the weights directly; for
 * other single tokens rows are dequantized MM_SUB_ROWS at a time, so that
 * they are still in L1 when dotted.
 */
static void
mm_task(void *arg, int64_t task, int thread)
{
	const struct mm_ctx *c = arg;
	int64_t in = c->w->ne[0], r = task * c->chunks_per_task * CPU_MM_ROWS;
	int64_t end = MIN(r + c->chunks_per_task * CPU_MM_ROWS, c->w->ne[1]), nr;
	const uint8_t *src;
	const float *rows;
	float *scratch = c->scratch + (size_t)thread * CPU_MM_ROWS * (size_t)in;

	if (c->qmm != NULL) {
		mm_q8_rows(c, r, end);
		return;
	}
	if (c->dot1 != NULL) {
		c->dot1((const uint8_t *)c->w->data + (size_t)r * c->row_bytes, c->row_bytes,
		    end - r, c->x, in, c->y + r);
		return;
	}
	for (; r < end; r += nr) {
		nr = MIN(c->n_tok == 1 ? MM_SUB_ROWS : CPU_MM_ROWS, end - r);
		src = (const uint8_t *)c->w->data + (size_t)r * c->row_bytes;
		if (c->w->type == TT_F32) {
			rows = (const float *)src; /* quant.c would copy it bit for bit */
		} else {
			dequantize(c->w->type, src, scratch, nr * in);
			rows = scratch;
		}
		mm_chunk_impl(rows, in, (int)nr, c->x, c->ldx, c->n_tok, c->y + r, c->ldy);
	}
}

size_t
cpu_act_bytes(int64_t n, int64_t n_tok)
{
	int64_t up = (n + QK_K - 1) / QK_K * QK_K; /* Q8_K takes more per element */

	return MAX(cpu_q8_act_bytes(Q8_ACT_K, up), cpu_q8_act_bytes(Q8_ACT_32, up)) * (size_t)n_tok;
}

void
cpu_act_init(struct cpu_act *a, const float *x, int64_t ld, int n_tok, int64_t n,
    uint8_t *const *q8)
{
	*a = (struct cpu_act){ x, ld, n, n_tok, q8, { 0, 0 } };
}

void
cpu_act_rows(struct cpu_act *a, const float *x, int64_t ld, int64_t row0, int n_tok, int64_t n, uint8_t *const *q8,
    uint8_t *slice[2])
{
	if (q8 != NULL) {
		slice[0] = q8[0] + (size_t)row0 * cpu_q8_act_bytes(Q8_ACT_32, n);
		slice[1] = q8[1] + (size_t)row0 * cpu_q8_act_bytes(Q8_ACT_K, n);
	}
	cpu_act_init(a, x + row0 * ld, ld, n_tok, n, q8 != NULL ? slice : NULL);
}

/*
 * Points c at the input's 8-bit copy for c's weight, making it if need be,
 * when the weight has an integer kernel. Activations that are not finite
 * stay on the float path, which carries them as the reference does.
 */
static void
use_q8(struct mm_ctx *c, struct cpu_act *a)
{
	int at = cpu_q8_act_type(c->w->type), k = at == Q8_ACT_K;
	cpu_q8_mm_fn mm = cpu_q8_mm(c->w->type);
	int t;

	if (a->q8 == NULL || at == Q8_ACT_NONE || mm == NULL)
		return;
	c->xq_bytes = cpu_q8_act_bytes(at, a->n);
	if (!a->made[k]) {
		for (t = 0; t < a->n_tok; t++)
			if (cpu_q8_quantize(at, a->x + t * a->ld, a->n, a->q8[k] + (size_t)t * c->xq_bytes) != 0)
				break;
		a->made[k] = t == a->n_tok ? 1 : -1;
	}
	if (a->made[k] < 0)
		return;
	c->qmm = mm;
	c->xq = a->q8[k];
	c->nb = a->n / quant_traits(c->w->type)->block_elems;
}

/* Sets c up for one weight, its rows in chunks of CPU_MM_ROWS. */
static void
mm_prepare(struct mm_ctx *c, const struct model_tensor *w, struct cpu_act *x, float *y, int64_t ldy, float *scratch)
{
	*c = (struct mm_ctx){ .w = w, .x = x->x, .ldx = x->ld, .n_tok = x->n_tok, .y = y, .ldy = ldy,
	    .scratch = scratch, .chunks_per_task = 1 };
	quant_row_bytes(w->type, w->ne[0], &c->row_bytes);
	use_q8(c, x);
	if (c->qmm == NULL && x->n_tok == 1 && w->type < TT_COUNT_)
		c->dot1 = dot1_impl[w->type];
	c->n_chunks = (w->ne[1] + CPU_MM_ROWS - 1) / CPU_MM_ROWS;
}

/*
 * c's chunks a task, at most `most` (the grouping only decides which
 * thread computes which rows); returns its number of tasks.
 */
static int64_t
mm_tasks(struct mm_ctx *c, int64_t most)
{
	int64_t chunk_work = CPU_MM_ROWS * c->w->ne[0] * (int64_t)MAX(c->n_tok, 1);

	c->chunks_per_task = MIN(most, MAX(1, MM_TASK_WORK / chunk_work));
	return (c->n_chunks + c->chunks_per_task - 1) / c->chunks_per_task;
}

/* A set of products: product j's tasks are first[j] .. first[j + 1] - 1. */
struct mm_set {
	struct mm_ctx *c;
	int64_t *first;
	int n;
};

static void
mm_set_task(void *arg, int64_t task, int thread)
{
	struct mm_set *s = arg;
	int lo = 0, hi = s->n - 1, j;

	while (lo < hi) { /* the last j with first[j] <= task */
		j = (lo + hi + 1) / 2;
		if (s->first[j] <= task)
			lo = j;
		else
			hi = j - 1;
	}
	mm_task(&s->c[lo], task - s->first[lo], thread);
}

void
cpu_matmul_set(struct cpu_pool *pool, int n, const struct cpu_mm *mm, float *scratch)
{
	struct mm_set s = { xmalloc((size_t)MAX(n, 1) * sizeof *s.c), xmalloc((size_t)(n + 1) * sizeof *s.first), n };
	int64_t chunks = 0, most;

	for (int j = 0; j < n; j++) {
		mm_prepare(&s.c[j], mm[j].w, mm[j].x, mm[j].y, mm[j].ldy, scratch);
		chunks += s.c[j].n_chunks;
	}
	/*
	 * The tasks a thread counted over the whole set, not over each
	 * product: a layer's experts (eight products of 2,048 rows of 768 for
	 * one token of qwen3-30b-a3b) were otherwise a task of 16 rows each,
	 * 1,024 trips to the pool's counter for 7 MB.
	 */
	most = MAX(1, chunks / (MM_TASKS_PER_THREAD * cpu_pool_threads(pool)));
	s.first[0] = 0;
	for (int j = 0; j < n; j++)
		s.first[j + 1] = s.first[j] + mm_tasks(&s.c[j], most);
	if (n > 0)
		cpu_pool_run(pool, s.first[n], mm_set_task, &s);
	free(s.c);
	free(s.first);
}

void
cpu_matmul(struct cpu_pool *pool, struct cpu_act *x, int n, const struct model_tensor *const *w,
    float *const *y, const int64_t *ldy, float *scratch)
{
	struct cpu_mm mm[CPU_MM_MAX];

	for (int j = 0; j < n; j++)
		mm[j] = (struct cpu_mm){ x, w[j], y[j], ldy[j] };
	cpu_matmul_set(pool, n, mm, scratch);
}

void
cpu_get_row(const struct model_tensor *w, int64_t r, float *out)
{
	size_t row_bytes;

	quant_row_bytes(w->type, w->ne[0], &row_bytes);
	dequantize(w->type, (const uint8_t *)w->data + (size_t)r * row_bytes, out, w->ne[0]);
}

float *
cpu_to_float(const struct model_tensor *t)
{
	float *f;

	if (t == NULL)
		return NULL;
	f = xmalloc((size_t)t->ne[0] * (size_t)t->ne[1] * sizeof *f);
	for (int64_t r = 0; r < t->ne[1]; r++)
		cpu_get_row(t, r, f + r * t->ne[0]);
	return f;
}

void
cpu_rmsnorm(const float *x, const float *w, float w_offset, float eps, int64_t n, float *out)
{
	float scale = 1.0f / sqrtf(cpu_dot(x, x, n) / (float)n + eps);
	int64_t i;

	for (i = 0; i < n; i++)
		out[i] = x[i] * scale * (w[i] + w_offset);
}

void
cpu_rope(float *x, int n_heads, int d, float pos, const float *freq, int neox)
{
	int half = d / 2, i, h, a, b;
	float ang, c, s, x0, x1;

	for (i = 0; i < half; i++) {
		ang = pos * freq[i];
		c = cosf(ang);
		s = sinf(ang);
		a = neox ? i : 2 * i;
		b = neox ? i + half : 2 * i + 1;
		for (h = 0; h < n_heads; h++, a += d, b += d) {
			x0 = x[a];
			x1 = x[b];
			x[a] = x0 * c - x1 * s;
			x[b] = x0 * s + x1 * c;
		}
	}
}

void
cpu_glu(float *a, const float *b, int64_t n, int gelu)
{
	glu_impl(a, b, n, gelu);
}

void
cpu_glu_oai(float *a, const float *b, int64_t n, float alpha, float limit)
{
	for (int64_t i = 0; i < n; i++) {
		float g = MIN(a[i], limit), u = MAX(-limit, MIN(b[i], limit));

		a[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
	}
}

float
cpu_exp_sum(float *sc, int64_t n, float mx)
{
	return exp_sum_impl(sc, n, mx);
}

void
cpu_axpy(float *y, float a, const float *x, int64_t n)
{
	axpy_impl(y, a, x, n);
}

void
cpu_add(float *a, const float *b, int64_t n)
{
	int64_t i;

	for (i = 0; i < n; i++)
		a[i] += b[i];
}
