/*
 * sched_step.c: running the admitted requests. Each step of a model puts
 * the decoding sequences first (one token each) and then prefill chunks
 * that the pacer (pace.h) sizes so that a long prompt slows the streams
 * beside it by about half and never stalls them, and sends what the step
 * produced; a request of several choices forks them once its prompt is in
 * (sched_fork_choices) and ends when they all have. Requests cancelled or
 * left by their client are finished between steps. Unloading a model ends
 * what runs on it; a backend failure reloads the model (model_fault).
 */
#include "config.h"
#include "sched_int.h"
#include "engine.h"
#include "log.h"
#include "pace.h"
#include "slots.h"
#include "util.h"
#include "worker.h"

#include <stdio.h>
#include <stdlib.h>

int
sched_seq_ready(const struct seq *q)
{
	return (q->state == SEQ_PREFILL || q->state == SEQ_DECODE) && !q->wait_io;
}

int32_t
sched_seq_blocks(const struct seq *q)
{
	return (q->n_tokens - q->n_cached + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS + 1;
}

/* 1 if a running request has a sequence a step can take. */
int
sched_gen_ready(const struct gen *g)
{
	if (g->emb != NULL)
		return sched_embed_ready(g);
	for (int i = 0; i < g->n_seqs; i++)
		if (sched_seq_ready(g->seqs[i]))
			return 1;
	return 0;
}

/*
 * The sequences of one model for the next step: decoding ones first, then
 * prefilling ones, interactive before background, in arrival order (a
 * request's choices together; an embed's inputs, started as the step has
 * room for them).
 */
static int
pick(struct sched *s, struct slot *m, struct seq **out, struct gen **gens, int max)
{
	int n = 0, pass, prio, i;
	struct gen *g;
	struct seq *q;
	int32_t need = 0;

	for (pass = 0; pass < 2; pass++)
		for (prio = PRIO_INTERACTIVE; prio <= PRIO_BACKGROUND; prio++)
			for (g = s->gens; g != NULL; g = g->next) {
				if (g->state != GEN_RUNNING || g->slot != m || (int)g->job->req.priority != prio)
					continue;
				if (g->emb != NULL) {
					n = pass == 1 ? sched_embed_pick(g, out, gens, n, max, &need) : n;
					continue;
				}
				for (i = 0; i < g->n_seqs && n < max; i++) {
					q = g->seqs[i];
					if (!sched_seq_ready(q) || (q->state == SEQ_DECODE) != (pass == 0))
						continue;
					gens[n] = g;
					out[n++] = q;
					need += sched_seq_blocks(q);
				}
			}
	sched_make_room(m, need);
	return n;
}

/* Finishes the sequences whose request was cancelled or whose client left. */
void
sched_reap_cancelled(struct sched *s)
{
	struct gen *g, *next;

	for (g = s->gens; g != NULL; g = next) {
		next = g->next;
		if ((!g->cancelled && !g->gone) || g->state == GEN_PREP)  /* that one when its prompt is back */
			continue;
		sched_gen_finish(g, FINISH_CANCEL, NULL);
		if (!g->gone)
			sched_post(s, sched_done_event(g));
		sched_gen_free(s, g);
	}
}

/*
 * Ends the requests running on m (finish why; error, if not NULL, is their
 * message) and unloads it, dropping its sessions' cached sequences. The
 * worker may be reading the model for a prompt: its items for m (the
 * prompts and tokenizes of this model, not of others) are drained first.
 * Returns the requests ended.
 */
int
sched_unload_model(struct sched *s, struct slot *m, enum finish_reason why, const char *error)
{
	struct gen *g, *next;
	int n = 0;

	sched_take_prep(s, worker_drain(&s->prep, m));
	sched_take_prep(s, worker_drain(&s->prep_gram, m));
	for (g = s->gens; g != NULL; g = next) {
		next = g->next;
		if (g->slot != m || g->state != GEN_RUNNING)
			continue;
		sched_gen_finish(g, why, error);
		if (!g->gone)
			sched_post(s, sched_done_event(g));
		sched_gen_free(s, g);
		n++;
	}
	slots_unload(&s->slots, m);
	return n;
}

/*
 * The backend failed a step of model m (a GPU fault; the step's requests
 * got its error already). What it holds on the device is not to be trusted:
 * the model's other running requests end with the error too, its cached
 * sessions are dropped (a next turn rebuilds them from the store), and it
 * is loaded again, on the CPU under SCHED_FAULT_CPU. If that load fails the
 * model stays unloaded, to be loaded by its next request. Queued requests
 * wait and then run on the new engine.
 */
static void
model_fault(struct sched *s, struct slot *m, const char *what)
{
	char err[ERR_LEN], msg[ERR_LEN];

	m->faults++;
	log_error("model %s: %s; loading it again%s", m->name, what,
	    s->o.device_fault == SCHED_FAULT_CPU ? " on the CPU" : "");
	snprintf(msg, sizeof msg, "the model failed and was loaded again: %.200s", what);
	sched_unload_model(s, m, FINISH_ERROR, msg);
	if (s->o.device_fault == SCHED_FAULT_CPU)
		m->device = "cpu";
	if (slots_load(&s->slots, m, NULL, NULL, err) < 0)
		log_error("model %s: loading it again: %s", m->name, err);
}

/*
 * After a step of m: its requests whose prompt is now in the KV cache fork
 * their other choices (a fork that fails fails the request), embeds take
 * their inputs' vectors, and those that have ended send their done (an
 * embed its result) and are freed.
 */
static struct sched_event **
step_ends(struct sched *s, struct slot *m, struct sched_event **tail)
{
	struct gen *g, *next;
	char err[ERR_LEN];

	for (g = s->gens; g != NULL; g = next) {
		next = g->next;
		if (g->state != GEN_RUNNING || g->slot != m)
			continue;
		if (g->emb != NULL) {
			if (!sched_embed_over(g))
				continue;
		} else {
			if (sched_fork_choices(s, g, err) != 0) {
				snprintf(g->seqs[0]->error, sizeof g->seqs[0]->error, "%s", err);
				engine_seq_finish(g->seqs[0], FINISH_ERROR);
			}
			if (!sched_gen_over(g))
				continue;
		}
		tail = sched_chain(tail, sched_done_event(g));
		sched_gen_free(s, g);
	}
	return tail;
}

/*
 * Before a step of m: whether it guesses ahead (guess.h), and if so its
 * draft models' guesses. Returns -1 when m itself failed as a draft (the
 * step's sequences ended with it), else 0.
 */
static int
guess_first(struct sched *s, struct slot *m, struct seq **seqs, struct gen **gens, int n, int n_dec)
{
	struct slot *bad;
	char err[ERR_LEN];
	int allow = n_dec == 0 || guess_allow(&m->guess, n_dec);

	engine_auto_guess(m->e, allow);
	if ((bad = sched_draft_guess(s, seqs, gens, n, err)) == NULL)
		return 0;
	model_fault(s, bad, err);
	return bad == m ? -1 : 0;
}

/* The token replies of a step's sequences (each settled token its own, in order), counted in *produced. */
static struct sched_event **
send_tokens(struct slot *m, struct seq **seqs, struct gen **gens, int n, uint64_t now, int32_t *produced,
    struct sched_event **tail)
{
	for (int i = 0; i < n; i++) {
		struct gen *g = gens[i];
		struct seq *q = seqs[i];

		if (q->new_token < 0)
			continue;
		do {
			(*produced)++;
			sched_gen_token_time(g, q, now);
			if (g->job->req.stream && (gentext_piece_bytes(&q->out) > 0 || q->state != SEQ_DONE))
				tail = sched_chain(tail, sched_token_event(g, q));
		} while (engine_seq_more(m->e, q));
	}
	return tail;
}

/*
 * The step's figures: the pacer's, the guesses' (a decode-only step's, from tg, before its draft work), status'.
 * dec_tokens is what the pacer was asked with before the step: the decoders' guesses are theirs, not
 * prompt tokens, and their steps are measured as the decoders' (had they counted as more decode tokens,
 * no step measured would be comparable to the next one asked about, and prompts waiting beside a sequence
 * that guesses would get no tokens until it ended).
 */
static void
step_figures(struct sched *s, struct slot *m, int n, int n_dec, int n_pre, int32_t tokens, int32_t dec_tokens,
    double sec, int cap)
{
	int32_t guesses = engine_step_guesses(m->e);

	log_debug("step %s: %d decoding, %d prefilling, %d tokens (%d guessed), %.2f ms (chunk %d)",
	    m->name, n_dec, n_pre, tokens, guesses, sec * 1e3, (int)m->pace.chunk);
	pace_done(&m->pace, n_dec, dec_tokens, n_pre, MAX(tokens - n_dec - guesses, 0), sec, cap);
	s->steps++;
	s->step_tokens += (uint64_t)tokens;
	s->step_seqs += (uint64_t)n;
	s->max_batch = MAX(s->max_batch, n);
	hist_add(&s->batch, &hist_batch, (uint64_t)n);
}

/* Runs one step of a model and sends what it produced. */
void
sched_step_model(struct sched *s, struct slot *m)
{
	int cap = engine_max_step_tokens(m->e), n, i, rc = 0, n_dec = 0, n_pre = 0;
	int32_t budget, dec_tokens, produced = 0;
	struct seq **seqs = xmalloc((size_t)cap * sizeof *seqs);
	struct gen **gens = xmalloc((size_t)cap * sizeof *gens);
	struct sched_event *out = NULL, **tail = &out;
	char err[ERR_LEN];
	uint64_t tg, t0, t1 = 0;

	n = pick(s, m, seqs, gens, MIN(cap, s->o.max_seqs > 0 ? s->o.max_seqs : 64));
	for (i = 0; i < n; i++) {
		n_dec += seqs[i]->state == SEQ_DECODE;
		n_pre += seqs[i]->state == SEQ_PREFILL;
	}
	/* a limited chunk fills the device's last tile of tokens: those cost about nothing more (pace.h) */
	dec_tokens = engine_step_tokens(m->e, n_dec);
	if ((budget = pace_budget(&m->pace, n_dec, dec_tokens, n_pre)) > 0)
		budget = MAX(budget, engine_step_tokens(m->e, n_dec + budget) - n_dec);
	tg = now_ns();
	if (n > 0 && guess_first(s, m, seqs, gens, n, n_dec) < 0) {
		free(seqs);
		free(gens);
		return;
	}
	t0 = now_ns();
	if (n > 0 && (rc = engine_step(m->e, seqs, n, budget, err)) >= 0)
		step_figures(s, m, n, n_dec, n_pre, rc, dec_tokens, (double)((t1 = now_ns()) - t0) / 1e9, cap);
	tail = send_tokens(m, seqs, gens, n, t1, &produced, tail);
	if (rc >= 0 && n_dec > 0 && n_pre == 0)
		guess_done(&m->guess, n_dec, engine_step_guesses(m->e) > 0, produced, (double)(t1 - tg) / 1e9);
	tail = step_ends(s, m, tail);
	sched_post_chain(s, out, tail);
	free(seqs);
	free(gens);
	if (rc < 0)
		model_fault(s, m, err);
}
