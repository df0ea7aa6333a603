/*
 * qgemm_wg.cu: qgemm's wgmma form (sm_90a) for Q4_K, Q5_K and Q6_K, from
 * cuda_mm.wg_min tokens: the copy engine brings each unit of a block's
 * weight rows and each sub-step's fp16 token tile into rings of shared
 * memory, two warpgroups decode the units into the same A fragments as
 * the mma.sync form (qgemm.cu), in k order, and multiply them by wgmma,
 * which reads the token tile itself; a tile's splits of K add their sums
 * in their cluster's shared memory where the launch's clusters fit. Its
 * GLU form multiplies gate and up in one tile and stores the down
 * product's input. The types' decoding, the stores and the plan of
 * launches are qgemm.cuh's.
 */
#include "norm.cuh"
#include "qgemm.cuh"
#include "wg.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <limits.h>

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

/* The form's types share the K types' unit of 256. */
#define QW_UNIT(TY) static_assert(qg_type<TY>::UNIT == 256, "the form's types share one unit");
QW_TYPES(QW_UNIT)
#undef QW_UNIT

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

/*
 * A tile of 256 tokens holds 128 accumulators a consumer thread, more than
 * 320 threads' even share of the registers leaves: its block is three
 * warpgroups, the producers' (warps 8 to 11) gives back all but PREGS a
 * thread and the consumers' take CREGS, within the 168 a thread the
 * launch gives 384 threads.
 */
template <int BN_>
struct qw_cfg {
	static constexpr int BM = 128, BN = BN_, MT = 1, NT = BN / 8;
	static constexpr bool WIDE = BN == 256;
	static constexpr int XS = WIDE ? 3 : 4;   /* token tiles in the ring */
	/*
	 * Boxes of 64 of K a sub-step (its token tile): a 64-token sub-step is
	 * held by its waits and round trips more than by its work, and one of
	 * 128 halves them; the 128-token tiles measured even with it, and the
	 * 256-token ones have no registers for it (RESULTS, 2026-11-29).
	 */
	static constexpr int KS = BN == 64 ? 2 : 1;
	static constexpr int WS = 4;               /* weight units in the ring */
	static constexpr int THREADS = (WIDE ? 12 : 10) * WARP; /* warpgroups 0 and 1 consume, warps 8 and 9 produce */
	static constexpr int CREGS = 216, PREGS = 72;
	static constexpr int LDT = BM + 4;         /* floats from a token's row to the next in a split's sums */
	static constexpr int FIT = BN == 64 ? 0 : BN == 128 ? 1 : 2; /* its row of cuda_mm.wg_fit */
	static_assert(!WIDE || 2 * 128 * CREGS + 128 * PREGS <= 65536 / THREADS / 8 * 8 * THREADS,
	    "the consumers take no more than the producers give back");
};

/* Shared memory of type TY, shape C: the token ring (1024-byte aligned slots), the unit ring, the barriers. */
template <int TY, class C>
struct qw_smem {
	static constexpr int X_BOX = C::BN * 64 * (int)sizeof(__half), X_BYTES = C::KS * X_BOX;
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
 * step writes them), warp 8 the token tiles. A unit's rows come as NH
 * boxes of BM / NH rows, box h from row m[h] of the weight (the GLU form:
 * 64 of gate, then the same 64 of up).
 */
template <int TY, class C, int NH>
static __device__ __forceinline__ void
qw_produce_w(const CUtensorMap *wmap, const CUtensorMap *hmap, uint32_t base, qw_bars br, int u0, int U,
    const int (&m)[NH])
{
	using L = qw_smem<TY, C>;
	using W = qw_unit<TY>;
	constexpr int R = C::BM / NH;
	static_assert(R * W::BODY % 128 == 0 && R * W::HEAD % 16 == 0, "each box lands where the copy engine can put it");

	for (int u = 0; u < U; u++) {
		int ws = u % C::WS;
		uint32_t slot = base + L::W_OFF + ws * L::W_BYTES;

		if (u >= C::WS)
			mbar_wait(br.wempty + 8 * ws, ((u / C::WS) & 1) ^ 1);
		mbar_expect(br.wfull + 8 * ws, L::W_BYTES);
#pragma unroll
		for (int h = 0; h < NH; h++) {
			tma_2d(slot + h * R * W::BODY, wmap, W::body(u0 + u), m[h], br.wfull + 8 * ws);
			if constexpr (W::HEAD > 0)
				tma_2d(slot + L::W_BODY + h * R * W::HEAD, hmap, W::head(u0 + u), m[h], br.wfull + 8 * ws);
		}
	}
}

template <int TY, class C>
static __device__ __forceinline__ void
qw_produce_x(const CUtensorMap *xmap, uint32_t base, qw_bars br, int u0, int U, int n0)
{
	using L = qw_smem<TY, C>;
	constexpr int SUB = qg_type<TY>::UNIT / (64 * C::KS);

	for (int g = 0; g < U * SUB; g++) {
		int s = g % C::XS;

		mbar_wait(br.xempty + 8 * s, ((g / C::XS) & 1) ^ 1);
		mbar_expect(br.xfull + 8 * s, L::X_BYTES);
#pragma unroll
		for (int b = 0; b < C::KS; b++)
			tma_2d(base + s * L::X_BYTES + b * L::X_BOX, xmap, ((u0 * SUB + g) * C::KS + b) * 64, n0,
			    br.xfull + 8 * s);
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

	/* The A fragments (wgmma's register order) of quarter q of the unit (64 of K). */
	__device__ __forceinline__ void
	quarter(int q, int t, uint32_t (&fa)[4][4]) const
	{
		uint32_t f0[4][2], f1[4][2];

		qg_type<TY>::template frags<true>(b0, tab0, q, t, f0);
		qg_type<TY>::template frags<true>(b1, tab1, q, t, f1);
#pragma unroll
		for (int kk = 0; kk < 4; kk++)
			fa[kk][0] = f0[kk][0], fa[kk][1] = f1[kk][0], fa[kk][2] = f0[kk][1], fa[kk][3] = f1[kk][1];
	}

	/* Those of sub-step p of the unit: its KS quarters. */
	__device__ __forceinline__ void
	decode(int p, int t, uint32_t (&fa)[C::KS][4][4]) const
	{
#pragma unroll
		for (int b = 0; b < C::KS; b++)
			quarter(C::KS * p + b, t, fa[b]);
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
	constexpr int SUB = qg_type<TY>::UNIT / (64 * C::KS);
	static_assert(SUB % 2 == 0, "a unit's sub-steps alternate the two register sets");
	int lane = threadIdx.x % WARP, t = lane % 4;
	qw_rows<TY, C> rw;
	uint32_t fa[2][C::KS][4][4];

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
			for (int kk = 0; kk < 4 * C::KS; kk++)
				wg_mma(acc[0], fa[p & 1][kk / 4][kk % 4],
				    wg_desc_sw128(base + s * L::X_BYTES + kk / 4 * L::X_BOX + 32 * (kk % 4)));
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
#pragma unroll
			for (int b = 0; b < C::KS; b++)
				wg_hold(fa[p & 1][b]);
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

/*
 * The GLU form's epilogue, after every consumer is done with the rings:
 * the sums go through shared memory (gate's rows, then up's), and each
 * thread in turn takes a token's 8 rows: act(gate) * up, stored as fp16,
 * undivided, in one 16-byte store. Where one of the 8 passes F16_SAFE or
 * is not finite, they go to g.f as floats instead, infinities in their
 * fp16 places, and the token is flagged in g.big for cuda_glu_fix, which
 * divides its row as cuda_glu would. A rolled loop: unrolled over the
 * accumulators, the 256-token tile's epilogue was 17,000 instructions and
 * its launch took 252 us against the plain products' 151 (H200). The
 * first row tile sets every token's divisor to 1 (the fix's come later).
 */
template <class C>
static __device__ __forceinline__ void
qw_glu_store(const struct qg_args &a, const struct cuda_glu16 &g, const float (&acc)[1][C::NT][4], float *t,
    int warp, int n0)
{
	int r0 = (int)blockIdx.x * C::BM / 2;

	asm volatile("bar.sync 1, 256;" ::: "memory");
	qw_part<C>(t, acc, 64 * (warp / 4) + 16 * (warp % 4));
	asm volatile("bar.sync 1, 256;" ::: "memory");
	for (int i = threadIdx.x; i < C::BN * 8 && n0 + i / 8 < a.n_tok; i += 256) {
		int tok = i / 8, r = 8 * (i % 8), big = 0;
		const float4 *gt = (const float4 *)(t + tok * C::LDT + r), *ut = (const float4 *)(t + tok * C::LDT + 64 + r);
		float sc = a.xscale[n0 + tok], v[8];
		size_t o = (size_t)(n0 + tok) * g.ff + r0 + r;
		uint32_t q[4];

#pragma unroll
		for (int h = 0; h < 2; h++) {
			float4 x = gt[h], y = ut[h];
			float gx[4] = { x.x, x.y, x.z, x.w }, uy[4] = { y.x, y.y, y.z, y.w };

#pragma unroll
			for (int e = 0; e < 4; e++) {
				v[4 * h + e] = act(gx[e] * sc, g.gelu) * (uy[e] * sc);
				big |= !(fabsf(v[4 * h + e]) <= F16_SAFE);
			}
		}
#pragma unroll
		for (int e = 0; e < 4; e++) {
			__half2 p = big ? __floats2half2_rn(INFINITY, INFINITY) : __floats2half2_rn(v[2 * e], v[2 * e + 1]);

			memcpy(&q[e], &p, 4);
		}
		*(uint4 *)(g.h + o) = make_uint4(q[0], q[1], q[2], q[3]);
		if (big) {
			((float4 *)(g.f + o))[0] = make_float4(v[0], v[1], v[2], v[3]);
			((float4 *)(g.f + o))[1] = make_float4(v[4], v[5], v[6], v[7]);
			g.big[n0 + tok] = 1;
		}
		if (blockIdx.x == 0 && r == 0)
			g.scale[n0 + tok] = 1.0f;
	}
}
#endif

/*
 * Block (blockIdx.x: BM rows, blockIdx.y: BN tokens, blockIdx.z: a split
 * of K's units). A split launch whose tiles are clusters (a.part NULL)
 * adds each tile's splits in the cluster; otherwise they go to a.part.
 * The GLU form (never split): rows BM / 2 blockIdx.x.. of gate (a.w's
 * first g.ff rows) and the same of up (the next g.ff), stored by
 * qw_glu_store.
 */
template <int TY, class C, bool GLU = false>
__global__ void __launch_bounds__(C::THREADS, 1)
qw_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
    const __grid_constant__ CUtensorMap hmap, struct qg_args a, struct cuda_glu16 g)
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
	if constexpr (C::WIDE) {
		if (warp >= 8)
			wg_regs_dec<C::PREGS>();
		else
			wg_regs_inc<C::CREGS>();
	}
	if (warp >= 8) {
		if constexpr (GLU) {
			int m[2] = { m0 / 2, g.ff + m0 / 2 };

			if (warp == 9 && threadIdx.x % WARP == 0)
				qw_produce_w<TY, C, 2>(&wmap, &hmap, base, br, u0, U, m);
		} else {
			int m[1] = { m0 };

			if (warp == 9 && threadIdx.x % WARP == 0)
				qw_produce_w<TY, C, 1>(&wmap, &hmap, base, br, u0, U, m);
		}
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
		if constexpr (GLU) {
			qw_glu_store<C>(a, g, acc, (float *)smem, warp, n0);
			return;
		}
		if (nz == 1 || a.part != NULL) {
			if constexpr (C::WIDE)
				qg_store_wide<C>(a, acc, m0 + rr, n0, z);
			else
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

/* A launch's tensor maps: the tokens, the weight's units in boxes of `rows` rows and (Q6_K) its groups' d's. */
template <int TY, class C>
static int
qw_maps(const struct qg_args &a, int rows, CUtensorMap *xmap, CUtensorMap *wmap, CUtensorMap *hmap, char *err)
{
	int rc;

	if ((rc = qw_map(xmap, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, a.xh, (uint64_t)a.k, (uint64_t)a.n_tok,
	    (uint64_t)a.k * sizeof(__half), 64, C::BN, CU_TENSOR_MAP_SWIZZLE_128B, err)) != 0 ||
	    (rc = qw_map(wmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.w, a.row_bytes, (uint64_t)a.n_rows, a.row_bytes,
	    qw_unit<TY>::BODY, (uint32_t)rows, CU_TENSOR_MAP_SWIZZLE_NONE, err)) != 0)
		return rc;
	if (qw_unit<TY>::HEAD > 0)
		return qw_map(hmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.w, a.row_bytes, (uint64_t)a.n_rows, a.row_bytes,
		    qw_unit<TY>::HEAD, (uint32_t)rows, CU_TENSOR_MAP_SWIZZLE_NONE, err);
	return 0;
}

/*
 * The wgmma form of shape C: one block a multiprocessor, a tile's splits
 * one cluster; each launch makes its operands' tensor maps.
 */
template <int TY, class C>
struct qw_form {
	using Cfg = C;
	static constexpr int TYPE = TY;
	static constexpr bool SPLIT_REST = C::BN >= 128;
	/* where a launch's clusters all run at once: a second wave of them costs more than the reduction's launch */
	static int
	cluster_sum(const struct cuda_mm *m, dim3 grid)
	{
		return (int)grid.z <= m->wg_cluster && (int)(grid.x * grid.y) <= m->wg_fit[C::FIT][grid.z];
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
		struct cuda_glu16 none = {};
		int rc;

		if ((rc = qw_maps<TY, C>(a, C::BM, &xmap, &wmap, &hmap, err)) != 0)
			return rc;
		CK(cuda_launch_ex(qw_kernel<TY, C>, grid, dim3(C::THREADS), qw_smem<TY, C>::BYTES,
		    dim3(1, 1, a.part == NULL ? grid.z : 1), m->stream, xmap, wmap, hmap, a, none));
		return 0;
	}
	/* The GLU form (qw_kernel's GLU) of a's rows: g.ff of gate, then as many of up; one tile a block, K whole. */
	static int
	launch_glu(struct cuda_mm *m, const struct qg_args &a, const struct cuda_glu16 &g, char *err)
	{
		CUtensorMap xmap, wmap, hmap = {};
		dim3 grid((unsigned)(g.ff / (C::BM / 2)), (unsigned)((a.n_tok + C::BN - 1) / C::BN));
		int rc;

		if ((rc = qw_maps<TY, C>(a, C::BM / 2, &xmap, &wmap, &hmap, err)) != 0)
			return rc;
		CK(cuda_launch(qw_kernel<TY, C, true>, grid, dim3(C::THREADS), qw_smem<TY, C>::BYTES, m->stream, xmap, wmap,
		    hmap, a, g));
		return 0;
	}
	/* 1 if the plan of a's product (gate and up as one weight) is one launch of whole tiles, K unsplit. */
	static int
	whole(const struct cuda_mm *m, const struct qg_args &a)
	{
		return qg_rest_row<TY, qw_form>(m, a) == 0 && qg_split_of<TY, qw_form>(m, a) == 1;
	}
};

/* 1 if the form has kernels for weights of this type. */
static int
qw_type(uint32_t type)
{
#define QW_IS(TY) type == TY ||
	return QW_TYPES(QW_IS) false;
#undef QW_IS
}

int
cuda_qgemm_wg_type(const struct cuda_weight *w)
{
	return qw_encode != NULL && qw_type(w->type) && w->k % 256 == 0;
}

int
qw_setup(char *err)
{
#define QW_CASE(TY) \
	CK(cudaFuncSetAttribute(qw_kernel<TY, qw_cfg<64>>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
	    (int)qw_smem<TY, qw_cfg<64>>::BYTES)); \
	CK(cudaFuncSetAttribute(qw_kernel<TY, qw_cfg<128>>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
	    (int)qw_smem<TY, qw_cfg<128>>::BYTES)); \
	CK(cudaFuncSetAttribute(qw_kernel<TY, qw_cfg<256>>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
	    (int)qw_smem<TY, qw_cfg<256>>::BYTES)); \
	CK(cudaFuncSetAttribute(qw_kernel<TY, qw_cfg<64>, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
	    (int)qw_smem<TY, qw_cfg<64>>::BYTES)); \
	CK(cudaFuncSetAttribute(qw_kernel<TY, qw_cfg<128>, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
	    (int)qw_smem<TY, qw_cfg<128>>::BYTES)); \
	CK(cudaFuncSetAttribute(qw_kernel<TY, qw_cfg<256>, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
	    (int)qw_smem<TY, qw_cfg<256>>::BYTES));
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
		for (int c = 0; c < QW_SHAPES; c++)
			m->wg_fit[c][z] = INT_MAX;
		if (z < 2)
			continue;
#define QW_FIT1(TY, C) \
		if ((rc = qw_fit<TY, C>(z, &n, err)) != 0) \
			return rc; \
		m->wg_fit[C::FIT][z] = MIN(m->wg_fit[C::FIT][z], n);
#define QW_FIT(TY) QW_FIT1(TY, qw_cfg<64>) QW_FIT1(TY, qw_cfg<128>) QW_FIT1(TY, qw_cfg<256>)
		QW_TYPES(QW_FIT)
#undef QW_FIT
#undef QW_FIT1
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

/* fn(F) for F the wgmma form of the shape for a.n_tok tokens. */
template <int TY, class Fn>
static int
qw_shape(const struct cuda_mm *m, const struct qg_args &a, Fn &&fn)
{
	using Wide = qw_form<TY, qw_cfg<256>>;

	if (a.n_tok <= 64)
		return fn(qw_form<TY, qw_cfg<64>>());
	if (a.n_tok > m->wg_wide && a.k / qg_type<TY>::UNIT >= m->wg_wide_units * qg_split_of<TY, Wide>(m, a))
		return fn(Wide());
	return fn(qw_form<TY, qw_cfg<128>>());
}

/* fn(F) for F the wgmma form of `type` (one qw_type takes) in the shape for a.n_tok tokens. */
template <class Fn>
static int
qw_form_of(const struct cuda_mm *m, uint32_t type, const struct qg_args &a, Fn &&fn)
{
	switch (type) {
#define QW_CASE(TY) case TY: return qw_shape<TY>(m, a, fn);
	QW_TYPES(QW_CASE)
#undef QW_CASE
	default:
		return ERR_UNSUPPORTED;
	}
}

int
qw_product(struct cuda_mm *m, uint32_t type, const struct qg_args &a, char *err)
{
	if (!qw_type(type))
		return err_set(err, ERR_UNSUPPORTED, "no wgmma kernel for weight type %u", type);
	return qw_form_of(m, type, a, [&](auto f) { return qg_launch<decltype(f)::TYPE, decltype(f)>(m, a, err); });
}

/* w's product with the tokens in, into no outputs (the GLU form's stores are its own). */
static struct qg_args
qw_args(const struct cuda_weight *w, struct cuda_h16 in, int n_tok)
{
	struct mm_out none = { { NULL }, { 0 }, { 0 }, 0 };

	return { w->d, w->row_bytes, (int)w->k, (int)w->n, n_tok, in.h, in.scale, none, NULL };
}

int
cuda_qgemm_glu_whole(const struct cuda_mm *m, const struct cuda_weight *w, int n_tok)
{
	struct qg_args a = qw_args(w, { NULL, NULL }, n_tok); /* the plan reads only the shapes */

	return cuda_qgemm_wg(m, w, n_tok) && w->n % 128 == 0 &&
	    qw_form_of(m, w->type, a, [&](auto f) { return decltype(f)::whole(m, a); }) == 1;
}

int
cuda_qgemm_glu(struct cuda_mm *m, const struct cuda_weight *w, struct cuda_h16 in, int n_tok,
    const struct cuda_glu16 *g, char *err)
{
	struct qg_args a = qw_args(w, in, n_tok);

	if (!cuda_qgemm_wg_type(w) || w->n % 128 != 0 || 2 * (int64_t)g->ff != w->n)
		return err_set(err, ERR_UNSUPPORTED, "no GLU form for %lld rows of type %u", (long long)w->n, w->type);
	return qw_form_of(m, w->type, a, [&](auto f) { return decltype(f)::launch_glu(m, a, *g, err); });
}
