/*
 * engine.c: sequences over one KV pool, advanced by batched forward steps.
 *
 * A step gathers, for each sequence it is given, the tokens not yet in the
 * KV cache (all of them for a decode, a chunk for a prefill), makes sure
 * blocks cover their positions, runs the backend once, then samples a token
 * for each sequence whose last token was in the step and turns it into text
 * (gentext.h: whole UTF-8, split into answer, reasoning and tool text, the
 * answer held back while it could still become a stop string). A step also
 * checks the tokens its sequences guessed (engine_spec.c) and settles the
 * ones its rows agree with.
 */
#include "config.h"
#include "engine_int.h"
#include "embed.h"
#include "grammar.h"
#include "kvdisk.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CTX_CAP 8192
/*
 * A host layer of experts keeps this share of them on the device as well
 * (1 / HOT_SHARE; RESIDENT_HOT_EXPERTS sets the count, 0 none).
 */
#define HOT_SHARE 8

_Static_assert(FWD_TOP_LOGPROBS == SAMPLE_TOP, "the backends and the host sampler report as many likely tokens");

static const char *const finish_names[] = {
	[FINISH_NONE] = "none", [FINISH_STOP] = "stop", [FINISH_LENGTH] = "length",
	[FINISH_CONTEXT] = "context", [FINISH_CANCEL] = "cancel", [FINISH_ERROR] = "error",
};

const char *
engine_finish_name(enum finish_reason r)
{
	return finish_names[r];
}

int
engine_pick_backend(const char *device, const struct backend_ops **ops, char *err)
{
#ifdef HAVE_CUDA
	if ((device == NULL && cuda_backend_devices() > 0) ||
	    (device != NULL && strcmp(device, "cuda") == 0)) {
		*ops = &cuda_backend;
		return 0;
	}
#endif
	if (device == NULL || strcmp(device, "cpu") == 0) {
		*ops = &cpu_backend;
		return 0;
	}
#ifndef HAVE_CUDA
	if (strcmp(device, "cuda") == 0)
		return err_set(err, ERR_UNSUPPORTED, "this build has no CUDA backend (configure found no nvcc)");
#endif
	return err_set(err, ERR_INVAL, "unknown device '%s' (cpu, cuda)", device);
}

/* Fills the defaults of the options from the model, and the backend's options. */
static void
resolve_opts(struct engine *e, const struct engine_opts *o)
{
	const char *host_picks, *stall, *hot;
	int32_t kv_tokens;

	e->n_ctx = o->n_ctx > 0 ? o->n_ctx : MIN(e->m->hp.n_ctx_train, DEFAULT_CTX_CAP);
	e->max_step_tokens = o->max_step_tokens > 0 ? o->max_step_tokens : 512;
	/* a bidirectional input is computed in one step, however long */
	if (e->m->embed.bidirectional)
		e->max_step_tokens = MAX(e->max_step_tokens, e->n_ctx);
	e->max_seqs = o->max_seqs > 0 ? o->max_seqs : 64;
	kv_tokens = o->kv_tokens > 0 ? o->kv_tokens : 4 * e->n_ctx;
	kv_tokens = MAX(kv_tokens, e->n_ctx);
	e->bo.n_threads = o->n_threads;
	e->bo.kv_blocks = (kv_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	e->bo.max_tokens = e->max_step_tokens;
	e->bo.max_seqs = e->max_seqs;
	e->bo.exact = o->exact;
	e->bo.kv_type = o->kv_type;
	e->exact = o->exact != 0;
	host_picks = getenv("RESIDENT_HOST_SAMPLING");
	e->host_picks = host_picks != NULL && atoi(host_picks) != 0;
	stall = getenv("RESIDENT_KV_MOVE_STALL");
	e->move_stall_ms = stall != NULL ? MAX(atol(stall), 0) : 0;
	hot = getenv("RESIDENT_HOT_EXPERTS");
	e->hot_experts = hot != NULL && *hot != '\0' ? MAX(atoi(hot), 0) : e->m->hp.n_expert / HOT_SHARE;
	e->host = o->host;
	e->disk = o->disk;
}

/*
 * The backend's plan with every layer on the device, each feed-forward's
 * device bytes, and fixed_min: the plan with every one that can in host
 * memory.
 */
static int
plan_placement(struct engine *e, char *err)
{
	struct backend_plan low = { 0 };
	int n = e->m->hp.n_layer, any = 0, rc;

	e->ffn = xcalloc((size_t)n, sizeof *e->ffn);
	e->host_ffn = xcalloc((size_t)n, sizeof *e->host_ffn);
	e->plan.ffn = e->ffn;
	if ((rc = e->ops->plan(e->m, &e->bo, &e->plan, err)) != 0)
		return rc;
	e->plan.ffn = NULL;
	e->fixed_min = e->fixed_whole = e->plan.fixed;
	for (int l = 0; l < n; l++)
		any |= e->host_ffn[l] = e->ffn[l] > 0;
	if (any) {
		e->bo.host_ffn = e->host_ffn;
		rc = e->ops->plan(e->m, &e->bo, &low, err);
		e->fixed_min = low.fixed;
		e->bo.host_ffn = NULL;
		memset(e->host_ffn, 0, (size_t)n);
	}
	return rc;
}

int
engine_prepare(const char *model_path, const struct engine_opts *o, struct engine **out, char *err)
{
	struct engine *e = xcalloc(1, sizeof *e);
	int rc;

	pthread_mutex_init(&e->copy_mu, NULL);
	if ((rc = engine_pick_backend(o->device, &e->ops, err)) != 0 ||
	    (rc = model_open(model_path, &e->m, err)) != 0) {
		pthread_mutex_destroy(&e->copy_mu);
		free(e);
		return rc;
	}
	resolve_opts(e, o);
	if ((rc = plan_placement(e, err)) != 0) {
		err_prefix(err, rc, "%s backend", e->ops->name);
		engine_close(e);
		return rc;
	}
	*out = e;
	return 0;
}

/* Bytes of a KV cache of one context. */
static uint64_t
ctx_kv_bytes(const struct engine *e)
{
	return (uint64_t)((e->n_ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS) * e->plan.kv_block;
}

void
engine_mem_need(const struct engine *e, uint64_t *min, uint64_t *whole, uint64_t *want)
{
	*min = e->fixed_min + ctx_kv_bytes(e);
	*whole = e->fixed_whole + ctx_kv_bytes(e);
	*want = e->fixed_whole + (uint64_t)e->bo.kv_blocks * e->plan.kv_block;
}

/*
 * Keeps the feed-forwards of the first layers that can move in host
 * memory, one more at a time, until the rest and a KV cache of one
 * context fit limit (engine_mem_need's min has said that they can). A
 * host layer of experts keeps its most chosen ones on the device too
 * (hot_experts of them, where the backend can): the device's share of
 * the experts is then spread over every layer, where it follows what the
 * tokens choose and computes beside the host, rather than held by whole
 * layers. Should the hot experts themselves not fit, fewer are kept.
 */
static int
place_layers(struct engine *e, uint64_t limit, char *err)
{
	int rc;

	e->bo.hot_experts = e->plan.expert > 0 ? e->hot_experts : 0;
	for (int l = 0; l < e->m->hp.n_layer && e->plan.fixed + ctx_kv_bytes(e) > limit; l++) {
		if (e->ffn[l] == 0)
			continue;
		e->host_ffn[l] = 1;
		e->host_layers++;
		e->bo.host_ffn = e->host_ffn;
		if ((rc = e->ops->plan(e->m, &e->bo, &e->plan, err)) != 0)
			return err_prefix(err, rc, "%s backend", e->ops->name);
	}
	while (e->bo.hot_experts > 0 && e->plan.fixed + ctx_kv_bytes(e) > limit) {
		e->bo.hot_experts = e->bo.hot_experts / 2;
		if ((rc = e->ops->plan(e->m, &e->bo, &e->plan, err)) != 0)
			return err_prefix(err, rc, "%s backend", e->ops->name);
	}
	return 0;
}

/*
 * Sizes the KV pool to what limit leaves after the rest (0: no limit), at
 * least one context; where the weights and one context do not fit on the
 * device, the first layers' feed-forwards stay in host memory.
 */
static int
size_pool(struct engine *e, uint64_t limit, char *err)
{
	uint64_t min, whole, want, fit;
	int rc;

	if (limit == 0)
		return 0;
	engine_mem_need(e, &min, &whole, &want);
	if (limit < min)
		return err_set(err, ERR_NOMEM, "%s needs %.0f MiB of %s memory (weights and scratch %.0f MiB%s, "
		    "a KV cache of one context of %d tokens %.0f MiB); %.0f MiB are left of the budget",
		    e->m->name, min / 1048576.0, e->ops->name, e->fixed_min / 1048576.0,
		    e->fixed_min < e->fixed_whole ? " with every feed-forward in host memory" : "", e->n_ctx,
		    ctx_kv_bytes(e) / 1048576.0, limit / 1048576.0);
	if ((rc = place_layers(e, limit, err)) != 0)
		return rc;
	fit = (limit - e->plan.fixed) / e->plan.kv_block;
	e->bo.kv_blocks = (int64_t)MIN(fit, (uint64_t)e->bo.kv_blocks);
	return 0;
}

int
engine_load(struct engine *e, uint64_t limit, char *err)
{
	int rc;

	if ((rc = size_pool(e, limit, err)) != 0)
		return rc;
	if ((rc = e->ops->load(e->m, &e->bo, &e->be, err)) != 0) {
		e->be = NULL;
		return err_prefix(err, rc, "%s backend", e->ops->name);
	}
	kv_init(&e->kv, (int32_t)e->bo.kv_blocks);
	tier_identity(e);
	e->block_bytes = engine_kv_bytes(e) / (uint64_t)e->bo.kv_blocks;
	e->mem_bytes = e->plan.fixed + (uint64_t)e->bo.kv_blocks * e->plan.kv_block;
	if (e->host != NULL) {
		e->kv.evict = tier_evict;
		e->kv.evict_arg = e;
	}
	e->fseqs = xcalloc((size_t)e->max_seqs, sizeof *e->fseqs);
	e->fseq_of = xcalloc((size_t)e->max_seqs, sizeof *e->fseq_of);
	e->tokens = xcalloc((size_t)e->max_step_tokens, sizeof *e->tokens);
	e->max_rows = MIN(MAX(e->max_seqs, ENGINE_DRAFT_MAX + 1), e->max_step_tokens);
	e->auto_guess = 1;
	e->logits = xmalloc((size_t)e->max_rows * (size_t)e->m->hp.n_vocab * sizeof *e->logits);
	e->argmax = xcalloc((size_t)e->max_rows, sizeof *e->argmax);
	e->pick = xcalloc((size_t)e->max_rows, sizeof *e->pick);
	e->pen_tok = xcalloc((size_t)e->max_rows * FWD_PICK_PENALTY_MAX, sizeof *e->pen_tok);
	e->pen_cnt = xcalloc((size_t)e->max_rows * FWD_PICK_PENALTY_MAX, sizeof *e->pen_cnt);
	e->logprob = xcalloc((size_t)e->max_rows, sizeof *e->logprob);
	e->top_ids = xcalloc((size_t)e->max_rows * FWD_TOP_LOGPROBS, sizeof *e->top_ids);
	e->top_lp = xcalloc((size_t)e->max_rows * FWD_TOP_LOGPROBS, sizeof *e->top_lp);
	/* zeroed: words past the tokenizer's tokens (a padded output) allow nothing, and gram_mask never writes them */
	e->masks = xcalloc((size_t)e->max_rows * FWD_MASK_WORDS(e->m->hp.n_vocab), sizeof *e->masks);
	e->mask_rows = xcalloc((size_t)e->max_rows, sizeof *e->mask_rows);
	e->cons = cons_new(e->m->tok, e->bo.n_threads);
	if (e->m->embed.pool != POOL_NONE) {
		e->embd = xmalloc((size_t)e->max_step_tokens * (size_t)e->m->hp.n_embd * sizeof *e->embd);
		e->embd_tmp = xmalloc(((size_t)e->m->hp.n_embd + embed_scratch(&e->m->embed, e->m->hp.n_embd)) *
		    sizeof *e->embd_tmp);
	}
	return 0;
}

int
engine_open(const char *model_path, const struct engine_opts *o, struct engine **out, char *err)
{
	int rc;

	if ((rc = engine_prepare(model_path, o, out, err)) != 0)
		return rc;
	if ((rc = engine_load(*out, 0, err)) != 0) {
		engine_close(*out);
		*out = NULL;
	}
	return rc;
}

uint64_t
engine_mem_bytes(const struct engine *e)
{
	return e->be != NULL ? e->mem_bytes : 0;
}

int32_t
engine_host_layers(const struct engine *e, uint64_t *host_bytes)
{
	*host_bytes = e->be != NULL ? e->plan.host : 0;
	return e->be != NULL ? e->host_layers : 0;
}

int
engine_hot_experts(const struct engine *e, int64_t *moves)
{
	*moves = 0;
	return e->be != NULL && e->ops->hot_experts != NULL ? e->ops->hot_experts(e->be, moves) : 0;
}

int
engine_device_memory(const char *device, uint64_t *free_b, uint64_t *total, char *err)
{
	const struct backend_ops *ops;
	int rc;

	if ((rc = engine_pick_backend(device, &ops, err)) != 0)
		return rc;
#ifdef HAVE_CUDA
	if (ops == &cuda_backend)
		return cuda_backend_memory(0, free_b, total, err);
#endif
	return host_memory(free_b, total, err);
}

void
engine_close(struct engine *e)
{
	struct kvdisk_job *j, *next;

	if (e == NULL)
		return;
	for (j = e->disk && e->be ? kvdisk_drain(e->disk, e) : NULL; j != NULL; j = next) {
		next = j->next;
		engine_io_done(e, j);
	}
	if (e->be != NULL) {
		tier_evict_flush(e);  /* the blocks given up last still go to the host tier */
		e->ops->free(e->be);
	}
	kv_destroy(&e->kv);
	cons_free(e->cons);
	model_close(e->m);
	free(e->identity_text);
	free(e->fseqs), free(e->fseq_of), free(e->tokens), free(e->logits), free(e->argmax), free(e->pick);
	free(e->pen_tok), free(e->pen_cnt), free(e->logprob), free(e->masks), free(e->mask_rows);
	free(e->top_ids), free(e->top_lp), free(e->embd), free(e->embd_tmp), free(e->ffn), free(e->host_ffn);
	pthread_mutex_destroy(&e->copy_mu);
	free(e);
}

const struct model_desc *
engine_model(const struct engine *e)
{
	return e->m;
}

const char *
engine_device(const struct engine *e)
{
	return e->ops->name;
}

int
engine_exact(const struct engine *e)
{
	return e->exact;
}

int32_t
engine_n_ctx(const struct engine *e)
{
	return e->n_ctx;
}

int32_t
engine_free_blocks(const struct engine *e)
{
	return kv_available(&e->kv);
}

void
engine_cache_stats(const struct engine *e, struct engine_cache_stats *st)
{
	*st = e->st;
	st->cached = e->kv.n_cached;
	st->idle = e->kv.n_idle;
	st->used_bytes = (uint64_t)(e->kv.n_blocks - e->kv.n_free) * e->block_bytes;
}


int32_t
engine_kv_blocks(const struct engine *e)
{
	return e->kv.n_blocks;
}

uint64_t
engine_kv_bytes(const struct engine *e)
{
	const struct model_hparams *hp = &e->m->hp;

	return (uint64_t)e->kv.n_blocks * KV_BLOCK_TOKENS * (uint64_t)hp->n_layer * 2u *
	    (uint64_t)e->ops->kv_row_bytes(e->be);
}

int32_t
engine_max_step_tokens(const struct engine *e)
{
	return e->max_step_tokens;
}

int32_t
engine_step_tokens(const struct engine *e, int32_t n)
{
	return e->ops->step_tokens(e->be, MIN(n, e->max_step_tokens));
}

/* ---- sequences ---- */

/* Appends tokens to a sequence's history. */
void
seq_push_tokens(struct seq *s, const int32_t *t, int32_t n)
{
	if (s->n_tokens + n > s->cap_tokens) {
		s->cap_tokens = MAX(s->cap_tokens * 2, s->n_tokens + n + 64);
		s->tokens = xrealloc(s->tokens, (size_t)s->cap_tokens * sizeof *s->tokens);
	}
	memcpy(s->tokens + s->n_tokens, t, (size_t)n * sizeof *t);
	s->n_tokens += n;
}

/* Frees a constrained sequence's grammars after its guesses. */
void
free_gspec(struct seq *s)
{
	for (int32_t i = 0; i < ENGINE_DRAFT_MAX && s->gspec[i] != NULL; i++) {
		gram_state_free(s->gspec[i]);
		s->gspec[i] = NULL;
	}
}

/* Frees the parameters a turn copied, and its text. */
static void
seq_clear_params(struct engine *e, struct seq *s)
{
	gentext_free(&s->out);
	sampler_free(&s->sampler);
	gram_state_free(s->gstate);
	free_gspec(s);
	cons_put(e->cons, s->gram);
	s->gstate = NULL, s->gram = NULL;
}

/* Validates and copies a turn's parameters; resets the turn's output. */
static int
seq_set_params(struct engine *e, struct seq *s, const struct seq_params *p, char *err)
{
	struct gram_state *gstate = NULL;
	struct gentext out;
	int i, rc;

	if ((rc = sample_params_check(&p->sample, err)) != 0)
		return rc;
	if (p->max_tokens < 0 || p->n_stop < 0 || p->n_stop > 16)
		return err_set(err, ERR_INVAL, "max_tokens must be >= 0 and at most 16 stop strings");
	if (p->top_logprobs < 0 || p->top_logprobs > SAMPLE_TOP || (p->top_logprobs > 0 && !p->logprobs))
		return err_set(err, ERR_INVAL, "top_logprobs must be 0..%d, with logprobs", SAMPLE_TOP);
	for (i = 0; i < p->n_stop; i++)
		if (p->stop[i] == NULL || p->stop[i][0] == '\0' || strlen(p->stop[i]) > 256 ||
		    !utf8_valid(p->stop[i], strlen(p->stop[i])))
			return err_set(err, ERR_INVAL, "stop strings must be 1..256 bytes of UTF-8");
	if (p->grammar != NULL && (rc = gram_state_new(cons_grammar(p->grammar), &gstate, err)) != 0)
		return rc;
	if ((rc = gentext_init(&out, e->m->tok, p->split, p->stop, p->n_stop, err)) != 0) {
		gram_state_free(gstate);
		return rc;
	}
	seq_clear_params(e, s);
	s->params = *p;
	s->params.stop = NULL;      /* out has them */
	s->params.grammar = NULL;   /* s->gram holds it */
	s->gram = p->grammar != NULL ? cons_hold(e->cons, p->grammar) : NULL;
	s->gstate = gstate;
	s->req_error = 0;
	s->out = out;
	sampler_init(&s->sampler, &p->sample, e->m->hp.n_vocab);
	s->n_generated = 0;
	s->finish = FINISH_NONE;
	s->error[0] = '\0';
	/* the tokens may have changed; logprobs' lists are one a step */
	draft_reset(&s->draft);
	s->params.speculative = p->logprobs ? SPEC_OFF : p->speculative;
	s->n_draft = s->n_given = s->n_cut = s->n_spec = s->spec_next = s->spec_kv = 0;
	s->spec_rate = 1;
	s->n_drafted = s->n_accepted = 0;
	return 0;
}

/* Checks that every token id is inside the vocabulary. */
static int
check_ids(const struct engine *e, const int32_t *t, int32_t n, char *err)
{
	for (int32_t i = 0; i < n; i++)
		if (t[i] < 0 || t[i] >= e->m->hp.n_vocab)
			return err_set(err, ERR_INVAL, "token id %d is outside the vocabulary", t[i]);
	return 0;
}

/* Checks token ids and the context (with a token to generate) before a sequence takes them. */
static int
check_tokens(const struct engine *e, const struct seq *s, const int32_t *t, int32_t n, char *err)
{
	int32_t have = s ? s->n_tokens : 0;

	if (n < 1)
		return err_set(err, ERR_INVAL, "empty prompt");
	if (have + (int64_t)n >= e->n_ctx)
		return err_set(err, ERR_RANGE, "%d tokens do not fit the context of %d tokens",
		    have + n, e->n_ctx);
	return check_ids(e, t, n, err);
}

/* Makes room for n entries in the block table. */
void
seq_grow_blocks(struct seq *s, int32_t n)
{
	if (n > s->cap_blocks) {
		s->cap_blocks = MAX(n, s->cap_blocks * 2);
		s->blocks = xrealloc(s->blocks, (size_t)s->cap_blocks * sizeof *s->blocks);
	}
}

/*
 * Takes, from the prefix cache, the blocks that follow the sequence's own
 * (which must all be in the cache) while they hold its tokens, up to upto
 * tokens, then from the host tier. Returns how many tokens its blocks then
 * hold.
 */
static int32_t
seq_match(struct engine *e, struct seq *s, int32_t upto)
{
	while (s->cache && s->n_blocks == s->n_keyed && (s->n_keyed + 1) * KV_BLOCK_TOKENS <= upto) {
		const int32_t *t = s->tokens + (size_t)s->n_keyed * KV_BLOCK_TOKENS;
		uint64_t key = kv_chain(s->key, t);
		int32_t b = kv_find(&e->kv, s->root, key, s->n_keyed ? s->blocks[s->n_keyed - 1] : KV_NONE,
		    s->n_keyed, t);

		if (b == KV_NONE) {
			if (tier_from_host(e, s, upto) == 0)
				break;
			continue;
		}
		kv_ref(&e->kv, b);
		seq_grow_blocks(s, s->n_blocks + 1);
		s->blocks[s->n_blocks++] = b;
		s->n_keyed++;
		s->key = key;
	}
	return s->n_keyed * KV_BLOCK_TOKENS;
}

/* Enters the blocks the last step filled into the prefix cache. */
void
seq_publish(struct engine *e, struct seq *s)
{
	while (s->cache && (s->n_keyed + 1) * KV_BLOCK_TOKENS <= s->n_cached) {
		int32_t i = s->n_keyed;
		const int32_t *t = s->tokens + (size_t)i * KV_BLOCK_TOKENS;
		uint64_t key = kv_chain(s->key, t);

		s->blocks[i] = kv_publish(&e->kv, s->blocks[i], s->root, key, i ? s->blocks[i - 1] : KV_NONE, i, t);
		s->key = key;
		s->n_keyed++;
	}
}

/* Counts a turn's prompt tokens as found in the cache or to compute. */
static void
count_lookup(struct engine *e, struct seq *s)
{
	s->n_hit = s->n_cached;
	e->st.hit += (uint64_t)s->n_cached;
	e->st.miss += (uint64_t)(s->n_tokens - s->n_cached);
}

int
engine_seq_new(struct engine *e, const int32_t *prompt, int32_t n, const struct seq_params *p,
    struct seq **out, char *err)
{
	struct seq *s;
	int rc;

	if ((rc = check_tokens(e, NULL, prompt, n, err)) != 0)
		return rc;
	s = xcalloc(1, sizeof *s);
	s->new_token = -1;
	if ((rc = seq_set_params(e, s, p, err)) != 0) {
		engine_seq_free(e, s);
		return rc;
	}
	seq_push_tokens(s, prompt, n);
	s->n_prompt = n;
	s->turn_start = s->n_tokens;
	s->state = SEQ_PREFILL;
	s->cache = p->cache;
	s->key = s->root = kv_root(e->identity, p->cache_ns);
	s->n_cached = seq_match(e, s, n - 1);
	count_lookup(e, s);
	*out = s;
	return 0;
}

int
engine_seq_embed(struct engine *e, const int32_t *tokens, int32_t n, int32_t dims, struct seq **out, char *err)
{
	struct seq *s;
	int rc;

	if (e->m->embed.pool == POOL_NONE)
		return err_set(err, ERR_UNSUPPORTED, "%s is not an embedding model", e->m->name);
	if (n < 1)
		return err_set(err, ERR_INVAL, "an empty input");
	if (n > e->n_ctx)
		return err_set(err, ERR_RANGE, "an input of %d tokens does not fit the context of %d tokens", n, e->n_ctx);
	if (dims < 0 || dims > e->m->embed.n_out)
		return err_set(err, ERR_INVAL, "dimensions %d: the model's vectors have %d", dims, e->m->embed.n_out);
	if ((rc = check_ids(e, tokens, n, err)) != 0)
		return rc;
	s = xcalloc(1, sizeof *s);
	s->new_token = -1;
	s->embed = 1;
	s->dims = dims;
	s->pool = xcalloc((size_t)e->m->hp.n_embd, sizeof *s->pool);
	seq_push_tokens(s, tokens, n);
	s->n_prompt = n;
	s->turn_start = n;
	s->state = SEQ_PREFILL;  /* no prefix cache, and no cache figures: an input's K/V are its own */
	*out = s;
	return 0;
}

int32_t
engine_embed_dims(const struct engine *e, int32_t dims)
{
	return dims > 0 ? MIN(dims, e->m->embed.n_out) : e->m->embed.n_out;
}

/* Lets go of the blocks from the nth on. */
static void
seq_drop_blocks(struct engine *e, struct seq *s, int32_t from)
{
	if (from >= s->n_blocks)
		return;
	kv_release(&e->kv, s->blocks + from, s->n_blocks - from);
	s->n_blocks = from;
	if (s->n_keyed > from) {
		s->n_keyed = from;
		s->key = kv_chain_n(s->root, s->tokens, from);
	}
	s->n_saved = MIN(s->n_saved, s->n_keyed);
}

/*
 * A parked sequence takes its cached blocks back, those that cover its
 * first keep tokens (it still has its old tokens). Returns how many of
 * those tokens it holds then: all of them, or, where the cache lost a
 * block, up to there (its partial last block is then let go too).
 */
static int32_t
seq_unpark(struct engine *e, struct seq *s, int32_t keep)
{
	int32_t want = MIN(s->n_parked, (keep + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS), tail = s->n_blocks;

	s->n_blocks = s->n_keyed = 0;
	s->key = s->root;
	seq_match(e, s, want * KV_BLOCK_TOKENS);
	if (s->n_keyed == s->n_parked) {
		s->n_blocks = tail;
	} else {
		kv_release(&e->kv, s->blocks + s->n_parked, tail - s->n_parked);
		keep = MIN(keep, s->n_keyed * KV_BLOCK_TOKENS);
	}
	s->n_parked = 0;
	return keep;
}

/*
 * The sequence's history becomes tokens (n, checked): the longest common
 * prefix with what it held stays in the KV cache (all but the last token
 * at most), a caching sequence looks for more in the prefix cache, and it
 * is to prefill the rest.
 */
static void
seq_retoken(struct engine *e, struct seq *s, const int32_t *tokens, int32_t n)
{
	int32_t keep = 0;

	while (keep < n - 1 && keep < s->n_cached && s->tokens[keep] == tokens[keep])
		keep++;
	if (s->n_parked > 0)
		keep = seq_unpark(e, s, keep);
	seq_drop_blocks(e, s, (keep + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
	s->n_tokens = 0;
	seq_push_tokens(s, tokens, n);
	/* a block the new tokens depart in is no longer the cache's (it is copied before the write) */
	if (s->n_keyed > keep / KV_BLOCK_TOKENS) {
		s->n_keyed = keep / KV_BLOCK_TOKENS;
		s->key = kv_chain_n(s->root, s->tokens, s->n_keyed);
		s->n_saved = MIN(s->n_saved, s->n_keyed);
	}
	s->n_cached = keep % KV_BLOCK_TOKENS == 0 ? seq_match(e, s, n - 1) : keep;
	s->n_cached = MAX(s->n_cached, keep);
	s->state = SEQ_PREFILL;
	s->finish = FINISH_NONE;
}

int
engine_seq_reuse(struct engine *e, struct seq *s, const int32_t *tokens, int32_t n,
    const struct seq_params *p, char *err)
{
	int rc;

	if (s->state != SEQ_DONE)
		return err_set(err, ERR_INVAL, "the sequence is still generating");
	if ((rc = check_tokens(e, NULL, tokens, n, err)) != 0 || (rc = seq_set_params(e, s, p, err)) != 0)
		return rc;
	seq_retoken(e, s, tokens, n);
	s->n_prompt = n;
	s->turn_start = n;
	count_lookup(e, s);
	return s->n_cached;
}

int
engine_seq_follow(struct engine *e, struct seq *s, const int32_t *tokens, int32_t n, char *err)
{
	int rc;

	if (s->state == SEQ_LOAD || s->io != NULL || s->n_spec > s->spec_next)
		return err_set(err, ERR_BUSY, "the sequence is loading or has tokens not taken");
	if ((rc = check_tokens(e, NULL, tokens, n, err)) != 0)
		return rc;
	seq_retoken(e, s, tokens, n);
	return s->n_cached;
}

void
engine_seq_append(struct seq *s, const int32_t *tokens, int32_t n)
{
	seq_push_tokens(s, tokens, n);
}

struct seq *
engine_seq_fork(struct engine *e, const struct seq *parent)
{
	struct seq *s = xcalloc(1, sizeof *s);
	int32_t i;

	s->new_token = -1;
	s->state = SEQ_DONE;
	seq_push_tokens(s, parent->tokens, parent->n_tokens);
	s->n_cached = parent->n_cached;
	s->n_prompt = parent->n_prompt;
	s->cache = parent->cache;
	s->root = parent->root;
	s->key = parent->key;
	s->n_keyed = parent->n_keyed;
	s->n_parked = parent->n_parked;
	seq_grow_blocks(s, MAX(parent->n_blocks, 1));
	for (i = 0; i < parent->n_blocks; i++) {
		if (i >= parent->n_parked)
			kv_ref(&e->kv, parent->blocks[i]);
		s->blocks[s->n_blocks++] = parent->blocks[i];
	}
	sampler_init(&s->sampler, &parent->params.sample, e->m->hp.n_vocab);
	return s;
}

void
engine_seq_park(struct engine *e, struct seq *s)
{
	if (s->n_keyed > s->n_parked)
		kv_release(&e->kv, s->blocks + s->n_parked, s->n_keyed - s->n_parked);
	s->n_parked = MAX(s->n_parked, s->n_keyed);
}

void
engine_seq_finish(struct seq *s, enum finish_reason why)
{
	s->state = SEQ_DONE;
	s->finish = why;
}

int
engine_grammar(struct engine *e, const char *text, size_t len, struct cons_gram **out, char *err)
{
	return cons_get(e->cons, text, len, out, err);
}

int
engine_schema(struct engine *e, const char *text, size_t len, struct cons_gram **out, char *err)
{
	return cons_get_schema(e->cons, text, len, out, err);
}

void
engine_grammar_put(struct engine *e, struct cons_gram *g)
{
	cons_put(e->cons, g);
}

void
engine_seq_free(struct engine *e, struct seq *s)
{
	if (s == NULL)
		return;
	if (s->io != NULL)
		s->io->seq = NULL;  /* its blocks are the job's; engine_io_done lets them go */
	if (s->n_blocks > s->n_parked)
		kv_release(&e->kv, s->blocks + s->n_parked, s->n_blocks - s->n_parked);
	seq_clear_params(e, s);
	draft_free(&s->draft);
	free(s->blocks), free(s->tokens), free(s->pool), free(s->vec);
	free(s);
}

/*
 * Makes blocks cover positions 0..n-1 and gives the sequence its own copy
 * of any block that positions n_cached.. will be written into and that is
 * shared or cached (cached blocks never change). Returns 0, ERR_RANGE if
 * the pool is full, or the backend's error if a block copy failed.
 */
static int
seq_reserve(struct engine *e, struct seq *s, int32_t n, char *err)
{
	int32_t need = (n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS, b, i;
	int rc;

	seq_grow_blocks(s, need);
	for (i = s->n_cached / KV_BLOCK_TOKENS; i < s->n_blocks; i++) {
		const struct kv_block *k = &e->kv.b[s->blocks[i]];

		if (k->ref == 1 && !k->cached)
			continue;
		if ((b = kv_alloc(&e->kv)) < 0)
			return err_set(err, ERR_RANGE, "the KV cache is full");
		tier_evict_flush(e);  /* b may have been given up: its K/V out before the copy writes it */
		if ((rc = e->ops->kv_copy(e->be, s->blocks[i], b, KV_BLOCK_TOKENS, err)) != 0) {
			kv_release(&e->kv, &b, 1);
			return err_prefix(err, rc, "copying a KV block");
		}
		kv_release(&e->kv, &s->blocks[i], 1);
		s->blocks[i] = b;
	}
	while (s->n_blocks < need) {
		if ((b = kv_alloc(&e->kv)) < 0)
			return err_set(err, ERR_RANGE, "the KV cache is full");
		s->blocks[s->n_blocks++] = b;
	}
	return 0;
}

/* ---- text out ---- */

/*
 * Advances a constrained sequence's grammar by a drawn token (not an end
 * token): 1 when nothing more may follow it, 0, or -1 when the grammar
 * does not allow it (s->error says why).
 */
static int
gram_step(struct engine *e, struct seq *s, int32_t tok)
{
	if (s->gstate == NULL)
		return 0;
	if (cons_accept(e->cons, s->gstate, tok, s->error) != 0) {
		s->req_error = 1;
		return -1;
	}
	return gram_finished(s->gstate);
}

/* A constrained sequence whose grammar left no token (rc 0) or failed (rc < 0, s->error says why): it ends. */
void
gram_dead_end(struct seq *s, int rc)
{
	if (rc == 0)
		snprintf(s->error, sizeof s->error, "the grammar allows no token of the model's vocabulary after "
		    "%d generated tokens", s->n_generated);
	s->req_error = 1;
}

/* Accepts a sampled token: its text (gentext.h), the end of generation, the grammar, stop strings, limits. */
void
seq_accept(struct engine *e, struct seq *s, int32_t tok)
{
	int eog = tok_is_eog(e->m->tok, tok), g = 0;

	seq_push_tokens(s, &tok, 1);
	s->n_generated++;
	s->new_token = tok;
	if (!eog && (g = gram_step(e, s, tok)) < 0)
		engine_seq_finish(s, FINISH_ERROR);
	else if (eog || gentext_token(&s->out, tok) || g > 0)
		engine_seq_finish(s, FINISH_STOP);
	else if (s->params.max_tokens > 0 && s->n_generated >= s->params.max_tokens)
		engine_seq_finish(s, FINISH_LENGTH);
	else if (s->n_tokens >= e->n_ctx)
		engine_seq_finish(s, FINISH_CONTEXT);
	if (s->state == SEQ_DONE && gentext_end(&s->out))
		s->finish = FINISH_STOP;
	gentext_emit(&s->out, s->state == SEQ_DONE);
}

/* ---- steps ---- */

/*
 * Adds a sequence's pending tokens (up to budget) to the step. Returns how
 * many. A sequence that gets no blocks is finished with the reason; when
 * the backend failed to copy one, *rc gets its error too.
 */
static int32_t
plan_seq(struct engine *e, struct seq *s, int32_t budget, int32_t *room, int32_t *mask_room, int32_t *n_fseqs,
    int32_t n_tok, int *rc, char *err)
{
	int32_t take;
	enum pool_kind pool = s->embed ? e->m->embed.pool : POOL_NONE;
	int bidir = s->embed && e->m->embed.bidirectional;
	struct fwd_seq *f;
	int r;

	if (engine_seq_guesses(e, s) && *room > 0 && budget > 1)
		seq_guess(e, s, MIN(*room, budget - 1), mask_room);
	/* a draft's guesses follow the tokens of this step: in a later one they would be stale */
	s->n_given = 0;
	s->spec_live = s->n_draft + 1;
	/* before any row of the step draws (step_picks, or settle on the host) */
	memcpy(s->rng_mark, s->sampler.rng, sizeof s->rng_mark);
	take = MIN(s->n_tokens - s->n_cached, budget);
	/* a bidirectional input waits for a step with room for all of it */
	if (take <= 0 || (bidir && take < s->n_tokens - s->n_cached))
		return 0;
	if ((r = seq_reserve(e, s, s->n_cached + take, err)) != 0) {
		seq_unguess(s);
		if (r == ERR_RANGE && e->n_io > 0) {
			/* blocks a disk write holds come back when it ends: wait for it, not fail */
			s->wait_io = 1;
			return 0;
		}
		snprintf(s->error, sizeof s->error, "%s", err);
		engine_seq_finish(s, FINISH_ERROR);
		*rc = r == ERR_RANGE ? 0 : r;
		return 0;
	}
	*room -= s->n_draft;
	e->step_guesses += s->n_draft;
	f = &e->fseqs[*n_fseqs];
	f->n_new = take;
	f->pos0 = s->n_cached;
	f->block_table = s->blocks;
	f->n_blocks = s->n_blocks;
	f->logits = !s->embed && s->n_cached + take == s->n_tokens ? 1 + s->n_draft : 0;
	/* mean: every row; last: the input's last; CLS: its first, in the first chunk's rows */
	f->embd = pool == POOL_MEAN || (pool == POOL_CLS && s->n_cached == 0) ? take :
	    pool == POOL_LAST && s->n_cached + take == s->n_tokens;
	f->bidir = bidir;
	memcpy(e->tokens + n_tok, s->tokens + s->n_cached, (size_t)take * sizeof *e->tokens);
	e->fseq_of[(*n_fseqs)++] = s;
	return take;
}

/* 1 if the backend can pick s's next token: the argmax, or a draw it makes as sample.c does. */
static int
pickable(const struct engine *e, const struct seq *s)
{
	const struct sample_params *p = &s->sampler.p;

	if (p->temperature == 0 && !sampler_penalized(&s->sampler) && !s->params.logprobs)
		return 1;
	return e->m->hp.n_vocab <= FWD_PICK_MAX_VOCAB &&
	    (p->temperature == 0 || (p->top_k >= 1 && p->top_k <= FWD_PICK_TOP_K));
}

/*
 * Row row's penalty window (after the first n tokens of s) into the step's
 * pairs from *n_pen on; 0, or -1 if it is too wide for the backend.
 */
static int
pick_window(struct engine *e, struct seq *s, int32_t row, int32_t n, int32_t *n_pen)
{
	struct fwd_pick *f = &e->pick[row];
	int32_t m = 0;

	if (sampler_penalized(&s->sampler) && (m = sampler_window(&s->sampler, s->tokens, (size_t)n,
	    e->pen_tok + *n_pen, e->pen_cnt + *n_pen, FWD_PICK_PENALTY_MAX)) < 0)
		return -1;
	f->pen0 = *n_pen, f->n_pen = m;
	*n_pen += m;
	return 0;
}

/* How the backend draws a row of s (its window set already); 1 if that is more than the argmax. */
static int
pick_params(struct seq *s, struct fwd_pick *f)
{
	struct sampler *sm = &s->sampler;

	f->key = sm->p.temperature > 0 ? sampler_key(sm) : 0;
	f->temperature = sm->p.temperature, f->top_p = sm->p.top_p, f->min_p = sm->p.min_p;
	f->top_k = sm->p.top_k;
	f->repeat_penalty = sm->p.repeat_penalty, f->presence_penalty = sm->p.presence_penalty;
	f->frequency_penalty = sm->p.frequency_penalty;
	f->logprob = s->params.logprobs;
	f->top = s->params.top_logprobs;
	return f->temperature > 0 || f->n_pen > 0 || f->logprob;
}

/* The tokens before a sequence's first logits row of the step (its guesses follow them). */
static int32_t
rows_history(const struct seq *s)
{
	return s->n_tokens - s->n_draft;
}

/*
 * 1 if the backend picks every token this step samples (each sequence
 * pickable, each penalty window narrow enough): then the logits need not
 * leave it. batch gets the argmax buffer and, unless every row is a plain
 * argmax, how each row is drawn: the windows (a guess's row's with the
 * guesses before it), then each sampling sequence's generator drawing
 * each row's key here, as sampler_pick would.
 */
static int
step_picks(struct engine *e, int32_t n_fseqs, struct fwd_batch *b)
{
	int32_t i, r, row = 0, n_pen = 0, drawn = 0;

	b->argmax = NULL, b->pick = NULL;
	b->pen_tok = e->pen_tok, b->pen_cnt = e->pen_cnt, b->logprob = e->logprob;
	b->top_ids = e->top_ids, b->top_lp = e->top_lp;
	if (!e->ops->has_argmax || e->host_picks)
		return 0;
	for (i = 0; i < n_fseqs; i++)
		for (r = 0; r < e->fseqs[i].logits; r++)
			if (!pickable(e, e->fseq_of[i]) ||
			    pick_window(e, e->fseq_of[i], row++, rows_history(e->fseq_of[i]) + r, &n_pen) < 0)
				return 0; /* before any draw: the host's sampler draws the same */
	for (i = 0, row = 0; i < n_fseqs; i++)
		for (r = 0; r < e->fseqs[i].logits; r++)
			drawn |= pick_params(e->fseq_of[i], &e->pick[row++]);
	b->argmax = e->argmax;
	b->pick = drawn ? e->pick : NULL;
	return 1;
}


/*
 * The step's constrained rows (fwd_batch.masks): called by the backend
 * while the device runs the step. A sequence whose grammar leaves no token
 * is not listed; its draw is dropped (sample_step).
 */
static int
step_masks(void *arg, struct fwd_masks *m, char *err)
{
	struct engine *e = arg;
	size_t words = FWD_MASK_WORDS(e->m->hp.n_vocab);
	int32_t i, row = 0, n = 0;
	int rc;

	(void)err;
	for (i = 0; i < e->n_fseqs; i++) {
		struct seq *s = e->fseq_of[i];

		if (!e->fseqs[i].logits)
			continue;
		/* a guess's row: the grammar after the guesses before it; past a dead end, no row is reached */
		for (int32_t r = 0; s->gstate != NULL && r < e->fseqs[i].logits; r++) {
			const struct gram_state *at = r == 0 ? s->gstate : s->gspec[r - 1];

			if ((rc = gram_mask(at, cons_index(s->gram), e->masks + (size_t)n * words, s->error)) > 0) {
				e->mask_rows[n++] = row + r;
				continue;
			}
			if (r == 0)
				gram_dead_end(s, rc);
			s->spec_live = r;
			break;
		}
		row += e->fseqs[i].logits;
	}
	m->n = n, m->rows = e->mask_rows, m->bits = e->masks;
	return 0;
}

/* 1 if a sequence that samples this step is constrained. */
static int
step_constrained(const struct engine *e)
{
	for (int32_t i = 0; i < e->n_fseqs; i++)
		if (e->fseqs[i].logits && e->fseq_of[i]->gstate != NULL)
			return 1;
	return 0;
}

/*
 * An embedding sequence's hidden-state rows of the step (from row on in
 * e->embd) into its pool; once its last token is in, its vector.
 */
static void
embed_rows(struct engine *e, struct seq *s, const struct fwd_seq *f, int32_t row)
{
	const struct model_embed *me = &e->m->embed;
	int32_t d = e->m->hp.n_embd, r, i;
	const float *h = e->embd + (size_t)row * (size_t)d;

	for (r = 0; r < f->embd; r++, h += d)
		if (me->pool == POOL_MEAN || r == 0)
			for (i = 0; i < d; i++)
				s->pool[i] = me->pool == POOL_MEAN ? s->pool[i] + h[i] : h[i];
	if (s->n_cached < s->n_tokens)
		return;
	for (i = 0; i < d; i++)
		e->embd_tmp[i] = (float)(me->pool == POOL_MEAN ? s->pool[i] / s->n_tokens : s->pool[i]);
	s->vec = xmalloc((size_t)engine_embed_dims(e, s->dims) * sizeof *s->vec);
	embed_finish(me, e->embd_tmp, d, s->dims, s->vec, e->embd_tmp + d);
	engine_seq_finish(s, FINISH_STOP);
}

/*
 * The token of logits row row, the r-th of s's (after its first n
 * tokens): the backend's pick, or sample.c's draw, with the
 * log-probability and the most likely tokens where s asks for them.
 */
static int32_t
row_token(struct engine *e, struct seq *s, int32_t row, int32_t n, int picked)
{
	float lp = 0, *logits;
	int32_t tok;

	s->n_top = s->params.top_logprobs;
	if (picked) {
		s->new_logprob = s->params.logprobs ? e->logprob[row] : 0;
		memcpy(s->top_ids, e->top_ids + (size_t)row * FWD_TOP_LOGPROBS, (size_t)s->n_top * sizeof *s->top_ids);
		memcpy(s->top_lp, e->top_lp + (size_t)row * FWD_TOP_LOGPROBS, (size_t)s->n_top * sizeof *s->top_lp);
		return e->argmax[row];
	}
	logits = e->logits + (size_t)row * (size_t)e->m->hp.n_vocab;
	tok = sampler_pick(&s->sampler, logits, s->tokens, (size_t)n, s->params.logprobs && s->n_top == 0 ? &lp : NULL);
	if (s->n_top > 0)
		s->n_top = sampler_top(&s->sampler, logits, s->n_top, tok, s->top_ids, s->top_lp, &lp);
	s->new_logprob = s->params.logprobs ? lp : 0;
	return tok;
}

/*
 * The tokens s's rows settle, from row on, into spec: each row's token in
 * turn while it is the guess that follows (the standard rule for a guess
 * of one token: drawn from the model's own distribution, so that the
 * output has exactly that distribution, and greedy output is decoding's
 * without guesses), then the first that is not, or the one after the
 * last guess. The guesses leave tokens[] (seq_take puts the accepted ones
 * back). Whatever the rows drew (the backend's picks draw every row's key),
 * the generator is left one draw past where it was per token taken, as
 * decoding without guesses leaves it: token j is drawn with the j-th
 * key either way, so a seed gives the same tokens with guesses as
 * without (where the logits are the same) and whatever the scheduler
 * chose to guess.
 */
static void
settle(struct engine *e, struct seq *s, int32_t row, int picked)
{
	int32_t k = s->n_draft, n = rows_history(s), a = 0, drawn, tok = -1;

	s->n_tokens = n;
	while (a < s->spec_live) {
		tok = row_token(e, s, row + a, n + a, picked);
		if (a == k || tok != s->tokens[n + a])
			break;
		s->spec[a++] = tok;
	}
	/* a == spec_live: the guesses were accepted up to a row whose grammar allows nothing (seq_take ends it) */
	drawn = a < s->spec_live ? a + 1 : a;
	s->spec[a] = tok;
	/* one draw a token taken, whatever the rows drew: a seed gives the tokens it gives without guesses */
	if (s->sampler.p.temperature > 0) {
		memcpy(s->sampler.rng, s->rng_mark, sizeof s->rng_mark);
		for (int32_t r = 0; r < drawn; r++)
			(void)sampler_key(&s->sampler);
	}
	s->n_spec = drawn, s->spec_kv = a, s->spec_next = 0, s->n_draft = 0;
	free_gspec(s);
	/* a guess its grammar cut is one not accepted: a draft model whose guesses the grammar never allows
	   stops drafting (its steps are not free) */
	if (k + s->n_cut > 0)
		s->spec_rate = 0.7f * s->spec_rate + 0.3f * (float)a / (float)(k + s->n_cut);
	else if (s->params.speculative != SPEC_OFF)
		s->spec_rate = MIN(1.0f, s->spec_rate + 0.02f);
	s->n_cut = 0;
	if (k > 0) {
		s->n_drafted += k, s->n_accepted += a;
		e->drafted += (uint64_t)k, e->accepted += (uint64_t)a;
	}
}

/*
 * Samples for every sequence whose last token was in the step (picked
 * already when the backend did), taking each one's first token settled;
 * embedding sequences take their rows.
 */
static void
sample_step(struct engine *e, int32_t n_fseqs, int picked)
{
	int32_t i, row = 0, erow = 0;

	for (i = 0; i < n_fseqs; i++) {
		struct seq *s = e->fseq_of[i];

		s->n_cached += e->fseqs[i].n_new - s->n_draft;
		seq_publish(e, s);
		if (s->embed) {
			embed_rows(e, s, &e->fseqs[i], erow);
			erow += e->fseqs[i].embd;
			continue;
		}
		if (!e->fseqs[i].logits)
			continue;
		s->state = SEQ_DECODE;
		if (s->req_error) {
			row += e->fseqs[i].logits;
			seq_unguess(s);
			engine_seq_finish(s, FINISH_ERROR);
			continue;
		}
		settle(e, s, row, picked);
		row += e->fseqs[i].logits;
		seq_take(e, s);
	}
}

int
engine_step(struct engine *e, struct seq **seqs, int n, int32_t max_prefill, char *err)
{
	struct fwd_batch batch;
	int32_t n_fseqs = 0, n_tok = 0, n_prefill = 0, i, budget, took, room, mask_room;
	int rc = 0, picked;

	if (max_prefill < 0)
		max_prefill = e->max_step_tokens;
	for (i = 0; i < n; i++) {
		while (engine_seq_more(e, seqs[i]))
			;
		seqs[i]->new_token = -1;
		gentext_no_piece(&seqs[i]->out);
	}
	/* the rows the step's sequences leave are its guesses' (one a sequence at least), and the masks the
	   backend takes (max_seqs) those of constrained ones */
	room = share_guesses(e, seqs, n, NULL);
	e->share_turn++;
	e->step_guesses = 0;
	for (i = 0, mask_room = e->max_seqs; i < n; i++)
		mask_room -= seqs[i]->gstate != NULL;
	for (i = 0; i < n && n_fseqs < e->max_seqs && n_tok < e->max_step_tokens && rc == 0; i++) {
		budget = e->max_step_tokens - n_tok;
		if (seqs[i]->state == SEQ_PREFILL)
			budget = MIN(budget, max_prefill - n_prefill);
		if (budget <= 0 || (seqs[i]->state != SEQ_PREFILL && seqs[i]->state != SEQ_DECODE))
			continue;
		took = plan_seq(e, seqs[i], budget, &room, &mask_room, &n_fseqs, n_tok, &rc, err);
		n_prefill += seqs[i]->state == SEQ_PREFILL ? took : 0;
		n_tok += took;
	}
	if (rc != 0) {
		for (i = 0; i < n_fseqs; i++)
			seq_unguess(e->fseq_of[i]);
		return rc;
	}
	if (n_tok == 0)
		return 0;
	n_tok = trim_guesses(e, n_fseqs, n_tok);
	batch.n_seqs = n_fseqs;
	batch.seqs = e->fseqs;
	batch.n_tokens = n_tok;
	batch.tokens = e->tokens;
	e->n_fseqs = n_fseqs;
	batch.masks = step_constrained(e) ? step_masks : NULL;
	batch.masks_arg = e;
	batch.embd = e->embd;
	picked = step_picks(e, n_fseqs, &batch);
	tier_evict_flush(e);  /* the blocks the step's sequences took, given up by others, out before it writes them */
	if ((rc = e->ops->forward(e->be, &batch, picked ? NULL : e->logits, err)) != 0) {
		for (i = 0; i < n_fseqs; i++) {
			snprintf(e->fseq_of[i]->error, sizeof e->fseq_of[i]->error, "%s", err);
			seq_unguess(e->fseq_of[i]);
			engine_seq_finish(e->fseq_of[i], FINISH_ERROR);
		}
		return rc;
	}
	sample_step(e, n_fseqs, picked);
	return n_tok;
}
