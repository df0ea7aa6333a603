/*
 * tc.cuh: the instructions the tensor-core kernels share (sm_80 and newer):
 * asynchronous copies from global to shared memory, ldmatrix, and the fp16
 * mma.sync with float accumulation. Device functions only.
 *
 * Fragments of mma.sync.m16n8k16 (g = lane / 4, c = 2 * (lane % 4)):
 * A (16 x 16, row-major) a[0] = A[g][c..c+1], a[1] = A[g+8][c..c+1],
 * a[2] = A[g][c+8..c+9], a[3] = A[g+8][c+8..c+9]; B (16 x 8) b[0] =
 * B[c..c+1][g], b[1] = B[c+8..c+9][g]; C (16 x 8) d[0..1] = C[g][c..c+1],
 * d[2..3] = C[g+8][c..c+1].
 */
#ifndef RESIDENT_CUDA_TC_CUH
#define RESIDENT_CUDA_TC_CUH

#include "cuda_common.cuh"

#include <string.h>

/*
 * A shared-memory address as the copies take it, kept in a register: the
 * conversion from a generic pointer reads the block's cluster rank
 * (S2R), and ptxas redid it at every copy of qgemm's loop, each a
 * variable-latency wait (ncu: a quarter of that loop's stall samples).
 */
static __device__ __forceinline__ uint32_t
smem_addr(const void *smem)
{
	uint32_t sa;

	asm volatile("mov.u32 %0, %1;" : "=r"(sa) : "r"((uint32_t)__cvta_generic_to_shared(smem)));
	return sa;
}

/* 16 bytes from global memory to shared address sa without passing through registers. */
static __device__ __forceinline__ void
cp_async16_at(uint32_t sa, const void *gmem)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem));
}

/*
 * N (4, 8 or 16) bytes to shared address sa, of which only the first n
 * (0 or N) are read from gmem; the rest are zeros. 16 bytes skip L1.
 */
template <int N>
static __device__ __forceinline__ void
cp_async_zfill_at(uint32_t sa, const void *gmem, int n)
{
	static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
	if constexpr (N == 16)
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(n));
	else
		asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(sa), "l"(gmem), "n"(N), "r"(n));
}

/* 16 bytes from global to shared memory without passing through registers. */
static __device__ __forceinline__ void
cp_async16(void *smem, const void *gmem)
{
	cp_async16_at((uint32_t)__cvta_generic_to_shared(smem), gmem);
}

/* 4 bytes likewise, through L1 (the 16-byte form alone may skip it). */
static __device__ __forceinline__ void
cp_async4(void *smem, const void *gmem)
{
	unsigned sa = (unsigned)__cvta_generic_to_shared(smem);

	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(gmem));
}

static __device__ __forceinline__ void
cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::);
}

/* Waits until at most N groups of this thread's copies are still in flight. */
template <int N>
static __device__ __forceinline__ void
cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Four 8 x 8 matrices of 16-bit elements; lane l gives the address of row l % 8 of matrix l / 8. */
static __device__ __forceinline__ void
ldmatrix_x4(uint32_t r[4], const void *smem)
{
	unsigned sa = (unsigned)__cvta_generic_to_shared(smem);

	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sa));
}

/* As ldmatrix_x4, each matrix transposed (for an operand stored the other way round). */
static __device__ __forceinline__ void
ldmatrix_x4_trans(uint32_t r[4], const void *smem)
{
	unsigned sa = (unsigned)__cvta_generic_to_shared(smem);

	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	    : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sa));
}

/*
 * An 8 x 8 matrix of 16-bit elements held as a fragment (lane l: row l / 4,
 * columns 2 (l % 4) and + 1), transposed in registers.
 */
static __device__ __forceinline__ uint32_t
movmatrix_trans(uint32_t x)
{
	uint32_t y;

	asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
	return y;
}

/* d += a b: one m16n8k16 product of fp16 fragments, accumulated in float. */
static __device__ __forceinline__ void
mma16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
	    "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Two floats as one register of two fp16 (the first in the low half). */
static __device__ __forceinline__ uint32_t
pack_half2(float lo, float hi)
{
	__half2 h = __floats2half2_rn(lo, hi);

	return *(const uint32_t *)&h;
}

/* ---- fp16 arithmetic on quants ---- */

static __device__ __forceinline__ __half2
as_h2(uint32_t u)
{
	__half2 h;

	memcpy(&h, &u, sizeof h);
	return h;
}

static __device__ __forceinline__ uint32_t
as_u32(__half2 h)
{
	uint32_t u;

	memcpy(&u, &h, sizeof u);
	return u;
}

/* fp16 pairs 0x6400 | n: the values 1024 + n, exact for n < 1024. */
#define H_1024 0x64006400u
#define H_1032 0x64086408u /* 1024 + 8: Q4_0's offset */
#define H_1040 0x64106410u /* 1024 + 16: Q5_0's */
#define H_1056 0x64206420u /* 1024 + 32: Q6_K's */
#define H_1152 0x64806480u /* 1024 + 128: Q8_0's bytes, xor 0x80 */

/*
 * The A fragments take the k slots of a k16 step in the order of the
 * quants in memory: lane t of a row group holds elements 4t .. 4t+3 of the
 * 16 (slots 2t, 2t+1 and 2t+8, 2t+9), and its B fragment the tokens'
 * values of the same elements, one 8-byte load. So one 32-bit word of a
 * block's quant bytes gives a lane both A registers of a row.
 *
 * h2_pairs: x holds four unsigned byte values, those of the lane's four
 * elements; each pair becomes the fp16 pair 1024 + byte, less off, times
 * scale, plus add (the K types' - dmin m; 0 for the others).
 */
static __device__ __forceinline__ void
h2_pairs(uint32_t x, uint32_t off, __half2 scale, __half2 add, uint32_t a[2])
{
	a[0] = as_u32(__hfma2(__hsub2(as_h2(__byte_perm(x, 0x64646464u, 0x4140)), as_h2(off)), scale, add));
	a[1] = as_u32(__hfma2(__hsub2(as_h2(__byte_perm(x, 0x64646464u, 0x4342)), as_h2(off)), scale, add));
}

/*
 * The two bytes of x that sel places in the low bytes of the halves (a
 * byte_perm selector over x and 0x64 bytes), each (1024 + byte - off) *
 * mul, broadcast to both halves of lo and hi: a block's scales, decoded
 * as h2_pairs decodes quants.
 */
static __device__ __forceinline__ void
h2_bytes2(uint32_t x, uint32_t sel, uint32_t off, __half2 mul, __half2 &lo, __half2 &hi)
{
	__half2 v = __hmul2(mul, __hsub2(as_h2(__byte_perm(x, 0x64646464u, sel)), as_h2(off)));

	lo = __low2half2(v), hi = __high2half2(v);
}

#endif
