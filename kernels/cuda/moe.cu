/*
 * moe.cu: a step of a mixture of experts: the router's product, the
 * routing, and the experts' rows by slots or grouped by expert.
 *
 * The routing of a step that groups its rows is one block (route_kernel):
 * each token's top experts (a warp a token, route.cuh), then every slot's
 * row among its expert's rows (a warp an expert, walking the slots in
 * order, so the grouping does not depend on timing) and the tiles. A
 * step's routing is small (512 tokens of 8 choices in 128 experts: 4,096
 * slots), and one block keeps it one launch, inside the step's graph, with
 * no round trip to the host. A step of a few tokens by slots has no
 * routing launch: its gate/up slots route their own token.
 */
#include "moe.cuh"
#include "dequant.cuh"

#define ROUTE_THREADS 1024
/* Up to this many tokens the router's product is router_kernel's. */
#define FUSED_TOKENS 8
/* Threads of a block of router_kernel (an expert's row). */
#define FUSED_THREADS 256

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
		route_token(r.logit + (size_t)t * r.n_expert, r.bias, r.n_expert, r.n_used, r.norm,
		    r.expert + (size_t)t * r.n_used, r.weight + (size_t)t * r.n_used);
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
 * A few tokens' router logits (without the bias: routing adds it): block e
 * takes expert e's row of the router (type TY) by every token's row of h,
 * in float, its threads an 8-element chunk each (a warp a row held each
 * warp to eight dependent loads). The row's first chunk is a weight, read
 * before pdl_wait. The routing is not here: a block that routed after the
 * others finished (a count of finished blocks, the last one routing) took
 * 11.8 us a qwen3-30b-a3b layer on an H100 under ncu, 9.6 of them that one
 * block's; the experts' slots route their own token instead
 * (route_token), and grouped steps launch route_kernel.
 */
template <int TY>
__global__ void __launch_bounds__(FUSED_THREADS)
router_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int k, const float *__restrict__ h, int ldh,
    float *__restrict__ logit, int n_tok, int n_expert)
{
	__shared__ float red[WARP];
	float acc[FUSED_TOKENS] = {}, v[8];
	int e = blockIdx.x, c = threadIdx.x;

	if (c < k / 8)
		deq8<TY>(w + (size_t)e * row_bytes, c, v);
	pdl_wait();
	pdl_trigger();
	for (; c < k / 8; c += blockDim.x) {
		if (c != (int)threadIdx.x)
			deq8<TY>(w + (size_t)e * row_bytes, c, v);
#pragma unroll
		for (int t = 0; t < FUSED_TOKENS; t++)
			if (t < n_tok) {
				const float4 *xp = (const float4 *)(h + (size_t)t * ldh) + 2 * c;
				float4 a = xp[0], b = xp[1];

				acc[t] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y +
				    v[6] * b.z + v[7] * b.w;
			}
	}
#pragma unroll
	for (int t = 0; t < FUSED_TOKENS; t++) {
		float sum = t < n_tok ? block_sum(acc[t], red) : 0.0f;

		if (t < n_tok && threadIdx.x == 0)
			logit[(size_t)t * n_expert + e] = sum;
	}
}

#define BUS_THREADS 256
/* Loads (16 bytes each) a thread of bus_gather_kernel has in flight: many at once hide the bus's latency. */
#define BUS_LOADS 4

/*
 * The step's table of a layer whose experts are split (cuda_bus): the
 * chosen experts it does not hold counted by their slots, ranked (more
 * slots first, then the lower index), and the first share of them given
 * the bus's slots. One block; a few thousand slots at most.
 */
__global__ void __launch_bounds__(BUS_THREADS)
bus_pick_kernel(const int32_t *__restrict__ expert, int slots, const int32_t *__restrict__ home, int n_expert,
    struct cuda_bus bus)
{
	__shared__ int count[MOE_MAX_EXPERTS];
	__shared__ int n_cand;

	pdl_wait();
	pdl_trigger();
	for (int e = threadIdx.x; e < n_expert; e += blockDim.x)
		count[e] = 0;
	if (threadIdx.x == 0)
		n_cand = 0;
	__syncthreads();
	for (int s = threadIdx.x; s < slots; s += blockDim.x)
		if (home[expert[s]] < 0 && atomicAdd(&count[expert[s]], 1) == 0)
			atomicAdd(&n_cand, 1);
	__syncthreads();
	int n_bus = min(bus.max, (int)(*bus.share * (float)n_cand + 0.5f));

	for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
		int at = home[e], rank = 0;

		if (at < 0 && count[e] > 0) {
			for (int o = 0; o < n_expert; o++)
				rank += count[o] > count[e] || (count[o] == count[e] && o < e);
			if (rank < n_bus)
				at = bus.n_home + rank, bus.list[1 + rank] = e;
		}
		bus.step_of[e] = at;
	}
	if (threadIdx.x == 0)
		bus.list[0] = n_bus;
}

/*
 * The listed experts' gate/up and down from host memory into the bus's
 * slots, 16 bytes a load, BUS_LOADS loads of each thread in flight over
 * the whole list (a grid of a few blocks a multiprocessor keeps the bus
 * full: 51 GB/s on an H200's, as cudaMemcpy).
 */
__global__ void __launch_bounds__(BUS_THREADS)
bus_gather_kernel(struct cuda_bus bus, size_t gu16, size_t down16)
{
	pdl_wait();
	pdl_trigger();
	size_t per = gu16 + down16, n = (size_t)bus.list[0] * per, step = (size_t)gridDim.x * blockDim.x;

	for (size_t i0 = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < n; i0 += step * BUS_LOADS) {
		uint4 v[BUS_LOADS];
		uint4 *to[BUS_LOADS];

#pragma unroll
		for (int u = 0; u < BUS_LOADS; u++) {
			size_t i = i0 + (size_t)u * step, j = i / per, o = i % per, e;

			if (i >= n)
				break;
			e = (size_t)bus.list[1 + j];
			if (o < gu16) {
				v[u] = __ldcs((const uint4 *)bus.gu_host + e * gu16 + o);
				to[u] = (uint4 *)bus.gu + j * gu16 + o;
			} else {
				v[u] = __ldcs((const uint4 *)bus.down_host + e * down16 + o - gu16);
				to[u] = (uint4 *)bus.down + j * down16 + o - gu16;
			}
		}
#pragma unroll
		for (int u = 0; u < BUS_LOADS; u++)
			if (i0 + (size_t)u * step < n)
				*to[u] = v[u];
	}
}

/*
 * Copies the list's experts (list[0] of them; both strides multiples of
 * 16 bytes, see open_bus_experts) from host memory into the bus's slots,
 * on st, a block a multiprocessor (sms).
 */
static int
bus_gather(const struct cuda_bus *bus, size_t gu_stride, size_t down_stride, int sms, cudaStream_t st, char *err)
{
	CK(cuda_launch(bus_gather_kernel, dim3((unsigned)sms), dim3(BUS_THREADS), 0, st, *bus, gu_stride / 16,
	    down_stride / 16));
	return 0;
}

int
cuda_moe_max_tiles(int n_rows, int n_expert, int bn)
{
	return n_rows / bn + MIN(n_expert, n_rows);
}

/* The router's logits of n_tok <= FUSED_TOKENS tokens. */
static int
router(const struct cuda_weight *w, const float *h, int ldh, const struct cuda_route *r, cudaStream_t st, char *err)
{
	dim3 grid((unsigned)r->n_expert), block(FUSED_THREADS);

	switch (w->type) {
#define TY_CASE(TY) \
	case TY: \
		CK(cuda_launch(router_kernel<TY>, grid, block, 0, st, w->d, w->row_bytes, (int)w->k, h, ldh, r->logit, \
		    r->n_tok, r->n_expert)); \
		return 0;
	DEQ_TYPES(TY_CASE)
#undef TY_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "no GPU kernel for a router of type %u", w->type);
	}
}

/*
 * Each token's n_used experts and their weights (route_token), then the
 * grouping when r->bn > 0. One block, one launch.
 */
static int
route_step(const struct cuda_route *r, cudaStream_t st, char *err)
{
	CK(cuda_launch(route_kernel, dim3(1), dim3(ROUTE_THREADS), 0, st, *r));
	return 0;
}

/*
 * Rows a tile of n_tok tokens' grouped rows on the integer kernel (0: on
 * the tensor cores): about twice an expert's mean, so that few experts
 * take two tiles (each reads the expert's rows again).
 */
static int
int_bn(const struct cuda_mm *m, const struct cuda_moe *e, int n_tok)
{
	int R = n_tok * e->n_used, active = MIN(e->n_expert, R), mean = (R + active - 1) / active;

	if (n_tok > e->int_max || !cuda_matmul_int8(m, &e->gu) || !cuda_matmul_int8(m, &e->down))
		return 0;
	return mean <= 1 ? 2 : mean <= 2 ? 4 : 8;
}

int
cuda_moe_grouped(const struct cuda_mm *m, const struct cuda_moe *e, int n_tok)
{
	return e->slot_of == NULL && n_tok > e->slots_max && ((m->xh != NULL && cuda_qgemm_type(&e->gu) && cuda_qgemm_type(&e->down)) ||
	    int_bn(m, e, n_tok) > 0);
}

/*
 * The experts' rows of the slots (a few tokens). The activation is the
 * gate/up launch's own where the integer kernel takes gate and up
 * (mm_slots.glu), down's int8 form of it a plain quantizing launch: a step
 * of one token 2.8 % faster on a 6-layer gpt-oss-20b, 1-1.3 % on an
 * 8-layer qwen3-30b-a3b (H100) than with the GLU's launch (biases, the
 * activation and the int8 form; 7 us alone on gpt-oss's, the quantizing
 * 3.6). Down's blocks each making the int8 form themselves was 6 % slower
 * (960 blocks quantizing the same row). Else the GLU's launch, in int8
 * form where down takes it. self_route: the gate/up slots route their
 * token from the router's logits (and store the routing); else it is done.
 */
static int
moe_slots(struct cuda_mm *m, const struct cuda_moe *e, struct cuda_moe_scratch *s, const float *h, int n_embd,
    int n_tok, int h_q8, int self_route, char *err)
{
	const struct cuda_route *r = &s->route;
	int F = (int)e->down.k, k = e->n_used, R = n_tok * k, rc;
	int fused = cuda_matmul_int8(m, &e->gu);
	struct cuda_h16 h16 = { NULL, NULL };
	struct cuda_q8 q8 = { NULL, NULL };
	struct mm_out gu = { { s->gate, s->up }, { F, F }, { 0, F, 2 * F }, 2 };
	struct mm_out act = { { s->gate }, { F }, { 0, F }, 1 };
	struct mm_out dn = { { s->down }, { n_embd }, { 0, n_embd }, 1 };
	const struct cuda_bus *bus = e->bus;
	const int32_t *at = bus != NULL ? bus->step_of : e->slot_of;
	int home = bus != NULL ? bus->n_home : 0;
	struct mm_slots sl_gu = { r->expert, e->gu_stride, k, self_route ? r->logit : NULL, r->bias, r->weight,
		r->n_expert, r->norm, { e->gate_b, e->up_b, e->act, fused }, at, bus != NULL ? bus->gu : NULL, home };
	struct mm_slots sl_dn = { r->expert, e->down_stride, 1, NULL, NULL, NULL, 0, 0, {}, at,
		bus != NULL ? bus->down : NULL, home, 1 }; /* gate/up and the activation's launch came after the routing */

	if (fused) { /* down's int8 form of the activation (if it reads one) made by its own launch */
		if ((rc = cuda_matmul_slots(m, &e->gu, h, n_embd, n_tok, R, &sl_gu, &act, h_q8, err)) != 0)
			return rc;
		return cuda_matmul_slots(m, &e->down, s->gate, F, R, R, &sl_dn, &dn, 0, err);
	}
	if (cuda_matmul_int8(m, &e->down))
		q8.q = m->xq, q8.d = m->xd;
	if ((rc = cuda_matmul_slots(m, &e->gu, h, n_embd, n_tok, R, &sl_gu, &gu, h_q8, err)) != 0 ||
	    (rc = cuda_moe_glu(s->gate, s->up, R, F, s->route.expert, e->gate_b, e->up_b, e->act, h16, q8, m->stream,
	    err)) != 0)
		return rc;
	return cuda_matmul_slots(m, &e->down, s->gate, F, R, R, &sl_dn, &dn, q8.q != NULL, err);
}

/*
 * The experts' rows grouped by expert (more tokens): a few an expert on
 * the integer kernel (q: int8 forms in row order, the inputs gathered, the
 * activation's made by the GLU), more on the tensor cores (fp16 forms).
 */
static int
moe_grouped(struct cuda_mm *m, const struct cuda_moe *e, struct cuda_moe_scratch *s, const float *h, int n_embd,
    int n_tok, int q, char *err)
{
	const struct cuda_route *r = &s->route;
	int F = (int)e->down.k, k = e->n_used, R = n_tok * k, max_tiles = cuda_moe_max_tiles(R, e->n_expert, r->bn), rc;
	struct cuda_h16 xh = { m->xh, m->xscale }, no_h16 = { NULL, NULL };
	struct cuda_q8 q8 = { m->xq, m->xd }, no_q8 = { NULL, NULL };
	struct mm_out gu = { { s->gate, s->up }, { F, F }, { 0, F, 2 * F }, 2 };
	struct mm_out dn = { { s->down }, { n_embd }, { 0, n_embd }, 1 };

	rc = q ? cuda_quant_rows(m, h, n_embd, n_embd, r->row_slot, k, R, err) :
		 cuda_to_f16_rows(h, n_embd, n_embd, r->row_slot, k, R, xh, m->stream, err);
	if (rc != 0 || (rc = q ? cuda_matmul_grouped_int8(m, &e->gu, e->gu_stride, r->tiles, max_tiles, r->bn, &gu, err) :
	    cuda_qgemm_grouped(m, &e->gu, e->gu_stride, xh, R, r->tiles, max_tiles, r->bn, &gu, err)) != 0 ||
	    (rc = cuda_moe_glu(s->gate, s->up, R, F, r->row_expert, e->gate_b, e->up_b, e->act, q ? no_h16 : xh,
	    q ? q8 : no_q8, m->stream, err)) != 0)
		return rc;
	return q ? cuda_matmul_grouped_int8(m, &e->down, e->down_stride, r->tiles, max_tiles, r->bn, &dn, err) :
		   cuda_qgemm_grouped(m, &e->down, e->down_stride, xh, R, r->tiles, max_tiles, r->bn, &dn, err);
}

int
cuda_moe_fuses_norm(const struct cuda_mm *m, const struct cuda_moe *e, int n_tok)
{
	return n_tok <= FUSED_TOKENS && !cuda_moe_grouped(m, e, n_tok) && e->router.type == TT_F32 &&
	    cuda_norm_router_fits((int)e->router.k, n_tok);
}

int
cuda_moe_ffn(struct cuda_mm *m, const struct cuda_moe *e, struct cuda_moe_scratch *s, float *h, int n_embd,
    int n_tok, int h_q8, const struct cuda_moe_pre *pre, struct cuda_rmix *mix, char *err)
{
	struct cuda_route *r = &s->route;
	int R = n_tok * e->n_used, grouped = cuda_moe_grouped(m, e, n_tok), rc;
	struct mm_out lg = { { r->logit }, { e->n_expert }, { 0, e->n_expert }, 1 };
	struct mm_slots tok = { NULL, 0, 1, NULL, NULL, NULL, 0, 0 };
	int few = n_tok <= FUSED_TOKENS, self_route = few && !grouped && e->slot_of == NULL, ib = grouped ? int_bn(m, e, n_tok) : 0;

	r->bias = e->router_b, r->n_tok = n_tok, r->n_expert = e->n_expert, r->n_used = e->n_used, r->norm = e->norm;
	r->bn = !grouped ? 0 : ib > 0 ? ib : cuda_qgemm_grouped_bn(R, MIN(e->n_expert, R));
	/* the router on the float rows whatever the token count: fp16 inputs would move near ties */
	if (pre != NULL && !cuda_moe_fuses_norm(m, e, n_tok))
		return err_set(err, ERR_INVAL, "experts of %d tokens cannot norm in the router's launch", n_tok);
	if (pre != NULL) {
		rc = cuda_norm_router(pre->x, pre->r, pre->bias, pre->w, (const float *)e->router.d, e->n_expert, r->logit,
		    h, pre->q8, n_tok, n_embd, pre->nm, m->stream, err);
		h_q8 = pre->q8.q != NULL;
	} else {
		rc = few ? router(&e->router, h, n_embd, r, m->stream, err) :
			   cuda_matmul_slots(m, &e->router, h, n_embd, n_tok, n_tok, &tok, &lg, h_q8, err);
	}
	if (rc == 0 && !self_route)
		rc = route_step(r, m->stream, err);
	if (rc == 0 && e->bus != NULL)
		CK(cuda_launch(bus_pick_kernel, dim3(1), dim3(BUS_THREADS), 0, m->stream, (const int32_t *)r->expert, R,
		    e->slot_of, e->n_expert, *e->bus));
	if (rc == 0 && e->routed != NULL)
		CK(cudaEventRecord(e->routed, m->stream));
	if (rc == 0 && e->bus != NULL)
		rc = bus_gather(e->bus, e->gu_stride, e->down_stride, m->sms, m->stream, err);
	if (rc != 0 || (rc = grouped ? moe_grouped(m, e, s, h, n_embd, n_tok, ib > 0, err) :
	    moe_slots(m, e, s, h, n_embd, n_tok, h_q8, self_route, err)) != 0)
		return rc;
	*mix = (struct cuda_rmix){ pre != NULL ? pre->bias : NULL, e->n_used, r->weight, grouped ? r->row : NULL, r->expert,
		e->down_b, pre != NULL ? pre->r : NULL, e->bus != NULL ? e->bus->step_of : e->slot_of };
	return 0;
}
