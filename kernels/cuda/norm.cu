/*
 * norm.cu: the row-wise kernels of the residual stream: RMSNorm with
 * residual adds fused around it, the gated activation, rows to fp16 for
 * the products of many tokens (fused into the first two where they feed
 * such a product), and the argmax of logits rows.
 */
#include "norm.cuh"

#include <limits.h>
#include <string.h>

#define ROW_THREADS_MAX 512
#define ARGMAX_THREADS 256
/* Blocks (one cluster) of a row of the fp16 GLU when its rows are few; the most clusters allow portably. */
#define GLU_SPLIT 8

/*
 * A row of n floats (n a multiple of 4) is held in registers by one
 * block: thread i keeps float4 number i + j * blockDim.x, j < V. Every
 * kernel here reads its row once, reduces, and writes: one memory latency
 * a pass, where a loop over the row in global memory paid one per element
 * a thread touched (a decode step has a single row per kernel).
 */
template <int V>
static __device__ __forceinline__ void
row_load(const float *__restrict__ p, int n4, float4 (&v)[V])
{
#pragma unroll
	for (int j = 0; j < V; j++) {
		int i = threadIdx.x + j * blockDim.x;

		v[j] = i < n4 ? ((const float4 *)p)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	}
}

template <int V>
static __device__ __forceinline__ void
row_store(float *__restrict__ p, int n4, const float4 (&v)[V])
{
#pragma unroll
	for (int j = 0; j < V; j++) {
		int i = threadIdx.x + j * blockDim.x;

		if (i < n4)
			((float4 *)p)[i] = v[j];
	}
}

template <int V>
static __device__ __forceinline__ float
row_sumsq(const float4 (&v)[V], float *red)
{
	float ss = 0.0f;

#pragma unroll
	for (int j = 0; j < V; j++)
		ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
	return block_sum(ss, red);
}

/*
 * A norm's weight as one thread of a row kernel scales by it. Rows of up
 * to 4 float4s a thread hold it in registers, loaded before pdl_wait
 * (no kernel writes it) so that its load is not one more latency after
 * the sum; wider rows would spill, and read it as they scale.
 */
template <int V>
struct row_weight {
	static constexpr bool held = V <= 4;
	float4 g[held ? V : 1];
	const float4 *p;
	int n4;

	__device__ __forceinline__ void load(const float *w, int n)
	{
		p = (const float4 *)w, n4 = n / 4;
		if constexpr (held)
			row_load<V>(w, n4, g);
	}

	__device__ __forceinline__ float4 at(int j) const
	{
		if constexpr (held) {
			return g[j];
		} else {
			int i = threadIdx.x + j * blockDim.x;

			return i < n4 ? p[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		}
	}
};

/* v = v / rms(v) * (w + offset), as cpu_rmsnorm computes it. */
template <int V>
static __device__ __forceinline__ void
row_norm(float4 (&v)[V], const row_weight<V> &w, int n, const struct cuda_norm &nm, float *red)
{
	float sc = 1.0f / sqrtf(row_sumsq(v, red) / (float)n + nm.eps);

#pragma unroll
	for (int j = 0; j < V; j++) {
		float4 g = w.at(j);

		v[j].x = v[j].x * sc * (g.x + nm.offset), v[j].y = v[j].y * sc * (g.y + nm.offset);
		v[j].z = v[j].z * sc * (g.z + nm.offset), v[j].w = v[j].w * sc * (g.w + nm.offset);
	}
}

/* The largest magnitude of this thread's float4s of a row. */
template <int V>
static __device__ __forceinline__ float
row_absmax(const float4 (&v)[V])
{
	float mx = 0.0f;

#pragma unroll
	for (int j = 0; j < V; j++)
		mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)), fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
	return mx;
}

/* The power of two a row of largest magnitude mx is divided by in fp16 form. */
static __device__ __forceinline__ float
f16_divisor(float mx)
{
	return mx > F16_SAFE && isfinite(mx) ? exp2f(ceilf(log2f(mx / F16_SAFE))) : 1.0f;
}

/* This thread's float4s of a row, divided by s, as fp16 at out. */
template <int V>
static __device__ __forceinline__ void
row_put_f16(const float4 (&v)[V], int n4, __half *__restrict__ out, float s)
{
#pragma unroll
	for (int j = 0; j < V; j++) {
		int i = threadIdx.x + j * blockDim.x;

		if (i < n4) {
			__half2 a = __floats2half2_rn(v[j].x / s, v[j].y / s), b = __floats2half2_rn(v[j].z / s, v[j].w / s);
			uint2 u;

			memcpy(&u.x, &a, 4);
			memcpy(&u.y, &b, 4);
			((uint2 *)out)[i] = u;
		}
	}
}

/*
 * The row as fp16 at out, divided by a power of two when its largest
 * magnitude would overflow fp16 (that divisor to *scale): the form the
 * products of many tokens read.
 */
template <int V>
static __device__ __forceinline__ void
row_store_f16(const float4 (&v)[V], int n4, __half *__restrict__ out, float *__restrict__ scale, float *red)
{
	float s = f16_divisor(block_max(row_absmax(v), red));

	row_put_f16<V>(v, n4, out, s);
	if (threadIdx.x == 0)
		*scale = s;
}

/*
 * Float4 number i of a row of n4 in int8 form (cuda_q8): hi at q, lo n4
 * float4s on, its group's scale and sum at d[i / 8]. A group of 32 is the
 * float4s of 8 neighbouring lanes, all of which call this (those past the
 * row's end with active 0).
 */
static __device__ __forceinline__ void
q8_store4(float4 a, int i, int n4, int active, int8_t *__restrict__ q, float2 *__restrict__ d)
{
	float mx, sum;
	int hi[4], lo[4];

	if (!active)
		a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	mx = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w)));
	sum = a.x + a.y + a.z + a.w;
#pragma unroll
	for (int o = 4; o > 0; o >>= 1) {
		mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
		sum += __shfl_xor_sync(FULL_MASK, sum, o);
	}
	if (!active)
		return;
	q8_split(a.x, mx, &hi[0], &lo[0]);
	q8_split(a.y, mx, &hi[1], &lo[1]);
	q8_split(a.z, mx, &hi[2], &lo[2]);
	q8_split(a.w, mx, &hi[3], &lo[3]);
	((char4 *)q)[i] = make_char4((char)hi[0], (char)hi[1], (char)hi[2], (char)hi[3]);
	((char4 *)q)[n4 + i] = make_char4((char)lo[0], (char)lo[1], (char)lo[2], (char)lo[3]);
	if (i % 8 == 0)
		d[i / 8] = q8_scale(mx, sum);
}

/* The row (n4 float4s, in the block's threads' registers) in int8 form at q, d. */
template <int V>
static __device__ __forceinline__ void
row_store_q8(const float4 (&v)[V], int n4, int8_t *__restrict__ q, float2 *__restrict__ d)
{
#pragma unroll
	for (int j = 0; j < V; j++) {
		int i = threadIdx.x + j * blockDim.x;

		q8_store4(v[j], i, n4, i < n4, q, d);
	}
}

/* The row's forms the next products read: fp16 if h16.h, else floats at h; int8 if q8.q. */
template <int V>
static __device__ __forceinline__ void
row_store_forms(const float4 (&v)[V], int n4, float *__restrict__ h, struct cuda_h16 h16, struct cuda_q8 q8,
    float *red)
{
	size_t row = blockIdx.x;

	if (h16.h != NULL)
		row_store_f16<V>(v, n4, h16.h + row * 4 * n4, h16.scale + row, red);
	else
		row_store<V>(h + row * 4 * n4, n4, v);
	if (q8.q != NULL)
		row_store_q8<V>(v, n4, q8.q + row * 8 * n4, q8.d + row * n4 / 8);
}

/* v += a * u, element by element. */
template <int V>
static __device__ __forceinline__ void
row_axpy(float4 (&v)[V], float a, const float4 (&u)[V])
{
#pragma unroll
	for (int j = 0; j < V; j++)
		v[j].x += a * u[j].x, v[j].y += a * u[j].y, v[j].z += a * u[j].z, v[j].w += a * u[j].w;
}

/*
 * rv += the mixture of block blockIdx.x's slots (struct cuda_rmix), in
 * passes of P slots whose loads are all in flight at once: each slot's
 * expert, row and weight, then whether its expert is here, then its rows.
 * One slot at a time paid those round trips to L2 in a row for every
 * slot: qwen3-30b-a3b's eight made the one-block kernel after the experts
 * 4.3-5.2 us a layer (H200). The sum's order is the slots' as before.
 */
template <int V>
static __device__ __forceinline__ void
residual_mix(const float *__restrict__ r, const struct cuda_rmix &mix, int n4, float4 (&rv)[V])
{
	constexpr int P = V >= 8 ? 1 : 8 / V;
	int end = (int)(blockIdx.x + 1) * mix.k;

	for (int s0 = (int)blockIdx.x * mix.k; s0 < end; s0 += P) {
		float4 u[P][V], b[P][V];
		int ex[P], row[P];
		float wt[P];

#pragma unroll
		for (int q = 0; q < P; q++) {
			int s = s0 + q;

			ex[q] = s < end ? mix.expert[s] : 0;
			row[q] = s >= end ? -1 : mix.row != NULL ? mix.row[s] : s;
			wt[q] = s < end ? mix.weight[s] : 0.0f;
		}
#pragma unroll
		for (int q = 0; q < P; q++)
			if (row[q] >= 0 && mix.slot_of != NULL && mix.slot_of[ex[q]] < 0)
				row[q] = -1;
#pragma unroll
		for (int q = 0; q < P; q++) {
			if (row[q] < 0)
				continue;
			row_load<V>(r + (size_t)row[q] * 4 * n4, n4, u[q]);
			if (mix.row_b != NULL)
				row_load<V>(mix.row_b + (size_t)ex[q] * 4 * n4, n4, b[q]);
		}
#pragma unroll
		for (int q = 0; q < P; q++) {
			if (row[q] < 0)
				continue;
			if (mix.row_b != NULL)
				row_axpy<V>(u[q], 1.0f, b[q]);
			row_axpy<V>(rv, wt[q], u[q]);
		}
	}
}

/* Row blockIdx.x of r as mix says (struct cuda_rmix), into rv. */
template <int V>
static __device__ __forceinline__ void
residual_row(const float *__restrict__ r, const struct cuda_rmix &mix, int n4, float4 (&rv)[V])
{
	float4 u[V], b[V];

	if (mix.pre != NULL) /* in flight beside the mixture's loads, added after them as before */
		row_load<V>(mix.pre + (size_t)blockIdx.x * 4 * n4, n4, u);
	if (mix.bias != NULL)
		row_load<V>(mix.bias, n4, b);
	if (mix.k == 0) {
		row_load<V>(r + (size_t)blockIdx.x * 4 * n4, n4, rv);
	} else {
#pragma unroll
		for (int j = 0; j < V; j++)
			rv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		residual_mix<V>(r, mix, n4, rv);
	}
	if (mix.pre != NULL)
		row_axpy<V>(rv, 1.0f, u);
	if (mix.bias != NULL)
		row_axpy<V>(rv, 1.0f, b);
}

template <int V>
__global__ void __launch_bounds__(ROW_THREADS_MAX)
residual_norm_kernel(float *__restrict__ x, const float *__restrict__ r, struct cuda_rmix mix,
    const float *__restrict__ post, const float *__restrict__ w, float *__restrict__ h, struct cuda_h16 h16,
    struct cuda_q8 q8, int n, struct cuda_norm nm)
{
	__shared__ float red[WARP];
	float *xr = x + (size_t)blockIdx.x * n;
	float4 v[V];
	row_weight<V> gw, gp;
	int n4 = n / 4;

	if (w != NULL)
		gw.load(w, n);
	if (r != NULL && post != NULL)
		gp.load(post, n);
	pdl_wait();
	pdl_trigger();
	row_load<V>(xr, n4, v);
	if (r != NULL) {
		float4 rv[V];

		residual_row<V>(r, mix, n4, rv);
		if (post != NULL)
			row_norm<V>(rv, gp, n, nm, red);
#pragma unroll
		for (int j = 0; j < V; j++)
			v[j].x += rv[j].x, v[j].y += rv[j].y, v[j].z += rv[j].z, v[j].w += rv[j].w;
		row_store<V>(xr, n4, v);
	}
	if (w == NULL)
		return;
	row_norm<V>(v, gw, n, nm, red);
	row_store_forms<V>(v, n4, h, h16, q8, red);
}

/* Most tokens of cuda_norm_router. */
#define NORM_ROUTER_TOKENS 8

/* cuda_norm_router: block e, router row e by each token's normed row. */
template <int V>
__global__ void __launch_bounds__(ROW_THREADS_MAX)
norm_router_kernel(const float *__restrict__ x, const float *__restrict__ r, const float *__restrict__ bias,
    const float *__restrict__ w, const float *__restrict__ router, int n_expert, float *__restrict__ logit,
    float *__restrict__ h, struct cuda_q8 q8, int n_tok, int n, struct cuda_norm nm)
{
	__shared__ float red[WARP];
	float4 rw[V], v[V], u[V];
	row_weight<V> gw;
	int n4 = n / 4, e = blockIdx.x;

	gw.load(w, n);
	row_load<V>(router + (size_t)e * n, n4, rw);
	pdl_wait();
	pdl_trigger();
	for (int t = 0; t < n_tok; t++) {
		float d = 0.0f;

		row_load<V>(x + (size_t)t * n, n4, v);
		row_load<V>(r + (size_t)t * n, n4, u);
		row_axpy<V>(v, 1.0f, u);
		if (bias != NULL) {
			row_load<V>(bias, n4, u);
			row_axpy<V>(v, 1.0f, u);
		}
		row_norm<V>(v, gw, n, nm, red);
#pragma unroll
		for (int j = 0; j < V; j++)
			d += v[j].x * rw[j].x + v[j].y * rw[j].y + v[j].z * rw[j].z + v[j].w * rw[j].w;
		d = block_sum(d, red);
		if (threadIdx.x == 0)
			logit[(size_t)t * n_expert + e] = d;
		if (e != 0)
			continue;
		row_store<V>(h + (size_t)t * n, n4, v);
		if (q8.q != NULL)
			row_store_q8<V>(v, n4, q8.q + (size_t)t * 8 * n4, q8.d + (size_t)t * n4 / 8);
	}
}

template <int V>
__global__ void __launch_bounds__(ROW_THREADS_MAX)
norm_rows_kernel(const float *__restrict__ x, const int32_t *__restrict__ rows,
    const float *__restrict__ w, float *__restrict__ h, int n, struct cuda_norm nm)
{
	__shared__ float red[WARP];
	float4 v[V];
	row_weight<V> g;

	g.load(w, n);
	pdl_wait();
	pdl_trigger();
	row_load<V>(x + (size_t)rows[blockIdx.x] * n, n / 4, v);
	row_norm<V>(v, g, n, nm, red);
	row_store<V>(h + (size_t)blockIdx.x * n, n / 4, v);
}

/*
 * act(a) * b into a, and as int8 into q8 if q8.q, over rows of n4 float4s,
 * all4 in all: spread over the whole GPU (a thread a float4), since only
 * the fp16 form needs a whole row.
 */
__global__ void
glu_kernel(float *__restrict__ a, const float *__restrict__ b, int64_t all4, int n4, int gelu, struct cuda_q8 q8)
{
	pdl_wait();
	pdl_trigger();
	int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, row = i / n4;
	float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

	if (i < all4) {
		float4 u = ((const float4 *)b)[i];

		v = ((const float4 *)a)[i];
		v.x = act(v.x, gelu) * u.x, v.y = act(v.y, gelu) * u.y;
		v.z = act(v.z, gelu) * u.z, v.w = act(v.w, gelu) * u.w;
		((float4 *)a)[i] = v;
	}
	if (q8.q != NULL)
		q8_store4(v, (int)(i - row * n4), n4, i < all4, q8.q + row * 8 * n4, q8.d + row * n4 / 8);
}

/* v = act(v) * u, element by element. */
template <int V>
static __device__ __forceinline__ void
glu_rows(float4 (&v)[V], const float4 (&u)[V], int gelu)
{
#pragma unroll
	for (int j = 0; j < V; j++) {
		v[j].x = act(v[j].x, gelu) * u[j].x, v[j].y = act(v[j].y, gelu) * u[j].y;
		v[j].z = act(v[j].z, gelu) * u[j].z, v[j].w = act(v[j].w, gelu) * u[j].w;
	}
}

/* Row blockIdx.x: act(a) * b as an fp16 row (h16). */
template <int V>
__global__ void __launch_bounds__(ROW_THREADS_MAX)
glu_f16_kernel(const float *__restrict__ a, const float *__restrict__ b, int n, int gelu, struct cuda_h16 h16)
{
	pdl_wait();
	pdl_trigger();
	__shared__ float red[WARP];
	float4 v[V], u[V];
	int n4 = n / 4;

	row_load<V>(a + (size_t)blockIdx.x * n, n4, v);
	row_load<V>(b + (size_t)blockIdx.x * n, n4, u);
	glu_rows<V>(v, u, gelu);
	row_store_f16<V>(v, n4, h16.h + (size_t)blockIdx.x * n, h16.scale + blockIdx.x, red);
}

/*
 * glu_f16_kernel for few rows (sm_90): a cluster of GLU_SPLIT blocks a row,
 * each a GLU_SPLIT-th of it, which read the others' largest magnitudes
 * from their shared memory; one block a row left the GPU's other
 * multiprocessors idle (4 rows of 14,336: 8.7 us, H100).
 */
template <int V>
__global__ void __launch_bounds__(ROW_THREADS_MAX)
glu_f16_split_kernel(const float *__restrict__ a, const float *__restrict__ b, int n, int gelu, struct cuda_h16 h16)
{
	pdl_wait();
	pdl_trigger();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	__shared__ float red[WARP], part_max;
	float4 v[V], u[V];
	int row = blockIdx.x / GLU_SPLIT, c = (int)cluster_rank(), m4 = n / 4 / GLU_SPLIT;
	size_t off = (size_t)row * n + (size_t)c * m4 * 4;
	float mx;

	row_load<V>(a + off, m4, v);
	row_load<V>(b + off, m4, u);
	glu_rows<V>(v, u, gelu);
	mx = block_max(row_absmax(v), red);
	if (threadIdx.x == 0)
		part_max = mx;
	cluster_sync();
	for (int r = 0; r < GLU_SPLIT; r++)
		mx = fmaxf(mx, cluster_ld(&part_max, (unsigned)r));
	mx = f16_divisor(mx);
	row_put_f16<V>(v, m4, h16.h + off, mx);
	if (c == 0 && threadIdx.x == 0)
		h16.scale[row] = mx;
	cluster_sync(); /* no block leaves while another may still read its maximum */
#endif
}

/* Row rows[blockIdx.x] / div of x (ldx apart; rows NULL: row blockIdx.x) as fp16 row blockIdx.x of k. */
template <int V>
__global__ void __launch_bounds__(ROW_THREADS_MAX)
to_f16_kernel(const float *__restrict__ x, int ldx, int k, const int32_t *__restrict__ rows, int div,
    struct cuda_h16 h16)
{
	pdl_wait();
	pdl_trigger();
	__shared__ float red[WARP];
	float4 v[V];

	row_load<V>(x + (size_t)(rows != NULL ? rows[blockIdx.x] / div : (int)blockIdx.x) * ldx, k / 4, v);
	row_store_f16<V>(v, k / 4, h16.h + (size_t)blockIdx.x * k, h16.scale + blockIdx.x, red);
}

/*
 * Row blockIdx.x of the experts' gate and up: its expert's biases, the
 * activation, then the row's forms (row_store_forms: fp16, or floats in
 * place; int8 too if q8.q).
 */
template <int V>
__global__ void __launch_bounds__(ROW_THREADS_MAX)
moe_glu_kernel(float *__restrict__ gate, const float *__restrict__ up, int n, const int32_t *__restrict__ row_expert,
    const float *__restrict__ gate_b, const float *__restrict__ up_b, struct cuda_act a, struct cuda_h16 h16,
    struct cuda_q8 q8)
{
	pdl_wait();
	pdl_trigger();
	__shared__ float red[WARP];
	size_t row = blockIdx.x;
	float4 v[V], u[V];
	int n4 = n / 4;

	row_load<V>(gate + row * n, n4, v);
	row_load<V>(up + row * n, n4, u);
	if (gate_b != NULL) {
		float4 bg[V], bu[V];
		size_t e = (size_t)row_expert[row];

		row_load<V>(gate_b + e * n, n4, bg);
		row_load<V>(up_b + e * n, n4, bu);
#pragma unroll
		for (int j = 0; j < V; j++) {
			v[j].x += bg[j].x, v[j].y += bg[j].y, v[j].z += bg[j].z, v[j].w += bg[j].w;
			u[j].x += bu[j].x, u[j].y += bu[j].y, u[j].z += bu[j].z, u[j].w += bu[j].w;
		}
	}
#pragma unroll
	for (int j = 0; j < V; j++) {
		v[j].x = expert_act(v[j].x, u[j].x, a), v[j].y = expert_act(v[j].y, u[j].y, a);
		v[j].z = expert_act(v[j].z, u[j].z, a), v[j].w = expert_act(v[j].w, u[j].w, a);
	}
	row_store_forms<V>(v, n4, gate, h16, q8, red);
}

/* (v, i) beats (bv, bi): larger, or equal with a lower index. */
static __device__ __forceinline__ int
argmax_better(float v, int i, float bv, int bi)
{
	return v > bv || (v == bv && i < bi);
}

/* The best (value, index) of the warp's lanes, in every lane. */
static __device__ __forceinline__ void
warp_argmax(float *bv, int *bi)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		float v = __shfl_xor_sync(FULL_MASK, *bv, o);
		int i = __shfl_xor_sync(FULL_MASK, *bi, o);

		if (argmax_better(v, i, *bv, *bi))
			*bv = v, *bi = i;
	}
}

/*
 * Part blockIdx.y of row blockIdx.x: the best (value, index) of its share
 * of the row, into part[row][blockIdx.y]. Many blocks read a vocabulary
 * row at once; argmax_final_kernel picks among the parts.
 */
__global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_part_kernel(const float *__restrict__ x, int n, float2 *__restrict__ part)
{
	pdl_wait();
	pdl_trigger();
	__shared__ float sv[WARP];
	__shared__ int si[WARP];
	const float *r = x + (size_t)blockIdx.x * n;
	int per = (n + ARGMAX_PARTS - 1) / ARGMAX_PARTS, lo = blockIdx.y * per, hi = min(n, lo + per);
	int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, bi = INT_MAX;
	float bv = -INFINITY;

#pragma unroll 4
	for (int i = lo + threadIdx.x; i < hi; i += blockDim.x)
		if (bi == INT_MAX || r[i] > bv) /* rising i: the first of equals stays */
			bv = r[i], bi = i;
	warp_argmax(&bv, &bi);
	if (lane == 0)
		sv[w] = bv, si[w] = bi;
	__syncthreads();
	if (w != 0)
		return;
	bv = lane < (int)(blockDim.x / WARP) ? sv[lane] : -INFINITY;
	bi = lane < (int)(blockDim.x / WARP) ? si[lane] : INT_MAX;
	warp_argmax(&bv, &bi);
	if (lane == 0)
		part[(size_t)blockIdx.x * ARGMAX_PARTS + blockIdx.y] = make_float2(bv, __int_as_float(bi));
}

/* Row blockIdx.x's pick among its parts (a warp). */
__global__ void
argmax_final_kernel(const float2 *__restrict__ part, int32_t *__restrict__ ids)
{
	pdl_wait();
	pdl_trigger();
	float bv = -INFINITY;
	int bi = INT_MAX;

	for (int i = threadIdx.x; i < ARGMAX_PARTS; i += WARP) {
		float2 p = part[(size_t)blockIdx.x * ARGMAX_PARTS + i];

		if (argmax_better(p.x, __float_as_int(p.y), bv, bi))
			bv = p.x, bi = __float_as_int(p.y);
	}
	warp_argmax(&bv, &bi);
	if (threadIdx.x == 0)
		ids[blockIdx.x] = bi;
}

/* Threads and float4s a thread of a row kernel for rows of n floats; 0 when a row does not fit. */
static int
row_shape(int n, int *threads)
{
	int n4 = n / 4, t = MIN(ROW_THREADS_MAX, (n4 + WARP - 1) / WARP * WARP), v = (n4 + t - 1) / t;

	*threads = t;
	return v <= 1 ? 1 : v <= 2 ? 2 : v <= 4 ? 4 : v <= 8 ? 8 : v <= 16 ? 16 : 0;
}

int
cuda_row_fits(int n)
{
	int t;

	return n % 4 == 0 && row_shape(n, &t) != 0;
}

/* Launches KERNEL<V>(args) for rows (or parts of rows) of n on n_blocks blocks, in clusters of cl. */
#define ROW_LAUNCH_EX(KERNEL, n, n_blocks, cl, st, ...) \
	do { \
		int t_, v_ = row_shape((n), &t_); \
		dim3 g_((unsigned)(n_blocks)), b_((unsigned)t_); \
		switch (v_) { \
		case 1: CK(cuda_launch_ex(KERNEL<1>, g_, b_, 0, (cl), (st), __VA_ARGS__)); break; \
		case 2: CK(cuda_launch_ex(KERNEL<2>, g_, b_, 0, (cl), (st), __VA_ARGS__)); break; \
		case 4: CK(cuda_launch_ex(KERNEL<4>, g_, b_, 0, (cl), (st), __VA_ARGS__)); break; \
		case 8: CK(cuda_launch_ex(KERNEL<8>, g_, b_, 0, (cl), (st), __VA_ARGS__)); break; \
		case 16: CK(cuda_launch_ex(KERNEL<16>, g_, b_, 0, (cl), (st), __VA_ARGS__)); break; \
		default: return err_set(err, ERR_UNSUPPORTED, #KERNEL ": rows of %d floats", (int)(n)); \
		} \
	} while (0)

/* Launches KERNEL<V>(args) for rows of n on n_rows blocks. */
#define ROW_LAUNCH(KERNEL, n, n_rows, st, ...) ROW_LAUNCH_EX(KERNEL, n, n_rows, 1u, st, __VA_ARGS__)

/*
 * 1 if the fp16 GLU of n_rows rows of n takes clusters of GLU_SPLIT blocks
 * a row: rows too few to give each of cluster_sms multiprocessors one, and
 * a row GLU_SPLIT equal parts of float4s.
 */
static int
glu_split(int n_rows, int n, int cluster_sms)
{
	return n % (4 * GLU_SPLIT) == 0 && (int64_t)n_rows * GLU_SPLIT <= cluster_sms;
}

int
cuda_norm_router_fits(int n, int n_tok)
{
	return n % 32 == 0 && cuda_row_fits(n) && n_tok <= NORM_ROUTER_TOKENS;
}

int
cuda_norm_router(const float *x, const float *r, const float *bias, const float *w, const float *router,
    int n_expert, float *logit, float *h, struct cuda_q8 q8, int n_tok, int n, struct cuda_norm nm, cudaStream_t st,
    char *err)
{
	if (!cuda_norm_router_fits(n, n_tok))
		return err_set(err, ERR_INVAL, "norm_router: %d tokens of %d floats", n_tok, n);
	ROW_LAUNCH(norm_router_kernel, n, n_expert, st, x, r, bias, w, router, n_expert, logit, h, q8, n_tok, n, nm);
	return 0;
}

int
cuda_residual_norm(float *x, const float *r, const struct cuda_rmix *mix, const float *post, const float *w,
    float *h, struct cuda_h16 h16, struct cuda_q8 q8, int n_rows, int n, struct cuda_norm nm, cudaStream_t st,
    char *err)
{
	struct cuda_rmix none = {};

	if (q8.q != NULL && n % 32 != 0)
		return err_set(err, ERR_INVAL, "residual_norm: an int8 form of rows of %d floats", n);
	ROW_LAUNCH(residual_norm_kernel, n, n_rows, st, x, r, mix != NULL ? *mix : none, post, w, h, h16, q8, n, nm);
	return 0;
}

int
cuda_norm_rows(const float *x, const int32_t *rows, const float *w, float *h, int n_rows, int n,
    struct cuda_norm nm, cudaStream_t st, char *err)
{
	ROW_LAUNCH(norm_rows_kernel, n, n_rows, st, x, rows, w, h, n, nm);
	return 0;
}

int
cuda_glu(float *a, const float *b, int n_rows, int n, int gelu, struct cuda_h16 h16, struct cuda_q8 q8,
    int cluster_sms, cudaStream_t st, char *err)
{
	int64_t all4 = (int64_t)n_rows * n / 4;

	if (q8.q != NULL && n % 32 != 0)
		return err_set(err, ERR_INVAL, "glu: an int8 form of rows of %d floats", n);
	if (h16.h != NULL && glu_split(n_rows, n, cluster_sms)) {
		ROW_LAUNCH_EX(glu_f16_split_kernel, n / GLU_SPLIT, n_rows * GLU_SPLIT, GLU_SPLIT, st, a, b, n, gelu, h16);
		return 0;
	}
	if (h16.h != NULL) {
		ROW_LAUNCH(glu_f16_kernel, n, n_rows, st, a, b, n, gelu, h16);
		return 0;
	}
	CK(cuda_launch(glu_kernel, dim3((unsigned)((all4 + 255) / 256)), dim3(256), 0, st, a, b, all4, n / 4, gelu,
	    q8));
	return 0;
}

/* A value of a GLU form's row: its float where its group left one (an fp16 infinity), else its fp16. */
static __device__ __forceinline__ float
glu16_at(const __half *h, const float *f, int i)
{
	return __hisinf(h[i]) ? f[i] : __half2float(h[i]);
}

/* Row blockIdx.x of g, where flagged: divided as row_store_f16 divides a row (see cuda_glu16). */
__global__ void __launch_bounds__(ROW_THREADS_MAX)
glu_fix_kernel(struct cuda_glu16 g)
{
	__shared__ float red[WARP];
	__half *h = g.h + (size_t)blockIdx.x * g.ff;
	const float *f = g.f + (size_t)blockIdx.x * g.ff;
	float mx = 0.0f, s;

	pdl_wait();
	pdl_trigger();
	if (g.big[blockIdx.x] == 0)
		return;
	for (int i = threadIdx.x; i < g.ff; i += blockDim.x)
		mx = fmaxf(mx, fabsf(glu16_at(h, f, i)));
	s = f16_divisor(block_max(mx, red));
	for (int i = threadIdx.x; i < g.ff; i += blockDim.x)
		h[i] = __float2half_rn(glu16_at(h, f, i) / s);
	if (threadIdx.x == 0)
		g.scale[blockIdx.x] = s, g.big[blockIdx.x] = 0;
}

int
cuda_glu_fix(const struct cuda_glu16 *g, int n_rows, cudaStream_t st, char *err)
{
	CK(cuda_launch(glu_fix_kernel, dim3((unsigned)n_rows), dim3(ROW_THREADS_MAX), 0, st, *g));
	return 0;
}

int
cuda_to_f16(const float *x, int ldx, int k, int n_rows, struct cuda_h16 h16, cudaStream_t st, char *err)
{
	ROW_LAUNCH(to_f16_kernel, k, n_rows, st, x, ldx, k, (const int32_t *)NULL, 1, h16);
	return 0;
}

int
cuda_to_f16_rows(const float *x, int ldx, int k, const int32_t *rows, int div, int n_rows, struct cuda_h16 h16,
    cudaStream_t st, char *err)
{
	ROW_LAUNCH(to_f16_kernel, k, n_rows, st, x, ldx, k, rows, div, h16);
	return 0;
}

int
cuda_moe_glu(float *gate, const float *up, int n_rows, int n, const int32_t *row_expert, const float *gate_b,
    const float *up_b, struct cuda_act a, struct cuda_h16 h16, struct cuda_q8 q8, cudaStream_t st, char *err)
{
	if (q8.q != NULL && n % 32 != 0)
		return err_set(err, ERR_INVAL, "moe_glu: an int8 form of rows of %d floats", n);
	ROW_LAUNCH(moe_glu_kernel, n, n_rows, st, gate, up, n, row_expert, gate_b, up_b, a, h16, q8);
	return 0;
}

int
cuda_argmax(const float *x, int n_rows, int n, int32_t *ids, float2 *part, cudaStream_t st, char *err)
{
	CK(cuda_launch(argmax_part_kernel, dim3((unsigned)n_rows, ARGMAX_PARTS), dim3(ARGMAX_THREADS), 0, st, x, n,
	    part));
	CK(cuda_launch(argmax_final_kernel, dim3((unsigned)n_rows), dim3(WARP), 0, st, part, ids));
	return 0;
}
