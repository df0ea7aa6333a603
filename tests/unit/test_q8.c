/*
 * test_q8.c: the integer dot products of the CPU backend's fast mode
 * (kernels/cpu/cpu_q8.c), AVX2 and portable, against a float64 dot of the
 * dequantized weight row and the dequantized 8-bit activations: the same
 * numbers, so only float rounding may separate them.
 *
 * Weight blocks are random bytes (every level, every 6-bit scale, Q8_0's
 * -128) with small random fp16 scales; activations are random floats
 * quantized by quant.c. Rows of odd block counts reach the kernels' tails.
 * Several tokens in one call must give each token's result alone, bit for
 * bit: the engine's batch invariance rests on it.
 */
#include "config.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_ops.h"
#include "cpu_q8.h"
#include "quant.h"
#include "quant_blocks.h"
#include "util.h"

#define ROWS 19   /* rows of a weight: not a multiple of a tile */
#define TOKENS 7  /* tokens of a call: a tile of 4 and 3 left */

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static uint32_t
next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}

/* Uniform in [lo, hi). */
static float
uniform(float lo, float hi)
{
	return lo + (hi - lo) * (float)(next() >> 8) / 16777216.0f;
}

/* The fp16 scale fields of a block of type t: byte offsets, or -1. */
static void
scale_fields(uint32_t t, int off[2])
{
	off[0] = off[1] = -1;
	switch (t) {
	case TT_Q4_0: case TT_Q5_0: case TT_Q8_0:
		off[0] = 0;
		break;
	case TT_Q4_K: case TT_Q5_K:
		off[0] = offsetof(struct blk_q4_K, d);
		off[1] = offsetof(struct blk_q4_K, dmin);
		break;
	case TT_Q6_K:
		off[0] = offsetof(struct blk_q6_K, d);
		break;
	}
}

/* A row of nb random blocks of type t. */
static uint8_t *
random_row(uint32_t t, int64_t nb)
{
	const struct quant_traits *qt = quant_traits(t);
	size_t bytes = (size_t)nb * (size_t)qt->block_bytes;
	uint8_t *row = xmalloc(bytes);
	uint16_t h;
	int off[2];

	for (size_t i = 0; i < bytes; i++)
		row[i] = (uint8_t)next();
	scale_fields(t, off);
	for (int64_t b = 0; b < nb; b++)
		for (int k = 0; k < 2; k++) {
			if (off[k] < 0)
				continue;
			h = fp32_to_fp16(uniform(1e-3f, 2e-2f));
			memcpy(row + b * qt->block_bytes + off[k], &h, sizeof h);
		}
	return row;
}

/* n activations of an 8-bit type as floats. */
static void
act_dequantize(int at, const uint8_t *q, int64_t n, float *x)
{
	const struct q8_act32 *b = (const struct q8_act32 *)q;

	if (at == Q8_ACT_K) {
		quant_dequantize(TT_Q8_K, q, x, n);
		return;
	}
	for (int64_t i = 0; i < n; i++)
		x[i] = b[i / 32].d * (float)b[i / 32].qs[i % 32];
}

/*
 * One weight type, n elements a row: ROWS random rows by TOKENS tokens in
 * one call; each result against the float64 dot, and bit for bit against
 * the same row and token alone (batch invariance).
 */
static void
check_type(uint32_t t, int64_t n)
{
	int at = cpu_q8_act_type(t);
	cpu_q8_mm_fn mm = cpu_q8_mm(t);
	const struct quant_traits *qt = quant_traits(t);
	int64_t nb = n / qt->block_elems;
	size_t ab, rb = (size_t)nb * (size_t)qt->block_bytes;
	float *x = xmalloc((size_t)n * sizeof *x), *wf = xmalloc((size_t)n * sizeof *wf);
	float *xf = xmalloc((size_t)n * sizeof *xf), y[TOKENS * ROWS], one;
	uint8_t *xq, *w = xmalloc(rb * ROWS), *row;
	double ref, mag, worst = 0;
	int r, k;

	assert_true(at >= 0);
	assert_non_null(mm);
	ab = cpu_q8_act_bytes(at, n);
	xq = xmalloc(ab * TOKENS);
	for (r = 0; r < ROWS; r++) {
		row = random_row(t, nb);
		memcpy(w + r * rb, row, rb);
		free(row);
	}
	for (k = 0; k < TOKENS; k++) {
		for (int64_t i = 0; i < n; i++)
			x[i] = uniform(-3, 3) * (k % 3 == 0 ? 100.0f : 1.0f);
		assert_int_equal(cpu_q8_quantize(at, x, n, xq + k * ab), 0);
	}
	mm(w, rb, ROWS, xq, ab, TOKENS, nb, y, ROWS);
	for (k = 0; k < TOKENS; k++) {
		act_dequantize(at, xq + k * ab, n, xf);
		for (r = 0; r < ROWS; r++) {
			quant_dequantize(t, w + r * rb, wf, n);
			ref = mag = 0;
			for (int64_t i = 0; i < n; i++) {
				ref += (double)wf[i] * xf[i];
				mag += fabs((double)wf[i] * xf[i]);
			}
			worst = fmax(worst, fabs(y[k * ROWS + r] - ref) / mag);
			mm(w + r * rb, rb, 1, xq + k * ab, ab, 1, nb, &one, 1);
			assert_memory_equal(&one, &y[k * ROWS + r], sizeof one);
		}
	}
	printf("%-5s x %-4s n=%-5lld (%s): worst |dot - ref| / sum |w x| = %.2e\n",
	    qt->name, at == Q8_ACT_K ? "Q8_K" : "Q8", (long long)n, cpu_ops_isa(), worst);
	assert_true(worst < 1e-5);
	free(x), free(wf), free(xf), free(xq), free(w);
}

static void
check_all(void)
{
	static const uint32_t types[] = { TT_Q4_0, TT_Q5_0, TT_Q8_0, TT_Q4_K, TT_Q5_K, TT_Q6_K };

	for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
		int64_t be = quant_traits(types[i])->block_elems;

		check_type(types[i], be);      /* one block: only the tail */
		check_type(types[i], 7 * be);  /* odd */
		check_type(types[i], 24 * be);
	}
}

static void
test_native(void **state)
{
	(void)state;
	unsetenv("RESIDENT_CPU_ISA");
	cpu_ops_init();
	check_all();
}

static void
test_portable(void **state)
{
	(void)state;
	setenv("RESIDENT_CPU_ISA", "portable", 1);
	cpu_ops_init();
	assert_string_equal(cpu_ops_isa(), "portable");
	check_all();
	unsetenv("RESIDENT_CPU_ISA");
	cpu_ops_init();
}

/* Only the quantized types have integer kernels; floats keep the float path. */
static void
test_act_types(void **state)
{
	(void)state;
	assert_int_equal(cpu_q8_act_type(TT_Q5_0), Q8_ACT_32);
	assert_int_equal(cpu_q8_act_type(TT_Q6_K), Q8_ACT_K);
	assert_int_equal(cpu_q8_act_type(TT_F32), Q8_ACT_NONE);
	assert_int_equal(cpu_q8_act_type(TT_F16), Q8_ACT_NONE);
	assert_int_equal(cpu_q8_act_type(TT_BF16), Q8_ACT_NONE);
	assert_int_equal(cpu_q8_act_type(TT_Q2_K), Q8_ACT_NONE);
}

/*
 * 32-element activations: AVX2 and portable give the same bytes (ties
 * included: x * (1 / d) lands on k + 0.5 for chosen x), within half a
 * step of x; a NaN or an infinity anywhere is refused.
 */
static void
test_quantize32(void **state)
{
	enum { N = 32 * 64 };
	float x[N];
	struct q8_act32 a[N / 32], b[N / 32];

	(void)state;
	for (int i = 0; i < N; i++)
		x[i] = i % 64 == 0 ? 127.0f : i % 64 < 8 ? (float)(i % 64) + 0.5f : uniform(-50, 50);
	unsetenv("RESIDENT_CPU_ISA");
	cpu_ops_init();
	assert_int_equal(cpu_q8_quantize(Q8_ACT_32, x, N, a), 0);
	setenv("RESIDENT_CPU_ISA", "portable", 1);
	cpu_ops_init();
	assert_int_equal(cpu_q8_quantize(Q8_ACT_32, x, N, b), 0);
	assert_memory_equal(a, b, sizeof a);
	assert_int_equal(a[0].qs[3], 4);  /* 3.5 to even: 4 */
	assert_int_equal(a[0].qs[2], 2);  /* 2.5 to even: 2 */
	for (int i = 0; i < N; i++)
		assert_true(fabsf(a[i / 32].d * a[i / 32].qs[i % 32] - x[i]) <= 0.5f * a[i / 32].d * 1.0001f);
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			unsetenv("RESIDENT_CPU_ISA");
		cpu_ops_init();
		x[77] = NAN;
		assert_int_equal(cpu_q8_quantize(Q8_ACT_32, x, N, a), ERR_INVAL);
		x[77] = INFINITY;
		assert_int_equal(cpu_q8_quantize(Q8_ACT_32, x, N, a), ERR_INVAL);
		x[77] = 1;
	}
}

/*
 * Q8_K activations: the AVX2 quantizer gives quant.c's bytes, including
 * a block whose extremes are +m and -m (the first one sets the sign) and
 * an all-zero block.
 */
static void
test_quantize_k(void **state)
{
	enum { N = QK_K * 6 };
	float x[N];
	struct blk_q8_K a[N / QK_K], b[N / QK_K];

	(void)state;
	for (int i = 0; i < N; i++)
		x[i] = uniform(-20, 20);
	x[5] = -30, x[9] = 30;            /* block 0: -30 first */
	x[QK_K + 3] = 30, x[QK_K + 8] = -30; /* block 1: +30 first */
	for (int i = 2 * QK_K; i < 3 * QK_K; i++)
		x[i] = 0;
	for (int i = 3 * QK_K; i < 4 * QK_K; i++)
		x[i] = (float)(i % 64) - 31.5f; /* ties */
	unsetenv("RESIDENT_CPU_ISA");
	cpu_ops_init();
	assert_int_equal(cpu_q8_quantize(Q8_ACT_K, x, N, a), 0);
	assert_int_equal(quant_quantize(TT_Q8_K, x, b, N), 0);
	assert_memory_equal(a, b, sizeof a);
	x[QK_K * 5 + 7] = NAN;
	assert_int_equal(cpu_q8_quantize(Q8_ACT_K, x, N, a), ERR_INVAL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_native),
		cmocka_unit_test(test_portable),
		cmocka_unit_test(test_act_types),
		cmocka_unit_test(test_quantize32),
		cmocka_unit_test(test_quantize_k),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
