/*
 * flash.cu: attention of prefill chunks on the tensor cores (flash
 * attention over the paged fp16 pool).
 *
 * A block takes a tile of FLASH_ROWS query rows: FLASH_ROWS / G consecutive
 * new tokens of one sequence times the G query heads that share a KV head
 * (GQA), so each K and V row it loads serves every head of the group. Its
 * four warps own 16 rows each. The block walks the positions its tokens
 * see, 64 at a time: the K and V rows are copied into shared memory through
 * the sequence's block table with cp.async, a tile ahead; S = Q K^T and
 * O += P V are mma.sync m16n8k16 on fp16 with float accumulation; the
 * softmax is online (a running max and sum per row, in base 2 with log2(e)
 * folded into the query scale), P going from the accumulators of S to the
 * A fragments of P V in registers. Causal and sliding-window masks are
 * applied per row; positions past the tile's last token are zeros.
 *
 * A q8 pool's rows (attention.cuh) come into two stages as they are, and
 * the stage in use is widened into one fp16 stage of K and V before its
 * products: the copies stay a tile ahead, and the products are the fp16
 * pool's.
 *
 * Tiles come from the host per step (kv->fa_tiles); the blocks of a launch
 * beyond their count return at once, so that one launch shape (one graph)
 * serves every step of a token count. Tiles run longest context first.
 *
 * A tile of a few tokens (a sequence's guesses, a short chunk) beside a
 * long context would leave the GPU idle in one block: like the split
 * kernel (attention.cu), a launch of n_split > 1 cuts each tile's
 * positions into n_split pieces of whole K/V tiles (blockIdx.z), each
 * leaving its rows' weighted values, max and sum in kv->part for
 * attn_merge_kernel. The tile's K and V rows are read once for all its
 * tokens, where the split kernel reads them once for each token.
 */
#include "attention.cuh"
#include "tc.cuh"

#define FA_WARPS (FLASH_ROWS / 16)
#define FA_KV 64     /* positions per K/V tile */
#define FA_PAD 8     /* fp16 after each shared-memory row: ldmatrix meets no bank conflicts */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

#define FA_Q8_PAD 16 /* bytes after each int8 row of a q8 stage */

/* Bytes of a q8 stage: K's rows, V's, K's scales, V's. */
static constexpr __host__ __device__ size_t
fa_q8_stage(int d)
{
	return (size_t)2 * FA_KV * (size_t)(d + FA_Q8_PAD + d / 32 * (int)sizeof(float));
}

/* Shared memory of fa_kernel<D, Q8>: the queries, two stages of K and of V (q8: one, and two q8 stages). */
static constexpr size_t
fa_smem_bytes(int d, bool q8)
{
	return (size_t)(FLASH_ROWS + (q8 ? 2 : 4) * FA_KV) * (size_t)(d + FA_PAD) * sizeof(__half) +
	    (q8 ? 2 * fa_q8_stage(d) : 0);
}

/*
 * The 16-byte columns a row's copies take, rounded up to a power of two
 * (at most a block's threads), so that each thread keeps one column for
 * all its rows; the columns past the row's have no copies.
 */
static constexpr __host__ __device__ int
fa_pow2(int n)
{
	return n <= 1 ? 1 : 2 * fa_pow2((n + 1) / 2);
}

/*
 * The pool blocks of positions p, p + STEP, ... (N of them) from the block
 * table, all asked for before the first is used; a position past last
 * takes last's block (its copy reads nothing).
 */
template <int N, int STEP>
static __device__ __forceinline__ void
fa_blocks(uint32_t (&blk)[N], const int32_t *tab, int p, int last)
{
#pragma unroll
	for (int k = 0; k < N; k++)
		blk[k] = (uint32_t)tab[(uint32_t)min(p + k * STEP, last) / KV_BLOCK_TOKENS];
}

/*
 * Copies the K and V rows r0 .. r1 - 1 of the tile of positions c0 .. c0 +
 * FA_KV - 1 (D elements of T each) to the stage rows at shared addresses
 * ks, vs, ROWB bytes apart; those past last are zeros. A thread keeps one
 * 16-byte column for all its rows, so their pool offsets differ only by
 * the row's block and place in it, and it asks for all its rows'
 * block-table entries at once (one after another, each copy waited for
 * its entry). With SB > 0 (a q8 pool) the threads of a row's first
 * columns also copy its scales, SB bytes each, to ksc and vsc (D / 32
 * floats a row), from the block entries they hold. Offsets within the
 * pool are worked out in 32 bits but for the block's (the load checks
 * that they fit): in 64 bits, with the scales' own entries, the copies'
 * arithmetic was 40 % of a q8 decode tile's instructions.
 */
template <int D, typename T, int ROWB, int SB = 0>
static __device__ __forceinline__ void
fa_copy_rows(uint32_t ks, uint32_t vs, const struct cuda_kv &kv, const int32_t *tab, int c0, int last, int r0,
    int r1, int nkv, int koff, uint32_t ksc = 0, uint32_t vsc = 0)
{
	constexpr int PER = 16 / (int)sizeof(T), PIECES = fa_pow2(D / PER), STEP = FA_WARPS * WARP / PIECES;
	constexpr int G = D / 32, SP = SB > 0 ? 4 * G / SB : 0; /* a row's pieces of scales */
	static_assert(SP <= PIECES, "a row's scales go with its first columns");
	uint32_t bs = (uint32_t)kv_block_stride(kv), ci = threadIdx.x % PIECES, c = ci * PER;
	int r = (int)c < D ? r0 + (int)(threadIdx.x / PIECES) : r1;
	const T *col = (const T *)kv.pool + kv_at(kv, 0, 0, 0, nkv, koff + (int)c);
	const int8_t *scol = (const int8_t *)kv.pool + (SB > 0 ? kv_scale_at(kv, 0, 0, 0, nkv, koff) + ci * SB : 0);
	uint32_t blk[FA_KV / STEP];

	fa_blocks<FA_KV / STEP, STEP>(blk, tab, c0 + r, last);
#pragma unroll
	for (int k = 0; k < FA_KV / STEP; k++, r += STEP) {
		int p = c0 + r, n = p <= last ? 16 : 0;
		uint64_t at = (uint64_t)blk[k] * bs;
		const T *src = col + at + kv_in_block(p, nkv);
		uint32_t o = (uint32_t)(r * ROWB) + c * (uint32_t)sizeof(T);

		if (r >= r1)
			continue;
		cp_async_zfill_at<16>(ks + o, src, n);
		cp_async_zfill_at<16>(vs + o, src + kv.kv_stride, n);
		if constexpr (SB > 0) {
			const int8_t *ss = scol + at + kv_scale_in_block(p, nkv);
			uint32_t so = (uint32_t)r * G * (uint32_t)sizeof(float) + ci * SB;

			if ((int)ci < SP) {
				cp_async_zfill_at<SB>(ksc + so, ss, n > 0 ? SB : 0);
				cp_async_zfill_at<SB>(vsc + so, ss + kv.kv_stride, n > 0 ? SB : 0);
			}
		}
	}
}

/*
 * The rows of a tile from a q8 pool as they are, into the stage at shared
 * address st (K's levels, V's, K's scales, V's); those past last get
 * scales of 0 (and levels of 0).
 */
template <int D>
static __device__ __forceinline__ void
fa_load_q8(uint32_t st, const struct cuda_kv &kv, const int32_t *tab, int c0, int last, int r0, int r1, int nkv,
    int koff)
{
	constexpr int RQ = D + FA_Q8_PAD, G = D / 32;
	/* a row's scales in the largest copies that divide them (a head's start is a multiple of 4 G bytes) */
	constexpr int SB = 4 * G % 16 == 0 ? 16 : 4 * G % 8 == 0 ? 8 : 4;
	uint32_t ksc = st + 2 * FA_KV * RQ, vsc = ksc + FA_KV * G * (int)sizeof(float);

	fa_copy_rows<D, int8_t, RQ, SB>(st, st + FA_KV * RQ, kv, tab, c0, last, r0, r1, nkv, koff, ksc, vsc);
}

/*
 * q8 stage st widened into the fp16 stage ks, vs. Rows past the context
 * have levels and scales of 0 (fa_load_q8) and read as zeros.
 */
template <int D>
static __device__ __forceinline__ void
fa_widen(__half *ks, __half *vs, const int8_t *st)
{
	constexpr int LD = D + FA_PAD, RQ = D + FA_Q8_PAD, G = D / 32;
	const int8_t *vq = st + FA_KV * RQ;
	const float *ksc = (const float *)(vq + FA_KV * RQ), *vsc = ksc + FA_KV * G;

	for (int i = threadIdx.x; i < FA_KV * (D / 8); i += FA_WARPS * WARP) {
		int r = i / (D / 8), c = (i % (D / 8)) * 8;
		uint2 a = *(const uint2 *)(st + r * RQ + c), b = *(const uint2 *)(vq + r * RQ + c);
		float da = ksc[r * G + c / 32], db = vsc[r * G + c / 32], qa[8], qb[8];
		uint4 ka, va;

		i8x4_float(a.x, qa), i8x4_float(a.y, qa + 4), i8x4_float(b.x, qb), i8x4_float(b.y, qb + 4);
		ka.x = pack_half2(qa[0] * da, qa[1] * da), ka.y = pack_half2(qa[2] * da, qa[3] * da);
		ka.z = pack_half2(qa[4] * da, qa[5] * da), ka.w = pack_half2(qa[6] * da, qa[7] * da);
		va.x = pack_half2(qb[0] * db, qb[1] * db), va.y = pack_half2(qb[2] * db, qb[3] * db);
		va.z = pack_half2(qb[4] * db, qb[5] * db), va.w = pack_half2(qb[6] * db, qb[7] * db);
		*(uint4 *)(ks + r * LD + c) = ka;
		*(uint4 *)(vs + r * LD + c) = va;
	}
}

/*
 * ROWS query rows as fp16, times the score scale and log2(e): row r is
 * head h0 + r % per of token t0 + r / per, zeros past nt tokens or ng heads.
 * With PERM each 16 dimensions in the order of fd_kq8's K fragments
 * (tc.cuh's quants' order: dimensions 4t .. 4t+3 in slots 2t, 2t+1, 2t+8,
 * 2t+9).
 */
template <int D, int ROWS, bool PERM = false>
static __device__ __forceinline__ void
fa_load_q(__half *qs, const float *__restrict__ q, const struct cuda_heads &hp, int t0, int nt, int h0, int per,
    int ng)
{
	constexpr int LD = D + FA_PAD;
	float sc = hp.scale * LOG2E;

	for (int i = threadIdx.x; i < ROWS * D / 8; i += FA_WARPS * WARP) {
		int r = i / (D / 8), c = (i % (D / 8)) * 8, tok = r / per, h = r % per;
		uint4 v = make_uint4(0, 0, 0, 0);

		if (tok < nt && h < ng) {
			const float4 *src = (const float4 *)(q + ((size_t)(t0 + tok) * hp.n_head + h0 + h) * D + c);
			float4 a = src[0], b = src[1];

			v.x = pack_half2(a.x * sc, a.y * sc), v.y = pack_half2(a.z * sc, a.w * sc);
			v.z = pack_half2(b.x * sc, b.y * sc), v.w = pack_half2(b.z * sc, b.w * sc);
		}
		if constexpr (PERM) { /* dimensions c .. c + 7: pairs into slots (c % 16) / 2 + 0, 8, 2, 10 */
			uint32_t *row = (uint32_t *)(qs + r * LD + (c & ~15)) + (c % 16) / 4;

			row[0] = v.x, row[4] = v.y, row[1] = v.z, row[5] = v.w;
		} else {
			*(uint4 *)(qs + r * LD + c) = v;
		}
	}
}

/*
 * 2^x in one instruction; exp2f adds a rescaling for results under 2^-126,
 * which a softmax weight that small (against its row's largest, 1) does
 * not need: they become 0.
 */
static __device__ __forceinline__ float
exp2_ftz(float x)
{
	float y;

	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

/* Max and sum over the four lanes that share a row of an mma fragment. */
static __device__ __forceinline__ float
quad_max(float v)
{
	v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
	return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 2));
}

static __device__ __forceinline__ float
quad_sum(float v)
{
	v += __shfl_xor_sync(FULL_MASK, v, 1);
	return v + __shfl_xor_sync(FULL_MASK, v, 2);
}

/*
 * What one query row of a thread sees: its position, the first position
 * its window lets in, and whether it is one of the tile's tokens.
 */
struct fa_row {
	int pos, first, live;
	float m, l;        /* running max (base 2) and this thread's share of the sum */
};

/*
 * Masks one row's scores of NJ n8 tiles from position c0 (only with
 * EDGE: tiles wholly inside every row's window need none) and folds them
 * into the running max; returns the correction of the old terms.
 */
template <int NJ, bool EDGE>
static __device__ __forceinline__ float
fa_softmax_row(struct fa_row &r, float (&s)[NJ][4], int half, int c0, int lane)
{
	float mx = -INFINITY, mn, corr;

#pragma unroll
	for (int j = 0; j < NJ; j++)
#pragma unroll
		for (int e = 0; e < 2; e++) {
			int col = c0 + 8 * j + 2 * (lane % 4) + e;
			float &v = s[j][2 * half + e];

			if (!r.live || (EDGE && (col > r.pos || col < r.first)))
				v = -INFINITY;
			mx = fmaxf(mx, v);
		}
	mn = fmaxf(r.m, quad_max(mx));
	/* a row that has seen nothing yet keeps max -inf: nothing to correct, nothing to add */
	corr = mn == -INFINITY ? 1.0f : exp2_ftz(r.m - mn);
	r.l *= corr;
#pragma unroll
	for (int j = 0; j < NJ; j++)
#pragma unroll
		for (int e = 0; e < 2; e++) {
			float &v = s[j][2 * half + e];

			v = mn == -INFINITY ? 0.0f : exp2_ftz(v - mn);
			r.l += v;
		}
	r.m = mn;
	return corr;
}

/*
 * The softmax of a tile's first nr rows (of NR), corr[i] row i's
 * correction: one branch a tile between the copies with and without
 * masks (edge), taken outside the rows. With one copy ptxas computed
 * every mask and selected; with the branch a row, prefill ran 1.2 %
 * slower (H200, tests/bench/RESULTS.md).
 */
template <int NJ, int NR>
static __device__ __forceinline__ void
fa_softmax(struct fa_row (&r)[NR], float (&s)[NJ][4], int c0, int lane, bool edge, int nr, float (&corr)[NR])
{
	if (edge) {
#pragma unroll
		for (int i = 0; i < NR; i++)
			if (i < nr)
				corr[i] = fa_softmax_row<NJ, true>(r[i], s, i, c0, lane);
	} else {
#pragma unroll
		for (int i = 0; i < NR; i++)
			if (i < nr)
				corr[i] = fa_softmax_row<NJ, false>(r[i], s, i, c0, lane);
	}
}

/* K's B fragments from an fp16 stage: n8 tiles 2 jj and 2 jj + 1 of the positions from kb, dimensions kk .. kk + 15. */
template <int D>
struct fa_kf16 {
	const __half *kb;

	__device__ __forceinline__ void
	operator()(int kk, int jj, int lane, uint32_t b[4]) const
	{
		ldmatrix_x4(b, kb + (16 * jj + lane % 8 + (lane / 16) * 8) * (D + FA_PAD) + kk + ((lane / 8) % 2) * 8);
	}
};

/* The A fragments of 16 query rows (qw, the warp's) for every 16 dimensions. */
template <int D>
static __device__ __forceinline__ void
fa_q_frags(const __half *qw, int lane, uint32_t (&a)[D / 16][4])
{
#pragma unroll
	for (int kk = 0; kk < D / 16; kk++)
		ldmatrix_x4(a[kk], qw + (lane % 16) * (D + FA_PAD) + 16 * kk + (lane / 16) * 8);
}

/*
 * S = Q K^T for 16 query rows (their A fragments qa) and the 8 NJ
 * positions whose K fragments kf gives (fa_kf16, fd_kq8).
 */
template <int D, int NJ, typename KF>
static __device__ __forceinline__ void
fa_scores(const uint32_t (&qa)[D / 16][4], const KF &kf, int lane, float (&s)[NJ][4])
{
#pragma unroll
	for (int j = 0; j < NJ; j++)
		s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
	for (int kk = 0; kk < D; kk += 16)
#pragma unroll
		for (int jj = 0; jj < NJ / 2; jj++) {
			uint32_t b[4];

			kf(kk, jj, lane, b);
			mma16816(s[2 * jj], qa[kk / 16], b);
			mma16816(s[2 * jj + 1], qa[kk / 16], b + 2);
		}
}

/* O += P V for the warp's rows, P the softmaxed scores of the 8 NJ positions from vb. */
template <int D, int NJ>
static __device__ __forceinline__ void
fa_values(const __half *vb, const float (&s)[NJ][4], int lane, float (&o)[D / 8][4])
{
	constexpr int LD = D + FA_PAD;

#pragma unroll
	for (int kk = 0; kk < NJ / 2; kk++) {
		/* the accumulators of two n8 tiles of S are the A fragment of one k16 step of P V */
		uint32_t a[4] = { pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
			pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]) };

#pragma unroll
		for (int j = 0; j < D / 16; j++) {
			uint32_t b[4];

			ldmatrix_x4_trans(b, vb + (16 * kk + ((lane / 8) % 2) * 8 + lane % 8) * LD + 16 * j + (lane / 16) * 8);
			mma16816(o[2 * j], a, b);
			mma16816(o[2 * j + 1], a, b + 2);
		}
	}
}

/*
 * Fills rows r0 .. r1 - 1 of stage st of fa_kernel<D, Q8>'s (or
 * fd_kernel's) shared memory (its fp16 stages ks, vs, or its q8 ones, q8s).
 */
template <int D, bool Q8>
static __device__ __forceinline__ void
fa_fill(__half *ks, __half *vs, int8_t *q8s, int st, const struct cuda_kv &kv, const int32_t *tab, int c0, int last,
    int nkv, int koff, int r0 = 0, int r1 = FA_KV)
{
	constexpr int LD = D + FA_PAD;

	if constexpr (Q8)
		fa_load_q8<D>(smem_addr(q8s + st * fa_q8_stage(D)), kv, tab, c0, last, r0, r1, nkv, koff);
	else
		fa_copy_rows<D, __half, LD * (int)sizeof(__half)>(smem_addr(ks + st * FA_KV * LD),
		    smem_addr(vs + st * FA_KV * LD), kv, tab, c0, last, r0, r1, nkv, koff);
}

/*
 * The rows of a thread's tile once its positions are done: normalized into
 * out (and their fp16 form into h16 if h16.h), or with n_split > 1 as
 * piece `split` of each row in part (its max in natural log, as
 * attn_kernel leaves it).
 */
template <int D>
static __device__ __forceinline__ void
fa_store(float *__restrict__ out, struct cuda_h16 h16, float *__restrict__ part, int n_split, int split,
    const struct cuda_heads &hp, const struct fa_row (&rows)[2], const float (&o)[D / 8][4], int t0, int kvh,
    int group)
{
	int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, col = 2 * (lane % 4);

#pragma unroll
	for (int i = 0; i < 2; i++) { /* unrolled: o stays in registers */
		int r = 16 * warp + lane / 4 + 8 * i, tok = r / group, h = kvh * group + r % group;
		size_t row = (size_t)(t0 + tok) * hp.n_head + h;
		float l = quad_sum(rows[i].l);

		if (!rows[i].live)
			continue;
		if (n_split > 1) {
			float *pr = part + (row * n_split + split) * (D + 2);
#pragma unroll
			for (int j = 0; j < D / 8; j++)
				*(float2 *)(pr + 8 * j + col) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
			if (col == 0)
				pr[D] = rows[i].m * LN2, pr[D + 1] = l;
			continue;
		}
		float f = softmax_norm(rows[i].m, l, hp.sinks, h, true);
#pragma unroll
		for (int j = 0; j < D / 8; j++) {
			float a = o[j][2 * i] * f, b = o[j][2 * i + 1] * f;

			*(float2 *)(out + row * D + 8 * j + col) = make_float2(a, b);
			if (h16.h != NULL)
				*(__half2 *)(h16.h + row * D + 8 * j + col) = __floats2half2_rn(a, b);
		}
		if (h16.h != NULL && h == 0 && col == 0)
			h16.scale[t0 + tok] = 1.0f;
	}
}

/* Block (tile blockIdx.x counted from the last, KV head blockIdx.y, piece blockIdx.z of n_split). */
template <int D, bool Q8>
__global__ void __launch_bounds__(FA_WARPS * WARP)
fa_kernel(const float *__restrict__ q, float *__restrict__ out, struct cuda_h16 h16, float *__restrict__ part,
    int n_split, struct cuda_heads hp, struct cuda_kv kv)
{
	pdl_wait();
	pdl_trigger();
	constexpr int LD = D + FA_PAD, NS = Q8 ? 1 : 2; /* fp16 stages */
	extern __shared__ __align__(16) unsigned char smem[];
	__half *qs = (__half *)smem, *ks = qs + FLASH_ROWS * LD, *vs = ks + NS * FA_KV * LD;
	int8_t *q8s = (int8_t *)(vs + NS * FA_KV * LD);
	int n_tiles = kv.fa_tiles[0];

	if ((int)blockIdx.x >= n_tiles)
		return;
	int tile = kv.fa_tiles[n_tiles - blockIdx.x]; /* the last tiles see the most positions: first */
	int t0 = FLASH_T0(tile), nt = FLASH_N(tile), kvh = blockIdx.y, group = hp.n_head / hp.n_head_kv;
	int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
	int p0 = kv.tok_pos[t0], last = p0 + nt - 1, nkv = hp.n_head_kv * D;
	int lo = hp.window > 0 ? max(0, p0 - hp.window + 1) : 0, c_begin = lo / FA_KV * FA_KV;
	/* this piece's whole K/V tiles: c_lo .. c_end (none past last; a piece may be empty) */
	int per = ((last - c_begin + n_split) / n_split + FA_KV - 1) / FA_KV * FA_KV;
	int c_lo = c_begin + (int)blockIdx.z * per, c_end = min(last, c_lo + per - 1);
	const int32_t *tab = kv.tables + kv.tok_tab[t0];
	struct fa_row rows[2];
	float o[D / 8][4];

	for (int i = 0; i < 2; i++) {
		int tok = (16 * warp + lane / 4 + 8 * i) / group;

		rows[i].pos = p0 + tok;
		rows[i].first = hp.window > 0 ? rows[i].pos - hp.window + 1 : 0;
		rows[i].live = tok < nt;
		rows[i].m = -INFINITY;
		rows[i].l = 0.0f;
	}
#pragma unroll
	for (int j = 0; j < D / 8; j++)
		o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
	fa_load_q<D, FLASH_ROWS>(qs, q, hp, t0, nt, kvh * group, group, group);
	if (c_lo <= c_end)
		fa_fill<D, Q8>(ks, vs, q8s, 0, kv, tab, c_lo, c_end, nkv, kvh * D);
	cp_async_commit();
	__syncthreads();
	uint32_t qa[D / 16][4];

	fa_q_frags<D>(qs + 16 * warp * LD, lane, qa);
	for (int c0 = c_lo, st = 0; c0 <= c_end; c0 += FA_KV, st ^= 1) {
		float s[8][4], corr[2];
		int at = Q8 ? 0 : st; /* the fp16 stage in use */
		/*
		 * Only tiles past the first token's position or before the last
		 * one's window need masks: the others are seen whole by every row
		 * (rows past the tile's tokens are never stored).
		 */
		bool edge = c0 + FA_KV - 1 > p0 || (hp.window > 0 && c0 < last - hp.window + 1);

		if (c0 + FA_KV <= c_end)
			fa_fill<D, Q8>(ks, vs, q8s, st ^ 1, kv, tab, c0 + FA_KV, c_end, nkv, kvh * D);
		cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();
		if constexpr (Q8) {
			fa_widen<D>(ks, vs, q8s + st * fa_q8_stage(D));
			__syncthreads();
		}
		fa_scores<D, 8>(qa, fa_kf16<D>{ ks + at * FA_KV * LD }, lane, s);
		fa_softmax<8>(rows, s, c0, lane, edge, 2, corr);
#pragma unroll
		for (int j = 0; j < D / 8; j++) {
			o[j][0] *= corr[0], o[j][1] *= corr[0];
			o[j][2] *= corr[1], o[j][3] *= corr[1];
		}
		fa_values<D, 8>(vs + at * FA_KV * LD, s, lane, o);
		__syncthreads(); /* the stage is refilled next */
	}
	cp_async_wait<0>();
	fa_store<D>(out, h16, part, n_split, (int)blockIdx.z, hp, rows, o, t0, kvh, group);
}

/*
 * Stages of fd_kernel, FD_STAGES - 1 tiles copied ahead of the one in use:
 * with one ahead (two stages) a block waited a whole memory latency a
 * tile. Three leave room for two blocks a multiprocessor (fp16, head_dim
 * 128) or three (q8): the kernel is bound by its warps' latencies, and
 * more of them hide more.
 */
#define FD_STAGES 3

/*
 * Shared memory of fd_kernel<D, Q8>: FD_ROWS query rows, then its stages of
 * K and V (fp16 or q8), then a decode step's new K and V rows (fd_new_token).
 */
static constexpr __host__ __device__ size_t
fd_smem_new(int d, bool q8)
{
	return (size_t)(FD_ROWS + (q8 ? 0 : 2 * FD_STAGES) * FA_KV) * (size_t)(d + FA_PAD) * sizeof(__half) +
	    (q8 ? FD_STAGES * fa_q8_stage(d) : 0);
}

static constexpr size_t
fd_smem_bytes(int d, bool q8)
{
	return fd_smem_new(d, q8) + 2 * (size_t)d * sizeof(float);
}

/*
 * K's B fragments from a q8 stage (fa_scores with queries in fa_load_q's
 * PERM order): a lane's fragment of position lane / 4 (and + 8) is one
 * 4-byte load of levels, widened and scaled in fp16 (h2_pairs) by the
 * scale in ksc, where fa_widen would store and load them.
 */
template <int D>
struct fd_kq8 {
	const int8_t *kb;
	const float *ksc;

	__device__ __forceinline__ void
	operator()(int kk, int jj, int lane, uint32_t b[4]) const
	{
		constexpr int RQ = D + FA_Q8_PAD, G = D / 32;
		const __half2 zero = __float2half2_rn(0.0f);

#pragma unroll
		for (int h = 0; h < 2; h++) {
			int p = 16 * jj + 8 * h + lane / 4;
			uint32_t w = *(const uint32_t *)(kb + p * RQ + kk + 4 * (lane % 4));

			h2_pairs(w ^ 0x80808080u, H_1152, __float2half2_rn(ksc[p * G + kk / 32]), zero, b + 2 * h);
		}
	}
};

/*
 * O += P V for the warp's rows, P the softmaxed scores of the 16 positions
 * of a q8 stage from vb (their scales from vsc). V's B fragment holds
 * two positions of one dimension a register, which a load of the rows
 * cannot give: a lane loads 4 levels of its position (lane / 4, and + 8)
 * from each 16 dimensions, widens them to two fp16 pairs (h2_pairs) and
 * movmatrix transposes each 8 x 8 of them. So n8 tile 2c + m of o holds
 * dimensions 16c + 4t + 2m and + 1 in its columns 2t, 2t + 1 (fd_dim).
 */
template <int D>
static __device__ __forceinline__ void
fd_values_q8(const int8_t *vb, const float *vsc, const float (&s)[2][4], int lane, float (&o)[D / 8][4])
{
	constexpr int RQ = D + FA_Q8_PAD, G = D / 32;
	const __half2 zero = __float2half2_rn(0.0f);
	uint32_t a[4] = { pack_half2(s[0][0], s[0][1]), pack_half2(s[0][2], s[0][3]), pack_half2(s[1][0], s[1][1]),
		pack_half2(s[1][2], s[1][3]) };

#pragma unroll
	for (int c = 0; c < D / 16; c++) {
		uint32_t x[2][2];

#pragma unroll
		for (int h = 0; h < 2; h++) {
			int p = lane / 4 + 8 * h;
			uint32_t w = *(const uint32_t *)(vb + p * RQ + 16 * c + 4 * (lane % 4));

			h2_pairs(w ^ 0x80808080u, H_1152, __float2half2_rn(vsc[p * G + c / 2]), zero, x[h]);
		}
#pragma unroll
		for (int m = 0; m < 2; m++) {
			uint32_t b[2] = { movmatrix_trans(x[0][m]), movmatrix_trans(x[1][m]) };

			mma16816(o[2 * c + m], a, b);
		}
	}
}

/* Where fa_load_q<D, ROWS, PERM> puts dimension d of a query row. */
template <bool PERM>
static __device__ __forceinline__ int
fa_q_slot(int d)
{
	int p = d % 16 / 2; /* the pair within its 16: slots 0, 4, 1, 5, 2, 6, 3, 7 */

	return PERM ? (d & ~15) + 2 * (p / 2 + 4 * (p % 2)) + d % 2 : d;
}

/*
 * cuda_qk's work for token t of a decode step (cuda_kv.k_new: each token
 * its sequence's only one), after pdl_wait, in fd_kernel's block of KV
 * head kvh and query heads h0 .. h0 + ng - 1: warp w rotates heads w,
 * w + FA_WARPS, ... into qs as fa_load_q lays them out (zeros past ng);
 * where own (the block whose piece holds pos), warp 0 rotates the new K
 * row and the block adds V's bias, into kn, and both go to the pool as
 * cuda_qk stores them, before the block copies that row. The same
 * arithmetic as qk_kernel and fa_load_q, so scores and pool are theirs
 * (but for the contraction of a multiply-add: within fp16's rounding of
 * q). l.q and l.k hold the lanes of each warp's first head and of K,
 * rotated to pos, loaded before pdl_wait (fd_new_lanes).
 */
template <int NP>
struct fd_lanes {
	qk_lane<NP> q, k;
};

/* A warp's fd_lanes at position pos: its first query head's (of h0 .. h0 + ng - 1) and warp 0's K head's where own. */
template <int NP>
static __device__ __forceinline__ void
fd_new_lanes(fd_lanes<NP> &l, const struct cuda_heads &hp, int h0, int ng, int kvh, int own, int pos)
{
	int warp = threadIdx.x / WARP, D = hp.head_dim;
	float fp = (float)pos / hp.pos_div;

	if (warp < ng)
		qk_lane_load(l.q, hp.bq != NULL ? hp.bq + (size_t)(h0 + warp) * D : NULL, hp.q_norm, hp, fp);
	if (own && warp == 0)
		qk_lane_load(l.k, hp.bk != NULL ? hp.bk + (size_t)kvh * D : NULL, hp.k_norm, hp, fp);
}

template <int D, bool Q8, int NP>
static __device__ __forceinline__ void
fd_new_token(__half *qs, float *kn, const float *q, const struct cuda_heads &hp, const struct cuda_kv &kv, int t,
    int pos, const int32_t *tab, int h0, int ng, int kvh, int own, const fd_lanes<NP> &l)
{
	constexpr int LD = D + FA_PAD;
	int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nkv = hp.n_head_kv * D;
	size_t kr = (size_t)t * nkv + (size_t)kvh * D; /* the token's K and V rows of this head */
	float a[NP], b[NP], sc = hp.scale * LOG2E;
	qk_lane<NP> c;

	for (int h = warp; h < FD_ROWS; h += FA_WARPS) {
		if (h >= ng) {
			for (int i = lane; i < D; i += WARP)
				qs[h * LD + i] = __float2half_rn(0.0f);
			continue;
		}
		if (h == warp)
			c = l.q;
		else
			qk_lane_load(c, hp.bq != NULL ? hp.bq + (size_t)(h0 + h) * D : NULL, hp.q_norm, hp,
			    (float)pos / hp.pos_div);
		qk_head(q + ((size_t)t * hp.n_head + h0 + h) * D, c, hp, a, b);
#pragma unroll
		for (int u = 0; u < NP; u++)
			if (lane + WARP * u < D / 2) {
				qs[h * LD + fa_q_slot<Q8>(c.ia[u])] = __float2half_rn(a[u] * sc);
				qs[h * LD + fa_q_slot<Q8>(c.ib[u])] = __float2half_rn(b[u] * sc);
			}
	}
	if (!own)
		return;
	if (warp == 0)
		qk_new_k<D>(kn, kv.k_new + kr, l.k, hp);
	for (int i = threadIdx.x; i < D; i += FA_WARPS * WARP)
		kn[D + i] = kv.v_new[kr + i] + (hp.bv != NULL ? hp.bv[(size_t)kvh * D + i] : 0.0f);
	__syncthreads();
	if constexpr (Q8) {
		if (warp < 2)
			kv_q8_row(kn + warp * D, kv, tab, pos, warp, nkv, kvh * D, D);
	} else {
		kv_put_rows((__half *)kv.pool, kv_index(kv, tab, pos, 0, nkv, kvh * D), kv_index(kv, tab, pos, 1, nkv, kvh * D),
		    kn, D, FA_WARPS * WARP);
	}
}

/* The first of the two dimensions in columns 2t, 2t + 1 (t = lane % 4) of n8 tile j of fd_kernel's o. */
template <bool Q8>
static __device__ __forceinline__ int
fd_dim(int j, int lane)
{
	return Q8 ? 16 * (j / 2) + 4 * (lane % 4) + 2 * (j % 2) : 8 * j + 2 * (lane % 4);
}

/*
 * The rows of a warp's softmax over its positions (max m in base 2, sums
 * l, weighted values o) added to the other warps' in shared memory
 * (free once the stages are read), each head's row then normalized or
 * stored as a piece by attn_out. Rows of heads past ng are not stored.
 */
template <int D, bool Q8>
static __device__ __forceinline__ void
fd_store(float *red, const struct fa_row (&rows)[2], const float (&o)[D / 8][4], int ng, int t, int h0, int split,
    int n_split, const struct cuda_heads &hp, float *out, struct cuda_q8 q8, struct cuda_h16 h16, float *part)
{
	int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, col = 2 * (lane % 4);
	float *ml = red + FA_WARPS * FD_ROWS * D; /* each warp's max, then sum, of each row */

#pragma unroll
	for (int i = 0; i < 2; i++) {
		int r = lane / 4 + 8 * i;
		float l = quad_sum(rows[i].l);

		if (r >= ng)
			continue;
#pragma unroll
		for (int j = 0; j < D / 8; j++)
			*(float2 *)(red + (warp * FD_ROWS + r) * D + fd_dim<Q8>(j, lane)) = make_float2(o[j][2 * i],
			    o[j][2 * i + 1]);
		if (col == 0)
			ml[warp * FD_ROWS + r] = rows[i].m, ml[(FA_WARPS + warp) * FD_ROWS + r] = l;
	}
	__syncthreads();
	for (int e = threadIdx.x; e < ng * D; e += FA_WARPS * WARP) {
		int r = e / D, d = e % D;
		float m = -INFINITY, l = 0.0f, v = 0.0f;

#pragma unroll
		for (int w = 0; w < FA_WARPS; w++)
			m = fmaxf(m, ml[w * FD_ROWS + r]);
#pragma unroll
		for (int w = 0; w < FA_WARPS; w++) {
			float mw = ml[w * FD_ROWS + r], f = mw == -INFINITY ? 0.0f : exp2f(mw - m);

			l += f * ml[(FA_WARPS + w) * FD_ROWS + r];
			v += f * red[(w * FD_ROWS + r) * D + d];
		}
		attn_out<D>(v, t, h0 + r, d, split, n_split, m * LN2, l, hp, out, q8, h16, part);
	}
}

/*
 * Decode tokens on the tensor cores. Block (token, piece of n_split)
 * blockIdx.x, (KV head, group of up to FD_ROWS of its query heads)
 * blockIdx.y: the heads are the rows of one m16 tile (zeros past them),
 * and the block walks its piece of the token's positions FA_KV at a time,
 * copied as fa_kernel's, S - 1 stages ahead (the first stages' rows that
 * earlier steps wrote before pdl_wait), each warp taking 16 of a stage's
 * positions with a softmax of its own; fd_store adds the four. A q8
 * stage's levels are read as they are (fd_kq8, fd_values_q8), each
 * warp its own rows. The split kernel converts and multiplies each K and
 * V element on the CUDA cores for every head, and at depth was bound by
 * issuing those instructions.
 */
template <int D, bool Q8>
__global__ void __launch_bounds__(FA_WARPS * WARP)
fd_kernel(const float *__restrict__ q, float *__restrict__ out, struct cuda_q8 q8, struct cuda_h16 h16,
    float *__restrict__ part, int n_split, struct cuda_heads hp, struct cuda_kv kv)
{
	constexpr int LD = D + FA_PAD, RQ = D + FA_Q8_PAD, G = D / 32, S = FD_STAGES;
	extern __shared__ __align__(16) unsigned char smem[];
	__half *qs = (__half *)smem, *ks = qs + FD_ROWS * LD, *vs = ks + S * FA_KV * LD;
	int8_t *q8s = (int8_t *)ks; /* q8 stages instead of fp16 ones */
	int t = blockIdx.x / n_split, split = blockIdx.x % n_split;
	int group = hp.n_head / hp.n_head_kv, ngb = (group + FD_ROWS - 1) / FD_ROWS;
	int kvh = blockIdx.y / ngb, h0 = kvh * group + (int)(blockIdx.y % ngb) * FD_ROWS;
	int ng = min(FD_ROWS, (kvh + 1) * group - h0), nkv = hp.n_head_kv * D;
	int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, w0 = 16 * warp;
	int pos = kv.tok_pos[t], p0 = hp.window > 0 && pos >= hp.window ? pos - hp.window + 1 : 0;
	int per = ((pos - p0 + n_split) / n_split + FA_KV - 1) / FA_KV * FA_KV;
	int lo = p0 + split * per, hi = min(lo + per, pos + 1), mine = !(kv.fa_tok != NULL && kv.fa_tok[t]);
	/* the first position of this step's tokens (a sequence has at most gridDim.x / n_split; with k_new, one) */
	int fresh = kv.k_new != NULL ? pos : pos + 1 - (int)(gridDim.x / n_split);
	const int32_t *tab = kv.tables + kv.tok_tab[t];
	int own = blockIdx.y % ngb == 0 && lo <= pos && pos < hi; /* with k_new: the block that stores the new row */
	struct fa_row rows[2];
	float o[D / 8][4];
	fd_lanes<(D / 2 + WARP - 1) / WARP> nl;

	/* the first S - 1 stages' rows that earlier steps wrote, before the wait */
	for (int i = 0, c0 = lo; mine && i < S - 1 && c0 < hi; i++, c0 += FA_KV)
		fa_fill<D, Q8>(ks, vs, q8s, i, kv, tab, c0, hi - 1, nkv, kvh * D, 0, max(0, min(FA_KV, fresh - c0)));
	if (kv.k_new != NULL)
		fd_new_lanes(nl, hp, h0, ng, kvh, own, pos);
	pdl_wait();
	if (!mine) { /* a prefill tile's token: fa_kernel has it */
		pdl_trigger();
		return;
	}
	for (int i = 0; i < 2; i++) {
		rows[i].pos = pos;
		rows[i].first = p0;
		rows[i].live = lane / 4 + 8 * i < ng;
		rows[i].m = -INFINITY;
		rows[i].l = 0.0f;
	}
#pragma unroll
	for (int j = 0; j < D / 8; j++)
		o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
	if (kv.k_new != NULL) { /* the new row is in the pool before any copy of it */
		fd_new_token<D, Q8>(qs, (float *)(smem + fd_smem_new(D, Q8)), q, hp, kv, t, pos, tab, h0, ng, kvh, own,
		    nl);
		__syncthreads();
	} else {
		fa_load_q<D, FD_ROWS, Q8>(qs, q, hp, t, 1, h0, FD_ROWS, ng);
	}
	/* one group of copies for each of the first S - 1 stages, empty past the piece */
	for (int i = 0, c0 = lo; i < S - 1; i++, c0 += FA_KV) {
		if (c0 < hi)
			fa_fill<D, Q8>(ks, vs, q8s, i, kv, tab, c0, hi - 1, nkv, kvh * D, max(0, min(FA_KV, fresh - c0)),
			    FA_KV);
		cp_async_commit();
	}
	__syncthreads(); /* the queries, read by every warp */
	uint32_t qa[D / 16][4];

	fa_q_frags<D>(qs, lane, qa);
	for (int c0 = lo, st = 0; c0 < hi; c0 += FA_KV, st = st + 1 < S ? st + 1 : 0) {
		int ahead = st == 0 ? S - 1 : st - 1; /* the stage used last, refilled with the tile S - 1 ahead */
		float s[2][4], corr[2];

		if (c0 + (S - 1) * FA_KV < hi)
			fa_fill<D, Q8>(ks, vs, q8s, ahead, kv, tab, c0 + (S - 1) * FA_KV, hi - 1, nkv, kvh * D);
		cp_async_commit();
		cp_async_wait<S - 1>();
		__syncthreads();
		if (c0 + w0 < hi) {
			bool edge = c0 + w0 < p0 || c0 + w0 + 15 > pos; /* a position of the warp's outside the window */
			/* a q8 stage: K's rows, V's, K's scales, V's (fa_load_q8) */
			const int8_t *kq = q8s + st * fa_q8_stage(D), *vq = kq + FA_KV * RQ;
			const float *ksc = (const float *)(vq + FA_KV * RQ), *vsc = ksc + FA_KV * G;

			if constexpr (Q8)
				fa_scores<D, 2>(qa, fd_kq8<D>{ kq + w0 * RQ, ksc + w0 * G }, lane, s);
			else
				fa_scores<D, 2>(qa, fa_kf16<D>{ ks + (st * FA_KV + w0) * LD }, lane, s);
			/* rows past ng (zero queries, zero scores) stay out of the softmax: P's rows of them stay 0 */
			fa_softmax<2>(rows, s, c0 + w0, lane, edge, ng > 8 ? 2 : 1, corr);
			/* deep in a context a row's max seldom moves: most tiles correct nothing */
			if (__any_sync(FULL_MASK, corr[0] != 1.0f || (ng > 8 && corr[1] != 1.0f))) {
#pragma unroll
				for (int j = 0; j < D / 8; j++) {
					o[j][0] *= corr[0], o[j][1] *= corr[0];
					if (ng > 8)
						o[j][2] *= corr[1], o[j][3] *= corr[1];
				}
			}
			if constexpr (Q8)
				fd_values_q8<D>(vq + w0 * RQ, vsc + w0 * G, s, lane, o);
			else
				fa_values<D, 2>(vs + (st * FA_KV + w0) * LD, s, lane, o);
		}
		__syncthreads(); /* the stage is refilled next */
	}
	cp_async_wait<0>();
	/* only now: the output product's blocks waiting beside this grid would hold back its later blocks */
	pdl_trigger();
	__syncthreads();
	fd_store<D, Q8>((float *)smem, rows, o, ng, t, h0, split, n_split, hp, out, q8, h16, part);
}

int
cuda_flash_usable(const struct cuda_heads *hd, int f32, int *tile_tokens)
{
	int group = hd->n_head / hd->n_head_kv;

	if (f32 || hd->head_dim % 32 != 0 || hd->head_dim > 256 || FLASH_ROWS % group != 0)
		return 0;
	*tile_tokens = FLASH_ROWS / group;
	return 1;
}

/* Launches fa_kernel<D, Q8> for the pool, whose shared-memory limit cuda_flash_setup raised. */
template <int D>
static int
fa_launch(const float *q, float *out, struct cuda_h16 h16, int n_split, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	dim3 grid((unsigned)kv->fa_grid, (unsigned)hd->n_head_kv, (unsigned)n_split);

	if (kv->q8)
		CK(cuda_launch(fa_kernel<D, true>, dim3(grid), dim3(FA_WARPS * WARP), fa_smem_bytes(D, true), st, q, out,
		    h16, kv->part, n_split, *hd, *kv));
	else
		CK(cuda_launch(fa_kernel<D, false>, dim3(grid), dim3(FA_WARPS * WARP), fa_smem_bytes(D, false), st, q,
		    out, h16, kv->part, n_split, *hd, *kv));
	return 0;
}

int
cuda_flash(const float *q, float *out, struct cuda_h16 h16, int n_split, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	if (kv->fa_grid < 1)
		return 0;
	if (n_split > 1 && kv->part == NULL)
		return err_set(err, ERR_INVAL, "cuda_flash: %d pieces and no scratch for them", n_split);
	switch (hd->head_dim) {
#define D_CASE(D) case D: return fa_launch<D>(q, out, h16, n_split, hd, kv, st, err);
	D_CASE(32) D_CASE(64) D_CASE(96) D_CASE(128) D_CASE(160) D_CASE(192) D_CASE(224) D_CASE(256)
#undef D_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "flash attention: head_dim %d", hd->head_dim);
	}
}

/* Launches fd_kernel<D, Q8> for the pool, whose shared-memory limit cuda_flash_setup raised. */
template <int D>
static int
fd_launch(dim3 grid, const float *q, float *out, struct cuda_q8 q8, struct cuda_h16 h16, int n_split,
    const struct cuda_heads *hd, const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	if (kv->q8)
		CK(cuda_launch(fd_kernel<D, true>, grid, dim3(FA_WARPS * WARP), fd_smem_bytes(D, true), st, q, out, q8, h16,
		    kv->part, n_split, *hd, *kv));
	else
		CK(cuda_launch(fd_kernel<D, false>, grid, dim3(FA_WARPS * WARP), fd_smem_bytes(D, false), st, q, out, q8,
		    h16, kv->part, n_split, *hd, *kv));
	return 0;
}

int
cuda_flash_decode(const float *q, float *out, struct cuda_q8 q8, struct cuda_h16 h16, int n_tok, int n_split,
    const struct cuda_heads *hd, const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	int group = hd->n_head / hd->n_head_kv;
	dim3 grid((unsigned)(n_tok * n_split), (unsigned)(hd->n_head_kv * ((group + FD_ROWS - 1) / FD_ROWS)));

	if (kv->f32 || kv->tok_end != NULL)
		return err_set(err, ERR_INVAL, "cuda_flash_decode: an fp32 pool or bidirectional tokens");
	if (kv->k_new != NULL && group > FD_ROWS)
		return err_set(err, ERR_UNSUPPORTED, "cuda_flash_decode: new tokens' raw rows for %d query heads a KV head "
		    "(a block's %d at most)", group, FD_ROWS);
	switch (hd->head_dim) {
#define D_CASE(D) case D: return fd_launch<D>(grid, q, out, q8, h16, n_split, hd, kv, st, err);
	D_CASE(32) D_CASE(64) D_CASE(96) D_CASE(128) D_CASE(160) D_CASE(192) D_CASE(224) D_CASE(256)
#undef D_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "decode attention on the tensor cores: head_dim %d", hd->head_dim);
	}
}

/* 1 if fd_kernel<D, Q8>'s shared memory fits a block of the current device, 0 if not, < 0 on a CUDA error. */
template <int D, bool Q8>
static int
fd_fits(char *err)
{
	int dev;

	CK(cudaGetDevice(&dev));
	return cuda_smem_fits(fd_smem_bytes(D, Q8), dev, err);
}

/* cuda_flash_decode_blocks for one head_dim and pool. */
template <int D, bool Q8>
static int
fd_blocks(int *per_sm, char *err)
{
	int fits = fd_fits<D, Q8>(err);

	*per_sm = 0;
	if (fits <= 0)
		return fits;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, fd_kernel<D, Q8>, FA_WARPS * WARP, fd_smem_bytes(D, Q8)));
	return 0;
}

int
cuda_flash_decode_blocks(int head_dim, int q8, int *per_sm, char *err)
{
	switch (head_dim) {
#define D_CASE(D) case D: return q8 ? fd_blocks<D, true>(per_sm, err) : fd_blocks<D, false>(per_sm, err);
	D_CASE(32) D_CASE(64) D_CASE(96) D_CASE(128) D_CASE(160) D_CASE(192) D_CASE(224) D_CASE(256)
#undef D_CASE
	default:
		*per_sm = 0;
		return 0;
	}
}

/* The decode kernel's limit for one pool, where its shared memory fits the device (else it is not used). */
template <int D, bool Q8>
static int
fd_setup(char *err)
{
	int fits = fd_fits<D, Q8>(err);

	return fits <= 0 ? fits : cuda_smem_limit(fd_kernel<D, Q8>, fd_smem_bytes(D, Q8), err);
}

template <int D>
static int
fa_setup(char *err)
{
	int rc = cuda_smem_limit(fa_kernel<D, false>, fa_smem_bytes(D, false), err);

	rc = rc != 0 ? rc : cuda_smem_limit(fa_kernel<D, true>, fa_smem_bytes(D, true), err);
	rc = rc != 0 ? rc : fd_setup<D, false>(err);
	return rc != 0 ? rc : fd_setup<D, true>(err);
}

int
cuda_flash_setup(int head_dim, char *err)
{
	switch (head_dim) {
#define D_CASE(D) case D: return fa_setup<D>(err);
	D_CASE(32) D_CASE(64) D_CASE(96) D_CASE(128) D_CASE(160) D_CASE(192) D_CASE(224) D_CASE(256)
#undef D_CASE
	default:
		return 0; /* not usable: cuda_flash_usable says so */
	}
}
