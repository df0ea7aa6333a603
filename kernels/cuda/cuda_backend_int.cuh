/*
 * cuda_backend_int.cuh: what the CUDA backend's two halves share, load
 * (cuda_load.cu) and the step (cuda_backend.cu): struct backend, which load
 * fills once and every step reads, and the few functions each half calls in
 * the other. Internal to those two files; kernels.h is the backend's face.
 *
 * KV pool: [block][layer][K|V][KV_BLOCK_TOKENS][n_head_kv * head_dim], fp16;
 * with a q8_0 cache (--kv-type q8_0) int8 rows and their scales (the
 * layout is attention.cuh's struct cuda_kv's).
 *
 * Exact mode (backend_opts.exact): the pool holds fp32 and every product
 * takes the fp32 matrix-vector path whatever the token count (never the
 * int8 kernels), so that no activation is rounded to fp16 or int8 and the
 * step differs from the CPU's exact mode by float order alone.
 */
#ifndef RESIDENT_CUDA_BACKEND_INT_CUH
#define RESIDENT_CUDA_BACKEND_INT_CUH

#include "cuda_common.cuh"
#include "matmul.cuh"
#include "moe.cuh"

extern "C" {
#include "cpu/cpu_ffn.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_pool.h"
}

/*
 * Logit rows computed per pass of the output matrix: 128, the wgmma form's
 * widest tile (a pass of 64 rows ran its output product in the 64-token
 * shape at about half the rate, four passes a 256-sequence step).
 */
#define LOGIT_ROWS 128
/* Ints of the staged penalty windows of T logit rows: their tokens, then their counts. */
#define PEN_INTS(T) ((size_t)(T) * FWD_PICK_PENALTY_MAX * 2)
/* Graphs kept, one per (tokens, logit rows) shape, least recently used replaced. */
#define GRAPH_CACHE 32
/* The last steps' shapes a shape is counted among before it is captured. */
#define GRAPH_RECENT 16
/* Most phase marks timed in one step (RESIDENT_CUDA_TIMING). */
#define PROF_EVENTS 1024

/* What the GPU does between two marks. */
enum phase { PH_STAGE, PH_MATMUL, PH_ATTN, PH_NORM, PH_OUTPUT, PH_END, PH_COUNT };

/*
 * RESIDENT_CUDA_TIMING=1: events between the phases of every step; their
 * GPU time is summed per phase and printed to stderr when the backend is
 * freed (=2: and after every step). Steps are then not run as graphs.
 * =step: graphs kept, two events a step, from its staging copy to its last
 * copy back, and the time the GPU waited between steps (the host's turn:
 * sampling, planning, the next launches). Off, it costs a branch per phase.
 */
enum prof_mode { PROF_OFF, PROF_PHASES, PROF_EACH, PROF_STEPS };

struct prof {
	enum prof_mode on;
	int n;
	cudaEvent_t ev[PROF_EVENTS];
	enum phase ph[PROF_EVENTS];
	double ms[PH_COUNT];
	double span_ms, idle_ms;     /* PROF_STEPS: steps' GPU time, and the waits between them */
	double host_ms;              /* PROF_STEPS: from a step's return to the next one's call */
	uint64_t left_ns;            /* when the last step returned */
	int64_t steps, tokens;
};

/*
 * One layer on the GPU: matrices as stored, small weights as float (or
 * NULL); its experts as moe.cuh's (the upload keeps each expert's gate and
 * up one after the other, the experts in order).
 */
struct cuda_layer {
	struct cuda_weight wq, wk, wv, wo, w_gate, w_up, w_down;
	struct cuda_moe moe;
	float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffn_norm;
	float *q_norm, *k_norm, *bq, *bk, *bv, *bo, *sinks;
};

/*
 * A step's kernels captured once for its shape: the buffers are fixed and
 * the positions, tokens and block tables are read from the staging area,
 * so one graph serves every step of the same token and logit-row counts,
 * attention pieces (att_len, step_split), decode kernel (att_tc) and
 * decode-or-not.
 */
struct step_shape {
	int n_tok, n_logits, att_len, att_tc, decode;
};

struct graph {
	struct step_shape shape;
	uint64_t used;
	cudaGraphExec_t exec;
};

/*
 * The step's integer data, in the pinned staging area and its device twin:
 * max_tokens each of tokens, positions, table offsets, output rows (those
 * that want logits, then those that want hidden states) and flags of the
 * tokens in prefill tiles, max_tokens + 1 for the tiles (their count
 * first), max_tokens of the last position each token attends to with
 * bidirectional attention (-1: causal), then the block tables.
 */
struct step_ints {
	int32_t *tokens, *pos, *tab, *lrows, *fa_tok, *fa_tiles, *tables, *end;
};
/* int32 of the staging area before the tables. */
#define STEP_INTS(T) (7 * (size_t)(T) + 1)

/* Most experts hot_settle moves into the device's slots at once (one a layer at most). */
#define HOT_MOVES 8

/* An expert on its way into a slot of its layer's hot experts. */
struct hot_move {
	int l, e, slot;
};

/*
 * The steps of one token count under each share of the bus, k / (BUS_SHARES
 * - 1) for k = 0 .. BUS_SHARES - 1: their fading time (0: none yet), the
 * fastest, the share of the step under way.
 */
#define BUS_SHARES 5
struct bus_tally {
	double t[BUS_SHARES];
	int64_t steps;
	int best, now;
};

/* The argument of layer l's host function (a feed-forward kept in host memory). */
struct host_call {
	struct backend *b;
	int l;
};

struct backend {
	const struct model_desc *m;
	int device;
	cudaStream_t stream;
	struct cuda_mm mm;
	uint8_t *weights;            /* every matrix, in its GPU form (cuda_weight_form) */
	float *smalls;               /* norms, biases, RoPE frequencies */
	struct cuda_layer *layers;
	struct cuda_weight tok_embd, output;
	float *out_norm;
	float *inv_freq[2];          /* RoPE of full-attention and of sliding-window layers */
	void *kv;                    /* __half, or float in exact mode, or q8 rows (kv_q8) */
	int exact;                   /* backend_opts.exact: fp32 pool (unless kv_q8), fp32 products only */
	int kv_q8;                   /* backend_opts.kv_type KV_Q8_0 */
	int64_t kv_blocks;
	size_t kv_stride;            /* elements of one block's K (or V) of one layer; bytes with kv_q8 */
	int max_tokens;
	/* activations, max_tokens rows each (logits: LOGIT_ROWS) */
	float *x, *h, *q, *k, *v, *att, *gate, *up, *ffn_out, *logits;
	float *glu_scale;            /* the GLU form's divisors (cuda_glu16; its rows in gate, its floats in up) */
	int *glu_big;                /* ... and its flags, zero between steps */
	float *att_part;             /* the pieces of split attention */
	struct cuda_moe_scratch moe; /* experts: the routing and rows of a step (max_tokens x n_expert_used) */
	int32_t *dev_argmax, *host_argmax; /* the greedy picks of a step's logits rows (host: pinned) */
	char *stage;                 /* 2 x KV_STAGE_BYTES, pinned; NULL until the first copy */
	cudaEvent_t stage_ev[2];     /* the last copy through each */
	cudaStream_t move_out, move_in; /* kv_move's two directions (made with the staging buffers) */
	cudaEvent_t moved_out;       /* a block's copy out is done (its copy in waits for it) */
	float2 *argmax_part;         /* their partial picks */
	struct fwd_pick *dev_pick, *host_pick; /* how sampled rows are drawn (host: pinned) */
	int32_t *dev_pen, *host_pen; /* their penalty windows: tokens, then counts (max_tokens * FWD_PICK_PENALTY_MAX each) */
	float *dev_lp, *host_lp;     /* their log-probabilities */
	int32_t *dev_top_ids, *host_top_ids; /* their most likely tokens (max_tokens * FWD_TOP_LOGPROBS) */
	float *dev_top_lp, *host_top_lp;
	uint64_t *pick_part;         /* cuda_pick's scratch; NULL past FWD_PICK_MAX_VOCAB */
	int32_t *dev_mask_rows, *host_mask_rows; /* a step's constrained rows (fwd_masks), max_seqs (host: pinned) */
	uint32_t *dev_mask_bits, *host_mask_bits;
	int max_seqs;                /* sequences a step may carry (and its most constrained rows) */
	int64_t att_part_rows;
	void *blas_ws;
	/* staging: tokens, positions, table offsets, logit rows, then the tables */
	int32_t *host_ints, *dev_ints;
	int step_bidir;              /* this step has a sequence that attends bidirectionally (its ends staged) */
	int step_decode;             /* every token of this step is its sequence's only one (no prefill tiles) */
	int64_t table_cap;
	struct graph graphs[GRAPH_CACHE];
	uint64_t graph_clock;
	struct step_shape recent[GRAPH_RECENT]; /* the last steps' shapes, a ring */
	uint64_t n_recent;           /* steps put in it */
	int use_graphs;              /* RESIDENT_CUDA_GRAPHS=0 turns them off */
	int flash_tokens;            /* tokens of a prefill tile of flash.cu's kernel; 0: not used */
	/*
	 * This step's longest sequence rounded up to split pieces, but no more
	 * pieces than its attention splits into (cuda_kv.max_len, step_split)
	 */
	int att_len;
	int att_tc;                  /* this step's cuda_kv.dec_tc: tc_blocks from tc_decode_len on, else 0 */
	int tc_decode_len;           /* a sequence's length from which decode tokens take the tensor cores; 0: never */
	int tc_blocks;               /* then cuda_kv.dec_tc: the decode kernel's blocks a multiprocessor */
	int att_wide;                /* cuda_kv.wide: the split kernel's wide blocks a multiprocessor */
	int cluster_sms;             /* multiprocessors where the device launches clusters (sm_90), else 0 */
	struct prof prof;
	/*
	 * The feed-forwards kept in host memory (backend_opts.host_ffn): a
	 * step copies such a layer's normed rows down to host_h, a host
	 * function of the stream runs host_run's layer on them into host_out
	 * (step_T rows), and the rows go back up, all inside the step's graph.
	 */
	uint8_t *host_ffn;           /* n_layer flags; NULL: every layer on the device */
	struct cpu_pool *host_pool;
	struct cpu_ffn *host_run;
	float *host_h, *host_out;    /* pinned, max_tokens rows of n_embd */
	float *host_x;               /* pinned: the step's embeddings, looked up by the host when the token
	                                embeddings stay there (cuda_load's embd_on_host); NULL: on the device */
	struct host_call *host_calls;/* n_layer */
	int step_T;                  /* the tokens of the step under way */
	/*
	 * A step of stream_min tokens or more brings each host layer's weights
	 * up instead (host_form, pinned, in the GPU's form) into its stage
	 * buffer (stream_slot: the two alternate) on up_stream, while the layers
	 * before it compute, and runs it on the device as streamed[l] (its
	 * weights in that buffer). NULL without host layers.
	 */
	uint8_t **host_form;         /* n_layer: NULL for device layers */
	size_t *host_form_bytes;
	int *stream_slot;
	struct cuda_layer *streamed;
	uint8_t *stage_w[2];
	size_t stage_bytes;          /* of each */
	cudaStream_t up_stream;
	cudaEvent_t w_ready[2], w_free[2];
	int stream_min;
	/*
	 * A dense model's bus layers (n_layer flags; NULL: none): host layers
	 * brought up at every token count, every other one, so that the bus
	 * carries one's weights while the host computes the one before it.
	 */
	uint8_t *bus_layer;
	/*
	 * Hot experts (backend_opts.hot_experts): each host layer of experts
	 * holds n_hot of them on the device too, in hot[l]'s slots (its router
	 * there as well). A step of fewer than stream_min tokens routes such a
	 * layer on the device; the side stream copies the routing and the
	 * rows to the host, whose threads compute the chosen experts the
	 * device does not hold while the device computes the ones it does,
	 * and the mixture adds both. Between steps hot_settle moves the most
	 * chosen experts (cpu_ffn_chosen's counts, fading) into the slots of
	 * the least chosen, copied from host_form on up_stream while steps run.
	 * hot NULL: none.
	 */
	struct cuda_layer *hot;      /* n_layer (host layers only) */
	int n_hot;
	uint8_t *hot_w;              /* device: the host layers' routers and slots */
	int32_t *slot_of;            /* pinned, n_layer x n_expert: each expert's slot, -1: on the host only */
	int32_t *dev_slot_of;        /* its device copy, which the step reads */
	int32_t *hot_expert;         /* n_layer x n_hot: the expert in each slot, -1: none */
	int32_t *host_ids;           /* pinned, max_tokens x n_expert_used: the step's routing */
	float *host_wt;
	size_t hot_gu_off, hot_down_off; /* expert 0's gate/up and down in a host layer's host_form */
	cudaStream_t side;
	cudaEvent_t routed, host_done, moved;
	struct hot_move moves[HOT_MOVES];
	int hot_pending;             /* moves in flight (their copies end at moved) */
	int hot_dirty;               /* slot_of changed since the device copy was made */
	int64_t hot_moved;           /* moves done since the load */
	/*
	 * Experts brought up over the bus (cuda_bus; bus NULL: none): of the
	 * chosen experts a hot layer does not hold, a step shares those it
	 * computes between the host and the bus by bus_share, the bus's part
	 * copied into stage_w[0] (which no layer is brought up into in a step
	 * of fewer than stream_min tokens). Each token count chooses its share
	 * by the times its steps took (bus_tally, stream_min of them).
	 */
	struct cuda_bus *bus;        /* n_layer (host layers only) */
	float *bus_share, *dev_bus_share; /* pinned, and the device copy the step reads (bus[l].share) */
	int32_t *host_step_of;       /* pinned, n_expert: the step's table of the layer the host computes */
	struct bus_tally *bus_tally;
	int bus_fixed;               /* the share stays as RESIDENT_CUDA_BUS_SHARE set it */
};

/* ---- load (cuda_load.cu) ---- */

/* The backend_ops entries of load, plan and free (the ops table is cuda_backend.cu's). */
int cuda_plan(const struct model_desc *m, const struct backend_opts *o, struct backend_plan *p, char *err);
int cuda_load(const struct model_desc *m, const struct backend_opts *o, struct backend **out, char *err);
void cuda_free(struct backend *b);

/*
 * (Re)makes the pinned staging area and its device twin for table_cap
 * block-table entries: at load, and when a step needs more entries.
 */
int cuda_alloc_staging(struct backend *b, int64_t table_cap, char *err);

/* ---- the step (cuda_backend.cu) ---- */

/* Forgets every captured graph (they read the staging area: it moved, or the backend goes). */
void cuda_drop_graphs(struct backend *b);

/* The step's timing (RESIDENT_CUDA_TIMING): made at load, printed and destroyed at free. */
int cuda_prof_open(struct prof *p, char *err);
void cuda_prof_close(struct prof *p);

#endif
