/*
 * engine.c: sequences over one KV pool, advanced by batched forward steps.
 *
 * A step gathers, for each sequence it is given, the tokens not yet in the
 * KV cache (all of them for a decode, a chunk for a prefill), makes sure
 * blocks cover their positions, runs the backend once, then samples a token
 * for each sequence whose last token was in the step and turns it into text:
 * whole UTF-8 only, held back while it could still become a stop string.
 */
#include "config.h"
#include "engine.h"
#include "kernels.h"
#include "kv.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_CTX_CAP 8192
#define PIECE_CAP 1024

struct engine {
	struct model_desc *m;
	const struct backend_ops *ops;
	int exact;          /* the backend runs its exact numerics (engine_opts) */
	struct backend *be;
	struct kv_pool kv;
	int32_t n_ctx;
	int32_t max_step_tokens;
	int32_t max_seqs;
	/* step buffers */
	struct fwd_seq *fseqs;
	struct seq **fseq_of;   /* the sequence of each fwd_seq */
	int32_t *tokens;
	float *logits;          /* max_seqs rows */
	int32_t *argmax;        /* max_seqs: the greedy picks, when the backend makes them */
};

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

/* Fills the defaults of the options from the model. */
static void
resolve_opts(struct engine *e, const struct engine_opts *o, int32_t *kv_tokens)
{
	e->n_ctx = o->n_ctx > 0 ? o->n_ctx : MIN(e->m->hp.n_ctx_train, DEFAULT_CTX_CAP);
	e->max_step_tokens = o->max_step_tokens > 0 ? o->max_step_tokens : 512;
	e->max_seqs = o->max_seqs > 0 ? o->max_seqs : 64;
	*kv_tokens = o->kv_tokens > 0 ? o->kv_tokens : 4 * e->n_ctx;
	*kv_tokens = MAX(*kv_tokens, e->n_ctx);
}

int
engine_open(const char *model_path, const struct engine_opts *o, struct engine **out, char *err)
{
	struct engine *e = xcalloc(1, sizeof *e);
	struct backend_opts bo = { 0 };
	int32_t kv_tokens;
	int rc;

	if ((rc = engine_pick_backend(o->device, &e->ops, err)) != 0 ||
	    (rc = model_open(model_path, &e->m, err)) != 0) {
		free(e);
		return rc;
	}
	resolve_opts(e, o, &kv_tokens);
	bo.n_threads = o->n_threads;
	bo.kv_blocks = (kv_tokens + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
	bo.max_tokens = e->max_step_tokens;
	bo.max_seqs = e->max_seqs;
	bo.exact = o->exact;
	e->exact = o->exact != 0;
	if ((rc = e->ops->load(e->m, &bo, &e->be, err)) != 0) {
		err_prefix(err, rc, "%s backend", e->ops->name);
		model_close(e->m);
		free(e);
		return rc;
	}
	kv_init(&e->kv, (int32_t)bo.kv_blocks);
	e->fseqs = xcalloc((size_t)e->max_seqs, sizeof *e->fseqs);
	e->fseq_of = xcalloc((size_t)e->max_seqs, sizeof *e->fseq_of);
	e->tokens = xcalloc((size_t)e->max_step_tokens, sizeof *e->tokens);
	e->logits = xmalloc((size_t)e->max_seqs * (size_t)e->m->hp.n_vocab * sizeof *e->logits);
	e->argmax = xcalloc((size_t)e->max_seqs, sizeof *e->argmax);
	*out = e;
	return 0;
}

void
engine_close(struct engine *e)
{
	if (e == NULL)
		return;
	e->ops->free(e->be);
	kv_destroy(&e->kv);
	model_close(e->m);
	free(e->fseqs), free(e->fseq_of), free(e->tokens), free(e->logits), free(e->argmax);
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
	return e->kv.n_free;
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
	    (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim * (uint64_t)e->ops->kv_elem_bytes(e->be);
}

int32_t
engine_max_step_tokens(const struct engine *e)
{
	return e->max_step_tokens;
}

/* ---- sequences ---- */

/* Appends tokens to a sequence's history. */
static void
seq_push_tokens(struct seq *s, const int32_t *t, int32_t n)
{
	if (s->n_tokens + n > s->cap_tokens) {
		s->cap_tokens = MAX(s->cap_tokens * 2, s->n_tokens + n + 64);
		s->tokens = xrealloc(s->tokens, (size_t)s->cap_tokens * sizeof *s->tokens);
	}
	memcpy(s->tokens + s->n_tokens, t, (size_t)n * sizeof *t);
	s->n_tokens += n;
}

/* Frees the parameters a turn copied. */
static void
seq_clear_params(struct seq *s)
{
	int i;

	for (i = 0; i < s->params.n_stop; i++)
		free(s->stop[i]);
	free(s->stop);
	s->stop = NULL;
	sampler_free(&s->sampler);
}

/* Validates and copies a turn's parameters; resets the turn's output. */
static int
seq_set_params(const struct engine *e, struct seq *s, const struct seq_params *p, char *err)
{
	int i, rc;

	if ((rc = sample_params_check(&p->sample, err)) != 0)
		return rc;
	if (p->max_tokens < 0 || p->n_stop < 0 || p->n_stop > 16)
		return err_set(err, ERR_INVAL, "max_tokens must be >= 0 and at most 16 stop strings");
	for (i = 0; i < p->n_stop; i++)
		if (p->stop[i] == NULL || p->stop[i][0] == '\0' || strlen(p->stop[i]) > 256 ||
		    !utf8_valid(p->stop[i], strlen(p->stop[i])))
			return err_set(err, ERR_INVAL, "stop strings must be 1..256 bytes of UTF-8");
	seq_clear_params(s);
	s->params = *p;
	s->stop = xcalloc((size_t)(p->n_stop ? p->n_stop : 1), sizeof *s->stop);
	for (i = 0; i < p->n_stop; i++)
		s->stop[i] = xstrdup(p->stop[i]);
	s->params.stop = NULL;
	sampler_init(&s->sampler, &p->sample, e->m->hp.n_vocab);
	tok_stream_init(&s->stream);
	if (s->text == NULL) {
		s->text_cap = 256;
		s->text = xmalloc(s->text_cap);
	}
	s->text[0] = '\0';
	s->text_len = s->text_emitted = 0;
	s->n_generated = 0;
	s->finish = FINISH_NONE;
	s->error[0] = '\0';
	return 0;
}

/* Checks token ids and the context before a sequence takes them. */
static int
check_tokens(const struct engine *e, const struct seq *s, const int32_t *t, int32_t n, char *err)
{
	int32_t i, have = s ? s->n_tokens : 0;

	if (n < 1)
		return err_set(err, ERR_INVAL, "empty prompt");
	if (have + (int64_t)n >= e->n_ctx)
		return err_set(err, ERR_RANGE, "%d tokens do not fit the context of %d tokens",
		    have + n, e->n_ctx);
	for (i = 0; i < n; i++)
		if (t[i] < 0 || t[i] >= e->m->hp.n_vocab)
			return err_set(err, ERR_INVAL, "token id %d is outside the vocabulary", t[i]);
	return 0;
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
	s->piece = xmalloc(PIECE_CAP);
	s->piece[0] = '\0';
	s->new_token = -1;
	if ((rc = seq_set_params(e, s, p, err)) != 0) {
		engine_seq_free(e, s);
		return rc;
	}
	seq_push_tokens(s, prompt, n);
	s->n_prompt = n;
	s->turn_start = s->n_tokens;
	s->state = SEQ_PREFILL;
	*out = s;
	return 0;
}

/* Drops the blocks beyond what n_keep tokens need. */
static void
seq_trim_blocks(struct engine *e, struct seq *s, int32_t n_keep)
{
	int32_t keep = (n_keep + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;

	while (s->n_blocks > keep)
		kv_unref(&e->kv, s->blocks[--s->n_blocks]);
}

int
engine_seq_reuse(struct engine *e, struct seq *s, const int32_t *tokens, int32_t n,
    const struct seq_params *p, char *err)
{
	int32_t keep = 0;
	int rc;

	if (s->state != SEQ_DONE)
		return err_set(err, ERR_INVAL, "the sequence is still generating");
	if ((rc = check_tokens(e, NULL, tokens, n, err)) != 0 || (rc = seq_set_params(e, s, p, err)) != 0)
		return rc;
	while (keep < n - 1 && keep < s->n_cached && s->tokens[keep] == tokens[keep])
		keep++;
	s->n_tokens = 0;
	s->n_cached = keep;
	seq_trim_blocks(e, s, keep);
	seq_push_tokens(s, tokens, n);
	s->n_prompt = n;
	s->turn_start = n;
	s->state = SEQ_PREFILL;
	return keep;
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

	s->piece = xmalloc(PIECE_CAP);
	s->piece[0] = '\0';
	s->new_token = -1;
	s->state = SEQ_DONE;
	seq_push_tokens(s, parent->tokens, parent->n_tokens);
	s->n_cached = parent->n_cached;
	s->n_prompt = parent->n_prompt;
	s->cap_blocks = MAX(parent->n_blocks, 1);
	s->blocks = xmalloc((size_t)s->cap_blocks * sizeof *s->blocks);
	for (i = 0; i < parent->n_blocks; i++) {
		kv_ref(&e->kv, parent->blocks[i]);
		s->blocks[s->n_blocks++] = parent->blocks[i];
	}
	sampler_init(&s->sampler, &parent->params.sample, e->m->hp.n_vocab);
	s->stop = xcalloc(1, sizeof *s->stop);
	return s;
}

void
engine_seq_finish(struct seq *s, enum finish_reason why)
{
	s->state = SEQ_DONE;
	s->finish = why;
}

void
engine_seq_free(struct engine *e, struct seq *s)
{
	int32_t i;

	if (s == NULL)
		return;
	for (i = 0; i < s->n_blocks; i++)
		kv_unref(&e->kv, s->blocks[i]);
	seq_clear_params(s);
	free(s->blocks), free(s->tokens), free(s->piece), free(s->text);
	free(s);
}

/*
 * Makes blocks cover positions 0..n-1 and gives the sequence its own copy
 * of any shared block that positions n_cached.. will be written into.
 * Returns 0, ERR_RANGE if the pool is full, or the backend's error if a
 * block copy failed.
 */
static int
seq_reserve(struct engine *e, struct seq *s, int32_t n, char *err)
{
	int32_t need = (n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS, b, i;
	int rc;

	if (need > s->cap_blocks) {
		s->cap_blocks = MAX(need, s->cap_blocks * 2);
		s->blocks = xrealloc(s->blocks, (size_t)s->cap_blocks * sizeof *s->blocks);
	}
	for (i = s->n_cached / KV_BLOCK_TOKENS; i < s->n_blocks; i++) {
		if (e->kv.ref[s->blocks[i]] == 1)
			continue;
		if ((b = kv_alloc(&e->kv)) < 0)
			return err_set(err, ERR_RANGE, "the KV cache is full");
		if ((rc = e->ops->kv_copy(e->be, s->blocks[i], b, KV_BLOCK_TOKENS, err)) != 0) {
			kv_unref(&e->kv, b);
			return err_prefix(err, rc, "copying a KV block");
		}
		kv_unref(&e->kv, s->blocks[i]);
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
 * Appends decoded bytes to the turn's text, a U+0000 (a model may generate
 * the byte token <0x00>) as U+FFFD: the text is kept and rendered again as
 * a C string (a session's stored reply, the chat template of its next
 * turn), and no request may carry a NUL either.
 */
static void
text_append(struct seq *s, const char *p, size_t n)
{
	static const char replacement[] = "\xef\xbf\xbd";
	size_t i;

	if (s->text_len + 3 * n + 1 > s->text_cap) {
		s->text_cap = MAX(s->text_cap * 2, s->text_len + 3 * n + 256);
		s->text = xrealloc(s->text, s->text_cap);
	}
	for (i = 0; i < n; i++) {
		if (p[i] != '\0') {
			s->text[s->text_len++] = p[i];
		} else {
			memcpy(s->text + s->text_len, replacement, 3);
			s->text_len += 3;
		}
	}
	s->text[s->text_len] = '\0';
}

/*
 * Looks for a stop string in the text not yet handed out; cuts the text
 * there if found (returns 1). Otherwise sets *safe to how far the text can
 * be handed out: not into a suffix that could still grow into a stop string.
 */
static int
find_stop(struct seq *s, size_t *safe)
{
	size_t from = s->text_emitted, k, n, best = s->text_len;
	const char *hit;
	int i;

	*safe = s->text_len;
	for (i = 0; i < s->params.n_stop; i++) {
		n = strlen(s->stop[i]);
		/* a stop string may straddle what was held back */
		hit = memmem(s->text + from, s->text_len - from, s->stop[i], n);
		if (hit != NULL && (size_t)(hit - s->text) < best)
			best = (size_t)(hit - s->text);
		for (k = MIN(n - 1, s->text_len - from); k > 0; k--) {
			if (memcmp(s->text + s->text_len - k, s->stop[i], k) == 0) {
				*safe = MIN(*safe, s->text_len - k);
				break;
			}
		}
	}
	if (best == s->text_len)
		return 0;
	s->text_len = best;
	s->text[best] = '\0';
	*safe = best;
	return 1;
}

/* Moves text from emitted to upto into piece. */
static void
emit_text(struct seq *s, size_t upto)
{
	size_t n = upto > s->text_emitted ? upto - s->text_emitted : 0;

	if (n + 1 > PIECE_CAP) {
		/* pieces are short (one token), but a flush after a long hold-back is not */
		s->piece = xrealloc(s->piece, n + 1);
	}
	memcpy(s->piece, s->text + s->text_emitted, n);
	s->piece[n] = '\0';
	s->piece_len = n;
	s->text_emitted += n;
}

/* Accepts a sampled token: text, stop strings, limits. */
static void
seq_accept(struct engine *e, struct seq *s, int32_t tok)
{
	char buf[PIECE_CAP];
	size_t safe;
	int n;

	seq_push_tokens(s, &tok, 1);
	s->n_generated++;
	s->new_token = tok;
	if (tok_is_eog(e->m->tok, tok)) {
		n = tok_stream_flush(&s->stream, buf, sizeof buf);
		text_append(s, buf, (size_t)MAX(n, 0));
		engine_seq_finish(s, FINISH_STOP);
	} else {
		n = tok_stream_push(e->m->tok, &s->stream, tok, 0, buf, sizeof buf);
		text_append(s, buf, (size_t)MAX(n, 0));
	}
	if (find_stop(s, &safe))
		engine_seq_finish(s, FINISH_STOP);
	else if (s->params.max_tokens > 0 && s->n_generated >= s->params.max_tokens)
		engine_seq_finish(s, FINISH_LENGTH);
	else if (s->n_tokens >= e->n_ctx)
		engine_seq_finish(s, FINISH_CONTEXT);
	if (s->state == SEQ_DONE && s->finish != FINISH_STOP) {
		n = tok_stream_flush(&s->stream, buf, sizeof buf);
		text_append(s, buf, (size_t)MAX(n, 0));
		safe = s->text_len;
	}
	emit_text(s, s->state == SEQ_DONE ? s->text_len : safe);
}

/* ---- steps ---- */

/*
 * Adds a sequence's pending tokens (up to budget) to the step. Returns how
 * many. A sequence that gets no blocks is finished with the reason; when
 * the backend failed to copy one, *rc gets its error too.
 */
static int32_t
plan_seq(struct engine *e, struct seq *s, int32_t budget, int32_t *n_fseqs, int32_t n_tok, int *rc,
    char *err)
{
	int32_t take = MIN(s->n_tokens - s->n_cached, budget);
	struct fwd_seq *f;
	int r;

	if (take <= 0)
		return 0;
	if ((r = seq_reserve(e, s, s->n_cached + take, err)) != 0) {
		snprintf(s->error, sizeof s->error, "%s", err);
		engine_seq_finish(s, FINISH_ERROR);
		*rc = r == ERR_RANGE ? 0 : r;
		return 0;
	}
	f = &e->fseqs[*n_fseqs];
	f->n_new = take;
	f->pos0 = s->n_cached;
	f->block_table = s->blocks;
	f->n_blocks = s->n_blocks;
	f->logits = s->n_cached + take == s->n_tokens;
	memcpy(e->tokens + n_tok, s->tokens + s->n_cached, (size_t)take * sizeof *e->tokens);
	e->fseq_of[(*n_fseqs)++] = s;
	return take;
}

/*
 * 1 if every sequence that samples in this step picks greedily with no
 * penalties and wants no log-probabilities: then the backend's argmax is
 * the whole of sampling, and the logits need not leave it.
 */
static int
step_greedy(const struct engine *e, int32_t n_fseqs)
{
	if (!e->ops->has_argmax)
		return 0;
	for (int32_t i = 0; i < n_fseqs; i++) {
		const struct seq *s = e->fseq_of[i];
		const struct sample_params *p = &s->sampler.p;

		if (e->fseqs[i].logits && (p->temperature != 0 || p->repeat_penalty != 1.0f ||
		    p->presence_penalty != 0 || p->frequency_penalty != 0 || s->params.logprobs))
			return 0;
	}
	return 1;
}

/* Samples for every sequence whose last token was in the step (picked already when greedy). */
static void
sample_step(struct engine *e, int32_t n_fseqs, int greedy)
{
	int32_t i, row = 0;
	float lp, *logits;
	int32_t tok;

	for (i = 0; i < n_fseqs; i++) {
		struct seq *s = e->fseq_of[i];

		s->n_cached += e->fseqs[i].n_new;
		if (!e->fseqs[i].logits)
			continue;
		s->state = SEQ_DECODE;
		if (greedy) {
			tok = e->argmax[row++];
			s->new_logprob = 0;
		} else {
			logits = e->logits + (size_t)row++ * (size_t)e->m->hp.n_vocab;
			tok = sampler_pick(&s->sampler, logits, s->tokens, (size_t)s->n_tokens,
			    s->params.logprobs ? &lp : NULL);
			s->new_logprob = s->params.logprobs ? lp : 0;
		}
		seq_accept(e, s, tok);
	}
}

int
engine_step(struct engine *e, struct seq **seqs, int n, char *err)
{
	struct fwd_batch batch;
	int32_t n_fseqs = 0, n_tok = 0, i;
	int rc = 0, greedy;

	for (i = 0; i < n; i++) {
		seqs[i]->new_token = -1;
		seqs[i]->piece[0] = '\0';
		seqs[i]->piece_len = 0;
	}
	for (i = 0; i < n && n_fseqs < e->max_seqs && n_tok < e->max_step_tokens && rc == 0; i++)
		if (seqs[i]->state != SEQ_DONE)
			n_tok += plan_seq(e, seqs[i], e->max_step_tokens - n_tok, &n_fseqs, n_tok, &rc, err);
	if (rc != 0)
		return rc;
	if (n_tok == 0)
		return 0;
	batch.n_seqs = n_fseqs;
	batch.seqs = e->fseqs;
	batch.n_tokens = n_tok;
	batch.tokens = e->tokens;
	greedy = step_greedy(e, n_fseqs);
	batch.argmax = greedy ? e->argmax : NULL;
	if ((rc = e->ops->forward(e->be, &batch, greedy ? NULL : e->logits, err)) != 0) {
		for (i = 0; i < n_fseqs; i++) {
			snprintf(e->fseq_of[i]->error, sizeof e->fseq_of[i]->error, "%s", err);
			engine_seq_finish(e->fseq_of[i], FINISH_ERROR);
		}
		return rc;
	}
	sample_step(e, n_fseqs, greedy);
	return n_tok;
}
