/*
 * sched_resident.c: a request's sequences, and sessions' sequences kept
 * between turns (struct resident, on their model's slot). A session's turn
 * reuses its parked sequence (the longest common prefix with what it held,
 * then the prefix cache) and asks the disk tier for what the caches lack; a
 * request without a session starts from the prefix cache alone, and one of
 * several choices forks the others from its first sequence once the prompt
 * is in the KV cache (sched_fork_choices). Finished sessions keep their
 * sequence parked (sched_gen_free); its blocks stay in the prefix cache
 * (kv.h) until the pool needs them, then go to the host tier, and each
 * turn's KV is written to disk. A fork shares the parent's blocks; a deleted
 * session loses its sequences, its turn in flight and its KV file. A request
 * done with its models releases them here (sched_release_slot), whatever
 * file it ends in.
 */
#include "config.h"
#include "sched_int.h"
#include "engine.h"
#include "kvdisk.h"
#include "model.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a request's models ---- */

double
sched_job_keep_alive(const struct sched *s, const struct sched_job *job)
{
	return job->req.set & SET_KEEP_ALIVE ? job->req.keep_alive : s->o.keep_alive;
}

void
sched_release_slot(struct sched *s, struct slot *m, double keep_alive)
{
	slots_release(&s->slots, m, keep_alive);
	s->retry |= m->users == 0;
}

/* ---- sessions' sequences ---- */

/* Unlinks a session's cached sequence and frees it. */
void
sched_free_resident(struct slot *m, struct resident *r)
{
	struct resident **pp;

	for (pp = &m->residents; *pp != r; pp = &(*pp)->next)
		;
	*pp = r->next;
	engine_seq_free(m->e, r->seq);
	free(r);
}

/* slots' unloading hook: frees the parked sessions of a model. */
void
sched_drop_residents(void *arg, struct slot *m)
{
	while (m->residents != NULL)
		sched_free_resident(m, m->residents);
}

/*
 * The sequence parameters of a generate. Its prefix-cache namespace is its
 * user's, unless the daemon shares the cache between users. Messages
 * rendered with the model's template have their reply split as that
 * family marks reasoning (gentext.h), Qwen3's without reasoning (think
 * false: its prompt closed the think block) as ChatML's; a raw prompt's
 * output is all answer, since nothing says that the prompt follows the
 * template, and so is a constrained one's.
 */
static void
job_params(const struct sched *s, const struct gen *g, struct seq_params *p)
{
	const struct sched_job *job = g->job;

	memset(p, 0, sizeof *p);
	/* a grammar's output has none of the family's marks (they are control tokens, never allowed) */
	p->split = job->req.prompt == NULL && proto_constraints(&job->req) == 0 ?
	    g->md->chat : CHAT_RAW;
	if (p->split == CHAT_QWEN3 && job->req.think == THINK_OFF)
		p->split = CHAT_CHATML;
	p->cache = 1;
	p->cache_ns = s->o.kv_share_users ? 0 : (uint64_t)job->uid + 1;
	p->sample = job->req.sample;
	p->max_tokens = job->req.max_tokens;
	p->stop = (const char *const *)job->req.stop;
	p->n_stop = job->req.n_stop;
	p->logprobs = job->req.logprobs;
	p->top_logprobs = job->req.top_logprobs;
	p->grammar = g->gram;
	p->speculative = job->req.speculative;
}

/* The cached sequence of a session on a model, or NULL. */
static struct resident *
find_resident(struct slot *m, const char *uuid)
{
	struct resident *r;

	for (r = m->residents; r != NULL; r = r->next)
		if (strcmp(r->uuid, uuid) == 0)
			return r;
	return NULL;
}

/* Creates or reuses the sequence of a generate request. */
int
sched_start_seq(struct sched *s, struct gen *g, const int32_t *ids, size_t n, char *err)
{
	struct seq_params p;
	struct resident *r = NULL;
	int rc;

	job_params(s, g, &p);
	if (g->job->req.session != NULL && (r = find_resident(g->slot, g->job->req.session)) != NULL) {
		if (r->busy)
			return err_set(err, ERR_BUSY, "session %s has a turn generating already", r->uuid);
		if ((rc = engine_seq_reuse(g->slot->e, r->seq, ids, (int32_t)n, &p, err)) < 0)
			return rc;
		g->seqs[0] = r->seq;
	} else {
		if ((rc = engine_seq_new(g->slot->e, ids, (int32_t)n, &p, &g->seqs[0], err)) != 0)
			return rc;
		if (g->job->req.session != NULL) {
			r = xcalloc(1, sizeof *r);
			snprintf(r->uuid, sizeof r->uuid, "%s", g->job->req.session);
			r->seq = g->seqs[0];
			r->next = g->slot->residents;
			g->slot->residents = r;
		}
	}
	if (r != NULL) {
		r->busy = 1;
		r->last_used = ++s->tick;
		/* what the caches lack of the stored history may be on disk */
		engine_seq_load(g->slot->e, r->seq, r->uuid, g->job->history_tokens);
	}
	g->res = r;
	g->n_seqs = 1;
	g->n_prompt = (int32_t)n;
	return 0;
}

/*
 * Forks a request's other choices from its first sequence once that one's
 * prompt is in the KV cache, so that the prompt is computed once: each
 * shares its blocks and computes only the prompt's last token again, for
 * the logits of its first draw (engine_seq_reuse keeps all but the last
 * token), with its own sampler, grammar state and stop strings. Choice i
 * draws with the request's seed + i: a seeded request is reproducible,
 * its choices differ, and its first choice is what n = 1 gives. 0 (also
 * when there is nothing to fork), or a negative code.
 */
int
sched_fork_choices(struct sched *s, struct gen *g, char *err)
{
	struct seq *first = g->seqs[0];
	struct seq_params p;
	struct seq *q;
	int rc;

	if (g->n_seqs != 1 || g->job->req.n_choices == 1 || first->n_cached < g->n_prompt ||
	    first->finish == FINISH_ERROR)
		return 0;
	job_params(s, g, &p);
	while (g->n_seqs < g->job->req.n_choices) {
		q = engine_seq_fork(g->slot->e, first);
		p.sample.seed = g->job->req.sample.seed + (uint64_t)g->n_seqs;
		if ((rc = engine_seq_reuse(g->slot->e, q, first->tokens, g->n_prompt, &p, err)) < 0) {
			engine_seq_free(g->slot->e, q);
			return err_prefix(err, rc, "choice %d", g->n_seqs);
		}
		g->seqs[g->n_seqs++] = q;
	}
	return 0;
}

/* Evicts idle cached sessions (least recently used first) until `need` blocks are free. */
void
sched_make_room(struct slot *m, int32_t need)
{
	struct resident *r, *lru;

	while (engine_free_blocks(m->e) < need) {
		lru = NULL;
		for (r = m->residents; r != NULL; r = r->next)
			if (!r->busy && (lru == NULL || r->last_used < lru->last_used))
				lru = r;
		if (lru == NULL)
			return;
		sched_free_resident(m, lru);
	}
}

/* Forks a cached session sequence under the child's uuid. */
void
sched_fork_resident(struct sched *s, const char *parent, const char *child)
{
	struct slot *m;
	struct resident *p, *c;

	for (m = s->slots.list; m != NULL; m = m->next) {
		if ((p = find_resident(m, parent)) == NULL || p->busy)
			continue;
		c = xcalloc(1, sizeof *c);
		snprintf(c->uuid, sizeof c->uuid, "%s", child);
		c->seq = engine_seq_fork(m->e, p->seq);
		c->last_used = ++s->tick;
		c->next = m->residents;
		m->residents = c;
	}
}

/*
 * Drops a session's cached sequences (a running one when it is done) and
 * its stored KV, and cancels its turn in flight, queued ones too: one that
 * ran on would park and save KV for a session that is gone.
 */
void
sched_drop_resident(struct sched *s, const char *uuid)
{
	struct slot *m;
	struct resident *r, *next;
	struct kvdisk_job *j;
	struct gen *g;

	for (g = s->gens; g != NULL; g = g->next)
		if (g->job->req.session != NULL && strcmp(g->job->req.session, uuid) == 0)
			g->cancelled = 1;

	for (m = s->slots.list; m != NULL; m = m->next)
		for (r = m->residents; r != NULL; r = next) {
			next = r->next;
			if (strcmp(r->uuid, uuid) == 0 && r->busy)
				r->dropped = 1;
			else if (strcmp(r->uuid, uuid) == 0)
				sched_free_resident(m, r);
		}
	if (s->disk != NULL) {
		j = xcalloc(1, sizeof *j);
		j->op = KVDISK_REMOVE;
		snprintf(j->name, sizeof j->name, "%s", uuid);
		kvdisk_submit(s->disk, j);
	}
}
