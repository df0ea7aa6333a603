/*
 * matmul.cu: matrix products straight from the stored weights.
 *
 * Few tokens (decoding): a block of threads takes four output rows and
 * walks them eight elements per thread at a time, dequantizing in
 * registers, and dots them with up to MMV_TOKENS tokens at once, so the
 * weight is read once per group of tokens and each token load serves four
 * rows. The weight's bytes are the cost; the tokens come from L1/L2.
 * Several weights of the same input stored one after the other (Q/K/V,
 * gate/up) run as one kernel that sends each row to its own output.
 *
 * Many tokens (prefill): the tokens are converted to fp16 once per input
 * (each row divided by a power of two when it would overflow fp16, and
 * multiplied back afterwards), the weight is dequantized to fp16 a tile of
 * rows at a time (fp16 weights are used as they are), and cuBLAS multiplies
 * them on the tensor cores with float32 accumulation.
 */
#include "matmul.cuh"
#include "dequant.cuh"

#define MMV_WARPS 4
#define MMV_ROWS 4  /* rows of one block of the matrix-vector kernel */
#define ROW_THREADS 256
/* fp16 scratch for one tile of a dequantized weight: 64 MiB. */
#define WTILE_ELEMS ((int64_t)32 << 20)
/* Rows whose largest magnitude is above this are scaled down for fp16. */
#define F16_SAFE 32768.0f

/* Runs a cuBLAS call; on failure returns from the calling function. */
#define CKB(call) \
	do { \
		cublasStatus_t s_ = (call); \
		if (s_ != CUBLAS_STATUS_SUCCESS) \
			return cuda_fail(err, __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
	} while (0)

/*
 * Where the rows of one product go: rows [start[i], start[i + 1]) to y[i],
 * token t's row ldy[i] floats after token t - 1's.
 */
struct mm_out {
	float *y[MM_MAX_OUT];
	int ldy[MM_MAX_OUT];
	int start[MM_MAX_OUT + 1];
	int n;
};

/* Stores token t's value of row o. */
static __device__ __forceinline__ void
mm_store(const struct mm_out &out, int o, int t, float v)
{
	float *y = out.y[0];
	int ld = out.ldy[0], r = o;

#pragma unroll
	for (int j = 1; j < MM_MAX_OUT; j++) /* constant indices: the struct stays in registers */
		if (j < out.n && o >= out.start[j]) {
			y = out.y[j];
			ld = out.ldy[j];
			r = o - out.start[j];
		}
	y[(size_t)t * ld + r] = v;
}

/*
 * MMV_ROWS rows by NT tokens per block: the block's threads split the rows'
 * chunks of 8 elements, each dequantizes its chunk of every row in
 * registers and feeds it to every token, so one load of x serves
 * MMV_ROWS rows and one load of the weight serves NT tokens. Partial sums
 * are reduced within warps, then across them in shared memory.
 */
template <int TY, int NT>
__global__ void __launch_bounds__(MMV_WARPS * WARP)
mmv_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int k, int n,
    const float *__restrict__ x, int ldx, struct mm_out out)
{
	__shared__ float red[MMV_WARPS][MMV_ROWS * NT];
	int row0 = blockIdx.x * MMV_ROWS, lane = threadIdx.x % WARP, wp = threadIdx.x / WARP;
	const uint8_t *r[MMV_ROWS];
	float acc[MMV_ROWS][NT];

#pragma unroll
	for (int i = 0; i < MMV_ROWS; i++) {
		r[i] = w + (size_t)min(row0 + i, n - 1) * row_bytes; /* a missing last row repeats one */
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[i][t] = 0.0f;
	}
	for (int c = threadIdx.x; c < k / 8; c += MMV_WARPS * WARP) {
		float v[MMV_ROWS][8];

#pragma unroll
		for (int i = 0; i < MMV_ROWS; i++)
			deq8<TY>(r[i], c, v[i]);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			const float4 *xp = (const float4 *)(x + (size_t)t * ldx) + 2 * c;
			float4 a = __ldg(xp), b = __ldg(xp + 1);

#pragma unroll
			for (int i = 0; i < MMV_ROWS; i++)
				acc[i][t] += v[i][0] * a.x + v[i][1] * a.y + v[i][2] * a.z + v[i][3] * a.w +
				    v[i][4] * b.x + v[i][5] * b.y + v[i][6] * b.z + v[i][7] * b.w;
		}
	}
#pragma unroll
	for (int i = 0; i < MMV_ROWS; i++)
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float s = warp_sum(acc[i][t]);

			if (lane == 0)
				red[wp][i * NT + t] = s;
		}
	__syncthreads();
	for (int j = threadIdx.x; j < MMV_ROWS * NT; j += blockDim.x) {
		int i = j / NT, t = j % NT;
		float s = 0.0f;

		if (row0 + i >= n)
			continue;
#pragma unroll
		for (int q = 0; q < MMV_WARPS; q++)
			s += red[q][j];
		mm_store(out, row0 + i, t, s);
	}
}

/* Row t of x as fp16 in xh (k apart), divided by a power of two kept in xscale[t]. */
__global__ void
to_f16_kernel(const float *__restrict__ x, int ldx, int k, __half *__restrict__ xh,
    float *__restrict__ xscale)
{
	__shared__ float red[WARP];
	const float *xr = x + (size_t)blockIdx.x * ldx;
	__half *out = xh + (size_t)blockIdx.x * k;
	float mx = 0.0f, s = 1.0f;
	int i;

	for (i = threadIdx.x; i < k; i += blockDim.x)
		mx = fmaxf(mx, fabsf(xr[i]));
	mx = block_max(mx, red);
	if (mx > F16_SAFE && isfinite(mx))
		s = exp2f(ceilf(log2f(mx / F16_SAFE)));
	for (i = threadIdx.x; i < k; i += blockDim.x)
		out[i] = __float2half_rn(xr[i] / s);
	if (threadIdx.x == 0)
		xscale[blockIdx.x] = s;
}

/* Multiplies row t of y (n wide) back by xscale[t]. */
__global__ void
unscale_kernel(float *__restrict__ y, int ldy, int n, const float *__restrict__ xscale)
{
	float s = xscale[blockIdx.x];

	if (s == 1.0f)
		return;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		y[(size_t)blockIdx.x * ldy + i] *= s;
}

/* Chunks [0, n_chunks) of rows of k elements, dequantized to fp16 rows of k. */
template <int TY>
__global__ void
deq_f16_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int k, int64_t n_chunks,
    __half *__restrict__ out)
{
	int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	int cpr = k / 8;
	float v[8];
	__half2 h[4];

	if (idx >= n_chunks)
		return;
	deq8<TY>(w + (size_t)(idx / cpr) * row_bytes, (int)(idx % cpr), v);
#pragma unroll
	for (int i = 0; i < 4; i++)
		h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
	((uint4 *)out)[idx] = *(const uint4 *)h;
}

/* out[t] = scale * row tokens[t] of the matrix. */
template <int TY>
__global__ void
embed_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int k, const int32_t *__restrict__ tokens,
    float scale, float *__restrict__ out)
{
	const uint8_t *r = w + (size_t)tokens[blockIdx.x] * row_bytes;
	float *o = out + (size_t)blockIdx.x * k;
	float v[8];

	for (int c = threadIdx.x; c < k / 8; c += blockDim.x) {
		deq8<TY>(r, c, v);
#pragma unroll
		for (int i = 0; i < 8; i++)
			o[8 * c + i] = scale != 1.0f ? v[i] * scale : v[i];
	}
}

/* The matrix-vector kernel of type TY for nt (1..MMV_TOKENS) tokens. */
template <int TY>
static void
mmv_launch(int nt, cudaStream_t st, const struct cuda_weight *w, const float *x, int ldx,
    const struct mm_out *out)
{
	dim3 grid((unsigned)((w->n + MMV_ROWS - 1) / MMV_ROWS)), block(MMV_WARPS * WARP);
	int k = (int)w->k, n = (int)w->n;

	switch (nt) {
#define NT_CASE(N) \
	case N: \
		mmv_kernel<TY, N><<<grid, block, 0, st>>>(w->d, w->row_bytes, k, n, x, ldx, *out); \
		break;
	NT_CASE(1) NT_CASE(2) NT_CASE(3) NT_CASE(4) NT_CASE(5) NT_CASE(6) NT_CASE(7) NT_CASE(8)
#undef NT_CASE
	}
}

/*
 * Matrix-vector kernels over groups of MMV_TOKENS tokens for w (the rows of
 * every output of out, stored one after the other).
 */
static int
matvec(struct cuda_mm *m, const struct cuda_weight *w, const float *x, int ldx, int n_tok,
    const struct mm_out *out, char *err)
{
	for (int t = 0; t < n_tok; t += MMV_TOKENS) {
		int nt = MIN(MMV_TOKENS, n_tok - t);
		const float *xt = x + (size_t)t * ldx;
		struct mm_out o = *out;

		for (int i = 0; i < o.n; i++)
			o.y[i] += (size_t)t * o.ldy[i];
		switch (w->type) {
#define TY_CASE(TY) case TY: mmv_launch<TY>(nt, m->stream, w, xt, ldx, &o); break;
		DEQ_TYPES(TY_CASE)
#undef TY_CASE
		default:
			return err_set(err, ERR_UNSUPPORTED, "no GPU kernel for weight type %u", w->type);
		}
		CK_LAUNCH("mmv_kernel");
	}
	return 0;
}

/* Rows [r0, r0 + nr) of w into m->wh as fp16. */
static int
dequant_tile(struct cuda_mm *m, const struct cuda_weight *w, int64_t r0, int64_t nr, char *err)
{
	int64_t chunks = nr * (w->k / 8);
	unsigned blocks = (unsigned)((chunks + ROW_THREADS - 1) / ROW_THREADS);
	const uint8_t *src = w->d + (size_t)r0 * w->row_bytes;

	switch (w->type) {
#define TY_CASE(TY) \
	case TY: \
		deq_f16_kernel<TY><<<blocks, ROW_THREADS, 0, m->stream>>>(src, w->row_bytes, (int)w->k, \
		    chunks, m->wh); \
		break;
	DEQ_TYPES(TY_CASE)
#undef TY_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "no GPU kernel for weight type %u", w->type);
	}
	CK_LAUNCH("deq_f16_kernel");
	return 0;
}

/* The tensor-core path: fp16 tokens, fp16 weight tiles, cuBLAS, float32 out. */
static int
gemm(struct cuda_mm *m, const struct cuda_weight *w, const float *x, int ldx, int n_tok, float *y,
    int ldy, int reuse_x, char *err)
{
	const float one = 1.0f, zero = 0.0f;
	int64_t tile = w->type == TT_F16 ? w->n : MIN(w->n, m->wh_elems / w->k);
	int k = (int)w->k, rc;

	if (tile < 1)
		return err_set(err, ERR_DEVICE, "fp16 scratch too small for rows of %d", k);
	if (!reuse_x) {
		to_f16_kernel<<<n_tok, ROW_THREADS, 0, m->stream>>>(x, ldx, k, m->xh, m->xscale);
		CK_LAUNCH("to_f16_kernel");
	}
	for (int64_t r0 = 0; r0 < w->n; r0 += tile) {
		int64_t nr = MIN(tile, w->n - r0);
		const __half *a = (const __half *)(w->d + (size_t)r0 * w->row_bytes);

		if (w->type != TT_F16) {
			if ((rc = dequant_tile(m, w, r0, nr, err)) != 0)
				return rc;
			a = m->wh;
		}
		/* column-major: y^T (nr x n_tok) = (w tile, k x nr)^T . (x^T, k x n_tok) */
		CKB(cublasGemmEx(m->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n_tok, k, &one, a, CUDA_R_16F,
		    k, m->xh, CUDA_R_16F, k, &zero, y + r0, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
		    CUBLAS_GEMM_DEFAULT));
	}
	unscale_kernel<<<n_tok, ROW_THREADS, 0, m->stream>>>(y, ldy, (int)w->n, m->xscale);
	CK_LAUNCH("unscale_kernel");
	return 0;
}

int
cuda_weight_follows(const struct cuda_weight *a, const struct cuda_weight *b)
{
	return a->type == b->type && a->k == b->k && a->row_bytes == b->row_bytes &&
	    a->d + (size_t)a->n * a->row_bytes == b->d;
}

int
cuda_matmul(struct cuda_mm *m, const struct cuda_weight *w, const float *x, int ldx, int n_tok,
    float *y, int ldy, int reuse_x, char *err)
{
	struct mm_out out = { { y }, { ldy }, { 0, (int)w->n }, 1 };

	if (n_tok <= m->mmv_max)
		return matvec(m, w, x, ldx, n_tok, &out, err);
	return gemm(m, w, x, ldx, n_tok, y, ldy, reuse_x, err);
}

int
cuda_matmul_multi(struct cuda_mm *m, const struct cuda_weight *const *w, int n_w, const float *x,
    int ldx, int n_tok, float *const *y, const int *ldy, char *err)
{
	int rc;

	if (n_w < 1 || n_w > MM_MAX_OUT)
		return err_set(err, ERR_INVAL, "%d weights in one product (1..%d)", n_w, MM_MAX_OUT);
	for (int i = 0; i < n_w;) {
		struct cuda_weight all = *w[i];
		struct mm_out out = { { NULL }, { 0 }, { 0 }, 0 };
		int j = i, rows = 0;

		if (n_tok > m->mmv_max) {
			if ((rc = gemm(m, w[i], x, ldx, n_tok, y[i], ldy[i], i > 0, err)) != 0)
				return rc;
			i++;
			continue;
		}
		/* the run of weights that follow one another: one kernel */
		for (; j < n_w && (j == i || cuda_weight_follows(w[j - 1], w[j])); j++) {
			out.y[out.n] = y[j];
			out.ldy[out.n] = ldy[j];
			out.start[out.n++] = rows;
			rows += (int)w[j]->n;
		}
		out.start[out.n] = rows;
		all.n = rows;
		if ((rc = matvec(m, &all, x, ldx, n_tok, &out, err)) != 0)
			return rc;
		i = j;
	}
	return 0;
}

int
cuda_embed(const struct cuda_weight *w, const int32_t *tokens, int n_tok, float scale, float *out,
    cudaStream_t st, char *err)
{
	switch (w->type) {
#define TY_CASE(TY) \
	case TY: \
		embed_kernel<TY><<<n_tok, ROW_THREADS, 0, st>>>(w->d, w->row_bytes, (int)w->k, tokens, \
		    scale, out); \
		break;
	DEQ_TYPES(TY_CASE)
#undef TY_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "no GPU kernel for weight type %u", w->type);
	}
	CK_LAUNCH("embed_kernel");
	return 0;
}

int64_t
cuda_matmul_tile_elems(const struct cuda_weight *w)
{
	return w->type == TT_F16 ? 0 : MIN(w->n * w->k, MAX(WTILE_ELEMS, w->k));
}
