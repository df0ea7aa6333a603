/*
 * attention.cu: RoPE and the KV write, then paged attention.
 *
 * cuda_attention is flash decoding: a block takes one token, the (up to
 * four) query heads that share a KV head, and a share of the token's
 * visible positions. The context is split into several shares when too few
 * (token, KV head) pairs would fill the GPU (decode), so a long context is
 * read by many blocks at once; a merge kernel then combines the shares by
 * their softmax maxima and sums. The block copies tiles of 32 K and V rows
 * (128 with 16 warps, for launches of no more blocks than multiprocessors)
 * into shared memory asynchronously, a tile ahead, through the sequence's
 * block table (a sequence's blocks need not be contiguous); each K and V
 * row is read from memory once for all the heads of its group. Prefill
 * tiles (kv->fa_tiles) go to flash.cu's tensor-core kernel first; the
 * kernels here leave their tokens out. A decode step (each token its
 * sequence's only one) has no qk launch where the product cannot do its
 * work: the attention blocks do it (attn_new_token).
 */
#include "attention.cuh"
#include "tc.cuh"

#define QK_WARPS 4
#define ATT_GROUP 4      /* query heads of one KV head per attention block, a warp each */
#define ATT_WARPS ATT_GROUP
#define KV_PAD_BYTES 16  /* after each row of a tile in shared memory: no bank conflicts */
#define ATT_WAVES 4      /* attention blocks per multiprocessor worth splitting a context for */
/*
 * Warps of an attention block when the launch is one wave of such blocks,
 * at most ATT_WIDE_PER_SM a multiprocessor (one sequence's first 4,096
 * positions, 32 sequences' first 128): with four warps a block that was
 * alone on its multiprocessor ran one warp a scheduler, and a tile of 32
 * positions cost 1.4-1.7 us a layer (H100), latency exposed at every
 * instruction. Sixteen warps take tiles of 128 positions (a short
 * context's whole share) in one stage. Two a multiprocessor: one sequence
 * at depth 4,096 3 % faster than blocks of four warps (32 sequences the same).
 */
#define ATT_WIDE_WARPS 16
#define ATT_WIDE_PER_SM 2
#define MAX_PAIRS 4 /* head_dim <= 256: at most 4 rotation pairs per lane */

/*
 * Warp j of the grid's y dimension: head j of token blockIdx.x, a query
 * head for j < n_head, else key head j - n_head (whose value head is stored
 * with it). T: the pool's element type (int8_t: q8 rows, attention.cuh).
 */
template <typename T>
__global__ void __launch_bounds__(QK_WARPS * WARP)
qk_kernel(float *__restrict__ q, float *__restrict__ k, const float *__restrict__ v,
    struct cuda_heads hp, struct cuda_kv kv)
{
	T *pool = (T *)kv.pool;
	int t = blockIdx.x, j = blockIdx.y * QK_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
	int d = hp.head_dim, half = d / 2, nkv = hp.n_head_kv * d;
	int isq = j < hp.n_head, head = isq ? j : j - hp.n_head, live = j < hp.n_head + hp.n_head_kv;
	float *vec = isq ? q + ((size_t)t * hp.n_head + head) * d : k + (size_t)t * nkv + (size_t)head * d;
	const float *bias = isq ? hp.bq : hp.bk;
	float a[MAX_PAIRS], b[MAX_PAIRS];
	qk_lane<MAX_PAIRS> c;
	constexpr bool Q8 = sizeof(T) == 1;

	int pos = kv.tok_pos[t];
	const int32_t *tab = kv.tables + kv.tok_tab[t];
	size_t blk = 0;

	if (live) { /* weights, positions and tables: none is written by the kernel before */
		qk_lane_load(c, bias != NULL ? bias + (size_t)head * d : NULL, isq ? hp.q_norm : hp.k_norm, hp,
		    (float)pos / hp.pos_div);
		blk = isq ? 0 : (size_t)tab[pos / KV_BLOCK_TOKENS];
	}
	pdl_wait();
	pdl_trigger();
	if (!live)
		return;
	qk_head(vec, c, hp, a, b);
	size_t ko = isq ? 0 : kv_at(kv, blk, pos, 0, nkv, head * d);
#pragma unroll
	for (int u = 0; u < MAX_PAIRS; u++) {
		if (lane + WARP * u >= half)
			continue;
		if constexpr (!Q8) {
			if (!isq) {
				pool[ko + c.ia[u]] = kv_elem<T>(a[u]);
				pool[ko + c.ib[u]] = kv_elem<T>(b[u]);
				continue;
			}
		}
		vec[c.ia[u]] = a[u]; /* q, or a q8 row, which is quantized from vec by groups of lanes */
		vec[c.ib[u]] = b[u];
	}
	if (isq)
		return;
	/* the value head rides with its key head */
	const float *vr = v + (size_t)t * nkv + (size_t)head * d;
	const float *bv = hp.bv != NULL ? hp.bv + (size_t)head * d : NULL;
	if constexpr (Q8) {
		__syncwarp();
		kv_q8_row(vec, kv, tab, pos, 0, nkv, head * d, d);
		for (int g = 0; g < d; g += WARP) /* the biased V row, through vec (K's is stored) */
			vec[g + lane] = vr[g + lane] + (bv != NULL ? bv[g + lane] : 0.0f);
		__syncwarp();
		kv_q8_row(vec, kv, tab, pos, 1, nkv, head * d, d);
	} else {
		size_t vo = kv_at(kv, blk, pos, 1, nkv, head * d);

		for (int i = lane; i < d; i += WARP)
			pool[vo + i] = kv_elem<T>(vr[i] + (bv != NULL ? bv[i] : 0.0f));
	}
}

/* E consecutive pool elements at p as floats. */
template <int E>
static __device__ __forceinline__ void
load_kv(const float *p, float *out)
{
	if constexpr (E % 4 == 0) {
#pragma unroll
		for (int i = 0; i < E; i += 4) {
			float4 f = *(const float4 *)(p + i);

			out[i] = f.x, out[i + 1] = f.y, out[i + 2] = f.z, out[i + 3] = f.w;
		}
	} else {
#pragma unroll
		for (int i = 0; i < E; i++)
			out[i] = p[i];
	}
}

template <int E>
static __device__ __forceinline__ void
load_kv(const __half *p, float *out)
{
	if constexpr (E % 8 == 0) {
#pragma unroll
		for (int i = 0; i < E; i += 8) {
			uint4 u = *(const uint4 *)(p + i);
			const __half2 *h2 = (const __half2 *)&u;
#pragma unroll
			for (int k = 0; k < 4; k++) {
				float2 f = __half22float2(h2[k]);
				out[i + 2 * k] = f.x;
				out[i + 2 * k + 1] = f.y;
			}
		}
	} else if constexpr (E % 2 == 0) {
#pragma unroll
		for (int i = 0; i < E; i += 2) {
			float2 f = __half22float2(*(const __half2 *)(p + i));
			out[i] = f.x;
			out[i + 1] = f.y;
		}
	} else {
#pragma unroll
		for (int i = 0; i < E; i++)
			out[i] = __half2float(p[i]);
	}
}

/* Elements of pool type T after each row of a shared-memory tile. */
template <typename T>
static constexpr __host__ __device__ int
kv_pad(void)
{
	return KV_PAD_BYTES / (int)sizeof(T);
}

/* Positions of a tile, and its stages, for an attention block of w warps. */
static constexpr __host__ __device__ int
att_tile(int w)
{
	return 8 * w;
}

/*
 * A q8 pool's (T int8_t) four: its tiles are half an fp16 tile's bytes, and
 * with two stages its blocks kept half the bytes in flight, and a step of
 * one sequence at depth 16,384 read 1.4 TB/s where fp16's read 1.9 (H200).
 */
template <typename T>
static constexpr __host__ __device__ int
att_stages(int w)
{
	return w > ATT_WARPS ? 1 : sizeof(T) == 1 ? 4 : 2;
}

/* Scales of a q8 (T int8_t) row of head_dim d in a tile: one float a 32; none for other tiles. */
template <typename T>
static constexpr __host__ __device__ int
kv_groups(int d)
{
	return sizeof(T) == 1 ? d / 32 : 0;
}

/*
 * Shared memory of attn_kernel for head_dim d and w warps: the stages of K
 * and V tiles (with a q8 pool, T int8_t, its rows as they are, then their
 * scales), the queries, a tile's scores (then weights, and with q8 the
 * weights scaled for each group) of every head, each head's correction
 * (then its max and sum), the token's new K and V rows (cuda_kv.k_new) and
 * with q8 their levels and scales.
 */
template <typename T>
static size_t
attn_smem_bytes(int d, int w)
{
	size_t tiles = (size_t)att_stages<T>(w) * 2 * att_tile(w) *
	    ((d + kv_pad<T>()) * sizeof(T) + kv_groups<T>(d) * sizeof(float));

	return tiles + (size_t)(ATT_GROUP * d + ATT_GROUP * att_tile(w) * (1 + kv_groups<T>(d)) + 2 * ATT_GROUP + 2 * d) *
	    sizeof(float) +
	    (sizeof(T) == 1 ? 2 * (size_t)d + 2 * kv_groups<T>(d) * sizeof(float) : 0);
}

/*
 * Copies the K and V rows r0 .. r1 - 1 (< the tile's positions) of the tile of
 * positions from c0, KV head offset koff, into a stage: every thread of the
 * block issues its share of 16-byte copies, all in flight at once; a q8
 * pool's rows as they are, and their scales into ksc and vsc. The row of
 * position np (-1: none) is not in the pool yet: it is stored from kn (its
 * K, then its V, as floats) instead, or with q8 from kq (its K levels, V
 * levels, K scales, V scales, as attn_new_token quantized kn).
 */
template <int D, typename T>
static __device__ __forceinline__ void
attn_load_tile(T *ks, T *vs, float *ksc, float *vsc, const struct cuda_kv &kv, const int32_t *tab, int c0, int r0,
    int r1, int nkv, int koff, int np = -1, const float *kn = NULL, const int8_t *kq = NULL)
{
	constexpr int PER = 16 / (int)sizeof(T), PIECES = D / PER, RS = D + kv_pad<T>(), G = kv_groups<T>(D);
	const T *pool = (const T *)kv.pool;

	for (int i = threadIdx.x; i < (r1 - r0) * PIECES; i += blockDim.x) {
		int r = r0 + i / PIECES, c = (i % PIECES) * PER;
		size_t ko;

		if (c0 + r == np) { /* no block table read: after pdl_wait it would be one more round trip */
			if constexpr (G > 0) {
				*(uint4 *)(ks + r * RS + c) = *(const uint4 *)(kq + c);
				*(uint4 *)(vs + r * RS + c) = *(const uint4 *)(kq + D + c);
			} else {
#pragma unroll
				for (int e = 0; e < PER; e++) {
					ks[r * RS + c + e] = kv_elem<T>(kn[c + e]);
					vs[r * RS + c + e] = kv_elem<T>(kn[D + c + e]);
				}
			}
			continue;
		}
		ko = kv_index(kv, tab, c0 + r, 0, nkv, koff + c);
		cp_async16(ks + r * RS + c, pool + ko);
		cp_async16(vs + r * RS + c, pool + ko + kv.kv_stride);
	}
	if constexpr (G > 0)
		for (int i = threadIdx.x; i < (r1 - r0) * G; i += blockDim.x) {
			int r = r0 + i / G, g = i % G;
			size_t so;

			if (c0 + r == np) {
				ksc[r * G + g] = ((const float *)(kq + 2 * D))[g];
				vsc[r * G + g] = ((const float *)(kq + 2 * D))[G + g];
				continue;
			}
			so = kv_scale_index(kv, tab, c0 + r, 0, nkv, koff + 32 * g);
			cp_async4(ksc + r * G + g, (const int8_t *)pool + so);
			cp_async4(vsc + r * G + g, (const int8_t *)pool + so + kv.kv_stride);
		}
}

/*
 * The scores of position j of a tile against every head of the block: the
 * four lanes of the position (qq = 0..3, 8 lanes apart, so that the 8
 * lanes of a shared-memory phase read 8 rows' same quarter, in distinct
 * banks, against one broadcast query quarter) each dot a quarter of its
 * dimensions, then sum their parts. Lane qq returns head qq's. A q8
 * tile's (T int8_t) eight levels at a time are dotted with the queries and
 * the sum scaled by their group's scale in ksc (a quarter of a row is
 * whole groups, or half of one).
 */
template <int D, typename T>
static __device__ __forceinline__ float
attn_scores(const T *kt, const float *ksc, const float *qs, int j, int nv, int qq)
{
	constexpr int QD = D / 4, RS = D + kv_pad<T>(), G = kv_groups<T>(D);
	float sc[ATT_GROUP], v;

#pragma unroll
	for (int h = 0; h < ATT_GROUP; h++)
		sc[h] = 0.0f;
	if (j < nv) {
#pragma unroll 2
		for (int i = 0; i < QD; i += 8) {
			float kf[8], d = 1.0f;

			if constexpr (G > 0) {
				uint2 u = *(const uint2 *)(kt + j * RS + qq * QD + i);

				d = ksc[j * G + (qq * QD + i) / 32];
				i8x4_float(u.x, kf);
				i8x4_float(u.y, kf + 4);
			} else {
				load_kv<8>(kt + j * RS + qq * QD + i, kf);
			}
#pragma unroll
			for (int h = 0; h < ATT_GROUP; h++) {
				const float *qh = qs + h * D + qq * QD + i;
				float4 qa = *(const float4 *)qh, qb = *(const float4 *)(qh + 4);
				float part = qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
				    qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];

				sc[h] += G > 0 ? d * part : part;
			}
		}
	}
	v = sc[0];
#pragma unroll
	for (int h = 0; h < ATT_GROUP; h++) {
		sc[h] += __shfl_xor_sync(FULL_MASK, sc[h], 8);
		sc[h] += __shfl_xor_sync(FULL_MASK, sc[h], 16);
		v = qq == h ? sc[h] : v;
	}
	return j < nv ? v : -INFINITY;
}

/*
 * Warp g's part of a tile's softmax (TILE positions, nv of them there):
 * for head g if it has one (live), its scores in ws folded into its
 * running max *m and sum *l and left as weights, its correction in cs[g];
 * else weights and correction 0 (nothing to weigh). With a q8 pool's G
 * groups a row, the weights times each group's V scale (vst) follow, a
 * TILE of weights a group: a value is then its level times its weight.
 */
template <int TILE, int G>
static __device__ __forceinline__ void
attn_softmax(float *ws, float *cs, int g, int live, int nv, float *m, float *l, const float *vst)
{
	int lane = threadIdx.x % WARP;
	float s[TILE / WARP], mx = -INFINITY, sum = 0.0f, mn, corr;

	if (!live) {
#pragma unroll
		for (int k = 0; k < TILE / WARP; k++) {
			ws[(lane + WARP * k) * ATT_GROUP + g] = 0.0f;
#pragma unroll
			for (int gg = 0; gg < G; gg++)
				ws[((1 + gg) * TILE + lane + WARP * k) * ATT_GROUP + g] = 0.0f;
		}
		if (lane == 0)
			cs[g] = 0.0f;
		return;
	}
#pragma unroll
	for (int k = 0; k < TILE / WARP; k++)
		mx = fmaxf(mx, s[k] = ws[(lane + WARP * k) * ATT_GROUP + g]);
	mn = fmaxf(*m, warp_max(mx));
	corr = expf(*m - mn);
#pragma unroll
	for (int k = 0; k < TILE / WARP; k++) {
		int j = lane + WARP * k;
		float p = j < nv ? expf(s[k] - mn) : 0.0f;

		ws[j * ATT_GROUP + g] = p;
#pragma unroll
		for (int gg = 0; gg < G; gg++) /* past nv the scales are whatever the stage held */
			ws[((1 + gg) * TILE + j) * ATT_GROUP + g] = j < nv ? p * vst[j * G + gg] : 0.0f;
		sum += p;
	}
	*l = *l * corr + warp_sum(sum);
	*m = mn;
	if (lane == 0)
		cs[g] = corr;
}

/* The warp of an attention block of W warps that rotates the new K row: a free one if there is. */
template <int W>
static constexpr __host__ __device__ int
attn_k_warp(void)
{
	return W > ATT_GROUP ? ATT_GROUP : 0;
}

/*
 * cuda_qk's work for token t of a decode step (each token its sequence's
 * only one), in the attention block of that token's KV head kvh
 * (cuda_kv.k_new) at position pos, in pool block blk
 * (both read before pdl_wait): warp g rotates query head h0 + g
 * (of ng) from q into qs, scaled, by cq (its qk_lane), or zeroes it past
 * ng; warp attn_k_warp rotates the new K row by ck and every thread adds
 * the new V row's bias (vb, its dimensions threadIdx.x + i W 32), into kn
 * (K then V, as floats) for the tile that holds the token's position; the
 * block of the first query group whose share holds that position (own)
 * stores both into the pool for the steps after. The same arithmetic as
 * qk_kernel's, so the pool and the scores are the same as with it: with a
 * q8 pool (T int8_t) every block quantizes kn into kq (attn_load_tile's
 * form of it).
 */
template <int D, typename T, int W, int NP, int NV>
static __device__ void
attn_new_token(const float *q, float *qs, float *kn, int8_t *kq, const struct cuda_heads &hp,
    const struct cuda_kv &kv, int t, int pos, size_t blk, int h0, int ng, int kvh, int own, const qk_lane<NP> &cq,
    const qk_lane<NP> &ck, const float (&vb)[NV])
{
	int g = threadIdx.x / WARP, lane = threadIdx.x % WARP, nkv = hp.n_head_kv * D;
	size_t kr = (size_t)t * nkv + (size_t)kvh * D; /* the token's K and V rows of this head */
	float a[NP], b[NP], vn[NV];

	/* V first: its loads on their way with the heads', not a round trip after them (+700 cycles, H200) */
#pragma unroll
	for (int i = 0; i < NV; i++) {
		int d = threadIdx.x + i * W * WARP;

		vn[i] = d < D ? kv.v_new[kr + d] : 0.0f;
	}
	if (g < ATT_GROUP && g < ng) {
		qk_head(q + ((size_t)t * hp.n_head + h0 + g) * D, cq, hp, a, b);
#pragma unroll
		for (int u = 0; u < NP; u++)
			if (lane + WARP * u < D / 2)
				qs[g * D + cq.ia[u]] = a[u] * hp.scale, qs[g * D + cq.ib[u]] = b[u] * hp.scale;
	} else if (g < ATT_GROUP) {
		for (int i = lane; i < D; i += WARP)
			qs[g * D + i] = 0.0f;
	}
	if (g == attn_k_warp<W>())
		qk_new_k<D>(kn, kv.k_new + kr, ck, hp);
#pragma unroll
	for (int i = 0; i < NV; i++) {
		int d = threadIdx.x + i * W * WARP;

		if (d < D)
			kn[D + d] = vn[i] + vb[i];
	}
	__syncthreads();
	if constexpr (sizeof(T) == 1) {
		/* warp g a group of 32 at a time: K's groups, then V's */
		int8_t *pool = (int8_t *)kv.pool;
		float *sc = (float *)(kq + 2 * D);

		for (int i = g * WARP; i < 2 * D; i += W * WARP) {
			int sel = i >= D, c = kvh * D + i - sel * D;

			kv_q8_put(kn[i + lane], kq + i + lane, sc + i / WARP);
			if (own) {
				pool[kv_at(kv, blk, pos, sel, nkv, c + lane)] = kq[i + lane];
				if (lane == 0)
					*(float *)(pool + kv_scale_at(kv, blk, pos, sel, nkv, c)) = sc[i / WARP];
			}
		}
		__syncthreads();
		return;
	}
	if (!own)
		return;
	kv_put_rows((T *)kv.pool, kv_at(kv, blk, pos, 0, nkv, kvh * D), kv_at(kv, blk, pos, 1, nkv, kvh * D), kn, D,
	    W * WARP);
}

/*
 * Flash decoding over the paged pool. Block (token t, split s) of
 * blockIdx.x, and a group of up to ATT_GROUP query heads sharing one KV
 * head (blockIdx.y), W warps: the block walks its share of the token's
 * visible positions 8 W at a time, the tiles copied into shared memory
 * asynchronously, with 4 warps one ahead of their use (two stages; a q8
 * pool's three ahead), with
 * more one at a time (one stage: a short context's share is one tile).
 * Each K and V element is read and converted once for all the heads (with
 * a warp a head, each was four times, and the kernel issue-bound: at depth
 * 16,384 the issue slots were 47 % busy for 58 % of DRAM, ncu on an H100).
 * Scores: four lanes a position, a quarter of its dimensions each
 * (attn_scores). Softmax: warp h (h < ATT_GROUP) folds head h's scores into
 * its running max and sum (online softmax) and leaves their weights
 * (attn_softmax). Values: each thread accumulates, for every head, its
 * dimensions (DPT of them, NT apart) over the tile's positions,
 * or where head_dim is under NT, over every NPG-th position, the groups'
 * sums added at the end. With one split the output is normalized in place
 * (and its int8 form written to q8 if q8.q, its fp16 form to h16 if h16.h,
 * for the output product); else
 * the piece (weighted values, max, sum) goes to part for attn_merge.
 * A q8 pool's tiles (T int8_t) are its levels as they are, with their
 * scales beside them: a score is the dot of the levels with the queries
 * times the group's scale, a value a level times its scale; a level
 * becomes a float by a byte permute and an add (i8x4_float).
 */
template <int E, typename T, int W>
__global__ void __launch_bounds__(W * WARP)
attn_kernel(const float *__restrict__ q, float *__restrict__ out, struct cuda_q8 q8, struct cuda_h16 h16,
    float *__restrict__ part,
    int n_split, struct cuda_heads hp, struct cuda_kv kv)
{
	constexpr int D = WARP * E, RS = D + kv_pad<T>(), NT = W * WARP, TILE = att_tile(W), S = att_stages<T>(W);
	constexpr int NPG = D < NT ? NT / D : 1, TG = NT / NPG, DPT = (D + TG - 1) / TG, G = kv_groups<T>(D);
	static_assert(ATT_GROUP == 4 && W >= ATT_GROUP, "four lanes a position, one head each");
	static_assert(TG % WARP == 0, "a warp's threads hold 32 dimensions of a row");
	static_assert(TILE * RS * sizeof(T) % 16 == 0, "stages of whole 16 bytes");
	extern __shared__ __align__(16) unsigned char smem[];
	T *ks = (T *)smem, *vs = ks + S * TILE * RS;
	float *ksc = (float *)(vs + S * TILE * RS), *vsc = ksc + S * TILE * G; /* q8 scales */
	float *qs = vsc + S * TILE * G, *ws = qs + ATT_GROUP * D, *cs = ws + ATT_GROUP * TILE * (1 + G);
	float *kn = cs + 2 * ATT_GROUP;
	int8_t *kq = (int8_t *)(kn + 2 * D); /* with q8: kn's levels, then scales */
	int t = blockIdx.x / n_split, split = blockIdx.x % n_split;
	int g = threadIdx.x / WARP, lane = threadIdx.x % WARP, pg = threadIdx.x / TG, di = threadIdx.x % TG;
	int group = hp.n_head / hp.n_head_kv, ngb = (group + ATT_GROUP - 1) / ATT_GROUP;
	int kvh = blockIdx.y / ngb, h0 = kvh * group + (blockIdx.y % ngb) * ATT_GROUP;
	int ng = min(ATT_GROUP, (kvh + 1) * group - h0), nkv = hp.n_head_kv * D;
	int fa = kv.fa_tok != NULL && kv.fa_tok[t]; /* the tensor-core kernel has this token */
	int pos = kv.tok_pos[t], seq_end = kv.tok_end != NULL && kv.tok_end[t] >= 0 ? kv.tok_end[t] : -1;
	int p0 = seq_end >= 0 ? (hp.window > 0 ? max(0, pos - hp.window / 2) : 0) :
	    hp.window > 0 && pos >= hp.window ? pos - hp.window + 1 : 0;
	int end = seq_end >= 0 ? (hp.window > 0 ? min(seq_end, pos + hp.window / 2) : seq_end) : pos;
	int per = ((end - p0 + 1 + n_split - 1) / n_split + TILE - 1) / TILE * TILE;
	int lo = p0 + split * per, hi = min(lo + per, end + 1);
	const int32_t *tab = kv.tables + kv.tok_tab[t];
	int np = kv.k_new != NULL ? pos : -1; /* the row attn_new_token makes */
	float m = -INFINITY, l = 0.0f, acc[ATT_GROUP][DPT];
	/*
	 * The first S tiles fill the stages. Their rows older than every
	 * token of the step (a sequence has at most gridDim.x / n_split of
	 * them) were written by earlier steps: their copies start before
	 * pdl_wait, under the kernel before (the positions and tables are the
	 * step's staged copy, done before its first kernel); the rows of the
	 * step's tokens are copied after it. With k_new every token is its
	 * sequence's only one, so only its own row is new.
	 */
	int fresh = kv.k_new != NULL ? pos : max(pos, seq_end) + 1 - (int)(gridDim.x / n_split);
	int pre = fa || lo >= hi ? 0 : min(S, (hi - lo + TILE - 1) / TILE);
	constexpr int NP = (D / 2 + WARP - 1) / WARP, NV = (D + NT - 1) / NT;
	qk_lane<NP> cq = {}, ck = {};
	float vb[NV] = {};
	size_t blk = 0;

	if (kv.k_new != NULL) { /* attn_new_token's weights, and where its row goes */
		blk = (size_t)tab[pos / KV_BLOCK_TOKENS];
		if (g < ATT_GROUP && g < ng)
			qk_lane_load(cq, hp.bq != NULL ? hp.bq + (size_t)(h0 + g) * D : NULL, hp.q_norm, hp,
			    (float)pos / hp.pos_div);
		if (g == attn_k_warp<W>())
			qk_lane_load(ck, hp.bk != NULL ? hp.bk + (size_t)kvh * D : NULL, hp.k_norm, hp,
			    (float)pos / hp.pos_div);
#pragma unroll
		for (int i = 0; i < NV; i++) {
			int d = threadIdx.x + i * NT;

			vb[i] = hp.bv != NULL && d < D ? hp.bv[(size_t)kvh * D + d] : 0.0f;
		}
	}
	for (int i = 0, c0 = lo; i < pre; i++, c0 += TILE)
		attn_load_tile<D, T>(ks + i * TILE * RS, vs + i * TILE * RS, ksc + i * TILE * G, vsc + i * TILE * G, kv,
		    tab, c0, 0, max(0, min(min(TILE, hi - c0), fresh - c0)), nkv, kvh * D);
	pdl_wait();
	/*
	 * Only after the wait: the kernel after this one waits for it alone, and
	 * reads what the tensor-core kernel before it wrote.
	 */
	if (fa)
		return;
	if (kv.k_new != NULL) /* the pool's row is stored by one block of the KV head's: the share that holds it */
		attn_new_token<D, T, W>(q, qs, kn, kq, hp, kv, t, pos, blk, h0, ng, kvh,
		    blockIdx.y % ngb == 0 && lo <= pos && pos < hi, cq, ck, vb);
	else
		for (int i = threadIdx.x; i < ATT_GROUP * D; i += NT)
			qs[i] = i / D < ng ? q[((size_t)t * hp.n_head + h0) * D + i] * hp.scale : 0.0f;
#pragma unroll
	for (int h = 0; h < ATT_GROUP; h++)
#pragma unroll
		for (int k = 0; k < DPT; k++)
			acc[h][k] = 0.0f;
	for (int i = 0, c0 = lo; i < pre; i++, c0 += TILE) {
		int nv = min(TILE, hi - c0);

		attn_load_tile<D, T>(ks + i * TILE * RS, vs + i * TILE * RS, ksc + i * TILE * G, vsc + i * TILE * G, kv,
		    tab, c0, max(0, min(nv, fresh - c0)), nv, nkv, kvh * D, np, kn, kq);
	}
	/*
	 * One group for the first tiles, then S - 1 empty ones, then one a
	 * tile (tile i + S, copied into tile i's stage once it is used, or
	 * none): when tile i is used, S - 1 groups have followed its own.
	 */
#pragma unroll
	for (int i = 0; i < S; i++)
		cp_async_commit();
	for (int c0 = lo, st = 0; c0 < hi; c0 += TILE, st = st + 1 < S ? st + 1 : 0) {
		int nv = min(TILE, hi - c0), j = 8 * g + lane % 8;
		const T *kt = ks + st * TILE * RS, *vt = vs + st * TILE * RS;
		const float *kst = ksc + st * TILE * G, *vst = vsc + st * TILE * G;

		cp_async_wait<S - 1>();
		__syncthreads();
		ws[j * ATT_GROUP + lane / 8] = attn_scores<D, T>(kt, kst, qs, j, nv, lane / 8);
		__syncthreads();
		if (g < ATT_GROUP)
			attn_softmax<TILE, G>(ws, cs, g, g < ng, nv, &m, &l, vst);
		__syncthreads();
#pragma unroll
		for (int h = 0; h < ATT_GROUP; h++)
#pragma unroll
			for (int k = 0; k < DPT; k++)
				acc[h][k] *= cs[h];
#pragma unroll 4
		for (int jj = pg; jj < nv; jj += NPG) {
			float4 w = *(const float4 *)(ws + jj * ATT_GROUP);

#pragma unroll
			for (int k = 0; k < DPT; k++) {
				int d = di + k * TG;
				float v;

				if (d >= D)
					break;
				if constexpr (G > 0) { /* a warp's 32 dimensions are one group: its weights, scaled */
					w = *(const float4 *)(ws + ((1 + d / 32) * TILE + jj) * ATT_GROUP);
					v = __int_as_float(0x4B000000 | ((uint8_t)vt[jj * RS + d] ^ 0x80)) - 8388736.0f;
				} else {
					load_kv<1>(vt + jj * RS + d, &v);
				}
				acc[0][k] += w.x * v, acc[1][k] += w.y * v, acc[2][k] += w.z * v, acc[3][k] += w.w * v;
			}
		}
		__syncthreads(); /* the stage and the weights are refilled next */
		if (c0 + S * TILE < hi)
			attn_load_tile<D, T>(ks + st * TILE * RS, vs + st * TILE * RS, ksc + st * TILE * G, vsc + st * TILE * G,
			    kv, tab, c0 + S * TILE, 0, min(TILE, hi - c0 - S * TILE), nkv, kvh * D, np, kn, kq);
		cp_async_commit();
	}
	cp_async_wait<0>();
	/*
	 * Only now may the next kernel launch: launched at the start, the output
	 * product's blocks waited beside this grid's later waves with their
	 * shared memory taken (llama3-8b at 64 sequences 3 % slower, H200).
	 */
	pdl_trigger();
	if (g < ng && lane == 0)
		cs[g] = m, cs[ATT_GROUP + g] = l;
	if constexpr (NPG > 1) {
		/*
		 * The position groups' sums, through the stages' memory (free
		 * now), then a warp for each 32 dimensions of a head: left to
		 * the first group's threads, the sums and stores of four heads
		 * one after another were a quarter of the one-token kernel (H100).
		 */
		float *red = (float *)smem;

		__syncthreads();
#pragma unroll
		for (int h = 0; h < ATT_GROUP; h++)
			red[h * NT + threadIdx.x] = acc[h][0];
		__syncthreads();
		for (int e = threadIdx.x; e < ng * D; e += NT) {
			int h = e / D, d = e % D;
			float o = red[h * NT + d];

#pragma unroll
			for (int r = 1; r < NPG; r++)
				o += red[h * NT + r * TG + d];
			attn_out<D>(o, t, h0 + h, d, split, n_split, cs[h], cs[ATT_GROUP + h], hp, out, q8, h16, part);
		}
		return;
	}
	__syncthreads();
	for (int h = 0; h < ng; h++)
#pragma unroll
		for (int k = 0; k < DPT; k++)
			if (di + k * TG < D)
				attn_out<D>(acc[h][k], t, h0 + h, di + k * TG, split, n_split, cs[h], cs[ATT_GROUP + h], hp,
				    out, q8, h16, part);
}

/*
 * The pieces of (token, head) blockIdx.x merged, a thread a dimension
 * (blockDim.x == d): each weighted by e^(its max - the max of all)
 * (log-sum-exp), divided by the weighted sum; the result's int8 form also
 * into q8 if q8.q, its fp16 form into h16 if h16.h. Piece 0 is never empty; empty ones have max -inf and weigh nothing. The
 * maxima and sums are read once into shared memory, so that the values'
 * loads, one per piece and thread, are all independent.
 */
__global__ void
attn_merge_kernel(const float *__restrict__ part, float *__restrict__ out, struct cuda_q8 q8, struct cuda_h16 h16,
    int n_split, int d, int n_head, const float *__restrict__ sinks)
{
	pdl_wait();
	pdl_trigger();
	__shared__ float wm[ATT_MAX_SPLITS], wl[ATT_MAX_SPLITS];
	const float *pr = part + (size_t)blockIdx.x * n_split * (d + 2);
	float mx = -INFINITY, l = 0.0f, acc = 0.0f;

	for (int s = threadIdx.x; s < n_split; s += blockDim.x)
		wm[s] = pr[s * (d + 2) + d], wl[s] = pr[s * (d + 2) + d + 1];
	__syncthreads();
	for (int s = 0; s < n_split; s++)
		mx = fmaxf(mx, wm[s]);
#pragma unroll 8
	for (int s = 0; s < n_split; s++) {
		float w = wm[s] == -INFINITY ? 0.0f : expf(wm[s] - mx);

		l += w * wl[s];
		acc += w * pr[s * (d + 2) + threadIdx.x];
	}
	acc *= softmax_norm(mx, l, sinks, blockIdx.x % n_head);
	out[(size_t)blockIdx.x * d + threadIdx.x] = acc;
	if (q8.q != NULL) /* whole warps: blockDim.x == d, a multiple of 32 */
		q8_store1(q8, blockIdx.x / n_head, n_head * d, (blockIdx.x % n_head) * d + threadIdx.x, acc);
	if (h16.h != NULL)
		f16_store1(h16, blockIdx.x / n_head, (size_t)blockIdx.x * d + threadIdx.x,
		    blockIdx.x % n_head == 0 && threadIdx.x == 0, acc);
}

int
cuda_qk(float *q, float *k, const float *v, int n_tok, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	dim3 grid((unsigned)n_tok, (unsigned)((hd->n_head + hd->n_head_kv + QK_WARPS - 1) / QK_WARPS));

	if (kv->q8)
		CK(cuda_launch(qk_kernel<int8_t>, dim3(grid), dim3(QK_WARPS * WARP), 0, st, q, k, v, *hd, *kv));
	else if (kv->f32)
		CK(cuda_launch(qk_kernel<float>, dim3(grid), dim3(QK_WARPS * WARP), 0, st, q, k, v, *hd, *kv));
	else
		CK(cuda_launch(qk_kernel<__half>, dim3(grid), dim3(QK_WARPS * WARP), 0, st, q, k, v, *hd, *kv));
	return 0;
}

int64_t
cuda_attention_part_rows(int device)
{
	int sms = 0;

	if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
		return 0;
	return (int64_t)ATT_WAVES * sms * ATT_GROUP;
}

/*
 * attn_wide_splits: ATT_WIDE_WARPS' threads split into whole groups of
 * head_dim WARP * E (a multiple of 32 a group). attn_wide_fits: 1 if that
 * width's shared memory fits a block on device dev, -1 on a CUDA error.
 */
template <int E>
static constexpr bool attn_wide_splits = (ATT_WIDE_WARPS * WARP) % (WARP * E) == 0;

template <int E, typename T>
static int
attn_wide_fits(int dev, char *err)
{
	return cuda_smem_fits(attn_smem_bytes<T>(WARP * E, ATT_WIDE_WARPS), dev, err);
}

/* Lets attn_kernel<E, T, W> have its shared memory on the current device. */
template <int E, typename T, int W>
static int
attn_smem_limit(char *err)
{
	return cuda_smem_limit(attn_kernel<E, T, W>, attn_smem_bytes<T>(WARP * E, W), err);
}

/* Both widths, the wide one where it serves (launches never raise the limit: see cuda_attention_setup). */
template <int E, typename T>
static int
attn_smem_limits_t(char *err)
{
	int rc = attn_smem_limit<E, T, ATT_WARPS>(err), wide, dev;

	if constexpr (attn_wide_splits<E>) {
		if (rc != 0)
			return rc;
		CK(cudaGetDevice(&dev));
		if ((wide = attn_wide_fits<E, T>(dev, err)) <= 0)
			return wide;
		return attn_smem_limit<E, T, ATT_WIDE_WARPS>(err);
	}
	return rc;
}

/* Every pool: fp16, fp32 (exact), q8. */
template <int E>
static int
attn_smem_limits(char *err)
{
	int rc = attn_smem_limits_t<E, __half>(err);

	rc = rc != 0 ? rc : attn_smem_limits_t<E, float>(err);
	return rc != 0 ? rc : attn_smem_limits_t<E, int8_t>(err);
}

int
cuda_attention_setup(int head_dim, char *err)
{
	int rc = cuda_flash_setup(head_dim, err);

	if (rc != 0)
		return rc;
	switch (head_dim / WARP) {
#define E_CASE(E) case E: return attn_smem_limits<E>(err);
	E_CASE(1) E_CASE(2) E_CASE(3) E_CASE(4) E_CASE(5) E_CASE(6) E_CASE(7) E_CASE(8)
#undef E_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "head_dim %d (a multiple of 32 up to 256 only)", head_dim);
	}
}

/* cuda_attention_wide_blocks for pool type T. */
template <int E, typename T>
static int
attn_wide_blocks_t(int *per_sm, char *err)
{
	*per_sm = 0;
	if constexpr (attn_wide_splits<E>) {
		int dev, fits;

		CK(cudaGetDevice(&dev));
		if ((fits = attn_wide_fits<E, T>(dev, err)) <= 0)
			return fits;
		CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, attn_kernel<E, T, ATT_WIDE_WARPS>,
		    ATT_WIDE_WARPS * WARP, attn_smem_bytes<T>(WARP * E, ATT_WIDE_WARPS)));
		*per_sm = MIN(*per_sm, ATT_WIDE_PER_SM);
	}
	return 0;
}

int
cuda_attention_wide_blocks(int head_dim, int q8, int f32, int *per_sm, char *err)
{
	switch (head_dim / WARP) {
#define E_CASE(E) \
	case E: \
		return q8 ? attn_wide_blocks_t<E, int8_t>(per_sm, err) : \
		    f32 ? attn_wide_blocks_t<E, float>(per_sm, err) : attn_wide_blocks_t<E, __half>(per_sm, err);
		E_CASE(1) E_CASE(2) E_CASE(3) E_CASE(4) E_CASE(5) E_CASE(6) E_CASE(7) E_CASE(8)
#undef E_CASE
	default:
		*per_sm = 0;
		return 0;
	}
}

/*
 * Launches attn_kernel<E, T, W> with its shared memory (cuda_attention_setup
 * raised the limit): ATT_WIDE_WARPS where that width serves the head_dim
 * and the grid is one wave of it (kv->wide blocks a multiprocessor), else
 * ATT_WARPS.
 */
template <int E, typename T>
static int
attn_launch_t(dim3 grid, const float *q, float *out, struct cuda_q8 q8, struct cuda_h16 h16, float *part,
    int n_split, const struct cuda_heads *hd, const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	if constexpr (attn_wide_splits<E>) {
		if (kv->wide > 0 && (int64_t)grid.x * grid.y <= (int64_t)kv->wide * kv->sms) {
			CK(cuda_launch(attn_kernel<E, T, ATT_WIDE_WARPS>, grid, dim3(ATT_WIDE_WARPS * WARP),
			    attn_smem_bytes<T>(WARP * E, ATT_WIDE_WARPS), st, q, out, q8, h16, part, n_split, *hd, *kv));
			return 0;
		}
	}
	CK(cuda_launch(attn_kernel<E, T, ATT_WARPS>, grid, dim3(ATT_WARPS * WARP), attn_smem_bytes<T>(WARP * E, ATT_WARPS),
	    st, q, out, q8, h16, part, n_split, *hd, *kv));
	return 0;
}

/* attn_launch_t for the pool's element type (a q8 pool's levels, whatever the mode: the sums are float's). */
template <int E>
static int
attn_launch(dim3 grid, const float *q, float *out, struct cuda_q8 q8, struct cuda_h16 h16, float *part,
    int n_split, const struct cuda_heads *hd, const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	if (kv->q8)
		return attn_launch_t<E, int8_t>(grid, q, out, q8, h16, part, n_split, hd, kv, st, err);
	if (kv->f32)
		return attn_launch_t<E, float>(grid, q, out, q8, h16, part, n_split, hd, kv, st, err);
	return attn_launch_t<E, __half>(grid, q, out, q8, h16, part, n_split, hd, kv, st, err);
}

int
cuda_attention_splits(int n_tok, const struct cuda_heads *hd, const struct cuda_kv *kv)
{
	int group = hd->n_head / hd->n_head_kv, ngb = (group + ATT_GROUP - 1) / ATT_GROUP;
	int64_t base = (int64_t)n_tok * hd->n_head_kv * ngb, target = (int64_t)ATT_WAVES * kv->sms; /* a busy device */

	if (kv->dec_tc > 0) { /* one wave of the tensor-core kernel's blocks: each piece a block's whole work */
		base = (int64_t)n_tok * hd->n_head_kv * ((group + FD_ROWS - 1) / FD_ROWS);
		target = (int64_t)kv->dec_tc * kv->sms;
	}
	if (kv->part == NULL || base >= target)
		return 1;
	return (int)MAX(1, MIN(MIN(target / base, (int64_t)ATT_MAX_SPLITS), kv->part_rows / ((int64_t)n_tok * hd->n_head)));
}

int
cuda_attention(const float *q, float *out, struct cuda_q8 q8, struct cuda_h16 h16, int n_tok,
    const struct cuda_heads *hd, const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	int group = hd->n_head / hd->n_head_kv, ngb = (group + ATT_GROUP - 1) / ATT_GROUP, rc;
	int64_t n_split;

	if (q8.q != NULL && kv->fa_tiles != NULL)
		return err_set(err, ERR_INVAL, "cuda_attention: an int8 form of the prefill tiles' rows");
	if (h16.h != NULL && kv->f32)
		return err_set(err, ERR_INVAL, "cuda_attention: an fp16 form of values from an fp32 pool");
	if (kv->sms < 1)
		return err_set(err, ERR_INVAL, "cuda_attention: the device's multiprocessors are not set");
	n_split = MIN(cuda_attention_splits(n_tok, hd, kv), ((int64_t)kv->max_len + ATT_SPLIT_MIN - 1) / ATT_SPLIT_MIN);
	n_split = MAX(n_split, 1);
	/* the tiles split as the other tokens do: one merge then serves every row */
	if (kv->fa_tiles != NULL && (rc = cuda_flash(q, out, h16, (int)n_split, hd, kv, st, err)) != 0)
		return rc;
	dim3 grid((unsigned)(n_tok * n_split), (unsigned)(hd->n_head_kv * ngb));

	if (kv->dec_tc > 0) {
		rc = cuda_flash_decode(q, out, q8, h16, n_tok, (int)n_split, hd, kv, st, err);
	} else {
		switch (hd->head_dim / WARP) {
#define E_CASE(E) \
	case E: \
		rc = attn_launch<E>(grid, q, out, q8, h16, kv->part, (int)n_split, hd, kv, st, err); \
		break;
		E_CASE(1) E_CASE(2) E_CASE(3) E_CASE(4) E_CASE(5) E_CASE(6) E_CASE(7) E_CASE(8)
#undef E_CASE
		default:
			return err_set(err, ERR_UNSUPPORTED, "head_dim %d (a multiple of 32 up to 256 only)",
			    hd->head_dim);
		}
	}
	if (rc != 0 || n_split == 1)
		return rc;
	CK(cuda_launch(attn_merge_kernel, dim3((unsigned)(n_tok * hd->n_head)), dim3(hd->head_dim), 0, st, kv->part,
	    out, q8, h16, (int)n_split, hd->head_dim, hd->n_head, hd->sinks));
	return 0;
}
