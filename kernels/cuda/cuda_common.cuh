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
 * Whether a CUDA runtime call, by its source text, is to fail under
 * RESIDENT_CUDA_FAULT (fault.h): cudaMemcpy* are copies, cudaMalloc*
 * allocations, cudaGraphLaunch a launch. Cheap when off.
 */
int cuda_fault(const char *call);

/* Runs a CUDA runtime call; on failure returns from the calling function. */
#define CK(call) \
	do { \
		if (cuda_fault(#call)) \
			return cuda_fail(err, __FILE__, __LINE__, #call, fault_message(FAULT_CUDA)); \
		cudaError_t e_ = (call); \
		if (e_ != cudaSuccess) \
			return cuda_fail(err, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
	} while (0)

/* Checks the launch just made (bad configuration, missing kernel image). */
#define CK_LAUNCH(name) \
	do { \
		cudaError_t e_ = cudaGetLastError(); \
		if (e_ == cudaSuccess && fault_hit(FAULT_CUDA, FAULT_LAUNCH)) \
			return cuda_fail(err, __FILE__, __LINE__, name, fault_message(FAULT_CUDA)); \
		if (e_ != cudaSuccess) \
			return cuda_fail(err, __FILE__, __LINE__, name, cudaGetErrorString(e_)); \
	} while (0)

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
