/*
 * kernels.h: the backend interface. A backend runs whole forward steps, so
 * that it can fuse, batch and capture graphs as it likes; the engine above
 * it only decides what goes into a step.
 *
 * The KV cache is a pool of fixed-size blocks owned by the backend (device
 * memory for CUDA). Block b holds, for every layer, the keys and values of
 * KV_BLOCK_TOKENS consecutive positions of one sequence. A sequence's block
 * table lists its blocks in position order; kv.c decides which blocks a
 * sequence owns and shares.
 */
#ifndef RESIDENT_KERNELS_H
#define RESIDENT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

struct model_desc;

#define KV_BLOCK_TOKENS 16

/* How a KV pool holds K and V (backend_opts.kv_type; residentd --kv-type). */
enum kv_type {
	KV_F16,            /* floats: fp16 on CUDA (fp32 in its exact mode), fp32 on the CPU */
	KV_Q8_0,           /* groups of 32 values of 8 bits and a float scale (d = max |x| / 127), laid out
	                      as each backend reads them (the CPU: struct q8_act32, kernels/cpu/cpu_q8.h;
	                      CUDA: kernels/cuda/attention.cuh); a head's row is whole groups */
};

/* "f16" or "q8_0" into *t; ERR_INVAL with a message naming the choices otherwise. */
int kv_type_parse(const char *s, enum kv_type *t, char *err);
const char *kv_type_name(enum kv_type t);
/* 0, or ERR_UNSUPPORTED with a message where heads of head_dim cannot take t (q8_0: whole groups of 32). */
int kv_type_check(enum kv_type t, int head_dim, char *err);

struct backend_opts {
	int n_threads;     /* CPU: worker threads (0: all cores) */
	enum kv_type kv_type;
	int64_t kv_blocks; /* blocks in the KV pool */
	int max_tokens;    /* most tokens one forward step may carry */
	int max_seqs;      /* most sequences one step may carry */
	int device;        /* CUDA: device ordinal */
	int exact;         /* CPU: float activations in every product (the reference mode);
	                      else quantized weights meet 8-bit activations.
	                      CUDA: an fp32 KV pool and fp32 activations in every
	                      product (else fp16 KV, fp16 activations for cuBLAS) */
	/*
	 * NULL, or one flag a layer: 1 where the layer's feed-forward (dense,
	 * or its router and experts) stays in host memory and runs on the
	 * host's threads (n_threads) inside each step, for a model larger
	 * than the device's share of memory. Only where plan reported the
	 * layer's ffn bytes (CUDA); ignored by a backend that computes on the
	 * host anyway (CPU).
	 */
	const uint8_t *host_ffn;
	/*
	 * Experts of each host_ffn layer of experts held on the device as
	 * well (CUDA; 0: none): a step of a few tokens runs the chosen ones
	 * held there while the host computes the others, and the most chosen
	 * experts move into the place of the least chosen as the routing
	 * changes (backend_plan.expert: the device bytes of one).
	 */
	int hot_experts;
};

/*
 * What a load would take (plan), for backend_opts' placement: device
 * memory besides the KV pool, one block of the pool, host memory of the
 * feed-forwards kept there (their weights as stored, the host's buffers),
 * and, when ffn is not NULL (n_layer entries, given by the caller), the
 * device bytes each layer's feed-forward takes there: what keeping it in
 * host memory would free (0 for every layer of a backend that cannot).
 */
struct backend_plan {
	uint64_t fixed, kv_block, host;
	uint64_t *ffn;
	uint64_t expert;   /* device bytes of one expert (backend_opts.hot_experts); 0: the backend holds none apart */
};

/* One sequence's part of a step: n_new tokens at positions pos0.. */
struct fwd_seq {
	int32_t n_new;
	int32_t pos0;                /* position of the first new token = tokens already cached */
	const int32_t *block_table;  /* blocks covering positions 0 .. pos0 + n_new - 1 */
	int32_t n_blocks;
	int32_t logits;              /* rows of logits wanted: 0, 1 (the last token) or n_new */
	/*
	 * An embedding model's sequence: rows of final hidden states (after
	 * the output norm) wanted instead of logits (logits is then 0): 0, 1
	 * (the last token) or n_new, into fwd_batch.embd.
	 */
	int32_t embd;
	/*
	 * 1: its tokens attend to every position of the sequence, after them
	 * too (a sliding-window layer to those at most half its window,
	 * rounded down, away either side): bidirectional attention, for an
	 * embedding model whose whole sequence is in this step (pos0 0).
	 */
	int32_t bidir;
};

/*
 * How a backend with has_argmax draws a logits row's token itself
 * (fwd_batch.pick): as the host sampler (daemon/engine/sample.c) draws with
 * these parameters, key for its draw (fwd_race_uniform), after the penalties
 * of the row's window (its n_pen tokens and counts from pen0 on in
 * fwd_batch.pen_tok and pen_cnt), so that the same logits and key give the
 * same token. Temperature 0 is greedy.
 */
struct fwd_pick {
	uint64_t key;                /* the generator's draw for the row's token */
	float temperature, top_p, min_p;
	int32_t top_k;               /* 1 .. FWD_PICK_TOP_K, unless greedy */
	float repeat_penalty, presence_penalty, frequency_penalty;
	int32_t pen0, n_pen;         /* n_pen at most FWD_PICK_PENALTY_MAX */
	int32_t logprob;             /* 1: fwd_batch.logprob gets the pick's log-probability */
	int32_t top;                 /* with logprob, 0..FWD_TOP_LOGPROBS: the row's most likely tokens and
	                                their log-probabilities too, best first (fwd_batch.top_ids, top_lp) */
};

#define FWD_PICK_TOP_K 64

#ifdef __CUDACC__
#define FWD_HOST_DEVICE __host__ __device__
#else
#define FWD_HOST_DEVICE
#endif

/*
 * A sampled token is the first of the kept candidates to arrive in a race:
 * token id sets off after an exponential time, -log u of this uniform u in
 * (0, 1] hashed from the row's key and id (splitmix64's finalizer), and
 * runs at its probability p, arriving at -log(u) / p: the first to arrive
 * (the first in the candidates' order on a tie) is drawn with probability
 * p / sum(p) (Gumbel-max, in exponential form).
 * Unlike a uniform against the cumulative probabilities, every token's
 * chance comes from its own variate, not from where it falls in an order:
 * a draft model that draws with the key its target's token will take
 * (engine_seq_couple) guesses that token with a probability near the two
 * distributions' overlap. The host and the device compute it alike.
 */
static inline FWD_HOST_DEVICE double
fwd_race_uniform(uint64_t key, int32_t id)
{
	uint64_t z = key ^ ((uint64_t)(uint32_t)id * 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return (double)((z >> 11) + 1) * (1.0 / 9007199254740992.0);
}
#define FWD_PICK_MAX_VOCAB 262144    /* larger vocabularies are sampled on the host */
#define FWD_PICK_PENALTY_MAX 256     /* distinct tokens of a row's penalty window */
#define FWD_TOP_LOGPROBS 20          /* most likely tokens a row reports at most */

/*
 * The constrained logits rows of a step: rows[i] (ascending) may draw only
 * the tokens whose bits are set in bits + i * FWD_MASK_WORDS(n_vocab)
 * (token t: bit t % 32 of word t / 32).
 */
struct fwd_masks {
	int32_t n;
	const int32_t *rows;
	const uint32_t *bits;
};

#define FWD_MASK_WORDS(n_vocab) (((size_t)(n_vocab) + 31) / 32)

/*
 * A step: the new tokens of every sequence, concatenated in sequence order.
 * Logits are written row after row in the same order, n_vocab floats each,
 * for the rows each sequence asked for.
 */
struct fwd_batch {
	int32_t n_seqs;
	const struct fwd_seq *seqs;
	int32_t n_tokens;
	const int32_t *tokens;
	/*
	 * Only with a backend whose has_argmax is 1, else NULL: gets the id of
	 * the largest logit of each logits row (the lowest id among equals, as
	 * the greedy sampler picks), and forward's logits may then be NULL.
	 */
	int32_t *argmax;
	/* With argmax: NULL for the largest logit, else row r drawn as pick[r] says. */
	const struct fwd_pick *pick;
	const int32_t *pen_tok, *pen_cnt; /* with pick: the rows' penalty windows, each token once */
	float *logprob;              /* with pick: row r's log-probability where pick[r].logprob */
	int32_t *top_ids;            /* with pick: row r's pick[r].top best tokens from r * FWD_TOP_LOGPROBS on */
	float *top_lp;               /* and their log-probabilities */
	/*
	 * NULL, or the step's constrained rows, asked for once the step's work
	 * is under way and before any row is drawn or handed out, so that the
	 * caller computes them while the device runs: the backend then sets a
	 * listed row's logits of tokens not allowed to -inf, for the argmax,
	 * the draw and the logits it returns alike. An error it returns fails
	 * the step.
	 */
	int (*masks)(void *arg, struct fwd_masks *out, char *err);
	void *masks_arg;
	/* With sequences that want hidden states (fwd_seq.embd): their rows, n_embd floats each, in order. */
	float *embd;
};

/*
 * The step's masks (batch->masks, called now; none when it is NULL),
 * checked against its n_logits rows. 0 or the callback's error / ERR_INVAL.
 */
int fwd_masks_get(const struct fwd_batch *batch, int32_t n_logits, struct fwd_masks *m, char *err);
/* Sets row rows[i]'s logits of tokens m does not allow to -inf (a backend that masks on the host). */
void fwd_masks_apply(const struct fwd_masks *m, float *logits, int32_t n_vocab);

/*
 * Checks a step against a backend's limits before any work: token, logit
 * and hidden-state row counts (embd rows only with fwd_batch.embd, a
 * bidirectional sequence whole), block tables inside the pool and long
 * enough for their sequence, token ids inside the vocabulary. *max_len
 * gets the longest sequence, *n_table the block-table entries the step
 * covers. 0 or ERR_INVAL/ERR_RANGE.
 */
int fwd_batch_check(const struct fwd_batch *batch, int32_t max_tokens, int64_t kv_blocks, int32_t n_vocab,
    int64_t *max_len, int64_t *n_table, char *err);

struct backend;

struct backend_ops {
	const char *name;
	/* Bytes of one token's K (or V) of one layer in b's pool (its mode and kv_type set it). */
	size_t (*kv_row_bytes)(const struct backend *b);
	/* The memory load would take (struct backend_plan); it allocates nothing. */
	int (*plan)(const struct model_desc *m, const struct backend_opts *o, struct backend_plan *p, char *err);
	/* Uploads / prepares the weights and allocates the KV pool. */
	int (*load)(const struct model_desc *m, const struct backend_opts *o,
	    struct backend **out, char *err);
	/* Runs one step: writes the new tokens' K/V into their blocks, returns logits. */
	int (*forward)(struct backend *b, const struct fwd_batch *batch, float *logits, char *err);
	/* Copies the first n_tokens positions of block src into block dst (copy on write). */
	int (*kv_copy)(struct backend *b, int32_t src, int32_t dst, int32_t n_tokens, char *err);
	/*
	 * Moves n whole blocks between the pool and host memory, each every
	 * layer's K and V as the pool holds them (kv_row_bytes a token each): block
	 * blocks[i] out to out[i], then in[i] into it (none where the array
	 * or its entry is NULL), so that blocks the pool gives up and
	 * the ones that take their place cross the bus both ways at once. Host
	 * memory from host_alloc crosses directly, every block in flight;
	 * other memory is staged. It runs on its own streams and may be called
	 * from another thread than forward's, at the same time, for blocks
	 * that no step running meanwhile reads or writes; it returns when the
	 * copies are done. Calls for one backend must not overlap (they share
	 * its staging buffers): the engine serialises them.
	 */
	int (*kv_move)(struct backend *b, const int32_t *blocks, int32_t n, void *const *out, const void *const *in,
	    char *err);
	/*
	 * Host memory that kv_move copies at the bus's speed
	 * (CUDA: pinned), for the host tier; NULL when there is none left.
	 * Not tied to a backend: what one allocates may outlive every backend
	 * and is given back with host_free.
	 */
	void *(*host_alloc)(size_t bytes);
	void (*host_free)(void *p);
	/*
	 * The most tokens a step that would carry n takes for about the same
	 * time (at least n, at most max_tokens): a device whose products run
	 * in tiles of tokens fills the last tile; one that pays by the token
	 * returns n.
	 */
	int (*step_tokens)(const struct backend *b, int n);
	/*
	 * The experts each host layer holds on the device (backend_opts.
	 * hot_experts; 0: none) and how many have moved there since the
	 * load; NULL for a backend without them.
	 */
	int (*hot_experts)(const struct backend *b, int64_t *moves);
	void (*free)(struct backend *b);
	int has_argmax;     /* forward fills fwd_batch.argmax on the device (only ids cross to the host),
	                       drawn as fwd_batch.pick says when it is set */
	int step_align;     /* steps of more tokens than this run fastest at a multiple of it (CUDA
	                       replays a captured graph per step shape); 0: any count */
};

extern const struct backend_ops cpu_backend;
#ifdef HAVE_CUDA
extern const struct backend_ops cuda_backend;
/* CUDA devices present (0 when there is no driver or no GPU). */
int cuda_backend_devices(void);
/* Free and total memory of a CUDA device. */
int cuda_backend_memory(int device, uint64_t *free_b, uint64_t *total, char *err);
/* Measured read bandwidth of a device in GB/s (kernels/cuda/cuda_bw.cu), and its name. */
int cuda_bw_measure(int device, double *gb_s, char *name, size_t name_len, char *err);
#endif

#endif
