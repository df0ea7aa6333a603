/*
 * listener.c: see listener.h. An evconnlistener's error callback gets the
 * listener's argument, which evhttp keeps for itself, so each pause is
 * found by its listener in a list of the process's (one or two).
 */
#include "config.h"
#include "listener.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int
listener_claim_path(const char *path, char *msg, size_t size)
{
	struct sockaddr_un sa;
	struct stat st;
	int fd, answered;

	if (lstat(path, &st) != 0)
		return 0;
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(msg, size, "a file that is not a socket is there");
		return -1;
	}
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
		snprintf(msg, size, "socket: %s", strerror(errno));
		return -1;
	}
	answered = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 || errno != ECONNREFUSED;
	close(fd);
	if (answered) {
		snprintf(msg, size, "another program listens there");
		return -1;
	}
	if (unlink(path) != 0) {
		snprintf(msg, size, "cannot remove the stale socket: %s", strerror(errno));
		return -1;
	}
	return 0;
}

static struct listener_pause *pauses;

static void
resume_cb(evutil_socket_t fd, short what, void *arg)
{
	struct listener_pause *p = arg;

	evconnlistener_enable(p->listener);
}

static void
error_cb(struct evconnlistener *l, void *arg)
{
	static const struct timeval pause = { 0, ACCEPT_PAUSE_MS * 1000 };
	int e = EVUTIL_SOCKET_ERROR();
	struct listener_pause *p;

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
listener_pause_init(struct listener_pause *p, struct event_base *base, struct evconnlistener *l, const char *what)
{
	*p = (struct listener_pause){ l, evtimer_new(base, resume_cb, p), what, 0, pauses };
	if (p->resume == NULL)
		return -1;
	pauses = p;
	evconnlistener_set_error_cb(l, error_cb);
	return 0;
}

void
listener_pause_ok(struct listener_pause *p)
{
	p->failing = 0;
}

void
listener_pause_free(struct listener_pause *p)
{
	struct listener_pause **pp;

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
