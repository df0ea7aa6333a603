/*
 * call.c: one HTTP request's life against residentd.
 *
 * Each request has its own daemon connection, read by the event loop
 * (rs_fd, rs_process): the daemon admits requests round-robin across
 * connections, so HTTP clients share it as fairly as any other clients, and
 * a client that leaves or stalls concerns its own connection alone. A
 * connection adds a fraction of a millisecond (README, "OpenAI-compatible
 * endpoint").
 *
 *   every request:   CALL_HELLO     hello, answered before anything else is sent: it says
 *                                   the daemon's max_frame, over which a request is refused
 *                                   here (413) rather than sent (the daemon would close the
 *                                   connection, racing the write)
 *   a completion:    CALL_MODELS    only for a model not in the cache (404 if not listed)
 *                    CALL_SESSION   session.new, only for session "new"
 *                    CALL_GENERATE  --done or error--> reply, CALL_DONE
 *   ops (call_ops):  CALL_MODELS    as a completion's, for a request that names a model
 *                    CALL_OPS       each op in turn --the last result--> reply, CALL_DONE
 *   the client leaves: in CALL_GENERATE a cancel is sent --> CALL_CANCELLING --done--> CALL_DONE;
 *                      in CALL_SESSION the session's result is waited for (to delete it);
 *                      in the other states the call ends at once.
 *   a session "new" made for a request that ends before its client was told
 *   its id (an error, the client left): CALL_CLEANUP, session.delete, then
 *   CALL_DONE. No turn is stored then, so the session is empty, and no
 *   client could name it.
 *
 * The daemon connection never blocks the event loop (RS_NONBLOCK): what
 * the socket does not take of a request is queued and sent when it is
 * writable, so a stopped or slow daemon holds up its own requests only.
 *
 * Model names are cached: the daemon only ever adds models, so a name in
 * the cache is a model, and a name not in it sends for a fresh list. A name
 * that is not listed is refused rather than passed on, since the daemon
 * would take it for a file to load. An Ollama request's name is resolved
 * to the daemon's (ollama_resolve); its replies echo the name it gave.
 *
 * A request of Ollama's API runs as OpenAI's does; its objects are
 * ollama_api.c's (one choice, its end in one last object with the times),
 * and http.c frames its stream and errors as Ollama does.
 *
 * libresident's callbacks run inside rs_process, where the client must not
 * be closed: call_end marks the call CALL_DONE and the read callback frees
 * it once rs_process has returned.
 *
 * A request of n choices is one generate of n (the daemon computes the
 * prompt once); its token replies say their choice, whose chunks carry it
 * as their index, and each choice keeps its own logprobs and held text.
 */
#include "config.h"
#include "openai.h"
#include "log.h"

#include <event2/event.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SESSION_TITLE "resident-http"

enum call_state {
	CALL_HELLO, CALL_MODELS, CALL_SESSION, CALL_GENERATE, CALL_CANCELLING, CALL_OPS, CALL_CLEANUP, CALL_DONE
};

/* What a completion keeps of one of its choices while the daemon generates it. */
struct choice {
	/*
	 * With logprobs: their tokens. The daemon sends token replies only to a
	 * stream, so a reply that is not streamed is gathered from them, its
	 * answer and reasoning too.
	 */
	struct api_logprobs lp;
	char *lp_text, *lp_reasoning;
	size_t lp_text_len, lp_reasoning_len;
	/*
	 * A stream with tools offered: answer text held back while it may
	 * still be a call its family writes as text (api_tools_may_call); the
	 * done's calls_in_text says whether it was.
	 */
	char *held;
	size_t held_len;
	int released;                 /* held text went out as an answer: no more is held */
};

struct call {
	enum call_state state;
	struct oa *oa;
	struct evhttp_request *req;   /* NULL once answered, or once the client left */
	struct conn *watch;
	rs_client *rc;
	struct event *rc_ev, *wr_ev;  /* the daemon connection readable; writable (while requests are queued) */
	int in_process;               /* inside rs_process: libresident's callbacks may run */
	const char *path;             /* for the log */
	struct timespec t0;
	/* call_ops: the ops, the next one's index, their results; ops NULL: a completion */
	const char *const *ops;
	size_t op;
	json_t *results[CALL_MAX_OPS];
	rs_params *params;            /* the ops' fields (call_ops), or NULL */
	call_reply_fn reply;
	void *reply_arg;
	/* completions (of call_ops: the model, if any) */
	struct api_req r;
	struct api_meta meta;
	char session[40];
	int own_session;              /* session is one made for this request, not yet named to its client */
	uint64_t gen_id;
	int streaming;                /* the event stream has begun */
	struct choice ch[API_MAX_CHOICES]; /* the request's r.n choices */
	struct call *next;
};

static void call_start_generate(struct call *c);
static void session_result_cb(uint64_t id, const rs_value *result, void *arg);

/* ---- life ---- */

static void
call_free(struct call *c)
{
	struct call **pp;
	int i;

	for (pp = &c->oa->calls; *pp != c; pp = &(*pp)->next)
		;
	*pp = c->next;
	conn_unwatch(c->watch);
	if (c->rc_ev != NULL)
		event_free(c->rc_ev);
	if (c->wr_ev != NULL)
		event_free(c->wr_ev);
	rs_close(c->rc);
	api_req_free(&c->r);
	for (i = 0; i < API_MAX_CHOICES; i++) {
		api_logprobs_free(&c->ch[i].lp);
		free(c->ch[i].lp_text);
		free(c->ch[i].lp_reasoning);
		free(c->ch[i].held);
	}
	for (i = 0; i < CALL_MAX_OPS; i++)
		json_decref(c->results[i]);
	rs_params_free(c->params);
	free(c);
}

/* Seconds since the request came. */
static double
call_seconds(const struct call *c)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - c->t0.tv_sec) + (t.tv_nsec - c->t0.tv_nsec) / 1e9;
}

/*
 * The last reply is about to be sent: the watch ends first, since sending it
 * may free the connection at once (a client that asked to close it).
 */
static void
call_unwatch(struct call *c)
{
	conn_unwatch(c->watch);
	c->watch = NULL;
}

/* Writability is waited for while requests are queued for the daemon. */
static void
call_want_write(struct call *c)
{
	if (rs_unsent(c->rc) > 0)
		event_add(c->wr_ev, NULL);
	else
		event_del(c->wr_ev);
}

static void call_end(struct call *c);

/* The session was deleted (or could not be: the daemon is gone): the call ends. */
static void
cleanup_result_cb(uint64_t id, const rs_value *result, void *arg)
{
	call_end(arg);
}

static void
cleanup_error_cb(uint64_t id, rs_status code, const char *message, void *arg)
{
	struct call *c = arg;

	log_warn("%s: the session %s made for the request could not be deleted: %s", c->path, c->session, message);
	call_end(c);
}

/* Deletes the session made for the request; 1 if the call waits for that. */
static int
call_cleanup(struct call *c)
{
	rs_params *p = rs_params_new();
	int sent;

	c->own_session = 0;
	sent = p != NULL && rs_params_set_str(p, "session", c->session) == RS_OK &&
	    rs_call_start(c->rc, "session.delete", p, cleanup_result_cb, cleanup_error_cb, c) != 0;
	rs_params_free(p);
	if (!sent)
		return 0;
	c->state = CALL_CLEANUP;
	call_want_write(c);
	return 1;
}

/* The call is over: its reply was sent, or its client left. Freed now or after rs_process. */
static void
call_end(struct call *c)
{
	call_unwatch(c);
	c->req = NULL;
	if (c->own_session && call_cleanup(c))
		return;
	c->state = CALL_DONE;
	if (!c->in_process)
		call_free(c);
}

/* Answers with an error and ends the call. */
static void
call_fail(struct call *c, const struct api_error *e)
{
	call_unwatch(c);
	if (c->req != NULL && c->streaming) {
		/* the status is sent already: the error goes into the stream (the openai packages raise it) */
		http_stream_send(c->req, http_error_json(c->req, e));
		http_stream_end(c->req);
	} else if (c->req != NULL) {
		http_send_error(c->req, e);
	}
	log_info("%s %d %s (%.3fs)", c->path, e->status, e->message, call_seconds(c));
	call_end(c);
}

/* The HTTP client left (its request is already released). */
static void
call_gone_cb(void *arg)
{
	struct call *c = arg;

	c->watch = NULL;
	c->req = NULL;
	if (c->state == CALL_GENERATE && rs_cancel_start(c->rc, c->gen_id) == RS_OK) {
		c->state = CALL_CANCELLING;
		call_want_write(c);
		return;
	}
	if (c->state == CALL_SESSION)
		return;                 /* session_result_cb deletes the session made */
	log_info("%s: the client left (%.3fs)", c->path, call_seconds(c));
	call_end(c);
}

/* The daemon connection is readable or writable: replies, and queued requests sent. A call that
 * ended inside them is freed here. */
static void
call_io_cb(evutil_socket_t fd, short what, void *arg)
{
	struct call *c = arg;
	struct api_error e;
	rs_status st;

	c->in_process = 1;
	st = rs_process(c->rc);
	c->in_process = 0;
	if (st != RS_OK && c->state != CALL_DONE) {
		/* every request in flight has failed through its callback; this is for a call with none */
		api_error_from_status(st, rs_last_error(c->rc), &e);
		call_fail(c, &e);
	}
	if (c->state == CALL_DONE)
		call_free(c);
	else
		call_want_write(c);
}

static void call_check_model(struct call *c);
static void call_error_cb(uint64_t id, rs_status code, const char *message, void *arg);

/* hello answered: the daemon's max_frame is known to libresident; the request goes on. */
static void
hello_result_cb(uint64_t id, const rs_value *result, void *arg)
{
	struct call *c = arg;

	if (c->req == NULL)
		call_end(c);
	else
		call_check_model(c);
}

/* Names the connection for the daemon's status ("resident-http") and learns its max_frame. 0, or -1. */
static int
call_hello(struct call *c)
{
	rs_params *p = rs_params_new();
	int sent;

	c->state = CALL_HELLO;
	sent = p != NULL && rs_params_set_str(p, "client", "resident-http") == RS_OK &&
	    rs_params_set_uint(p, "version", RS_PROTOCOL_VERSION) == RS_OK &&
	    rs_call_start(c->rc, "hello", p, hello_result_cb, call_error_cb, c) != 0;
	rs_params_free(p);
	return sent ? 0 : -1;
}

/* A call with its own daemon connection, or NULL after answering the error. */
static struct call *
call_open(struct oa *oa, struct evhttp_request *req, const char *path)
{
	struct call *c = calloc(1, sizeof *c);
	struct api_error e;
	rs_error err;

	if (c == NULL) {
		api_nomem(&e);
		http_send_error(req, &e);
		return NULL;
	}
	c->oa = oa;
	c->req = req;
	c->path = path;
	clock_gettime(CLOCK_MONOTONIC, &c->t0);
	c->next = oa->calls;
	oa->calls = c;
	if ((c->rc = rs_connect(oa->socket, RS_NONBLOCK, &err)) == NULL) {
		api_error_from_status(err.code, err.message, &e);
		call_fail(c, &e);
		return NULL;
	}
	c->rc_ev = event_new(oa->base, rs_fd(c->rc), EV_READ | EV_PERSIST, call_io_cb, c);
	c->wr_ev = event_new(oa->base, rs_fd(c->rc), EV_WRITE | EV_PERSIST, call_io_cb, c);
	c->watch = conn_watch(oa, req, call_gone_cb, c);
	if (c->rc_ev == NULL || c->wr_ev == NULL || c->watch == NULL || event_add(c->rc_ev, NULL) != 0 ||
	    call_hello(c) != 0) {
		api_nomem(&e);
		call_fail(c, &e);
		return NULL;
	}
	call_want_write(c);
	return c;
}

void
call_free_all(struct oa *oa)
{
	while (oa->calls != NULL)
		call_free(oa->calls);
}

/* A failed daemon request of any state. */
static void
call_error_cb(uint64_t id, rs_status code, const char *message, void *arg)
{
	struct call *c = arg;
	struct api_error e;

	if (c->req == NULL) {
		log_info("%s: the client left (%.3fs)", c->path, call_seconds(c));
		call_end(c);
		return;
	}
	api_error_from_status(code, message, &e);
	if (code == RS_ERR_NOT_FOUND && c->state == CALL_GENERATE && c->r.session != NULL) {
		e.param = "session";
		e.code = "session_not_found";
	}
	call_fail(c, &e);
}

/*
 * A request could not be sent: one over the daemon's max_frame (a 413),
 * a connection already over, no memory.
 */
static void
call_start_failed(struct call *c)
{
	char message[256];

	snprintf(message, sizeof message, "%s", rs_last_error(c->rc));
	call_error_cb(0, rs_last_status(c->rc), message, c);
}

/* ---- models ---- */

static int
model_known(const struct oa *oa, const char *name)
{
	size_t i;

	for (i = 0; i < oa->n_models; i++)
		if (strcmp(oa->models[i], name) == 0)
			return 1;
	return 0;
}

/*
 * Whether the request's model is one of the cached names: 1 (an Ollama
 * name resolved to the daemon's, in r.model), 0 not, -1 no memory. A
 * request of no model (an op call's) has it.
 */
static int
call_model_known(struct call *c)
{
	const char *name;
	char *copy;

	if (c->r.model == NULL)
		return 1;
	if (c->r.dialect == API_OPENAI)
		return model_known(c->oa, c->r.model);
	if ((name = ollama_resolve(c->oa->models, c->oa->n_models, c->r.asked)) == NULL)
		return 0;
	if ((copy = strdup(name)) == NULL)
		return -1;
	free(c->r.model);
	c->r.model = copy;
	return 1;
}

/* Replaces the cache with the names of a model.list result. */
static void
models_cache(struct oa *oa, const rs_value *models)
{
	size_t i, n = rs_len(models);
	char **names = calloc(n ? n : 1, sizeof *names);
	const char *name;

	if (names == NULL)
		return;
	for (i = 0; i < n; i++) {
		name = rs_str(rs_get(rs_at(models, i), "name"));
		if ((names[i] = strdup(name ? name : "")) == NULL)
			break;
	}
	n = i;
	for (i = 0; i < oa->n_models; i++)
		free(oa->models[i]);
	free(oa->models);
	oa->models = names;
	oa->n_models = n;
}

/* 404 for a model residentd does not have. */
static void
call_no_model(struct call *c)
{
	struct api_error e;

	if (c->r.dialect == API_OPENAI)
		api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
		    "the model '%s' does not exist: GET /v1/models lists the models of residentd", c->r.model);
	else
		api_error_set(&e, 404, "invalid_request_error", "model", "model_not_found",
		    "model '%s' not found: GET /api/tags lists the models of residentd", c->r.asked);
	call_fail(c, &e);
}

static void ops_next(struct call *c);

/* Where a request goes once its model is known to exist. */
static void
call_after_model(struct call *c)
{
	rs_params *p;

	if (c->ops != NULL) {
		ops_next(c);
		return;
	}
	if (c->r.session == NULL || strcmp(c->r.session, "new") != 0) {
		if (c->r.session != NULL)
			snprintf(c->session, sizeof c->session, "%s", c->r.session);
		call_start_generate(c);
		return;
	}
	c->state = CALL_SESSION;
	p = rs_params_new();
	if (p == NULL || rs_params_set_str(p, "model", c->r.model) != RS_OK ||
	    rs_params_set_str(p, "title", SESSION_TITLE) != RS_OK ||
	    (c->r.system != NULL && rs_params_set_str(p, "system", c->r.system) != RS_OK) ||
	    rs_call_start(c->rc, "session.new", p, session_result_cb, call_error_cb, c) == 0)
		call_start_failed(c);
	rs_params_free(p);
}

/* Goes on with the model known (1), refused (0) or not checked for want of memory (-1). */
static void
call_model_checked(struct call *c, int known)
{
	if (known < 0)
		call_error_cb(0, RS_ERR_NOMEM, "out of memory", c);
	else if (known == 0)
		call_no_model(c);
	else
		call_after_model(c);
}

static void
models_result_cb(uint64_t id, const rs_value *result, void *arg)
{
	struct call *c = arg;

	models_cache(c->oa, rs_get(result, "models"));
	if (c->req == NULL)
		call_end(c);
	else
		call_model_checked(c, call_model_known(c));
}

/* Goes on with the request's model: from the cache, else from a fresh model.list. */
static void
call_check_model(struct call *c)
{
	int known = call_model_known(c);

	if (known != 0) {
		call_model_checked(c, known);
		return;
	}
	c->state = CALL_MODELS;
	if (rs_call_start(c->rc, "model.list", NULL, models_result_cb, call_error_cb, c) == 0)
		call_start_failed(c);
}

/* ---- ops ---- */

/* The last op answered: the reply. */
static void
ops_reply(struct call *c)
{
	call_unwatch(c);
	c->reply(c->req, c->r.asked ? c->r.asked : c->r.model, c->results, c->reply_arg);
	log_info("%s 200 (%.3fs)", c->path, call_seconds(c));
	call_end(c);
}

static void
ops_result_cb(uint64_t id, const rs_value *result, void *arg)
{
	struct call *c = arg;

	if (c->req == NULL) {
		call_end(c);
		return;
	}
	if (strcmp(c->ops[c->op], "model.list") == 0)
		models_cache(c->oa, rs_get(result, "models"));
	if ((c->results[c->op++] = api_value_json(result)) == NULL) {
		call_error_cb(0, RS_ERR_NOMEM, "out of memory", c);
		return;
	}
	ops_next(c);
}

/* Sends the next op, with the model's daemon name; after the last, the reply. */
static void
ops_next(struct call *c)
{
	if (c->op == CALL_MAX_OPS || c->ops[c->op] == NULL) {
		ops_reply(c);
		return;
	}
	c->state = CALL_OPS;
	if (c->r.model != NULL && ((c->params == NULL && (c->params = rs_params_new()) == NULL) ||
	    rs_params_set_str(c->params, "model", c->r.model) != RS_OK)) {
		call_error_cb(0, RS_ERR_NOMEM, "out of memory", c);
		return;
	}
	if (rs_call_start(c->rc, c->ops[c->op], c->params, ops_result_cb, call_error_cb, c) == 0)
		call_start_failed(c);
}

void
call_ops(struct oa *oa, struct evhttp_request *req, const char *path, enum api_dialect d, const char *model,
    const char *const *ops, rs_params *params, call_reply_fn reply, void *arg)
{
	struct call *c = call_open(oa, req, path);

	if (c == NULL) {
		rs_params_free(params);
		return;
	}
	c->params = params;
	c->ops = ops;
	c->reply = reply;
	c->reply_arg = arg;
	c->r.dialect = d;
	if (model != NULL && ((c->r.model = strdup(model)) == NULL ||
	    (d != API_OPENAI && (c->r.asked = strdup(model)) == NULL)))
		call_error_cb(0, RS_ERR_NOMEM, "out of memory", c);
	/* else the model is checked once hello is answered */
}

/* ---- sessions ---- */

static void
session_result_cb(uint64_t id, const rs_value *result, void *arg)
{
	struct call *c = arg;
	const char *uuid = rs_str(rs_get(rs_get(result, "session"), "session"));

	snprintf(c->session, sizeof c->session, "%s", uuid ? uuid : "");
	c->own_session = c->session[0] != '\0';
	if (c->req == NULL) {
		log_info("%s: the client left (%.3fs)", c->path, call_seconds(c));
		call_end(c);
		return;
	}
	call_start_generate(c);
}

/* ---- generation ---- */

/* The status line, headers and (chat) each choice's assistant role: sent with the first token, so
 * that an error before it (a prompt too long, a session not found) still gets its own status. */
static void
stream_begin(struct call *c)
{
	int i;

	c->streaming = 1;
	c->own_session = 0;         /* named to the client from here on */
	if (c->session[0])
		http_add_header(c->req, "X-Resident-Session", c->session);
	conn_reply_begins(c->watch);
	http_stream_start(c->req);
	for (i = 0; c->r.kind == API_CHAT && c->r.dialect == API_OPENAI && i < c->r.n; i++)
		http_stream_send(c->req, api_chunk(&c->r, &c->meta, i, "", NULL, 1, NULL, NULL));
}

/* A stream chunk of choice i: its text (NULL: none), reasoning (NULL: none) and logprobs (taken; NULL: none). */
static json_t *
call_chunk(struct call *c, int i, const char *text, const char *reasoning, json_t *lp)
{
	if (c->r.dialect != API_OPENAI)
		return ollama_chunk(&c->r, &c->meta, text, reasoning, lp);
	return api_chunk(&c->r, &c->meta, i, text, reasoning, 0, NULL, lp);
}

/* The {bytes, logprob} of a token reply, or of one of its top_logprobs. */
static struct api_lp_token
lp_token(const rs_value *v)
{
	const rs_value *b = rs_get(v, "bytes");

	return (struct api_lp_token){ rs_str(b) ? rs_str(b) : "", rs_len(b), rs_float(rs_get(v, "logprob")) };
}

/*
 * Adds a token reply's logprobs to its choice's. A token that holds
 * reasoning or tool text and no answer text is not one of the answer's: it
 * is left out. Returns 1 when the token was added.
 */
static int
logprobs_token(struct call *c, struct choice *ch, const char *text, const rs_value *reply)
{
	struct api_lp_token tok, top[API_MAX_TOP_LOGPROBS];
	const rs_value *tl = rs_get(reply, "top_logprobs");
	size_t i, n = rs_len(tl);

	if (text[0] == '\0' && (rs_reply_reasoning(reply)[0] != '\0' || rs_reply_tool(reply)[0] != '\0'))
		return 0;
	tok = lp_token(reply);
	for (i = 0; i < n && i < API_MAX_TOP_LOGPROBS; i++)
		top[i] = lp_token(rs_at(tl, i));
	if (api_logprobs_add(&c->r, &ch->lp, &tok, top, i) != 0) {
		log_warn("%s: out of memory: a token's logprobs are left out", c->path);
		return 0;
	}
	return 1;
}

/* Appends s to the string *buf of *len bytes. */
static int
str_append(char **buf, size_t *len, const char *s)
{
	size_t n = strlen(s);
	char *p;

	if (n == 0)
		return 0;
	if ((p = realloc(*buf, *len + n + 1)) == NULL)
		return -1;
	memcpy(p + *len, s, n + 1);
	*buf = p;
	*len += n;
	return 0;
}

/* A token of a reply that is not streamed but has logprobs: gathered for done_cb. */
static int
logprobs_gather(struct call *c, struct choice *ch, const char *text, const rs_value *reply)
{
	struct api_error e;

	logprobs_token(c, ch, text, reply);
	if (str_append(&ch->lp_text, &ch->lp_text_len, text) != 0 ||
	    str_append(&ch->lp_reasoning, &ch->lp_reasoning_len, rs_reply_reasoning(reply)) != 0) {
		api_nomem(&e);
		call_fail(c, &e);
		return 1;       /* cancels the generation; its done finds the call answered */
	}
	return 0;
}

/* The logprobs of a streamed token, for its chunk; NULL when it has none. */
static json_t *
logprobs_chunk(struct call *c, struct choice *ch, const char *text, const rs_value *reply)
{
	if (!c->r.logprobs || !logprobs_token(c, ch, text, reply))
		return NULL;
	return api_logprobs_take(&c->r, &ch->lp);
}

/*
 * A streamed token's answer text as it may go out: "" while it may still
 * be a call written as text (held); then what was held with it.
 */
static const char *
tools_text(struct call *c, struct choice *ch, const char *text)
{
	if (ch->released || text[0] == '\0' || (ch->held == NULL && !api_tools_may_call(&c->r, text)))
		return text;
	if (str_append(&ch->held, &ch->held_len, text) != 0) {
		log_warn("%s: out of memory: answer text is not held back", c->path);
		return text;
	}
	if (api_tools_may_call(&c->r, ch->held))
		return "";
	ch->released = 1;
	return ch->held;
}

/* The done's fields of choice i (finish, text, tool_calls, ...): the done's own with one choice. */
static const rs_value *
done_choice(const struct call *c, const rs_value *done, int i)
{
	return c->r.n == 1 ? done : rs_at(rs_get(done, "choices"), (size_t)i);
}

/* OpenAI's finish_reason of choice i, or NULL when it was cancelled. */
static const char *
choice_reason(const struct call *c, const rs_value *done, int i)
{
	return api_finish_reason(rs_str(rs_get(done_choice(c, done, i), "finish")));
}

/* Whether the daemon cancelled a choice (its model was unloaded, or it is stopping). */
static int
any_cancelled(const struct call *c, const rs_value *done)
{
	for (int i = 0; i < c->r.n; i++)
		if (choice_reason(c, done, i) == NULL)
			return 1;
	return 0;
}

/* A stream chunk of choice i with every call of the daemon's calls. */
static json_t *
call_tool_chunk(struct call *c, int i, const rs_value *calls)
{
	json_t *j, *chunk;

	if (c->r.dialect == API_OPENAI)
		return api_tool_chunk(&c->r, &c->meta, i, calls);
	j = api_value_json(calls);
	chunk = ollama_calls_chunk(&c->r, &c->meta, j);
	json_decref(j);
	return chunk;
}

/*
 * The end of a streamed choice's tool calls: held answer text goes out
 * unless it was the calls (or is blank beside them, as a reply that is not
 * streamed has no content then); the calls as one chunk. Returns the
 * finish_reason.
 */
static const char *
stream_tool_calls(struct call *c, int i, const rs_value *fields, const char *reason)
{
	struct choice *ch = &c->ch[i];
	const rs_value *calls = rs_get(fields, "tool_calls");

	if (ch->held != NULL && !ch->released && !rs_bool(rs_get(fields, "calls_in_text")) &&
	    !(rs_len(calls) > 0 && api_blank(ch->held)))
		http_stream_send(c->req, call_chunk(c, i, ch->held, NULL, NULL));
	if (rs_len(calls) == 0)
		return reason;
	http_stream_send(c->req, call_tool_chunk(c, i, calls));
	return "tool_calls";
}

/*
 * A token's answer and reasoning as a chunk of its choice; its tool text
 * is a call's, which the done delivers parsed. With logprobs, each token of
 * the answer has a chunk with its logprobs, its content "" when the token
 * ends no character (or its text is held back: that comes with a later one).
 */
static int
token_cb(uint64_t id, const char *text, const rs_value *reply, void *arg)
{
	struct call *c = arg;
	const char *reasoning = c->r.hide_reasoning ? "" : rs_reply_reasoning(reply);
	unsigned i = rs_reply_choice(reply);
	struct choice *ch;
	json_t *lp;

	if (c->req == NULL || i >= (unsigned)c->r.n)
		return 0;               /* cancelling; no such choice was asked for */
	ch = &c->ch[i];
	if (c->r.logprobs && !c->r.stream)
		return logprobs_gather(c, ch, text, reply);
	if (!c->streaming)
		stream_begin(c);
	text = tools_text(c, ch, text);
	lp = logprobs_chunk(c, ch, text, reply);
	if (text[0] != '\0' || reasoning[0] != '\0' || lp != NULL)
		http_stream_send(c->req, call_chunk(c, (int)i, text[0] != '\0' || lp != NULL ? text : NULL, reasoning, lp));
	if (http_unsent(c->req) > c->oa->max_unread) {
		log_warn("%s: the client left %zu bytes unread: dropped", c->path, http_unsent(c->req));
		conn_drop(c->watch);            /* calls call_gone_cb: the generation is cancelled */
	}
	return 0;
}

/*
 * Choice i of a reply that is not streamed: its text from the done or,
 * with logprobs, gathered from its tokens; its tool calls.
 */
static void
reply_choice(struct call *c, json_t *reply, int i, const rs_value *fields, const char *reason)
{
	struct choice *ch = &c->ch[i];
	json_t *o;

	if (c->r.logprobs) {
		o = api_add_choice(&c->r, reply, ch->lp_text ? ch->lp_text : "", ch->lp_reasoning, reason);
		api_set_logprobs(o, api_logprobs_take(&c->r, &ch->lp));
	} else {
		o = api_add_choice(&c->r, reply, rs_str(rs_get(fields, "text")), rs_reply_reasoning(fields), reason);
	}
	api_set_tool_calls(o, rs_get(fields, "tool_calls"), rs_bool(rs_get(fields, "calls_in_text")));
}

/* OpenAI's end of a reply: each choice's finish chunk and the usage, or the whole reply. */
static void
openai_done(struct call *c, const rs_value *done, const struct api_usage *u)
{
	json_t *reply;
	int i;

	if (c->r.stream) {
		for (i = 0; i < c->r.n; i++)
			http_stream_send(c->req, api_chunk(&c->r, &c->meta, i, c->r.kind == API_CHAT ? NULL : "", NULL, 0,
			    stream_tool_calls(c, i, done_choice(c, done, i), choice_reason(c, done, i)), NULL));
		if (c->r.include_usage)
			http_stream_send(c->req, api_usage_chunk(&c->r, &c->meta, u));
		http_stream_end(c->req);
	} else {
		if (c->session[0])
			http_add_header(c->req, "X-Resident-Session", c->session);
		reply = api_reply(&c->r, &c->meta, u);
		for (i = 0; i < c->r.n; i++)
			reply_choice(c, reply, i, done_choice(c, done, i), choice_reason(c, done, i));
		http_send_json(c->req, 200, reply);
	}
}

/* Ollama's end of a reply (one choice): its last object, with the text when not streamed. */
static void
ollama_done(struct call *c, const rs_value *done, const struct api_usage *u)
{
	struct choice *ch = &c->ch[0];
	struct ollama_end end = { .finish = rs_str(rs_get(done, "finish")), .whole = !c->r.stream, .u = *u,
		.seconds = call_seconds(c) };
	json_t *calls;

	if (c->r.stream) {
		stream_tool_calls(c, 0, done, NULL);
		http_stream_send(c->req, ollama_final(&c->r, &c->meta, &end));
		http_stream_end(c->req);
		return;
	}
	end.text = c->r.logprobs ? (ch->lp_text ? ch->lp_text : "") : rs_str(rs_get(done, "text"));
	end.reasoning = c->r.logprobs ? ch->lp_reasoning : rs_reply_reasoning(done);
	end.calls = calls = api_value_json(rs_get(done, "tool_calls"));
	end.calls_in_text = rs_bool(rs_get(done, "calls_in_text"));
	end.logprobs = c->r.logprobs ? api_logprobs_take(&c->r, &ch->lp) : NULL;
	http_send_json(c->req, 200, ollama_final(&c->r, &c->meta, &end));
	json_decref(calls);
}

static void
done_cb(uint64_t id, const rs_value *done, void *arg)
{
	struct call *c = arg;
	const rs_value *uv = rs_get(done, "usage");
	const char *reason = choice_reason(c, done, 0);
	struct api_usage u = { rs_uint(rs_get(uv, "prompt_tokens")), rs_uint(rs_get(uv, "cached_tokens")),
	    rs_uint(rs_get(uv, "generated_tokens")), rs_float(rs_get(uv, "ttft_ms")),
	    rs_float(rs_get(uv, "tokens_per_s")) };
	struct api_error e;

	if (c->req == NULL) {
		log_info("%s: the client left: generation cancelled after %llu tokens (%.3fs)", c->path,
		    (unsigned long long)u.generated, call_seconds(c));
		call_end(c);
		return;
	}
	if (any_cancelled(c, done)) {
		api_error_set(&e, 503, "server_error", NULL, "cancelled", "residentd cancelled the generation "
		    "(its model was unloaded, or it is stopping)");
		call_fail(c, &e);
		return;
	}
	call_unwatch(c);
	c->own_session = 0;         /* its turn is stored, and the reply names it */
	if (c->r.stream && !c->streaming)
		stream_begin(c);
	if (c->r.dialect == API_OPENAI)
		openai_done(c, done, &u);
	else
		ollama_done(c, done, &u);
	log_info("%s 200 model %s%s%s, %llu+%llu tokens (%llu cached), %d choice%s, %s (%.3fs)", c->path,
	    c->r.model, c->session[0] ? ", session " : "", c->session, (unsigned long long)u.prompt,
	    (unsigned long long)u.generated, (unsigned long long)u.cached, c->r.n, c->r.n > 1 ? "s" : "", reason,
	    call_seconds(c));
	call_end(c);
}

static void
call_start_generate(struct call *c)
{
	rs_params *p = api_params(&c->r);

	c->state = CALL_GENERATE;
	c->meta.session = c->session[0] ? c->session : NULL;
	if (p == NULL || (c->session[0] && rs_params_set_str(p, "session", c->session) != RS_OK) ||
	    rs_params_set_bool(p, "stream", c->r.stream || c->r.logprobs) != RS_OK) {
		rs_params_free(p);
		call_error_cb(0, RS_ERR_NOMEM, "out of memory", c);
		return;
	}
	c->gen_id = rs_generate_start(c->rc, p, token_cb, done_cb, call_error_cb, c);
	rs_params_free(p);
	if (c->gen_id == 0)
		call_start_failed(c);
}

void
call_generate(struct oa *oa, struct evhttp_request *req, struct api_req *r)
{
	static const char *const paths[] = { [API_OPENAI] = NULL, [API_OLLAMA_CHAT] = "POST /api/chat",
		[API_OLLAMA_GENERATE] = "POST /api/generate" };
	struct call *c = call_open(oa, req, r->dialect != API_OPENAI ? paths[r->dialect] :
	    r->kind == API_CHAT ? "POST /v1/chat/completions" : "POST /v1/completions");

	if (c == NULL) {
		api_req_free(r);
		return;
	}
	c->r = *r;
	memset(r, 0, sizeof *r);
	/* replies name the model as the request did: an Ollama name is resolved to another */
	api_meta_init(&c->meta, c->r.kind, c->r.asked ? c->r.asked : c->r.model);
	/* the model is checked once hello is answered */
}
