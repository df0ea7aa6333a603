/*
 * conn.c: the bridge's HTTP connections, apart from the requests on them:
 * accepting them (also on a Unix socket, and pausing while descriptors
 * run out), their deadlines, bounding what is read of them while a reply
 * is made, and noticing a client that leaves while its reply is made.
 *
 * evhttp knows a connection's life but tells the application only of
 * whole requests. Its bufferevent callback (evhttp_set_bevcb) is where a
 * connection is seen first; evhttp wires the bufferevent to its connection
 * just after, with the connection as the bufferevent's callback argument,
 * so the connection is taken up (adopted) from an event made active then,
 * which runs before anything is read from it. A reference on the
 * bufferevent keeps it valid until then; one that evhttp has freed in
 * between has its callbacks cleared.
 *
 *   NEW --adopted--> IDLE --a byte--> READING --evhttp: whole (conn_request)--> the request's
 *                     ^                                                          route
 *                     |                     conn_watch: SERVING (no deadline) <--/   |
 *                     |                                 | conn_unwatch                | answered at once
 *                     \--the reply taken (on_complete)-- SENDING <--------------------/ (READING's deadline)
 *
 * IDLE lasts idle_timeout, READING request_timeout from the request's
 * first byte (line, headers and body: a client that trickles bytes does
 * not keep it), SENDING request_timeout for the client to take its reply;
 * then the connection is closed. SERVING has no deadline: the reply takes
 * as long as the generation, and a client that leaves is seen instead.
 *
 * evhttp stops reading a connection while the application makes a reply,
 * so a client that closes its connection would be seen only when a write
 * to it fails, which for a reply that is not streamed is never before the
 * generation ends. In SERVING, until the reply begins, the watch waits on
 * the socket itself, edge-triggered, for its end (EV_CLOSED), an error or
 * an end of file; bytes (a pipelined next request) are left there for
 * evhttp, which reads them after the reply, and do not wake it again.
 * evhttp has no event of its own on the socket then: it must have none
 * while the watch is edge-triggered, since epoll keeps one mode for a
 * socket. Once the reply begins (a stream) the watch leaves the socket to
 * evhttp, whose closing of the connection (a failed write) is the sign.
 * While a reply is sent, evhttp reads the socket to see it close; what it
 * reads then is bounded (a read watermark, until the reply is taken), so a
 * client that sends while it is streamed to fills its own socket buffers,
 * not the bridge's memory.
 */
#include "config.h"
#include "openai.h"
#include "log.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/*
 * The most of a connection's input read while its reply is sent (evhttp
 * reads then only to see the connection close): a pipelined request's
 * headers fit, a flood does not. Reading a request has no such bound: its
 * body is held whole before evhttp passes it on (--max-body bounds it).
 */
#define READ_HIGH (2 * HTTP_MAX_HEADERS)

enum conn_state { CONN_NEW, CONN_IDLE, CONN_READING, CONN_SERVING, CONN_SENDING };

struct conn {
	enum conn_state state;
	struct oa *oa;
	struct bufferevent *bev;
	struct evhttp_connection *evcon;    /* NULL until adopted */
	struct event *timer;                /* NEW: the adoption; then the state's deadline */
	/* the watch (SERVING) */
	struct evhttp_request *req;
	struct event *sock_ev;              /* on the socket until the reply begins; NULL after */
	void (*gone)(void *);
	void *gone_arg;
	struct conn *next;
};

static const char *const state_names[] = {
	[CONN_NEW] = "new", [CONN_IDLE] = "idle", [CONN_READING] = "reading a request",
	[CONN_SERVING] = "serving", [CONN_SENDING] = "sending a reply",
};

/* ---- life ---- */

static void
conn_unlink(struct conn *c)
{
	struct conn **pp;

	for (pp = &c->oa->conns; *pp != c; pp = &(*pp)->next)
		;
	*pp = c->next;
}

/* Frees what the bridge holds of a connection (evhttp frees its own). */
static void
conn_free(struct conn *c)
{
	conn_unlink(c);
	if (c->sock_ev != NULL)
		event_free(c->sock_ev);         /* before its socket is closed */
	event_free(c->timer);
	free(c);
}

/* Enters state; its deadline (0: none) counts from now. */
static void
conn_enter(struct conn *c, enum conn_state state, unsigned seconds)
{
	struct timeval tv = { (time_t)seconds, 0 };

	c->state = state;
	if (seconds > 0)
		evtimer_add(c->timer, &tv);
	else
		evtimer_del(c->timer);
}

/* Waiting for a request, or reading one when some of it came already. */
static void
conn_await(struct conn *c)
{
	/* a request's body is held whole in the input before evhttp passes it on: no bound while reading */
	bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
	if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
		conn_enter(c, CONN_READING, c->oa->request_timeout);
	else
		conn_enter(c, CONN_IDLE, c->oa->idle_timeout);
}

/* The connection's client is gone (or given up): the watch ends, the connection is freed, then gone(). */
static void
conn_fire(struct conn *c, int free_evcon)
{
	void (*gone)(void *) = c->gone;
	void *arg = c->gone_arg;
	struct evhttp_request *req = c->req;

	c->gone = NULL;
	c->req = NULL;
	if (c->sock_ev != NULL) {
		event_free(c->sock_ev);
		c->sock_ev = NULL;
	}
	if (free_evcon)
		evhttp_connection_free(c->evcon);   /* frees req with it, and c (conn_close_cb) */
	else if (evhttp_request_get_connection(req) == NULL)
		evhttp_request_free(req);           /* evhttp let go of it: it is ours to free */
	gone(arg);
}

/* evhttp is freeing the connection: the client left, a write failed, or a deadline closed it. */
static void
conn_close_cb(struct evhttp_connection *evcon, void *arg)
{
	struct conn *c = arg;

	if (c->gone != NULL)
		conn_fire(c, 0);
	conn_free(c);
}

/* The deadline of the state passed, or (NEW) the connection is to be adopted. */
static void
conn_timer_cb(evutil_socket_t fd, short what, void *arg);

/* Bytes came into a connection's input: the first of a request starts its deadline. */
static void
conn_input_cb(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
	struct conn *c = arg;

	if (c->state == CONN_IDLE && info->n_added > 0)
		conn_enter(c, CONN_READING, c->oa->request_timeout);
}

/* Takes up the connection evhttp made of the bufferevent (see the top of the file). */
static void
conn_adopt(struct conn *c)
{
	bufferevent_event_cb eventcb;
	void *evcon;

	bufferevent_getcb(c->bev, NULL, NULL, &eventcb, &evcon);
	if (eventcb == NULL) {              /* evhttp gave it up already */
		bufferevent_decref(c->bev);
		conn_free(c);
		return;
	}
	c->evcon = evcon;
	bufferevent_decref(c->bev);
	evhttp_connection_set_closecb(c->evcon, conn_close_cb, c);
	if (evbuffer_add_cb(bufferevent_get_input(c->bev), conn_input_cb, c) == NULL) {
		evhttp_connection_free(c->evcon);
		return;
	}
	conn_await(c);
}

static void
conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;

	if (c->state == CONN_NEW) {
		conn_adopt(c);
		return;
	}
	log_debug("closing a connection %s for %u s", state_names[c->state],
	    c->state == CONN_IDLE ? c->oa->idle_timeout : c->oa->request_timeout);
	evhttp_connection_free(c->evcon);       /* conn_close_cb frees c */
}

/* evhttp's bufferevent callback: a new connection. */
static struct bufferevent *
conn_new_cb(struct event_base *base, void *arg)
{
	struct oa *oa = arg;
	struct conn *c = calloc(1, sizeof *c);

	listener_pause_ok(&oa->pause);
	if (c == NULL)
		return NULL;                    /* evhttp makes its own bufferevent: conn_request closes it */
	c->oa = oa;
	c->state = CONN_NEW;
	c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
	c->timer = evtimer_new(base, conn_timer_cb, c);
	if (c->bev == NULL || c->timer == NULL) {
		if (c->bev != NULL)
			bufferevent_free(c->bev);
		if (c->timer != NULL)
			event_free(c->timer);
		free(c);
		return NULL;
	}
	bufferevent_incref(c->bev);
	c->next = oa->conns;
	oa->conns = c;
	event_active(c->timer, EV_TIMEOUT, 1);
	return c->bev;
}

/* The reply was taken by the client: the next request may come. */
static void
conn_complete_cb(struct evhttp_request *req, void *arg)
{
	conn_await(arg);
}

int
conn_request(struct oa *oa, struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct api_error e;
	struct conn *c;

	for (c = oa->conns; c != NULL && evcon != NULL; c = c->next)
		if (c->evcon == evcon) {
			evhttp_request_set_on_complete_cb(req, conn_complete_cb, c);
			return 1;
		}
	/*
	 * A connection that came while memory ran out has no conn: no
	 * deadlines, and no watch, without which every call fails. It is
	 * answered and closed, so that the client's next one is whole.
	 */
	api_nomem(&e);
	http_add_header(req, "Connection", "close");
	http_send_error(req, &e);
	return 0;
}

/*
 * The bridge's connection of a request, as conn_request found it: the
 * argument of its on_complete callback (evhttp has no accessor of it but
 * http_struct.h's), so that no request looks for it twice.
 */
static struct conn *
conn_of(struct evhttp_request *req)
{
	return req->on_complete_cb == conn_complete_cb ? req->on_complete_cb_arg : NULL;
}

void
conn_free_all(struct oa *oa)
{
	struct conn *c;

	/* after evhttp_free: only connections not adopted yet are left, held by their reference */
	while ((c = oa->conns) != NULL) {
		if (c->state == CONN_NEW)
			bufferevent_decref(c->bev);
		conn_free(c);
	}
}

/* ---- a client that leaves ---- */

/* The socket is readable while the reply is being made: its end, an error, or a next request. */
static void
conn_sock_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	socklen_t len = sizeof(int);
	int err = 0;
	ssize_t n;
	char b;

	if (!(what & EV_CLOSED)) {
		n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		/* pipelined bytes, unless the connection was reset after them */
		if (n > 0 && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err == 0))
			return;
	}
	conn_fire(c, 1);
}

struct conn *
conn_watch(struct oa *oa, struct evhttp_request *req, void (*gone)(void *), void *arg)
{
	struct conn *c = conn_of(req);
	evutil_socket_t fd;

	if (c == NULL || c->gone != NULL)
		return NULL;
	fd = bufferevent_getfd(c->bev);
	c->sock_ev = event_new(oa->base, fd, EV_READ | EV_CLOSED | EV_ET | EV_PERSIST, conn_sock_cb, c);
	if (c->sock_ev == NULL || event_add(c->sock_ev, NULL) != 0) {
		if (c->sock_ev != NULL)
			event_free(c->sock_ev);
		c->sock_ev = NULL;
		return NULL;
	}
	c->req = req;
	c->gone = gone;
	c->gone_arg = arg;
	conn_enter(c, CONN_SERVING, 0);
	return c;
}

/* The socket is evhttp's again, which reads it while it streams: bounded until the reply is taken. */
static void
conn_sock_release(struct conn *c)
{
	if (c->sock_ev != NULL) {
		event_free(c->sock_ev);
		c->sock_ev = NULL;
	}
	bufferevent_setwatermark(c->bev, EV_READ, 0, READ_HIGH);
}

void
conn_reply_begins(struct conn *c)
{
	if (c != NULL)
		conn_sock_release(c);
}

void
conn_unwatch(struct conn *c)
{
	if (c == NULL)
		return;
	conn_sock_release(c);
	c->gone = NULL;
	c->req = NULL;
	conn_enter(c, CONN_SENDING, c->oa->request_timeout);
}

void
conn_drop(struct conn *c)
{
	conn_fire(c, 1);
}

/* ---- accepting ---- */

int
conn_setup(struct oa *oa, struct evhttp_bound_socket *bound)
{
	if (listener_pause_init(&oa->pause, oa->base, evhttp_bound_socket_get_listener(bound), "a connection") != 0)
		return -1;
	evhttp_set_bevcb(oa->http, conn_new_cb, oa);
	return 0;
}

struct evhttp_bound_socket *
conn_listen_unix(struct oa *oa, const char *path, char *err, size_t size)
{
	struct evhttp_bound_socket *bound = NULL;
	struct evconnlistener *l = NULL;
	struct sockaddr_un sa;
	mode_t old;
	int fd, rc;

	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	if (path[0] == '\0' || strlen(path) >= sizeof sa.sun_path) {
		snprintf(err, size, "a socket path of 1..%zu bytes", sizeof sa.sun_path - 1);
		return NULL;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	/* a socket left by a bridge that is gone is taken over; one in use, or another file, is not */
	if (listener_claim_path(path, err, size) != 0)
		return NULL;
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0) {
		snprintf(err, size, "socket: %s", strerror(errno));
		return NULL;
	}
	old = umask(0177);                  /* 0600: the user's alone, as residentd's socket */
	rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
	umask(old);
	if (rc != 0) {
		snprintf(err, size, "%s", strerror(errno));
		close(fd);
		return NULL;
	}
	/* from here the socket file is this bridge's: removed again if listening fails */
	if (listen(fd, 128) != 0)
		snprintf(err, size, "listen: %s", strerror(errno));
	else if ((l = evconnlistener_new(oa->base, NULL, NULL, LEV_OPT_CLOSE_ON_FREE, 0, fd)) == NULL)
		snprintf(err, size, "out of memory");  /* backlog 0: the socket listens already */
	else if ((bound = evhttp_bind_listener(oa->http, l)) == NULL)
		snprintf(err, size, "out of memory");
	if (bound == NULL) {
		if (l != NULL)
			evconnlistener_free(l);     /* closes fd */
		else
			close(fd);
		unlink(path);
		return NULL;
	}
	oa->unix_listener = true;
	return bound;
}
