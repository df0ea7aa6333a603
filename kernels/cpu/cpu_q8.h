/*
 * cpu_q8.h: integer dot products of quantized weight rows with activations
 * quantized to 8 bits: the fast mode of the CPU backend's products.
 */
#ifndef RESIDENT_CPU_Q8_H
#define RESIDENT_CPU_Q8_H

#include <stddef.h>
#include <stdint.h>

/*
 * y[t * ldy + r] = the dot of weight row r (nb blocks of its stored type,
 * rows rb bytes apart) with token t's activations (nb blocks of 32 or QK_K
 * elements of cpu_q8_act_type, rows ab bytes apart), for r < nr, t < n_tok.
 * Each result is the same whatever nr and n_tok.
 */
typedef void (*cpu_q8_mm_fn)(const uint8_t *w, size_t rb, int64_t nr, const uint8_t *a, size_t ab,
    int n_tok, int64_t nb, float *y, int64_t ldy);

/* The 8-bit activations a weight type meets. */
enum cpu_q8_act {
	Q8_ACT_NONE = -1, /* none: the type takes the float path */
	Q8_ACT_32,        /* blocks of 32, struct q8_act32: for Q4_0, Q5_0, Q8_0 */
	Q8_ACT_K,         /* Q8_K blocks of QK_K (quant.c's): for Q4_K, Q5_K, Q6_K */
};

/* 32 activations, x[i] ~ d * qs[i]: Q8_0 with a float scale. */
struct q8_act32 {
	float d;
	int8_t qs[32];
};

/* The enum cpu_q8_act of a weight type. */
int cpu_q8_act_type(uint32_t wtype);

/* Bytes of n activations (whole blocks) of an act type. */
size_t cpu_q8_act_bytes(int act, int64_t n);

/*
 * Quantizes n floats (whole blocks) to an act type; levels round to
 * nearest, ties to even. 0, or ERR_INVAL if a value is NaN or infinite.
 */
int cpu_q8_quantize(int act, const float *x, int64_t n, void *dst);

/* nb q8_act32 blocks (a q8_0 KV cache's row) as floats, d * qs[i], into y. */
void cpu_q8_dequant32(const struct q8_act32 *x, int64_t nb, float *y);

/* The kernel for a weight type, AVX2 or portable as cpu_q8_init chose; or NULL. */
cpu_q8_mm_fn cpu_q8_mm(uint32_t wtype);

/* Chooses the AVX2 kernels (avx2 != 0, the processor has AVX2, FMA and F16C) or portable C. */
void cpu_q8_init(int avx2);

#endif
