/*
 * route.cuh: one token's choice of experts, by one warp, for every kernel
 * that routes (moe.cu's routing of a step, and the expert slots of
 * matmul.cu, which route their own token so that a step of a few tokens
 * needs no launch between the router's product and the experts' rows).
 * Device code only.
 */
#ifndef RESIDENT_CUDA_ROUTE_CUH
#define RESIDENT_CUDA_ROUTE_CUH

#include "cuda_common.cuh"

#include <limits.h>

/* Most experts a layer may have here (a warp holds a token's logits in registers, 32 a lane). */
#define MOE_MAX_EXPERTS 1024
/* Most experts a token may use (a lane each). */
#define MOE_MAX_USED 32

/* (v, i) beats (bv, bi): larger, or equal with a lower index; a NaN counts as -inf. */
static __device__ __forceinline__ int
route_better(float v, int i, float bv, int bi)
{
	return v > bv || (v == bv && i < bi);
}

/* An unsigned integer in the order of the floats (not NaN; -0 as +0), and back. */
static __device__ __forceinline__ unsigned
route_key(float v)
{
	unsigned u = __float_as_uint(v + 0.0f);

	return u & 0x80000000u ? ~u : u | 0x80000000u;
}

static __device__ __forceinline__ float
route_unkey(unsigned k)
{
	return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

/*
 * route_token with NL logits a lane: lane l holds those of experts l, l +
 * 32, ... in registers, each read once (with its bias), and round j takes
 * the best not yet taken, so every lane knows each choice; lane j keeps
 * the j-th. A round is two warp reductions (sm_80): the largest value, as
 * an integer of the same order, then the lowest index among the lanes
 * that hold it; a butterfly of (value, index) pairs took ten shuffles a
 * round.
 */
template <int NL>
static __device__ __forceinline__ void
route_token_n(const float *lg, const float *bias, int n_expert, int n_used, int norm, int32_t *expert,
    float *weight)
{
	int lane = threadIdx.x % WARP, my_e = 0;
	float v[NL], top = 0.0f, sum = 0.0f, my_w = 0.0f;
	uint32_t taken = 0; /* bit i: expert lane + 32 i is chosen */

#pragma unroll
	for (int i = 0; i < NL; i++) {
		int e = lane + WARP * i;

		v[i] = -INFINITY;
		if (e < n_expert) {
			float x = lg[e] + (bias != NULL ? bias[e] : 0.0f);

			v[i] = isnan(x) ? -INFINITY : x;
		}
	}
	for (int j = 0; j < n_used; j++) {
		float bv = -INFINITY;
		int bi = INT_MAX;

#pragma unroll
		for (int i = 0; i < NL; i++)
			if (!(taken >> i & 1) && lane + WARP * i < n_expert && route_better(v[i], lane + WARP * i, bv, bi))
				bv = v[i], bi = lane + WARP * i;
		unsigned key = route_key(bv), top_key = __reduce_max_sync(FULL_MASK, key);

		bi = __reduce_min_sync(FULL_MASK, key == top_key ? bi : INT_MAX);
		bv = route_unkey(top_key);
		if (bi % WARP == lane)
			taken |= 1u << (bi / WARP);
		if (j == 0)
			top = bv;
		if (j == lane)
			my_e = bi, my_w = expf(bv - top);
		sum += expf(bv - top);
	}
	if (!norm) { /* the softmax over every expert's logit */
		float all = 0.0f;

#pragma unroll
		for (int i = 0; i < NL; i++)
			if (lane + WARP * i < n_expert)
				all += expf(v[i] - top);
		sum = warp_sum(all);
	}
	if (lane < n_used)
		expert[lane] = my_e, weight[lane] = my_w / sum;
}

/*
 * A token's n_used experts, those of its largest logits lg[e] + bias[e]
 * (bias NULL: none; the lowest index first among equals, as the CPU
 * backend), into expert[0..n_used), their weights into weight[]: a softmax
 * over the chosen logits (norm) or over all of them. Called by a whole
 * warp; lg and bias are only read.
 */
static __device__ __forceinline__ void
route_token(const float *lg, const float *bias, int n_expert, int n_used, int norm, int32_t *expert, float *weight)
{
	if (n_expert <= 4 * WARP)
		route_token_n<4>(lg, bias, n_expert, n_used, norm, expert, weight);
	else
		route_token_n<MOE_MAX_EXPERTS / WARP>(lg, bias, n_expert, n_used, norm, expert, weight);
}

#endif
