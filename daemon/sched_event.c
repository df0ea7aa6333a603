/*
 * sched_event.c: the engine thread's way back to the loop thread. A reply
 * (struct sched_event: a packed frame) is appended to a locked list and the
 * loop is woken through the callback given to sched_start; a step's replies
 * go as one chain with one wake-up. Also the freeing of the two structs that
 * cross between the threads, jobs and events (sched.h).
 */
#include "config.h"
#include "sched_int.h"
#include "store.h"
#include "util.h"

#include <pthread.h>
#include <stdlib.h>

/*
 * Queues a chain of events (first, ..., the one whose next is *last_next)
 * for the loop thread and wakes it once: a step's 64 tokens are one
 * wake-up, not 64 (each takes the loop's lock and may write its notify fd,
 * between two steps).
 */
void
sched_post_chain(struct sched *s, struct sched_event *first, struct sched_event **last_next)
{
	if (first == NULL)
		return;
	pthread_mutex_lock(&s->mu);
	*s->events_tail = first;
	s->events_tail = last_next;
	pthread_mutex_unlock(&s->mu);
	s->wake(s->wake_arg);
}

/* Links ev at *tail of a chain being built for sched_post_chain; returns the chain's new tail. */
struct sched_event **
sched_chain(struct sched_event **tail, struct sched_event *ev)
{
	*tail = ev;
	return &ev->next;
}

/* Queues an event for the loop thread and wakes it. */
void
sched_post(struct sched *s, struct sched_event *ev)
{
	ev->next = NULL;
	sched_post_chain(s, ev, &ev->next);
}

/* A new event for a request; the caller packs the frame. */
struct sched_event *
sched_new_event(uint64_t conn, uint64_t req_id, int last)
{
	struct sched_event *ev = xcalloc(1, sizeof *ev);

	ev->conn = conn;
	ev->req_id = req_id;
	ev->last = last;
	return ev;
}

/* Posts an error reply that ends a job's request. */
void
sched_post_error(struct sched *s, const struct sched_job *job, enum proto_err code, const char *msg)
{
	struct sched_event *ev = sched_new_event(job->conn, job->req.id, 1);

	proto_error(&ev->frame, 1, job->req.id, code, msg);
	sched_post(s, ev);
}

/* Posts a result whose map was packed by fill. */
void
sched_post_result(struct sched *s, const struct sched_job *job, size_t n_fields, sched_fill_fn *fill,
    const void *arg, const char *extra_model)
{
	struct sched_event *ev = sched_new_event(job->conn, job->req.id, 1);
	msgpack_packer pk;

	proto_reply_begin(&ev->frame, &pk, 1, job->req.id, "result", n_fields);
	if (fill != NULL)
		fill(s, job, &pk, arg);
	proto_reply_end(&ev->frame);
	if (extra_model != NULL)
		ev->model_loaded = xstrdup(extra_model);
	sched_post(s, ev);
}

struct sched_event *
sched_take_events(struct sched *s)
{
	struct sched_event *ev;

	pthread_mutex_lock(&s->mu);
	ev = s->events;
	s->events = NULL;
	s->events_tail = &s->events;
	pthread_mutex_unlock(&s->mu);
	return ev;
}

void
sched_event_free(struct sched_event *ev)
{
	msgpack_sbuffer_destroy(&ev->frame);
	store_turns_free(ev->turns, ev->n_turns);
	free(ev->model_loaded);
	free(ev);
}

void
sched_job_free(struct sched_job *job)
{
	int i;

	proto_req_free(&job->req);
	for (i = 0; i < job->n_history; i++)
		proto_msg_free(&job->history[i]);
	free(job->history);
	free(job->history_ids);
	free(job->session_system);
	free(job->session_model);
	free(job->clients);
	free(job);
}
