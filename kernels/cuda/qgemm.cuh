/*
 * qgemm.cuh: what qgemm's two forms share (qgemm.cu's mma.sync form for
 * every device from sm_80, qgemm_wg.cu's wgmma form for sm_90a): each
 * type's decoding of its quantized units into the A fragments of an
 * m16n8k16 product (fp16 arithmetic alone, see qgemm.cu), a launch's
 * arguments, a warp's stores of its sums, and the host's plan of a
 * product's launches over a form: its tiles, the splits of K, the last
 * partial wave as a second launch. A form F gives its shape (F::Cfg), its
 * blocks a multiprocessor, its launch of a grid, whether it may split its
 * last wave and whether a split grid adds its sums in clusters.
 */
#ifndef RESIDENT_CUDA_QGEMM_CUH
#define RESIDENT_CUDA_QGEMM_CUH

#include "dequant.cuh"
#include "matmul.cuh"
#include "tc.cuh"

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

/*
 * Q4_K and Q5_K: sub-block g's 32 quants are the low (g even) or high
 * nibbles of 32 bytes at Q + 32 (g / 2); Q5_K (HI) adds bit g of byte l
 * of the 32 at 16 as the fifth bit. Both scale by k4_table's (d sc, dmin m).
 */
template <int Q, bool HI>
struct qg_k4 {
	static constexpr int UNIT = 256, TAB = 16;
	static __device__ __forceinline__ void
	table(const uint8_t *b, int, uint32_t *tab)
	{
		k4_table(b, tab);
	}
	template <bool WG = false>
	static __device__ __forceinline__ void
	frags(const uint8_t *b, const uint32_t *tab, int part, int t, uint32_t a[4][2])
	{
		const uint8_t *q = b + Q + 32 * part + QG_LANE(WG, t), *qh = b + 16 + QG_LANE(WG, t);

#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			int g = 2 * part + kk / 2;
			uint32_t x = (qg_quad<WG>(q + 16 * (kk & 1), t) >> (4 * (kk / 2))) & 0x0f0f0f0fu;

			if constexpr (HI)
				x |= ((qg_quad<WG>(qh + 16 * (kk & 1), t) >> g) & 0x01010101u) << 4;
			h2_pairs(x, H_1024, as_h2(tab[2 * g]), as_h2(tab[2 * g + 1]), a[kk]);
		}
	}
};

template <> struct qg_type<TT_Q4_K> : qg_k4<16, false> {
	static constexpr int BYTES = 144;
};

template <> struct qg_type<TT_Q5_K> : qg_k4<48, true> {
	static constexpr int BYTES = 176;
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

/*
 * The types of 32-element blocks that carry their own d (Q8_0, Q4_0,
 * Q5_0): a unit is two blocks, no table; k16 step kk reads block kk / 2,
 * whose half kk & 1 Q::word gives as biased bytes (Q::BIAS) for lane t.
 */
template <class Q>
struct qg_blocks {
	static constexpr int UNIT = 64, TAB = 0;
	static __device__ __forceinline__ void
	table(const uint8_t *, int, uint32_t *)
	{
	}
	static __device__ __forceinline__ void
	frags(const uint8_t *b, const uint32_t *, int, int t, uint32_t a[4][2])
	{
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			const uint8_t *blk = b + Q::BLOCK * (kk / 2);

			h2_pairs(Q::word(blk, kk & 1, t), Q::BIAS, smem_f16x2(blk), as_h2(0u), a[kk]);
		}
	}
};

/* Q8_0: two 34-byte blocks, d then 32 signed bytes. Only 2-byte aligned. */
template <> struct qg_type<TT_Q8_0> : qg_blocks<qg_type<TT_Q8_0>> {
	static constexpr int BYTES = 68, BLOCK = 34;
	static constexpr uint32_t BIAS = H_1152;
	static __device__ __forceinline__ uint32_t
	word(const uint8_t *blk, int half, int t)
	{
		return qg_word2(blk + 2 + 16 * half + 4 * t) ^ 0x80808080u;
	}
};

/* Q4_0: two 18-byte blocks, d then 16 bytes: elements 0..15 the low nibbles, 16..31 the high ones. */
template <> struct qg_type<TT_Q4_0> : qg_blocks<qg_type<TT_Q4_0>> {
	static constexpr int BYTES = 36, BLOCK = 18;
	static constexpr uint32_t BIAS = H_1032;
	static __device__ __forceinline__ uint32_t
	word(const uint8_t *blk, int half, int t)
	{
		return (qg_word2(blk + 2 + 4 * t) >> (4 * half)) & 0x0f0f0f0fu;
	}
};

/* Q5_0: two 22-byte blocks, d, 32 high bits, then Q4_0's nibbles. */
template <> struct qg_type<TT_Q5_0> : qg_blocks<qg_type<TT_Q5_0>> {
	static constexpr int BYTES = 44, BLOCK = 22;
	static constexpr uint32_t BIAS = H_1040;
	static __device__ __forceinline__ uint32_t
	word(const uint8_t *blk, int half, int t)
	{
		uint32_t qh = qg_word2(blk + 2) >> (16 * half + 4 * t);

		return ((qg_word2(blk + 6 + 4 * t) >> (4 * half)) & 0x0f0f0f0fu) | spread4(qh);
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

/* Adds the `split` partial sums in a.part into a's outputs, in split order (qgemm.cu). */
int qg_reduce(struct cuda_mm *m, const struct qg_args &a, int split, char *err);

/* The wgmma form's product of a weight of type `type` where cuda_qgemm_wg takes it (qgemm_wg.cu). */
int qw_product(struct cuda_mm *m, uint32_t type, const struct qg_args &a, char *err);

/* The wgmma form's shared-memory limits (qgemm_wg.cu). */
int qw_setup(char *err);


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
 * qg_store for tiles of many tokens (the wgmma form's 256): the scales of
 * a thread's 64 tokens do not fit in registers beside its sums, so each
 * is loaded once, in turn, and every row's destination worked out first.
 */
template <class C>
static __device__ __forceinline__ void
qg_store_wide(const struct qg_args &a, const float (&acc)[C::MT][C::NT][4], int r0, int t0, int z)
{
	int lane = threadIdx.x % WARP, gq = lane / 4, tq = 2 * (lane % 4);
	float *y[C::MT][2];
	int ld[C::MT][2];

#pragma unroll
	for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int row = r0 + 16 * mt + gq + 8 * h;

			ld[mt][h] = a.n_rows;
			y[mt][h] = row >= a.n_rows ? NULL : a.part != NULL ?
			    a.part + (size_t)z * a.n_tok * a.n_rows + row : mm_row(a.out, row, &ld[mt][h]);
		}
#pragma unroll
	for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
		for (int j = 0; j < 2; j++) {
			int tok = t0 + 8 * nt + tq + j;
			float sc;

			if (tok >= a.n_tok)
				continue;
			sc = a.part == NULL ? a.xscale[tok] : 1.0f;
#pragma unroll
			for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
				for (int h = 0; h < 2; h++)
					if (y[mt][h] != NULL)
						y[mt][h][(size_t)tok * ld[mt][h]] = acc[mt][nt][2 * h + j] * sc;
		}
}

/*
 * Splits of K for a grid of `blocks` tiles: enough to give every
 * multiprocessor its share, no more than the units of a split allow, and
 * as many as the partial sums' buffer holds.
 */
static inline int
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
	return qg_reduce(m, a, split, err);
}

/* The outputs of rows row0 and on of out, as rows from 0. */
static inline struct mm_out
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

/* a's product for its rows row0 and on, as rows from 0. */
static inline struct qg_args
qg_rows_of(struct qg_args a, int row0)
{
	a.w += (size_t)row0 * a.row_bytes;
	a.n_rows -= row0;
	a.out = qg_rows_from(a.out, row0);
	return a;
}

/*
 * Where a product in form F starts its second launch (0: it makes one).
 * When a prefill product's tiles take more than one wave of the GPU's
 * slots and leave a last wave under half full (llama3-8b's gate/up at 512
 * tokens: 448 tiles on 132 slots, four waves' time for 3.4 of work), the
 * tiles of its last rows, enough to hold that remainder, go to a second
 * launch, which splits their K to fill the GPU; the first launch is at
 * most whole waves. Only where F::SPLIT_REST, and where that K splits.
 */
template <int TY, class F>
static int
qg_rest_row(const struct cuda_mm *m, const struct qg_args &a)
{
	using C = typename F::Cfg;
	int64_t gx = (a.n_rows + C::BM - 1) / C::BM, gy = (a.n_tok + C::BN - 1) / C::BN;
	int64_t slots = (int64_t)m->sms * F::per_sm(), left = slots > 0 ? gx * gy % slots : 0;
	int64_t r = (left + gy - 1) / gy; /* row tiles of the remainder: 0 for none, gx for a single wave */
	int row0 = (int)(gx - r) * C::BM;

	if (!F::SPLIT_REST || r == 0 || r >= gx || 2 * left > slots)
		return 0;
	return qg_split_of<TY, F>(m, qg_rows_of(a, row0)) > 1 ? row0 : 0;
}

/* A product in form F: one launch, or two where qg_rest_row says. */
template <int TY, class F>
static int
qg_launch(struct cuda_mm *m, struct qg_args a, char *err)
{
	int row0 = qg_rest_row<TY, F>(m, a), rc;
	struct qg_args rest = qg_rows_of(a, row0);

	if (row0 == 0)
		return qg_grid<F>(m, a, qg_split_of<TY, F>(m, a), err);
	a.n_rows = row0;
	if ((rc = qg_grid<F>(m, a, qg_split_of<TY, F>(m, a), err)) != 0)
		return rc;
	return qg_grid<F>(m, rest, qg_split_of<TY, F>(m, rest), err);
}

#endif
