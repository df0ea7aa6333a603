/*
 * moe.cuh: the router's choices on the GPU, for mixtures of experts.
 * Host entry points only.
 */
#ifndef RESIDENT_CUDA_MOE_CUH
#define RESIDENT_CUDA_MOE_CUH

#include "cuda_common.cuh"
#include "matmul.cuh"
#include "norm.cuh"
#include "route.cuh"

/*
 * A step's routing, on the GPU. Slot s = t n_used + j is token t's j-th
 * choice (largest logit first). With grouping (bn > 0) the slots are also
 * grouped by expert into rows: expert e's rows are consecutive, its tokens
 * in step order, and cut into tiles of at most bn rows for
 * cuda_qgemm_grouped (tiles[0] their count, then (expert, first row, rows)
 * each; at most cuda_moe_max_tiles).
 */
struct cuda_route {
	float *logit;           /* n_tok x n_expert router logits, in, without the bias */
	const float *bias;      /* the router's bias, or NULL */
	int32_t *expert;        /* per slot */
	float *weight;          /* per slot */
	int32_t *row;           /* per slot: its row (grouping) */
	int32_t *row_expert;    /* per row: its expert (grouping) */
	int32_t *row_slot;      /* per row: its slot (grouping) */
	int32_t *tiles;
	int n_tok, n_expert, n_used;
	int norm;               /* the weights are a softmax over the chosen logits alone; else over all */
	int bn;                 /* rows of a tile; 0: no grouping */
};

/* Tiles of bn rows that n_rows rows of at most n_expert experts may take. */
int cuda_moe_max_tiles(int n_rows, int n_expert, int bn);
/* The fewest rows a tile is cut to (for the size of the tile table). */
#define MOE_MIN_TILE_ROWS 2

/*
 * Experts brought up over the bus for a step, beside the ones a layer
 * holds (cuda_moe.slot_of): of the chosen experts it does not hold, the
 * share *share (the most chosen first, at most max) are copied by a kernel
 * from host memory (pinned and mapped: expert e's gate/up at gu_host + e
 * gate/up strides, its down at down_host + e down strides) into the slots
 * gu and down, while the host computes the others. step_of (n_expert) is
 * the step's table, which the experts' kernels, the mixture and the host
 * read: the layer's slot_of, and each expert brought up at n_home + its
 * rank; list[0] is their count, list[1 + j] the expert in slot j.
 */
struct cuda_bus {
	const uint8_t *gu_host, *down_host;
	uint8_t *gu, *down;
	int32_t *step_of, *list;
	const float *share;
	int n_home, max;
};

/*
 * A layer's experts on the GPU: the router (n_expert rows), expert 0's
 * gate and up stored one after the other (gu: 2 n_ff_exp rows, gate
 * first) and its down; expert e's are e strides after them. Biases and
 * the activation as model.h's.
 */
struct cuda_moe {
	struct cuda_weight router, gu, down;
	size_t gu_stride, down_stride;
	float *router_b, *gate_b, *up_b, *down_b; /* or NULL */
	struct cuda_act act;
	int n_expert, n_used, norm;
	int slots_max;          /* up to this many tokens run as slots (cuda_moe_ffn), more are grouped */
	int int_max;            /* grouped, up to this many on the integer kernel (int8 types), more on the tensor cores */
	/*
	 * NULL, or a layer that holds some of its experts only (the others
	 * are computed elsewhere): expert e's gate/up and down are at slot
	 * slot_of[e] of gu and down (their strides apart), none where it is
	 * negative. Such a layer runs every token count as slots, leaves the
	 * experts it does not hold out of its rows and its mixture, and
	 * records routed on the stream once the step's routing is made (for
	 * the work elsewhere that reads it).
	 */
	const int32_t *slot_of;
	cudaEvent_t routed;
	const struct cuda_bus *bus; /* NULL, or with slot_of: the chosen experts it does not hold, some brought up */
};

/*
 * Where cuda_moe_ffn works, for up to its most rows (tokens times n_used):
 * the routing's arrays (route.logit and the others; the rest of route is
 * set per call), each row's gate, up (n_ff_exp wide) and down (the model's
 * width).
 */
struct cuda_moe_scratch {
	struct cuda_route route;
	float *gate, *up, *down;
};

/*
 * 1 if cuda_moe_ffn groups n_tok tokens' rows by expert: above
 * e->slots_max tokens, up to e->int_max on the integer kernel
 * (cuda_matmul_grouped_int8), else on the tensor cores
 * (cuda_qgemm_grouped), for the types they take; else it runs them as
 * slots.
 */
int cuda_moe_grouped(const struct cuda_mm *m, const struct cuda_moe *e, int n_tok);

/*
 * The residual norm before the experts when cuda_moe_ffn does it in the
 * router's launch (cuda_norm_router): h = norm(x + r + bias) * w into h
 * and its int8 form into q8 (q8.q NULL: none); x is left as it is and the
 * mixture cuda_moe_ffn returns adds r and bias (cuda_rmix.pre, .bias).
 */
struct cuda_moe_pre {
	const float *x, *r, *bias, *w;
	struct cuda_norm nm;
	struct cuda_q8 q8;
};

/*
 * 1 if cuda_moe_ffn takes a cuda_moe_pre for n_tok tokens: few enough to
 * run as slots and to norm in every block of the router's launch, an F32
 * router.
 */
int cuda_moe_fuses_norm(const struct cuda_mm *m, const struct cuda_moe *e, int n_tok);

/*
 * The experts' feed-forward of the n_tok normed rows h (n_embd floats
 * each, and their int8 form in m->xq where h_q8 says the kernel that wrote
 * h made it): the router's logits (fp32, as llama.cpp keeps routers) and
 * each token's choices (route_token's; for a few tokens by slots, the
 * gate/up slots route their own token: no launch of its own), gate and up
 * of every choice, the activation, and down, into
 * s->down; *mix then says how each token's rows there add up to its output
 * (cuda_residual_norm adds them into the residual stream). Few tokens go
 * by slots, each reading its expert's rows; more are grouped by expert,
 * so that an expert's rows are read once for all of its tokens. All on
 * m->stream, no host round trip.
 * With pre (cuda_moe_fuses_norm), h is made here first, in the router's
 * launch.
 */
int cuda_moe_ffn(struct cuda_mm *m, const struct cuda_moe *e, struct cuda_moe_scratch *s, float *h, int n_embd,
    int n_tok, int h_q8, const struct cuda_moe_pre *pre, struct cuda_rmix *mix, char *err);

#endif
