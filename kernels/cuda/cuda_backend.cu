/*
 * cuda_backend.cu: the CUDA backend's step, and its backend_ops table. The
 * same forward step as the CPU reference (kernels/cpu/cpu_backend.c), on
 * one GPU. Load (cuda_load.cu) decides once what lies where on the device;
 * a step only reads that, stages its own data and queues its kernels, so
 * the two live apart and meet in struct backend (cuda_backend_int.cuh):
 *
 * - forward copies the step's tokens, positions and block tables in one
 *   transfer, runs the layers as a stream of kernels (matmul.cu, norm.cu,
 *   attention.cu), and copies the logits back; the one synchronisation is
 *   at the end;
 * - every CUDA call is checked: a failure is a negative return code with
 *   file, line and CUDA's message, never an abort.
 *
 * kv_move copies whole blocks between the pool and host memory on two
 * streams of its own (out and in, which the bus carries at once; the
 * engine thread and the KV disk thread take turns), never on the stream of
 * the steps: a copy never waits for a step, nor a step for a copy, and the
 * blocks copied are ones no step is using (kernels.h).
 */
#include "attention.cuh"
#include "cuda_backend_int.cuh"
#include "cuda_common.cuh"
#include "matmul.cuh"
#include "moe.cuh"
#include "norm.cuh"
#include "pick.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Steps of up to this many tokens replay a captured CUDA graph. */
#define GRAPH_MAX_TOKENS 64
/* Steps of one shape among the last GRAPH_RECENT + 1, the last of them captured (see shape_steady). */
#define GRAPH_AFTER 3
/* Each of the two pinned buffers that KV blocks cross to and from host memory through. */
#define KV_STAGE_BYTES ((size_t)1 << 20)

static const char *const phase_names[PH_COUNT] = {
	"staging", "matmul", "attention", "norm/act", "output", "end",
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

/* ---- timing ---- */

/* Creates the events if RESIDENT_CUDA_TIMING is set. */
int
cuda_prof_open(struct prof *p, char *err)
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
void
cuda_prof_close(struct prof *p)
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

/* Forgets every captured graph. */
void
cuda_drop_graphs(struct backend *b)
{
	for (int i = 0; i < GRAPH_CACHE; i++)
		if (b->graphs[i].exec != NULL) {
			cudaGraphExecDestroy(b->graphs[i].exec);
			b->graphs[i].exec = NULL;
		}
}

/* Bytes of one element of the pool's kind (cuda_kv.kv_stride's unit). */
static int
kv_elem_size(const struct backend *b)
{
	return b->kv_q8 ? 1 : b->exact ? (int)sizeof(float) : (int)sizeof(__half);
}

static size_t
kv_row_bytes(const struct backend *b)
{
	return kv_row_size((size_t)b->m->hp.n_head_kv * (size_t)b->m->hp.head_dim, b->exact, b->kv_q8);
}

/* ---- forward ---- */

/* Where each part of the staging area starts, host or device. */
static struct step_ints
step_ints(const struct backend *b, int32_t *base)
{
	size_t T = (size_t)b->max_tokens;
	struct step_ints s = { base, base + T, base + 2 * T, base + 3 * T, base + 4 * T, base + 5 * T,
		base + STEP_INTS(T), base + 6 * T + 1 };

	return s;
}

/*
 * A sequence's new tokens from token t of the step as prefill tiles, if it
 * has enough of them and attends causally (the tiles' kernel masks so).
 */
static void
stage_tiles(const struct backend *b, const struct step_ints *h, int32_t t, int32_t n_new, int bidir)
{
	int on = b->flash_tokens > 0 && n_new >= FLASH_MIN_TOKENS && !bidir;

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
 * sequence long enough to have one (no more than a step's sequences); 0
 * when no sequence can be.
 */
static int
flash_grid(const struct backend *b, int T)
{
	if (b->flash_tokens == 0 || T < FLASH_MIN_TOKENS)
		return 0;
	return T / b->flash_tokens + MIN(T / FLASH_MIN_TOKENS, b->max_seqs) + 1;
}

/*
 * Fills the staging area (tokens, positions, table offsets, logit rows and
 * then hidden-state rows, prefill tiles, each token's bidirectional end,
 * the block tables each token needs) and sends it. Returns the logit rows,
 * the hidden-state rows and whether a sequence attends bidirectionally.
 */
/* Token tok's embedding, scaled, looked up by the host (the token embeddings kept in host memory). */
static void
embed_row(const struct backend *b, int32_t tok, float *x)
{
	const struct model_hparams *hp = &b->m->hp;

	cpu_get_row(b->m->tok_embd, tok, x);
	for (int i = 0; hp->embd_scale != 1.0f && i < hp->n_embd; i++)
		x[i] *= hp->embd_scale;
}

static int
stage_step(struct backend *b, const struct fwd_batch *batch, int64_t n_tab, int *n_logits, int *n_embd,
    int *bidir, char *err)
{
	struct step_ints h;
	int32_t s, i, t = 0, tab = 0, nl = 0, ne = 0;
	int rc;

	if (n_tab > b->table_cap && (rc = cuda_alloc_staging(b, MAX(n_tab, 2 * b->table_cap), err)) != 0)
		return rc;
	h = step_ints(b, b->host_ints);
	h.fa_tiles[0] = 0;
	for (s = 0; s < batch->n_seqs; s++) {
		const struct fwd_seq *q = &batch->seqs[s];
		int32_t nb = (q->pos0 + q->n_new + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;

		stage_tiles(b, &h, t, q->n_new, q->bidir);
		memcpy(h.tables + tab, q->block_table, (size_t)nb * sizeof(int32_t));
		*bidir |= q->bidir;
		for (i = 0; i < q->n_new; i++, t++) {
			h.tokens[t] = batch->tokens[t];
			h.pos[t] = q->pos0 + i;
			h.tab[t] = tab;
			h.end[t] = q->bidir ? q->pos0 + q->n_new - 1 : -1;
			if (i >= q->n_new - q->logits)
				h.lrows[nl++] = t;
		}
		tab += nb;
	}
	for (t = 0; b->host_x != NULL && t < batch->n_tokens; t++)
		embed_row(b, batch->tokens[t], b->host_x + (size_t)t * b->m->hp.n_embd);
	/* the hidden-state rows after the logit rows, normed with them */
	for (s = 0, t = 0; s < batch->n_seqs; t += batch->seqs[s++].n_new)
		for (i = batch->seqs[s].n_new - batch->seqs[s].embd; i < batch->seqs[s].n_new; i++)
			h.lrows[nl + ne++] = t + i;
	CK(cudaMemcpyAsync(b->dev_ints, b->host_ints, (STEP_INTS(b->max_tokens) + (size_t)tab) * sizeof(int32_t),
	    cudaMemcpyHostToDevice, b->stream));
	*n_logits = nl;
	*n_embd = ne;
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

/* 1 if layer l's feed-forward is kept in host memory and computed there. */
static int
ffn_on_host(const struct backend *b, int l)
{
	return b->host_ffn != NULL && b->host_ffn[l];
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

	return b->m->hp.n_expert > 0 && !ffn_on_host(b, l) && c->post_attn_norm == NULL && c->post_ffn_norm == NULL &&
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
		b->att_part, b->att_part_rows, b->exact, b->kv_q8, fa ? dev->fa_tiles : NULL, fa ? dev->fa_tok : NULL, fa,
		b->att_len, b->step_bidir ? dev->end : NULL };
	struct cuda_norm nm = { hp->norm_offset, hp->norm_eps };
	struct cuda_q8 q8 = { NULL, NULL }, no_q8 = { NULL, NULL };
	struct cuda_h16 h16 = { NULL, NULL }, none = { NULL, NULL };
	struct cuda_rmix bias = { c->bo, 0, NULL, NULL, NULL, NULL };
	int embd = hp->n_embd, nq = hp->n_head * hp->head_dim, nkv = hp->n_head_kv * hp->head_dim, rc, fused;
	const struct cuda_weight *wqkv[3] = { &c->wq, &c->wk, &c->wv };
	float *qkv[3] = { b->q, b->k, b->v };
	int ld[3] = { nq, nkv, nkv };

	/* the attention kernels write the output product's input form (the prefill tiles' kernel its fp16 one) */
	h16 = h16_of(b, T);
	if (!fa)
		q8 = q8_of(b, T, &c->wo);
	prof_mark(b, PH_MATMUL);
	fused = cuda_matmul_qkv_fits(&b->mm, wqkv, T, &hd, &kv); /* the product does qk's work too */
	rc = fused ? cuda_matmul_qkv(&b->mm, wqkv, b->h, embd, T, b->q, &hd, &kv, formed(b, T, &c->wq), err) :
		     cuda_matmul_multi(&b->mm, wqkv, 3, b->h, embd, T, qkv, ld, formed(b, T, &c->wq), err);
	if (rc != 0)
		return rc;
	prof_mark(b, PH_ATTN);
	kv.sms = b->mm.sms, kv.wide = b->att_wide;
	kv.dec_tc = b->att_tc;
	/* the attention kernel does qk's work (the tensor-core one where a block holds a KV head's query heads) */
	if (!fused && b->step_decode && !b->step_bidir && (!kv.dec_tc || hd.n_head / hd.n_head_kv <= FD_ROWS))
		kv.k_new = b->k, kv.v_new = b->v;
	else if (!fused && (rc = cuda_qk(b->q, b->k, b->v, T, &hd, &kv, b->stream, err)) != 0)
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
	if (hp->n_expert > 0 || ffn_on_host(b, l)) /* the router, the gathering or the host read the float rows */
		return cuda_residual_norm(b->x, b->ffn_out, &bias, c->post_attn_norm, c->ffn_norm, b->h, none,
		    ffn_on_host(b, l) ? no_q8 : q8_of_experts(b, T, l), T, embd, nm, b->stream, err);
	return cuda_residual_norm(b->x, b->ffn_out, &bias, c->post_attn_norm, c->ffn_norm, b->h, h16_of(b, T),
	    q8_of(b, T, &c->w_gate), T, embd, nm, b->stream, err);
}

/*
 * The dense feed-forward of layer c on the normed rows in h (or their
 * forms: formed, see formed()), into ffn_out.
 */
static int
dense_ffn(struct backend *b, int T, const struct cuda_layer *c, int formed_in, char *err)
{
	const struct model_hparams *hp = &b->m->hp;
	int embd = hp->n_embd, ff = hp->n_ff, rc, ld[2] = { ff, ff };
	const struct cuda_weight *wgu[2] = { &c->w_gate, &c->w_up };
	float *gu[2] = { b->gate, b->up };

	prof_mark(b, PH_MATMUL);
	if (cuda_matmul_glu_fits(&b->mm, &c->w_gate, &c->w_up, T)) { /* the GLU made by gate/up's launch */
		struct cuda_glu16 g = { (__half *)b->gate, b->up, b->glu_scale, b->glu_big, ff, hp->act == ACT_GELU };
		struct cuda_h16 in = { g.h, g.scale };

		if ((rc = cuda_matmul_glu(&b->mm, &c->w_gate, &c->w_up, b->h, embd, T, &g, formed_in, err)) != 0 ||
		    (rc = cuda_glu_fix(&g, T, b->stream, err)) != 0)
			return rc;
		return cuda_matmul_h16(&b->mm, &c->w_down, in, T, b->ffn_out, embd, err);
	}
	if ((rc = cuda_matmul_multi(&b->mm, wgu, 2, b->h, embd, T, gu, ld, formed_in, err)) != 0)
		return rc;
	prof_mark(b, PH_NORM);
	if ((rc = cuda_glu(b->gate, b->up, T, ff, hp->act == ACT_GELU, h16_of(b, T), q8_of(b, T, &c->w_down),
	    b->cluster_sms, b->stream, err)) != 0)
		return rc;
	prof_mark(b, PH_MATMUL);
	return cuda_matmul(&b->mm, &c->w_down, b->gate, ff, T, b->ffn_out, embd, formed(b, T, &c->w_down), err);
}

/*
 * 1 if a step of T tokens brings host layer l's feed-forward up
 * (open_streaming) instead of computing it on the host: every host layer
 * from stream_min tokens, the bus layers at any count.
 */
static int
streams(const struct backend *b, int T, int l)
{
	return b->streamed != NULL && (T >= b->stream_min || (b->bus_layer != NULL && b->bus_layer[l]));
}

/* 1 if a step of T tokens brings any host layer up (it then runs outside a graph). */
static int
streams_any(const struct backend *b, int T)
{
	return b->streamed != NULL && (T >= b->stream_min || b->bus_layer != NULL);
}

/* 1 if a step of T tokens splits host layer l's experts between the device's hot ones and the host. */
static int
hot_split(const struct backend *b, int T, int l)
{
	return b->hot != NULL && ffn_on_host(b, l) && !streams(b, T, l);
}

/*
 * A feed-forward kept in host memory: the stream's host function between
 * its rows' copies; with hot experts, the experts the device does not
 * compute, by the device's routing (and the step's table, where some are
 * brought up over the bus).
 */
static void CUDART_CB
host_ffn(void *arg)
{
	const struct host_call *c = (const struct host_call *)arg;
	struct backend *b = c->b;

	if (hot_split(b, b->step_T, c->l))
		cpu_ffn_run_routed(b->host_run, c->l, b->host_h, b->step_T, b->host_ids, b->host_wt,
		    b->bus != NULL ? b->host_step_of : b->slot_of + (size_t)c->l * b->m->hp.n_expert, b->host_out);
	else
		cpu_ffn_run(b->host_run, c->l, b->host_h, b->step_T, b->host_out);
}

/*
 * Layer l's feed-forward on the host, into ffn_out, on stream st: its
 * normed rows (float, in h) down, with the device's routing where its
 * experts are split (hot_split), the host's threads on them while the
 * stream waits, the rows up. The copies and the host function are part of
 * a captured graph like any kernel; the function reads the token count of
 * the step under way.
 */
static int
host_feed_forward(struct backend *b, int T, int l, cudaStream_t st, char *err)
{
	const struct model_hparams *hp = &b->m->hp;
	size_t bytes = (size_t)T * (size_t)hp->n_embd * sizeof(float), slots = (size_t)T * hp->n_expert_used;

	CK(cudaMemcpyAsync(b->host_h, b->h, bytes, cudaMemcpyDeviceToHost, st));
	if (hot_split(b, T, l)) {
		CK(cudaMemcpyAsync(b->host_ids, b->moe.route.expert, slots * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
		CK(cudaMemcpyAsync(b->host_wt, b->moe.route.weight, slots * sizeof(float), cudaMemcpyDeviceToHost, st));
		if (b->bus != NULL)
			CK(cudaMemcpyAsync(b->host_step_of, b->bus[l].step_of, (size_t)hp->n_expert * sizeof(int32_t),
			    cudaMemcpyDeviceToHost, st));
	}
	CK(cudaLaunchHostFunc(st, host_ffn, &b->host_calls[l]));
	CK(cudaMemcpyAsync(b->ffn_out, b->host_out, bytes, cudaMemcpyHostToDevice, st));
	return 0;
}

/*
 * Host layer l's experts split (hot_split): the device routes the tokens
 * and runs the chosen experts it holds (hot[l]); once the routing is made
 * the side stream takes the rows and the routing down, the host's threads
 * compute the other chosen experts into host_out and the sum comes up
 * into ffn_out, which the mixture adds (cuda_rmix.pre) beside the
 * device's rows, after the step's stream has waited for it.
 */
static int
hot_feed_forward(struct backend *b, int T, int l, struct cuda_rmix *mix, const float **r, char *err)
{
	int rc;

	if ((rc = cuda_moe_ffn(&b->mm, &b->hot[l].moe, &b->moe, b->h, b->m->hp.n_embd, T, 0, NULL, mix, err)) != 0)
		return rc;
	CK(cudaStreamWaitEvent(b->side, b->routed, 0));
	if ((rc = host_feed_forward(b, T, l, b->side, err)) != 0)
		return rc;
	CK(cudaEventRecord(b->host_done, b->side));
	CK(cudaStreamWaitEvent(b->stream, b->host_done, 0));
	mix->pre = b->ffn_out;
	*r = b->moe.down;
	return 0;
}

/*
 * Host layer l's feed-forward on the device, its weights brought up into
 * its stage buffer on up_stream once the layer before it in that buffer
 * is done with it (w_free), the step's stream waiting for them (w_ready).
 * The copies of the next layers run on while this one computes: the bus,
 * not the host, bounds such a step. The rows stay float (its norm wrote
 * no int8 or fp16 form). Its experts leave their rows and mixture as a
 * device layer's do.
 */
static int
streamed_ffn(struct backend *b, int T, int l, struct cuda_rmix *mix, const float **r, char *err)
{
	const struct cuda_layer *c = &b->streamed[l];
	int k = b->stream_slot[l], rc;

	CK(cudaStreamWaitEvent(b->up_stream, b->w_free[k], 0));
	CK(cudaMemcpyAsync(b->stage_w[k], b->host_form[l], b->host_form_bytes[l], cudaMemcpyHostToDevice,
	    b->up_stream));
	CK(cudaEventRecord(b->w_ready[k], b->up_stream));
	CK(cudaStreamWaitEvent(b->stream, b->w_ready[k], 0));
	if (b->m->hp.n_expert > 0) {
		rc = cuda_moe_ffn(&b->mm, &c->moe, &b->moe, b->h, b->m->hp.n_embd, T, 0, NULL, mix, err);
		*r = b->moe.down;
	} else {
		rc = dense_ffn(b, T, c, 0, err);
	}
	if (rc != 0)
		return rc;
	CK(cudaEventRecord(b->w_free[k], b->stream));
	return 0;
}

/*
 * The feed-forward half of layer l; ends with the next layer's input norm
 * in h. A layer's experts leave each of their rows in moe.down, and the
 * residual adds each token's up by the router's weights (mix); a host
 * layer's come back summed, as a dense one's.
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
	if (ffn_on_host(b, l) && streams(b, T, l)) {
		rc = streamed_ffn(b, T, l, &mix, &r, err);
	} else if (hot_split(b, T, l)) {
		rc = hot_feed_forward(b, T, l, &mix, &r, err);
	} else if (ffn_on_host(b, l)) {
		rc = host_feed_forward(b, T, l, b->stream, err);
	} else if (hp->n_expert > 0) {
		struct cuda_moe_pre pre = { b->x, b->ffn_out, c->bo, c->ffn_norm, nm, q8_of_experts(b, T, l) };

		rc = cuda_moe_ffn(&b->mm, &c->moe, &b->moe, b->h, hp->n_embd, T, pre.q8.q != NULL,
		    moe_norm_fused(b, T, l) ? &pre : NULL, &mix, err);
		r = b->moe.down;
	} else {
		rc = dense_ffn(b, T, c, formed(b, T, &c->w_gate), err);
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
 * the final norm of the rows that want logits (and after them of the
 * n_embd rows that want hidden states, left in h) and the projection of
 * the first LOGIT_ROWS logit rows. Nothing here synchronises, and host
 * memory is touched only by copies from and to the pinned buffers that
 * every step of a shape uses alike (the embeddings the host looked up,
 * the rows of its feed-forwards) and by the host functions that read
 * them, so that it can be captured into a graph.
 */
static int
step_kernels(struct backend *b, int T, int n_logits, int n_embd, const struct step_ints *dev, char *err)
{
	const struct model_hparams *hp = &b->m->hp;
	struct cuda_norm nm = { hp->norm_offset, hp->norm_eps };
	int rc;

	prof_mark(b, PH_NORM);
	if (b->host_x != NULL)
		CK(cudaMemcpyAsync(b->x, b->host_x, (size_t)T * hp->n_embd * sizeof(float), cudaMemcpyHostToDevice,
		    b->stream));
	else if ((rc = cuda_embed(&b->tok_embd, dev->tokens, T, hp->embd_scale, b->x, b->stream, err)) != 0)
		return rc;
	if ((rc = cuda_residual_norm(b->x, NULL, NULL, NULL, b->layers[0].attn_norm, b->h, h16_of(b, T),
	    q8_of(b, T, &b->layers[0].wq), T, hp->n_embd, nm, b->stream, err)) != 0)
		return rc;
	for (int l = 0; l < hp->n_layer; l++)
		if ((rc = attention(b, T, l, dev, err)) != 0 || (rc = feed_forward(b, T, l, err)) != 0)
			return rc;
	prof_mark(b, PH_OUTPUT);
	if (n_logits + n_embd == 0)
		return 0;
	if ((rc = cuda_norm_rows(b->x, dev->lrows, b->out_norm, b->h, n_logits + n_embd, hp->n_embd, nm,
	    b->stream, err)) != 0)
		return rc;
	return n_logits == 0 ? 0 : output_rows(b, 0, MIN(n_logits, MIN(b->max_tokens, LOGIT_ROWS)), err);
}

static int
shape_eq(const struct step_shape *a, const struct step_shape *b)
{
	return a->n_tok == b->n_tok && a->n_logits == b->n_logits && a->att_len == b->att_len && a->att_tc == b->att_tc &&
	    a->decode == b->decode;
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
 * Counts this step's shape; 1 if it is the GRAPH_AFTER-th of that shape
 * among the last GRAPH_RECENT + 1 steps. A capture and instantiation cost
 * about half a step (2.5-9 ms beside steps of 4.5-7.5 ms, llama3-8b on an
 * H100) and a step without a graph ~5 % more than with one (programmatic
 * launch hides most launch gaps; on a small model, several times more), so
 * only a shape that recurs pays for one: requests that arrive or end one
 * by one change the token count every step or two, but speculative steps
 * come back to a few sizes (engine.c's trim_guesses) in turn, not in a row.
 */
static int
shape_steady(struct backend *b, const struct step_shape *sh)
{
	int seen = 0, n = (int)MIN(b->n_recent, (uint64_t)GRAPH_RECENT);

	for (int i = 0; i < n; i++)
		seen += shape_eq(&b->recent[i], sh);
	b->recent[b->n_recent++ % GRAPH_RECENT] = *sh;
	return seen + 1 >= GRAPH_AFTER;
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
	struct step_shape sh = { T, n_logits, b->att_len, b->att_tc, b->step_decode };
	int steady = shape_steady(b, &sh), hit, rc;
	struct graph *g = find_graph(b, &sh, &hit);
	cudaGraph_t graph = NULL;
	cudaError_t e;

	if (!hit && !steady)
		return step_kernels(b, T, n_logits, 0, dev, err);
	if (!hit) {
		if (g->exec != NULL) {
			cudaGraphExecDestroy(g->exec);
			g->exec = NULL;
		}
		CK(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
		rc = step_kernels(b, T, n_logits, 0, dev, err);
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
	if (mk.n > b->max_seqs)
		return err_set(err, ERR_INVAL, "%d constrained rows (at most %d)", mk.n, b->max_seqs);
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

/*
 * How the hot experts follow the routing: every step a choice's count
 * fades by HOT_FADE (about a hundred steps' memory), and an expert moves
 * into the slot of its layer's least chosen one once its count is
 * HOT_MARGIN times that one's and HOT_LEAD more, so that two experts
 * chosen about as often do not trade places back and forth. Only the steps
 * the host computes count (cpu_ffn_chosen): a prompt brought up over the
 * bus does not.
 */
#define HOT_FADE 0.99f
#define HOT_MARGIN 1.5f
#define HOT_LEAD 2.0f

/* Host layer l's best move into its hot slots (the gain in counts, 0: none), into *mv. */
static float
hot_candidate(const struct backend *b, int l, struct hot_move *mv)
{
	int E = b->m->hp.n_expert, H = b->n_hot, in = -1, out = -1;
	const float *c = cpu_ffn_chosen(b->host_run, l);
	const int32_t *at = b->slot_of + (size_t)l * E, *held = b->hot_expert + (size_t)l * H;
	float lo = 0, hi = 0;

	for (int s = 0; s < H; s++) { /* an empty slot (a move that failed) is the least chosen */
		float v = held[s] < 0 ? -1.0f : c[held[s]];

		if (out < 0 || v < lo)
			out = s, lo = v;
	}
	for (int e = 0; e < E; e++)
		if (at[e] < 0 && (in < 0 || c[e] > hi))
			in = e, hi = c[e];
	if (in < 0 || out < 0 || hi <= lo * HOT_MARGIN + HOT_LEAD)
		return 0;
	*mv = (struct hot_move){ l, in, out };
	return hi - lo;
}

/*
 * Up to HOT_MOVES moves, the best gains first, each slot taken out of the
 * table before its copy begins on up_stream (the next steps compute its
 * old expert on the host until the move is done).
 */
static int
hot_start(struct backend *b, char *err)
{
	int n = b->m->hp.n_layer, E = b->m->hp.n_expert, H = b->n_hot, nb = 0, at;
	struct hot_move mv;
	float gain[HOT_MOVES], g;

	for (int l = 0; l < n; l++) {
		if (!ffn_on_host(b, l) || (g = hot_candidate(b, l, &mv)) <= 0 || (nb == HOT_MOVES && g <= gain[nb - 1]))
			continue;
		for (at = nb < HOT_MOVES ? nb++ : HOT_MOVES - 1; at > 0 && gain[at - 1] < g; at--)
			b->moves[at] = b->moves[at - 1], gain[at] = gain[at - 1];
		b->moves[at] = mv, gain[at] = g;
	}
	for (int i = 0; i < nb; i++) {
		const struct hot_move *m = &b->moves[i];
		int32_t *held = &b->hot_expert[(size_t)m->l * H + m->slot];
		const struct cuda_moe *e = &b->hot[m->l].moe;
		const uint8_t *src = b->host_form[m->l];
		size_t gu = e->gu_stride, down = e->down_stride;

		if (*held >= 0)
			b->slot_of[(size_t)m->l * E + *held] = -1;
		*held = -1;
		CK(cudaMemcpyAsync((uint8_t *)e->gu.d + (size_t)m->slot * gu, src + b->hot_gu_off + (size_t)m->e * gu, gu,
		    cudaMemcpyHostToDevice, b->up_stream));
		CK(cudaMemcpyAsync((uint8_t *)e->down.d + (size_t)m->slot * down, src + b->hot_down_off +
		    (size_t)m->e * down, down, cudaMemcpyHostToDevice, b->up_stream));
	}
	if (nb > 0) {
		CK(cudaEventRecord(b->moved, b->up_stream));
		b->hot_pending = nb, b->hot_dirty = 1;
	}
	return 0;
}

/* Every BUS_RETRY-th step of a token count tries a share next to its best; a new time counts BUS_FADE. */
#define BUS_RETRY 16
#define BUS_FADE 0.25

/*
 * The bus's share for a step of T tokens (struct backend's bus): the one
 * that took the least time. Each token count keeps a fading step time for
 * each share (bus_tally); a step takes the best one, or a share next to it
 * that it has not timed yet, and every BUS_RETRY-th step of that count the
 * one on either side in turn, so that the choice follows what the host and
 * the bus really do (the host's caches, the memory both read, the hot
 * experts moving in) rather than a model of them. Its device copy is made
 * on the step's stream when it changes.
 */
static int
bus_choose(struct backend *b, int T, char *err)
{
	struct bus_tally *c = &b->bus_tally[T];
	int k = c->best, lo = MAX(k - 1, 0), hi = MIN(k + 1, BUS_SHARES - 1);
	float f;

	c->steps++;
	if (c->t[lo] == 0)
		k = lo;
	else if (c->t[hi] == 0)
		k = hi;
	else if (c->steps % BUS_RETRY == 0)
		k = c->steps / BUS_RETRY % 2 ? lo : hi;
	c->now = k;
	f = (float)k / (BUS_SHARES - 1);
	if (f != *b->bus_share) {
		*b->bus_share = f;
		CK(cudaMemcpyAsync(b->dev_bus_share, b->bus_share, sizeof *b->bus_share, cudaMemcpyHostToDevice, b->stream));
	}
	return 0;
}

/* 1 if a step of T tokens chooses its share of the bus (bus_choose) and is timed for it. */
static int
bus_tallied(const struct backend *b, int T)
{
	return b->bus != NULL && !b->bus_fixed && T < b->stream_min;
}

/*
 * A step of T tokens took s seconds at the share bus_choose gave it. The
 * best share's time fades; another's is its latest, since its earlier
 * ones are many steps old (the hot experts were not where they are now).
 */
static void
bus_timed(struct backend *b, int T, double s)
{
	struct bus_tally *c = &b->bus_tally[T];
	double *t = &c->t[c->now];

	*t = *t > 0 && c->now == c->best ? *t + (s - *t) * BUS_FADE : s;
	for (int k = 0; k < BUS_SHARES; k++)
		if (c->t[k] > 0 && c->t[k] < c->t[c->best])
			c->best = k;
}

/*
 * Between steps: the counts fade; a finished batch of moves enters the
 * table, or, with none in flight, the next batch starts (hot_start). The
 * table's device copy is made on the step's stream, before the step
 * reads it.
 */
static int
hot_settle(struct backend *b, char *err)
{
	int n = b->m->hp.n_layer, E = b->m->hp.n_expert, H = b->n_hot, rc;
	cudaError_t done = b->hot_pending > 0 ? cudaEventQuery(b->moved) : cudaSuccess;

	if (done == cudaErrorNotReady)
		(void)cudaGetLastError(); /* not an error: the copies go on */
	else
		CK(done);
	for (int l = 0; l < n; l++) {
		float *c = ffn_on_host(b, l) ? cpu_ffn_chosen(b->host_run, l) : NULL;

		for (int e = 0; c != NULL && e < E; e++)
			c[e] *= HOT_FADE;
	}
	if (b->hot_pending > 0 && done == cudaSuccess) {
		for (int i = 0; i < b->hot_pending; i++) {
			const struct hot_move *m = &b->moves[i];

			b->slot_of[(size_t)m->l * E + m->e] = m->slot;
			b->hot_expert[(size_t)m->l * H + m->slot] = m->e;
		}
		b->hot_moved += b->hot_pending;
		b->hot_pending = 0, b->hot_dirty = 1;
	} else if (b->hot_pending == 0 && (rc = hot_start(b, err)) != 0) {
		return rc;
	}
	if (b->hot_dirty)
		CK(cudaMemcpyAsync(b->dev_slot_of, b->slot_of, (size_t)n * E * sizeof(int32_t), cudaMemcpyHostToDevice,
		    b->stream));
	b->hot_dirty = 0;
	return 0;
}

static int
cuda_hot_experts(const struct backend *b, int64_t *moves)
{
	*moves = b->hot_moved;
	return b->n_hot;
}

/*
 * Pieces of split attention grow with the context, up to the most a step
 * of T tokens splits into (cuda_attention_splits): the length is bounded
 * there, so that past it one shape, and one graph, serves every longer
 * context. Whether decode tokens take the tensor cores follows the
 * unbounded length.
 */
static void
step_split(struct backend *b, int T, int64_t max_len)
{
	struct cuda_heads hd = heads_of(b, 0); /* every layer has the same head counts */
	struct cuda_kv kv;
	int64_t pieces = MIN((max_len + ATT_SPLIT_MIN - 1) / ATT_SPLIT_MIN, ATT_MAX_SPLITS);

	b->att_tc = b->tc_decode_len > 0 && pieces * ATT_SPLIT_MIN >= b->tc_decode_len && !b->step_bidir ?
	    b->tc_blocks : 0;
	memset(&kv, 0, sizeof(kv));
	kv.sms = b->mm.sms, kv.part = b->att_part, kv.part_rows = b->att_part_rows, kv.dec_tc = b->att_tc;
	b->att_len = (int)MIN(pieces, (int64_t)cuda_attention_splits(T, &hd, &kv)) * ATT_SPLIT_MIN;
}

static int
cuda_forward(struct backend *b, const struct fwd_batch *batch, float *logits, char *err)
{
	size_t V = (size_t)b->m->hp.n_vocab;
	struct step_ints dev;
	int64_t n_tab = 0, max_len;
	int T = batch->n_tokens, n_logits = 0, n_embd = 0, bidir = 0, rows = MIN(b->max_tokens, LOGIT_ROWS), n_masks, rc;
	uint64_t t0 = now_ns();

	if ((rc = fwd_batch_check(batch, b->max_tokens, b->kv_blocks, b->m->hp.n_vocab, &max_len, &n_tab,
	    err)) != 0)
		return rc;
	CK(cudaSetDevice(b->device));
	if (b->hot != NULL && (rc = hot_settle(b, err)) != 0)
		return rc;
	if (bus_tallied(b, T) && (rc = bus_choose(b, T, err)) != 0)
		return rc;
	b->prof.n = 0;
	prof_mark(b, PH_STAGE);
	if ((rc = stage_step(b, batch, n_tab, &n_logits, &n_embd, &bidir, err)) != 0 ||
	    (rc = stage_picks(b, batch, n_logits, err)) != 0)
		return rc;
	dev = step_ints(b, b->dev_ints);
	b->step_bidir = bidir;
	b->step_decode = batch->n_seqs == T;
	b->step_T = T;
	step_split(b, T, max_len);
	/*
	 * an embedding step (hidden states, bidirectional attention) is no graph's shape, nor is one that brings
	 * weights up on a second stream (its events would join the capture from outside it)
	 */
	if (b->use_graphs && (!b->prof.on || b->prof.on == PROF_STEPS) && T <= GRAPH_MAX_TOKENS && n_logits <= rows &&
	    n_embd == 0 && !bidir && !streams_any(b, T))
		rc = graph_step(b, T, n_logits, &dev, err);
	else
		rc = step_kernels(b, T, n_logits, n_embd, &dev, err);
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
	/* the hidden states were normed after the logit rows, which a later pass of the loop above does not touch */
	if (n_embd > 0)
		CK(cudaMemcpyAsync(batch->embd, b->h + (size_t)n_logits * b->m->hp.n_embd,
		    (size_t)n_embd * b->m->hp.n_embd * sizeof(float), cudaMemcpyDeviceToHost, b->stream));
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
	if (bus_tallied(b, T))
		bus_timed(b, T, (double)(now_ns() - t0) / 1e9);
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
	size_t pitch = b->kv_stride * (size_t)kv_elem_size(b), per_block = (size_t)b->m->hp.n_layer * 2 * pitch;
	size_t rows = (size_t)n_tokens * (b->kv_q8 ? nkv : kv_row_bytes(b));
	char *kv = (char *)b->kv, *src_at, *dst_at;

	if (src < 0 || src >= b->kv_blocks || dst < 0 || dst >= b->kv_blocks ||
	    n_tokens < 0 || n_tokens > KV_BLOCK_TOKENS)
		return err_set(err, ERR_INVAL, "kv_copy %d -> %d of %d tokens: out of range", src, dst, n_tokens);
	if (n_tokens == 0 || src == dst)
		return 0;
	CK(cudaSetDevice(b->device));
	/* the block's K and V of every layer: 2 * n_layer rows of n_tokens positions, a pitch apart */
	src_at = kv + (size_t)src * per_block, dst_at = kv + (size_t)dst * per_block;
	CK(cudaMemcpy2DAsync(dst_at, pitch, src_at, pitch, rows, (size_t)b->m->hp.n_layer * 2, cudaMemcpyDeviceToDevice,
	    b->stream));
	if (b->kv_q8) /* and their scales, after the block's int8 rows */
		CK(cudaMemcpy2DAsync(dst_at + KV_BLOCK_TOKENS * nkv, pitch, src_at + KV_BLOCK_TOKENS * nkv, pitch,
		    (size_t)n_tokens * (nkv / 32) * sizeof(float), (size_t)b->m->hp.n_layer * 2, cudaMemcpyDeviceToDevice,
		    b->stream));
	return 0;
}

/*
 * Pieces of pageable host memory cross through two pinned buffers of
 * KV_STAGE_BYTES: a copy from or to pageable memory runs at a fraction of
 * the bus's speed (CUDA stages it itself, one piece at a time,
 * synchronously). While one piece crosses the bus the CPU copies the
 * other; a piece read from the device is copied out once the next one is
 * on its way (prev), or before a piece goes the other way.
 */
struct kv_stager {
	cudaStream_t st;
	int k;              /* the buffer the next piece takes */
	char *prev;         /* where the piece in the other buffer goes (to the host), or NULL */
	size_t prev_len;
};

/* Copies the piece read last out of its buffer, if one is waiting. */
static int
stage_flush(struct backend *b, struct kv_stager *sg, char *err)
{
	if (sg->prev == NULL)
		return 0;
	CK(cudaEventSynchronize(b->stage_ev[sg->k ^ 1]));
	memcpy(sg->prev, b->stage + (sg->k ^ 1) * KV_STAGE_BYTES, sg->prev_len);
	sg->prev = NULL;
	return 0;
}

static int
stage_piece(struct backend *b, struct kv_stager *sg, char *dev, char *host, size_t len, int to_host, char *err)
{
	char *buf = b->stage + sg->k * KV_STAGE_BYTES;
	int rc;

	if (!to_host && (rc = stage_flush(b, sg, err)) != 0)
		return rc;
	CK(cudaEventSynchronize(b->stage_ev[sg->k]));
	if (to_host) {
		CK(cudaMemcpyAsync(buf, dev, len, cudaMemcpyDeviceToHost, sg->st));
		CK(cudaEventRecord(b->stage_ev[sg->k], sg->st));
		if ((rc = stage_flush(b, sg, err)) != 0)
			return rc;
		sg->prev = host, sg->prev_len = len;
	} else {
		memcpy(buf, host, len);
		CK(cudaMemcpyAsync(dev, buf, len, cudaMemcpyHostToDevice, sg->st));
		CK(cudaEventRecord(b->stage_ev[sg->k], sg->st));
	}
	sg->k ^= 1;
	return 0;
}

/* A block's bytes between dev and pageable host memory, through the staging buffers. */
static int
stage_block(struct backend *b, struct kv_stager *sg, char *dev, char *host, size_t per, int to_host, char *err)
{
	int rc;

	for (size_t at = 0, len; at < per; at += len) {
		len = MIN(KV_STAGE_BYTES, per - at);
		if ((rc = stage_piece(b, sg, dev + at, host + at, len, to_host, err)) != 0)
			return rc;
	}
	return 0;
}

/* 1 if p is host memory CUDA has pinned (host_alloc's), 0 if pageable, -1 on an error. */
static int
host_pinned(const void *p, char *err)
{
	struct cudaPointerAttributes at;

	CK(cudaPointerGetAttributes(&at, p));
	return at.type == cudaMemoryTypeHost;
}

/*
 * Block i's copy out (if any), then its copy in (if any). Pinned blocks
 * go straight across, out on move_out, in on move_in once its own copy
 * out is done, so that one block's copy in overlaps the next one's copy
 * out (the bus carries both ways at once); pageable ones are staged on
 * move_out, in order.
 */
static int
move_block(struct backend *b, struct kv_stager *sg, char *dev, size_t per, char *out, const char *in, char *err)
{
	int rc, pinned;

	if (out != NULL) {
		if ((pinned = host_pinned(out, err)) < 0)
			return pinned;
		if (pinned)
			CK(cudaMemcpyAsync(out, dev, per, cudaMemcpyDeviceToHost, b->move_out));
		else if ((rc = stage_block(b, sg, dev, out, per, 1, err)) != 0)
			return rc;
	}
	if (in == NULL)
		return 0;
	if ((pinned = host_pinned(in, err)) < 0)
		return pinned;
	if (!pinned)
		return stage_block(b, sg, dev, (char *)in, per, 0, err);
	CK(cudaEventRecord(b->moved_out, b->move_out));
	CK(cudaStreamWaitEvent(b->move_in, b->moved_out, 0));
	CK(cudaMemcpyAsync(dev, in, per, cudaMemcpyHostToDevice, b->move_in));
	return 0;
}

/*
 * The calling thread on b's device, and the staging buffers and streams,
 * made at the first move (most loads never move a block).
 */
static int
kv_stage_ready(struct backend *b, char *err)
{
	CK(cudaSetDevice(b->device));
	if (b->stage != NULL)
		return 0;
	/* each made once: a call after one failed goes on from there (cuda_free frees what there is) */
	if (b->stage_ev[0] == NULL)
		CK(cudaEventCreateWithFlags(&b->stage_ev[0], cudaEventDisableTiming));
	if (b->stage_ev[1] == NULL)
		CK(cudaEventCreateWithFlags(&b->stage_ev[1], cudaEventDisableTiming));
	if (b->moved_out == NULL)
		CK(cudaEventCreateWithFlags(&b->moved_out, cudaEventDisableTiming));
	if (b->move_out == NULL)
		CK(cudaStreamCreateWithFlags(&b->move_out, cudaStreamNonBlocking));
	if (b->move_in == NULL)
		CK(cudaStreamCreateWithFlags(&b->move_in, cudaStreamNonBlocking));
	CK(cudaMallocHost((void **)&b->stage, 2 * KV_STAGE_BYTES));
	return 0;
}

/* kernels.h: one caller at a time. */
static int
cuda_kv_move(struct backend *b, const int32_t *blocks, int32_t n, void *const *out, const void *const *in,
    char *err)
{
	size_t per = (size_t)b->m->hp.n_layer * 2 * b->kv_stride * (size_t)kv_elem_size(b);
	struct kv_stager sg;
	int rc;

	for (int32_t i = 0; i < n; i++)
		if (blocks[i] < 0 || blocks[i] >= b->kv_blocks)
			return err_set(err, ERR_INVAL, "KV block %d is outside the pool", blocks[i]);
	if ((rc = kv_stage_ready(b, err)) != 0)
		return rc;
	sg = (struct kv_stager){ b->move_out, 0, NULL, 0 };
	for (int32_t i = 0; i < n && rc == 0; i++)
		rc = move_block(b, &sg, (char *)b->kv + (size_t)blocks[i] * per, per, out != NULL ? (char *)out[i] : NULL,
		    in != NULL ? (const char *)in[i] : NULL, err);
	if (rc == 0)
		rc = stage_flush(b, &sg, err);
	if (rc != 0) { /* the copies under way end before the caller reuses their blocks and buffers */
		cudaStreamSynchronize(b->move_out);
		cudaStreamSynchronize(b->move_in);
		cudaGetLastError();
		return rc;
	}
	CK(cudaStreamSynchronize(b->move_out));
	CK(cudaStreamSynchronize(b->move_in));
	return 0;
}

/*
 * Pinned host memory for the host tier (NULL where CUDA cannot pin it:
 * the tier then keeps no block rather than slow ones). Pinning takes the
 * driver a while, so the tier reuses what it got (kvhost.c).
 */
static void *
cuda_host_alloc(size_t bytes)
{
	void *p = NULL;

	if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
		cudaGetLastError(); /* clear it */
		return NULL;
	}
	return p;
}

static void
cuda_host_free(void *p)
{
	if (p != NULL)
		cudaFreeHost(p);
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
	kv_row_bytes,
	cuda_plan,
	cuda_load,
	cuda_forward,
	cuda_kv_copy,
	cuda_kv_move,
	cuda_host_alloc,
	cuda_host_free,
	cuda_step_tokens,
	cuda_hot_experts,
	cuda_free,
	1,
	8,
};
