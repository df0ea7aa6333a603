/*
 * client.c: one connection to residentd. Requests in flight, the input
 * buffer and the dispatch of replies to requests.
 *
 * Every request is a struct req linked on the client from the moment its
 * frame was written until its last reply (`result`, `done` or `error`)
 * came. A blocking call keeps its req on its own stack and waits in
 * wait_req, which dispatches every reply that arrives, its own or not; a
 * request started with rs_generate_start has a heap req, freed after its
 * last callback. Callbacks may start or wait for other requests, so
 * nothing here holds a req pointer across a callback: it is looked up
 * again by id.
 *
 * A request frame is sent straight from where it was built while nothing
 * is queued before it; what the socket does not take goes to an output
 * queue. A client made without RS_NONBLOCK sends each frame whole before
 * the call returns (reading, not dispatching, while the socket is full);
 * one made with it leaves the rest queued for rs_process (or a blocking
 * call) to send when it is writable. A write that fails there marks the client
 * WRITE_FAILED; the next rs_process ends it, so that no callback runs
 * inside a start function.
 *
 *   OPEN --(EOF, socket error, malformed reply)-----------------> DEAD: every req fails
 *     \--(a queued write fails)--> WRITE_FAILED --(rs_process)--/   with on_error / its status
 */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_CHUNK 65536

struct req {
	uint64_t id;
	int blocking;               /* a blocking call waits for it (the req is on its stack) */
	int hello;                  /* a hello: its result says the daemon's max_frame */
	int finished;               /* blocking: its last reply came */
	int ignore;                 /* a cancel nobody waits for: replies are dropped */
	int cancel_sent;
	rs_status status;           /* blocking: the outcome */
	rs_value *result;           /* blocking: the result or done reply */
	char message[ERRMSG_LEN];   /* blocking: the error message */
	rs_token_cb on_token;
	rs_done_cb on_done;
	rs_error_cb on_error;
	rs_progress_cb on_progress;
	void *user;
	struct req *next;
};

struct rs_client {
	int fd;
	int nonblock;               /* RS_NONBLOCK: starts leave what the socket won't take queued */
	int dead;                   /* the connection is over */
	int write_failed;           /* a queued write failed: the next rs_process ends the connection */
	rs_status dead_status;
	char dead_message[ERRMSG_LEN];
	uint64_t next_id;
	size_t max_frame;           /* the daemon's limit from hello; 0 if unknown */
	struct req *reqs;           /* in flight */
	size_t n_async;             /* of those, started with rs_generate_start */
	unsigned char *buf;         /* input: bytes [pos, len) are not yet dispatched */
	size_t pos, len, cap;
	char *out;                  /* output: bytes [out_pos, out_len) of request frames are not yet sent */
	size_t out_pos, out_len, out_cap;
	rs_status error_status;     /* rs_last_status */
	char error[ERRMSG_LEN];     /* rs_last_error */
};

static void dispatch_all(rs_client *c);

/* Sets the client's last error and returns st. */
static rs_status
fail(rs_client *c, rs_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->error, sizeof c->error, fmt, ap);
	va_end(ap);
	c->error_status = st;
	return st;
}

/* ---- requests ---- */

static struct req *
find_req(rs_client *c, uint64_t id)
{
	struct req *r;

	for (r = c->reqs; r != NULL; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

static void
unlink_req(rs_client *c, struct req *r)
{
	struct req **pp;

	for (pp = &c->reqs; *pp != NULL; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			return;
		}
}

/*
 * A request's last reply: st and (on success) the reply v, whose ownership
 * passes here. A blocking req keeps them for its waiter; an async one gets
 * its callback and is freed.
 */
static void
finish_req(rs_client *c, struct req *r, rs_status st, const char *msg, rs_value *v)
{
	unlink_req(c, r);
	if (r->hello && st == RS_OK)
		c->max_frame = (size_t)rs_uint(rs_get(v, "max_frame"));
	if (r->blocking) {
		r->finished = 1;
		r->status = st;
		r->result = v;
		snprintf(r->message, sizeof r->message, "%s", msg ? msg : "");
		return;
	}
	if (!r->ignore) {
		c->n_async--;
		if (st == RS_OK && r->on_done != NULL)
			r->on_done(r->id, v, r->user);
		else if (st != RS_OK && r->on_error != NULL)
			r->on_error(r->id, st, msg ? msg : rs_strerror(st), r->user);
	}
	rs_value_free(v);
	free(r);
}

/* The connection is over: every request in flight fails with its reason. */
static void
conn_over(rs_client *c, rs_status st, const char *msg)
{
	if (!c->dead) {
		c->dead = 1;
		if (c->dead_status == RS_OK) {
			c->dead_status = st;
			snprintf(c->dead_message, sizeof c->dead_message, "%s", msg);
		}
	}
	while (c->reqs != NULL)
		finish_req(c, c->reqs, c->dead_status, c->dead_message, NULL);
}

/* ---- input ---- */

/*
 * One non-blocking read into the buffer. Returns 1 if bytes came, 0 if
 * none were waiting, -1 if the connection is over (end of file, an error,
 * no memory), with the reason kept for conn_over.
 */
static int
read_some(rs_client *c)
{
	size_t need = READ_CHUNK, body;
	unsigned char *nb;
	ssize_t n;

	if (c->pos > 0) {
		memmove(c->buf, c->buf + c->pos, c->len - c->pos);
		c->len -= c->pos;
		c->pos = 0;
	}
	/* room for the whole frame being received, if that is more */
	if (frame_check(c->buf, c->len, FRAME_MAX_REPLY, &body) == FRAME_MORE && c->len >= 4 &&
	    4 + body - c->len > need)
		need = 4 + body - c->len;
	if (c->cap - c->len < need) {
		if ((nb = realloc(c->buf, c->len + need)) == NULL) {
			c->dead_status = RS_ERR_NOMEM;
			snprintf(c->dead_message, sizeof c->dead_message, "out of memory reading a reply");
			return -1;
		}
		c->buf = nb;
		c->cap = c->len + need;
	}
	do
		n = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n > 0) {
		c->len += (size_t)n;
		return 1;
	}
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	if (c->dead_status == RS_OK) {
		c->dead_status = RS_ERR_IO;
		if (n == 0 || errno == ECONNRESET)
			snprintf(c->dead_message, sizeof c->dead_message, "residentd closed the connection");
		else
			snprintf(c->dead_message, sizeof c->dead_message, "reading from residentd: %s",
			    strerror(errno));
	}
	return -1;
}

/* Reads what is there (a bounded number of times), dispatches it; ends a lost connection. */
static void
pump(rs_client *c)
{
	int i, n = 0;

	for (i = 0; i < 64 && (n = read_some(c)) > 0; i++)
		;
	dispatch_all(c);
	if (n < 0)
		conn_over(c, c->dead_status, c->dead_message);
}

/* 1 if the daemon closes the connection after an error of this code without an id. */
static int
ends_connection(rs_status st)
{
	return st == RS_ERR_FRAME_TOO_LARGE || st == RS_ERR_OVERLOADED || st == RS_ERR_FRAME_TIMEOUT;
}

/*
 * A reply that carries no id: about the connection, not a request. After
 * frame_too_large (a frame of ours over the limit), overloaded (too many
 * clients) and frame_timeout the daemon closes the connection; that is then
 * the reason every request fails, also when the end of the connection
 * (RS_ERR_IO) was seen before the reply was looked at. Others cannot be
 * matched to a request.
 */
static void
dispatch_no_id(rs_client *c, const rs_value *v)
{
	const char *code = rs_str(rs_get(v, "code")), *msg = rs_str(rs_get(v, "message"));
	rs_status st = rs_status_from_code(code);

	if (!ends_connection(st) || (c->dead_status != RS_OK && c->dead_status != RS_ERR_IO))
		return;
	c->dead_status = st;
	snprintf(c->dead_message, sizeof c->dead_message, "%s", msg ? msg : rs_strerror(c->dead_status));
}

/* A reply's string field, or "" when it has none. */
static const char *
reply_str(const rs_value *reply, const char *key)
{
	const char *s = rs_str(rs_get(reply, key));

	return s ? s : "";
}

/* One reply: to its request's callbacks or waiter. Takes ownership of v. */
static void
dispatch(rs_client *c, rs_value *v)
{
	const rs_value *idv = rs_get(v, "id");
	const char *type = rs_str(rs_get(v, "type"));
	struct req *r;
	uint64_t id = rs_uint(idv);
	int stop;

	if (rs_value_type(idv) != RS_TYPE_UINT) {
		dispatch_no_id(c, v);
		rs_value_free(v);
		return;
	}
	if ((r = find_req(c, id)) == NULL || type == NULL) {
		rs_value_free(v);   /* a late reply to something forgotten */
		return;
	}
	if (strcmp(type, "token") == 0) {
		if (r->on_token != NULL && !r->cancel_sent && !r->ignore) {
			stop = r->on_token(id, reply_str(v, "text"), v, r->user);
			/* the callback may have made other calls: look the request up again */
			if (stop && (r = find_req(c, id)) != NULL && !r->cancel_sent) {
				r->cancel_sent = 1;
				rs_cancel_start(c, id);
			}
		}
		rs_value_free(v);
	} else if (strcmp(type, "progress") == 0) {
		if (r->on_progress != NULL)
			r->on_progress(rs_uint(rs_get(v, "done")), rs_uint(rs_get(v, "total")), r->user);
		rs_value_free(v);
	} else if (strcmp(type, "result") == 0 || strcmp(type, "done") == 0) {
		value_map_remove(v, "id");
		value_map_remove(v, "type");
		finish_req(c, r, RS_OK, NULL, v);
	} else if (strcmp(type, "error") == 0) {
		const char *msg = rs_str(rs_get(v, "message"));
		rs_status st = rs_status_from_code(rs_str(rs_get(v, "code")));
		char copy[ERRMSG_LEN];

		snprintf(copy, sizeof copy, "%s", msg ? msg : rs_strerror(st));
		rs_value_free(v);
		finish_req(c, r, st, copy, NULL);
	} else {
		rs_value_free(v);   /* a reply type from a newer daemon */
	}
}

/* Dispatches every complete frame in the buffer. */
static void
dispatch_all(rs_client *c)
{
	char err[ERRMSG_LEN];
	rs_value *v;
	size_t body;
	rs_status st;

	while (!c->dead) {
		switch (frame_check(c->buf + c->pos, c->len - c->pos, FRAME_MAX_REPLY, &body)) {
		case FRAME_MORE:
			return;
		case FRAME_BAD:
			conn_over(c, RS_ERR_PROTOCOL, "residentd sent a frame of a bad length");
			return;
		case FRAME_OK:
			break;
		}
		st = frame_decode((const char *)c->buf + c->pos + 4, body, &v, err);
		/* consumed before dispatching: callbacks may read and dispatch more */
		c->pos += 4 + body;
		if (st != RS_OK) {
			conn_over(c, st, err);
			return;
		}
		dispatch(c, v);
	}
}

/* ---- output ---- */

/*
 * Looks at the replies read and not yet dispatched for one that ends the
 * connection without an id (frame_too_large, ...): the daemon may have
 * said why before it closed (frame_too_large, sent as soon as it read a
 * frame's length, while the rest was still being written; overloaded, sent
 * at once to a client over the limit). That is then the reason, rather
 * than a failed write or the end of file. Nothing is dispatched.
 */
static void
find_end_reason(rs_client *c)
{
	char err[ERRMSG_LEN];
	size_t body, off;
	rs_value *v;

	for (off = c->pos; !ends_connection(c->dead_status) &&
	    frame_check(c->buf + off, c->len - off, FRAME_MAX_REPLY, &body) == FRAME_OK; off += 4 + body) {
		if (frame_decode((const char *)c->buf + off + 4, body, &v, err) != RS_OK)
			break;
		if (rs_value_type(rs_get(v, "id")) != RS_TYPE_UINT)
			dispatch_no_id(c, v);
		rs_value_free(v);
	}
}

/* A write failed: the daemon closed the connection. What it sent before is read for the reason. */
static void
send_failed(rs_client *c, int e)
{
	while (read_some(c) > 0)
		;
	find_end_reason(c);
	if (c->dead_status == RS_OK) {
		c->dead_status = RS_ERR_IO;
		snprintf(c->dead_message, sizeof c->dead_message, "writing to residentd: %s", strerror(e));
	}
}

/*
 * Sends what the socket takes of p (n bytes) without waiting. Returns the
 * bytes sent, or -1 when the write failed (the reason kept for conn_over).
 */
static ssize_t
send_some(rs_client *c, const char *p, size_t n)
{
	size_t done = 0;
	ssize_t k;

	while (done < n) {
		k = send(c->fd, p + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (k > 0) {
			done += (size_t)k;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		send_failed(c, k < 0 ? errno : EPIPE);
		return -1;
	}
	return (ssize_t)done;
}

/* Sends what the socket takes of the output queue without waiting. 0, or -1 when the write failed. */
static int
flush_some(rs_client *c)
{
	ssize_t k = send_some(c, c->out + c->out_pos, c->out_len - c->out_pos);

	if (k < 0)
		return -1;
	c->out_pos += (size_t)k;
	if (c->out_pos == c->out_len)
		c->out_pos = c->out_len = 0;
	return 0;
}

/* Makes room for n more bytes in the output queue, growing it by doubling. */
static rs_status
queue_reserve(rs_client *c, size_t n)
{
	size_t cap;
	char *nb;

	if (c->out_cap - c->out_len >= n)
		return RS_OK;
	if (c->out_pos > 0) {               /* room from what was sent first */
		memmove(c->out, c->out + c->out_pos, c->out_len - c->out_pos);
		c->out_len -= c->out_pos;
		c->out_pos = 0;
		if (c->out_cap - c->out_len >= n)
			return RS_OK;
	}
	if (n > SIZE_MAX / 2 - c->out_len)
		return RS_ERR_NOMEM;
	for (cap = c->out_cap ? c->out_cap : 4096; cap < c->out_len + n; cap *= 2)
		;
	if ((nb = realloc(c->out, cap)) == NULL)
		return RS_ERR_NOMEM;
	c->out = nb;
	c->out_cap = cap;
	return RS_OK;
}

/*
 * Sends the whole output queue, waiting while the socket is full. While it
 * waits it keeps reading (without dispatching), so that the daemon is
 * never blocked on us.
 */
static rs_status
flush_all(rs_client *c)
{
	struct pollfd pfd;

	for (;;) {
		if (flush_some(c) != 0)
			return RS_ERR_IO;
		if (c->out_pos == c->out_len)
			return RS_OK;
		pfd.fd = c->fd;
		pfd.events = POLLIN | POLLOUT;
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
			return RS_ERR_IO;
		if ((pfd.revents & POLLIN) && read_some(c) < 0) {
			find_end_reason(c);
			return RS_ERR_IO;
		}
	}
}

/*
 * Sends a request frame (n bytes at p): straight from p while nothing is
 * queued before it, what the socket does not take through the output
 * queue; a client without RS_NONBLOCK then waits until all of it is sent.
 * Room for the whole frame is made in the queue first, so that running out
 * of memory never leaves part of a frame sent. RS_OK, or an error with the
 * client's message set.
 */
static rs_status
send_frame(rs_client *c, const char *p, size_t n)
{
	int behind = c->out_pos < c->out_len;
	ssize_t sent = 0;

	if (queue_reserve(c, n) != RS_OK)
		return fail(c, RS_ERR_NOMEM, "out of memory queueing a request");
	if (!behind)
		sent = send_some(c, p, n);
	if (sent >= 0) {
		memcpy(c->out + c->out_len, p + sent, n - (size_t)sent);
		c->out_len += n - (size_t)sent;
	}
	if (sent >= 0 && behind && c->nonblock)
		sent = flush_some(c);
	if (c->nonblock) {
		/* a failed write is reported by rs_process, where callbacks may run */
		if (sent < 0)
			c->write_failed = 1;
		return RS_OK;
	}
	if (sent < 0 || flush_all(c) != RS_OK) {
		conn_over(c, c->dead_status, c->dead_message);
		return fail(c, c->dead_status, "%s", c->dead_message);
	}
	return RS_OK;
}

/*
 * Sends request op with the fields of p and extra (either may be NULL; they
 * must not share keys) and links r under a new id. Returns RS_OK, or an
 * error with the client's message set (r is then not linked).
 */
static rs_status
start_req(rs_client *c, struct req *r, const char *op, const rs_params *p, const rs_params *extra)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	rs_status st;

	if (c->dead || c->write_failed)
		return fail(c, c->dead_status, "%s", c->dead_message);
	r->id = ++c->next_id;
	r->hello = strcmp(op, "hello") == 0;
	frame_begin(&sb, &pk, r->id, op, params_count(p) + params_count(extra));
	params_pack(p, &pk);
	params_pack(extra, &pk);
	frame_end(&sb);
	if (sb.data == NULL) {
		msgpack_sbuffer_destroy(&sb);
		return fail(c, RS_ERR_NOMEM, "out of memory building a request");
	}
	if (c->max_frame > 0 && sb.size - 4 > c->max_frame) {
		st = fail(c, RS_ERR_FRAME_TOO_LARGE, "the request is %zu bytes; residentd takes at most %zu",
		    sb.size - 4, c->max_frame);
		msgpack_sbuffer_destroy(&sb);
		return st;
	}
	st = send_frame(c, sb.data, sb.size);
	msgpack_sbuffer_destroy(&sb);
	if (st != RS_OK)
		return st;
	r->next = c->reqs;
	c->reqs = r;
	return RS_OK;
}

/* Waits for a blocking request's last reply, dispatching everything that arrives. */
static rs_status
wait_req(rs_client *c, struct req *r, rs_value **out)
{
	struct pollfd pfd;
	int n = 0;

	while (!r->finished) {
		dispatch_all(c);
		if (r->finished || c->dead)
			break;
		if (!c->write_failed && c->out_pos < c->out_len && flush_some(c) != 0)
			c->write_failed = 1;
		if (!c->write_failed && (n = read_some(c)) > 0)
			continue;
		if (c->write_failed || n < 0) {
			dispatch_all(c);
			conn_over(c, c->dead_status, c->dead_message);
			break;
		}
		pfd.fd = c->fd;
		pfd.events = POLLIN | (c->out_pos < c->out_len ? POLLOUT : 0);
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR) {
			conn_over(c, RS_ERR_IO, "poll failed");
			break;
		}
	}
	if (!r->finished) {         /* the connection ended under a nested call */
		unlink_req(c, r);
		r->status = c->dead_status;
		snprintf(r->message, sizeof r->message, "%s", c->dead_message);
	}
	if (r->status != RS_OK) {
		rs_value_free(r->result);
		r->result = NULL;
		fail(c, r->status, "%s", r->message);
	}
	if (out != NULL)
		*out = r->result;
	else
		rs_value_free(r->result);
	return r->status;
}

/* A blocking call: sends op with p (and extra), waits, returns the result in *out. */
static rs_status
call(rs_client *c, struct req *r, const char *op, const rs_params *p, const rs_params *extra,
    rs_value **out)
{
	rs_status st;

	if (out != NULL)
		*out = NULL;
	r->blocking = 1;
	if ((st = start_req(c, r, op, p, extra)) != RS_OK)
		return st;
	return wait_req(c, r, out);
}

/* ---- the client ---- */

rs_client *
rs_connect(const char *socket_path, int flags, rs_error *err)
{
	char path[4096];
	rs_client *c;
	int fd;

	if (err != NULL) {
		err->code = RS_OK;
		err->message[0] = '\0';
	}
	if (socket_path == NULL) {
		if (rs_default_socket(path, sizeof path) != 0) {
			if (err != NULL) {
				err->code = RS_ERR_INVAL;
				snprintf(err->message, sizeof err->message, "the default socket path is too long");
			}
			return NULL;
		}
		socket_path = path;
	}
	if ((fd = connect_socket(socket_path, flags, err)) < 0)
		return NULL;
	if ((c = calloc(1, sizeof *c)) == NULL) {
		close(fd);
		if (err != NULL) {
			err->code = RS_ERR_NOMEM;
			snprintf(err->message, sizeof err->message, "out of memory");
		}
		return NULL;
	}
	c->fd = fd;
	c->nonblock = (flags & RS_NONBLOCK) != 0;
	return c;
}

void
rs_close(rs_client *c)
{
	struct req *r, *next;

	if (c == NULL)
		return;
	for (r = c->reqs; r != NULL; r = next) {
		next = r->next;
		if (!r->blocking)
			free(r);
	}
	close(c->fd);
	free(c->buf);
	free(c->out);
	free(c);
}

const char *
rs_last_error(const rs_client *c)
{
	return c ? c->error : "no client";
}

rs_status
rs_last_status(const rs_client *c)
{
	return c ? c->error_status : RS_ERR_INVAL;
}

int
rs_fd(const rs_client *c)
{
	return c ? c->fd : -1;
}

size_t
rs_unsent(const rs_client *c)
{
	return c ? c->out_len - c->out_pos : 0;
}

size_t
rs_pending(const rs_client *c)
{
	return c ? c->n_async : 0;
}

rs_status
rs_process(rs_client *c)
{
	if (c == NULL)
		return RS_ERR_INVAL;
	if (!c->dead && !c->write_failed && c->out_pos < c->out_len && flush_some(c) != 0)
		c->write_failed = 1;
	if (!c->dead && c->write_failed) {
		dispatch_all(c);        /* what came before the end is delivered */
		conn_over(c, c->dead_status, c->dead_message);
	} else if (!c->dead) {
		pump(c);
	}
	if (c->dead)
		return fail(c, c->dead_status, "%s", c->dead_message);
	return RS_OK;
}

/* ---- generation ---- */

const char *
rs_reply_reasoning(const rs_value *reply)
{
	return reply_str(reply, "reasoning");
}

const char *
rs_reply_tool(const rs_value *reply)
{
	return reply_str(reply, "tool");
}

unsigned
rs_reply_choice(const rs_value *reply)
{
	return (unsigned)rs_uint(rs_get(reply, "choice"));
}

/* The fields the library adds to a generate: stream, unless the caller chose. */
static rs_status
generate_extra(const rs_params *p, int streaming, rs_params **extra)
{
	*extra = NULL;
	if (params_has(p, "stream"))
		return RS_OK;
	if ((*extra = rs_params_new()) == NULL)
		return RS_ERR_NOMEM;
	return rs_params_set_bool(*extra, "stream", streaming);
}

rs_status
rs_generate(rs_client *c, const rs_params *p, rs_token_cb on_token, void *user, rs_value **done)
{
	struct req r = { .on_token = on_token, .user = user };
	rs_params *extra;
	rs_status st;

	if (done != NULL)
		*done = NULL;
	if (c == NULL || p == NULL)
		return c ? fail(c, RS_ERR_INVAL, "rs_generate: no params") : RS_ERR_INVAL;
	if ((st = generate_extra(p, on_token != NULL, &extra)) != RS_OK) {
		rs_params_free(extra);
		return fail(c, st, "out of memory");
	}
	st = call(c, &r, "generate", p, extra, done);
	rs_params_free(extra);
	return st;
}

uint64_t
rs_generate_start(rs_client *c, const rs_params *p, rs_token_cb on_token, rs_done_cb on_done,
    rs_error_cb on_error, void *user)
{
	struct req *r;
	rs_params *extra;
	rs_status st;

	if (c == NULL || p == NULL) {
		if (c != NULL)
			fail(c, RS_ERR_INVAL, "rs_generate_start: no params");
		return 0;
	}
	if ((r = calloc(1, sizeof *r)) == NULL || generate_extra(p, on_token != NULL, &extra) != RS_OK) {
		free(r);
		fail(c, RS_ERR_NOMEM, "out of memory");
		return 0;
	}
	r->on_token = on_token, r->on_done = on_done, r->on_error = on_error, r->user = user;
	st = start_req(c, r, "generate", p, extra);
	rs_params_free(extra);
	if (st != RS_OK) {
		free(r);
		return 0;
	}
	c->n_async++;
	return r->id;
}

uint64_t
rs_call_start(rs_client *c, const char *op, const rs_params *p, rs_done_cb on_result,
    rs_error_cb on_error, void *user)
{
	struct req *r;

	if (c == NULL || op == NULL) {
		if (c != NULL)
			fail(c, RS_ERR_INVAL, "rs_call_start: no op");
		return 0;
	}
	if ((r = calloc(1, sizeof *r)) == NULL) {
		fail(c, RS_ERR_NOMEM, "out of memory");
		return 0;
	}
	r->on_done = on_result, r->on_error = on_error, r->user = user;
	if (start_req(c, r, op, p, NULL) != RS_OK) {
		free(r);
		return 0;
	}
	c->n_async++;
	return r->id;
}

/* A params holding one uint field; NULL when out of memory. */
static rs_params *
params_uint(const char *key, uint64_t v)
{
	rs_params *p = rs_params_new();

	if (p != NULL && rs_params_set_uint(p, key, v) != RS_OK) {
		rs_params_free(p);
		return NULL;
	}
	return p;
}

rs_status
rs_cancel(rs_client *c, uint64_t target)
{
	struct req r = { 0 };
	rs_params *p;
	rs_status st;

	if (c == NULL)
		return RS_ERR_INVAL;
	if ((p = params_uint("target", target)) == NULL)
		return fail(c, RS_ERR_NOMEM, "out of memory");
	st = call(c, &r, "cancel", p, NULL, NULL);
	rs_params_free(p);
	return st;
}

rs_status
rs_cancel_start(rs_client *c, uint64_t target)
{
	struct req *r;
	rs_params *p;
	rs_status st;

	if (c == NULL)
		return RS_ERR_INVAL;
	if ((r = calloc(1, sizeof *r)) == NULL || (p = params_uint("target", target)) == NULL) {
		free(r);
		return fail(c, RS_ERR_NOMEM, "out of memory");
	}
	r->ignore = 1;
	st = start_req(c, r, "cancel", p, NULL);
	rs_params_free(p);
	if (st != RS_OK)
		free(r);
	return st;
}

/* ---- the other ops ---- */

/*
 * Builds params from (key, string) pairs ending with NULL; a NULL value
 * leaves its key out. NULL when out of memory.
 */
static rs_params *
params_strs(const char *key, ...)
{
	rs_params *p = rs_params_new();
	const char *k, *v;
	va_list ap;

	if (p == NULL)
		return NULL;
	va_start(ap, key);
	for (k = key; k != NULL; k = va_arg(ap, const char *)) {
		v = va_arg(ap, const char *);
		if (v != NULL && rs_params_set_str(p, k, v) != RS_OK) {
			rs_params_free(p);
			p = NULL;
			break;
		}
	}
	va_end(ap);
	return p;
}

/* A blocking op whose fields are p (freed here); NULL p means out of memory. */
static rs_status
call_owned(rs_client *c, const char *op, rs_params *p, rs_progress_cb progress, void *user,
    rs_value **out)
{
	struct req r = { .on_progress = progress, .user = user };
	rs_status st;

	if (out != NULL)
		*out = NULL;
	if (c == NULL) {
		rs_params_free(p);
		return RS_ERR_INVAL;
	}
	if (p == NULL)
		return fail(c, RS_ERR_NOMEM, "out of memory");
	st = call(c, &r, op, p, NULL, out);
	rs_params_free(p);
	return st;
}

rs_status
rs_call(rs_client *c, const char *op, const rs_params *p, rs_value **out)
{
	struct req r = { 0 };

	if (out != NULL)
		*out = NULL;
	if (c == NULL || op == NULL)
		return c ? fail(c, RS_ERR_INVAL, "rs_call: no op") : RS_ERR_INVAL;
	return call(c, &r, op, p, NULL, out);
}

rs_status
rs_hello(rs_client *c, const char *client_name, rs_value **out)
{
	rs_params *p = params_strs("client", client_name, NULL);
	rs_value *v = NULL;
	rs_status st;

	if (p != NULL && rs_params_set_uint(p, "version", RS_PROTOCOL_VERSION) != RS_OK) {
		rs_params_free(p);
		p = NULL;
	}
	st = call_owned(c, "hello", p, NULL, NULL, &v);
	if (out != NULL)
		*out = v;
	else
		rs_value_free(v);
	return st;
}

rs_status
rs_session_new(rs_client *c, const char *model, const char *title, const char *system,
    const rs_params *defaults, rs_value **out)
{
	rs_params *p = params_strs("model", model, "title", title, "system", system, NULL);

	if (p != NULL && defaults != NULL && params_set_params(p, "defaults", defaults) != RS_OK) {
		rs_params_free(p);
		p = NULL;
	}
	return call_owned(c, "session.new", p, NULL, NULL, out);
}

rs_status
rs_session_list(rs_client *c, unsigned limit, unsigned offset, rs_value **out)
{
	rs_params *p = rs_params_new();

	if (p != NULL && ((limit > 0 && rs_params_set_uint(p, "limit", limit) != RS_OK) ||
	    rs_params_set_uint(p, "offset", offset) != RS_OK)) {
		rs_params_free(p);
		p = NULL;
	}
	return call_owned(c, "session.list", p, NULL, NULL, out);
}

/* The session ops that take a uuid: NULL is a caller's mistake. */
static rs_status
session_op(rs_client *c, const char *op, const char *uuid, const char *title, rs_value **out)
{
	if (out != NULL)
		*out = NULL;
	if (c != NULL && uuid == NULL)
		return fail(c, RS_ERR_INVAL, "%s: no session given", op);
	return call_owned(c, op, params_strs("session", uuid, "title", title, NULL), NULL, NULL, out);
}

rs_status
rs_session_get(rs_client *c, const char *uuid, rs_value **out)
{
	return session_op(c, "session.get", uuid, NULL, out);
}

rs_status
rs_session_fork(rs_client *c, const char *uuid, const char *title, rs_value **out)
{
	return session_op(c, "session.fork", uuid, title, out);
}

rs_status
rs_session_rename(rs_client *c, const char *uuid, const char *title, rs_value **out)
{
	if (c != NULL && title == NULL)
		return fail(c, RS_ERR_INVAL, "session.rename: no title given");
	return session_op(c, "session.rename", uuid, title, out);
}

rs_status
rs_session_delete(rs_client *c, const char *uuid)
{
	return session_op(c, "session.delete", uuid, NULL, NULL);
}

rs_status
rs_model_list(rs_client *c, rs_value **out)
{
	return call_owned(c, "model.list", rs_params_new(), NULL, NULL, out);
}

rs_status
rs_model_load(rs_client *c, const char *model, rs_progress_cb progress, void *user, rs_value **out)
{
	if (c != NULL && model == NULL)
		return fail(c, RS_ERR_INVAL, "model.load: no model given");
	return call_owned(c, "model.load", params_strs("model", model, NULL), progress, user, out);
}

rs_status
rs_model_unload(rs_client *c, const char *model, rs_value **out)
{
	if (c != NULL && model == NULL)
		return fail(c, RS_ERR_INVAL, "model.unload: no model given");
	return call_owned(c, "model.unload", params_strs("model", model, NULL), NULL, NULL, out);
}

rs_status
rs_model_show(rs_client *c, const char *model, rs_value **out)
{
	return call_owned(c, "model.show", params_strs("model", model, NULL), NULL, NULL, out);
}

rs_status
rs_tokenize(rs_client *c, const char *model, const char *text, int flags, uint32_t **tokens,
    size_t *n_tokens)
{
	rs_params *p = params_strs("model", model, "text", text, NULL);
	const rs_value *a;
	rs_value *v;
	rs_status st;
	size_t i;

	*tokens = NULL;
	*n_tokens = 0;
	if (c != NULL && text == NULL) {
		rs_params_free(p);
		return fail(c, RS_ERR_INVAL, "tokenize: no text given");
	}
	if (p != NULL && (((flags & RS_TOK_SPECIAL) && rs_params_set_bool(p, "special", 1) != RS_OK) ||
	    ((flags & (RS_TOK_BOS | RS_TOK_NO_BOS)) &&
	    rs_params_set_bool(p, "bos", (flags & RS_TOK_BOS) != 0) != RS_OK))) {
		rs_params_free(p);
		p = NULL;
	}
	if ((st = call_owned(c, "tokenize", p, NULL, NULL, &v)) != RS_OK)
		return st;
	a = rs_get(v, "tokens");
	if ((*tokens = malloc((rs_len(a) ? rs_len(a) : 1) * sizeof **tokens)) == NULL) {
		rs_value_free(v);
		return fail(c, RS_ERR_NOMEM, "out of memory");
	}
	for (i = 0; i < rs_len(a); i++)
		(*tokens)[i] = (uint32_t)rs_uint(rs_at(a, i));
	*n_tokens = rs_len(a);
	rs_value_free(v);
	return RS_OK;
}

/* The result's vectors as one array of n x d floats, vector i's from i * d on; NULL when out of memory. */
static float *
embed_floats(const rs_value *all, size_t n, size_t d)
{
	float *f = malloc((n * d > 0 ? n * d : 1) * sizeof *f);
	size_t i, j;

	for (i = 0; f != NULL && i < n; i++)
		for (j = 0; j < d; j++)
			f[i * d + j] = (float)rs_float(rs_at(rs_at(all, i), j));
	return f;
}

rs_status
rs_embed(rs_client *c, const char *model, const char *const *texts, size_t n, unsigned dimensions,
    float **vectors, size_t *dims, rs_value **out)
{
	rs_params *p = params_strs("model", model, NULL);
	const rs_value *all;
	rs_value *v;
	rs_status st;
	size_t i, d;

	if (vectors != NULL)
		*vectors = NULL;
	if (dims != NULL)
		*dims = 0;
	if (out != NULL)
		*out = NULL;
	if (c == NULL || n == 0 || texts == NULL) {
		rs_params_free(p);
		return c == NULL ? RS_ERR_INVAL : fail(c, RS_ERR_INVAL, "embed: no texts given");
	}
	for (i = 0; p != NULL && i < n; i++)
		if (texts[i] == NULL || rs_params_add_str(p, "input", texts[i]) != RS_OK) {
			rs_params_free(p);
			return texts[i] == NULL ? fail(c, RS_ERR_INVAL, "embed: text %zu is NULL", i) :
			    fail(c, RS_ERR_NOMEM, "out of memory");
		}
	if (p != NULL && dimensions > 0 && rs_params_set_uint(p, "dimensions", dimensions) != RS_OK) {
		rs_params_free(p);
		p = NULL;
	}
	if ((st = call_owned(c, "embed", p, NULL, NULL, &v)) != RS_OK)
		return st;
	all = rs_get(v, "embeddings");
	d = (size_t)rs_uint(rs_get(v, "dimensions"));
	st = rs_len(all) != n ? fail(c, RS_ERR_PROTOCOL, "embed: %zu vectors for %zu texts", rs_len(all), n) : RS_OK;
	for (i = 0; st == RS_OK && i < n; i++)
		if (rs_len(rs_at(all, i)) != d)
			st = fail(c, RS_ERR_PROTOCOL, "embed: vector %zu has %zu floats, not %zu", i, rs_len(rs_at(all, i)), d);
	if (st == RS_OK && vectors != NULL && (*vectors = embed_floats(all, n, d)) == NULL)
		st = fail(c, RS_ERR_NOMEM, "out of memory");
	if (st != RS_OK) {
		rs_value_free(v);
		return st;
	}
	if (dims != NULL)
		*dims = d;
	if (out != NULL)
		*out = v;
	else
		rs_value_free(v);
	return RS_OK;
}

rs_status
rs_detokenize(rs_client *c, const char *model, const uint32_t *tokens, size_t n_tokens, int flags,
    char **text)
{
	rs_params *p = params_strs("model", model, NULL);
	rs_value *v;
	rs_status st;
	const char *s;

	*text = NULL;
	if (p != NULL && (params_set_uints(p, "tokens", tokens, n_tokens) != RS_OK ||
	    ((flags & RS_TOK_SPECIAL) && rs_params_set_bool(p, "special", 1) != RS_OK))) {
		rs_params_free(p);
		p = NULL;
	}
	if ((st = call_owned(c, "detokenize", p, NULL, NULL, &v)) != RS_OK)
		return st;
	s = rs_str(rs_get(v, "text"));
	*text = strdup(s ? s : "");
	rs_value_free(v);
	return *text ? RS_OK : fail(c, RS_ERR_NOMEM, "out of memory");
}

rs_status
rs_server_status(rs_client *c, rs_value **out)
{
	return call_owned(c, "status", rs_params_new(), NULL, NULL, out);
}
