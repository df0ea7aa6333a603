/*
 * cpu_ops.c: float32 kernels of the CPU backend.
 *
 * Matrix products read the weights in their stored type: a task takes
 * chunks of CPU_MM_ROWS rows, dequantizes each chunk into its scratch and
 * dots its rows with every token, so the dequantization is paid once per
 * step and the model is never expanded in memory. Every y element is one
 * dot product over the dequantized row in a fixed order, whatever computed
 * it, which keeps a token's result independent of the batch it came in.
 *
 * The AVX2 path, picked at run time, keeps those bits and goes faster:
 * - its dequantizers do the float operations of quant.c's, one for one and
 *   in the same order (a product then a difference, never fused: gcc does
 *   not contract under -std=c11, clang is told below), so the floats are
 *   the same;
 * - register tiles of several rows by several tokens keep, for each pair,
 *   the two accumulators of dot_avx2, fed in its order and reduced by its
 *   code, so each element equals dot_avx2 of the row and the token.
 */
#include "config.h"
#include "cpu_ops.h"
#include "cpu_pool.h"
#include "model.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

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
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline
#define F16C __attribute__((target("avx2,fma,f16c")))
#define F16C_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* Rows and tokens of the largest register tiles: 4 x 1 and 2 x 3. */
#define TILE_R 4
#define TILE_T 3

/* The blocks read here, as quant.c and ggml lay them out. */
struct blk_q4_0 { uint16_t d; uint8_t qs[16]; };
struct blk_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct blk_q8_0 { uint16_t d; int8_t qs[32]; };
struct blk_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
struct blk_q5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct blk_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };

_Static_assert(sizeof(struct blk_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(struct blk_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(struct blk_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(struct blk_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(struct blk_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(struct blk_q6_K) == 210, "q6_K layout");

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

/* The end of dot_avx2: the 8-wide and scalar tails from i, then the sum. */
AVX2_INLINE float
dot_end_avx2(__m256 s0, __m256 s1, const float *a, const float *b, int64_t i, int64_t n)
{
	__m128 lo;
	float tail = 0;

	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
	for (; i < n; i++)
		tail += a[i] * b[i];
	s0 = _mm256_add_ps(s0, s1);
	lo = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo) + tail;
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

#ifndef KEEP
#define KEEP(v) __asm__("" : "+x"(v))
#endif

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

#ifndef MT_R
#define MT_R 3
#define MT_T 2
#endif

/* Rows [r, nr) for the T tokens at x, MT_R at a time. */
AVX2_INLINE void
mm_group_avx2(const float *a, int64_t lda, int r, int nr, const float *x, int64_t ldx, float *y,
    int64_t ldy, const int T)
{
	for (; r + MT_R <= nr; r += MT_R)
		mm_tile_avx2(a + r * lda, lda, x, ldx, y + r, ldy, lda, MT_R, T);
	if (MT_R > 2 && r + 2 <= nr) {
		mm_tile_avx2(a + r * lda, lda, x, ldx, y + r, ldy, lda, 2, T);
		r += 2;
	}
	if (r < nr)
		mm_tile_avx2(a + r * lda, lda, x, ldx, y + r, ldy, lda, 1, T);
}

/*
 * The AVX2 twin of mm_chunk_portable. One token goes by tiles of 4 rows;
 * several by tiles of MT_R rows by MT_T tokens, all the rows for each
 * MT_T tokens, which then stay in L1.
 */
AVX2 static void
mm_chunk_avx2(const float *a, int64_t lda, int nr, const float *x, int64_t ldx, int n_tok,
    float *y, int64_t ldy)
{
	int r = 0, t;

	if (n_tok == 1) {
		for (; r + 4 <= nr; r += 4)
			mm_tile_avx2(a + r * lda, lda, x, ldx, y + r, ldy, lda, 4, 1);
		mm_group_avx2(a, lda, r, nr, x, ldx, y, ldy, 1);
		return;
	}
	for (t = 0; t + MT_T <= n_tok; t += MT_T)
		mm_group_avx2(a, lda, 0, nr, x + t * ldx, ldx, y + t * ldy, ldy, MT_T);
	if (MT_T > 2 && n_tok - t == 2)
		mm_group_avx2(a, lda, 0, nr, x + t * ldx, ldx, y + t * ldy, ldy, 2);
	else if (n_tok - t == 1)
		mm_group_avx2(a, lda, 0, nr, x + t * ldx, ldx, y + t * ldy, ldy, 1);
}

/* ---- dequantizers: quant.c's arithmetic, eight floats at a time ---- */

/*
 * A block scale by F16C. It equals fp16_to_fp32 except that a signalling
 * NaN comes out quiet, and quant.c multiplies every scale before use,
 * which quiets it the same way.
 */
F16C_INLINE float
scale_f16(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* Eight signed bytes (the low half of v) as floats. */
AVX2_INLINE __m256
i8_ps(__m128i v)
{
	return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

/* y[0..31] = d * (float)q[0..31], q signed bytes: quant.c's d * (float)q. */
AVX2_INLINE void
put_scaled(float *y, __m256i q, __m256 d)
{
	__m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);

	_mm256_storeu_ps(y, _mm256_mul_ps(d, i8_ps(lo)));
	_mm256_storeu_ps(y + 8, _mm256_mul_ps(d, i8_ps(_mm_unpackhi_epi64(lo, lo))));
	_mm256_storeu_ps(y + 16, _mm256_mul_ps(d, i8_ps(hi)));
	_mm256_storeu_ps(y + 24, _mm256_mul_ps(d, i8_ps(_mm_unpackhi_epi64(hi, hi))));
}

/* y[0..31] = dl * (float)q - ml, q bytes 0..31: quant.c's Q4_K/Q5_K step. */
AVX2_INLINE void
put_scaled_min(float *y, __m256i q, __m256 dl, __m256 ml)
{
	__m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);

	_mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(dl, i8_ps(lo)), ml));
	_mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(dl, i8_ps(_mm_unpackhi_epi64(lo, lo))), ml));
	_mm256_storeu_ps(y + 16, _mm256_sub_ps(_mm256_mul_ps(dl, i8_ps(hi)), ml));
	_mm256_storeu_ps(y + 24, _mm256_sub_ps(_mm256_mul_ps(dl, i8_ps(_mm_unpackhi_epi64(hi, hi))), ml));
}

/* 16 bytes of nibbles as 32: the low nibbles, then the high ones. */
AVX2_INLINE __m256i
nibbles(const uint8_t *qs)
{
	__m128i v = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0f);

	return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/*
 * F16: exact widening by F16C; a NaN is rebuilt from its bits as
 * fp16_to_fp32 does, since F16C would set its quiet bit.
 */
F16C static void
deq_f16_avx2(const void *src, float *y, int64_t n)
{
	const uint16_t *h = src;
	const __m256i abs = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7c00);
	__m256i v, nan;
	int64_t i;

	for (i = 0; i + 8 <= n; i += 8) {
		v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
		nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, abs), inf);
		if (_mm256_testz_si256(nan, nan)) {
			_mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
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

/* Q4_0: d * (float)(q - 8). */
F16C static void
deq_q4_0_avx2(const void *src, float *y, int64_t n)
{
	const struct blk_q4_0 *b = src;
	int64_t i;

	for (i = 0; i < n; i += 32, b++, y += 32)
		put_scaled(y, _mm256_sub_epi8(nibbles(b->qs), _mm256_set1_epi8(8)),
		    _mm256_set1_ps(scale_f16(b->d)));
}

/* Q5_0: d * (float)(q - 16), bit 4 of element e being bit e of qh. */
F16C static void
deq_q5_0_avx2(const void *src, float *y, int64_t n)
{
	const struct blk_q5_0 *b = src;
	/* byte e takes byte e/8 of qh, then tests bit e%8 */
	const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
	    0x0101010101010101, 0);
	const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
	__m256i h;
	uint32_t qh;
	int64_t i;

	for (i = 0; i < n; i += 32, b++, y += 32) {
		memcpy(&qh, b->qh, sizeof qh);
		h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
		h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit),
		    _mm256_set1_epi8(0x10));
		put_scaled(y, _mm256_sub_epi8(_mm256_or_si256(nibbles(b->qs), h), _mm256_set1_epi8(16)),
		    _mm256_set1_ps(scale_f16(b->d)));
	}
}

/* Q8_0: d * (float)q. */
F16C static void
deq_q8_0_avx2(const void *src, float *y, int64_t n)
{
	const struct blk_q8_0 *b = src;
	int64_t i;

	for (i = 0; i < n; i += 32, b++, y += 32)
		put_scaled(y, _mm256_loadu_si256((const __m256i *)b->qs), _mm256_set1_ps(scale_f16(b->d)));
}

/* Scale and min of sub-block j of a Q4_K/Q5_K block: quant.c's k4_scale_min. */
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

/* Sub-block g of a Q4_K/Q5_K block: dl = d * sc, ml = dmin * m, as quant.c. */
AVX2_INLINE void
k4_put(float *y, __m256i q, const uint8_t scales[12], int g, float d, float dmin)
{
	uint8_t sc, m;

	k4_scale_min(g, scales, &sc, &m);
	put_scaled_min(y, q, _mm256_set1_ps(d * (float)sc), _mm256_set1_ps(dmin * (float)m));
}

/* Q4_K: (d * sc) * q - dmin * m per sub-block of 32; 32 bytes hold two. */
F16C static void
deq_q4_K_avx2(const void *src, float *y, int64_t n)
{
	const struct blk_q4_K *b = src;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	__m256i v;
	float d, dmin;
	int64_t i;
	int j;

	for (i = 0; i < n; i += QK_K, b++, y += QK_K) {
		d = scale_f16(b->d);
		dmin = scale_f16(b->dmin);
		for (j = 0; j < 4; j++) {
			v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
			k4_put(y + 64 * j, _mm256_and_si256(v, m4), b->scales, 2 * j, d, dmin);
			k4_put(y + 64 * j + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
			    b->scales, 2 * j + 1, d, dmin);
		}
	}
}

/* Q5_K: Q4_K with bit g of qh[e % 32] as bit 4 of sub-block g. */
F16C static void
deq_q5_K_avx2(const void *src, float *y, int64_t n)
{
	const struct blk_q5_K *b = src;
	const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
	__m256i v, h, hb;
	float d, dmin;
	int64_t i;
	int j;

	for (i = 0; i < n; i += QK_K, b++, y += QK_K) {
		d = scale_f16(b->d);
		dmin = scale_f16(b->dmin);
		h = _mm256_loadu_si256((const __m256i *)b->qh);
		for (j = 0; j < 4; j++) {
			v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
			hb = _mm256_slli_epi16(_mm256_and_si256(h, one), 4);
			k4_put(y + 64 * j, _mm256_or_si256(_mm256_and_si256(v, m4), hb), b->scales,
			    2 * j, d, dmin);
			h = _mm256_srli_epi16(h, 1);
			hb = _mm256_slli_epi16(_mm256_and_si256(h, one), 4);
			k4_put(y + 64 * j + 32, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), hb),
			    b->scales, 2 * j + 1, d, dmin);
			h = _mm256_srli_epi16(h, 1);
		}
	}
}

/*
 * Q6_K: (d * sc) * (q - 32), sc per 16 elements. Quarter s of each half
 * of 128: nibble s/2 of ql[(s%2)*32 + l], bits 2s of qh[l].
 */
F16C static void
deq_q6_K_avx2(const void *src, float *y, int64_t n)
{
	const struct blk_q6_K *b = src;
	const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
	const __m256i off = _mm256_set1_epi8(32);
	__m256i ql[2], qh, q;
	__m128i lo, hi;
	__m256 dl0, dl1;
	const int8_t *sc;
	float d;
	int64_t i;
	int h, s;

	for (i = 0; i < n; i += QK_K, b++) {
		d = scale_f16(b->d);
		for (h = 0; h < 2; h++) {
			ql[0] = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
			ql[1] = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
			qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
			for (s = 0; s < 4; s++, y += 32) {
				q = _mm256_and_si256(s < 2 ? ql[s] : _mm256_srli_epi16(ql[s - 2], 4), m4);
				q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(
				    _mm256_srli_epi16(qh, 2 * s), m2), 4));
				q = _mm256_sub_epi8(q, off);
				sc = b->scales + 8 * h + 2 * s;
				dl0 = _mm256_set1_ps(d * (float)sc[0]);
				dl1 = _mm256_set1_ps(d * (float)sc[1]);
				lo = _mm256_castsi256_si128(q);
				hi = _mm256_extracti128_si256(q, 1);
				_mm256_storeu_ps(y, _mm256_mul_ps(dl0, i8_ps(lo)));
				_mm256_storeu_ps(y + 8, _mm256_mul_ps(dl0, i8_ps(_mm_unpackhi_epi64(lo, lo))));
				_mm256_storeu_ps(y + 16, _mm256_mul_ps(dl1, i8_ps(hi)));
				_mm256_storeu_ps(y + 24, _mm256_mul_ps(dl1, i8_ps(_mm_unpackhi_epi64(hi, hi))));
			}
		}
	}
}
#endif

static float (*dot_impl)(const float *, const float *, int64_t) = dot_portable;
static void (*mm_chunk_impl)(const float *, int64_t, int, const float *, int64_t, int, float *,
    int64_t) = mm_chunk_portable;
/* SIMD dequantizers by type; NULL: quant_dequantize. */
static row_deq_fn deq_impl[TT_COUNT_];
static const char *isa = "portable";

void
cpu_ops_init(void)
{
#ifdef HAVE_X86
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
		dot_impl = dot_avx2;
		mm_chunk_impl = mm_chunk_avx2;
		isa = "avx2";
	}
	if (dot_impl == dot_avx2 && __builtin_cpu_supports("f16c")) {
		deq_impl[TT_F16] = deq_f16_avx2;
		deq_impl[TT_BF16] = deq_bf16_avx2;
		deq_impl[TT_Q4_0] = deq_q4_0_avx2;
		deq_impl[TT_Q5_0] = deq_q5_0_avx2;
		deq_impl[TT_Q8_0] = deq_q8_0_avx2;
		deq_impl[TT_Q4_K] = deq_q4_K_avx2;
		deq_impl[TT_Q5_K] = deq_q5_K_avx2;
		deq_impl[TT_Q6_K] = deq_q6_K_avx2;
	}
#endif
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
};

/*
 * One task: chunks_per_task chunks of CPU_MM_ROWS output rows, every token.
 * For one token, rows are dequantized MM_SUB_ROWS at a time, so that they
 * are still in L1 when dotted.
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

void
cpu_matmul(struct cpu_pool *pool, const struct model_tensor *w, const float *x, int64_t ldx,
    int n_tok, float *y, int64_t ldy, float *scratch)
{
	struct mm_ctx c = { w, 0, x, ldx, n_tok, y, ldy, scratch, 0, 1 };
	int64_t chunk_work = CPU_MM_ROWS * w->ne[0] * (int64_t)MAX(n_tok, 1), most;

	quant_row_bytes(w->type, w->ne[0], &c.row_bytes);
	/* rows are split in chunks the same way whatever the grouping: it only sets who computes them */
	c.n_chunks = (w->ne[1] + CPU_MM_ROWS - 1) / CPU_MM_ROWS;
	most = MAX(1, c.n_chunks / (MM_TASKS_PER_THREAD * cpu_pool_threads(pool)));
	c.chunks_per_task = MIN(most, MAX(1, MM_TASK_WORK / chunk_work));
	cpu_pool_run(pool, (c.n_chunks + c.chunks_per_task - 1) / c.chunks_per_task, mm_task, &c);
}

void
cpu_get_row(const struct model_tensor *w, int64_t r, float *out)
{
	size_t row_bytes;

	quant_row_bytes(w->type, w->ne[0], &row_bytes);
	dequantize(w->type, (const uint8_t *)w->data + (size_t)r * row_bytes, out, w->ne[0]);
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
cpu_rope(float *x, int d, float pos, float theta, int neox)
{
	int half = d / 2, i, a, b;
	float ang, c, s, x0, x1;

	for (i = 0; i < half; i++) {
		/* the frequency as Hugging Face computes it: 1 / base^(2i/d) in float */
		ang = pos * (1.0f / powf(theta, (float)(2 * i) / (float)d));
		c = cosf(ang);
		s = sinf(ang);
		a = neox ? i : 2 * i;
		b = neox ? i + half : 2 * i + 1;
		x0 = x[a];
		x1 = x[b];
		x[a] = x0 * c - x1 * s;
		x[b] = x0 * s + x1 * c;
	}
}

void
cpu_glu(float *a, const float *b, int64_t n, int gelu)
{
	const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
	int64_t i;
	float v;

	for (i = 0; i < n; i++) {
		v = a[i];
		if (gelu)
			v = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
		else
			v = v / (1.0f + expf(-v));
		a[i] = v * b[i];
	}
}

void
cpu_add(float *a, const float *b, int64_t n)
{
	int64_t i;

	for (i = 0; i < n; i++)
		a[i] += b[i];
}
