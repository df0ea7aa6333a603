/*
 * kvdisk.h: the disk tier of the KV cache. A session's full KV blocks are
 * kept in one file, DIR/IDENTITY/UUID.kv, where IDENTITY stands for the
 * model file and the numerics the blocks were computed with (the engine's
 * identity), so that a session resumed after an eviction or a
 * restart loads its blocks instead of computing them again.
 *
 * The file is a header (the identity, in full, and the block size) and one
 * record per block in prefix order: its index, its 16 token ids, the
 * prefix cache's chained key of the history up to it, its K/V and a
 * checksum of all of them. A record is used only if the header matches the
 * engine exactly, every record before it in the load was used, its index,
 * tokens and key are the session's at that place (so the whole history
 * before it is, not only its 16 tokens) and its checksum holds; loading
 * stops at the first that fails, and the rest is computed. So a file cut
 * short or damaged anywhere (a kill -9 or a power loss in the middle of a
 * write, a disk error), one left from another model file or numerics, or
 * one written for a history that was never committed is never used
 * wrongly, and no other record of the state is needed.
 *
 * Reads and writes run on the tier's own thread (a worker.h worker), never
 * on the engine thread: a job names the blocks of the device pool to write
 * from or load into (their holder keeps them held until the job comes
 * back), and the thread copies them with the backend's kv_move,
 * which run on their own stream. Finished jobs queue up for the owner (kvdisk_take_done),
 * and the wake callback tells it there are some.
 *
 * The files share a byte budget: past it the least recently used files go.
 * The budget is one process's: the first to open the directory holds it
 * (a lock file), and another opening it meanwhile stores nothing.
 */
#ifndef RESIDENT_KVDISK_H
#define RESIDENT_KVDISK_H

#include <stddef.h>
#include <pthread.h>
#include <stdint.h>

#include "kernels.h"
#include "util.h"
#include "worker.h"

struct kvdisk;
struct backend;
struct backend_ops;

enum kvdisk_op {
	KVDISK_WRITE,   /* records [first, first + n) from blocks, after the first records of the file */
	KVDISK_LOAD,    /* records [first, first + n) into blocks, while they check out */
	KVDISK_REMOVE,  /* every file of the session (all identities, indexed or not) */
};

struct kvdisk_job {
	struct work work;           /* first: the tier's worker runs the job as its item */
	struct kvdisk *disk;        /* set by kvdisk_submit */
	enum kvdisk_op op;
	char name[37];              /* the session's uuid */
	/* WRITE and LOAD */
	void *owner;                /* the engine that gets it back (kvdisk_drain) */
	void *seq;                  /* the owner's: the sequence it is for, or NULL once that is gone */
	const struct backend_ops *ops;
	struct backend *be;
	pthread_mutex_t *copy_mu;   /* the owner's: held around kv_move (kernels.h) */
	uint64_t identity;
	char *identity_text;        /* malloc'd */
	uint64_t prev;              /* the records' key before record first (kvdisk.c) */
	size_t block_bytes;
	long move_stall_ms;         /* LOAD: the test hook RESIDENT_KV_MOVE_STALL's stall (kvdisk_move_stall), or 0 */
	int32_t first, n;
	int32_t *tokens;            /* n * KV_BLOCK_TOKENS: each record's token ids (malloc'd) */
	int32_t *blocks;            /* n device blocks (malloc'd), or a part of hold */
	int32_t *hold;              /* the owner's: blocks it holds until the job is back (malloc'd), or NULL */
	int32_t n_hold;
	/* the result */
	int32_t done;               /* WRITE: records the file holds after it; LOAD: records loaded */
	int rc;                     /* 0 or ERR_* (err says why) */
	char err[ERR_LEN];
	struct kvdisk_job *next;
};

/*
 * Opens the tier in dir (created 0700 if missing; its files are counted
 * against the budget, in bytes) and starts its thread. wake(arg) is called
 * from that thread when a job has finished. The tier stores nothing, and
 * only removes sessions' files, with a budget of 0 or while another
 * process has the directory (kvdisk_stores says which). note (ERR_LEN) is
 * left empty, or says for the log what the owner should know: that
 * another process has the directory, or that files of another format were
 * removed.
 */
int kvdisk_open(const char *dir, uint64_t budget, void (*wake)(void *), void *arg, struct kvdisk **out,
    char *note, char *err);
/* 1 if the tier stores sessions' KV; 0 if it only removes them (NULL: 0). */
int kvdisk_stores(const struct kvdisk *d);
/* Finishes the queued jobs, stops the thread, frees the finished jobs nobody took; NULL is allowed. */
void kvdisk_close(struct kvdisk *d);
/* Queues a job; the tier owns it until kvdisk_take_done hands it back. */
void kvdisk_submit(struct kvdisk *d, struct kvdisk_job *j);
/* The finished jobs, in order (a list); the caller frees each with kvdisk_job_free. */
struct kvdisk_job *kvdisk_take_done(struct kvdisk *d);
/*
 * Waits until no job of owner is queued or running, and takes its finished
 * ones (a list, as kvdisk_take_done), so that the owner can go away.
 */
struct kvdisk_job *kvdisk_drain(struct kvdisk *d, const void *owner);
void kvdisk_job_free(struct kvdisk_job *j);
/*
 * How many records the file of a session and identity is long enough to
 * hold (0 if there is none); they are checked only when loaded.
 * Thread-safe, no I/O.
 */
int32_t kvdisk_records(struct kvdisk *d, uint64_t identity, const char *identity_text, size_t block_bytes,
    const char *name);
/* Bytes of the files, and the budget. Thread-safe. */
void kvdisk_usage(struct kvdisk *d, uint64_t *bytes, uint64_t *budget);
/*
 * The test hook RESIDENT_KV_MOVE_STALL (engine_tier.c): a move of n blocks
 * into the pool from `from` has copied its first; says so on stderr, for
 * the test to see, and waits ms milliseconds before it goes on.
 */
void kvdisk_move_stall(long ms, const char *from, int32_t n);

#endif
