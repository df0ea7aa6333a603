/*
 * norm.cu: RMSNorm with residual adds fused around it, the gated
 * activation, and the argmax of logits rows. A block per row; each thread
 * keeps to the same elements in every pass, so it reads back only what it
 * wrote itself.
 */
#include "norm.cuh"

#include <limits.h>

#define NORM_THREADS 256
#define GLU_THREADS 256
#define ARGMAX_THREADS 1024

/* 1 / rms of the row, as cpu_rmsnorm computes it. */
static __device__ __forceinline__ float
inv_rms(float sumsq, int n, float eps, float *red)
{
	return 1.0f / sqrtf(block_sum(sumsq, red) / (float)n + eps);
}

/* out = xr / rms(xr) * (w + offset), n elements, by the whole block. */
static __device__ __forceinline__ void
norm_row(const float *xr, const float *__restrict__ w, float *__restrict__ out, int n,
    const struct cuda_norm &nm, float *red)
{
	float ss = 0.0f, sc;
	int i;

	for (i = threadIdx.x; i < n; i += blockDim.x)
		ss += xr[i] * xr[i];
	sc = inv_rms(ss, n, nm.eps, red);
	for (i = threadIdx.x; i < n; i += blockDim.x)
		out[i] = xr[i] * sc * (w[i] + nm.offset);
}

__global__ void
residual_norm_kernel(float *__restrict__ x, const float *__restrict__ r, const float *__restrict__ post,
    const float *__restrict__ w, float *__restrict__ h, int n, struct cuda_norm nm)
{
	__shared__ float red[WARP];
	float *xr = x + (size_t)blockIdx.x * n, ss = 0.0f, sc;
	const float *rr = r ? r + (size_t)blockIdx.x * n : NULL;
	int i;

	if (rr != NULL) {
		if (post != NULL) {
			for (i = threadIdx.x; i < n; i += blockDim.x)
				ss += rr[i] * rr[i];
			sc = inv_rms(ss, n, nm.eps, red);
			for (i = threadIdx.x; i < n; i += blockDim.x)
				xr[i] += rr[i] * sc * (post[i] + nm.offset);
		} else {
			for (i = threadIdx.x; i < n; i += blockDim.x)
				xr[i] += rr[i];
		}
	}
	if (w != NULL)
		norm_row(xr, w, h + (size_t)blockIdx.x * n, n, nm, red);
}

__global__ void
norm_rows_kernel(const float *__restrict__ x, const int32_t *__restrict__ rows,
    const float *__restrict__ w, float *__restrict__ h, int n, struct cuda_norm nm)
{
	__shared__ float red[WARP];

	norm_row(x + (size_t)rows[blockIdx.x] * n, w, h + (size_t)blockIdx.x * n, n, nm, red);
}

__global__ void
glu_kernel(float *__restrict__ a, const float *__restrict__ b, int64_t n, int gelu)
{
	const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
	int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	float v;

	if (i >= n)
		return;
	v = a[i];
	if (gelu)
		v = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
	else
		v = v / (1.0f + expf(-v));
	a[i] = v * b[i];
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

/* Block r: the index of row r's largest value, the lowest among equals (the host sampler's rule). */
__global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_kernel(const float *__restrict__ x, int n, int32_t *__restrict__ ids)
{
	__shared__ float sv[WARP];
	__shared__ int si[WARP];
	const float *r = x + (size_t)blockIdx.x * n;
	int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, bi = INT_MAX;
	float bv = -INFINITY;

	for (int i = threadIdx.x; i < n; i += blockDim.x)
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
		ids[blockIdx.x] = bi;
}

int
cuda_residual_norm(float *x, const float *r, const float *post, const float *w, float *h, int n_rows,
    int n, struct cuda_norm nm, cudaStream_t st, char *err)
{
	residual_norm_kernel<<<n_rows, NORM_THREADS, 0, st>>>(x, r, post, w, h, n, nm);
	CK_LAUNCH("residual_norm_kernel");
	return 0;
}

int
cuda_norm_rows(const float *x, const int32_t *rows, const float *w, float *h, int n_rows, int n,
    struct cuda_norm nm, cudaStream_t st, char *err)
{
	norm_rows_kernel<<<n_rows, NORM_THREADS, 0, st>>>(x, rows, w, h, n, nm);
	CK_LAUNCH("norm_rows_kernel");
	return 0;
}

int
cuda_glu(float *a, const float *b, int64_t n, int gelu, cudaStream_t st, char *err)
{
	glu_kernel<<<(unsigned)((n + GLU_THREADS - 1) / GLU_THREADS), GLU_THREADS, 0, st>>>(a, b, n, gelu);
	CK_LAUNCH("glu_kernel");
	return 0;
}

int
cuda_argmax(const float *x, int n_rows, int n, int32_t *ids, cudaStream_t st, char *err)
{
	argmax_kernel<<<n_rows, ARGMAX_THREADS, 0, st>>>(x, n, ids);
	CK_LAUNCH("argmax_kernel");
	return 0;
}
