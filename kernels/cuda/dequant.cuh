/*
 * dequant.cuh: the GGML block formats read on the GPU, eight elements at a
 * time. deq8<TYPE>(row, c, v) writes elements 8c .. 8c+7 of a row stored
 * in TYPE into v, with the arithmetic of daemon/model/quant.c (the compiler
 * may fuse a product and a difference into one FMA: a last-bit difference).
 *
 * Rows start where the weight's rows start, so blocks are only as aligned
 * as their size allows: Q8_0 (34 bytes), Q4_0 (18) and Q5_0 (22) are read
 * 2 bytes at a time, Q4_K (144), Q5_K (176) and Q6_K (regrouped at load:
 * TT_Q6_KG) 8 at a time, the float types 16 at a time.
 */
#ifndef RESIDENT_CUDA_DEQUANT_CUH
#define RESIDENT_CUDA_DEQUANT_CUH

#include "cuda_common.cuh"

/* Eight bytes at a 2-byte aligned address, as two little-endian words. */
static __device__ __forceinline__ uint2
load8_a2(const uint8_t *p)
{
	const uint16_t *h = (const uint16_t *)p;
	uint2 r;

	r.x = (uint32_t)__ldg(h) | (uint32_t)__ldg(h + 1) << 16;
	r.y = (uint32_t)__ldg(h + 2) | (uint32_t)__ldg(h + 3) << 16;
	return r;
}

/* Byte i (0..7) of an 8-byte word pair. */
static __device__ __forceinline__ int
byte_of(uint2 w, int i)
{
	return (int)(((i < 4 ? w.x : w.y) >> (8 * (i & 3))) & 0xff);
}

/* An fp16 scale at a 2-byte aligned address. */
static __device__ __forceinline__ float
f16_at(const uint8_t *p)
{
	return __half2float(__ushort_as_half(__ldg((const unsigned short *)p)));
}

template <int TYPE> __device__ __forceinline__ void deq8(const uint8_t *__restrict__ row, int c, float *v);

template <>
__device__ __forceinline__ void
deq8<TT_F32>(const uint8_t *__restrict__ row, int c, float *v)
{
	const float4 *p = (const float4 *)row + 2 * c;
	float4 a = __ldg(p), b = __ldg(p + 1);

	v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
	v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

template <>
__device__ __forceinline__ void
deq8<TT_F16>(const uint8_t *__restrict__ row, int c, float *v)
{
	uint4 u = __ldg((const uint4 *)row + c);
	const uint32_t w[4] = { u.x, u.y, u.z, u.w };

#pragma unroll
	for (int i = 0; i < 4; i++) {
		v[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffff)));
		v[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
	}
}

template <>
__device__ __forceinline__ void
deq8<TT_BF16>(const uint8_t *__restrict__ row, int c, float *v)
{
	uint4 u = __ldg((const uint4 *)row + c);
	const uint32_t w[4] = { u.x, u.y, u.z, u.w };

#pragma unroll
	for (int i = 0; i < 4; i++) {
		v[2 * i] = __uint_as_float(w[i] << 16);
		v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
	}
}

/* Q8_0: 34-byte blocks of 32, d * q. */
template <>
__device__ __forceinline__ void
deq8<TT_Q8_0>(const uint8_t *__restrict__ row, int c, float *v)
{
	const uint8_t *b = row + (size_t)(c >> 2) * 34;
	float d = f16_at(b);
	uint2 q = load8_a2(b + 2 + 8 * (c & 3));

#pragma unroll
	for (int i = 0; i < 8; i++)
		v[i] = d * (float)(int8_t)byte_of(q, i);
}

/* Q4_0: 18-byte blocks; elements 0..15 are the low nibbles, 16..31 the high ones. */
template <>
__device__ __forceinline__ void
deq8<TT_Q4_0>(const uint8_t *__restrict__ row, int c, float *v)
{
	const uint8_t *b = row + (size_t)(c >> 2) * 18;
	int j = c & 3, sh = j < 2 ? 0 : 4;
	float d = f16_at(b);
	uint2 q = load8_a2(b + 2 + 8 * (j & 1));

#pragma unroll
	for (int i = 0; i < 8; i++)
		v[i] = d * (float)(((byte_of(q, i) >> sh) & 0xf) - 8);
}

/* Q5_0: 22-byte blocks: d, 32 high bits, nibbles as Q4_0; d * (q - 16). */
template <>
__device__ __forceinline__ void
deq8<TT_Q5_0>(const uint8_t *__restrict__ row, int c, float *v)
{
	const uint8_t *b = row + (size_t)(c >> 2) * 22;
	int j = c & 3, sh = j < 2 ? 0 : 4, e0 = 8 * j;
	float d = f16_at(b);
	uint32_t qh = (uint32_t)__ldg((const uint16_t *)(b + 2)) |
	    (uint32_t)__ldg((const uint16_t *)(b + 4)) << 16;
	uint2 q = load8_a2(b + 6 + 8 * (j & 1));

#pragma unroll
	for (int i = 0; i < 8; i++) {
		int lo = (byte_of(q, i) >> sh) & 0xf, hi = (int)(qh >> (e0 + i)) & 1;

		v[i] = d * (float)((lo | hi << 4) - 16);
	}
}

/*
 * The 6-bit scales and mins of a Q4_K/Q5_K block's eight sub-blocks from its
 * 12 scale bytes as three words, as k4_scale_min unpacks them
 * (daemon/model/quant_blocks.h), for all eight at once: byte i of sc[h] and
 * m[h] belongs to sub-block 4h + i.
 */
static __device__ __forceinline__ void
k4_unpack(uint32_t q0, uint32_t q1, uint32_t q2, uint32_t sc[2], uint32_t m[2])
{
	sc[0] = q0 & 0x3f3f3f3fu, sc[1] = (q2 & 0x0f0f0f0fu) | ((q0 >> 2) & 0x30303030u);
	m[0] = q1 & 0x3f3f3f3fu, m[1] = ((q2 >> 4) & 0x0f0f0f0fu) | ((q1 >> 2) & 0x30303030u);
}

/* Scale and min of sub-block g of a Q4_K/Q5_K block (k4_scale_min of daemon/model/quant_blocks.h). */
static __device__ __forceinline__ void
k4_scale_min(const uint8_t *scales, int g, int *sc, int *m)
{
	if (g < 4) {
		*sc = __ldg(scales + g) & 63;
		*m = __ldg(scales + g + 4) & 63;
	} else {
		int a = __ldg(scales + g + 4), lo = __ldg(scales + g - 4), hi = __ldg(scales + g);

		*sc = (a & 0xf) | (lo >> 6) << 4;
		*m = (a >> 4) | (hi >> 6) << 4;
	}
}

/* Q4_K: 144-byte blocks of 256, (d * sc) * q - dmin * m per sub-block of 32. */
template <>
__device__ __forceinline__ void
deq8<TT_Q4_K>(const uint8_t *__restrict__ row, int c, float *v)
{
	const uint8_t *b = row + (size_t)(c >> 5) * 144;
	int cc = c & 31, g = cc >> 2, l0 = (cc & 3) * 8, sc, m, sh = (g & 1) * 4;
	uint32_t dd = __ldg((const uint32_t *)b);
	uint2 q = __ldg((const uint2 *)(b + 16 + (g >> 1) * 32 + l0));
	float d = __half2float(__ushort_as_half((unsigned short)(dd & 0xffff)));
	float dmin = __half2float(__ushort_as_half((unsigned short)(dd >> 16)));

	k4_scale_min(b + 4, g, &sc, &m);
	float dl = d * (float)sc, ml = dmin * (float)m;
#pragma unroll
	for (int i = 0; i < 8; i++)
		v[i] = dl * (float)((byte_of(q, i) >> sh) & 0xf) - ml;
}

/* Q5_K: Q4_K plus a fifth bit, bit g of qh[e % 32]. */
template <>
__device__ __forceinline__ void
deq8<TT_Q5_K>(const uint8_t *__restrict__ row, int c, float *v)
{
	const uint8_t *b = row + (size_t)(c >> 5) * 176;
	int cc = c & 31, g = cc >> 2, l0 = (cc & 3) * 8, sc, m, sh = (g & 1) * 4;
	uint32_t dd = __ldg((const uint32_t *)b);
	uint2 q = __ldg((const uint2 *)(b + 48 + (g >> 1) * 32 + l0));
	uint2 h = __ldg((const uint2 *)(b + 16 + l0));
	float d = __half2float(__ushort_as_half((unsigned short)(dd & 0xffff)));
	float dmin = __half2float(__ushort_as_half((unsigned short)(dd >> 16)));

	k4_scale_min(b + 4, g, &sc, &m);
	float dl = d * (float)sc, ml = dmin * (float)m;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		int qv = ((byte_of(q, i) >> sh) & 0xf) | ((byte_of(h, i) >> g) & 1) << 4;

		v[i] = dl * (float)qv - ml;
	}
}

/*
 * Q6_KG: Q6_K as the GPU holds it. A row's 210-byte blocks are regrouped at
 * load (cuda_weight_upload) so that every load is aligned: each group of up
 * to 8 blocks is 16 bytes of their fp16 d's, then their 208-byte bodies
 * (ql, qh, the 16 signed scales) as in the file. A row of a multiple of 8
 * blocks keeps its size; others grow by less than 16 bytes.
 */
#define TT_Q6_KG (0x100 | TT_Q6_K)
#define Q6G_BODY 208 /* a block's ql, qh and scales: the file's block but its d */
#define Q6G_GROUP (16 + 8 * Q6G_BODY)

/* Block b's body in a Q6_KG row. */
static __device__ __forceinline__ const uint8_t *
q6g_body(const uint8_t *row, int b)
{
	return row + (size_t)(b >> 3) * Q6G_GROUP + 16 + Q6G_BODY * (b & 7);
}

/* Block b's d in a Q6_KG row. */
static __device__ __forceinline__ float
q6g_d(const uint8_t *row, int b)
{
	return f16_at(row + (size_t)(b >> 3) * Q6G_GROUP + 2 * (b & 7));
}

/*
 * In each half of 128, quarter s takes nibble s/2 of ql[64h + 32(s%2) + l]
 * and bits 2s of qh[32h + l]; (d * sc) * (q - 32), sc a signed byte per 16.
 */
template <>
__device__ __forceinline__ void
deq8<TT_Q6_KG>(const uint8_t *__restrict__ row, int c, float *v)
{
	const uint8_t *b = q6g_body(row, c >> 5);
	int cc = c & 31, h = cc >> 4, s = (cc >> 2) & 3, l0 = (cc & 3) * 8;
	uint2 ql = __ldg((const uint2 *)(b + h * 64 + (s & 1) * 32 + l0));
	uint2 qh = __ldg((const uint2 *)(b + 128 + h * 32 + l0));
	float dl = q6g_d(row, c >> 5) * (float)(int8_t)__ldg(b + 192 + (cc >> 1));

#pragma unroll
	for (int i = 0; i < 8; i++) {
		int lo = (byte_of(ql, i) >> (4 * (s >> 1))) & 0xf, hi = (byte_of(qh, i) >> (2 * s)) & 3;

		v[i] = dl * (float)((lo | hi << 4) - 32);
	}
}

/*
 * MXFP4G: MXFP4 as the GPU holds it. Its 17-byte blocks (an e8m0 scale,
 * 16 bytes of e2m1 pairs) are regrouped at load so that every load is
 * aligned: each group of up to 8 blocks is 16 bytes of their scales, then
 * their 16-byte quants as in the file (element j of a block in the low
 * nibble of byte j, j + 16 in the high one).
 */
#define TT_MXFP4G (0x100 | TT_MXFP4)
#define MX4G_GROUP (16 + 8 * 16)

/* Block b's quants in an MXFP4G row. */
static __device__ __forceinline__ const uint8_t *
mx4g_qs(const uint8_t *row, int b)
{
	return row + (size_t)(b >> 3) * MX4G_GROUP + 16 + 16 * (b & 7);
}

/* Block b's scale in an MXFP4G row: half of 2^(e - 127), for the doubled values (ggml_e8m0_to_fp32_half). */
static __device__ __forceinline__ float
mx4g_d(const uint8_t *row, int b)
{
	uint32_t e = __ldg(row + (size_t)(b >> 3) * MX4G_GROUP + (b & 7));

	return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/*
 * The permute instruction itself: __byte_perm clears bit 3 of each
 * selector (which the instruction reads as "replicate the byte's sign"),
 * with a logic operation wherever the selector is not known at compile
 * time. Callers give selectors whose bit 3 is clear.
 */
static __device__ __forceinline__ uint32_t
prmt(uint32_t a, uint32_t b, uint32_t sel)
{
	uint32_t d;

	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
	return d;
}

/*
 * mx4_codes8's tables of the positive and negative values of codes 0-3,
 * read from memory: as constants, each permute was given its own copy of
 * them from a uniform register (53 of the gate/up slots' 462 instructions
 * a chunk; RESULTS.md 2026-11-30), as a load they are read once a kernel
 * and stay in registers.
 */
static __device__ uint32_t mx4_tab[2] = { 0x03020100u, 0xfdfeff00u };

/*
 * The eight e2m1 codes of a word (two a byte) as the signed bytes of their
 * doubled values (kvalues_mxfp4), in the word's nibble order: x the codes
 * of bytes 0 and 1 (low, high, low, high), y those of bytes 2 and 3. Byte
 * permutes look each code's magnitude up among the positive values and
 * among the negative ones, and a third takes one or the other by the sign
 * bit: fewer instructions than masking, looking up and negating four at a
 * time, which counts where the experts' integer kernel is bound by its
 * instruction issue (RESULTS.md).
 */
static __device__ __forceinline__ uint2
mx4_codes8(uint32_t codes)
{
	/* the magnitude alone selects: the code's sign, as a selector's bit 3, would replicate the byte's sign */
	uint32_t mag = codes & 0x77777777u, pick = 0x32103210u | (codes & 0x88888888u) >> 1;
	uint32_t v[2], t0 = __ldg(&mx4_tab[0]), t1 = __ldg(&mx4_tab[1]);

#pragma unroll
	for (int i = 0; i < 2; i++) {
		uint32_t pos = prmt(t0, 0x0c080604u, mag >> 16 * i);
		uint32_t neg = prmt(t1, 0xf4f8fafcu, mag >> 16 * i);

		v[i] = prmt(pos, neg, pick >> 16 * i);
	}
	return make_uint2(v[0], v[1]);
}

/* mx4_codes8's values sorted: x those of the low nibbles (bytes 0-3 in order), y those of the high ones. */
static __device__ __forceinline__ uint2
mx4_decode8(uint32_t codes)
{
	uint2 v = mx4_codes8(codes);

	return make_uint2(prmt(v.x, v.y, 0x6420), prmt(v.x, v.y, 0x7531));
}

/* MXFP4G: chunk c is the low (c % 4 < 2) or high nibbles of 8 quant bytes, times the block's scale. */
template <>
__device__ __forceinline__ void
deq8<TT_MXFP4G>(const uint8_t *__restrict__ row, int c, float *v)
{
	int b = c >> 2, j = c & 3;
	uint2 q = __ldg((const uint2 *)(mx4g_qs(row, b) + 8 * (j & 1)));
	uint2 vx = mx4_decode8(q.x), vy = mx4_decode8(q.y);
	uint32_t lo = j >> 1 ? vx.y : vx.x, hi = j >> 1 ? vy.y : vy.x;
	float d = mx4g_d(row, b);

#pragma unroll
	for (int i = 0; i < 4; i++) {
		v[i] = d * (float)(int8_t)(lo >> (8 * i));
		v[4 + i] = d * (float)(int8_t)(hi >> (8 * i));
	}
}

/* X(type) for every type the GPU reads: the cases of a run-time dispatch. */
#define DEQ_TYPES(X) X(TT_F32) X(TT_F16) X(TT_BF16) X(TT_Q8_0) X(TT_Q4_0) X(TT_Q5_0) \
	X(TT_Q4_K) X(TT_Q5_K) X(TT_Q6_KG) X(TT_MXFP4G)

/* The type weights stored as `type` have on the GPU. */
static inline uint32_t
cuda_gpu_type(uint32_t type)
{
	return type == TT_Q6_K ? TT_Q6_KG : type == TT_MXFP4 ? TT_MXFP4G : type;
}

/* 1 if the GPU reads weights stored in this type. */
static inline int
cuda_type_supported(uint32_t type)
{
	switch (cuda_gpu_type(type)) {
#define CASE(t) case t:
	DEQ_TYPES(CASE)
#undef CASE
		return 1;
	default:
		return 0;
	}
}

#endif
