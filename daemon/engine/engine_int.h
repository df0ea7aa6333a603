/*
 * engine_int.h: the engine's state, shared by engine.c (sequences and
 * steps) and engine_tier.c (what its K/V depend on, and blocks to and from
 * the host and disk tiers). Not for other parts of the daemon: engine.h is
 * their interface.
 */
#ifndef RESIDENT_ENGINE_INT_H
#define RESIDENT_ENGINE_INT_H

#include "engine.h"
#include "kernels.h"
#include "kv.h"
#include "kvhost.h"

#include <pthread.h>

/*
 * Blocks a copy from the host tier moves: the pool blocks a run takes may
 * push idle ones out to the host tier, into the buffers the run before gave
 * back (pinning new ones costs the driver far more than the copy).
 */
#define HOST_RUN 32

struct engine {
	struct model_desc *m;
	const struct backend_ops *ops;
	int exact;          /* the backend runs its exact numerics (engine_opts) */
	struct backend_opts bo;
	/*
	 * The backend's plan for the placement chosen (engine_mem_need): every
	 * layer on the device until engine_load keeps the feed-forwards of
	 * host_layers layers (those host_ffn marks, from the first on) in host
	 * memory to fit its limit; fixed_min is plan.fixed with every one that
	 * can move there, fixed_whole with none, ffn each layer's device bytes.
	 */
	struct backend_plan plan;
	uint64_t fixed_min, fixed_whole;
	uint64_t *ffn;
	uint8_t *host_ffn;
	int32_t host_layers;
	int hot_experts;    /* what a host layer of experts keeps on the device (RESIDENT_HOT_EXPERTS, else n_expert / HOT_SHARE) */
	int32_t n_io;       /* disk jobs in flight: they hold blocks of the pool */
	pthread_mutex_t copy_mu; /* held around kv_move, which the disk tier's thread calls too */
	uint64_t mem_bytes;              /* what it holds on the device once loaded */
	struct backend *be; /* NULL until engine_load */
	struct kv_pool kv;
	int32_t n_ctx;
	int32_t max_step_tokens;
	int32_t max_seqs;
	/* step buffers */
	struct fwd_seq *fseqs;
	struct seq **fseq_of;   /* the sequence of each fwd_seq */
	int32_t *tokens;
	/*
	 * A step's logits rows: one for each sequence that samples, and one
	 * for each guess checked (speculative decoding takes the rows the
	 * step's sequences leave, so large batches guess less).
	 */
	int32_t max_rows;       /* max_seqs, at least ENGINE_DRAFT_MAX + 1 (a sequence alone guesses fully) */
	float *logits;          /* max_rows rows */
	int32_t *argmax;        /* max_rows: the picks, when the backend makes them */
	struct fwd_pick *pick;  /* max_rows: how it draws them, when a row samples */
	int32_t *pen_tok, *pen_cnt; /* max_rows * FWD_PICK_PENALTY_MAX: the rows' penalty windows */
	float *logprob;         /* max_rows: the picks' log-probabilities */
	int32_t *top_ids;       /* max_rows * FWD_TOP_LOGPROBS: the rows' most likely tokens */
	float *top_lp;          /* and theirs */
	int host_picks;         /* RESIDENT_HOST_SAMPLING=1: sample.c picks every token (to compare) */
	int32_t n_fseqs;        /* the step's */
	/* constrained decoding */
	struct cons *cons;      /* the model's grammars */
	uint32_t *masks;        /* max_rows masks of FWD_MASK_WORDS(n_vocab) words: the step's constrained rows */
	int32_t *mask_rows;     /* max_rows: their logits rows */
	uint64_t drafted, accepted; /* guesses checked since the engine opened, and those accepted */
	int32_t step_guesses;   /* the last step's */
	int auto_guess;         /* engine_auto_guess's (initially 1) */
	uint32_t share_turn;    /* where share_guesses starts giving the odd rows (engine_step moves it on) */
	/* an embedding model's */
	float *embd;            /* max_step_tokens rows of n_embd: the step's hidden states */
	float *embd_tmp;        /* n_embd, then embed_finish's scratch */
	/* the prefix cache and its tiers */
	/*
	 * What its K/V depend on besides the tokens: the model file (path, size,
	 * modification time, a hash of each file's stat and sampled bytes
	 * (files_hash) and one of its tensor directory, which holds the
	 * quantization) and the numerics (backend, exact mode, KV element size);
	 * the text for people (and the disk tier's file headers), its hash for
	 * keys (the prefix cache's, so the host tier's, and the disk tier's).
	 */
	uint64_t identity;
	char *identity_text;
	size_t block_bytes;     /* one block's K/V, as kv_move gives it */
	struct kvhost *host;
	/*
	 * Blocks the pool gave up for the host tier, their copies out waiting
	 * (tier_evict) to go together, before anything writes into the pool,
	 * or in the copy that brings a run from the host tier in.
	 */
	struct kvhost_block *evicted[HOST_RUN];
	int32_t evicted_blk[HOST_RUN];
	int32_t n_evicted;
	struct kvdisk *disk;
	long move_stall_ms;     /* RESIDENT_KV_MOVE_STALL (tests only, engine_tier.c), or 0 */
	struct engine_cache_stats st;
};

/* ---- engine.c ---- */

/* Makes room for n entries in the block table. */
void seq_grow_blocks(struct seq *s, int32_t n);
/* Enters the blocks the last step filled into the prefix cache. */
void seq_publish(struct engine *e, struct seq *s);
/* Appends tokens to a sequence's history. */
void seq_push_tokens(struct seq *s, const int32_t *t, int32_t n);
/* Frees a constrained sequence's grammars after its guesses. */
void free_gspec(struct seq *s);
/* Accepts a sampled token: its text (gentext.h), the end of generation, the grammar, stop strings, limits. */
void seq_accept(struct engine *e, struct seq *s, int32_t tok);
/* A constrained sequence whose grammar left no token (rc 0) or failed (rc < 0, s->error says why): it ends. */
void gram_dead_end(struct seq *s, int rc);

/* ---- engine_spec.c ---- */

/*
 * Shares the rows a step of seqs[0..n) leaves for guesses (returned) among
 * them (their guess_cap); drafted, if not NULL, marks those a draft model
 * is yet to guess for.
 */
int32_t share_guesses(struct engine *e, struct seq **seqs, int n, const int *drafted);
/* Puts s's guesses (its share, within room rows and mask_room masks) after its last token. */
void seq_guess(struct engine *e, struct seq *s, int32_t room, int32_t *mask_room);
/* Takes s's guesses back (it is not in the step). */
void seq_unguess(struct seq *s);
/* Takes the next token the step settled for s; 0 when none is left or s has ended. */
int seq_take(struct engine *e, struct seq *s);
/* Drops guesses until the step's n_tok tokens suit the backend's step_align; returns the step's tokens. */
int32_t trim_guesses(struct engine *e, int32_t n_fseqs, int32_t n_tok);

/* ---- engine_tier.c ---- */

/* The engine's identity (engine.identity, identity_text), once its backend is loaded. */
void tier_identity(struct engine *e);
/*
 * kv.h's evict hook (arg: the engine): a block the pool gives up goes to
 * the host tier, copied out by tier_evict_flush, which whatever writes
 * into pool blocks (a step, a copy on write, a load) calls first.
 */
void tier_evict(void *arg, const struct kv_pool *kv, int32_t blk);
void tier_evict_flush(struct engine *e);
/*
 * Blocks after the sequence's own from the host tier, up to upto tokens,
 * into the pool and the prefix cache; returns how many it took.
 */
int32_t tier_from_host(struct engine *e, struct seq *s, int32_t upto);

#endif
