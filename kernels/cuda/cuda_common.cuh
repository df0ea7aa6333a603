/*
 * cuda_common.cuh: what every file of the CUDA backend shares: the error
 * macros (a failed CUDA or cuBLAS call becomes a negative return code with
 * file, line and the library's message, never an abort), warp and block
 * reductions, and the C headers of the rest of the program.
 */
#ifndef RESIDENT_CUDA_COMMON_CUH
#define RESIDENT_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "config.h"
#include "fault.h"
#include "kernels.h"
#include "model.h"
#include "quant.h"
#include "util.h"
}

#define WARP 32
#define FULL_MASK 0xffffffffu

/* Formats "file:line: what: message" into err; returns ERR_DEVICE. */
int cuda_fail(char *err, const char *file, int line, const char *what, const char *msg);

/*
 * The RESIDENT_CUDA_FAULT kind (fault.h) of a CUDA runtime call, by its
 * source text: cudaMemcpy* are copies, cudaMalloc* allocations,
 * cudaGraphLaunch and the project's *_launch helpers (all kernels go
 * through cuda_launch) launches; -1 for the others. CK works it out once
 * per call site.
 */
int cuda_fault_kind(const char *call);

/* Runs a CUDA runtime call; on failure returns from the calling function. */
#define CK(call) \
	do { \
		static const int fault_kind_ = cuda_fault_kind(#call); \
		if (fault_kind_ >= 0 && fault_hit(FAULT_CUDA, (enum fault_kind)fault_kind_)) \
			return cuda_fail(err, __FILE__, __LINE__, #call, fault_message(FAULT_CUDA)); \
		cudaError_t e_ = (call); \
		if (e_ != cudaSuccess) \
			return cuda_fail(err, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
	} while (0)

/*
 * Programmatic dependent launch (sm_90 and newer): with cuda_pdl set (at
 * load, from the device and RESIDENT_CUDA_PDL), each kernel of a step is
 * launched while the one before it on the stream still runs; it starts
 * with pdl_wait(), which holds it until that kernel has finished and its
 * writes are visible, then pdl_trigger() lets the next one launch. What a
 * kernel does before pdl_wait() may only read what no kernel of the step
 * writes: the weights, the step's staged inputs (copied before its first
 * kernel) and the KV pool's positions of earlier steps; or what a kernel
 * two or more launches before it wrote, since every kernel calls
 * pdl_trigger() only after its own pdl_wait() (mm_slots.early), read past
 * L1 (__ldcg). Every block of a kernel passes pdl_wait() before it exits:
 * the kernel after it waits for it alone, not for the ones before. The
 * launch latency between kernels, a few microseconds each on a step of
 * hundreds, is hidden.
 */
extern int cuda_pdl;

static __device__ __forceinline__ void
pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void
pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* This block's rank in its cluster. */
static __device__ __forceinline__ unsigned
cluster_rank(void)
{
	unsigned r;

	asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
	return r;
}

/* A barrier of the whole cluster; shared-memory writes before it are seen by every block after it. */
static __device__ __forceinline__ void
cluster_sync(void)
{
	asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* The address of this block's shared p in the shared memory of the cluster's block rank. */
static __device__ __forceinline__ unsigned
cluster_map(const void *p, unsigned rank)
{
	unsigned r;

	asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"((unsigned)__cvta_generic_to_shared(p)),
	    "r"(rank));
	return r;
}

static __device__ __forceinline__ float
cluster_ld(const float *p, unsigned rank)
{
	float v;

	asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_map(p, rank)) : "memory");
	return v;
}

static __device__ __forceinline__ float4
cluster_ld4(const float4 *p, unsigned rank)
{
	float4 v;

	asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
	    : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(cluster_map(p, rank)) : "memory");
	return v;
}
#endif

/*
 * Launches kernel on st, early when cuda_pdl allows it (see pdl_wait), in
 * clusters of cluster blocks (sm_90; 1 x 1 x 1: none).
 */
template <typename... P, typename... A>
static cudaError_t
cuda_launch_ex(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, dim3 cluster, cudaStream_t st,
    A &&...args)
{
	cudaLaunchConfig_t cfg = {};
	cudaLaunchAttribute at[2];
	unsigned n = 0;

	cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = st;
	if (cuda_pdl) {
		at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		at[n++].val.programmaticStreamSerializationAllowed = 1;
	}
	if (cluster.x * cluster.y * cluster.z > 1) {
		at[n].id = cudaLaunchAttributeClusterDimension;
		at[n].val.clusterDim.x = cluster.x, at[n].val.clusterDim.y = cluster.y, at[n++].val.clusterDim.z = cluster.z;
	}
	cfg.attrs = at;
	cfg.numAttrs = n;
	return cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}

/* cuda_launch_ex without clusters. */
template <typename... P, typename... A>
static cudaError_t
cuda_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A &&...args)
{
	return cuda_launch_ex(kernel, grid, block, smem, dim3(1), st, static_cast<A &&>(args)...);
}

/* Sum over the 32 lanes of a warp; every lane gets it. */
static __device__ __forceinline__ float
warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

/* Max over the 32 lanes of a warp; every lane gets it. */
static __device__ __forceinline__ float
warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
}

/*
 * Sum over a block of blockDim.x threads (a multiple of 32, at most 1024);
 * every thread gets it. scratch holds 32 floats; the call may be repeated
 * with the same scratch.
 */
static __device__ __forceinline__ float
block_sum(float v, float *scratch)
{
	int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;

	v = warp_sum(v);
	__syncthreads(); /* a previous call may still be reading scratch */
	if (lane == 0)
		scratch[w] = v;
	__syncthreads();
	v = lane < nw ? scratch[lane] : 0.0f;
	return warp_sum(v);
}

/* Max over a block, as block_sum. */
static __device__ __forceinline__ float
block_max(float v, float *scratch)
{
	int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;

	v = warp_max(v);
	__syncthreads();
	if (lane == 0)
		scratch[w] = v;
	__syncthreads();
	v = lane < nw ? scratch[lane] : -INFINITY;
	return warp_max(v);
}

#endif
