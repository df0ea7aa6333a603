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

/*
 * Launches kernel on st, early when cuda_pdl allows it (see pdl_wait), in
 * clusters of cluster_x blocks (sm_90; 1: none).
 */
template <typename... P, typename... A>
static cudaError_t
cuda_launch_ex(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, unsigned cluster_x, cudaStream_t st,
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
	if (cluster_x > 1) {
		at[n].id = cudaLaunchAttributeClusterDimension;
		at[n].val.clusterDim.x = cluster_x, at[n].val.clusterDim.y = 1, at[n++].val.clusterDim.z = 1;
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
	return cuda_launch_ex(kernel, grid, block, smem, 1u, st, static_cast<A &&>(args)...);
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
