/*
 * qgemm.cu: products of many tokens (batched decoding, prefill) on the
 * tensor cores, straight from the quantized blocks: y = W x for W in Q4_K,
 * Q5_K, Q6_K, Q8_0, Q4_0 or Q5_0 as stored, x as fp16 (matmul.cu's
 * to_f16_kernel: each token's row divided by a power of two when it would
 * overflow fp16; the product is multiplied back here).
 *
 * A block computes a tile of 128 weight rows by BN tokens. It walks K 64
 * elements at a time (a sub-step). The raw blocks of the weight (a whole
 * super-block of 256 for the K types, two blocks of 32 for the others: a
 * unit) and the tokens' fp16 tile are copied into shared memory with
 * cp.async, the raw units a shape's RAW_AHEAD sub-steps ahead of their
 * use (enough bytes in flight to stream the weight at the memory's rate),
 * the token tiles (which the L2 cache holds) QG_AHEAD. Each warp owns
 * 16 or 32 rows and decodes them from the raw unit straight into the A
 * fragments of mma.sync m16n8k16 (fp16 in, float32 accumulation); the
 * tokens' fragments come from shared memory by ldmatrix. The K types'
 * scales and mins are decoded once per unit into a small table.
 *
 * The decoding is fp16 arithmetic alone (no conversion instructions, which
 * run at a quarter of the rate): a byte b of quants becomes the fp16
 * 1024 + b by a byte permute with 0x64 (the exponent of 1024 leaves an ulp
 * of 1), 1024 plus the type's offset is subtracted exactly, and one
 * multiply (and subtract, for the K types' mins) by the block's fp16
 * scales rounds once: the weight differs from quant.c's float value by the
 * fp16 rounding of the value and of its scale (d * sc for the K types), a
 * few parts in 2^11.
 *
 * Tile shapes follow the token count: 16, 32 or 64 tokens (eight warps of
 * 16 rows), or 128 for prefill (eight warps of 32 rows by 64 tokens). When
 * the tiles do not fill the GPU the K range is split: each split writes its
 * partial sums and a second kernel adds them in a fixed order (the result
 * does not depend on timing).
 */
#include "matmul.cuh"
#include "tc.cuh"

#include <string.h>

/* Sub-steps of token-tile copies in flight ahead of the one being multiplied. */
#define QG_AHEAD 2
/* fp16 elements of a shared-memory token row: 64 and 8 of padding, so ldmatrix meets no bank conflicts. */
#define QG_LDS 72
/* Most splits of K. */
#define QG_MAX_SPLIT 8
/* Weight rows of a block. */
#define QG_BM 128

/*
 * A tile shape: BN tokens against QG_BM rows, warps WM x WN, raw units
 * copied RAW_AHEAD sub-steps ahead.
 */
template <int BN_, int WM_, int WN_, int RAW_AHEAD_>
struct qg_cfg {
	static constexpr int BM = QG_BM, BN = BN_, WM = WM_, WN = WN_, RAW_AHEAD = RAW_AHEAD_;
	static constexpr int THREADS = WM * WN * WARP;
	static constexpr int MT = BM / WM / 16; /* m16 tiles of a warp */
	static constexpr int NT = BN / WN / 8;  /* n8 tiles of a warp */
	static_assert(NT % 2 == 0, "token fragments are loaded two n8 tiles at a time");
};

/*
 * The decode shapes stream the weight (raw units 8 sub-steps ahead), each
 * warp decoding its own 16 rows; prefill's is bound by the tensor cores:
 * its warps take 32 rows by 64 tokens (each row decoded by two warps) and
 * it keeps its shared memory for token tiles.
 */
using qg_c16 = qg_cfg<16, 8, 1, 8>;
using qg_c32 = qg_cfg<32, 8, 1, 8>;
using qg_c64 = qg_cfg<64, 8, 1, 8>;
using qg_c128 = qg_cfg<128, 4, 2, 4>;

/* ---- fp16 arithmetic on quants ---- */

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

/*
 * Quants for the two A registers of one row: x holds four unsigned byte
 * values, those of k slots (2t, 2t+1) in bytes 0-1 and (2t+8, 2t+9) in
 * bytes 2-3; each pair becomes the fp16 pair 1024 + byte, less off, times
 * scale, plus add (the K types' - dmin m; 0 for the others).
 */
static __device__ __forceinline__ void
qg_pairs(uint32_t x, uint32_t off, __half2 scale, __half2 add, uint32_t &lo, uint32_t &hi)
{
	lo = as_u32(__hfma2(__hsub2(as_h2(__byte_perm(x, 0x64646464u, 0x4140)), as_h2(off)), scale, add));
	hi = as_u32(__hfma2(__hsub2(as_h2(__byte_perm(x, 0x64646464u, 0x4342)), as_h2(off)), scale, add));
}

/* Bytes p[0..1] and p[8..9] (p 2-byte aligned, shared memory) as one word. */
static __device__ __forceinline__ uint32_t
qg_bytes(const uint8_t *p)
{
	return (uint32_t)*(const uint16_t *)p | (uint32_t)*(const uint16_t *)(p + 8) << 16;
}

/* An fp16 scalar at a 2-byte aligned shared address, in both halves of a pair. */
static __device__ __forceinline__ __half2
smem_f16x2(const uint8_t *p)
{
	uint32_t u = *(const uint16_t *)p;

	return as_h2(u | u << 16);
}

/* The fp16 pair (sc, m) of sub-block g of a Q4_K/Q5_K block (12 scale bytes at b + 4), times (d, dmin) at b. */
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

/* Bits 0, 1, 8 and 9 of b into bit 4 of bytes 0 .. 3 (distinct partial products: no carries). */
static __device__ __forceinline__ uint32_t
q5_high(uint32_t b)
{
	uint32_t four = (b & 3u) | (b >> 6 & 12u);

	return ((four * 0x00204081u) & 0x01010101u) << 4;
}

/*
 * A type's unit of raw copies (UNIT elements of a row in BYTES), its table
 * of scales (TAB words a row a unit, made by table(), 0 when the fragments
 * read their scales from the blocks), and frag(): the A registers of one
 * row, k16 step kk of sub-step part of the unit, for lane t (of 4) of a
 * row group: a[0] for k slots (2t, 2t+1), a[1] for (2t+8, 2t+9).
 */
template <int TY> struct qg_type;

/* Q4_K: sub-block g's 32 quants are the low (g even) or high nibbles of 32 bytes at 16 + 32 (g / 2). */
template <> struct qg_type<TT_Q4_K> {
	static constexpr int UNIT = 256, BYTES = 144, TAB = 16;
	/* word 2g: (d sc, d sc); 2g + 1: (-dmin m, -dmin m) */
	static __device__ __forceinline__ uint32_t
	table(const uint8_t *b, int j)
	{
		__half2 dm = k4_dm(b, j / 2);

		return as_u32(j & 1 ? __hneg2(__high2half2(dm)) : __low2half2(dm));
	}
	static __device__ __forceinline__ void
	frag(const uint8_t *b, const uint32_t *tab, int part, int kk, int t, uint32_t a[2])
	{
		int g = 2 * part + kk / 2;
		uint32_t x = (qg_bytes(b + 16 + 32 * part + 16 * (kk & 1) + 2 * t) >> (4 * (kk / 2))) & 0x0f0f0f0fu;

		qg_pairs(x, H_1024, as_h2(tab[2 * g]), as_h2(tab[2 * g + 1]), a[0], a[1]);
	}
};

/* Q5_K: Q4_K's nibbles at 48 + 32 (g / 2), plus bit g of byte l of the 32 at 16. */
template <> struct qg_type<TT_Q5_K> {
	static constexpr int UNIT = 256, BYTES = 176, TAB = 16;
	static __device__ __forceinline__ uint32_t
	table(const uint8_t *b, int j)
	{
		return qg_type<TT_Q4_K>::table(b, j);
	}
	static __device__ __forceinline__ void
	frag(const uint8_t *b, const uint32_t *tab, int part, int kk, int t, uint32_t a[2])
	{
		int g = 2 * part + kk / 2, l = 16 * (kk & 1) + 2 * t;
		uint32_t x = (qg_bytes(b + 48 + 32 * part + l) >> (4 * (kk / 2))) & 0x0f0f0f0fu;

		x |= ((qg_bytes(b + 16 + l) >> g) & 0x01010101u) << 4;
		qg_pairs(x, H_1024, as_h2(tab[2 * g]), as_h2(tab[2 * g + 1]), a[0], a[1]);
	}
};

/*
 * Q6_K: in half h (128 elements) quarter s takes nibble s / 2 of the 32
 * bytes at 64 h + 32 (s % 2) and bits 2s of the 32 at 128 + 32 h; a signed
 * byte scale per 16 at 192, d at 208.
 */
template <> struct qg_type<TT_Q6_K> {
	static constexpr int UNIT = 256, BYTES = 210, TAB = 16;
	/* word j: (d sc_j, d sc_j) */
	static __device__ __forceinline__ uint32_t
	table(const uint8_t *b, int j)
	{
		uint32_t sc = (uint32_t)(b[192 + j] ^ 0x80u); /* the signed scale + 128 */

		return as_u32(__hmul2(smem_f16x2(b + 208), __hsub2(as_h2(H_1024 | sc | sc << 16), as_h2(H_1152))));
	}
	static __device__ __forceinline__ void
	frag(const uint8_t *b, const uint32_t *tab, int part, int kk, int t, uint32_t a[2])
	{
		int h = part / 2, s = 2 * (part & 1) + kk / 2, l = 16 * (kk & 1) + 2 * t;
		uint32_t x = ((qg_bytes(b + 64 * h + 32 * (s & 1) + l) >> (4 * (s >> 1))) & 0x0f0f0f0fu) |
		    ((qg_bytes(b + 128 + 32 * h + l) >> (2 * s)) & 0x03030303u) << 4;

		qg_pairs(x, H_1056, as_h2(tab[4 * part + kk]), as_h2(0u), a[0], a[1]);
	}
};

/* Q8_0: two 34-byte blocks, d then 32 signed bytes. */
template <> struct qg_type<TT_Q8_0> {
	static constexpr int UNIT = 64, BYTES = 68, TAB = 0;
	static __device__ __forceinline__ uint32_t
	table(const uint8_t *, int)
	{
		return 0;
	}
	static __device__ __forceinline__ void
	frag(const uint8_t *b, const uint32_t *, int, int kk, int t, uint32_t a[2])
	{
		const uint8_t *blk = b + 34 * (kk / 2);

		qg_pairs(qg_bytes(blk + 2 + 16 * (kk & 1) + 2 * t) ^ 0x80808080u, H_1152, smem_f16x2(blk), as_h2(0u),
		    a[0], a[1]);
	}
};

/* Q4_0: two 18-byte blocks, d then 16 bytes: elements 0..15 the low nibbles, 16..31 the high ones. */
template <> struct qg_type<TT_Q4_0> {
	static constexpr int UNIT = 64, BYTES = 36, TAB = 0;
	static __device__ __forceinline__ uint32_t
	table(const uint8_t *, int)
	{
		return 0;
	}
	static __device__ __forceinline__ void
	frag(const uint8_t *b, const uint32_t *, int, int kk, int t, uint32_t a[2])
	{
		const uint8_t *blk = b + 18 * (kk / 2);

		qg_pairs((qg_bytes(blk + 2 + 2 * t) >> (4 * (kk & 1))) & 0x0f0f0f0fu, H_1032, smem_f16x2(blk),
		    as_h2(0u), a[0], a[1]);
	}
};

/* Q5_0: two 22-byte blocks, d, 32 high bits, then Q4_0's nibbles. */
template <> struct qg_type<TT_Q5_0> {
	static constexpr int UNIT = 64, BYTES = 44, TAB = 0;
	static __device__ __forceinline__ uint32_t
	table(const uint8_t *, int)
	{
		return 0;
	}
	static __device__ __forceinline__ void
	frag(const uint8_t *b, const uint32_t *, int, int kk, int t, uint32_t a[2])
	{
		const uint8_t *blk = b + 22 * (kk / 2);
		const uint16_t *qh = (const uint16_t *)(blk + 2);
		int e = 16 * (kk & 1) + 2 * t;
		uint32_t bits = ((uint32_t)qh[0] | (uint32_t)qh[1] << 16) >> e;
		uint32_t x = ((qg_bytes(blk + 6 + 2 * t) >> (4 * (kk & 1))) & 0x0f0f0f0fu) | q5_high(bits);

		qg_pairs(x, H_1040, smem_f16x2(blk), as_h2(0u), a[0], a[1]);
	}
};

/* The types qgemm reads, as X(type) cases. */
#define QG_TYPES(X) X(TT_Q4_K) X(TT_Q5_K) X(TT_Q6_K) X(TT_Q8_0) X(TT_Q4_0) X(TT_Q5_0)

/*
 * Shared-memory layout of one (type, shape): the token tiles (ring of
 * QG_AHEAD + 1), the raw units (a ring deep enough that the unit being
 * refilled is never one still in flight or being decoded) and two units'
 * tables of scales. A unit's bytes are copied as the 16-byte aligned words
 * covering them, so a row's slot holds BYTES + 15 rounded up to 16, the
 * unit starting at its global address modulo 16.
 */
template <int TY, class C>
struct qg_smem {
	static constexpr int SUB = qg_type<TY>::UNIT / 64;
	static constexpr int BR = QG_AHEAD + 1;
	static constexpr int RR = (C::RAW_AHEAD + SUB - 1) / SUB + 1;
	static_assert(C::RAW_AHEAD > QG_AHEAD, "a unit arrives a sub-step before its first token tile");
	static constexpr int RAW = (qg_type<TY>::BYTES + 15 + 15) / 16 * 16;
	static constexpr size_t B_OFF = 0;
	static constexpr size_t R_OFF = B_OFF + (size_t)BR * C::BN * QG_LDS * sizeof(__half);
	static constexpr size_t T_OFF = R_OFF + (size_t)RR * C::BM * RAW;
	static constexpr size_t BYTES = T_OFF + (size_t)2 * C::BM * qg_type<TY>::TAB * sizeof(uint32_t);
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

/* Where row r's bytes of unit u start in global memory (rows past the end repeat the last). */
template <int TY>
static __device__ __forceinline__ uintptr_t
qg_at(const struct qg_args &a, int r, int u)
{
	return (uintptr_t)(a.w + (size_t)min(r, a.n_rows - 1) * a.row_bytes + (size_t)u * qg_type<TY>::BYTES);
}

/* Queues the copy of the raw unit that sub-step g starts, if it starts one (g < S). */
template <int TY, class C>
static __device__ __forceinline__ void
qg_issue_w(const struct qg_args &a, unsigned char *smem, int m0, int s0, int g, int S)
{
	using L = qg_smem<TY, C>;
	constexpr int CH = L::RAW / 16;
	uint8_t *raw = smem + L::R_OFF + (size_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
	int u = (s0 + g) / L::SUB;

	if (g >= S || g % L::SUB != 0)
		return;
#pragma unroll
	for (int i = threadIdx.x; i < C::BM * CH; i += C::THREADS) {
		int r = i / CH, j = i % CH;
		uintptr_t p = qg_at<TY>(a, m0 + r, u);

		if (16 * j < (int)(p & 15) + qg_type<TY>::BYTES)
			cp_async16(raw + r * L::RAW + 16 * j, (const void *)((p & ~(uintptr_t)15) + 16 * j));
	}
}

/* Fills the table of scales of the unit sub-step g starts (the unit is in shared memory), if the type has one. */
template <int TY, class C>
static __device__ __forceinline__ void
qg_table(const struct qg_args &a, unsigned char *smem, int m0, int s0, int g)
{
	using L = qg_smem<TY, C>;
	constexpr int TAB = qg_type<TY>::TAB;
	const uint8_t *raw = smem + L::R_OFF + (size_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
	uint32_t *tab = (uint32_t *)(smem + L::T_OFF) + (size_t)((g / L::SUB) & 1) * C::BM * TAB;
	int u = (s0 + g) / L::SUB;

	if constexpr (TAB > 0) {
#pragma unroll
		for (int i = threadIdx.x; i < C::BM * TAB; i += C::THREADS) {
			int r = i / TAB;

			tab[i] = qg_type<TY>::table(raw + r * L::RAW + (qg_at<TY>(a, m0 + r, u) & 15), i % TAB);
		}
	}
}

/*
 * Sub-step g's products of one warp: for each k16 step, its rows' A
 * fragments decoded from the raw unit, the tokens' B fragments by
 * ldmatrix, the mma.sync of every (m16, n8) tile.
 */
template <int TY, class C>
static __device__ __forceinline__ void
qg_step(const struct qg_args &a, unsigned char *smem, int m0, int s0, int g, int wm0, int wn0,
    float (&acc)[C::MT][C::NT][4])
{
	using L = qg_smem<TY, C>;
	constexpr int TAB = qg_type<TY>::TAB;
	const uint8_t *raw = smem + L::R_OFF + (size_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
	const uint32_t *tab = (const uint32_t *)(smem + L::T_OFF) + (size_t)((g / L::SUB) & 1) * C::BM * TAB;
	const __half *bs = (const __half *)(smem + L::B_OFF) + (size_t)(g % L::BR) * C::BN * QG_LDS;
	int lane = threadIdx.x % WARP, u = (s0 + g) / L::SUB, part = g % L::SUB;
	const uint8_t *rb[C::MT][2];
	const uint32_t *rt[C::MT][2];

#pragma unroll
	for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int r = wm0 + 16 * mt + lane / 4 + 8 * h;

			rb[mt][h] = raw + r * L::RAW + (qg_at<TY>(a, m0 + r, u) & 15);
			rt[mt][h] = tab + r * TAB;
		}
#pragma unroll
	for (int kk = 0; kk < 4; kk++) {
		uint32_t af[C::MT][4], bf[C::NT][2];

#pragma unroll
		for (int mt = 0; mt < C::MT; mt++) {
			uint32_t r0[2], r1[2];

			qg_type<TY>::frag(rb[mt][0], rt[mt][0], part, kk, lane % 4, r0);
			qg_type<TY>::frag(rb[mt][1], rt[mt][1], part, kk, lane % 4, r1);
			af[mt][0] = r0[0], af[mt][1] = r1[0], af[mt][2] = r0[1], af[mt][3] = r1[1];
		}
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
}

/*
 * Block (blockIdx.x: 128 rows, blockIdx.y: BN tokens, blockIdx.z: a split
 * of K's units). Pipeline, per sub-step g: wait for token tile g (the raw
 * unit of g + 1 was queued earlier still) and the barrier; queue token tile
 * g + QG_AHEAD and the raw unit of g + RAW_AHEAD in one group; if g + 1
 * starts a unit, make its table of scales (seen after the next barrier);
 * then decode and multiply g.
 */
template <int TY, class C>
__global__ void __launch_bounds__(C::THREADS)
qgemm_kernel(struct qg_args a)
{
	using L = qg_smem<TY, C>;
	extern __shared__ __align__(16) unsigned char smem[];
	int m0 = blockIdx.x * C::BM, n0 = blockIdx.y * C::BN;
	int units = a.k / qg_type<TY>::UNIT;
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
	if (S > 0)
		qg_table<TY, C>(a, smem, m0, s0, 0);
	for (int g = 0; g < S; g++) {
		/* token tile g (queued QG_AHEAD iterations ago) and the raw unit of g + 1 (earlier) are in */
		cp_async_wait<QG_AHEAD - 1>();
		__syncthreads();
		qg_issue_x<TY, C>(a, smem, n0, s0, g + QG_AHEAD, S);
		qg_issue_w<TY, C>(a, smem, m0, s0, g + C::RAW_AHEAD, S);
		cp_async_commit();
		if (g + 1 < S && (g + 1) % L::SUB == 0)
			qg_table<TY, C>(a, smem, m0, s0, g + 1);
		qg_step<TY, C>(a, smem, m0, s0, g, wm0, wn0, acc);
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
	int units = a.k / qg_type<TY>::UNIT;

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
#define QT_CASE(TY) case TY: return w->k % qg_type<TY>::UNIT == 0;
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
