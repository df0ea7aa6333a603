/*
 * cpu_ops.c: float32 kernels of the CPU backend.
 *
 * Matrix products read the weights in their stored type: a task dequantizes
 * CPU_MM_ROWS rows into its scratch and dots them with every token, so the
 * dequantization is paid once per step and the model is never expanded in
 * memory. The dot product has an AVX2/FMA variant picked at run time; both
 * variants sum in a fixed order, which keeps a token's result independent of
 * the batch it came in.
 */
#include "config.h"
#include "cpu_ops.h"
#include "cpu_pool.h"
#include "model.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

/* Eight partial sums, combined pairwise: the portable twin of the AVX2 order. */
static float
dot_portable(const float *a, const float *b, int64_t n)
{
	float acc[8] = { 0 };
	int64_t i;
	int k;

	for (i = 0; i + 8 <= n; i += 8)
		for (k = 0; k < 8; k++)
			acc[k] += a[i + k] * b[i + k];
	for (; i < n; i++)
		acc[i % 8] += a[i] * b[i];
	return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

#ifdef HAVE_X86
/* Two 8-wide FMA accumulators. */
__attribute__((target("avx2,fma"))) static float
dot_avx2(const float *a, const float *b, int64_t n)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	__m128 lo;
	float tail = 0;
	int64_t i;

	for (i = 0; i + 16 <= n; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
	}
	for (; i + 8 <= n; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
	for (; i < n; i++)
		tail += a[i] * b[i];
	s0 = _mm256_add_ps(s0, s1);
	lo = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo) + tail;
}
#endif

static float (*dot_impl)(const float *, const float *, int64_t) = dot_portable;
static const char *isa = "portable";

void
cpu_ops_init(void)
{
#ifdef HAVE_X86
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
		dot_impl = dot_avx2;
		isa = "avx2";
	}
#endif
}

const char *
cpu_ops_isa(void)
{
	return isa;
}

float
cpu_dot(const float *a, const float *b, int64_t n)
{
	return dot_impl(a, b, n);
}

struct mm_ctx {
	const struct model_tensor *w;
	size_t row_bytes;
	const float *x;
	int64_t ldx;
	int n_tok;
	float *y;
	int64_t ldy;
	float *scratch;
};

/* One task: CPU_MM_ROWS output rows for every token. */
static void
mm_task(void *arg, int64_t task, int thread)
{
	const struct mm_ctx *c = arg;
	int64_t in = c->w->ne[0], r0 = task * CPU_MM_ROWS;
	int64_t nr = MIN(CPU_MM_ROWS, c->w->ne[1] - r0), r;
	float *rows = c->scratch + (size_t)thread * CPU_MM_ROWS * (size_t)in;
	const float *xt;
	float *yt;
	int t;

	quant_dequantize(c->w->type, (const uint8_t *)c->w->data + (size_t)r0 * c->row_bytes, rows, nr * in);
	for (t = 0; t < c->n_tok; t++) {
		xt = c->x + t * c->ldx;
		yt = c->y + t * c->ldy + r0;
		for (r = 0; r < nr; r++)
			yt[r] = dot_impl(rows + r * in, xt, in);
	}
}

void
cpu_matmul(struct cpu_pool *pool, const struct model_tensor *w, const float *x, int64_t ldx,
    int n_tok, float *y, int64_t ldy, float *scratch)
{
	struct mm_ctx c = { w, 0, x, ldx, n_tok, y, ldy, scratch };

	quant_row_bytes(w->type, w->ne[0], &c.row_bytes);
	cpu_pool_run(pool, (w->ne[1] + CPU_MM_ROWS - 1) / CPU_MM_ROWS, mm_task, &c);
}

void
cpu_get_row(const struct model_tensor *w, int64_t r, float *out)
{
	size_t row_bytes;

	quant_row_bytes(w->type, w->ne[0], &row_bytes);
	quant_dequantize(w->type, (const uint8_t *)w->data + (size_t)r * row_bytes, out, w->ne[0]);
}

void
cpu_rmsnorm(const float *x, const float *w, float w_offset, float eps, int64_t n, float *out)
{
	float scale = 1.0f / sqrtf(cpu_dot(x, x, n) / (float)n + eps);
	int64_t i;

	for (i = 0; i < n; i++)
		out[i] = x[i] * scale * (w[i] + w_offset);
}

void
cpu_rope(float *x, int d, float pos, float theta, int neox)
{
	int half = d / 2, i, a, b;
	float ang, c, s, x0, x1;

	for (i = 0; i < half; i++) {
		/* the frequency as Hugging Face computes it: 1 / base^(2i/d) in float */
		ang = pos * (1.0f / powf(theta, (float)(2 * i) / (float)d));
		c = cosf(ang);
		s = sinf(ang);
		a = neox ? i : 2 * i;
		b = neox ? i + half : 2 * i + 1;
		x0 = x[a];
		x1 = x[b];
		x[a] = x0 * c - x1 * s;
		x[b] = x0 * s + x1 * c;
	}
}

void
cpu_glu(float *a, const float *b, int64_t n, int gelu)
{
	const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
	int64_t i;
	float v;

	for (i = 0; i < n; i++) {
		v = a[i];
		if (gelu)
			v = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
		else
			v = v / (1.0f + expf(-v));
		a[i] = v * b[i];
	}
}

void
cpu_add(float *a, const float *b, int64_t n)
{
	int64_t i;

	for (i = 0; i < n; i++)
		a[i] += b[i];
}
