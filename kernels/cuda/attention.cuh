/*
 * attention.cuh: the per-head half of attention over the paged KV pool:
 * biases, QK norm, RoPE and the K/V write (cuda_qk), then softmax(q.K) V
 * over each token's visible positions (cuda_attention). Host entry points.
 */
#ifndef RESIDENT_CUDA_ATTENTION_CUH
#define RESIDENT_CUDA_ATTENTION_CUH

#include "cuda_common.cuh"
#include "norm.cuh"

/*
 * The KV pool, fp16 (or fp32 with f32, the exact mode):
 * [block][layer][K|V][KV_BLOCK_TOKENS][n_head_kv * head_dim], and where
 * this step's tokens sit in it: token t is at position tok_pos[t] of the
 * sequence whose block table starts at tables + tok_tab[t].
 *
 * With q8 (KV_Q8_0) a block's K (or V) of one layer is KV_BLOCK_TOKENS
 * rows of n_head_kv * head_dim int8, then as many rows of a float scale
 * for each 32 of them (a head's row is whole groups): a value is q * d,
 * d = max |x| / 127 of its group, as the CPU's q8_0 cache. The kernels
 * copy such rows into shared memory as they are; the decode kernel reads
 * the levels there, the prefill kernel widens them to fp16 for its
 * tensor cores.
 */
struct cuda_kv {
	void *pool;        /* __half, float with f32, int8 and scales with q8 */
	size_t kv_stride;  /* elements of one block's K (or V) of one layer; bytes with q8 */
	int n_layer, layer;
	const int32_t *tok_pos, *tok_tab, *tables;
	/*
	 * Scratch of split attention: part_rows rows of head_dim + 2 floats
	 * (one per token, head and split). NULL: each (token, head) in one piece.
	 */
	float *part;
	int64_t part_rows;
	int f32;           /* exact mode: floats in the pool (unless q8) and in the tiles */
	int q8;            /* the pool holds q8_0 rows (above) */
	/*
	 * Prefill on the tensor cores (flash.cu): fa_tiles[0] tiles follow,
	 * each FLASH_TILE(first token, tokens) of one sequence's new tokens,
	 * and fa_tok[t] is 1 for every token they cover (the split kernel
	 * leaves those out). fa_grid, fixed for a step's shape, bounds
	 * fa_tiles[0]. fa_tiles NULL: every token goes to the split kernel.
	 */
	const int32_t *fa_tiles, *fa_tok;
	int fa_grid;
	/*
	 * Bounds the pieces a context is split in (no fewer than
	 * ATT_SPLIT_MIN positions each): at least the step's longest sequence,
	 * or no less than the pieces cuda_attention_splits allows times
	 * ATT_SPLIT_MIN. Fixed for a step's shape, like fa_grid, so that a
	 * graph serves every step under it.
	 */
	int max_len;
	/*
	 * NULL, or for each token the last position of its sequence when it
	 * attends bidirectionally (fwd_seq.bidir: every position of the
	 * sequence, a sliding-window layer those at most window / 2 away
	 * either side; the split kernel's, never a prefill tile's), -1 for a
	 * causal one.
	 */
	const int32_t *tok_end;
	/*
	 * NULL, or for a decode step (each token its sequence's only one, no
	 * prefill tiles) its tokens' K and V rows as the product left them
	 * (n_head_kv heads a token), their q likewise: cuda_attention does
	 * cuda_qk's work itself (the biases, the QK norm, the rotation and the
	 * K/V write; one launch a layer less) and cuda_qk is not run.
	 */
	const float *k_new, *v_new;
	/*
	 * > 0: the tokens the prefill tiles leave go to flash.cu's decode
	 * kernel (the query heads of a KV head as the rows of the tensor
	 * cores' tiles) instead of the split kernel, and dec_tc is how many of
	 * its blocks a multiprocessor holds (cuda_flash_decode_blocks, worked
	 * out once): fp16 or q8 pool, not exact mode, no tok_end, k_new only
	 * where a KV head's query heads fit one block's FD_ROWS rows.
	 */
	int dec_tc;
	/*
	 * The device's multiprocessors, and how many blocks of the split
	 * kernel's wide form a multiprocessor holds (cuda_attention_wide_blocks;
	 * 0: that form does not serve the heads or does not fit): worked out
	 * once, not asked of the driver at every launch.
	 */
	int sms, wide;
};

/*
 * Bytes of one token's K (or V) row of every KV head (nkv values) in the
 * pool: fp16, fp32 in exact mode, with q8 int8 and a float scale a 32.
 */
static inline size_t
kv_row_size(size_t nkv, int exact, int q8)
{
	return q8 ? nkv + nkv / 32 * sizeof(float) : nkv * (exact ? sizeof(float) : sizeof(__half));
}

/* Fewest positions in one piece of a split context, and most pieces. */
#define ATT_SPLIT_MIN 128
#define ATT_MAX_SPLITS 64

/* A prefill tile of n (1..64) tokens from token t0 of the step, and its parts. */
#define FLASH_TILE(t0, n) ((t0) << 7 | (n))
#define FLASH_T0(x) ((x) >> 7)
#define FLASH_N(x) ((x) & 127)
/* Query rows of one tile: its tokens times the query heads of a KV head. */
#define FLASH_ROWS 64
/*
 * Sequences with at least this many new tokens in a step go to the
 * tensor-core kernel. Fewer were tried (2: a sequence's guesses, its K and
 * V rows read once for all of them): sixteen Gemma 3 270M sequences of 4
 * guesses at depth ~1,700 took 1.88 ms a step where they took 1.97, but
 * one sequence of 7 took 1.09 ms where it took 0.98 (its one tile in 14
 * pieces against the split kernel's 112 blocks), H200.
 */
#define FLASH_MIN_TOKENS 16
/* Query rows of a block of the tensor-core decode kernel: query heads of one KV head. */
#define FD_ROWS 16

/* Elements (bytes in a q8 pool) from one pool block to the next. */
static __device__ __forceinline__ size_t
kv_block_stride(const struct cuda_kv &kv)
{
	return (size_t)kv.n_layer * 2 * kv.kv_stride;
}

/*
 * Position p's row within its pool block, from the block's row 0 of its
 * layer's K or V: in 32 bits, since load refuses a pool block of more
 * than 2^32 elements, and a 64-bit offset costs a tile's copies twice
 * the instructions.
 */
static __device__ __forceinline__ uint32_t
kv_in_block(int p, int nkv)
{
	return (uint32_t)p % KV_BLOCK_TOKENS * (uint32_t)nkv;
}

/* Element e of position p's K (kvsel 0) or V (kvsel 1) in the pool, head offset head_off, p in pool block blk. */
static __device__ __forceinline__ size_t
kv_at(const struct cuda_kv &kv, size_t blk, int p, int kvsel, int nkv, int head_off)
{
	return blk * kv_block_stride(kv) + ((size_t)kv.layer * 2 + (size_t)kvsel) * kv.kv_stride + kv_in_block(p, nkv) +
	    (size_t)head_off;
}

/* kv_at for the pool block the sequence's block table tab gives position p. */
static __device__ __forceinline__ size_t
kv_index(const struct cuda_kv &kv, const int32_t *tab, int p, int kvsel, int nkv, int head_off)
{
	return kv_at(kv, (size_t)tab[p / KV_BLOCK_TOKENS], p, kvsel, nkv, head_off);
}

/* Position p's scales within its pool block, from the block's first scale of its layer's K or V (32 bits, as kv_in_block). */
static __device__ __forceinline__ uint32_t
kv_scale_in_block(int p, int nkv)
{
	return (uint32_t)p % KV_BLOCK_TOKENS * ((uint32_t)nkv / 32 * (uint32_t)sizeof(float));
}

/*
 * A q8 pool's byte offset of the scale of element head_off of position p
 * (a multiple of 32: its group's first), p in pool block blk.
 */
static __device__ __forceinline__ size_t
kv_scale_at(const struct cuda_kv &kv, size_t blk, int p, int kvsel, int nkv, int head_off)
{
	return kv_at(kv, blk, 0, kvsel, nkv, 0) + (size_t)KV_BLOCK_TOKENS * (size_t)nkv + kv_scale_in_block(p, nkv) +
	    (size_t)(head_off / 32) * sizeof(float);
}

/* kv_scale_at for the pool block the sequence's block table tab gives position p. */
static __device__ __forceinline__ size_t
kv_scale_index(const struct cuda_kv &kv, const int32_t *tab, int p, int kvsel, int nkv, int head_off)
{
	return kv_scale_at(kv, (size_t)tab[p / KV_BLOCK_TOKENS], p, kvsel, nkv, head_off);
}

/*
 * The four signed bytes of w (a q8 pool's levels, lowest first) as floats:
 * each byte, biased by 128, in the low bits of the float 2^23, less
 * 2^23 + 128 (a byte permute and an add, where the conversion instruction
 * runs at an eighth of the adds' rate).
 */
static __device__ __forceinline__ void
i8x4_float(uint32_t w, float *f)
{
	uint32_t u = w ^ 0x80808080u;

#pragma unroll
	for (int k = 0; k < 4; k++)
		f[k] = __int_as_float((int)__byte_perm(u, 0x4B000000u, 0x7650u | (unsigned)k)) - 8388736.0f;
}

/*
 * A warp's 32 values of one q8 group (lane's x) quantized as the CPU's
 * q8_0 cache does (cpu_q8.c's quantize32): lane's level into *q, the
 * scale into *d by lane 0. Returns x as the pool gives it back (q * d);
 * a group with a value that is not finite reads back as NaN.
 */
static __device__ __forceinline__ float
kv_q8_put(float x, int8_t *q, float *d)
{
	float amax = warp_max(fabsf(x)), s = amax / 127.0f, id = s != 0.0f ? 1.0f / s : 0.0f, r = rintf(x * id);

	if (__any_sync(FULL_MASK, !isfinite(x)))
		s = __int_as_float(0x7fc00000), r = 0.0f;
	*q = (int8_t)r;
	if (threadIdx.x % WARP == 0)
		*d = s;
	return r * s;
}

/* One layer's heads. */
struct cuda_heads {
	int n_head, n_head_kv, head_dim;
	const float *bq, *bk, *bv;      /* or NULL */
	const float *q_norm, *k_norm;   /* or NULL */
	struct cuda_norm nm;
	const float *inv_freq;          /* head_dim / 2 RoPE frequencies of this layer */
	float pos_div;                  /* positions are divided by it (linear RoPE scaling) */
	int neox;                       /* pairs (i, i + d/2) instead of (2i, 2i + 1) */
	float scale;                    /* of q.k */
	int window;                     /* sliding window; 0: none */
	const float *sinks;             /* a logit per head that joins its softmax with no value; or NULL */
};

/*
 * What a head's weighted values are multiplied by at the end of a softmax
 * whose scores had the largest m and summed l (as e^(score - m), or with
 * base2 2^(score - m) of scores in log2 units): 1 / l, or, with head h's
 * attention sink in the softmax, its share taken out.
 */
static __device__ __forceinline__ float
softmax_norm(float m, float l, const float *sinks, int h, bool base2 = false)
{
	float s, top, f;

	if (sinks == NULL)
		return 1.0f / l;
	s = base2 ? sinks[h] * 1.4426950408889634f : sinks[h], top = fmaxf(m, s);
	f = base2 ? exp2f(m - top) : expf(m - top);
	return f / (l * f + (base2 ? exp2f(s - top) : expf(s - top)));
}

/*
 * Dimension d of head h of token t, o its weighted values, m and l its
 * softmax's max (natural log) and sum: normalized into out, with its int8
 * form into q8 if q8.q and its fp16 form into h16 if h16.h; or, with
 * n_split pieces, into split's piece in part, m and l beside it (what
 * attn_merge_kernel reads). Whole warps call it, 32 dimensions of one head
 * a warp.
 */
template <int D>
static __device__ __forceinline__ void
attn_out(float o, int t, int h, int d, int split, int n_split, float m, float l, const struct cuda_heads &hp,
    float *out, struct cuda_q8 q8, struct cuda_h16 h16, float *part)
{
	size_t row = (size_t)t * hp.n_head + h;

	if (n_split > 1) {
		float *pr = part + (row * n_split + split) * (D + 2);

		pr[d] = o;
		if (d == 0)
			pr[D] = m, pr[D + 1] = l;
		return;
	}
	o *= softmax_norm(m, l, hp.sinks, h);
	out[row * D + d] = o;
	if (q8.q != NULL)
		q8_store1(q8, t, hp.n_head * D, h * D + d, o);
	if (h16.h != NULL)
		f16_store1(h16, t, row * D + d, h + d == 0, o);
}

/*
 * Dimension pair (a, b) rotated (RoPE) by the angle whose cosine and sine
 * are co and si: the position times the pair's frequency. Callers work
 * them out before they wait, since positions are staged before a step's
 * first kernel: the sine and cosine are a chain of dependent instructions.
 */
static __device__ __forceinline__ void
rope_pair(float &a, float &b, float co, float si)
{
	float x0 = a * co - b * si;

	b = a * si + b * co;
	a = x0;
}

/*
 * What a lane of a warp that rotates one head reads besides the head
 * itself, for its NP rotation pairs u (dimensions ia[u] and ib[u]; those
 * past head_dim / 2 unused): the bias, the norm weights plus the norm's
 * offset, the rotation's cosine and sine at the token's position. They
 * are weights and positions, so kernels load them before pdl_wait: a
 * layer's norm weights are no longer in L2 a token later, and read after
 * the wait they held the one-token attention kernel's new-token phase at
 * 6,571 cycles (3,027 read before it; H100).
 */
template <int NP>
struct qk_lane {
	float ba[NP], bb[NP], na[NP], nb[NP], co[NP], si[NP];
	int ia[NP], ib[NP];
	bool biased, normed;
};

/*
 * The calling lane's qk_lane of a head with bias (or NULL) and norm
 * weights nw (or NULL), rotated to position pos (a token's position over
 * cuda_heads.pos_div).
 */
template <int NP>
static __device__ __forceinline__ void
qk_lane_load(qk_lane<NP> &c, const float *bias, const float *nw, const struct cuda_heads &hp, float pos)
{
	int half = hp.head_dim / 2, lane = threadIdx.x % WARP;

	c.biased = bias != NULL, c.normed = nw != NULL;
#pragma unroll
	for (int u = 0; u < NP; u++) {
		int i = lane + WARP * u;

		c.ia[u] = hp.neox ? i : 2 * i;
		c.ib[u] = hp.neox ? i + half : 2 * i + 1;
		c.ba[u] = c.bb[u] = c.na[u] = c.nb[u] = c.si[u] = 0.0f, c.co[u] = 1.0f;
		if (i >= half)
			continue;
		if (bias != NULL)
			c.ba[u] = bias[c.ia[u]], c.bb[u] = bias[c.ib[u]];
		if (nw != NULL)
			c.na[u] = nw[c.ia[u]] + hp.nm.offset, c.nb[u] = nw[c.ib[u]] + hp.nm.offset;
		c.co[u] = cosf(pos * hp.inv_freq[i]), c.si[u] = sinf(pos * hp.inv_freq[i]);
	}
}

/*
 * The calling lane's rotation pairs of one head of vec (head_dim wide),
 * with c's bias added, RMS-normed by c's weights if it has them, rotated
 * to c's position: pair u into a[u] and b[u] (those past head_dim / 2 are
 * left 0). The whole warp calls it.
 */
template <int NP>
static __device__ __forceinline__ void
qk_head(const float *vec, const qk_lane<NP> &c, const struct cuda_heads &hp, float *a, float *b)
{
	int half = hp.head_dim / 2, lane = threadIdx.x % WARP;
	float ss = 0.0f;

#pragma unroll
	for (int u = 0; u < NP; u++) {
		a[u] = b[u] = 0.0f;
		if (lane + WARP * u >= half)
			continue;
		a[u] = vec[c.ia[u]];
		b[u] = vec[c.ib[u]];
		if (c.biased)
			a[u] += c.ba[u], b[u] += c.bb[u];
		ss += a[u] * a[u] + b[u] * b[u];
	}
	if (c.normed) {
		float sc = 1.0f / sqrtf(warp_sum(ss) / (float)hp.head_dim + hp.nm.eps);

#pragma unroll
		for (int u = 0; u < NP; u++)
			a[u] = a[u] * sc * c.na[u], b[u] = b[u] * sc * c.nb[u];
	}
#pragma unroll
	for (int u = 0; u < NP; u++)
		if (lane + WARP * u < half)
			rope_pair(a[u], b[u], c.co[u], c.si[u]);
}

/*
 * The new K row of a head (k_row) with c's bias, normed and rotated as
 * qk_head does, into kn as D floats: the new row that the attention
 * kernels take into their tile and store in the pool. The whole warp
 * calls it.
 */
template <int D, int NP>
static __device__ __forceinline__ void
qk_new_k(float *kn, const float *k_row, const qk_lane<NP> &c, const struct cuda_heads &hp)
{
	int lane = threadIdx.x % WARP;
	float a[NP], b[NP];

	qk_head(k_row, c, hp, a, b);
#pragma unroll
	for (int u = 0; u < NP; u++)
		if (lane + WARP * u < D / 2)
			kn[c.ia[u]] = a[u], kn[c.ib[u]] = b[u];
}

/* x as a pool element of type T. */
template <typename T>
static __device__ __forceinline__ T
kv_elem(float x)
{
	if constexpr (sizeof(T) == sizeof(float))
		return x;
	else
		return __float2half_rn(x);
}

/*
 * Stores one head's new K and V rows (kn: K, then V, d floats each) into a
 * pool of T at ko and vo, the block's threads step apart.
 */
template <typename T>
static __device__ __forceinline__ void
kv_put_rows(T *pool, size_t ko, size_t vo, const float *kn, int d, int step)
{
	for (int i = threadIdx.x; i < d; i += step)
		pool[ko + i] = kv_elem<T>(kn[i]), pool[vo + i] = kv_elem<T>(kn[d + i]);
}

/*
 * Stores one head's row of a q8 pool (the K or V row kvsel of position pos),
 * the warp's lanes reading x (head_dim floats) 32 apart.
 */
static __device__ __forceinline__ void
kv_q8_row(const float *x, const struct cuda_kv &kv, const int32_t *tab, int pos, int kvsel, int nkv, int off, int d)
{
	int8_t *pool = (int8_t *)kv.pool;
	size_t qo = kv_index(kv, tab, pos, kvsel, nkv, off), so = kv_scale_index(kv, tab, pos, kvsel, nkv, off);

	for (int g = 0; g < d; g += WARP)
		kv_q8_put(x[g + threadIdx.x % WARP], pool + qo + g + threadIdx.x % WARP,
		    (float *)(pool + so) + g / WARP);
}

/*
 * Where rows o and o + 1 (o even) of token t's Q/K/V product (the n_head
 * q heads, then the n_head_kv k heads, then v) go as cuda_qk leaves them,
 * for heads whose pairs are neighbouring dimensions and that have no QK
 * norm (cuda_matmul_qkv_fits): q rotated into q (n_head * head_dim floats
 * a token), k rotated and v into the fp16 pool at the token's position,
 * with their biases. Worked out from the weights and the step's staged
 * input before the product's sums are, so that storing them waits on no
 * load.
 */
struct qkv_pair {
	void *dst;            /* two floats of q, or two fp16 of the pool */
	float co, si, ba, bb; /* the rotation's cosine and sine, the rows' biases (0: none) */
	int kind;             /* 0 q, 1 k, 2 v */
};

static __device__ __forceinline__ struct qkv_pair
qkv_pair_of(const struct cuda_heads &hp, const struct cuda_kv &kv, float *q, int o, int t)
{
	int d = hp.head_dim, nq = hp.n_head * d, nkv = hp.n_head_kv * d, p = kv.tok_pos[t];
	int kind = o < nq ? 0 : o < nq + nkv ? 1 : 2, r = o - (kind == 0 ? 0 : kind == 1 ? nq : nq + nkv);
	const float *bias = kind == 0 ? hp.bq : kind == 1 ? hp.bk : hp.bv;
	struct qkv_pair e;

	e.kind = kind;
	e.ba = bias != NULL ? bias[r] : 0.0f;
	e.bb = bias != NULL ? bias[r + 1] : 0.0f;
	e.co = 1.0f, e.si = 0.0f;
	if (kind < 2) {
		float ang = (float)p / hp.pos_div * hp.inv_freq[r % d / 2];

		e.co = cosf(ang), e.si = sinf(ang);
	}
	if (kind == 0)
		e.dst = q + (size_t)t * nq + r;
	else
		e.dst = (__half *)kv.pool + kv_index(kv, kv.tables + kv.tok_tab[t], p, kind - 1, nkv, r);
	return e;
}

/* Rows a and b stored as e says. */
static __device__ __forceinline__ void
qkv_pair_store(const struct qkv_pair &e, float a, float b)
{
	a += e.ba, b += e.bb;
	if (e.kind < 2)
		rope_pair(a, b, e.co, e.si);
	if (e.kind == 0)
		*(float2 *)e.dst = make_float2(a, b);
	else
		*(__half2 *)e.dst = __floats2half2_rn(a, b);
}

/*
 * For n_tok tokens: q (n_head heads) and k, v (n_head_kv heads) get their
 * biases; q and k their norms and rotation (in place); k and v are stored
 * into the pool at each token's position.
 */
int cuda_qk(float *q, float *k, const float *v, int n_tok, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err);

/*
 * out[t][h] = softmax(scale * q[t][h] . K) V over the positions token t
 * sees. When few (token, KV head) pairs would leave the GPU idle, each
 * token's positions are split into pieces done by separate blocks and
 * merged after (kv->part holds the pieces). With q8.q, out's int8 form
 * (cuda_q8, rows of n_head * head_dim) goes there too, for the integer
 * kernels of the output product; with h16.h its fp16 form (cuda_h16, each
 * row's divisor 1: a mean of the fp16 pool's values never overflows fp16;
 * not from an fp32 pool), for the tensor-core ones. No int8 form with
 * prefill tiles (kv->fa_tiles), whose kernel splits as the other tokens'.
 */
int cuda_attention(const float *q, float *out, struct cuda_q8 q8, struct cuda_h16 h16, int n_tok,
    const struct cuda_heads *hd, const struct cuda_kv *kv, cudaStream_t st, char *err);

/*
 * Readies cuda_attention for head_dim on the current device: raises its
 * kernels' shared-memory limits, once, before any launch (launches never
 * set attributes: a call per layer and step costs time, and graph capture
 * must not meet one).
 */
int cuda_attention_setup(int head_dim, char *err);

/*
 * How many blocks of the split kernel's wide form (16 warps) for head_dim
 * and the pool (q8, else f32, else fp16) a multiprocessor of the current
 * device holds, at most the two it is launched for; 0 where that form
 * does not serve head_dim or its shared memory does not fit (cuda_kv.wide).
 */
int cuda_attention_wide_blocks(int head_dim, int q8, int f32, int *per_sm, char *err);

/*
 * The most pieces cuda_attention splits a context into for a step of
 * n_tok tokens of these heads (kv's sms, part, part_rows and dec_tc),
 * however long the context: it takes fewer only where kv->max_len has
 * fewer pieces of ATT_SPLIT_MIN.
 */
int cuda_attention_splits(int n_tok, const struct cuda_heads *hd, const struct cuda_kv *kv);

/* Rows of kv->part that let cuda_attention split as much as it wants on this device. */
int64_t cuda_attention_part_rows(int device);

/*
 * 1 if the tensor-core prefill kernel serves these heads (fp16 pool, a
 * group of query heads per KV head that divides FLASH_ROWS); *tile_tokens
 * gets the tokens of one tile.
 */
int cuda_flash_usable(const struct cuda_heads *hd, int f32, int *tile_tokens);

/*
 * The prefill tiles of kv (fa_tiles), on st, each in n_split pieces (> 1:
 * into kv->part for attn_merge_kernel, else into out and h16's fp16 form
 * if h16.h); cuda_attention calls it.
 */
int cuda_flash(const float *q, float *out, struct cuda_h16 h16, int n_split, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err);

/*
 * The tokens that are not in prefill tiles (kv->dec_tc), on st, each in
 * n_split pieces, as the split kernel would do them; cuda_attention calls
 * it. cuda_flash_decode_blocks: how many of its blocks a multiprocessor
 * of the current device holds at once (cuda_kv.dec_tc), 0 where its
 * shared memory does not fit the device or head_dim is not one it serves:
 * it must not be used then.
 */
int cuda_flash_decode(const float *q, float *out, struct cuda_q8 q8, struct cuda_h16 h16, int n_tok, int n_split,
    const struct cuda_heads *hd, const struct cuda_kv *kv, cudaStream_t st, char *err);
int cuda_flash_decode_blocks(int head_dim, int q8, int *per_sm, char *err);

/*
 * 1 if bytes of dynamic shared memory fit a block of device dev (sm_86 and
 * sm_89: 99 KB), 0 if not, < 0 on a CUDA error.
 */
static inline int
cuda_smem_fits(size_t bytes, int dev, char *err)
{
	int most = 0;

	CK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
	return bytes <= (size_t)most;
}

/* Lets kernel k have bytes of dynamic shared memory on the current device (past 48 KB it must be asked for). */
template <typename K>
static int
cuda_smem_limit(K k, size_t bytes, char *err)
{
	if (bytes > 48 * 1024)
		CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
	return 0;
}

/* Readies cuda_flash and cuda_flash_decode for head_dim on the current device (cuda_attention_setup calls it). */
int cuda_flash_setup(int head_dim, char *err);

#endif
