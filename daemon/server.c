/*
 * server.c: the loop thread. One libevent base serves the listening
 * socket, every connection, the scheduler's wake-ups and signals. The
 * listening socket is bound here, or passed by systemd (socket activation):
 * then it is systemd's, and its file stays when residentd stops.
 *
 * A connection's input is parsed as frames: the 4-byte length is checked
 * against the limit before the body is buffered (bufferevent's read
 * watermark keeps at most one frame in memory), then the body is decoded
 * and dispatched. A malformed frame gets an error and the connection lives
 * on; an oversized one gets an error and the connection is closed after
 * it is flushed, since the stream cannot be resynchronised. A connection
 * whose unsent replies exceed max_output is dropped as too slow, so a stuck
 * client never makes the daemon buffer without bound.
 *
 *   CONN_OPEN --(bad frame length, frame timeout,   --> CONN_CLOSING --(flushed)--> CONN_DEAD --> freed
 *       |        one client over max_clients)                            ^
 *       \--------------(EOF, error, too slow)----------------------------/
 *
 * A connection is never freed inside one of its own callbacks: conn_kill
 * marks it dead and a zero timeout frees it from the loop afterwards.
 *
 * What clients can make the loop hold is bounded: at most max_clients
 * connections (one more is told overloaded and closed), and the frames
 * being received together reserve at most the input budget, the frames of
 * one uid at most half of it. A frame reserves its length when its header
 * arrives and the rest is still to come; one that would go over waits, its
 * connection unread, until a reservation is given back (a frame done, a
 * connection gone), so no frame waits on a frame that waits. A reserved
 * frame not whole frame_timeout seconds after its reservation ends its
 * connection (frame_timeout): trickling bytes does not keep the budget.
 */
#include "config.h"
#include "server.h"
#include "listener.h"
#include "chat_tools.h"
#include "log.h"
#include "proto.h"
#include "sched.h"
#include "store.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#ifdef HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

enum conn_state { CONN_OPEN, CONN_CLOSING, CONN_DEAD };

/* A request not finished; session turns are known by their session, one at a time. */
struct inflight {
	uint64_t id;
	char session[37];           /* a generate's session, or "" */
};

struct conn {
	uint64_t id;
	enum conn_state state;
	struct server *srv;
	struct bufferevent *bev;
	uid_t uid;
	pid_t pid;
	char client[PROTO_MAX_CLIENT + 1];
	struct inflight *inflight;  /* requests not finished */
	int n_inflight, cap_inflight;
	size_t reserved;            /* the input budget held by the frame being received (0: none) */
	int waiting;                /* its next frame waits for the input budget; reading is off */
	struct event *stall_ev;     /* the reserved frame is not whole frame_timeout seconds after its reservation */
	struct event *hup_ev;       /* while it waits, unread: its client hung up (EV_CLOSED) */
	struct conn *next;
};

struct server {
	struct event_base *base;
	struct server_opts o;
	char *socket_path;
	int owns_path;              /* residentd made the socket file (not systemd): it removes it */
	char *default_model;
	struct evconnlistener *listener;
	struct listener_pause pause;  /* accepting paused after accept() failed */
	struct event *wake_ev;
	struct store *store;
	struct sched *sched;
	struct conn *conns;
	int n_conns;                /* not dead */
	size_t in_budget, in_reserved;
	int n_waiting;              /* connections waiting for the input budget */
	int refusing;               /* a client over max_clients was refused since one was taken (logged once) */
	uint64_t next_id;
	int shutting_down;
};

static void conn_read_cb(struct bufferevent *bev, void *arg);
static void conn_write_cb(struct bufferevent *bev, void *arg);
static void conn_event_cb(struct bufferevent *bev, short what, void *arg);

/* ---- connections ---- */

/* Finds a live connection by id. */
static struct conn *
conn_find(struct server *srv, uint64_t id)
{
	struct conn *c;

	for (c = srv->conns; c != NULL; c = c->next)
		if (c->id == id && c->state != CONN_DEAD)
			return c;
	return NULL;
}

/* Unlinks and frees a connection. */
static void
conn_free(struct conn *c)
{
	struct conn **pp;

	for (pp = &c->srv->conns; *pp != c; pp = &(*pp)->next)
		;
	*pp = c->next;
	event_free(c->hup_ev); /* before the socket it watches is closed */
	bufferevent_free(c->bev);
	event_free(c->stall_ev);
	free(c->inflight);
	free(c);
}

static void
conn_free_cb(evutil_socket_t fd, short what, void *arg)
{
	conn_free(arg);
}

/*
 * The connection's next frame waits for the input budget: reading stops, and
 * its client's hang-up is watched for instead (reading nothing, it would not
 * see the EOF).
 */
static void
wait_begin(struct conn *c)
{
	bufferevent_disable(c->bev, EV_READ);
	if (c->waiting)
		return;
	c->waiting = 1;
	c->srv->n_waiting++;
	event_add(c->hup_ev, NULL);
}

/* The connection waits no longer (reading stays as it is). */
static void
wait_end(struct conn *c)
{
	if (!c->waiting)
		return;
	c->waiting = 0;
	c->srv->n_waiting--;
	event_del(c->hup_ev);
}

/* Lets the connections that wait for the input budget read again: each tries to reserve anew. */
static void
budget_wake(struct server *srv)
{
	struct conn *c;

	for (c = srv->conns; c != NULL && srv->n_waiting > 0; c = c->next)
		if (c->waiting) {
			wait_end(c);
			bufferevent_enable(c->bev, EV_READ);
			/* bytes it read before it waited start no read of their own */
			bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);
		}
}

/* The connection gives back what it held of the input budget, and stops waiting for it. */
static void
budget_release(struct conn *c)
{
	struct server *srv = c->srv;

	evtimer_del(c->stall_ev);
	wait_end(c);
	if (c->reserved == 0)
		return;
	srv->in_reserved -= c->reserved;
	c->reserved = 0;
	budget_wake(srv);
}

/* The connection is over: its requests stop, it is freed once the loop is out of its callbacks. */
static void
conn_kill(struct conn *c)
{
	static const struct timeval now = { 0, 0 };

	if (c->state == CONN_DEAD)
		return;
	c->state = CONN_DEAD;
	c->srv->n_conns--;
	budget_release(c);
	bufferevent_disable(c->bev, EV_READ | EV_WRITE);
	if (c->srv->sched != NULL)
		sched_conn_gone(c->srv->sched, c->id);
	log_debug("client %llu (pid %d) gone", (unsigned long long)c->id, (int)c->pid);
	event_base_once(c->srv->base, -1, EV_TIMEOUT, conn_free_cb, c, &now);
}

/* Stops reading; the connection closes once its output is flushed. */
static void
conn_close_after_flush(struct conn *c)
{
	if (c->state != CONN_OPEN) /* a reply may have dropped it as too slow already */
		return;
	c->state = CONN_CLOSING;
	budget_release(c);
	bufferevent_disable(c->bev, EV_READ);
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
		conn_kill(c);
}

/* Queues a finished reply frame on a connection. */
static void
conn_send(struct conn *c, msgpack_sbuffer *frame)
{
	size_t queued;

	if (c->state == CONN_DEAD)
		return;
	/* what was queued before this frame: one large reply is no sign of a slow reader */
	queued = evbuffer_get_length(bufferevent_get_output(c->bev));
	bufferevent_write(c->bev, frame->data, frame->size);
	if (queued > c->srv->o.max_output) {
		log_warn("client %llu (pid %d) reads too slowly; dropping it", (unsigned long long)c->id, (int)c->pid);
		conn_kill(c);
	}
}

/* Sends an error reply (and frees the frame). */
static void
conn_error(struct conn *c, int has_id, uint64_t id, enum proto_err code, const char *msg)
{
	msgpack_sbuffer sb;

	proto_error(&sb, has_id, id, code, msg);
	conn_send(c, &sb);
	msgpack_sbuffer_destroy(&sb);
}

/* Whether request id is in flight on the connection. */
static int
inflight_has(const struct conn *c, uint64_t id)
{
	int i;

	for (i = 0; i < c->n_inflight; i++)
		if (c->inflight[i].id == id)
			return 1;
	return 0;
}

/* Whether a generate on the session is in flight on any connection. */
static int
session_busy(const struct server *srv, const char *uuid)
{
	const struct conn *c;
	int i;

	for (c = srv->conns; c != NULL; c = c->next)
		for (i = 0; i < c->n_inflight; i++)
			if (strcmp(c->inflight[i].session, uuid) == 0)
				return 1;
	return 0;
}

static void
inflight_add(struct conn *c, uint64_t id, const char *session)
{
	if (c->n_inflight == c->cap_inflight) {
		c->cap_inflight = c->cap_inflight ? c->cap_inflight * 2 : 8;
		c->inflight = xrealloc(c->inflight, (size_t)c->cap_inflight * sizeof *c->inflight);
	}
	c->inflight[c->n_inflight].id = id;
	snprintf(c->inflight[c->n_inflight++].session, sizeof c->inflight->session, "%s", session ? session : "");
}

static void
inflight_del(struct conn *c, uint64_t id)
{
	int i;

	for (i = 0; i < c->n_inflight; i++)
		if (c->inflight[i].id == id) {
			c->inflight[i] = c->inflight[--c->n_inflight];
			return;
		}
}

/* ---- replies built here ---- */

/* Packs a session map. */
static void
pack_session(msgpack_packer *pk, const struct store_session *ss)
{
	/* PROTOCOL.md: sampling defaults, if set, appear as `defaults` */
	json_t *d = ss->defaults ? json_loads(ss->defaults, 0, NULL) : NULL;
	const char *k;
	json_t *v;

	if (d != NULL && (!json_is_object(d) || json_object_size(d) == 0)) {
		json_decref(d);
		d = NULL;
	}
	msgpack_pack_map(pk, d ? 9 : 8);
	if (d != NULL) {
		proto_pack_str(pk, "defaults");
		msgpack_pack_map(pk, (uint32_t)json_object_size(d));
		json_object_foreach(d, k, v) {
			proto_pack_str(pk, k);
			if (json_is_integer(v) && json_integer_value(v) >= 0)
				msgpack_pack_uint64(pk, (uint64_t)json_integer_value(v));
			else
				msgpack_pack_double(pk, json_number_value(v));
		}
		json_decref(d);
	}
	proto_pack_kv_str(pk, "session", ss->uuid);
	proto_pack_kv_str(pk, "title", ss->title);
	proto_pack_kv_str(pk, "model", ss->model);
	proto_pack_kv_str(pk, "system", ss->system);
	proto_pack_kv_uint(pk, "created", (uint64_t)ss->created);
	proto_pack_kv_uint(pk, "updated", (uint64_t)ss->updated);
	proto_pack_kv_uint(pk, "tokens", (uint64_t)ss->n_tokens);
	proto_pack_kv_uint(pk, "turns", (uint64_t)ss->n_turns);
}

/* Maps a store error to a protocol error. */
static enum proto_err
store_pe(int rc)
{
	switch (rc) {
	case ERR_NOTFOUND: return PE_NOT_FOUND;
	case ERR_INVAL: case ERR_RANGE: return PE_INVALID_PARAM;
	case ERR_QUOTA: return PE_QUOTA_EXCEEDED;
	case ERR_NOSPACE: return PE_STORAGE_FULL;
	case ERR_BUSY: return PE_SESSION_BUSY;
	default: return PE_INTERNAL;
	}
}

/* A result holding one session. */
static void
reply_session(struct conn *c, uint64_t id, const struct store_session *ss)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;

	proto_reply_begin(&sb, &pk, 1, id, "result", 1);
	proto_pack_str(&pk, "session");
	pack_session(&pk, ss);
	proto_reply_end(&sb);
	conn_send(c, &sb);
	msgpack_sbuffer_destroy(&sb);
}

/*
 * A stored turn's tool calls (*calls NULL and *n 0 for none). The row was
 * written by chat_calls_json: one that does not read back goes without its calls.
 */
static void
turn_calls(const struct store_turn *t, struct chat_call **calls, size_t *n)
{
	*calls = NULL, *n = 0;
	if (t->tool_calls[0] != '\0' && chat_calls_from_json(t->tool_calls, calls, n, NULL) != 0) {
		chat_calls_free(*calls, *n);
		*calls = NULL, *n = 0;
	}
}

/*
 * A stored turn in session.get: role, content, tokens, and where not
 * empty its reasoning, tool calls, and a tool result's call id and tool.
 */
static void
pack_turn(msgpack_packer *pk, const struct store_turn *t)
{
	struct chat_call *calls;
	size_t n_calls;

	turn_calls(t, &calls, &n_calls);
	msgpack_pack_map(pk, 3 + (t->reasoning[0] != '\0') + (n_calls > 0) + (t->tool_call_id[0] != '\0') +
	    (t->tool_name[0] != '\0'));
	proto_pack_kv_str(pk, "role", t->role);
	proto_pack_kv_str(pk, "content", t->content);
	if (t->reasoning[0] != '\0')
		proto_pack_kv_str(pk, "reasoning", t->reasoning);
	if (n_calls > 0) {
		proto_pack_str(pk, "tool_calls");
		proto_pack_calls(pk, calls, n_calls);
	}
	if (t->tool_call_id[0] != '\0')
		proto_pack_kv_str(pk, "tool_call_id", t->tool_call_id);
	if (t->tool_name[0] != '\0')
		proto_pack_kv_str(pk, "name", t->tool_name);
	proto_pack_kv_uint(pk, "tokens", (uint64_t)t->n_tokens);
	chat_calls_free(calls, n_calls);
}

/* A stored turn as a message of the history (its strings moved out of t). */
static void
history_msg(struct proto_msg *m, struct store_turn *t)
{
	size_t n;

	m->role = t->role, t->role = NULL;
	m->content = t->content, t->content = NULL;
	if (t->reasoning[0] != '\0')
		m->reasoning = t->reasoning, t->reasoning = NULL;
	turn_calls(t, &m->calls, &n);
	m->n_calls = (int)n;
	if (t->tool_call_id[0] != '\0')
		m->tool_call_id = t->tool_call_id, t->tool_call_id = NULL;
	if (t->tool_name[0] != '\0')
		m->name = t->tool_name, t->tool_name = NULL;
}

/* A result with nothing in it. */
static void
reply_empty(struct conn *c, uint64_t id)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;

	proto_reply_begin(&sb, &pk, 1, id, "result", 0);
	proto_reply_end(&sb);
	conn_send(c, &sb);
	msgpack_sbuffer_destroy(&sb);
}

static void
op_hello(struct conn *c, struct proto_req *r)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;

	if (r->client != NULL)
		snprintf(c->client, sizeof c->client, "%s", r->client);
	proto_reply_begin(&sb, &pk, 1, r->id, "result", 5);
	proto_pack_kv_uint(&pk, "version", PROTO_VERSION);
	proto_pack_kv_str(&pk, "server", "residentd " PACKAGE_VERSION);
	proto_pack_kv_uint(&pk, "max_frame", c->srv->o.max_frame);
	proto_pack_kv_uint(&pk, "uid", c->uid);
	proto_pack_str(&pk, "capabilities");
	msgpack_pack_array(&pk, 1);
	proto_pack_str(&pk, "embed");
	proto_reply_end(&sb);
	conn_send(c, &sb);
	msgpack_sbuffer_destroy(&sb);
}

static void
op_session_list(struct conn *c, struct proto_req *r)
{
	struct store_session *ss = NULL;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	char err[ERR_LEN];
	int n = 0, i, rc;

	if ((rc = store_session_list(c->srv->store, c->uid, r->limit, r->offset, &ss, &n, err)) != 0) {
		conn_error(c, 1, r->id, store_pe(rc), err);
		return;
	}
	proto_reply_begin(&sb, &pk, 1, r->id, "result", 1);
	proto_pack_str(&pk, "sessions");
	msgpack_pack_array(&pk, (uint32_t)n);
	for (i = 0; i < n; i++)
		pack_session(&pk, &ss[i]);
	proto_reply_end(&sb);
	conn_send(c, &sb);
	msgpack_sbuffer_destroy(&sb);
	store_sessions_free(ss, n);
}

static void
op_session_get(struct conn *c, struct proto_req *r)
{
	struct store_session ss;
	struct store_turn *t = NULL;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	char err[ERR_LEN];
	int n = 0, i, rc;

	if ((rc = store_session_get(c->srv->store, c->uid, r->session, &ss, err)) != 0 ||
	    (rc = store_turns(c->srv->store, c->uid, r->session, &t, &n, err)) != 0) {
		store_session_clear(&ss);
		conn_error(c, 1, r->id, store_pe(rc), err);
		return;
	}
	proto_reply_begin(&sb, &pk, 1, r->id, "result", 2);
	proto_pack_str(&pk, "session");
	pack_session(&pk, &ss);
	proto_pack_str(&pk, "turns");
	msgpack_pack_array(&pk, (uint32_t)n);
	for (i = 0; i < n; i++)
		pack_turn(&pk, &t[i]);
	proto_reply_end(&sb);
	conn_send(c, &sb);
	msgpack_sbuffer_destroy(&sb);
	store_session_clear(&ss);
	store_turns_free(t, n);
}

/* session.new, .fork, .rename, .delete: one store call each. */
static void
op_session_change(struct conn *c, struct proto_req *r)
{
	struct store *st = c->srv->store;
	struct store_session ss;
	char err[ERR_LEN];
	int rc;

	memset(&ss, 0, sizeof ss);
	switch (r->op) {
	case OP_SESSION_NEW:
		if (r->model != NULL && !sched_model_known(c->srv->sched, r->model)) {
			rc = err_set(err, ERR_NOTFOUND, "no such model: %s", r->model);
			break;
		}
		rc = store_session_new(st, c->uid, r->model ? r->model : c->srv->default_model, r->title,
		    r->system, r->defaults, &ss, err);
		break;
	case OP_SESSION_FORK:
		if ((rc = store_session_fork(st, c->uid, r->session, r->title, &ss, err)) == 0)
			sched_session_forked(c->srv->sched, r->session, ss.uuid);
		break;
	case OP_SESSION_RENAME:
		if ((rc = store_session_rename(st, c->uid, r->session, r->title, err)) == 0)
			rc = store_session_get(st, c->uid, r->session, &ss, err);
		break;
	default:
		if ((rc = store_session_delete(st, c->uid, r->session, err)) == 0)
			sched_session_dropped(c->srv->sched, r->session);
		break;
	}
	if (rc != 0)
		conn_error(c, 1, r->id, store_pe(rc), err);
	else if (r->op == OP_SESSION_DELETE)
		reply_empty(c, r->id);
	else
		reply_session(c, r->id, &ss);
	store_session_clear(&ss);
}

/* Applies a session's stored sampling defaults to the fields the request left out. */
static void
apply_defaults(struct proto_req *r, const char *json)
{
	struct proto_req d;
	json_t *j = json ? json_loads(json, 0, NULL) : NULL, *v;

	if (j == NULL)
		return;
	memset(&d, 0, sizeof d);
	proto_sample_defaults(&d);
#define DEF(bit, key, field, conv) \
	if (!(r->set & (bit)) && (v = json_object_get(j, key)) != NULL) r->field = conv(v)
	DEF(SET_TEMPERATURE, "temperature", sample.temperature, (float)json_number_value);
	DEF(SET_TOP_K, "top_k", sample.top_k, (int32_t)json_integer_value);
	DEF(SET_TOP_P, "top_p", sample.top_p, (float)json_number_value);
	DEF(SET_MIN_P, "min_p", sample.min_p, (float)json_number_value);
	DEF(SET_REPEAT, "repeat_penalty", sample.repeat_penalty, (float)json_number_value);
	DEF(SET_PRESENCE, "presence_penalty", sample.presence_penalty, (float)json_number_value);
	DEF(SET_FREQUENCY, "frequency_penalty", sample.frequency_penalty, (float)json_number_value);
	DEF(SET_SEED, "seed", sample.seed, (uint64_t)json_integer_value);
	DEF(SET_MAX_TOKENS, "max_tokens", max_tokens, (int32_t)json_integer_value);
	DEF(SET_KEEP_ALIVE, "keep_alive", keep_alive, (float)json_number_value);
#undef DEF
	/* the scheduler tells a keep-alive given from the daemon's default by this bit */
	if (json_object_get(j, "keep_alive") != NULL)
		r->set |= SET_KEEP_ALIVE;
	json_decref(j);
}

/*
 * Reads a session's history into the job. Returns 0 or sends the error:
 * also session_busy while another generate on it is in flight, since a
 * turn made from a history that another turn then extends would be stored
 * after it without having seen it.
 */
static int
load_session(struct conn *c, struct sched_job *job)
{
	struct store_session ss;
	struct store_turn *t = NULL;
	char err[ERR_LEN];
	int64_t total;
	int n = 0, i, rc;

	rc = store_session_get(c->srv->store, c->uid, job->req.session, &ss, err);
	if (rc == 0 && session_busy(c->srv, job->req.session))
		rc = err_set(err, ERR_BUSY, "the session has a turn generating already; wait for its done, or cancel it");
	if (rc != 0 || (rc = store_turns(c->srv->store, c->uid, job->req.session, &t, &n, err)) != 0) {
		store_turns_free(t, n);
		store_session_clear(&ss);
		conn_error(c, 1, job->req.id, store_pe(rc), err);
		return -1;
	}
	/* sized by the turns read, not the session's count: another process may write between the two reads */
	for (i = 0, total = 0; i < n; i++)
		total += t[i].n_tokens;
	job->history = xcalloc((size_t)(n ? n : 1), sizeof *job->history);
	job->history_ids = xmalloc((size_t)MAX(total, 1) * sizeof *job->history_ids);
	for (i = 0; i < n; i++) {
		history_msg(&job->history[i], &t[i]);
		if (t[i].n_tokens > 0) /* a turn stored without tokens (a system message's) has none to copy: NULL */
			memcpy(job->history_ids + job->history_tokens, t[i].tokens, (size_t)t[i].n_tokens * sizeof(int32_t));
		job->history_tokens += t[i].n_tokens;
	}
	job->n_history = n;
	job->session_system = ss.system, ss.system = NULL;
	job->session_model = ss.model[0] ? ss.model : NULL;
	ss.model = job->session_model ? NULL : ss.model;
	apply_defaults(&job->req, ss.defaults);
	store_turns_free(t, n);
	store_session_clear(&ss);
	return 0;
}

/* Copies the connections' descriptions for status. */
static void
add_clients(struct server *srv, struct sched_job *job)
{
	struct conn *c;
	int n = 0;

	for (c = srv->conns; c != NULL; c = c->next)
		n++;
	job->clients = xcalloc((size_t)(n ? n : 1), sizeof *job->clients);
	for (c = srv->conns; c != NULL; c = c->next, job->n_clients++) {
		struct sched_client *k = &job->clients[job->n_clients];

		k->pid = (int)c->pid;
		k->uid = c->uid;
		snprintf(k->client, sizeof k->client, "%s", c->client);
		k->requests = c->n_inflight;
	}
}

/* Hands a request to the scheduler; it replies through events. */
static void
submit(struct conn *c, struct proto_req *r)
{
	struct sched_job *job = xcalloc(1, sizeof *job);

	job->conn = c->id;
	job->req = *r;
	memset(r, 0, sizeof *r);
	job->uid = c->uid;
	job->t_submit = now_ns();
	if (job->req.op == OP_GENERATE && job->req.session != NULL && load_session(c, job) != 0) {
		sched_job_free(job);
		return;
	}
	if (job->req.op == OP_STATUS)
		add_clients(c->srv, job);
	inflight_add(c, job->req.id, job->req.op == OP_GENERATE ? job->req.session : NULL);
	sched_submit(c->srv->sched, job);
}

/* Runs one decoded request. */
static void
dispatch(struct conn *c, struct proto_req *r)
{
	char err[ERR_LEN];

	if (inflight_has(c, r->id)) {
		conn_error(c, 1, r->id, PE_DUPLICATE_ID, "a request with this id is still in flight");
		return;
	}
	if (c->srv->shutting_down) {
		conn_error(c, 1, r->id, PE_SHUTTING_DOWN, "the daemon is stopping");
		return;
	}
	if (c->n_inflight >= PROTO_MAX_INFLIGHT) {
		snprintf(err, sizeof err, "this connection has %d requests in flight, the most allowed; "
		    "wait for some to finish", c->n_inflight);
		conn_error(c, 1, r->id, PE_OVERLOADED, err);
		return;
	}
	switch (r->op) {
	case OP_HELLO: op_hello(c, r); break;
	case OP_CANCEL: sched_cancel(c->srv->sched, c->id, r->target, r->id); inflight_add(c, r->id, NULL); break;
	case OP_SESSION_LIST: op_session_list(c, r); break;
	case OP_SESSION_GET: op_session_get(c, r); break;
	case OP_SESSION_NEW: case OP_SESSION_FORK: case OP_SESSION_RENAME: case OP_SESSION_DELETE:
		op_session_change(c, r);
		break;
	default: submit(c, r); break;
	}
}

/* ---- input ---- */

/* The input budget the frames of uid's connections hold. */
static size_t
uid_reserved(const struct server *srv, uid_t uid)
{
	const struct conn *c;
	size_t n = 0;

	for (c = srv->conns; c != NULL; c = c->next)
		if (c->uid == uid)
			n += c->reserved;
	return n;
}

/*
 * A frame of len bytes is being received: it reserves its length, or waits
 * for the budget to have it. With nothing reserved a frame always may, so
 * that one frame of the largest size always goes through.
 */
static void
frame_pending(struct conn *c, uint32_t len)
{
	struct server *srv = c->srv;
	struct timeval tv = { srv->o.frame_timeout, 0 };

	if (c->reserved > 0)
		return;
	if (srv->in_reserved > 0 && (srv->in_reserved + len > srv->in_budget ||
	    uid_reserved(srv, c->uid) + len > srv->in_budget / 2)) {
		wait_begin(c);
		log_debug("client %llu: a frame of %u bytes waits for the input budget (%zu of %zu held)",
		    (unsigned long long)c->id, len, srv->in_reserved, srv->in_budget);
		return;
	}
	c->reserved = len;
	srv->in_reserved += len;
	evtimer_add(c->stall_ev, &tv);
}

/* The reserved frame is not whole frame_timeout seconds on: the stream is given up. */
static void
conn_stall_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	size_t have = evbuffer_get_length(bufferevent_get_input(c->bev));
	char err[ERR_LEN];

	snprintf(err, sizeof err, "a frame of %zu bytes was not whole %d s after it began (%zu bytes came); "
	    "closing the connection", c->reserved, c->srv->o.frame_timeout, have > 4 ? have - 4 : 0);
	log_warn("client %llu (pid %d): %s", (unsigned long long)c->id, (int)c->pid, err);
	conn_error(c, 0, 0, PE_FRAME_TIMEOUT, err);
	conn_close_after_flush(c);
}

/* Parses and dispatches every complete frame in the input buffer. */
static void
conn_read_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	struct proto_req r;
	unsigned char hdr[4];
	char err[ERR_LEN], *body;
	uint32_t len;
	int has_id, rc;

	while (c->state == CONN_OPEN && evbuffer_get_length(in) >= 4) {
		evbuffer_copyout(in, hdr, 4);
		len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
		if (len == 0 || len > c->srv->o.max_frame) {
			snprintf(err, sizeof err, "a frame of %u bytes (1..%zu allowed)", len, c->srv->o.max_frame);
			conn_error(c, 0, 0, PE_FRAME_TOO_LARGE, err);
			conn_close_after_flush(c);
			return;
		}
		if (evbuffer_get_length(in) < 4 + (size_t)len) {
			frame_pending(c, len);
			return;
		}
		if (c->reserved > 0)
			budget_release(c);
		evbuffer_drain(in, 4);
		body = (char *)evbuffer_pullup(in, len);
		rc = proto_decode(body, len, &r, &has_id, err);
		evbuffer_drain(in, len);
		if (rc != 0)
			conn_error(c, has_id, r.id, (enum proto_err)rc, err);
		else
			dispatch(c, &r);
		proto_req_free(&r);
	}
}

static void
conn_write_cb(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;

	if (c->state == CONN_CLOSING && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		conn_kill(c);
}

static void
conn_event_cb(struct bufferevent *bev, short what, void *arg)
{
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		conn_kill(arg);
}

/* A waiting connection's client hung up (it reads nothing then, so the EOF would not be seen). */
static void
conn_hup_cb(evutil_socket_t fd, short what, void *arg)
{
	conn_kill(arg);
}

/* One client more than max_clients: told so, without reading what it sent. */
static void
conn_refuse(struct conn *c)
{
	char err[ERR_LEN];

	snprintf(err, sizeof err, "too many clients: %d connected, the most this residentd takes "
	    "(--max-clients); try again later", c->srv->o.max_clients);
	if (!c->srv->refusing) /* once until a client is taken again: a flood of them does not fill the log */
		log_warn("client %llu (pid %d) refused: %d clients connected", (unsigned long long)c->id,
		    (int)c->pid, c->srv->o.max_clients);
	c->srv->refusing = 1;
	conn_error(c, 0, 0, PE_OVERLOADED, err);
	conn_close_after_flush(c);
}

/* A new client: who it is (SO_PEERCRED), then frames. */
static void
accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
	struct server *srv = arg;
	struct ucred cred;
	socklen_t clen = sizeof cred;
	struct conn *c;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
		log_warn("SO_PEERCRED: %s; refusing the client", strerror(errno));
		close(fd);
		return;
	}
	c = xcalloc(1, sizeof *c);
	c->id = ++srv->next_id;
	c->srv = srv;
	c->uid = cred.uid;
	c->pid = cred.pid;
	c->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
	c->stall_ev = evtimer_new(srv->base, conn_stall_cb, c);
	c->hup_ev = event_new(srv->base, fd, EV_CLOSED, conn_hup_cb, c);
	bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
	/* never buffer more than one frame of input */
	bufferevent_setwatermark(c->bev, EV_READ, 0, 4 + srv->o.max_frame);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	c->next = srv->conns;
	srv->conns = c;
	listener_pause_ok(&srv->pause);
	if (++srv->n_conns > srv->o.max_clients) {
		conn_refuse(c);
		return;
	}
	srv->refusing = 0;
	log_debug("client %llu: pid %d uid %u", (unsigned long long)c->id, (int)c->pid, (unsigned)c->uid);
}

/* ---- events from the scheduler ---- */

/*
 * Commits a finished session turn; on failure the done becomes an error
 * saying why (storage_full when the disk is full: the session is as it
 * was, and the same turn can be asked again once there is room).
 */
static void
commit_turn(struct server *srv, struct sched_event *ev)
{
	char err[ERR_LEN], msg[ERR_LEN + 32];
	int rc;

	if ((rc = store_append_turns(srv->store, ev->uid, ev->session, ev->after, ev->turns, ev->n_turns, err)) == 0)
		return;
	log_error("saving a turn of session %s: %s", ev->session, err);
	snprintf(msg, sizeof msg, "the turn could not be saved: %s", err);
	msgpack_sbuffer_destroy(&ev->frame);
	proto_error(&ev->frame, 1, ev->req_id, store_pe(rc), msg);
}

void
server_deliver(struct server *srv)
{
	struct sched_event *ev, *next;
	struct conn *c;
	char err[ERR_LEN];

	for (ev = sched_take_events(srv->sched); ev != NULL; ev = next) {
		next = ev->next;
		if (ev->n_turns > 0)
			commit_turn(srv, ev);
		if (ev->model_loaded != NULL && store_model_upsert(srv->store, ev->model_loaded, ev->model_loaded,
		    "", "", 0, err) != 0)
			log_warn("recording model %s: %s", ev->model_loaded, err);
		if ((c = conn_find(srv, ev->conn)) != NULL) {
			if (ev->last)
				inflight_del(c, ev->req_id);
			conn_send(c, &ev->frame);
		}
		sched_event_free(ev);
	}
}

static void
wake_cb(evutil_socket_t fd, short what, void *arg)
{
	server_deliver(arg);
}

void
server_wake(void *arg)
{
	struct server *srv = arg;

	event_active(srv->wake_ev, EV_READ, 0);
}

/* ---- the socket ---- */

/* Refuses to replace a socket another program answers on, or another file; removes a stale socket. */
static int
claim_path(const char *path, char *err)
{
	char msg[256];

	if (listener_claim_path(path, msg, sizeof msg) != 0)
		return err_set(err, ERR_IO, "%s: %s", path, msg);
	return 0;
}

/*
 * Refuses a socket directory another user could write to or own: in /tmp,
 * anyone may create /tmp/resident-UID first and swap our socket for theirs.
 */
static int
check_private(const char *dir, char *err)
{
	struct stat st;

	if (lstat(dir, &st) != 0)
		return err_set(err, ERR_IO, "%s: %s", dir, strerror(errno));
	if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077) != 0)
		return err_set(err, ERR_IO,
		    "%s: unsafe socket directory (owner uid %u, mode %03o): it must be a directory of uid "
		    "%u with mode 0700; remove it or give a socket path with -s",
		    dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)getuid());
	return 0;
}

/* Creates the socket's directory (0700) if it is missing. */
static int
make_parent(const char *path, int private_dir, char *err)
{
	char *dir = xstrdup(path), *p, *last;
	int rc = 0;

	for (p = dir + 1; (p = strchr(p, '/')) != NULL; p++) {
		*p = '\0';
		if (mkdir(dir, 0700) != 0 && errno != EEXIST)
			rc = err_set(err, ERR_IO, "%s: %s", dir, strerror(errno));
		*p = '/';
		if (rc != 0)
			break;
	}
	if (rc == 0 && private_dir && (last = strrchr(dir, '/')) != NULL && last != dir) {
		*last = '\0';
		rc = check_private(dir, err);
	}
	free(dir);
	return rc;
}

/* Binds and listens on the socket path of the options (created 0600, or 0660 for the group). */
static int
listen_path(struct server *srv, char *err)
{
	const struct server_opts *o = &srv->o;
	struct sockaddr_un sa;
	mode_t old;
	int rc;

	if (strlen(o->socket_path) >= sizeof sa.sun_path)
		return err_set(err, ERR_INVAL, "socket path %s is too long", o->socket_path);
	if ((rc = make_parent(o->socket_path, o->private_dir, err)) != 0 || (rc = claim_path(o->socket_path, err)) != 0)
		return rc;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", o->socket_path);
	/* the socket is born 0600: no moment where others could connect */
	old = umask(0177);
	srv->listener = evconnlistener_new_bind(srv->base, accept_cb, srv,
	    LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 64, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (srv->listener == NULL)
		return err_set(err, ERR_IO, "%s: cannot listen: %s", o->socket_path, strerror(errno));
	srv->owns_path = 1;
	if (o->group != (gid_t)-1 && (chown(o->socket_path, (uid_t)-1, o->group) != 0 ||
	    chmod(o->socket_path, 0660) != 0))
		return err_set(err, ERR_IO, "%s: cannot give the socket to group %u: %s", o->socket_path,
		    (unsigned)o->group, strerror(errno));
	return 0;
}

/* ---- socket activation (systemd's LISTEN_FDS protocol, sd_listen_fds(3)) ---- */

#define LISTEN_FDS_START 3

/*
 * How many sockets systemd passed, from fd 3 on: 0 when LISTEN_PID is not
 * this process (the variables were meant for another), or a negative errno.
 * The variables are removed so that no child takes the sockets for its own.
 */
static int
activation_fds(void)
{
#ifdef HAVE_LIBSYSTEMD
	return sd_listen_fds(1);
#else
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	char *end;
	long n = 0;
	int fd;

	if (pid != NULL && fds != NULL) {
		errno = 0;
		if (strtol(pid, &end, 10) == (long)getpid() && *end == '\0' && errno == 0) {
			n = strtol(fds, &end, 10);
			if (*end != '\0' || end == fds || errno != 0 || n < 0 || n > INT_MAX - LISTEN_FDS_START)
				n = -EINVAL;
		}
	}
	for (fd = LISTEN_FDS_START; fd < LISTEN_FDS_START + n; fd++)
		if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
			n = -errno;
			break;
		}
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return (int)n;
#endif
}

/* An int socket option of fd's. */
static int
sockopt_int(int fd, int opt, int *v)
{
	socklen_t len = sizeof *v;

	return getsockopt(fd, SOL_SOCKET, opt, v, &len);
}

/* Checks that fd is a listening AF_UNIX stream socket, saying what it is not. */
static int
check_activated(int fd, char *err)
{
	struct stat st;
	int domain, type, listening;

	if (fstat(fd, &st) != 0)
		return err_set(err, ERR_IO, "socket activation: fd %d: %s", fd, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return err_set(err, ERR_INVAL, "socket activation: fd %d is not a socket", fd);
	if (sockopt_int(fd, SO_DOMAIN, &domain) != 0 || sockopt_int(fd, SO_TYPE, &type) != 0 ||
	    sockopt_int(fd, SO_ACCEPTCONN, &listening) != 0)
		return err_set(err, ERR_IO, "socket activation: fd %d: %s", fd, strerror(errno));
	if (domain != AF_UNIX)
		return err_set(err, ERR_INVAL, "socket activation: fd %d is not a Unix socket (address family %d): "
		    "ListenStream= must name a path", fd, domain);
	if (type != SOCK_STREAM)
		return err_set(err, ERR_INVAL, "socket activation: fd %d is not a stream socket (type %d): "
		    "use ListenStream=", fd, type);
	if (!listening)
		return err_set(err, ERR_INVAL, "socket activation: fd %d is not listening: residentd takes the "
		    "listening socket itself (Accept=no)", fd);
	return 0;
}

int
server_activation(int *fd, char *err)
{
	int n = activation_fds();

	*fd = -1;
	if (n < 0)
		return err_set(err, ERR_INVAL, "socket activation: LISTEN_FDS: %s", strerror(-n));
	if (n > 1)
		return err_set(err, ERR_INVAL, "socket activation: systemd passed %d sockets; residentd serves one "
		    "(a single ListenStream= in residentd.socket)", n);
	if (n == 1) {
		if (check_activated(LISTEN_FDS_START, err) != 0)
			return ERR_INVAL;
		*fd = LISTEN_FDS_START;
	}
	return 0;
}

/* Accepts on the socket systemd passed; its file is systemd's and stays when residentd stops. */
static int
listen_activated(struct server *srv, int fd, char *err)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof sa;
	char name[sizeof sa.sun_path + 1];
	int abstract;

	memset(&sa, 0, sizeof sa);
	if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
		return err_set(err, ERR_IO, "socket activation: fd %d: %s", fd, strerror(errno));
	/* a name in the abstract namespace starts with a NUL; systemd writes it with an @ */
	abstract = sa.sun_path[0] == '\0';
	snprintf(name, sizeof name, "%s%.*s", abstract ? "@" : "", (int)sizeof sa.sun_path - abstract,
	    sa.sun_path + abstract);
	free(srv->socket_path);
	srv->socket_path = xstrdup(name);
	srv->o.socket_path = srv->socket_path;
	/* systemd passes it blocking; the loop's accepts must not block */
	if (evutil_make_socket_nonblocking(fd) != 0)
		return err_set(err, ERR_IO, "socket activation: fd %d: %s", fd, strerror(errno));
	/* backlog 0: it listens already, with systemd's Backlog= */
	srv->listener = evconnlistener_new(srv->base, accept_cb, srv, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
	    0, fd);
	if (srv->listener == NULL)
		return err_set(err, ERR_IO, "socket activation: fd %d: cannot accept on it", fd);
	if (srv->o.group != (gid_t)-1)
		log_warn("--group does not apply to the socket systemd passed: set SocketGroup= and "
		    "SocketMode=0660 in residentd.socket");
	log_info("socket activation: serving the socket systemd passed (%s, fd %d)", srv->socket_path, fd);
	return 0;
}

int
server_start(struct event_base *base, const struct server_opts *o, struct store *st,
    struct server **out, char *err)
{
	struct server *srv = xcalloc(1, sizeof *srv);
	int rc;

	srv->base = base;
	srv->o = *o;
	srv->socket_path = xstrdup(o->socket_path);
	srv->default_model = xstrdup(o->default_model ? o->default_model : "");
	srv->o.socket_path = srv->socket_path;
	srv->store = st;
	srv->in_budget = (size_t)MAX((uint64_t)SERVER_IN_BUDGET_MIN, 4 * (uint64_t)o->max_frame);
	rc = o->listen_fd >= 0 ? listen_activated(srv, o->listen_fd, err) : listen_path(srv, err);
	if (rc != 0) {
		server_free(srv);
		return rc;
	}
	srv->wake_ev = event_new(base, -1, 0, wake_cb, srv);
	if (listener_pause_init(&srv->pause, base, srv->listener, "a client") != 0) {
		server_free(srv);
		return err_set(err, ERR_NOMEM, "out of memory");
	}
	*out = srv;
	return 0;
}

const char *
server_socket_path(const struct server *srv)
{
	return srv->socket_path;
}

void
server_set_sched(struct server *srv, struct sched *s)
{
	srv->sched = s;
}

/* Stops accepting; removes the socket file if residentd made it. */
static void
close_listener(struct server *srv)
{
	if (srv->listener == NULL)
		return;
	listener_pause_free(&srv->pause);
	evconnlistener_free(srv->listener);
	srv->listener = NULL;
	if (srv->owns_path)
		unlink(srv->socket_path);
}

void
server_shutdown(struct server *srv)
{
	srv->shutting_down = 1;
	close_listener(srv);
}

int
server_flushing(const struct server *srv)
{
	const struct conn *c;

	for (c = srv->conns; c != NULL; c = c->next)
		if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
			return 1;
	return 0;
}

void
server_free(struct server *srv)
{
	if (srv == NULL)
		return;
	srv->sched = NULL;
	while (srv->conns != NULL)
		conn_free(srv->conns);
	close_listener(srv);
	if (srv->wake_ev != NULL)
		event_free(srv->wake_ev);
	free(srv->socket_path);
	free(srv->default_model);
	free(srv);
}
