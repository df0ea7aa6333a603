/*
 * accept_pause.c: see accept_pause.h. An evconnlistener's error callback
 * gets the listener's argument, which evhttp keeps for itself, so each
 * pause is found by its listener in a list of the process's (one or two).
 */
#include "config.h"
#include "accept_pause.h"
#include "log.h"

#include <string.h>

static struct accept_pause *pauses;

static void
resume_cb(evutil_socket_t fd, short what, void *arg)
{
	struct accept_pause *p = arg;

	evconnlistener_enable(p->listener);
}

static void
error_cb(struct evconnlistener *l, void *arg)
{
	static const struct timeval pause = { 0, ACCEPT_PAUSE_MS * 1000 };
	int e = EVUTIL_SOCKET_ERROR();
	struct accept_pause *p;

	for (p = pauses; p != NULL && p->listener != l; p = p->next)
		;
	if (p == NULL)
		return;
	if (!p->failing)
		log_warn("cannot accept %s: %s; trying again every %d ms", p->what, evutil_socket_error_to_string(e),
		    ACCEPT_PAUSE_MS);
	p->failing = 1;
	evconnlistener_disable(l);
	evtimer_add(p->resume, &pause);
}

int
accept_pause_init(struct accept_pause *p, struct event_base *base, struct evconnlistener *l, const char *what)
{
	*p = (struct accept_pause){ l, evtimer_new(base, resume_cb, p), what, 0, pauses };
	if (p->resume == NULL)
		return -1;
	pauses = p;
	evconnlistener_set_error_cb(l, error_cb);
	return 0;
}

void
accept_pause_ok(struct accept_pause *p)
{
	p->failing = 0;
}

void
accept_pause_free(struct accept_pause *p)
{
	struct accept_pause **pp;

	if (p->resume == NULL)
		return;
	for (pp = &pauses; *pp != NULL; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	event_free(p->resume);
	p->resume = NULL;
}
