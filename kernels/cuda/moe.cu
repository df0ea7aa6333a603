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
#include "dequant.cuh"

#include <limits.h>

#define ROUTE_THREADS 1024
/* Up to this many tokens the router's product and the routing are one launch (route_fused_kernel). */
#define FUSED_TOKENS 8
/* Threads of a block of the fused router (an expert's row). */
#define FUSED_THREADS 256

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

/* The whole step's routing, by the calling block (any number of warps). */
static __device__ void
route_all(const struct cuda_route &r)
{
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

__global__ void __launch_bounds__(ROUTE_THREADS)
route_kernel(struct cuda_route r)
{
	pdl_wait();
	pdl_trigger();
	route_all(r);
}

/*
 * A few tokens' router logits and their routing in one launch: block e
 * takes expert e's row of the router (type TY) by every token's row of h,
 * in float, its threads an 8-element chunk each (a warp a row held each
 * warp to eight dependent loads: 18.7 us a layer on an H100, against 10.8
 * for the product and the routing apart; this form 11.8 under ncu, but
 * one launch fewer in the graph); the last block to finish
 * routes the step (it sees the others' logits: each fences before
 * counting itself done), then sets the count back to 0 for the next step.
 */
template <int TY>
__global__ void __launch_bounds__(FUSED_THREADS)
route_fused_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int k, const float *__restrict__ h, int ldh,
    struct cuda_route r)
{
	pdl_wait();
	pdl_trigger();
	__shared__ float red[WARP];
	__shared__ int last;
	float acc[FUSED_TOKENS] = {};
	int e = blockIdx.x;

	for (int c = threadIdx.x; c < k / 8; c += blockDim.x) {
		float v[8];

		deq8<TY>(w + (size_t)e * row_bytes, c, v);
#pragma unroll
		for (int t = 0; t < FUSED_TOKENS; t++)
			if (t < r.n_tok) {
				const float4 *xp = (const float4 *)(h + (size_t)t * ldh) + 2 * c;
				float4 a = xp[0], b = xp[1];

				acc[t] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y +
				    v[6] * b.z + v[7] * b.w;
			}
	}
#pragma unroll
	for (int t = 0; t < FUSED_TOKENS; t++) {
		float sum = t < r.n_tok ? block_sum(acc[t], red) : 0.0f;

		if (t < r.n_tok && threadIdx.x == 0)
			r.logit[(size_t)t * r.n_expert + e] = sum;
	}
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0)
		last = atomicAdd(r.done, 1) == (int)gridDim.x - 1;
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	route_all(r);
	if (threadIdx.x == 0)
		*r.done = 0;
}

int
cuda_moe_max_tiles(int n_rows, int n_expert, int bn)
{
	return n_rows / bn + MIN(n_expert, n_rows);
}

/* The router's product and the routing of n_tok <= FUSED_TOKENS tokens as one launch. */
static int
route_fused(const struct cuda_weight *w, const float *h, int ldh, const struct cuda_route *r, cudaStream_t st,
    char *err)
{
	dim3 grid((unsigned)r->n_expert), block(FUSED_THREADS);

	switch (w->type) {
#define TY_CASE(TY) \
	case TY: \
		CK(cuda_launch(route_fused_kernel<TY>, grid, block, 0, st, w->d, w->row_bytes, (int)w->k, h, ldh, *r)); \
		return 0;
	DEQ_TYPES(TY_CASE)
#undef TY_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "no GPU kernel for a router of type %u", w->type);
	}
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
	return n_tok > e->slots_max && m->xh != NULL && cuda_qgemm_type(&e->gu) && cuda_qgemm_type(&e->down);
}

/* The experts' rows of the slots (a few tokens), their activation in int8 form where down takes it. */
static int
moe_slots(struct cuda_mm *m, const struct cuda_moe *e, struct cuda_moe_scratch *s, const float *h, int n_embd,
    int n_tok, int h_q8, char *err)
{
	int F = (int)e->down.k, k = e->n_used, R = n_tok * k, rc;
	struct cuda_h16 h16 = { NULL, NULL };
	struct cuda_q8 q8 = { NULL, NULL };
	struct mm_out gu = { { s->gate, s->up }, { F, F }, { 0, F, 2 * F }, 2 };
	struct mm_out dn = { { s->down }, { n_embd }, { 0, n_embd }, 1 };
	struct mm_slots sl_gu = { s->route.expert, e->gu_stride, k }, sl_dn = { s->route.expert, e->down_stride, 1 };

	if (cuda_matmul_int8(m, &e->down))
		q8.q = m->xq, q8.d = m->xd;
	if ((rc = cuda_matmul_slots(m, &e->gu, h, n_embd, n_tok, R, &sl_gu, &gu, h_q8, err)) != 0 ||
	    (rc = cuda_moe_glu(s->gate, s->up, R, F, s->route.expert, e->gate_b, e->up_b, e->act, h16, q8, m->stream,
	    err)) != 0)
		return rc;
	return cuda_matmul_slots(m, &e->down, s->gate, F, R, R, &sl_dn, &dn, q8.q != NULL, err);
}

/* The experts' rows grouped by expert (more tokens), on the tensor cores. */
static int
moe_grouped(struct cuda_mm *m, const struct cuda_moe *e, struct cuda_moe_scratch *s, const float *h, int n_embd,
    int n_tok, char *err)
{
	const struct cuda_route *r = &s->route;
	int F = (int)e->down.k, k = e->n_used, R = n_tok * k, max_tiles = cuda_moe_max_tiles(R, e->n_expert, r->bn), rc;
	struct cuda_h16 xh = { m->xh, m->xscale };
	struct cuda_q8 q8 = { NULL, NULL };
	struct mm_out gu = { { s->gate, s->up }, { F, F }, { 0, F, 2 * F }, 2 };
	struct mm_out dn = { { s->down }, { n_embd }, { 0, n_embd }, 1 };

	if ((rc = cuda_to_f16_rows(h, n_embd, n_embd, r->row_slot, k, R, xh, m->stream, err)) != 0 ||
	    (rc = cuda_qgemm_grouped(m, &e->gu, e->gu_stride, R, r->tiles, max_tiles, r->bn, &gu, err)) != 0 ||
	    (rc = cuda_moe_glu(s->gate, s->up, R, F, r->row_expert, e->gate_b, e->up_b, e->act, xh, q8, m->stream,
	    err)) != 0)
		return rc;
	return cuda_qgemm_grouped(m, &e->down, e->down_stride, R, r->tiles, max_tiles, r->bn, &dn, err);
}

int
cuda_moe_ffn(struct cuda_mm *m, const struct cuda_moe *e, struct cuda_moe_scratch *s, const float *h, int n_embd,
    int n_tok, int h_q8, struct cuda_rmix *mix, char *err)
{
	struct cuda_route *r = &s->route;
	int R = n_tok * e->n_used, grouped = cuda_moe_grouped(m, e, n_tok), rc;
	struct mm_out lg = { { r->logit }, { e->n_expert }, { 0, e->n_expert }, 1 };
	struct mm_slots tok = { NULL, 0, 1 };

	r->bias = e->router_b, r->n_tok = n_tok, r->n_expert = e->n_expert, r->n_used = e->n_used, r->norm = e->norm;
	r->bn = grouped ? cuda_qgemm_grouped_bn(R, MIN(e->n_expert, R)) : 0;
	/* the router on the float rows whatever the token count: fp16 inputs would move near ties */
	if (n_tok <= FUSED_TOKENS)
		rc = route_fused(&e->router, h, n_embd, r, m->stream, err);
	else if ((rc = cuda_matmul_slots(m, &e->router, h, n_embd, n_tok, n_tok, &tok, &lg, h_q8, err)) == 0)
		rc = cuda_moe_route(r, m->stream, err);
	if (rc != 0 || (rc = grouped ? moe_grouped(m, e, s, h, n_embd, n_tok, err) :
	    moe_slots(m, e, s, h, n_embd, n_tok, h_q8, err)) != 0)
		return rc;
	*mix = (struct cuda_rmix){ NULL, e->n_used, r->weight, grouped ? r->row : NULL, r->expert, e->down_b };
	return 0;
}
