/*
 * api.c: OpenAI's JSON on one side, resident's generate fields on the other.
 * Parses and checks request bodies into a struct api_req and builds the
 * replies, stream chunks and error bodies. No I/O.
 *
 * Fields resident has no use for (user, metadata, store, ...) are ignored,
 * as the daemon ignores unknown fields; fields that would change the reply
 * in a way resident cannot honour (n > 1, functions, echo, ...) are refused
 * with a 400 that names them, so that a client never gets a reply it did
 * not ask for. Value ranges are the daemon's to check (PROTOCOL.md): its
 * invalid_param comes back as a 400 with its message.
 */
#include "config.h"
#include "openai.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* The numeric fields passed to generate; max_completion_tokens wins over max_tokens. */
static const struct api_num_field num_fields[] = {
	{ "max_completion_tokens", "max_tokens", API_NUM_POSITIVE },
	{ "max_tokens", "max_tokens", API_NUM_POSITIVE },
	{ "temperature", "temperature", API_NUM_FLOAT },
	{ "top_p", "top_p", API_NUM_FLOAT },
	{ "seed", "seed", API_NUM_SEED },
	{ "presence_penalty", "presence_penalty", API_NUM_FLOAT },
	{ "frequency_penalty", "frequency_penalty", API_NUM_FLOAT },
	/* not OpenAI's: resident's own sampling fields, for extra_body */
	{ "top_k", "top_k", API_NUM_UINT },
	{ "min_p", "min_p", API_NUM_FLOAT },
	{ "repeat_penalty", "repeat_penalty", API_NUM_FLOAT },
};

/* Whether r is OpenAI's /v1/completions, whose logprobs have their own shape and meaning. */
static int
openai_completion(const struct api_req *r)
{
	return r->kind == API_COMPLETION && r->dialect == API_OPENAI;
}

int
api_error_set(struct api_error *e, int status, const char *type, const char *param, const char *code,
    const char *fmt, ...)
{
	va_list ap;
	int n;

	e->status = status;
	e->type = type;
	e->param = param;
	e->code = code;
	va_start(ap, fmt);
	n = vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
	if (n >= (int)sizeof e->message)
		api_utf8_cut(e->message);
	return -1;
}

void
api_utf8_cut(char *s)
{
	size_t n = strlen(s), lead = n;
	unsigned char c;
	size_t want;

	/* the last character's lead byte, at most 3 continuation bytes back */
	while (lead > 0 && n - lead < 4 && ((unsigned char)s[lead - 1] & 0xc0) == 0x80)
		lead--;
	if (lead == 0)
		return;
	c = (unsigned char)s[lead - 1];
	want = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
	if (n - (lead - 1) < want)
		s[lead - 1] = '\0';
}

json_t *
api_field(const json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_null(v) ? NULL : v;
}

/* ---- parsing ---- */

const char *
api_think(const json_t *v, const char *const names[][2], size_t n)
{
	size_t i;

	for (i = 0; json_is_string(v) && i < n; i++)
		if (strcmp(json_string_value(v), names[i][0]) == 0)
			return names[i][1];
	return NULL;
}

/* The value v of field f into *n, checked for its kind. 0, or -1 with *e. */
static int
num_value(const json_t *v, const struct api_num_field *f, struct api_num *n, struct api_error *e)
{
	int least = f->kind == API_NUM_POSITIVE;

	n->key = f->key;
	if (f->kind == API_NUM_FLOAT) {
		if (!json_is_number(v))
			return api_bad(e, f->field, "%s must be a number", f->field);
		n->f = json_number_value(v);
		return 0;
	}
	if (!json_is_integer(v))
		return api_bad(e, f->field, "%s must be an integer", f->field);
	/* a negative seed stays a seed of its own: same seed, same output, as OpenAI's API has it */
	if (f->kind != API_NUM_SEED && json_integer_value(v) < least)
		return api_bad(e, f->field, "%s must be an integer of at least %d", f->field, least);
	n->is_uint = 1;
	n->u = (uint64_t)json_integer_value(v);
	return 0;
}

int
api_parse_nums(const json_t *o, const struct api_num_field *fields, size_t n_fields, struct api_req *r,
    struct api_error *e)
{
	json_t *v;
	size_t i;
	int j, dup;

	for (i = 0; i < n_fields && r->n_nums < API_MAX_NUMS; i++) {
		if ((v = api_field(o, fields[i].field)) == NULL)
			continue;
		for (j = 0, dup = 0; j < r->n_nums; j++)
			dup |= strcmp(r->nums[j].key, fields[i].key) == 0;
		if (dup)
			continue;
		if (num_value(v, &fields[i], &r->nums[r->n_nums], e) != 0)
			return -1;
		r->n_nums++;
	}
	return 0;
}

int
api_parse_stop(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *v = api_field(o, "stop"), *s;
	size_t i, n;

	if (v == NULL)
		return 0;
	if (!json_is_string(v) && !json_is_array(v))
		return api_bad(e, "stop", "stop must be a string or an array of strings");
	n = json_is_string(v) ? 1 : json_array_size(v);
	if ((r->stop = calloc(n ? n : 1, sizeof *r->stop)) == NULL)
		return api_nomem(e);
	for (i = 0; i < n; i++) {
		s = json_is_string(v) ? v : json_array_get(v, i);
		if (!json_is_string(s))
			return api_bad(e, "stop", "stop must be a string or an array of strings");
		if ((r->stop[r->n_stop++] = strdup(json_string_value(s))) == NULL)
			return api_nomem(e);
	}
	return 0;
}

/* A true or nonzero value of a field resident cannot honour. */
static int
given(const json_t *v)
{
	if (v == NULL || json_is_false(v))
		return 0;
	if (json_is_integer(v))
		return json_integer_value(v) != 0;
	if (json_is_string(v))
		return json_string_length(v) > 0;
	if (json_is_array(v))
		return json_array_size(v) > 0;
	if (json_is_object(v))
		return json_object_size(v) > 0;
	return 1;
}

/* Refuses the fields that ask for what resident does not do. */
static int
refuse_unsupported(const json_t *o, struct api_error *e)
{
	static const char *const fields[] = {
		"echo", "suffix", "functions", "logit_bias",
	};
	json_t *v;
	size_t i;

	for (i = 0; i < sizeof fields / sizeof fields[0]; i++)
		if (given(api_field(o, fields[i])))
			return api_bad(e, fields[i], "%s is not supported by resident-http", fields[i]);
	if ((v = api_field(o, "best_of")) != NULL && (!json_is_integer(v) || json_integer_value(v) != 1))
		return api_bad(e, "best_of", "best_of must be 1");
	return 0;
}

/* n: the choices to make of the prompt, 1..API_MAX_CHOICES (the daemon forks them from one prefill). */
static int
parse_choices(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *v = api_field(o, "n");

	r->n = 1;
	if (v == NULL)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > API_MAX_CHOICES)
		return api_bad(e, "n", "n must be an integer from 1 to %d: the choices to make", API_MAX_CHOICES);
	r->n = (int)json_integer_value(v);
	return 0;
}

/*
 * reasoning_effort (chat): the daemon's think. "none" is false (Qwen3
 * answers at once), "minimal" the lowest effort gpt-oss has.
 */
static int
parse_effort(const json_t *o, struct api_req *r, struct api_error *e)
{
	static const char *const names[][2] = { { "none", "off" }, { "minimal", "low" }, { "low", "low" },
		{ "medium", "medium" }, { "high", "high" } };
	json_t *v = api_field(o, "reasoning_effort");

	if (v == NULL || (r->think = api_think(v, names, sizeof names / sizeof names[0])) != NULL)
		return 0;
	return api_bad(e, "reasoning_effort", "reasoning_effort must be \"none\", \"minimal\", \"low\", \"medium\" or "
	    "\"high\"");
}

/* response_format json_schema: {name, schema, strict}; the schema goes to the daemon as JSON text. */
static int
parse_json_schema(const json_t *js, struct api_req *r, struct api_error *e)
{
	json_t *schema = api_field(js, "schema");

	if (!json_is_object(js))
		return api_bad(e, "response_format", "response_format.json_schema must be an object: "
		    "{name, schema, strict}");
	if (!json_is_object(schema) && !json_is_boolean(schema))
		return api_bad(e, "response_format", "response_format.json_schema.schema must be a JSON Schema "
		    "(an object)");
	r->constraint = "json_schema";
	if ((r->constraint_text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY)) == NULL)
		return api_nomem(e);
	return 0;
}

/*
 * The output's constraint: response_format text (none), json_object or
 * json_schema, or resident's own grammar (extra_body); at most one. The
 * daemon always holds the output to the schema, whatever strict says.
 */
static int
parse_constraint(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *rf = api_field(o, "response_format"), *g = api_field(o, "grammar");
	const char *type;

	if (g != NULL && !json_is_string(g))
		return api_bad(e, "grammar", "grammar must be a string: the text of a grammar");
	if (g != NULL) {
		r->constraint = "grammar";
		if ((r->constraint_text = strdup(json_string_value(g))) == NULL)
			return api_nomem(e);
	}
	if (rf == NULL)
		return 0;
	if (!json_is_object(rf) || !json_is_string(json_object_get(rf, "type")))
		return api_bad(e, "response_format", "response_format must be an object with a type: \"text\", "
		    "\"json_object\" or \"json_schema\"");
	type = json_string_value(json_object_get(rf, "type"));
	if (strcmp(type, "text") == 0)
		return 0;
	if (strcmp(type, "json_object") != 0 && strcmp(type, "json_schema") != 0)
		return api_bad(e, "response_format", "response_format type '%s' is not supported: \"text\", "
		    "\"json_object\" or \"json_schema\"", type);
	if (r->constraint != NULL)
		return api_bad(e, "grammar", "grammar and a response_format of type %s: give one of them", type);
	if (strcmp(type, "json_object") == 0) {
		r->constraint = "json";
		return 0;
	}
	return parse_json_schema(json_object_get(rf, "json_schema"), r, e);
}

/* A message's content: a string, or an array of text parts (joined by newlines). */
static char *
message_content(const json_t *c, size_t i, struct api_error *e)
{
	json_t *part, *text;
	size_t k, len = 0, n;
	char *s, *p;

	if (json_is_string(c))
		return strdup(json_string_value(c));
	if (!json_is_array(c)) {
		api_bad(e, "messages", "messages[%zu].content must be a string or an array of text parts", i);
		return NULL;
	}
	json_array_foreach(c, k, part) {
		text = json_object_get(part, "text");
		if (!json_is_string(json_object_get(part, "type")) ||
		    strcmp(json_string_value(json_object_get(part, "type")), "text") != 0 || !json_is_string(text)) {
			api_bad(e, "messages", "messages[%zu].content[%zu]: only text parts are supported", i, k);
			return NULL;
		}
		len += json_string_length(text) + 1;
	}
	if ((s = p = malloc(len + 1)) == NULL)
		return NULL;
	json_array_foreach(c, k, part) {
		if (k > 0)
			*p++ = '\n';
		text = json_object_get(part, "text");
		n = json_string_length(text);
		memcpy(p, json_string_value(text), n);
		p += n;
	}
	*p = '\0';
	return s;
}

/* The role names resident knows; developer is OpenAI's newer name for system. */
static const char *
message_role(const char *role)
{
	if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0)
		return "system";
	if (strcmp(role, "user") == 0)
		return "user";
	if (strcmp(role, "assistant") == 0)
		return "assistant";
	if (strcmp(role, "tool") == 0)
		return "tool";
	return NULL;
}

int
api_parse_messages(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *a = api_field(o, "messages"), *m, *role, *content;
	size_t i;

	if (a == NULL)
		return api_bad(e, "messages", "messages is required");
	if (!json_is_array(a) || json_array_size(a) == 0)
		return api_bad(e, "messages", "messages must be a non-empty array");
	if ((r->msgs = calloc(json_array_size(a), sizeof *r->msgs)) == NULL)
		return api_nomem(e);
	json_array_foreach(a, i, m) {
		role = json_object_get(m, "role");
		if (!json_is_object(m) || !json_is_string(role))
			return api_bad(e, "messages", "messages[%zu] must be an object with a role", i);
		if ((r->msgs[i].role = message_role(json_string_value(role))) == NULL)
			return api_bad(e, "messages", "messages[%zu]: role '%s' is not supported (system, developer, "
			    "user, assistant, tool)", i, json_string_value(role));
		r->n_msgs = i + 1;
		if (api_tools_message(m, i, &r->msgs[i], e) != 0)
			return -1;
		/* an assistant message with tool_calls may have no content */
		if ((content = api_field(m, "content")) == NULL && r->msgs[i].n_calls == 0)
			return api_bad(e, "messages", "messages[%zu] has no content", i);
		r->msgs[i].content = content == NULL ? strdup("") : message_content(content, i, e);
		if (r->msgs[i].content == NULL)
			return e->message[0] ? -1 : api_nomem(e);
	}
	return 0;
}

/* prompt: a string, or an array of one string. */
static int
parse_prompt(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *p = api_field(o, "prompt");

	if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
		p = json_array_get(p, 0);
	if (!json_is_string(p))
		return api_bad(e, "prompt", "prompt must be a string (or an array of one string)");
	if ((r->prompt = strdup(json_string_value(p))) == NULL)
		return api_nomem(e);
	return 0;
}

/* A session's uuid in the protocol's form (lowercased here), or "new". */
static int
valid_session(char *s)
{
	static const char form[] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
	size_t i;

	if (strcmp(s, "new") == 0)
		return 1;
	if (strlen(s) != sizeof form - 1)
		return 0;
	for (i = 0; s[i]; i++) {
		s[i] = (char)tolower((unsigned char)s[i]);
		if (form[i] == '-' ? s[i] != '-' : !isxdigit((unsigned char)s[i]))
			return 0;
	}
	return 1;
}

/* The session named by the body's `session` and the X-Resident-Session header. */
static int
parse_session(const json_t *o, const char *header, struct api_req *r, struct api_error *e)
{
	json_t *v = api_field(o, "session");
	const char *s = header;

	if (v != NULL && !json_is_string(v))
		return api_bad(e, "session", "session must be a string: a session's id, or \"new\"");
	if (v != NULL && header != NULL && strcmp(json_string_value(v), header) != 0)
		return api_bad(e, "session", "the session field and the X-Resident-Session header differ");
	if (v != NULL)
		s = json_string_value(v);
	if (s == NULL)
		return 0;
	if ((r->session = strdup(s)) == NULL)
		return api_nomem(e);
	if (!valid_session(r->session))
		return api_bad(e, "session", "session must be a session's id (8-4-4-4-12 hex digits) or \"new\"");
	if (r->kind != API_CHAT)
		return api_bad(e, "session", "a session continues a conversation: use /v1/chat/completions");
	/* a new session keeps a leading system message as its system prompt */
	if (strcmp(r->session, "new") == 0 && strcmp(r->msgs[0].role, "system") == 0) {
		if (r->n_msgs < 2)
			return api_bad(e, "messages", "messages must hold more than the system message");
		r->system = r->msgs[0].content;
		memmove(r->msgs, r->msgs + 1, --r->n_msgs * sizeof *r->msgs);
	}
	return 0;
}

/* stream and stream_options.include_usage. */
static int
parse_stream(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *v = api_field(o, "stream"), *so = api_field(o, "stream_options"), *iu;

	if (v != NULL && !json_is_boolean(v))
		return api_bad(e, "stream", "stream must be a boolean");
	r->stream = json_is_true(v);
	if (so == NULL)
		return 0;
	if (!r->stream)
		return api_bad(e, "stream_options", "stream_options is only allowed when stream is true");
	iu = api_field(so, "include_usage");
	if (!json_is_object(so) || (iu != NULL && !json_is_boolean(iu)))
		return api_bad(e, "stream_options", "stream_options must be {\"include_usage\": bool}");
	r->include_usage = json_is_true(iu);
	return 0;
}

/*
 * logprobs. Chat: logprobs (bool) and top_logprobs (0..20, with logprobs
 * true). Completions: logprobs N (0..5), the number of top tokens; their
 * top_logprobs is not a field.
 */
/* The number of top tokens of the field name: an integer from 0 to max, into *n. */
static int
parse_top_count(const json_t *v, const char *name, int max, int *n, struct api_error *e)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
		return api_bad(e, name, "%s must be an integer from 0 to %d", name, max);
	*n = (int)json_integer_value(v);
	return 0;
}

int
api_parse_logprobs(const json_t *o, struct api_req *r, struct api_error *e)
{
	json_t *lp = api_field(o, "logprobs"), *top = api_field(o, "top_logprobs");
	int n;

	if (openai_completion(r)) {
		if (top != NULL)
			return api_bad(e, "top_logprobs", "top_logprobs is a field of chat completions: here logprobs "
			    "is the number of top tokens (0..%d)", API_MAX_CMPL_LOGPROBS);
		if (lp == NULL)
			return 0;
		if (parse_top_count(lp, "logprobs", API_MAX_CMPL_LOGPROBS, &r->top_logprobs, e) != 0)
			return -1;
		r->logprobs = 1;
		return 0;
	}
	if (lp != NULL && !json_is_boolean(lp))
		return api_bad(e, "logprobs", "logprobs must be a boolean");
	r->logprobs = json_is_true(lp);
	if (top == NULL)
		return 0;
	if (parse_top_count(top, "top_logprobs", API_MAX_TOP_LOGPROBS, &n, e) != 0)
		return -1;
	if (!r->logprobs && n > 0)
		return api_bad(e, "top_logprobs", "top_logprobs needs logprobs: true");
	r->top_logprobs = n;
	return 0;
}

json_t *
api_body(const char *body, size_t len, struct api_error *e)
{
	json_error_t je;
	json_t *o;

	if ((o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je)) == NULL) {
		api_bad(e, NULL, "the body is not valid JSON: %s (at byte %d)", je.text, je.position);
		return NULL;
	}
	if (!json_is_object(o)) {
		json_decref(o);
		api_bad(e, NULL, "the body must be a JSON object");
		return NULL;
	}
	return o;
}

int
api_parse(enum api_kind kind, const char *body, size_t len, const char *session_header,
    struct api_req *r, struct api_error *e)
{
	json_t *o, *model;
	int rc = -1;

	memset(r, 0, sizeof *r);
	e->message[0] = '\0';
	r->kind = kind;
	if ((o = api_body(body, len, e)) == NULL)
		return -1;
	if (!json_is_string(model = api_field(o, "model")) || json_string_length(model) == 0) {
		api_bad(e, "model", "model is required: one of the names of GET /v1/models");
		goto out;
	}
	if ((r->model = strdup(json_string_value(model))) == NULL) {
		api_nomem(e);
		goto out;
	}
	if ((kind == API_CHAT ? api_parse_messages(o, r, e) : parse_prompt(o, r, e)) != 0 ||
	    parse_session(o, session_header, r, e) != 0 || parse_stream(o, r, e) != 0 ||
	    api_parse_nums(o, num_fields, sizeof num_fields / sizeof num_fields[0], r, e) != 0 ||
	    api_parse_stop(o, r, e) != 0 || parse_constraint(o, r, e) != 0 ||
	    api_parse_logprobs(o, r, e) != 0 || parse_choices(o, r, e) != 0 || api_tools_parse(o, r, e) != 0 ||
	    (kind == API_CHAT && parse_effort(o, r, e) != 0) || refuse_unsupported(o, e) != 0)
		goto out;
	rc = 0;
out:
	json_decref(o);
	if (rc != 0)
		api_req_free(r);
	return rc;
}

void
api_req_free(struct api_req *r)
{
	size_t i;

	for (i = 0; i < r->n_msgs; i++)
		api_msg_free(&r->msgs[i]);
	for (i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->msgs), free(r->stop), free(r->model), free(r->asked), free(r->session), free(r->system);
	free(r->prompt);
	free(r->constraint_text), free(r->tools), free(r->tool_name);
	memset(r, 0, sizeof *r);
}

rs_params *
api_params(const struct api_req *r)
{
	rs_params *p = rs_params_new();
	rs_status st = p ? RS_OK : RS_ERR_NOMEM;
	size_t i;
	int j;

	if (st == RS_OK)
		st = rs_params_set_str(p, "model", r->model);
	if (st == RS_OK && r->prompt != NULL)
		st = rs_params_set_str(p, "prompt", r->prompt);
	for (i = 0; st == RS_OK && i < r->n_msgs; i++)
		st = api_message_params(p, &r->msgs[i]);
	if (st == RS_OK)
		st = api_tools_params(r, p);
	for (i = 0; st == RS_OK && i < r->n_stop; i++)
		st = rs_params_add_stop(p, r->stop[i]);
	for (j = 0; st == RS_OK && j < r->n_nums; j++)
		st = r->nums[j].is_uint ? rs_params_set_uint(p, r->nums[j].key, r->nums[j].u) :
		    rs_params_set_float(p, r->nums[j].key, r->nums[j].f);
	if (st == RS_OK && r->constraint != NULL)
		st = r->constraint_text != NULL ? rs_params_set_str(p, r->constraint, r->constraint_text) :
		    rs_params_set_bool(p, r->constraint, 1);
	if (st == RS_OK && r->logprobs)
		st = rs_params_set_bool(p, "logprobs", 1);
	if (st == RS_OK && r->top_logprobs > 0)
		st = rs_params_set_uint(p, "top_logprobs", (uint64_t)r->top_logprobs);
	if (st == RS_OK && r->n > 1)
		st = rs_params_set_uint(p, "n", (uint64_t)r->n);
	if (st == RS_OK && r->think != NULL)
		st = strcmp(r->think, "off") == 0 ? rs_params_set_bool(p, "think", 0) : rs_params_set_str(p, "think", r->think);
	if (st != RS_OK) {
		rs_params_free(p);
		return NULL;
	}
	return p;
}

void
api_meta_init(struct api_meta *m, enum api_kind kind, const char *model)
{
	static uint64_t counter;
	unsigned char b[12];
	size_t i;
	int n;

	/* ids need only be unique: a counter stands in if the kernel has no randomness to give */
	if (getrandom(b, sizeof b, GRND_NONBLOCK) != (ssize_t)sizeof b) {
		counter++;
		for (i = 0; i < sizeof b; i++)
			b[i] = (unsigned char)(i < 8 ? counter >> (8 * i) : (uint64_t)time(NULL) >> (8 * (i - 8)));
	}
	n = snprintf(m->id, sizeof m->id, "%s", kind == API_CHAT ? "chatcmpl-" : "cmpl-");
	for (i = 0; i < sizeof b; i++)
		n += snprintf(m->id + n, sizeof m->id - (size_t)n, "%02x", b[i]);
	m->created = (long long)time(NULL);
	m->model = model;
	m->session = NULL;
}

/* ---- replies ---- */

const char *
api_finish_reason(const char *finish)
{
	if (finish == NULL)
		return NULL;
	if (strcmp(finish, "stop") == 0)
		return "stop";
	if (strcmp(finish, "length") == 0 || strcmp(finish, "context") == 0)
		return "length";
	return NULL;
}

json_t *
api_text_json(const char *s)
{
	json_t *j = json_string(s ? s : "");

	return j ? j : json_string("");
}

static json_t *
usage_json(const struct api_usage *u)
{
	return json_pack("{sI sI sI s{sI}}", "prompt_tokens", (json_int_t)u->prompt,
	    "completion_tokens", (json_int_t)u->generated, "total_tokens", (json_int_t)(u->prompt + u->generated),
	    "prompt_tokens_details", "cached_tokens", (json_int_t)u->cached);
}

/* The fields every reply object starts with. */
static json_t *
reply_head(const struct api_meta *m, const char *object)
{
	json_t *o = json_pack("{ss ss sI ss}", "id", m->id, "object", object, "created",
	    (json_int_t)m->created, "model", m->model);

	if (o != NULL && m->session != NULL)
		json_object_set_new(o, "session", json_string(m->session));
	return o;
}

/* Sets a chat message's or delta's reasoning_content where there is reasoning. */
static void
set_reasoning(json_t *msg, const char *reasoning)
{
	if (reasoning != NULL && reasoning[0] != '\0')
		json_object_set_new(msg, "reasoning_content", api_text_json(reasoning));
}

/* A reply of no choices yet, with its usage (a whole reply's start, or a stream's usage chunk). */
static json_t *
usage_reply(const struct api_meta *m, const char *object, const struct api_usage *u)
{
	json_t *o = reply_head(m, object);

	json_object_set_new(o, "choices", json_array());
	json_object_set_new(o, "usage", usage_json(u));
	return o;
}

json_t *
api_reply(const struct api_req *r, const struct api_meta *m, const struct api_usage *u)
{
	return usage_reply(m, r->kind == API_CHAT ? "chat.completion" : "text_completion", u);
}

json_t *
api_add_choice(const struct api_req *r, json_t *reply, const char *text, const char *reasoning,
    const char *finish_reason)
{
	json_t *choices = json_object_get(reply, "choices"), *choice;
	json_int_t index = (json_int_t)json_array_size(choices);

	if (r->kind == API_CHAT) {
		choice = json_pack("{sI s{ss so} sn ss}", "index", index, "message", "role", "assistant",
		    "content", api_text_json(text), "logprobs", "finish_reason", finish_reason);
		set_reasoning(json_object_get(choice, "message"), reasoning);
	} else
		choice = json_pack("{sI so sn ss}", "index", index, "text", api_text_json(text), "logprobs",
		    "finish_reason", finish_reason);
	json_array_append_new(choices, choice);
	return choice;
}

json_t *
api_chunk(const struct api_req *r, const struct api_meta *m, int index, const char *text, const char *reasoning,
    int role, const char *finish_reason, json_t *logprobs)
{
	json_t *o = reply_head(m, r->kind == API_CHAT ? "chat.completion.chunk" : "text_completion");
	json_t *choice = json_pack("{sI so}", "index", (json_int_t)index, "logprobs", logprobs ? logprobs : json_null());
	json_t *delta;

	if (r->kind == API_CHAT) {
		delta = json_object();
		if (role)
			json_object_set_new(delta, "role", json_string("assistant"));
		set_reasoning(delta, reasoning);
		if (text != NULL)
			json_object_set_new(delta, "content", api_text_json(text));
		json_object_set_new(choice, "delta", delta);
	} else {
		json_object_set_new(choice, "text", api_text_json(text));
	}
	json_object_set_new(choice, "finish_reason", finish_reason ? json_string(finish_reason) : json_null());
	json_object_set_new(o, "choices", json_pack("[o]", choice));
	/* with include_usage every chunk has the field, null but in the last */
	if (r->include_usage)
		json_object_set_new(o, "usage", json_null());
	return o;
}

json_t *
api_usage_chunk(const struct api_req *r, const struct api_meta *m, const struct api_usage *u)
{
	return usage_reply(m, r->kind == API_CHAT ? "chat.completion.chunk" : "text_completion", u);
}

json_t *
api_model(const char *name)
{
	/* the daemon keeps no creation time of a model: 0 says so */
	return json_pack("{ss ss sI ss}", "id", name, "object", "model", "created", (json_int_t)0,
	    "owned_by", "resident");
}

json_t *
api_models(const json_t *list)
{
	json_t *data = json_array(), *m;
	size_t i;

	json_array_foreach(json_object_get(list, "models"), i, m)
		if (json_is_string(json_object_get(m, "name")))
			json_array_append_new(data, api_model(json_string_value(json_object_get(m, "name"))));
	return json_pack("{ss so}", "object", "list", "data", data);
}

json_t *
api_value_json(const rs_value *v)
{
	json_t *j, *item;
	size_t i;

	switch (rs_value_type(v)) {
	case RS_TYPE_BOOL: return json_boolean(rs_bool(v));
	case RS_TYPE_UINT: return json_integer((json_int_t)rs_uint(v));
	case RS_TYPE_INT: return json_integer((json_int_t)rs_int(v));
	case RS_TYPE_FLOAT: return json_real(rs_float(v));
	case RS_TYPE_STR: /* bin that is not UTF-8 (no op result here has any) is null */
		return (j = json_stringn(rs_str(v), rs_len(v))) != NULL ? j : json_null();
	case RS_TYPE_ARRAY:
	case RS_TYPE_MAP:
		j = rs_value_type(v) == RS_TYPE_MAP ? json_object() : json_array();
		for (i = 0; j != NULL && i < rs_len(v); i++) {
			if ((item = api_value_json(rs_at(v, i))) == NULL ||
			    (json_is_object(j) ? json_object_set_new(j, rs_key(v, i) ? rs_key(v, i) : "", item) :
			    json_array_append_new(j, item)) != 0)
				json_decref(j), j = NULL;
		}
		return j;
	default: return json_null();
	}
}

/* ---- logprobs ---- */

/*
 * Bytes as text the way Python's bytes.decode("utf-8", "replace") has it
 * (OpenAI's token strings): each maximal part of a sequence that cannot be
 * completed, and each byte that starts none, becomes one U+FFFD. Returns
 * a JSON string (it may hold U+0000), and its characters in *chars.
 */
static json_t *
token_string(const void *bytes, size_t len, size_t *chars)
{
	const unsigned char *b = bytes;
	unsigned char *out = malloc(len * 3 + 1), lo, hi;
	size_t i = 0, n = 0, k, need;
	json_t *j;

	*chars = 0;
	if (out == NULL)
		return NULL;
	while (i < len) {
		unsigned char c = b[i];

		lo = 0x80, hi = 0xbf;
		if (c < 0x80)
			need = 0;
		else if (c >= 0xc2 && c <= 0xdf)
			need = 1;
		else if (c >= 0xe0 && c <= 0xef)
			need = 2, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
		else if (c >= 0xf0 && c <= 0xf4)
			need = 3, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
		else
			need = (size_t)-1;
		/* k: the bytes of the sequence that are right, its lead byte included */
		for (k = 1; need != (size_t)-1 && k <= need && i + k < len; k++) {
			if (b[i + k] < lo || b[i + k] > hi)
				break;
			lo = 0x80, hi = 0xbf;
		}
		if (need != (size_t)-1 && k == need + 1) {
			memcpy(out + n, b + i, k);
			n += k;
		} else {
			memcpy(out + n, "\xef\xbf\xbd", 3);
			n += 3;
		}
		i += need == (size_t)-1 ? 1 : k;
		(*chars)++;
	}
	j = json_stringn((const char *)out, n);
	free(out);
	return j;
}

/* OpenAI's logprob: -9999.0 for one that is not finite (-inf: a token a grammar forbids). */
static json_t *
logprob_json(double lp)
{
	return json_real(isfinite(lp) ? lp : -9999.0);
}

/* Chat's {token, logprob, bytes} of a token. */
static json_t *
chat_token_json(const struct api_lp_token *t)
{
	const unsigned char *b = t->bytes;
	json_t *bytes = json_array(), *o;
	size_t i, chars;

	for (i = 0; bytes != NULL && i < t->len; i++)
		if (json_array_append_new(bytes, json_integer(b[i])) != 0)
			json_decref(bytes), bytes = NULL;
	o = json_pack("{so so so}", "token", token_string(t->bytes, t->len, &chars), "logprob",
	    logprob_json(t->logprob), "bytes", bytes);
	return o;
}

/* Makes the arrays of lp that a take left empty (or that were never made). */
static int
logprobs_arrays(const struct api_req *r, struct api_logprobs *lp)
{
	json_t **a[] = { &lp->content, &lp->tokens, &lp->token_logprobs, &lp->top_logprobs, &lp->text_offset };
	size_t i;

	for (i = openai_completion(r) ? 1 : 0; i < (openai_completion(r) ? 5 : 1); i++)
		if (*a[i] == NULL && (*a[i] = json_array()) == NULL)
			return -1;
	return 0;
}

static int
chat_logprobs_add(const struct api_req *r, struct api_logprobs *lp, const struct api_lp_token *tok,
    const struct api_lp_token *top, size_t n_top)
{
	json_t *entry = chat_token_json(tok), *tops = json_array();
	size_t i;
	int rc = -1;

	if (entry == NULL || tops == NULL)
		goto out;
	for (i = 0; i < n_top && i < (size_t)r->top_logprobs; i++)
		if (json_array_append_new(tops, chat_token_json(&top[i])) != 0)
			goto out;
	if (json_object_set(entry, "top_logprobs", tops) == 0 && json_array_append(lp->content, entry) == 0)
		rc = 0;
out:
	json_decref(entry);
	json_decref(tops);
	return rc;
}

static int
completion_logprobs_add(const struct api_req *r, struct api_logprobs *lp, const struct api_lp_token *tok,
    const struct api_lp_token *top, size_t n_top)
{
	json_t *tops = json_object(), *s;
	size_t i, chars, ignored;
	int rc = 0;

	if (tops == NULL)
		return -1;
	/* a string two top tokens share (two ends of characters, both U+FFFD) keeps the better one */
	for (i = 0; i < n_top && i < (size_t)r->top_logprobs && rc == 0; i++) {
		if ((s = token_string(top[i].bytes, top[i].len, &ignored)) == NULL)
			rc = -1;
		else if (json_object_get(tops, json_string_value(s)) == NULL)
			/* (a key ends at a U+0000: jansson before 2.14 has no other) */
			rc = json_object_set_new(tops, json_string_value(s), logprob_json(top[i].logprob));
		json_decref(s);
	}
	if (rc != 0 || (s = token_string(tok->bytes, tok->len, &chars)) == NULL) {
		json_decref(tops);
		return -1;
	}
	rc |= json_array_append_new(lp->tokens, s);
	rc |= json_array_append_new(lp->token_logprobs, logprob_json(tok->logprob));
	rc |= json_array_append_new(lp->top_logprobs, tops);
	rc |= json_array_append_new(lp->text_offset, json_integer((json_int_t)lp->offset));
	lp->offset += chars;
	return rc ? -1 : 0;
}

int
api_logprobs_add(const struct api_req *r, struct api_logprobs *lp, const struct api_lp_token *tok,
    const struct api_lp_token *top, size_t n_top)
{
	if (logprobs_arrays(r, lp) != 0)
		return -1;
	return openai_completion(r) ? completion_logprobs_add(r, lp, tok, top, n_top) :
	    chat_logprobs_add(r, lp, tok, top, n_top);
}

json_t *
api_logprobs_take(const struct api_req *r, struct api_logprobs *lp)
{
	json_t *o;

	if (logprobs_arrays(r, lp) != 0)
		return NULL;
	if (!openai_completion(r))
		o = json_pack("{so}", "content", lp->content);
	else
		o = json_pack("{so so so so}", "tokens", lp->tokens, "token_logprobs", lp->token_logprobs,
		    "top_logprobs", lp->top_logprobs, "text_offset", lp->text_offset);
	/* json_pack took the arrays, or freed them */
	lp->content = lp->tokens = lp->token_logprobs = lp->top_logprobs = lp->text_offset = NULL;
	return o;
}

void
api_logprobs_free(struct api_logprobs *lp)
{
	json_decref(lp->content);
	json_decref(lp->tokens);
	json_decref(lp->token_logprobs);
	json_decref(lp->top_logprobs);
	json_decref(lp->text_offset);
	memset(lp, 0, sizeof *lp);
}

void
api_set_logprobs(json_t *choice, json_t *logprobs)
{
	if (choice == NULL || logprobs == NULL)
		json_decref(logprobs);
	else
		json_object_set_new(choice, "logprobs", logprobs);
}

/* ---- errors ---- */

/* A daemon's or libresident's status as an HTTP error; code NULL: the protocol's own code. */
static const struct {
	rs_status st;
	int status;
	const char *type, *param, *code;
} status_errors[] = {
	{ RS_ERR_BAD_FRAME, 400, "invalid_request_error", NULL, NULL },
	{ RS_ERR_BAD_REQUEST, 400, "invalid_request_error", NULL, NULL },
	{ RS_ERR_UNKNOWN_OP, 400, "invalid_request_error", NULL, NULL },
	{ RS_ERR_INVALID_PARAM, 400, "invalid_request_error", NULL, NULL },
	{ RS_ERR_INVALID_UTF8, 400, "invalid_request_error", NULL, NULL },
	{ RS_ERR_DUPLICATE_ID, 400, "invalid_request_error", NULL, NULL },
	{ RS_ERR_CONTEXT_EXCEEDED, 400, "invalid_request_error", "messages", "context_length_exceeded" },
	{ RS_ERR_NOT_FOUND, 404, "invalid_request_error", NULL, NULL },
	{ RS_ERR_FRAME_TOO_LARGE, 413, "invalid_request_error", NULL, "request_too_large" },
	{ RS_ERR_OVERLOADED, 429, "rate_limit_error", NULL, NULL },
	{ RS_ERR_SESSION_BUSY, 409, "invalid_request_error", "session", NULL },
	{ RS_ERR_QUOTA_EXCEEDED, 429, "rate_limit_error", NULL, NULL },
	{ RS_ERR_STORAGE_FULL, 507, "server_error", NULL, NULL },
	{ RS_ERR_FRAME_TIMEOUT, 503, "server_error", NULL, NULL },
	{ RS_ERR_SHUTTING_DOWN, 503, "server_error", NULL, NULL },
	{ RS_ERR_CONNECT, 503, "server_error", NULL, "daemon_unavailable" },
	{ RS_ERR_IO, 502, "server_error", NULL, "daemon_connection_lost" },
	{ RS_ERR_PROTOCOL, 502, "server_error", NULL, "daemon_connection_lost" },
};

void
api_error_from_status(rs_status st, const char *message, struct api_error *e)
{
	const char *code = rs_status_code(st);
	size_t i;

	for (i = 0; i < sizeof status_errors / sizeof status_errors[0]; i++)
		if (status_errors[i].st == st) {
			api_error_set(e, status_errors[i].status, status_errors[i].type, status_errors[i].param,
			    status_errors[i].code ? status_errors[i].code : code, "%s", message);
			return;
		}
	/* model_error, internal, a code from a newer daemon, no memory */
	api_error_set(e, 500, "server_error", NULL, code ? code : "internal", "%s", message);
}

json_t *
api_error_json(const struct api_error *e)
{
	return json_pack("{s{so ss so so}}", "error", "message", api_text_json(e->message), "type", e->type,
	    "param", e->param ? json_string(e->param) : json_null(),
	    "code", e->code ? json_string(e->code) : json_null());
}
