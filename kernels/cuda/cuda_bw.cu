/*
 * cuda_bw.cu: the device's measured read bandwidth, the yardstick that
 * resident-bench holds decode steps against. A read-only reduction streams
 * a buffer of a few GiB (far beyond the L2) once per run; the best of
 * several runs, timed with events, is what the memory can deliver to a
 * kernel that does nothing but read.
 */
#include "cuda_common.cuh"

#include <stdio.h>

#define BW_RUNS 10
#define BW_THREADS 512
#define BW_MAX_BYTES ((size_t)4 << 30)

/*
 * Sums the buffer's words in 16-byte loads. The sum goes to out so that the
 * compiler cannot drop the loads; its value does not matter.
 */
static __global__ void
bw_read(const uint4 *__restrict__ p, size_t n, unsigned *out)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
	unsigned acc = 0;

#pragma unroll 4
	for (; i < n; i += stride) {
		uint4 v = __ldcs(p + i); /* streaming: the buffer is read once per run */

		acc += v.x ^ v.y ^ v.z ^ v.w;
	}
	for (int o = 16; o > 0; o >>= 1)
		acc += __shfl_xor_sync(FULL_MASK, acc, o);
	if (threadIdx.x % WARP == 0 && acc == 0x9e3779b9u) /* almost never: the store only has to be possible */
		atomicAdd(out, acc);
}

/* Times BW_RUNS reads of the buffer after a warm-up (clocks, TLB); *best_s gets the fastest. */
static int
bw_time(const uint4 *buf, size_t n, int blocks, unsigned *out, double *best_s, char *err)
{
	cudaEvent_t t0, t1;
	cudaError_t e = cudaSuccess;
	float ms;
	int r;

	CK(cudaEventCreate(&t0));
	if ((e = cudaEventCreate(&t1)) != cudaSuccess) {
		cudaEventDestroy(t0);
		return cuda_fail(err, __FILE__, __LINE__, "cudaEventCreate", cudaGetErrorString(e));
	}
	*best_s = 1e30;
	for (r = -1; r < BW_RUNS && e == cudaSuccess; r++) {
		cudaEventRecord(t0);
		bw_read<<<blocks, BW_THREADS>>>(buf, n, out);
		cudaEventRecord(t1);
		if ((e = cudaGetLastError()) == cudaSuccess && (e = cudaEventSynchronize(t1)) == cudaSuccess &&
		    (e = cudaEventElapsedTime(&ms, t0, t1)) == cudaSuccess && r >= 0)
			*best_s = fmin(*best_s, ms / 1e3);
	}
	cudaEventDestroy(t0);
	cudaEventDestroy(t1);
	return e == cudaSuccess ? 0 : cuda_fail(err, __FILE__, __LINE__, "bw_read", cudaGetErrorString(e));
}

extern "C" int
cuda_bw_measure(int device, double *gb_s, char *name, size_t name_len, char *err)
{
	struct cudaDeviceProp prop;
	size_t free_b, total_b, bytes, n;
	uint4 *buf = NULL;
	unsigned *out = NULL;
	double best_s = 0;
	int rc;

	CK(cudaSetDevice(device));
	CK(cudaGetDeviceProperties(&prop, device));
	snprintf(name, name_len, "%s", prop.name);
	CK(cudaMemGetInfo(&free_b, &total_b));
	/* a few GiB, but leave room for whatever else runs on the device */
	bytes = MIN(BW_MAX_BYTES, free_b / 2) & ~(size_t)((1 << 20) - 1);
	if (bytes == 0)
		return err_set(err, ERR_NOMEM, "bandwidth test: no free device memory");
	n = bytes / sizeof(uint4);
	CK(cudaMalloc((void **)&buf, bytes));
	if (cudaMalloc((void **)&out, sizeof *out) != cudaSuccess) {
		cudaFree(buf);
		return cuda_fail(err, __FILE__, __LINE__, "cudaMalloc", cudaGetErrorString(cudaGetLastError()));
	}
	if (cudaMemset(buf, 1, bytes) != cudaSuccess || cudaMemset(out, 0, sizeof *out) != cudaSuccess)
		rc = cuda_fail(err, __FILE__, __LINE__, "cudaMemset", cudaGetErrorString(cudaGetLastError()));
	else
		rc = bw_time(buf, n, prop.multiProcessorCount * 4, out, &best_s, err);
	cudaFree(buf);
	cudaFree(out);
	if (rc == 0)
		*gb_s = (double)bytes / best_s / 1e9;
	return rc;
}
