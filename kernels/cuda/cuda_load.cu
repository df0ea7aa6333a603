/*
 * cuda_load.cu: the CUDA backend's load, plan and free, apart from its step
 * (cuda_backend.cu): what a model needs on the GPU and where each piece of
 * it goes is decided once, before any step, and the step only reads what
 * was placed here (struct backend, cuda_backend_int.cuh). Plan sizes a load
 * without allocating, so that the engine can size the KV pool to the memory.
 *
 * Load uploads every matrix once as stored (quantized blocks, one
 * allocation), the norms, biases and RoPE frequencies as float (a second),
 * and allocates the KV pool, the activations for max_tokens rows, the fp16
 * scratch of the tensor-core path (and, where steps reach cuda_mm.blas_min
 * tokens, the tile cuBLAS reads the weights dequantized from) and a pinned
 * staging area for each
 * step's token data; nothing is allocated per step (the block-table area
 * only grows, if a step ever needs more). The total is checked against
 * the device's free memory before any of it is allocated. The layers whose
 * feed-forward a placement keeps in host memory (backend_opts.host_ffn)
 * upload their attention only; the host computes the rest (cpu_ffn.h).
 */
#include "attention.cuh"
#include "cuda_backend_int.cuh"
#include "cuda_common.cuh"
#include "dequant.cuh"
#include "matmul.cuh"
#include "moe.cuh"
#include "norm.cuh"
#include "pick.cuh"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

/* cuBLAS workspace (what it wants on Hopper). */
#define BLAS_WORKSPACE ((size_t)32 << 20)
/* Allocations are rounded up to this, so that every row start is 16-byte aligned. */
#define DEV_ALIGN 256
/* First size of the block-table area, in entries, unless the pool needs less. */
#define TABLE_CAP0 (1 << 20)
/*
 * Default least tokens of a step that brings the host layers' feed-forwards
 * up rather than computing them on the host: the bus carries a dense
 * layer's weights in about the time the host takes for 8 tokens
 * (llama3-8b Q4_K_M under 2.5 GiB, H200 machine: 16 sequences 339 t/s
 * brought up, 75 on the host); a layer of experts is brought up whole,
 * while the host reads only the experts its tokens chose, so experts wait
 * for more (qwen3-30b-a3b under 8 GiB: 16 sequences 127 t/s on the host,
 * 79 brought up; 64: 178 against 200; a prompt of 64: 227 against 316).
 */
#define STREAM_MIN_DENSE 8
#define STREAM_MIN_EXPERTS 32
/* A dense model's bus layers: one host layer in this many (open_bus). */
#define BUS_EVERY 2
/* Default largest token count for the matrix-vector kernels. */
#define MMV_MAX_DEFAULT 1 /* measured: 2 tokens and more faster on the tensor cores (mmt.cu, qgemm.cu) */
#define TC_DECODE_LEN 2048 /* contexts from which decode attention takes the tensor cores */
/*
 * Default token count from which quantized weights are dequantized for
 * cuBLAS: measured on an H200 (llama3-8b Q4_K_M), steps of 256 sequences
 * ran 8 % faster that way than on qgemm, 384 34 %, a 512-token prefill
 * chunk 37 %; with the first, slower dequantizing kernel 192 ran as fast
 * and 128 31 % slower.
 */
#define BLAS_MIN_DEFAULT 256
/*
 * Default token count from which the types qgemm's wgmma form takes (Q4_K,
 * Q5_K, Q6_K on sm_90a) go to it, before cuBLAS too: measured on an H200
 * (llama3-8b Q4_K_M) against mma.sync and cuBLAS, 64 sequences +21 %, 128
 * +39 %, 256 +30 %, a 512-token prefill chunk +9 %; at 16 and 32 tokens
 * its tiles of 64 lose to mma.sync's of 16 and 32.
 */
#define WG_MIN_DEFAULT 33
/*
 * Weights (rows x K) from which the wgmma form takes a product: below,
 * its launch's fixed costs (the tensor maps, filling the rings) outweigh
 * its speed. gemma3-270m's down projection (640 x 2,048) on it made the
 * whole model 8 % slower in prefill and 12 % at 256 sequences (H200);
 * qwen3-0.6b's products of 2M weights gained 6-21 %.
 */
#define WG_ELEMS_DEFAULT (1 << 21)
/* The wgmma form's most splits of a tile added in a cluster (RESIDENT_CUDA_WG_CLUSTER). */
#define WG_CLUSTER_DEFAULT QG_MAX_SPLIT

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
	    align_up(PEN_INTS(d->T) * sizeof(int32_t)) + floats_bytes(d->T) * 2 + align_up(d->T * sizeof(int)) +
	    route_bytes(d) +
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

/* 1 if layer l's feed-forward stays in host memory (backend_opts.host_ffn). */
static int
ffn_on_host(const struct backend_opts *o, int l)
{
	return o->host_ffn != NULL && o->host_ffn[l];
}

/* Of a layer's matrices (layer_matrices), those of its feed-forward start here: after Q, K, V and O. */
#define LAYER_FFN_FIRST 4

/* 1 if o keeps any layer's feed-forward in host memory. */
static int
any_on_host(const struct model_desc *m, const struct backend_opts *o)
{
	for (int l = 0; l < m->hp.n_layer; l++)
		if (ffn_on_host(o, l))
			return 1;
	return 0;
}

/*
 * 1 if the token embeddings stay in host memory: with any layer there (a
 * step reads only its tokens' rows, which the host looks up), unless
 * they are the output's too.
 */
static int
embd_on_host(const struct model_desc *m, const struct backend_opts *o)
{
	return m->output != m->tok_embd && any_on_host(m, o);
}

/*
 * The matrices of the model, tok_embd first; the output only when not
 * tied. host[i] is 1 for those that stay in host memory (the host_ffn
 * layers' feed-forwards, and then the token embeddings), which the device
 * does not hold.
 */
static int
list_matrices(const struct model_desc *m, const struct backend_opts *o, const struct model_tensor **out,
    uint8_t *host)
{
	int n = 0;

	host[n] = (uint8_t)embd_on_host(m, o);
	out[n++] = m->tok_embd;
	if (m->output != m->tok_embd)
		out[n++] = m->output;
	for (int l = 0; l < m->hp.n_layer; l++) {
		int k = layer_matrices(&m->layers[l], m->hp.n_expert, out + n);

		for (int i = LAYER_FFN_FIRST; i < k; i++)
			host[n + i] = (uint8_t)ffn_on_host(o, l);
		n += k;
	}
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
 * Where each matrix the device holds (host[i] 0) goes in the weights
 * allocation; returns the total. A matrix of the same type and width as
 * the one before it starts right where that one ends, so that Q/K/V and
 * gate/up can run as one product (cuda_matmul_multi); the others start
 * aligned. The matrices of a feed-forward kept in host memory get offsets
 * from their run's start, laid out alike: where a step that brings them
 * up puts them (their host form, one copy).
 */
static size_t
matrix_offsets(const struct model_tensor **mats, const uint8_t *host, int n, size_t *off)
{
	const struct model_tensor *prev = NULL, *hprev = NULL;
	size_t end = 0, hend = 0;

	for (int i = 0; i < n; i++) {
		const struct model_tensor *p = host[i] ? hprev : prev;
		int follows = p != NULL && mats[i]->type == p->type && mats[i]->ne[0] == p->ne[0];
		size_t *e = host[i] ? &hend : &end;

		if (host[i] && (i == 0 || !host[i - 1]))
			hend = 0, hprev = NULL, follows = 0;
		off[i] = follows ? *e : align_up(*e);
		*e = off[i] + gpu_bytes(mats[i]);
		*(host[i] ? &hprev : &prev) = mats[i];
	}
	return align_up(end);
}

/* Uploads the matrices the device holds into one allocation at their offsets. */
static int
upload_matrices(struct backend *b, const struct model_tensor **mats, const uint8_t *host, int n, const size_t *off,
    size_t total, char *err)
{
	int rc;

	if ((rc = dev_alloc((void **)&b->weights, total, "the weights", err)) != 0)
		return rc;
	for (int i = 0; i < n && rc == 0; i++) {
		struct cuda_weight w = form_of(mats[i]);

		if (!host[i])
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
	    (rc = dev_alloc((void **)&b->glu_scale, floats_bytes(T), "activations", err)) ||
	    (rc = dev_alloc((void **)&b->glu_big, T * sizeof(int), "activations", err)) ||
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
		CK(cudaMemset(b->glu_big, 0, T * sizeof(int)));
		CK(cudaMallocHost((void **)&b->host_argmax, T * sizeof(int32_t)));
		CK(cudaMallocHost((void **)&b->host_pick, T * sizeof(struct fwd_pick)));
		CK(cudaMallocHost((void **)&b->host_pen, PEN_INTS(T) * sizeof(int32_t)));
		CK(cudaMallocHost((void **)&b->host_lp, T * sizeof(float)));
		CK(cudaMallocHost((void **)&b->host_top_ids, T * FWD_TOP_LOGPROBS * sizeof(int32_t)));
		CK(cudaMallocHost((void **)&b->host_top_lp, T * FWD_TOP_LOGPROBS * sizeof(float)));
		CK(cudaMallocHost((void **)&b->host_mask_rows, d->S * sizeof(int32_t)));
		CK(cudaMallocHost((void **)&b->host_mask_bits, d->S * FWD_MASK_WORDS(d->vocab) * sizeof(uint32_t)));
		b->max_seqs = (int)d->S;
	}
	b->mm.wh_elems = wh_elems;
	return rc;
}

/* The pinned staging area and its device twin, for table_cap table entries. */
int
cuda_alloc_staging(struct backend *b, int64_t table_cap, char *err)
{
	size_t bytes = (STEP_INTS(b->max_tokens) + (size_t)table_cap) * sizeof(int32_t);
	int rc;

	if (b->host_ints != NULL) {
		cuda_drop_graphs(b); /* they read the old staging area */
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

/* The token count from which quantized weights take cuBLAS (RESIDENT_CUDA_BLAS_MIN); never in exact mode. */
static int
blas_min(int exact)
{
	return exact ? INT_MAX : MAX(1, env_int("RESIDENT_CUDA_BLAS_MIN", BLAS_MIN_DEFAULT));
}

/*
 * Which kernel takes a product of how many tokens, into mm: the matrix-
 * vector kernels, mmt.cu, qgemm, its wgmma form (RESIDENT_CUDA_WG_MIN and
 * _WG_ELEMS; never in exact mode or where the device does not run it: wg,
 * cuda_qgemm_wg_device's answer; its splits summed in a cluster up to
 * _WG_CLUSTER) and cuBLAS. The plan and the load read it
 * here alike, so that the scratch planned is the scratch the steps use.
 */
static void
mm_routing(struct cuda_mm *mm, int exact, int wg)
{
	mm->mmv_max = mmv_max(exact);
	mm->mmt_max = MIN(env_int("RESIDENT_CUDA_MMT_MAX", MMT_MAX_TOKENS), MMT_MAX_TOKENS);
	mm->blas_min = blas_min(exact);
	mm->wg_min = exact || !wg ? INT_MAX : MAX(1, env_int("RESIDENT_CUDA_WG_MIN", WG_MIN_DEFAULT));
	mm->wg_elems = MAX(0, env_int("RESIDENT_CUDA_WG_ELEMS", WG_ELEMS_DEFAULT));
	mm->wg_cluster = env_int("RESIDENT_CUDA_WG_CLUSTER", WG_CLUSTER_DEFAULT);
	mm->wg_wide = MAX(64, env_int("RESIDENT_CUDA_WG_WIDE", WG_WIDE_TOKENS));
	mm->wg_wide_units = WG_WIDE_UNITS;
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

/*
 * The split kernel's wide blocks a multiprocessor (b->att_wide); the
 * context (cuda_kv.max_len) from which decode tokens take flash.cu's
 * tensor-core kernel (b->tc_decode_len, RESIDENT_CUDA_TC_DECODE, 0: never)
 * and its blocks a multiprocessor (b->tc_blocks); never in exact mode, nor
 * where the kernel does not serve the heads or its shared memory does not
 * fit the device.
 */
static int
attention_counts(struct backend *b, const struct model_hparams *hp, char *err)
{
	int rc;

	b->tc_decode_len = b->tc_blocks = 0;
	if ((rc = cuda_attention_wide_blocks(hp->head_dim, b->kv_q8, b->exact, &b->att_wide, err)) != 0)
		return rc;
	if (b->exact)
		return 0;
	if ((rc = cuda_flash_decode_blocks(hp->head_dim, b->kv_q8, &b->tc_blocks, err)) != 0)
		return rc;
	if (b->tc_blocks > 0)
		b->tc_decode_len = MAX(env_int("RESIDENT_CUDA_TC_DECODE", TC_DECODE_LEN), 0);
	return 0;
}

/* What load allocates: weights, activations and scratch, one KV block. */
struct sizes {
	size_t weights, act, kv_block;
	size_t stage;                /* the two buffers a host layer's feed-forward is brought up in */
	size_t hot;                  /* the host layers' hot experts and their table (hot_bytes) */
	int64_t wh;                  /* elements of the fp16 tile scratch */
	int64_t part_elems;          /* floats of qgemm's split sums */
};

/*
 * The matrices of a load: the model's (list_matrices), where each the
 * device holds goes in the weights allocation, and which stay in host
 * memory.
 */
struct mats {
	const struct model_tensor **t;
	size_t *off;
	uint8_t *host;
	int n;
};

/* The first of layer l's matrices in a list_matrices list. */
static int
layer_first(const struct model_desc *m, int l)
{
	return (m->output != m->tok_embd ? 2 : 1) + l * layer_matrix_count(&m->hp);
}

/*
 * Bytes of layer l's feed-forward in the GPU's form, laid out as
 * matrix_offsets puts a host layer's (from its first matrix on).
 */
static size_t
form_bytes(const struct model_desc *m, const struct mats *x, int l)
{
	int last = layer_first(m, l) + layer_matrix_count(&m->hp) - 1;

	return align_up(x->off[last] + gpu_bytes(x->t[last]));
}

/* Bytes of each of layer l's experts on the device: its gate and up (one run), its down. */
static void
expert_strides(const struct model_desc *m, const struct mats *x, int l, size_t *gu, size_t *down)
{
	int i = layer_first(m, l) + LAYER_FFN_FIRST;

	*gu = gpu_bytes(x->t[i + 1]) + gpu_bytes(x->t[i + 2]);
	*down = gpu_bytes(x->t[i + 1 + 2 * m->hp.n_expert]);
}

/* Device bytes of host layer l's hot experts (n of them) and its router, each part aligned. */
static size_t
hot_layer_bytes(const struct model_desc *m, const struct mats *x, int l, int n)
{
	size_t gu, down;

	expert_strides(m, x, l, &gu, &down);
	return align_up(gpu_bytes(x->t[layer_first(m, l) + LAYER_FFN_FIRST])) + align_up((size_t)n * gu) +
	    align_up((size_t)n * down);
}

/* The hot experts a load of o keeps a host layer (backend_opts.hot_experts, at most every one); 0: none. */
static int
hot_count(const struct model_desc *m, const struct backend_opts *o)
{
	return m->hp.n_expert > 0 && any_on_host(m, o) ? MIN(MAX(o->hot_experts, 0), m->hp.n_expert) : 0;
}

/*
 * 4-byte entries of the hot experts' tables on the device: where each
 * expert of each layer is (dev_slot_of), the step's table, list and share
 * of the experts brought up (cuda_bus).
 */
static size_t
hot_table_entries(const struct model_desc *m)
{
	return ((size_t)m->hp.n_layer + 2) * (size_t)m->hp.n_expert + 2;
}

/* Device bytes of o's hot experts: every host layer's, and their tables (hot_table_entries). */
static size_t
hot_bytes(const struct model_desc *m, const struct backend_opts *o, const struct mats *x)
{
	size_t bytes = 0;
	int n = hot_count(m, o);

	if (n == 0)
		return 0;
	for (int l = 0; l < m->hp.n_layer; l++)
		if (ffn_on_host(o, l))
			bytes += hot_layer_bytes(m, x, l, n);
	return bytes + align_up(hot_table_entries(m) * sizeof(int32_t));
}

/* The sizes of a load, and where each matrix goes (x->off). Refuses what the kernels do not handle. */
static int
plan_sizes(const struct model_desc *m, const struct backend_opts *o, int wg, struct mats *x, struct sizes *z,
    char *err)
{
	struct dims d = model_dims(&m->hp, o);
	struct cuda_mm mm = {};
	int rc, sms = 0;

	if ((rc = kv_type_check(o->kv_type, m->hp.head_dim, err)) != 0 || (rc = check_model(m, x->t, x->n, err)) != 0)
		return rc;
	CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, o->device));
	z->weights = matrix_offsets(x->t, x->host, x->n, x->off);
	z->wh = 1;
	mm_routing(&mm, o->exact, wg);
	for (int i = 0; i < x->n; i++) {
		struct cuda_weight w = form_of(x->t[i]);
		/*
		 * quantized experts (3-D) take the grouped kernels, whatever the step; a quantized
		 * output, which a step multiplies by as many tokens only when it wants every row's
		 * logits, takes what tiles the layers' products leave it (a 128k vocabulary would take
		 * the whole 128 MiB), at least 256 of its rows
		 */
		int quant = cuda_qgemm_type(&w);
		int64_t e;

		if (x->host[i] || !is_product(m, x->t[i]) || (quant && x->t[i]->n_dims == 3))
			continue;
		e = cuda_matmul_tile_elems(&mm, &w, o->max_tokens);
		z->wh = MAX(z->wh, quant && x->t[i] == m->output ? MIN(e, 256 * w.k) : e);
	}
	z->stage = 0;
	for (int l = 0; l < m->hp.n_layer; l++)
		if (ffn_on_host(o, l))
			z->stage = MAX(z->stage, 2 * form_bytes(m, x, l));
	z->hot = hot_bytes(m, o, x);
	z->part_elems = o->exact ? 0 : cuda_qgemm_part_elems(sms);
	z->kv_block = (size_t)m->hp.n_layer * 2 * KV_BLOCK_TOKENS *
	    kv_row_size(d.nkv, o->exact, o->kv_type == KV_Q8_0);
	z->act = activation_bytes(&d) + (size_t)z->wh * sizeof(__half) + BLAS_WORKSPACE + part_bytes(o->device, &m->hp) +
	    floats_bytes(small_floats(m)) + floats_bytes((size_t)z->part_elems);
	return 0;
}

/* The matrices of a model for o's placement, room for their offsets (mats_free). */
static void
mats_list(const struct model_desc *m, const struct backend_opts *o, struct mats *x)
{
	size_t cap = 2 + (size_t)layer_matrix_count(&m->hp) * (size_t)m->hp.n_layer;

	x->t = (const struct model_tensor **)xcalloc(cap, sizeof *x->t);
	x->off = (size_t *)xcalloc(cap, sizeof *x->off);
	x->host = (uint8_t *)xcalloc(cap, sizeof *x->host);
	x->n = list_matrices(m, o, x->t, x->host);
}

static void
mats_free(struct mats *x)
{
	free(x->t), free(x->off), free(x->host);
}

/*
 * Threads of the host's feed-forwards: n_threads, or all cores but two:
 * the engine thread spins on the step's stream and CUDA's callback thread
 * runs the pool's first share, so a pool of every core oversubscribes
 * them (qwen3-30b-a3b cut to 12 layers, 11 on the host, one token, 16
 * cores of an H200 machine: 150 t/s with 16 threads, 182 with 15, 173
 * with 14; 201 with 14 and CPU_POOL_SPIN_LONG, whose spinning workers
 * make oversubscription far worse: about 85 with 16).
 */
static int
host_threads(const struct backend_opts *o)
{
	return o->n_threads > 0 ? o->n_threads : MAX(1, (int)sysconf(_SC_NPROCESSORS_ONLN) - 2);
}

/* Bytes of the pinned rows a host feed-forward's input and output cross the bus in (each). */
static size_t
host_rows_bytes(const struct model_desc *m, int max_tokens)
{
	return (size_t)max_tokens * (size_t)m->hp.n_embd * sizeof(float);
}

/*
 * Host memory of o's placement: the host layers' feed-forward weights as
 * stored and in the GPU's form (pinned, for the steps that bring them
 * up), the host's buffers and the pinned rows; 0 without any.
 */
static uint64_t
host_bytes(const struct model_desc *m, const struct backend_opts *o, const struct mats *x)
{
	uint64_t bytes = 0;

	for (int i = 0; i < x->n; i++)
		if (x->host[i])
			bytes += x->t[i]->bytes;
	if (bytes == 0)
		return 0;
	for (int l = 0; l < m->hp.n_layer; l++)
		if (ffn_on_host(o, l))
			bytes += form_bytes(m, x, l);
	return bytes + cpu_ffn_bytes(m, o->max_tokens, o->exact, host_threads(o)) + 3 * host_rows_bytes(m, o->max_tokens);
}

/* Device bytes of each layer's feed-forward matrices (what keeping them in host memory frees), into ffn. */
static void
ffn_bytes(const struct model_desc *m, const struct mats *x, uint64_t *ffn)
{
	int per = layer_matrix_count(&m->hp);

	for (int l = 0; l < m->hp.n_layer; l++) {
		ffn[l] = 0;
		for (int i = LAYER_FFN_FIRST; i < per; i++)
			ffn[l] += align_up(gpu_bytes(x->t[layer_first(m, l) + i]));
	}
}

int
cuda_plan(const struct model_desc *m, const struct backend_opts *o, struct backend_plan *p, char *err)
{
	struct mats x;
	struct sizes z;
	int rc, wg = 0;

	mats_list(m, o, &x);
	/* which forms the device runs changes the scratch */
	if (cudaSetDevice(o->device) != cudaSuccess)
		rc = err_set(err, ERR_DEVICE, "CUDA device %d cannot be used", o->device);
	else if ((rc = cuda_qgemm_wg_device(&wg, err)) == 0 && (rc = plan_sizes(m, o, wg, &x, &z, err)) == 0) {
		size_t gu, down;

		p->fixed = z.weights + z.act + z.stage + z.hot;
		p->kv_block = z.kv_block;
		p->host = host_bytes(m, o, &x);
		p->expert = 0;
		if (m->hp.n_expert > 0) {
			expert_strides(m, &x, 0, &gu, &down);
			p->expert = gu + down;
		}
		if (p->ffn != NULL)
			ffn_bytes(m, &x, p->ffn);
	}
	mats_free(&x);
	return rc;
}

/* Matrix i of a layer's (mats, off from its first) where base + its offset puts it. */
static struct cuda_weight
placed(uint8_t *base, const struct model_tensor **mats, const size_t *off, int i)
{
	struct cuda_weight w = form_of(mats[i]);

	w.d = base + off[i];
	return w;
}

/*
 * Layer l's weights into c: its attention where the upload put them (its
 * matrices, in layer_matrices' order, from mats and off), its feed-forward
 * from ffn (the weights allocation; a stage buffer for one kept in host
 * memory; NULL: none). Experts are multiplied as one
 * weight whose experts are evenly strided: each expert's gate and up one
 * run, every expert alike. ERR_UNSUPPORTED for experts that are not.
 */
static int
layer_weights(struct backend *b, struct cuda_layer *c, int l, const struct model_tensor **mats, const size_t *off,
    uint8_t *ffn, char *err)
{
	int E = b->m->hp.n_expert, ok = 1;

	c->wq = placed(b->weights, mats, off, 0), c->wk = placed(b->weights, mats, off, 1);
	c->wv = placed(b->weights, mats, off, 2), c->wo = placed(b->weights, mats, off, 3);
	if (ffn == NULL)
		return 0;
	if (E == 0) {
		c->w_gate = placed(ffn, mats, off, 4), c->w_up = placed(ffn, mats, off, 5);
		c->w_down = placed(ffn, mats, off, 6);
		return 0;
	}
	c->moe.router = placed(ffn, mats, off, 4);
	c->moe.gu = placed(ffn, mats, off, 5);
	c->moe.down = placed(ffn, mats, off, 5 + 2 * E);
	c->moe.gu_stride = 2 * (size_t)c->moe.gu.n * c->moe.gu.row_bytes;
	c->moe.down_stride = (size_t)c->moe.down.n * c->moe.down.row_bytes;
	for (int e = 0; e < E; e++) {
		struct cuda_weight g = placed(ffn, mats, off, 5 + 2 * e), u = placed(ffn, mats, off, 6 + 2 * e);
		struct cuda_weight d = placed(ffn, mats, off, 5 + 2 * E + e);

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

/*
 * The feed-forwards o keeps in host memory: their runner on a pool of the
 * host's threads, the pinned rows their input and output cross the bus
 * in, each layer's host function's argument. Their weights stay in the
 * mapped file, read once here (by pinning their GPU form, else page by
 * page) so that the first step does not wait for the disk. Nothing without
 * any.
 */
static int open_streaming(struct backend *b, const struct backend_opts *o, const struct mats *x, size_t stage,
    char *err);

static int
open_host_ffn(struct backend *b, const struct backend_opts *o, const struct mats *x, size_t stage, char *err)
{
	const struct model_desc *m = b->m;
	size_t rows = host_rows_bytes(m, b->max_tokens);
	volatile uint8_t sink = 0;
	int n = m->hp.n_layer, rc;

	if (!any_on_host(m, o))
		return 0;
	if (embd_on_host(m, o))
		CK(cudaHostAlloc((void **)&b->host_x, rows, cudaHostAllocDefault));
	b->host_ffn = (uint8_t *)xmalloc((size_t)n);
	for (int l = 0; l < n; l++)
		b->host_ffn[l] = (uint8_t)ffn_on_host(o, l);
	cpu_ops_init();
	b->host_pool = cpu_pool_new(host_threads(o), CPU_POOL_SPIN_LONG);
	if ((b->host_run = cpu_ffn_new(m, b->host_ffn, b->max_tokens, b->exact, b->host_pool, err)) == NULL)
		return ERR_NOMEM;
	CK(cudaHostAlloc((void **)&b->host_h, rows, cudaHostAllocDefault));
	CK(cudaHostAlloc((void **)&b->host_out, rows, cudaHostAllocDefault));
	b->host_calls = (struct host_call *)xcalloc((size_t)n, sizeof *b->host_calls);
	for (int l = 0; l < n; l++)
		b->host_calls[l].b = b, b->host_calls[l].l = l;
	if ((rc = open_streaming(b, o, x, stage, err)) != 0 || b->streamed != NULL)
		return rc; /* pinning the GPU's form read every page already */
	for (int i = 1; i < x->n; i++) /* not the embeddings (i 0): a step reads only its tokens' rows */
		for (size_t at = 0; x->host[i] && at < x->t[i]->bytes; at += 4096)
			sink ^= ((const uint8_t *)x->t[i]->data)[at];
	(void)sink;
	return 0;
}

/*
 * The host layers' weights in the GPU's form, pinned, one copy a layer;
 * 0 and none where half the host's available memory does not hold them
 * or pinning fails: the pinned copies double a host layer's host memory,
 * and the host can compute every step without them, only slower.
 */
static int
pin_forms(struct backend *b, const struct backend_opts *o, const struct mats *x)
{
	const struct model_desc *m = b->m;
	uint64_t avail = 0, total = 0, forms = 0;
	char err[ERR_LEN];
	int n = m->hp.n_layer;

	for (int l = 0; l < n; l++)
		forms += ffn_on_host(o, l) ? form_bytes(m, x, l) : 0;
	if (host_memory(&avail, &total, err) != 0 || forms > avail / 2)
		return 0;
	b->host_form = (uint8_t **)xcalloc((size_t)n, sizeof *b->host_form);
	b->host_form_bytes = (size_t *)xcalloc((size_t)n, sizeof *b->host_form_bytes);
	for (int l = 0; l < n; l++) {
		if (!ffn_on_host(o, l))
			continue;
		b->host_form_bytes[l] = form_bytes(m, x, l);
		if (cudaHostAlloc((void **)&b->host_form[l], b->host_form_bytes[l], cudaHostAllocWriteCombined) !=
		    cudaSuccess) {
			(void)cudaGetLastError();
			for (int k = 0; k < l; k++)
				if (b->host_form[k] != NULL)
					cudaFreeHost(b->host_form[k]);
			free(b->host_form), free(b->host_form_bytes);
			b->host_form = NULL, b->host_form_bytes = NULL;
			return 0;
		}
		for (int i = layer_first(m, l) + LAYER_FFN_FIRST; i < layer_first(m, l) + layer_matrix_count(&m->hp); i++) {
			struct cuda_weight w = form_of(x->t[i]);

			cuda_weight_to_host(&w, x->t[i]->data, b->host_form[l] + x->off[i]);
		}
	}
	return 1;
}

/*
 * A dense model's bus layers (struct backend's bus_layer): of its host
 * layers, the last of every BUS_EVERY (RESIDENT_CUDA_BUS_EVERY, 0: none).
 * A step of a few tokens computes a host layer on the host at the host's
 * memory bandwidth while the bus stands idle; bringing every other one up
 * instead, its copy runs while the host computes the layer before it. Not
 * for experts: the host reads only a layer's chosen ones, the bus would
 * carry them all.
 */
static void
open_bus(struct backend *b, const struct backend_opts *o)
{
	int n = b->m->hp.n_layer, every = env_int("RESIDENT_CUDA_BUS_EVERY", BUS_EVERY), j = 0;

	if (b->m->hp.n_expert > 0 || every <= 0)
		return;
	b->bus_layer = (uint8_t *)xcalloc((size_t)n, 1);
	for (int l = 0; l < n; l++)
		if (ffn_on_host(o, l))
			b->bus_layer[l] = (uint8_t)(++j % every == 0);
}

/*
 * What the steps of many tokens need to bring the host layers'
 * feed-forwards up instead of computing them on the host: each one's
 * weights pinned in the GPU's form (pin_forms; without them every step
 * computes on the host), two device buffers of stage bytes they take
 * turns in, a stream for the copies and the events that order them with
 * the step's stream. RESIDENT_CUDA_STREAM_MIN: the least tokens of such a
 * step.
 */
static int
open_streaming(struct backend *b, const struct backend_opts *o, const struct mats *x, size_t stage, char *err)
{
	const struct model_desc *m = b->m;
	int n = m->hp.n_layer, k = 0, rc;

	if (!pin_forms(b, o, x))
		return 0;
	b->stream_slot = (int *)xcalloc((size_t)n, sizeof *b->stream_slot);
	for (int l = 0; l < n; l++)
		if (ffn_on_host(o, l))
			b->stream_slot[l] = k++ % 2;
	for (int i = 0; i < 2; i++)
		if ((rc = dev_alloc((void **)&b->stage_w[i], stage, "a host layer's weights brought up", err)) != 0)
			return rc;
	b->stage_bytes = stage;
	CK(cudaStreamCreateWithFlags(&b->up_stream, cudaStreamNonBlocking));
	for (int i = 0; i < 2; i++) {
		CK(cudaEventCreateWithFlags(&b->w_ready[i], cudaEventDisableTiming));
		CK(cudaEventCreateWithFlags(&b->w_free[i], cudaEventDisableTiming));
	}
	b->stream_min = env_int("RESIDENT_CUDA_STREAM_MIN", m->hp.n_expert > 0 ? STREAM_MIN_EXPERTS : STREAM_MIN_DENSE);
	b->streamed = (struct cuda_layer *)xcalloc((size_t)n, sizeof *b->streamed);
	open_bus(b, o);
	return 0;
}

/*
 * Host layer l's hot experts in hot[l], from base (hot_layer_bytes of
 * them): its router, then n_hot slots of gate/up and of down, holding
 * experts 0 .. n_hot - 1 to begin with, copied from its pinned GPU form.
 */
static int
hot_layer(struct backend *b, const struct mats *x, int l, uint8_t *base, char *err)
{
	const struct model_desc *m = b->m;
	int i = layer_first(m, l), E = m->hp.n_expert, H = b->n_hot, rc;
	struct cuda_layer *c = &b->hot[l];
	size_t router = gpu_bytes(x->t[i + LAYER_FFN_FIRST]), gu, down;

	*c = b->layers[l]; /* its norms and biases */
	if ((rc = layer_weights(b, c, l, x->t + i, x->off + i, b->host_form[l], err)) != 0)
		return rc;
	expert_strides(m, x, l, &gu, &down);
	b->hot_gu_off = (size_t)(c->moe.gu.d - b->host_form[l]);
	b->hot_down_off = (size_t)(c->moe.down.d - b->host_form[l]);
	CK(cudaMemcpy(base, c->moe.router.d, router, cudaMemcpyHostToDevice));
	c->moe.router.d = base;
	c->moe.gu.d = base + align_up(router);
	c->moe.down.d = c->moe.gu.d + align_up((size_t)H * gu);
	CK(cudaMemcpy((void *)c->moe.gu.d, b->host_form[l] + b->hot_gu_off, (size_t)H * gu, cudaMemcpyHostToDevice));
	CK(cudaMemcpy((void *)c->moe.down.d, b->host_form[l] + b->hot_down_off, (size_t)H * down, cudaMemcpyHostToDevice));
	c->moe.slot_of = b->dev_slot_of + (size_t)l * E;
	c->moe.routed = b->routed;
	for (int s = 0; s < H; s++)
		b->slot_of[(size_t)l * E + s] = s, b->hot_expert[(size_t)l * H + s] = s;
	return 0;
}

/*
 * The experts a step of a hot layer brings up over the bus (struct
 * backend's bus): their slots in stage_w[0], as many as it holds of the
 * largest experts, the tables at the end of hot_w, none brought up to
 * begin with (RESIDENT_CUDA_BUS_SHARE: a share fixed at that fraction
 * instead, 0: never any). None either where no layer is brought up (no
 * stage_w) or an expert's rows are not 16-byte aligned in host memory
 * (the copying kernel's loads).
 */
static int
open_bus_experts(struct backend *b, char *err)
{
	const struct model_desc *m = b->m;
	const char *fixed = getenv("RESIDENT_CUDA_BUS_SHARE");
	double share = fixed != NULL && *fixed != '\0' ? strtod(fixed, NULL) : -1;
	int n = m->hp.n_layer, E = m->hp.n_expert, max;
	size_t gu = 0, down = 0, at;
	int32_t *tab = b->dev_slot_of + (size_t)n * E;

	if (share == 0 || b->stage_w[0] == NULL)
		return 0;
	for (int l = 0; l < n; l++) {
		const struct cuda_moe *e = &b->hot[l].moe;

		if (e->slot_of == NULL)
			continue;
		if (e->gu_stride % 16 || e->down_stride % 16 ||
		    (uintptr_t)(b->host_form[l] + b->hot_gu_off) % 16 || (uintptr_t)(b->host_form[l] + b->hot_down_off) % 16)
			return 0;
		gu = MAX(gu, e->gu_stride), down = MAX(down, e->down_stride);
	}
	max = gu == 0 ? 0 : MIN(E, (int)((b->stage_bytes - MIN(b->stage_bytes, (size_t)DEV_ALIGN)) / (gu + down)));
	if (max == 0)
		return 0;
	at = align_up((size_t)max * gu);
	CK(cudaHostAlloc((void **)&b->bus_share, sizeof *b->bus_share, cudaHostAllocDefault));
	CK(cudaHostAlloc((void **)&b->host_step_of, (size_t)E * sizeof *b->host_step_of, cudaHostAllocDefault));
	*b->bus_share = share > 0 ? (float)MIN(share, 1.0) : 0.0f;
	b->bus_fixed = share > 0;
	b->dev_bus_share = (float *)(tab + 2 * E + 1); /* after step_of (E) and list (1 + E): hot_table_entries */
	CK(cudaMemcpy(b->dev_bus_share, b->bus_share, sizeof *b->bus_share, cudaMemcpyHostToDevice));
	b->bus = (struct cuda_bus *)xcalloc((size_t)n, sizeof *b->bus);
	for (int l = 0; l < n; l++) {
		struct cuda_moe *e = &b->hot[l].moe;

		if (e->slot_of == NULL)
			continue;
		b->bus[l] = (struct cuda_bus){ b->host_form[l] + b->hot_gu_off, b->host_form[l] + b->hot_down_off,
			b->stage_w[0], b->stage_w[0] + at, tab, tab + E, b->dev_bus_share, b->n_hot, max };
		e->bus = &b->bus[l];
	}
	b->bus_tally = (struct bus_tally *)xcalloc((size_t)b->stream_min, sizeof *b->bus_tally);
	return 0;
}

/*
 * The hot experts of o's host layers (struct backend's hot): their device
 * memory, the pinned routing the host reads, the side stream and its
 * events. None where o asks for none or the host layers' GPU forms are
 * not pinned (the slots are filled from them).
 */
static int
open_hot(struct backend *b, const struct backend_opts *o, const struct mats *x, char *err)
{
	const struct model_desc *m = b->m;
	int n = m->hp.n_layer, E = m->hp.n_expert, H = hot_count(m, o), rc;
	size_t slots = (size_t)b->max_tokens * (size_t)m->hp.n_expert_used, at = 0, bytes = hot_bytes(m, o, x);
	uint8_t *base;

	if (H == 0 || b->host_form == NULL)
		return 0;
	if ((rc = dev_alloc((void **)&b->hot_w, bytes, "hot experts", err)) != 0)
		return rc;
	b->n_hot = H;
	b->dev_slot_of = (int32_t *)(b->hot_w + bytes - align_up(hot_table_entries(m) * sizeof(int32_t)));
	CK(cudaHostAlloc((void **)&b->slot_of, (size_t)n * E * sizeof(int32_t), cudaHostAllocDefault));
	CK(cudaHostAlloc((void **)&b->host_ids, slots * sizeof(int32_t), cudaHostAllocDefault));
	CK(cudaHostAlloc((void **)&b->host_wt, slots * sizeof(float), cudaHostAllocDefault));
	CK(cudaStreamCreateWithFlags(&b->side, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&b->routed, cudaEventDisableTiming));
	CK(cudaEventCreateWithFlags(&b->host_done, cudaEventDisableTiming));
	CK(cudaEventCreateWithFlags(&b->moved, cudaEventDisableTiming));
	b->hot_expert = (int32_t *)xmalloc((size_t)n * H * sizeof(int32_t));
	b->hot = (struct cuda_layer *)xcalloc((size_t)n, sizeof *b->hot);
	for (size_t i = 0; i < (size_t)n * E; i++)
		b->slot_of[i] = -1;
	for (int l = 0; l < n; l++) {
		if (!ffn_on_host(o, l))
			continue;
		base = b->hot_w + at;
		at += hot_layer_bytes(m, x, l, H);
		if ((rc = hot_layer(b, x, l, base, err)) != 0)
			return rc;
	}
	CK(cudaMemcpy(b->dev_slot_of, b->slot_of, (size_t)n * E * sizeof(int32_t), cudaMemcpyHostToDevice));
	return open_bus_experts(b, err);
}

/* Everything load does, in order; on failure the caller frees what was made. */
static int
load_all(struct backend *b, const struct backend_opts *o, char *err)
{
	const struct model_desc *m = b->m;
	size_t kv_bytes;
	struct dims d = model_dims(&m->hp, o);
	struct sizes z;
	struct mats x;
	int rc, wg = 0;

	mats_list(m, o, &x);
	/* the kernels first: the wgmma form, if the device runs it, changes the scratch wanted */
	if ((rc = open_device(b, o->device, err)) != 0 || (rc = cuda_attention_setup(m->hp.head_dim, err)) != 0 ||
	    (rc = cuda_qgemm_setup(err)) != 0 || (rc = cuda_qgemm_wg_device(&wg, err)) != 0 ||
	    (rc = plan_sizes(m, o, wg, &x, &z, err)) != 0)
		goto out;
	b->exact = o->exact != 0;
	b->kv_q8 = o->kv_type == KV_Q8_0;
	b->mm.part_elems = z.part_elems;
	/* in elements of the pool's kind: bytes with q8 */
	b->kv_stride = KV_BLOCK_TOKENS * (b->kv_q8 ? kv_row_size(d.nkv, b->exact, 1) : d.nkv);
	/* the attention kernels work out offsets within the pool in 32 bits but for the block's */
	if ((uint64_t)m->hp.n_layer * 2 * b->kv_stride > UINT32_MAX) {
		rc = err_set(err, ERR_UNSUPPORTED, "load: a KV pool block (%d layers' K and V of %zu elements each) "
		    "is past the GPU kernels' 32-bit offsets", m->hp.n_layer, b->kv_stride);
		goto out;
	}
	kv_bytes = (size_t)o->kv_blocks * z.kv_block;
	if ((rc = check_memory(z.weights + kv_bytes + z.act + z.stage + z.hot, z.weights, kv_bytes, z.act + z.stage + z.hot,
	    err)) != 0 ||
	    (rc = upload_matrices(b, x.t, x.host, x.n, x.off, z.weights, err)) != 0 ||
	    (rc = upload_smalls(b, err)) != 0 ||
	    (rc = alloc_buffers(b, &d, kv_bytes, z.wh, err)) != 0 ||
	    (rc = cuda_alloc_staging(b, MIN((int64_t)d.S * o->kv_blocks, (int64_t)TABLE_CAP0), err)) != 0 ||
	    (rc = open_blas(b, err)) != 0 || (rc = cuda_prof_open(&b->prof, err)) != 0 ||
	    (rc = open_host_ffn(b, o, &x, z.stage / 2, err)) != 0)
		goto out;
	b->tok_embd = weight_of(b, x.t, x.n, x.off, m->tok_embd);
	b->output = weight_of(b, x.t, x.n, x.off, m->output);
	for (int l = 0; l < m->hp.n_layer; l++) {
		int i = layer_first(m, l), host = ffn_on_host(o, l);

		if ((rc = layer_weights(b, &b->layers[l], l, x.t + i, x.off + i, host ? NULL : b->weights, err)) != 0)
			goto out;
		if (!host || b->streamed == NULL)
			continue;
		b->streamed[l] = b->layers[l]; /* its norms and biases */
		if ((rc = layer_weights(b, &b->streamed[l], l, x.t + i, x.off + i, b->stage_w[b->stream_slot[l]],
		    err)) != 0)
			goto out;
	}
	if ((rc = open_hot(b, o, &x, err)) != 0)
		goto out;
	mm_routing(&b->mm, b->exact, wg);
	if (wg && (rc = cuda_qgemm_wg_fit(&b->mm, err)) != 0)
		goto out;
	b->use_graphs = env_int("RESIDENT_CUDA_GRAPHS", 1) != 0;
	b->flash_tokens = flash_tokens(&m->hp, b->exact);
	rc = attention_counts(b, &m->hp, err);
out:
	mats_free(&x);
	return rc;
}

int
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

void
cuda_free(struct backend *b)
{
	if (b == NULL)
		return;
	cudaSetDevice(b->device);
	if (b->stream != NULL)
		cudaStreamSynchronize(b->stream);
	if (b->up_stream != NULL) /* the hot experts' moves */
		cudaStreamSynchronize(b->up_stream);
	cuda_prof_close(&b->prof);
	cuda_drop_graphs(b);
	if (b->mm.blas != NULL)
		cublasDestroy(b->mm.blas);
	cudaFree(b->weights), cudaFree(b->smalls), cudaFree(b->kv);
	cudaFree(b->x), cudaFree(b->h), cudaFree(b->q), cudaFree(b->k), cudaFree(b->v);
	cudaFree(b->att), cudaFree(b->gate), cudaFree(b->up), cudaFree(b->ffn_out), cudaFree(b->logits);
	cudaFree(b->glu_scale), cudaFree(b->glu_big);
	cudaFree(b->mm.xh), cudaFree(b->mm.xscale), cudaFree(b->mm.wh), cudaFree(b->blas_ws);
	cudaFree(b->mm.xq), cudaFree(b->mm.xd), cudaFree(b->mm.part);
	cudaFree(b->dev_ints), cudaFree(b->att_part), cudaFree(b->dev_argmax), cudaFree(b->argmax_part);
	cudaFree(b->dev_pick), cudaFree(b->dev_pen), cudaFree(b->dev_lp), cudaFree(b->pick_part);
	cudaFree(b->dev_mask_rows), cudaFree(b->dev_mask_bits), cudaFree(b->dev_top_ids), cudaFree(b->dev_top_lp);
	cudaFree(b->moe.route.logit), cudaFree(b->moe.route.expert), cudaFree(b->moe.route.weight);
	cudaFree(b->moe.route.row), cudaFree(b->moe.route.row_expert), cudaFree(b->moe.route.row_slot);
	cudaFree(b->moe.route.tiles), cudaFree(b->moe.down), cudaFree(b->hot_w);
	void *pinned[] = { b->host_argmax, b->host_pick, b->host_pen, b->host_lp, b->host_top_ids, b->host_top_lp,
		b->host_mask_rows, b->host_mask_bits, b->stage, b->host_ints, b->host_h, b->host_out, b->host_x,
		b->slot_of, b->host_ids, b->host_wt, b->bus_share, b->host_step_of };
	cudaEvent_t events[] = { b->routed, b->host_done, b->moved };

	for (size_t i = 0; i < ARRAY_LEN(pinned); i++)
		if (pinned[i] != NULL)
			cudaFreeHost(pinned[i]);
	for (int i = 0; i < 2; i++)
		if (b->stage_ev[i] != NULL)
			cudaEventDestroy(b->stage_ev[i]);
	if (b->moved_out != NULL)
		cudaEventDestroy(b->moved_out);
	if (b->move_out != NULL)
		cudaStreamDestroy(b->move_out);
	if (b->move_in != NULL)
		cudaStreamDestroy(b->move_in);
	if (b->stream != NULL)
		cudaStreamDestroy(b->stream);
	for (int l = 0; b->host_form != NULL && l < b->m->hp.n_layer; l++)
		if (b->host_form[l] != NULL)
			cudaFreeHost(b->host_form[l]);
	for (int i = 0; i < 2; i++) {
		cudaFree(b->stage_w[i]);
		if (b->w_ready[i] != NULL)
			cudaEventDestroy(b->w_ready[i]);
		if (b->w_free[i] != NULL)
			cudaEventDestroy(b->w_free[i]);
	}
	if (b->up_stream != NULL)
		cudaStreamDestroy(b->up_stream);
	if (b->side != NULL)
		cudaStreamDestroy(b->side);
	for (size_t i = 0; i < ARRAY_LEN(events); i++)
		if (events[i] != NULL)
			cudaEventDestroy(events[i]);
	free(b->hot), free(b->hot_expert), free(b->bus), free(b->bus_tally);
	free(b->host_form), free(b->host_form_bytes), free(b->stream_slot), free(b->streamed), free(b->bus_layer);
	cpu_ffn_free(b->host_run);
	if (b->host_pool != NULL)
		cpu_pool_free(b->host_pool);
	free(b->host_ffn), free(b->host_calls);
	free(b->layers);
	free(b);
}
