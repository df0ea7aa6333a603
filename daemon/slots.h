/*
 * slots.h: the scheduler's models, and one memory budget for the device
 * over all of them.
 *
 * A slot is a model known by name and path; it is loaded on demand. Loading
 * one asks the engine what it needs (engine_mem_need): at least its weights,
 * scratch and a KV cache of one context, at most its configured KV cache.
 * Loaded models that no request uses are unloaded, least recently used
 * first, until the budget has the least it needs; it then gets the most the
 * budget has left, up to what it wants. Only models that requests use hold
 * memory it cannot take: then it waits (SLOTS_WAIT) for them to finish.
 * An unused model is also unloaded once its keep-alive has passed.
 *
 *   known --slots_load--> loaded --(users fall to 0)--> idle --+--> unloaded
 *                            ^                                 |
 *                            +------ slots_acquire ------------+
 *                    (idle: keep-alive over, or the budget needs it)
 *
 * A known slot whose first load (or slots_prepare) fails goes again, so
 * that a path that is no model leaves nothing behind.
 *
 * Engine thread only, but for slots_known.
 */
#ifndef RESIDENT_SLOTS_H
#define RESIDENT_SLOTS_H

#include <pthread.h>
#include <stdint.h>

#include "engine.h"
#include "hist.h"
#include "guess.h"
#include "pace.h"

struct resident;

struct slot {
	char *name, *path;
	struct engine *e;             /* NULL while not loaded */
	const char *device;           /* "cpu" after a GPU fault under SCHED_FAULT_CPU; NULL: slots_opts' */
	uint64_t faults;              /* backend failures (the scheduler's model_fault) */
	struct resident *residents;   /* the scheduler's parked sessions on it (sched_resident.c) */
	int users;                    /* requests running on it */
	double keep_alive;            /* seconds it stays loaded unused; < 0: until the memory is needed */
	uint64_t idle_since;          /* now_ns() when it was last left unused */
	uint64_t last_used;           /* order of last use among the slots */
	uint64_t loads, unloads;
	struct pace pace;             /* its steps' prefill chunk (the scheduler's) */
	struct guess guess;           /* whether its decode steps guess ahead (the scheduler's) */
	/* the scheduler's figures for status, since the daemon started */
	uint64_t prompt_tokens, generated_tokens;
	struct hist ttft, itl;        /* time to first token, between tokens (hist_ttft, hist_itl) */
	struct slot *next;
};

struct slots_opts {
	struct engine_opts eo;        /* how its engines are opened */
	uint64_t budget;              /* bytes of device memory for all loaded models */
	double keep_alive;            /* the default keep-alive, seconds (< 0: forever) */
	/* called before a slot's engine is closed, to let go of what refers to it */
	void (*unloading)(void *arg, struct slot *m);
	void *arg;
};

struct slots {
	struct slots_opts o;
	struct slot *list;
	uint64_t used;                /* bytes the loaded models hold */
	uint64_t loads, unloads, clock;
	pthread_mutex_t mu;           /* known */
	char **known;                 /* names and paths of the slots, for slots_known */
	int n_known;
};

/* The memory of a slots_load that had to wait (the budget is held by models in use). */
#define SLOTS_WAIT 1

void slots_init(struct slots *sl, const struct slots_opts *o);
/* Unloads and forgets every slot. */
void slots_destroy(struct slots *sl);
/*
 * The slot of a model name or path; a path to an existing file or
 * directory (relative ones from residentd's directory) makes a new slot
 * under its absolute path, which goes again if its first slots_load or
 * slots_prepare fails. Returns 0, or ERR_NOTFOUND or ERR_INVAL (no such
 * model, a name taken by another file), with a message in err.
 */
int slots_find(struct slots *sl, const char *name_or_path, struct slot **out, char *err);
/* Whether a name or path is a known slot, or an existing file's. Thread-safe. */
int slots_known(struct slots *sl, const char *name_or_path);
/*
 * Loads a slot if it is not loaded, unloading unused ones as the budget
 * needs; progress(arg, done, total) is told before and after a load (total:
 * the model file's bytes). 0 when loaded, SLOTS_WAIT when models in use
 * hold the memory it needs (nothing was done), or a negative code (a slot
 * that never loaded and that nothing uses is then freed: see slots_prepare).
 */
int slots_load(struct slots *sl, struct slot *m, void (*progress)(void *, uint64_t, uint64_t), void *arg,
    char *err);
void slots_unload(struct slots *sl, struct slot *m);
/*
 * Opens a slot's model as slots_load would, without loading it: its
 * description, context and memory needs (engine_prepare). The caller
 * closes *out with engine_close. 0 or a negative code; after a failure a
 * slot that never loaded and that nothing uses is freed (as after a failed
 * slots_load), so the caller no longer touches m.
 */
int slots_prepare(struct slots *sl, struct slot *m, struct engine **out, char *err);
/* A request starts running on a loaded slot. */
void slots_acquire(struct slots *sl, struct slot *m);
/* It ended: the slot keeps keep_alive (seconds, < 0: forever) from now on if nobody else uses it. */
void slots_release(struct slots *sl, struct slot *m, double keep_alive);
/*
 * Unloads the unused slots whose keep-alive has passed. Returns the
 * nanoseconds until the next one's does, or -1 if none will.
 */
int64_t slots_expire(struct slots *sl);
/* Seconds until an unused loaded slot's keep-alive passes; -1: it stays (in use, or forever). */
double slots_expires_in(const struct slot *m);

#endif
