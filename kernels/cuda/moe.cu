/*
 * moe.cu: the router's choices for a step of a mixture of experts. One
 * block does all of it: each token's top experts (a warp a token), then,
 * for the grouped products, every slot's row among its expert's rows (a
 * warp an expert, walking the slots in order, so the grouping does not
 * depend on timing) and the tiles. A step's routing is small (512 tokens
 * of 8 choices in 128 experts: 4,096 slots), and one block keeps it one
 * launch, inside the step's graph, with no round trip to the host.
 */
#include "moe.cuh"

#include <limits.h>

#define ROUTE_THREADS 1024

/* (v, i) beats (bv, bi): larger, or equal with a lower index; a NaN counts as -inf. */
static __device__ __forceinline__ int
route_better(float v, int i, float bv, int bi)
{
	v = isnan(v) ? -INFINITY : v;
	return v > bv || (v == bv && i < bi);
}

/* Token t's choices and weights, by the calling warp (lane e % 32 holds expert e's logit). */
static __device__ void
route_token(const struct cuda_route &r, int t, int lane)
{
	float *lg = r.logit + (size_t)t * r.n_expert, top = 0.0f, sum = 0.0f;
	uint32_t taken = 0; /* bit i: expert lane + 32 i is chosen */

	for (int e = lane; r.bias != NULL && e < r.n_expert; e += WARP)
		lg[e] += r.bias[e];
	__syncwarp();
	for (int j = 0; j < r.n_used; j++) {
		float bv = -INFINITY;
		int bi = INT_MAX;

		for (int i = 0, e = lane; e < r.n_expert; i++, e += WARP)
			if (!(taken >> i & 1) && route_better(lg[e], e, bv, bi))
				bv = isnan(lg[e]) ? -INFINITY : lg[e], bi = e;
#pragma unroll
		for (int o = 16; o > 0; o >>= 1) {
			float v = __shfl_xor_sync(FULL_MASK, bv, o);
			int i = __shfl_xor_sync(FULL_MASK, bi, o);

			if (route_better(v, i, bv, bi))
				bv = v, bi = i;
		}
		if (bi % WARP == lane)
			taken |= 1u << (bi / WARP);
		if (j == 0)
			top = bv;
		if (lane == 0) {
			r.expert[(size_t)t * r.n_used + j] = bi;
			r.weight[(size_t)t * r.n_used + j] = expf(bv - top);
		}
		sum += expf(bv - top);
	}
	if (!r.norm) { /* the softmax over every expert's logit */
		float all = 0.0f;

		for (int e = lane; e < r.n_expert; e += WARP)
			all += expf(lg[e] - top);
		sum = warp_sum(all);
	}
	__syncwarp();
	if (lane < r.n_used)
		r.weight[(size_t)t * r.n_used + lane] /= sum;
}

/* Slots of the step whose expert is e, counted by the calling warp (in every lane). */
static __device__ int
route_count(const struct cuda_route &r, int e, int slots, int lane)
{
	int n = 0;

	for (int s0 = 0; s0 < slots; s0 += WARP)
		n += __popc(__ballot_sync(FULL_MASK, s0 + lane < slots && r.expert[s0 + lane] == e));
	return n;
}

/* Gives expert e's slots their rows from first on, in slot order (the calling warp). */
static __device__ void
route_place(const struct cuda_route &r, int e, int first, int slots, int lane)
{
	for (int s0 = 0; s0 < slots; s0 += WARP) {
		int s = s0 + lane, mine = s < slots && r.expert[s] == e;
		uint32_t m = __ballot_sync(FULL_MASK, mine);

		if (mine) {
			int row = first + __popc(m & ((1u << lane) - 1));

			r.row[s] = row;
			r.row_expert[row] = e;
			r.row_slot[row] = s;
		}
		first += __popc(m);
	}
}

__global__ void __launch_bounds__(ROUTE_THREADS)
route_kernel(struct cuda_route r)
{
	pdl_wait();
	pdl_trigger();
	__shared__ int first[MOE_MAX_EXPERTS + 1];
	int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nw = blockDim.x / WARP;
	int slots = r.n_tok * r.n_used;

	for (int t = warp; t < r.n_tok; t += nw)
		route_token(r, t, lane);
	if (r.bn == 0)
		return;
	__syncthreads(); /* the slots' experts, written above, are seen by the whole block */
	for (int e = warp; e < r.n_expert; e += nw) {
		int n = route_count(r, e, slots, lane);

		if (lane == 0)
			first[e + 1] = n;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		int nt = 0;

		first[0] = 0;
		for (int e = 0; e < r.n_expert; e++) {
			for (int row = first[e]; row < first[e] + first[e + 1]; row += r.bn, nt++) {
				r.tiles[1 + 3 * nt] = e;
				r.tiles[2 + 3 * nt] = row;
				r.tiles[3 + 3 * nt] = min(r.bn, first[e] + first[e + 1] - row);
			}
			first[e + 1] += first[e];
		}
		r.tiles[0] = nt;
	}
	__syncthreads();
	for (int e = warp; e < r.n_expert; e += nw)
		route_place(r, e, first[e], slots, lane);
}

int
cuda_moe_max_tiles(int n_rows, int n_expert, int bn)
{
	return n_rows / bn + MIN(n_expert, n_rows);
}

int
cuda_moe_route(const struct cuda_route *r, cudaStream_t st, char *err)
{
	if (r->n_expert < 1 || r->n_expert > MOE_MAX_EXPERTS || r->n_used < 1 || r->n_used > MIN(MOE_MAX_USED, r->n_expert))
		return err_set(err, ERR_UNSUPPORTED, "%d experts, %d a token: the GPU routes up to %d of %d", r->n_expert,
		    r->n_used, MOE_MAX_USED, MOE_MAX_EXPERTS);
	CK(cuda_launch(route_kernel, dim3(1), dim3(ROUTE_THREADS), 0, st, *r));
	return 0;
}

int
cuda_moe_grouped(const struct cuda_mm *m, const struct cuda_moe *e, int n_tok)
{
	return n_tok > m->mmv_max && cuda_qgemm_type(&e->gu) && cuda_qgemm_type(&e->down);
}

int
cuda_moe_ffn(struct cuda_mm *m, const struct cuda_moe *e, struct cuda_moe_scratch *s, const float *h, int n_embd,
    int n_tok, int h_q8, float *out, char *err)
{
	struct cuda_route r = s->route;
	int F = (int)e->down.k, k = e->n_used, R = n_tok * k, grouped = cuda_moe_grouped(m, e, n_tok), max_tiles = 0, rc;
	struct cuda_h16 h16 = { NULL, NULL }, xh = { m->xh, m->xscale };
	struct cuda_q8 q8 = { NULL, NULL };
	struct mm_out lg = { { r.logit }, { e->n_expert }, { 0, e->n_expert }, 1 };
	struct mm_out gu = { { s->gate, s->up }, { F, F }, { 0, F, 2 * F }, 2 };
	struct mm_out dn = { { s->down }, { n_embd }, { 0, n_embd }, 1 };
	struct mm_slots tok = { NULL, 0, 1 }, sl_gu = { r.expert, e->gu_stride, k }, sl_dn = { r.expert, e->down_stride, 1 };

	r.bias = e->router_b, r.n_tok = n_tok, r.n_expert = e->n_expert, r.n_used = k, r.norm = e->norm;
	r.bn = grouped ? cuda_qgemm_grouped_bn(R, MIN(e->n_expert, R)) : 0;
	/* the router on the float rows whatever the token count: fp16 inputs would move near ties */
	if ((rc = cuda_matmul_slots(m, &e->router, h, n_embd, n_tok, n_tok, &tok, &lg, h_q8, err)) != 0 ||
	    (rc = cuda_moe_route(&r, m->stream, err)) != 0)
		return rc;
	if (grouped) {
		max_tiles = cuda_moe_max_tiles(R, e->n_expert, r.bn);
		if ((rc = cuda_to_f16_rows(h, n_embd, n_embd, r.row_slot, k, R, xh, m->stream, err)) != 0 ||
		    (rc = cuda_qgemm_grouped(m, &e->gu, e->gu_stride, R, r.tiles, max_tiles, r.bn, &gu, err)) != 0)
			return rc;
		h16 = xh;
	} else {
		if ((rc = cuda_matmul_slots(m, &e->gu, h, n_embd, n_tok, R, &sl_gu, &gu, h_q8, err)) != 0)
			return rc;
		if (cuda_matmul_int8(m, &e->down))
			q8.q = m->xq, q8.d = m->xd;
	}
	if ((rc = cuda_moe_glu(s->gate, s->up, R, F, grouped ? r.row_expert : r.expert, e->gate_b, e->up_b, e->act, h16,
	    q8, m->stream, err)) != 0)
		return rc;
	rc = grouped ? cuda_qgemm_grouped(m, &e->down, e->down_stride, R, r.tiles, max_tiles, r.bn, &dn, err) :
	    cuda_matmul_slots(m, &e->down, s->gate, F, R, R, &sl_dn, &dn, q8.q != NULL, err);
	if (rc != 0)
		return rc;
	return cuda_moe_combine(out, s->down, n_tok, n_embd, k, r.weight, grouped ? r.row : NULL, r.expert, e->down_b,
	    m->stream, err);
}
