/*
 * cpu_ffn.c: a layer's feed-forward on the host (cpu_ffn.h). The products
 * are cpu_ops.c's, threaded by cpu_pool.c; a layer of experts routes its
 * tokens, groups them by expert and runs every expert's product over its
 * own rows in one pool run, so that an expert's weights are read once a
 * step however many tokens chose it.
 */
#include "config.h"
#include "cpu_ffn.h"
#include "cpu_ops.h"
#include "cpu_pool.h"
#include "model.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A layer's 1-D weights of the experts, as float (converted once). */
struct ffn_layer {
	float *router_b, *gate_b, *up_b, *down_b;
};

/*
 * A step's expert routing: each token's n_expert_used choices (slot j of
 * token t is t * used + j, in router order) and their weights; the rows
 * of the experts' products, grouped by expert (expert e's are first[e] ..
 * first[e + 1] - 1, its tokens in step order), and the row each slot took.
 */
struct cpu_route {
	float *logit;       /* max_tokens x n_expert */
	int32_t *expert;    /* per slot */
	float *weight;      /* per slot */
	int32_t *row;       /* per slot: its row of the grouped products */
	int32_t *token;     /* per row: its token */
	int32_t *first;     /* n_expert + 1 */
	float *x, *gate, *up, *down; /* per row: input, gate and up (n_ff_exp), down (n_embd) */
};

struct cpu_ffn {
	const struct model_desc *m;
	struct cpu_pool *pool;
	struct ffn_layer *layers;
	int max_tokens;
	int exact;
	float *gate, *up;   /* a dense layer's hidden rows, max_tokens x n_ff */
	float *scratch;     /* cpu_matmul's */
	uint8_t *q8[2];     /* 8-bit copies of a product's input; NULL: exact */
	struct cpu_route route;
	float *chosen;      /* n_layer x n_expert: cpu_ffn_chosen's counts */
	/* the call under way */
	int l;
	const float *h;
	float *out;
	const int32_t *on_dev; /* cpu_ffn_run_routed's: experts computed elsewhere (>= 0), or NULL */
};

/* The width of a feed-forward's hidden rows: the experts' or the dense one's. */
static size_t
ffn_width(const struct model_hparams *hp)
{
	return (size_t)(hp->n_expert > 0 ? hp->n_ff_exp : hp->n_ff);
}

/* Rows of the experts' products in a step of max_tokens: every token's choices. */
static size_t
expert_rows(const struct model_hparams *hp, int max_tokens)
{
	return (size_t)max_tokens * (size_t)hp->n_expert_used;
}

/* Most buffers ffn_bufs names. */
#define FFN_BUFS 9

/* A float buffer: where it goes, rows x cols floats. */
struct ffn_buf {
	float **p;
	size_t rows, cols;
};

/* The float buffers of f (for threads threads). Returns how many. */
static int
ffn_bufs(struct cpu_ffn *f, int threads, struct ffn_buf *out)
{
	const struct model_hparams *hp = &f->m->hp;
	size_t T = (size_t)f->max_tokens, R = expert_rows(hp, f->max_tokens), D = (size_t)hp->n_embd;
	size_t F = (size_t)hp->n_ff_exp, dense = hp->n_expert > 0 ? 0 : (size_t)hp->n_ff;
	struct cpu_route *r = &f->route;
	int n = 0;

	out[n++] = (struct ffn_buf){ &f->gate, T, dense };
	out[n++] = (struct ffn_buf){ &f->up, T, dense };
	out[n++] = (struct ffn_buf){ &f->scratch, (size_t)threads * CPU_MM_ROWS, MAX(D, ffn_width(hp)) };
	out[n++] = (struct ffn_buf){ &r->logit, T, (size_t)hp->n_expert };
	out[n++] = (struct ffn_buf){ &r->weight, R, 1 };
	out[n++] = (struct ffn_buf){ &r->x, R, D };
	out[n++] = (struct ffn_buf){ &r->gate, R, F };
	out[n++] = (struct ffn_buf){ &r->up, R, F };
	out[n++] = (struct ffn_buf){ &r->down, R, D };
	return n;
}

/* Bytes of each of the two 8-bit copies of a product's input: the experts' rows the most. */
static size_t
q8_bytes(const struct model_hparams *hp, int max_tokens, int exact)
{
	size_t rows = MAX((size_t)max_tokens, expert_rows(hp, max_tokens));

	return exact ? 0 : cpu_act_bytes((int64_t)MAX((size_t)hp->n_embd, ffn_width(hp)), (int64_t)rows);
}

/* Bytes of the routing's integer arrays. */
static size_t
route_ints(const struct model_hparams *hp, int max_tokens)
{
	return (3 * (expert_rows(hp, max_tokens) + 1) + (size_t)hp->n_expert + 1) * sizeof(int32_t);
}

size_t
cpu_ffn_bytes(const struct model_desc *m, int max_tokens, int exact, int threads)
{
	struct cpu_ffn f = { .m = m, .max_tokens = max_tokens };
	struct ffn_buf bufs[FFN_BUFS];
	int n = ffn_bufs(&f, threads, bufs);
	size_t bytes = 2 * q8_bytes(&m->hp, max_tokens, exact) + route_ints(&m->hp, max_tokens);

	for (int i = 0; i < n; i++)
		bytes += bufs[i].rows * bufs[i].cols * sizeof(float);
	return bytes;
}

struct cpu_ffn *
cpu_ffn_new(const struct model_desc *m, const uint8_t *use_layer, int max_tokens, int exact, struct cpu_pool *pool,
    char *err)
{
	struct cpu_ffn *f = xcalloc(1, sizeof *f);
	struct ffn_buf bufs[FFN_BUFS];
	size_t R = expert_rows(&m->hp, max_tokens), bytes;
	int n, ok = 1;

	f->m = m, f->pool = pool, f->max_tokens = max_tokens, f->exact = exact;
	n = ffn_bufs(f, cpu_pool_threads(pool), bufs);
	for (int i = 0; i < n; i++)
		ok &= mul_size(bufs[i].rows, bufs[i].cols * sizeof(float), &bytes) == 0 &&
		    (*bufs[i].p = calloc(1, bytes ? bytes : 1)) != NULL;
	f->route.expert = calloc(R + 1, sizeof *f->route.expert);
	f->route.row = calloc(R + 1, sizeof *f->route.row);
	f->route.token = calloc(R + 1, sizeof *f->route.token);
	f->route.first = calloc((size_t)m->hp.n_expert + 1, sizeof *f->route.first);
	ok &= f->route.expert && f->route.row && f->route.token && f->route.first;
	for (int k = 0; k < 2 && !exact; k++)
		ok &= (f->q8[k] = malloc(q8_bytes(&m->hp, max_tokens, exact))) != NULL;
	if (!ok) {
		cpu_ffn_free(f);
		err_set(err, ERR_NOMEM, "out of host memory for the feed-forward's buffers (%d tokens a step)",
		    max_tokens);
		return NULL;
	}
	f->layers = xcalloc((size_t)m->hp.n_layer, sizeof *f->layers);
	if (m->hp.n_expert > 0)
		f->chosen = xcalloc((size_t)m->hp.n_layer * (size_t)m->hp.n_expert, sizeof *f->chosen);
	for (int l = 0; l < m->hp.n_layer; l++) {
		const struct model_layer *L = &m->layers[l];
		struct ffn_layer *c = &f->layers[l];

		if (use_layer != NULL && !use_layer[l])
			continue;
		c->router_b = cpu_to_float(L->router_b);
		c->gate_b = cpu_to_float(L->exp_gate_b);
		c->up_b = cpu_to_float(L->exp_up_b);
		c->down_b = cpu_to_float(L->exp_down_b);
	}
	return f;
}

void
cpu_ffn_free(struct cpu_ffn *f)
{
	struct cpu_route *r;

	if (f == NULL)
		return;
	r = &f->route;
	for (int l = 0; f->layers != NULL && l < f->m->hp.n_layer; l++) {
		struct ffn_layer *c = &f->layers[l];

		free(c->router_b), free(c->gate_b), free(c->up_b), free(c->down_b);
	}
	free(f->layers), free(f->chosen);
	free(f->gate), free(f->up), free(f->scratch), free(f->q8[0]), free(f->q8[1]);
	free(r->logit), free(r->weight), free(r->x), free(r->gate), free(r->up), free(r->down);
	free(r->expert), free(r->row), free(r->token), free(r->first);
	free(f);
}

/* T rows of n floats as the input of products, 8-bit copies allowed unless exact. */
static void
input(struct cpu_ffn *f, struct cpu_act *in, const float *x, int64_t n, int T)
{
	cpu_act_init(in, x, n, T, n, f->exact ? NULL : f->q8);
}

/* The dense feed-forward of the call's layer. */
static void
dense_ffn(struct cpu_ffn *f, int T)
{
	const struct model_hparams *hp = &f->m->hp;
	const struct model_layer *L = &f->m->layers[f->l];
	struct cpu_act in;

	input(f, &in, f->h, hp->n_embd, T);
	cpu_matmul(f->pool, &in, 2, (const struct model_tensor *[]){ L->w_gate, L->w_up },
	    (float *[]){ f->gate, f->up }, (int64_t[]){ hp->n_ff, hp->n_ff }, f->scratch);
	cpu_glu(f->gate, f->up, (int64_t)T * hp->n_ff, hp->act == ACT_GELU);
	input(f, &in, f->gate, hp->n_ff, T);
	cpu_matmul(f->pool, &in, 1, &L->w_down, &f->out, (int64_t[]){ hp->n_embd }, f->scratch);
}

/*
 * Task t: token t's experts, those of the largest router logits (the
 * lowest index first among equals, largest first), and their weights: a
 * softmax over the chosen logits (expert_norm) or over all of them.
 */
static void
route_task(void *arg, int64_t t, int thread)
{
	const struct cpu_ffn *f = arg;
	const struct model_hparams *hp = &f->m->hp;
	const struct cpu_route *r = &f->route;
	const float *bias = f->layers[f->l].router_b;
	int E = hp->n_expert, k = hp->n_expert_used, j, e, i;
	float *lg = r->logit + t * E, *w = r->weight + t * k, sum = 0;
	int32_t *ex = r->expert + t * k;

	for (e = 0; bias != NULL && e < E; e++)
		lg[e] += bias[e];
	for (j = 0; j < k; j++) {
		for (ex[j] = -1, e = 0; e < E; e++) {
			for (i = 0; i < j && ex[i] != e; i++)
				;
			if (i == j && (ex[j] < 0 || lg[e] > lg[ex[j]]))
				ex[j] = e;
		}
	}
	for (j = 0; j < k; j++)
		sum += w[j] = expf(lg[ex[j]] - lg[ex[0]]);
	if (!hp->expert_norm)
		for (sum = 0, e = 0; e < E; e++)
			sum += expf(lg[e] - lg[ex[0]]);
	for (j = 0; j < k; j++)
		w[j] /= sum;
}

/*
 * Gives every slot its row of the grouped products: the rows of expert e
 * are first[e] .. first[e + 1] - 1, its tokens in step order.
 */
static void
group_rows(struct cpu_route *r, int E, int64_t slots, int k)
{
	memset(r->first, 0, (size_t)(E + 1) * sizeof *r->first);
	for (int64_t s = 0; s < slots; s++)
		r->first[r->expert[s] + 1]++;
	for (int e = 0; e < E; e++)
		r->first[e + 1] += r->first[e];
	/* first[e] walks from expert e's start to its end, which is where e + 1 starts */
	for (int64_t s = 0; s < slots; s++) {
		r->row[s] = r->first[r->expert[s]]++;
		r->token[r->row[s]] = (int32_t)(s / k);
	}
	memmove(r->first + 1, r->first, (size_t)E * sizeof *r->first);
	r->first[0] = 0;
}

/* The expert whose rows hold row. */
static int
expert_of(const struct cpu_route *r, int E, int32_t row)
{
	int lo = 0, hi = E - 1, mid;

	while (lo < hi) {
		mid = (lo + hi + 1) / 2;
		if (r->first[mid] <= row)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* 1 if the call's expert e is computed elsewhere (cpu_ffn_run_routed's on_dev). */
static int
on_device(const struct cpu_ffn *f, int e)
{
	return f->on_dev != NULL && f->on_dev[e] >= 0;
}

/* Task row: its token's normed input into the grouped rows. */
static void
gather_task(void *arg, int64_t row, int thread)
{
	const struct cpu_ffn *f = arg;
	int64_t D = f->m->hp.n_embd;

	memcpy(f->route.x + row * D, f->h + (int64_t)f->route.token[row] * D, (size_t)D * sizeof(float));
}

/* Task row: its expert's gate and up biases, then the gate. */
static void
act_task(void *arg, int64_t row, int thread)
{
	const struct cpu_ffn *f = arg;
	const struct model_hparams *hp = &f->m->hp;
	const struct ffn_layer *c = &f->layers[f->l];
	int64_t F = hp->n_ff_exp, e = expert_of(&f->route, hp->n_expert, (int32_t)row);
	float *g = f->route.gate + row * F, *u = f->route.up + row * F;

	if (on_device(f, (int)e))
		return;
	if (c->gate_b != NULL) {
		cpu_add(g, c->gate_b + e * F, F);
		cpu_add(u, c->up_b + e * F, F);
	}
	if (hp->act == ACT_SWIGLU_OAI)
		cpu_glu_oai(g, u, F, hp->glu_alpha, hp->glu_limit);
	else
		cpu_glu(g, u, F, hp->act == ACT_GELU);
}

/* Task t: token t's experts' outputs (with their biases) weighted into its row of out, largest first. */
static void
combine_task(void *arg, int64_t t, int thread)
{
	const struct cpu_ffn *f = arg;
	const struct model_hparams *hp = &f->m->hp;
	const struct cpu_route *r = &f->route;
	const float *bias = f->layers[f->l].down_b;
	int64_t D = hp->n_embd, s;
	float *out = f->out + t * D, *d;

	memset(out, 0, (size_t)D * sizeof *out);
	for (s = t * hp->n_expert_used; s < (t + 1) * hp->n_expert_used; s++) {
		if (on_device(f, r->expert[s]))
			continue;
		d = r->down + (int64_t)r->row[s] * D;
		if (bias != NULL)
			cpu_add(d, bias + (int64_t)r->expert[s] * D, D);
		cpu_axpy(out, r->weight[s], d, D);
	}
}

/*
 * One product for each expert that has rows: w[e] over its rows of in
 * (width n), into its rows of out[0] (and out[1] with w2). Returns how
 * many products it made.
 */
static int
expert_products(struct cpu_ffn *f, const struct model_tensor *w, const struct model_tensor *w2, const float *in,
    int64_t n, float *const *out, int64_t ldy, struct cpu_mm *mm, struct cpu_act *acts, uint8_t *(*slices)[2])
{
	const struct cpu_route *r = &f->route;
	int n_mm = 0;

	for (int e = 0; e < f->m->hp.n_expert; e++) {
		int32_t rows = r->first[e + 1] - r->first[e];

		if (rows == 0 || on_device(f, e))
			continue;
		cpu_act_rows(&acts[e], in, n, r->first[e], rows, n, f->exact ? NULL : f->q8, slices[e]);
		mm[n_mm++] = (struct cpu_mm){ &acts[e], &w[e], out[0] + r->first[e] * ldy, ldy };
		if (w2 != NULL)
			mm[n_mm++] = (struct cpu_mm){ &acts[e], &w2[e], out[1] + r->first[e] * ldy, ldy };
	}
	return n_mm;
}

/* Counts the call's choices (cpu_ffn_chosen). */
static void
count_chosen(struct cpu_ffn *f, int64_t slots)
{
	float *c = f->chosen + (size_t)f->l * (size_t)f->m->hp.n_expert;

	for (int64_t s = 0; s < slots; s++)
		c[f->route.expert[s]] += 1.0f;
}

/*
 * The call's layer of experts, routed (f->route's experts and weights for
 * every slot): the tokens are grouped by expert, each expert's gate and up
 * run over its own rows (all experts in one pool run), then its down, and
 * each token sums its experts' rows by their weights. Experts computed
 * elsewhere (on_dev) are left out throughout.
 */
static void
moe_experts(struct cpu_ffn *f, int T)
{
	const struct model_hparams *hp = &f->m->hp;
	const struct model_layer *L = &f->m->layers[f->l];
	struct cpu_route *r = &f->route;
	int E = hp->n_expert, n_mm;
	int64_t rows = (int64_t)T * hp->n_expert_used;
	struct cpu_mm *mm = xmalloc(2 * (size_t)E * sizeof *mm);
	struct cpu_act *acts = xmalloc((size_t)E * sizeof *acts);
	uint8_t *(*slices)[2] = xmalloc((size_t)E * sizeof *slices);

	count_chosen(f, rows);
	group_rows(r, E, rows, hp->n_expert_used);
	cpu_pool_run(f->pool, rows, gather_task, f);
	n_mm = expert_products(f, L->exp_gate, L->exp_up, r->x, hp->n_embd, (float *[]){ r->gate, r->up },
	    hp->n_ff_exp, mm, acts, slices);
	cpu_matmul_set(f->pool, n_mm, mm, f->scratch);
	cpu_pool_run(f->pool, rows, act_task, f);
	n_mm = expert_products(f, L->exp_down, NULL, r->gate, hp->n_ff_exp, &r->down, hp->n_embd, mm, acts, slices);
	cpu_matmul_set(f->pool, n_mm, mm, f->scratch);
	cpu_pool_run(f->pool, T, combine_task, f);
	free(mm), free(acts), free(slices);
}

/* The call's layer of experts: the router picks each token's experts, then moe_experts. */
static void
moe_ffn(struct cpu_ffn *f, int T)
{
	const struct model_hparams *hp = &f->m->hp;
	const struct model_layer *L = &f->m->layers[f->l];
	struct cpu_act in;

	input(f, &in, f->h, hp->n_embd, T);
	cpu_matmul(f->pool, &in, 1, &L->router, &f->route.logit, (int64_t[]){ hp->n_expert }, f->scratch);
	cpu_pool_run(f->pool, T, route_task, f);
	moe_experts(f, T);
}

void
cpu_ffn_run(struct cpu_ffn *f, int l, const float *h, int T, float *out)
{
	f->l = l, f->h = h, f->out = out, f->on_dev = NULL;
	if (f->m->hp.n_expert > 0)
		moe_ffn(f, T);
	else
		dense_ffn(f, T);
}

void
cpu_ffn_run_routed(struct cpu_ffn *f, int l, const float *h, int T, const int32_t *expert, const float *weight,
    const int32_t *on_dev, float *out)
{
	size_t slots = (size_t)T * (size_t)f->m->hp.n_expert_used;

	f->l = l, f->h = h, f->out = out, f->on_dev = on_dev;
	memcpy(f->route.expert, expert, slots * sizeof *expert);
	memcpy(f->route.weight, weight, slots * sizeof *weight);
	moe_experts(f, T);
}

float *
cpu_ffn_chosen(struct cpu_ffn *f, int l)
{
	return f->chosen != NULL && l >= 0 && l < f->m->hp.n_layer ? f->chosen + (size_t)l * f->m->hp.n_expert : NULL;
}
