/*
 * cuda_probe.h: single kernels of the CUDA backend run on host data, for
 * the kernel tests (tests/unit/test_cuda_ops.c). A C interface to the host
 * entry points of matmul.cuh, norm.cuh and attention.cuh.
 *
 * Every call copies its inputs to the GPU, fills its outputs and the
 * scratch the kernel uses with 0xff bytes (NaN as float and as fp16) so
 * that an element the kernel fails to write shows up as NaN, runs the
 * kernel on the probe's stream, waits for it, checks that a guard zone of
 * 0xff bytes after every buffer the kernel writes is intact, and copies
 * the outputs back. Each returns 0 or a negative ERR_* code with a
 * message in err (ERR_LEN bytes): ERR_DEVICE for a CUDA failure or a
 * write past the end of a buffer.
 */
#ifndef RESIDENT_CUDA_PROBE_H
#define RESIDENT_CUDA_PROBE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_probe;
struct fwd_pick;

/* A stream and a cuBLAS handle on device 0. */
int cuda_probe_open(struct cuda_probe **out, char *err);
void cuda_probe_close(struct cuda_probe *p);

/* A weight as stored: n rows of k elements of type, quant_row_bytes(type, k) apart. */
struct cuda_probe_weight {
	uint32_t type;
	int64_t k, n;
	const void *data;
};

/* The paths of cuda_matmul. */
enum cuda_probe_path {
	CUDA_PROBE_MATVEC, /* the fp32 matrix-vector kernels, whatever the token count */
	CUDA_PROBE_GEMM,   /* steps of many tokens, whatever the count: fp16 activations; quantized
	                      weights on the tensor-core kernel (K split as the device's
	                      multiprocessor count makes the backend split it), the others
	                      (and rows not whole units of their blocks) on cuBLAS */
	CUDA_PROBE_GEMM_WHOLE, /* as CUDA_PROBE_GEMM, K never split */
	CUDA_PROBE_INT8,   /* the matrix-vector kernels with int8 activations where the type has
	                      an integer kernel (Q4_K, Q6_K, Q8_0; the others stay fp32) */
	CUDA_PROBE_FEW,    /* as CUDA_PROBE_GEMM, but up to MMT_MAX_TOKENS tokens of Q4_K and Q6_K
	                      on mmt.cu's kernel */
	CUDA_PROBE_BLAS,   /* as CUDA_PROBE_GEMM, but every weight on cuBLAS, the quantized ones
	                      dequantized into fp16 tiles (the backend's path from cuda_mm.blas_min
	                      tokens) */
	CUDA_PROBE_WG,     /* as CUDA_PROBE_GEMM, but the types qgemm's wgmma form takes on it (the
	                      backend's path from cuda_mm.wg_min tokens; where cuda_probe_wg) */
	CUDA_PROBE_WG_WHOLE, /* as CUDA_PROBE_WG, K never split */
};

/* 1 if the device runs qgemm's wgmma form (sm_90a, built for it). */
int cuda_probe_wg(const struct cuda_probe *p);

/*
 * y[t * n + o] = W[o] . x[t * k ..] for t < n_tok (x: n_tok x k, y: n_tok
 * x n). n_parts (1 to 3): W's rows cut into that many weights stored one
 * after the other (n / n_parts rows each, the last the rest), multiplied
 * by one cuda_matmul_multi, as the backend does Q, K and V (one fused
 * kernel on the matrix-vector path); 1: cuda_matmul. tile_rows > 0 limits the rows the cuBLAS path dequantizes at a
 * time (0: as much as the backend would give it). reuse_x says x is the
 * previous call's x, same k and n_tok: the many-token paths then reuse its
 * fp16 copy.
 */
int cuda_probe_matmul(struct cuda_probe *p, const struct cuda_probe_weight *w, int n_parts, const float *x,
    int n_tok, enum cuda_probe_path path, int64_t tile_rows, int reuse_x, float *y, char *err);

/*
 * As Q, K and V stored in two types: w's rows cut in two weights, then w2
 * (same k, any type), multiplied by one cuda_matmul_multi on a path; y
 * gets token t's n rows of w at t * n, y2 its n2 rows of w2 at t * n2.
 */
int cuda_probe_matmul_two(struct cuda_probe *p, const struct cuda_probe_weight *w,
    const struct cuda_probe_weight *w2, const float *x, int n_tok, enum cuda_probe_path path, float *y,
    float *y2, char *err);

/* ids[r] = the index of the largest of row r of x (n_rows x n), the lowest among equals: cuda_argmax. */
int cuda_probe_argmax(struct cuda_probe *p, const float *x, int n_rows, int n, int32_t *ids, char *err);

/*
 * ids[r] = the token drawn from row r of x (n_rows x n) as how[r] says,
 * after its penalties (n_pairs tokens and counts in all), and logprob[r]
 * its log-probability where how[r].logprob, and its how[r].top most likely
 * tokens and theirs from top_ids and top_lp + r * FWD_TOP_LOGPROBS on
 * (n_rows * FWD_TOP_LOGPROBS each): cuda_pick.
 */
int cuda_probe_pick(struct cuda_probe *p, const float *x, int n_rows, int n, const struct fwd_pick *how,
    const int32_t *pen_tok, const int32_t *pen_cnt, int n_pairs, int32_t *ids, float *logprob, int32_t *top_ids,
    float *top_lp, char *err);

/* out[t * k ..] = row tokens[t] of w, times scale, for t < n_tok. */
int cuda_probe_embed(struct cuda_probe *p, const struct cuda_probe_weight *w, const int32_t *tokens,
    int n_tok, float scale, float *out, char *err);

/*
 * cuda_residual_norm on n_rows rows of width n (a multiple of 4): x is
 * updated in place; r, post and w may each be NULL (then h is not written
 * and may be NULL). hh not NULL: the normed rows go there in their fp16
 * form instead (raw fp16 bits, each row divided by hscale[row]). q not
 * NULL (n a multiple of 32): their int8 form too, n_rows x 2 x n bytes
 * laid out as cuda_q8's, with each group's scale and sum in qd (n_rows x
 * n / 32 pairs of floats).
 */
int cuda_probe_residual_norm(struct cuda_probe *p, float *x, const float *r, const float *post,
    const float *w, float *h, uint16_t *hh, float *hscale, int8_t *q, float *qd, int n_rows, int n,
    float offset, float eps, char *err);

/*
 * cuda_norm_router: for n_tok rows of n, h = norm(x + r + bias) * (w +
 * offset) (bias NULL: none) into h and its int8 form into q, qd (q NULL:
 * none), and logit[t n_expert + e] = router row e . h (router n_expert F32
 * rows of n); x is only read.
 */
int cuda_probe_norm_router(struct cuda_probe *p, const float *x, const float *r, const float *bias, const float *w,
    const float *router, int n_expert, float *logit, float *h, int8_t *q, float *qd, int n_tok, int n, float offset,
    float eps, char *err);

/* h[i * n ..] = norm(x[rows[i] * n ..]) * (w + offset), for i < n_rows; x has n_x rows. */
int cuda_probe_norm_rows(struct cuda_probe *p, const float *x, int n_x, const int32_t *rows,
    int n_rows, int n, const float *w, float offset, float eps, float *h, char *err);

/*
 * a = silu(a) * b (gelu: gelu_tanh) for n_rows rows of n (a multiple of
 * 4), in place, or with hh, in fp16 form there; with q, in int8 form too
 * (both as cuda_probe_residual_norm).
 */
int cuda_probe_glu(struct cuda_probe *p, float *a, const float *b, int n_rows, int n, int gelu, uint16_t *hh,
    float *hscale, int8_t *q, float *qd, char *err);

/*
 * The dense feed-forward's gate and up as one launch of the wgmma form's
 * GLU form (cuda_matmul_glu, K whole), then cuda_glu_fix, as the backend
 * runs them: w's first n / 2 rows are gate's, the rest up's; hh gets
 * act(gate x) * (up x) for each of x's n_tok rows (k wide) as fp16 rows of
 * n / 2 (raw bits, each divided by hscale[t]). Fails if a flag is left
 * set. ERR_UNSUPPORTED where cuda_matmul_glu_fits says no (where
 * cuda_probe_wg says the form does not run, or for other types).
 */
int cuda_probe_matmul_glu(struct cuda_probe *p, const struct cuda_probe_weight *w, const float *x, int n_tok,
    int gelu, uint16_t *hh, float *hscale, char *err);

/*
 * cuda_glu_fix on n_rows rows of n: hh (fp16 bits, an infinity wherever
 * the row's float in f stands for it), hscale and big (the flags) are
 * updated in place.
 */
int cuda_probe_glu_fix(struct cuda_probe *p, uint16_t *hh, const float *f, int *big, float *hscale, int n_rows,
    int n, char *err);

/* A layer's experts as stored, for cuda_probe_moe. */
struct cuda_probe_moe {
	int n_expert, n_used;
	int norm;                           /* the weights a softmax over the chosen logits (else over all) */
	int act;                            /* enum ffn_act */
	float alpha, limit;                 /* ACT_SWIGLU_OAI */
	struct cuda_probe_weight router;    /* n_expert rows of the model's width */
	struct cuda_probe_weight gate_up;   /* n_expert x 2f rows: each expert's f gate rows, then its f up rows */
	struct cuda_probe_weight down;      /* n_expert x width rows of f */
	const float *router_b, *gate_b, *up_b, *down_b; /* or NULL: n_expert, n_expert x f (twice), n_expert x width */
};
/*
 * cuda_moe_ffn on x (n_tok rows of the model's width) into out, on a path:
 * CUDA_PROBE_MATVEC (every token's choices as float slots),
 * CUDA_PROBE_INT8 (slots, int8 activations where the types take them),
 * CUDA_PROBE_GEMM (the rows grouped by expert, on the tensor cores where
 * the types allow) or CUDA_PROBE_FEW (grouped, on the integer kernel where
 * the types allow); expert and weight (n_tok x n_used) get the routing.
 */
int cuda_probe_moe(struct cuda_probe *p, const struct cuda_probe_moe *mo, const float *x, int n_tok,
    enum cuda_probe_path path, float *out, int32_t *expert, float *weight, char *err);

/* One layer's heads, as struct cuda_heads but with the RoPE base instead of a table. */
struct cuda_probe_heads {
	int n_head, n_head_kv, head_dim;
	const float *bq, *bk, *bv;      /* n_head * head_dim, n_head_kv * head_dim; or NULL */
	const float *q_norm, *k_norm;   /* head_dim each; or NULL */
	float norm_offset, norm_eps;
	float theta;                    /* RoPE base: frequencies 1 / theta^(2i/d), as cpu_rope */
	float pos_div;                  /* positions are divided by it */
	int neox;
	float scale;                    /* of q.k */
	int window;                     /* sliding window; 0: none */
};

/*
 * The KV pool, raw fp16 bits (floats with f32, the exact mode),
 * [block][layer][K|V][KV_BLOCK_TOKENS][n_head_kv * head_dim] for n_blocks
 * blocks and n_layer layers, of which `layer` is used, and where each
 * token sits: token t is at position tok_pos[t] of the sequence whose
 * block table starts at tables + tok_tab[t] (n_tables entries in all). The
 * pool goes to the GPU as given and cuda_probe_qk copies it back whole.
 * split: cuda_probe_attention gives the kernel the scratch of split
 * attention, as many rows as the backend gives it (its pieces and their
 * merge run when few tokens would leave the GPU idle); 0: none, each
 * (token, head) in one piece. flash: the tokens of sequences with at
 * least FLASH_MIN_TOKENS (attention.cuh) new ones go to the tensor-core
 * prefill kernel in tiles, as the backend sends them, where it serves the
 * heads (fp16 or q8 pool, a group of query heads that divides a tile); the
 * launch has a few blocks more than tiles, as a step's fixed launch has.
 * Tokens of one sequence are consecutive, with one table and consecutive
 * positions.
 */
struct cuda_probe_kv {
	void *pool;
	int n_blocks, n_layer, layer;
	const int32_t *tok_pos, *tok_tab, *tables;
	int n_tables;
	int f32;
	int split;
	int flash;
	int q8;     /* the pool holds q8 rows (attention.cuh) */
	/* the other tokens go to the tensor-core decode kernel (cuda_kv.dec_tc; ERR_UNSUPPORTED where it does not fit) */
	int dec_tc;
};

/*
 * cuda_qk for n_tok tokens: q (n_tok x n_head x head_dim) gets its bias,
 * norm and rotation in place; k and v (n_tok x n_head_kv x head_dim) go
 * into the pool, k rotated, both with their biases.
 */
int cuda_probe_qk(struct cuda_probe *p, const struct cuda_probe_heads *hd, struct cuda_probe_kv *kv,
    float *q, const float *k, const float *v, int n_tok, char *err);

/*
 * cuda_matmul_qkv: Q, K and V of x (n_tok x k) with qk's work in the
 * product, on a path (CUDA_PROBE_INT8 or CUDA_PROBE_FEW): w holds Q's
 * n_head x head_dim rows, then K's n_head_kv x head_dim, then V's unless
 * w2 (another type, same k) holds them; q (n_tok x n_head x head_dim)
 * gets the rotated queries, the pool (copied back whole) K and V, as
 * cuda_probe_qk leaves them.
 * ERR_UNSUPPORTED where cuda_matmul_qkv_fits says no.
 */
int cuda_probe_qkv(struct cuda_probe *p, const struct cuda_probe_weight *w, const struct cuda_probe_weight *w2,
    const float *x, int n_tok, enum cuda_probe_path path, const struct cuda_probe_heads *hd,
    struct cuda_probe_kv *kv, float *q, char *err);

/*
 * cuda_attention: out (n_tok x n_head x head_dim) from q over the pool;
 * with q8 (NULL: not asked for) also its int8 form, two int8 rows a token
 * into q8 and a scale and sum a group of 32 into q8d (2 floats each), and
 * with h16 (NULL: not asked for; only from an fp16 pool) its fp16 form, a
 * row a token into h16 and each row's divisor into h16s.
 */
int cuda_probe_attention(struct cuda_probe *p, const struct cuda_probe_heads *hd,
    const struct cuda_probe_kv *kv, const float *q, int n_tok, float *out, int8_t *q8, float *q8d, uint16_t *h16,
    float *h16s, char *err);

/*
 * cuda_attention for a decode step of n_tok tokens, each its sequence's
 * only one, that does cuda_qk's work itself (cuda_kv.k_new): q, k and v
 * as the product left them (biases, norms and rotation not applied; q
 * n_tok x n_head x head_dim, k and v n_tok x n_head_kv x head_dim); out as
 * cuda_probe_attention's, and the pool (copied back whole) with the
 * tokens' K and V stored as cuda_probe_qk stores them. q, k and v are not
 * written.
 */
int cuda_probe_attention_new(struct cuda_probe *p, const struct cuda_probe_heads *hd, struct cuda_probe_kv *kv,
    const float *q, const float *k, const float *v, int n_tok, float *out, char *err);

#ifdef __cplusplus
}
#endif

#endif
