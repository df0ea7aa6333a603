/*
 * accept_pause.h: a listening socket that pauses instead of spinning when
 * accept() fails. Out of descriptors (EMFILE, ENFILE), the waiting
 * connection keeps the socket readable and libevent would call accept()
 * again at once, in a loop; instead the listener is disabled for
 * ACCEPT_PAUSE_MS and enabled again, open connections going on meanwhile,
 * and the failure is logged once until a connection comes. Used by
 * residentd's server and by resident-http's.
 */
#ifndef RESIDENT_ACCEPT_PAUSE_H
#define RESIDENT_ACCEPT_PAUSE_H

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#define ACCEPT_PAUSE_MS 100

struct accept_pause {
	struct evconnlistener *listener;
	struct event *resume;       /* accepting again after accept() failed */
	const char *what;           /* what is accepted, for the log: "a client" */
	int failing;                /* accept() failed since the last connection came (logged once) */
	struct accept_pause *next;  /* the process's (listeners' callback arguments are not always their owners') */
};

/* Takes over l's error callback. 0, or -1 when the timer cannot be made. */
int accept_pause_init(struct accept_pause *p, struct event_base *base, struct evconnlistener *l, const char *what);
/* A connection came: the next failure is logged again. */
void accept_pause_ok(struct accept_pause *p);
/* Frees the timer: no pause under way enables the listener again (before or after it is freed). */
void accept_pause_free(struct accept_pause *p);

#endif
