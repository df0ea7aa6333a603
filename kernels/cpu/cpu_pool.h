/* cpu_pool.h: a fixed set of worker threads running parallel loops. */
#ifndef RESIDENT_CPU_POOL_H
#define RESIDENT_CPU_POOL_H

#include <stdint.h>

struct cpu_pool;

/* Called for each task index in [0, n_tasks); thread is 0..n_threads-1. */
typedef void (*cpu_task_fn)(void *ctx, int64_t task, int thread);

/* Rounds a worker spins for the next loop before it sleeps: about 20 us, what one step's loops leave between them. */
#define CPU_POOL_SPIN 20000
/*
 * About 200 us: for a pool whose loops come between a GPU's kernels (the
 * host layers of a CUDA step, 75-95 us apart at one token), which would
 * otherwise pay a wake-up of every worker each layer.
 */
#define CPU_POOL_SPIN_LONG 200000

/* Starts n_threads - 1 workers (the caller is thread 0), each spinning spin rounds before it sleeps. */
struct cpu_pool *cpu_pool_new(int n_threads, int spin);
void cpu_pool_free(struct cpu_pool *p);
int cpu_pool_threads(const struct cpu_pool *p);

/*
 * Runs fn for every task on all threads and returns when all are done.
 * Tasks are handed out in order from a shared counter, so a task's result
 * must not depend on which thread ran it.
 */
void cpu_pool_run(struct cpu_pool *p, int64_t n_tasks, cpu_task_fn fn, void *ctx);

#endif
