/*
 * engine.h: the backend-neutral driver. It owns a model, a backend and the
 * KV block pool, and advances sequences one forward step at a time: prefill
 * chunks and decode tokens of many sequences share each step. Which
 * sequences go into a step, and in what order, is the caller's (the
 * scheduler's) decision.
 *
 * Life of a sequence:
 *
 *   engine_seq_new ---> PREFILL --(prompt all in KV)--> DECODE --+--> DONE
 *                          ^                                    |
 *                          +-------- engine_seq_reuse ----------+
 *                                    (the next turn)
 *
 * LOAD: waiting for blocks from the disk tier (engine_seq_load), then PREFILL.
 * PREFILL: tokens not yet in the KV cache remain; each step takes a chunk.
 * DECODE: the last sampled token is fed back; each step samples one more.
 * DONE: finished (a stop, the length limit, an error); its KV blocks stay
 * until engine_seq_free, so that a next turn can reuse them.
 *
 * Blocks can be shared between sequences (engine_seq_fork); a step that
 * writes into a shared block first copies it (copy on write).
 *
 * With seq_params.cache, a sequence starts from the longest prefix of its
 * tokens that the prefix cache holds (kv.h: full blocks only, so a partial
 * last block is computed again), and each block it fills is entered there
 * for others. Blocks a finished sequence lets go of stay cached until the
 * pool needs them. A finished sequence can be *parked* (a session between
 * turns): it lets go of its cached blocks and keeps only its partial last
 * block; its next turn finds the others again through the cache, or
 * computes again from where the cache lost them.
 */
#ifndef RESIDENT_ENGINE_H
#define RESIDENT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "constrain.h"
#include "kernels.h"
#include "draft.h"
#include "gentext.h"
#include "sample.h"
#include "tokenizer.h"

struct model_desc;
struct engine;
struct kvhost;
struct kvdisk;
struct kvdisk_job;

struct engine_opts {
	const char *device;     /* "cpu" or "cuda"; NULL: cuda when there is a GPU */
	int n_threads;          /* CPU threads; 0: all cores */
	int32_t n_ctx;          /* longest sequence; 0: the model's, at most 8192 */
	int32_t kv_tokens;      /* size of the KV pool in tokens; 0: 4 x n_ctx */
	int32_t max_step_tokens;/* tokens per forward step; 0: 512 */
	int32_t max_seqs;       /* sequences per step; 0: 64 */
	int exact;              /* CPU: float activations in every product, the reference
	                           numerics; else quantized weights meet 8-bit activations */
	enum kv_type kv_type;   /* how the KV pool holds K and V (kernels.h) */
	struct kvhost *host;    /* where blocks the pool gives up go, or NULL (kvhost.h) */
	struct kvdisk *disk;    /* where sessions' blocks are stored, or NULL (kvdisk.h) */
};

enum seq_state { SEQ_LOAD, SEQ_PREFILL, SEQ_DECODE, SEQ_DONE };

enum finish_reason {
	FINISH_NONE,
	FINISH_STOP,     /* an end-of-generation token or a stop string */
	FINISH_LENGTH,   /* max_tokens reached */
	FINISH_CONTEXT,  /* the context (n_ctx) is full */
	FINISH_CANCEL,   /* the caller cancelled */
	FINISH_ERROR,    /* the backend failed; seq->error says why */
};

struct seq_params {
	struct sample_params sample;
	int cache;              /* engine_seq_new: share full blocks through the prefix cache */
	uint64_t cache_ns;      /* engine_seq_new: its namespace (the user): only sequences of
	                           one namespace find each other's blocks */
	int32_t max_tokens;     /* generated tokens at most; 0: until the context is full */
	const char *const *stop;/* stop strings (copied), looked for in the answer (gentext.h) */
	int n_stop;
	int logprobs;           /* report each token's log-probability */
	int32_t top_logprobs;   /* with logprobs, 0..SAMPLE_TOP: and each step's most likely tokens and theirs */
	enum chat_tmpl split;   /* the chat family whose marks part the output into answer, reasoning and
	                           tool text (chat_reason.h); CHAT_RAW: all of it is answer */
	struct cons_gram *grammar; /* NULL, or what this turn's output must match (engine_grammar): the
	                           sequence holds it while it lives; an end token only where the grammar's
	                           root is complete, and the turn ends once nothing more may follow */
	enum spec_mode speculative; /* guess the next tokens (from the text, draft.h, or given) and check
	                           them in the step with its own (engine_step); not with logprobs; with a
	                           grammar, only the guesses it allows */
};

/* The most tokens a sequence guesses for one step. */
#define ENGINE_DRAFT_MAX 7

struct seq {
	enum seq_state state;
	enum finish_reason finish;
	char error[256];
	int32_t *tokens;        /* prompt(s) and generated tokens */
	int32_t n_tokens, cap_tokens;
	int32_t n_cached;       /* tokens whose K/V are in the pool */
	int32_t n_hit;          /* of this turn's tokens, those found in a cache (not computed) */
	int32_t n_prompt;       /* tokens given by the caller (all turns) */
	int32_t n_generated;    /* this turn */
	int32_t *blocks;        /* block table */
	int32_t n_blocks, cap_blocks;
	/* output of the last step (or engine_seq_more): at most one token, and the text it completed (out's pieces) */
	int32_t new_token;      /* -1 if none this step */
	float new_logprob;
	int32_t n_top;          /* params.top_logprobs: the step's most likely tokens, best first, and theirs */
	int32_t top_ids[SAMPLE_TOP];
	float top_lp[SAMPLE_TOP];
	struct gentext out;     /* this turn's text, its parts, and what each step handed out */
	struct sampler sampler;
	struct seq_params params;
	struct cons_gram *gram; /* this turn's grammar, held, and where its output is in it */
	struct gram_state *gstate;
	int req_error;          /* with FINISH_ERROR: the request's fault (its grammar left no token), not the
	                           model's or the device's */
	int32_t turn_start;     /* index of this turn's first generated token */
	/* the prefix cache (kv.h) */
	int cache;              /* its full blocks are looked up and published */
	uint64_t root;          /* its chain's seed */
	uint64_t key;           /* key of block n_keyed - 1 (root when none) */
	int32_t n_keyed;        /* leading blocks in the table */
	int32_t n_parked;       /* leading blocks let go while parked (engine_seq_park) */
	int32_t n_saved;        /* leading blocks its disk file holds (engine_seq_save) */
	struct kvdisk_job *io;  /* its disk job in flight, or NULL */
	int wait_io;            /* the pool was full while disk jobs held blocks: it waits for one to end
	                           (the scheduler clears this when one does) */
	/*
	 * Speculative decoding (params.speculative): a step checks n_draft
	 * guessed tokens (put after the last in tokens[] for it) with a logits
	 * row each and settles up to n_draft + 1 tokens; the first is taken
	 * as any step's, the others wait in spec[] for engine_seq_more.
	 */
	struct draft_index draft;
	int32_t given[ENGINE_DRAFT_MAX], n_given; /* engine_seq_guess's, for the next step */
	int32_t n_draft;
	int32_t guess_cap;      /* the most it may guess in the step being planned (share_guesses) */
	int32_t spec[ENGINE_DRAFT_MAX + 1];
	int32_t n_spec, spec_next; /* settled tokens after the first, and the next to take */
	int32_t spec_kv;        /* of those, the first spec_kv are guesses whose K/V the step wrote */
	float spec_rate;        /* the share of guesses accepted lately (a moving average) */
	uint64_t rng_mark[4];   /* the sampler's generator before the step's rows drew: settle leaves it
	                           one draw past it per token taken, as decoding without guesses would */
	int32_t n_cut;          /* this step's guesses its grammar did not allow (counted as not accepted) */
	/*
	 * A constrained sequence's grammar after each of its guesses (gspec[i]
	 * after guess i), for their rows' masks; spec_live: its rows whose
	 * grammar allows a token (the rest would be a dead end once reached).
	 */
	struct gram_state *gspec[ENGINE_DRAFT_MAX];
	int32_t spec_live;
	int32_t n_drafted, n_accepted; /* this turn's guesses, and those accepted */
	/* an input of an embedding model (engine_seq_embed) */
	int embed;
	int32_t dims;           /* the floats its vector is cut to (0: all of them) */
	double *pool;           /* n_embd: the sum of its hidden states (mean), or the one it pools */
	float *vec;             /* once DONE with FINISH_STOP: its vector, engine_embed_dims floats */
};

struct backend_ops;
/*
 * The backend named by device, "cpu" or "cuda" (NULL: CUDA when built and a
 * GPU is present, else the CPU). 0, or ERR_UNSUPPORTED / ERR_INVAL.
 */
int engine_pick_backend(const char *device, const struct backend_ops **ops, char *err);
int engine_open(const char *model_path, const struct engine_opts *o, struct engine **out, char *err);
/*
 * engine_open in two steps, so that the memory can be found first:
 * engine_prepare opens the model file and plans what loading it takes
 * (engine_mem_need: at least *min bytes of device memory, with a KV cache
 * of one context and every feed-forward the backend can keep in host
 * memory there; *whole with every layer on the device; *want with the KV
 * cache of engine_opts.kv_tokens too), and engine_load loads it within
 * limit bytes (0: no limit): the first layers' feed-forwards in host
 * memory until the rest and one context fit, then the KV cache taking
 * what is left, up to kv_tokens. A prepared engine that is not loaded is
 * only closed (engine_close).
 */
int engine_prepare(const char *model_path, const struct engine_opts *o, struct engine **out, char *err);
void engine_mem_need(const struct engine *e, uint64_t *min, uint64_t *whole, uint64_t *want);
int engine_load(struct engine *e, uint64_t limit, char *err);
/* Device memory the loaded engine holds (weights, scratch, KV pool), as planned. */
uint64_t engine_mem_bytes(const struct engine *e);
/*
 * Where the loaded engine's layers are: how many keep their feed-forward
 * in host memory (computed there), and the host bytes that takes.
 */
int32_t engine_host_layers(const struct engine *e, uint64_t *host_bytes);
/*
 * The experts each host layer keeps on the device as well (its most
 * chosen; 0: none) and how many have moved there since the load.
 */
int engine_hot_experts(const struct engine *e, int64_t *moves);
/*
 * Memory of the device a backend would run on (engine_pick_backend): the
 * GPU's for CUDA, the machine's for the CPU (MemAvailable, MemTotal).
 */
int engine_device_memory(const char *device, uint64_t *free_b, uint64_t *total, char *err);
void engine_close(struct engine *e);
const struct model_desc *engine_model(const struct engine *e);
const char *engine_device(const struct engine *e);
/* 1 if the backend runs its exact numerics (engine_opts.exact). */
int engine_exact(const struct engine *e);
int32_t engine_n_ctx(const struct engine *e);
/* Blocks a sequence can take: free ones, and cached ones no sequence holds. */
int32_t engine_free_blocks(const struct engine *e);
int32_t engine_kv_blocks(const struct engine *e);
/* What the KV caches did since the engine opened (engine_cache_stats). */
struct engine_cache_stats {
	int32_t cached, idle;       /* blocks in the prefix cache; of those, held by no sequence */
	uint64_t used_bytes;        /* K/V bytes of the blocks that hold something (held or cached) */
	uint64_t hit, miss;         /* prompt tokens found in a cache; computed */
	uint64_t host_hit, disk_hit;/* of hit, tokens that came from the host / disk tier */
};
void engine_cache_stats(const struct engine *e, struct engine_cache_stats *st);

/* Bytes of the whole KV pool. */
uint64_t engine_kv_bytes(const struct engine *e);
int32_t engine_max_step_tokens(const struct engine *e);
/*
 * The most tokens (at least n, at most max_step_tokens) a step of n takes
 * about as long for: the end of the device's last tile of tokens
 * (backend_ops.step_tokens).
 */
int32_t engine_step_tokens(const struct engine *e, int32_t n);

/*
 * A new sequence over a prompt (1..n_ctx tokens). Returns 0 or a negative
 * code (ERR_INVAL for bad parameters or token ids, ERR_RANGE if the prompt
 * does not fit the context).
 */
int engine_seq_new(struct engine *e, const int32_t *prompt, int32_t n, const struct seq_params *p,
    struct seq **out, char *err);

/*
 * A sequence that makes the vector of one input of n tokens (1..n_ctx) of
 * an embedding model (model_desc.embed): prefilled, never sampled, its
 * final hidden states pooled as the model says (with bidirectional
 * attention its whole input goes into one step: the engine's step holds
 * a context), its KV blocks its own (neither taken from the prefix cache
 * nor given to it: a bidirectional model's K/V depend on what follows).
 * Once its last token is computed it is DONE with FINISH_STOP and vec
 * holds its vector, cut to dims floats (0: all; embed.h). 0, or
 * ERR_UNSUPPORTED for a model that is not an embedding model, ERR_INVAL,
 * ERR_RANGE as engine_seq_new.
 */
int engine_seq_embed(struct engine *e, const int32_t *tokens, int32_t n, int32_t dims, struct seq **out,
    char *err);
/* Floats of the vectors made with dims (the model's own with 0, else dims, at most that). */
int32_t engine_embed_dims(const struct engine *e, int32_t dims);

/*
 * Starts the next turn of a finished sequence: its history becomes tokens
 * (the whole conversation). The longest common prefix with what it held
 * stays in the KV cache (all but the last token at most, whose logits are
 * needed), and a caching sequence looks for more in the prefix cache; the
 * rest is prefilled. Returns the number of cached tokens, or a negative
 * code.
 */
int engine_seq_reuse(struct engine *e, struct seq *s, const int32_t *tokens, int32_t n,
    const struct seq_params *p, char *err);
/*
 * The same within a turn, its parameters and text kept: a draft model's
 * sequence follows its target's history (tokens), keeping the common
 * prefix, whatever state it is in (not loading). Returns the number of
 * cached tokens, or a negative code.
 */
int engine_seq_follow(struct engine *e, struct seq *s, const int32_t *tokens, int32_t n, char *err);

/* Appends tokens to a finished sequence's history (not computed until its next turn). */
void engine_seq_append(struct seq *s, const int32_t *tokens, int32_t n);

/*
 * A finished sequence with parent's history, sharing its KV blocks; the
 * parent may be running. engine_seq_reuse starts its turn: over parent's
 * prompt, right after the prompt is computed, it computes only the last
 * token again (several choices of one prompt).
 */
struct seq *engine_seq_fork(struct engine *e, const struct seq *parent);

/* Parks a finished sequence: it keeps only the blocks that are not in the prefix cache. */
void engine_seq_park(struct engine *e, struct seq *s);

/*
 * The disk tier (engine_opts.disk), for sessions: name is the session's
 * uuid. engine_seq_load asks for the stored blocks that follow what the
 * caches gave a new turn, up to its first upto tokens (the stored
 * history); the sequence waits in LOAD until they come (engine_io_done),
 * then goes on from there. Returns 1 if it waits, 0 if there was nothing
 * to ask for. engine_seq_save has a finished sequence's cached blocks that
 * its file lacks written there, off the engine thread.
 */
int engine_seq_load(struct engine *e, struct seq *s, const char *name, int32_t upto);
void engine_seq_save(struct engine *e, struct seq *s, const char *name);
/* Takes back a finished disk job of this engine (kvdisk_take_done) and frees it. */
void engine_io_done(struct engine *e, struct kvdisk_job *j);

/* Marks a sequence finished with the reason (for cancel). */
void engine_seq_finish(struct seq *s, enum finish_reason why);

/*
 * The grammar of len bytes of text over e's vocabulary (constrain.h: made
 * on first use, which may take up to about a second on a large vocabulary,
 * so call it off the engine thread; thread-safe), held for the caller until
 * engine_grammar_put. 0, or ERR_INVAL / ERR_RANGE saying what is wrong with
 * the text.
 */
int engine_grammar(struct engine *e, const char *text, size_t len, struct cons_gram **out, char *err);
/* The same for a JSON Schema's JSON text (cons_get_schema). */
int engine_schema(struct engine *e, const char *text, size_t len, struct cons_gram **out, char *err);
void engine_grammar_put(struct engine *e, struct cons_gram *g);

/* Releases a sequence and its KV blocks. */
void engine_seq_free(struct engine *e, struct seq *s);

/*
 * One forward step over the sequences given (those decoding or prefilling),
 * in the order given: decoding ones take one token each, prefilling ones a
 * chunk of what budget is left (at most max_step_tokens in all, and at most
 * max_prefill tokens of prefill; < 0: no other limit). Sequences left out
 * of the budget are untouched. Afterwards each sequence's new_token, its
 * out's pieces and its state tell what happened. Returns the number of
 * tokens processed, or a negative code if the backend failed: the
 * sequences of the step are then finished with FINISH_ERROR, or, when a
 * KV block copy failed before the step ran, the sequence it was for (the
 * others are untouched).
 */
int engine_step(struct engine *e, struct seq **seqs, int n, int32_t max_prefill, char *err);

/*
 * Takes the next token the last step settled for s beyond its first (a
 * speculative step's accepted guesses and the token after them): new_token,
 * out's pieces and the state as after a step. Returns 1, or 0 when none is
 * left (or s ended). engine_step takes any not taken before its own.
 */
int engine_seq_more(struct engine *e, struct seq *s);

/*
 * Guesses of the n tokens that follow s now (at most ENGINE_DRAFT_MAX),
 * from elsewhere than its text (a draft model), for its next step in
 * place of lookup's: checked as those are, so that its output stays what
 * it would be without them. Only for a sequence that speculates.
 */
void engine_seq_guess(struct seq *s, const int32_t *tokens, int32_t n);
/*
 * Makes draft d draw its next tokens as target s will draw its own: with
 * s's sampling parameters and a copy of s's generator, so that the draft's
 * k-th guess is raced with the key s's k-th next token will take. A draft that
 * agrees with s then guesses s's very tokens, sampled as well as greedy:
 * its guesses are accepted by the rule that keeps a seed's output (settle,
 * engine.c), at a rate near the two distributions' overlap.
 */
void engine_seq_couple(struct seq *d, const struct seq *s);
/*
 * Before a step of seqs[0..n) (as engine_step will get them), for those a
 * draft model guesses for (drafted[i] set): how many tokens to ask it for,
 * into want[i] (0 for the others). That is what the step will check of
 * them: as many as the sequence's recent acceptance allows, within
 * max_tokens and the context, and within its share of the step's rows for
 * guesses, shared evenly among the step's guessing sequences as
 * engine_step shares them (each what it wants up to a common level).
 */
void engine_draft_shares(struct engine *e, struct seq **seqs, int n, const int *drafted, int32_t *want);

/*
 * Whether the next steps' sequences with speculative SPEC_AUTO guess (1,
 * the default) or not; those with SPEC_ON guess either way.
 */
void engine_auto_guess(struct engine *e, int allow);
/* Whether s guesses in the next step: decoding, and its request's choice with engine_auto_guess's. */
int engine_seq_guesses(const struct engine *e, const struct seq *s);

/* Guessed tokens the last engine_step checked (of the tokens it returned). */
int32_t engine_step_guesses(const struct engine *e);

/* Tokens the engine's sequences guessed since it opened, and of those, the tokens accepted. */
void engine_spec_stats(const struct engine *e, uint64_t *drafted, uint64_t *accepted);

/* Text of a finish reason: "stop", "length", "context", "cancel", "error". */
const char *engine_finish_name(enum finish_reason r);

#endif
