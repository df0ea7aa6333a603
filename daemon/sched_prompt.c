/*
 * sched_prompt.c: a request's messages through its model's chat template,
 * and its constraint into a grammar. The prompt worker turns them into the
 * prompt's tokens and the grammar its output must match (on its thread:
 * nothing here touches the scheduler's state, and a new schema's index may
 * take up to a second to build), and a finished session turn takes the
 * template's closing tokens too, so that the stored history is what the
 * template renders.
 */
#include "config.h"
#include "sched_int.h"
#include "engine.h"
#include "jschema.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* The chat history plus this turn's messages, with the session's system prompt first. */
static struct chat_msg *
conversation(const struct sched_job *job, size_t *n)
{
	const struct proto_req *r = &job->req;
	size_t i, k = 0, total = (size_t)job->n_history + (size_t)r->n_msgs + 1;
	struct chat_msg *m = xcalloc(total, sizeof *m);
	int has_system = (job->n_history > 0 && strcmp(job->history[0].role, "system") == 0) ||
	    (job->n_history == 0 && r->n_msgs > 0 && strcmp(r->msgs[0].role, "system") == 0);

	if (job->session_system != NULL && job->session_system[0] != '\0' && !has_system)
		m[k++] = (struct chat_msg){ "system", job->session_system, NULL };
	for (i = 0; i < (size_t)job->n_history; i++)
		m[k++] = (struct chat_msg){ job->history[i].role, job->history[i].content, job->history[i].reasoning };
	for (i = 0; i < (size_t)r->n_msgs; i++)
		m[k++] = (struct chat_msg){ r->msgs[i].role, r->msgs[i].content, NULL };
	*n = k;
	return m;
}

/* Renders messages [0, n) through the model's template into a malloc'd string. */
static int
render(const struct model_desc *md, const struct chat_msg *m, size_t n, int gen, char **text, size_t *len,
    char *err)
{
	return chat_render(md->chat, m, n, gen, tok_piece(md->tok, tok_bos(md->tok)), text, len, err);
}

/*
 * A session's prompt: its stored token ids, then the tokens of the text the
 * template adds for this turn's messages. So a resumed session sees exactly
 * the tokens it saw (and generated) before, whether its KV cache survived or
 * is rebuilt after a restart. Where the template does not simply append
 * (Mistral moves the system prompt to the last user turn; Qwen3 and
 * harmony drop a reply's reasoning once a user message follows it), the
 * whole conversation is rendered again instead.
 */
static int
session_tokens(const struct model_desc *md, const struct sched_job *job, const struct chat_msg *m,
    size_t n_msgs, size_t n_prev, int32_t **ids, size_t *n, char *err)
{
	char *all = NULL, *prev = NULL;
	size_t all_len, prev_len, n_new = 0;
	int32_t *new_ids = NULL;
	int rc;

	if ((rc = render(md, m, n_msgs, 1, &all, &all_len, err)) != 0)
		return rc;
	if (job->history_tokens > 0 && render(md, m, n_prev, 0, &prev, &prev_len, err) == 0 &&
	    prev_len <= all_len && memcmp(prev, all, prev_len) == 0) {
		rc = tok_encode(md->tok, all + prev_len, all_len - prev_len, 1, 0, &new_ids, &n_new, err);
		if (rc == 0) {
			*n = (size_t)job->history_tokens + n_new;
			*ids = xmalloc(*n * sizeof **ids);
			memcpy(*ids, job->history_ids, (size_t)job->history_tokens * sizeof **ids);
			memcpy(*ids + job->history_tokens, new_ids, n_new * sizeof **ids);
		}
	} else {
		rc = tok_encode(md->tok, all, all_len, 1, 0, ids, n, err);
	}
	free(all), free(prev), free(new_ids);
	return rc;
}

/* The prompt's tokens: raw text, or the conversation through the chat template. */
int
sched_prompt_tokens(const struct model_desc *md, const struct sched_job *job, int32_t **ids, size_t *n,
    enum proto_err *pe, char *err)
{
	struct chat_msg *msgs;
	size_t n_msgs;
	int rc;

	*pe = PE_INVALID_PARAM;
	if (job->req.prompt != NULL)
		return tok_encode(md->tok, job->req.prompt, strlen(job->req.prompt), 0, tok_add_bos(md->tok),
		    ids, n, err);
	if (md->chat_error != NULL)
		return err_set(err, ERR_UNSUPPORTED, "%s", md->chat_error);
	if (md->chat == CHAT_RAW)
		return err_set(err, ERR_UNSUPPORTED, "model %s has no chat template: send a raw 'prompt'", md->name);
	msgs = conversation(job, &n_msgs);
	rc = session_tokens(md, job, msgs, n_msgs, n_msgs - (size_t)job->req.n_msgs, ids, n, err);
	free(msgs);
	return rc;
}

/* A JSON Schema's text as a grammar over e's vocabulary; json alone: any JSON object. */
static int
schema_grammar(struct engine *e, const char *schema_text, struct cons_gram **out, char *err)
{
	json_error_t je;
	json_t *schema = schema_text != NULL ? json_loads(schema_text, 0, &je) : json_pack("{s:s}", "type", "object");
	char *text = NULL;
	int rc;

	if (schema == NULL)
		return err_set(err, ERR_INVAL, "not JSON: %s (line %d, column %d)", je.text, je.line,
		    je.column);
	if ((rc = jschema_grammar(schema, &text, err)) == 0)
		rc = engine_grammar(e, text, strlen(text), out, err);
	json_decref(schema);
	free(text);
	return rc;
}

int
sched_prompt_grammar(struct engine *e, const struct sched_job *job, struct cons_gram **out, char *err)
{
	const struct proto_req *r = &job->req;
	int rc;

	*out = NULL;
	if (r->grammar != NULL && (rc = engine_grammar(e, r->grammar, strlen(r->grammar), out, err)) != 0)
		return err_prefix(err, rc, "grammar");
	if ((r->json_schema != NULL || r->json) && (rc = schema_grammar(e, r->json_schema, out, err)) != 0)
		return err_prefix(err, rc, "json_schema");
	return 0;
}

/*
 * The template's text after a reply (Gemma's "<end_of_turn>\n"), as tokens,
 * so that a session's stored history is what the template would render.
 * An end-of-turn token the model generated itself is not repeated. A reply
 * with reasoning or tool text has none: its template renders it unlike it
 * was generated (the reasoning in a block that later turns drop), so its
 * next turn renders the conversation again (session_tokens) and does not
 * reuse the stored ids.
 */
void
sched_closing_tokens(const struct model_desc *md, const struct sched_job *job, const struct seq *q,
    int32_t **ids, size_t *n)
{
	const struct gentext_part *ans = &q->out.part[CHAT_PART_ANSWER];
	struct chat_msg *m, *m2;
	size_t n_msgs, a_len, b_len, skip = 0;
	char *a = NULL, *b = NULL;
	const char *last;

	*ids = NULL, *n = 0;
	if (q->out.part[CHAT_PART_REASONING].len > 0 || q->out.part[CHAT_PART_TOOL].len > 0)
		return;
	m = conversation(job, &n_msgs);
	m2 = xcalloc(n_msgs + 1, sizeof *m2);
	memcpy(m2, m, n_msgs * sizeof *m);
	m2[n_msgs] = (struct chat_msg){ "assistant", ans->text, NULL };
	if (render(md, m, n_msgs, 1, &b, &b_len, NULL) == 0 && render(md, m2, n_msgs + 1, 0, &a, &a_len, NULL) == 0 &&
	    a_len >= b_len + ans->len && memcmp(a, b, b_len) == 0 && memcmp(a + b_len, ans->text, ans->len) == 0) {
		last = q->n_tokens > 0 && tok_is_eog(md->tok, q->tokens[q->n_tokens - 1]) ?
		    tok_piece(md->tok, q->tokens[q->n_tokens - 1]) : NULL;
		if (last != NULL && strncmp(a + b_len + ans->len, last, strlen(last)) == 0)
			skip = strlen(last);
		if (a_len > b_len + ans->len + skip)
			tok_encode(md->tok, a + b_len + ans->len + skip, a_len - b_len - ans->len - skip, 1, 0,
			    ids, n, NULL);
	}
	free(a), free(b), free(m), free(m2);
}
