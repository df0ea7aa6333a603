/*
 * test_quant.c: fp16/bf16 conversion, type tables, and quantization.
 *
 * Bit-exactness against gguf-py and llama.cpp is checked by
 * tests/py/test_dequant.py; here: edge values derived by hand, block bytes
 * derived by hand, and round-trip error bounds that a broken quantizer
 * would exceed.
 */
#include "config.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "quant.h"
#include "util.h"

#define N_RT (QK_K * 64) /* elements per round-trip run */

/* The bits of a float. */
static uint32_t
bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof u);
	return u;
}

/* The float of some bits. */
static float
from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof f);
	return f;
}

/* A seeded xorshift64* stream, so every run sees the same data. */
static uint64_t
rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dULL;
}

/* Uniform in [0, 1), exactly representable. */
static double
rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) * 0x1p-53;
}

/*
 * Near-normal values: the sum of 12 uniforms less 6 (mean 0, variance 1).
 * Only exact or correctly rounded operations, so the data, and the bytes
 * quantized from it, are the same on every machine.
 */
static float
rng_normal(uint64_t *s)
{
	double v = -6;

	for (int k = 0; k < 12; k++)
		v += rng_unit(s);
	return (float)v;
}

/* n near-normal values. */
static void
fill_normal(float *x, int64_t n, uint64_t seed)
{
	uint64_t s = seed;

	for (int64_t i = 0; i < n; i++)
		x[i] = rng_normal(&s);
}

/*
 * Data shaped to take every branch of the K-quant searches: each group of
 * 32 has its own power-of-two scale, and some groups are all zero, all
 * positive or all negative.
 */
static void
fill_weights(float *x, int64_t n, uint64_t seed)
{
	uint64_t s = seed;

	for (int64_t g = 0; g < n; g += 32) {
		int kind = (int)(rng_next(&s) % 8);
		double scale = ldexp(1.0, (int)(rng_next(&s) % 12) - 10);

		for (int64_t i = g; i < g + 32; i++) {
			double v = rng_normal(&s) * scale;

			x[i] = (float)(kind == 0 ? 0 : kind == 1 ? fabs(v) :
			    kind == 2 ? -fabs(v) : v);
		}
	}
}

/* FNV-1a, to compare quantized bytes against recorded ones. */
static uint64_t
fnv1a(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ULL;
	return h;
}

/* fp32 -> fp16 on values whose result follows from the format by hand. */
static void
test_fp16_encode(void **state)
{
	(void)state;
	assert_int_equal(fp32_to_fp16(0.0f), 0x0000);
	assert_int_equal(fp32_to_fp16(-0.0f), 0x8000);
	assert_int_equal(fp32_to_fp16(1.0f), 0x3c00);
	assert_int_equal(fp32_to_fp16(-2.0f), 0xc000);
	assert_int_equal(fp32_to_fp16(65504.0f), 0x7bff);  /* largest */
	assert_int_equal(fp32_to_fp16(65519.0f), 0x7bff);  /* below the tie */
	assert_int_equal(fp32_to_fp16(65520.0f), 0x7c00);  /* tie -> even = inf */
	assert_int_equal(fp32_to_fp16(1e10f), 0x7c00);
	assert_int_equal(fp32_to_fp16(-INFINITY), 0xfc00);
	assert_int_equal(fp32_to_fp16(NAN), 0x7e00);
	assert_int_equal(fp32_to_fp16(from_bits(0xffa00001)), 0xfe00);
	/* ties in the mantissa go to even */
	assert_int_equal(fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
	assert_int_equal(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
	assert_int_equal(fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
	/* subnormals: multiples of 2^-24 */
	assert_int_equal(fp32_to_fp16(0x1p-14f), 0x0400);
	assert_int_equal(fp32_to_fp16(0x1p-24f), 0x0001);
	assert_int_equal(fp32_to_fp16(0x1p-25f), 0x0000);       /* tie -> 0 */
	assert_int_equal(fp32_to_fp16(0x1.000002p-25f), 0x0001); /* above it */
	assert_int_equal(fp32_to_fp16(3 * 0x1p-25f), 0x0002);    /* tie -> 2 */
	assert_int_equal(fp32_to_fp16(0x1p-14f - 0x1p-25f), 0x0400);
	assert_int_equal(fp32_to_fp16(-1023 * 0x1p-24f), 0x83ff);
	assert_int_equal(fp32_to_fp16(1e-30f), 0x0000);
}

/* fp16 -> fp32 is exact: every non-NaN half survives the round trip. */
static void
test_fp16_decode(void **state)
{
	(void)state;
	assert_true(fp16_to_fp32(0x3c00) == 1.0f);
	assert_true(fp16_to_fp32(0x0001) == 0x1p-24f);
	assert_true(fp16_to_fp32(0x03ff) == 1023 * 0x1p-24f);
	assert_int_equal(bits(fp16_to_fp32(0x8000)), 0x80000000);
	assert_int_equal(bits(fp16_to_fp32(0xfc00)), 0xff800000);
	/* a NaN keeps its payload, signalling bit included, as numpy does */
	assert_int_equal(bits(fp16_to_fp32(0x7c01)), 0x7f802000);
	assert_int_equal(bits(fp16_to_fp32(0xfe00)), 0xffc00000);
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = fp16_to_fp32((uint16_t)h);

		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
			assert_true(isnan(f));
			continue;
		}
		assert_int_equal(fp32_to_fp16(f), h);
	}
}

/* bf16: the top half of a float, rounded to nearest even, NaN made quiet. */
static void
test_bf16(void **state)
{
	(void)state;
	assert_int_equal(fp32_to_bf16(1.0f), 0x3f80);
	assert_int_equal(fp32_to_bf16(-0.0f), 0x8000);
	assert_int_equal(fp32_to_bf16(from_bits(0x3f808000)), 0x3f80); /* tie */
	assert_int_equal(fp32_to_bf16(from_bits(0x3f818000)), 0x3f82); /* tie */
	assert_int_equal(fp32_to_bf16(from_bits(0x3f808001)), 0x3f81);
	assert_int_equal(fp32_to_bf16(from_bits(0x7f7fffff)), 0x7f80); /* -> inf */
	assert_int_equal(fp32_to_bf16(INFINITY), 0x7f80);
	assert_int_equal(fp32_to_bf16(from_bits(0x7f800001)), 0x7fc0);
	assert_int_equal(fp32_to_bf16(from_bits(0xff80ffff)), 0xffc0);
	assert_int_equal(fp32_to_bf16(from_bits(0x00000001)), 0x0000);
	assert_true(bf16_to_fp32(0x3f80) == 1.0f);
	assert_int_equal(bits(bf16_to_fp32(0x7f81)), 0x7f810000);
	assert_int_equal(bits(bf16_to_fp32(0x8001)), 0x80010000);
}

/* Names, traits and row sizes. */
static void
test_types(void **state)
{
	size_t b = 0;

	(void)state;
	assert_int_equal(quant_type_from_name("q4_k"), TT_Q4_K);
	assert_int_equal(quant_type_from_name("Q8_0"), TT_Q8_0);
	assert_int_equal(quant_type_from_name("bf16"), TT_BF16);
	assert_int_equal(quant_type_from_name("F32"), TT_F32);
	assert_int_equal(quant_type_from_name("q4"), -1);
	assert_int_equal(quant_type_from_name("q4_k_m"), -1);
	assert_int_equal(quant_type_from_name(""), -1);
	assert_null(quant_traits(4));  /* Q4_2, removed from ggml */
	assert_null(quant_traits(16)); /* IQ2_XXS: not supported */
	assert_null(quant_traits(TT_COUNT_));
	assert_null(quant_traits(UINT32_MAX));
	assert_string_equal(quant_traits(TT_Q6_K)->name, "Q6_K");
	assert_int_equal(quant_traits(TT_Q6_K)->block_elems, 256);
	/* GGUF file types, as gguf-py's LlamaFileType numbers them */
	assert_string_equal(quant_file_type_name(0), "F32");
	assert_string_equal(quant_file_type_name(7), "Q8_0");
	assert_string_equal(quant_file_type_name(15), "Q4_K_M");
	assert_string_equal(quant_file_type_name(18), "Q6_K");
	assert_string_equal(quant_file_type_name(32), "BF16");
	assert_null(quant_file_type_name(4));   /* MOSTLY_Q4_1_SOME_F16, removed */
	assert_null(quant_file_type_name(33));
	assert_null(quant_file_type_name(UINT32_MAX));

	assert_int_equal(quant_row_bytes(TT_F32, 3, &b), 0);
	assert_int_equal(b, 12);
	assert_int_equal(quant_row_bytes(TT_BF16, 5, &b), 0);
	assert_int_equal(b, 10);
	assert_int_equal(quant_row_bytes(TT_Q8_0, 64, &b), 0);
	assert_int_equal(b, 68);
	assert_int_equal(quant_row_bytes(TT_Q8_1, 32, &b), 0);
	assert_int_equal(b, 36);
	assert_int_equal(quant_row_bytes(TT_Q4_0, 4096, &b), 0);
	assert_int_equal(b, 128 * 18);
	assert_int_equal(quant_row_bytes(TT_Q4_K, 256, &b), 0);
	assert_int_equal(b, 144);
	assert_int_equal(quant_row_bytes(TT_Q5_K, 256, &b), 0);
	assert_int_equal(b, 176);
	assert_int_equal(quant_row_bytes(TT_Q6_K, 512, &b), 0);
	assert_int_equal(b, 420);
	assert_int_equal(quant_row_bytes(TT_Q8_K, 256, &b), 0);
	assert_int_equal(b, 292);
	assert_int_equal(quant_row_bytes(TT_Q2_K, 256, &b), 0);
	assert_int_equal(b, 84);
	assert_int_equal(quant_row_bytes(TT_Q3_K, 256, &b), 0);
	assert_int_equal(b, 110);
	assert_int_equal(quant_row_bytes(TT_Q4_K, 0, &b), 0);
	assert_int_equal(b, 0);
	assert_int_equal(quant_row_bytes(TT_Q4_K, 255, &b), ERR_INVAL);
	assert_int_equal(quant_row_bytes(TT_Q8_0, -32, &b), ERR_INVAL);
	assert_int_equal(quant_row_bytes(4, 32, &b), ERR_INVAL);
	/* 2^62 floats of 4 bytes overflow a 64-bit size_t */
	assert_int_equal(quant_row_bytes(TT_F32, INT64_MAX / 2 + 1, &b), ERR_INVAL);
}

/* quant_quantize refuses what it cannot write: types, partial blocks, NaN/inf. */
static void
test_quantize_refusals(void **state)
{
	float x[QK_K] = { 0 };
	uint8_t out[512];

	(void)state;
	assert_int_equal(quant_quantize(TT_Q4_0, x, out, 32), ERR_UNSUPPORTED);
	assert_int_equal(quant_quantize(TT_Q3_K, x, out, QK_K), ERR_UNSUPPORTED);
	assert_int_equal(quant_quantize(4, x, out, 32), ERR_UNSUPPORTED);
	assert_int_equal(quant_quantize(TT_Q8_0, x, out, 33), ERR_INVAL);
	assert_int_equal(quant_quantize(TT_Q4_K, x, out, 128), ERR_INVAL);
	x[7] = NAN;
	assert_int_equal(quant_quantize(TT_Q8_0, x, out, 32), ERR_INVAL);
	x[7] = -INFINITY;
	assert_int_equal(quant_quantize(TT_Q6_K, x, out, QK_K), ERR_INVAL);
	assert_int_equal(quant_quantize(TT_F16, x, out, 32), 0); /* carried */
	assert_int_equal(out[14] | out[15] << 8, 0xfc00);
}

/*
 * Q8_0 of a block whose largest magnitude is 127: d = 1.0 (fp16 0x3c00),
 * so each quant is roundf(x), ties away from zero.
 */
static void
test_q8_0_bytes(void **state)
{
	static const float head[8] = { -127, 0.4f, 0.6f, -1.5f, 2.5f, 100.49f, -0.5f, 126.5f };
	static const int8_t qhead[8] = { -127, 0, 1, -2, 3, 100, -1, 127 };
	float *x = malloc(32 * sizeof(float));
	uint8_t *q = malloc(34);
	float *y = malloc(32 * sizeof(float));

	(void)state;
	for (int j = 0; j < 32; j++)
		x[j] = j < 8 ? head[j] : (float)(j - 16);
	assert_int_equal(quant_quantize(TT_Q8_0, x, q, 32), 0);
	assert_int_equal(q[0], 0x00);
	assert_int_equal(q[1], 0x3c);
	for (int j = 0; j < 32; j++)
		assert_int_equal((int8_t)q[2 + j], j < 8 ? qhead[j] : j - 16);
	quant_dequantize(TT_Q8_0, q, y, 32);
	for (int j = 0; j < 32; j++)
		assert_true(y[j] == (float)(int8_t)q[2 + j]);

	memset(x, 0, 32 * sizeof(float)); /* all zero: d = 0, quants 0 */
	assert_int_equal(quant_quantize(TT_Q8_0, x, q, 32), 0);
	for (int j = 0; j < 34; j++)
		assert_int_equal(q[j], 0);
	free(x);
	free(q);
	free(y);
}

/*
 * Q4_K of eight sub-blocks holding 0..15 twice. Each fits exactly with
 * scale 1 and min 0, so the 6-bit scales are all 63 against d =
 * fp16(1/63) = 0x2410, the mins all 0 (dmin 0), and the levels are the
 * values themselves: scales bytes ff ff ff ff 00 00 00 00 0f 0f 0f 0f,
 * each qs byte l|l<<4. Dequantized: (d*63) * l.
 */
static void
test_q4_K_bytes(void **state)
{
	static const uint8_t sc[12] = { 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0,
	    0x0f, 0x0f, 0x0f, 0x0f };
	float *x = malloc(QK_K * sizeof(float)), *y = malloc(QK_K * sizeof(float));
	uint8_t *q = malloc(144);
	float step = 0x1.04p-6f * 63; /* fp16 0x2410 is 2^-6 * (1 + 16/1024) */

	(void)state;
	for (int i = 0; i < QK_K; i++)
		x[i] = (float)(i % 16);
	assert_int_equal(quant_quantize(TT_Q4_K, x, q, QK_K), 0);
	assert_int_equal(q[0] | q[1] << 8, 0x2410);
	assert_int_equal(q[2] | q[3] << 8, 0x0000);
	assert_memory_equal(q + 4, sc, 12);
	for (int i = 0; i < 128; i++)
		assert_int_equal(q[16 + i], (i % 16) * 0x11);
	quant_dequantize(TT_Q4_K, q, y, QK_K);
	for (int i = 0; i < QK_K; i++)
		assert_true(y[i] == step * (float)(i % 16));
	free(x);
	free(y);
	free(q);
}

/*
 * Hand-made blocks of the 32-element types: Q4_0 with d = 1 and nibbles
 * j | (15-j)<<4; Q5_1 with d = 0.5, m = -1 and the fifth bit set on odd
 * elements.
 */
static void
test_dequant_small_blocks(void **state)
{
	uint8_t *q = malloc(24);
	float *y = malloc(32 * sizeof(float));

	(void)state;
	q[0] = 0x00, q[1] = 0x3c;
	for (int j = 0; j < 16; j++)
		q[2 + j] = (uint8_t)(j | (15 - j) << 4);
	quant_dequantize(TT_Q4_0, q, y, 32);
	for (int j = 0; j < 16; j++) {
		assert_true(y[j] == (float)(j - 8));
		assert_true(y[j + 16] == (float)(7 - j));
	}

	q[0] = 0x00, q[1] = 0x38; /* d = 0.5 */
	q[2] = 0x00, q[3] = 0xbc; /* m = -1 */
	q[4] = q[5] = q[6] = q[7] = 0xaa;
	for (int j = 0; j < 16; j++)
		q[8 + j] = (uint8_t)(j | j << 4);
	quant_dequantize(TT_Q5_1, q, y, 32);
	for (int j = 0; j < 32; j++)
		assert_true(y[j] == 0.5f * (float)(j % 16 + (j & 1) * 16) - 1);
	free(q);
	free(y);
}

/*
 * The bytes of each quantizer on fill_weights data, against hashes of the
 * bytes that llama.cpp's quantize_row_*_ref (F16, Q8_0, Q8_K, Q6_K, Q5_K,
 * Q4_K) and gguf-py (F16, BF16, Q8_0) give for the same floats. This is
 * what catches a quantizer that still fits well but no longer makes
 * llama.cpp's choices (a search step skipped, a tie broken otherwise).
 */
static void
test_reference_bytes(void **state)
{
	static const struct { uint32_t type; uint64_t hash; } cases[] = {
		{ TT_F16, 0x92133a3670ea2409ULL },
		{ TT_BF16, 0xa426ab81b99e89edULL },
		{ TT_Q8_0, 0x3251e906d57947c7ULL },
		{ TT_Q8_K, 0x31e88305db0f26e0ULL },
		{ TT_Q6_K, 0x40ee860b11bceb9aULL },
		{ TT_Q5_K, 0x95411572e5bcdbb7ULL },
		{ TT_Q4_K, 0x02cfcfdd8605a0a0ULL },
	};
	const int64_t n = 32 * QK_K;
	float *x = malloc((size_t)n * sizeof(float));
	uint8_t *q = malloc((size_t)n * 2);
	size_t bytes;

	(void)state;
	fill_weights(x, n, 0x1234);
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		assert_int_equal(quant_row_bytes(cases[i].type, n, &bytes), 0);
		assert_int_equal(quant_quantize(cases[i].type, x, q, n), 0);
		if (fnv1a(q, bytes) != cases[i].hash)
			fail_msg("%s: bytes differ from the reference",
			    quant_traits(cases[i].type)->name);
	}
	free(x);
	free(q);
}

/* Quantizes n values of x to type, dequantizes, returns RMS(err)/RMS(x). */
static double
round_trip_error(uint32_t type, const float *x, int64_t n)
{
	size_t bytes;
	void *q;
	float *y = malloc((size_t)n * sizeof(float));
	double se = 0, sx = 0;

	assert_int_equal(quant_row_bytes(type, n, &bytes), 0);
	q = malloc(bytes);
	assert_int_equal(quant_quantize(type, x, q, n), 0);
	quant_dequantize(type, q, y, n);
	for (int64_t i = 0; i < n; i++) {
		se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
		sx += (double)x[i] * x[i];
	}
	free(q);
	free(y);
	return sqrt(se / sx);
}

/*
 * Relative RMS error of a round trip on near-normal data, against bounds
 * some 15% above what the reference algorithms give (measured: F16
 * 2.1e-4, BF16 1.7e-3, Q8_0 5.3e-3, Q8_K 6.8e-3, Q6_K 0.0176, Q5_K 0.0359,
 * Q4_K 0.0706). A mis-packed bit or a wrong scale lands far above them;
 * finer departures from llama.cpp are test_reference_bytes' job.
 */
static void
test_round_trip(void **state)
{
	static const struct { uint32_t type; double bound; } cases[] = {
		{ TT_F32, 0 },
		{ TT_F16, 2.6e-4 },
		{ TT_BF16, 2.0e-3 },
		{ TT_Q8_0, 6.2e-3 },
		{ TT_Q8_K, 7.7e-3 },
		{ TT_Q6_K, 0.021 },
		{ TT_Q5_K, 0.041 },
		{ TT_Q4_K, 0.082 },
	};
	float *x = malloc(N_RT * sizeof(float));

	(void)state;
	fill_normal(x, N_RT, 0x5eed);
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		double e = round_trip_error(cases[i].type, x, N_RT);

		print_message("%-5s relative RMS error %.5f (bound %.5f)\n",
		    quant_traits(cases[i].type)->name, e, cases[i].bound);
		assert_true(e <= cases[i].bound);
	}
	free(x);
}

/*
 * The K-quant corner paths: all-zero blocks give zero, an all-positive
 * block (min clamped to 0) and one all-negative stay within bounds.
 */
static void
test_round_trip_corners(void **state)
{
	static const uint32_t types[] = { TT_Q8_0, TT_Q8_K, TT_Q6_K, TT_Q5_K, TT_Q4_K };
	float *x = malloc(2 * QK_K * sizeof(float)), *y = malloc(2 * QK_K * sizeof(float));
	uint8_t *q = malloc(2 * 292);
	uint64_t s = 42;

	(void)state;
	for (size_t t = 0; t < ARRAY_LEN(types); t++) {
		for (int i = 0; i < QK_K; i++) {
			x[i] = 0;
			x[QK_K + i] = (float)(0.5 + rng_unit(&s));
		}
		assert_int_equal(quant_quantize(types[t], x, q, 2 * QK_K), 0);
		quant_dequantize(types[t], q, y, 2 * QK_K);
		for (int i = 0; i < QK_K; i++)
			assert_true(y[i] == 0.0f);
		assert_true(round_trip_error(types[t], x + QK_K, QK_K) < 0.05);
		for (int i = 0; i < QK_K; i++)
			x[i] = -x[QK_K + i];
		assert_true(round_trip_error(types[t], x, QK_K) < 0.05);
	}
	free(x);
	free(y);
	free(q);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fp16_encode),
		cmocka_unit_test(test_fp16_decode),
		cmocka_unit_test(test_bf16),
		cmocka_unit_test(test_types),
		cmocka_unit_test(test_quantize_refusals),
		cmocka_unit_test(test_q8_0_bytes),
		cmocka_unit_test(test_q4_K_bytes),
		cmocka_unit_test(test_dequant_small_blocks),
		cmocka_unit_test(test_reference_bytes),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_round_trip_corners),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
