/*
 * sched_admit.c: admission. A queued request gets its model (found, loaded
 * with progress replies, or left waiting while models in use hold the
 * memory it needs) and goes to the prompt worker (worker.h), which renders
 * and tokenizes its prompt off the engine thread; sched_take_prep takes it
 * back and starts its sequence.
 *
 * sched_admit_queued takes requests round-robin across connections,
 * interactive ones first, while their sequences fit under max_seqs (a
 * request of n choices runs n; one alone may run more); one that must wait
 * for memory (SLOTS_WAIT) goes first when memory frees.
 *
 * tokenize and detokenize run on the prompt worker too, and come back on
 * the same list as prompts, which unloading a model drains: so they are
 * here, not with the other ops (sched_ops.c).
 */
#include "config.h"
#include "sched_int.h"
#include "engine.h"
#include "log.h"
#include "model.h"
#include "slots.h"
#include "tokenizer.h"
#include "util.h"
#include "worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a request's model ---- */

/* The model of a name or path (slots_find), or the default one for NULL. Returns 0 or an ERR_* code. */
int
sched_find_model(struct sched *s, const char *name_or_path, struct slot **out, char *err)
{
	if (name_or_path != NULL)
		return slots_find(&s->slots, name_or_path, out, err);
	if ((*out = s->default_model) == NULL)
		return err_set(err, ERR_NOTFOUND, "no model is configured (start residentd with -m MODEL)");
	return 0;
}

/* sched_find_model for a request: NULL once the not_found error is posted. */
struct slot *
sched_job_model(struct sched *s, const struct sched_job *job, const char *name_or_path)
{
	char err[ERR_LEN];
	struct slot *m;

	if (sched_find_model(s, name_or_path, &m, err) != 0)
		sched_post_error(s, job, PE_NOT_FOUND, err);
	return m;
}

/* A progress reply of a request whose model is loading. */
static void
post_progress(struct sched *s, const struct sched_job *job, uint64_t done, uint64_t total)
{
	struct sched_event *ev = sched_new_event(job->conn, job->req.id, 0);
	msgpack_packer pk;

	proto_reply_begin(&ev->frame, &pk, 1, job->req.id, "progress", 2);
	proto_pack_kv_uint(&pk, "done", done);
	proto_pack_kv_uint(&pk, "total", total);
	proto_reply_end(&ev->frame);
	sched_post(s, ev);
}

/* slots_load's progress callback for a job. */
struct job_progress {
	struct sched *s;
	const struct sched_job *job;
};

static void
job_progress_cb(void *arg, uint64_t done, uint64_t total)
{
	struct job_progress *p = arg;

	post_progress(p->s, p->job, done, total);
}

/* Loads a job's model (with progress replies): 0, SLOTS_WAIT or an error. */
static int
load_model(struct sched *s, const struct sched_job *job, struct slot *m, char *err)
{
	struct job_progress p = { s, job };

	return slots_load(&s->slots, m, job_progress_cb, &p, err);
}

/*
 * Loads the model of an op that cannot wait for memory (model.load with
 * progress replies, tokenize); sends the error and returns -1 if it fails.
 */
int
sched_load_now(struct sched *s, const struct sched_job *job, struct slot *m, int progress)
{
	struct job_progress p = { s, job };
	char err[ERR_LEN];
	int rc = slots_load(&s->slots, m, progress ? job_progress_cb : NULL, &p, err);

	if (rc == SLOTS_WAIT)
		sched_post_error(s, job, PE_OVERLOADED, "the device memory budget is held by models in use; try "
		    "again when their requests have ended");
	else if (rc != 0)
		sched_post_error(s, job, PE_MODEL_ERROR, err);
	return rc == 0 ? 0 : -1;
}

/* ---- admission ---- */

/* On the worker: the prompt's tokens (the engine thread waits for them in GEN_PREP). */
static void
prep_run(struct work *w)
{
	struct gen *g = (struct gen *)w;

	g->prep_err[0] = '\0';
	if (g->job->req.op == OP_EMBED) {
		sched_embed_prep(g);
		return;
	}
	g->prep_rc = sched_prompt_tokens(g->md, g->job, &g->ids, &g->n_ids, &g->prep_pe, g->prep_err);
	if (g->prep_rc == 0 && (g->prep_rc = sched_prompt_grammar(g->slot->e, g->job, &g->gram, g->prep_err)) != 0)
		g->prep_pe = PE_INVALID_PARAM;
}

/* 1 if a request's output is constrained by a grammar, which may take seconds to index. */
static int
constrained(const struct proto_req *r)
{
	return proto_constraints(r) > 0 || (r->tools && r->tool_choice == TOOLS_REQUIRED);
}

/*
 * Whether the model can serve the op: an embed wants an embedding model,
 * and a model with bidirectional attention makes vectors, not text. 0, or
 * -1 with the message.
 */
static int
model_kind_error(const struct model_desc *md, enum proto_op op, char *err)
{
	if (op == OP_EMBED && md->embed.pool == POOL_NONE)
		return err_set(err, -1, "model %s is not an embedding model (a GGUF file with a pooling type, or a "
		    "sentence-transformers directory with a Pooling module)", md->name);
	if (op == OP_GENERATE && md->embed.bidirectional)
		return err_set(err, -1, "model %s is an embedding model with bidirectional attention: it makes vectors "
		    "(embed), not text", md->name);
	return 0;
}

/* 1 if a loaded model other than m is in use: the memory it holds comes free when its requests end. */
static int
others_in_use(const struct sched *s, const struct slot *m)
{
	for (const struct slot *o = s->slots.list; o != NULL; o = o->next)
		if (o != m && o->e != NULL && o->users > 0)
			return 1;
	return 0;
}

/*
 * Loads the draft model name beside g's model (held, so that the draft's
 * load does not unload it) and gives it to g: 0, SLOTS_WAIT, or an error
 * in err with its code in *pe.
 */
static int
load_draft(struct sched *s, struct gen *g, const char *name, enum proto_err *pe, char *err)
{
	struct slot *d;
	int rc;

	*pe = PE_NOT_FOUND;
	if ((rc = sched_find_model(s, name, &d, err)) != 0)
		return rc;
	*pe = PE_MODEL_ERROR;
	if ((rc = load_model(s, g->job, d, err)) != 0)
		return rc;
	*pe = PE_INVALID_PARAM;
	if (model_kind_error(engine_model(d->e), OP_GENERATE, err) != 0)
		return ERR_INVAL;
	return sched_draft_use(s, g, d, err);
}

/*
 * g's draft model: the one it names (0, -1 when it failed: the error is
 * sent, or SLOTS_WAIT), or for a request that names none the daemon's for
 * its model (--draft, --model-draft), where it can be had at once (else the
 * request runs without it: 0). A named draft that does not fit while only
 * its own model is in use never will (that model is loaded first again at
 * the next try): an error, not a wait that would hold every later request
 * back.
 */
static int
admit_draft(struct sched *s, struct gen *g)
{
	const struct proto_req *r = &g->job->req;
	enum proto_err pe;
	char err[ERR_LEN];
	int rc;

	if (r->op != OP_GENERATE || r->speculative == SPEC_OFF)
		return 0;
	if (r->draft == NULL) {
		for (int i = s->o.n_drafts - 1; i >= 0; i--)
			if (s->draft_for[i] == g->slot) {
				if ((rc = load_draft(s, g, s->o.drafts[2 * i + 1], &pe, err)) != 0)
					log_debug("request %llu: no draft: %s", (unsigned long long)r->id,
					    rc == SLOTS_WAIT ? "the memory it needs is held by models in use" : err);
				break;
			}
		return 0;
	}
	if ((rc = load_draft(s, g, r->draft, &pe, err)) == SLOTS_WAIT) {
		if (others_in_use(s, g->slot))
			return SLOTS_WAIT;
		rc = err_set(err, ERR_NOMEM, "draft model %s does not fit beside %s (%.0f MiB) in the device memory "
		    "budget of %.0f MiB (residentd --device-memory)", r->draft, g->slot->name,
		    engine_mem_bytes(g->slot->e) / 1048576.0, s->slots.o.budget / 1048576.0);
	}
	if (rc != 0) {
		sched_post_error(s, g->job, pe, err);
		return -1;
	}
	return 0;
}

/*
 * Admits a queued generate or embed: its model (and a generate's draft
 * model) is loaded and the prompt (an embed's inputs) goes to the worker
 * (GEN_PREP). 0, or -1 when it failed (the error is sent), or SLOTS_WAIT
 * when a model cannot be loaded until models in use give back memory (it
 * stays queued, holding none).
 */
static int
admit(struct sched *s, struct gen *g)
{
	struct sched_job *job = g->job;
	const char *want = job->req.model ? job->req.model : job->session_model;
	uint64_t t0 = now_ns();
	char err[ERR_LEN];
	struct slot *m;
	int rc;

	if ((m = sched_job_model(s, job, want)) == NULL)
		return -1;
	if ((rc = load_model(s, job, m, err)) != 0) {
		if (rc != SLOTS_WAIT)
			sched_post_error(s, job, PE_MODEL_ERROR, err);
		return rc == SLOTS_WAIT ? SLOTS_WAIT : -1;
	}
	g->load_ns = now_ns() - t0;
	if (model_kind_error(engine_model(m->e), job->req.op, err) != 0) {
		sched_post_error(s, job, PE_INVALID_PARAM, err);
		return -1;
	}
	slots_acquire(&s->slots, m);
	g->slot = m;
	g->md = engine_model(m->e);
	if ((rc = admit_draft(s, g)) != 0) {
		if (rc == SLOTS_WAIT) {
			sched_release_slot(s, m, m->keep_alive);
			g->slot = NULL, g->md = NULL;
		}
		return rc;
	}
	g->prep.fn = prep_run;
	g->prep.owner = m;
	g->prep.key = job->conn;
	g->state = GEN_PREP;
	worker_submit(constrained(&job->req) ? &s->prep_gram : &s->prep, &g->prep);
	return 0;
}

/*
 * The error code of a sequence that could not start: ERR_UNSUPPORTED is the
 * model's (a harmony template over a vocabulary without its markers).
 */
static enum proto_err
start_error(int rc)
{
	switch (rc) {
	case ERR_RANGE: return PE_CONTEXT_EXCEEDED;
	case ERR_BUSY: return PE_SESSION_BUSY;
	case ERR_UNSUPPORTED: return PE_MODEL_ERROR;
	default: return PE_INVALID_PARAM;
	}
}

/* Its prompt's tokens came back: the request's sequence starts, or it fails. */
static void
prep_done(struct sched *s, struct gen *g)
{
	struct sched_job *job = g->job;
	enum proto_err pe = g->prep_pe;
	int n_ctx = engine_n_ctx(g->slot->e), rc = g->prep_rc;
	char *err = g->prep_err;

	g->state = GEN_RUNNING;
	if (g->cancelled || g->gone) {
		if (!g->gone)
			sched_post(s, sched_done_event(g));
		sched_gen_free(s, g);
		return;
	}
	if (job->req.op == OP_EMBED) {
		if (rc == 0)
			rc = sched_embed_start(g, &pe, err);
		if (rc != 0) {
			sched_post_error(s, job, pe, err);
			sched_gen_free(s, g);
		}
		return;
	}
	/* PROTOCOL.md: max_tokens is 1..context (the default may exceed a small context) */
	if (rc == 0 && (job->req.set & SET_MAX_TOKENS) && job->req.max_tokens > n_ctx) {
		snprintf(err, ERR_LEN, "max_tokens = %d is more than the context (%d)", (int)job->req.max_tokens, n_ctx);
		rc = ERR_RANGE, pe = PE_INVALID_PARAM;
	} else if (rc == 0 && (int64_t)g->n_ids + 1 > n_ctx) {
		snprintf(err, ERR_LEN, "the prompt has %zu tokens; the context holds %d", g->n_ids, n_ctx);
		rc = ERR_RANGE, pe = PE_CONTEXT_EXCEEDED;
	}
	if (rc == 0 && (rc = sched_start_seq(s, g, g->ids, g->n_ids, err)) != 0)
		pe = start_error(rc);
	free(g->ids);
	g->ids = NULL;
	if (rc != 0) {
		sched_post_error(s, job, rc == ERR_INVAL && strstr(err, "UTF-8") ? PE_INVALID_UTF8 : pe, err);
		sched_gen_free(s, g);
		return;
	}
	g->slot->prompt_tokens += (uint64_t)g->n_prompt;
}

/* What admitting a queued request did. */
enum admit_result { ADMIT_FAILED, ADMIT_RUNS, ADMIT_WAITS };

/*
 * Admits one queued request: it runs, or it failed (and is gone), or it
 * must wait for memory: it is then the one that the next admissions try
 * first, and none other goes before it.
 */
static enum admit_result
admit_one(struct sched *s, struct gen *g)
{
	int rc;

	if ((rc = admit(s, g)) == 0) {
		s->n_queued--;
		s->waiting = s->waiting == g ? NULL : s->waiting;
		return ADMIT_RUNS;
	}
	if (rc == SLOTS_WAIT) {
		s->waiting = g;
		s->retry = 0;
		return ADMIT_WAITS;
	}
	sched_gen_free(s, g);
	return ADMIT_FAILED;
}

/*
 * The sequences a request counts for at admission: n for n choices; an
 * embed one, since it starts its inputs a step's worth at a time.
 */
static int
gen_seqs(const struct gen *g)
{
	return g->job->req.op == OP_EMBED ? 1 : g->job->req.n_choices;
}

/* Sequences the admitted requests run, or will once their prompt is back: n for n choices. */
static int
running_seqs(const struct sched *s)
{
	const struct gen *g;
	int n = 0;

	for (g = s->gens; g != NULL; g = g->next)
		n += g->state != GEN_QUEUED ? gen_seqs(g) : 0;
	return n;
}

/*
 * 1 if a request's choices fit beside the running sequences under
 * max_seqs; a request of more choices than that runs alone.
 */
static int
fits(const struct sched *s, const struct gen *g, int running)
{
	return running == 0 || running + gen_seqs(g) <= (s->o.max_seqs > 0 ? s->o.max_seqs : 64);
}

/* The next queued request to admit: interactive first, the first of the next connection after rr_conn. */
static struct gen *
next_queued(const struct sched *s)
{
	struct gen *g, *best;
	int prio;

	for (prio = PRIO_INTERACTIVE; prio <= PRIO_BACKGROUND; prio++) {
		best = NULL;
		for (g = s->gens; g != NULL; g = g->next) {
			if (g->state != GEN_QUEUED || (int)g->job->req.priority != prio)
				continue;
			if (best == NULL || (g->job->conn > s->rr_conn && (best->job->conn <= s->rr_conn ||
			    g->job->conn < best->job->conn)))
				best = g;
		}
		if (best != NULL)
			return best;
	}
	return NULL;
}

/*
 * Whether admission can take a request now: the next one fits (while one
 * waits for memory, only that one, once a model has fallen out of use).
 */
int
sched_admit_ready(const struct sched *s)
{
	const struct gen *g = s->waiting != NULL ? s->waiting : next_queued(s);

	return g != NULL && (s->waiting == NULL || s->retry) && fits(s, g, running_seqs(s));
}

/*
 * Admits queued requests round-robin across connections while they fit;
 * the next one that does not fit is admitted first once room frees, and
 * none goes before it, so that a request of many choices is not starved.
 */
void
sched_admit_queued(struct sched *s)
{
	int running = running_seqs(s), n;
	enum admit_result rc;
	struct gen *g;

	if (s->waiting != NULL) {
		/* it can fit only once a model fell out of use (slots_load unloads idle ones): no slots_load, which
		 * opens the model, until then */
		if (!sched_admit_ready(s))
			return;
		n = gen_seqs(s->waiting);
		if ((rc = admit_one(s, s->waiting)) == ADMIT_WAITS)
			return;
		running += rc == ADMIT_RUNS ? n : 0;
	}
	while ((g = next_queued(s)) != NULL && fits(s, g, running)) {
		s->rr_conn = g->job->conn;
		n = gen_seqs(g);
		if ((rc = admit_one(s, g)) == ADMIT_WAITS)
			return;
		running += rc == ADMIT_RUNS ? n : 0;
	}
}

/* ---- tokenize, detokenize (on the prompt worker) ---- */

/* tokenize's result: arg is the model's description. */
static void
fill_tokens(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct model_desc *md = arg;
	int32_t *ids = NULL;
	size_t n = 0, i;
	int bos = job->req.bos >= 0 ? job->req.bos : tok_add_bos(md->tok);

	tok_encode(md->tok, job->req.text, strlen(job->req.text), job->req.special, bos, &ids, &n, NULL);
	proto_pack_str(pk, "tokens");
	msgpack_pack_array(pk, (uint32_t)n);
	for (i = 0; i < n; i++)
		msgpack_pack_uint32(pk, (uint32_t)ids[i]);
	free(ids);
}

/* detokenize's result: arg is the model's description. */
static void
fill_text(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct model_desc *md = arg;
	char *text = NULL;
	size_t len = 0;

	tok_decode(md->tok, job->req.tokens, job->req.n_tokens, job->req.special, &text, &len, NULL);
	proto_pack_str(pk, "text");
	msgpack_pack_str(pk, len);
	msgpack_pack_str_body(pk, text ? text : "", len);
	free(text);
}

/*
 * A tokenize or detokenize runs on the prompt worker: a megabyte of text
 * takes ~0.2 s, which on the engine thread would stop every stream. Its
 * model is held (a user of the slot) until it is back.
 */
struct tok_work {
	struct work work;           /* first: the worker's item */
	struct sched *s;
	struct sched_job *job;
	struct slot *m;
	const struct model_desc *md;
};

/* On the worker: the result, posted from there. */
static void
tok_run(struct work *w)
{
	struct tok_work *t = (struct tok_work *)w;

	sched_post_result(t->s, t->job, 1, t->job->req.op == OP_DETOKENIZE ? fill_text : fill_tokens, t->md, NULL);
}

/* Back on the engine thread: the model is free again. */
static void
tok_done(struct sched *s, struct tok_work *t)
{
	sched_release_slot(s, t->m, t->m->keep_alive);
	sched_job_free(t->job);
	free(t);
}

/*
 * tokenize / detokenize: checked here so that fill_* cannot fail. Returns
 * 1 when the job went to the worker (which owns it then), 0 when it is
 * answered.
 */
int
sched_op_tokens(struct sched *s, struct sched_job *job)
{
	struct slot *m = sched_job_model(s, job, job->req.model);
	const struct model_desc *md;
	struct tok_work *t;
	size_t i;

	if (m == NULL || sched_load_now(s, job, m, 0) != 0)
		return 0;
	md = engine_model(m->e);
	for (i = 0; job->req.op == OP_DETOKENIZE && i < job->req.n_tokens; i++)
		if (job->req.tokens[i] >= md->hp.n_vocab) {
			sched_post_error(s, job, PE_INVALID_PARAM, "a token id is outside the vocabulary");
			return 0;
		}
	t = xcalloc(1, sizeof *t);
	t->work.fn = tok_run;
	t->work.owner = m;
	t->work.key = job->conn;
	t->s = s;
	t->job = job;
	t->m = m;
	t->md = md;
	slots_acquire(&s->slots, m);
	worker_submit(&s->prep, &t->work);
	return 1;
}

/* ---- back from the prompt worker ---- */

/* Takes back a list of the worker's finished items: prompts, and tokenize / detokenize. */
void
sched_take_prep(struct sched *s, struct work *w)
{
	struct work *next;

	for (; w != NULL; w = next) {
		next = w->next;
		if (w->fn == tok_run)
			tok_done(s, (struct tok_work *)w);
		else
			prep_done(s, (struct gen *)w);
	}
}
