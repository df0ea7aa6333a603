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
 * cp.async, QG_AHEAD sub-steps ahead of their use. Each sub-step the
 * block's threads decode the weight tile of the next sub-step into fp16
 * (deq8<TYPE, false>: quant.c's arithmetic, then rounded to fp16, as the
 * cuBLAS path rounded its dequantized tiles) while the warps multiply the
 * current one with mma.sync m16n8k16 (fp16 in, float32 accumulation), so
 * the decoding hides under the tensor cores and the copies under both.
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
#include "dequant.cuh"
#include "tc.cuh"

/* Sub-steps of copies in flight ahead of the one being multiplied. */
#define QG_AHEAD 3
/* fp16 elements of a shared-memory tile row: 64 and 8 of padding, so ldmatrix meets no bank conflicts. */
#define QG_LDS 72
/* Most splits of K. */
#define QG_MAX_SPLIT 8

/* A tile shape: BM weight rows by BN tokens, warps WM x WN. */
template <int BM_, int BN_, int WM_, int WN_>
struct qg_cfg {
	static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_;
	static constexpr int THREADS = WM * WN * WARP;
	static constexpr int MT = BM / WM / 16; /* m16 tiles of a warp */
	static constexpr int NT = BN / WN / 8;  /* n8 tiles of a warp */
};

using qg_c16 = qg_cfg<64, 16, 4, 1>;
using qg_c32 = qg_cfg<64, 32, 4, 1>;
using qg_c64 = qg_cfg<64, 64, 4, 1>;
using qg_c128 = qg_cfg<128, 128, 2, 4>;

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
 * enough that the unit being refilled is never one still being decoded).
 * A unit's bytes are copied as the 16-byte aligned words covering them, so
 * a row's slot holds BYTES + 15 rounded up to 16.
 */
template <int TY, class C>
struct qg_smem {
	static constexpr int SUB = qg_unit<TY>::UNIT / 64;
	static constexpr int BR = QG_AHEAD + 1;
	static constexpr int RR = SUB > 1 ? 2 : QG_AHEAD;
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

/*
 * Queues the copies of sub-step g of this block's K range (g < S): the
 * tokens' fp16 tile, and the raw unit when g starts one. Always commits a
 * group, so that group g is sub-step g's.
 */
template <int TY, class C>
static __device__ __forceinline__ void
qg_issue(const struct qg_args &a, unsigned char *smem, int m0, int n0, int s0, int g, int S)
{
	using L = qg_smem<TY, C>;
	using U = qg_unit<TY>;

	if (g < S) {
		__half *bs = (__half *)(smem + L::B_OFF) + (size_t)(g % L::BR) * C::BN * QG_LDS;
		int k0 = (s0 + g) * 64;

		for (int i = threadIdx.x; i < C::BN * 8; i += C::THREADS) {
			int r = i / 8, c = i % 8, n = n0 + r;
			const __half *src = a.xh + (size_t)min(n, a.n_tok - 1) * a.k + k0 + 8 * c;

			cp_async16_zfill(bs + r * QG_LDS + 8 * c, src, n < a.n_tok ? 16 : 0);
		}
		if (g % L::SUB == 0) {
			uint8_t *raw = smem + L::R_OFF + (size_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
			size_t unit = (size_t)((s0 + g) / L::SUB) * U::BYTES;

			for (int i = threadIdx.x; i < C::BM * (L::RAW / 16); i += C::THREADS) {
				int r = i / (L::RAW / 16), j = i % (L::RAW / 16);
				const uint8_t *p = a.w + (size_t)min(m0 + r, a.n_rows - 1) * a.row_bytes + unit;
				const uint8_t *base = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)15);

				if (16 * j < (int)((uintptr_t)p & 15) + U::BYTES)
					cp_async16(raw + r * L::RAW + 16 * j, base + 16 * j);
			}
		}
	}
	cp_async_commit();
}

/* Decodes sub-step g's 64 elements of the block's BM rows from their raw unit into fp16 tile buf. */
template <int TY, class C>
static __device__ __forceinline__ void
qg_decode(const struct qg_args &a, unsigned char *smem, int m0, int s0, int g, int buf)
{
	using L = qg_smem<TY, C>;
	using U = qg_unit<TY>;
	const uint8_t *raw = smem + L::R_OFF + (size_t)((g / L::SUB) % L::RR) * C::BM * L::RAW;
	__half *as = (__half *)(smem + L::A_OFF) + (size_t)buf * C::BM * QG_LDS;
	size_t unit = (size_t)((s0 + g) / L::SUB) * U::BYTES;
	int part = g % L::SUB;

	for (int i = threadIdx.x; i < C::BM * 8; i += C::THREADS) {
		int r = i / 8, c = i % 8;
		uintptr_t p = (uintptr_t)(a.w + (size_t)min(m0 + r, a.n_rows - 1) * a.row_bytes + unit);
		float v[8];
		uint4 h;

		deq8<TY, false>(raw + r * L::RAW + (p & 15), 8 * part + c, v);
		h.x = pack_half2(v[0], v[1]), h.y = pack_half2(v[2], v[3]);
		h.z = pack_half2(v[4], v[5]), h.w = pack_half2(v[6], v[7]);
		*(uint4 *)(as + r * QG_LDS + 8 * c) = h;
	}
}

/* One sub-step of the warp's products: 4 x k16 over the decoded tile buf and token tile g. */
template <int TY, class C>
static __device__ __forceinline__ void
qg_mma(unsigned char *smem, int g, int buf, int wm0, int wn0, float (&acc)[C::MT][C::NT][4])
{
	using L = qg_smem<TY, C>;
	const __half *as = (const __half *)(smem + L::A_OFF) + (size_t)buf * C::BM * QG_LDS;
	const __half *bs = (const __half *)(smem + L::B_OFF) + (size_t)(g % L::BR) * C::BN * QG_LDS;
	int lane = threadIdx.x % WARP;

#pragma unroll
	for (int kk = 0; kk < 64; kk += 16) {
		uint32_t af[C::MT][4], bf[C::NT][2];

#pragma unroll
		for (int mt = 0; mt < C::MT; mt++)
			ldmatrix_x4(af[mt], as + (wm0 + 16 * mt + lane % 16) * QG_LDS + kk + (lane / 16) * 8);
#pragma unroll
		for (int j = 0; j < C::NT / 2; j++) {
			uint32_t r[4];

			ldmatrix_x4(r, bs + (wn0 + 16 * j + lane % 8 + (lane / 16) * 8) * QG_LDS + kk + ((lane / 8) % 2) * 8);
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
 * Block (blockIdx.x: BM rows, blockIdx.y: BN tokens, blockIdx.z: a split
 * of K's units). Pipeline, per sub-step g: wait for group g + 1 (the raw
 * unit the next decode reads) and the barrier; queue group g + QG_AHEAD;
 * decode g + 1 into the other fp16 tile; multiply g.
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
	for (int g = 0; g < QG_AHEAD; g++)
		qg_issue<TY, C>(a, smem, m0, n0, s0, g, S);
	cp_async_wait<QG_AHEAD - 1>();
	__syncthreads();
	if (S > 0)
		qg_decode<TY, C>(a, smem, m0, s0, 0, 0);
	for (int g = 0; g < S; g++) {
		cp_async_wait<QG_AHEAD - 2>();
		__syncthreads();
		qg_issue<TY, C>(a, smem, m0, n0, s0, g + QG_AHEAD, S);
		if (g + 1 < S)
			qg_decode<TY, C>(a, smem, m0, s0, g + 1, (g + 1) & 1);
		qg_mma<TY, C>(smem, g, g & 1, wm0, wn0, acc);
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
	/* enough for (blocks x splits) <= 4 blocks of 64 x 64 or one of 128 x 128 per multiprocessor */
	return (int64_t)sms * MAX(4 * qg_c64::BM * qg_c64::BN, qg_c128::BM * qg_c128::BN);
}
