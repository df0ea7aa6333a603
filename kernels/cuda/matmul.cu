/*
 * matmul.cu: matrix products straight from the stored weights.
 *
 * Few tokens (decoding): the types that have one (Q4_K, Q6_K, Q8_0) go to
 * an integer kernel: the tokens are quantized once per input to two rows
 * of int8 with a float scale per 32 (cuda_q8; the kernel that wrote the
 * input often did it already), a warp takes a row and each
 * lane dots chunks of it with dp4a, straight from the stored blocks, for
 * up to MMV_TOKENS tokens at once, so the weight is read once per group of
 * tokens with 16-byte loads where the blocks allow. Other types: a block
 * of threads takes four rows and walks them eight elements per thread,
 * dequantizing in registers. Several weights of the same input stored one
 * after the other (Q/K/V, gate/up) run as one kernel that sends each row
 * to its own output; on the integer kernel, up to MMQ_PAIR_TOKENS tokens,
 * two such runs of different types (a Q4_K Q/K, a Q6_K V) share a launch.
 *
 * Many tokens (batched decoding, prefill): the tokens are converted to
 * fp16 once per input (each row divided by a power of two when it would
 * overflow fp16, and multiplied back afterwards). Quantized weights go to
 * the tensor-core kernel of qgemm.cu, which decodes their blocks in shared
 * memory; float weights to cuBLAS, BF16 and F32 ones converted to fp16 a
 * tile of rows at a time, all with float32 accumulation. From
 * cuda_mm.blas_min tokens (a prefill chunk, the largest batches) the
 * quantized weights take cuBLAS too, each dequantized into the fp16 tile
 * first: qgemm decodes every weight once per 128 tokens, inside the loop
 * that feeds the tensor cores, where cuBLAS's products run at ~700
 * TFLOP/s against qgemm's ~300, and the decoding, once a step, is a
 * stream of the weights' bytes in and twice as many out (H200:
 * tests/bench/RESULTS.md, 2026-11-29).
 */
#include "matmul.cuh"
#include "dequant.cuh"
#include "norm.cuh"
#include "mmq.cuh"
#include "route.cuh"
#include "tc.cuh"

#include <string.h>

#define MMV_WARPS 4
#define MMV_ROWS 4  /* rows of one block of the matrix-vector kernel */
#define MMQ_WARPS 4 /* warps of one block of the integer kernel */
#define MMQ_PAIR_TOKENS 2 /* up to this many tokens, weights of two types can share a launch */
#define Q8_WARPS 8  /* groups of 32 (a warp each) per block of the quantizing kernel */
#define ROW_THREADS 256
/*
 * fp16 scratch for one tile of a dequantized weight: 128 MiB, a whole
 * product of an 8B model (llama3-8b's gate, 14,336 x 4,096): tiles of half
 * that made prefill 18 % slower (its down projection in tiles of 2,340
 * rows; H200).
 */
#define WTILE_ELEMS ((int64_t)64 << 20)

/* Runs a cuBLAS call (a launch, for RESIDENT_CUDA_FAULT); on failure returns from the calling function. */
#define CKB(call) \
	do { \
		if (fault_hit(FAULT_CUDA, FAULT_LAUNCH)) \
			return cuda_fail(err, __FILE__, __LINE__, #call, fault_message(FAULT_CUDA)); \
		cublasStatus_t s_ = (call); \
		if (s_ != CUBLAS_STATUS_SUCCESS) \
			return cuda_fail(err, __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
	} while (0)

/*
 * MMV_ROWS rows by NT tokens per block: the block's threads split the rows'
 * chunks of 8 elements, each dequantizes its chunk of every row in
 * registers and feeds it to every token, so one load of x serves
 * MMV_ROWS rows and one load of the weight serves NT tokens. Partial sums
 * are reduced within warps, then across them in shared memory.
 */
template <int TY, int NT>
static __device__ __forceinline__ void
mmv_block(const uint8_t *__restrict__ w, size_t row_bytes, int k, int n, const float *__restrict__ x, int ldx,
    const struct mm_out &out)
{
	__shared__ float red[MMV_WARPS][MMV_ROWS * NT];
	int row0 = blockIdx.x * MMV_ROWS, lane = threadIdx.x % WARP, wp = threadIdx.x / WARP;
	const uint8_t *r[MMV_ROWS];
	float acc[MMV_ROWS][NT];

#pragma unroll
	for (int i = 0; i < MMV_ROWS; i++) {
		r[i] = w + (size_t)min(row0 + i, n - 1) * row_bytes; /* a missing last row repeats one */
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[i][t] = 0.0f;
	}
	for (int c = threadIdx.x; c < k / 8; c += MMV_WARPS * WARP) {
		float v[MMV_ROWS][8];

#pragma unroll
		for (int i = 0; i < MMV_ROWS; i++)
			deq8<TY>(r[i], c, v[i]);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			const float4 *xp = (const float4 *)(x + (size_t)t * ldx) + 2 * c;
			float4 a = __ldg(xp), b = __ldg(xp + 1);

#pragma unroll
			for (int i = 0; i < MMV_ROWS; i++)
				acc[i][t] += v[i][0] * a.x + v[i][1] * a.y + v[i][2] * a.z + v[i][3] * a.w +
				    v[i][4] * b.x + v[i][5] * b.y + v[i][6] * b.z + v[i][7] * b.w;
		}
	}
#pragma unroll
	for (int i = 0; i < MMV_ROWS; i++)
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float s = warp_sum(acc[i][t]);

			if (lane == 0)
				red[wp][i * NT + t] = s;
		}
	__syncthreads();
	for (int j = threadIdx.x; j < MMV_ROWS * NT; j += blockDim.x) {
		int i = j / NT, t = j % NT;
		float s = 0.0f;

		if (row0 + i >= n)
			continue;
#pragma unroll
		for (int q = 0; q < MMV_WARPS; q++)
			s += red[q][j];
		mm_store(out, row0 + i, t, s);
	}
}

template <int TY, int NT>
__global__ void __launch_bounds__(MMV_WARPS * WARP)
mmv_kernel(const uint8_t *w, size_t row_bytes, int k, int n, const float *x, int ldx, struct mm_out out)
{
	pdl_wait();
	pdl_trigger();
	mmv_block<TY, NT>(w, row_bytes, k, n, x, ldx, out);
}

/* The outputs of slot s (blockIdx.y) of a slot launch: each output's row s. */
static __device__ __forceinline__ struct mm_out
slot_out(struct mm_out out, int s)
{
#pragma unroll
	for (int i = 0; i < MM_MAX_OUT; i++) /* constant indices: the struct stays in registers */
		if (i < out.n)
			out.y[i] += (size_t)s * out.ldy[i];
	return out;
}

/*
 * The expert of slot s, for the whole calling block: sl.expert[s], or
 * (sl.logit set) its token's routing, by the block's first warp; block
 * (0, the token's first slot) stores the token's routing for the kernels
 * after this one (each block reads its own from shared memory). Stored
 * choices are read past L1 (as slot_at's table is), so that a launch that
 * reads them before pdl_wait (mm_slots.early) sees what was stored.
 */
static __device__ __forceinline__ int
slot_expert(const struct mm_slots &sl, int s)
{
	__shared__ int32_t ex[MOE_MAX_USED];
	__shared__ float wt[MOE_MAX_USED];
	int t = s / sl.in_div, j = s % sl.in_div;

	if (sl.logit == NULL)
		return sl.expert != NULL ? __ldcg(sl.expert + s) : 0;
	if (threadIdx.x < WARP)
		route_token(sl.logit + (size_t)t * sl.n_expert, sl.bias, sl.n_expert, sl.in_div, sl.norm, ex, wt);
	__syncthreads();
	if (blockIdx.x == 0 && j == 0 && (int)threadIdx.x < sl.in_div)
		sl.expert[s + threadIdx.x] = ex[threadIdx.x], sl.weight[s + threadIdx.x] = wt[threadIdx.x];
	return ex[j];
}

/* Where expert ex's rows are, in strides from the weight's start (mm_slots.slot_of); negative: not here. */
static __device__ __forceinline__ int
slot_at(const struct mm_slots &sl, int ex)
{
	return sl.slot_of != NULL ? __ldcg(sl.slot_of + ex) : ex;
}

/* The rows of slot at (slot_at's, not negative) of weight w: there, or brought up for the step (mm_slots.away). */
static __device__ __forceinline__ const uint8_t *
slot_w(const struct mm_slots &sl, const uint8_t *w, int at)
{
	return sl.away != NULL && at >= sl.n_home ? sl.away + (size_t)(at - sl.n_home) * sl.stride :
						     w + (size_t)at * sl.stride;
}

/*
 * The matrix-vector kernel over expert slots (cuda_matmul_slots): block
 * (x, s) takes rows of the expert slot s chose, by its input row.
 */
template <int TY>
__global__ void __launch_bounds__(MMV_WARPS * WARP)
mmv_slot_kernel(const uint8_t *w, size_t row_bytes, int k, int n, const float *x, int ldx, struct mm_out out,
    struct mm_slots sl)
{
	pdl_wait();
	pdl_trigger();
	int s = blockIdx.y, at = slot_at(sl, slot_expert(sl, s));

	if (at < 0)
		return;
	mmv_block<TY, 1>(slot_w(sl, w, at), row_bytes, k, n, x + (size_t)(s / sl.in_div) * ldx, ldx,
	    slot_out(out, s));
}

/*
 * Rows of one warp of the integer kernel for NT tokens: the chunks of x
 * are read from L1 once per row group, which bounds several tokens (four
 * rows keep that under the weight's own traffic). Measured on an H100 at
 * one token: 3 rows 2 % faster than 2, 1 and 4 rows 12-14 % slower; at two
 * tokens 3 rows 6 % faster than 4 and 14 % than 2. One token of rows of
 * MMQ_WIDE_K or more takes 2 rows a warp: such a product (llama3-8b's
 * down projection, 4,096 rows of 14,336) has few rows for its bytes, and
 * 3 a warp left a third of an H100's block slots empty while each warp
 * walked a long row (a step 1 % faster with 2; every product at 2: 1 %
 * slower). Such a row in Q6_K (the down projection of half of llama3-8b's
 * layers) is read by a pair of warps, 4 rows a pair, each warp half of
 * the chunks (held to 128 registers: four blocks a multiprocessor, 4,096
 * rows in one wave), so that each row has two chunks' loads in flight: alone
 * 23.8 -> 22.7 us, a step 0.6 % faster; Q4_K's went 15.0 -> 15.7 us that way
 * and keeps 2 rows a warp. Q/K/V's 4 rows a warp (384 blocks, one wave)
 * were faster alone (11.5 -> 10.5 us) but made a step 5 % slower.
 */
template <int NT> struct mmq_rows { static constexpr int n = NT >= 4 ? 4 : 3; };
#define MMQ_WIDE_K 8192

/* The other products' rows all go to out. */
static const struct mm_qkv no_qkv = {};

/*
 * The sums of a group of KS warps (g of the block's groups, this warp its
 * part) into its first warp's lane 0: N floats at a each, through shared
 * memory, added in part order. 1 in the warp that stores them. The group's
 * own barrier: a group past the last row returns before it, as a whole.
 */
template <int N, int KS>
static __device__ __forceinline__ int
mmq_group_sum(float *a, int g, int part, int lane)
{
	__shared__ float red[MMQ_WARPS][N];

	if (part != 0 && lane == 0)
#pragma unroll
		for (int i = 0; i < N; i++)
			red[g * KS + part][i] = a[i];
	asm volatile("bar.sync %0, %1;" ::"r"(1 + g), "r"(KS * WARP) : "memory");
	if (part != 0)
		return 0;
	if (lane == 0)
#pragma unroll
		for (int p = 1; p < KS; p++)
#pragma unroll
			for (int i = 0; i < N; i++)
				a[i] += red[g * KS + p][i];
	return 1;
}

/* The sum over each run of LS lanes (LS a power of two up to 32); every lane of a run gets its run's. */
template <int LS>
static __device__ __forceinline__ float
run_sum(float v)
{
#pragma unroll
	for (int o = LS / 2; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

/* Lines first, first + step, ... of 128 bytes of R rows of bytes each into L1. */
template <int R>
static __device__ __forceinline__ void
mmq_prefetch_rows(const uint8_t *const (&r)[R], size_t bytes, int first, int step)
{
#pragma unroll
	for (int i = 0; i < R; i++)
		for (size_t o = 128 * (size_t)first; o < bytes; o += 128 * (size_t)step)
			asm volatile("prefetch.global.L1 [%0];" ::"l"(r[i] + o));
}

/*
 * One block of the integer matrix-vector kernel: its warps in groups of
 * KS, group g taking R rows of the weight from (blk * MMQ_WARPS / KS + g)
 * * R; warp j of a group takes runs j, j + KS, ... of 32 chunks of its
 * rows, a chunk a lane; each token's chunk of x, loaded once, serves every
 * row. The group's first warp adds the others' sums (in that order) and
 * stores. With QKV (R even), the rows go to e as pairs. Only the first nt
 * tokens are there (nt <= NT; a constant NT where the caller has all).
 *
 * Short rows (the experts' slots): LS < 32 splits a warp (KS 1) into runs
 * of LS lanes, each run R rows of its own, so that a row of fewer than 32
 * chunks does not leave lanes idle; U > 1 loads U chunks a lane before
 * the first product, so that a lane has all of a short row's loads in
 * flight at once instead of one chunk's (a chunk past the row is loaded
 * again as the row's last and not added).
 *
 * GLU (R even, one token) takes the weight's rows 2 i and 2 i + 1 as its
 * rows i and n / 2 + i (an expert's gate and up) and stores their
 * activation (mm_glu, expert ex's biases) as row i of out's first output.
 *
 * WAIT: the caller has not passed pdl_wait; each thread does once its
 * first chunks of the weight are asked for, before it reads x, so that
 * those loads are in flight while the kernel before ends.
 *
 * mmq_xs<TY, LS> (Q4_K in runs of lanes): the block copies x into shared
 * memory (mmq_stage_x; mmq_xs_bytes of dynamic shared memory) after
 * pdl_wait, before its first weight loads, and every warp reads it there.
 */
template <int TY, int NT, int R, int KS, bool QKV, int LS = WARP, int U = 1, bool GLU = false, bool WAIT = false>
static __device__ __forceinline__ void
mmq_block(const struct mm_seg &sg, int blk, int k, const int8_t *__restrict__ xq,
    const float2 *__restrict__ xd, const struct mm_out &out, const mm_e<QKV> &e, int nt,
    const struct mm_glu &glu = {}, int ex = 0)
{
	using Q = qt<TY>;
	constexpr bool XS = mmq_xs<TY, LS>;
	static_assert(LS == WARP || KS == 1, "runs of lanes are one warp's");
	constexpr int RUNS = WARP / LS;
	int w = threadIdx.x / WARP, g = w / KS, part = w % KS, lane = threadIdx.x % WARP, nc = k / Q::n;
	int warp_row0 = (blk * (MMQ_WARPS / KS) + g) * RUNS * R, row0 = warp_row0 + lane / LS * R, n = sg.n;
	bool rows = warp_row0 < n; /* a run past the last row still takes part in its warp's sums */
	const uint8_t *r[R];
	float acc[R][NT];
	struct qkv_pair pe[QKV ? R / 2 : 1][NT];

	static_assert(!XS || NT == 1, "a copy of x is of one token");
	if (!XS && !rows) { /* with XS, a warp without rows still copies x */
		if constexpr (WAIT)
			pdl_wait(), pdl_trigger();
		return;
	}
	if constexpr (QKV) {
#pragma unroll
		for (int i = 0; i < R; i += 2)
#pragma unroll
			for (int t = 0; t < NT; t++)
				if (lane == 0 && row0 + i < n) /* n is even: the pair's second row too */
					pe[i / 2][t] = qkv_pair_of(e.hd, e.kv, e.q, sg.o0 + row0 + i, t);
	}
#pragma unroll
	for (int i = 0; i < R; i++) {
		int j = min(row0 + i, n - 1); /* a missing last row repeats one */

		r[i] = sg.w + (size_t)(GLU ? (j >> 1) + (j & 1) * (n >> 1) : j) * sg.row_bytes;
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[i][t] = 0.0f;
	}
	float gb[GLU ? R / 2 : 1], ub[GLU ? R / 2 : 1]; /* the biases of a GLU's rows, loaded with the weights */

	if constexpr (GLU)
#pragma unroll
		for (int i = 0; i < R; i += 2) {
			size_t b = (size_t)ex * (n >> 1) + (min(row0 + i, n - 2) >> 1);

			gb[i / 2] = glu.gate_b != NULL ? glu.gate_b[b] : 0.0f;
			ub[i / 2] = glu.up_b != NULL ? glu.up_b[b] : 0.0f;
		}
	bool waited = !WAIT;
	extern __shared__ uint4 mmq_xs[];

	if constexpr (XS) {
		if constexpr (WAIT) /* the first loads came before pdl_wait: the rows go to L1 there instead */
			if (rows)
				mmq_prefetch_rows<R>(r, sg.row_bytes, lane % LS, LS);
		if (!waited)
			pdl_wait(), pdl_trigger(), waited = true;
		mmq_stage_x(mmq_xs, xq, xd, k);
		if (!rows)
			return;
	}
	for (int c0 = lane % LS + part * LS; c0 < nc; c0 += U * KS * LS) {
		typename Q::W wc[U][R];

#pragma unroll
		for (int u = 0; u < U; u++)
#pragma unroll
			for (int i = 0; i < R; i++)
				Q::load(r[i], min(c0 + u * KS * LS, nc - 1), wc[u][i]);
		if (!waited)
			pdl_wait(), pdl_trigger(), waited = true;
#pragma unroll
		for (int u = 0; u < U; u++) {
			int c = c0 + u * KS * LS;

			if (c >= nc)
				break;
#pragma unroll
			for (int t = 0; t < NT; t++) {
				typename Q::X x;

				if (t >= nt)
					break;
				if constexpr (XS)
					Q::loadxs(mmq_xs, k, c, x);
				else
					Q::loadx(xq, xd, k, t, c, x);
#pragma unroll
				for (int i = 0; i < R; i++)
					acc[i][t] += Q::dot(wc[u][i], x);
			}
		}
	}
	if (!waited)
		pdl_wait(), pdl_trigger();
#pragma unroll
	for (int i = 0; i < R; i++)
#pragma unroll
		for (int t = 0; t < NT; t++)
			acc[i][t] = run_sum<LS>(acc[i][t]);
	if constexpr (KS > 1)
		if (!mmq_group_sum<R * NT, KS>(&acc[0][0], g, part, lane))
			return;
	if (lane % LS != 0)
		return;
	if constexpr (GLU) {
		static_assert(R % 2 == 0 && NT == 1 && !QKV, "a run holds whole pairs of one token");
#pragma unroll
		for (int i = 0; i < R; i += 2)
			if (row0 + i < n)
				out.y[0][(row0 + i) >> 1] = expert_act(acc[i][0] + gb[i / 2], acc[i + 1][0] + ub[i / 2], glu.act);
	} else if constexpr (QKV) {
		static_assert(R % 2 == 0 && LS == WARP, "a warp holds whole pairs");
#pragma unroll
		for (int i = 0; i < R; i += 2)
#pragma unroll
			for (int t = 0; t < NT; t++)
				if (row0 + i < n)
					qkv_pair_store(pe[i / 2][t], acc[i][t], acc[i + 1][t]);
	} else {
#pragma unroll
		for (int i = 0; i < R; i++)
#pragma unroll
			for (int t = 0; t < NT; t++)
				if (row0 + i < n && t < nt)
					mm_store(out, sg.o0 + row0 + i, t, acc[i][t]);
	}
}

/* Blocks of the integer kernel for n rows of R a group of ks warps (a run of ls lanes, if ls < 32). */
static int
mmq_blocks(int64_t n, int r, int ks, int ls = WARP)
{
	int rows = MMQ_WARPS / ks * r * (WARP / ls);

	return (int)((n + rows - 1) / rows);
}

/*
 * The integer matrix-vector kernel: its first nb_a blocks multiply by a
 * (of type TY), the rest by b (of type TY2; 0: none), so that weights of
 * one input stored in two types (a Q4_K Q/K and a Q6_K V) are one launch
 * whose blocks run side by side, not two in a row (a step of one sequence
 * 2 % faster on an H100). One block a multiprocessor is all the launch
 * bounds ask for at one token: left to its default, nvcc held the one-token
 * kernel to 80 registers, and with what it takes then (75-114, sm_90a, Q4_K
 * and Q6_K, alone or paired) a step was 11 % faster (more of a lane's loads
 * in flight at once). At two tokens they ask for four: the Q4_K kernel
 * takes 128 registers instead of 157, without spilling, and four blocks a
 * multiprocessor instead of three (a step of two sequences 2.8 % faster,
 * one sequence's unchanged). Unrolling the chunk loop,
 * loading the first chunk before pdl_wait, prefetching a warp's rows to
 * L2 and staging them through shared memory with cp.async were slower.
 */
template <int TY, int TY2, int NT, int R, int KS, bool QKV>
__global__ void __launch_bounds__(MMQ_WARPS * WARP, NT == 2 || KS > 1 ? 4 : 1)
mmq_kernel(struct mm_seg a, struct mm_seg b, int nb_a, int k, const int8_t *__restrict__ xq,
    const float2 *__restrict__ xd, struct mm_out out, mm_e<QKV> e)
{
	pdl_wait();
	pdl_trigger();
	if constexpr (TY2 != 0) {
		if ((int)blockIdx.x >= nb_a) {
			mmq_block<TY2, NT, R, KS, QKV>(b, blockIdx.x - nb_a, k, xq, xd, out, e, NT);
			return;
		}
	}
	mmq_block<TY, NT, R, KS, QKV>(a, blockIdx.x, k, xq, xd, out, e, NT);
}

/*
 * The integer kernel over expert slots (cuda_matmul_slots): block (x, s)
 * takes rows of the expert slot s chose, by the int8 form of its input
 * row, R rows a group of KS warps as the one-token kernel, or R rows a run
 * of LS lanes, U chunks a lane in flight, for short rows; GLU:
 * mm_slots.glu. EARLY (mm_slots.early): the slot's expert and its first
 * rows are read before pdl_wait.
 */
template <int TY, int R, int KS, int LS = WARP, int U = 1, bool GLU = false, bool EARLY = false>
__global__ void __launch_bounds__(MMQ_WARPS * WARP, KS > 1 ? 4 : 1)
mmq_slot_kernel(struct mm_seg a, int k, const int8_t *__restrict__ xq, const float2 *__restrict__ xd,
    struct mm_out out, struct mm_slots sl)
{
	int s = blockIdx.y, in = s / sl.in_div, ex, at;

	if constexpr (!EARLY)
		pdl_wait(), pdl_trigger();
	ex = slot_expert(sl, s), at = slot_at(sl, ex);
	if (at < 0) {
		if constexpr (EARLY)
			pdl_wait(), pdl_trigger();
		return;
	}
	a.w = slot_w(sl, a.w, at);
	mmq_block<TY, 1, R, KS, false, LS, U, GLU, EARLY>(a, blockIdx.x, k, xq + (size_t)in * 2 * k,
	    xd + (size_t)in * (k / 32), slot_out(out, s), mm_e<false>{}, 1, sl.glu, ex);
}

/*
 * The integer kernel over tiles of rows grouped by expert
 * (cuda_matmul_grouped_int8): block (x, i) takes rows of tile i's expert
 * by the tile's rows of the int8 input (up to NT), as mmq_kernel does NT
 * tokens; blocks of tiles past the step's count return at once.
 */
template <int TY, int NT>
__global__ void __launch_bounds__(MMQ_WARPS * WARP, NT == 2 ? 4 : 1)
mmq_grouped_kernel(struct mm_seg a, size_t stride, int k, const int8_t *__restrict__ xq,
    const float2 *__restrict__ xd, struct mm_out out, const int32_t *__restrict__ tiles)
{
	pdl_wait();
	pdl_trigger();
	int i = blockIdx.y;

	if (i >= tiles[0])
		return;
	int e = tiles[1 + 3 * i], first = tiles[2 + 3 * i], nt = tiles[3 + 3 * i];

	a.w += (size_t)e * stride;
	mmq_block<TY, NT, mmq_rows<NT>::n, 1, false>(a, blockIdx.x, k, xq + (size_t)first * 2 * k,
	    xd + (size_t)first * (k / 32), slot_out(out, first), mm_e<false>{}, nt);
}

/*
 * Row t of x (k wide) in the integer kernels' form (cuda_q8), from x's row
 * t, or rows[t] / div where rows is set. A warp per group of 32.
 */
__global__ void
quant_q8_kernel(const float *__restrict__ x, int ldx, int k, const int32_t *__restrict__ rows, int div,
    int8_t *__restrict__ xq, float2 *__restrict__ xd)
{
	pdl_wait();
	pdl_trigger();
	int g = blockIdx.x * Q8_WARPS + threadIdx.x / WARP, i = 32 * g + threadIdx.x % WARP, t = blockIdx.y;
	int src = rows != NULL ? rows[t] / div : t;
	struct cuda_q8 q8 = { xq, xd };

	if (g < k / 32)
		q8_store1(q8, t, k, i, x[(size_t)src * ldx + i]);
}

/* Multiplies row t of y (n wide) back by xscale[t]. */
__global__ void
unscale_kernel(float *__restrict__ y, int ldy, int n, const float *__restrict__ xscale)
{
	pdl_wait();
	pdl_trigger();
	float s = xscale[blockIdx.x];

	if (s == 1.0f)
		return;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		y[(size_t)blockIdx.x * ldy + i] *= s;
}

/* Chunks [0, n_chunks) of rows of k elements, dequantized to fp16 rows of k. */
template <int TY>
__global__ void
deq_f16_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int k, int64_t n_chunks,
    __half *__restrict__ out)
{
	pdl_wait();
	pdl_trigger();
	int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	int cpr = k / 8;
	float v[8];
	__half2 h[4];

	if (idx >= n_chunks)
		return;
	deq8<TY>(w + (size_t)(idx / cpr) * row_bytes, (int)(idx % cpr), v);
#pragma unroll
	for (int i = 0; i < 4; i++)
		h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
	((uint4 *)out)[idx] = *(const uint4 *)h;
}

/*
 * The 32 elements thread t (of 8) of a block of 256 writes when block bi
 * of row r is dequantized to fp16 for cuBLAS: the 8 at 8 (t + 8 i), as
 * o[8 i], for i < 4, so that each store of a warp fills 128 contiguous
 * bytes of each of its 4 blocks. Decoded as qgemm decodes them (tc.cuh's
 * h2_pairs: 1024 + q in fp16, less the type's offset, times the scale,
 * plus the K types' - dmin m).
 *
 * Q4_K: the low (t < 4) or high nibbles of quant bytes 32 i + 8 (t % 4) ..
 * + 7, of sub-block 2 i + t / 4; the header and the quants in one 16-byte
 * and four 8-byte loads, where deq8 makes five loads for 8 elements.
 */
template <int TY> static __device__ __forceinline__ void deq32(const uint8_t *r, int bi, int t, uint4 *o);

template <>
__device__ __forceinline__ void
deq32<TT_Q4_K>(const uint8_t *r, int bi, int t, uint4 *o)
{
	const uint8_t *b = r + (size_t)bi * 144;
	int sh = 4 * (t >> 2);
	uint4 hd = __ldg((const uint4 *)b);
	uint2 q[4];
	uint32_t sc[2], m[2];
	float d = __low2float(as_h2(hd.x)), dmin = __high2float(as_h2(hd.x));

#pragma unroll
	for (int i = 0; i < 4; i++)
		q[i] = __ldg((const uint2 *)(b + 16 + 32 * i + 8 * (t & 3)));
	k4_unpack(hd.y, hd.z, hd.w, sc, m);
#pragma unroll
	for (int i = 0; i < 4; i++) {
		int at = 8 * ((2 * i) & 3) + 2 * sh; /* sub-block 2 i + t / 4's byte of sc[i / 2] and m[i / 2] */
		__half2 dl = __float2half2_rn(d * (float)((sc[i >> 1] >> at) & 0xff));
		__half2 ml = __float2half2_rn(-dmin * (float)((m[i >> 1] >> at) & 0xff));
		uint32_t v[4];

		h2_pairs((q[i].x >> sh) & 0x0f0f0f0fu, H_1024, dl, ml, &v[0]);
		h2_pairs((q[i].y >> sh) & 0x0f0f0f0fu, H_1024, dl, ml, &v[2]);
		o[8 * i] = make_uint4(v[0], v[1], v[2], v[3]);
	}
}

/*
 * Q6_K as the GPU holds it (TT_Q6_KG): piece i is of half i / 2 of the
 * block and its quarter 2 (i % 2) + t / 4. Two 8-byte loads of ql and two
 * of qh serve all four (ql's nibble and qh's bit pair picked by i), one
 * 16-byte load the scales.
 */
template <>
__device__ __forceinline__ void
deq32<TT_Q6_KG>(const uint8_t *r, int bi, int t, uint4 *o)
{
	const uint8_t *b = q6g_body(r, bi);
	int l0 = 8 * (t & 3);
	float d = q6g_d(r, bi);
	uint4 scv = __ldg((const uint4 *)(b + 192));
	uint32_t sw[4] = { scv.x, scv.y, scv.z, scv.w };
	uint2 ql[2], qh[2];

#pragma unroll
	for (int j = 0; j < 2; j++) {
		ql[j] = __ldg((const uint2 *)(b + 64 * j + 32 * (t >> 2) + l0));
		qh[j] = __ldg((const uint2 *)(b + 128 + 32 * j + l0));
	}
#pragma unroll
	for (int i = 0; i < 4; i++) {
		int j = i >> 1, lsh = 4 * (i & 1), hsh = 2 * (2 * (i & 1) + (t >> 2));
		/* scale t / 2 + 4 i: byte t / 2 of word i */
		__half2 dl = __float2half2_rn(d * (float)(int8_t)(sw[i] >> (8 * (t >> 1))));
		uint32_t x0 = ((ql[j].x >> lsh) & 0x0f0f0f0fu) | (((qh[j].x >> hsh) & 0x03030303u) << 4);
		uint32_t x1 = ((ql[j].y >> lsh) & 0x0f0f0f0fu) | (((qh[j].y >> hsh) & 0x03030303u) << 4);
		uint32_t v[4];

		h2_pairs(x0, H_1056, dl, as_h2(0u), &v[0]);
		h2_pairs(x1, H_1056, dl, as_h2(0u), &v[2]);
		o[8 * i] = make_uint4(v[0], v[1], v[2], v[3]);
	}
}

/* Rows of nb blocks of 256 (TY: Q4_K, Q6_KG) to fp16, by deq32: n_units threads, 8 a block. */
template <int TY>
__global__ void
deq32_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int nb, int64_t n_units, __half *__restrict__ out)
{
	pdl_wait();
	pdl_trigger();
	int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, blk = idx >> 3, row = blk / nb;

	if (idx >= n_units)
		return;
	int bi = (int)(blk % nb), t = (int)idx & 7;

	deq32<TY>(w + (size_t)row * row_bytes, bi, t, (uint4 *)(out + (size_t)row * nb * 256 + (size_t)bi * 256) + t);
}

/* out[t] = scale * row tokens[t] of the matrix. */
template <int TY>
__global__ void
embed_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int k, const int32_t *__restrict__ tokens,
    float scale, float *__restrict__ out)
{
	pdl_wait();
	pdl_trigger();
	const uint8_t *r = w + (size_t)tokens[blockIdx.x] * row_bytes;
	float *o = out + (size_t)blockIdx.x * k;
	float v[8];

	for (int c = threadIdx.x; c < k / 8; c += blockDim.x) {
		deq8<TY>(r, c, v);
#pragma unroll
		for (int i = 0; i < 8; i++)
			o[8 * c + i] = scale != 1.0f ? v[i] * scale : v[i];
	}
}

/* The matrix-vector kernel of type TY for nt (1..MMV_TOKENS) tokens. */
template <int TY>
static cudaError_t
mmv_launch(int nt, cudaStream_t st, const struct cuda_weight *w, const float *x, int ldx,
    const struct mm_out *out)
{
	dim3 grid((unsigned)((w->n + MMV_ROWS - 1) / MMV_ROWS)), block(MMV_WARPS * WARP);
	int k = (int)w->k, n = (int)w->n;

	switch (nt) {
#define NT_CASE(N) \
	case N: \
		return cuda_launch(mmv_kernel<TY, N>, grid, block, 0, st, w->d, w->row_bytes, k, n, x, ldx, *out);
	NT_CASE(1) NT_CASE(2) NT_CASE(3) NT_CASE(4) NT_CASE(5) NT_CASE(6) NT_CASE(7) NT_CASE(8)
#undef NT_CASE
	}
	return cudaErrorInvalidValue;
}

/*
 * The integer kernel for NT tokens, R rows a group of KS warps: the rows
 * of a, then those of b (if b.n > 0), to out or with QKV to e.
 */
template <int TY, int TY2, int NT, int R, int KS = 1, bool QKV = false>
static cudaError_t
mmq_go(cudaStream_t st, struct mm_seg a, struct mm_seg b, int k, const int8_t *xq, const float2 *xd,
    const struct mm_out *out, const struct mm_qkv &e)
{
	int nb_a = mmq_blocks(a.n, R, KS);
	dim3 grid((unsigned)(nb_a + (b.n > 0 ? mmq_blocks(b.n, R, KS) : 0))), block(MMQ_WARPS * WARP);

	return cuda_launch(mmq_kernel<TY, TY2, NT, R, KS, QKV>, grid, block, 0, st, a, b, nb_a, k, xq, xd, *out,
	    mm_e_of<QKV>(e));
}

/*
 * The integer kernel for nt tokens whose quantized rows start at xq, xd:
 * the rows of w (type TY), then those of w2 (type TY2, or none: w2 NULL,
 * TY2 0; only for up to MMQ_PAIR_TOKENS tokens), to out, or where e.q is
 * set, to e (as many tokens; 2 rows a warp, so that a warp holds pairs).
 */
template <int TY, int TY2>
static cudaError_t
mmq_types(int nt, cudaStream_t st, const struct cuda_weight *w, const struct cuda_weight *w2,
    const int8_t *xq, const float2 *xd, const struct mm_out *out, const struct mm_qkv &e)
{
	struct mm_seg a, b;
	int k = (int)w->k;

	mm_segs(w, w2, &a, &b);
	if (e.q != NULL)
		switch (nt) {
		case 1: return mmq_go<TY, TY2, 1, 2, 1, true>(st, a, b, k, xq, xd, out, e);
		case 2: return mmq_go<TY, TY2, 2, 2, 1, true>(st, a, b, k, xq, xd, out, e);
		default: return cudaErrorInvalidValue;
		}
	switch (nt) {
#define NT_CASE(N) case N: return mmq_go<TY, TY2, N, mmq_rows<N>::n>(st, a, b, k, xq, xd, out, e);
	case 1:
		if constexpr (TY == TT_Q6_KG && TY2 == 0)
			if (k >= MMQ_WIDE_K)
				return mmq_go<TY, TY2, 1, 4, 2>(st, a, b, k, xq, xd, out, e);
		if (k >= MMQ_WIDE_K)
			return mmq_go<TY, TY2, 1, 2>(st, a, b, k, xq, xd, out, e);
		return mmq_go<TY, TY2, 1, 3>(st, a, b, k, xq, xd, out, e);
	NT_CASE(2)
	}
	if constexpr (TY2 == 0)
		switch (nt) {
		NT_CASE(3) NT_CASE(4) NT_CASE(5) NT_CASE(6) NT_CASE(7) NT_CASE(8)
#undef NT_CASE
		}
	return cudaErrorInvalidValue;
}

/* As mmq_types<TY, TY2>, TY2 the type of w2 (NULL: none). */
template <int TY>
static cudaError_t
mmq_launch(int nt, cudaStream_t st, const struct cuda_weight *w, const struct cuda_weight *w2,
    const int8_t *xq, const float2 *xd, const struct mm_out *out, const struct mm_qkv &e)
{
	switch (w2 != NULL ? (int)w2->type : 0) {
	case 0: return mmq_types<TY, 0>(nt, st, w, NULL, xq, xd, out, e);
#define T2_CASE(T2) \
	case T2: \
		if constexpr (T2 != TY) /* weights of one type that follow each other are one run already */ \
			return mmq_types<TY, T2>(nt, st, w, w2, xq, xd, out, e); \
		break;
	T2_CASE(TT_Q4_K) T2_CASE(TT_Q6_KG) T2_CASE(TT_Q8_0)
#undef T2_CASE
	}
	return cudaErrorInvalidValue;
}

/* The n_tok rows of x (k wide) into m->xq / m->xd, unless they are there already. */
static int
quantize_x(struct cuda_mm *m, const float *x, int ldx, int k, int n_tok, char *err)
{
	dim3 grid((unsigned)((k / 32 + Q8_WARPS - 1) / Q8_WARPS), (unsigned)n_tok);

	if (m->xq_ready)
		return 0;
	CK(cuda_launch(quant_q8_kernel, dim3(grid), dim3(Q8_WARPS * WARP), 0, m->stream, x, ldx, k,
	    (const int32_t *)NULL, 1, m->xq, m->xd));
	m->xq_ready = 1;
	return 0;
}

int
cuda_quant_rows(struct cuda_mm *m, const float *x, int ldx, int k, const int32_t *rows, int div, int n_rows,
    char *err)
{
	dim3 grid((unsigned)((k / 32 + Q8_WARPS - 1) / Q8_WARPS), (unsigned)n_rows);

	CK(cuda_launch(quant_q8_kernel, dim3(grid), dim3(Q8_WARPS * WARP), 0, m->stream, x, ldx, k, rows, div, m->xq,
	    m->xd));
	return 0;
}

/*
 * Matrix-vector kernels over groups of MMV_TOKENS tokens for w (the rows of
 * every output of out, stored one after the other), then w2 (NULL: none;
 * else of another type for the integer kernel, whose rows follow w's in
 * out, and at most MMQ_PAIR_TOKENS tokens); the integer kernel's rows to
 * e where e.q is set.
 */
static int
matvec(struct cuda_mm *m, const struct cuda_weight *w, const struct cuda_weight *w2, const float *x, int ldx,
    int n_tok, const struct mm_out *out, const struct mm_qkv &e, char *err)
{
	int q = cuda_matmul_int8(m, w), rc;

	if (q && (rc = quantize_x(m, x, ldx, (int)w->k, n_tok, err)) != 0)
		return rc;
	for (int t = 0; t < n_tok; t += MMV_TOKENS) {
		int nt = MIN(MMV_TOKENS, n_tok - t);
		const float *xt = x + (size_t)t * ldx;
		const int8_t *xq = m->xq + (size_t)t * 2 * w->k;
		const float2 *xd = m->xd + (size_t)t * (w->k / 32);
		struct mm_out o = *out;

		for (int i = 0; i < o.n; i++)
			o.y[i] += (size_t)t * o.ldy[i];
		switch (q ? -(int)w->type - 1 : (int)w->type) {
#define TY_CASE(TY) case TY: CK(mmv_launch<TY>(nt, m->stream, w, xt, ldx, &o)); break;
		DEQ_TYPES(TY_CASE)
#undef TY_CASE
#define TQ_CASE(TY) case -TY - 1: CK(mmq_launch<TY>(nt, m->stream, w, w2, xq, xd, &o, e)); break;
		TQ_CASE(TT_Q4_K) TQ_CASE(TT_Q6_KG) TQ_CASE(TT_Q8_0) TQ_CASE(TT_MXFP4G)
#undef TQ_CASE
		default:
			return err_set(err, ERR_UNSUPPORTED, "no GPU kernel for weight type %u", w->type);
		}
	}
	return 0;
}

/*
 * The slot kernel of the integer type TY, shaped as the one-token kernel
 * for rows of k, except Q4_K rows of up to 32 chunks: runs of 4 or 8 lanes,
 * 2 rows each, a run's chunks loaded at once, made qwen3-30b-a3b's step of
 * one token 1-3 % faster on an H100 (its gate/up and down: every lane
 * busy, where 12 of 32 took a row of 768); the same for MXFP4 rows of
 * 2,880 (gpt-oss) and for Q6_K was slower (tests/bench/RESULTS.md).
 */
template <int TY, int R, int KS, int LS = WARP, int U = 1>
static cudaError_t
mmq_slot_go(cudaStream_t st, const struct cuda_weight *w, int n_slots, const int8_t *xq, const float2 *xd,
    const struct mm_out *out, const struct mm_slots &sl)
{
	struct mm_seg a = { w->d, w->row_bytes, (int)w->n, 0 };
	dim3 grid((unsigned)mmq_blocks(w->n, R, KS, LS), (unsigned)n_slots), block(MMQ_WARPS * WARP);
	int k = (int)w->k;
	size_t xs = mmq_xs_bytes<TY, LS>(k);

	if constexpr (R % 2 == 0)
		if (sl.glu.on)
			return cuda_launch(mmq_slot_kernel<TY, R, KS, LS, U, true>, grid, block, xs, st, a, k, xq, xd, *out,
			    sl);
	if (sl.early)
		return cuda_launch(mmq_slot_kernel<TY, R, KS, LS, U, false, true>, grid, block, xs, st, a, k, xq, xd, *out,
		    sl);
	return cuda_launch(mmq_slot_kernel<TY, R, KS, LS, U>, grid, block, xs, st, a, k, xq, xd, *out, sl);
}

template <int TY>
static cudaError_t
mmq_slot_launch(cudaStream_t st, const struct cuda_weight *w, int n_slots, const int8_t *xq, const float2 *xd,
    const struct mm_out *out, const struct mm_slots &sl)
{
	int k = (int)w->k, nc = k / qt<TY>::n;

	if (TY == TT_Q6_KG && k >= MMQ_WIDE_K)
		return mmq_slot_go<TY, 4, 2>(st, w, n_slots, xq, xd, out, sl);
	/* qwen3-30b-a3b's experts (rows of 2,048 and 768 in Q4_K: 32 and 12 chunks) */
	if (TY == TT_Q4_K && nc <= 12)
		return mmq_slot_go<TY, 2, 1, 4, 3>(st, w, n_slots, xq, xd, out, sl);
	if (TY == TT_Q4_K && nc <= 32)
		return mmq_slot_go<TY, 2, 1, 8, 4>(st, w, n_slots, xq, xd, out, sl);
	if (k >= MMQ_WIDE_K)
		return mmq_slot_go<TY, 2, 1>(st, w, n_slots, xq, xd, out, sl);
	if (sl.glu.on) /* a gate and an up row: pairs (as fast as 3 rows on gpt-oss-20b's, 2 were 15 % slower) */
		return mmq_slot_go<TY, 4, 1>(st, w, n_slots, xq, xd, out, sl);
	return mmq_slot_go<TY, 3, 1>(st, w, n_slots, xq, xd, out, sl);
}

int
cuda_matmul_slots(struct cuda_mm *m, const struct cuda_weight *w, const float *x, int ldx, int n_in, int n_slots,
    const struct mm_slots *sl, const struct mm_out *out, int reuse_x, char *err)
{
	int q = cuda_matmul_int8(m, w), rc;
	dim3 grid((unsigned)((w->n + MMV_ROWS - 1) / MMV_ROWS), (unsigned)n_slots);

	if (sl->glu.on && !q)
		return err_set(err, ERR_UNSUPPORTED, "no integer kernel for expert weights of type %u", w->type);
	m->xq_ready = reuse_x;
	if (q && (rc = quantize_x(m, x, ldx, (int)w->k, n_in, err)) != 0)
		return rc;
	switch (q ? -(int)w->type - 1 : (int)w->type) {
#define TY_CASE(TY) \
	case TY: \
		CK(cuda_launch(mmv_slot_kernel<TY>, grid, dim3(MMV_WARPS * WARP), 0, m->stream, w->d, w->row_bytes, \
		    (int)w->k, (int)w->n, x, ldx, *out, *sl)); \
		break;
	DEQ_TYPES(TY_CASE)
#undef TY_CASE
#define TQ_CASE(TY) case -TY - 1: CK(mmq_slot_launch<TY>(m->stream, w, n_slots, m->xq, m->xd, out, *sl)); break;
	TQ_CASE(TT_Q4_K) TQ_CASE(TT_Q6_KG) TQ_CASE(TT_Q8_0) TQ_CASE(TT_MXFP4G)
#undef TQ_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "no GPU kernel for expert weights of type %u", w->type);
	}
	return 0;
}

/* The grouped integer kernel of type TY, bn (2, 4 or 8) rows a tile. */
template <int TY>
static cudaError_t
mmq_grouped_launch(cudaStream_t st, const struct cuda_weight *w, size_t stride, const int8_t *xq, const float2 *xd,
    const struct mm_out *out, const int32_t *tiles, int max_tiles, int bn)
{
	struct mm_seg a = { w->d, w->row_bytes, (int)w->n, 0 };
	dim3 block(MMQ_WARPS * WARP);
	int k = (int)w->k;

	switch (bn) {
#define BN_CASE(N) \
	case N: \
		return cuda_launch(mmq_grouped_kernel<TY, N>, dim3((unsigned)mmq_blocks(w->n, mmq_rows<N>::n, 1), \
		    (unsigned)max_tiles), block, 0, st, a, stride, k, xq, xd, *out, tiles);
	BN_CASE(2) BN_CASE(4) BN_CASE(8)
#undef BN_CASE
	}
	return cudaErrorInvalidValue;
}

int
cuda_matmul_grouped_int8(struct cuda_mm *m, const struct cuda_weight *w, size_t stride, const int32_t *tiles,
    int max_tiles, int bn, const struct mm_out *out, char *err)
{
	if (!cuda_matmul_int8(m, w))
		return err_set(err, ERR_UNSUPPORTED, "no grouped integer kernel for expert weights of type %u", w->type);
	switch (w->type) {
#define TQ_CASE(TY) case TY: CK(mmq_grouped_launch<TY>(m->stream, w, stride, m->xq, m->xd, out, tiles, max_tiles, bn)); break;
	TQ_CASE(TT_Q4_K) TQ_CASE(TT_Q6_KG) TQ_CASE(TT_Q8_0) TQ_CASE(TT_MXFP4G)
#undef TQ_CASE
	}
	return 0;
}

/* nr rows of w (of type TY) from src into out as fp16, on st: by deq32 where the type has one, else deq8. */
template <int TY>
static cudaError_t
dequant_launch(const struct cuda_weight *w, const uint8_t *src, int64_t nr, __half *out, cudaStream_t st)
{
	if constexpr (TY == TT_Q4_K || TY == TT_Q6_KG) {
		int64_t units = nr * (w->k / 32);

		return cuda_launch(deq32_kernel<TY>, dim3((unsigned)((units + ROW_THREADS - 1) / ROW_THREADS)),
		    dim3(ROW_THREADS), 0, st, src, w->row_bytes, (int)(w->k / 256), units, out);
	} else {
		int64_t chunks = nr * (w->k / 8);

		return cuda_launch(deq_f16_kernel<TY>, dim3((unsigned)((chunks + ROW_THREADS - 1) / ROW_THREADS)),
		    dim3(ROW_THREADS), 0, st, src, w->row_bytes, (int)w->k, chunks, out);
	}
}

/* Rows [r0, r0 + nr) of w into out as fp16, on st. */
static int
dequant_rows(const struct cuda_weight *w, int64_t r0, int64_t nr, __half *out, cudaStream_t st, char *err)
{
	const uint8_t *src = w->d + (size_t)r0 * w->row_bytes;

	switch (w->type) {
#define TY_CASE(TY) \
	case TY: \
		CK(dequant_launch<TY>(w, src, nr, out, st)); \
		break;
	DEQ_TYPES(TY_CASE)
#undef TY_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "no GPU kernel for weight type %u", w->type);
	}
	return 0;
}

/*
 * A product's input: x's float rows, ldx apart, and the fp16 form h that
 * the products of many tokens read. ready: that form (for few tokens, the
 * int8 form in m->xq) is made already.
 */
struct mm_in {
	const float *x;
	int ldx;
	struct cuda_h16 h;
	int ready;
};

/* x as a product's input, its fp16 form made into m's scratch (m->xh, m->xscale) unless ready. */
static struct mm_in
mm_in_of(const struct cuda_mm *m, const float *x, int ldx, int ready)
{
	return { x, ldx, { m->xh, m->xscale }, ready };
}

/* in.h from the n_tok rows of in.x (k wide), unless it is ready. */
static int
in_f16(struct cuda_mm *m, const struct mm_in &in, int k, int n_tok, char *err)
{
	return in.ready ? 0 : cuda_to_f16(in.x, in.ldx, k, n_tok, in.h, m->stream, err);
}

/*
 * 1 if cuBLAS multiplies w by a step's n_tok tokens (above m->mmv_max):
 * float weights, and quantized ones from m->blas_min tokens unless qgemm's
 * wgmma form takes them; else the tensor-core kernels (qgemm.cu, mmt.cu) do.
 */
static int
blas_takes(const struct cuda_mm *m, const struct cuda_weight *w, int n_tok)
{
	return !cuda_qgemm_type(w) || (n_tok >= m->blas_min && !cuda_qgemm_wg(m, w, n_tok));
}

/*
 * cuBLAS on fp16 tokens (in) and fp16 weights (the matrix itself, or
 * tiles of any other type converted into m->wh), float32 out.
 */
static int
gemm(struct cuda_mm *m, const struct cuda_weight *w, struct cuda_h16 in, int n_tok, float *y, int ldy, char *err)
{
	const float one = 1.0f, zero = 0.0f;
	const __half *whole = w->type == TT_F16 ? (const __half *)w->d : NULL;
	int64_t tile = whole != NULL ? w->n : MIN(w->n, m->wh_elems / w->k);
	int k = (int)w->k, rc;

	if (tile < 1)
		return err_set(err, ERR_DEVICE, "fp16 scratch too small for rows of %d", k);
	for (int64_t r0 = 0; r0 < w->n; r0 += tile) {
		int64_t nr = MIN(tile, w->n - r0);
		const __half *a = m->wh;

		if (whole != NULL)
			a = whole + (size_t)r0 * (size_t)k;
		else if ((rc = dequant_rows(w, r0, nr, m->wh, m->stream, err)) != 0)
			return rc;
		/* column-major: y^T (nr x n_tok) = (w tile, k x nr)^T . (x^T, k x n_tok) */
		CKB(cublasGemmEx(m->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n_tok, k, &one, a, CUDA_R_16F,
		    k, in.h, CUDA_R_16F, k, &zero, y + r0, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
		    CUBLAS_GEMM_DEFAULT));
	}
	CK(cuda_launch(unscale_kernel, dim3(n_tok), dim3(ROW_THREADS), 0, m->stream, y, ldy, (int)w->n, in.scale));
	return 0;
}

int
cuda_matmul_int8(const struct cuda_mm *m, const struct cuda_weight *w)
{
	return m->xq != NULL && (w->type == TT_Q4_K || w->type == TT_Q6_KG || w->type == TT_Q8_0 || w->type == TT_MXFP4G);
}

int
cuda_weight_form(uint32_t type, int64_t k, int64_t n, struct cuda_weight *w)
{
	*w = (struct cuda_weight){ NULL, cuda_gpu_type(type), k, n, 0 };
	if (!cuda_type_supported(type) || k % 8 != 0 || n < 1 || quant_row_bytes(type, k, &w->row_bytes) != 0)
		return -1;
	if (w->type == TT_Q6_KG) {
		int64_t nb = k / 256;

		w->row_bytes = (size_t)((nb + 7) / 8 * 16 + nb * Q6G_BODY);
	}
	if (w->type == TT_MXFP4G) {
		int64_t nb = k / 32;

		w->row_bytes = (size_t)((nb + 7) / 8 * 16 + nb * 16);
	}
	return 0;
}

/* A row of nb Q6_K blocks regrouped (TT_Q6_KG): each group of up to 8 is their d's, then their bodies. */
static void
q6g_row(const uint8_t *src, int64_t nb, uint8_t *dst)
{
	for (int64_t g = 0; g < nb; g += 8, dst += Q6G_GROUP) {
		memset(dst, 0, 16);
		for (int i = 0; i < 8 && g + i < nb; i++) {
			const uint8_t *b = src + (size_t)(g + i) * (Q6G_BODY + 2);

			memcpy(dst + 2 * i, b + Q6G_BODY, 2);
			memcpy(dst + 16 + Q6G_BODY * i, b, Q6G_BODY);
		}
	}
}

/* A row of nb MXFP4 blocks regrouped (TT_MXFP4G): each group of up to 8 is their scales, then their quants. */
static void
mx4g_row(const uint8_t *src, int64_t nb, uint8_t *dst)
{
	for (int64_t g = 0; g < nb; g += 8, dst += MX4G_GROUP) {
		memset(dst, 0, 16);
		for (int i = 0; i < 8 && g + i < nb; i++) {
			const uint8_t *b = src + (size_t)(g + i) * 17;

			dst[i] = b[0];
			memcpy(dst + 16 + 16 * i, b + 1, 16);
		}
	}
}

/* Host bytes a Q6_K matrix passes through, regrouped, on its way up. */
#define UPLOAD_STAGE ((size_t)16 << 20)

/* nr rows of w as stored (src, src_row bytes apart) in the GPU's form at dst. */
static void
form_rows(const struct cuda_weight *w, const uint8_t *src, size_t src_row, int64_t nr, uint8_t *dst)
{
	for (int64_t i = 0; i < nr; i++)
		if (w->type == TT_Q6_KG)
			q6g_row(src + (size_t)i * src_row, w->k / 256, dst + (size_t)i * w->row_bytes);
		else if (w->type == TT_MXFP4G)
			mx4g_row(src + (size_t)i * src_row, w->k / 32, dst + (size_t)i * w->row_bytes);
		else
			memcpy(dst + (size_t)i * w->row_bytes, src + (size_t)i * src_row, w->row_bytes);
}

void
cuda_weight_to_host(const struct cuda_weight *w, const void *src, uint8_t *dst)
{
	size_t src_row = 0;

	quant_row_bytes(w->type & 0xff, w->k, &src_row);
	form_rows(w, (const uint8_t *)src, src_row, w->n, dst);
}

/* w's rows as stored (src, src_row bytes apart) regrouped in stage, run rows at a time, and copied to dev. */
static int
upload_regrouped(const struct cuda_weight *w, const uint8_t *src, size_t src_row, uint8_t *dev, uint8_t *stage,
    int64_t run, cudaStream_t st, char *err)
{
	for (int64_t r = 0; r < w->n; r += run) {
		int64_t nr = MIN(run, w->n - r);

		form_rows(w, src + (size_t)r * src_row, src_row, nr, stage);
		CK(cudaMemcpyAsync(dev + (size_t)r * w->row_bytes, stage, (size_t)nr * w->row_bytes,
		    cudaMemcpyHostToDevice, st));
		CK(cudaStreamSynchronize(st)); /* before the stage is filled again */
	}
	return 0;
}

int
cuda_weight_upload(const struct cuda_weight *w, const void *src, uint8_t *dev, cudaStream_t st, char *err)
{
	size_t src_row = 0;
	int64_t run;
	uint8_t *stage;
	int rc;

	if (w->type != TT_Q6_KG && w->type != TT_MXFP4G) { /* the GPU reads the file's form */
		CK(cudaMemcpyAsync(dev, src, w->row_bytes * (size_t)w->n, cudaMemcpyHostToDevice, st));
		CK(cudaStreamSynchronize(st));
		return 0;
	}
	quant_row_bytes(w->type & 0xff, w->k, &src_row);
	run = MAX((int64_t)1, MIN(w->n, (int64_t)(UPLOAD_STAGE / w->row_bytes)));
	stage = (uint8_t *)xmalloc((size_t)run * w->row_bytes);
	rc = upload_regrouped(w, (const uint8_t *)src, src_row, dev, stage, run, st, err);
	free(stage);
	return rc;
}

int
cuda_weight_follows(const struct cuda_weight *a, const struct cuda_weight *b)
{
	return a->type == b->type && a->k == b->k && a->row_bytes == b->row_bytes &&
	    a->d + (size_t)a->n * a->row_bytes == b->d;
}

/*
 * Weights [i, j) of w that the kernel of one launch multiplies together
 * (w[i] and those stored right after it, of its type and width, so that
 * whichever kernel takes w[i] takes them), as one weight in *all, their
 * outputs appended to out; returns j.
 */
static int
run_of(const struct cuda_weight *const *w, int n_w, int i, float *const *y, const int *ldy, struct mm_out *out,
    struct cuda_weight *all)
{
	int j = i, rows = out->start[out->n];

	*all = *w[i];
	all->n = 0;
	for (; j < n_w && (j == i || cuda_weight_follows(w[j - 1], w[j])); j++) {
		out->y[out->n] = y[j];
		out->ldy[out->n] = ldy[j];
		out->start[out->n++] = rows;
		rows += (int)w[j]->n;
		all->n += w[j]->n;
	}
	out->start[out->n] = rows;
	return j;
}

/*
 * 1 if the rows of a (a run of weights) and b (of the same type or
 * another) can be one launch for n_tok tokens: on the integer kernel up to
 * MMQ_PAIR_TOKENS, on mmt.cu's above the matrix-vector count.
 */
static int
pairs(const struct cuda_mm *m, const struct cuda_weight *a, const struct cuda_weight *b, int n_tok)
{
	if (n_tok > m->mmv_max)
		return cuda_mmt_fits(m, a, n_tok) && cuda_mmt_fits(m, b, n_tok);
	return n_tok <= MMQ_PAIR_TOKENS && cuda_matmul_int8(m, a) && cuda_matmul_int8(m, b);
}

/*
 * The products of n_w weights of one input: runs of weights
 * stored one after the other go to one kernel on the matrix-vector and
 * tensor-core paths, and on the integer path, for up to MMQ_PAIR_TOKENS
 * tokens, and on mmt.cu's, two runs of different types to one launch; the
 * rest to cuBLAS one by one. The integer and mmt.cu kernels' rows go to e
 * where e.q is set.
 */
static int
products(struct cuda_mm *m, const struct cuda_weight *const *w, int n_w, struct mm_in in, int n_tok,
    float *const *y, const int *ldy, const struct mm_qkv &e, char *err)
{
	int many = n_tok > m->mmv_max, rc;

	m->xq_ready = in.ready && !many;
	for (int i = 0; i < n_w;) {
		struct mm_out out = { { NULL }, { 0 }, { 0 }, 0 };
		struct cuda_weight all, second;
		const struct cuda_weight *w2 = NULL; /* &second when a run of another type shares the launch */
		int j;

		if (many && (rc = in_f16(m, in, (int)w[i]->k, n_tok, err)) != 0)
			return rc;
		in.ready |= many;
		if (many && blas_takes(m, w[i], n_tok)) {
			if ((rc = gemm(m, w[i], in.h, n_tok, y[i], ldy[i], err)) != 0)
				return rc;
			i++;
			continue;
		}
		j = run_of(w, n_w, i, y, ldy, &out, &all);
		if (j < n_w && w[j]->type != w[i]->type && pairs(m, &all, w[j], n_tok)) {
			j = run_of(w, n_w, j, y, ldy, &out, &second);
			w2 = &second;
		}
		if (many)
			rc = cuda_mmt_fits(m, &all, n_tok) ? cuda_mmt(m, &all, w2, in.h, n_tok, &out, e, err) :
							    cuda_qgemm(m, &all, in.h, n_tok, &out, err);
		else
			rc = matvec(m, &all, w2, in.x, in.ldx, n_tok, &out, e, err);
		if (rc != 0)
			return rc;
		i = j;
	}
	return 0;
}

int
cuda_matmul(struct cuda_mm *m, const struct cuda_weight *w, const float *x, int ldx, int n_tok,
    float *y, int ldy, int reuse_x, char *err)
{
	const struct cuda_weight *ws[1] = { w };
	float *ys[1] = { y };

	return products(m, ws, 1, mm_in_of(m, x, ldx, reuse_x), n_tok, ys, &ldy, no_qkv, err);
}

int
cuda_matmul_multi(struct cuda_mm *m, const struct cuda_weight *const *w, int n_w, const float *x,
    int ldx, int n_tok, float *const *y, const int *ldy, int reuse_x, char *err)
{

	if (n_w < 1 || n_w > MM_MAX_OUT)
		return err_set(err, ERR_INVAL, "%d weights in one product (1..%d)", n_w, MM_MAX_OUT);
	return products(m, w, n_w, mm_in_of(m, x, ldx, reuse_x), n_tok, y, ldy, no_qkv, err);
}

/*
 * 1 if products() would give gate and up (stored one after the other, as
 * one weight: all) at n_tok tokens to one whole launch of the wgmma form:
 * not cuBLAS, not mmt.cu's, K unsplit.
 */
static int
glu_route(const struct cuda_mm *m, const struct cuda_weight *gate, const struct cuda_weight *up, int n_tok,
    struct cuda_weight *all)
{
	if (!cuda_weight_follows(gate, up) || gate->n != up->n)
		return 0;
	*all = *gate;
	all->n = gate->n + up->n;
	return n_tok > m->mmv_max && !blas_takes(m, all, n_tok) && !cuda_mmt_fits(m, all, n_tok) &&
	    cuda_qgemm_glu_whole(m, all, n_tok);
}

int
cuda_matmul_glu_fits(const struct cuda_mm *m, const struct cuda_weight *gate, const struct cuda_weight *up,
    int n_tok)
{
	struct cuda_weight all;

	return glu_route(m, gate, up, n_tok, &all);
}

int
cuda_matmul_glu(struct cuda_mm *m, const struct cuda_weight *gate, const struct cuda_weight *up, const float *x,
    int ldx, int n_tok, const struct cuda_glu16 *g, int reuse_x, char *err)
{
	struct mm_in in = mm_in_of(m, x, ldx, reuse_x);
	struct cuda_weight all;
	int rc;

	if (!glu_route(m, gate, up, n_tok, &all))
		return err_set(err, ERR_UNSUPPORTED, "cuda_matmul_glu: weights or a token count it does not serve");
	if ((rc = in_f16(m, in, (int)gate->k, n_tok, err)) != 0)
		return rc;
	return cuda_qgemm_glu(m, &all, in.h, n_tok, g, err);
}

int
cuda_matmul_h16(struct cuda_mm *m, const struct cuda_weight *w, struct cuda_h16 h, int n_tok, float *y, int ldy,
    char *err)
{
	const struct cuda_weight *ws[1] = { w };
	float *ys[1] = { y };
	struct mm_in in = { NULL, (int)w->k, h, 1 };

	if (n_tok <= m->mmv_max)
		return err_set(err, ERR_INVAL, "cuda_matmul_h16: %d tokens take the matrix-vector kernels", n_tok);
	return products(m, ws, 1, in, n_tok, ys, &ldy, no_qkv, err);
}

int
cuda_matmul_qkv_fits(const struct cuda_mm *m, const struct cuda_weight *const *w, int n_tok,
    const struct cuda_heads *hd, const struct cuda_kv *kv)
{
	int types = pairs(m, w[0], w[2], n_tok); /* Q/K's kernel takes V's rows too, whatever its type */
	int one_launch = cuda_weight_follows(w[0], w[1]) &&
	    (cuda_weight_follows(w[1], w[2]) || w[2]->type != w[1]->type);
	int64_t nq = (int64_t)hd->n_head * hd->head_dim, nkv = (int64_t)hd->n_head_kv * hd->head_dim;
	/* qkv_pair_of finds q, k and v by their row counts: any other shape would store outside them */
	int shape = w[0]->n == nq && w[1]->n == nkv && w[2]->n == nkv;

	return n_tok >= 1 && n_tok < m->blas_min && types && one_launch && shape && !hd->neox && hd->q_norm == NULL &&
	    hd->k_norm == NULL && !kv->f32 && !kv->q8;
}

int
cuda_matmul_qkv(struct cuda_mm *m, const struct cuda_weight *const *w, const float *x, int ldx, int n_tok,
    float *q, const struct cuda_heads *hd, const struct cuda_kv *kv, int reuse_x, char *err)
{
	struct mm_qkv e = { *hd, *kv, q };
	float *y[3] = { q, q, q }; /* unused: e takes the rows */
	int ld[3] = { 0, 0, 0 };

	if (!cuda_matmul_qkv_fits(m, w, n_tok, hd, kv))
		return err_set(err, ERR_UNSUPPORTED, "cuda_matmul_qkv: weights, heads or pool it does not serve");
	return products(m, w, 3, mm_in_of(m, x, ldx, reuse_x), n_tok, y, ld, e, err);
}

int
cuda_embed(const struct cuda_weight *w, const int32_t *tokens, int n_tok, float scale, float *out,
    cudaStream_t st, char *err)
{
	switch (w->type) {
#define TY_CASE(TY) \
	case TY: \
		CK(cuda_launch(embed_kernel<TY>, dim3(n_tok), dim3(ROW_THREADS), 0, st, w->d, w->row_bytes, \
		    (int)w->k, tokens, scale, out)); \
		break;
	DEQ_TYPES(TY_CASE)
#undef TY_CASE
	default:
		return err_set(err, ERR_UNSUPPORTED, "no GPU kernel for weight type %u", w->type);
	}
	return 0;
}

int64_t
cuda_matmul_tile_elems(const struct cuda_mm *m, const struct cuda_weight *w, int max_tokens)
{
	/* quantized weights first reach cuBLAS at blas_min tokens, if at all: the routing decides from there on */
	int blas = cuda_qgemm_type(w) ? max_tokens >= m->blas_min && blas_takes(m, w, m->blas_min) : w->type != TT_F16;

	return blas ? MIN(w->n * w->k, MAX(WTILE_ELEMS, w->k)) : 0;
}

