/*
 * sched_gen.c: a generate request's replies and its end, wherever it ends
 * (its prompt failed, a step finished it, it was cancelled, its model was
 * unloaded): the token and done replies (of each choice, for n > 1), when
 * a request of several choices has ended, the rows of a finished session
 * turn that the loop thread commits before it sends the done, and freeing
 * it, which parks a session's sequence and saves its KV to disk.
 */
#include "config.h"
#include "sched_int.h"
#include "chat_tools.h"
#include "engine.h"
#include "model.h"
#include "slots.h"
#include "store.h"
#include "tokenizer.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What replies call the parts of a turn's text (PROTOCOL.md). */
static const char *const part_key[CHAT_N_PARTS] = {
	[CHAT_PART_ANSWER] = "text", [CHAT_PART_REASONING] = "reasoning", [CHAT_PART_TOOL] = "tool",
};

/* A part's text in a reply: all of the turn's (whole), or what the last step handed out. */
static size_t
part_text(const struct gentext_part *p, int whole, const char **s)
{
	*s = whole ? p->text : p->piece;
	return whole ? p->len : p->piece_len;
}

/* Whether a reply has part k's field: the answer always, the others when not empty. */
static int
part_shown(const struct gentext *t, int k, int whole)
{
	const char *s;

	return k == CHAT_PART_ANSWER || part_text(&t->part[k], whole, &s) > 0;
}

/* How many fields pack_parts packs. */
static size_t
n_parts(const struct gentext *t, int whole)
{
	size_t n = 0;
	int k;

	for (k = 0; k < CHAT_N_PARTS; k++)
		n += (size_t)part_shown(t, k, whole);
	return n;
}

/* Packs the fields of a turn's text parts, whole or the last step's pieces. */
static void
pack_parts(msgpack_packer *pk, const struct gentext *t, int whole)
{
	const char *s;
	size_t n;
	int k;

	for (k = 0; k < CHAT_N_PARTS; k++)
		if (part_shown(t, k, whole)) {
			n = part_text(&t->part[k], whole, &s);
			proto_pack_kv_strn(pk, part_key[k], s, n);
		}
}

/* A token's bytes (not decoded to text: they may end mid-character) as a bin. */
static void
pack_token_bytes(msgpack_packer *pk, const struct tokenizer *t, int32_t id)
{
	size_t len = 0;
	const char *b = tok_bytes(t, id, &len);

	msgpack_pack_bin(pk, len);
	msgpack_pack_bin_body(pk, b, len);
}

/* With logprobs: the drawn token's bytes and log-probability, and the step's most likely tokens. */
static void
pack_logprobs(msgpack_packer *pk, const struct gen *g, const struct seq *q)
{
	proto_pack_str(pk, "bytes");
	pack_token_bytes(pk, g->md->tok, q->new_token);
	proto_pack_kv_float(pk, "logprob", q->new_logprob);
	if (q->n_top == 0)
		return;
	proto_pack_str(pk, "top_logprobs");
	msgpack_pack_array(pk, (size_t)q->n_top);
	for (int32_t i = 0; i < q->n_top; i++) {
		msgpack_pack_map(pk, 3);
		proto_pack_kv_uint(pk, "token", (uint64_t)q->top_ids[i]);
		proto_pack_str(pk, "bytes");
		pack_token_bytes(pk, g->md->tok, q->top_ids[i]);
		proto_pack_kv_float(pk, "logprob", q->top_lp[i]);
	}
}

/* Which choice of g sequence q is. */
static int
choice_of(const struct gen *g, const struct seq *q)
{
	int i = 0;

	while (g->seqs[i] != q)
		i++;
	return i;
}

/* A token reply of q, one of g's sequences; with n > 1 it says which choice it is of. */
struct sched_event *
sched_token_event(struct gen *g, const struct seq *q)
{
	struct sched_event *ev = sched_new_event(g->job->conn, g->job->req.id, 0);
	int lp = g->job->req.logprobs, several = g->job->req.n_choices > 1;
	msgpack_packer pk;

	proto_reply_begin(&ev->frame, &pk, 1, g->job->req.id, "token",
	    1 + n_parts(&q->out, 0) + (lp ? 2 + (q->n_top > 0) : 0) + several);
	pack_parts(&pk, &q->out, 0);
	proto_pack_kv_uint(&pk, "token", (uint64_t)q->new_token);
	if (lp)
		pack_logprobs(&pk, g, q);
	if (several)
		proto_pack_kv_uint(&pk, "choice", (uint64_t)choice_of(g, q));
	proto_reply_end(&ev->frame);
	return ev;
}

/* ---- tool calls ---- */

/* A finished turn's tool calls (PROTOCOL.md, Tool calls). */
struct turn_calls {
	struct chat_call *calls;
	size_t n;
	char error[ERR_LEN];   /* a call that does not parse; "" when none */
	int in_text;           /* the calls are the answer's text (Llama 3.1, Gemma, Mistral write them there) */
};

/*
 * The turn's output as the model wrote it (control tokens spelled out, an
 * end-of-turn token left out) after what the prompt opened of a call.
 */
static char *
raw_output(struct gen *g, const struct seq *q)
{
	const struct tokenizer *tok = g->md->tok;
	int32_t n = q->n_tokens - g->n_prompt;
	char *prefix = NULL, *text = NULL, *all;
	size_t len = 0;

	while (n > 0 && tok_is_eog(tok, q->tokens[g->n_prompt + n - 1]))
		n--;
	if (tok_decode(tok, q->tokens + g->n_prompt, (size_t)n, 1, &text, &len, NULL) != 0)
		text = xstrdup(""), len = 0;
	/* no error now: the prompt was made with the same prefix */
	sched_tool_prefix(g->md, g->job, &prefix, NULL);
	all = xmalloc((prefix ? strlen(prefix) : 0) + len + 1);
	sprintf(all, "%s", prefix ? prefix : "");
	memcpy(all + strlen(all), text, len + 1);
	free(prefix), free(text);
	return all;
}

/*
 * Parses the calls of a turn whose request offered tools (and did not say
 * tool_choice none): out of Qwen's tool text, or the model's whole output.
 */
static void
turn_calls(struct gen *g, const struct seq *q, struct turn_calls *tc)
{
	const struct gentext_part *tool = &q->out.part[CHAT_PART_TOOL];
	enum chat_tmpl t;
	char *raw;

	memset(tc, 0, sizeof *tc);
	/* a request cancelled before it was admitted has no model description */
	if (g->md == NULL || g->job->req.tools == NULL || g->job->req.tool_choice == TOOLS_NONE ||
	    q->finish == FINISH_CANCEL)
		return;
	t = g->md->chat;
	if (t == CHAT_CHATML || t == CHAT_QWEN3) {
		chat_calls_parse(t, tool->text, tool->len, &tc->calls, &tc->n, tc->error);
		return;
	}
	raw = raw_output(g, q);
	chat_calls_parse(t, raw, strlen(raw), &tc->calls, &tc->n, tc->error);
	tc->in_text = tc->n > 0 && (t == CHAT_LLAMA3 || t == CHAT_GEMMA || t == CHAT_MISTRAL);
	free(raw);
}

/* How many fields pack_calls packs. */
static size_t
n_call_fields(const struct turn_calls *tc)
{
	return (tc->n > 0) + (tc->error[0] != '\0') + (size_t)tc->in_text;
}

/* The done reply's tool_calls, tool_error and calls_in_text, where they have something to say. */
static void
pack_calls(msgpack_packer *pk, const struct turn_calls *tc)
{
	if (tc->n > 0) {
		proto_pack_str(pk, "tool_calls");
		proto_pack_calls(pk, tc->calls, tc->n);
	}
	if (tc->error[0] != '\0')
		proto_pack_kv_str(pk, "tool_error", tc->error);
	if (tc->in_text)
		proto_pack_kv_bool(pk, "calls_in_text", 1);
}

/*
 * A session turn's rows carry the messages' calls and results, and the
 * reply's calls: its content is then what the answer holds beside them
 * (nothing, where the calls were the answer's text).
 */
static void
turn_row_tools(const struct proto_msg *m, struct store_turn *t)
{
	if (m->n_calls > 0)
		t->tool_calls = chat_calls_json(m->calls, (size_t)m->n_calls);
	t->tool_call_id = m->tool_call_id ? xstrdup(m->tool_call_id) : NULL;
	t->tool_name = m->name ? xstrdup(m->name) : NULL;
}

static void
reply_row_tools(const struct turn_calls *tc, struct store_turn *t)
{
	if (tc->n == 0)
		return;
	t->tool_calls = chat_calls_json(tc->calls, tc->n);
	if (tc->in_text) {
		free(t->content);
		t->content = xstrdup("");
	}
}

/*
 * The rows of a finished session turn: the new messages (the prompt tokens
 * this turn added are accounted to the first) and the reply (its answer
 * and reasoning; generated tokens and the template's closing tokens, which
 * the cached sequence also takes, so it stays equal to the stored history).
 * Tool text is not stored: no template renders it back without the tool
 * call it came from, which the daemon does not parse.
 */
static void
turn_rows(struct gen *g, struct sched_event *ev, const struct turn_calls *tc)
{
	const struct proto_req *r = &g->job->req;
	struct seq *q = g->seqs[0];   /* a session's request has one choice */
	struct store_turn *t = xcalloc((size_t)r->n_msgs + 1, sizeof *t);
	int32_t *close_ids, n_gen = q->n_tokens - g->n_prompt;
	size_t n_close;
	int i;

	sched_closing_tokens(engine_model(g->slot->e), g->job, q, &close_ids, &n_close);
	for (i = 0; i < r->n_msgs; i++) {
		t[i].role = xstrdup(r->msgs[i].role);
		t[i].content = xstrdup(r->msgs[i].content);
		turn_row_tools(&r->msgs[i], &t[i]);
	}
	t[0].n_tokens = MAX(0, g->n_prompt - g->job->history_tokens);
	t[0].tokens = xmalloc((size_t)MAX(t[0].n_tokens, 1) * sizeof(int32_t));
	memcpy(t[0].tokens, q->tokens + g->n_prompt - t[0].n_tokens, (size_t)t[0].n_tokens * sizeof(int32_t));
	t[i].role = xstrdup("assistant");
	t[i].content = xstrdup(q->out.part[CHAT_PART_ANSWER].text);
	t[i].reasoning = xstrdup(q->out.part[CHAT_PART_REASONING].text);
	reply_row_tools(tc, &t[i]);
	t[i].n_tokens = n_gen + (int32_t)n_close;
	t[i].tokens = xmalloc((size_t)MAX(t[i].n_tokens, 1) * sizeof(int32_t));
	memcpy(t[i].tokens, q->tokens + g->n_prompt, (size_t)n_gen * sizeof(int32_t));
	if (n_close > 0) {
		memcpy(t[i].tokens + n_gen, close_ids, n_close * sizeof(int32_t));
		if (g->res != NULL)
			engine_seq_append(q, close_ids, (int32_t)n_close);
	}
	free(close_ids);
	ev->turns = t;
	ev->n_turns = r->n_msgs + 1;
	ev->after = g->job->n_history;
	snprintf(ev->session, sizeof ev->session, "%s", r->session);
	ev->uid = g->job->uid;
}

/* The finish, text (without streaming) and tool calls of one choice: how many fields, then packed. */
static size_t
n_choice_fields(const struct gen *g, const struct seq *q, const struct turn_calls *tc)
{
	return 1 + (g->job->req.stream ? 0 : n_parts(&q->out, 1)) + n_call_fields(tc);
}

static void
pack_choice(msgpack_packer *pk, const struct gen *g, const struct seq *q, const struct turn_calls *tc)
{
	proto_pack_kv_str(pk, "finish", engine_finish_name(q->finish));
	if (!g->job->req.stream)
		pack_parts(pk, &q->out, 1);
	pack_calls(pk, tc);
}

/*
 * The usage of a done: the prompt once (its choices share its KV: it was
 * computed once), the tokens every choice generated, guessed and had
 * accepted, and their rate after the first token.
 */
static void
pack_usage(msgpack_packer *pk, const struct gen *g)
{
	double gen_s = g->t_first ? (double)(now_ns() - g->t_first) / 1e9 : 0;
	int32_t generated = 0, drafted = 0, accepted = 0;
	int i;

	for (i = 0; i < g->n_seqs; i++) {
		generated += g->seqs[i]->n_generated;
		drafted += g->seqs[i]->n_drafted;
		accepted += g->seqs[i]->n_accepted;
	}
	proto_pack_str(pk, "usage");
	msgpack_pack_map(pk, 7);
	proto_pack_kv_uint(pk, "prompt_tokens", (uint64_t)g->n_prompt);
	proto_pack_kv_uint(pk, "cached_tokens", (uint64_t)(g->n_seqs > 0 ? g->seqs[0]->n_hit : 0));
	proto_pack_kv_uint(pk, "generated_tokens", (uint64_t)generated);
	proto_pack_kv_uint(pk, "drafted_tokens", (uint64_t)drafted);
	proto_pack_kv_uint(pk, "accepted_tokens", (uint64_t)accepted);
	proto_pack_kv_float(pk, "ttft_ms", g->t_first ? (double)(g->t_first - g->job->t_submit) / 1e6 : 0);
	proto_pack_kv_float(pk, "tokens_per_s", gen_s > 0 ? (generated - 1) / gen_s : 0);
}

/* Choice i of g: its sequence, or for a choice not forked yet (a request cancelled early), none. */
static const struct seq *
choice_seq(const struct gen *g, int i)
{
	static const struct seq none = { .state = SEQ_DONE, .finish = FINISH_CANCEL };

	return i < g->n_seqs ? g->seqs[i] : &none;
}

/* The choice that failed (its error ends the request), or NULL. */
static const struct seq *
failed_choice(const struct gen *g)
{
	for (int i = 0; i < g->n_seqs; i++)
		if (g->seqs[i]->finish == FINISH_ERROR)
			return g->seqs[i];
	return NULL;
}

/* The done of n > 1 choices: the usage, and each choice's fields in `choices`, in their order. */
static void
pack_choices_done(struct sched_event *ev, struct gen *g)
{
	int i, n = g->job->req.n_choices;
	struct turn_calls tc;
	msgpack_packer pk;

	proto_reply_begin(&ev->frame, &pk, 1, g->job->req.id, "done", 2);
	pack_usage(&pk, g);
	proto_pack_str(&pk, "choices");
	msgpack_pack_array(&pk, (size_t)n);
	for (i = 0; i < n; i++) {
		const struct seq *q = choice_seq(g, i);

		turn_calls(g, q, &tc);
		msgpack_pack_map(&pk, 1 + n_choice_fields(g, q, &tc));
		pack_choice(&pk, g, q, &tc);
		proto_pack_kv_uint(&pk, "generated_tokens", (uint64_t)q->n_generated);
		chat_calls_free(tc.calls, tc.n);
	}
	proto_reply_end(&ev->frame);
}

/*
 * The done reply (with the rows to commit for a completed session turn),
 * or the error of a choice that failed; an embed's result or error. A
 * request cancelled while queued has no sequence yet.
 */
struct sched_event *
sched_done_event(struct gen *g)
{
	const struct seq *q = choice_seq(g, 0), *failed = failed_choice(g);
	int with_session = g->job->req.session != NULL;
	struct sched_event *ev;
	struct turn_calls tc;
	msgpack_packer pk;

	if (g->job->req.op == OP_EMBED)
		return sched_embed_event(g);
	ev = sched_new_event(g->job->conn, g->job->req.id, 1);
	if (failed != NULL) {
		proto_error(&ev->frame, 1, g->job->req.id, failed->req_error ? PE_INVALID_PARAM : PE_MODEL_ERROR,
		    failed->error);
		return ev;
	}
	if (g->job->req.n_choices > 1) {
		pack_choices_done(ev, g);
		return ev;
	}
	turn_calls(g, q, &tc);
	proto_reply_begin(&ev->frame, &pk, 1, g->job->req.id, "done", 1 + n_choice_fields(g, q, &tc) + with_session);
	pack_choice(&pk, g, q, &tc);
	pack_usage(&pk, g);
	if (with_session)
		proto_pack_kv_str(&pk, "session", g->job->req.session);
	proto_reply_end(&ev->frame);
	if (with_session && q->finish != FINISH_CANCEL)
		turn_rows(g, ev, &tc);
	chat_calls_free(tc.calls, tc.n);
	return ev;
}

/* Ends the request's choices still running; error, if not NULL, is their message. */
void
sched_gen_finish(struct gen *g, enum finish_reason why, const char *error)
{
	sched_embed_end(g, why, error);
	for (int i = 0; i < g->n_seqs; i++) {
		if (g->seqs[i]->state == SEQ_DONE)
			continue;
		if (error != NULL)
			snprintf(g->seqs[i]->error, sizeof g->seqs[i]->error, "%s", error);
		engine_seq_finish(g->seqs[i], why);
	}
}

/*
 * 1 when a running request has ended: all its choices have, or one failed
 * (the others are then ended: the request ends with that one's error).
 */
int
sched_gen_over(struct gen *g)
{
	int i, done = 0;

	if (failed_choice(g) != NULL) {
		sched_gen_finish(g, FINISH_CANCEL, NULL);
		return 1;
	}
	for (i = 0; i < g->n_seqs; i++)
		done += g->seqs[i]->state == SEQ_DONE;
	return done == g->job->req.n_choices;
}

/*
 * The times of a token of q, one of g's sequences, out of a step that
 * ended at now: the request's first token (from its arrival, a queue and
 * a load included) and the time since the sequence's token before. A
 * choice forked after the first has no token before its first.
 */
void
sched_gen_token_time(struct gen *g, const struct seq *q, uint64_t now)
{
	struct slot *m = g->slot;
	int i = choice_of(g, q);

	if (g->t_first == 0) {
		g->t_first = now;
		hist_add(&m->ttft, &hist_ttft, (now - g->job->t_submit) / 1000);
	} else if (g->t_token[i] != 0) {
		hist_add(&m->itl, &hist_itl, (now - g->t_token[i]) / 1000);
	}
	g->t_token[i] = now;
	m->generated_tokens++;
}

/*
 * How a request ended, for status's requests: error when it failed (before
 * its sequence started, or one of its choices did), cancel when it was
 * cancelled, its client left, or an unload or the daemon stopping ended a
 * choice, else its first choice's finish.
 */
static enum finish_reason
gen_outcome(const struct gen *g)
{
	int i;

	if (failed_choice(g) != NULL)
		return FINISH_ERROR;
	if (g->cancelled || g->gone)
		return FINISH_CANCEL;
	if (g->n_seqs == 0)
		return FINISH_ERROR;
	for (i = 0; i < g->n_seqs; i++)
		if (g->seqs[i]->finish == FINISH_CANCEL)
			return FINISH_CANCEL;
	return g->seqs[0]->finish;
}

/* Unlinks a gen and frees it; a session keeps its sequence. */
void
sched_gen_free(struct sched *s, struct gen *g)
{
	struct gen **pp;
	int i;

	s->requests[gen_outcome(g)]++;
	for (pp = &s->gens; *pp != g; pp = &(*pp)->next)
		;
	*pp = g->next;
	if (g->state == GEN_QUEUED)
		s->n_queued--;
	if (s->waiting == g)
		s->waiting = NULL;
	if (g->res != NULL && g->res->dropped) {
		sched_free_resident(g->slot, g->res);
	} else if (g->res != NULL) {
		struct seq *q = g->seqs[0];   /* a session's only choice */

		if (q->finish == FINISH_STOP || q->finish == FINISH_LENGTH || q->finish == FINISH_CONTEXT)
			engine_seq_save(g->slot->e, q, g->res->uuid);
		engine_seq_park(g->slot->e, q);
		g->res->busy = 0;
		g->res->last_used = ++s->tick;
	} else {
		for (i = 0; i < g->n_seqs; i++)
			engine_seq_free(g->slot->e, g->seqs[i]);
		sched_embed_free(g);
	}
	if (g->gram != NULL)
		engine_grammar_put(g->slot->e, g->gram);
	sched_draft_drop(s, g);
	if (g->slot != NULL)
		sched_release_slot(s, g->slot, sched_job_keep_alive(s, g->job));
	free(g->ids);  /* a prompt cancelled while the worker tokenized it */
	sched_job_free(g->job);
	free(g);
}
