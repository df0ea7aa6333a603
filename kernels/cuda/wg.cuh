/*
 * wg.cuh: the sm_90a instructions of the warp-specialized kernels: mbarriers,
 * the copy engine's tiled copies (cp.async.bulk.tensor, completing on an
 * mbarrier), and wgmma with A from registers and B from shared memory in
 * the 128-byte swizzled layout the copy engine writes. Device functions
 * only; call them from code built for sm_90a alone (WG_ARCH).
 *
 * wgmma.m64nNk16's fragments, for warp w (0-3) of the warpgroup, are
 * mma.sync.m16n8k16's (tc.cuh) for rows 16 w .. 16 w + 15: A's four
 * registers those of its m16 tile, C's four floats of n8 tile j those of
 * mma's C for columns 8 j to 8 j + 7.
 */
#ifndef RESIDENT_CUDA_WG_CUH
#define RESIDENT_CUDA_WG_CUH

#include "cuda_common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ARCH 1
#else
#define WG_ARCH 0
#endif

static __device__ __forceinline__ void
mbar_init(uint32_t bar, int count)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/* Makes initialized mbarriers visible to the copy engine; a block barrier follows. */
static __device__ __forceinline__ void
mbar_init_fence(void)
{
	asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}

/* The producer's arrival, announcing `bytes` that copies will complete. */
static __device__ __forceinline__ void
mbar_expect(uint32_t bar, uint32_t bytes)
{
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

static __device__ __forceinline__ void
mbar_arrive(uint32_t bar)
{
	asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* Waits for the phase of parity `parity` to complete (a fresh barrier's phase before 0 counts as complete). */
static __device__ __forceinline__ void
mbar_wait(uint32_t bar, uint32_t parity)
{
	asm volatile("{\n.reg .pred p;\nWG_WAIT_%=:\n"
	    "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
	    "@!p bra WG_WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

/* The box of map at (c0, c1) into shared address dst, completing on bar. */
static __device__ __forceinline__ void
tma_2d(uint32_t dst, const void *map, int c0, int c1, uint32_t bar)
{
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
	    " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

/*
 * The descriptor of a K-major operand tile at shared address sa (1024-byte
 * aligned, plus 32 bytes a k16 step): rows of 64 fp16, eight rows a
 * 1024-byte atom, 128-byte swizzle.
 */
static __device__ __forceinline__ uint64_t
wg_desc_sw128(uint32_t sa)
{
	return (uint64_t)((sa & 0x3ffffu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

static __device__ __forceinline__ void
wg_fence(void)
{
	asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

static __device__ __forceinline__ void
wg_commit(void)
{
	asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void
wg_wait(void)
{
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Keeps the compiler from moving accesses of the accumulators across the asynchronous products. */
template <int NT>
static __device__ __forceinline__ void
wg_hold(float (&d)[NT][4])
{
#pragma unroll
	for (int j = 0; j < NT; j++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			asm volatile("" : "+f"(d[j][i])::"memory");
}

/* d (64 x 64, the warpgroup's C layout) += a (64 x 16 from registers) b (16 x 64 at desc). */
static __device__ __forceinline__ void
wg_mma_n64(float (&d)[8][4], const uint32_t a[4], uint64_t desc)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
	    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
	    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
	    "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
	    : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
	      "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
	      "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
	      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
	      "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
	      "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
	      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
	      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

/* d (64 x 128, the warpgroup's C layout) += a (64 x 16 from registers) b (16 x 128 at desc). */
static __device__ __forceinline__ void
wg_mma_n128(float (&d)[16][4], const uint32_t a[4], uint64_t desc)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
	    "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
	    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
	    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
	    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
	    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
	    "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
	    : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
	      "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
	      "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
	      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
	      "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
	      "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
	      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
	      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
	      "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
	      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
	      "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
	      "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
	      "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
	      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
	      "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
	      "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

/*
 * Keeps A fragments (KK k16 steps' registers) alive until here, their
 * registers not reused: wgmma reads them after it is issued.
 */
template <int KK>
static __device__ __forceinline__ void
wg_hold_a(uint32_t (&fa)[KK][4])
{
#pragma unroll
	for (int kk = 0; kk < KK; kk++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			asm volatile("" : "+r"(fa[kk][i])::"memory");
}

/* The m64nNk16 product for N = 8 NT. */
template <int NT>
static __device__ __forceinline__ void
wg_mma(float (&d)[NT][4], const uint32_t a[4], uint64_t desc)
{
	static_assert(NT == 8 || NT == 16, "wgmma shapes of 64 and 128 columns");
	if constexpr (NT == 8)
		wg_mma_n64(d, a, desc);
	else
		wg_mma_n128(d, a, desc);
}

#endif
