/*
 * sched.c: the engine thread. It takes jobs from the loop thread, keeps the
 * models (slots.h: loaded on demand within one memory budget) and the
 * sessions' sequences, and runs forward steps that batch every running
 * request of a model together.
 *
 * This file is the thread and its API (sched.h): the locked lists the loop
 * thread fills with jobs and control messages, taking them in (generate
 * requests queue, the other ops are answered), the main loop and when it
 * may sleep, start and stop. What the main loop calls is in the sched_*.c
 * files, whose map is sched_int.h.
 */
#include "config.h"
#include "sched.h"
#include "sched_int.h"
#include "engine.h"
#include "kvdisk.h"
#include "kvhost.h"
#include "log.h"
#include "slots.h"
#include "util.h"
#include "worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* A control message from the loop thread (sched_cancel, sched_conn_gone, sched_session_*). */
enum ctl_type { CTL_CANCEL, CTL_GONE, CTL_DROP, CTL_FORK };

struct ctl {
	enum ctl_type type;
	uint64_t conn, req_id, cancel_id;
	char a[37], b[37];
	struct ctl *next;
};

/* ---- jobs and control messages ---- */

/* Takes a job: generate requests queue, the rest run now. */
static void
take_job(struct sched *s, struct sched_job *job)
{
	struct gen *g, **pp;

	switch (job->req.op) {
	case OP_GENERATE: case OP_EMBED:
		if (s->n_queued >= (s->o.max_queue > 0 ? s->o.max_queue : 256)) {
			sched_post_error(s, job, PE_OVERLOADED, "too many requests are waiting; try again later");
			s->requests[FINISH_ERROR]++;
			break;
		}
		g = xcalloc(1, sizeof *g);
		g->job = job;
		for (pp = &s->gens; *pp != NULL; pp = &(*pp)->next)
			;
		*pp = g;
		s->n_queued++;
		return;
	case OP_MODEL_LIST: sched_post_result(s, job, 1, sched_fill_model_list, NULL, NULL); break;
	case OP_MODEL_LOAD: sched_op_model_load(s, job); break;
	case OP_MODEL_UNLOAD: sched_op_model_unload(s, job); break;
	case OP_MODEL_SHOW: sched_op_model_show(s, job); break;
	case OP_TOKENIZE: case OP_DETOKENIZE:
		if (sched_op_tokens(s, job))
			return;
		break;
	case OP_STATUS: sched_post_result(s, job, 10, sched_fill_status, NULL, NULL); break;
	default: sched_post_error(s, job, PE_INTERNAL, "op not handled by the scheduler"); break;
	}
	sched_job_free(job);
}

/* The request req_id of conn, or NULL. */
static struct gen *
find_gen(struct sched *s, uint64_t conn, uint64_t req_id)
{
	struct gen *g;

	for (g = s->gens; g != NULL; g = g->next)
		if (g->job->conn == conn && g->job->req.id == req_id)
			return g;
	return NULL;
}

/* Applies a control message. */
static void
take_ctl(struct sched *s, struct ctl *c)
{
	struct sched_event *ev;
	struct gen *g;
	msgpack_packer pk;

	switch (c->type) {
	case CTL_CANCEL:
		g = find_gen(s, c->conn, c->req_id);
		ev = sched_new_event(c->conn, c->cancel_id, 1);
		if (g == NULL) {
			proto_error(&ev->frame, 1, c->cancel_id, PE_NOT_FOUND, "no such request in flight");
		} else {
			g->cancelled = 1;
			proto_reply_begin(&ev->frame, &pk, 1, c->cancel_id, "result", 0);
			proto_reply_end(&ev->frame);
		}
		sched_post(s, ev);
		break;
	case CTL_GONE:
		for (g = s->gens; g != NULL; g = g->next)
			if (g->job->conn == c->conn)
				g->gone = 1;
		break;
	case CTL_DROP:
		sched_drop_resident(s, c->a);
		break;
	case CTL_FORK:
		sched_fork_resident(s, c->a, c->b);
		break;
	}
	free(c);
}

/* ---- the thread ---- */

/* Whether a request can be stepped (not only waiting for the disk) or admitted (sched_admit_ready). */
static int
has_work(const struct sched *s)
{
	const struct gen *g;

	for (g = s->gens; g != NULL; g = g->next)
		if (g->state == GEN_RUNNING && sched_gen_ready(g))
			return 1;
	return sched_admit_ready(s);
}

/* Hands the disk tier's finished jobs back to their engines. */
static void
take_io(struct sched *s)
{
	struct kvdisk_job *j, *next;
	struct gen *g;
	int any = 0, i;

	for (j = s->disk ? kvdisk_take_done(s->disk) : NULL; j != NULL; j = next) {
		next = j->next;
		any = 1;
		if (j->rc != 0)
			log_warn("KV disk tier: %s", j->err);
		if (j->owner != NULL)
			engine_io_done(j->owner, j);
		else
			kvdisk_job_free(j);
	}
	for (g = s->gens; g != NULL && any; g = g->next) {
		for (i = 0; g->state == GEN_RUNNING && i < g->n_seqs; i++)
			g->seqs[i]->wait_io = 0;
		for (i = 0; g->emb != NULL && i < g->emb->n_running; i++)
			g->emb->running[i]->wait_io = 0;
	}
}

/*
 * Takes everything the loop thread sent; waits when there is nothing to do,
 * at most timeout_ns (< 0: no limit).
 */
static int
take_input(struct sched *s, int64_t timeout_ns)
{
	uint64_t deadline = now_ns() + (uint64_t)MAX(timeout_ns, 0);
	struct timespec ts = { (time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u) };
	struct sched_job *jobs;
	struct ctl *ctls, *c;
	int stopping;

	pthread_mutex_lock(&s->mu);
	while (!s->stopping && s->jobs == NULL && s->ctls == NULL && !s->io_ready && !has_work(s)) {
		if (timeout_ns < 0)
			pthread_cond_wait(&s->cv, &s->mu);
		else if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT)
			break;
	}
	s->io_ready = 0;
	jobs = s->jobs, ctls = s->ctls;
	s->jobs = NULL, s->jobs_tail = &s->jobs;
	s->ctls = NULL, s->ctls_tail = &s->ctls;
	stopping = s->stopping;
	pthread_mutex_unlock(&s->mu);
	/* jobs first: a cancel or a hang-up may concern a job sent just before it */
	while (jobs != NULL) {
		struct sched_job *j = jobs;

		jobs = j->next;
		take_job(s, j);
	}
	while ((c = ctls) != NULL) {
		ctls = c->next;
		take_ctl(s, c);
	}
	take_io(s);
	sched_take_prep(s, worker_take_done(&s->prep));
	sched_take_prep(s, worker_take_done(&s->prep_gram));
	return stopping;
}

/* Ends every request as cancelled (shutdown). */
static void
cancel_all(struct sched *s)
{
	struct gen *g;

	for (g = s->gens; g != NULL; g = g->next)
		g->cancelled = 1;
	sched_take_prep(s, worker_drain(&s->prep, NULL));
	sched_take_prep(s, worker_drain(&s->prep_gram, NULL));
	sched_reap_cancelled(s);
}

static void *
sched_main(void *arg)
{
	struct sched *s = arg;
	struct slot *m;

	while (!take_input(s, slots_expire(&s->slots))) {
		sched_reap_cancelled(s);
		sched_admit_queued(s);
		for (m = s->slots.list; m != NULL; m = m->next)
			if (m->e != NULL)
				sched_step_model(s, m);
	}
	cancel_all(s);
	return NULL;
}

/* The disk tier's wake-up (its thread): a job has finished. */
static void
io_wake(void *arg)
{
	struct sched *s = arg;

	pthread_mutex_lock(&s->mu);
	s->io_ready = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* slots_opts.unloading: what refers to a model's engine lets go of it (drafts, then parked sessions). */
static void
slot_unloading(void *arg, struct slot *m)
{
	sched_draft_unload(arg, m);
	sched_drop_residents(arg, m);
}

/* The model slots, with the engine options and the memory budget. */
static void
start_slots(struct sched *s)
{
	struct slots_opts so = { .budget = s->o.device_memory, .keep_alive = s->o.keep_alive,
		.unloading = slot_unloading, .arg = s };

	so.eo = (struct engine_opts){ .device = s->o.device, .n_threads = s->o.n_threads, .n_ctx = s->o.n_ctx,
		.kv_tokens = s->o.kv_tokens, .max_step_tokens = s->o.max_step_tokens, .max_seqs = s->o.max_seqs,
		.exact = s->o.exact, .kv_type = s->o.kv_type, .host = &s->host,
		.disk = kvdisk_stores(s->disk) ? s->disk : NULL };
	slots_init(&s->slots, &so);
	s->slots_on = 1;
}

int
sched_start(const struct sched_opts *o, void (*wake)(void *), void *wake_arg, struct sched **out,
    char *err)
{
	struct sched *s = xcalloc(1, sizeof *s);
	pthread_condattr_t ca;
	char note[ERR_LEN];
	int rc;

	s->o = *o;
	s->o.device = s->device = o->device ? xstrdup(o->device) : NULL;
	s->wake = wake;
	s->wake_arg = wake_arg;
	s->jobs_tail = &s->jobs;
	s->ctls_tail = &s->ctls;
	s->events_tail = &s->events;
	s->t_start = now_ns();
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);  /* now_ns()'s, for the keep-alive timeouts */
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	kvhost_init(&s->host, o->kv_host_bytes);
	/* with --kv-disk 0 too: session.delete removes the files that an earlier run stored */
	if (o->kv_dir != NULL &&
	    (rc = kvdisk_open(o->kv_dir, o->kv_disk_bytes, io_wake, s, &s->disk, note, err)) != 0) {
		sched_stop(s);
		return rc;
	}
	if (note[0] != '\0')
		log_warn("%s", note);
	start_slots(s);
	if ((rc = worker_start(&s->prep, io_wake, s, err)) != 0 ||
	    (rc = worker_start(&s->prep_gram, io_wake, s, err)) != 0) {
		sched_stop(s);
		return rc;
	}
	if (o->default_model != NULL) {
		if ((rc = sched_find_model(s, o->default_model, &s->default_model, err)) != 0 ||
		    (rc = slots_load(&s->slots, s->default_model, NULL, NULL, err)) != 0) {
			sched_stop(s);
			return ERR_NOTFOUND;
		}
	}
	s->draft_for = xcalloc((size_t)MAX(o->n_drafts, 1), sizeof *s->draft_for);
	for (int i = 0; i < o->n_drafts; i++)
		if ((rc = sched_find_model(s, o->drafts[2 * i], &s->draft_for[i], err)) != 0) {
			err_prefix(err, rc, "--model-draft");
			sched_stop(s);
			return ERR_NOTFOUND;
		}
	if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
		sched_stop(s);
		return err_set(err, ERR_NOMEM, "cannot start the engine thread");
	}
	s->running = 1;
	*out = s;
	return 0;
}

void
sched_stop_thread(struct sched *s)
{
	if (!s->running)
		return;
	pthread_mutex_lock(&s->mu);
	s->stopping = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->thread, NULL);
	s->running = 0;
}

void
sched_stop(struct sched *s)
{
	struct sched_event *ev;

	sched_stop_thread(s);
	while (s->jobs != NULL) {
		struct sched_job *j = s->jobs;

		s->jobs = j->next;
		sched_job_free(j);
	}
	while (s->ctls != NULL) {
		struct ctl *c = s->ctls;

		s->ctls = c->next;
		free(c);
	}
	while ((ev = s->events) != NULL) {
		s->events = ev->next;
		sched_event_free(ev);
	}
	worker_stop(&s->prep);
	worker_stop(&s->prep_gram);
	if (s->slots_on)
		slots_destroy(&s->slots);
	take_io(s);
	kvdisk_close(s->disk);
	kvhost_destroy(&s->host);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s->device);
	free(s->draft_for);
	free(s);
}

/* Queues a control message for the engine thread. */
static void
send_ctl(struct sched *s, struct ctl *c)
{
	pthread_mutex_lock(&s->mu);
	c->next = NULL;
	*s->ctls_tail = c;
	s->ctls_tail = &c->next;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

int
sched_model_known(struct sched *s, const char *name_or_path)
{
	return slots_known(&s->slots, name_or_path);
}

void
sched_submit(struct sched *s, struct sched_job *job)
{
	pthread_mutex_lock(&s->mu);
	job->next = NULL;
	*s->jobs_tail = job;
	s->jobs_tail = &job->next;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

void
sched_cancel(struct sched *s, uint64_t conn, uint64_t req_id, uint64_t cancel_req_id)
{
	struct ctl *c = xcalloc(1, sizeof *c);

	c->type = CTL_CANCEL;
	c->conn = conn;
	c->req_id = req_id;
	c->cancel_id = cancel_req_id;
	send_ctl(s, c);
}

void
sched_conn_gone(struct sched *s, uint64_t conn)
{
	struct ctl *c = xcalloc(1, sizeof *c);

	c->type = CTL_GONE;
	c->conn = conn;
	send_ctl(s, c);
}

void
sched_session_dropped(struct sched *s, const char *uuid)
{
	struct ctl *c = xcalloc(1, sizeof *c);

	c->type = CTL_DROP;
	snprintf(c->a, sizeof c->a, "%s", uuid);
	send_ctl(s, c);
}

void
sched_session_forked(struct sched *s, const char *parent, const char *child)
{
	struct ctl *c = xcalloc(1, sizeof *c);

	c->type = CTL_FORK;
	snprintf(c->a, sizeof c->a, "%s", parent);
	snprintf(c->b, sizeof c->b, "%s", child);
	send_ctl(s, c);
}
