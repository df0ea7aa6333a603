/*
 * cuda_backend.cu: the CUDA backend. The same forward step as the CPU
 * reference (kernels/cpu/cpu_backend.c), on one GPU:
 *
 * - load uploads every matrix once as stored (quantized blocks, one
 *   allocation), the norms, biases and RoPE frequencies as float (a
 *   second), and allocates the fp16 KV pool, the activations for
 *   max_tokens rows, the fp16 scratch of the tensor-core path and a pinned
 *   staging area for each step's token data; nothing is allocated per step
 *   (the block-table area only grows, if a step ever needs more);
 * - forward copies the step's tokens, positions and block tables in one
 *   transfer, runs the layers as a stream of kernels (matmul.cu, norm.cu,
 *   attention.cu), and copies the logits back; the one synchronisation is
 *   at the end;
 * - every CUDA call is checked: a failure is a negative return code with
 *   file, line and CUDA's message, never an abort.
 *
 * KV pool: [block][layer][K|V][KV_BLOCK_TOKENS][n_head_kv * head_dim], fp16.
 *
 * kv_read / kv_write copy whole blocks between the pool and host memory on
 * the calling thread's own stream (cudaStreamPerThread: the engine thread
 * and the KV disk thread each have theirs), never on the stream of the
 * steps: a copy never waits for a step, nor a step for a copy, and the
 * blocks copied are ones no step is using (kernels.h).
 *
 * Exact mode (backend_opts.exact): the pool holds fp32 and every product
 * takes the fp32 matrix-vector path whatever the token count (never the
 * int8 kernels), so that no activation is rounded to fp16 or int8 and the
 * step differs from the CPU's exact mode by float order alone.
 */
#include "attention.cuh"
#include "cuda_common.cuh"
#include "dequant.cuh"
#include "matmul.cuh"
#include "moe.cuh"
#include "norm.cuh"
#include "pick.cuh"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Logit rows computed per pass of the output matrix. */
#define LOGIT_ROWS 64
/* Ints of the staged penalty windows of T logit rows: their tokens, then their counts. */
#define PEN_INTS(T) ((size_t)(T) * FWD_PICK_PENALTY_MAX * 2)
/* cuBLAS workspace (what it wants on Hopper). */
#define BLAS_WORKSPACE ((size_t)32 << 20)
/* Allocations are rounded up to this, so that every row start is 16-byte aligned. */
#define DEV_ALIGN 256
/* First size of the block-table area, in entries, unless the pool needs less. */
#define TABLE_CAP0 (1 << 20)
/* Default largest token count for the matrix-vector kernels. */
#define MMV_MAX_DEFAULT 1 /* measured: 2 tokens and more faster on the tensor cores (mmt.cu, qgemm.cu) */
/* Steps of up to this many tokens replay a captured CUDA graph. */
#define GRAPH_MAX_TOKENS 64
/* Graphs kept, one per (tokens, logit rows) shape, least recently used replaced. */
#define GRAPH_CACHE 32
/* Each of the two pinned buffers that KV blocks cross to and from host memory through. */
#define KV_STAGE_BYTES ((size_t)1 << 20)
/* Most phase marks timed in one step (RESIDENT_CUDA_TIMING). */
#define PROF_EVENTS 1024

/* What the GPU does between two marks. */
enum phase { PH_STAGE, PH_MATMUL, PH_ATTN, PH_NORM, PH_OUTPUT, PH_END, PH_COUNT };

static const char *const phase_names[PH_COUNT] = {
	"staging", "matmul", "attention", "norm/act", "output", "end",
};

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
 * so one graph serves every step of the same token and logit-row counts.
 */
struct step_shape {
	int n_tok, n_logits, att_len;
};

struct graph {
	struct step_shape shape;
	uint64_t used;
	cudaGraphExec_t exec;
};

/* Steps of one shape in a row, the last of them captured (see shape_steady). */
#define GRAPH_AFTER 3

/*
 * The step's integer data, in the pinned staging area and its device twin:
 * max_tokens each of tokens, positions, table offsets, logit rows and
 * flags of the tokens in prefill tiles, max_tokens + 1 for the tiles
 * (their count first), then the block tables.
 */
struct step_ints {
	int32_t *tokens, *pos, *tab, *lrows, *fa_tok, *fa_tiles, *tables;
};
/* int32 of the staging area before the tables. */
#define STEP_INTS(T) (6 * (size_t)(T) + 1)

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
	void *kv;                    /* __half, or float in exact mode */
	int exact;                   /* backend_opts.exact: fp32 pool, fp32 products only */
	int64_t kv_blocks;
	size_t kv_stride;            /* elements of one block's K (or V) of one layer */
	int max_tokens;
	/* activations, max_tokens rows each (logits: LOGIT_ROWS) */
	float *x, *h, *q, *k, *v, *att, *gate, *up, *ffn_out, *logits;
	float *att_part;             /* the pieces of split attention */
	struct cuda_moe_scratch moe; /* experts: the routing and rows of a step (max_tokens x n_expert_used) */
	int32_t *dev_argmax, *host_argmax; /* the greedy picks of a step's logits rows (host: pinned) */
	char *stage;                 /* 2 x KV_STAGE_BYTES, pinned; NULL until the first copy */
	cudaEvent_t stage_ev[2];     /* the last copy through each */
	float2 *argmax_part;         /* their partial picks */
	struct fwd_pick *dev_pick, *host_pick; /* how sampled rows are drawn (host: pinned) */
	int32_t *dev_pen, *host_pen; /* their penalty windows: tokens, then counts (max_tokens * FWD_PICK_PENALTY_MAX each) */
	float *dev_lp, *host_lp;     /* their log-probabilities */
	int32_t *dev_top_ids, *host_top_ids; /* their most likely tokens (max_tokens * FWD_TOP_LOGPROBS) */
	float *dev_top_lp, *host_top_lp;
	uint64_t *pick_part;         /* cuda_pick's scratch; NULL past FWD_PICK_MAX_VOCAB */
	int32_t *dev_mask_rows, *host_mask_rows; /* a step's constrained rows (fwd_masks), max_seqs (host: pinned) */
	uint32_t *dev_mask_bits, *host_mask_bits;
	int max_masks;               /* max_seqs */
	int64_t att_part_rows;
	void *blas_ws;
	/* staging: tokens, positions, table offsets, logit rows, then the tables */
	int32_t *host_ints, *dev_ints;
	int64_t table_cap;
	struct graph graphs[GRAPH_CACHE];
	uint64_t graph_clock;
	struct step_shape last;      /* the last step's shape */
	int last_runs;               /* steps in a row of that shape */
	int use_graphs;              /* RESIDENT_CUDA_GRAPHS=0 turns them off */
	int flash_tokens;            /* tokens of a prefill tile of flash.cu's kernel; 0: not used */
	int att_len;                 /* this step's longest sequence, rounded up to split pieces (cuda_kv.max_len) */
	int cluster_sms;             /* multiprocessors where the device launches clusters (sm_90), else 0 */
	struct prof prof;
};

int cuda_pdl;

int
cuda_fail(char *err, const char *file, int line, const char *what, const char *msg)
{
	const char *base = strrchr(file, '/');

	return err_set(err, ERR_DEVICE, "%s:%d: %s: %s", base ? base + 1 : file, line, what, msg);
}

int
cuda_fault_kind(const char *call)
{
	if (strncmp(call, "cudaMemcpy", 10) == 0)
		return FAULT_COPY;
	if (strncmp(call, "cudaMalloc", 10) == 0)
		return FAULT_ALLOC;
	/* cuda_launch(...), and the launch helpers, templated ones (mmq_launch<TY>(...)) included */
	if (strncmp(call, "cudaGraphLaunch", 15) == 0 || strstr(call, "_launch(") != NULL || strstr(call, "_launch<") != NULL)
		return FAULT_LAUNCH;
	return -1;
}

/* Rounds n up to DEV_ALIGN. */
static size_t
align_up(size_t n)
{
	return (n + DEV_ALIGN - 1) / DEV_ALIGN * DEV_ALIGN;
}

/* Bytes of GPU memory for n floats, aligned. */
static size_t
floats_bytes(size_t n)
{
	return align_up(n * sizeof(float));
}

/* ---- timing ---- */

/* Creates the events if RESIDENT_CUDA_TIMING is set. */
static int
prof_open(struct prof *p, char *err)
{
	const char *s = getenv("RESIDENT_CUDA_TIMING");

	if (s == NULL || *s == '\0' || *s == '0')
		return 0;
	for (int i = 0; i < PROF_EVENTS; i++)
		CK(cudaEventCreate(&p->ev[i]));
	p->on = strcmp(s, "step") == 0 ? PROF_STEPS : atoi(s) > 1 ? PROF_EACH : PROF_PHASES;
	return 0;
}

/* The work queued from here on belongs to phase ph. */
static void
prof_mark(struct backend *b, enum phase ph)
{
	struct prof *p = &b->prof;

	if (p->on == PROF_STEPS) {
		if (ph == PH_STAGE && p->steps > 0)
			p->host_ms += (double)(now_ns() - p->left_ns) / 1e6;
		/* a step's two events alternate between two pairs, so that the last step's end is kept */
		if (ph == PH_STAGE || ph == PH_END)
			cudaEventRecord(p->ev[2 * (p->steps & 1) + (ph == PH_END)], b->stream);
		return;
	}
	if (!p->on || p->n >= PROF_EVENTS)
		return;
	p->ph[p->n] = ph;
	cudaEventRecord(p->ev[p->n++], b->stream);
}

/* PROF_STEPS, after the step's synchronisation: its span, and the wait since the step before. */
static int
prof_span(struct prof *p, char *err)
{
	int k = 2 * (int)(p->steps & 1);
	float ms;

	CK(cudaEventElapsedTime(&ms, p->ev[k], p->ev[k + 1]));
	p->span_ms += ms;
	p->left_ns = now_ns();
	if (p->steps > 0) {
		CK(cudaEventElapsedTime(&ms, p->ev[(k ^ 2) + 1], p->ev[k]));
		p->idle_ms += ms;
	}
	return 0;
}

/* After the step's synchronisation: adds each interval to its phase. */
static int
prof_step(struct prof *p, int n_tok, char *err)
{
	float ms;
	int rc;

	if (!p->on)
		return 0;
	if (p->on == PROF_STEPS && (rc = prof_span(p, err)) != 0)
		return rc;
	for (int i = 1; i < p->n; i++) {
		CK(cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]));
		p->ms[p->ph[i - 1]] += ms;
	}
	if (p->on == PROF_EACH) {
		fprintf(stderr, "cuda step of %d tokens:", n_tok);
		for (int ph = 0; ph < PH_END; ph++) {
			float sum = 0;

			for (int i = 1; i < p->n; i++)
				if (p->ph[i - 1] == (enum phase)ph) {
					CK(cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]));
					sum += ms;
				}
			fprintf(stderr, " %s %.3f", phase_names[ph], sum);
		}
		fprintf(stderr, " ms\n");
	}
	p->n = 0;
	p->steps++;
	p->tokens += n_tok;
	return 0;
}

/* Prints the sums per step and destroys the events. */
static void
prof_close(struct prof *p)
{
	double all = 0, n = p->steps ? (double)p->steps : 1.0;

	if (!p->on)
		return;
	if (p->on == PROF_STEPS) {
		fprintf(stderr, "cuda timing: %lld steps, %.3f ms of GPU time per step, %.1f us idle before each "
		    "(%.1f us of it from a step's return to the next one's call)\n", (long long)p->steps, p->span_ms / n,
		    p->steps > 1 ? 1e3 * p->idle_ms / (n - 1) : 0.0, p->steps > 1 ? 1e3 * p->host_ms / (n - 1) : 0.0);
	} else {
		for (int i = 0; i < PH_COUNT; i++)
			all += p->ms[i];
		fprintf(stderr, "cuda timing: %lld steps, %lld tokens, %.3f ms of GPU time per step:",
		    (long long)p->steps, (long long)p->tokens, all / n);
		for (int i = 0; i < PH_END; i++)
			fprintf(stderr, " %s %.3f", phase_names[i], p->ms[i] / n);
		fprintf(stderr, "\n");
	}
	for (int i = 0; i < PROF_EVENTS; i++)
		cudaEventDestroy(p->ev[i]);
}

/* ---- sizes ---- */

/*
 * The widths the activations need. With experts, the rows of their
 * products are every token's choices (R = max_tokens x n_expert_used), and
 * the scratch forms of a product's input (fp16, int8) hold as many rows.
 */
struct dims {
	size_t T, embd, nq, nkv, ff, widest, vocab;
	size_t R, E, F;              /* expert rows, experts, an expert's width; 0 without experts */
	size_t ffn;                  /* floats of each of gate and up */
	size_t forms;                /* elements of the fp16 and int8 forms of a product's input */
	size_t scales;               /* rows of the fp16 form */
	size_t tiles;                /* ints of the grouped products' tile table */
	size_t S;                    /* sequences a step may carry (the most constrained rows) */
};

static struct dims
model_dims(const struct model_hparams *hp, const struct backend_opts *o)
{
	struct dims d;

	d.T = (size_t)o->max_tokens;
	d.S = o->max_seqs > 0 ? MIN((size_t)o->max_seqs, d.T) : d.T;
	d.embd = (size_t)hp->n_embd;
	d.nq = (size_t)hp->n_head * (size_t)hp->head_dim;
	d.nkv = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
	d.E = hp->n_expert > 0 ? (size_t)hp->n_expert : 0;
	d.R = d.E > 0 ? d.T * (size_t)hp->n_expert_used : 0;
	d.F = d.E > 0 ? (size_t)hp->n_ff_exp : 0;
	d.ff = d.E > 0 ? d.F : (size_t)hp->n_ff;
	d.widest = MAX(MAX(d.embd, d.ff), d.nq);
	d.vocab = (size_t)hp->n_vocab;
	d.ffn = d.E > 0 ? d.R * d.F : d.T * d.ff;
	d.forms = MAX(d.T * d.widest, d.R * MAX(d.embd, d.F));
	d.scales = MAX(d.T, d.R);
	d.tiles = d.E > 0 ? 1 + 3 * (size_t)cuda_moe_max_tiles((int)d.R, (int)d.E, MOE_MIN_TILE_ROWS) : 0;
	return d;
}

/* Bytes of the experts' routing arrays: four ints and a float a row, the tile table. */
static size_t
route_bytes(const struct dims *d)
{
	return d->E > 0 ? align_up(d->R * sizeof(int32_t)) * 4 + floats_bytes(d->R) + align_up(d->tiles * sizeof(int32_t)) +
	    DEV_ALIGN + floats_bytes(d->T * d->E) + floats_bytes(d->R * d->embd) : 0;
}

/* Bytes of the activations and their fp16 copy. */
static size_t
activation_bytes(const struct dims *d)
{
	size_t logit_rows = MIN(d->T, (size_t)LOGIT_ROWS);

	return floats_bytes(d->T * d->embd) * 2 + floats_bytes(d->T * d->widest) +
	    floats_bytes(d->T * d->nq) * 2 + floats_bytes(d->T * d->nkv) * 2 +
	    floats_bytes(d->ffn) * 2 + floats_bytes(logit_rows * d->vocab) +
	    align_up(d->forms * sizeof(__half)) + floats_bytes(d->scales) +
	    align_up(d->forms * 2) + align_up(d->forms / 32 * sizeof(float2)) +
	    align_up(CUDA_ARGMAX_PARTS(logit_rows) * sizeof(float2)) + align_up(d->T * sizeof(struct fwd_pick)) +
	    align_up(PEN_INTS(d->T) * sizeof(int32_t)) + floats_bytes(d->T) + route_bytes(d) +
	    align_up(d->S * sizeof(int32_t)) + align_up(d->S * FWD_MASK_WORDS(d->vocab) * sizeof(uint32_t)) +
	    align_up(d->T * FWD_TOP_LOGPROBS * sizeof(int32_t)) + floats_bytes(d->T * FWD_TOP_LOGPROBS) +
	    (d->vocab <= FWD_PICK_MAX_VOCAB ? align_up(CUDA_PICK_SCRATCH(logit_rows, d->vocab) * sizeof(uint64_t)) : 0);
}

/*
 * Layer L's matrices, in upload order: Q, K, V, O; then gate, up, down; or,
 * with experts, the router, each expert's gate and up, then each one's
 * down (so that each expert's gate and up are one product, and the
 * experts' rows evenly strided). Returns how many.
 */
static int
layer_matrices(const struct model_layer *L, int n_expert, const struct model_tensor **out)
{
	int n = 0;

	out[n++] = L->wq, out[n++] = L->wk, out[n++] = L->wv, out[n++] = L->wo;
	if (n_expert == 0) {
		out[n++] = L->w_gate, out[n++] = L->w_up, out[n++] = L->w_down;
		return n;
	}
	out[n++] = L->router;
	for (int e = 0; e < n_expert; e++)
		out[n++] = &L->exp_gate[e], out[n++] = &L->exp_up[e];
	for (int e = 0; e < n_expert; e++)
		out[n++] = &L->exp_down[e];
	return n;
}

/* Matrices of one layer (layer_matrices). */
static int
layer_matrix_count(const struct model_hparams *hp)
{
	return hp->n_expert > 0 ? 5 + 3 * hp->n_expert : 7;
}

/* The matrices of the model, tok_embd first; the output only when not tied. */
static int
list_matrices(const struct model_desc *m, const struct model_tensor **out)
{
	int n = 0;

	out[n++] = m->tok_embd;
	if (m->output != m->tok_embd)
		out[n++] = m->output;
	for (int l = 0; l < m->hp.n_layer; l++)
		n += layer_matrices(&m->layers[l], m->hp.n_expert, out + n);
	return n;
}

/* Refuses what the kernels do not handle, before anything is allocated. */
static int
check_model(const struct model_desc *m, const struct model_tensor **mats, int n, char *err)
{
	const struct model_hparams *hp = &m->hp;

	if (hp->n_expert > 0 && (hp->n_expert > MOE_MAX_EXPERTS || hp->n_expert_used > MOE_MAX_USED ||
	    !cuda_row_fits(hp->n_ff_exp)))
		return err_set(err, ERR_UNSUPPORTED, "%d experts of %d rows, %d a token: the CUDA backend takes up to %d, "
		    "rows a multiple of 4 up to 32768, up to %d a token", hp->n_expert, hp->n_ff_exp, hp->n_expert_used,
		    MOE_MAX_EXPERTS, MOE_MAX_USED);
	if (hp->head_dim % WARP != 0 || hp->head_dim > 8 * WARP)
		return err_set(err, ERR_UNSUPPORTED, "head_dim %d: the CUDA backend wants a multiple of "
		    "32 up to 256", hp->head_dim);
	if (hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv != 0)
		return err_set(err, ERR_UNSUPPORTED, "%d heads over %d KV heads", hp->n_head, hp->n_head_kv);
	if (!cuda_row_fits(hp->n_embd) || (hp->n_expert == 0 && !cuda_row_fits(hp->n_ff)) ||
	    !cuda_row_fits(hp->n_head * hp->head_dim))
		return err_set(err, ERR_UNSUPPORTED, "rows of %d, %d and %d: the CUDA row kernels take multiples of 4 "
		    "up to 32768", hp->n_embd, hp->n_expert > 0 ? hp->n_ff_exp : hp->n_ff, hp->n_head * hp->head_dim);
	for (int i = 0; i < n; i++) {
		const struct quant_traits *qt = quant_traits(mats[i]->type);

		if (!cuda_type_supported(mats[i]->type))
			return err_set(err, ERR_UNSUPPORTED, "%s: type %s has no CUDA kernel", mats[i]->name,
			    qt ? qt->name : "unknown");
		if (mats[i]->ne[0] % 8 != 0)
			return err_set(err, ERR_UNSUPPORTED, "%s: rows of %lld (a multiple of 8 only)",
			    mats[i]->name, (long long)mats[i]->ne[0]);
	}
	return 0;
}

/* A layer's small weights (norms, biases, sinks): as many as small_weights gives. */
#define SMALL_WEIGHTS 15

/* Layer L's small weights and where they go in c (NULL ones are skipped). */
static int
small_weights(const struct model_layer *L, struct cuda_layer *c, const struct model_tensor **t, float ***at)
{
	int k = 0;

#define W(field) (t[k] = L->field, at[k++] = c != NULL ? &c->field : NULL)
#define WM(field, to) (t[k] = L->field, at[k++] = c != NULL ? &c->moe.to : NULL)
	W(attn_norm), W(ffn_norm), W(post_attn_norm), W(post_ffn_norm), W(q_norm), W(k_norm);
	W(bq), W(bk), W(bv), W(bo), W(sinks);
	WM(router_b, router_b), WM(exp_gate_b, gate_b), WM(exp_up_b, up_b), WM(exp_down_b, down_b);
#undef W
#undef WM
	return k;
}

/* Floats of a small weight on the GPU, aligned (an expert bias is a row per expert). */
static size_t
small_len(const struct model_tensor *t)
{
	size_t a = DEV_ALIGN / sizeof(float);

	return t == NULL ? 0 : ((size_t)t->ne[0] * (size_t)t->ne[1] + a - 1) / a * a;
}

/* Floats of the small weights: norms, biases, two RoPE tables (each aligned). */
static size_t
small_floats(const struct model_desc *m)
{
	const struct model_tensor *t[SMALL_WEIGHTS];
	float **at[SMALL_WEIGHTS];
	size_t n = 0, a = DEV_ALIGN / sizeof(float);

	for (int l = 0; l < m->hp.n_layer; l++) {
		int k = small_weights(&m->layers[l], NULL, t, at);

		for (int i = 0; i < k; i++)
			n += small_len(t[i]);
	}
	n += small_len(m->out_norm);
	return n + 2 * (((size_t)m->hp.head_dim / 2 + a - 1) / a * a);
}

/* ---- load ---- */

static void cuda_free(struct backend *b);

/* The value of environment variable name as an integer, or def where it is unset or empty. */
static int
env_int(const char *name, int def)
{
	const char *s = getenv(name);

	return s != NULL && *s != '\0' ? atoi(s) : def;
}

/* A CUDA device is there and usable. */
static int
open_device(struct backend *b, int device, char *err)
{
	int n = 0, major = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess || n == 0)
		return err_set(err, ERR_DEVICE, "no CUDA device: %s",
		    e != cudaSuccess ? cudaGetErrorString(e) : "none found");
	if (device < 0 || device >= n)
		return err_set(err, ERR_INVAL, "CUDA device %d does not exist (%d found)", device, n);
	b->device = device;
	CK(cudaSetDevice(device));
	CK(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
	CK(cudaDeviceGetAttribute(&b->mm.sms, cudaDevAttrMultiProcessorCount, device));
	CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
	/* RESIDENT_CUDA_PDL=0: every kernel waits for the one before it to end before it launches */
	cuda_pdl = major >= 9 && env_int("RESIDENT_CUDA_PDL", 1) != 0;
	b->cluster_sms = major >= 9 ? b->mm.sms : 0;
	return 0;
}

/* Refuses a model that does not fit, saying how much was needed and how much was free. */
static int
check_memory(size_t need, size_t weights, size_t kv, size_t act, char *err)
{
	size_t free_b = 0, total = 0;

	CK(cudaMemGetInfo(&free_b, &total));
	if (need > free_b)
		return err_set(err, ERR_NOMEM, "the model needs %.1f MiB of GPU memory (weights %.1f, "
		    "KV pool %.1f, activations and scratch %.1f), %.1f MiB free of %.1f",
		    need / 1048576.0, weights / 1048576.0, kv / 1048576.0, act / 1048576.0,
		    free_b / 1048576.0, total / 1048576.0);
	return 0;
}

/* cudaMalloc with a message that says what and how much. */
static int
dev_alloc(void **p, size_t bytes, const char *what, char *err)
{
	cudaError_t e;

	if (fault_hit(FAULT_CUDA, FAULT_ALLOC)) {
		*p = NULL;
		return err_set(err, ERR_NOMEM, "cudaMalloc of %.1f MiB for %s: %s", bytes / 1048576.0, what,
		    fault_message(FAULT_CUDA));
	}
	if ((e = cudaMalloc(p, bytes ? bytes : 1)) != cudaSuccess) {
		*p = NULL;
		return err_set(err, ERR_NOMEM, "cudaMalloc of %.1f MiB for %s: %s", bytes / 1048576.0,
		    what, cudaGetErrorString(e));
	}
	return 0;
}

/* The GPU form of matrix t (check_model has refused what the GPU does not read); its data not yet placed. */
static struct cuda_weight
form_of(const struct model_tensor *t)
{
	struct cuda_weight w;

	cuda_weight_form(t->type, t->ne[0], t->ne[1], &w);
	return w;
}

/* Bytes of matrix t on the GPU. */
static size_t
gpu_bytes(const struct model_tensor *t)
{
	struct cuda_weight w = form_of(t);

	return w.row_bytes * (size_t)w.n;
}

/*
 * Where each matrix goes in the weights allocation; returns the total. A
 * matrix of the same type and width as the one before it starts right
 * where that one ends, so that Q/K/V and gate/up can run as one product
 * (cuda_matmul_multi); the others start aligned.
 */
static size_t
matrix_offsets(const struct model_tensor **mats, int n, size_t *off)
{
	size_t end = 0;

	for (int i = 0; i < n; i++) {
		int follows = i > 0 && mats[i]->type == mats[i - 1]->type && mats[i]->ne[0] == mats[i - 1]->ne[0];

		off[i] = follows ? end : align_up(end);
		end = off[i] + gpu_bytes(mats[i]);
	}
	return align_up(end);
}

/* Uploads the matrices into one allocation at their offsets. */
static int
upload_matrices(struct backend *b, const struct model_tensor **mats, int n, const size_t *off, size_t total,
    char *err)
{
	int rc;

	if ((rc = dev_alloc((void **)&b->weights, total, "the weights", err)) != 0)
		return rc;
	for (int i = 0; i < n && rc == 0; i++) {
		struct cuda_weight w = form_of(mats[i]);

		rc = cuda_weight_upload(&w, mats[i]->data, b->weights + off[i], b->stream, err);
	}
	return rc;
}

/* 1 if t is multiplied (every matrix but an embedding not tied to the output): it may want weight tiles. */
static int
is_product(const struct model_desc *m, const struct model_tensor *t)
{
	return t != m->tok_embd || t == m->output;
}

/* The cuda_weight of matrix t, found among the uploaded ones. */
static struct cuda_weight
weight_of(const struct backend *b, const struct model_tensor **mats, int n, const size_t *off,
    const struct model_tensor *t)
{
	struct cuda_weight w = form_of(t);

	for (int i = 0; i < n; i++)
		if (mats[i] == t) {
			w.d = b->weights + off[i];
			break;
		}
	return w;
}


/* Appends a small weight as float to the host buffer; returns its device address. */
static float *
add_small(const struct model_tensor *t, float *host, size_t *used, float *dev)
{
	size_t at = *used;

	if (t == NULL)
		return NULL;
	quant_dequantize(t->type, t->data, host + at, t->ne[0] * t->ne[1]);
	*used += small_len(t);
	return dev + at;
}

/* The RoPE frequencies of global (swa 0) or sliding layers, as the CPU's (model_rope_freqs); the device address. */
static float *
add_rope(const struct model_hparams *hp, int swa, float *host, size_t *used, float *dev)
{
	size_t a = DEV_ALIGN / sizeof(float), at = *used;

	model_rope_freqs(hp, swa, host + at);
	*used += ((size_t)hp->head_dim / 2 + a - 1) / a * a;
	return dev + at;
}

/* Uploads the norms, biases and RoPE tables; points the layers at them. */
static int
upload_smalls(struct backend *b, char *err)
{
	const struct model_desc *m = b->m;
	const struct model_hparams *hp = &m->hp;
	size_t n = small_floats(m), used = 0;
	float *host = (float *)xcalloc(n, sizeof(float)), *dev;
	int rc;

	if ((rc = dev_alloc((void **)&b->smalls, n * sizeof(float), "norms and biases", err)) != 0) {
		free(host);
		return rc;
	}
	dev = b->smalls;
	for (int l = 0; l < hp->n_layer; l++) {
		const struct model_tensor *t[SMALL_WEIGHTS];
		float **at[SMALL_WEIGHTS];
		int k = small_weights(&m->layers[l], &b->layers[l], t, at);

		for (int i = 0; i < k; i++)
			*at[i] = add_small(t[i], host, &used, dev);
	}
	b->out_norm = add_small(m->out_norm, host, &used, dev);
	b->inv_freq[0] = add_rope(hp, 0, host, &used, dev);
	b->inv_freq[1] = add_rope(hp, 1, host, &used, dev);
	cudaError_t e = cudaMemcpy(b->smalls, host, n * sizeof(float), cudaMemcpyHostToDevice);
	free(host);
	CK(e);
	return 0;
}

/* Bytes of the split-attention scratch on a device. */
static size_t
part_bytes(int device, const struct model_hparams *hp)
{
	return floats_bytes((size_t)cuda_attention_part_rows(device) * ((size_t)hp->head_dim + 2));
}

/* The experts' routing arrays, router logits and down rows (their gate and up rows are the backend's). */
static int
alloc_moe(struct backend *b, const struct dims *d, char *err)
{
	struct cuda_route *r = &b->moe.route;
	int rc;

	(void)((rc = dev_alloc((void **)&r->logit, floats_bytes(d->T * d->E), "the experts' routing", err)) ||
	    (rc = dev_alloc((void **)&r->expert, d->R * sizeof(int32_t), "the experts' routing", err)) ||
	    (rc = dev_alloc((void **)&r->weight, floats_bytes(d->R), "the experts' routing", err)) ||
	    (rc = dev_alloc((void **)&r->row, d->R * sizeof(int32_t), "the experts' routing", err)) ||
	    (rc = dev_alloc((void **)&r->row_expert, d->R * sizeof(int32_t), "the experts' routing", err)) ||
	    (rc = dev_alloc((void **)&r->row_slot, d->R * sizeof(int32_t), "the experts' routing", err)) ||
	    (rc = dev_alloc((void **)&r->tiles, d->tiles * sizeof(int32_t), "the experts' routing", err)) ||
	    (rc = dev_alloc((void **)&b->moe.down, floats_bytes(d->R * d->embd), "the experts' rows", err)));
	b->moe.gate = b->gate, b->moe.up = b->up;
	return rc;
}

/* The activations, the KV pool and the scratch. */
static int
alloc_buffers(struct backend *b, const struct dims *d, size_t kv_bytes, int64_t wh_elems, char *err)
{
	size_t T = d->T;
	int rc = 0;

	b->att_part_rows = cuda_attention_part_rows(b->device);
	if ((rc = dev_alloc((void **)&b->kv, kv_bytes, "the KV pool", err)) != 0)
		return rc;
	CK(cudaMemset(b->kv, 0, kv_bytes));
	(void)((rc = dev_alloc((void **)&b->x, floats_bytes(T * d->embd), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->h, floats_bytes(T * d->widest), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->q, floats_bytes(T * d->nq), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->att, floats_bytes(T * d->nq), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->k, floats_bytes(T * d->nkv), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->v, floats_bytes(T * d->nkv), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->gate, floats_bytes(d->ffn), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->up, floats_bytes(d->ffn), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->ffn_out, floats_bytes(T * d->embd), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->logits, floats_bytes(MIN(T, (size_t)LOGIT_ROWS) * d->vocab),
	    "logits", err)) ||
	    (rc = dev_alloc((void **)&b->mm.xh, d->forms * sizeof(__half), "fp16 activations", err)) ||
	    (rc = dev_alloc((void **)&b->mm.xscale, floats_bytes(d->scales), "fp16 activations", err)) ||
	    /* exact mode keeps float activations: no int8 copies, so the int8 kernels stay off */
	    (!b->exact && (rc = dev_alloc((void **)&b->mm.xq, d->forms * 2, "int8 activations", err))) ||
	    (!b->exact && (rc = dev_alloc((void **)&b->mm.xd, d->forms / 32 * sizeof(float2),
	    "int8 activations", err))) ||
	    (d->E > 0 && (rc = alloc_moe(b, d, err))) ||
	    (rc = dev_alloc((void **)&b->mm.wh, (size_t)wh_elems * sizeof(__half), "fp16 weight tiles",
	    err)) ||
	    (rc = dev_alloc(&b->blas_ws, BLAS_WORKSPACE, "the cuBLAS workspace", err)) ||
	    (rc = dev_alloc((void **)&b->att_part, part_bytes(b->device, &b->m->hp), "split attention", err)) ||
	    (rc = dev_alloc((void **)&b->dev_argmax, T * sizeof(int32_t), "argmax", err)) ||
	    (rc = dev_alloc((void **)&b->argmax_part, CUDA_ARGMAX_PARTS(MIN(T, (size_t)LOGIT_ROWS)) * sizeof(float2),
	    "argmax", err)) ||
	    (rc = dev_alloc((void **)&b->dev_pick, T * sizeof(struct fwd_pick), "sampling", err)) ||
	    (rc = dev_alloc((void **)&b->dev_pen, PEN_INTS(T) * sizeof(int32_t), "sampling", err)) ||
	    (rc = dev_alloc((void **)&b->dev_lp, floats_bytes(T), "sampling", err)) ||
	    (rc = dev_alloc((void **)&b->dev_top_ids, T * FWD_TOP_LOGPROBS * sizeof(int32_t), "sampling", err)) ||
	    (rc = dev_alloc((void **)&b->dev_top_lp, floats_bytes(T * FWD_TOP_LOGPROBS), "sampling", err)) ||
	    (rc = dev_alloc((void **)&b->dev_mask_rows, d->S * sizeof(int32_t), "grammar masks", err)) ||
	    (rc = dev_alloc((void **)&b->dev_mask_bits, d->S * FWD_MASK_WORDS(d->vocab) * sizeof(uint32_t),
	    "grammar masks", err)) ||
	    (d->vocab <= FWD_PICK_MAX_VOCAB && (rc = dev_alloc((void **)&b->pick_part,
	    CUDA_PICK_SCRATCH(MIN(T, (size_t)LOGIT_ROWS), d->vocab) * sizeof(uint64_t), "sampling", err))) ||
	    (!b->exact && (rc = dev_alloc((void **)&b->mm.part, (size_t)b->mm.part_elems * sizeof(float),
	    "split sums", err))));
	if (rc == 0) {
		CK(cudaMallocHost((void **)&b->host_argmax, T * sizeof(int32_t)));
		CK(cudaMallocHost((void **)&b->host_pick, T * sizeof(struct fwd_pick)));
		CK(cudaMallocHost((void **)&b->host_pen, PEN_INTS(T) * sizeof(int32_t)));
		CK(cudaMallocHost((void **)&b->host_lp, T * sizeof(float)));
		CK(cudaMallocHost((void **)&b->host_top_ids, T * FWD_TOP_LOGPROBS * sizeof(int32_t)));
		CK(cudaMallocHost((void **)&b->host_top_lp, T * FWD_TOP_LOGPROBS * sizeof(float)));
		CK(cudaMallocHost((void **)&b->host_mask_rows, d->S * sizeof(int32_t)));
		CK(cudaMallocHost((void **)&b->host_mask_bits, d->S * FWD_MASK_WORDS(d->vocab) * sizeof(uint32_t)));
		b->max_masks = (int)d->S;
	}
	b->mm.wh_elems = wh_elems;
	return rc;
}

/* Forgets every captured graph. */
static void
drop_graphs(struct backend *b)
{
	for (int i = 0; i < GRAPH_CACHE; i++)
		if (b->graphs[i].exec != NULL) {
			cudaGraphExecDestroy(b->graphs[i].exec);
			b->graphs[i].exec = NULL;
		}
}

/* The pinned staging area and its device twin, for table_cap table entries. */
static int
alloc_staging(struct backend *b, int64_t table_cap, char *err)
{
	size_t bytes = (STEP_INTS(b->max_tokens) + (size_t)table_cap) * sizeof(int32_t);
	int rc;

	if (b->host_ints != NULL) {
		drop_graphs(b); /* they read the old staging area */
		CK(cudaStreamSynchronize(b->stream));
		CK(cudaFreeHost(b->host_ints));
		CK(cudaFree(b->dev_ints));
		b->host_ints = b->dev_ints = NULL;
	}
	CK(cudaMallocHost((void **)&b->host_ints, bytes));
	if ((rc = dev_alloc((void **)&b->dev_ints, bytes, "the step's block tables", err)) != 0)
		return rc;
	b->table_cap = table_cap;
	return 0;
}

/* cuBLAS on the backend's stream, with its workspace given once. */
static int
open_blas(struct backend *b, char *err)
{
	cublasStatus_t s = cublasCreate(&b->mm.blas);

	if (s != CUBLAS_STATUS_SUCCESS) {
		b->mm.blas = NULL;
		return err_set(err, ERR_DEVICE, "cublasCreate: %s", cublasGetStatusString(s));
	}
	if ((s = cublasSetStream(b->mm.blas, b->stream)) != CUBLAS_STATUS_SUCCESS ||
	    (s = cublasSetWorkspace(b->mm.blas, b->blas_ws, BLAS_WORKSPACE)) != CUBLAS_STATUS_SUCCESS)
		return err_set(err, ERR_DEVICE, "cuBLAS setup: %s", cublasGetStatusString(s));
	b->mm.stream = b->stream;
	return 0;
}

/*
 * The largest token count that goes to the matrix-vector kernels
 * (RESIDENT_CUDA_MMV_MAX); in exact mode every count, since cuBLAS takes
 * fp16 activations.
 */
static int
mmv_max(int exact)
{
	return exact ? INT_MAX : env_int("RESIDENT_CUDA_MMV_MAX", MMV_MAX_DEFAULT);
}

/* Bytes of one K or V element of the pool. */
static int
kv_elem_size(const struct backend *b)
{
	return b->exact ? (int)sizeof(float) : (int)sizeof(__half);
}

/*
 * Tokens of a prefill tile of the tensor-core attention kernel for these
 * heads; 0 when it cannot serve them (exact mode's fp32 pool, groups of
 * query heads that do not divide a tile) or RESIDENT_CUDA_FLASH=0.
 */
static int
flash_tokens(const struct model_hparams *hp, int exact)
{
	struct cuda_heads hd = {};
	int n = 0;

	hd.n_head = hp->n_head, hd.n_head_kv = hp->n_head_kv, hd.head_dim = hp->head_dim;
	if (env_int("RESIDENT_CUDA_FLASH", 1) == 0 || !cuda_flash_usable(&hd, exact, &n))
		return 0;
	return n;
}

/* What load allocates: weights, activations and scratch, one KV block. */
struct sizes {
	size_t weights, act, kv_block;
	int64_t wh;                  /* elements of the fp16 tile scratch */
	int64_t part_elems;          /* floats of qgemm's split sums */
};

/* The sizes of a load, and where each matrix goes (off). Refuses what the kernels do not handle. */
static int
plan_sizes(const struct model_desc *m, const struct backend_opts *o, const struct model_tensor **mats, int n,
    size_t *off, struct sizes *z, char *err)
{
	struct dims d = model_dims(&m->hp, o);
	int rc, sms = 0;

	if ((rc = check_model(m, mats, n, err)) != 0)
		return rc;
	CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, o->device));
	z->weights = matrix_offsets(mats, n, off);
	z->wh = 1;
	for (int i = 0; i < n; i++) {
		struct cuda_weight w = form_of(mats[i]);

		if (is_product(m, mats[i]))
			z->wh = MAX(z->wh, cuda_matmul_tile_elems(&w));
	}
	z->part_elems = o->exact ? 0 : cuda_qgemm_part_elems(sms);
	z->kv_block = (size_t)m->hp.n_layer * 2 * KV_BLOCK_TOKENS * d.nkv * (o->exact ? sizeof(float) : sizeof(__half));
	z->act = activation_bytes(&d) + (size_t)z->wh * sizeof(__half) + BLAS_WORKSPACE + part_bytes(o->device, &m->hp) +
	    floats_bytes(small_floats(m)) + floats_bytes((size_t)z->part_elems);
	return 0;
}

/* The matrices of a model and room for their offsets (free both). */
static int
matrices(const struct model_desc *m, const struct model_tensor ***mats, size_t **off)
{
	size_t cap = 2 + (size_t)layer_matrix_count(&m->hp) * (size_t)m->hp.n_layer;

	*mats = (const struct model_tensor **)xcalloc(cap, sizeof **mats);
	*off = (size_t *)xcalloc(cap, sizeof **off);
	return list_matrices(m, *mats);
}

static int
cuda_plan(const struct model_desc *m, const struct backend_opts *o, uint64_t *fixed, uint64_t *kv_block, char *err)
{
	const struct model_tensor **mats;
	size_t *off;
	struct sizes z;
	int n = matrices(m, &mats, &off), rc;

	if ((rc = plan_sizes(m, o, mats, n, off, &z, err)) == 0) {
		*fixed = z.weights + z.act;
		*kv_block = z.kv_block;
	}
	free(mats), free(off);
	return rc;
}

/* Matrix i of a layer's (mats, off from its first) as uploaded. */
static struct cuda_weight
uploaded(const struct backend *b, const struct model_tensor **mats, const size_t *off, int i)
{
	struct cuda_weight w = form_of(mats[i]);

	w.d = b->weights + off[i];
	return w;
}

/*
 * Layer l's weights where the upload put them (its matrices, in
 * layer_matrices' order, from mats and off). Experts are multiplied as one
 * weight whose experts are evenly strided: each expert's gate and up one
 * run, every expert alike. ERR_UNSUPPORTED for experts that are not.
 */
static int
layer_weights(struct backend *b, int l, const struct model_tensor **mats, const size_t *off, char *err)
{
	struct cuda_layer *c = &b->layers[l];
	int E = b->m->hp.n_expert, ok = 1;

	c->wq = uploaded(b, mats, off, 0), c->wk = uploaded(b, mats, off, 1);
	c->wv = uploaded(b, mats, off, 2), c->wo = uploaded(b, mats, off, 3);
	if (E == 0) {
		c->w_gate = uploaded(b, mats, off, 4), c->w_up = uploaded(b, mats, off, 5);
		c->w_down = uploaded(b, mats, off, 6);
		return 0;
	}
	c->moe.router = uploaded(b, mats, off, 4);
	c->moe.gu = uploaded(b, mats, off, 5);
	c->moe.down = uploaded(b, mats, off, 5 + 2 * E);
	c->moe.gu_stride = 2 * (size_t)c->moe.gu.n * c->moe.gu.row_bytes;
	c->moe.down_stride = (size_t)c->moe.down.n * c->moe.down.row_bytes;
	for (int e = 0; e < E; e++) {
		struct cuda_weight g = uploaded(b, mats, off, 5 + 2 * e), u = uploaded(b, mats, off, 6 + 2 * e);
		struct cuda_weight d = uploaded(b, mats, off, 5 + 2 * E + e);

		ok &= cuda_weight_follows(&g, &u) && g.type == c->moe.gu.type && g.n == c->moe.gu.n &&
		    g.d == c->moe.gu.d + (size_t)e * c->moe.gu_stride && d.type == c->moe.down.type &&
		    d.d == c->moe.down.d + (size_t)e * c->moe.down_stride;
	}
	if (!ok)
		return err_set(err, ERR_UNSUPPORTED, "layer %d: experts of different types or sizes (the CUDA backend "
		    "multiplies a layer's experts as one weight)", l);
	c->moe.gu.n *= 2;
	c->moe.act.kind = b->m->hp.act, c->moe.act.alpha = b->m->hp.glu_alpha, c->moe.act.limit = b->m->hp.glu_limit;
	c->moe.n_expert = E, c->moe.n_used = b->m->hp.n_expert_used, c->moe.norm = b->m->hp.expert_norm;
	/* RESIDENT_CUDA_MOE_SLOTS: the most tokens whose experts run as slots (the exact mode's: every count) */
	c->moe.slots_max = b->exact ? INT_MAX : env_int("RESIDENT_CUDA_MOE_SLOTS", mmv_max(0));
	/*
	 * RESIDENT_CUDA_MOE_INT: the most grouped tokens on the integer kernel. MXFP4 experts while they
	 * average up to 2 rows (gpt-oss-20b, 16 sequences on an H100: 1,903 t/s, 1,452 on the tensor
	 * cores; 32: 2,412 against 2,594); Q4_K ones never (qwen3-30b-a3b, 16: 1,244 against 1,623)
	 */
	c->moe.int_max = env_int("RESIDENT_CUDA_MOE_INT", c->moe.gu.type == TT_MXFP4G ? 2 * E / c->moe.n_used : 0);
	return 0;
}

/* Everything load does, in order; on failure the caller frees what was made. */
static int
load_all(struct backend *b, const struct backend_opts *o, char *err)
{
	const struct model_desc *m = b->m;
	const struct model_tensor **mats;
	size_t *off, kv_bytes;
	struct dims d = model_dims(&m->hp, o);
	struct sizes z;
	int n = matrices(m, &mats, &off), rc;

	if ((rc = plan_sizes(m, o, mats, n, off, &z, err)) != 0 || (rc = open_device(b, o->device, err)) != 0 ||
	    (rc = cuda_attention_setup(m->hp.head_dim, err)) != 0 || (rc = cuda_qgemm_setup(err)) != 0)
		goto out;
	b->exact = o->exact != 0;
	b->mm.part_elems = z.part_elems;
	b->kv_stride = KV_BLOCK_TOKENS * d.nkv;
	kv_bytes = (size_t)o->kv_blocks * z.kv_block;
	if ((rc = check_memory(z.weights + kv_bytes + z.act, z.weights, kv_bytes, z.act, err)) != 0 ||
	    (rc = upload_matrices(b, mats, n, off, z.weights, err)) != 0 ||
	    (rc = upload_smalls(b, err)) != 0 ||
	    (rc = alloc_buffers(b, &d, kv_bytes, z.wh, err)) != 0 ||
	    (rc = alloc_staging(b, MIN((int64_t)d.S * o->kv_blocks, (int64_t)TABLE_CAP0), err)) != 0 ||
	    (rc = open_blas(b, err)) != 0 || (rc = prof_open(&b->prof, err)) != 0)
		goto out;
	b->tok_embd = weight_of(b, mats, n, off, m->tok_embd);
	b->output = weight_of(b, mats, n, off, m->output);
	for (int l = 0, i = m->output != m->tok_embd ? 2 : 1; l < m->hp.n_layer; l++, i += layer_matrix_count(&m->hp))
		if ((rc = layer_weights(b, l, mats + i, off + i, err)) != 0)
			goto out;
	b->mm.mmv_max = mmv_max(b->exact);
	b->mm.mmt_max = MIN(env_int("RESIDENT_CUDA_MMT_MAX", MMT_MAX_TOKENS), MMT_MAX_TOKENS);
	b->use_graphs = env_int("RESIDENT_CUDA_GRAPHS", 1) != 0;
	b->flash_tokens = flash_tokens(&m->hp, b->exact);
	rc = 0;
out:
	free(mats);
	free(off);
	return rc;
}

static int
cuda_load(const struct model_desc *m, const struct backend_opts *o, struct backend **out, char *err)
{
	struct backend *b;
	int rc;

	if (o->max_tokens < 1 || o->kv_blocks < 1)
		return err_set(err, ERR_INVAL, "max_tokens and kv_blocks must be positive");
	if ((rc = fault_init(FAULT_CUDA, err)) != 0)
		return rc;
	b = (struct backend *)xcalloc(1, sizeof *b);
	b->m = m;
	b->max_tokens = o->max_tokens;
	b->kv_blocks = o->kv_blocks;
	b->device = o->device;
	b->layers = (struct cuda_layer *)xcalloc((size_t)m->hp.n_layer, sizeof *b->layers);
	if ((rc = load_all(b, o, err)) != 0) {
		cuda_free(b);
		return rc;
	}
	*out = b;
	return 0;
}

static void
cuda_free(struct backend *b)
{
	if (b == NULL)
		return;
	cudaSetDevice(b->device);
	if (b->stream != NULL)
		cudaStreamSynchronize(b->stream);
	prof_close(&b->prof);
	drop_graphs(b);
	if (b->mm.blas != NULL)
		cublasDestroy(b->mm.blas);
	cudaFree(b->weights), cudaFree(b->smalls), cudaFree(b->kv);
	cudaFree(b->x), cudaFree(b->h), cudaFree(b->q), cudaFree(b->k), cudaFree(b->v);
	cudaFree(b->att), cudaFree(b->gate), cudaFree(b->up), cudaFree(b->ffn_out), cudaFree(b->logits);
	cudaFree(b->mm.xh), cudaFree(b->mm.xscale), cudaFree(b->mm.wh), cudaFree(b->blas_ws);
	cudaFree(b->mm.xq), cudaFree(b->mm.xd), cudaFree(b->mm.part);
	cudaFree(b->dev_ints), cudaFree(b->att_part), cudaFree(b->dev_argmax), cudaFree(b->argmax_part);
	cudaFree(b->dev_pick), cudaFree(b->dev_pen), cudaFree(b->dev_lp), cudaFree(b->pick_part);
	cudaFree(b->dev_mask_rows), cudaFree(b->dev_mask_bits), cudaFree(b->dev_top_ids), cudaFree(b->dev_top_lp);
	cudaFree(b->moe.route.logit), cudaFree(b->moe.route.expert), cudaFree(b->moe.route.weight);
	cudaFree(b->moe.route.row), cudaFree(b->moe.route.row_expert), cudaFree(b->moe.route.row_slot);
	cudaFree(b->moe.route.tiles), cudaFree(b->moe.down);
	void *pinned[] = { b->host_argmax, b->host_pick, b->host_pen, b->host_lp, b->host_top_ids, b->host_top_lp,
		b->host_mask_rows, b->host_mask_bits, b->stage, b->host_ints };

	for (size_t i = 0; i < ARRAY_LEN(pinned); i++)
		if (pinned[i] != NULL)
			cudaFreeHost(pinned[i]);
	for (int i = 0; i < 2; i++)
		if (b->stage_ev[i] != NULL)
			cudaEventDestroy(b->stage_ev[i]);
	if (b->stream != NULL)
		cudaStreamDestroy(b->stream);
	free(b->layers);
	free(b);
}

/* ---- forward ---- */

/* Where each part of the staging area starts, host or device. */
static struct step_ints
step_ints(const struct backend *b, int32_t *base)
{
	size_t T = (size_t)b->max_tokens;
	struct step_ints s = { base, base + T, base + 2 * T, base + 3 * T, base + 4 * T, base + 5 * T,
		base + STEP_INTS(T) };

	return s;
}

/* A sequence's new tokens from token t of the step as prefill tiles, if it has enough of them. */
static void
stage_tiles(const struct backend *b, const struct step_ints *h, int32_t t, int32_t n_new)
{
	int on = b->flash_tokens > 0 && n_new >= FLASH_MIN_TOKENS;

	for (int32_t i = 0; i < n_new; i++)
		h->fa_tok[t + i] = on;
	if (!on)
		return;
	for (int32_t i = 0; i < n_new; i += b->flash_tokens)
		h->fa_tiles[1 + h->fa_tiles[0]++] = FLASH_TILE(t + i, MIN(b->flash_tokens, n_new - i));
}

/*
 * The bound on a step's prefill tiles, by its token count alone (one graph
 * serves every step of a count): whole tiles, plus a part-tile for each
 * sequence long enough to have one; 0 when no sequence can be.
 */
static int
flash_grid(const struct backend *b, int T)
{
	if (b->flash_tokens == 0 || T < FLASH_MIN_TOKENS)
		return 0;
	return T / b->flash_tokens + T / FLASH_MIN_TOKENS + 1;
}

/*
 * Fills the staging area (tokens, positions, table offsets, logit rows,
 * prefill tiles, the block tables each token needs) and sends it. Returns
 * the logit rows.
 */
static int
stage_step(struct backend *b, const struct fwd_batch *batch, int64_t n_tab, int *n_logits, char *err)
{
	struct step_ints h;
	int32_t s, i, t = 0, tab = 0, nl = 0;
	int rc;

	if (n_tab > b->table_cap && (rc = alloc_staging(b, MAX(n_tab, 2 * b->table_cap), err)) != 0)
		return rc;
	h = step_ints(b, b->host_ints);
	h.fa_tiles[0] = 0;
	for (s = 0; s < batch->n_seqs; s++) {
		const struct fwd_seq *q = &batch->seqs[s];
		int32_t nb = (q->pos0 + q->n_new + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;

		stage_tiles(b, &h, t, q->n_new);
		memcpy(h.tables + tab, q->block_table, (size_t)nb * sizeof(int32_t));
		for (i = 0; i < q->n_new; i++, t++) {
			h.tokens[t] = batch->tokens[t];
			h.pos[t] = q->pos0 + i;
			h.tab[t] = tab;
			if (i >= q->n_new - q->logits)
				h.lrows[nl++] = t;
		}
		tab += nb;
	}
	CK(cudaMemcpyAsync(b->dev_ints, b->host_ints, (STEP_INTS(b->max_tokens) + (size_t)tab) * sizeof(int32_t),
	    cudaMemcpyHostToDevice, b->stream));
	*n_logits = nl;
	return 0;
}

/* Layer l's heads: sliding window, RoPE base and scaling. */
static struct cuda_heads
heads_of(const struct backend *b, int l)
{
	const struct model_hparams *hp = &b->m->hp;
	const struct cuda_layer *c = &b->layers[l];
	int swa = model_layer_is_swa(hp, l);
	struct cuda_heads hd;

	hd.n_head = hp->n_head;
	hd.n_head_kv = hp->n_head_kv;
	hd.head_dim = hp->head_dim;
	hd.bq = c->bq, hd.bk = c->bk, hd.bv = c->bv;
	hd.q_norm = c->q_norm, hd.k_norm = c->k_norm;
	hd.nm.offset = hp->norm_offset, hd.nm.eps = hp->norm_eps;
	hd.inv_freq = b->inv_freq[swa];
	hd.pos_div = swa ? 1.0f : hp->rope_scale;
	hd.neox = hp->rope == ROPE_NEOX;
	hd.scale = hp->attn_scale;
	hd.window = swa ? hp->sliding_window : 0;
	hd.sinks = c->sinks;
	return hd;
}

/*
 * Where a row kernel puts its output for the products of a step of T
 * tokens: their fp16 form (which the products of many tokens read) when
 * the step is above the matrix-vector kernels' count, else nowhere (h
 * takes the float rows).
 */
static struct cuda_h16
h16_of(const struct backend *b, int T)
{
	struct cuda_h16 h = { NULL, NULL };

	if (T > b->mm.mmv_max)
		h.h = b->mm.xh, h.scale = b->mm.xscale;
	return h;
}

/*
 * Where a row kernel puts the int8 form of its output for a product by w
 * (NULL: none) of a step of T tokens: the integer kernels' input when that
 * product is theirs (so that they need not quantize it), else nowhere.
 */
static struct cuda_q8
q8_of(const struct backend *b, int T, const struct cuda_weight *w)
{
	struct cuda_q8 q = { NULL, NULL };

	if (w != NULL && T <= b->mm.mmv_max && cuda_matmul_int8(&b->mm, w))
		q.q = b->mm.xq, q.d = b->mm.xd;
	return q;
}

/* 1 if the row kernel before a product by w of T tokens made the form of its input that the product reads. */
static int
formed(const struct backend *b, int T, const struct cuda_weight *w)
{
	return h16_of(b, T).h != NULL || q8_of(b, T, w).q != NULL;
}

/* The int8 form of layer l's normed input that its experts' slots read (NULL: none). */
static struct cuda_q8
q8_of_experts(const struct backend *b, int T, int l)
{
	struct cuda_q8 q = { NULL, NULL };

	if (!cuda_moe_grouped(&b->mm, &b->layers[l].moe, T) && cuda_matmul_int8(&b->mm, &b->layers[l].moe.gu))
		q.q = b->mm.xq, q.d = b->mm.xd;
	return q;
}

/*
 * 1 if layer l's residual norm before its experts runs in their router's
 * launch for T tokens (cuda_moe_fuses_norm; no post-attention norm), the
 * residual add deferred to the norm after them.
 */
static int
moe_norm_fused(const struct backend *b, int T, int l)
{
	const struct cuda_layer *c = &b->layers[l];

	return b->m->hp.n_expert > 0 && c->post_attn_norm == NULL && c->post_ffn_norm == NULL &&
	    cuda_moe_fuses_norm(&b->mm, &c->moe, T);
}

/* The attention half of layer l; h (or its fp16 form) holds the normed input, x gets the residual. */
static int
attention(struct backend *b, int T, int l, const struct step_ints *dev, char *err)
{
	const struct model_hparams *hp = &b->m->hp;
	const struct cuda_layer *c = &b->layers[l];
	struct cuda_heads hd = heads_of(b, l);
	int fa = flash_grid(b, T);
	struct cuda_kv kv = { b->kv, b->kv_stride, hp->n_layer, l, dev->pos, dev->tab, dev->tables,
		b->att_part, b->att_part_rows, b->exact, fa ? dev->fa_tiles : NULL, fa ? dev->fa_tok : NULL, fa,
		b->att_len };
	struct cuda_norm nm = { hp->norm_offset, hp->norm_eps };
	struct cuda_q8 q8 = { NULL, NULL };
	struct cuda_h16 h16 = { NULL, NULL }, none = { NULL, NULL };
	struct cuda_rmix bias = { c->bo, 0, NULL, NULL, NULL, NULL };
	int embd = hp->n_embd, nq = hp->n_head * hp->head_dim, nkv = hp->n_head_kv * hp->head_dim, rc, fused;
	const struct cuda_weight *wqkv[3] = { &c->wq, &c->wk, &c->wv };
	float *qkv[3] = { b->q, b->k, b->v };
	int ld[3] = { nq, nkv, nkv };

	/* the attention kernels write the output product's input form (the prefill tiles' kernel does not) */
	if (!fa)
		q8 = q8_of(b, T, &c->wo), h16 = h16_of(b, T);
	prof_mark(b, PH_MATMUL);
	fused = cuda_matmul_qkv_fits(&b->mm, wqkv, T, &hd, &kv); /* the product does qk's work too */
	rc = fused ? cuda_matmul_qkv(&b->mm, wqkv, b->h, embd, T, b->q, &hd, &kv, formed(b, T, &c->wq), err) :
		     cuda_matmul_multi(&b->mm, wqkv, 3, b->h, embd, T, qkv, ld, formed(b, T, &c->wq), err);
	if (rc != 0)
		return rc;
	prof_mark(b, PH_ATTN);
	if (!fused && (rc = cuda_qk(b->q, b->k, b->v, T, &hd, &kv, b->stream, err)) != 0)
		return rc;
	if ((rc = cuda_attention(b->q, b->att, q8, h16, T, &hd, &kv, b->stream, err)) != 0)
		return rc;
	prof_mark(b, PH_MATMUL);
	if ((rc = cuda_matmul(&b->mm, &c->wo, b->att, nq, T, b->ffn_out, embd, q8.q != NULL || h16.h != NULL,
	    err)) != 0)
		return rc;
	prof_mark(b, PH_NORM);
	if (moe_norm_fused(b, T, l))
		return 0;
	if (hp->n_expert > 0) /* the router and the gathering read the float rows */
		return cuda_residual_norm(b->x, b->ffn_out, &bias, c->post_attn_norm, c->ffn_norm, b->h, none,
		    q8_of_experts(b, T, l), T, embd, nm, b->stream, err);
	return cuda_residual_norm(b->x, b->ffn_out, &bias, c->post_attn_norm, c->ffn_norm, b->h, h16_of(b, T),
	    q8_of(b, T, &c->w_gate), T, embd, nm, b->stream, err);
}

/* The dense feed-forward of layer l on the normed rows in h (or their forms), into ffn_out. */
static int
dense_ffn(struct backend *b, int T, int l, char *err)
{
	const struct model_hparams *hp = &b->m->hp;
	const struct cuda_layer *c = &b->layers[l];
	int embd = hp->n_embd, ff = hp->n_ff, rc, ld[2] = { ff, ff };
	const struct cuda_weight *wgu[2] = { &c->w_gate, &c->w_up };
	float *gu[2] = { b->gate, b->up };

	prof_mark(b, PH_MATMUL);
	if ((rc = cuda_matmul_multi(&b->mm, wgu, 2, b->h, embd, T, gu, ld, formed(b, T, &c->w_gate), err)) != 0)
		return rc;
	prof_mark(b, PH_NORM);
	if ((rc = cuda_glu(b->gate, b->up, T, ff, hp->act == ACT_GELU, h16_of(b, T), q8_of(b, T, &c->w_down),
	    b->cluster_sms, b->stream, err)) != 0)
		return rc;
	prof_mark(b, PH_MATMUL);
	return cuda_matmul(&b->mm, &c->w_down, b->gate, ff, T, b->ffn_out, embd, formed(b, T, &c->w_down), err);
}

/*
 * The feed-forward half of layer l; ends with the next layer's input norm
 * in h. A layer's experts leave each of their rows in moe.down, and the
 * residual adds each token's up by the router's weights (mix).
 */
static int
feed_forward(struct backend *b, int T, int l, char *err)
{
	const struct model_hparams *hp = &b->m->hp;
	const struct cuda_layer *c = &b->layers[l];
	const struct cuda_layer *nl = l + 1 < hp->n_layer ? &b->layers[l + 1] : NULL;
	struct cuda_norm nm = { hp->norm_offset, hp->norm_eps };
	struct cuda_rmix mix = {};
	const float *r = b->ffn_out;
	int rc;

	prof_mark(b, PH_MATMUL);
	if (hp->n_expert > 0) {
		struct cuda_moe_pre pre = { b->x, b->ffn_out, c->bo, c->ffn_norm, nm, q8_of_experts(b, T, l) };

		rc = cuda_moe_ffn(&b->mm, &c->moe, &b->moe, b->h, hp->n_embd, T, pre.q8.q != NULL,
		    moe_norm_fused(b, T, l) ? &pre : NULL, &mix, err);
		r = b->moe.down;
	} else {
		rc = dense_ffn(b, T, l, err);
	}
	if (rc != 0)
		return rc;
	prof_mark(b, PH_NORM);
	return cuda_residual_norm(b->x, r, &mix, c->post_ffn_norm, nl ? nl->attn_norm : NULL, b->h, h16_of(b, T),
	    q8_of(b, T, nl ? &nl->wq : NULL), T, hp->n_embd, nm, b->stream, err);
}

/* Logit rows [r0, r0 + nr) (normed in h) projected into the logits buffer. */
static int
output_rows(struct backend *b, int r0, int nr, char *err)
{
	const struct model_hparams *hp = &b->m->hp;

	return cuda_matmul(&b->mm, &b->output, b->h + (size_t)r0 * hp->n_embd, hp->n_embd, nr, b->logits,
	    hp->n_vocab, 0, err);
}

/*
 * Every kernel of a step, queued on the stream: the embeddings, the layers,
 * the final norm of the rows that want logits and the projection of the
 * first LOGIT_ROWS of them. Nothing here synchronises or touches host
 * memory, so that it can be captured into a graph.
 */
static int
step_kernels(struct backend *b, int T, int n_logits, const struct step_ints *dev, char *err)
{
	const struct model_hparams *hp = &b->m->hp;
	struct cuda_norm nm = { hp->norm_offset, hp->norm_eps };
	int rc;

	prof_mark(b, PH_NORM);
	if ((rc = cuda_embed(&b->tok_embd, dev->tokens, T, hp->embd_scale, b->x, b->stream, err)) != 0 ||
	    (rc = cuda_residual_norm(b->x, NULL, NULL, NULL, b->layers[0].attn_norm, b->h, h16_of(b, T),
	    q8_of(b, T, &b->layers[0].wq), T,
	    hp->n_embd, nm, b->stream, err)) != 0)
		return rc;
	for (int l = 0; l < hp->n_layer; l++)
		if ((rc = attention(b, T, l, dev, err)) != 0 || (rc = feed_forward(b, T, l, err)) != 0)
			return rc;
	prof_mark(b, PH_OUTPUT);
	if (n_logits == 0)
		return 0;
	if ((rc = cuda_norm_rows(b->x, dev->lrows, b->out_norm, b->h, n_logits, hp->n_embd, nm,
	    b->stream, err)) != 0)
		return rc;
	return output_rows(b, 0, MIN(n_logits, MIN(b->max_tokens, LOGIT_ROWS)), err);
}

static int
shape_eq(const struct step_shape *a, const struct step_shape *b)
{
	return a->n_tok == b->n_tok && a->n_logits == b->n_logits && a->att_len == b->att_len;
}

/* The cached graph of this shape, or a slot to capture it in (the least recently used). */
static struct graph *
find_graph(struct backend *b, const struct step_shape *sh, int *hit)
{
	struct graph *victim = &b->graphs[0];

	for (int i = 0; i < GRAPH_CACHE; i++) {
		struct graph *g = &b->graphs[i];

		if (g->exec != NULL && shape_eq(&g->shape, sh)) {
			*hit = 1;
			return g;
		}
		if (victim->exec != NULL && (g->exec == NULL || g->used < victim->used))
			victim = g;
	}
	*hit = 0;
	return victim;
}

/*
 * Counts this step's shape; 1 if it is the GRAPH_AFTER-th of that shape in
 * a row. A capture and instantiation cost about half a step (2.5-9 ms
 * beside steps of 4.5-7.5 ms, llama3-8b on an H100) and a step without a
 * graph ~5 % more than with one (programmatic launch hides most launch
 * gaps), so only a shape that lasts pays for one; requests that arrive or
 * end one by one change the token count every step or two.
 */
static int
shape_steady(struct backend *b, const struct step_shape *sh)
{
	b->last_runs = shape_eq(&b->last, sh) ? b->last_runs + 1 : 1;
	b->last = *sh;
	return b->last_runs >= GRAPH_AFTER;
}

/*
 * Runs step_kernels as a graph: replayed when this shape was captured
 * before, captured once it has lasted (shape_steady), else run as it is.
 * One launch instead of a few hundred: small steps are bound by launches,
 * not by the GPU.
 */
static int
graph_step(struct backend *b, int T, int n_logits, const struct step_ints *dev, char *err)
{
	struct step_shape sh = { T, n_logits, b->att_len };
	int steady = shape_steady(b, &sh), hit, rc;
	struct graph *g = find_graph(b, &sh, &hit);
	cudaGraph_t graph = NULL;
	cudaError_t e;

	if (!hit && !steady)
		return step_kernels(b, T, n_logits, dev, err);
	if (!hit) {
		if (g->exec != NULL) {
			cudaGraphExecDestroy(g->exec);
			g->exec = NULL;
		}
		CK(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
		rc = step_kernels(b, T, n_logits, dev, err);
		e = cudaStreamEndCapture(b->stream, &graph); /* always: the stream must leave capture */
		if (rc != 0) {
			if (graph != NULL)
				cudaGraphDestroy(graph);
			return rc;
		}
		CK(e);
		e = cudaGraphInstantiate(&g->exec, graph, 0);
		cudaGraphDestroy(graph);
		if (e != cudaSuccess) {
			g->exec = NULL;
			CK(e);
		}
		g->shape = sh;
	}
	g->used = ++b->graph_clock;
	CK(cudaGraphLaunch(g->exec, b->stream));
	return 0;
}

/* Penalty pairs of the step's n_logits rows (each row's come after the rows' before it). */
static int
pen_pairs(const struct fwd_batch *batch, int n_logits)
{
	const struct fwd_pick *last = &batch->pick[n_logits - 1];

	return last->pen0 + last->n_pen;
}

/*
 * The step's fwd_pick rows and penalty windows, when it has them, copied
 * up before its kernels (which do not read them).
 */
static int
stage_picks(struct backend *b, const struct fwd_batch *batch, int n_logits, char *err)
{
	size_t cap = PEN_INTS(b->max_tokens) / 2;
	int np;

	if (batch->argmax == NULL || batch->pick == NULL || n_logits == 0)
		return 0;
	if (b->pick_part == NULL)
		return err_set(err, ERR_UNSUPPORTED, "sampling on the GPU: a vocabulary of %d (at most %d)",
		    b->m->hp.n_vocab, FWD_PICK_MAX_VOCAB);
	for (int r = 0; r < n_logits; r++) {
		const struct fwd_pick *f = &batch->pick[r];

		if (f->n_pen < 0 || f->n_pen > FWD_PICK_PENALTY_MAX || f->pen0 != (r > 0 ? pen_pairs(batch, r) : 0) ||
		    (f->n_pen > 0 && (batch->pen_tok == NULL || batch->pen_cnt == NULL)))
			return err_set(err, ERR_INVAL, "sampling on the GPU: row %d's penalty window", r);
		if (f->temperature > 0 && (f->top_k < 1 || f->top_k > FWD_PICK_TOP_K))
			return err_set(err, ERR_INVAL, "sampling on the GPU: row %d's top-k %d (1 to %d)", r, f->top_k,
			    FWD_PICK_TOP_K);
		if (f->logprob && batch->logprob == NULL)
			return err_set(err, ERR_INVAL, "sampling on the GPU: row %d's log-probability has no place", r);
		if (f->top < 0 || f->top > FWD_TOP_LOGPROBS || (f->top > 0 && (!f->logprob || batch->top_ids == NULL ||
		    batch->top_lp == NULL)))
			return err_set(err, ERR_INVAL, "sampling on the GPU: row %d's %d most likely tokens", r, f->top);
	}
	memcpy(b->host_pick, batch->pick, (size_t)n_logits * sizeof *b->host_pick);
	CK(cudaMemcpyAsync(b->dev_pick, b->host_pick, (size_t)n_logits * sizeof *b->host_pick,
	    cudaMemcpyHostToDevice, b->stream));
	if ((np = pen_pairs(batch, n_logits)) == 0)
		return 0;
	memcpy(b->host_pen, batch->pen_tok, (size_t)np * sizeof(int32_t));
	memcpy(b->host_pen + cap, batch->pen_cnt, (size_t)np * sizeof(int32_t));
	CK(cudaMemcpyAsync(b->dev_pen, b->host_pen, (size_t)np * sizeof(int32_t), cudaMemcpyHostToDevice, b->stream));
	CK(cudaMemcpyAsync(b->dev_pen + cap, b->host_pen + cap, (size_t)np * sizeof(int32_t), cudaMemcpyHostToDevice,
	    b->stream));
	return 0;
}

/*
 * The step's constrained rows (fwd_batch.masks: the caller makes them
 * now, while the device runs the step's kernels), copied up behind them.
 * Returns how many, or a negative code.
 */
static int
stage_masks(struct backend *b, const struct fwd_batch *batch, int n_logits, char *err)
{
	size_t words = FWD_MASK_WORDS(b->m->hp.n_vocab);
	struct fwd_masks mk;
	int rc;

	if ((rc = fwd_masks_get(batch, n_logits, &mk, err)) != 0 || mk.n == 0)
		return rc;
	if (mk.n > b->max_masks)
		return err_set(err, ERR_INVAL, "%d constrained rows (at most %d)", mk.n, b->max_masks);
	memcpy(b->host_mask_rows, mk.rows, (size_t)mk.n * sizeof *mk.rows);
	memcpy(b->host_mask_bits, mk.bits, (size_t)mk.n * words * sizeof *mk.bits);
	CK(cudaMemcpyAsync(b->dev_mask_rows, b->host_mask_rows, (size_t)mk.n * sizeof *mk.rows, cudaMemcpyHostToDevice,
	    b->stream));
	CK(cudaMemcpyAsync(b->dev_mask_bits, b->host_mask_bits, (size_t)mk.n * words * sizeof *mk.bits,
	    cudaMemcpyHostToDevice, b->stream));
	return mk.n;
}

/* The picks of logit rows [r0, r0 + nr), in the logits buffer, into dev_argmax: greedy, or as staged. */
static int
pick_rows(struct backend *b, const struct fwd_batch *batch, int r0, int nr, char *err)
{
	int V = b->m->hp.n_vocab;

	if (batch->pick == NULL)
		return cuda_argmax(b->logits, nr, V, b->dev_argmax + r0, b->argmax_part, b->stream, err);
	/* the rows' windows follow each other: these rows have some if theirs end past their first's start */
	return cuda_pick(b->logits, nr, V, b->dev_pick + r0, b->dev_pen, b->dev_pen + PEN_INTS(b->max_tokens) / 2,
	    pen_pairs(batch, r0 + nr) > batch->pick[r0].pen0, b->dev_argmax + r0, b->dev_lp + r0,
	    b->dev_top_ids + (size_t)r0 * FWD_TOP_LOGPROBS, b->dev_top_lp + (size_t)r0 * FWD_TOP_LOGPROBS, b->pick_part,
	    b->stream, err);
}

static int
cuda_forward(struct backend *b, const struct fwd_batch *batch, float *logits, char *err)
{
	size_t V = (size_t)b->m->hp.n_vocab;
	struct step_ints dev;
	int64_t n_tab = 0, max_len;
	int T = batch->n_tokens, n_logits = 0, rows = MIN(b->max_tokens, LOGIT_ROWS), n_masks, rc;

	if ((rc = fwd_batch_check(batch, b->max_tokens, b->kv_blocks, b->m->hp.n_vocab, &max_len, &n_tab,
	    err)) != 0)
		return rc;
	CK(cudaSetDevice(b->device));
	/* pieces of split attention grow with the context; past the most pieces, one shape serves all */
	b->att_len = (int)MIN((max_len + ATT_SPLIT_MIN - 1) / ATT_SPLIT_MIN, ATT_MAX_SPLITS) * ATT_SPLIT_MIN;
	b->prof.n = 0;
	prof_mark(b, PH_STAGE);
	if ((rc = stage_step(b, batch, n_tab, &n_logits, err)) != 0 || (rc = stage_picks(b, batch, n_logits, err)) != 0)
		return rc;
	dev = step_ints(b, b->dev_ints);
	if (b->use_graphs && (!b->prof.on || b->prof.on == PROF_STEPS) && T <= GRAPH_MAX_TOKENS && n_logits <= rows)
		rc = graph_step(b, T, n_logits, &dev, err);
	else
		rc = step_kernels(b, T, n_logits, &dev, err);
	if (rc != 0 || (rc = n_masks = stage_masks(b, batch, n_logits, err)) < 0)
		return rc;
	/* the logits (or their argmax), a buffer at a time; the kernels above did the first */
	for (int r0 = 0; r0 < n_logits; r0 += rows) {
		int nr = MIN(rows, n_logits - r0);

		if (r0 > 0 && (rc = output_rows(b, r0, nr, err)) != 0)
			return rc;
		if (n_masks > 0 && (rc = cuda_mask_logits(b->logits, r0, nr, (int)V, b->dev_mask_rows, b->dev_mask_bits,
		    n_masks, b->stream, err)) != 0)
			return rc;
		if (batch->argmax != NULL && (rc = pick_rows(b, batch, r0, nr, err)) != 0)
			return rc;
		if (logits != NULL)
			CK(cudaMemcpyAsync(logits + (size_t)r0 * V, b->logits, (size_t)nr * V * sizeof(float),
			    cudaMemcpyDeviceToHost, b->stream));
	}
	if (batch->argmax != NULL && n_logits > 0)
		CK(cudaMemcpyAsync(b->host_argmax, b->dev_argmax, (size_t)n_logits * sizeof(int32_t),
		    cudaMemcpyDeviceToHost, b->stream));
	if (batch->pick != NULL && n_logits > 0) {
		size_t tops = (size_t)n_logits * FWD_TOP_LOGPROBS;

		CK(cudaMemcpyAsync(b->host_lp, b->dev_lp, (size_t)n_logits * sizeof(float), cudaMemcpyDeviceToHost,
		    b->stream));
		CK(cudaMemcpyAsync(b->host_top_ids, b->dev_top_ids, tops * sizeof(int32_t), cudaMemcpyDeviceToHost,
		    b->stream));
		CK(cudaMemcpyAsync(b->host_top_lp, b->dev_top_lp, tops * sizeof(float), cudaMemcpyDeviceToHost, b->stream));
	}
	prof_mark(b, PH_END);
	CK(cudaStreamSynchronize(b->stream));
	if (batch->argmax != NULL)
		memcpy(batch->argmax, b->host_argmax, (size_t)n_logits * sizeof(int32_t));
	for (int r = 0; batch->pick != NULL && r < n_logits; r++) {
		size_t at = (size_t)r * FWD_TOP_LOGPROBS, k = (size_t)batch->pick[r].top;

		if (batch->pick[r].logprob)
			batch->logprob[r] = b->host_lp[r];
		memcpy(batch->top_ids + at, b->host_top_ids + at, k * sizeof(int32_t));
		memcpy(batch->top_lp + at, b->host_top_lp + at, k * sizeof(float));
	}
	return prof_step(&b->prof, T, err);
}

static int
cuda_kv_copy(struct backend *b, int32_t src, int32_t dst, int32_t n_tokens, char *err)
{
	size_t nkv = (size_t)b->m->hp.n_head_kv * (size_t)b->m->hp.head_dim;
	size_t el = (size_t)kv_elem_size(b), pitch = b->kv_stride * el;
	size_t per_block = (size_t)b->m->hp.n_layer * 2 * pitch;
	char *kv = (char *)b->kv;

	if (src < 0 || src >= b->kv_blocks || dst < 0 || dst >= b->kv_blocks ||
	    n_tokens < 0 || n_tokens > KV_BLOCK_TOKENS)
		return err_set(err, ERR_INVAL, "kv_copy %d -> %d of %d tokens: out of range", src, dst, n_tokens);
	if (n_tokens == 0 || src == dst)
		return 0;
	CK(cudaSetDevice(b->device));
	/* the block's K and V of every layer: 2 * n_layer rows of n_tokens positions, a pitch apart */
	CK(cudaMemcpy2DAsync(kv + (size_t)dst * per_block, pitch, kv + (size_t)src * per_block, pitch,
	    (size_t)n_tokens * nkv * el, (size_t)b->m->hp.n_layer * 2,
	    cudaMemcpyDeviceToDevice, b->stream));
	return 0;
}

/*
 * Copies n blocks between the pool and host memory on the calling thread's
 * stream, through two pinned buffers of KV_STAGE_BYTES: a copy from or to
 * pageable memory runs at a fraction of the bus's speed (CUDA stages it
 * itself, one piece at a time, synchronously), and the host tier's and the
 * disk's blocks are pageable. While one piece crosses the bus the CPU
 * copies the other.
 */
static int
kv_staged(struct backend *b, const int32_t *blocks, int32_t n, size_t per, char *host, int to_host, char *err)
{
	cudaStream_t st = cudaStreamPerThread;
	size_t total = (size_t)n * per, len, prev_len = 0;
	char *kv = (char *)b->kv, *prev = NULL;
	int k = 0;

	for (size_t at = 0; at < total; at += len, k ^= 1) {
		char *dev = kv + (size_t)blocks[at / per] * per + at % per, *buf = b->stage + k * KV_STAGE_BYTES;

		len = MIN(KV_STAGE_BYTES, per - at % per);
		CK(cudaEventSynchronize(b->stage_ev[k]));
		if (to_host) {
			CK(cudaMemcpyAsync(buf, dev, len, cudaMemcpyDeviceToHost, st));
			CK(cudaEventRecord(b->stage_ev[k], st));
			if (prev != NULL) {
				CK(cudaEventSynchronize(b->stage_ev[k ^ 1]));
				memcpy(prev, b->stage + (k ^ 1) * KV_STAGE_BYTES, prev_len);
			}
			prev = host + at, prev_len = len;
		} else {
			memcpy(buf, host + at, len);
			CK(cudaMemcpyAsync(dev, buf, len, cudaMemcpyHostToDevice, st));
			CK(cudaEventRecord(b->stage_ev[k], st));
		}
	}
	if (prev != NULL) {
		CK(cudaEventSynchronize(b->stage_ev[k ^ 1]));
		memcpy(prev, b->stage + (k ^ 1) * KV_STAGE_BYTES, prev_len);
	}
	CK(cudaStreamSynchronize(st));
	return 0;
}

/*
 * The calling thread on b's device, and the staging buffers, made at the
 * first copy (most loads never copy a block out).
 */
static int
kv_stage_ready(struct backend *b, char *err)
{
	CK(cudaSetDevice(b->device));
	if (b->stage != NULL)
		return 0;
	CK(cudaEventCreateWithFlags(&b->stage_ev[0], cudaEventDisableTiming));
	CK(cudaEventCreateWithFlags(&b->stage_ev[1], cudaEventDisableTiming));
	CK(cudaMallocHost((void **)&b->stage, 2 * KV_STAGE_BYTES));
	return 0;
}

/* Copies n blocks between the pool and host memory (one caller at a time: kernels.h). */
static int
kv_blocks_copy(struct backend *b, const int32_t *blocks, int32_t n, char *host, int to_host, char *err)
{
	size_t per = (size_t)b->m->hp.n_layer * 2 * b->kv_stride * (size_t)kv_elem_size(b);
	int rc;

	for (int32_t i = 0; i < n; i++)
		if (blocks[i] < 0 || blocks[i] >= b->kv_blocks)
			return err_set(err, ERR_INVAL, "KV block %d is outside the pool", blocks[i]);
	if ((rc = kv_stage_ready(b, err)) == 0)
		rc = kv_staged(b, blocks, n, per, host, to_host, err);
	return rc;
}

static int
cuda_kv_read(struct backend *b, const int32_t *blocks, int32_t n, void *dst, char *err)
{
	return kv_blocks_copy(b, blocks, n, (char *)dst, 1, err);
}

static int
cuda_kv_write(struct backend *b, const int32_t *blocks, int32_t n, const void *src, char *err)
{
	return kv_blocks_copy(b, blocks, n, (char *)src, 0, err);
}

extern "C" int
cuda_backend_devices(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError(); /* clear it */
		return 0;
	}
	return n;
}

extern "C" int
cuda_backend_memory(int device, uint64_t *free_b, uint64_t *total, char *err)
{
	size_t f = 0, t = 0;

	CK(cudaSetDevice(device));
	CK(cudaMemGetInfo(&f, &t));
	*free_b = f;
	*total = t;
	return 0;
}

/*
 * Up to the end of the last tile of the tensor-core products of quantized
 * weights (a 65-token step costs about what a 128-token one does, 1.6
 * times a 64-token one; mmt.cu's steps of up to 8 what one of 8 does); the
 * matrix-vector kernels' counts, and cuBLAS's float weights, pay by the
 * token.
 */
static int
cuda_step_tokens(const struct backend *b, int n)
{
	const struct cuda_weight *w = &b->layers[0].w_gate;

	if (n <= b->mm.mmv_max || !cuda_qgemm_type(w))
		return n;
	if (cuda_mmt_fits(&b->mm, w, n))
		return MIN(b->mm.mmt_max, b->max_tokens);
	return MIN(cuda_qgemm_tokens(n), b->max_tokens);
}

extern "C" const struct backend_ops cuda_backend = {
	"cuda",
	kv_elem_size,
	cuda_plan,
	cuda_load,
	cuda_forward,
	cuda_kv_copy,
	cuda_kv_read,
	cuda_kv_write,
	cuda_step_tokens,
	cuda_free,
	1,
};
