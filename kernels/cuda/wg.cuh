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

#include <type_traits>

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

/*
 * Holds the registers of an operand of the asynchronous products (the
 * accumulators, floats; A's fragments, words) here: the compiler neither
 * moves their accesses across this point nor reuses them before it, since
 * wgmma reads them after it is issued.
 */
template <typename T, int N>
static __device__ __forceinline__ void
wg_hold(T (&r)[N][4])
{
#pragma unroll
	for (int j = 0; j < N; j++)
#pragma unroll
		for (int i = 0; i < 4; i++)
			if constexpr (std::is_same<T, float>::value)
				asm volatile("" : "+f"(r[j][i])::"memory");
			else
				asm volatile("" : "+r"(r[j][i])::"memory");
}

/* The accumulator operands of n8 tiles o to o + 7, and the placeholders of 32 and 64 of them. */
#define WG_D4(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_D32(d, o) \
	WG_D4(d, o), WG_D4(d, o + 1), WG_D4(d, o + 2), WG_D4(d, o + 3), WG_D4(d, o + 4), WG_D4(d, o + 5), \
	    WG_D4(d, o + 6), WG_D4(d, o + 7)
#define WG_P32 \
	"%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
	"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_P64 \
	WG_P32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
	"%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_P128 \
	WG_P64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
	"%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
	"%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
	"%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

/*
 * wgmma.m64nNk16 (N a string): d (64 x N, the warpgroup's C layout: the
 * operands after the colon, placeholders DP) += a (64 x 16 from registers,
 * placeholders in AD with desc's) b (16 x N at desc); SC the placeholder
 * of the constant 1 that turns scale-d on.
 */
#define WG_MMA(N, DP, AD, SC, a, desc, ...) \
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SC ", 0;\n" \
	    "wgmma.mma_async.sync.aligned.m64n" N "k16.f32.f16.f16 {" DP "}, " AD ", p, 1, 1, 0;\n}\n" \
	    : __VA_ARGS__ : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1))

/* d += a b: the m64nNk16 product for N = 8 NT. */
template <int NT>
static __device__ __forceinline__ void
wg_mma(float (&d)[NT][4], const uint32_t a[4], uint64_t desc)
{
	static_assert(NT == 8 || NT == 16 || NT == 32, "wgmma shapes of 64, 128 and 256 columns");
	if constexpr (NT == 8)
		WG_MMA("64", WG_P32, "{%32, %33, %34, %35}, %36", "%37", a, desc, WG_D32(d, 0));
	else if constexpr (NT == 16)
		WG_MMA("128", WG_P64, "{%64, %65, %66, %67}, %68", "%69", a, desc, WG_D32(d, 0), WG_D32(d, 8));
	else
		WG_MMA("256", WG_P128, "{%128, %129, %130, %131}, %132", "%133", a, desc, WG_D32(d, 0), WG_D32(d, 8),
		    WG_D32(d, 16), WG_D32(d, 24));
}

/*
 * A warpgroup's registers a thread from here on (a multiple of 8, 24 to
 * 256): the producers give theirs back so that the consumers can hold
 * wider accumulators than the launch's even share allows.
 */
template <int N>
static __device__ __forceinline__ void
wg_regs_dec(void)
{
	asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N>
static __device__ __forceinline__ void
wg_regs_inc(void)
{
	asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

#endif
