/*
 * norm.cuh: row-wise kernels of the residual stream (RMSNorm, residual
 * adds, the gated activation) and the greedy pick over logits rows. Host
 * entry points only; all on stream st.
 */
#ifndef RESIDENT_CUDA_NORM_CUH
#define RESIDENT_CUDA_NORM_CUH

#include "cuda_common.cuh"

/* RMSNorm: out = x / rms(x) * (w + offset). */
struct cuda_norm {
	float offset, eps;
};

/*
 * For each of n_rows rows of width n: if r, x += (post ? norm(r) * post : r);
 * then, if w, h = norm(x) * w. Either step may be absent.
 */
int cuda_residual_norm(float *x, const float *r, const float *post, const float *w, float *h,
    int n_rows, int n, struct cuda_norm nm, cudaStream_t st, char *err);

/* h[i] = norm(x[rows[i]]) * w for i < n_rows (rows on the GPU). */
int cuda_norm_rows(const float *x, const int32_t *rows, const float *w, float *h, int n_rows, int n,
    struct cuda_norm nm, cudaStream_t st, char *err);

/* a[i] = silu(a[i]) * b[i], or gelu_tanh(a[i]) * b[i], for i < n. */
int cuda_glu(float *a, const float *b, int64_t n, int gelu, cudaStream_t st, char *err);

/* ids[r] = the index of the largest of row r's n floats (the lowest among equals), r < n_rows. */
int cuda_argmax(const float *x, int n_rows, int n, int32_t *ids, cudaStream_t st, char *err);

#endif
