/*
 * cpu_pool.c: worker threads for the CPU backend's parallel loops.
 *
 * A forward step runs a few hundred short loops, so waking workers must be
 * cheap: they spin on a generation counter for a while before sleeping on
 * the condition variable, and the caller works on tasks too.
 */
#include "config.h"
#include "cpu_pool.h"
#include "util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

struct cpu_pool {
	int n_threads;
	int spin;               /* rounds a worker spins before it sleeps */
	pthread_t *tid;
	pthread_mutex_t mu;
	pthread_cond_t wake;
	atomic_uint gen;        /* bumped for each loop (and at shutdown) */
	atomic_int stop;
	/* the current loop */
	cpu_task_fn fn;
	void *ctx;
	int64_t n_tasks;
	atomic_llong next;
	atomic_int busy;        /* workers still in the current loop */
};

struct worker_arg {
	struct cpu_pool *p;
	int thread;
};

/* Takes tasks until none are left. */
static void
drain(struct cpu_pool *p, int thread)
{
	int64_t t;

	while ((t = atomic_fetch_add(&p->next, 1)) < p->n_tasks)
		p->fn(p->ctx, t, thread);
}

/* Waits until the generation moves past seen: spins first, then sleeps. */
static unsigned
wait_gen(struct cpu_pool *p, unsigned seen)
{
	unsigned g;
	int i;

	for (i = 0; i < p->spin; i++)
		if ((g = atomic_load(&p->gen)) != seen)
			return g;
	pthread_mutex_lock(&p->mu);
	while ((g = atomic_load(&p->gen)) == seen)
		pthread_cond_wait(&p->wake, &p->mu);
	pthread_mutex_unlock(&p->mu);
	return g;
}

static void *
worker_main(void *arg)
{
	struct worker_arg *w = arg;
	struct cpu_pool *p = w->p;
	int thread = w->thread;
	unsigned seen = 0;

	free(w);
	for (;;) {
		seen = wait_gen(p, seen);
		if (atomic_load(&p->stop))
			return NULL;
		drain(p, thread);
		atomic_fetch_sub(&p->busy, 1);
	}
}

struct cpu_pool *
cpu_pool_new(int n_threads, int spin)
{
	struct cpu_pool *p = xcalloc(1, sizeof *p);
	struct worker_arg *w;
	int i;

	p->n_threads = n_threads < 1 ? 1 : n_threads;
	p->spin = spin;
	p->tid = xcalloc((size_t)p->n_threads, sizeof *p->tid);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->wake, NULL);
	for (i = 1; i < p->n_threads; i++) {
		w = xmalloc(sizeof *w);
		w->p = p;
		w->thread = i;
		if (pthread_create(&p->tid[i], NULL, worker_main, w) != 0)
			fatal("cannot start a worker thread");
	}
	return p;
}

void
cpu_pool_free(struct cpu_pool *p)
{
	int i;

	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, 1);
	atomic_fetch_add(&p->gen, 1);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	for (i = 1; i < p->n_threads; i++)
		pthread_join(p->tid[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->wake);
	free(p->tid);
	free(p);
}

int
cpu_pool_threads(const struct cpu_pool *p)
{
	return p->n_threads;
}

void
cpu_pool_run(struct cpu_pool *p, int64_t n_tasks, cpu_task_fn fn, void *ctx)
{
	int64_t t;

	if (p->n_threads == 1 || n_tasks == 1) {
		for (t = 0; t < n_tasks; t++)
			fn(ctx, t, 0);
		return;
	}
	p->fn = fn;
	p->ctx = ctx;
	p->n_tasks = n_tasks;
	atomic_store(&p->next, 0);
	atomic_store(&p->busy, p->n_threads - 1);
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add(&p->gen, 1);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	drain(p, 0);
	/* a worker pushed off its core must not cost the caller a whole time slice */
	while (atomic_load(&p->busy) > 0)
		sched_yield();
}
