/*
 * attention.cu: RoPE and the KV write, then paged attention.
 *
 * cuda_attention gives each (token, head) a warp, four heads of a token to
 * a block (with grouped-query attention they share their K/V rows through
 * L1). The warp walks the token's visible positions 32 at a time: lane j
 * dots the query with the key of position c0 + j (the query sits in shared
 * memory), the chunk's scores update a running max and sum (online
 * softmax), then every lane adds the 32 weighted value rows for its
 * head_dim / 32 dimensions. Keys and values are read through the
 * sequence's block table, so a sequence's blocks need not be contiguous.
 */
#include "attention.cuh"

#define QK_WARPS 4
#define ATT_WARPS 4
#define MAX_PAIRS 4 /* head_dim <= 256: at most 4 rotation pairs per lane */

/* Element e of position p's K (kv 0) or V (kv 1) head kvh. */
static __device__ __forceinline__ size_t
kv_index(const struct cuda_kv &kv, const int32_t *tab, int p, int kvsel, int nkv, int head_off)
{
	size_t block = (size_t)tab[p / KV_BLOCK_TOKENS];

	return ((block * (size_t)kv.n_layer + (size_t)kv.layer) * 2 + (size_t)kvsel) * kv.kv_stride +
	    (size_t)(p % KV_BLOCK_TOKENS) * (size_t)nkv + (size_t)head_off;
}

/*
 * Warp j of the grid's y dimension: head j of token blockIdx.x, a query
 * head for j < n_head, else key head j - n_head (whose value head is stored
 * with it). Lane l rotates pairs l, l + 32, ...
 */
__global__ void __launch_bounds__(QK_WARPS * WARP)
qk_kernel(float *__restrict__ q, float *__restrict__ k, const float *__restrict__ v,
    struct cuda_heads hp, struct cuda_kv kv)
{
	int t = blockIdx.x, j = blockIdx.y * QK_WARPS + threadIdx.x / WARP, lane = threadIdx.x % WARP;
	int d = hp.head_dim, half = d / 2, nkv = hp.n_head_kv * d;
	int isq = j < hp.n_head, head = isq ? j : j - hp.n_head;
	float *vec = isq ? q + ((size_t)t * hp.n_head + head) * d : k + (size_t)t * nkv + (size_t)head * d;
	const float *bias = isq ? hp.bq : hp.bk, *nw = isq ? hp.q_norm : hp.k_norm;
	float a[MAX_PAIRS], b[MAX_PAIRS], ss = 0.0f, pos;
	int ia[MAX_PAIRS], ib[MAX_PAIRS];

	if (j >= hp.n_head + hp.n_head_kv)
		return;
#pragma unroll
	for (int u = 0; u < MAX_PAIRS; u++) {
		int i = lane + WARP * u;

		ia[u] = hp.neox ? i : 2 * i;
		ib[u] = hp.neox ? i + half : 2 * i + 1;
		a[u] = b[u] = 0.0f;
		if (i >= half)
			continue;
		a[u] = vec[ia[u]];
		b[u] = vec[ib[u]];
		if (bias != NULL) {
			a[u] += bias[(size_t)head * d + ia[u]];
			b[u] += bias[(size_t)head * d + ib[u]];
		}
		ss += a[u] * a[u] + b[u] * b[u];
	}
	if (nw != NULL) {
		float sc = 1.0f / sqrtf(warp_sum(ss) / (float)d + hp.nm.eps);

#pragma unroll
		for (int u = 0; u < MAX_PAIRS; u++) {
			if (lane + WARP * u >= half)
				continue;
			a[u] = a[u] * sc * (nw[ia[u]] + hp.nm.offset);
			b[u] = b[u] * sc * (nw[ib[u]] + hp.nm.offset);
		}
	}
	pos = (float)kv.tok_pos[t] / hp.pos_div;
	const int32_t *tab = kv.tables + kv.tok_tab[t];
	size_t ko = isq ? 0 : kv_index(kv, tab, kv.tok_pos[t], 0, nkv, head * d);
#pragma unroll
	for (int u = 0; u < MAX_PAIRS; u++) {
		int i = lane + WARP * u;
		float ang, c, s, x0, x1;

		if (i >= half)
			continue;
		ang = pos * hp.inv_freq[i];
		c = cosf(ang);
		s = sinf(ang);
		x0 = a[u] * c - b[u] * s;
		x1 = a[u] * s + b[u] * c;
		if (isq) {
			vec[ia[u]] = x0;
			vec[ib[u]] = x1;
		} else {
			kv.pool[ko + ia[u]] = __float2half_rn(x0);
			kv.pool[ko + ib[u]] = __float2half_rn(x1);
		}
	}
	if (isq)
		return;
	/* the value head rides with its key head */
	const float *vr = v + (size_t)t * nkv + (size_t)head * d;
	size_t vo = kv_index(kv, tab, kv.tok_pos[t], 1, nkv, head * d);
	for (int i = lane; i < d; i += WARP)
		kv.pool[vo + i] = __float2half_rn(vr[i] + (hp.bv != NULL ? hp.bv[(size_t)head * d + i] : 0.0f));
}

/* E consecutive halves at p as floats. */
template <int E>
static __device__ __forceinline__ void
load_halves(const __half *p, float *out)
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

/* head_dim = 32 * E. */
template <int E>
__global__ void __launch_bounds__(ATT_WARPS * WARP)
attn_kernel(const float *__restrict__ q, float *__restrict__ out, struct cuda_heads hp, struct cuda_kv kv)
{
	constexpr int D = WARP * E;
	__shared__ __align__(16) float qs[ATT_WARPS][D];
	int t = blockIdx.x, w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
	int h = blockIdx.y * ATT_WARPS + w, nkv = hp.n_head_kv * D;
	int pos = kv.tok_pos[t], p0 = 0;
	const int32_t *tab = kv.tables + kv.tok_tab[t];
	float m = -INFINITY, l = 0.0f, acc[E];

	if (h >= hp.n_head)
		return;
	int koff = h / (hp.n_head / hp.n_head_kv) * D;
	if (hp.window > 0 && pos >= hp.window)
		p0 = pos - hp.window + 1;
	for (int i = lane; i < D; i += WARP)
		qs[w][i] = q[((size_t)t * hp.n_head + h) * D + i];
	__syncwarp();
#pragma unroll
	for (int e = 0; e < E; e++)
		acc[e] = 0.0f;
	for (int c0 = p0; c0 <= pos; c0 += WARP) {
		int nv = min(WARP, pos - c0 + 1);
		float s = -INFINITY, pw, mn, corr;

		if (lane < nv) {
			const __half *kp = kv.pool + kv_index(kv, tab, c0 + lane, 0, nkv, koff);
			float dot = 0.0f, kf[8];

#pragma unroll 4
			for (int i = 0; i < D; i += 8) {
				load_halves<8>(kp + i, kf);
#pragma unroll
				for (int e = 0; e < 8; e++)
					dot += qs[w][i + e] * kf[e];
			}
			s = dot * hp.scale;
		}
		mn = fmaxf(m, warp_max(s));
		corr = expf(m - mn);
		pw = lane < nv ? expf(s - mn) : 0.0f;
		l = l * corr + warp_sum(pw);
		m = mn;
#pragma unroll
		for (int e = 0; e < E; e++)
			acc[e] *= corr;
#pragma unroll 4
		for (int jj = 0; jj < nv; jj++) {
			float wj = __shfl_sync(FULL_MASK, pw, jj), vf[E];

			load_halves<E>(kv.pool + kv_index(kv, tab, c0 + jj, 1, nkv, koff + lane * E), vf);
#pragma unroll
			for (int e = 0; e < E; e++)
				acc[e] += wj * vf[e];
		}
	}
#pragma unroll
	for (int e = 0; e < E; e++)
		out[((size_t)t * hp.n_head + h) * D + lane * E + e] = acc[e] / l;
}

int
cuda_qk(float *q, float *k, const float *v, int n_tok, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	dim3 grid((unsigned)n_tok, (unsigned)((hd->n_head + hd->n_head_kv + QK_WARPS - 1) / QK_WARPS));

	qk_kernel<<<grid, QK_WARPS * WARP, 0, st>>>(q, k, v, *hd, *kv);
	CK_LAUNCH("qk_kernel");
	return 0;
}

int
cuda_attention(const float *q, float *out, int n_tok, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	dim3 grid((unsigned)n_tok, (unsigned)((hd->n_head + ATT_WARPS - 1) / ATT_WARPS));

	switch (hd->head_dim / WARP) {
#define E_CASE(E) case E: attn_kernel<E><<<grid, ATT_WARPS * WARP, 0, st>>>(q, out, *hd, *kv); break;
	E_CASE(1) E_CASE(2) E_CASE(3) E_CASE(4) E_CASE(5) E_CASE(6) E_CASE(7) E_CASE(8)
#undef E_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "head_dim %d (a multiple of 32 up to 256 only)",
		    hd->head_dim);
	}
	CK_LAUNCH("attn_kernel");
	return 0;
}
