/*
 * engine_spec.c: speculative decoding. Before a step, each sequence that
 * guesses gets its share of the rows the step leaves for guesses
 * (share_guesses: evenly, since a deeper guess is worth less), and puts
 * that many guessed tokens after its last one: a draft model's
 * (engine_seq_guess, asked for that share by engine_draft_shares) or
 * lookup's (draft.h), cut where its grammar does not allow them. The step
 * checks them with a logits row each; engine.c's settle keeps those its
 * rows agree with (greedy output is decoding's without guesses, sampled
 * output keeps the model's distribution), and seq_take hands the kept ones
 * out one by one (engine_seq_more).
 */
#include "config.h"
#include "engine_int.h"
#include "grammar.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"

#include <math.h>
#include <string.h>

/*
 * How many tokens s guesses at most, at rate: all it may (ENGINE_DRAFT_MAX)
 * at a rate of 1 (its guesses accepted), fewer as the rate falls, none
 * below one in 2 * ENGINE_DRAFT_MAX (a guess that fails costs a row;
 * settle raises the rate again a little each step without guesses, so
 * that lookup tries again), none past max_tokens or the context.
 */
static int32_t
draft_len(const struct engine *e, const struct seq *s, float rate)
{
	int32_t k = (int32_t)lrintf(rate * (float)ENGINE_DRAFT_MAX);

	if (s->params.max_tokens > 0)
		k = MIN(k, s->params.max_tokens - s->n_generated - 1);
	return MIN(k, e->n_ctx - 1 - s->n_tokens);
}

/*
 * Of a constrained sequence's k guesses g, those its grammar allows in
 * turn, each with the grammar after it (gspec); none that ends the turn
 * (an end token, or one after the grammar's end). Returns how many.
 */
static int32_t
gram_guesses(struct engine *e, struct seq *s, const int32_t *g, int32_t k)
{
	const struct gram_state *at = s->gstate;
	char err[ERR_LEN];
	int32_t i;

	for (i = 0; i < k && !gram_finished(at) && !tok_is_eog(e->m->tok, g[i]); i++) {
		if (gram_state_clone(at, &s->gspec[i], err) != 0)
			break;
		if (cons_accept(e->cons, s->gspec[i], g[i], err) != 0) {
			gram_state_free(s->gspec[i]);
			s->gspec[i] = NULL;
			break;
		}
		at = s->gspec[i];
	}
	return i;
}

/*
 * Puts s's guesses for this step after its last token (n_draft of them: its
 * share, share_guesses' guess_cap, within room rows): those given, else
 * lookup's; a constrained sequence's only as far as its grammar allows
 * them, and within mask_room more masks.
 */
void
seq_guess(struct engine *e, struct seq *s, int32_t room, int32_t *mask_room)
{
	int32_t k = MIN(s->guess_cap, room), g[ENGINE_DRAFT_MAX];

	if (s->gstate != NULL)
		k = MIN(k, *mask_room);
	if (s->n_given > 0) {
		s->n_draft = k;
		memcpy(g, s->given, (size_t)k * sizeof *g);
	} else {
		s->n_draft = k > 0 ? draft_guess(&s->draft, s->tokens, s->n_tokens, k, g) : 0;
	}
	if (s->gstate != NULL) {
		k = s->n_draft;
		s->n_draft = gram_guesses(e, s, g, k);
		s->n_cut = k - s->n_draft;
		*mask_room -= s->n_draft;
	}
	seq_push_tokens(s, g, s->n_draft);
}

int
engine_seq_guesses(const struct engine *e, const struct seq *s)
{
	return (s->params.speculative == SPEC_ON || (s->params.speculative == SPEC_AUTO && e->auto_guess)) &&
	    s->state == SEQ_DECODE;
}

/*
 * The guesses s would make with rows to spare, before its grammar's cut:
 * those given (their source chose how many: lookup's rate is lookup's),
 * else lookup's; with drafted, what its draft model is to be asked for.
 */
static int32_t
guess_want(struct engine *e, struct seq *s, int drafted)
{
	int32_t g[ENGINE_DRAFT_MAX], k;

	if (drafted)
		return MAX(0, draft_len(e, s, s->spec_rate));
	if (s->n_given > 0)
		return MAX(0, MIN(draft_len(e, s, 1), s->n_given));
	k = draft_len(e, s, s->spec_rate);
	return k > 0 ? draft_guess(&s->draft, s->tokens, s->n_tokens, k, g) : 0;
}

/*
 * Shares the rows a step of seqs[0..n) leaves for guesses (returned) among
 * its first max_seqs sequences (their guess_cap; the others get none;
 * drafted, if not NULL, marks those a draft model is yet to guess for):
 * each what it wants up to a level that all of them share, the rows left
 * over one each to those that want more, from share_turn on (engine_step
 * moves it on every step). A guess is kept only if every one before it in
 * its run is, so the deeper a guess the less it is worth: spread, the
 * rows settle more tokens a step, and a request's speed does not depend on
 * its place in the queue (first come, first served, the first six of
 * sixteen rewrites took all the rows, seven each).
 */
int32_t
share_guesses(struct engine *e, struct seq **seqs, int n, const int *drafted)
{
	int32_t room = e->max_rows - MIN(n, e->max_seqs), level, used, i, j;

	for (i = 0; i < n; i++)
		seqs[i]->guess_cap = i < e->max_seqs && engine_seq_guesses(e, seqs[i]) ?
		    guess_want(e, seqs[i], drafted != NULL && drafted[i]) : 0;
	n = MIN(n, e->max_seqs);
	for (level = ENGINE_DRAFT_MAX;; level--) { /* at 0 none are used: room is never negative */
		for (i = 0, used = 0; i < n; i++)
			used += MIN(seqs[i]->guess_cap, level);
		if (used <= room)
			break;
	}
	for (j = 0; j < n; j++) {
		struct seq *s = seqs[(e->share_turn + (uint32_t)j) % (uint32_t)n];

		if (s->guess_cap > level && used < room)
			s->guess_cap = level + 1, used++;
		else
			s->guess_cap = MIN(s->guess_cap, level);
	}
	return room;
}

void
engine_draft_shares(struct engine *e, struct seq **seqs, int n, const int *drafted, int32_t *want)
{
	share_guesses(e, seqs, n, drafted);
	for (int i = 0; i < n; i++)
		want[i] = drafted[i] ? seqs[i]->guess_cap : 0;
}

void
engine_seq_guess(struct seq *s, const int32_t *tokens, int32_t n)
{
	s->n_given = MIN(n, ENGINE_DRAFT_MAX);
	memcpy(s->given, tokens, (size_t)s->n_given * sizeof *tokens);
}

void
engine_seq_couple(struct seq *d, const struct seq *s)
{
	d->sampler.p = s->sampler.p;
	memcpy(d->sampler.rng, s->sampler.rng, sizeof d->sampler.rng);
}

/* Takes s's guesses back (it is not in the step). */
void
seq_unguess(struct seq *s)
{
	s->n_tokens -= s->n_draft;
	s->n_draft = s->n_cut = 0;
	free_gspec(s);
}

/*
 * Takes the next token the step settled for s (seq_accept): a guess that
 * was accepted has its K/V in the pool already, so that it counts as
 * cached at once. Returns 0 when none is left or s has ended.
 */
int
seq_take(struct engine *e, struct seq *s)
{
	int32_t i = s->spec_next;

	if (i >= s->n_spec || s->state == SEQ_DONE) {
		s->n_spec = s->spec_next = s->spec_kv = 0;
		return 0;
	}
	s->spec_next++;
	if (i > 0) /* a guess's: its sequence reports no logprobs (the first's are row_token's) */
		s->new_logprob = 0, s->n_top = 0;
	seq_accept(e, s, s->spec[i]);
	if (i < s->spec_kv) {
		s->n_cached = s->n_tokens;
		seq_publish(e, s);
	}
	if (i == s->n_spec - 1 && s->spec_live <= s->spec_kv && s->state != SEQ_DONE) {
		/* its accepted guesses led where its grammar allows nothing: the next step would say so */
		gram_dead_end(s, 0);
		engine_seq_finish(s, FINISH_ERROR);
	}
	return 1;
}

int
engine_seq_more(struct engine *e, struct seq *s)
{
	return s->spec_next > 0 && seq_take(e, s);
}

void
engine_auto_guess(struct engine *e, int allow)
{
	e->auto_guess = allow;
}

int32_t
engine_step_guesses(const struct engine *e)
{
	return e->step_guesses;
}

void
engine_spec_stats(const struct engine *e, uint64_t *drafted, uint64_t *accepted)
{
	*drafted = e->drafted;
	*accepted = e->accepted;
}

/* Drops the last of s's guesses in the step (fseq f). */
static void
drop_guess(struct engine *e, struct seq *s, struct fwd_seq *f)
{
	s->n_draft--, s->n_tokens--, s->spec_live--;
	f->n_new--, f->logits--;
	e->step_guesses--;
	if (s->gspec[s->n_draft] != NULL) {
		gram_state_free(s->gspec[s->n_draft]);
		s->gspec[s->n_draft] = NULL;
	}
}

/*
 * Drops guesses, the last of the longest runs first, until the step's
 * n_tok tokens are a multiple of the backend's step_align (when there are
 * more than that), if the guesses alone can bring them there: a backend
 * that replays a captured graph per step shape (CUDA) launches each kernel
 * of a step of a shape it has not seen often by itself, and guesses would
 * vary the shape by a token or two every step (on a small model, launching
 * is most of a step). Returns the step's tokens.
 */
int32_t
trim_guesses(struct engine *e, int32_t n_fseqs, int32_t n_tok)
{
	int32_t a = e->ops->step_align, cut, i, at, most;

	if (a <= 0 || n_tok <= a || (cut = n_tok % a) == 0 || cut > e->step_guesses)
		return n_tok;
	for (; cut > 0; cut--) {
		for (i = 0, most = 0; i < n_fseqs; i++)
			if (e->fseq_of[i]->n_draft > e->fseq_of[most]->n_draft)
				most = i;
		drop_guess(e, e->fseq_of[most], &e->fseqs[most]);
	}
	for (i = 0, at = 0; i < n_fseqs; i++) {
		memcpy(e->tokens + at, e->fseq_of[i]->tokens + e->fseqs[i].pos0,
		    (size_t)e->fseqs[i].n_new * sizeof *e->tokens);
		at += e->fseqs[i].n_new;
	}
	return at;
}
