/*
 * pick.cu: a token drawn from each logits row on the device, as the host
 * sampler (daemon/engine/sample.c) draws it with a top-k, so that a sampled
 * step sends the host a token id a row instead of the row (half a megabyte
 * to a megabyte) and the host sorts nothing.
 *
 * Two kernels. The first selects, in slices of PICK_SLICE logits of a row,
 * by keys that order by logit, then by the lower id, each slice's best
 * FWD_PICK_TOP_K: the row's best top_k are among them. The second selects
 * the best of those, sorts them, and runs the host's arithmetic over the
 * best top_k: the e^-40 floor, the softmax at the temperature, the min-p
 * and top-p cuts and the race the key starts (fwd_race_uniform), in the same
 * float and double operations, so that the same logits and key pick the
 * same token (up to the last bit of expf and log, which may differ from
 * the C library's).
 */
#include "pick.cuh"

#define PICK_THREADS 512

/* A key whose descending order is the logit's, then the lower id's. */
static __device__ __forceinline__ uint64_t
pick_key(float v, int32_t id)
{
	uint32_t u;

	if (v == 0.0f) /* -0 ties with +0, as the host compares them */
		v = 0.0f;
	u = __float_as_uint(v);

	u = u & 0x80000000u ? ~u : u | 0x80000000u;
	return (uint64_t)u << 32 | (uint32_t)~id;
}

static __device__ __forceinline__ float
key_logit(uint64_t k)
{
	uint32_t u = (uint32_t)(k >> 32);

	return __uint_as_float(u & 0x80000000u ? u & 0x7fffffffu : ~u);
}

static __device__ __forceinline__ int32_t
key_id(uint64_t k)
{
	return (int32_t)~(uint32_t)k;
}

/* s[0..n) in descending order (n a power of two) by the block's threads, a bitonic sort. */
static __device__ void
sort_desc(uint64_t *s, int n)
{
	for (int k = 2; k <= n; k <<= 1)
		for (int j = k >> 1; j > 0; j >>= 1) {
			for (int i = threadIdx.x; i < n; i += blockDim.x) {
				int x = i ^ j;

				if (x > i) {
					uint64_t a = s[i], b = s[x];

					if ((i & k) == 0 ? a < b : a > b)
						s[i] = b, s[x] = a;
				}
			}
			__syncthreads();
		}
}

/* What the block's threads share while they select. */
struct pick_sel {
	int hist[256];
	int digit, above, count; /* a pass's: the digit the k-th key has, the keys above it, the keys at it */
	int slots, ties;
};

/*
 * The k largest of the block's keys (N a thread, in key[]) into out, in no
 * order: a radix select, 8 bits a pass from the top, that stops once the
 * keys sharing the k-th one's leading bits are all taken (after 2-4 passes
 * for a row of logits, where a sort of the slice took 80 us). Keys are
 * distinct but for the padding (0), of which as many as are needed go.
 */
template <int N>
static __device__ void
select_top(const uint64_t (&key)[N], int k, uint64_t *out, struct pick_sel *sm)
{
	uint64_t prefix = 0, mask = 0;
	int need = k, lane = threadIdx.x % WARP;

	for (int shift = 56; shift >= 0; shift -= 8) {
		for (int i = threadIdx.x; i < 256; i += blockDim.x)
			sm->hist[i] = 0;
		__syncthreads();
#pragma unroll
		for (int j = 0; j < N; j++) {
			int in = (key[j] & mask) == prefix, d = (int)(key[j] >> shift) & 255;
			unsigned act = __ballot_sync(FULL_MASK, in);

			if (in) { /* one atomic per digit a warp: a row's leading bits are much the same */
				unsigned peers = __match_any_sync(act, d);

				if (lane == __ffs(peers) - 1)
					atomicAdd(&sm->hist[d], __popc(peers));
			}
		}
		__syncthreads();
		if (threadIdx.x < WARP) { /* lane l holds digits 255 - 8 l down to 248 - 8 l */
			int c[8], tot = 0, incl;

#pragma unroll
			for (int q = 0; q < 8; q++)
				tot += c[q] = sm->hist[255 - 8 * lane - q];
			incl = tot;
			for (int off = 1; off < WARP; off <<= 1) {
				int v = __shfl_up_sync(FULL_MASK, incl, off);

				if (lane >= off)
					incl += v;
			}
			if (incl - tot < need && need <= incl)
				for (int q = 0, cum = incl - tot; q < 8; cum += c[q++])
					if (cum + c[q] >= need) {
						sm->digit = 255 - 8 * lane - q, sm->above = cum, sm->count = c[q];
						break;
					}
		}
		__syncthreads();
		need -= sm->above;
		prefix |= (uint64_t)sm->digit << shift;
		mask |= (uint64_t)255 << shift;
		int done = sm->count == need;

		__syncthreads(); /* before the next pass writes them */
		if (done)
			break;
	}
	if (threadIdx.x == 0)
		sm->slots = 0, sm->ties = 0;
	__syncthreads();
#pragma unroll
	for (int j = 0; j < N; j++) {
		uint64_t m = key[j] & mask;

		if (m > prefix || (m == prefix && atomicAdd(&sm->ties, 1) < need))
			out[atomicAdd(&sm->slots, 1)] = key[j];
	}
	__syncthreads();
}

#define PICK_PER_THREAD (PICK_SLICE / PICK_THREADS)

/* The temperature a row's log-probability is taken at: the host's, 1 for greedy. */
static __device__ __forceinline__ float
lp_temp(const struct fwd_pick &h)
{
	return h.temperature > 0 ? h.temperature : 1.0f;
}

/*
 * Block (slice, row): the best FWD_PICK_TOP_K keys of the slice, in no
 * order, to best; with a log-probability wanted, the slice's largest logit
 * and its sum of exp((l - largest) / t) to stats.
 */
__global__ void __launch_bounds__(PICK_THREADS)
pick_slice_kernel(const float *__restrict__ logits, int n, const struct fwd_pick *__restrict__ how,
    uint64_t *__restrict__ best, float2 *__restrict__ stats)
{
	pdl_wait();
	pdl_trigger();
	__shared__ struct pick_sel sm;
	__shared__ float red[WARP];
	int i0 = blockIdx.x * PICK_SLICE + threadIdx.x;
	const float *x = logits + (size_t)blockIdx.y * n;
	size_t at = (size_t)blockIdx.y * gridDim.x + blockIdx.x;
	uint64_t key[PICK_PER_THREAD];
	float mx = -INFINITY, sum = 0.0f, t;

#pragma unroll
	for (int j = 0; j < PICK_PER_THREAD; j++) {
		int i = i0 + j * PICK_THREADS;

		key[j] = i < n ? pick_key(x[i], i) : 0; /* 0: below every logit */
		if (i < n)
			mx = fmaxf(mx, x[i]);
	}
	select_top(key, FWD_PICK_TOP_K, best + at * FWD_PICK_TOP_K, &sm);
	if (!how[blockIdx.y].logprob)
		return;
	t = lp_temp(how[blockIdx.y]);
	mx = block_max(mx, red);
#pragma unroll
	for (int j = 0; j < PICK_PER_THREAD; j++)
		if (i0 + j * PICK_THREADS < n && mx > -INFINITY) /* a slice all -inf weighs nothing */
			sum += expf((key_logit(key[j]) - mx) / t);
	sum = block_sum(sum, red);
	if (threadIdx.x == 0)
		stats[at] = make_float2(mx, sum);
}

/* Row r's penalty window applied to its logits in place: sample.c's sample_penalize, unfused. */
__global__ void
pick_penalty_kernel(float *__restrict__ logits, int n, const struct fwd_pick *__restrict__ how,
    const int32_t *__restrict__ pen_tok, const int32_t *__restrict__ pen_cnt)
{
	pdl_wait();
	pdl_trigger();
	const struct fwd_pick h = how[blockIdx.x];
	float *x = logits + (size_t)blockIdx.x * n;

	for (int i = threadIdx.x; i < h.n_pen; i += blockDim.x) {
		int t = pen_tok[h.pen0 + i];
		float l, c = (float)pen_cnt[h.pen0 + i];

		if (t < 0 || t >= n)
			continue;
		l = x[t];
		l = l > 0 ? __fdiv_rn(l, h.repeat_penalty) : __fmul_rn(l, h.repeat_penalty);
		x[t] = __fsub_rn(l, __fadd_rn(h.presence_penalty, __fmul_rn(h.frequency_penalty, c)));
	}
}

/*
 * The row's largest logit (x) and the log of its sum of exp((l - x) / t)
 * (y): the host's log_softmax_at, the sum over the slices' sums rescaled to
 * the row's largest logit.
 */
static __device__ float2
row_lse(const struct fwd_pick &h, const float2 *st, int slices)
{
	float t = lp_temp(h), mx = -INFINITY;
	double sum = 0;

	for (int s = 0; s < slices; s++)
		mx = fmaxf(mx, st[s].x);
	for (int s = 0; s < slices; s++)
		if (st[s].y > 0)
			sum += (double)st[s].y * exp((double)(st[s].x - mx) / t);
	return make_float2(mx, (float)log(sum));
}

/* A key's log-probability in a row of row_lse lse. */
static __device__ __forceinline__ float
key_logprob(uint64_t k, const struct fwd_pick &h, float2 lse)
{
	return (float)((double)(key_logit(k) - lse.x) / lp_temp(h) - (double)lse.y);
}

/* The pick k of row blockIdx.x into ids and, if wanted, its log-probability into logprob. */
static __device__ void
pick_store(uint64_t k, const struct fwd_pick &h, const float2 *st, int slices, int32_t *ids, float *logprob)
{
	ids[blockIdx.x] = key_id(k);
	if (h.logprob)
		logprob[blockIdx.x] = key_logprob(k, h, row_lse(h, st, slices));
}

/*
 * Block row: the best FWD_PICK_TOP_K of its slices' keys, sorted, then the
 * host sampler's top-k draw over them (sample.c: top_k, cut_candidates and
 * sampler_pick), its float and double operations in the same order: the
 * exponentials and quotients a thread each, the sums and the cuts on one.
 */
__global__ void __launch_bounds__(PICK_THREADS)
pick_draw_kernel(const uint64_t *__restrict__ best, const float2 *__restrict__ stats, int slices, int n,
    const struct fwd_pick *__restrict__ how, int32_t *__restrict__ ids, float *__restrict__ logprob,
    int32_t *__restrict__ top_ids, float *__restrict__ top_lp)
{
	pdl_wait();
	pdl_trigger();
	__shared__ struct pick_sel sm;
	__shared__ uint64_t top[FWD_PICK_TOP_K];
	__shared__ float e[FWD_PICK_TOP_K], prob[FWD_PICK_TOP_K];
	__shared__ double sum, arrive[FWD_PICK_TOP_K];
	__shared__ float2 lse;
	const struct fwd_pick h = how[blockIdx.x];
	int m = slices * FWD_PICK_TOP_K, nc, i, keep = 0, first = 0;
	const uint64_t *b = best + (size_t)blockIdx.x * m;
	uint64_t key[PICK_PER_THREAD];
	float t = h.temperature, mx, floor;
	double cum = 0, soonest;

#pragma unroll
	for (int j = 0; j < PICK_PER_THREAD; j++) {
		int q = threadIdx.x + j * PICK_THREADS;

		key[j] = q < m ? b[q] : 0;
	}
	select_top(key, FWD_PICK_TOP_K, top, &sm);
	sort_desc(top, FWD_PICK_TOP_K);
	mx = key_logit(top[0]);
	if (h.logprob && h.top > 0) { /* the row's best, as sorted: every block of the row takes this branch */
		size_t at = (size_t)blockIdx.x * FWD_TOP_LOGPROBS + threadIdx.x;

		if (threadIdx.x == 0)
			lse = row_lse(h, stats + (size_t)blockIdx.x * slices, slices);
		__syncthreads();
		if (threadIdx.x < min(h.top, min(n, FWD_TOP_LOGPROBS))) {
			top_ids[at] = key_id(top[threadIdx.x]);
			top_lp[at] = key_logprob(top[threadIdx.x], h, lse);
		}
	}
	if (t == 0) {
		if (threadIdx.x == 0)
			pick_store(top[0], h, stats + (size_t)blockIdx.x * slices, slices, ids, logprob);
		return;
	}
	floor = __fsub_rn(mx, __fmul_rn(40.0f, t)); /* rounded as the host rounds it, not fused */
	for (nc = max(1, min(min(h.top_k, FWD_PICK_TOP_K), n)); nc > 1 && key_logit(top[nc - 1]) < floor; nc--)
		;
	if (threadIdx.x < nc)
		e[threadIdx.x] = expf((key_logit(top[threadIdx.x]) - mx) / t);
	__syncthreads();
	if (threadIdx.x == 0) {
		double s = 0;

		for (i = 0; i < nc; i++)
			s += e[i];
		sum = s;
	}
	__syncthreads();
	if (threadIdx.x < nc) {
		prob[threadIdx.x] = (float)(e[threadIdx.x] / sum);
		arrive[threadIdx.x] = -log(fwd_race_uniform(h.key, key_id(top[threadIdx.x]))) / (double)prob[threadIdx.x];
	}
	__syncthreads();
	if (threadIdx.x != 0)
		return;
	while (keep < nc) {
		float p = prob[keep];

		if (keep > 0 && p < __fmul_rn(h.min_p, prob[0]))
			break;
		keep++;
		cum += p;
		if (h.top_p < 1 && cum >= h.top_p)
			break;
	}
	for (i = 0, soonest = INFINITY; i < keep; i++)
		if (arrive[i] < soonest)
			soonest = arrive[i], first = i;
	pick_store(top[first], h, stats + (size_t)blockIdx.x * slices, slices, ids, logprob);
}

int
cuda_pick(float *logits, int n_rows, int n, const struct fwd_pick *how, const int32_t *pen_tok,
    const int32_t *pen_cnt, int penalized, int32_t *ids, float *logprob, int32_t *top_ids, float *top_lp,
    uint64_t *scratch, cudaStream_t st, char *err)
{
	unsigned slices = (unsigned)PICK_SLICES(n);
	float2 *stats = (float2 *)(scratch + (size_t)n_rows * slices * FWD_PICK_TOP_K);

	if (n < 1 || n_rows < 1)
		return err_set(err, ERR_INVAL, "sampling on the GPU: %d rows of %d", n_rows, n);
	if (n > FWD_PICK_MAX_VOCAB)
		return err_set(err, ERR_UNSUPPORTED, "sampling on the GPU: a vocabulary of %d (at most %d)", n,
		    FWD_PICK_MAX_VOCAB);
	if (penalized)
		CK(cuda_launch(pick_penalty_kernel, dim3((unsigned)n_rows), dim3(256), 0, st, logits, n, how, pen_tok,
		    pen_cnt));
	CK(cuda_launch(pick_slice_kernel, dim3(slices, (unsigned)n_rows), dim3(PICK_THREADS), 0, st,
	    (const float *)logits, n, how, scratch, stats));
	CK(cuda_launch(pick_draw_kernel, dim3((unsigned)n_rows), dim3(PICK_THREADS), 0, st, (const uint64_t *)scratch,
	    (const float2 *)stats, (int)slices, n, how, ids, logprob, top_ids, top_lp));
	return 0;
}

/* Block (slice, i): a slice of row rows[i]'s tokens, a thread each; a warp reads one mask word. */
__global__ void
mask_kernel(float *logits, int r0, int n_rows, int n, const int32_t *rows, const uint32_t *bits)
{
	int row = rows[blockIdx.y] - r0, t = blockIdx.x * blockDim.x + threadIdx.x;

	if (row < 0 || row >= n_rows || t >= n)
		return;
	if (!(bits[blockIdx.y * FWD_MASK_WORDS(n) + t / 32] >> (t % 32) & 1))
		logits[(size_t)row * n + t] = -INFINITY;
}

int
cuda_mask_logits(float *logits, int r0, int n_rows, int n, const int32_t *rows, const uint32_t *bits,
    int n_masked, cudaStream_t st, char *err)
{
	dim3 grid((unsigned)((n + 255) / 256), (unsigned)n_masked);

	mask_kernel<<<grid, 256, 0, st>>>(logits, r0, n_rows, n, rows, bits);
	CK(cudaGetLastError());
	return 0;
}
