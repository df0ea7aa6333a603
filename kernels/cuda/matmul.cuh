/*
 * matmul.cuh: y = W x for a weight in its stored (quantized) form and a
 * few or many tokens. Host entry points only.
 */
#ifndef RESIDENT_CUDA_MATMUL_CUH
#define RESIDENT_CUDA_MATMUL_CUH

#include "attention.cuh"
#include "cuda_common.cuh"
#include "norm.cuh"

#include <cublas_v2.h>
#include <type_traits>

/* Tokens one matrix-vector kernel carries; more go in groups of this. */
#define MMV_TOKENS 8

/* qgemm's most splits of K: 8, the most blocks a cluster holds portably (the wgmma form's splits may be one). */
#define QG_MAX_SPLIT 8

/* The wgmma form's tile shapes (64, 128 and 256 tokens), and the tokens above which it takes 256 (RESIDENT_CUDA_WG_WIDE). */
#define QW_SHAPES 3
#define WG_WIDE_TOKENS 128
/*
 * Units of K a block of a 256-token tile must still run after the split
 * its grid takes, for that tile to pay: with fewer, filling and draining
 * its rings outweighs decoding each unit once for 256 tokens. qwen3-0.6b
 * (K of 1,024 to 3,072: 1 to 4 units a block) ran 9 % slower at 256
 * sequences in 256-token tiles, llama3-8b (8 to 56) 5 % faster (H200).
 */
#define WG_WIDE_UNITS 8

/* A weight on the GPU: n rows of k elements, row_bytes apart. */
struct cuda_weight {
	const uint8_t *d;
	uint32_t type;
	int64_t k, n;
	size_t row_bytes;
};

/*
 * Scratch of the tensor-core path, allocated once at load: the activations
 * as fp16 (each row scaled by a power of two into fp16 range) and a tile
 * of the weight dequantized to fp16.
 */
struct cuda_mm {
	cublasHandle_t blas;
	cudaStream_t stream;
	__half *xh;        /* max_tokens x widest input: the fp16 form products make of their float input */
	float *xscale;     /* max_tokens: the power of two each row of xh was divided by */
	__half *wh;        /* wh_elems: rows of a weight, dequantized */
	int64_t wh_elems;
	int mmv_max;       /* up to this many tokens: matrix-vector kernels; above: the tensor cores, cuBLAS */
	int mmt_max;       /* above mmv_max and up to this many (at most MMT_MAX_TOKENS): mmt.cu where it takes the type */
	int blas_min;      /* from this many (above mmv_max): quantized weights too on cuBLAS, dequantized into wh */
	int wg_min;        /* from this many (above mmt_max): qgemm's wgmma form where it takes the weight (sm_90a) */
	int64_t wg_elems;  /* ... for weights of this many elements (rows x K) and more */
	int wg_cluster;    /* the wgmma form adds up to this many splits of a tile in one cluster; more go through part */
	int wg_wide;       /* ... in tiles of 256 tokens from more than this many, of 128 from 65 */
	int wg_wide_units; /* ... where each block of 256 tokens still runs this many units of K */
	int wg_fit[QW_SHAPES][QG_MAX_SPLIT + 1]; /* its clusters of each size the device runs at once, a row a tile shape */
	/*
	 * The activations as two int8 rows (max_tokens x 2 x widest input)
	 * with a scale and a sum per 32 (max_tokens x widest / 32), for the
	 * integer matrix-vector kernels. NULL: those kernels are not used.
	 */
	int8_t *xq;
	float2 *xd;
	int xq_ready;      /* xq holds the x of this call */
	/* the tensor-core kernels' split sums (part_elems floats), and the multiprocessors they fill */
	float *part;
	int64_t part_elems;
	int sms;
};

/* Most weights of one cuda_matmul_multi. */
#define MM_MAX_OUT 3

/*
 * Where the rows of one product go: rows [start[i], start[i + 1]) to y[i],
 * token t's row ldy[i] floats after token t - 1's.
 */
struct mm_out {
	float *y[MM_MAX_OUT];
	int ldy[MM_MAX_OUT];
	int start[MM_MAX_OUT + 1];
	int n;
};

/* Where token 0's value of row o goes; token t's is t * *ld floats on. */
static __device__ __forceinline__ float *
mm_row(const struct mm_out &out, int o, int *ld)
{
	float *y = out.y[0];
	int r = o;

	*ld = out.ldy[0];
#pragma unroll
	for (int j = 1; j < MM_MAX_OUT; j++) /* constant indices: the struct stays in registers */
		if (j < out.n && o >= out.start[j]) {
			y = out.y[j];
			*ld = out.ldy[j];
			r = o - out.start[j];
		}
	return y + r;
}

/* Stores token t's value of row o. */
static __device__ __forceinline__ void
mm_store(const struct mm_out &out, int o, int t, float v)
{
	int ld;
	float *y = mm_row(out, o, &ld);

	y[(size_t)t * ld] = v;
}


/* The rows of one weight a kernel multiplies; they go to rows o0 .. o0 + n - 1 of its outputs. */
struct mm_seg {
	const uint8_t *w;
	size_t row_bytes;
	int n, o0;
};

/* The rows of w as a kernel's first segment, those of w2 (NULL: none) after them as its second. */
static inline void
mm_segs(const struct cuda_weight *w, const struct cuda_weight *w2, struct mm_seg *a, struct mm_seg *b)
{
	*a = { w->d, w->row_bytes, (int)w->n, 0 };
	*b = { NULL, 0, 0, (int)w->n };
	if (w2 != NULL)
		b->w = w2->d, b->row_bytes = w2->row_bytes, b->n = (int)w2->n;
}

/*
 * Where a Q/K/V product with qk's work stores its rows (qkv_pair_of): q
 * NULL, the rows go to the product's outputs as any product's.
 */
struct mm_qkv {
	struct cuda_heads hd;
	struct cuda_kv kv;
	float *q;
};

/* What a product kernel takes for e: mm_qkv with QKV, else nothing (its ~230 bytes on no other launch). */
struct mm_none {
};
template <bool QKV> using mm_e = std::conditional_t<QKV, struct mm_qkv, struct mm_none>;

/* e as a kernel with QKV or without it takes it. */
template <bool QKV>
static inline mm_e<QKV>
mm_e_of(const struct mm_qkv &e)
{
	mm_e<QKV> k = {};

	if constexpr (QKV)
		k = e;
	return k;
}

/*
 * y[t * ldy + o] = sum_i W[o][i] * x[t * ldx + i] for t < n_tok and every
 * row o of the weight, on m->stream. With reuse_x, the other form of x
 * the kernels read is made already (by the previous call or the kernel
 * that wrote x): for more than mmv_max tokens its fp16 form (m->xh,
 * m->xscale), for fewer its int8 form (m->xq, m->xd, see cuda_q8).
 * Returns 0 or ERR_DEVICE with a message.
 */
int cuda_matmul(struct cuda_mm *m, const struct cuda_weight *w, const float *x, int ldx, int n_tok,
    float *y, int ldy, int reuse_x, char *err);

/*
 * y[i] = w[i] x for n_w (<= MM_MAX_OUT) weights of the same input, as
 * cuda_matmul with y[i] ldy[i] apart. Weights stored one after the other
 * with the same type and width (cuda_weight_follows) are one kernel.
 */
int cuda_matmul_multi(struct cuda_mm *m, const struct cuda_weight *const *w, int n_w, const float *x,
    int ldx, int n_tok, float *const *y, const int *ldy, int reuse_x, char *err);

/*
 * The dense feed-forward's gate and up (stored one after the other) times
 * n_tok tokens, and act(gate) * up, as one launch of qgemm's wgmma form,
 * into g (see cuda_glu16): the rows of neither product nor the GLU's
 * launch pass through memory. ERR_UNSUPPORTED, with nothing done, where
 * cuda_matmul_glu_fits says no. reuse_x as cuda_matmul.
 */
int cuda_matmul_glu(struct cuda_mm *m, const struct cuda_weight *gate, const struct cuda_weight *up, const float *x,
    int ldx, int n_tok, const struct cuda_glu16 *g, int reuse_x, char *err);

/*
 * 1 if cuda_matmul_glu serves these weights at n_tok tokens: where their
 * product would be one launch of the wgmma form, K unsplit, and gate's
 * rows are whole tiles of 64.
 */
int cuda_matmul_glu_fits(const struct cuda_mm *m, const struct cuda_weight *gate, const struct cuda_weight *up,
    int n_tok);

/*
 * cuda_matmul of n_tok tokens (more than m->mmv_max) whose fp16 form is
 * h, made by another kernel (the down product after cuda_matmul_glu).
 */
int cuda_matmul_h16(struct cuda_mm *m, const struct cuda_weight *w, struct cuda_h16 h, int n_tok, float *y, int ldy,
    char *err);

/*
 * Q, K and V (w[0..2], of one input) times n_tok tokens, with cuda_qk's
 * work done as the product's kernel (the integer one, or mmt.cu's) stores
 * each pair of rows: q rotated into
 * q (n_head * head_dim floats a token), k rotated and v into the pool at
 * each token's position, with their biases; the step saves qk's launch.
 * ERR_UNSUPPORTED, with nothing done, where cuda_matmul_qkv_fits says
 * no. reuse_x as cuda_matmul.
 */
int cuda_matmul_qkv(struct cuda_mm *m, const struct cuda_weight *const *w, const float *x, int ldx, int n_tok,
    float *q, const struct cuda_heads *hd, const struct cuda_kv *kv, int reuse_x, char *err);

/*
 * 1 if cuda_matmul_qkv serves n_tok tokens of these weights, heads and
 * pool: one launch of the integer kernel (n_tok up to m->mmv_max and 2) or
 * of mmt.cu's (more, up to m->mmt_max and below m->blas_min, from which
 * cuBLAS multiplies them; Q4_K and Q6_K); Q and K of one
 * type, stored one after the other, V after them or of another type; RoPE
 * on neighbouring dimensions, no QK norm, fp16 pool.
 */
int cuda_matmul_qkv_fits(const struct cuda_mm *m, const struct cuda_weight *const *w, int n_tok,
    const struct cuda_heads *hd, const struct cuda_kv *kv);

/* 1 if a product of at most m->mmv_max tokens by w reads the int8 form of its input (cuda_q8). */
int cuda_matmul_int8(const struct cuda_mm *m, const struct cuda_weight *w);

/*
 * Expert slots (mixtures of experts): slot s of a step chose expert
 * expert[s], whose rows are stride bytes after expert 0's (expert NULL:
 * one weight for every slot, a token's matrix-vector product), and reads
 * input row s / in_div (a token's input, by its n_used slots; or the
 * slot's own row). With logit set the launch routes its own tokens: slot
 * s = t in_div + j takes token t's j-th choice among its n_expert logits
 * (plus bias; route_token), and the token's first slot stores the
 * token's choices and weights into expert and weight.
 *
 * With glu.on (w of a type cuda_matmul_int8 takes) the expert's rows are
 * its gate and up, n / 2 each, multiplied in pairs (gate i, up i) and
 * stored as expert_act(gate + gate_b, up + up_b), n / 2 wide into the
 * first output: the experts' activation without a launch of its own.
 */
struct mm_glu {
	const float *gate_b, *up_b; /* expert 0's biases (n / 2 floats each, expert e's e n / 2 on), or NULL */
	struct cuda_act act;
	int on;
};
struct mm_slots {
	int32_t *expert;
	size_t stride;
	int in_div;
	const float *logit, *bias;
	float *weight;
	int n_expert, norm;
	struct mm_glu glu;
	/*
	 * NULL, or where each expert's rows are: expert e's at slot_of[e]
	 * strides from w, and a slot whose expert's entry is negative is
	 * left out (its expert is computed elsewhere; its outputs' rows are
	 * not written). Not with logit (the routing is made before).
	 */
	const int32_t *slot_of;
	/*
	 * NULL, or where the slots from n_home on are: slot s >= n_home at
	 * (s - n_home) strides from away (experts brought up for the step,
	 * cuda_bus), not from w.
	 */
	const uint8_t *away;
	int n_home;
	/*
	 * 1: expert (and slot_of) were written two or more launches before
	 * this one, so the integer kernel reads them, and its first rows,
	 * before pdl_wait: every launch waits for the one before it before it
	 * lets the next one start, so the launch that wrote them has ended.
	 * Not with logit.
	 */
	int early;
};

/*
 * For each of n_slots slots s: the rows of the expert slot s chose (w is
 * expert 0's weight, its outputs' rows as for any product) times its input
 * row of x (n_in rows, ldx apart), into row s of each output of out. One
 * launch of the matrix-vector kernels; the integer one where the type has
 * one, on x's int8 form (made here unless reuse_x: the kernel that wrote x
 * did). Each slot reads its expert's weights: the path of a few tokens.
 */
int cuda_matmul_slots(struct cuda_mm *m, const struct cuda_weight *w, const float *x, int ldx, int n_in, int n_slots,
    const struct mm_slots *sl, const struct mm_out *out, int reuse_x, char *err);

/*
 * Rows of experts grouped by expert, a few an expert (the integer
 * kernel): for each tile (expert, first row, rows) of tiles (tiles[0] of
 * them, at most max_tiles, each of at most bn = 2, 4 or 8 rows), that
 * expert's rows of w (expert 0's; expert e's stride bytes after) times the
 * tile's rows of the int8 form in m->xq, into those rows of each output of
 * out. w of a type cuda_matmul_int8 takes.
 */
int cuda_matmul_grouped_int8(struct cuda_mm *m, const struct cuda_weight *w, size_t stride, const int32_t *tiles,
    int max_tiles, int bn, const struct mm_out *out, char *err);

/* n_rows rows of x in int8 form into m->xq / m->xd, row r from x's row rows[r] / div (k wide, ldx apart). */
int cuda_quant_rows(struct cuda_mm *m, const float *x, int ldx, int k, const int32_t *rows, int div, int n_rows,
    char *err);

/*
 * The GPU form of a matrix of n rows of k elements stored as `type` (d
 * NULL): its type there (Q6_K and MXFP4 are regrouped: TT_Q6_KG, TT_MXFP4G) and the bytes of a
 * row. Returns 0, or -1 if the GPU reads no such matrix.
 */
int cuda_weight_form(uint32_t type, int64_t k, int64_t n, struct cuda_weight *w);

/*
 * Copies w's rows as stored in the file (src) to dev in w's GPU form, on st,
 * and waits for the copies. Returns 0 or ERR_DEVICE with a message.
 */
int cuda_weight_upload(const struct cuda_weight *w, const void *src, uint8_t *dev, cudaStream_t st, char *err);
/* w's rows as stored at src, in the form the GPU reads them (cuda_weight_upload's), into host memory at dst. */
void cuda_weight_to_host(const struct cuda_weight *w, const void *src, uint8_t *dst);

/* 1 if b's rows start where a's end, with the same type and width. */
int cuda_weight_follows(const struct cuda_weight *a, const struct cuda_weight *b);

/* out[t][i] = row tokens[t] of an embedding matrix, times scale, for t < n_tok. */
int cuda_embed(const struct cuda_weight *w, const int32_t *tokens, int n_tok, float scale,
    float *out, cudaStream_t st, char *err);

/* ---- qgemm.cu: many tokens on the tensor cores, straight from the quantized blocks ---- */

/* 1 if cuda_qgemm multiplies by w (its type, and rows whole units of its blocks). */
int cuda_qgemm_type(const struct cuda_weight *w);

/*
 * The rows of w (every output of out, stored one after the other) times
 * n_tok tokens whose fp16 rows are in in.h (k apart, divided by
 * in.scale[t]), into out; on m->stream, using m->part for split sums.
 */
int cuda_qgemm(struct cuda_mm *m, const struct cuda_weight *w, struct cuda_h16 in, int n_tok, const struct mm_out *out,
    char *err);

/*
 * The tokens of the tiles cuda_qgemm computes for n_tok tokens (at least
 * n_tok): each tile decodes the whole weight again, so a product of that
 * many costs about what one of n_tok does.
 */
int cuda_qgemm_tokens(int n_tok);

/*
 * The grouped products of a mixture of experts: tiles[0] tiles (at most
 * max_tiles), each three ints (expert e, first row r0, rows n <= bn): the
 * rows of expert e's weight (expert 0's is w, e's stride bytes after it)
 * times rows r0 .. r0 + n - 1 of the fp16 tokens in in.h (k apart,
 * divided by in.scale[row]), into the same rows of out. A weight is read
 * once per tile of its rows, however many tokens chose it. One launch; the
 * tiles come from the device (no host round trip): the grid is max_tiles.
 */
int cuda_qgemm_grouped(struct cuda_mm *m, const struct cuda_weight *w, size_t stride, struct cuda_h16 in, int n_rows,
    const int32_t *tiles, int max_tiles, int bn, const struct mm_out *out, char *err);

/* Tokens of a grouped product's tiles for n_rows rows over about n_groups experts: a tile shape's. */
int cuda_qgemm_grouped_bn(int n_rows, int n_groups);

/* Readies the kernels' shared memory on the current device: once, before any graph capture. */
int cuda_qgemm_setup(char *err);

/* *wg = 1 if the current device runs qgemm's wgmma form (its sm_90a code, the driver's tensor-map encoder). */
int cuda_qgemm_wg_device(int *wg, char *err);

/*
 * Fills m->wg_fit on the current device (after cuda_qgemm_setup): a tile's
 * splits are summed in one cluster only where all of a launch's clusters
 * run at once (1 block a multiprocessor; a cluster within a GPC).
 */
int cuda_qgemm_wg_fit(struct cuda_mm *m, char *err);

/* 1 if qgemm's wgmma form multiplies weights of w's type and width (where a device runs it). */
int cuda_qgemm_wg_type(const struct cuda_weight *w);

/* 1 if qgemm's wgmma form multiplies w by n_tok tokens (cuda_mm.wg_min, wg_elems). */
int cuda_qgemm_wg(const struct cuda_mm *m, const struct cuda_weight *w, int n_tok);

/*
 * 1 if the wgmma form's plan for w (gate's rows, then up's as many, a
 * multiple of 128) at n_tok tokens is one launch of whole tiles, K unsplit:
 * what its GLU form (cuda_qgemm_glu) runs as.
 */
int cuda_qgemm_glu_whole(const struct cuda_mm *m, const struct cuda_weight *w, int n_tok);

/*
 * The wgmma form's GLU form: w (gate, then up; g->ff rows each) times the
 * n_tok tokens in in, into g. Right for any w the form takes whose rows
 * are a multiple of 128; as fast as the two products only where
 * cuda_qgemm_glu_whole says so, which the caller checks.
 */
int cuda_qgemm_glu(struct cuda_mm *m, const struct cuda_weight *w, struct cuda_h16 in, int n_tok,
    const struct cuda_glu16 *g, char *err);

/* Floats of split sums cuda_qgemm wants on a device of sms multiprocessors (cuda_mm.part). */
int64_t cuda_qgemm_part_elems(int sms);

/*
 * Elements of fp16 scratch (cuda_mm.wh) cuBLAS wants for rows of this
 * weight converted a tile at a time, under m's thresholds, in steps of up
 * to max_tokens: BF16 and F32 weights, and the quantized ones that such
 * steps send to cuBLAS (from cuda_mm.blas_min, where the wgmma form does
 * not take them).
 */
int64_t cuda_matmul_tile_elems(const struct cuda_mm *m, const struct cuda_weight *w, int max_tokens);

/* ---- mmt.cu: a few tokens on the tensor cores, each warp streaming its own rows ---- */

/* The most tokens of one mmt.cu product: one n8 tile. */
#define MMT_MAX_TOKENS 8

/* 1 if cuda_mmt multiplies n_tok tokens by w (Q4_K or Q6_K, rows whole blocks, n_tok up to m->mmt_max). */
int cuda_mmt_fits(const struct cuda_mm *m, const struct cuda_weight *w, int n_tok);

/*
 * As cuda_qgemm, for weights and a token count cuda_mmt_fits takes (else
 * ERR_UNSUPPORTED): the rows of w, then those of w2 (NULL: none; else of
 * the other type, same input), one launch; no split sums. Where e.q is set
 * the rows go to e (cuda_matmul_qkv), else to out.
 */
int cuda_mmt(struct cuda_mm *m, const struct cuda_weight *w, const struct cuda_weight *w2, struct cuda_h16 in, int n_tok,
    const struct mm_out *out, const struct mm_qkv &e, char *err);

#endif
