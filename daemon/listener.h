/*
 * listener.h: what residentd's server and resident-http's listeners
 * share. A Unix socket path is claimed the same way: a socket nobody
 * answers on any more is taken over, one in use or a file that is no
 * socket is not. And a listening socket pauses instead of spinning when
 * accept() fails: out of descriptors (EMFILE, ENFILE), the waiting
 * connection keeps the socket readable and libevent would call accept()
 * again at once, in a loop; instead the listener is disabled for
 * ACCEPT_PAUSE_MS and enabled again, open connections going on meanwhile,
 * and the failure is logged once until a connection comes.
 */
#ifndef RESIDENT_LISTENER_H
#define RESIDENT_LISTENER_H

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <stddef.h>

#define ACCEPT_PAUSE_MS 100

/*
 * Makes path free for a listening socket: nothing there, or a socket no
 * program answers on any more (removed). 0, or -1 with why in msg (another
 * program listens there; a file that is not a socket; it cannot be removed).
 */
int listener_claim_path(const char *path, char *msg, size_t size);

struct listener_pause {
	struct evconnlistener *listener;
	struct event *resume;       /* accepting again after accept() failed */
	const char *what;           /* what is accepted, for the log: "a client" */
	int failing;                /* accept() failed since the last connection came (logged once) */
	struct listener_pause *next;  /* the process's (listeners' callback arguments are not always their owners') */
};

/* Takes over l's error callback. 0, or -1 when the timer cannot be made. */
int listener_pause_init(struct listener_pause *p, struct event_base *base, struct evconnlistener *l, const char *what);
/* A connection came: the next failure is logged again. */
void listener_pause_ok(struct listener_pause *p);
/* Frees the timer: no pause under way enables the listener again (before or after it is freed). */
void listener_pause_free(struct listener_pause *p);

#endif
