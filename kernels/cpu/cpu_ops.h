/* cpu_ops.h: the CPU backend's numeric kernels: float32, and 8-bit activations for products. */
#ifndef RESIDENT_CPU_OPS_H
#define RESIDENT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

struct cpu_pool;
struct model_tensor;

/* Rows of a weight dequantized at a time by one task. */
#define CPU_MM_ROWS 16

/*
 * Picks the SIMD variants this processor runs (AVX2/FMA or portable C);
 * RESIDENT_CPU_ISA=portable in the environment forces portable C.
 */
void cpu_ops_init(void);
/* "avx2" or "portable". */
const char *cpu_ops_isa(void);

/* Dot product of n floats, in a fixed order (the same for every call). */
float cpu_dot(const float *a, const float *b, int64_t n);

/*
 * The input of products: n_tok rows of n floats, ld apart. With q8 set
 * (fast mode), a product with a weight that has an integer kernel
 * (cpu_q8.h) takes the rows quantized to 8 bits, made on first use, once
 * for each 8-bit type: q8[0] holds the Q8_0 copy, q8[1] the Q8_K one,
 * cpu_act_bytes each. With q8 NULL every product is float (exact mode).
 */
struct cpu_act {
	const float *x;
	int64_t ld, n;
	int n_tok;
	uint8_t *const *q8;
	int made[2];
};

/* Bytes of one 8-bit copy of n_tok rows of n floats, either type. */
size_t cpu_act_bytes(int64_t n, int64_t n_tok);

/* An input over x (see struct cpu_act); q8 NULL for the float path. */
void cpu_act_init(struct cpu_act *a, const float *x, int64_t ld, int n_tok, int64_t n,
    uint8_t *const *q8);

/*
 * An input over rows row0 .. row0 + n_tok - 1 of a buffer whose rows are
 * ld apart, with its 8-bit copies (q8 NULL: none) at the same rows of q8's
 * two areas, whose start the call puts in slice (which must outlive a).
 * Slices of one buffer with disjoint rows can be the inputs of one
 * cpu_matmul_set.
 */
void cpu_act_rows(struct cpu_act *a, const float *x, int64_t ld, int64_t row0, int n_tok, int64_t n,
    uint8_t *const *q8, uint8_t *slice[2]);

/* Most weights one cpu_matmul takes. */
#define CPU_MM_MAX 3

/* One product of a set (cpu_matmul_set): y[t * ldy + o] = W[o] . x's token t. */
struct cpu_mm {
	struct cpu_act *x;
	const struct model_tensor *w;
	float *y;
	int64_t ldy;
};

/*
 * For each of the n <= CPU_MM_MAX weights w[j] (ne[1] rows of ne[0] = the
 * input's n): y[j][t * ldy[j] + o] = sum_i W[o][i] * x[t * ld + i] for
 * the input's n_tok tokens and every output row o, all in one pool run
 * (the products of one input, as Q/K/V or gate/up, share the threads'
 * start and end). scratch holds n_threads * CPU_MM_ROWS * (widest ne[0])
 * floats. On the float path each y element has the bits of cpu_dot over
 * the dequantized row (quant_dequantize), whatever kernel computed it; on
 * the 8-bit path, those of the row's integer dot product with the token's
 * 8-bit copy. Either way it does not depend on n_tok or on the other
 * weights.
 */
void cpu_matmul(struct cpu_pool *pool, struct cpu_act *x, int n, const struct model_tensor *const *w,
    float *const *y, const int64_t *ldy, float *scratch);

/*
 * n products, each by its own weight of its own input (the experts of a
 * layer, each over the tokens routed to it), all in one pool run, with
 * cpu_matmul's arithmetic. An input shared by several products gets its
 * 8-bit copy made once.
 */
void cpu_matmul_set(struct cpu_pool *pool, int n, const struct cpu_mm *mm, float *scratch);

/* Dequantizes row r of a weight (an embedding lookup). */
void cpu_get_row(const struct model_tensor *w, int64_t r, float *out);

/* A 1-D weight (or each row of a 2-D one) as a malloc'd float array, for small weights converted once; NULL stays NULL. */
float *cpu_to_float(const struct model_tensor *t);

/* out = x / rms(x) * (w + w_offset), n elements; out may be x. */
void cpu_rmsnorm(const float *x, const float *w, float w_offset, float eps, int64_t n, float *out);

/* Rotates n_heads heads of dimension d (one after the other) at position pos by the d / 2 frequencies freq. */
void cpu_rope(float *x, int n_heads, int d, float pos, const float *freq, int neox);

/* a[i] = silu(a[i]) * b[i], or gelu_tanh(a[i]) * b[i]. */
void cpu_glu(float *a, const float *b, int64_t n, int gelu);

/* gpt-oss's gate: a[i] = (clamp(b[i], +-limit) + 1) * g * sigmoid(alpha * g), g = min(a[i], limit). */
void cpu_glu_oai(float *a, const float *b, int64_t n, float alpha, float limit);

/* sc[i] = exp(sc[i] - mx) for i < n; returns their sum, added in one fixed order. */
float cpu_exp_sum(float *sc, int64_t n, float mx);

/* y[i] += a * x[i] */
void cpu_axpy(float *y, float a, const float *x, int64_t n);

/* a[i] += b[i] */
void cpu_add(float *a, const float *b, int64_t n);

#endif
