/*
 * worker.h: a thread that runs slow work in order, off the engine thread:
 * the scheduler's preparations (a prompt's chat rendering and
 * tokenization: a 32,000-token prompt takes longer to tokenize than a
 * decoding step takes), and the KV disk tier's reads and writes.
 *
 * A work item is embedded in its owner's struct; its function runs on the
 * worker thread, and the item then waits among the finished ones until the
 * owner takes it back (worker_take_done), woken by the callback. Items of
 * one key (the scheduler's: the client's connection) run in order, and the
 * keys take turns, so that one client's backlog (a thousand tokenizes of a
 * megabyte) does not hold another's prompt back. The KV
 * disk tier's reads and writes run on a worker of their own too. The
 * thread runs at a lower priority than the others (WORKER_NICE), so that
 * a long tokenization does not delay the loop thread's replies.
 */
#ifndef RESIDENT_WORKER_H
#define RESIDENT_WORKER_H

#include <pthread.h>
#include <stdint.h>

/* The worker thread's nice value: it yields the CPU to the loop and engine threads. */
#define WORKER_NICE 10

struct work {
	void (*fn)(struct work *w);
	const void *owner;           /* whose it is (worker_drain): what it reads, that must outlive it */
	uint64_t key;                /* whose turn it takes (0: all items are one's, in order) */
	struct work *next;
};

struct worker {
	pthread_t thread;
	int started, stopping;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct work *queue, **queue_tail, *done, **done_tail;
	struct work *running;        /* the item the thread runs, or NULL */
	uint64_t last_key;           /* the key of the item run last */
	void (*wake)(void *);
	void *wake_arg;
};

/* Starts the thread; wake(arg) is called from it when an item has finished. 0 or ERR_NOMEM. */
int worker_start(struct worker *wk, void (*wake)(void *), void *arg, char *err);
/* Runs what is queued, then stops the thread (the finished items stay to be taken). */
void worker_stop(struct worker *wk);
void worker_submit(struct worker *wk, struct work *w);
/* The finished items, in order (a list through next). */
struct work *worker_take_done(struct worker *wk);
/*
 * Waits until no item of owner (NULL: of anyone) is queued or running, and
 * takes its finished ones (a list, as worker_take_done), so that the owner
 * can let go of what they use; other owners' items go on meanwhile.
 */
struct work *worker_drain(struct worker *wk, const void *owner);

#endif
