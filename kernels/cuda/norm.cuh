/*
 * norm.cuh: row-wise kernels of the residual stream (RMSNorm, residual
 * adds, the gated activation) and the greedy pick over logits rows. Host
 * entry points, all on stream st, and the device helpers the products
 * share (the int8 form, the activations).
 */
#ifndef RESIDENT_CUDA_NORM_CUH
#define RESIDENT_CUDA_NORM_CUH

#include "cuda_common.cuh"

/* RMSNorm: out = x / rms(x) * (w + offset). */
struct cuda_norm {
	float offset, eps;
};

/*
 * Rows as fp16, each divided by a power of two when its largest magnitude
 * would overflow fp16 (the divisor in scale[row]): the form the products
 * of many tokens read (cuda_mm.xh, .xscale). h NULL: not wanted.
 */
struct cuda_h16 {
	__half *h;
	float *scale;
};

/* Rows whose largest magnitude is above this are divided by a power of two for fp16. */
#define F16_SAFE 32768.0f

/*
 * The GLU of a gate/up product made by the product itself (the wgmma
 * form's GLU form, cuda_matmul_glu): act(gate) * up as fp16 rows of ff in
 * h, undivided, scale[row] 1; but where a group of 8 of a row met a
 * value past F16_SAFE (or not finite), that group's values are floats in f
 * (row t at t * ff), infinities in their places in h, and big[row] is set,
 * until cuda_glu_fix divides the row as cuda_glu would and clears it.
 */
struct cuda_glu16 {
	__half *h;
	float *f, *scale;
	int *big;
	int ff, gelu;
};

/*
 * The int8 form of rows that the integer matrix-vector kernels read
 * (cuda_mm.xq, .xd): row t of k as two int8 rows, hi at q + 2 t k and lo k
 * bytes after, with a scale e and the float sum of each 32 in
 * d[t k / 32 + g]: x = e (QLO hi + lo). Per group of 32, D = max |x| / 127,
 * hi = round(x / D), lo = round((x - D hi) QLO / D), e = D / QLO. The
 * second row makes the rounding error about e / 2, where one row of int8
 * alone (llama.cpp's Q8_1) errs by QLO times that: enough to move logits
 * by ~1% on small models. q NULL: not wanted.
 */
#define QLO 254
struct cuda_q8 {
	int8_t *q;
	float2 *d;
};

/* hi and lo of v, in a group of 32 whose largest magnitude is amax (see cuda_q8). */
static __device__ __forceinline__ void
q8_split(float v, float amax, int *hi, int *lo)
{
	float d = amax / 127.0f;

	*hi = *lo = 0;
	if (amax > 0.0f) {
		*hi = __float2int_rn(v / d);
		*lo = max(-127, min(127, __float2int_rn((v - d * (float)*hi) * (float)QLO / d)));
	}
}

/* A group's scale and sum as cuda_q8.d holds them. */
static __device__ __forceinline__ float2
q8_scale(float amax, float sum)
{
	return make_float2(amax / 127.0f / (float)QLO, sum);
}

/*
 * v, element i of row t (k wide) in int8 form into q8, one element a lane:
 * the 32 lanes of the calling warp hold one group, i % 32 == lane.
 */
static __device__ __forceinline__ void
q8_store1(struct cuda_q8 q8, int t, int k, int i, float v)
{
	int8_t *q = q8.q + (size_t)t * 2 * k;
	float amax = warp_max(fabsf(v)), sum = warp_sum(v);
	int hi, lo;

	q8_split(v, amax, &hi, &lo);
	q[i] = (int8_t)hi, q[k + i] = (int8_t)lo;
	if (i % 32 == 0)
		q8.d[(size_t)t * (k / 32) + i / 32] = q8_scale(amax, sum);
}

/*
 * Element i of token t's row in fp16 form (cuda_h16) for a row known to fit
 * fp16 unscaled: v itself, and the row's divisor 1 if first.
 */
static __device__ __forceinline__ void
f16_store1(struct cuda_h16 h16, int t, size_t i, int first, float v)
{
	h16.h[i] = __float2half_rn(v);
	if (first)
		h16.scale[t] = 1.0f;
}

/* 1 if the row kernels take rows of n floats (a multiple of 4, at most 32768). */
int cuda_row_fits(int n);

/*
 * What cuda_residual_norm adds to x besides r itself: a bias on r's rows
 * (an attention output's), and r as a mixture, token t's row the sum over
 * its k rows s = t k .. t k + k - 1 of weight[s] times (r's row row[s],
 * or s where row is NULL, plus row_b's row expert[s] if row_b): each
 * token's experts, weighted; and pre's row t (an attention output whose
 * residual add was deferred to here: cuda_norm_router). Zeroed (or NULL):
 * r as it is.
 */
struct cuda_rmix {
	const float *bias;
	int k;                        /* 0: no mixture */
	const float *weight;
	const int32_t *row, *expert;
	const float *row_b;
	const float *pre;
	const int32_t *slot_of;       /* NULL, or slots whose expert's entry is negative add nothing (mm_slots.slot_of) */
};

/*
 * For each of n_rows rows of width n: if r, x += (post ? norm(r') * post :
 * r'), r' the row of r as mix says (NULL: r's own row); then, if w, h =
 * norm(x) * w, or its fp16 form into h16 when h16.h is set, and its int8
 * form into q8 when q8.q is set (n a multiple of 32). Either step may be
 * absent. w and post may be read before pdl_wait (rows of up to 8,192
 * floats): no kernel of the step may write them (they are weights).
 */
int cuda_residual_norm(float *x, const float *r, const struct cuda_rmix *mix, const float *post, const float *w,
    float *h, struct cuda_h16 h16, struct cuda_q8 q8, int n_rows, int n, struct cuda_norm nm, cudaStream_t st,
    char *err);

/* h[i] = norm(x[rows[i]]) * w for i < n_rows (rows on the GPU); w may be read before pdl_wait, as above. */
int cuda_norm_rows(const float *x, const int32_t *rows, const float *w, float *h, int n_rows, int n,
    struct cuda_norm nm, cudaStream_t st, char *err);

/* 1 if cuda_norm_router takes rows of n floats for up to n_tok tokens. */
int cuda_norm_router_fits(int n, int n_tok);

/*
 * The residual norm before a few tokens' experts and their router in one
 * launch: for each token t < n_tok, h = norm(x + r + bias) * w (rows of n;
 * bias NULL: none) and logit[t n_expert + e] = router row e . h, router an
 * F32 matrix of n_expert rows, a block a row, each block norming the
 * tokens itself; block 0 stores h and its int8 form (q8.q set). x is only
 * read: the residual add is left to the norm after the experts
 * (cuda_rmix.pre), so that no block writes what another reads. w and the
 * router's rows may be read before pdl_wait, as cuda_residual_norm's.
 */
int cuda_norm_router(const float *x, const float *r, const float *bias, const float *w, const float *router,
    int n_expert, float *logit, float *h, struct cuda_q8 q8, int n_tok, int n, struct cuda_norm nm, cudaStream_t st,
    char *err);

/*
 * For each of n_rows rows of n: a = silu(a) * b, or gelu_tanh(a) * b, in
 * place, with its int8 form into q8 when q8.q is set (n a multiple of
 * 32); or, when h16.h is set, only its fp16 form into h16. cluster_sms:
 * the device's multiprocessors where it launches clusters (sm_90), over
 * which the fp16 form of few rows spreads each row; 0 for none.
 */
int cuda_glu(float *a, const float *b, int n_rows, int n, int gelu, struct cuda_h16 h16, struct cuda_q8 q8,
    int cluster_sms, cudaStream_t st, char *err);

/*
 * The rows of g (n_rows) that are flagged, divided by a power of two as
 * cuda_glu's fp16 form is, their flags cleared; the others untouched.
 * Where a row's fp16 value was not past F16_SAFE, it is divided as fp16,
 * so a quotient below fp16's normal range may round one step (2^-24 of
 * the divisor) from cuda_glu's.
 */
int cuda_glu_fix(const struct cuda_glu16 *g, int n_rows, cudaStream_t st, char *err);

/* n_rows rows of x (k wide, ldx apart) in fp16 form. */
int cuda_to_f16(const float *x, int ldx, int k, int n_rows, struct cuda_h16 h16, cudaStream_t st, char *err);

/* As cuda_to_f16, row r of the fp16 form taken from row rows[r] / div of x (rows on the GPU). */
int cuda_to_f16_rows(const float *x, int ldx, int k, const int32_t *rows, int div, int n_rows, struct cuda_h16 h16,
    cudaStream_t st, char *err);

/* An expert's activation: enum ffn_act, and gpt-oss's constants. */
struct cuda_act {
	int kind;
	float alpha, limit;
};

/* silu(v) or gelu_tanh(v), as cpu_ops computes them. */
static __device__ __forceinline__ float
act(float v, int gelu)
{
	const float k = 0.7978845608028654f; /* sqrt(2 / pi) */

	if (gelu)
		return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
	return v / (1.0f + expf(-v));
}

/* act(g) * u for an expert's gate g and up u, as the CPU's cpu_glu / cpu_glu_oai. */
static __device__ __forceinline__ float
expert_act(float g, float u, const struct cuda_act &a)
{
	if (a.kind != ACT_SWIGLU_OAI)
		return act(g, a.kind == ACT_GELU) * u;
	g = fminf(g, a.limit);
	u = fmaxf(-a.limit, fminf(u, a.limit));
	return (u + 1.0f) * (g / (1.0f + expf(-a.alpha * g)));
}

/*
 * Rows of the experts' gate and up (n_rows of n): gate += its expert's
 * bias (row_expert[row]'s row of gate_b, up likewise; NULL: none), then
 * gate = act(gate) * up (cuda_act), left as the next product reads it:
 * its fp16 form into h16 when h16.h is set, else floats in place; its int8
 * form into q8 too when q8.q is set.
 */
int cuda_moe_glu(float *gate, const float *up, int n_rows, int n, const int32_t *row_expert, const float *gate_b,
    const float *up_b, struct cuda_act a, struct cuda_h16 h16, struct cuda_q8 q8, cudaStream_t st, char *err);



/*
 * Blocks sharing one row's argmax (a vocabulary row is read by many
 * multiprocessors at once): a thread's few elements of its share are
 * loads in flight together, where with 32 parts each thread walked ~19 of
 * a 151,936-wide row one L2 round trip at a time (the part kernel 13.9 ->
 * 3.4 us, a one-token step of Gemma 3 270M 2 % faster; H200).
 */
#define ARGMAX_PARTS 256
/* Scratch of cuda_argmax, in float2, for n_rows rows. */
#define CUDA_ARGMAX_PARTS(n_rows) ((size_t)(n_rows) * ARGMAX_PARTS)

/*
 * ids[r] = the index of the largest of row r's n floats (the lowest among
 * equals), r < n_rows; part holds CUDA_ARGMAX_PARTS(n_rows).
 */
int cuda_argmax(const float *x, int n_rows, int n, int32_t *ids, float2 *part, cudaStream_t st, char *err);

#endif
