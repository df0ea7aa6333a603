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
 * wgmma form (qgemm_wg.cu) takes Q4_K, Q5_K and Q6_K from cuda_mm.wg_min
 * tokens. Both forms share the types' decoding, the stores and the plan
 * of a product's launches (qgemm.cuh).
 */
#include "qgemm.cuh"

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

/* Blocks of one shape that fit on a multiprocessor at once, by shared memory (at least 1). */
template <int TY, class C>
static int
qg_per_sm(void)
{
	return MAX(1, (int)((227u * 1024u) / (qg_smem<TY, C>::BYTES + 1024)));
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

int
qg_reduce(struct cuda_mm *m, const struct qg_args &a, int split, char *err)
{
	int64_t n = (int64_t)a.n_tok * a.n_rows;

	CK(cuda_launch(qg_reduce_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, m->stream, m->part,
	    split, a.n_tok, a.n_rows, a.xscale, a.out));
	return 0;
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
cuda_qgemm(struct cuda_mm *m, const struct cuda_weight *w, struct cuda_h16 in, int n_tok, const struct mm_out *out,
    char *err)
{
	struct qg_args a = { w->d, w->row_bytes, (int)w->k, (int)w->n, n_tok, in.h, in.scale, *out, NULL };

	if (cuda_qgemm_wg(m, w, n_tok))
		return qw_product(m, w->type, a, err);
	switch (w->type) {
#define QT_CASE(TY) case TY: return qg_dispatch<TY>(m, a, err);
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
cuda_qgemm_grouped(struct cuda_mm *m, const struct cuda_weight *w, size_t stride, struct cuda_h16 in, int n_rows,
    const int32_t *tiles, int max_tiles, int bn, const struct mm_out *out, char *err)
{
	struct qg_args a = { w->d, w->row_bytes, (int)w->k, (int)w->n, n_rows, in.h, in.scale, *out, NULL };

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
