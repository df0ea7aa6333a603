/*
 * qgemm.cu: products of many tokens (batched decoding, prefill) on the
 * tensor cores, straight from the quantized blocks: y = W x for W in Q4_K,
 * Q5_K, Q6_K (regrouped at load), Q8_0, Q4_0 or Q5_0 as stored, x as fp16
 * (matmul.cu's to_f16_kernel: each token's row divided by a power of two
 * when it would overflow fp16; the product is multiplied back here).
 *
 * A block computes a tile of BM weight rows by BN tokens. It walks K 64
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
 * Tile shapes follow the token count: 16, 32 or 64 tokens (128 rows, four
 * warps of 32), or 128 for prefill (256 rows, eight warps of 32 rows by all
 * 128 tokens). When
 * the tiles do not fill the GPU the K range is split: each split writes its
 * partial sums and a second kernel adds them in a fixed order (the result
 * does not depend on timing). A prefill product of more than one wave of
 * tiles whose last wave would be under half full runs that remainder's rows
 * as a second, split launch.
 *
 * That is the mma.sync form, for every device from sm_80. On sm_90a the
 * wgmma form (qw_kernel, below) takes Q4_K, Q5_K and Q6_K from cuda_mm.wg_min
 * tokens: the copy engine brings the units and token tiles, two
 * warpgroups decode the same fragments (in k order) into registers and
 * multiply them by wgmma, which reads the token tile itself. Both forms
 * share the types' decoding, the stores and the split sums.
 */
#include "dequant.cuh"
#include "matmul.cuh"
#include "tc.cuh"
#include "wg.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <limits.h>
#include <string.h>

/* Sub-steps of token-tile copies in flight ahead of the one being multiplied. */
#define QG_AHEAD 2
/* Weight rows of a block of the decode shapes. */
#define QG_BM 128

/*
 * A tile shape: BN tokens against BM rows, warps WM x WN, raw units
 * copied RAW_AHEAD sub-steps ahead.
 */
template <int BN_, int WM_, int WN_, int RAW_AHEAD_, int BM_ = QG_BM>
struct qg_cfg {
	static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, RAW_AHEAD = RAW_AHEAD_;
	static constexpr int THREADS = WM * WN * WARP;
	static constexpr int MT = BM / WM / 16; /* m16 tiles of a warp */
	static constexpr int NT = BN / WN / 8;  /* n8 tiles of a warp */
	static_assert(NT % 2 == 0, "token fragments are loaded two n8 tiles at a time");
};

/*
 * The decode shapes stream the weight (raw units 4 sub-steps ahead), four
 * warps each decoding its own 32 rows, so that each token fragment loaded
 * serves two row tiles and a block needs less shared memory than eight
 * warps of 16 rows with units 8 sub-steps ahead, whose issue was active
 * under half the time (ncu: 43-49 %) and which this beat at 16, 32 and 64
 * tokens on the H100 (tests/bench/RESULTS.md). Prefill's warps take 32
 * rows by all 128 tokens, so each row is decoded once for twice the mma
 * of 32 rows by 64 tokens (each row decoded by two warps, 128 rows a
 * block: the loop issued 8 instructions an mma, now 5.3; pp512 +8.6 %,
 * 256 sequences +7.3 %, H200); 128 accumulators a thread, 227-255
 * registers, one block of 256 rows a multiprocessor.
 */
using qg_c16 = qg_cfg<16, 4, 1, 4>;
using qg_c32 = qg_cfg<32, 4, 1, 4>;
using qg_c64 = qg_cfg<64, 4, 1, 4>;
using qg_c128 = qg_cfg<128, 8, 1, 4, 2 * QG_BM>;

/* Four bytes at a 2-byte aligned shared address, as one word. */
static __device__ __forceinline__ uint32_t
qg_word2(const uint8_t *p)
{
	return (uint32_t)*(const uint16_t *)p | (uint32_t)*(const uint16_t *)(p + 2) << 16;
}

/*
 * Lane t's four bytes of a k16 step's 16: in mma.sync's form bytes 4t to
 * 4t + 3 (the token fragments are loaded in the same order), p + QG_LANE
 * pointing at them; in the wgmma form (WG) bytes 2t, 2t + 1, 2t + 8 and
 * 2t + 9 of the 16 at p (its tensor cores read the token tile in k order,
 * so the A fragments must hold k order).
 */
#define QG_LANE(WG, t) ((WG) ? 0 : 4 * (t))

template <bool WG>
static __device__ __forceinline__ uint32_t
qg_quad(const uint8_t *p, int t)
{
	if constexpr (WG)
		return __byte_perm(*(const uint32_t *)(p + 4 * (t / 2)), *(const uint32_t *)(p + 8 + 4 * (t / 2)),
		    0x5410u + 0x2222u * (t & 1));
	else
		return *(const uint32_t *)p;
}

/* An fp16 scalar at a 2-byte aligned shared address, in both halves of a pair. */
static __device__ __forceinline__ __half2
smem_f16x2(const uint8_t *p)
{
	uint32_t u = *(const uint16_t *)p;

	return as_h2(u | u << 16);
}

/*
 * The table of a Q4_K/Q5_K block (d, dmin at b, 12 scale bytes at b + 4):
 * for each sub-block g, words 2g and 2g + 1 of tab are (d sc, d sc) and
 * (-dmin m, -dmin m).
 */
static __device__ __forceinline__ void
k4_table(const uint8_t *b, uint32_t *tab)
{
	uint32_t q0 = *(const uint32_t *)(b + 4), q1 = *(const uint32_t *)(b + 8), q2 = *(const uint32_t *)(b + 12);
	uint32_t sc[2], m[2];
	__half2 dd = as_h2(*(const uint32_t *)b);
	__half2 d = __low2half2(dd), ndmin = __hneg2(__high2half2(dd));

	k4_unpack(q0, q1, q2, sc, m);

#pragma unroll
	for (int h = 0; h < 2; h++)
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint32_t s1 = (sc[h] >> (8 * i)) & 0xffu, m1 = (m[h] >> (8 * i)) & 0xffu;
			__half2 sm = __hsub2(as_h2(H_1024 | s1 | s1 << 16), as_h2(H_1024));
			__half2 mm = __hsub2(as_h2(H_1024 | m1 | m1 << 16), as_h2(H_1024));

			tab[2 * (4 * h + i)] = as_u32(__hmul2(d, sm));
			tab[2 * (4 * h + i) + 1] = as_u32(__hmul2(ndmin, mm));
		}
}

/* Bit i of the low four bits of b into bit 4 of byte i (distinct partial products: no carries). */
static __device__ __forceinline__ uint32_t
spread4(uint32_t b)
{
	return ((b & 15u) * 0x00204081u & 0x01010101u) << 4;
}

/*
 * A type's unit of raw copies (UNIT elements of a row in BYTES), its table
 * of scales (TAB words a row a unit u, filled by table(); none when the
 * fragments read their scales from the blocks), and frags():
 * the A registers of one row, a[kk] for k16 step kk of sub-step part of
 * the unit, for lane t (of 4) of a row group.
 */
template <int TY> struct qg_type;

/* Q4_K: sub-block g's 32 quants are the low (g even) or high nibbles of 32 bytes at 16 + 32 (g / 2). */
template <> struct qg_type<TT_Q4_K> {
	static constexpr int UNIT = 256, BYTES = 144, TAB = 16;
	static __device__ __forceinline__ void
	table(const uint8_t *b, int, uint32_t *tab)
	{
		k4_table(b, tab);
	}
	template <bool WG = false>
	static __device__ __forceinline__ void
	frags(const uint8_t *b, const uint32_t *tab, int part, int t, uint32_t a[4][2])
	{
		const uint8_t *q = b + 16 + 32 * part + QG_LANE(WG, t);

#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			int g = 2 * part + kk / 2;
			uint32_t x = (qg_quad<WG>(q + 16 * (kk & 1), t) >> (4 * (kk / 2))) & 0x0f0f0f0fu;

			h2_pairs(x, H_1024, as_h2(tab[2 * g]), as_h2(tab[2 * g + 1]), a[kk]);
		}
	}
};

/* Q5_K: Q4_K's nibbles at 48 + 32 (g / 2), plus bit g of byte l of the 32 at 16. */
template <> struct qg_type<TT_Q5_K> {
	static constexpr int UNIT = 256, BYTES = 176, TAB = 16;
	static __device__ __forceinline__ void
	table(const uint8_t *b, int, uint32_t *tab)
	{
		k4_table(b, tab);
	}
	template <bool WG = false>
	static __device__ __forceinline__ void
	frags(const uint8_t *b, const uint32_t *tab, int part, int t, uint32_t a[4][2])
	{
		const uint8_t *q = b + 48 + 32 * part + QG_LANE(WG, t), *qh = b + 16 + QG_LANE(WG, t);

#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			int g = 2 * part + kk / 2;
			uint32_t x = (qg_quad<WG>(q + 16 * (kk & 1), t) >> (4 * (kk / 2))) & 0x0f0f0f0fu;

			x |= ((qg_quad<WG>(qh + 16 * (kk & 1), t) >> g) & 0x01010101u) << 4;
			h2_pairs(x, H_1024, as_h2(tab[2 * g]), as_h2(tab[2 * g + 1]), a[kk]);
		}
	}
};

/*
 * Q6_K as the GPU holds it (TT_Q6_KG, dequant.cuh): a unit is a block's
 * 208-byte body, then the 16 bytes of d's of its group of 8 (d at 208 +
 * 2 (u % 8)), copied by qg_issue_w's own branch for it; rows are 16-byte
 * multiples, so every word is aligned and a unit starts a slot. In
 * half h (128 elements) quarter s takes nibble s / 2 of the 32 bytes at
 * 64 h + 32 (s % 2) and bits 2s of the 32 at 128 + 32 h; a signed byte
 * scale per 16 at 192.
 */
template <> struct qg_type<TT_Q6_KG> {
	static constexpr int UNIT = 256, BYTES = Q6G_BODY + 16, TAB = 16;
	/* word j: (d sc_j, d sc_j) */
	static __device__ __forceinline__ void
	table(const uint8_t *b, int u, uint32_t *tab)
	{
		table_d(b, b + Q6G_BODY + 2 * (u & 7), tab);
	}
	/* the same with the unit's d at dp */
	static __device__ __forceinline__ void
	table_d(const uint8_t *b, const uint8_t *dp, uint32_t *tab)
	{
		__half2 d = smem_f16x2(dp);

#pragma unroll
		for (int j = 0; j < 16; j += 4) {
			uint32_t sc = *(const uint32_t *)(b + 192 + j) ^ 0x80808080u; /* four signed scales + 128 */

#pragma unroll
			for (int i = 0; i < 4; i++)
				tab[j + i] = as_u32(__hmul2(d, __hsub2(as_h2(__byte_perm(sc, 0x64646464u, 0x4040 + 0x0101 * i)),
				    as_h2(H_1152))));
		}
	}
	template <bool WG = false>
	static __device__ __forceinline__ void
	frags(const uint8_t *b, const uint32_t *tab, int part, int t, uint32_t a[4][2])
	{
		int h = part / 2;

#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			int s = 2 * (part & 1) + kk / 2, l = 16 * (kk & 1) + QG_LANE(WG, t);
			uint32_t x = ((qg_quad<WG>(b + 64 * h + 32 * (kk / 2) + l, t) >> (4 * (part & 1))) & 0x0f0f0f0fu) |
			    ((qg_quad<WG>(b + 128 + 32 * h + l, t) >> (2 * s)) & 0x03030303u) << 4;

			h2_pairs(x, H_1056, as_h2(tab[4 * part + kk]), as_h2(0u), a[kk]);
		}
	}
};

/* Q8_0: two 34-byte blocks, d then 32 signed bytes. Only 2-byte aligned. */
template <> struct qg_type<TT_Q8_0> {
	static constexpr int UNIT = 64, BYTES = 68, TAB = 0;
	static __device__ __forceinline__ void
	table(const uint8_t *, int, uint32_t *)
	{
	}
	static __device__ __forceinline__ void
	frags(const uint8_t *b, const uint32_t *, int, int t, uint32_t a[4][2])
	{
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			const uint8_t *blk = b + 34 * (kk / 2);

			h2_pairs(qg_word2(blk + 2 + 16 * (kk & 1) + 4 * t) ^ 0x80808080u, H_1152, smem_f16x2(blk), as_h2(0u),
			    a[kk]);
		}
	}
};

/* Q4_0: two 18-byte blocks, d then 16 bytes: elements 0..15 the low nibbles, 16..31 the high ones. */
template <> struct qg_type<TT_Q4_0> {
	static constexpr int UNIT = 64, BYTES = 36, TAB = 0;
	static __device__ __forceinline__ void
	table(const uint8_t *, int, uint32_t *)
	{
	}
	static __device__ __forceinline__ void
	frags(const uint8_t *b, const uint32_t *, int, int t, uint32_t a[4][2])
	{
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			const uint8_t *blk = b + 18 * (kk / 2);

			h2_pairs((qg_word2(blk + 2 + 4 * t) >> (4 * (kk & 1))) & 0x0f0f0f0fu, H_1032, smem_f16x2(blk),
			    as_h2(0u), a[kk]);
		}
	}
};

/* Q5_0: two 22-byte blocks, d, 32 high bits, then Q4_0's nibbles. */
template <> struct qg_type<TT_Q5_0> {
	static constexpr int UNIT = 64, BYTES = 44, TAB = 0;
	static __device__ __forceinline__ void
	table(const uint8_t *, int, uint32_t *)
	{
	}
	static __device__ __forceinline__ void
	frags(const uint8_t *b, const uint32_t *, int, int t, uint32_t a[4][2])
	{
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			const uint8_t *blk = b + 22 * (kk / 2);
			uint32_t qh = qg_word2(blk + 2) >> (16 * (kk & 1) + 4 * t);
			uint32_t x = ((qg_word2(blk + 6 + 4 * t) >> (4 * (kk & 1))) & 0x0f0f0f0fu) | spread4(qh);

			h2_pairs(x, H_1040, smem_f16x2(blk), as_h2(0u), a[kk]);
		}
	}
};

/*
 * MXFP4 as the GPU holds it (TT_MXFP4G, dequant.cuh): a unit is two
 * blocks' 32 bytes of quants, then the 16 bytes of scales of their group
 * of 8, copied by qg_issue_w's own branch for it. Element 16 h + 4 t + i
 * of a block is nibble h of quant byte 4 t + i; the doubled e2m1 values
 * (kvalues, signed bytes) go through Q8_0's unsigned form, and the block's
 * scale, a power of two, is exact in fp16 (table: one (s, s) word per
 * block).
 */
template <> struct qg_type<TT_MXFP4G> {
	static constexpr int UNIT = 64, BYTES = 48, TAB = 2;
	/* 2^(e - 128), the halved scale, as an fp16 pair: subnormal down to 2^-24, clamped at 2^15 */
	static __device__ __forceinline__ uint32_t
	scale2(uint32_t e)
	{
		uint32_t h = e >= 114 ? min(e - 113, 30u) << 10 : e >= 104 ? 1u << (e - 104) : 0u;

		return h | h << 16;
	}
	static __device__ __forceinline__ void
	table(const uint8_t *b, int u, uint32_t *tab)
	{
		tab[0] = scale2(b[32 + 2 * (u & 3)]);
		tab[1] = scale2(b[32 + 2 * (u & 3) + 1]);
	}
	static __device__ __forceinline__ void
	frags(const uint8_t *b, const uint32_t *tab, int, int t, uint32_t a[4][2])
	{
#pragma unroll
		for (int h = 0; h < 2; h++) { /* a word's low nibbles, then its high ones */
			uint2 v = mx4_decode8(*(const uint32_t *)(b + 16 * h + 4 * t));

			h2_pairs(v.x ^ 0x80808080u, H_1152, as_h2(tab[h]), as_h2(0u), a[2 * h]);
			h2_pairs(v.y ^ 0x80808080u, H_1152, as_h2(tab[h]), as_h2(0u), a[2 * h + 1]);
		}
	}
};

/* The types qgemm reads, as X(type) cases. */
#define QG_TYPES(X) X(TT_Q4_K) X(TT_Q5_K) X(TT_Q6_KG) X(TT_Q8_0) X(TT_Q4_0) X(TT_Q5_0) X(TT_MXFP4G)

/* fp16 elements of a shared-memory token row: 64 and 16 of padding (8-byte fragment loads meet no bank conflicts). */
#define QG_LDB 80

/*
 * Shared-memory layout of one (type, shape), with what each thread copies
 * and reads: the token tiles (ring of QG_AHEAD + 1), the raw units (a ring
 * deep enough that the unit being refilled is never one still in flight or
 * being decoded) and two units' tables of scales. A unit's bytes are
 * copied as the CH 16-byte aligned words covering them, the unit starting
 * at its global address modulo 16. Fragment loads read the same offset in
 * 8 rows at once: a row's slot (RAW) is an odd number of 16-byte words and
 * a row's table TS = TAB + 2 words, so those rows fall in distinct banks
 * (at 10 words and 16, each load was two or four wavefronts: ncu counted
 * 42-48 % of the kernel's shared-memory wavefronts as excess).
 */
template <int TY, class C>
struct qg_smem {
	using T = qg_type<TY>;
	static constexpr int SUB = T::UNIT / 64;
	static constexpr int BR = QG_AHEAD + 1;
	static constexpr int RR = (C::RAW_AHEAD + SUB - 1) / SUB + 1;
	static_assert(C::RAW_AHEAD > QG_AHEAD, "a unit arrives a sub-step before its first token tile");
	static constexpr int CH = (T::BYTES + 15 + 15) / 16, RAW = 16 * (CH | 1);
	static constexpr int TS = T::TAB > 0 ? T::TAB + 2 : 0;
	static constexpr size_t B_OFF = 0;
	static constexpr size_t R_OFF = B_OFF + (size_t)BR * C::BN * QG_LDB * sizeof(__half);
	static constexpr size_t T_OFF = R_OFF + (size_t)RR * C::BM * RAW;
	static constexpr size_t BYTES = T_OFF + (size_t)2 * C::BM * TS * sizeof(uint32_t);
	/* copies and table entries of each thread */
	static constexpr int XC = (C::BN * 8 + C::THREADS - 1) / C::THREADS;
	static constexpr int WC = (C::BM * CH + C::THREADS - 1) / C::THREADS;
	static constexpr int TC = (C::BM + C::THREADS - 1) / C::THREADS;
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

/*
 * What a thread copies, decodes and tabulates, worked out once: the
 * source (at the block's first sub-step), shared-memory destination (in
 * the rings' first slot) and size of its token-tile copies; the rows,
 * destinations and 16-byte words of its raw copies; the shared-memory
 * rows (and their global alignment) of its fragments and table entries.
 */
template <int TY, class C>
struct qg_plan {
	using L = qg_smem<TY, C>;
	const __half *xsrc[L::XC];
	uint32_t xdst[L::XC];
	int xbytes[L::XC];
	const uint8_t *wrow[L::WC]; /* Q6_KG: where the copy reads in the row's first group */
	uint32_t wdst[L::WC];
	int wword[L::WC];           /* the copy's word in its row's slot; -1: no copy */
	int frow[C::MT][2], f15[C::MT][2];
	int trow[L::TC], t15[L::TC];

	__device__ __forceinline__ void
	init(const struct qg_args &a, uint32_t sbase, int m0, int n0, int wm0, int s0)
	{
		int lane = threadIdx.x % WARP;

#pragma unroll
		for (int j = 0; j < L::XC; j++) {
			int i = threadIdx.x + j * C::THREADS, r = (i / 8) % C::BN, c = i % 8;

			xsrc[j] = a.xh + (size_t)min(n0 + r, a.n_tok - 1) * a.k + (size_t)s0 * 64 + 8 * c;
			xdst[j] = sbase + L::B_OFF + (uint32_t)(r * QG_LDB + 8 * c) * sizeof(__half);
			xbytes[j] = i < C::BN * 8 && n0 + r < a.n_tok ? 16 : 0;
		}
#pragma unroll
		for (int j = 0; j < L::WC; j++) {
			int i = threadIdx.x + j * C::THREADS, r = (i / L::CH) % C::BM;

			wrow[j] = a.w + (size_t)min(m0 + r, a.n_rows - 1) * a.row_bytes;
			wdst[j] = sbase + L::R_OFF + (uint32_t)(r * L::RAW + 16 * (i % L::CH));
			wword[j] = i < C::BM * L::CH ? 16 * (i % L::CH) : -1;
			if constexpr (TY == TT_Q6_KG) /* body words from the row's first body, word Q6G_BODY its d's */
				wrow[j] += wword[j] >= 0 && wword[j] < Q6G_BODY ? 16 + wword[j] : 0;
			if constexpr (TY == TT_MXFP4G) /* quant words from the row's first quants, word 32 its scales */
				wrow[j] += wword[j] >= 0 && wword[j] < 32 ? 16 + wword[j] : 0;
		}
#pragma unroll
		for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				int r = wm0 + 16 * mt + lane / 4 + 8 * h;

				frow[mt][h] = r;
				f15[mt][h] = (int)((uintptr_t)(a.w + (size_t)min(m0 + r, a.n_rows - 1) * a.row_bytes) & 15);
			}
#pragma unroll
		for (int j = 0; j < L::TC; j++) {
			int r = threadIdx.x + j * C::THREADS;

			trow[j] = r < C::BM && L::TS > 0 ? r : -1;
			t15[j] = (int)((uintptr_t)(a.w + (size_t)min(m0 + r % C::BM, a.n_rows - 1) * a.row_bytes) & 15);
		}
	}
};

/* Queues the copy of the tokens' fp16 tile of sub-step g of this block's K range (g < S). */
template <int TY, class C>
static __device__ __forceinline__ void
qg_issue_x(const qg_plan<TY, C> &pl, int g, int S)
{
	using L = qg_smem<TY, C>;
	uint32_t slot = (uint32_t)(g % L::BR) * C::BN * QG_LDB * sizeof(__half);

	if (g >= S)
		return;
#pragma unroll
	for (int j = 0; j < L::XC; j++)
		if (L::XC * C::THREADS == C::BN * 8 || threadIdx.x + j * C::THREADS < C::BN * 8)
			cp_async_zfill_at<16>(pl.xdst[j] + slot, pl.xsrc[j] + (size_t)g * 64, pl.xbytes[j]);
}

/*
 * Queues the copy of the raw unit that sub-step g starts, if it starts one
 * (g < S). Q6_KG has a branch of its own: one address function for every
 * type, the flat types' arithmetic the same but in another order, made
 * ptxas schedule the Q4_K kernel of 16 tokens 10-14 % slower (H100, ncu).
 */
template <int TY, class C>
static __device__ __forceinline__ void
qg_issue_w(const qg_plan<TY, C> &pl, int s0, int g, int S)
{
	using L = qg_smem<TY, C>;
	uint32_t slot = (uint32_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
	size_t unit = (size_t)((s0 + g) / L::SUB) * L::T::BYTES;

	if (g >= S || g % L::SUB != 0)
		return;
#pragma unroll
	for (int j = 0; j < L::WC; j++) {
		int word = pl.wword[j];

		if constexpr (TY == TT_Q6_KG) {
			int u = (s0 + g) / L::SUB;

			if (word >= 0 && word <= Q6G_BODY)
				cp_async16_at(pl.wdst[j] + slot,
				    pl.wrow[j] + (size_t)(u >> 3) * Q6G_GROUP + (word < Q6G_BODY ? Q6G_BODY * (u & 7) : 0));
		} else if constexpr (TY == TT_MXFP4G) {
			int u = (s0 + g) / L::SUB;

			if (word >= 0 && word <= 32)
				cp_async16_at(pl.wdst[j] + slot,
				    pl.wrow[j] + (size_t)(u >> 2) * MX4G_GROUP + (word < 32 ? 32 * (u & 3) : 0));
		} else {
			uintptr_t p = (uintptr_t)(pl.wrow[j] + unit);

			if (word >= 0 && word < (int)(p & 15) + L::T::BYTES)
				cp_async16_at(pl.wdst[j] + slot, (const void *)((p & ~(uintptr_t)15) + word));
		}
	}
}

/* Fills the table of scales of the unit sub-step g starts (in shared memory by now), if the type has one. */
template <int TY, class C>
static __device__ __forceinline__ void
qg_table(const qg_plan<TY, C> &pl, unsigned char *smem, int s0, int g)
{
	using L = qg_smem<TY, C>;
	constexpr int TS = L::TS;
	const uint8_t *raw = smem + L::R_OFF + (size_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
	uint32_t *tab = (uint32_t *)(smem + L::T_OFF) + (size_t)((g / L::SUB) & 1) * C::BM * TS;
	int ub = (int)(((size_t)((s0 + g) / L::SUB) * L::T::BYTES) & 15);

	if constexpr (TS > 0) {
#pragma unroll
		for (int j = 0; j < L::TC; j++) {
			int r = pl.trow[j];

			if (r >= 0)
				L::T::table(raw + r * L::RAW + ((pl.t15[j] + ub) & 15), (s0 + g) / L::SUB, tab + r * TS);
		}
	}
}

/*
 * Sub-step g's products of one warp: its rows' A fragments decoded from
 * the raw unit, then for each k16 step the tokens' B fragments (8-byte
 * loads) and the mma.sync of every (m16, n8) tile.
 */
template <int TY, class C>
static __device__ __forceinline__ void
qg_step(const qg_plan<TY, C> &pl, unsigned char *smem, int s0, int g, int wn0, float (&acc)[C::MT][C::NT][4])
{
	using L = qg_smem<TY, C>;
	constexpr int TS = L::TS;
	const uint8_t *raw = smem + L::R_OFF + (size_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
	const uint32_t *tab = (const uint32_t *)(smem + L::T_OFF) + (size_t)((g / L::SUB) & 1) * C::BM * TS;
	const __half *bs = (const __half *)(smem + L::B_OFF) + (size_t)(g % L::BR) * C::BN * QG_LDB;
	int lane = threadIdx.x % WARP, t = lane % 4, part = g % L::SUB;
	int ub = (int)(((size_t)((s0 + g) / L::SUB) * L::T::BYTES) & 15);
	uint32_t fr[C::MT][2][4][2];

#pragma unroll
	for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int r = pl.frow[mt][h];

			L::T::frags(raw + r * L::RAW + ((pl.f15[mt][h] + ub) & 15), tab + r * TS, part, t, fr[mt][h]);
		}
#pragma unroll
	for (int kk = 0; kk < 4; kk++)
#pragma unroll
		for (int nt = 0; nt < C::NT; nt++) {
			uint2 bv = *(const uint2 *)(bs + (wn0 + 8 * nt + lane / 4) * QG_LDB + 16 * kk + 4 * t);
			uint32_t b[2] = { bv.x, bv.y };

#pragma unroll
			for (int mt = 0; mt < C::MT; mt++) {
				uint32_t af[4] = { fr[mt][0][kk][0], fr[mt][1][kk][0], fr[mt][0][kk][1], fr[mt][1][kk][1] };

				mma16816(acc[mt][nt], af, b);
			}
		}
}

/*
 * A warp's sums into the outputs (scaled back by each token's scale) or,
 * for split z of a split K, into the partial sums. Each row's destination
 * is worked out once, not at every token: the per-value form was an
 * eighth of the prefill launch's stall samples (ncu, H200).
 */
template <class C>
static __device__ __forceinline__ void
qg_store(const struct qg_args &a, const float (&acc)[C::MT][C::NT][4], int r0, int t0, int z)
{
	int lane = threadIdx.x % WARP, gq = lane / 4, tq = 2 * (lane % 4);
	float sc[C::NT][2];

#pragma unroll
	for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
		for (int j = 0; j < 2; j++) {
			int tok = t0 + 8 * nt + tq + j;

			sc[nt][j] = a.part == NULL && tok < a.n_tok ? a.xscale[tok] : 1.0f;
		}
#pragma unroll
	for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int row = r0 + 16 * mt + gq + 8 * h, ld = a.n_rows;
			float *y;

			if (row >= a.n_rows)
				continue;
			y = a.part != NULL ? a.part + (size_t)z * a.n_tok * a.n_rows + row : mm_row(a.out, row, &ld);
#pragma unroll
			for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
				for (int j = 0; j < 2; j++) {
					int tok = t0 + 8 * nt + tq + j;

					if (tok < a.n_tok)
						y[(size_t)tok * ld] = acc[mt][nt][2 * h + j] * sc[nt][j];
				}
		}
}

/*
 * One block's tile: rows m0.., tokens n0.., split z of nz of K's units.
 * Pipeline, per sub-step g: wait for token tile g (the raw unit of g + 1
 * was queued earlier still) and the barrier; queue token tile g + QG_AHEAD
 * and the raw unit of g + RAW_AHEAD in one group; if g + 1 starts a unit,
 * make its table of scales (seen after the next barrier); then decode and
 * multiply g.
 */
template <int TY, class C>
static __device__ __forceinline__ void
qgemm_tile(const struct qg_args &a, int m0, int n0, int z, int nz)
{
	using L = qg_smem<TY, C>;
	extern __shared__ __align__(16) unsigned char smem[];
	int units = a.k / L::T::UNIT;
	int u0 = (int)((int64_t)units * z / nz);
	int u1 = (int)((int64_t)units * (z + 1) / nz);
	int s0 = u0 * L::SUB, S = (u1 - u0) * L::SUB;
	int warp = threadIdx.x / WARP;
	int wm0 = (warp / C::WN) * (C::BM / C::WM), wn0 = (warp % C::WN) * (C::BN / C::WN);
	qg_plan<TY, C> pl;
	float acc[C::MT][C::NT][4];

	pl.init(a, smem_addr(smem), m0, n0, wm0, s0);
#pragma unroll
	for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
		for (int nt = 0; nt < C::NT; nt++)
			acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
	/*
	 * group 0: the first RAW_AHEAD sub-steps' raw units and token tile 0;
	 * groups 1 .. QG_AHEAD-1: tiles. The weights are no earlier kernel's
	 * output: their copies start while that kernel ends (pdl_wait).
	 */
	for (int g = 0; g < C::RAW_AHEAD; g++)
		qg_issue_w<TY, C>(pl, s0, g, S);
	pdl_wait();
	pdl_trigger();
	for (int g = 0; g < QG_AHEAD; g++) {
		qg_issue_x<TY, C>(pl, g, S);
		cp_async_commit();
	}
	cp_async_wait<QG_AHEAD - 1>();
	__syncthreads();
	if (S > 0)
		qg_table<TY, C>(pl, smem, s0, 0);
	for (int g = 0; g < S; g++) {
		/* token tile g (queued QG_AHEAD iterations ago) and the raw unit of g + 1 (earlier) are in */
		cp_async_wait<QG_AHEAD - 1>();
		__syncthreads();
		qg_issue_x<TY, C>(pl, g + QG_AHEAD, S);
		qg_issue_w<TY, C>(pl, s0, g + C::RAW_AHEAD, S);
		cp_async_commit();
		if (g + 1 < S && (g + 1) % L::SUB == 0)
			qg_table<TY, C>(pl, smem, s0, g + 1);
		qg_step<TY, C>(pl, smem, s0, g, wn0, acc);
	}
	cp_async_wait<0>();

	qg_store<C>(a, acc, m0 + wm0, n0 + wn0, z);
}

/* Block (blockIdx.x: BM rows, blockIdx.y: BN tokens, blockIdx.z: a split of K's units). */
template <int TY, class C>
__global__ void __launch_bounds__(C::THREADS)
qgemm_kernel(struct qg_args a)
{
	qgemm_tile<TY, C>(a, blockIdx.x * C::BM, blockIdx.y * C::BN, blockIdx.z, gridDim.z);
}

/*
 * Block (blockIdx.x: BM rows, blockIdx.y: tile) of the grouped products
 * (cuda_qgemm_grouped): the tile's expert's rows by its rows of the
 * grouped tokens, into the same rows of the outputs. The tiles are the
 * step's routing: read after pdl_wait, so the weights' first copies wait
 * too. Blocks past the step's tiles end there.
 */
template <int TY, class C>
__global__ void __launch_bounds__(C::THREADS)
qgemm_grouped_kernel(struct qg_args a, const int32_t *__restrict__ tiles, size_t stride)
{
	pdl_wait();
	if ((int)blockIdx.y >= tiles[0]) {
		pdl_trigger();
		return;
	}
	const int32_t *tl = tiles + 1 + 3 * blockIdx.y;
	int r0 = tl[1];

	a.w += (size_t)tl[0] * stride;
	a.xh += (size_t)r0 * a.k;
	a.xscale += r0;
	a.n_tok = tl[2];
#pragma unroll
	for (int i = 0; i < MM_MAX_OUT; i++)
		if (i < a.out.n)
			a.out.y[i] += (size_t)r0 * a.out.ldy[i];
	qgemm_tile<TY, C>(a, blockIdx.x * C::BM, 0, 0, 1);
}

/* The split sums of (token, row) added in split order, scaled back, stored. */
__global__ void
qg_reduce_kernel(const float *__restrict__ part, int n_split, int n_tok, int n_rows,
    const float *__restrict__ xscale, struct mm_out out)
{
	pdl_wait();
	pdl_trigger();
	int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	int tok = (int)(i / n_rows), row = (int)(i % n_rows);
	float s = 0.0f;

	if (i >= (int64_t)n_tok * n_rows)
		return;
	for (int z = 0; z < n_split; z++)
		s += part[((size_t)z * n_tok + tok) * n_rows + row];
	mm_store(out, row, tok, s * xscale[tok]);
}

/*
 * The wgmma form (sm_90a), for the types in QW_TYPES: a block of BM = 128
 * rows by BN tokens as two consumer warpgroups of 64 rows and two producer
 * warps. The producers' copy engine brings each unit of the block's rows
 * (a box of the weight's bytes) and each sub-step's token tile (a box of
 * the fp16 tokens, swizzled as wgmma reads it) into rings of shared
 * memory, each slot completing on an mbarrier; a consumer warp decodes
 * its 16 rows' A fragments from the unit (qg_type's frags, as the
 * mma.sync form) into registers and its warpgroup multiplies them with
 * the tile by wgmma, the tensor cores reading the tile themselves. The
 * operands arrive through the asynchronous proxy, so no proxy fence sits
 * in the loop (the fence that sank the 2026-11-28 wgmma forms, which
 * copied by cp.async). A warpgroup issues a sub-step's products, decodes
 * the next one into a second register set and waits for the products
 * before the token slot is freed; the other warpgroup's products fill
 * that time (ptxas orders most of the decoding after the wait).
 * Accumulators are mma.sync's C fragments, so qg_store and the split sums
 * serve both forms.
 */
#define QW_TYPES(X) X(TT_Q4_K) X(TT_Q5_K) X(TT_Q6_KG)

/* qw_has<TY>::value: the wgmma form is built for type TY (units of a K-type super-block, 256). */
template <int TY> struct qw_has : std::false_type {};
#define QW_HAS(TY) \
	template <> struct qw_has<TY> : std::true_type { \
		static_assert(qg_type<TY>::UNIT == 256, "the form's types share one unit"); \
	};
QW_TYPES(QW_HAS)
#undef QW_HAS

/*
 * A unit as the copy engine brings it: a box of BODY bytes a row from
 * column body(u) of the weight's bytes and, for Q6_KG, a box of the 16
 * bytes of its group's d's from head(u), stored after the bodies.
 */
template <int TY>
struct qw_unit {
	static constexpr int BODY = qg_type<TY>::BYTES, HEAD = 0;
	static __device__ __forceinline__ int body(int u) { return u * BODY; }
	static __device__ __forceinline__ int head(int) { return 0; }
	static __device__ __forceinline__ void
	table(const uint8_t *b, const uint8_t *, int u, uint32_t *tab)
	{
		qg_type<TY>::table(b, u, tab);
	}
};

template <>
struct qw_unit<TT_Q6_KG> {
	static constexpr int BODY = Q6G_BODY, HEAD = 16;
	static __device__ __forceinline__ int body(int u) { return (u >> 3) * Q6G_GROUP + 16 + Q6G_BODY * (u & 7); }
	static __device__ __forceinline__ int head(int u) { return (u >> 3) * Q6G_GROUP; }
	static __device__ __forceinline__ void
	table(const uint8_t *b, const uint8_t *hd, int u, uint32_t *tab)
	{
		qg_type<TT_Q6_KG>::table_d(b, hd + 2 * (u & 7), tab);
	}
};

template <int BN_>
struct qw_cfg {
	static constexpr int BM = 128, BN = BN_, MT = 1, NT = BN / 8;
	static constexpr int XS = 4;               /* token tiles in the ring */
	static constexpr int WS = 4;               /* weight units in the ring */
	static constexpr int THREADS = 10 * WARP;  /* warpgroups 0 and 1 consume, warps 8 and 9 produce */
	static constexpr int LDT = BM + 4;         /* floats from a token's row to the next in a split's sums */
};

/* Shared memory of type TY, shape C: the token ring (1024-byte aligned slots), the unit ring, the barriers. */
template <int TY, class C>
struct qw_smem {
	static constexpr int X_BYTES = C::BN * 64 * (int)sizeof(__half);
	static constexpr int W_BODY = C::BM * qw_unit<TY>::BODY;
	static constexpr int W_BYTES = W_BODY + C::BM * qw_unit<TY>::HEAD;
	static constexpr int W_OFF = C::XS * X_BYTES;
	static constexpr int BAR_OFF = (W_OFF + C::WS * W_BYTES + 7) & ~7;
	static constexpr int BYTES = BAR_OFF + 16 * (C::XS + C::WS) + 1024; /* + the base's alignment */
	static_assert(X_BYTES % 1024 == 0 && W_BODY % 128 == 0 && W_BYTES % 128 == 0,
	    "copy-engine boxes keep their slots' alignment");
};

/* Barriers: full and empty for each token slot, then for each unit slot. */
struct qw_bars {
	uint32_t xfull, xempty, wfull, wempty;
};

/*
 * The producers, one lane each, so that neither ring waits on the other:
 * warp 9 the weights' units (the first before pdl_wait: no kernel of the
 * step writes them), warp 8 the token tiles.
 */
template <int TY, class C>
static __device__ __forceinline__ void
qw_produce_w(const CUtensorMap *wmap, const CUtensorMap *hmap, uint32_t base, qw_bars br, int u0, int U, int m0)
{
	using L = qw_smem<TY, C>;
	using W = qw_unit<TY>;

	for (int u = 0; u < U; u++) {
		int ws = u % C::WS;
		uint32_t slot = base + L::W_OFF + ws * L::W_BYTES;

		if (u >= C::WS)
			mbar_wait(br.wempty + 8 * ws, ((u / C::WS) & 1) ^ 1);
		mbar_expect(br.wfull + 8 * ws, L::W_BYTES);
		tma_2d(slot, wmap, W::body(u0 + u), m0, br.wfull + 8 * ws);
		if constexpr (W::HEAD > 0)
			tma_2d(slot + L::W_BODY, hmap, W::head(u0 + u), m0, br.wfull + 8 * ws);
	}
}

template <int TY, class C>
static __device__ __forceinline__ void
qw_produce_x(const CUtensorMap *xmap, uint32_t base, qw_bars br, int u0, int U, int n0)
{
	using L = qw_smem<TY, C>;
	constexpr int SUB = qg_type<TY>::UNIT / 64;

	for (int g = 0; g < U * SUB; g++) {
		int s = g % C::XS;

		mbar_wait(br.xempty + 8 * s, ((g / C::XS) & 1) ^ 1);
		mbar_expect(br.xfull + 8 * s, L::X_BYTES);
		tma_2d(base + s * L::X_BYTES, xmap, (u0 * SUB + g) * 64, n0, br.xfull + 8 * s);
	}
}

/* A consumer warp's view of one unit in its slot: its two rows' bytes and their tables of scales. */
template <int TY, class C>
struct qw_rows {
	using L = qw_smem<TY, C>;
	using W = qw_unit<TY>;
	static constexpr int TN = qg_type<TY>::TAB > 0 ? qg_type<TY>::TAB : 1;
	const uint8_t *b0, *b1;
	uint32_t tab0[TN], tab1[TN];

	/* Waits for unit u (of the split's U) in its slot and tabulates its scales. */
	__device__ __forceinline__ void
	load(const unsigned char *smem, qw_bars br, int u0, int u, int rr)
	{
		int ws = u % C::WS;
		const uint8_t *h0 = smem + L::W_OFF + ws * L::W_BYTES + L::W_BODY + rr * W::HEAD;

		b0 = smem + L::W_OFF + ws * L::W_BYTES + rr * W::BODY, b1 = b0 + 8 * W::BODY;
		mbar_wait(br.wfull + 8 * ws, (u / C::WS) & 1);
		W::table(b0, h0, u0 + u, tab0);
		W::table(b1, h0 + 8 * W::HEAD, u0 + u, tab1);
	}

	/* The A fragments (wgmma's register order) of sub-step p of the unit. */
	__device__ __forceinline__ void
	decode(int p, int t, uint32_t (&fa)[4][4]) const
	{
		uint32_t f0[4][2], f1[4][2];

		qg_type<TY>::template frags<true>(b0, tab0, p, t, f0);
		qg_type<TY>::template frags<true>(b1, tab1, p, t, f1);
#pragma unroll
		for (int kk = 0; kk < 4; kk++)
			fa[kk][0] = f0[kk][0], fa[kk][1] = f1[kk][0], fa[kk][2] = f0[kk][1], fa[kk][3] = f1[kk][1];
	}
};

/*
 * A consumer warp: its 16 rows (rows rr and rr + 8 for its lane) by the
 * block's tokens, over units u0... The next sub-step's fragments are
 * decoded into the other of two register sets once this one's products
 * are issued (ptxas keeps only the decoding's loads ahead of the wait for
 * them; the rest ahead too measured no faster, RESULTS 2026-11-29); a
 * unit's slot is freed once its last sub-step is decoded.
 */
template <int TY, class C>
static __device__ __forceinline__ void
qw_consume(const unsigned char *smem, uint32_t base, qw_bars br, int u0, int U, int rr, float (&acc)[1][C::NT][4])
{
	using L = qw_smem<TY, C>;
	constexpr int SUB = qg_type<TY>::UNIT / 64;
	static_assert(SUB % 2 == 0, "a unit's sub-steps alternate the two register sets");
	int lane = threadIdx.x % WARP, t = lane % 4;
	qw_rows<TY, C> rw;
	uint32_t fa[2][4][4];

	rw.load(smem, br, u0, 0, rr);
	rw.decode(0, t, fa[0]);
	for (int u = 0; u < U; u++) {
#pragma unroll
		for (int p = 0; p < SUB; p++) {
			int g = u * SUB + p, s = g % C::XS;

			mbar_wait(br.xfull + 8 * s, (g / C::XS) & 1);
			wg_hold(acc[0]);
			wg_fence();
#pragma unroll
			for (int kk = 0; kk < 4; kk++)
				wg_mma(acc[0], fa[p & 1][kk], wg_desc_sw128(base + s * L::X_BYTES + 32 * kk));
			wg_commit();
			if (p + 1 < SUB) {
				rw.decode(p + 1, t, fa[(p + 1) & 1]);
			} else {
				__syncwarp();
				if (lane == 0)
					mbar_arrive(br.wempty + 8 * (u % C::WS));
				if (u + 1 < U) {
					rw.load(smem, br, u0, u + 1, rr);
					rw.decode(0, t, fa[0]);
				}
			}
			wg_wait<0>();
			wg_hold(acc[0]);
			wg_hold(fa[p & 1]);
			__syncwarp();
			if (lane == 0)
				mbar_arrive(br.xempty + 8 * s);
		}
	}
}

#if WG_ARCH
/* A consumer warp's sums (rows rr.. of the tile) into the split's tile t. */
template <class C>
static __device__ __forceinline__ void
qw_part(float *t, const float (&acc)[1][C::NT][4], int rr)
{
	int lane = threadIdx.x % WARP, row = rr + lane / 4, tq = 2 * (lane % 4);

#pragma unroll
	for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			t[(8 * nt + tq + i % 2) * C::LDT + row + 8 * (i / 2)] = acc[0][nt][i];
}

/*
 * The tile's sums over the cluster's nz splits (blockIdx.z, the block's
 * rank in its cluster), read from each block's shared memory in split
 * order, scaled back and stored: block c the c-th nz-th of the tile's
 * groups of four rows. The same sums, bit for bit, as qg_reduce_kernel's,
 * with no launch and no trip through L2.
 */
template <class C>
static __device__ __forceinline__ void
qw_cluster_sum(const struct qg_args &a, const float *t, int m0, int n0, int nz)
{
	constexpr int G = C::BN * C::BM / 4;
	int c = (int)cluster_rank();

	cluster_sync();
	for (int g = G * c / nz + threadIdx.x; g < G * (c + 1) / nz; g += C::THREADS) {
		int tok = g / (C::BM / 4), r = 4 * (g % (C::BM / 4));
		const float4 *p = (const float4 *)(t + tok * C::LDT + r);
		float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f), v[QG_MAX_SPLIT];

		if (n0 + tok >= a.n_tok)
			continue;
#pragma unroll
		for (int z = 0; z < QG_MAX_SPLIT; z++) /* every split's load in flight before the first sum */
			if (z < nz)
				v[z] = cluster_ld4(p, (unsigned)z);
#pragma unroll
		for (int z = 0; z < QG_MAX_SPLIT; z++)
			if (z < nz)
				s.x += v[z].x, s.y += v[z].y, s.z += v[z].z, s.w += v[z].w;
		float sc = a.xscale[n0 + tok], f[4] = { s.x, s.y, s.z, s.w };

#pragma unroll
		for (int i = 0; i < 4; i++)
			if (m0 + r + i < a.n_rows)
				mm_store(a.out, m0 + r + i, n0 + tok, f[i] * sc);
	}
	cluster_sync(); /* no block leaves while another may still read its sums */
}
#endif

/*
 * Block (blockIdx.x: BM rows, blockIdx.y: BN tokens, blockIdx.z: a split
 * of K's units). A split launch whose tiles are clusters (a.part NULL)
 * adds each tile's splits in the cluster; otherwise they go to a.part.
 */
template <int TY, class C>
__global__ void __launch_bounds__(C::THREADS, 1)
qw_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
    const __grid_constant__ CUtensorMap hmap, struct qg_args a)
{
#if WG_ARCH
	using L = qw_smem<TY, C>;
	static_assert(C::BN * C::LDT * sizeof(float) <= L::BAR_OFF, "a split's sums fit below the barriers");
	extern __shared__ __align__(16) unsigned char qw_raw[];
	uint32_t raw = smem_addr(qw_raw), base = (raw + 1023) & ~1023u;
	const unsigned char *smem = qw_raw + (base - raw);
	int warp = threadIdx.x / WARP, units = a.k / qg_type<TY>::UNIT, z = blockIdx.z, nz = gridDim.z;
	int u0 = (int)((int64_t)units * z / nz), U = (int)((int64_t)units * (z + 1) / nz) - u0;
	int m0 = blockIdx.x * C::BM, n0 = blockIdx.y * C::BN;
	qw_bars br;

	br.xfull = base + L::BAR_OFF, br.xempty = br.xfull + 8 * C::XS;
	br.wfull = br.xempty + 8 * C::XS, br.wempty = br.wfull + 8 * C::WS;
	if (threadIdx.x == 0) {
		for (int i = 0; i < C::XS; i++)
			mbar_init(br.xfull + 8 * i, 1), mbar_init(br.xempty + 8 * i, 8);
		for (int i = 0; i < C::WS; i++)
			mbar_init(br.wfull + 8 * i, 1), mbar_init(br.wempty + 8 * i, 8);
		mbar_init_fence();
	}
	__syncthreads();
	if (warp >= 8) {
		if (warp == 9 && threadIdx.x % WARP == 0)
			qw_produce_w<TY, C>(&wmap, &hmap, base, br, u0, U, m0);
		pdl_wait();
		pdl_trigger();
		if (warp == 8 && threadIdx.x % WARP == 0)
			qw_produce_x<TY, C>(&xmap, base, br, u0, U, n0);
		if (nz == 1 || a.part != NULL)
			return;
		__syncwarp(); /* the producing lane rejoins its warp before the cluster's aligned barriers */
	} else {
		float acc[1][C::NT][4];
		int rr = 64 * (warp / 4) + 16 * (warp % 4);

#pragma unroll
		for (int j = 0; j < C::NT; j++)
			acc[0][j][0] = acc[0][j][1] = acc[0][j][2] = acc[0][j][3] = 0.0f;
		pdl_wait();
		pdl_trigger();
		qw_consume<TY, C>(smem, base, br, u0, U, rr + (threadIdx.x % WARP) / 4, acc);
		if (nz == 1 || a.part != NULL) {
			qg_store<C>(a, acc, m0 + rr, n0, z);
			return;
		}
		/* the rings are done with once every consumer is: the split's sums go where they were */
		asm volatile("bar.sync 1, 256;" ::: "memory");
		qw_part<C>((float *)smem, acc, rr);
	}
	qw_cluster_sum<C>(a, (const float *)smem, m0, n0, nz);
#endif
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

/*
 * A form of qgemm at one shape: its configuration (Cfg), its blocks a
 * multiprocessor, its launch of a grid, and whether a product's last
 * partial wave may go to a second, split launch (qg_launch). This one is
 * the mma.sync form; qw_form (below) the wgmma form.
 */
template <int TY, class C>
struct qg_sync {
	using Cfg = C;
	/* the decode shapes keep one launch: forms that split their last wave cost batched decoding 1-3 % */
	static constexpr bool SPLIT_REST = C::BN == qg_c128::BN;
	/* split sums go through m->part and qg_reduce_kernel */
	static int
	cluster_sum(const struct cuda_mm *, dim3)
	{
		return 0;
	}
	static int
	per_sm(void)
	{
		return qg_per_sm<TY, C>();
	}
	static int
	launch(struct cuda_mm *m, dim3 grid, const struct qg_args &a, char *err)
	{
		CK(cuda_launch(qgemm_kernel<TY, C>, grid, dim3(C::THREADS), qg_smem<TY, C>::BYTES, m->stream, a));
		return 0;
	}
};

/* The splits of K of a's grid in form F. */
template <int TY, class F>
static int
qg_split_of(const struct cuda_mm *m, const struct qg_args &a)
{
	using C = typename F::Cfg;
	int64_t tiles = (int64_t)((a.n_rows + C::BM - 1) / C::BM) * ((a.n_tok + C::BN - 1) / C::BN);

	return qg_splits(m, tiles, F::per_sm(), a.k / qg_type<TY>::UNIT, (int64_t)a.n_tok * a.n_rows);
}

/* One launch in form F, K split in `split`, and the reduction of the splits. */
template <class F>
static int
qg_grid(struct cuda_mm *m, struct qg_args a, int split, char *err)
{
	using C = typename F::Cfg;
	dim3 grid((unsigned)((a.n_rows + C::BM - 1) / C::BM), (unsigned)((a.n_tok + C::BN - 1) / C::BN),
	    (unsigned)split);
	int rc;

	a.part = split > 1 && !F::cluster_sum(m, grid) ? m->part : NULL;
	if ((rc = F::launch(m, grid, a, err)) != 0 || a.part == NULL)
		return rc;
	int64_t n = (int64_t)a.n_tok * a.n_rows;
	CK(cuda_launch(qg_reduce_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, m->stream, m->part,
	    split, a.n_tok, a.n_rows, a.xscale, a.out));
	return 0;
}

/* 1 in the sm_90a code, where qw_kernel is built; 0 in the others. */
__device__ int qw_built = WG_ARCH;

/* The driver's tensor-map encoder, found by cuda_qgemm_wg_device; NULL: the wgmma form is not used. */
static PFN_cuTensorMapEncodeTiled_v12000 qw_encode;

/* A 2-D tensor map: rows of `inner` elements `stride` bytes apart, boxes of box0 x box1. */
static int
qw_map(CUtensorMap *map, CUtensorMapDataType ty, const void *p, uint64_t inner, uint64_t rows, uint64_t stride,
    uint32_t box0, uint32_t box1, CUtensorMapSwizzle sw, char *err)
{
	cuuint64_t dim[2] = { inner, rows }, str[1] = { stride };
	cuuint32_t box[2] = { box0, box1 }, es[2] = { 1, 1 };
	CUresult r = qw_encode(map, ty, 2, (void *)p, dim, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
	    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);

	return r == CUDA_SUCCESS ? 0 : err_set(err, ERR_DEVICE, "tensor map of %llu x %llu: driver error %d",
	    (unsigned long long)inner, (unsigned long long)rows, (int)r);
}

/*
 * The wgmma form of shape C: one block a multiprocessor, a tile's splits
 * one cluster; each launch makes its operands' tensor maps.
 */
template <int TY, class C>
struct qw_form {
	using Cfg = C;
	static constexpr bool SPLIT_REST = C::BN == 128;
	/* where a launch's clusters all run at once: a second wave of them costs more than the reduction's launch */
	static int
	cluster_sum(const struct cuda_mm *m, dim3 grid)
	{
		return (int)grid.z <= m->wg_cluster && (int)(grid.x * grid.y) <= m->wg_fit[C::BN == 128][grid.z];
	}
	static int
	per_sm(void)
	{
		return 1;
	}
	static int
	launch(struct cuda_mm *m, dim3 grid, const struct qg_args &a, char *err)
	{
		CUtensorMap xmap, wmap, hmap = {};
		int rc;

		if ((rc = qw_map(&xmap, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, a.xh, (uint64_t)a.k, (uint64_t)a.n_tok,
		    (uint64_t)a.k * sizeof(__half), 64, C::BN, CU_TENSOR_MAP_SWIZZLE_128B, err)) != 0 ||
		    (rc = qw_map(&wmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.w, a.row_bytes, (uint64_t)a.n_rows, a.row_bytes,
		    qw_unit<TY>::BODY, C::BM, CU_TENSOR_MAP_SWIZZLE_NONE, err)) != 0 ||
		    (qw_unit<TY>::HEAD > 0 && (rc = qw_map(&hmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.w, a.row_bytes,
		    (uint64_t)a.n_rows, a.row_bytes, qw_unit<TY>::HEAD, C::BM, CU_TENSOR_MAP_SWIZZLE_NONE, err)) != 0))
			return rc;
		CK(cuda_launch_ex(qw_kernel<TY, C>, grid, dim3(C::THREADS), qw_smem<TY, C>::BYTES,
		    dim3(1, 1, a.part == NULL ? grid.z : 1), m->stream, xmap, wmap, hmap, a));
		return 0;
	}
};

int
cuda_qgemm_wg_type(const struct cuda_weight *w)
{
#define QW_IS(TY) w->type == TY ||
	return qw_encode != NULL && (QW_TYPES(QW_IS) false) && w->k % 256 == 0;
#undef QW_IS
}

/* The wgmma form's shared-memory limits. */
static int
qw_setup(char *err)
{
#define QW_CASE(TY) \
	CK(cudaFuncSetAttribute(qw_kernel<TY, qw_cfg<64>>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
	    (int)qw_smem<TY, qw_cfg<64>>::BYTES)); \
	CK(cudaFuncSetAttribute(qw_kernel<TY, qw_cfg<128>>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
	    (int)qw_smem<TY, qw_cfg<128>>::BYTES));
	QW_TYPES(QW_CASE)
#undef QW_CASE
	return 0;
}

/* The clusters of `size` blocks of qw_kernel<TY, C> the device runs at once. */
template <int TY, class C>
static int
qw_fit(int size, int *n, char *err)
{
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute at;

	at.id = cudaLaunchAttributeClusterDimension;
	at.val.clusterDim.x = 1, at.val.clusterDim.y = 1, at.val.clusterDim.z = (unsigned)size;
	cfg.gridDim = dim3(1, 1, (unsigned)size), cfg.blockDim = dim3(C::THREADS);
	cfg.dynamicSmemBytes = qw_smem<TY, C>::BYTES, cfg.attrs = &at, cfg.numAttrs = 1;
	CK(cudaOccupancyMaxActiveClusters(n, qw_kernel<TY, C>, &cfg));
	return 0;
}

/* The fewest over the form's types, which all run a block a multiprocessor. */
int
cuda_qgemm_wg_fit(struct cuda_mm *m, char *err)
{
	int n, rc;

	for (int z = 0; z <= QG_MAX_SPLIT; z++) {
		m->wg_fit[0][z] = m->wg_fit[1][z] = INT_MAX;
		if (z < 2)
			continue;
#define QW_FIT(TY) \
		if ((rc = qw_fit<TY, qw_cfg<64>>(z, &n, err)) != 0) \
			return rc; \
		m->wg_fit[0][z] = MIN(m->wg_fit[0][z], n); \
		if ((rc = qw_fit<TY, qw_cfg<128>>(z, &n, err)) != 0) \
			return rc; \
		m->wg_fit[1][z] = MIN(m->wg_fit[1][z], n);
		QW_TYPES(QW_FIT)
#undef QW_FIT
	}
	return 0;
}

/*
 * The encoder, once found, stays: a load on another device does not take
 * it from an engine that routes to the form (cuda_mm.wg_min says which do).
 */
int
cuda_qgemm_wg_device(int *wg, char *err)
{
	int built = 0;
	cudaDriverEntryPointQueryResult q;
	void *fn = NULL;

	CK(cudaMemcpyFromSymbol(&built, qw_built, sizeof built));
	if (built && qw_encode == NULL &&
	    cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
	    q == cudaDriverEntryPointSuccess)
		qw_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
	*wg = built && qw_encode != NULL;
	return 0;
}

int
cuda_qgemm_wg(const struct cuda_mm *m, const struct cuda_weight *w, int n_tok)
{
	return n_tok >= m->wg_min && w->n * w->k >= m->wg_elems && cuda_qgemm_wg_type(w);
}

/* The outputs of rows row0 and on of out, as rows from 0. */
static struct mm_out
qg_rows_from(const struct mm_out &out, int row0)
{
	struct mm_out s = { { NULL }, { 0 }, { 0 }, 0 };

	for (int i = 0; i < out.n; i++) {
		if (out.start[i + 1] <= row0)
			continue;
		s.y[s.n] = out.y[i] + MAX(row0 - out.start[i], 0);
		s.ldy[s.n] = out.ldy[i];
		s.start[s.n++] = MAX(out.start[i] - row0, 0);
	}
	s.start[s.n] = out.start[out.n] - row0;
	return s;
}

/*
 * A product in form F. When a prefill product's tiles take more than one
 * wave of the GPU's slots and leave a last wave under half full
 * (llama3-8b's gate/up at 512 tokens: 448 tiles on 132 slots, four waves'
 * time for 3.4 of work), the tiles of its last rows, enough to hold that
 * remainder, go to a second launch, which splits their K to fill the GPU;
 * the first launch is at most whole waves. Only where F::SPLIT_REST.
 */
template <int TY, class F>
static int
qg_launch(struct cuda_mm *m, struct qg_args a, char *err)
{
	using C = typename F::Cfg;
	int64_t gx = (a.n_rows + C::BM - 1) / C::BM, gy = (a.n_tok + C::BN - 1) / C::BN;
	int64_t slots = (int64_t)m->sms * F::per_sm(), left = slots > 0 ? gx * gy % slots : 0;
	int64_t r = (left + gy - 1) / gy; /* row tiles of the remainder: 0 for none, gx for a single wave */
	int split, rc;

	if (F::SPLIT_REST && r > 0 && r < gx && 2 * left <= slots) {
		struct qg_args rest = a;
		int row0 = (int)(gx - r) * C::BM;

		rest.w += (size_t)row0 * rest.row_bytes;
		rest.n_rows -= row0;
		rest.out = qg_rows_from(rest.out, row0);
		if ((split = qg_split_of<TY, F>(m, rest)) > 1) {
			a.n_rows = row0;
			if ((rc = qg_grid<F>(m, a, qg_split_of<TY, F>(m, a), err)) != 0)
				return rc;
			return qg_grid<F>(m, rest, split, err);
		}
	}
	return qg_grid<F>(m, a, qg_split_of<TY, F>(m, a), err);
}

/* The wgmma shape for a.n_tok tokens. */
template <int TY>
static int
qw_dispatch(struct cuda_mm *m, const struct qg_args &a, char *err)
{
	return a.n_tok <= 64 ? qg_launch<TY, qw_form<TY, qw_cfg<64>>>(m, a, err) :
	    qg_launch<TY, qw_form<TY, qw_cfg<128>>>(m, a, err);
}

/* The tokens of one tile of the shape for n_tok tokens. */
static int
qg_bn(int n_tok)
{
	return n_tok <= qg_c16::BN ? qg_c16::BN : n_tok <= qg_c32::BN ? qg_c32::BN :
	    n_tok <= qg_c64::BN ? qg_c64::BN : qg_c128::BN;
}

/* The shape for n_tok tokens. */
template <int TY>
static int
qg_dispatch(struct cuda_mm *m, const struct qg_args &a, char *err)
{
	switch (qg_bn(a.n_tok)) {
	case qg_c16::BN: return qg_launch<TY, qg_sync<TY, qg_c16>>(m, a, err);
	case qg_c32::BN: return qg_launch<TY, qg_sync<TY, qg_c32>>(m, a, err);
	case qg_c64::BN: return qg_launch<TY, qg_sync<TY, qg_c64>>(m, a, err);
	default: return qg_launch<TY, qg_sync<TY, qg_c128>>(m, a, err);
	}
}

/* A product of type TY: on the wgmma form where it takes w at this count, else the mma.sync form. */
template <int TY>
static int
qg_product(struct cuda_mm *m, const struct cuda_weight *w, const struct qg_args &a, char *err)
{
	if constexpr (qw_has<TY>::value)
		if (cuda_qgemm_wg(m, w, a.n_tok))
			return qw_dispatch<TY>(m, a, err);
	return qg_dispatch<TY>(m, a, err);
}

int
cuda_qgemm_tokens(int n_tok)
{
	int bn = qg_bn(n_tok);

	return (n_tok + bn - 1) / bn * bn;
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
#define QT_CASE(TY) case TY: return qg_product<TY>(m, w, a, err);
	QG_TYPES(QT_CASE)
#undef QT_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "no tensor-core kernel for weight type %u", w->type);
	}
}

/* The grouped kernel of shape C for type TY over max_tiles tiles. */
template <int TY, class C>
static int
qg_grouped(struct cuda_mm *m, const struct qg_args &a, const int32_t *tiles, int max_tiles, size_t stride, char *err)
{
	dim3 grid((unsigned)((a.n_rows + C::BM - 1) / C::BM), (unsigned)max_tiles);

	CK(cuda_launch(qgemm_grouped_kernel<TY, C>, dim3(grid), dim3(C::THREADS), qg_smem<TY, C>::BYTES, m->stream, a,
	    tiles, stride));
	return 0;
}

/* The grouped kernel of type TY whose tiles are bn tokens. */
template <int TY>
static int
qg_grouped_dispatch(struct cuda_mm *m, const struct qg_args &a, const int32_t *tiles, int max_tiles, int bn,
    size_t stride, char *err)
{
	switch (bn) {
	case qg_c16::BN: return qg_grouped<TY, qg_c16>(m, a, tiles, max_tiles, stride, err);
	case qg_c32::BN: return qg_grouped<TY, qg_c32>(m, a, tiles, max_tiles, stride, err);
	case qg_c64::BN: return qg_grouped<TY, qg_c64>(m, a, tiles, max_tiles, stride, err);
	case qg_c128::BN: return qg_grouped<TY, qg_c128>(m, a, tiles, max_tiles, stride, err);
	default: return err_set(err, ERR_INVAL, "grouped products in tiles of %d tokens", bn);
	}
}

int
cuda_qgemm_grouped_bn(int n_rows, int n_groups)
{
	return qg_bn((n_rows + n_groups - 1) / MAX(n_groups, 1));
}

int
cuda_qgemm_grouped(struct cuda_mm *m, const struct cuda_weight *w, size_t stride, int n_rows, const int32_t *tiles,
    int max_tiles, int bn, const struct mm_out *out, char *err)
{
	struct qg_args a = { w->d, w->row_bytes, (int)w->k, (int)w->n, n_rows, m->xh, m->xscale, *out, NULL };

	switch (w->type) {
#define QT_CASE(TY) case TY: return qg_grouped_dispatch<TY>(m, a, tiles, max_tiles, bn, stride, err);
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
	CK(cudaFuncSetAttribute(qgemm_grouped_kernel<TY, qg_c16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	    (int)qg_smem<TY, qg_c16>::BYTES));
	CK(cudaFuncSetAttribute(qgemm_grouped_kernel<TY, qg_c32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	    (int)qg_smem<TY, qg_c32>::BYTES));
	CK(cudaFuncSetAttribute(qgemm_grouped_kernel<TY, qg_c64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
	    (int)qg_smem<TY, qg_c64>::BYTES));
	CK(cudaFuncSetAttribute(qgemm_grouped_kernel<TY, qg_c128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
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
	return rc != 0 ? rc : qw_setup(err);
}

int64_t
cuda_qgemm_part_elems(int sms)
{
	/* a split grid has at most a multiprocessor's worth of tiles per multiprocessor: BM x 128 of sums */
	return (int64_t)sms * qg_c128::BM * qg_c128::BN;
}
