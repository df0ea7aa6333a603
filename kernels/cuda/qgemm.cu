/*
 * qgemm.cu: products of many tokens (batched decoding, prefill) on the
 * tensor cores, straight from the quantized blocks: y = W x for W in Q4_K,
 * Q5_K, Q6_K, Q8_0, Q4_0 or Q5_0 as stored, x as fp16 (matmul.cu's
 * to_f16_kernel: each token's row divided by a power of two when it would
 * overflow fp16; the product is multiplied back here).
 *
 * A block computes a tile of BM weight rows by BN tokens. It walks K 64
 * elements at a time (a sub-step); the raw blocks of the weight (a whole
 * super-block of 256 for the K types, two blocks of 32 for the others: a
 * unit) and the tokens' fp16 tile are copied into shared memory with
 * cp.async, the raw units a shape's RAW_AHEAD sub-steps ahead of their
 * use (enough bytes in flight to stream the weight at the memory's rate),
 * the token tiles (which the L2 cache holds) QG_AHEAD. Each sub-step the
 * block's threads decode the weight tile of the next sub-step into fp16
 * while the warps multiply the current one with mma.sync m16n8k16 (fp16
 * in, float32 accumulation), a quarter of each interleaved with the other
 * in every warp, so the decoding hides under the tensor cores and the
 * copies under both. The decoding is fp16 arithmetic alone (no conversion
 * instructions, which run at a quarter of the rate): a byte b of quants
 * becomes the fp16 1024 + b by a byte permute with 0x64 (the exponent
 * of 1024 leaves an ulp of 1), 1024 plus the type's offset is
 * subtracted exactly, and one multiply (and subtract, for the K types'
 * mins) by the block's fp16 scales rounds once: the weight differs from
 * quant.c's float value by the fp16 rounding of the value and of its
 * scale (d * sc for the K types), a few parts in 2^11.
 * Nothing is dequantized to device memory: the weight is read once per
 * token tile, in its stored size.
 *
 * Tile shapes follow the token count: 16, 32 or 64 tokens against 64 rows
 * (four warps, each 16 rows of all the tokens), or 128 x 128 (eight warps
 * of 64 x 32) for prefill. When the tiles do not fill the GPU the K range
 * is split: each split writes its partial sums and a second kernel adds
 * them in a fixed order (the result does not depend on timing).
 */
#include "matmul.cuh"
#include "tc.cuh"

#include <string.h>

/* Sub-steps of token-tile copies in flight ahead of the one being multiplied. */
#define QG_AHEAD 3
/* fp16 elements of a shared-memory tile row: 64 and 8 of padding, so ldmatrix meets no bank conflicts. */
#define QG_LDS 72
/* Most splits of K. */
#define QG_MAX_SPLIT 8

/*
 * A tile shape: BM weight rows by BN tokens, warps WM x WN, raw units
 * copied RAW_AHEAD sub-steps ahead.
 */
template <int BM_, int BN_, int WM_, int WN_, int RAW_AHEAD_>
struct qg_cfg {
	static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, RAW_AHEAD = RAW_AHEAD_;
	static constexpr int THREADS = WM * WN * WARP;
	static constexpr int MT = BM / WM / 16; /* m16 tiles of a warp */
	static constexpr int NT = BN / WN / 8;  /* n8 tiles of a warp */
	/* each thread decodes one 8-element chunk beside each of a sub-step's four k16 steps */
	static_assert(BM * 8 == 4 * THREADS, "a tile shape decodes four chunks per thread a sub-step");
};

/*
 * 128 weight rows a block: the tokens' tile is read from L2 once per 128
 * rows, no more bytes than the rows' own quants at 16 and 32 tokens. The
 * decode shapes stream the weight (raw units 8 sub-steps ahead); prefill's
 * is bound by the tensor cores and keeps its shared memory for tiles.
 */
using qg_c16 = qg_cfg<128, 16, 8, 1, 8>;
using qg_c32 = qg_cfg<128, 32, 8, 1, 8>;
using qg_c64 = qg_cfg<128, 64, 4, 2, 8>;
using qg_c128 = qg_cfg<128, 128, 2, 4, 4>;

/* A type's unit of raw copies: UNIT elements of a row in BYTES. */
template <int TY> struct qg_unit;
template <> struct qg_unit<TT_Q4_K> { static constexpr int UNIT = 256, BYTES = 144; };
template <> struct qg_unit<TT_Q5_K> { static constexpr int UNIT = 256, BYTES = 176; };
template <> struct qg_unit<TT_Q6_K> { static constexpr int UNIT = 256, BYTES = 210; };
template <> struct qg_unit<TT_Q8_0> { static constexpr int UNIT = 64, BYTES = 68; };
template <> struct qg_unit<TT_Q4_0> { static constexpr int UNIT = 64, BYTES = 36; };
template <> struct qg_unit<TT_Q5_0> { static constexpr int UNIT = 64, BYTES = 44; };

/* The types qgemm reads, as X(type) cases. */
#define QG_TYPES(X) X(TT_Q4_K) X(TT_Q5_K) X(TT_Q6_K) X(TT_Q8_0) X(TT_Q4_0) X(TT_Q5_0)

/*
 * Shared-memory layout of one (type, shape): the token tiles (ring of
 * QG_AHEAD + 1), two decoded weight tiles, and the raw units (a ring deep
 * enough that the unit being refilled is never one still in flight or
 * being decoded).
 * A unit's bytes are copied as the 16-byte aligned words covering them, so
 * a row's slot holds BYTES + 15 rounded up to 16.
 */
template <int TY, class C>
struct qg_smem {
	static constexpr int SUB = qg_unit<TY>::UNIT / 64;
	static constexpr int BR = QG_AHEAD + 1;
	static constexpr int RR = (C::RAW_AHEAD + SUB - 1) / SUB + 1;
	static_assert(C::RAW_AHEAD > QG_AHEAD, "a decode's raw unit arrives before its tokens' tile");
	static constexpr int RAW = (qg_unit<TY>::BYTES + 15 + 15) / 16 * 16;
	static constexpr size_t B_OFF = 0;
	static constexpr size_t A_OFF = B_OFF + (size_t)BR * C::BN * QG_LDS * sizeof(__half);
	static constexpr size_t R_OFF = A_OFF + (size_t)2 * C::BM * QG_LDS * sizeof(__half);
	static constexpr size_t BYTES = R_OFF + (size_t)RR * C::BM * RAW;
};

/* Everything one launch reads. */
struct qg_args {
	const uint8_t *w;
	size_t row_bytes;
	int k, n_rows, n_tok;
	const __half *xh;
	const float *xscale;
	struct mm_out out;
	float *part;       /* split sums: [split][token][row], or NULL when not split */
};

/* Queues the copy of the tokens' fp16 tile of sub-step g of this block's K range (g < S). */
template <int TY, class C>
static __device__ __forceinline__ void
qg_issue_x(const struct qg_args &a, unsigned char *smem, int n0, int s0, int g, int S)
{
	using L = qg_smem<TY, C>;
	__half *bs = (__half *)(smem + L::B_OFF) + (size_t)(g % L::BR) * C::BN * QG_LDS;
	int k0 = (s0 + g) * 64;

	if (g >= S)
		return;
	for (int i = threadIdx.x; i < C::BN * 8; i += C::THREADS) {
		int r = i / 8, c = i % 8, n = n0 + r;
		const __half *src = a.xh + (size_t)min(n, a.n_tok - 1) * a.k + k0 + 8 * c;

		cp_async16_zfill(bs + r * QG_LDS + 8 * c, src, n < a.n_tok ? 16 : 0);
	}
}

/* Queues the copy of the raw unit that sub-step g starts, if it starts one (g < S). */
template <int TY, class C>
static __device__ __forceinline__ void
qg_issue_w(const struct qg_args &a, unsigned char *smem, int m0, int s0, int g, int S)
{
	using L = qg_smem<TY, C>;
	using U = qg_unit<TY>;
	uint8_t *raw = smem + L::R_OFF + (size_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
	size_t unit = (size_t)((s0 + g) / L::SUB) * U::BYTES;

	if (g >= S || g % L::SUB != 0)
		return;
	for (int i = threadIdx.x; i < C::BM * (L::RAW / 16); i += C::THREADS) {
		int r = i / (L::RAW / 16), j = i % (L::RAW / 16);
		const uint8_t *p = a.w + (size_t)min(m0 + r, a.n_rows - 1) * a.row_bytes + unit;
		const uint8_t *base = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)15);

		if (16 * j < (int)((uintptr_t)p & 15) + U::BYTES)
			cp_async16(raw + r * L::RAW + 16 * j, base + 16 * j);
	}
}

/* ---- decoding raw blocks to fp16 ---- */

static __device__ __forceinline__ __half2
as_h2(uint32_t u)
{
	__half2 h;

	memcpy(&h, &u, sizeof h);
	return h;
}

static __device__ __forceinline__ uint32_t
as_u32(__half2 h)
{
	uint32_t u;

	memcpy(&u, &h, sizeof u);
	return u;
}

/* fp16 pairs 0x6400 | n: the values 1024 + n, exact for n < 1024. */
#define H_1024 0x64006400u
#define H_1032 0x64086408u /* 1024 + 8: Q4_0's offset */
#define H_1040 0x64106410u /* 1024 + 16: Q5_0's */
#define H_1056 0x64206420u /* 1024 + 32: Q6_K's */
#define H_1152 0x64806480u /* 1024 + 128: Q8_0's bytes, xor 0x80 */

/* Bytes 0 and 1 (lo) or 2 and 3 (hi) of w as the fp16 pair 1024 + byte. */
static __device__ __forceinline__ __half2
magic_lo(uint32_t w)
{
	return as_h2(__byte_perm(w, 0x64646464u, 0x4140));
}

static __device__ __forceinline__ __half2
magic_hi(uint32_t w)
{
	return as_h2(__byte_perm(w, 0x64646464u, 0x4342));
}

/* Eight unsigned bytes of w minus off (fp16 1024 + offset), times scale. */
static __device__ __forceinline__ void
h8_scale(const uint32_t w[2], uint32_t off, __half2 scale, uint32_t out[4])
{
#pragma unroll
	for (int i = 0; i < 2; i++) {
		out[2 * i] = as_u32(__hmul2(__hsub2(magic_lo(w[i]), as_h2(off)), scale));
		out[2 * i + 1] = as_u32(__hmul2(__hsub2(magic_hi(w[i]), as_h2(off)), scale));
	}
}

/* Eight unsigned bytes of w times scale, minus min: the K types' (d sc) q - dmin m. */
static __device__ __forceinline__ void
h8_fma(const uint32_t w[2], __half2 scale, __half2 min, uint32_t out[4])
{
	__half2 nmin = __hneg2(min);

#pragma unroll
	for (int i = 0; i < 2; i++) {
		out[2 * i] = as_u32(__hfma2(__hsub2(magic_lo(w[i]), as_h2(H_1024)), scale, nmin));
		out[2 * i + 1] = as_u32(__hfma2(__hsub2(magic_hi(w[i]), as_h2(H_1024)), scale, nmin));
	}
}

/* Eight bytes at a 2-byte aligned shared address, as two words. */
static __device__ __forceinline__ void
smem8_a2(const uint8_t *p, uint32_t w[2])
{
	const uint16_t *h = (const uint16_t *)p;

	w[0] = (uint32_t)h[0] | (uint32_t)h[1] << 16;
	w[1] = (uint32_t)h[2] | (uint32_t)h[3] << 16;
}

/* An fp16 scalar at a 2-byte aligned shared address, in both halves of a pair. */
static __device__ __forceinline__ __half2
smem_f16x2(const uint8_t *p)
{
	uint32_t u = *(const uint16_t *)p;

	return as_h2(u | u << 16);
}

/* The fp16 pair (sc, m) of sub-block g of a Q4_K/Q5_K block's 12 scale bytes, times (d, dmin) at b. */
static __device__ __forceinline__ __half2
k4_dm(const uint8_t *b, int g)
{
	const uint8_t *q = b + 4;
	uint32_t sc, m;

	if (g < 4) {
		sc = q[g] & 63u;
		m = q[g + 4] & 63u;
	} else {
		sc = (q[g + 4] & 0xfu) | (uint32_t)(q[g - 4] >> 6) << 4;
		m = (uint32_t)(q[g + 4] >> 4) | (uint32_t)(q[g] >> 6) << 4;
	}
	return __hmul2(as_h2(*(const uint32_t *)b), __hsub2(as_h2(H_1024 | sc | m << 16), as_h2(H_1024)));
}

/* Bit i of the low four bits of b into bit 0 of byte i (distinct partial products: no carries). */
static __device__ __forceinline__ uint32_t
spread4(uint32_t b)
{
	return ((b & 15u) * 0x00204081u) & 0x01010101u;
}

/* chunk(unit, c, out): elements 8c .. 8c+7 of a unit in shared memory as four fp16 pairs. */
template <int TY> struct qg_dec;

template <> struct qg_dec<TT_Q4_K> {
	static __device__ __forceinline__ void
	chunk(const uint8_t *b, int c, uint32_t out[4])
	{
		int g = c >> 2, sh = (g & 1) * 4;
		__half2 dm = k4_dm(b, g);
		uint2 q = *(const uint2 *)(b + 16 + (g >> 1) * 32 + (c & 3) * 8);
		uint32_t w[2] = { (q.x >> sh) & 0x0f0f0f0fu, (q.y >> sh) & 0x0f0f0f0fu };

		h8_fma(w, __low2half2(dm), __high2half2(dm), out);
	}
};

template <> struct qg_dec<TT_Q5_K> {
	static __device__ __forceinline__ void
	chunk(const uint8_t *b, int c, uint32_t out[4])
	{
		int g = c >> 2, sh = (g & 1) * 4, l0 = (c & 3) * 8;
		__half2 dm = k4_dm(b, g);
		uint2 q = *(const uint2 *)(b + 48 + (g >> 1) * 32 + l0), hb = *(const uint2 *)(b + 16 + l0);
		uint32_t w[2] = { ((q.x >> sh) & 0x0f0f0f0fu) | ((hb.x >> g) & 0x01010101u) << 4,
			((q.y >> sh) & 0x0f0f0f0fu) | ((hb.y >> g) & 0x01010101u) << 4 };

		h8_fma(w, __low2half2(dm), __high2half2(dm), out);
	}
};

template <> struct qg_dec<TT_Q6_K> {
	static __device__ __forceinline__ void
	chunk(const uint8_t *b, int c, uint32_t out[4])
	{
		int h = c >> 4, s = (c >> 2) & 3, l0 = (c & 3) * 8;
		uint32_t ql[2], qh[2], w[2];
		uint32_t sc = (uint32_t)(b[192 + (c >> 1)] ^ 0x80u); /* the signed scale + 128 */
		__half2 scale = __hmul2(smem_f16x2(b + 208), __hsub2(as_h2(H_1024 | sc | sc << 16), as_h2(H_1152)));

		smem8_a2(b + 64 * h + 32 * (s & 1) + l0, ql);
		smem8_a2(b + 128 + 32 * h + l0, qh);
#pragma unroll
		for (int i = 0; i < 2; i++)
			w[i] = ((ql[i] >> (4 * (s >> 1))) & 0x0f0f0f0fu) | ((qh[i] >> (2 * s)) & 0x03030303u) << 4;
		h8_scale(w, H_1056, scale, out);
	}
};

template <> struct qg_dec<TT_Q8_0> {
	static __device__ __forceinline__ void
	chunk(const uint8_t *b, int c, uint32_t out[4])
	{
		const uint8_t *blk = b + (c >> 2) * 34;
		uint32_t w[2];

		smem8_a2(blk + 2 + 8 * (c & 3), w);
		w[0] ^= 0x80808080u, w[1] ^= 0x80808080u; /* q + 128, unsigned */
		h8_scale(w, H_1152, smem_f16x2(blk), out);
	}
};

template <> struct qg_dec<TT_Q4_0> {
	static __device__ __forceinline__ void
	chunk(const uint8_t *b, int c, uint32_t out[4])
	{
		const uint8_t *blk = b + (c >> 2) * 18;
		int j = c & 3, sh = j < 2 ? 0 : 4;
		uint32_t w[2];

		smem8_a2(blk + 2 + 8 * (j & 1), w);
		w[0] = (w[0] >> sh) & 0x0f0f0f0fu, w[1] = (w[1] >> sh) & 0x0f0f0f0fu;
		h8_scale(w, H_1032, smem_f16x2(blk), out);
	}
};

template <> struct qg_dec<TT_Q5_0> {
	static __device__ __forceinline__ void
	chunk(const uint8_t *b, int c, uint32_t out[4])
	{
		const uint8_t *blk = b + (c >> 2) * 22;
		int j = c & 3, sh = j < 2 ? 0 : 4;
		const uint16_t *qh16 = (const uint16_t *)(blk + 2);
		uint32_t bits = (((uint32_t)qh16[0] | (uint32_t)qh16[1] << 16) >> (8 * j)) & 0xffu, w[2];

		smem8_a2(blk + 6 + 8 * (j & 1), w);
		w[0] = ((w[0] >> sh) & 0x0f0f0f0fu) | spread4(bits) << 4;
		w[1] = ((w[1] >> sh) & 0x0f0f0f0fu) | spread4(bits >> 4) << 4;
		h8_scale(w, H_1040, smem_f16x2(blk), out);
	}
};

/*
 * Decodes chunk i (of BM x 8 chunks of 8 elements) of sub-step g's 64
 * elements of the block's rows, from its raw unit into fp16 tile buf.
 */
template <int TY, class C>
static __device__ __forceinline__ void
qg_decode(const struct qg_args &a, unsigned char *smem, int m0, int s0, int g, int buf, int i)
{
	using L = qg_smem<TY, C>;
	using U = qg_unit<TY>;
	const uint8_t *raw = smem + L::R_OFF + (size_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
	__half *as = (__half *)(smem + L::A_OFF) + (size_t)buf * C::BM * QG_LDS;
	size_t unit = (size_t)((s0 + g) / L::SUB) * U::BYTES;
	int r = i / 8, c = i % 8;
	uintptr_t p = (uintptr_t)(a.w + (size_t)min(m0 + r, a.n_rows - 1) * a.row_bytes + unit);
	uint32_t h[4];

	qg_dec<TY>::chunk(raw + r * L::RAW + (p & 15), 8 * (g % L::SUB) + c, h);
	*(uint4 *)(as + r * QG_LDS + 8 * c) = make_uint4(h[0], h[1], h[2], h[3]);
}

/* k16 step kk of the warp's products over decoded tile buf and token tile g. */
template <int TY, class C>
static __device__ __forceinline__ void
qg_mma(unsigned char *smem, int g, int buf, int kk, int wm0, int wn0, float (&acc)[C::MT][C::NT][4])
{
	using L = qg_smem<TY, C>;
	const __half *as = (const __half *)(smem + L::A_OFF) + (size_t)buf * C::BM * QG_LDS;
	const __half *bs = (const __half *)(smem + L::B_OFF) + (size_t)(g % L::BR) * C::BN * QG_LDS;
	int lane = threadIdx.x % WARP;
	uint32_t af[C::MT][4], bf[C::NT][2];

#pragma unroll
	for (int mt = 0; mt < C::MT; mt++)
		ldmatrix_x4(af[mt], as + (wm0 + 16 * mt + lane % 16) * QG_LDS + 16 * kk + (lane / 16) * 8);
#pragma unroll
	for (int j = 0; j < C::NT / 2; j++) {
		uint32_t r[4];

		ldmatrix_x4(r, bs + (wn0 + 16 * j + lane % 8 + (lane / 16) * 8) * QG_LDS + 16 * kk + ((lane / 8) % 2) * 8);
		bf[2 * j][0] = r[0], bf[2 * j][1] = r[1];
		bf[2 * j + 1][0] = r[2], bf[2 * j + 1][1] = r[3];
	}
#pragma unroll
	for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
		for (int nt = 0; nt < C::NT; nt++)
			mma16816(acc[mt][nt], af[mt], bf[nt]);
}

/*
 * Block (blockIdx.x: BM rows, blockIdx.y: BN tokens, blockIdx.z: a split
 * of K's units). Pipeline, per sub-step g: wait for token tile g (the
 * raw unit of g + 1 was queued earlier still) and the barrier; queue token
 * tile g + QG_AHEAD and the raw unit of g + RAW_AHEAD in one group;
 * decode g + 1 into the other fp16 tile while multiplying g.
 */
template <int TY, class C>
__global__ void __launch_bounds__(C::THREADS)
qgemm_kernel(struct qg_args a)
{
	using L = qg_smem<TY, C>;
	extern __shared__ __align__(16) unsigned char smem[];
	int m0 = blockIdx.x * C::BM, n0 = blockIdx.y * C::BN;
	int units = a.k / qg_unit<TY>::UNIT;
	int u0 = (int)((int64_t)units * blockIdx.z / gridDim.z), u1 = (int)((int64_t)units * (blockIdx.z + 1) / gridDim.z);
	int s0 = u0 * L::SUB, S = (u1 - u0) * L::SUB;
	int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
	int wm0 = (warp / C::WN) * (C::BM / C::WM), wn0 = (warp % C::WN) * (C::BN / C::WN);
	float acc[C::MT][C::NT][4];

#pragma unroll
	for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
		for (int nt = 0; nt < C::NT; nt++)
			acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
	/* group 0: the first RAW_AHEAD sub-steps' raw units and token tile 0; groups 1 .. QG_AHEAD-1: tiles */
	for (int g = 0; g < C::RAW_AHEAD; g++)
		qg_issue_w<TY, C>(a, smem, m0, s0, g, S);
	for (int g = 0; g < QG_AHEAD; g++) {
		qg_issue_x<TY, C>(a, smem, n0, s0, g, S);
		cp_async_commit();
	}
	cp_async_wait<QG_AHEAD - 1>();
	__syncthreads();
	for (int i = threadIdx.x; S > 0 && i < C::BM * 8; i += C::THREADS)
		qg_decode<TY, C>(a, smem, m0, s0, 0, 0, i);
	for (int g = 0; g < S; g++) {
		/* token tile g (queued QG_AHEAD iterations ago) and the raw unit of g + 1 (earlier) are in */
		cp_async_wait<QG_AHEAD - 1>();
		__syncthreads();
		qg_issue_x<TY, C>(a, smem, n0, s0, g + QG_AHEAD, S);
		qg_issue_w<TY, C>(a, smem, m0, s0, g + C::RAW_AHEAD, S);
		cp_async_commit();
		/* a quarter of the next tile's decoding beside each k16 step of this one's products */
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			if (g + 1 < S)
				qg_decode<TY, C>(a, smem, m0, s0, g + 1, (g + 1) & 1, threadIdx.x + kk * C::THREADS);
			qg_mma<TY, C>(smem, g, g & 1, kk, wm0, wn0, acc);
		}
	}
	cp_async_wait<0>();

	int gq = lane / 4, tq = 2 * (lane % 4);
#pragma unroll
	for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
		for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
			for (int i = 0; i < 4; i++) {
				int row = m0 + wm0 + 16 * mt + gq + (i >= 2 ? 8 : 0);
				int tok = n0 + wn0 + 8 * nt + tq + (i & 1);

				if (row >= a.n_rows || tok >= a.n_tok)
					continue;
				if (a.part != NULL)
					a.part[((size_t)blockIdx.z * a.n_tok + tok) * a.n_rows + row] = acc[mt][nt][i];
				else
					mm_store(a.out, row, tok, acc[mt][nt][i] * a.xscale[tok]);
			}
}

/* The split sums of (token, row) added in split order, scaled back, stored. */
__global__ void
qg_reduce_kernel(const float *__restrict__ part, int n_split, int n_tok, int n_rows,
    const float *__restrict__ xscale, struct mm_out out)
{
	int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	int tok = (int)(i / n_rows), row = (int)(i % n_rows);
	float s = 0.0f;

	if (i >= (int64_t)n_tok * n_rows)
		return;
	for (int z = 0; z < n_split; z++)
		s += part[((size_t)z * n_tok + tok) * n_rows + row];
	mm_store(out, row, tok, s * xscale[tok]);
}

/* Blocks of one shape that fit on a multiprocessor at once, by shared memory (at least 1). */
template <int TY, class C>
static int
qg_per_sm(void)
{
	return MAX(1, (int)((227u * 1024u) / (qg_smem<TY, C>::BYTES + 1024)));
}

/*
 * Splits of K for a grid of `blocks` tiles: enough to give every
 * multiprocessor its share, no more than the units of a split allow, and
 * as many as the partial sums' buffer holds.
 */
static int
qg_splits(const struct cuda_mm *m, int64_t blocks, int per_sm, int units, int64_t part_per_split)
{
	int64_t want = (int64_t)m->sms * per_sm, s = 1;

	if (blocks < want)
		s = MIN(want / blocks, (int64_t)QG_MAX_SPLIT);
	s = MIN(s, (int64_t)units);
	while (s > 1 && s * part_per_split > m->part_elems)
		s--;
	return (int)MAX(s, (int64_t)1);
}

/* One launch of shape C for type TY (and the reduction of its splits). */
template <int TY, class C>
static int
qg_launch(struct cuda_mm *m, struct qg_args a, char *err)
{
	dim3 grid((unsigned)((a.n_rows + C::BM - 1) / C::BM), (unsigned)((a.n_tok + C::BN - 1) / C::BN), 1);
	int units = a.k / qg_unit<TY>::UNIT;

	grid.z = (unsigned)qg_splits(m, (int64_t)grid.x * grid.y, qg_per_sm<TY, C>(), units,
	    (int64_t)a.n_tok * a.n_rows);
	a.part = grid.z > 1 ? m->part : NULL;
	qgemm_kernel<TY, C><<<grid, C::THREADS, qg_smem<TY, C>::BYTES, m->stream>>>(a);
	CK_LAUNCH("qgemm_kernel");
	if (grid.z == 1)
		return 0;
	int64_t n = (int64_t)a.n_tok * a.n_rows;
	qg_reduce_kernel<<<(unsigned)((n + 255) / 256), 256, 0, m->stream>>>(m->part, (int)grid.z, a.n_tok,
	    a.n_rows, a.xscale, a.out);
	CK_LAUNCH("qg_reduce_kernel");
	return 0;
}

/* The shape for n_tok tokens. */
template <int TY>
static int
qg_dispatch(struct cuda_mm *m, const struct qg_args &a, char *err)
{
	if (a.n_tok <= 16)
		return qg_launch<TY, qg_c16>(m, a, err);
	if (a.n_tok <= 32)
		return qg_launch<TY, qg_c32>(m, a, err);
	if (a.n_tok <= 64)
		return qg_launch<TY, qg_c64>(m, a, err);
	return qg_launch<TY, qg_c128>(m, a, err);
}

int
cuda_qgemm_type(const struct cuda_weight *w)
{
	switch (w->type) {
#define QT_CASE(TY) case TY: return w->k % qg_unit<TY>::UNIT == 0;
	QG_TYPES(QT_CASE)
#undef QT_CASE
	default:
		return 0;
	}
}

int
cuda_qgemm(struct cuda_mm *m, const struct cuda_weight *w, int n_tok, const struct mm_out *out, char *err)
{
	struct qg_args a = { w->d, w->row_bytes, (int)w->k, (int)w->n, n_tok, m->xh, m->xscale, *out, NULL };

	switch (w->type) {
#define QT_CASE(TY) case TY: return qg_dispatch<TY>(m, a, err);
	QG_TYPES(QT_CASE)
#undef QT_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "no tensor-core kernel for weight type %u", w->type);
	}
}

/* Raises the shared-memory limit of every shape of type TY. */
template <int TY>
static int
qg_setup_type(char *err)
{
	CK(cudaFuncSetAttribute(qgemm_kernel<TY, qg_c16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	    (int)qg_smem<TY, qg_c16>::BYTES));
	CK(cudaFuncSetAttribute(qgemm_kernel<TY, qg_c32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	    (int)qg_smem<TY, qg_c32>::BYTES));
	CK(cudaFuncSetAttribute(qgemm_kernel<TY, qg_c64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	    (int)qg_smem<TY, qg_c64>::BYTES));
	CK(cudaFuncSetAttribute(qgemm_kernel<TY, qg_c128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	    (int)qg_smem<TY, qg_c128>::BYTES));
	return 0;
}

int
cuda_qgemm_setup(char *err)
{
	int rc = 0;

#define QT_CASE(TY) if (rc == 0) rc = qg_setup_type<TY>(err);
	QG_TYPES(QT_CASE)
#undef QT_CASE
	return rc;
}

int64_t
cuda_qgemm_part_elems(int sms)
{
	/* a split grid has at most a multiprocessor's worth of tiles per multiprocessor: 128 x 128 of sums */
	return (int64_t)sms * qg_c128::BM * qg_c128::BN;
}
