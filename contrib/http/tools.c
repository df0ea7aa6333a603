/*
 * tools.c: OpenAI's tools, tool_choice, tool messages and tool_calls, to
 * and from resident's (PROTOCOL.md, Tool calls). The tools go to the
 * daemon as the JSON text it takes, in OpenAI's shape; it checks them. A
 * reply's calls come from the daemon's done (its tool_calls: id, name,
 * arguments as JSON text), whole: a stream gets them as one chunk of
 * delta.tool_calls before its finish_reason "tool_calls", which OpenAI's
 * clients accept as they accept arguments in pieces. No I/O.
 */
#include "config.h"
#include "openai.h"

#include <stdlib.h>
#include <string.h>

/* A copy of a JSON string member, NULL if it is not one. */
static char *
str_dup(const json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s != NULL ? strdup(s) : NULL;
}

/* tool_choice: "auto", "none", "required", or {"type": "function", "function": {"name"}}. */
static int
parse_choice(const json_t *c, struct api_req *r, struct api_error *e)
{
	static const char *const names[] = { "auto", "none", "required" };
	const char *name;

	if (json_is_string(c)) {
		for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
			if (strcmp(json_string_value(c), names[i]) == 0) {
				r->tool_choice = names[i];
				return 0;
			}
		return api_bad(e, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or "
		    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
	}
	name = json_string_value(json_object_get(json_object_get(c, "function"), "name"));
	if (!json_is_object(c) || name == NULL)
		return api_bad(e, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or "
		    "{\"type\": \"function\", \"function\": {\"name\": ...}}");
	if ((r->tool_name = strdup(name)) == NULL)
		return api_nomem(e);
	return 0;
}

int
api_tools_parse(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *tools = api_field(o, "tools"), *choice = api_field(o, "tool_choice");

	/* an empty list offers nothing, as none */
	if (json_is_array(tools) && json_array_size(tools) == 0)
		tools = NULL;
	if ((tools != NULL || choice != NULL) && r->kind != API_CHAT)
		return api_bad(e, tools ? "tools" : "tool_choice", "tools are for /v1/chat/completions");
	if (tools != NULL && !json_is_array(tools))
		return api_bad(e, "tools", "tools must be an array of {\"type\": \"function\", \"function\": "
		    "{name, description, parameters}}");
	if (choice != NULL && tools == NULL)
		return api_bad(e, "tool_choice", "tool_choice needs tools");
	if (tools != NULL && (r->tools = json_dumps(tools, JSON_COMPACT)) == NULL)
		return api_nomem(e);
	return choice != NULL ? parse_choice(choice, r, e) : 0;
}

/* One call of an assistant message: {id, type: "function", function: {name, arguments}}. */
static int
parse_call(const json_t *c, size_t i, size_t k, struct api_call *call, struct api_error *e)
{
	const json_t *fn = json_object_get(c, "function"), *args = json_object_get(fn, "arguments");

	if (!json_is_string(json_object_get(fn, "name")))
		return api_bad(e, "messages", "messages[%zu].tool_calls[%zu] must be {\"id\", \"type\": \"function\", "
		    "\"function\": {\"name\", \"arguments\"}}", i, k);
	call->id = str_dup(c, "id");
	call->name = str_dup(fn, "name");
	/* arguments are JSON text; an object given instead is taken as its text */
	call->arguments = json_is_string(args) ? strdup(json_string_value(args)) :
	    args != NULL ? json_dumps(args, JSON_COMPACT) : strdup("{}");
	if (call->name == NULL || call->arguments == NULL)
		return api_nomem(e);
	return 0;
}

int
api_tools_message(const json_t *m, size_t i, struct api_msg *msg, struct api_error *e)
{
	const json_t *calls = api_field(m, "tool_calls"), *c;
	size_t k;

	if (strcmp(msg->role, "tool") == 0) {
		/* the tool's name: OpenAI's name, Ollama's tool_name */
		const char *key = json_is_string(json_object_get(m, "name")) ? "name" : "tool_name";

		if (json_object_get(m, "tool_call_id") != NULL &&
		    (msg->tool_call_id = str_dup(m, "tool_call_id")) == NULL)
			return api_bad(e, "messages", "messages[%zu].tool_call_id must be a string", i);
		if (json_is_string(json_object_get(m, key)) && (msg->name = str_dup(m, key)) == NULL)
			return api_nomem(e);
		return 0;
	}
	if (calls == NULL)
		return 0;
	if (!json_is_array(calls) || strcmp(msg->role, "assistant") != 0)
		return api_bad(e, "messages", "messages[%zu].tool_calls must be an array, on an assistant message", i);
	if ((msg->calls = calloc(json_array_size(calls) + 1, sizeof *msg->calls)) == NULL)
		return api_nomem(e);
	json_array_foreach(calls, k, c) {
		msg->n_calls = k + 1;
		if (parse_call(c, i, k, &msg->calls[k], e) != 0)
			return -1;
	}
	return 0;
}

void
api_msg_free(struct api_msg *m)
{
	for (size_t k = 0; k < m->n_calls; k++)
		free(m->calls[k].id), free(m->calls[k].name), free(m->calls[k].arguments);
	free(m->calls), free(m->content), free(m->tool_call_id), free(m->name);
	memset(m, 0, sizeof *m);
}

rs_status
api_message_params(rs_params *p, const struct api_msg *m)
{
	rs_params *msg;
	rs_status st;
	size_t k;

	if (m->n_calls == 0 && m->tool_call_id == NULL && m->name == NULL)
		return rs_params_add_message(p, m->role, m->content);
	if ((msg = rs_params_new()) == NULL)
		return RS_ERR_NOMEM;
	st = rs_params_set_str(msg, "role", m->role);
	if (st == RS_OK)
		st = rs_params_set_str(msg, "content", m->content);
	for (k = 0; st == RS_OK && k < m->n_calls; k++)
		st = rs_params_add_call(msg, m->calls[k].id, m->calls[k].name, m->calls[k].arguments);
	if (st == RS_OK && m->tool_call_id != NULL)
		st = rs_params_set_str(msg, "tool_call_id", m->tool_call_id);
	if (st == RS_OK && m->name != NULL)
		st = rs_params_set_str(msg, "name", m->name);
	if (st == RS_OK)
		st = rs_params_add_map(p, "messages", msg);
	rs_params_free(msg);
	return st;
}

rs_status
api_tools_params(const struct api_req *r, rs_params *p)
{
	rs_status st = RS_OK;

	if (r->tools != NULL)
		st = rs_params_set_str(p, "tools", r->tools);
	if (st == RS_OK && r->tool_choice != NULL)
		st = rs_params_set_str(p, "tool_choice", r->tool_choice);
	if (st == RS_OK && r->tool_name != NULL)
		st = rs_params_set_str(p, "tool_name", r->tool_name);
	return st;
}

int
api_tools_may_call(const struct api_req *r, const char *text)
{
	static const char *const opens[] = { "{", "[", "```", "<|python_tag|>" };
	size_t n;

	if (r->tools == NULL || (r->tool_choice != NULL && strcmp(r->tool_choice, "none") == 0))
		return 0;
	text += strspn(text, " \t\r\n");
	n = strlen(text);
	for (size_t i = 0; i < sizeof opens / sizeof opens[0]; i++)
		if (strncmp(text, opens[i], n < strlen(opens[i]) ? n : strlen(opens[i])) == 0)
			return 1;
	return 0;
}

/* OpenAI's tool_calls of the daemon's calls: [{index?, id, type, function: {name, arguments}}]. */
static json_t *
calls_json(const rs_value *calls, int with_index)
{
	json_t *a = json_array(), *c;
	const rs_value *v;

	for (size_t i = 0; i < rs_len(calls); i++) {
		v = rs_at(calls, i);
		c = json_pack("{ss ss s{ss ss}}", "id", rs_str(rs_get(v, "id")), "type", "function", "function",
		    "name", rs_str(rs_get(v, "name")), "arguments", rs_str(rs_get(v, "arguments")));
		if (c != NULL && with_index)
			json_object_set_new(c, "index", json_integer((json_int_t)i));
		json_array_append_new(a, c);
	}
	return a;
}

int
api_blank(const char *s)
{
	return s == NULL || s[strspn(s, " \t\r\n")] == '\0';
}

void
api_set_tool_calls(json_t *choice, const rs_value *calls, int calls_in_text)
{
	json_t *msg = json_object_get(choice, "message");

	if (rs_len(calls) == 0 || msg == NULL)
		return;
	json_object_set_new(msg, "tool_calls", calls_json(calls, 0));
	if (calls_in_text || api_blank(json_string_value(json_object_get(msg, "content"))))
		json_object_set_new(msg, "content", json_null());
	json_object_set_new(choice, "finish_reason", json_string("tool_calls"));
}

json_t *
api_tool_chunk(const struct api_req *r, const struct api_meta *m, int index, const rs_value *calls)
{
	json_t *chunk = api_chunk(r, m, index, NULL, NULL, 0, NULL, NULL);
	json_t *delta = json_object_get(json_array_get(json_object_get(chunk, "choices"), 0), "delta");

	json_object_set_new(delta, "tool_calls", calls_json(calls, 1));
	return chunk;
}
