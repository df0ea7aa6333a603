/* worker.c: one thread, a queue in and a queue out (worker.h). */
#include "config.h"
#include "worker.h"
#include "util.h"

#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/*
 * The link to the queued item to run next (under mu): the first item of
 * the smallest key after the last one run, or, past the largest, of the
 * smallest key of all.
 */
static struct work **
next_item(struct worker *wk)
{
	struct work **pp, **after = NULL, **lowest = NULL;

	for (pp = &wk->queue; *pp != NULL; pp = &(*pp)->next) {
		uint64_t k = (*pp)->key;

		if (k > wk->last_key && (after == NULL || k < (*after)->key))
			after = pp;
		if (lowest == NULL || k < (*lowest)->key)
			lowest = pp;
	}
	return after != NULL ? after : lowest;
}

static void *
worker_main(void *arg)
{
	struct worker *wk = arg;
	struct work *w, **pp;

	/* behind the loop thread, which sends the tokens of every stream (Linux nices threads one by one) */
	setpriority(PRIO_PROCESS, (id_t)gettid(), WORKER_NICE);
	pthread_mutex_lock(&wk->mu);
	for (;;) {
		while (wk->queue == NULL && !wk->stopping)
			pthread_cond_wait(&wk->cv, &wk->mu);
		if (wk->queue == NULL)
			break;
		pp = next_item(wk);
		w = *pp;
		if ((*pp = w->next) == NULL)
			wk->queue_tail = pp;
		wk->last_key = w->key;
		wk->running = w;
		pthread_mutex_unlock(&wk->mu);
		w->fn(w);
		pthread_mutex_lock(&wk->mu);
		wk->running = NULL;
		w->next = NULL;
		*wk->done_tail = w;
		wk->done_tail = &w->next;
		pthread_cond_broadcast(&wk->cv);
		pthread_mutex_unlock(&wk->mu);
		wk->wake(wk->wake_arg);
		pthread_mutex_lock(&wk->mu);
	}
	pthread_mutex_unlock(&wk->mu);
	return NULL;
}

int
worker_start(struct worker *wk, void (*wake)(void *), void *arg, char *err)
{
	memset(wk, 0, sizeof *wk);
	wk->wake = wake;
	wk->wake_arg = arg;
	wk->queue_tail = &wk->queue;
	wk->done_tail = &wk->done;
	pthread_mutex_init(&wk->mu, NULL);
	pthread_cond_init(&wk->cv, NULL);
	if (pthread_create(&wk->thread, NULL, worker_main, wk) != 0)
		return err_set(err, ERR_NOMEM, "cannot start the worker thread");
	wk->started = 1;
	return 0;
}

void
worker_stop(struct worker *wk)
{
	if (!wk->started)
		return;
	pthread_mutex_lock(&wk->mu);
	wk->stopping = 1;
	pthread_cond_broadcast(&wk->cv);
	pthread_mutex_unlock(&wk->mu);
	pthread_join(wk->thread, NULL);
	wk->started = 0;
}

void
worker_submit(struct worker *wk, struct work *w)
{
	pthread_mutex_lock(&wk->mu);
	w->next = NULL;
	*wk->queue_tail = w;
	wk->queue_tail = &w->next;
	pthread_cond_broadcast(&wk->cv);
	pthread_mutex_unlock(&wk->mu);
}

struct work *
worker_take_done(struct worker *wk)
{
	struct work *w;

	pthread_mutex_lock(&wk->mu);
	w = wk->done;
	wk->done = NULL;
	wk->done_tail = &wk->done;
	pthread_mutex_unlock(&wk->mu);
	return w;
}

/* 1 if w is owner's (owner NULL: everyone's). */
static int
owned(const struct work *w, const void *owner)
{
	return owner == NULL || w->owner == owner;
}

/* 1 if an item of owner is queued or running (under mu). */
static int
owner_busy(const struct worker *wk, const void *owner)
{
	const struct work *w;

	if (wk->running != NULL && owned(wk->running, owner))
		return 1;
	for (w = wk->queue; w != NULL; w = w->next)
		if (owned(w, owner))
			return 1;
	return 0;
}

struct work *
worker_drain(struct worker *wk, const void *owner)
{
	struct work *mine = NULL, **tail = &mine, **pp, *w;

	pthread_mutex_lock(&wk->mu);
	while (owner_busy(wk, owner))
		pthread_cond_wait(&wk->cv, &wk->mu);
	for (pp = &wk->done; (w = *pp) != NULL;) {
		if (owned(w, owner)) {
			*pp = w->next;
			w->next = NULL;
			*tail = w;
			tail = &w->next;
		} else {
			pp = &w->next;
		}
	}
	for (wk->done_tail = &wk->done; *wk->done_tail != NULL; wk->done_tail = &(*wk->done_tail)->next)
		;
	pthread_mutex_unlock(&wk->mu);
	return mine;
}
