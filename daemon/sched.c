/*
 * sched.c: the engine thread. It takes jobs from the loop thread, keeps the
 * models (slots.h: loaded on demand within one memory budget) and the
 * sessions' sequences, and runs forward steps that batch every running
 * request of a model together.
 *
 * A generate request moves through:
 *
 *   GEN_QUEUED --admit()--> GEN_PREP --(prompt back)--> GEN_RUNNING --(done)--> freed
 *       |      (model loaded,  (the worker renders        (its sequence: SEQ_LOAD while
 *       |       or SLOTS_WAIT)  and tokenizes it)          its KV comes from disk, then
 *       |                                                  PREFILL, DECODE, DONE)
 *       +--cancel/gone at any point: finished at the next chance
 *
 * admit() takes requests round-robin across connections, interactive ones
 * first, while fewer than max_seqs run; one that must wait for memory
 * (SLOTS_WAIT) goes first when memory frees. Each step puts the decoding
 * sequences first (one token each) and then prefill chunks that the pacer
 * (pace.h) sizes so that a long prompt slows the streams beside it by
 * about half and never stalls them. Finished sessions keep their sequence
 * parked; its blocks stay in the prefix cache (kv.h) until the pool needs
 * them, then go to the host tier, and each turn's KV is written to disk.
 * A backend failure reloads the model (model_fault).
 */
#include "config.h"
#include "sched.h"
#include "engine.h"
#include "log.h"
#include "kvdisk.h"
#include "kvhost.h"
#include "model.h"
#include "slots.h"
#include "store.h"
#include "tokenizer.h"
#include "util.h"
#include "worker.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum gen_state { GEN_QUEUED, GEN_PREP, GEN_RUNNING };

/* A generate request inside the scheduler. */
struct gen {
	struct work prep;           /* first, so that the worker's item is the gen (prep_run) */
	struct sched_job *job;
	enum gen_state state;
	struct slot *slot;          /* its model, once admitted (it is then one of its users) */
	struct seq *seq;
	struct resident *res;       /* the session's cached sequence, while running */
	int cancelled, gone;
	int32_t n_prompt;
	uint64_t t_first;           /* first token */
	/* GEN_PREP: the worker renders and tokenizes the prompt with the model's description */
	const struct model_desc *md;
	int32_t *ids;
	size_t n_ids;
	int prep_rc;
	enum proto_err prep_pe;
	char prep_err[ERR_LEN];
	struct gen *next;
};

/* A session's sequence kept between turns (parked: engine_seq_park). */
struct resident {
	char uuid[37];
	struct seq *seq;
	int busy;
	int dropped;                /* the session was deleted while it ran: freed when done */
	uint64_t last_used;
	struct resident *next;
};

enum ctl_type { CTL_CANCEL, CTL_GONE, CTL_DROP, CTL_FORK };

struct sched;
static struct sched_event *done_event(struct gen *g);
static void gen_free(struct sched *s, struct gen *g);

struct ctl {
	enum ctl_type type;
	uint64_t conn, req_id, cancel_id;
	char a[37], b[37];
	struct ctl *next;
};

struct sched {
	struct sched_opts o;
	char *device;
	pthread_t thread;
	int running;                          /* the thread was started and not joined */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stopping;
	struct sched_job *jobs, **jobs_tail;   /* in, from the loop thread */
	struct ctl *ctls, **ctls_tail;
	struct sched_event *events, **events_tail; /* out */
	void (*wake)(void *);
	void *wake_arg;
	int io_ready;                         /* the disk tier or the worker has finished something */
	struct kvdisk *disk;                  /* NULL when --kv-disk is 0 */
	/* engine thread only */
	struct kvhost host;
	struct worker prep;                   /* prompts are tokenized there (worker.h) */
	struct slots slots;
	int slots_on;                         /* slots_init was done */
	struct slot *default_model;
	struct gen *gens;                     /* queued and running, in arrival order */
	struct gen *waiting;                  /* queued until models in use give back memory */
	int retry;                            /* a model fell out of use since waiting was last tried */
	int n_queued;
	uint64_t rr_conn;                     /* round-robin position */
	uint64_t tick;
	uint64_t t_start;
	uint64_t steps, step_tokens, step_seqs;
	int max_batch;
};

/* ---- events ---- */

/*
 * Queues a chain of events (first, ..., the one whose next is *last_next)
 * for the loop thread and wakes it once: a step's 64 tokens are one
 * wake-up, not 64 (each takes the loop's lock and may write its notify fd,
 * between two steps).
 */
static void
post_chain(struct sched *s, struct sched_event *first, struct sched_event **last_next)
{
	if (first == NULL)
		return;
	pthread_mutex_lock(&s->mu);
	*s->events_tail = first;
	s->events_tail = last_next;
	pthread_mutex_unlock(&s->mu);
	s->wake(s->wake_arg);
}

/* Links ev at *tail of a chain being built for post_chain; returns the chain's new tail. */
static struct sched_event **
chain(struct sched_event **tail, struct sched_event *ev)
{
	*tail = ev;
	return &ev->next;
}

/* Queues an event for the loop thread and wakes it. */
static void
post(struct sched *s, struct sched_event *ev)
{
	ev->next = NULL;
	post_chain(s, ev, &ev->next);
}

/* A new event for a request; the caller packs the frame. */
static struct sched_event *
new_event(uint64_t conn, uint64_t req_id, int last)
{
	struct sched_event *ev = xcalloc(1, sizeof *ev);

	ev->conn = conn;
	ev->req_id = req_id;
	ev->last = last;
	return ev;
}

/* Posts an error reply that ends a job's request. */
static void
post_error(struct sched *s, const struct sched_job *job, enum proto_err code, const char *msg)
{
	struct sched_event *ev = new_event(job->conn, job->req.id, 1);

	proto_error(&ev->frame, 1, job->req.id, code, msg);
	post(s, ev);
}

/* Packs the n_fields fields of a result; arg is post_result's. */
typedef void fill_fn(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg);

/* Posts a result whose map was packed by fill. */
static void
post_result(struct sched *s, const struct sched_job *job, size_t n_fields, fill_fn *fill, const void *arg,
    const char *extra_model)
{
	struct sched_event *ev = new_event(job->conn, job->req.id, 1);
	msgpack_packer pk;

	proto_reply_begin(&ev->frame, &pk, 1, job->req.id, "result", n_fields);
	if (fill != NULL)
		fill(s, job, &pk, arg);
	proto_reply_end(&ev->frame);
	if (extra_model != NULL)
		ev->model_loaded = xstrdup(extra_model);
	post(s, ev);
}

struct sched_event *
sched_take_events(struct sched *s)
{
	struct sched_event *ev;

	pthread_mutex_lock(&s->mu);
	ev = s->events;
	s->events = NULL;
	s->events_tail = &s->events;
	pthread_mutex_unlock(&s->mu);
	return ev;
}

void
sched_event_free(struct sched_event *ev)
{
	msgpack_sbuffer_destroy(&ev->frame);
	store_turns_free(ev->turns, ev->n_turns);
	free(ev->model_loaded);
	free(ev);
}

void
sched_job_free(struct sched_job *job)
{
	int i;

	proto_req_free(&job->req);
	for (i = 0; i < job->n_history; i++)
		free(job->history[i].role), free(job->history[i].content);
	free(job->history);
	free(job->history_ids);
	free(job->session_system);
	free(job->session_model);
	free(job->clients);
	free(job);
}

/* ---- models ---- */

/* The model of a name or path (slots_find), or the default one for NULL. Returns 0 or an ERR_* code. */
static int
find_model(struct sched *s, const char *name_or_path, struct slot **out, char *err)
{
	if (name_or_path != NULL)
		return slots_find(&s->slots, name_or_path, out, err);
	if ((*out = s->default_model) == NULL)
		return err_set(err, ERR_NOTFOUND, "no model is configured (start residentd with -m MODEL)");
	return 0;
}

/* find_model for a request: NULL once the not_found error is posted. */
static struct slot *
job_model(struct sched *s, const struct sched_job *job, const char *name_or_path)
{
	char err[ERR_LEN];
	struct slot *m;

	if (find_model(s, name_or_path, &m, err) != 0)
		post_error(s, job, PE_NOT_FOUND, err);
	return m;
}

/* Unlinks a session's cached sequence and frees it. */
static void
free_resident(struct slot *m, struct resident *r)
{
	struct resident **pp;

	for (pp = &m->residents; *pp != r; pp = &(*pp)->next)
		;
	*pp = r->next;
	engine_seq_free(m->e, r->seq);
	free(r);
}

/* slots' unloading hook: frees the parked sessions of a model. */
static void
drop_residents(void *arg, struct slot *m)
{
	while (m->residents != NULL)
		free_resident(m, m->residents);
}

/* A progress reply of a request whose model is loading. */
static void
post_progress(struct sched *s, const struct sched_job *job, uint64_t done, uint64_t total)
{
	struct sched_event *ev = new_event(job->conn, job->req.id, 0);
	msgpack_packer pk;

	proto_reply_begin(&ev->frame, &pk, 1, job->req.id, "progress", 2);
	proto_pack_kv_uint(&pk, "done", done);
	proto_pack_kv_uint(&pk, "total", total);
	proto_reply_end(&ev->frame);
	post(s, ev);
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
static int
load_now(struct sched *s, const struct sched_job *job, struct slot *m, int progress)
{
	struct job_progress p = { s, job };
	char err[ERR_LEN];
	int rc = slots_load(&s->slots, m, progress ? job_progress_cb : NULL, &p, err);

	if (rc == SLOTS_WAIT)
		post_error(s, job, PE_OVERLOADED, "the device memory budget is held by models in use; try "
		    "again when their requests have ended");
	else if (rc != 0)
		post_error(s, job, PE_MODEL_ERROR, err);
	return rc == 0 ? 0 : -1;
}

/* The keep-alive a request leaves its model with. */
static double
job_keep_alive(const struct sched *s, const struct sched_job *job)
{
	return job->req.set & SET_KEEP_ALIVE ? job->req.keep_alive : s->o.keep_alive;
}

/* ---- admission ---- */

/* The chat history plus this turn's messages, with the session's system prompt first. */
static struct chat_msg *
conversation(const struct sched_job *job, size_t *n)
{
	const struct proto_req *r = &job->req;
	size_t i, k = 0, total = (size_t)job->n_history + (size_t)r->n_msgs + 1;
	struct chat_msg *m = xcalloc(total, sizeof *m);
	int has_system = (job->n_history > 0 && strcmp(job->history[0].role, "system") == 0) ||
	    (job->n_history == 0 && r->n_msgs > 0 && strcmp(r->msgs[0].role, "system") == 0);

	if (job->session_system != NULL && job->session_system[0] != '\0' && !has_system)
		m[k++] = (struct chat_msg){ "system", job->session_system };
	for (i = 0; i < (size_t)job->n_history; i++)
		m[k++] = (struct chat_msg){ job->history[i].role, job->history[i].content };
	for (i = 0; i < (size_t)r->n_msgs; i++)
		m[k++] = (struct chat_msg){ r->msgs[i].role, r->msgs[i].content };
	*n = k;
	return m;
}

/* Renders messages [0, n) through the model's template into a malloc'd string. */
static int
render(const struct model_desc *md, const struct chat_msg *m, size_t n, int gen, char **text, size_t *len,
    char *err)
{
	return chat_render(md->chat, m, n, gen, tok_piece(md->tok, tok_bos(md->tok)), text, len, err);
}

/*
 * A session's prompt: its stored token ids, then the tokens of the text the
 * template adds for this turn's messages. So a resumed session sees exactly
 * the tokens it saw (and generated) before, whether its KV cache survived or
 * is rebuilt after a restart. Where the template does not simply append
 * (Mistral moves the system prompt to the last user turn), the whole
 * conversation is rendered again instead.
 */
static int
session_tokens(const struct model_desc *md, const struct sched_job *job, const struct chat_msg *m,
    size_t n_msgs, size_t n_prev, int32_t **ids, size_t *n, char *err)
{
	char *all = NULL, *prev = NULL;
	size_t all_len, prev_len, n_new = 0;
	int32_t *new_ids = NULL;
	int rc;

	if ((rc = render(md, m, n_msgs, 1, &all, &all_len, err)) != 0)
		return rc;
	if (job->history_tokens > 0 && render(md, m, n_prev, 0, &prev, &prev_len, err) == 0 &&
	    prev_len <= all_len && memcmp(prev, all, prev_len) == 0) {
		rc = tok_encode(md->tok, all + prev_len, all_len - prev_len, 1, 0, &new_ids, &n_new, err);
		if (rc == 0) {
			*n = (size_t)job->history_tokens + n_new;
			*ids = xmalloc(*n * sizeof **ids);
			memcpy(*ids, job->history_ids, (size_t)job->history_tokens * sizeof **ids);
			memcpy(*ids + job->history_tokens, new_ids, n_new * sizeof **ids);
		}
	} else {
		rc = tok_encode(md->tok, all, all_len, 1, 0, ids, n, err);
	}
	free(all), free(prev), free(new_ids);
	return rc;
}

/* The prompt's tokens: raw text, or the conversation through the chat template. */
static int
prompt_tokens(const struct model_desc *md, const struct sched_job *job, int32_t **ids, size_t *n,
    enum proto_err *pe, char *err)
{
	struct chat_msg *msgs;
	size_t n_msgs;
	int rc;

	*pe = PE_INVALID_PARAM;
	if (job->req.prompt != NULL)
		return tok_encode(md->tok, job->req.prompt, strlen(job->req.prompt), 0, tok_add_bos(md->tok),
		    ids, n, err);
	if (md->chat_error != NULL)
		return err_set(err, ERR_UNSUPPORTED, "%s", md->chat_error);
	if (md->chat == CHAT_RAW)
		return err_set(err, ERR_UNSUPPORTED, "model %s has no chat template: send a raw 'prompt'", md->name);
	msgs = conversation(job, &n_msgs);
	rc = session_tokens(md, job, msgs, n_msgs, n_msgs - (size_t)job->req.n_msgs, ids, n, err);
	free(msgs);
	return rc;
}

/*
 * The template's text after a reply (Gemma's "<end_of_turn>\n"), as tokens,
 * so that a session's stored history is what the template would render.
 * An end-of-turn token the model generated itself is not repeated.
 */
static void
closing_tokens(const struct model_desc *md, const struct sched_job *job, const struct seq *q,
    int32_t **ids, size_t *n)
{
	struct chat_msg *m, *m2;
	size_t n_msgs, a_len, b_len, skip = 0;
	char *a = NULL, *b = NULL;
	const char *last;

	*ids = NULL, *n = 0;
	m = conversation(job, &n_msgs);
	m2 = xcalloc(n_msgs + 1, sizeof *m2);
	memcpy(m2, m, n_msgs * sizeof *m);
	m2[n_msgs] = (struct chat_msg){ "assistant", q->text };
	if (render(md, m, n_msgs, 1, &b, &b_len, NULL) == 0 && render(md, m2, n_msgs + 1, 0, &a, &a_len, NULL) == 0 &&
	    a_len >= b_len + q->text_len && memcmp(a, b, b_len) == 0 && memcmp(a + b_len, q->text, q->text_len) == 0) {
		last = q->n_tokens > 0 && tok_is_eog(md->tok, q->tokens[q->n_tokens - 1]) ?
		    tok_piece(md->tok, q->tokens[q->n_tokens - 1]) : NULL;
		if (last != NULL && strncmp(a + b_len + q->text_len, last, strlen(last)) == 0)
			skip = strlen(last);
		if (a_len > b_len + q->text_len + skip)
			tok_encode(md->tok, a + b_len + q->text_len + skip, a_len - b_len - q->text_len - skip, 1, 0,
			    ids, n, NULL);
	}
	free(a), free(b), free(m), free(m2);
}

/*
 * The sequence parameters of a job. Its prefix-cache namespace is its
 * user's, unless the daemon shares the cache between users.
 */
static void
job_params(const struct sched *s, const struct sched_job *job, struct seq_params *p)
{
	memset(p, 0, sizeof *p);
	p->cache = 1;
	p->cache_ns = s->o.kv_share_users ? 0 : (uint64_t)job->uid + 1;
	p->sample = job->req.sample;
	p->max_tokens = job->req.max_tokens;
	p->stop = (const char *const *)job->req.stop;
	p->n_stop = job->req.n_stop;
	p->logprobs = job->req.logprobs;
}

/* The cached sequence of a session on a model, or NULL. */
static struct resident *
find_resident(struct slot *m, const char *uuid)
{
	struct resident *r;

	for (r = m->residents; r != NULL; r = r->next)
		if (strcmp(r->uuid, uuid) == 0)
			return r;
	return NULL;
}

/* Creates or reuses the sequence of a generate request. */
static int
start_seq(struct sched *s, struct gen *g, const int32_t *ids, size_t n, char *err)
{
	struct seq_params p;
	struct resident *r = NULL;
	int rc;

	job_params(s, g->job, &p);
	if (g->job->req.session != NULL && (r = find_resident(g->slot, g->job->req.session)) != NULL) {
		if (r->busy)
			return err_set(err, ERR_BUSY, "session %s has a turn generating already", r->uuid);
		if ((rc = engine_seq_reuse(g->slot->e, r->seq, ids, (int32_t)n, &p, err)) < 0)
			return rc;
		g->seq = r->seq;
	} else {
		if ((rc = engine_seq_new(g->slot->e, ids, (int32_t)n, &p, &g->seq, err)) != 0)
			return rc;
		if (g->job->req.session != NULL) {
			r = xcalloc(1, sizeof *r);
			snprintf(r->uuid, sizeof r->uuid, "%s", g->job->req.session);
			r->seq = g->seq;
			r->next = g->slot->residents;
			g->slot->residents = r;
		}
	}
	if (r != NULL) {
		r->busy = 1;
		r->last_used = ++s->tick;
		/* what the caches lack of the stored history may be on disk */
		engine_seq_load(g->slot->e, r->seq, r->uuid, g->job->history_tokens);
	}
	g->res = r;
	g->n_prompt = (int32_t)n;
	return 0;
}

/* On the worker: the prompt's tokens (the engine thread waits for them in GEN_PREP). */
static void
prep_run(struct work *w)
{
	struct gen *g = (struct gen *)w;

	g->prep_err[0] = '\0';
	g->prep_rc = prompt_tokens(g->md, g->job, &g->ids, &g->n_ids, &g->prep_pe, g->prep_err);
}

/*
 * Admits a queued generate: its model is loaded and the prompt goes to the
 * worker (GEN_PREP). 0, or -1 when it failed (the error is sent), or
 * SLOTS_WAIT when its model cannot be loaded until models in use give back
 * memory (it stays queued).
 */
static int
admit(struct sched *s, struct gen *g)
{
	struct sched_job *job = g->job;
	const char *want = job->req.model ? job->req.model : job->session_model;
	char err[ERR_LEN];
	struct slot *m;
	int rc;

	if ((m = job_model(s, job, want)) == NULL)
		return -1;
	if ((rc = load_model(s, job, m, err)) != 0) {
		if (rc != SLOTS_WAIT)
			post_error(s, job, PE_MODEL_ERROR, err);
		return rc == SLOTS_WAIT ? SLOTS_WAIT : -1;
	}
	slots_acquire(&s->slots, m);
	g->slot = m;
	g->md = engine_model(m->e);
	g->prep.fn = prep_run;
	g->prep.owner = m;
	g->prep.key = job->conn;
	g->state = GEN_PREP;
	worker_submit(&s->prep, &g->prep);
	return 0;
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
			post(s, done_event(g));
		gen_free(s, g);
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
	if (rc == 0 && (rc = start_seq(s, g, g->ids, g->n_ids, err)) != 0)
		pe = rc == ERR_RANGE ? PE_CONTEXT_EXCEEDED : rc == ERR_BUSY ? PE_SESSION_BUSY : PE_INVALID_PARAM;
	free(g->ids);
	g->ids = NULL;
	if (rc != 0) {
		post_error(s, job, rc == ERR_INVAL && strstr(err, "UTF-8") ? PE_INVALID_UTF8 : pe, err);
		gen_free(s, g);
	}
}

struct tok_work;
static void tok_run(struct work *w);
static void tok_done(struct sched *s, struct tok_work *t);

/* Takes back a list of the worker's finished items: prompts, and tokenize / detokenize. */
static void
take_prep(struct sched *s, struct work *w)
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

/* ---- running ---- */

/* A token reply. */
static struct sched_event *
token_event(struct gen *g)
{
	struct sched_event *ev = new_event(g->job->conn, g->job->req.id, 0);
	msgpack_packer pk;

	proto_reply_begin(&ev->frame, &pk, 1, g->job->req.id, "token", g->job->req.logprobs ? 3 : 2);
	proto_pack_str(&pk, "text");
	msgpack_pack_str(&pk, g->seq->piece_len);
	msgpack_pack_str_body(&pk, g->seq->piece, g->seq->piece_len);
	proto_pack_kv_uint(&pk, "token", (uint64_t)g->seq->new_token);
	if (g->job->req.logprobs)
		proto_pack_kv_float(&pk, "logprob", g->seq->new_logprob);
	proto_reply_end(&ev->frame);
	return ev;
}

/*
 * The rows of a finished session turn: the new messages (the prompt tokens
 * this turn added are accounted to the first) and the reply (generated
 * tokens and the template's closing tokens, which the cached sequence also
 * takes, so it stays equal to the stored history).
 */
static void
turn_rows(struct gen *g, struct sched_event *ev)
{
	const struct proto_req *r = &g->job->req;
	struct seq *q = g->seq;
	struct store_turn *t = xcalloc((size_t)r->n_msgs + 1, sizeof *t);
	int32_t *close_ids, n_gen = q->n_tokens - g->n_prompt;
	size_t n_close;
	int i;

	closing_tokens(engine_model(g->slot->e), g->job, q, &close_ids, &n_close);
	for (i = 0; i < r->n_msgs; i++) {
		t[i].role = xstrdup(r->msgs[i].role);
		t[i].content = xstrdup(r->msgs[i].content);
	}
	t[0].n_tokens = MAX(0, g->n_prompt - g->job->history_tokens);
	t[0].tokens = xmalloc((size_t)MAX(t[0].n_tokens, 1) * sizeof(int32_t));
	memcpy(t[0].tokens, q->tokens + g->n_prompt - t[0].n_tokens, (size_t)t[0].n_tokens * sizeof(int32_t));
	t[i].role = xstrdup("assistant");
	t[i].content = xstrndup(q->text, q->text_len);
	t[i].n_tokens = n_gen + (int32_t)n_close;
	t[i].tokens = xmalloc((size_t)MAX(t[i].n_tokens, 1) * sizeof(int32_t));
	memcpy(t[i].tokens, q->tokens + g->n_prompt, (size_t)n_gen * sizeof(int32_t));
	if (n_close > 0) {
		memcpy(t[i].tokens + n_gen, close_ids, n_close * sizeof(int32_t));
		if (g->res != NULL)
			engine_seq_append(q, close_ids, (int32_t)n_close);
	}
	free(close_ids);
	ev->turns = t;
	ev->n_turns = r->n_msgs + 1;
	ev->after = g->job->n_history;
	snprintf(ev->session, sizeof ev->session, "%s", r->session);
	ev->uid = g->job->uid;
}

/*
 * The done reply (with the rows to commit for a completed session turn).
 * A request cancelled while queued has no sequence yet.
 */
static struct sched_event *
done_event(struct gen *g)
{
	static const struct seq none = { .state = SEQ_DONE, .finish = FINISH_CANCEL, .text = "" };
	const struct seq *q = g->seq ? g->seq : &none;
	struct sched_event *ev = new_event(g->job->conn, g->job->req.id, 1);
	uint64_t now = now_ns();
	double gen_s = g->t_first ? (double)(now - g->t_first) / 1e9 : 0;
	int with_text = !g->job->req.stream, with_session = g->job->req.session != NULL;
	msgpack_packer pk;

	if (q->finish == FINISH_ERROR) {
		proto_error(&ev->frame, 1, g->job->req.id, PE_MODEL_ERROR, q->error);
		return ev;
	}
	proto_reply_begin(&ev->frame, &pk, 1, g->job->req.id, "done", 2 + with_text + with_session);
	proto_pack_kv_str(&pk, "finish", engine_finish_name(q->finish));
	proto_pack_str(&pk, "usage");
	msgpack_pack_map(&pk, 5);
	proto_pack_kv_uint(&pk, "prompt_tokens", (uint64_t)g->n_prompt);
	proto_pack_kv_uint(&pk, "cached_tokens", (uint64_t)q->n_hit);
	proto_pack_kv_uint(&pk, "generated_tokens", (uint64_t)q->n_generated);
	proto_pack_kv_float(&pk, "ttft_ms", g->t_first ? (double)(g->t_first - g->job->t_submit) / 1e6 : 0);
	proto_pack_kv_float(&pk, "tokens_per_s", gen_s > 0 ? (q->n_generated - 1) / gen_s : 0);
	if (with_text) {
		proto_pack_str(&pk, "text");
		msgpack_pack_str(&pk, q->text_len);
		msgpack_pack_str_body(&pk, q->text, q->text_len);
	}
	if (with_session)
		proto_pack_kv_str(&pk, "session", g->job->req.session);
	proto_reply_end(&ev->frame);
	if (with_session && q->finish != FINISH_CANCEL)
		turn_rows(g, ev);
	return ev;
}

/* A request is done with its model; a generate waiting for memory may be admitted once nobody uses it. */
static void
release_slot(struct sched *s, struct slot *m, double keep_alive)
{
	slots_release(&s->slots, m, keep_alive);
	s->retry |= m->users == 0;
}

/* Unlinks a gen and frees it; a session keeps its sequence. */
static void
gen_free(struct sched *s, struct gen *g)
{
	struct gen **pp;

	for (pp = &s->gens; *pp != g; pp = &(*pp)->next)
		;
	*pp = g->next;
	if (g->state == GEN_QUEUED)
		s->n_queued--;
	if (s->waiting == g)
		s->waiting = NULL;
	if (g->res != NULL && g->res->dropped) {
		free_resident(g->slot, g->res);
	} else if (g->res != NULL) {
		if (g->seq->finish == FINISH_STOP || g->seq->finish == FINISH_LENGTH || g->seq->finish == FINISH_CONTEXT)
			engine_seq_save(g->slot->e, g->seq, g->res->uuid);
		engine_seq_park(g->slot->e, g->seq);
		g->res->busy = 0;
		g->res->last_used = ++s->tick;
	} else if (g->seq != NULL) {
		engine_seq_free(g->slot->e, g->seq);
	}
	if (g->slot != NULL)
		release_slot(s, g->slot, job_keep_alive(s, g->job));
	free(g->ids);  /* a prompt cancelled while the worker tokenized it */
	sched_job_free(g->job);
	free(g);
}

/* Evicts idle cached sessions (least recently used first) until `need` blocks are free. */
static void
make_room(struct slot *m, int32_t need)
{
	struct resident *r, *lru;

	while (engine_free_blocks(m->e) < need) {
		lru = NULL;
		for (r = m->residents; r != NULL; r = r->next)
			if (!r->busy && (lru == NULL || r->last_used < lru->last_used))
				lru = r;
		if (lru == NULL)
			return;
		free_resident(m, lru);
	}
}

/*
 * The sequences of one model for the next step: decoding ones first, then
 * prefilling ones, interactive before background, each group starting
 * after the connection served first last time.
 */
static int
pick(struct sched *s, struct slot *m, struct seq **out, struct gen **gens, int max)
{
	int n = 0, pass, prio;
	struct gen *g;
	int32_t need = 0;

	for (pass = 0; pass < 2; pass++)
		for (prio = PRIO_INTERACTIVE; prio <= PRIO_BACKGROUND; prio++)
			for (g = s->gens; g != NULL && n < max; g = g->next) {
				if (g->state != GEN_RUNNING || g->slot != m || (int)g->job->req.priority != prio ||
				    g->seq->state == SEQ_LOAD || g->seq->wait_io ||
				    (g->seq->state == SEQ_DECODE) != (pass == 0))
					continue;
				gens[n] = g;
				out[n++] = g->seq;
				need += (g->seq->n_tokens - g->seq->n_cached + 15) / 16 + 1;
			}
	make_room(m, need);
	return n;
}

/* Finishes the sequences whose request was cancelled or whose client left. */
static void
reap_cancelled(struct sched *s)
{
	struct gen *g, *next;

	for (g = s->gens; g != NULL; g = next) {
		next = g->next;
		if ((!g->cancelled && !g->gone) || g->state == GEN_PREP)  /* that one when its prompt is back */
			continue;
		if (g->state == GEN_RUNNING && g->seq->state != SEQ_DONE)
			engine_seq_finish(g->seq, FINISH_CANCEL);
		if (!g->gone)
			post(s, done_event(g));
		gen_free(s, g);
	}
}

/*
 * Ends the requests running on m (finish why; error, if not NULL, is their
 * message) and unloads it, dropping its sessions' cached sequences. The
 * worker may be reading the model for a prompt: its items for m (the
 * prompts and tokenizes of this model, not of others) are drained first.
 * Returns the requests ended.
 */
static int
unload_model(struct sched *s, struct slot *m, enum finish_reason why, const char *error)
{
	struct gen *g, *next;
	int n = 0;

	take_prep(s, worker_drain(&s->prep, m));
	for (g = s->gens; g != NULL; g = next) {
		next = g->next;
		if (g->slot != m || g->state != GEN_RUNNING)
			continue;
		if (error != NULL)
			snprintf(g->seq->error, sizeof g->seq->error, "%s", error);
		engine_seq_finish(g->seq, why);
		if (!g->gone)
			post(s, done_event(g));
		gen_free(s, g);
		n++;
	}
	slots_unload(&s->slots, m);
	return n;
}

/*
 * The backend failed a step of model m (a GPU fault; the step's requests
 * got its error already). What it holds on the device is not to be trusted:
 * the model's other running requests end with the error too, its cached
 * sessions are dropped (a next turn rebuilds them from the store), and it
 * is loaded again, on the CPU under SCHED_FAULT_CPU. If that load fails the
 * model stays unloaded, to be loaded by its next request. Queued requests
 * wait and then run on the new engine.
 */
static void
model_fault(struct sched *s, struct slot *m, const char *what)
{
	char err[ERR_LEN], msg[ERR_LEN];

	m->faults++;
	log_error("model %s: %s; loading it again%s", m->name, what,
	    s->o.device_fault == SCHED_FAULT_CPU ? " on the CPU" : "");
	snprintf(msg, sizeof msg, "the model failed and was loaded again: %.200s", what);
	unload_model(s, m, FINISH_ERROR, msg);
	if (s->o.device_fault == SCHED_FAULT_CPU)
		m->device = "cpu";
	if (slots_load(&s->slots, m, NULL, NULL, err) < 0)
		log_error("model %s: loading it again: %s", m->name, err);
}

/* Runs one step of a model and sends what it produced. */
static void
step_model(struct sched *s, struct slot *m)
{
	int cap = engine_max_step_tokens(m->e), n, i, rc = 0, n_dec = 0, n_pre = 0;
	int32_t budget, dec_tokens;
	struct seq **seqs = xmalloc((size_t)cap * sizeof *seqs);
	struct gen **gens = xmalloc((size_t)cap * sizeof *gens);
	struct sched_event *out = NULL, **tail = &out;
	char err[ERR_LEN];
	uint64_t t0;

	n = pick(s, m, seqs, gens, MIN(cap, s->o.max_seqs > 0 ? s->o.max_seqs : 64));
	for (i = 0; i < n; i++) {
		n_dec += seqs[i]->state == SEQ_DECODE;
		n_pre += seqs[i]->state == SEQ_PREFILL;
	}
	/* a limited chunk fills the device's last tile of tokens: those cost about nothing more (pace.h) */
	dec_tokens = engine_step_tokens(m->e, n_dec);
	if ((budget = pace_budget(&m->pace, n_dec, dec_tokens, n_pre)) > 0)
		budget = MAX(budget, engine_step_tokens(m->e, n_dec + budget) - n_dec);
	t0 = now_ns();
	if (n > 0 && (rc = engine_step(m->e, seqs, n, budget, err)) >= 0) {
		double sec = (double)(now_ns() - t0) / 1e9;

		log_debug("step %s: %d decoding, %d prefilling, %d tokens, %.2f ms (chunk %d)",
		    m->name, n_dec, n_pre, rc, sec * 1e3, (int)m->pace.chunk);
		pace_done(&m->pace, n_dec, dec_tokens, n_pre, MAX(rc - n_dec, 0), sec, cap);
		s->steps++;
		s->step_tokens += (uint64_t)rc;
		s->step_seqs += (uint64_t)n;
		s->max_batch = MAX(s->max_batch, n);
	}
	for (i = 0; i < n; i++) {
		struct gen *g = gens[i];

		if (g->seq->new_token >= 0) {
			if (g->t_first == 0)
				g->t_first = now_ns();
			if (g->job->req.stream && (g->seq->piece_len > 0 || g->seq->state != SEQ_DONE))
				tail = chain(tail, token_event(g));
		}
		if (g->seq->state == SEQ_DONE) {
			tail = chain(tail, done_event(g));
			gen_free(s, g);
		}
	}
	post_chain(s, out, tail);
	free(seqs);
	free(gens);
	if (rc < 0)
		model_fault(s, m, err);
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
	gen_free(s, g);
	return ADMIT_FAILED;
}

/* Admits queued requests round-robin across connections while there is room. */
static void
admit_queued(struct sched *s)
{
	int running = 0, limit = s->o.max_seqs > 0 ? s->o.max_seqs : 64, prio, progress = 1;
	enum admit_result rc;
	struct gen *g, *best;

	for (g = s->gens; g != NULL; g = g->next)
		running += g->state != GEN_QUEUED;
	if (s->waiting != NULL) {
		/* it can fit only once a model fell out of use (slots_load unloads idle ones): no slots_load, which
		 * opens the model, until then */
		if (!s->retry || running >= limit)
			return;
		if ((rc = admit_one(s, s->waiting)) == ADMIT_WAITS)
			return;
		running += rc == ADMIT_RUNS;
	}
	while (running < limit && progress) {
		progress = 0;
		for (prio = PRIO_INTERACTIVE; prio <= PRIO_BACKGROUND && !progress; prio++) {
			/* the first queued request of the next connection after rr_conn */
			best = NULL;
			for (g = s->gens; g != NULL; g = g->next) {
				if (g->state != GEN_QUEUED || (int)g->job->req.priority != prio)
					continue;
				if (best == NULL || (g->job->conn > s->rr_conn && (best->job->conn <= s->rr_conn ||
				    g->job->conn < best->job->conn)))
					best = g;
			}
			if (best == NULL)
				continue;
			s->rr_conn = best->job->conn;
			progress = 1;
			if ((rc = admit_one(s, best)) == ADMIT_WAITS)
				return;
			running += rc == ADMIT_RUNS;
		}
	}
}

/* ---- the other ops ---- */

/*
 * Packs a model map with the fields of its description md (NULL: none), and
 * room for n_more fields that the caller packs after.
 */
static void
pack_model(struct sched *s, msgpack_packer *pk, const struct slot *m, const struct model_desc *md, size_t n_more)
{
	msgpack_pack_map(pk, (md ? 8 : 5) + n_more);
	proto_pack_kv_str(pk, "name", m->name);
	proto_pack_kv_str(pk, "path", m->path);
	proto_pack_kv_bool(pk, "loaded", m->e != NULL);
	proto_pack_kv_bool(pk, "default", m == s->default_model);
	proto_pack_kv_str(pk, "device", m->e ? engine_device(m->e) : "");
	if (md != NULL) {
		proto_pack_kv_str(pk, "arch", model_arch_name(md->arch));
		proto_pack_kv_uint(pk, "size", md->weight_bytes);
		proto_pack_kv_str(pk, "format", md->format == MODEL_SAFETENSORS ? "safetensors" : "gguf");
	}
}

static void
fill_model_list(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct slot *m;
	uint32_t n = 0;

	for (m = s->slots.list; m != NULL; m = m->next)
		n++;
	proto_pack_str(pk, "models");
	msgpack_pack_array(pk, n);
	for (m = s->slots.list; m != NULL; m = m->next)
		pack_model(s, pk, m, m->e ? engine_model(m->e) : NULL, 0);
}

/* A result's `model`: arg is the slot. */
static void
fill_model(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct slot *m = arg;

	proto_pack_str(pk, "model");
	pack_model(s, pk, m, m->e ? engine_model(m->e) : NULL, 0);
}

/* model.load: progress before and after the load, then the model. */
static void
op_model_load(struct sched *s, struct sched_job *job)
{
	struct slot *m = job_model(s, job, job->req.model);

	if (m == NULL)
		return;
	if (load_now(s, job, m, 1) != 0)
		return;
	post_result(s, job, 1, fill_model, m, strcmp(job->req.model, m->name) != 0 ? m->path : NULL);
}

/* What model.unload did. */
struct unloaded {
	const struct slot *m;
	int was_loaded;
	uint64_t cancelled;     /* requests that were running on it */
};

static void
fill_unloaded(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct unloaded *u = arg;

	fill_model(s, job, pk, u->m);
	proto_pack_kv_bool(pk, "unloaded", u->was_loaded);
	proto_pack_kv_uint(pk, "cancelled", u->cancelled);
}

/* model.unload: cancels what runs on it, drops its sessions' caches. */
static void
op_model_unload(struct sched *s, struct sched_job *job)
{
	struct slot *m = job_model(s, job, job->req.model);
	struct unloaded u = { m, m != NULL && m->e != NULL, 0 };

	if (m == NULL)
		return;
	u.cancelled = unload_model(s, m, FINISH_CANCEL, NULL);
	post_result(s, job, 3, fill_unloaded, &u, NULL);
}

/* A model.show of a slot, and the engine to describe it with (its own, or a prepared one). */
struct shown {
	const struct slot *m;
	const struct engine *e;
};

/* A model's tensor types: {type, tensors, bytes}, most bytes first. */
static void
pack_tensor_types(msgpack_packer *pk, const struct model_desc *md)
{
	struct model_type_use *uses;
	size_t i, n = model_tensor_types(md, &uses);

	proto_pack_str(pk, "tensor_types");
	msgpack_pack_array(pk, (uint32_t)n);
	for (i = 0; i < n; i++) {
		msgpack_pack_map(pk, 3);
		proto_pack_kv_str(pk, "type", uses[i].name);
		proto_pack_kv_uint(pk, "tensors", uses[i].tensors);
		proto_pack_kv_uint(pk, "bytes", uses[i].bytes);
	}
	free(uses);
}

/* model.show's `model`: the model map and what its description says. */
static void
fill_shown(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct shown *sh = arg;
	const struct model_desc *md = engine_model(sh->e);
	const struct model_hparams *hp = &md->hp;
	uint64_t need, want;

	engine_mem_need(sh->e, &need, &want);
	proto_pack_str(pk, "model");
	pack_model(s, pk, sh->m, md, 17);
	proto_pack_kv_uint(pk, "parameters", model_n_params(md));
	proto_pack_kv_str(pk, "quantization", model_quantization(md));
	pack_tensor_types(pk, md);
	proto_pack_kv_uint(pk, "context", (uint64_t)engine_n_ctx(sh->e));
	proto_pack_kv_uint(pk, "context_train", (uint64_t)hp->n_ctx_train);
	proto_pack_kv_str(pk, "template", chat_tmpl_name(md->chat));
	proto_pack_kv_str(pk, "template_error", md->chat_error ? md->chat_error : "");
	proto_pack_kv_uint(pk, "vocab", (uint64_t)hp->n_vocab);
	proto_pack_kv_uint(pk, "layers", (uint64_t)hp->n_layer);
	proto_pack_kv_uint(pk, "embedding", (uint64_t)hp->n_embd);
	proto_pack_kv_uint(pk, "heads", (uint64_t)hp->n_head);
	proto_pack_kv_uint(pk, "kv_heads", (uint64_t)hp->n_head_kv);
	proto_pack_kv_uint(pk, "head_dim", (uint64_t)hp->head_dim);
	proto_pack_kv_uint(pk, "feed_forward", (uint64_t)hp->n_ff);
	proto_pack_kv_uint(pk, "sliding_window", (uint64_t)hp->sliding_window);
	proto_pack_kv_uint(pk, "memory_bytes", sh->m->e ? engine_mem_bytes(sh->m->e) : 0);
	proto_pack_kv_uint(pk, "need_bytes", need);
}

/*
 * model.show: a model's description, from its engine when it is loaded,
 * else from its file, opened without loading the weights (a model_open:
 * 70 ms for Gemma 3 270M's 262,144-token vocabulary, as slots_load's own).
 */
static void
op_model_show(struct sched *s, struct sched_job *job)
{
	char err[ERR_LEN];
	struct slot *m = job_model(s, job, job->req.model);
	struct engine *e = NULL;
	struct shown sh;

	if (m == NULL)
		return;
	if (m->e == NULL && slots_prepare(&s->slots, m, &e, err) != 0) {
		post_error(s, job, PE_MODEL_ERROR, err);
		return;
	}
	sh.m = m;
	sh.e = m->e ? m->e : e;
	post_result(s, job, 1, fill_shown, &sh, NULL);
	if (e != NULL)
		engine_close(e);
}

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

	post_result(t->s, t->job, 1, t->job->req.op == OP_DETOKENIZE ? fill_text : fill_tokens, t->md, NULL);
}

/* Back on the engine thread: the model is free again. */
static void
tok_done(struct sched *s, struct tok_work *t)
{
	release_slot(s, t->m, t->m->keep_alive);
	sched_job_free(t->job);
	free(t);
}

/*
 * tokenize / detokenize: checked here so that fill_* cannot fail. Returns
 * 1 when the job went to the worker (which owns it then), 0 when it is
 * answered.
 */
static int
op_tokens(struct sched *s, struct sched_job *job)
{
	struct slot *m = job_model(s, job, job->req.model);
	const struct model_desc *md;
	struct tok_work *t;
	size_t i;

	if (m == NULL || load_now(s, job, m, 0) != 0)
		return 0;
	md = engine_model(m->e);
	for (i = 0; job->req.op == OP_DETOKENIZE && i < job->req.n_tokens; i++)
		if (job->req.tokens[i] >= md->hp.n_vocab) {
			post_error(s, job, PE_INVALID_PARAM, "a token id is outside the vocabulary");
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

/* status.kv: the KV bytes in each tier. */
static void
pack_kv_tiers(struct sched *s, msgpack_packer *pk, uint64_t device_bytes)
{
	uint64_t disk = 0, disk_budget = 0;

	if (s->disk != NULL)
		kvdisk_usage(s->disk, &disk, &disk_budget);
	proto_pack_str(pk, "kv");
	msgpack_pack_map(pk, 5);
	proto_pack_kv_uint(pk, "device_bytes", device_bytes);
	proto_pack_kv_uint(pk, "host_bytes", s->host.used);
	proto_pack_kv_uint(pk, "host_budget_bytes", s->host.budget);
	proto_pack_kv_uint(pk, "disk_bytes", disk);
	proto_pack_kv_uint(pk, "disk_budget_bytes", disk_budget);
}

/*
 * Whether a request is for model m: the one it runs on, or for a queued
 * request, the one it names (a name or a path; none: the default model).
 */
static int
gen_is_for(const struct sched *s, const struct gen *g, const struct slot *m)
{
	const char *want;

	if (g->slot != NULL)
		return g->slot == m;
	want = g->job->req.model ? g->job->req.model : g->job->session_model;
	if (want == NULL)
		return m == s->default_model;
	return strcmp(want, m->name) == 0 || strcmp(want, m->path) == 0;
}

static void
fill_status(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg)
{
	const struct slot *m;
	const struct gen *g;
	uint32_t n_models = 0, active = 0, queued = 0, ma, mq;
	struct engine_cache_stats cs;
	uint64_t device_bytes = 0;
	int i;

	for (m = s->slots.list; m != NULL; m = m->next)
		n_models++;
	for (g = s->gens; g != NULL; g = g->next)
		g->state != GEN_QUEUED ? active++ : queued++;
	proto_pack_kv_uint(pk, "version", PROTO_VERSION);
	proto_pack_kv_float(pk, "uptime_s", (double)(now_ns() - s->t_start) / 1e9);
	proto_pack_kv_uint(pk, "active", active);
	proto_pack_kv_uint(pk, "queued", queued);
	proto_pack_str(pk, "models");
	msgpack_pack_array(pk, n_models);
	for (m = s->slots.list; m != NULL; m = m->next) {
		for (ma = mq = 0, g = s->gens; g != NULL; g = g->next)
			if (gen_is_for(s, g, m))
				g->state != GEN_QUEUED ? ma++ : mq++;
		memset(&cs, 0, sizeof cs);
		if (m->e != NULL)
			engine_cache_stats(m->e, &cs);
		msgpack_pack_map(pk, 21);
		proto_pack_kv_str(pk, "name", m->name);
		proto_pack_kv_bool(pk, "loaded", m->e != NULL);
		proto_pack_kv_uint(pk, "faults", m->faults);
		proto_pack_kv_uint(pk, "memory_bytes", m->e ? engine_mem_bytes(m->e) : 0);
		proto_pack_kv_float(pk, "keep_alive_s", m->keep_alive);
		proto_pack_kv_float(pk, "expires_in_s", slots_expires_in(m));
		proto_pack_kv_uint(pk, "loads", m->loads);
		proto_pack_kv_uint(pk, "unloads", m->unloads);
		proto_pack_kv_str(pk, "device", m->e ? engine_device(m->e) : "");
		proto_pack_kv_bool(pk, "exact", m->e != NULL && engine_exact(m->e));
		proto_pack_kv_uint(pk, "weights_bytes", m->e ? engine_model(m->e)->weight_bytes : 0);
		proto_pack_kv_uint(pk, "kv_bytes", m->e ? engine_kv_bytes(m->e) : 0);
		proto_pack_kv_uint(pk, "kv_blocks", m->e ? (uint64_t)engine_kv_blocks(m->e) : 0);
		proto_pack_kv_uint(pk, "kv_free_blocks", m->e ? (uint64_t)engine_free_blocks(m->e) : 0);
		proto_pack_kv_uint(pk, "active", ma);
		proto_pack_kv_uint(pk, "queued", mq);
		proto_pack_kv_uint(pk, "cache_hit_tokens", cs.hit);
		proto_pack_kv_uint(pk, "cache_miss_tokens", cs.miss);
		proto_pack_kv_uint(pk, "cache_host_hit_tokens", cs.host_hit);
		proto_pack_kv_uint(pk, "cache_disk_hit_tokens", cs.disk_hit);
		proto_pack_kv_uint(pk, "kv_used_bytes", cs.used_bytes);
		device_bytes += cs.used_bytes;
	}
	pack_kv_tiers(s, pk, device_bytes);
	proto_pack_str(pk, "memory");
	msgpack_pack_map(pk, 4);
	proto_pack_kv_uint(pk, "budget_bytes", s->slots.o.budget);
	proto_pack_kv_uint(pk, "used_bytes", s->slots.used);
	proto_pack_kv_uint(pk, "loads", s->slots.loads);
	proto_pack_kv_uint(pk, "unloads", s->slots.unloads);
	proto_pack_str(pk, "clients");
	msgpack_pack_array(pk, (uint32_t)job->n_clients);
	for (i = 0; i < job->n_clients; i++) {
		msgpack_pack_map(pk, 4);
		proto_pack_kv_uint(pk, "pid", (uint64_t)job->clients[i].pid);
		proto_pack_kv_uint(pk, "uid", job->clients[i].uid);
		proto_pack_kv_str(pk, "client", job->clients[i].client);
		proto_pack_kv_uint(pk, "requests", (uint64_t)job->clients[i].requests);
	}
	proto_pack_str(pk, "steps");
	msgpack_pack_map(pk, 4);
	proto_pack_kv_uint(pk, "count", s->steps);
	proto_pack_kv_uint(pk, "tokens", s->step_tokens);
	proto_pack_kv_uint(pk, "max_batch", (uint64_t)s->max_batch);
	proto_pack_kv_float(pk, "mean_batch", s->steps ? (double)s->step_seqs / (double)s->steps : 0);
}

/* Takes a job: generate requests queue, the rest run now. */
static void
take_job(struct sched *s, struct sched_job *job)
{
	struct gen *g, **pp;

	switch (job->req.op) {
	case OP_GENERATE:
		if (s->n_queued >= (s->o.max_queue > 0 ? s->o.max_queue : 256)) {
			post_error(s, job, PE_OVERLOADED, "too many requests are waiting; try again later");
			break;
		}
		g = xcalloc(1, sizeof *g);
		g->job = job;
		for (pp = &s->gens; *pp != NULL; pp = &(*pp)->next)
			;
		*pp = g;
		s->n_queued++;
		return;
	case OP_MODEL_LIST: post_result(s, job, 1, fill_model_list, NULL, NULL); break;
	case OP_MODEL_LOAD: op_model_load(s, job); break;
	case OP_MODEL_UNLOAD: op_model_unload(s, job); break;
	case OP_MODEL_SHOW: op_model_show(s, job); break;
	case OP_TOKENIZE: case OP_DETOKENIZE:
		if (op_tokens(s, job))
			return;
		break;
	case OP_STATUS: post_result(s, job, 9, fill_status, NULL, NULL); break;
	default: post_error(s, job, PE_INTERNAL, "op not handled by the scheduler"); break;
	}
	sched_job_free(job);
}

/* ---- control messages ---- */

/* The request req_id of conn, or NULL. */
static struct gen *
find_gen(struct sched *s, uint64_t conn, uint64_t req_id)
{
	struct gen *g;

	for (g = s->gens; g != NULL; g = g->next)
		if (g->job->conn == conn && g->job->req.id == req_id)
			return g;
	return NULL;
}

/* Forks a cached session sequence under the child's uuid. */
static void
fork_resident(struct sched *s, const char *parent, const char *child)
{
	struct slot *m;
	struct resident *p, *c;

	for (m = s->slots.list; m != NULL; m = m->next) {
		if ((p = find_resident(m, parent)) == NULL || p->busy)
			continue;
		c = xcalloc(1, sizeof *c);
		snprintf(c->uuid, sizeof c->uuid, "%s", child);
		c->seq = engine_seq_fork(m->e, p->seq);
		c->last_used = ++s->tick;
		c->next = m->residents;
		m->residents = c;
	}
}

/*
 * Drops a session's cached sequences (a running one when it is done) and
 * its stored KV, and cancels its turn in flight, queued ones too: one that
 * ran on would park and save KV for a session that is gone.
 */
static void
drop_resident(struct sched *s, const char *uuid)
{
	struct slot *m;
	struct resident *r, *next;
	struct kvdisk_job *j;
	struct gen *g;

	for (g = s->gens; g != NULL; g = g->next)
		if (g->job->req.session != NULL && strcmp(g->job->req.session, uuid) == 0)
			g->cancelled = 1;

	for (m = s->slots.list; m != NULL; m = m->next)
		for (r = m->residents; r != NULL; r = next) {
			next = r->next;
			if (strcmp(r->uuid, uuid) == 0 && r->busy)
				r->dropped = 1;
			else if (strcmp(r->uuid, uuid) == 0)
				free_resident(m, r);
		}
	if (s->disk != NULL) {
		j = xcalloc(1, sizeof *j);
		j->op = KVDISK_REMOVE;
		snprintf(j->name, sizeof j->name, "%s", uuid);
		kvdisk_submit(s->disk, j);
	}
}

/* Applies a control message. */
static void
take_ctl(struct sched *s, struct ctl *c)
{
	struct sched_event *ev;
	struct gen *g;
	msgpack_packer pk;

	switch (c->type) {
	case CTL_CANCEL:
		g = find_gen(s, c->conn, c->req_id);
		ev = new_event(c->conn, c->cancel_id, 1);
		if (g == NULL) {
			proto_error(&ev->frame, 1, c->cancel_id, PE_NOT_FOUND, "no such request in flight");
		} else {
			g->cancelled = 1;
			proto_reply_begin(&ev->frame, &pk, 1, c->cancel_id, "result", 0);
			proto_reply_end(&ev->frame);
		}
		post(s, ev);
		break;
	case CTL_GONE:
		for (g = s->gens; g != NULL; g = g->next)
			if (g->job->conn == c->conn)
				g->gone = 1;
		break;
	case CTL_DROP:
		drop_resident(s, c->a);
		break;
	case CTL_FORK:
		fork_resident(s, c->a, c->b);
		break;
	}
	free(c);
}

/* ---- the thread ---- */

/*
 * Whether a request can be stepped (not only waiting for the disk) or
 * admitted (while one waits for memory, only that one, once a model has
 * fallen out of use).
 */
static int
has_work(const struct sched *s)
{
	const struct gen *g;
	int running = 0;

	for (g = s->gens; g != NULL; g = g->next) {
		if (g->state == GEN_RUNNING && g->seq->state != SEQ_LOAD && !g->seq->wait_io)
			return 1;
		running += g->state != GEN_QUEUED;
	}
	if (running >= (s->o.max_seqs > 0 ? s->o.max_seqs : 64))
		return 0;
	if (s->waiting != NULL)
		return s->retry;
	for (g = s->gens; g != NULL; g = g->next)
		if (g->state == GEN_QUEUED)
			return 1;
	return 0;
}

/* Hands the disk tier's finished jobs back to their engines. */
static void
take_io(struct sched *s)
{
	struct kvdisk_job *j, *next;
	struct gen *g;
	int any = 0;

	for (j = s->disk ? kvdisk_take_done(s->disk) : NULL; j != NULL; j = next) {
		next = j->next;
		any = 1;
		if (j->rc != 0)
			log_warn("KV disk tier: %s", j->err);
		if (j->owner != NULL)
			engine_io_done(j->owner, j);
		else
			kvdisk_job_free(j);
	}
	for (g = s->gens; g != NULL && any; g = g->next)
		if (g->state == GEN_RUNNING)
			g->seq->wait_io = 0;
}

/*
 * Takes everything the loop thread sent; waits when there is nothing to do,
 * at most timeout_ns (< 0: no limit).
 */
static int
take_input(struct sched *s, int64_t timeout_ns)
{
	uint64_t deadline = now_ns() + (uint64_t)MAX(timeout_ns, 0);
	struct timespec ts = { (time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u) };
	struct sched_job *jobs;
	struct ctl *ctls, *c;
	int stopping;

	pthread_mutex_lock(&s->mu);
	while (!s->stopping && s->jobs == NULL && s->ctls == NULL && !s->io_ready && !has_work(s)) {
		if (timeout_ns < 0)
			pthread_cond_wait(&s->cv, &s->mu);
		else if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT)
			break;
	}
	s->io_ready = 0;
	jobs = s->jobs, ctls = s->ctls;
	s->jobs = NULL, s->jobs_tail = &s->jobs;
	s->ctls = NULL, s->ctls_tail = &s->ctls;
	stopping = s->stopping;
	pthread_mutex_unlock(&s->mu);
	/* jobs first: a cancel or a hang-up may concern a job sent just before it */
	while (jobs != NULL) {
		struct sched_job *j = jobs;

		jobs = j->next;
		take_job(s, j);
	}
	while ((c = ctls) != NULL) {
		ctls = c->next;
		take_ctl(s, c);
	}
	take_io(s);
	take_prep(s, worker_take_done(&s->prep));
	return stopping;
}

/* Ends every request as cancelled (shutdown). */
static void
cancel_all(struct sched *s)
{
	struct gen *g;

	for (g = s->gens; g != NULL; g = g->next)
		g->cancelled = 1;
	take_prep(s, worker_drain(&s->prep, NULL));
	reap_cancelled(s);
}

static void *
sched_main(void *arg)
{
	struct sched *s = arg;
	struct slot *m;

	while (!take_input(s, slots_expire(&s->slots))) {
		reap_cancelled(s);
		admit_queued(s);
		for (m = s->slots.list; m != NULL; m = m->next)
			if (m->e != NULL)
				step_model(s, m);
	}
	cancel_all(s);
	return NULL;
}

/* The disk tier's wake-up (its thread): a job has finished. */
static void
io_wake(void *arg)
{
	struct sched *s = arg;

	pthread_mutex_lock(&s->mu);
	s->io_ready = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* The model slots, with the engine options and the memory budget. */
static void
start_slots(struct sched *s)
{
	struct slots_opts so = { .budget = s->o.device_memory, .keep_alive = s->o.keep_alive,
		.unloading = drop_residents, .arg = s };

	so.eo = (struct engine_opts){ .device = s->o.device, .n_threads = s->o.n_threads, .n_ctx = s->o.n_ctx,
		.kv_tokens = s->o.kv_tokens, .max_step_tokens = s->o.max_step_tokens, .max_seqs = s->o.max_seqs,
		.exact = s->o.exact, .host = &s->host, .disk = s->disk };
	slots_init(&s->slots, &so);
	s->slots_on = 1;
}

int
sched_start(const struct sched_opts *o, void (*wake)(void *), void *wake_arg, struct sched **out,
    char *err)
{
	struct sched *s = xcalloc(1, sizeof *s);
	pthread_condattr_t ca;
	int rc;

	s->o = *o;
	s->o.device = s->device = o->device ? xstrdup(o->device) : NULL;
	s->wake = wake;
	s->wake_arg = wake_arg;
	s->jobs_tail = &s->jobs;
	s->ctls_tail = &s->ctls;
	s->events_tail = &s->events;
	s->t_start = now_ns();
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);  /* now_ns()'s, for the keep-alive timeouts */
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	kvhost_init(&s->host, o->kv_host_bytes);
	if (o->kv_dir != NULL && o->kv_disk_bytes > 0 &&
	    (rc = kvdisk_open(o->kv_dir, o->kv_disk_bytes, io_wake, s, &s->disk, err)) != 0) {
		sched_stop(s);
		return rc;
	}
	start_slots(s);
	if ((rc = worker_start(&s->prep, io_wake, s, err)) != 0) {
		sched_stop(s);
		return rc;
	}
	if (o->default_model != NULL) {
		if ((rc = find_model(s, o->default_model, &s->default_model, err)) != 0 ||
		    (rc = slots_load(&s->slots, s->default_model, NULL, NULL, err)) != 0) {
			sched_stop(s);
			return ERR_NOTFOUND;
		}
	}
	if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
		sched_stop(s);
		return err_set(err, ERR_NOMEM, "cannot start the engine thread");
	}
	s->running = 1;
	*out = s;
	return 0;
}

void
sched_stop_thread(struct sched *s)
{
	if (!s->running)
		return;
	pthread_mutex_lock(&s->mu);
	s->stopping = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->thread, NULL);
	s->running = 0;
}

void
sched_stop(struct sched *s)
{
	struct sched_event *ev;

	sched_stop_thread(s);
	while (s->jobs != NULL) {
		struct sched_job *j = s->jobs;

		s->jobs = j->next;
		sched_job_free(j);
	}
	while (s->ctls != NULL) {
		struct ctl *c = s->ctls;

		s->ctls = c->next;
		free(c);
	}
	while ((ev = s->events) != NULL) {
		s->events = ev->next;
		sched_event_free(ev);
	}
	worker_stop(&s->prep);
	if (s->slots_on)
		slots_destroy(&s->slots);
	take_io(s);
	kvdisk_close(s->disk);
	kvhost_destroy(&s->host);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s->device);
	free(s);
}

/* Queues a control message for the engine thread. */
static void
send_ctl(struct sched *s, struct ctl *c)
{
	pthread_mutex_lock(&s->mu);
	c->next = NULL;
	*s->ctls_tail = c;
	s->ctls_tail = &c->next;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

int
sched_model_known(struct sched *s, const char *name_or_path)
{
	return slots_known(&s->slots, name_or_path);
}

void
sched_submit(struct sched *s, struct sched_job *job)
{
	pthread_mutex_lock(&s->mu);
	job->next = NULL;
	*s->jobs_tail = job;
	s->jobs_tail = &job->next;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void
sched_cancel(struct sched *s, uint64_t conn, uint64_t req_id, uint64_t cancel_req_id)
{
	struct ctl *c = xcalloc(1, sizeof *c);

	c->type = CTL_CANCEL;
	c->conn = conn;
	c->req_id = req_id;
	c->cancel_id = cancel_req_id;
	send_ctl(s, c);
}

void
sched_conn_gone(struct sched *s, uint64_t conn)
{
	struct ctl *c = xcalloc(1, sizeof *c);

	c->type = CTL_GONE;
	c->conn = conn;
	send_ctl(s, c);
}

void
sched_session_dropped(struct sched *s, const char *uuid)
{
	struct ctl *c = xcalloc(1, sizeof *c);

	c->type = CTL_DROP;
	snprintf(c->a, sizeof c->a, "%s", uuid);
	send_ctl(s, c);
}

void
sched_session_forked(struct sched *s, const char *parent, const char *child)
{
	struct ctl *c = xcalloc(1, sizeof *c);

	c->type = CTL_FORK;
	snprintf(c->a, sizeof c->a, "%s", parent);
	snprintf(c->b, sizeof c->b, "%s", child);
	send_ctl(s, c);
}
