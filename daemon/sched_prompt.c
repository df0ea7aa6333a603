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
#include "chat_tools.h"
#include "engine.h"
#include "jschema.h"
#include "model.h"
#include "tokenizer.h"
#include "util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* A message as the chat template takes it. */
static struct chat_msg
chat_msg_of(const struct proto_msg *p)
{
	return (struct chat_msg){ .role = p->role, .content = p->content, .reasoning = p->reasoning,
		.calls = p->calls, .n_calls = (size_t)p->n_calls, .tool_call_id = p->tool_call_id, .name = p->name };
}

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
		m[k++] = (struct chat_msg){ .role = "system", .content = job->session_system };
	for (i = 0; i < (size_t)job->n_history; i++)
		m[k++] = chat_msg_of(&job->history[i]);
	for (i = 0; i < (size_t)r->n_msgs; i++)
		m[k++] = chat_msg_of(&r->msgs[i]);
	*n = k;
	return m;
}

/* Whether the request's reply must be tool calls (tool_choice required, or a named tool). */
static int
call_required(const struct proto_req *r)
{
	return r->tools != NULL && r->tool_choice == TOOLS_REQUIRED;
}

/*
 * The tool the reply must call: the named one, or the only one offered;
 * NULL when any of several may be called.
 */
static const char *
the_tool(const struct proto_req *r, char buf[CHAT_MAX_TOOL_NAME + 1])
{
	json_t *a;
	int one;

	if (r->tool_name != NULL)
		return r->tool_name;
	a = chat_json(r->tools);
	if ((one = json_array_size(a) == 1))
		snprintf(buf, CHAT_MAX_TOOL_NAME + 1, "%s",
		    json_string_value(json_object_get(json_object_get(json_array_get(a, 0), "function"), "name")));
	json_decref(a);
	return one ? buf : NULL;
}

/*
 * Renders messages [0, n) through the model's template into a malloc'd
 * string: with the request's tools unless its tool_choice is none (the
 * model is then not shown them, so it answers), with the request's
 * think, and for a required call on Qwen3 without reasoning (its empty
 * think block, then the call).
 */
static int
render(const struct model_desc *md, const struct sched_job *job, const struct chat_msg *m, size_t n, int gen,
    char **text, size_t *len, char *err)
{
	const struct proto_req *r = &job->req;
	struct chat_opts o = {
		.add_generation_prompt = gen,
		.bos_text = tok_piece(md->tok, tok_bos(md->tok)),
		.tools = r->tool_choice != TOOLS_NONE ? r->tools : NULL,
		.think = gen && call_required(r) && md->chat == CHAT_QWEN3 ? THINK_OFF : r->think,
	};

	return chat_render_opts(md->chat, m, n, &o, text, len, err);
}

int
sched_tool_prefix(const struct model_desc *md, const struct sched_job *job, char **out, char *err)
{
	char name[CHAT_MAX_TOOL_NAME + 1];
	const char *tool;

	*out = NULL;
	if (!call_required(&job->req))
		return 0;
	if (md->chat == CHAT_MISTRAL) {
		*out = xstrdup("[TOOL_CALLS]");
	} else if (md->chat == CHAT_HARMONY) {
		if ((tool = the_tool(&job->req, name)) == NULL)
			return err_set(err, ERR_UNSUPPORTED, "the harmony template names the tool in its call's header, "
			    "of control tokens a grammar cannot generate: give tool_name (or one tool) with a "
			    "required call");
		*out = xmalloc(strlen(tool) + 64);
		sprintf(*out, " to=functions.%s<|channel|>commentary json<|message|>", tool);
	}
	return 0;
}

/*
 * Whether the stored ids may not be the rendering of the history this
 * request gets: it offers tools (which the families render at the start,
 * in the system turn or the first user turn, and a session does not keep),
 * or the history holds calls or results (rendered with the tools of their
 * own turns). Such a prompt is tokenized whole, as rendered now; the
 * prefix cache still finds what did not change.
 */
static int
tools_rendered(const struct sched_job *job)
{
	int i;

	if (job->req.tools != NULL && job->req.tool_choice != TOOLS_NONE)
		return 1;
	for (i = 0; i < job->n_history; i++)
		if (job->history[i].n_calls > 0 || strcmp(job->history[i].role, "tool") == 0)
			return 1;
	return 0;
}

/*
 * A session's prompt: its stored token ids, then the tokens of the text the
 * template adds for this turn's messages. So a resumed session sees exactly
 * the tokens it saw (and generated) before, whether its KV cache survived or
 * is rebuilt after a restart. Where the template does not simply append
 * (Mistral moves the system prompt to the last user turn; Qwen3 and
 * harmony drop a reply's reasoning once a user message follows it), or
 * where tools are rendered (tools_rendered), the whole conversation is
 * rendered again instead.
 */
static int
session_tokens(const struct model_desc *md, const struct sched_job *job, const struct chat_msg *m,
    size_t n_msgs, size_t n_prev, int32_t **ids, size_t *n, char *err)
{
	char *all = NULL, *prev = NULL, *prefix;
	size_t all_len, prev_len, n_new = 0;
	int32_t *new_ids = NULL;
	int rc;

	if ((rc = render(md, job, m, n_msgs, 1, &all, &all_len, err)) != 0)
		return rc;
	if ((rc = sched_tool_prefix(md, job, &prefix, err)) != 0) {
		free(all);
		return rc;
	}
	if (prefix != NULL) {
		all = xrealloc(all, all_len + strlen(prefix) + 1);
		memcpy(all + all_len, prefix, strlen(prefix) + 1);
		all_len += strlen(prefix);
		free(prefix);
	}
	if (job->history_tokens > 0 && !tools_rendered(job) &&
	    render(md, job, m, n_prev, 0, &prev, &prev_len, err) == 0 &&
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

/* ---- tool calls ---- */

/* Points each "$ref": "#..." in v at the same place under base, where v now sits in a larger schema. */
static void
rebase_refs(json_t *v, const char *base)
{
	const char *key, *ref;
	json_t *x;
	size_t i;
	char *to;

	if (json_is_array(v)) {
		json_array_foreach(v, i, x)
			rebase_refs(x, base);
		return;
	}
	json_object_foreach(v, key, x) {
		ref = json_string_value(x);
		if (strcmp(key, "$ref") == 0 && ref != NULL && ref[0] == '#') {
			to = xmalloc(strlen(base) + strlen(ref) + 1);
			sprintf(to, "%s%s", base, ref + 1);
			json_object_set_new(v, key, json_string(to));
			free(to);
		} else {
			rebase_refs(x, base);
		}
	}
}

/* The schema of one call of fn: {"name": its name, key: its parameters}, placed at pointer at. */
static json_t *
call_schema(const json_t *fn, const char *key, const char *at)
{
	const json_t *params = json_object_get(fn, "parameters");
	json_t *args = params != NULL ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
	char *base = xmalloc(strlen(at) + strlen(key) + 16);

	sprintf(base, "%s/properties/%s", at, key);
	rebase_refs(args, base);
	free(base);
	return json_pack("{s:s,s:{s:{s:O},s:o},s:[s,s],s:b}", "type", "object", "properties", "name", "const",
	    json_object_get(fn, "name"), key, args, "required", "name", key, "additionalProperties", 0);
}

/*
 * The JSON Schema of one call the family writes, of the tool named only or
 * any of the tools: Qwen's {"name", "arguments"}, Llama 3.1's and Gemma's
 * {"name", "parameters"}, Mistral's array of {"name", "arguments"}, and for
 * harmony (whose header names the tool) the arguments alone.
 */
static json_t *
calls_schema(enum chat_tmpl t, const json_t *tools, const char *only)
{
	const char *key = t == CHAT_LLAMA3 || t == CHAT_GEMMA ? "parameters" : "arguments";
	const char *top = t == CHAT_MISTRAL ? "#/items" : "#";
	json_t *alts = json_array(), *s, *fn;
	char at[64];
	size_t i, k = 0;

	json_array_foreach(tools, i, fn) {
		fn = json_object_get(fn, "function");
		if (only != NULL && strcmp(json_string_value(json_object_get(fn, "name")), only) != 0)
			continue;
		if (t == CHAT_HARMONY) {
			json_decref(alts);
			s = json_object_get(fn, "parameters");
			return s != NULL ? json_deep_copy(s) : json_pack("{s:s}", "type", "object");
		}
		snprintf(at, sizeof at, only != NULL ? "%s" : "%s/anyOf/%zu", top, k++);
		json_array_append_new(alts, call_schema(fn, key, at));
	}
	s = only != NULL ? json_incref(json_array_get(alts, 0)) : json_pack("{s:O}", "anyOf", alts);
	json_decref(alts);
	return t == CHAT_MISTRAL ? json_pack("{s:s,s:o,s:i}", "type", "array", "items", s, "minItems", 1) : s;
}

/* The grammar text around the calls' rule tool-call: each family's wrapper. */
static const char *
calls_wrapper(enum chat_tmpl t)
{
	switch (t) {
	case CHAT_CHATML:
	case CHAT_QWEN3:
		return "root ::= tool-block ( \"\\n\" tool-block )*\n"
		    "tool-block ::= \"<tool_call>\\n\" tool-call \"\\n</tool_call>\"\n";
	case CHAT_MISTRAL:
		/* after [TOOL_CALLS], which sched_tool_prefix put in the prompt */
		return "root ::= \" \" tool-call\n";
	default:
		return "root ::= tool-call\n";
	}
}

/* Each tool's parameters compile as a json_schema does (what a required call would be constrained by). */
static int
check_parameters(const json_t *tools, char *err)
{
	const json_t *fn, *params;
	char *text;
	size_t i;
	int rc;

	json_array_foreach(tools, i, fn) {
		fn = json_object_get(fn, "function");
		if ((params = json_object_get(fn, "parameters")) == NULL)
			continue;
		if ((rc = jschema_grammar(params, &text, err)) != 0)
			return err_prefix(err, rc, "tools: %s's parameters", json_string_value(json_object_get(fn, "name")));
		free(text);
	}
	return 0;
}

/* The grammar of a required call (tool_choice required or a named tool) over e's vocabulary. */
static int
calls_grammar(struct engine *e, const struct sched_job *job, struct cons_gram **out, char *err)
{
	const struct model_desc *md = engine_model(e);
	char name[CHAT_MAX_TOOL_NAME + 1], *rules = NULL;
	json_t *tools = chat_json(job->req.tools), *schema;
	struct strbuf text = { 0 };
	int rc;

	if ((rc = check_parameters(tools, err)) != 0 || !call_required(&job->req)) {
		json_decref(tools);
		return rc;
	}
	schema = calls_schema(md->chat, tools, md->chat == CHAT_HARMONY ? the_tool(&job->req, name) :
	    job->req.tool_name);
	if ((rc = jschema_grammar_rule(schema, "tool-call", &rules, err)) == 0) {
		strbuf_cat(&text, calls_wrapper(md->chat));
		strbuf_cat(&text, rules);
		rc = engine_grammar(e, text.s, text.n, out, err);
	}
	free(rules), free(text.s);
	json_decref(schema), json_decref(tools);
	return rc != 0 ? err_prefix(err, rc, "tools") : 0;
}

int
sched_prompt_grammar(struct engine *e, const struct sched_job *job, struct cons_gram **out, char *err)
{
	const struct proto_req *r = &job->req;
	const char *schema;
	int rc;

	*out = NULL;
	if (r->tools != NULL)
		return calls_grammar(e, job, out, err);
	if (r->grammar != NULL && (rc = engine_grammar(e, r->grammar, strlen(r->grammar), out, err)) != 0)
		return err_prefix(err, rc, "grammar");
	/* json alone: any JSON object */
	if (r->json_schema != NULL || r->json) {
		schema = r->json_schema != NULL ? r->json_schema : "{\"type\": \"object\"}";
		if ((rc = engine_schema(e, schema, strlen(schema), out, err)) != 0)
			return err_prefix(err, rc, "json_schema");
	}
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
	m2[n_msgs] = (struct chat_msg){ .role = "assistant", .content = ans->text };
	if (render(md, job, m, n_msgs, 1, &b, &b_len, NULL) == 0 &&
	    render(md, job, m2, n_msgs + 1, 0, &a, &a_len, NULL) == 0 &&
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
