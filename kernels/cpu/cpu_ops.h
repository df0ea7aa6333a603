/* cpu_ops.h: the CPU backend's numeric kernels, float32 throughout. */
#ifndef RESIDENT_CPU_OPS_H
#define RESIDENT_CPU_OPS_H

#include <stdint.h>

struct cpu_pool;
struct model_tensor;

/* Rows of a weight dequantized at a time by one task. */
#define CPU_MM_ROWS 16

/* Picks the SIMD variants this processor runs (AVX2/FMA or portable C). */
void cpu_ops_init(void);
/* "avx2" or "portable". */
const char *cpu_ops_isa(void);

/* Dot product of n floats, in a fixed order (the same for every call). */
float cpu_dot(const float *a, const float *b, int64_t n);

/*
 * y[t * ldy + o] = sum_i W[o][i] * x[t * ldx + i] for t < n_tok and every
 * output row o of the weight (ne[1] rows of ne[0]); scratch holds
 * n_threads * CPU_MM_ROWS * ne[0] floats. Each y element has the bits of
 * cpu_dot over the dequantized row (quant_dequantize), whatever kernel
 * computed it, so it does not depend on n_tok.
 */
void cpu_matmul(struct cpu_pool *pool, const struct model_tensor *w, const float *x, int64_t ldx,
    int n_tok, float *y, int64_t ldy, float *scratch);

/* Dequantizes row r of a weight (an embedding lookup). */
void cpu_get_row(const struct model_tensor *w, int64_t r, float *out);

/* out = x / rms(x) * (w + w_offset), n elements; out may be x. */
void cpu_rmsnorm(const float *x, const float *w, float w_offset, float eps, int64_t n, float *out);

/* Rotates one head of dimension d at position pos (scaled) with base theta. */
void cpu_rope(float *x, int d, float pos, float theta, int neox);

/* a[i] = silu(a[i]) * b[i], or gelu_tanh(a[i]) * b[i]. */
void cpu_glu(float *a, const float *b, int64_t n, int gelu);

/* a[i] += b[i] */
void cpu_add(float *a, const float *b, int64_t n);

#endif
