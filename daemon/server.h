/* server.h: the loop thread: the socket, connections, frames, sessions. */
#ifndef RESIDENT_SERVER_H
#define RESIDENT_SERVER_H

#include <stddef.h>
#include <sys/types.h>

struct event_base;
struct sched;
struct store;
struct server;

struct server_opts {
	const char *socket_path;
	int listen_fd;               /* -1, or the socket systemd passed (server_activation): served instead */
	int private_dir;             /* the socket's directory must be the user's alone (the default path) */
	gid_t group;                 /* (gid_t)-1: the socket is 0600, else 0660 for this group */
	size_t max_frame;
	size_t max_output;           /* bytes queued for a client before it is dropped as too slow */
	int max_clients;             /* connections at once; one more is refused (overloaded) */
	int frame_timeout;           /* seconds a frame may take from its reservation to its last byte */
	const char *default_model;   /* its name, for sessions created without one */
};

/* The least of the input budget: what the frames being received may reserve together (at least 4 frames). */
#define SERVER_IN_BUDGET_MIN ((size_t)64 << 20)
#define SERVER_MAX_CLIENTS_DEFAULT 1024
#define SERVER_FRAME_TIMEOUT_DEFAULT 60

/*
 * Socket activation: the socket systemd passed when LISTEN_FDS and
 * LISTEN_PID name this process (sd_listen_fds(3)), checked to be one
 * listening AF_UNIX stream socket. Sets *fd to it, or to -1 when none was
 * passed; returns 0, or a negative code with a message saying what is wrong.
 * Call it before anything opens a file: the socket is at fd 3.
 */
int server_activation(int *fd, char *err);
/*
 * Starts accepting on base: on o->listen_fd if set, else on o->socket_path,
 * bound here (refusing to steal one another daemon is serving). Returns 0 or
 * a negative code with a message.
 */
int server_start(struct event_base *base, const struct server_opts *o, struct store *st,
    struct server **out, char *err);
/* The path of the socket served (systemd's when it passed one). */
const char *server_socket_path(const struct server *srv);
/* Attaches the scheduler (events from it wake the loop through server_wake). */
void server_set_sched(struct server *srv, struct sched *s);
/* For sched_start: wakes the loop thread to deliver the scheduler's events. Thread-safe. */
void server_wake(void *srv);
/* Stops accepting and refuses new work; existing replies still flow. */
void server_shutdown(struct server *srv);
/* Delivers the scheduler's pending events now (used while shutting down). */
void server_deliver(struct server *srv);
/* 1 while some connection still has output to flush. */
int server_flushing(const struct server *srv);
/* Closes every connection and the socket; removes the socket file if residentd made it. */
void server_free(struct server *srv);

#endif
