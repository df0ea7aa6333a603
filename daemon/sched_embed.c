/*
 * sched_embed.c: an embed request's inputs, from tokens to vectors. The
 * prompt worker tokenizes them (sched_embed_prep); once running, each step
 * of its model starts as many of its inputs as the step has room for
 * (sched_embed_pick), one engine sequence each, prefilled beside whatever
 * else the model runs, and a finished sequence's vector is kept and the
 * sequence freed at once: its KV blocks are its own while it runs and go
 * back to the pool when it is done. The request ends with one result of
 * all its vectors, or with the error of the first input that failed.
 */
#include "config.h"
#include "sched_int.h"
#include "engine.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* On the prompt worker: each input's tokens (a text with the model's BOS and EOS, as its tokenizer adds them). */
void
sched_embed_prep(struct gen *g)
{
	const struct proto_req *r = &g->job->req;
	struct embed_run *e = xcalloc(1, sizeof *e);
	int i, rc = 0;

	e->n = r->n_inputs;
	e->ids = xcalloc((size_t)e->n, sizeof *e->ids);
	e->n_ids = xcalloc((size_t)e->n, sizeof *e->n_ids);
	for (i = 0; i < e->n && rc == 0; i++) {
		const struct proto_input *in = &r->inputs[i];
		size_t n = 0;

		if (in->text == NULL) {
			e->ids[i] = xmalloc(in->n_tokens * sizeof **e->ids);
			memcpy(e->ids[i], in->tokens, in->n_tokens * sizeof **e->ids);
			n = in->n_tokens;
		} else if ((rc = tok_encode(g->md->tok, in->text, strlen(in->text), 0, 1, &e->ids[i], &n,
		    g->prep_err)) != 0) {
			err_prefix(g->prep_err, rc, "input[%d]", i);
		}
		e->n_ids[i] = (int32_t)n;
	}
	g->prep_rc = rc;
	g->prep_pe = PE_INVALID_PARAM;
	g->emb = e;
}

/*
 * Back on the engine thread: the inputs checked against the model (its
 * context, unless truncate cuts them to it; its vocabulary; dimensions)
 * and the request made ready to run. 0, or the error to answer.
 */
int
sched_embed_start(struct gen *g, enum proto_err *pe, char *err)
{
	struct embed_run *e = g->emb;
	struct engine *en = g->slot->e;
	const struct model_desc *md = engine_model(en);
	int32_t n_ctx = engine_n_ctx(en), dims = g->job->req.dimensions;
	int i;

	*pe = PE_INVALID_PARAM;
	if (dims > md->embed.n_out)
		return err_set(err, ERR_INVAL, "dimensions = %d is more than the %d of %s's vectors", dims,
		    md->embed.n_out, md->name);
	for (i = 0; i < e->n; i++) {
		for (int32_t k = 0; k < e->n_ids[i]; k++)
			if (e->ids[i][k] < 0 || e->ids[i][k] >= md->hp.n_vocab)
				return err_set(err, ERR_INVAL, "input[%d]: token id %d is outside the vocabulary", i,
				    e->ids[i][k]);
		if (e->n_ids[i] < 1)
			return err_set(err, ERR_INVAL, "input[%d] has no tokens", i);
		if (e->n_ids[i] > n_ctx && !g->job->req.truncate) {
			*pe = PE_CONTEXT_EXCEEDED;
			return err_set(err, ERR_RANGE, "input[%d] has %d tokens; the context holds %d (truncate: true cuts "
			    "inputs to it)", i, e->n_ids[i], n_ctx);
		}
		if (e->n_ids[i] > n_ctx) {
			e->n_ids[i] = n_ctx;
			e->truncated++;
		}
		e->n_tokens += e->n_ids[i];
	}
	e->dims = engine_embed_dims(en, dims);
	e->vecs = xmalloc((size_t)e->n * (size_t)e->dims * sizeof *e->vecs);
	e->running = xcalloc((size_t)e->n, sizeof *e->running);
	e->idx = xcalloc((size_t)e->n, sizeof *e->idx);
	return 0;
}

/* Tokens its running sequences have yet to compute (those waiting for blocks too). */
static int32_t
pending(const struct embed_run *e)
{
	int32_t n = 0;

	for (int i = 0; i < e->n_running; i++)
		n += e->running[i]->n_tokens - e->running[i]->n_cached;
	return n;
}

/* 1 if it can start another input: one is left, and those running leave room in a step. */
static int
can_start(const struct gen *g)
{
	const struct embed_run *e = g->emb;

	return e->next < e->n && e->failed == PE_NONE && pending(e) < engine_max_step_tokens(g->slot->e);
}

int
sched_embed_ready(const struct gen *g)
{
	const struct embed_run *e = g->emb;

	for (int i = 0; i < e->n_running; i++)
		if (sched_seq_ready(e->running[i]))
			return 1;
	return can_start(g);
}

/*
 * Puts the request's sequences into a step's list (out and gens from n on,
 * at most max in all): those running, then new ones for the next inputs
 * while the tokens of all it runs stay under a step's worth, so that the
 * inputs that wait hold no blocks (nor do more start while some wait for
 * blocks). *need adds the blocks they take. Returns the list's new length.
 */
int
sched_embed_pick(struct gen *g, struct seq **out, struct gen **gens, int n, int max, int32_t *need)
{
	struct embed_run *e = g->emb;
	struct seq *q;
	int i;

	for (i = 0; i < e->n_running && n < max; i++) {
		q = e->running[i];
		if (!sched_seq_ready(q))
			continue;
		*need += sched_seq_blocks(q);
		gens[n] = g;
		out[n++] = q;
	}
	while (n < max && can_start(g)) {
		if (engine_seq_embed(g->slot->e, e->ids[e->next], e->n_ids[e->next], e->dims, &q, e->error) != 0) {
			e->failed = PE_MODEL_ERROR;
			break;
		}
		e->idx[e->n_running] = e->next++;
		e->running[e->n_running++] = q;
		*need += sched_seq_blocks(q);
		gens[n] = g;
		out[n++] = q;
	}
	return n;
}

/*
 * After a step: the vectors of the sequences that are done, which are
 * freed; 1 when the request has ended (every vector made, or one input
 * failed).
 */
int
sched_embed_over(struct gen *g)
{
	struct embed_run *e = g->emb;
	struct seq *q;
	int i, k = 0;

	for (i = 0; i < e->n_running; i++) {
		q = e->running[i];
		if (q->state != SEQ_DONE) {
			e->running[k] = q;
			e->idx[k++] = e->idx[i];
			continue;
		}
		if (q->finish == FINISH_STOP) {
			memcpy(e->vecs + (size_t)e->idx[i] * (size_t)e->dims, q->vec, (size_t)e->dims * sizeof *e->vecs);
			e->done++;
		} else if (e->failed == PE_NONE) {
			e->failed = PE_MODEL_ERROR;
			snprintf(e->error, sizeof e->error, "input[%d]: %.200s", e->idx[i], q->error);
		}
		engine_seq_free(g->slot->e, q);
	}
	e->n_running = k;
	return e->failed != PE_NONE || e->done == e->n;
}

/* Ends it early: cancelled (why FINISH_CANCEL), or failed with error (its model was unloaded, or failed). */
void
sched_embed_end(struct gen *g, enum finish_reason why, const char *error)
{
	struct embed_run *e = g->emb;

	if (e == NULL || e->failed != PE_NONE)
		return;
	e->failed = why == FINISH_ERROR ? PE_MODEL_ERROR : PE_CANCELLED;
	snprintf(e->error, sizeof e->error, "%s", error != NULL ? error : "the request was cancelled");
}

/* The result: each vector as an array of float32, the width, the model, the token counts. */
static void
pack_result(struct sched_event *ev, struct gen *g)
{
	const struct embed_run *e = g->emb;
	msgpack_packer pk;
	int i;

	proto_reply_begin(&ev->frame, &pk, 1, g->job->req.id, "result", 5);
	proto_pack_str(&pk, "embeddings");
	msgpack_pack_array(&pk, (size_t)e->n);
	for (i = 0; i < e->n; i++) {
		const float *v = e->vecs + (size_t)i * (size_t)e->dims;

		msgpack_pack_array(&pk, (size_t)e->dims);
		for (int32_t d = 0; d < e->dims; d++)
			msgpack_pack_float(&pk, v[d]);
	}
	proto_pack_kv_uint(&pk, "dimensions", (uint64_t)e->dims);
	proto_pack_kv_str(&pk, "model", g->slot->name);
	proto_pack_str(&pk, "tokens");
	msgpack_pack_array(&pk, (size_t)e->n);
	for (i = 0; i < e->n; i++)
		msgpack_pack_uint32(&pk, (uint32_t)e->n_ids[i]);
	proto_pack_str(&pk, "usage");
	msgpack_pack_map(&pk, 4);
	proto_pack_kv_uint(&pk, "prompt_tokens", (uint64_t)e->n_tokens);
	proto_pack_kv_uint(&pk, "truncated", (uint64_t)e->truncated);
	proto_pack_kv_float(&pk, "load_ms", (double)g->load_ns / 1e6);
	proto_pack_kv_float(&pk, "total_ms", (double)(now_ns() - g->job->t_submit) / 1e6);
	proto_reply_end(&ev->frame);
}

/* Its last reply: the result, or the error it ended with (a request cancelled while queued has none yet). */
struct sched_event *
sched_embed_event(struct gen *g)
{
	struct sched_event *ev = sched_new_event(g->job->conn, g->job->req.id, 1);
	const struct embed_run *e = g->emb;

	if (e == NULL || g->cancelled)
		proto_error(&ev->frame, 1, g->job->req.id, PE_CANCELLED, "the request was cancelled");
	else if (e->failed != PE_NONE)
		proto_error(&ev->frame, 1, g->job->req.id, e->failed, e->error);
	else
		pack_result(ev, g);
	return ev;
}

void
sched_embed_free(struct gen *g)
{
	struct embed_run *e = g->emb;

	if (e == NULL)
		return;
	for (int i = 0; i < e->n_running; i++)
		engine_seq_free(g->slot->e, e->running[i]);
	for (int i = 0; i < e->n; i++)
		free(e->ids[i]);
	free(e->ids), free(e->n_ids), free(e->vecs), free(e->running), free(e->idx);
	free(e);
	g->emb = NULL;
}
