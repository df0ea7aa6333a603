/*
 * attention.cu: RoPE and the KV write, then paged attention.
 *
 * cuda_attention is flash decoding: a block takes one token, the (up to
 * four) query heads that share a KV head, and a share of the token's
 * visible positions. The context is split into several shares when too few
 * (token, KV head) pairs would fill the GPU (decode), so a long context is
 * read by many blocks at once; a merge kernel then combines the shares by
 * their softmax maxima and sums. The block copies tiles of 32 K and V rows
 * into shared memory asynchronously, a tile ahead, through the sequence's
 * block table (a sequence's blocks need not be contiguous); each K and V
 * row is read from memory once for all the heads of its group. Prefill
 * tiles (kv->fa_tiles) go to flash.cu's tensor-core kernel first; the
 * kernels here leave their tokens out.
 */
#include "attention.cuh"
#include "tc.cuh"

#define QK_WARPS 4
#define ATT_GROUP 4      /* query heads of one KV head per attention block, a warp each */
#define ATT_WARPS ATT_GROUP
#define ATT_TILE 32      /* positions per tile: one per lane */
#define KV_PAD_BYTES 16  /* after each row of a tile in shared memory: no bank conflicts */
#define ATT_WAVES 4      /* attention blocks per multiprocessor worth splitting a context for */
#define MAX_PAIRS 4 /* head_dim <= 256: at most 4 rotation pairs per lane */

/*
 * Warp j of the grid's y dimension: head j of token blockIdx.x, a query
 * head for j < n_head, else key head j - n_head (whose value head is stored
 * with it). Lane l rotates pairs l, l + 32, ...
 */
/* x as a pool element of type T. */
template <typename T>
static __device__ __forceinline__ T
kv_elem(float x)
{
	if constexpr (sizeof(T) == sizeof(float))
		return x;
	else
		return __float2half_rn(x);
}

template <typename T>
__global__ void __launch_bounds__(QK_WARPS * WARP)
qk_kernel(float *__restrict__ q, float *__restrict__ k, const float *__restrict__ v,
    struct cuda_heads hp, struct cuda_kv kv)
{
	pdl_wait();
	pdl_trigger();
	T *pool = (T *)kv.pool;
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
			pool[ko + ia[u]] = kv_elem<T>(x0);
			pool[ko + ib[u]] = kv_elem<T>(x1);
		}
	}
	if (isq)
		return;
	/* the value head rides with its key head */
	const float *vr = v + (size_t)t * nkv + (size_t)head * d;
	size_t vo = kv_index(kv, tab, kv.tok_pos[t], 1, nkv, head * d);
	for (int i = lane; i < d; i += WARP)
		pool[vo + i] = kv_elem<T>(vr[i] + (hp.bv != NULL ? hp.bv[(size_t)head * d + i] : 0.0f));
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

/* Shared memory of attn_kernel for head_dim d: two stages of K and V tiles, the queries. */
template <typename T>
static size_t
attn_smem_bytes(int d)
{
	return (size_t)2 * 2 * ATT_TILE * (d + kv_pad<T>()) * sizeof(T) + (size_t)ATT_GROUP * d * sizeof(float);
}

/*
 * Copies the K and V rows of positions c0 .. c0 + nv - 1 (nv <= ATT_TILE) of
 * KV head offset koff into a stage: every thread of the block issues its
 * share of 16-byte copies, all in flight at once.
 */
template <int D, typename T>
static __device__ __forceinline__ void
attn_load_tile(T *ks, T *vs, const struct cuda_kv &kv, const int32_t *tab, int c0, int nv,
    int nkv, int koff)
{
	constexpr int PER = 16 / (int)sizeof(T), PIECES = D / PER, RS = D + kv_pad<T>();
	const T *pool = (const T *)kv.pool;

	for (int i = threadIdx.x; i < nv * PIECES; i += ATT_WARPS * WARP) {
		int r = i / PIECES, c = (i % PIECES) * PER;
		size_t ko = kv_index(kv, tab, c0 + r, 0, nkv, koff + c);

		cp_async16(ks + r * RS + c, pool + ko);
		cp_async16(vs + r * RS + c, pool + ko + kv.kv_stride);
	}
}

/*
 * Flash decoding over the paged pool. Block (token t, split s) of
 * blockIdx.x, and a group of up to ATT_GROUP query heads sharing one KV
 * head (blockIdx.y): the block walks its share of the token's visible
 * positions ATT_TILE at a time, the tiles copied into shared memory
 * asynchronously one ahead of their use; warp g keeps query head g's
 * running max, sum and weighted values (online softmax): lane j scores
 * position j of the tile, then each lane accumulates its E dimensions over
 * the tile's values. With one split the output is normalized in place;
 * else the piece (weighted values, max, sum) goes to part for attn_merge.
 */
template <int E, typename T>
__global__ void __launch_bounds__(ATT_WARPS * WARP)
attn_kernel(const float *__restrict__ q, float *__restrict__ out, float *__restrict__ part, int n_split,
    struct cuda_heads hp, struct cuda_kv kv)
{
	pdl_wait();
	pdl_trigger();
	constexpr int D = WARP * E, RS = D + kv_pad<T>();
	extern __shared__ __align__(16) unsigned char smem[];
	T *ks = (T *)smem, *vs = ks + 2 * ATT_TILE * RS;
	float *qs = (float *)(vs + 2 * ATT_TILE * RS);
	int t = blockIdx.x / n_split, split = blockIdx.x % n_split;
	int g = threadIdx.x / WARP, lane = threadIdx.x % WARP;
	int group = hp.n_head / hp.n_head_kv, ngb = (group + ATT_GROUP - 1) / ATT_GROUP;
	int kvh = blockIdx.y / ngb, h0 = kvh * group + (blockIdx.y % ngb) * ATT_GROUP;
	int ng = min(ATT_GROUP, (kvh + 1) * group - h0), h = h0 + g, nkv = hp.n_head_kv * D;
	if (kv.fa_tok != NULL && kv.fa_tok[t])
		return; /* the tensor-core kernel has it */
	int pos = kv.tok_pos[t], p0 = hp.window > 0 && pos >= hp.window ? pos - hp.window + 1 : 0;
	int per = ((pos - p0 + 1 + n_split - 1) / n_split + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
	int lo = p0 + split * per, hi = min(lo + per, pos + 1);
	const int32_t *tab = kv.tables + kv.tok_tab[t];
	float m = -INFINITY, l = 0.0f, acc[E];

	for (int i = threadIdx.x; i < ATT_GROUP * D; i += ATT_WARPS * WARP)
		qs[i] = i / D < ng ? q[((size_t)t * hp.n_head + h0) * D + i] * hp.scale : 0.0f;
#pragma unroll
	for (int e = 0; e < E; e++)
		acc[e] = 0.0f;
	if (lo < hi)
		attn_load_tile<D, T>(ks, vs, kv, tab, lo, min(ATT_TILE, hi - lo), nkv, kvh * D);
	cp_async_commit();
	for (int c0 = lo, st = 0; c0 < hi; c0 += ATT_TILE, st ^= 1) {
		int nv = min(ATT_TILE, hi - c0);
		const T *kt = ks + st * ATT_TILE * RS, *vt = vs + st * ATT_TILE * RS;

		if (c0 + ATT_TILE < hi)
			attn_load_tile<D, T>(ks + (st ^ 1) * ATT_TILE * RS, vs + (st ^ 1) * ATT_TILE * RS, kv, tab,
			    c0 + ATT_TILE, min(ATT_TILE, hi - c0 - ATT_TILE), nkv, kvh * D);
		cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();
		if (g < ng) {
			float s = -INFINITY, p, mn, corr;

			if (lane < nv) {
				float dot = 0.0f, kf[8];

#pragma unroll 4
				for (int i = 0; i < D; i += 8) {
					float4 qa = *(const float4 *)(qs + g * D + i), qb = *(const float4 *)(qs + g * D + i + 4);

					load_kv<8>(kt + lane * RS + i, kf);
					dot += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
					    qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
				}
				s = dot;
			}
			mn = fmaxf(m, warp_max(s));
			corr = expf(m - mn);
			p = lane < nv ? expf(s - mn) : 0.0f;
			l = l * corr + warp_sum(p);
			m = mn;
#pragma unroll
			for (int e = 0; e < E; e++)
				acc[e] *= corr;
#pragma unroll 8
			for (int j = 0; j < nv; j++) {
				float pj = __shfl_sync(FULL_MASK, p, j), vf[E];

				load_kv<E>(vt + j * RS + lane * E, vf);
#pragma unroll
				for (int e = 0; e < E; e++)
					acc[e] += pj * vf[e];
			}
		}
		__syncthreads(); /* the stage is refilled next */
	}
	cp_async_wait<0>();
	if (g >= ng)
		return;
	size_t row = (size_t)t * hp.n_head + h;
	if (n_split == 1) {
#pragma unroll
		for (int e = 0; e < E; e++)
			out[row * D + lane * E + e] = acc[e] / l;
		return;
	}
	float *pr = part + (row * n_split + split) * (D + 2);
#pragma unroll
	for (int e = 0; e < E; e++)
		pr[lane * E + e] = acc[e];
	if (lane == 0)
		pr[D] = m, pr[D + 1] = l;
}

/*
 * The pieces of (token, head) blockIdx.x merged: each weighted by
 * e^(its max - the max of all) (log-sum-exp), divided by the weighted sum.
 * Piece 0 is never empty; empty ones have max -inf and weigh nothing. The
 * maxima and sums are read once into shared memory, so that the values'
 * loads, one per piece and thread, are all independent.
 */
__global__ void
attn_merge_kernel(const float *__restrict__ part, float *__restrict__ out, int n_split, int d, int n_head,
    const int32_t *__restrict__ fa_tok)
{
	pdl_wait();
	pdl_trigger();
	__shared__ float wm[ATT_MAX_SPLITS], wl[ATT_MAX_SPLITS];
	const float *pr = part + (size_t)blockIdx.x * n_split * (d + 2);
	float mx = -INFINITY, l = 0.0f, acc = 0.0f;

	if (fa_tok != NULL && fa_tok[blockIdx.x / n_head])
		return;
	for (int s = threadIdx.x; s < n_split; s += blockDim.x)
		wm[s] = pr[s * (d + 2) + d], wl[s] = pr[s * (d + 2) + d + 1];
	__syncthreads();
	for (int s = 0; s < n_split; s++)
		mx = fmaxf(mx, wm[s]);
#pragma unroll 8
	for (int s = 0; s < n_split; s++) {
		float w = wm[s] == -INFINITY ? 0.0f : expf(wm[s] - mx);

		l += w * wl[s];
		if (threadIdx.x < d)
			acc += w * pr[s * (d + 2) + threadIdx.x];
	}
	if (threadIdx.x < d)
		out[(size_t)blockIdx.x * d + threadIdx.x] = acc / l;
}

int
cuda_qk(float *q, float *k, const float *v, int n_tok, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	dim3 grid((unsigned)n_tok, (unsigned)((hd->n_head + hd->n_head_kv + QK_WARPS - 1) / QK_WARPS));

	if (kv->f32)
		CK(cuda_launch(qk_kernel<float>, dim3(grid), dim3(QK_WARPS * WARP), 0, st, q, k, v, *hd, *kv));
	else
		CK(cuda_launch(qk_kernel<__half>, dim3(grid), dim3(QK_WARPS * WARP), 0, st, q, k, v, *hd, *kv));
	return 0;
}

/* Blocks of attention that keep the device busy: ATT_WAVES per multiprocessor. */
static int
attn_target_blocks(int device, char *err)
{
	int sms = 0;

	CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
	return ATT_WAVES * sms;
}

int64_t
cuda_attention_part_rows(int device)
{
	int sms = 0;

	if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
		return 0;
	return (int64_t)ATT_WAVES * sms * ATT_GROUP;
}

/* Lets attn_kernel<E, T> have its shared memory on the current device (past 48 KB it must be asked for). */
template <int E, typename T>
static int
attn_smem_limit(char *err)
{
	size_t smem = attn_smem_bytes<T>(WARP * E);

	if (smem > 48 * 1024)
		CK(cudaFuncSetAttribute(attn_kernel<E, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	return 0;
}

/* Both pool element types (launches never raise the limit: see cuda_attention_setup). */
template <int E>
static int
attn_smem_limits(char *err)
{
	int rc = attn_smem_limit<E, __half>(err);

	return rc != 0 ? rc : attn_smem_limit<E, float>(err);
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

/* Launches attn_kernel<E, T> with its shared memory (cuda_attention_setup raised the limit). */
template <int E, typename T>
static int
attn_launch_t(dim3 grid, const float *q, float *out, float *part, int n_split, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	CK(cuda_launch(attn_kernel<E, T>, grid, dim3(ATT_WARPS * WARP), attn_smem_bytes<T>(WARP * E), st, q, out,
	    part, n_split, *hd, *kv));
	return 0;
}

/* attn_launch_t for the pool's element type. */
template <int E>
static int
attn_launch(dim3 grid, const float *q, float *out, float *part, int n_split, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	if (kv->f32)
		return attn_launch_t<E, float>(grid, q, out, part, n_split, hd, kv, st, err);
	return attn_launch_t<E, __half>(grid, q, out, part, n_split, hd, kv, st, err);
}

int
cuda_attention(const float *q, float *out, int n_tok, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err)
{
	int group = hd->n_head / hd->n_head_kv, ngb = (group + ATT_GROUP - 1) / ATT_GROUP, dev, rc;
	int64_t base = (int64_t)n_tok * hd->n_head_kv * ngb, n_split = 1, target;

	if (kv->fa_tiles != NULL && (rc = cuda_flash(q, out, hd, kv, st, err)) != 0)
		return rc;
	CK(cudaGetDevice(&dev));
	if ((target = attn_target_blocks(dev, err)) < 0)
		return (int)target;
	if (kv->part != NULL && base < target)
		n_split = MIN(MIN(target / base, (int64_t)ATT_MAX_SPLITS), kv->part_rows / ((int64_t)n_tok * hd->n_head));
	n_split = MIN(n_split, ((int64_t)kv->max_len + ATT_SPLIT_MIN - 1) / ATT_SPLIT_MIN);
	n_split = MAX(n_split, 1);
	dim3 grid((unsigned)(n_tok * n_split), (unsigned)(hd->n_head_kv * ngb));

	switch (hd->head_dim / WARP) {
#define E_CASE(E) \
	case E: \
		rc = attn_launch<E>(grid, q, out, kv->part, (int)n_split, hd, kv, st, err); \
		break;
	E_CASE(1) E_CASE(2) E_CASE(3) E_CASE(4) E_CASE(5) E_CASE(6) E_CASE(7) E_CASE(8)
#undef E_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "head_dim %d (a multiple of 32 up to 256 only)",
		    hd->head_dim);
	}
	if (rc != 0 || n_split == 1)
		return rc;
	CK(cuda_launch(attn_merge_kernel, dim3((unsigned)(n_tok * hd->n_head)), dim3(hd->head_dim), 0, st, kv->part,
	    out, (int)n_split, hd->head_dim, hd->n_head, kv->fa_tok));
	return 0;
}
