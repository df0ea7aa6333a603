/*
 * mmt.cu: products of a few tokens (above the matrix-vector kernels' count,
 * one, and up to MMT_MAX_TOKENS: a few sequences decoding together) on the
 * tensor cores, straight from Q4_K and Q6_K (regrouped, TT_Q6_KG) blocks,
 * their tokens in the fp16 form qgemm reads (m->xh, m->xscale).
 *
 * qgemm stages a tile's raw blocks in shared memory for warps that share
 * them; with at most 8 tokens there is nothing to share but the tokens, so
 * here each warp streams its own rows from global memory into registers,
 * as the integer matrix-vector kernel does, with no barrier in its loop: a
 * block takes 16 rows (one m16 tile) and its MMT_WARPS warps (MMT_WIDE for
 * a grid too small to fill the GPU with loads: O and the down projection
 * of llama3-8b; MMT_THIRD where that fits it in one wave: Q/K/V) take
 * every MMT_WARPS-th 256-element block of them, the next one's loads
 * issued before the current one is decoded (but in 4-warp Q4_K blocks,
 * MMT_ONE_SET). Lane (g, t) holds rows g and g + 8 of
 * the tile and token g. Each k16 step takes four consecutive elements a
 * lane, the four lanes of a row 16 consecutive ones (two steps: 32), so
 * that a quad's tokens are read as 64 bytes in a row: lanes that each took
 * a quarter of a block (one sub-block pair's scales to decode, not four)
 * read their tokens 128 bytes apart, and at 8 tokens the kernel waited on
 * L1 (ncu: L1 88 % busy, DRAM 29 %, gate/up 71 us against qgemm's 53).
 * The decoding is qgemm's (h2_pairs, tc.cuh): the same fp16 weights, so
 * only the order of the float sums differs from qgemm's products. A
 * block's cost is its decoding, whatever the token count up to the 8 of an
 * n8 tile.
 */
#include "dequant.cuh"
#include "matmul.cuh"
#include "tc.cuh"

#define MMT_WARPS 4 /* warps of a block, splitting K */
#define MMT_WIDE 8  /* ... where the grid has under MMT_WIDE_PER_SM blocks a multiprocessor */
#define MMT_WIDE_PER_SM 4
#define MMT_THIRD 5 /* ... and where 3 of them a multiprocessor make it one wave, 2 not */
#define MMT_ROWS 16
/*
 * 4-warp Q4_K blocks hold one block of rows in registers, not two, and so
 * fit 7 a multiprocessor (72 registers), not 5 (96): more warps hide the
 * decoding better than each warp's loads ahead did, and llama3-8b's
 * gate/up (1,792 blocks) runs in two waves on 132 multiprocessors, not
 * three (H100: two to eight sequences 4.6-5.4 % faster; 6 a
 * multiprocessor no faster, 8 4 % slower, three register sets at 4 a
 * multiprocessor 6 % slower).
 */
#define MMT_ONE_SET_BLOCKS 7
#define MMT_ONE_SET(W, TY, TY2) ((W) == MMT_WARPS && (TY) == TT_Q4_K && (TY2) == 0)

/*
 * A type's part of the kernel for lane t of a row quad: R, the raw bytes of
 * a row's 256-element block that load() reads (all of them before any is
 * used); S, the fp16 scales that scales() decodes from R once a block;
 * frag(), the row's A registers of k16 step i (0..15) of the block; xoff(),
 * where in the block the four elements of step i start, for the tokens' B
 * registers (steps i and i + 1 are eight in a row, for even i).
 */
template <int TY> struct mt_type;

/*
 * Q4_K: in each pair of sub-blocks (the low and high nibbles of 32 bytes at
 * 16 + 32 p), lane t takes bytes 8 t .. 8 t + 7: k16 step i is word i % 2 of
 * them, low nibbles (sub-block 2 p) for (i / 2) % 2 = 0, high ones after, p
 * = i / 4. So the four lanes of a row read 32 bytes in a row, and their
 * tokens' elements too.
 */
template <> struct mt_type<TT_Q4_K> {
	struct R {
		uint4 hd;
		uint2 q[4];
	};
	struct S {
		__half2 s[8], m[8]; /* (d sc, d sc) and (-dmin m, -dmin m) of each sub-block */
	};
	static __device__ __forceinline__ void
	load(const uint8_t *row, int u, int t, R &r)
	{
		const uint8_t *b = row + (size_t)u * 144;

		r.hd = __ldg((const uint4 *)b);
#pragma unroll
		for (int p = 0; p < 4; p++)
			r.q[p] = __ldg((const uint2 *)(b + 16 + 32 * p + 8 * t));
	}
	static __device__ __forceinline__ void
	scales(const R &r, int, S &s)
	{
		uint32_t sc[2], mn[2];
		__half2 dd = as_h2(r.hd.x), d = __low2half2(dd), nd = __hneg2(__high2half2(dd));

		k4_unpack(r.hd.y, r.hd.z, r.hd.w, sc, mn);
#pragma unroll
		for (int p = 0; p < 4; p++) {
			uint32_t sel = p & 1 ? 0x4342u : 0x4140u;

			h2_bytes2(sc[p >> 1], sel, H_1024, d, s.s[2 * p], s.s[2 * p + 1]);
			h2_bytes2(mn[p >> 1], sel, H_1024, nd, s.m[2 * p], s.m[2 * p + 1]);
		}
	}
	static __device__ __forceinline__ int
	xoff(int t, int i)
	{
		return 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 8 * t + 4 * (i & 1);
	}
	static __device__ __forceinline__ void
	frag(const R &r, const S &s, int i, uint32_t a[2])
	{
		int p = i >> 2, hi = (i >> 1) & 1;
		uint32_t w = i & 1 ? r.q[p].y : r.q[p].x;

		h2_pairs((hi ? w >> 4 : w) & 0x0f0f0f0fu, H_1024, s.s[2 * p + hi], s.m[2 * p + hi], a);
	}
};

/*
 * Q6_K regrouped: in each quarter s (32 elements) of half h, lane t takes
 * positions l = 8 t .. 8 t + 7, whose scale is the half's 2 s + t / 2: the
 * ql bytes at 64 h + 32 (s % 2) + 8 t, the qh bytes at 128 + 32 h + 8 t.
 * k16 step i is word i % 2 of quarter (i / 2) % 4 of half i / 8.
 */
template <> struct mt_type<TT_Q6_KG> {
	struct R {
		uint2 l[2][2], h[2];
		uint4 sc;
		uint32_t d;
	};
	struct S {
		__half2 s[2][4]; /* (d sc, d sc) of the lane's scale in each quarter of each half */
	};
	static __device__ __forceinline__ void
	load(const uint8_t *row, int u, int t, R &r)
	{
		const uint8_t *b = q6g_body(row, u);

#pragma unroll
		for (int h = 0; h < 2; h++) {
			r.l[h][0] = __ldg((const uint2 *)(b + 64 * h + 8 * t));
			r.l[h][1] = __ldg((const uint2 *)(b + 64 * h + 32 + 8 * t));
			r.h[h] = __ldg((const uint2 *)(b + 128 + 32 * h + 8 * t));
		}
		r.sc = __ldg((const uint4 *)(b + 192));
		r.d = __ldg((const unsigned short *)(row + (size_t)(u >> 3) * Q6G_GROUP + 2 * (u & 7)));
	}
	static __device__ __forceinline__ void
	scales(const R &r, int t, S &s)
	{
		/* quarters 2 q and 2 q + 1 of a half: bytes 4 q + t / 2 and that + 2, signed, + 128 by the xor */
		uint32_t sel = t >> 1 ? 0x4341u : 0x4240u;
		const uint32_t w[4] = { r.sc.x, r.sc.y, r.sc.z, r.sc.w };
		__half2 d = as_h2(r.d | r.d << 16);

#pragma unroll
		for (int j = 0; j < 4; j++)
			h2_bytes2(w[j] ^ 0x80808080u, sel, H_1152, d, s.s[j >> 1][2 * (j & 1)], s.s[j >> 1][2 * (j & 1) + 1]);
	}
	static __device__ __forceinline__ int
	xoff(int t, int i)
	{
		return 128 * (i >> 3) + 32 * ((i >> 1) & 3) + 8 * t + 4 * (i & 1);
	}
	static __device__ __forceinline__ void
	frag(const R &r, const S &s, int i, uint32_t a[2])
	{
		int h = i >> 3, q = (i >> 1) & 3;
		uint32_t l = i & 1 ? r.l[h][q & 1].y : r.l[h][q & 1].x, qh = i & 1 ? r.h[h].y : r.h[h].x;
		uint32_t x = ((l >> (4 * (q >> 1))) & 0x0f0f0f0fu) | ((qh >> (2 * q)) & 0x03030303u) << 4;

		h2_pairs(x, H_1056, s.s[h][q], as_h2(0u), a);
	}
};

/* One 256-element block of rows g (raw a) and g + 8 (raw b) times the tokens' elements at xu, into acc. */
template <int TY>
static __device__ __forceinline__ void
mmt_block(const typename mt_type<TY>::R &ca, const typename mt_type<TY>::R &cb, int t, const __half *__restrict__ xu,
    float (&acc)[4])
{
	using T = mt_type<TY>;
	typename T::S sa, sb;

	T::scales(ca, t, sa);
	T::scales(cb, t, sb);
#pragma unroll
	for (int i = 0; i < 16; i += 2) {
		uint4 bv = __ldg((const uint4 *)(xu + T::xoff(t, i))); /* steps i and i + 1: 8 elements in a row */
		uint32_t b0[2] = { bv.x, bv.y }, b1[2] = { bv.z, bv.w }, fa[2], fb[2];

		T::frag(ca, sa, i, fa);
		T::frag(cb, sb, i, fb);
		uint32_t a0[4] = { fa[0], fb[0], fa[1], fb[1] };
		mma16816(acc, a0, b0);
		T::frag(ca, sa, i + 1, fa);
		T::frag(cb, sb, i + 1, fb);
		uint32_t a1[4] = { fa[0], fb[0], fa[1], fb[1] };
		mma16816(acc, a1, b1);
	}
}

/*
 * Where lane (g, t) of a block's storing warp puts its pairs of rows with
 * QKV: rows g and g + 1 (g even) or g + 7 and g + 8 (g odd) of the block,
 * tokens 2 t and 2 t + 1 (j), each pair wholly in q, k or v (their row
 * counts are even).
 */
static __device__ __forceinline__ int
mmt_pair_row(int g)
{
	return g & 1 ? g + 7 : g;
}

/* 1 if lane (g, .)'s pair of token tok exists in the block of sg's rows from r0. */
static __device__ __forceinline__ int
mmt_pair_stored(const struct mm_seg &sg, int r0, int g, int tok, int n_tok)
{
	return r0 + mmt_pair_row(g) < sg.n && tok < n_tok;
}

/*
 * The 16 rows of segment sg from r0 by up to 8 tokens, by a block of W
 * warps. Warp w takes blocks w, w + W, ... of the rows' 256-element
 * blocks; warps 1.. hand their sums to warp 0 through red, which adds
 * them in warp order and stores them to out, or with QKV as e says (the
 * neighbouring row of a pair is in the lane 4 away). The weights' first
 * block's loads come before pdl_wait (no kernel of the step writes them),
 * in the one-wave grids of wider blocks the first two: all of O's at
 * llama3-8b's 4,096 columns, most of Q/K/V's. (The 4-warp kernel took 4
 * registers more for a second, a block a multiprocessor less.) With
 * ONE, one set of registers (MMT_ONE_SET).
 */
template <int TY, int W, bool QKV, bool ONE>
static __device__ __forceinline__ void
mmt_rows(const struct mm_seg &sg, int r0, int k, int n_tok, const __half *__restrict__ xh,
    const float *__restrict__ xscale, const struct mm_out &out, const mm_e<QKV> &e, float (*red)[WARP][4])
{
	using T = mt_type<TY>;
	constexpr bool two_ahead = W != MMT_WARPS; /* both register sets loaded before pdl_wait */
	int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane / 4, t = lane % 4, units = k / 256;
	const uint8_t *ra = sg.w + (size_t)min(r0 + g, sg.n - 1) * sg.row_bytes;
	const uint8_t *rb = sg.w + (size_t)min(r0 + g + 8, sg.n - 1) * sg.row_bytes;
	const __half *xt = xh + (size_t)min(g, n_tok - 1) * k;
	float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
	typename T::R ca = {}, cb = {}, na = {}, nb = {};
	struct qkv_pair pe[QKV ? 2 : 1];

	if (warp < units)
		T::load(ra, warp, t, ca), T::load(rb, warp, t, cb);
	if (two_ahead && warp + W < units)
		T::load(ra, warp + W, t, na), T::load(rb, warp + W, t, nb);
	pdl_wait();
	pdl_trigger();
	if constexpr (ONE) {
		for (int u = warp; u < units; u += W) {
			if (u > warp)
				T::load(ra, u, t, ca), T::load(rb, u, t, cb);
			mmt_block<TY>(ca, cb, t, xt + (size_t)u * 256, acc);
		}
	} else {
		/* two sets of registers in turn, so that no block's bytes are copied from one set to the other */
		for (int u = warp; u < units; u += 2 * W) {
			if (u + W < units && (!two_ahead || u > warp))
				T::load(ra, u + W, t, na), T::load(rb, u + W, t, nb);
			mmt_block<TY>(ca, cb, t, xt + (size_t)u * 256, acc);
			if (u + W >= units)
				break;
			if (u + 2 * W < units)
				T::load(ra, u + 2 * W, t, ca), T::load(rb, u + 2 * W, t, cb);
			mmt_block<TY>(na, nb, t, xt + (size_t)(u + W) * 256, acc);
		}
	}
	if (warp > 0)
#pragma unroll
		for (int i = 0; i < 4; i++)
			red[warp - 1][lane][i] = acc[i];
	if constexpr (QKV) /* its loads while the other warps finish */
		if (warp == 0)
#pragma unroll
			for (int j = 0; j < 2; j++)
				if (mmt_pair_stored(sg, r0, g, 2 * t + j, n_tok))
					pe[j] = qkv_pair_of(e.hd, e.kv, e.q, sg.o0 + r0 + mmt_pair_row(g), 2 * t + j);
	__syncthreads();
	if (warp > 0)
		return;
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int v = 0; v < W - 1; v++)
			acc[i] += red[v][lane][i];
	if constexpr (QKV) {
		int odd = g & 1;

#pragma unroll
		for (int j = 0; j < 2; j++) {
			/* lane g has rows g (acc 0, 1) and g + 8 (acc 2, 3); the row beside each is in lane g ^ 1 */
			float mine = acc[odd ? 2 + j : j], near = __shfl_xor_sync(0xffffffffu, acc[odd ? j : 2 + j], 4);
			int tok = 2 * t + j;

			if (mmt_pair_stored(sg, r0, g, tok, n_tok))
				qkv_pair_store(pe[j], (odd ? near : mine) * xscale[tok], (odd ? mine : near) * xscale[tok]);
		}
	} else {
#pragma unroll
		for (int i = 0; i < 4; i++) {
			int row = r0 + g + (i >= 2 ? 8 : 0), tok = 2 * t + (i & 1);

			if (row < sg.n && tok < n_tok)
				mm_store(out, sg.o0 + row, tok, acc[i] * xscale[tok]);
		}
	}
}

/*
 * A block of W warps: rows blockIdx.x * 16 .. + 15 of a (type TY), or,
 * from block nb_a on, of b (type TY2; 0: none), so that weights of one
 * input in two types (a Q4_K Q/K and a Q6_K V) are one launch whose
 * blocks run side by side.
 */
template <int TY, int TY2, int W, bool QKV>
__global__ void __launch_bounds__(W * WARP, MMT_ONE_SET(W, TY, TY2) ? MMT_ONE_SET_BLOCKS : 0 /* none */)
mmt_kernel(struct mm_seg a, struct mm_seg b, int nb_a, int k, int n_tok, const __half *__restrict__ xh,
    const float *__restrict__ xscale, struct mm_out out, mm_e<QKV> e)
{
	__shared__ float red[W - 1][WARP][4];

	if constexpr (TY2 != 0)
		if ((int)blockIdx.x >= nb_a) {
			mmt_rows<TY2, W, QKV, false>(b, ((int)blockIdx.x - nb_a) * MMT_ROWS, k, n_tok, xh, xscale, out, e, red);
			return;
		}
	mmt_rows<TY, W, QKV, MMT_ONE_SET(W, TY, TY2)>(a, (int)blockIdx.x * MMT_ROWS, k, n_tok, xh, xscale, out, e, red);
}

int
cuda_mmt_fits(const struct cuda_mm *m, const struct cuda_weight *w, int n_tok)
{
	int type = w->type == TT_Q4_K || w->type == TT_Q6_KG;

	return type && n_tok >= 1 && n_tok <= m->mmt_max && w->k % 256 == 0 &&
	    w->row_bytes % 16 == 0;
}

template <int TY, int TY2, int W, bool QKV>
static int
mmt_launch(struct cuda_mm *m, const struct mm_seg &a, const struct mm_seg &b, int nb_a, int k, struct cuda_h16 in,
    int n_tok, const struct mm_out *out, const struct mm_qkv &e, unsigned grid, char *err)
{
	CK(cuda_launch(mmt_kernel<TY, TY2, W, QKV>, dim3(grid), dim3(W * WARP), 0, m->stream, a, b, nb_a, k, n_tok,
	    (const __half *)in.h, (const float *)in.scale, *out, mm_e_of<QKV>(e)));
	return 0;
}

/* The kernel of a's and b's types in blocks of W warps, storing to e where e.q is set. */
template <int TY, int TY2, int W>
static int
mmt_go(struct cuda_mm *m, const struct mm_seg &a, const struct mm_seg &b, int nb_a, int k, struct cuda_h16 in,
    int n_tok, const struct mm_out *out, const struct mm_qkv &e, unsigned grid, char *err)
{
	if (e.q != NULL)
		return mmt_launch<TY, TY2, W, true>(m, a, b, nb_a, k, in, n_tok, out, e, grid, err);
	return mmt_launch<TY, TY2, W, false>(m, a, b, nb_a, k, in, n_tok, out, e, grid, err);
}

/*
 * Blocks of 8 warps (two a multiprocessor: at most 128 registers) for a
 * grid too small to fill the GPU with loads, of 5 (three) where that makes
 * it one wave and 8 would not (Q/K/V's 384 blocks on an H100's 132
 * multiprocessors: two to eight sequences 2.3-3.0 % faster), else of 4.
 */
template <int TY, int TY2>
static int
mmt_types(struct cuda_mm *m, const struct mm_seg &a, const struct mm_seg &b, int k, struct cuda_h16 in, int n_tok,
    const struct mm_out *out, const struct mm_qkv &e, char *err)
{
	int nb_a = (a.n + MMT_ROWS - 1) / MMT_ROWS;
	unsigned grid = (unsigned)(nb_a + (b.n + MMT_ROWS - 1) / MMT_ROWS);

	if (grid > (unsigned)(2 * m->sms) && grid <= (unsigned)(3 * m->sms))
		return mmt_go<TY, TY2, MMT_THIRD>(m, a, b, nb_a, k, in, n_tok, out, e, grid, err);
	if (grid < (unsigned)(MMT_WIDE_PER_SM * m->sms))
		return mmt_go<TY, TY2, MMT_WIDE>(m, a, b, nb_a, k, in, n_tok, out, e, grid, err);
	return mmt_go<TY, TY2, MMT_WARPS>(m, a, b, nb_a, k, in, n_tok, out, e, grid, err);
}

/* As mmt_types<TY, TY2>, TY2 the type of b's rows (none: 0). */
template <int TY>
static int
mmt_second(struct cuda_mm *m, const struct mm_seg &a, const struct mm_seg &b, uint32_t type2, int k,
    struct cuda_h16 in, int n_tok, const struct mm_out *out, const struct mm_qkv &e, char *err)
{
	switch (type2) {
	case 0: return mmt_types<TY, 0>(m, a, b, k, in, n_tok, out, e, err);
	case TT_Q4_K:
		if constexpr (TY != TT_Q4_K)
			return mmt_types<TY, TT_Q4_K>(m, a, b, k, in, n_tok, out, e, err);
		break;
	case TT_Q6_KG:
		if constexpr (TY != TT_Q6_KG)
			return mmt_types<TY, TT_Q6_KG>(m, a, b, k, in, n_tok, out, e, err);
		break;
	}
	return err_set(err, ERR_UNSUPPORTED, "no few-token tensor-core kernel for types %u and %u", TY, type2);
}

int
cuda_mmt(struct cuda_mm *m, const struct cuda_weight *w, const struct cuda_weight *w2, struct cuda_h16 in, int n_tok,
    const struct mm_out *out, const struct mm_qkv &e, char *err)
{
	struct mm_seg a, b;

	if (!cuda_mmt_fits(m, w, n_tok) || (w2 != NULL && (!cuda_mmt_fits(m, w2, n_tok) || w2->k != w->k)))
		return err_set(err, ERR_UNSUPPORTED, "no few-token tensor-core kernel for type %u, %d tokens", w->type,
		    n_tok);
	mm_segs(w, w2, &a, &b);
	if (w->type == TT_Q4_K)
		return mmt_second<TT_Q4_K>(m, a, b, w2 != NULL ? w2->type : 0, (int)w->k, in, n_tok, out, e, err);
	return mmt_second<TT_Q6_KG>(m, a, b, w2 != NULL ? w2->type : 0, (int)w->k, in, n_tok, out, e, err);
}
