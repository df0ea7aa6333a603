/*
 * sched_draft.c: a request's draft model (generate's `draft`). A small model
 * with the target's vocabulary writes the tokens it expects next; the
 * target checks them in its next step (engine_seq_guess: speculative
 * decoding, engine.c), so that its output is what it would be without them.
 * The draft samples as its target does, with the target's own generator
 * (engine_seq_couple): greedy for a greedy request, and for a sampled one
 * each guess drawn with the key the target's token will take, so that
 * a draft that agrees with the target guesses the very tokens a seed gives.
 *
 * The draft is a model slot like any, loaded under the same memory budget
 * and held by the request while it runs. Each choice of the request has a
 * sequence on the draft's engine that follows its target's history
 * (engine_seq_follow: the common prefix stays in the draft's KV cache, so a
 * round computes only the tokens the target settled that the draft had not
 * written) and then runs as many draft steps as the choice guesses (its
 * share of the target step's rows for guesses, engine_draft_shares), all the
 * choices on that draft batched in each step. A draft sequence that is
 * still prefilling a long prompt takes one chunk a round and guesses once
 * it is in. A draft model that fails or is unloaded is dropped: the
 * requests go on without guesses (sched_draft_unload).
 */
#include "config.h"
#include "sched_int.h"
#include "engine.h"
#include "log.h"
#include "model.h"
#include "slots.h"
#include "tokenizer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
sched_draft_use(struct sched *s, struct gen *g, struct slot *d, char *err)
{
	const struct model_desc *t = g->md, *dm = engine_model(d->e);

	/* the hash was made at load: comparing 128k tokens here took ~1.4 ms a request (16 requests: 2 % of a round) */
	if (engine_model(g->slot->e)->hp.n_vocab != dm->hp.n_vocab || tok_n_vocab(t->tok) != tok_n_vocab(dm->tok) ||
	    tok_bytes_hash(t->tok) != tok_bytes_hash(dm->tok))
		return err_set(err, ERR_INVAL, "draft model %s has another vocabulary than %s: a draft's tokens must "
		    "be the target's", d->name, g->slot->name);
	slots_acquire(&s->slots, d);
	g->draft = d;
	return 0;
}

void
sched_draft_drop(struct sched *s, struct gen *g)
{
	if (g->draft == NULL)
		return;
	for (int i = 0; i < PROTO_MAX_CHOICES; i++) {
		engine_seq_free(g->draft->e, g->dseqs[i]);
		g->dseqs[i] = NULL;
	}
	sched_release_slot(s, g->draft, sched_job_keep_alive(s, g->job));
	g->draft = NULL;
}

void
sched_draft_unload(struct sched *s, struct slot *d)
{
	for (struct gen *g = s->gens; g != NULL; g = g->next)
		if (g->draft == d) {
			log_warn("draft model %s unloaded: request %llu goes on without its guesses", d->name,
			    (unsigned long long)g->job->req.id);
			sched_draft_drop(s, g);
		}
}

/* A draft sequence's parameters: in the request's namespace of the prefix cache (it samples as its target, follow). */
static void
draft_params(const struct sched *s, const struct gen *g, struct seq_params *p)
{
	memset(p, 0, sizeof *p);
	sample_params_default(&p->sample);
	p->cache = 1;
	p->cache_ns = s->o.kv_share_users ? 0 : (uint64_t)g->job->uid + 1;
	p->split = CHAT_RAW;
}

/*
 * Choice i's draft sequence, made or brought to its target q's history and
 * drawing as q will; NULL when that fails (the choice guesses nothing this round).
 */
static struct seq *
follow(struct sched *s, struct gen *g, int i, const struct seq *q)
{
	struct engine *e = g->draft->e;
	struct seq_params p;
	char err[ERR_LEN];

	if (g->dseqs[i] == NULL) {
		draft_params(s, g, &p);
		if (engine_seq_new(e, q->tokens, q->n_tokens, &p, &g->dseqs[i], err) != 0) {
			log_debug("draft %s: %s", g->draft->name, err);
			g->dseqs[i] = NULL;
		}
	} else if (engine_seq_follow(e, g->dseqs[i], q->tokens, q->n_tokens, err) < 0)
		return NULL;
	if (g->dseqs[i] != NULL)
		engine_seq_couple(g->dseqs[i], q);
	return g->dseqs[i];
}

/*
 * One draft's round for the targets q[0..n) (their gens g[], choices ch[]),
 * want[i] guesses each at most; rc < 0 if its backend failed.
 */
static int
draft_round(struct sched *s, struct slot *d, struct seq **q, struct gen **g, const int *ch, const int32_t *want,
    int n, char *err)
{
	struct seq **ds = xcalloc((size_t)n, sizeof *ds), **run = xcalloc((size_t)n, sizeof *run);
	int32_t (*guess)[ENGINE_DRAFT_MAX] = xcalloc((size_t)n, sizeof *guess);
	int *got = xcalloc((size_t)n, sizeof *got);
	int *of = xcalloc((size_t)n, sizeof *of);
	int32_t need = 0;
	int i, j, m, rc = 0, k;

	for (i = 0; i < n; i++) {
		if (want[i] > 0 && (ds[i] = follow(s, g[i], ch[i], q[i])) != NULL)
			need += sched_seq_blocks(ds[i]) + want[i] / KV_BLOCK_TOKENS + 1;
	}
	sched_make_room(d, need);
	for (k = 0; k < ENGINE_DRAFT_MAX && rc >= 0; k++) {
		for (i = m = 0; i < n; i++)
			if (ds[i] != NULL && got[i] < want[i] && sched_seq_ready(ds[i]) && (k == 0 || got[i] == k)) {
				of[m] = i;
				run[m++] = ds[i];
			}
		if (m == 0)
			break;
		rc = engine_step(d->e, run, m, -1, err);
		/* only the step's own: a draft that ended (an end token) keeps its last token, no guess again */
		for (j = 0; j < m; j++)
			if (run[j]->new_token >= 0)
				guess[of[j]][got[of[j]]++] = run[j]->new_token;
	}
	for (i = 0; i < n && rc >= 0; i++)
		if (got[i] > 0)
			engine_seq_guess(q[i], guess[i], got[i]);
	free(ds), free(run), free(guess), free(got), free(of);
	return rc < 0 ? rc : 0;
}

struct slot *
sched_draft_guess(struct sched *s, struct seq **seqs, struct gen **gens, int n, char *err)
{
	struct seq **q = xmalloc((size_t)n * sizeof *q);
	struct gen **g = xmalloc((size_t)n * sizeof *g);
	struct slot **dr = xcalloc((size_t)n, sizeof *dr), *d, *failed = NULL;
	int *ch = xmalloc((size_t)n * sizeof *ch), *drafted = xcalloc((size_t)n, sizeof *drafted), i, j, k, any = 0;
	int32_t *share = xcalloc((size_t)n, sizeof *share), *want = xcalloc((size_t)n, sizeof *want);

	/* the draft model that guesses for each sequence this step, or NULL */
	for (i = 0; i < n; i++) {
		dr[i] = engine_seq_guesses(gens[i]->slot->e, seqs[i]) ? gens[i]->draft : NULL;
		any |= drafted[i] = dr[i] != NULL;
	}
	/* a draft writes only what the step will check: its share of the rows for guesses */
	if (any)
		engine_draft_shares(gens[0]->slot->e, seqs, n, drafted, share);
	/* each draft model once, with all the step's decoding sequences that use it */
	for (i = 0; i < n && failed == NULL; i++) {
		if ((d = dr[i]) == NULL)
			continue;
		for (j = 0; j < i && dr[j] != d; j++)
			;
		if (j < i)
			continue;
		for (j = i, k = 0; j < n; j++) {
			if (dr[j] != d)
				continue;
			q[k] = seqs[j], g[k] = gens[j], want[k] = share[j];
			for (ch[k] = 0; gens[j]->seqs[ch[k]] != seqs[j]; ch[k]++)
				;
			k++;
		}
		if (draft_round(s, d, q, g, ch, want, k, err) < 0)
			failed = d;
	}
	free(q), free(g), free(dr), free(ch), free(drafted), free(share), free(want);
	return failed;
}
