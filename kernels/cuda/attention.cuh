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
 */
struct cuda_kv {
	void *pool;        /* __half, or float with f32 */
	size_t kv_stride;  /* elements of one block's K (or V) of one layer */
	int n_layer, layer;
	const int32_t *tok_pos, *tok_tab, *tables;
	/*
	 * Scratch of split attention: part_rows rows of head_dim + 2 floats
	 * (one per token, head and split). NULL: each (token, head) in one piece.
	 */
	float *part;
	int64_t part_rows;
	int f32;           /* the pool holds floats */
};

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
};

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
 * merged after (kv->part holds the pieces).
 */
int cuda_attention(const float *q, float *out, int n_tok, const struct cuda_heads *hd,
    const struct cuda_kv *kv, cudaStream_t st, char *err);

/*
 * Readies cuda_attention for head_dim on the current device: once, before
 * a stream that will call it is captured into a graph.
 */
int cuda_attention_setup(int head_dim, char *err);

/* Rows of kv->part that let cuda_attention split as much as it wants on this device. */
int64_t cuda_attention_part_rows(int device);

#endif
