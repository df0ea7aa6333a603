/*
 * sched.h: the scheduler, which owns the engine thread.
 *
 * The loop thread hands it jobs (every request that needs a model) and
 * takes back events: reply frames ready to send, and for a finished session
 * turn the rows to commit before its `done` is sent. The two threads share
 * nothing else: the queues are locked, and the loop is woken through the
 * callback given to sched_start (an event_active on its libevent base).
 */
#ifndef RESIDENT_SCHED_H
#define RESIDENT_SCHED_H

#include <msgpack.h>
#include <stdint.h>

#include "kernels.h"
#include "proto.h"

struct sched;
struct store_turn;

/* What a backend failure (a GPU fault) does to its model: load it again, on its device or on the CPU. */
enum sched_fault_policy { SCHED_FAULT_RELOAD, SCHED_FAULT_CPU };

struct sched_opts {
	const char *default_model;  /* path or name; may be NULL */
	const char *device;         /* "cpu" / "cuda" / NULL */
	int n_threads;
	int32_t n_ctx;
	int32_t kv_tokens;
	int32_t max_step_tokens;
	int32_t max_seqs;           /* sequences decoding at once per model */
	int max_queue;              /* waiting requests before `overloaded` */
	int exact;                  /* CPU: float activations everywhere (engine_opts) */
	enum sched_fault_policy device_fault;
	int kv_share_users;         /* one prefix cache for every uid (else one per uid) */
	uint64_t kv_host_bytes;     /* the host tier's budget (kvhost.h); 0: none */
	const char *kv_dir;         /* the disk tier's directory (kvdisk.h) */
	uint64_t kv_disk_bytes;     /* its budget; 0: none stored (deleted sessions' files are still removed) */
	uint64_t device_memory;     /* bytes of device memory for every loaded model (slots.h) */
	double keep_alive;          /* seconds a model stays loaded unused, unless requests say (< 0: forever) */
	/*
	 * n_drafts pairs of a model (a name or path, as requests give it) and
	 * the draft model of its requests that name none; a later pair of a
	 * model replaces an earlier one.
	 */
	const char *const *drafts;
	int n_drafts;
	enum kv_type kv_type;       /* how every model's KV pool holds K and V (engine_opts) */
};

/* What a client looks like in `status`. */
struct sched_client {
	int pid;
	uint32_t uid;
	char client[PROTO_MAX_CLIENT + 1];
	int requests;
};

/*
 * A request for the engine thread. The loop thread fills it from the
 * decoded request (and, for a session, the stored history) and gives up
 * ownership in sched_submit.
 */
struct sched_job {
	uint64_t conn;
	struct proto_req req;       /* the request as decoded (owned) */
	uint32_t uid;
	/* generate with a session: the stored conversation before this turn */
	struct proto_msg *history;
	int n_history;
	char *session_system;
	char *session_model;
	int32_t *history_ids;       /* the stored turns' token ids, concatenated */
	int32_t history_tokens;
	/* status: the loop thread's part */
	struct sched_client *clients;
	int n_clients;
	uint64_t t_submit;          /* now_ns() when the request arrived */
	struct sched_job *next;
};

/* Something for the loop thread: a frame for a connection, maybe rows to commit first. */
struct sched_event {
	uint64_t conn;
	uint64_t req_id;
	int last;                   /* the request is finished */
	msgpack_sbuffer frame;      /* a complete frame (length included) */
	/* a session turn to commit before the frame is sent */
	char session[37];
	uint32_t uid;
	struct store_turn *turns;
	int n_turns;
	int32_t after;              /* the session's turns they follow (store_append_turns) */
	char *model_loaded;         /* model.load of a path: register it in the store */
	struct sched_event *next;
};

int sched_start(const struct sched_opts *o, void (*wake)(void *), void *wake_arg,
    struct sched **out, char *err);
/*
 * Ends the requests in flight as cancelled (their `done` events stay
 * queued for sched_take_events) and joins the engine thread.
 */
void sched_stop_thread(struct sched *s);
/* Stops the thread if needed and frees everything, undelivered events too. */
void sched_stop(struct sched *s);

void sched_submit(struct sched *s, struct sched_job *job);
/* Whether a model name (or an existing file's path) can be used. Thread-safe. */
int sched_model_known(struct sched *s, const char *name_or_path);
/* Cancels request req_id of conn (a `done` with finish "cancel" follows, or not_found). */
void sched_cancel(struct sched *s, uint64_t conn, uint64_t req_id, uint64_t cancel_req_id);
/* The connection is gone: its requests stop at the next step, no events for it. */
void sched_conn_gone(struct sched *s, uint64_t conn);
/* A session was deleted: drop its cached KV. */
void sched_session_dropped(struct sched *s, const char *uuid);
/* A session was forked: the child shares the parent's cached KV, if any. */
void sched_session_forked(struct sched *s, const char *parent, const char *child);

/* Takes all pending events (a list in order); the caller frees each with sched_event_free. */
struct sched_event *sched_take_events(struct sched *s);
void sched_event_free(struct sched_event *ev);
void sched_job_free(struct sched_job *job);

#endif
