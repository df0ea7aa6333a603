/*
 * sched_int.h: what the scheduler's files share, and nothing outside them
 * includes (the rest of the daemon sees sched.h alone): the engine thread's
 * state (struct sched), a generate request and its states (struct gen), a
 * session's sequence kept between turns (struct resident), and the
 * functions one of the files calls in another. Each file calls only into
 * the files listed after it, never back up, so that what a change to one
 * file can break is in the files above it:
 *
 *   sched.c            the thread: intake of jobs and control messages, the
 *                      main loop, start and stop, the API of sched.h
 *   sched_ops.c        model.list, model.load, model.unload, model.show, status
 *   sched_step.c       a model's step: its sequences, tokens out, cancels, faults
 *   sched_admit.c      queued requests to their models and to the prompt worker
 *   sched_gen.c        a generate's token and done replies, and its end
 *   sched_draft.c      a request's draft model: its guesses before each step
 *   sched_embed.c      an embed's inputs: tokens, sequences, vectors, its reply
 *   sched_resident.c   a request's sequences: sessions' between turns, the prefix
 *                      cache, several choices forked from one prompt; its models
 *                      released
 *   sched_prompt.c     messages through the chat template, to tokens
 *   sched_event.c      replies queued for the loop thread
 */
#ifndef RESIDENT_SCHED_INT_H
#define RESIDENT_SCHED_INT_H

#include <pthread.h>
#include <stdint.h>

#include "engine.h"
#include "kvhost.h"
#include "sched.h"
#include "slots.h"
#include "util.h"
#include "worker.h"

/*
 * A generate request moves through:
 *
 *   GEN_QUEUED --admit()--> GEN_PREP --(prompt back)--> GEN_RUNNING --(done)--> freed
 *       |      (model loaded,  (the worker renders        (its sequence: SEQ_LOAD while
 *       |       or SLOTS_WAIT)  and tokenizes it)          its KV comes from disk, then
 *       |                                                  PREFILL, DECODE, DONE)
 *       +--cancel/gone at any point: finished at the next chance
 *
 * take_job (sched.c) queues it; admit and prep_done (sched_admit.c) move it
 * on; sched_gen_free (sched_gen.c) frees it, after a step (sched_step.c)
 * finished its sequences or sched_reap_cancelled ended it.
 *
 * An embed request (sched_embed.c) moves through the same states: the
 * worker tokenizes its inputs, and while it runs, its inputs are started a
 * step's worth at a time, a sequence each (struct embed_run).
 *
 * A request of n choices (PROTOCOL.md, Several choices) prefills one
 * sequence; once its prompt is in the KV cache, the n - 1 others are forked
 * from it (sched_fork_choices), sharing its blocks, and it ends when all of
 * them have, or at once when one fails. It counts as n sequences wherever
 * running ones are counted (sched_running).
 */

enum gen_state { GEN_QUEUED, GEN_PREP, GEN_RUNNING };

/*
 * An embed request's inputs once admitted (sched_embed.c): their tokens
 * (the prompt worker's), the sequences running, started a step's worth at
 * a time and freed as each is done, and the vectors made.
 */
struct embed_run {
	int n;                      /* inputs */
	int32_t **ids;              /* each input's tokens */
	int32_t *n_ids;
	int truncated;              /* inputs cut to the context (truncate) */
	int64_t n_tokens;           /* all inputs' tokens */
	int32_t dims;               /* floats of each vector */
	float *vecs;                /* n x dims */
	int next;                   /* inputs started */
	int done;                   /* inputs with their vector */
	struct seq **running;       /* n_running sequences, input idx[i] each */
	int *idx;
	int n_running;
	enum proto_err failed;      /* PE_NONE, or why it ended early (error says) */
	char error[ERR_LEN];
};

/* A generate request inside the scheduler. */
struct gen {
	struct work prep;           /* first, so that the worker's item is the gen (prep_run) */
	struct sched_job *job;
	enum gen_state state;
	struct slot *slot;          /* its model, once admitted (it is then one of its users) */
	struct slot *draft;         /* its draft model (sched_draft.c), held as slot is, or NULL */
	struct seq *dseqs[PROTO_MAX_CHOICES]; /* choice i's sequence on the draft's engine, or NULL */
	struct seq *seqs[PROTO_MAX_CHOICES]; /* choice i's sequence: the first from the prompt, the others forked */
	int n_seqs;                 /* 0 until it starts, 1 while its prompt is prefilled, then n */
	struct resident *res;       /* the session's cached sequence, while running */
	struct embed_run *emb;      /* an embed's, once its inputs are tokenized */
	uint64_t load_ns;           /* time its admission spent loading the model */
	int cancelled, gone;
	int32_t n_prompt;
	uint64_t t_first;           /* first token */
	uint64_t t_token[PROTO_MAX_CHOICES]; /* each choice's last token, for the time between tokens */
	/* GEN_PREP: the worker renders and tokenizes the prompt with the model's description */
	const struct model_desc *md;
	int32_t *ids;
	size_t n_ids;
	struct cons_gram *gram;     /* the output's grammar (sched_prompt_grammar), held until freed */
	int prep_rc;
	enum proto_err prep_pe;
	char prep_err[ERR_LEN];
	struct gen *next;
};

/* A session's sequence kept between turns (parked: engine_seq_park). */
struct resident {
	char uuid[37];
	struct seq *seq;
	int busy;
	int dropped;                /* the session was deleted while it ran: freed when done */
	uint64_t last_used;
	struct resident *next;
};

struct ctl;                 /* a control message, sched.c's own */

/* The scheduler: the lists it shares with the loop thread (under mu), then its own state. */
struct sched {
	struct sched_opts o;
	char *device;
	pthread_t thread;
	int running;                          /* the thread was started and not joined */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stopping;
	struct sched_job *jobs, **jobs_tail;   /* in, from the loop thread */
	struct ctl *ctls, **ctls_tail;
	struct sched_event *events, **events_tail; /* out */
	void (*wake)(void *);
	void *wake_arg;
	int io_ready;                         /* the disk tier or the worker has finished something */
	struct kvdisk *disk;                  /* with --kv-disk 0 too, where it only removes (kvdisk_stores) */
	/* engine thread only */
	struct kvhost host;
	struct worker prep;                   /* prompts are tokenized there (worker.h) */
	struct worker prep_gram;              /* and those of constrained requests, whose grammar's index may
	                                         take seconds to build: not in the way of the others */
	struct slots slots;
	int slots_on;                         /* slots_init was done */
	struct slot *default_model;
	struct slot **draft_for;              /* o.n_drafts: the model of each of o.drafts' pairs */
	struct gen *gens;                     /* queued and running, in arrival order */
	struct gen *waiting;                  /* queued until models in use give back memory */
	int retry;                            /* a model fell out of use since waiting was last tried */
	int n_queued;
	uint64_t rr_conn;                     /* round-robin position */
	uint64_t tick;
	uint64_t t_start;
	uint64_t steps, step_tokens, step_seqs;
	int max_batch;
	struct hist batch;                    /* sequences a step (hist_batch) */
	uint64_t requests[FINISH_ERROR + 1];  /* generate requests ended, by how (sched_gen.c: gen_outcome) */
};

/* Packs the n_fields fields of a result; arg is sched_post_result's. */
typedef void sched_fill_fn(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg);

/* sched_ops.c */
void sched_op_model_load(struct sched *s, struct sched_job *job);
void sched_op_model_unload(struct sched *s, struct sched_job *job);
void sched_op_model_show(struct sched *s, struct sched_job *job);
void sched_fill_model_list(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg);
void sched_fill_status(struct sched *s, const struct sched_job *job, msgpack_packer *pk, const void *arg);

/* sched_step.c */
void sched_step_model(struct sched *s, struct slot *m);
int sched_gen_ready(const struct gen *g);
void sched_reap_cancelled(struct sched *s);
int sched_unload_model(struct sched *s, struct slot *m, enum finish_reason why, const char *error);

/* sched_admit.c */
int sched_find_model(struct sched *s, const char *name_or_path, struct slot **out, char *err);
struct slot *sched_job_model(struct sched *s, const struct sched_job *job, const char *name_or_path);
int sched_load_now(struct sched *s, const struct sched_job *job, struct slot *m, int progress);
void sched_admit_queued(struct sched *s);
int sched_admit_ready(const struct sched *s);
int sched_op_tokens(struct sched *s, struct sched_job *job);
void sched_take_prep(struct sched *s, struct work *w);

/* sched_gen.c */
struct sched_event *sched_token_event(struct gen *g, const struct seq *q);
struct sched_event *sched_done_event(struct gen *g);
void sched_gen_token_time(struct gen *g, const struct seq *q, uint64_t now);
void sched_gen_finish(struct gen *g, enum finish_reason why, const char *error);
int sched_gen_over(struct gen *g);
void sched_gen_free(struct sched *s, struct gen *g);

/* sched_draft.c */
/*
 * Gives g the draft model d (loaded): its vocabulary must be the target's.
 * 0 (g holds d as one of its users), or ERR_INVAL with the message.
 */
int sched_draft_use(struct sched *s, struct gen *g, struct slot *d, char *err);
/* g lets go of its draft model and the draft's sequences. */
void sched_draft_drop(struct sched *s, struct gen *g);
/* Every request lets go of draft model d (before it is unloaded). */
void sched_draft_unload(struct sched *s, struct slot *d);
/*
 * Before a step of seqs[0..n) (gens[]' sequences): the draft models of
 * those that guess this step (engine_seq_guesses, after the step's
 * engine_auto_guess) guess their next tokens. Returns NULL, or the draft
 * model whose backend failed (err says how).
 */
struct slot *sched_draft_guess(struct sched *s, struct seq **seqs, struct gen **gens, int n,
    char *err);

/* sched_embed.c */
void sched_embed_prep(struct gen *g);
int sched_embed_start(struct gen *g, enum proto_err *pe, char *err);
int sched_embed_pick(struct gen *g, struct seq **out, struct gen **gens, int n, int max, int32_t *need);
int sched_embed_ready(const struct gen *g);
/* 1 if a sequence can go into a step: not done, not waiting for blocks a disk write holds (sched_step.c). */
int sched_seq_ready(const struct seq *q);
/* The blocks a step may take for a sequence: its tokens not in the cache, and one to copy on write. */
int32_t sched_seq_blocks(const struct seq *q);
int sched_embed_over(struct gen *g);
void sched_embed_end(struct gen *g, enum finish_reason why, const char *error);
struct sched_event *sched_embed_event(struct gen *g);
void sched_embed_free(struct gen *g);

/* sched_resident.c */
/* The keep-alive a request leaves its models with. */
double sched_job_keep_alive(const struct sched *s, const struct sched_job *job);
/* A request is done with model m; a generate waiting for memory may be admitted once nobody uses it. */
void sched_release_slot(struct sched *s, struct slot *m, double keep_alive);
void sched_free_resident(struct slot *m, struct resident *r);
void sched_drop_residents(void *arg, struct slot *m);
int sched_start_seq(struct sched *s, struct gen *g, const int32_t *ids, size_t n, char *err);
int sched_fork_choices(struct sched *s, struct gen *g, char *err);
void sched_make_room(struct slot *m, int32_t need);
void sched_fork_resident(struct sched *s, const char *parent, const char *child);
void sched_drop_resident(struct sched *s, const char *uuid);

/* sched_prompt.c */
/*
 * The request's constraint (grammar, json_schema or json) as a grammar over
 * e's vocabulary, held in *out (NULL when it has none). 0, or ERR_INVAL /
 * ERR_RANGE / ERR_UNSUPPORTED saying what is wrong with it.
 */
int sched_prompt_grammar(struct engine *e, const struct sched_job *job, struct cons_gram **out, char *err);
/*
 * What a required tool call's generation prompt gets after the template's
 * (*out malloc'd, NULL when nothing): the call's opening that only control
 * tokens spell, which a grammar cannot generate (Mistral's [TOOL_CALLS],
 * harmony's header to=functions.NAME). 0, or ERR_UNSUPPORTED for a call
 * harmony cannot open: one of several tools, none named.
 */
int sched_tool_prefix(const struct model_desc *md, const struct sched_job *job, char **out, char *err);
int sched_prompt_tokens(const struct model_desc *md, const struct sched_job *job, int32_t **ids, size_t *n,
    enum proto_err *pe, char *err);
void sched_closing_tokens(const struct model_desc *md, const struct sched_job *job, const struct seq *q,
    int32_t **ids, size_t *n);

/* sched_event.c */
void sched_post_chain(struct sched *s, struct sched_event *first, struct sched_event **last_next);
struct sched_event **sched_chain(struct sched_event **tail, struct sched_event *ev);
void sched_post(struct sched *s, struct sched_event *ev);
struct sched_event *sched_new_event(uint64_t conn, uint64_t req_id, int last);
void sched_post_error(struct sched *s, const struct sched_job *job, enum proto_err code, const char *msg);
void sched_post_result(struct sched *s, const struct sched_job *job, size_t n_fields, sched_fill_fn *fill,
    const void *arg, const char *extra_model);

#endif
