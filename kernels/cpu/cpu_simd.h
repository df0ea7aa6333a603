/*
 * cpu_simd.h: what the CPU kernels share to pick AVX2 at run time: the
 * target attributes of their AVX2 functions and F16C's block scales.
 */
#ifndef RESIDENT_CPU_SIMD_H
#define RESIDENT_CPU_SIMD_H

#include "quant_blocks.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1

#define AVX2 __attribute__((target("avx2,fma")))
#define AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline
#define F16C __attribute__((target("avx2,fma,f16c")))
#define F16C_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

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

/* The sum of the 8 lanes: halves, then pairs, then the last two. */
AVX2_INLINE float
hsum_avx2(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* 16 bytes of nibbles as 32: the low nibbles, then the high ones. */
AVX2_INLINE __m256i
nibbles(const uint8_t *qs)
{
	__m128i v = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0f);

	return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/*
 * The levels of a Q5_0 block as signed bytes, q - 16: the nibble of
 * element e with bit e of qh as its bit 4.
 */
AVX2_INLINE __m256i
q5_0_levels(const struct blk_q5_0 *b)
{
	/* byte e takes byte e/8 of qh, then tests bit e%8 */
	const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
	    0x0101010101010101, 0);
	const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
	__m256i h;
	uint32_t qh;

	memcpy(&qh, b->qh, sizeof qh);
	h = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
	h = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
	/* q - 16 is the nibble with bit 4 set, else the nibble - 16: its byte | 0xf0 */
	h = _mm256_andnot_si256(h, _mm256_set1_epi8((char)0xf0));
	return _mm256_or_si256(nibbles(b->qs), h);
}

/*
 * Sub-blocks 2k and 2k+1 of a Q5_K block (levels 0..31): the nibbles of
 * qs[32k..], bits 2k and 2k+1 of qh (h) as their bit 4.
 */
AVX2_INLINE void
q5_K_levels(const struct blk_q5_K *b, __m256i h, int k, __m256i *lo, __m256i *hi)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
	__m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * k));

	*lo = _mm256_or_si256(_mm256_and_si256(q, m4),
	    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k), one), 4));
	*hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
	    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * k + 1), one), 4));
}

/*
 * Quarter s of one half of a Q6_K block (levels 0..63): nibble s/2 of
 * ql[s % 2] (the half's two 32-byte runs), bits 2s of qh (its 32 bytes).
 */
AVX2_INLINE __m256i
q6_K_levels(const __m256i ql[2], __m256i qh, int s)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
	__m256i q = _mm256_and_si256(_mm256_srli_epi16(ql[s % 2], 4 * (s / 2)), m4);

	return _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * s), m2), 4));
}
#endif

#endif
