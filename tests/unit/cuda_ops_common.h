/*
 * cuda_ops_common.h: what the kernel tests share, static helpers for
 * test_cuda_ops.c (embedding rows, products, norms and GLU, argmax, sampled
 * picks), test_cuda_attn.c (RoPE, the KV write, attention) and
 * test_cuda_moe.c (experts). Each runs the CUDA backend's kernels one at a
 * time against the CPU backend's (kernels/cpu/cpu_ops.h) or a plain
 * reference, through kernels/cuda/cuda_probe.h; here are the probe and CPU
 * pool of its test group, the random inputs, random weights, the checks of
 * rows, the tolerances and the start of main (the skip and the seed).
 *
 * Inputs are fresh random numbers every run; the seed is printed, and
 * TEST_CUDA_OPS_SEED=N repeats a run (of any of the three programs);
 * TEST_CUDA_OPS_ONLY=PATTERN runs the tests whose names match it (cmocka's
 * pattern: * and ?), so that a sanitizer's slow run can take the kernels
 * it is about. Quantized weights are random bytes with block scales that
 * keep the values near [-1, 1], so every bit of the packed quants and
 * sub-block scales is exercised. Shapes are chosen not
 * to be multiples of the kernels' tiles: rows not multiples of 4, token
 * counts not multiples of 8, rows of 8-element chunks not multiples of the
 * 128 threads, widths not multiples of 256, sequence lengths not multiples
 * of the 16-token KV block, head counts not multiples of 4. The probe
 * fills every output with NaN bytes before the kernel runs and checks the
 * bytes after each buffer, so a missed or a stray write fails.
 *
 * Tolerances, and why:
 * - dequantization (embedding rows): the same float operations as
 *   quant.c, but the compiler may fuse a product and a difference: 1e-6 of
 *   the row's largest value;
 * - products, against cpu_matmul, as a fraction of sum |w_i x_i| (the
 *   size of the dot product's terms, which bounds any rounding error):
 *   matrix-vector kernels (float32 throughout, another summation order)
 *   2e-5; the many-token paths (the tensor-core kernel on quantized
 *   blocks, cuBLAS on the others), which round both operands to fp16 (at
 *   most 2^-10 of each product) and accumulate in float32, 2e-3;
 * - norms, GLU, RoPE: float32 with other reduction orders and CUDA's
 *   expf/tanhf/sinf/cosf (2 ulp): 1e-5 relative;
 * - K and V in the fp16 pool: half an fp16 ulp (2^-11) of the value, plus
 *   the float32 error above; in the fp32 pool (exact mode) the float32
 *   error alone;
 * - attention, against a float64 softmax over the same K/V (fp16 or fp32
 *   pool, one piece or split and merged): 1e-5 of the largest value it
 *   averages; prefill tiles on the tensor cores (fp16 queries and
 *   weights): 3e-3;
 * - argmax: exact, the lowest index among equal maxima.
 *
 * Without a CUDA device each program says so and exits 77 (a skip).
 */
#ifndef RESIDENT_TEST_CUDA_OPS_COMMON_H
#define RESIDENT_TEST_CUDA_OPS_COMMON_H

#include "cpu_ops.h"
#include "cpu_pool.h"
#include "cuda_probe.h"
#include "kernels.h"
#include "model.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define TOL_DEQ 1e-6
#define TOL_MATVEC 2e-5
#define TOL_GEMM 2e-3
/*
 * int8 activations with an int8 remainder: about 15 bits per value, relative
 * to each 32's largest (1/127 of it, then 1/254 of that step): ~3e-5 of
 * the block's scale per term, so 5e-4 of sum |w x| leaves room for blocks
 * whose largest value dwarfs the rest, and stays 4x under cuBLAS's fp16.
 */
#define TOL_INT8 5e-4
#define TOL_F32 1e-5
#define TOL_ATTN 1e-5
/*
 * Prefill attention on the tensor cores rounds the scaled queries and the
 * softmax weights to fp16 (2^-11 relative each) and sums in float: scores
 * of these tests reach ~10, so a weight errs by ~1e-3 of itself at worst.
 */
#define TOL_FLASH 3e-3
#define CPU_THREADS 4

static uint64_t rng_state;
static struct cuda_probe *probe;
static struct cpu_pool *pool;

/* splitmix64: the next 64 random bits. */
static uint64_t
rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static float
unif(float lo, float hi)
{
	return lo + (hi - lo) * (float)((double)(rnd() >> 11) / 9007199254740992.0);
}

/* n floats uniform in [lo, hi), malloc'd. */
static float *
rand_floats(size_t n, float lo, float hi)
{
	float *f = xmalloc((n ? n : 1) * sizeof *f);

	for (size_t i = 0; i < n; i++)
		f[i] = unif(lo, hi);
	return f;
}

/* n floats, all NaN: what an output holds before the call that fills it. */
static float *
nan_floats(size_t n)
{
	float *f = xmalloc((n ? n : 1) * sizeof *f);

	for (size_t i = 0; i < n; i++)
		f[i] = NAN;
	return f;
}

static double
max_abs(const float *a, size_t n)
{
	double m = 0;

	for (size_t i = 0; i < n; i++)
		m = fmax(m, fabs((double)a[i]));
	return m;
}

/* ---- weights ---- */

/*
 * Where a block type keeps its fp16 scales, and the largest multiple of d
 * its quants reach (so that d = 1 / range keeps the values within +-1).
 */
static const struct {
	uint32_t type;
	int d_off, dmin_off; /* dmin_off -1: none */
	float range;
} block_scales[] = {
	{ TT_Q8_0, 0, -1, 127 }, { TT_Q4_0, 0, -1, 8 }, { TT_Q5_0, 0, -1, 16 },
	{ TT_Q4_K, 0, 2, 63 * 15 }, { TT_Q5_K, 0, 2, 63 * 31 }, { TT_Q6_K, 208, -1, 128 * 32 },
};

static void
put_f16(uint8_t *p, float f)
{
	uint16_t h = fp32_to_fp16(f);

	memcpy(p, &h, sizeof h);
}

/*
 * n random rows of k elements of type, as stored (malloc'd): float types
 * from uniform values, block types random bytes with sane scales. *f gets
 * the rows dequantized (malloc'd), as the CPU backend reads them.
 */
static struct model_tensor
random_weight(uint32_t type, int64_t k, int64_t n, float **f)
{
	const struct quant_traits *qt = quant_traits(type);
	struct model_tensor t = { "w", type, 2, { k, n, 1, 1 }, NULL, 0 };
	size_t row_bytes, nb, i;
	uint8_t *d;

	assert_int_equal(quant_row_bytes(type, k, &row_bytes), 0);
	t.bytes = row_bytes * (size_t)n;
	d = xmalloc(t.bytes);
	if (qt->block_elems == 1) {
		float *src = rand_floats((size_t)(k * n), -1, 1);

		assert_int_equal(quant_quantize(type, src, d, k * n), 0);
		free(src);
	} else {
		for (i = 0; i < t.bytes; i++)
			d[i] = (uint8_t)rnd();
		nb = t.bytes / (size_t)qt->block_bytes;
		for (i = 0; type == TT_MXFP4 && i < nb; i++) /* scales of 2^-4 to 2^-2: values within +-1.5 */
			d[i * (size_t)qt->block_bytes] = (uint8_t)(123 + rnd() % 3);
		for (size_t s = 0; s < ARRAY_LEN(block_scales); s++) {
			if (block_scales[s].type != type)
				continue;
			for (i = 0; i < nb; i++) {
				uint8_t *b = d + i * (size_t)qt->block_bytes;

				put_f16(b + block_scales[s].d_off, unif(0.5f, 1.0f) / block_scales[s].range);
				if (block_scales[s].dmin_off >= 0)
					put_f16(b + block_scales[s].dmin_off, unif(0.0f, 1.0f) / 63.0f);
			}
		}
	}
	t.data = d;
	*f = xmalloc((size_t)(k * n) * sizeof **f);
	quant_dequantize(type, d, *f, k * n);
	return t;
}

static struct cuda_probe_weight
probe_weight(const struct model_tensor *t)
{
	struct cuda_probe_weight w = { t->type, t->ne[0], t->ne[1], t->data };

	return w;
}

/* ---- paths ---- */

static const char *
path_name(enum cuda_probe_path path)
{
	return path == CUDA_PROBE_MATVEC ? "matvec" : path == CUDA_PROBE_INT8 ? "int8" :
	    path == CUDA_PROBE_GEMM ? "gemm" : path == CUDA_PROBE_FEW ? "few" : path == CUDA_PROBE_BLAS ? "blas" :
	    path == CUDA_PROBE_WG ? "wgmma" : path == CUDA_PROBE_WG_WHOLE ? "wgmma-whole" : "gemm-whole";
}

/*
 * ---- checks of rows ----
 *
 * static inline: test_cuda_moe.c uses none of them, and an unused inline
 * function draws no warning.
 */

/* Fails unless every row of got is within tol of ref, relative to the row's largest value. */
static inline double
check_rows_tol(const char *what, const float *got, const float *ref, int n_rows, int n, double tol)
{
	double worst = 0;

	for (int r = 0; r < n_rows; r++) {
		double m = max_abs(ref + (size_t)r * n, (size_t)n);

		for (int i = 0; i < n; i++) {
			double e = fabs((double)got[(size_t)r * n + i] - ref[(size_t)r * n + i]) / m;

			if (!(e <= tol))
				fail_msg("%s: row %d element %d: gpu %g cpu %g", what, r, i, got[(size_t)r * n + i],
				    ref[(size_t)r * n + i]);
			worst = fmax(worst, e);
		}
	}
	return worst;
}

/* check_rows_tol within TOL_F32. */
static inline double
check_rows(const char *what, const float *got, const float *ref, int n_rows, int n)
{
	return check_rows_tol(what, got, ref, n_rows, n, TOL_F32);
}

/*
 * Fails unless every fp16-form row (hh, divided by hscale[row]) is ref
 * within fp16's rounding (2^-11 of the value) plus TOL_F32 of the row's
 * largest, and the divisor is 1 unless the row would overflow fp16 (then a
 * power of two that brings it under 32768). Returns the worst error /
 * that bound.
 */
static inline double
check_rows_f16(const char *what, const uint16_t *hh, const float *hscale, const float *ref, int n_rows, int n)
{
	double worst = 0;

	for (int r = 0; r < n_rows; r++) {
		double m = max_abs(ref + (size_t)r * n, (size_t)n), s = hscale[r];

		if (!(m <= 32768 ? s == 1 : s >= m / 32768 && s < m / 16384 && s == exp2(round(log2(s)))))
			fail_msg("%s: row %d of largest %g: divisor %g", what, r, m, s);
		for (int i = 0; i < n; i++) {
			double ref_i = ref[(size_t)r * n + i], got = fp16_to_fp32(hh[(size_t)r * n + i]) * s;
			double bound = ldexp(fabs(ref_i), -11) + TOL_F32 * m, e = fabs(got - ref_i);

			if (!(e <= bound))
				fail_msg("%s (fp16): row %d element %d: gpu %g cpu %g", what, r, i, got, ref_i);
			worst = fmax(worst, e / bound);
		}
	}
	return worst;
}

/*
 * Fails unless the int8 form of every row (q, qd as cuda_probe_residual_norm
 * gives them) stands for ref: per group of 32, the scale is max |ref| /
 * (127 QLO) and the sum that of ref, each within TOL_F32 of the row's
 * largest; each element, scale (QLO hi + lo), within the scale (twice the
 * rounding of lo) plus TOL_F32 of the row's largest. Returns the worst
 * element error / that bound.
 */
static inline double
check_rows_q8(const char *what, const int8_t *q, const float *qd, const float *ref, int n_rows, int n)
{
	const double qlo = 254;
	double worst = 0;

	for (int r = 0; r < n_rows; r++) {
		const float *rr = ref + (size_t)r * n;
		const int8_t *hi = q + (size_t)r * 2 * n, *lo = hi + n;
		double m = max_abs(rr, (size_t)n);

		for (int g = 0; g < n / 32; g++) {
			double e = qd[2 * ((size_t)r * (n / 32) + g)], sum = qd[2 * ((size_t)r * (n / 32) + g) + 1];
			double gm = max_abs(rr + 32 * g, 32), rs = 0;

			for (int i = 32 * g; i < 32 * g + 32; i++) {
				double got = e * (qlo * hi[i] + lo[i]), bound = e + TOL_F32 * m;

				if (!(fabs(got - rr[i]) <= bound))
					fail_msg("%s (int8): row %d element %d: gpu %g (hi %d lo %d scale %g) cpu %g", what, r, i,
					    got, hi[i], lo[i], e, rr[i]);
				worst = fmax(worst, fabs(got - rr[i]) / bound);
				rs += rr[i];
			}
			if (!(fabs(e * 127 * qlo - gm) <= TOL_F32 * m && fabs(sum - rs) <= 32 * TOL_F32 * m))
				fail_msg("%s (int8): row %d group %d: scale %g sum %g, cpu largest %g sum %g", what, r, g,
				    e, sum, gm, rs);
		}
	}
	return worst;
}

/* ---- setup ---- */

static int
group_setup(void **state)
{
	char err[ERR_LEN];

	(void)state;
	if (cuda_probe_open(&probe, err) != 0) {
		print_error("cuda_probe_open: %s\n", err);
		return -1;
	}
	cpu_ops_init();
	pool = cpu_pool_new(CPU_THREADS, CPU_POOL_SPIN);
	return 0;
}

static int
group_teardown(void **state)
{
	(void)state;
	cuda_probe_close(probe);
	cpu_pool_free(pool);
	return 0;
}

/*
 * A kernel test's main: without a CUDA device says so and returns 77 (a
 * skip); else seeds the draws (TEST_CUDA_OPS_SEED, or the clock and the
 * pid), prints the seed as test's, applies TEST_CUDA_OPS_ONLY and runs the
 * n tests as one group.
 */
static int
cuda_ops_run(const char *test, const struct CMUnitTest *tests, size_t n)
{
	const char *s = getenv("TEST_CUDA_OPS_SEED"), *only = getenv("TEST_CUDA_OPS_ONLY");
	uint64_t seed;

	if (cuda_backend_devices() <= 0) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	seed = s != NULL && *s != '\0' ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	printf("%s: seed %llu (TEST_CUDA_OPS_SEED=%llu repeats this run)\n", test, (unsigned long long)seed,
	    (unsigned long long)seed);
	fflush(stdout);
	rng_state = seed;
	if (only != NULL && *only != '\0')
		cmocka_set_test_filter(only);
	return _cmocka_run_group_tests(test, tests, n, group_setup, group_teardown);
}

#endif
