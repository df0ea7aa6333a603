/*
 * proto.c: frames to requests and replies to frames.
 *
 * A frame is first walked by a small structural scanner that checks every
 * container count against the bytes left and the nesting depth, so that
 * msgpack-c is never asked to allocate for an array a short frame only
 * claims to hold. Then each op's fields are read by one table-driven
 * routine: the type, the range, and UTF-8 of every string.
 */
#include "config.h"
#include "proto.h"
#include "chat_tools.h"
#include "util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 16
/*
 * Objects in one frame: a detokenize of the most tokens and room besides.
 * msgpack-c allocates 24-48 bytes an object, and a 16 MiB frame of one-byte
 * objects would otherwise cost hundreds of MiB and field look-ups through
 * maps of millions of keys.
 */
#define MAX_OBJECTS (2 * PROTO_MAX_TOKENS)

static const char *const op_names[OP_COUNT_] = {
	[OP_HELLO] = "hello", [OP_GENERATE] = "generate", [OP_CANCEL] = "cancel",
	[OP_SESSION_NEW] = "session.new", [OP_SESSION_LIST] = "session.list",
	[OP_SESSION_GET] = "session.get", [OP_SESSION_FORK] = "session.fork",
	[OP_SESSION_RENAME] = "session.rename", [OP_SESSION_DELETE] = "session.delete",
	[OP_MODEL_LIST] = "model.list", [OP_MODEL_LOAD] = "model.load", [OP_MODEL_UNLOAD] = "model.unload",
	[OP_MODEL_SHOW] = "model.show",
	[OP_TOKENIZE] = "tokenize", [OP_DETOKENIZE] = "detokenize", [OP_STATUS] = "status",
	[OP_EMBED] = "embed",
};

static const char *const err_names[PE_COUNT_] = {
	[PE_NONE] = "none", [PE_BAD_FRAME] = "bad_frame", [PE_FRAME_TOO_LARGE] = "frame_too_large",
	[PE_BAD_REQUEST] = "bad_request", [PE_UNKNOWN_OP] = "unknown_op",
	[PE_INVALID_PARAM] = "invalid_param", [PE_INVALID_UTF8] = "invalid_utf8",
	[PE_CONTEXT_EXCEEDED] = "context_exceeded", [PE_NOT_FOUND] = "not_found",
	[PE_DUPLICATE_ID] = "duplicate_id", [PE_OVERLOADED] = "overloaded",
	[PE_MODEL_ERROR] = "model_error", [PE_SHUTTING_DOWN] = "shutting_down",
	[PE_INTERNAL] = "internal", [PE_QUOTA_EXCEEDED] = "quota_exceeded", [PE_STORAGE_FULL] = "storage_full",
	[PE_SESSION_BUSY] = "session_busy", [PE_FRAME_TIMEOUT] = "frame_timeout", [PE_CANCELLED] = "cancelled",
};

const char *
proto_err_name(enum proto_err e)
{
	return err_names[e];
}

const char *
proto_op_name(enum proto_op op)
{
	return op_names[op];
}

/* ---- structural scan ---- */

/* Big-endian integer of n bytes at p. */
static uint64_t
be(const uint8_t *p, int n)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

/*
 * Reads one msgpack header at p: *skip is the bytes of payload after the
 * header (strings, bins, numbers), *items the objects that follow
 * (container elements). Returns the header size, or 0 if malformed or
 * truncated.
 */
static size_t
scan_header(const uint8_t *p, size_t left, uint64_t *skip, uint64_t *items)
{
	static const struct { uint8_t lo, hi; uint8_t hdr; int len_bytes; int kind; } forms[] = {
		/* kind: 0 fixed payload (len_bytes = payload size), 1 length-prefixed bytes,
		 * 2 array of len, 3 map of len, 4 ext with len + type byte, 5 fixext */
		{ 0xc0, 0xc0, 1, 0, 0 }, { 0xc2, 0xc3, 1, 0, 0 },
		{ 0xc4, 0xc4, 2, 1, 1 }, { 0xc5, 0xc5, 3, 2, 1 }, { 0xc6, 0xc6, 5, 4, 1 },
		{ 0xc7, 0xc7, 3, 1, 4 }, { 0xc8, 0xc8, 4, 2, 4 }, { 0xc9, 0xc9, 6, 4, 4 },
		{ 0xca, 0xca, 1, 4, 0 }, { 0xcb, 0xcb, 1, 8, 0 },
		{ 0xcc, 0xcc, 1, 1, 0 }, { 0xcd, 0xcd, 1, 2, 0 }, { 0xce, 0xce, 1, 4, 0 }, { 0xcf, 0xcf, 1, 8, 0 },
		{ 0xd0, 0xd0, 1, 1, 0 }, { 0xd1, 0xd1, 1, 2, 0 }, { 0xd2, 0xd2, 1, 4, 0 }, { 0xd3, 0xd3, 1, 8, 0 },
		{ 0xd4, 0xd4, 1, 2, 0 }, { 0xd5, 0xd5, 1, 3, 0 }, { 0xd6, 0xd6, 1, 5, 0 }, { 0xd7, 0xd7, 1, 9, 0 },
		{ 0xd8, 0xd8, 1, 17, 0 },
		{ 0xd9, 0xd9, 2, 1, 1 }, { 0xda, 0xda, 3, 2, 1 }, { 0xdb, 0xdb, 5, 4, 1 },
		{ 0xdc, 0xdc, 3, 2, 2 }, { 0xdd, 0xdd, 5, 4, 2 }, { 0xde, 0xde, 3, 2, 3 }, { 0xdf, 0xdf, 5, 4, 3 },
	};
	uint8_t c = p[0];
	size_t i;

	*skip = *items = 0;
	if (c <= 0x7f || c >= 0xe0)
		return 1;
	if (c >= 0xa0 && c <= 0xbf) {
		*skip = c & 0x1f;
		return 1;
	}
	if (c >= 0x90 && c <= 0x9f) {
		*items = c & 0x0f;
		return 1;
	}
	if (c >= 0x80 && c <= 0x8f) {
		*items = 2u * (c & 0x0f);
		return 1;
	}
	for (i = 0; i < ARRAY_LEN(forms); i++) {
		if (c < forms[i].lo || c > forms[i].hi)
			continue;
		if (left < forms[i].hdr)
			return 0;
		switch (forms[i].kind) {
		case 0: *skip = (uint64_t)forms[i].len_bytes; return 1;
		case 1: *skip = be(p + 1, forms[i].len_bytes); return forms[i].hdr;
		case 2: *items = be(p + 1, forms[i].len_bytes); return forms[i].hdr;
		case 3: *items = 2 * be(p + 1, forms[i].len_bytes); return forms[i].hdr;
		/* ext: hdr already counts the type byte; the length is the data's */
		default: *skip = be(p + 1, forms[i].len_bytes); return forms[i].hdr;
		}
	}
	return 0; /* 0xc1 is never used */
}

/*
 * Walks the objects of buf with an explicit stack of "objects still owed"
 * per level. Returns NULL if buf holds exactly one well-formed object whose
 * containers fit the bytes (each element takes at least one byte), nest
 * at most MAX_DEPTH deep and hold MAX_OBJECTS in all; else what is wrong.
 */
static const char *
scan_frame(const uint8_t *buf, size_t len)
{
	static const char *const bad = "the frame is not one well-formed msgpack object";
	static const char *const many = "the frame holds more msgpack objects than a request can use";
	uint64_t owed[MAX_DEPTH + 1], skip, items, total = 1;
	size_t pos = 0, h;
	int depth = 0;

	owed[0] = 1;
	while (depth > 0 || owed[0] > 0) {
		if (owed[depth] == 0) {
			depth--;
			continue;
		}
		if (pos >= len || (h = scan_header(buf + pos, len - pos, &skip, &items)) == 0)
			return bad;
		owed[depth]--;
		pos += h;
		if (skip > len - pos || items > len - pos)
			return bad;
		pos += (size_t)skip;
		if ((total += items) > MAX_OBJECTS)
			return many;
		if (items > 0) {
			if (depth == MAX_DEPTH)
				return bad;
			owed[++depth] = items;
		}
	}
	return pos == len ? NULL : bad;
}

/* ---- field access ---- */

/* The value of key k in map m, or NULL. */
static const msgpack_object *
map_get(const msgpack_object *m, const char *k)
{
	size_t n = strlen(k);
	uint32_t i;

	for (i = 0; i < m->via.map.size; i++) {
		const msgpack_object *key = &m->via.map.ptr[i].key;

		if (key->type == MSGPACK_OBJECT_STR && key->via.str.size == n &&
		    memcmp(key->via.str.ptr, k, n) == 0)
			return &m->via.map.ptr[i].val;
	}
	return NULL;
}

/* A copy of a msgpack string of at most max bytes, checked for UTF-8. */
static int
get_str_obj(const msgpack_object *o, const char *what, size_t max, char **out, char *err)
{
	if (o->type != MSGPACK_OBJECT_STR)
		return err_set(err, PE_BAD_REQUEST, "%s must be a string", what);
	if (o->via.str.size > max)
		return err_set(err, PE_INVALID_PARAM, "%s is %u bytes; at most %zu are allowed", what,
		    (unsigned)o->via.str.size, max);
	if (!utf8_valid(o->via.str.ptr, o->via.str.size))
		return err_set(err, PE_INVALID_UTF8, "%s is not valid UTF-8", what);
	if (memchr(o->via.str.ptr, '\0', o->via.str.size) != NULL)
		return err_set(err, PE_INVALID_PARAM, "%s contains a NUL character", what);
	*out = xstrndup(o->via.str.ptr, o->via.str.size);
	return 0;
}

/* An optional (or required) string field of at most max bytes. */
static int
get_str(const msgpack_object *m, const char *k, int required, size_t max, char **out, char *err)
{
	const msgpack_object *o = map_get(m, k);

	if (o == NULL || o->type == MSGPACK_OBJECT_NIL)
		return required ? err_set(err, PE_BAD_REQUEST, "field '%s' is required", k) : 0;
	return get_str_obj(o, k, max, out, err);
}

/* An optional unsigned integer field within [0, max]. *found tells if it was there. */
static int
get_uint(const msgpack_object *m, const char *k, uint64_t max, uint64_t *out, int *found, char *err)
{
	const msgpack_object *o = map_get(m, k);

	*found = 0;
	if (o == NULL || o->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		return err_set(err, PE_INVALID_PARAM, "%s must not be negative", k);
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return err_set(err, PE_BAD_REQUEST, "%s must be an unsigned integer", k);
	if (o->via.u64 > max)
		return err_set(err, PE_INVALID_PARAM, "%s = %llu is too large (at most %llu)", k,
		    (unsigned long long)o->via.u64, (unsigned long long)max);
	*out = o->via.u64;
	*found = 1;
	return 0;
}

/* An optional number field (integer or float), finite. */
static int
get_float(const msgpack_object *m, const char *k, float *out, int *found, char *err)
{
	const msgpack_object *o = map_get(m, k);
	double v;

	*found = 0;
	if (o == NULL || o->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
		v = o->via.f64;
	else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		v = (double)o->via.u64;
	else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		v = (double)o->via.i64;
	else
		return err_set(err, PE_BAD_REQUEST, "%s must be a number", k);
	if (!isfinite(v) || fabs(v) > 1e30)
		return err_set(err, PE_INVALID_PARAM, "%s must be a finite number", k);
	*out = (float)v;
	*found = 1;
	return 0;
}

/* An optional boolean field. */
static int
get_bool(const msgpack_object *m, const char *k, int *out, char *err)
{
	const msgpack_object *o = map_get(m, k);

	if (o == NULL || o->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (o->type != MSGPACK_OBJECT_BOOLEAN)
		return err_set(err, PE_BAD_REQUEST, "%s must be a boolean", k);
	*out = o->via.boolean;
	return 0;
}

/* ---- generate ---- */

/* Bytes of a call id or a tool message's tool_call_id. */
#define MAX_CALL_ID 64

/* One call of an assistant message's tool_calls: {id, name, arguments}; *bytes counts its arguments. */
static int
get_call(const msgpack_object *o, struct chat_call *c, size_t *bytes, char *err)
{
	int rc;

	if (o->type != MSGPACK_OBJECT_MAP)
		return err_set(err, PE_BAD_REQUEST, "must be a map");
	if ((rc = get_str(o, "id", 0, MAX_CALL_ID, &c->id, err)) != 0 ||
	    (rc = get_str(o, "name", 1, CHAT_MAX_TOOL_NAME, &c->name, err)) != 0 ||
	    (rc = get_str(o, "arguments", 1, PROTO_MAX_TEXT, &c->arguments, err)) != 0)
		return rc;
	if (!chat_tool_name_ok(c->name))
		return err_set(err, PE_INVALID_PARAM, "name must be 1..%d letters, digits, '_' or '-'",
		    CHAT_MAX_TOOL_NAME);
	*bytes += strlen(c->arguments);
	return chat_json_is_object(c->arguments) ? 0 : err_set(err, PE_INVALID_PARAM,
	    "arguments must be the JSON text of an object");
}

/* An assistant message's tool_calls a (given, not nil): [{id, name, arguments}, ...] */
static int
get_calls(const msgpack_object *a, struct proto_msg *msg, size_t *bytes, char *err)
{
	uint32_t i;
	int rc;

	if (a->type != MSGPACK_OBJECT_ARRAY)
		return err_set(err, PE_BAD_REQUEST, "tool_calls must be an array");
	if (a->via.array.size > CHAT_MAX_CALLS)
		return err_set(err, PE_INVALID_PARAM, "tool_calls holds %u calls; at most %d are allowed",
		    (unsigned)a->via.array.size, CHAT_MAX_CALLS);
	if (a->via.array.size > 0 && strcmp(msg->role, "assistant") != 0)
		return err_set(err, PE_INVALID_PARAM, "only an assistant message has tool_calls");
	msg->calls = xcalloc(a->via.array.size + 1, sizeof *msg->calls);
	for (i = 0; i < a->via.array.size; i++) {
		msg->n_calls = (int)i + 1;
		if ((rc = get_call(&a->via.array.ptr[i], &msg->calls[i], bytes, err)) != 0)
			return err_prefix(err, rc, "tool_calls[%u]", i);
	}
	return 0;
}

/*
 * One message: role, content, and a tool message's tool_call_id and name,
 * an assistant message's tool_calls (its content may then be left out).
 */
static int
get_message(const msgpack_object *e, struct proto_msg *msg, size_t *bytes, char *err)
{
	const msgpack_object *calls = map_get(e, "tool_calls");
	int rc, has_calls;

	if (calls != NULL && calls->type == MSGPACK_OBJECT_NIL)
		calls = NULL;
	has_calls = calls != NULL && calls->type == MSGPACK_OBJECT_ARRAY && calls->via.array.size > 0;
	if ((rc = get_str(e, "role", 1, SIZE_MAX, &msg->role, err)) != 0 ||
	    (rc = get_str(e, "content", !has_calls, PROTO_MAX_TEXT, &msg->content, err)) != 0)
		return rc;
	if (strcmp(msg->role, "system") != 0 && strcmp(msg->role, "user") != 0 &&
	    strcmp(msg->role, "assistant") != 0 && strcmp(msg->role, "tool") != 0)
		return err_set(err, PE_INVALID_PARAM, "role must be system, user, assistant or tool");
	if (msg->content == NULL)
		msg->content = xstrdup("");
	*bytes += strlen(msg->content);
	if (calls != NULL && (rc = get_calls(calls, msg, bytes, err)) != 0)
		return rc;
	if (strcmp(msg->role, "tool") != 0)
		return 0;
	if ((rc = get_str(e, "tool_call_id", 0, MAX_CALL_ID, &msg->tool_call_id, err)) != 0 ||
	    (rc = get_str(e, "name", 0, CHAT_MAX_TOOL_NAME, &msg->name, err)) != 0)
		return rc;
	return 0;
}

/* messages: [{role, content, ...}, ...] */
static int
get_messages(const msgpack_object *m, struct proto_req *r, char *err)
{
	const msgpack_object *a = map_get(m, "messages"), *e;
	size_t total = 0;
	uint32_t i;
	int rc;

	if (a == NULL || a->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (a->type != MSGPACK_OBJECT_ARRAY)
		return err_set(err, PE_BAD_REQUEST, "messages must be an array");
	if (a->via.array.size == 0 || a->via.array.size > PROTO_MAX_MSGS)
		return err_set(err, PE_INVALID_PARAM, "messages must hold 1..%d messages", PROTO_MAX_MSGS);
	r->msgs = xcalloc(a->via.array.size, sizeof *r->msgs);
	for (i = 0; i < a->via.array.size; i++) {
		e = &a->via.array.ptr[i];
		if (e->type != MSGPACK_OBJECT_MAP)
			return err_set(err, PE_BAD_REQUEST, "messages[%u] must be a map", i);
		r->n_msgs = (int)i + 1;
		if ((rc = get_message(e, &r->msgs[i], &total, err)) != 0)
			return err_prefix(err, rc, "messages[%u]", i);
	}
	if (total > PROTO_MAX_TEXT)
		return err_set(err, PE_INVALID_PARAM, "the messages' contents and tool call arguments are %zu bytes "
		    "together; at most %u are allowed", total, PROTO_MAX_TEXT);
	return 0;
}

/* stop: [string, ...] */
static int
get_stop(const msgpack_object *m, struct proto_req *r, char *err)
{
	const msgpack_object *a = map_get(m, "stop");
	uint32_t i;
	int rc;

	if (a == NULL || a->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (a->type != MSGPACK_OBJECT_ARRAY)
		return err_set(err, PE_BAD_REQUEST, "stop must be an array of strings");
	if (a->via.array.size > PROTO_MAX_STOP)
		return err_set(err, PE_INVALID_PARAM, "at most %d stop strings", PROTO_MAX_STOP);
	for (i = 0; i < a->via.array.size; i++) {
		if ((rc = get_str_obj(&a->via.array.ptr[i], "stop", SIZE_MAX, &r->stop[i], err)) != 0)
			return rc;
		r->n_stop = (int)i + 1;
		if (strlen(r->stop[i]) < 1 || strlen(r->stop[i]) > PROTO_MAX_STOP_LEN)
			return err_set(err, PE_INVALID_PARAM, "stop strings must be 1..%d bytes", PROTO_MAX_STOP_LEN);
	}
	return 0;
}

/* keep_alive: seconds the model stays loaded once unused (set only where given). */
static int
get_keep_alive(const msgpack_object *m, struct proto_req *r, char *err)
{
	int rc, found;

	if ((rc = get_float(m, "keep_alive", &r->keep_alive, &found, err)) != 0)
		return rc;
	r->set |= found ? SET_KEEP_ALIVE : 0;
	return 0;
}

/* The sampling fields; each one given is marked in r->set. */
static int
get_sampling(const msgpack_object *m, struct proto_req *r, char *err)
{
	static const struct { const char *k; size_t off; unsigned bit; } floats[] = {
		{ "temperature", offsetof(struct sample_params, temperature), SET_TEMPERATURE },
		{ "top_p", offsetof(struct sample_params, top_p), SET_TOP_P },
		{ "min_p", offsetof(struct sample_params, min_p), SET_MIN_P },
		{ "repeat_penalty", offsetof(struct sample_params, repeat_penalty), SET_REPEAT },
		{ "presence_penalty", offsetof(struct sample_params, presence_penalty), SET_PRESENCE },
		{ "frequency_penalty", offsetof(struct sample_params, frequency_penalty), SET_FREQUENCY },
	};
	uint64_t u;
	size_t i;
	int found, rc;

	for (i = 0; i < ARRAY_LEN(floats); i++) {
		if ((rc = get_float(m, floats[i].k, (float *)((char *)&r->sample + floats[i].off), &found, err)) != 0)
			return rc;
		r->set |= found ? floats[i].bit : 0;
	}
	if ((rc = get_uint(m, "top_k", 1u << 20, &u, &found, err)) != 0)
		return rc;
	if (found)
		r->sample.top_k = (int32_t)u, r->set |= SET_TOP_K;
	if ((rc = get_uint(m, "seed", UINT64_MAX, &u, &found, err)) != 0)
		return rc;
	if (found)
		r->sample.seed = u, r->set |= SET_SEED;
	if ((rc = get_uint(m, "max_tokens", 1u << 24, &u, &found, err)) != 0)
		return rc;
	if (found && u == 0)
		return err_set(err, PE_INVALID_PARAM, "max_tokens must be at least 1");
	if (found)
		r->max_tokens = (int32_t)u, r->set |= SET_MAX_TOKENS;
	return get_keep_alive(m, r, err);
}

/* tools (JSON text), tool_choice ("auto", "none", "required") and tool_name. */
static int
get_tools(const msgpack_object *m, struct proto_req *r, char *err)
{
	char *text = NULL, *choice = NULL;
	size_t n;
	int rc;

	if ((rc = get_str(m, "tools", 0, PROTO_MAX_TEXT, &text, err)) != 0 ||
	    (rc = get_str(m, "tool_choice", 0, SIZE_MAX, &choice, err)) != 0 ||
	    (rc = get_str(m, "tool_name", 0, CHAT_MAX_TOOL_NAME, &r->tool_name, err)) != 0)
		goto out;
	if (text != NULL && (rc = chat_tools_check(text, &r->tools, &n, err)) != 0) {
		rc = PE_INVALID_PARAM;
		goto out;
	}
	r->tool_choice = r->tool_name != NULL ? TOOLS_REQUIRED : TOOLS_AUTO;
	if (choice != NULL && strcmp(choice, "none") == 0 && r->tool_name == NULL)
		r->tool_choice = TOOLS_NONE;
	else if (choice != NULL && strcmp(choice, "required") == 0)
		r->tool_choice = TOOLS_REQUIRED;
	else if (choice != NULL && (strcmp(choice, "auto") != 0 || r->tool_name != NULL))
		rc = err_set(err, PE_INVALID_PARAM, "tool_choice must be \"auto\", \"none\" or \"required\" "
		    "(with tool_name: \"required\" or left out)");
	if (rc == 0 && (choice != NULL || r->tool_name != NULL) && r->tools == NULL)
		rc = err_set(err, PE_INVALID_PARAM, "tool_choice and tool_name need tools");
	else if (rc == 0 && r->tool_name != NULL && !chat_tools_has(r->tools, r->tool_name))
		rc = err_set(err, PE_INVALID_PARAM, "tool_name '%s' is none of the tools", r->tool_name);
out:
	free(text), free(choice);
	return rc;
}

/* think: true (the model's default), false, or "low", "medium", "high" (PROTOCOL.md, Reasoning). */
static int
get_think(const msgpack_object *m, struct proto_req *r, char *err)
{
	static const char *const efforts[] = { "low", "medium", "high" };
	const msgpack_object *o = map_get(m, "think");

	r->think = THINK_DEFAULT;
	if (o == NULL || o->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (o->type == MSGPACK_OBJECT_BOOLEAN) {
		r->think = o->via.boolean ? THINK_DEFAULT : THINK_OFF;
		return 0;
	}
	for (size_t i = 0; o->type == MSGPACK_OBJECT_STR && i < ARRAY_LEN(efforts); i++)
		if (o->via.str.size == strlen(efforts[i]) && memcmp(o->via.str.ptr, efforts[i], o->via.str.size) == 0) {
			r->think = (enum chat_think)(THINK_LOW + i);
			return 0;
		}
	return err_set(err, PE_INVALID_PARAM, "think must be true, false, \"low\", \"medium\" or \"high\"");
}

/* n: choices of the one prompt (PROTOCOL.md, Several choices). */
static int
get_choices(const msgpack_object *m, struct proto_req *r, char *err)
{
	uint64_t u = 1;
	int found, rc;

	if ((rc = get_uint(m, "n", UINT64_MAX, &u, &found, err)) != 0)
		return rc;
	if (u < 1 || u > PROTO_MAX_CHOICES)
		return err_set(err, PE_INVALID_PARAM, "n = %llu: n must be 1..%d (the choices to generate)",
		    (unsigned long long)u, PROTO_MAX_CHOICES);
	r->n_choices = (int)u;
	return 0;
}

/*
 * A field that is one of n words: *which gets its index, left as it is
 * when the field is absent.
 */
static int
get_word(const msgpack_object *m, const char *key, const char *const *words, int n, int *which, char *err)
{
	char *v = NULL, list[128] = "";
	int rc, i;

	if ((rc = get_str(m, key, 0, SIZE_MAX, &v, err)) != 0 || v == NULL)
		return rc;
	for (i = 0; i < n && strcmp(v, words[i]) != 0; i++)
		;
	if (i < n)
		*which = i;
	free(v);
	if (i < n)
		return 0;
	for (i = 0; i < n; i++)
		snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i == 0 ? "" : i < n - 1 ? ", " :
		    " or ", words[i]);
	return err_set(err, PE_INVALID_PARAM, "%s must be %s", key, list);
}

/* priority: "interactive" (the default) or "background". */
static int
get_priority(const msgpack_object *m, struct proto_req *r, char *err)
{
	static const char *const words[] = { "interactive", "background" };
	int background = 0, rc = get_word(m, "priority", words, 2, &background, err);

	r->priority = background ? PRIO_BACKGROUND : PRIO_INTERACTIVE;
	return rc;
}

/* speculative: "auto" (the default), "on" or "off" (enum spec_mode's order). */
static int
get_speculative(const msgpack_object *m, struct proto_req *r, char *err)
{
	static const char *const words[] = { "off", "auto", "on" };
	int mode = SPEC_AUTO, rc = get_word(m, "speculative", words, 3, &mode, err);

	r->speculative = (enum spec_mode)mode;
	return rc;
}

static int
decode_generate(const msgpack_object *m, struct proto_req *r, char *err)
{
	uint64_t top = 0;
	int rc, found;

	proto_sample_defaults(r);
	r->stream = 1;
	if ((rc = get_str(m, "prompt", 0, PROTO_MAX_TEXT, &r->prompt, err)) || (rc = get_messages(m, r, err)) ||
	    (rc = get_str(m, "session", 0, SIZE_MAX, &r->session, err)) ||
	    (rc = get_str(m, "model", 0, PROTO_MAX_MODEL, &r->model, err)) ||
	    (rc = get_sampling(m, r, err)) || (rc = get_stop(m, r, err)) ||
	    (rc = get_bool(m, "stream", &r->stream, err)) || (rc = get_bool(m, "logprobs", &r->logprobs, err)) ||
	    (rc = get_str(m, "grammar", 0, PROTO_MAX_TEXT, &r->grammar, err)) ||
	    (rc = get_str(m, "json_schema", 0, PROTO_MAX_TEXT, &r->json_schema, err)) ||
	    (rc = get_bool(m, "json", &r->json, err)))
		return rc;
	if ((rc = get_uint(m, "top_logprobs", PROTO_MAX_TOP_LOGPROBS, &top, &found, err)) != 0)
		return rc;
	r->top_logprobs = (int32_t)top;
	if (r->top_logprobs > 0 && !r->logprobs)
		return err_set(err, PE_INVALID_PARAM, "top_logprobs needs logprobs: true");
	if ((rc = get_choices(m, r, err)) != 0 || (rc = get_think(m, r, err)) != 0)
		return rc;
	if (proto_constraints(r) > 1)
		return err_set(err, PE_BAD_REQUEST, "give at most one of 'grammar', 'json_schema' and 'json'");
	if ((rc = get_tools(m, r, err)) != 0)
		return rc;
	if (r->tool_choice == TOOLS_REQUIRED && proto_constraints(r) > 0)
		return err_set(err, PE_BAD_REQUEST, "a required tool call is constrained by the tools' parameters: "
		    "give no 'grammar', 'json_schema' or 'json' with it");
	if (r->tools != NULL && r->prompt != NULL)
		return err_set(err, PE_BAD_REQUEST, "tools are rendered by the chat template: give 'messages', "
		    "not 'prompt'");
	if ((rc = get_priority(m, r, err)) != 0 || (rc = get_speculative(m, r, err)) != 0 ||
	    (rc = get_str(m, "draft", 0, PROTO_MAX_MODEL, &r->draft, err)) != 0)
		return rc;
	/* else looked for as a model (a file '' in residentd's directory) and not found; "off" ignores any draft */
	if (r->draft != NULL && r->draft[0] == '\0' && r->speculative != SPEC_OFF)
		return err_set(err, PE_INVALID_PARAM, "draft is empty: give a model's name or path, or no draft");
	if ((r->prompt != NULL) == (r->msgs != NULL))
		return err_set(err, PE_BAD_REQUEST, "give exactly one of 'prompt' and 'messages'");
	if (r->session != NULL && r->prompt != NULL)
		return err_set(err, PE_BAD_REQUEST, "a session continues with 'messages', not 'prompt'");
	if (r->session != NULL && r->n_choices > 1)
		return err_set(err, PE_INVALID_PARAM, "n = %d with a session: a session has one history, so n must "
		    "be 1", r->n_choices);
	/* here, not only when the sequence starts: before the request can load a model or wait in the queue */
	if (sample_params_check(&r->sample, err) != 0)
		return PE_INVALID_PARAM;
	return 0;
}

/* ---- other ops ---- */

/* Turns the defaults map of session.new into JSON text (its sampling fields only). */
static int
decode_defaults(const msgpack_object *m, struct proto_req *r, char *err)
{
	const msgpack_object *d = map_get(m, "defaults");
	struct proto_req tmp;
	json_t *j;
	int rc;

	if (d == NULL || d->type == MSGPACK_OBJECT_NIL)
		return 0;
	if (d->type != MSGPACK_OBJECT_MAP)
		return err_set(err, PE_BAD_REQUEST, "defaults must be a map");
	memset(&tmp, 0, sizeof tmp);
	proto_sample_defaults(&tmp);
	if ((rc = get_sampling(d, &tmp, err)) != 0)
		return err_prefix(err, rc, "defaults");
	j = json_object();
	if (tmp.set & SET_TEMPERATURE) json_object_set_new(j, "temperature", json_real(tmp.sample.temperature));
	if (tmp.set & SET_TOP_K) json_object_set_new(j, "top_k", json_integer(tmp.sample.top_k));
	if (tmp.set & SET_TOP_P) json_object_set_new(j, "top_p", json_real(tmp.sample.top_p));
	if (tmp.set & SET_MIN_P) json_object_set_new(j, "min_p", json_real(tmp.sample.min_p));
	if (tmp.set & SET_REPEAT) json_object_set_new(j, "repeat_penalty", json_real(tmp.sample.repeat_penalty));
	if (tmp.set & SET_PRESENCE) json_object_set_new(j, "presence_penalty", json_real(tmp.sample.presence_penalty));
	if (tmp.set & SET_FREQUENCY) json_object_set_new(j, "frequency_penalty", json_real(tmp.sample.frequency_penalty));
	if (tmp.set & SET_SEED) json_object_set_new(j, "seed", json_integer((json_int_t)tmp.sample.seed));
	if (tmp.set & SET_MAX_TOKENS) json_object_set_new(j, "max_tokens", json_integer(tmp.max_tokens));
	if (tmp.set & SET_KEEP_ALIVE) json_object_set_new(j, "keep_alive", json_real(tmp.keep_alive));
	r->defaults = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(j);
	if ((rc = sample_params_check(&tmp.sample, err)) != 0)
		return err_prefix(err, PE_INVALID_PARAM, "defaults");
	return 0;
}

/* An array of token ids (what names it in messages) into *ids, *n. */
static int
get_ids(const msgpack_object *a, const char *what, int32_t **ids, size_t *n, char *err)
{
	uint32_t i;

	if (a == NULL || a->type != MSGPACK_OBJECT_ARRAY)
		return err_set(err, PE_BAD_REQUEST, "%s must be an array of token ids", what);
	if (a->via.array.size > PROTO_MAX_TOKENS)
		return err_set(err, PE_INVALID_PARAM, "%s holds %u ids; at most %u are allowed", what,
		    (unsigned)a->via.array.size, PROTO_MAX_TOKENS);
	*ids = xmalloc((a->via.array.size ? a->via.array.size : 1) * sizeof **ids);
	*n = a->via.array.size;
	for (i = 0; i < a->via.array.size; i++) {
		if (a->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
		    a->via.array.ptr[i].via.u64 > INT32_MAX)
			return err_set(err, PE_INVALID_PARAM, "%s[%u] is not a token id", what, i);
		(*ids)[i] = (int32_t)a->via.array.ptr[i].via.u64;
	}
	return 0;
}

/* tokens: [uint, ...] */
static int
get_tokens(const msgpack_object *m, struct proto_req *r, char *err)
{
	return get_ids(map_get(m, "tokens"), "tokens", &r->tokens, &r->n_tokens, err);
}

/* embed's input: a string, or an array of strings and arrays of token ids, none empty. */
static int
get_inputs(const msgpack_object *m, struct proto_req *r, char *err)
{
	const msgpack_object *a = map_get(m, "input");
	const msgpack_object *one;
	uint32_t n, i;
	char what[32];
	int rc = 0;

	if (a == NULL || (a->type != MSGPACK_OBJECT_ARRAY && a->type != MSGPACK_OBJECT_STR))
		return err_set(err, PE_BAD_REQUEST, "field 'input' (a string, or an array of strings or token id arrays) "
		    "is required");
	n = a->type == MSGPACK_OBJECT_STR ? 1 : a->via.array.size;
	if (n < 1 || n > PROTO_MAX_INPUTS)
		return err_set(err, PE_INVALID_PARAM, "input holds %u inputs; 1..%u are allowed", n, PROTO_MAX_INPUTS);
	r->inputs = xcalloc(n, sizeof *r->inputs);
	for (i = 0; i < n && rc == 0; i++, r->n_inputs++) {
		struct proto_input *in = &r->inputs[i];

		one = a->type == MSGPACK_OBJECT_STR ? a : &a->via.array.ptr[i];
		snprintf(what, sizeof what, "input[%u]", i);
		if (one->type == MSGPACK_OBJECT_ARRAY)
			rc = get_ids(one, what, &in->tokens, &in->n_tokens, err);
		else
			rc = get_str_obj(one, what, PROTO_MAX_TEXT, &in->text, err);
		if (rc == 0 && (in->text ? in->text[0] == '\0' : in->n_tokens == 0))
			rc = err_set(err, PE_INVALID_PARAM, "%s is empty", what);
	}
	return rc;
}

/* embed: input, dimensions, truncate, priority, keep_alive (model is every op's). */
static int
decode_embed(const msgpack_object *m, struct proto_req *r, char *err)
{
	uint64_t u;
	int rc, found;

	if ((rc = get_inputs(m, r, err)) || (rc = get_bool(m, "truncate", &r->truncate, err)) ||
	    (rc = get_priority(m, r, err)) ||
	    (rc = get_uint(m, "dimensions", 1u << 20, &u, &found, err)))
		return rc;
	if (found && u == 0)
		return err_set(err, PE_INVALID_PARAM, "dimensions must be at least 1");
	r->dimensions = found ? (int32_t)u : 0;
	return get_keep_alive(m, r, err);
}

/* The fields of every op but generate. */
static int
decode_other(const msgpack_object *m, struct proto_req *r, char *err)
{
	uint64_t u;
	int found, rc = 0, need_session;

	need_session = r->op == OP_SESSION_GET || r->op == OP_SESSION_FORK ||
	    r->op == OP_SESSION_RENAME || r->op == OP_SESSION_DELETE;
	r->bos = -1;
	r->limit = 100;
	if ((rc = get_str(m, "session", need_session, SIZE_MAX, &r->session, err)) ||
	    (rc = get_str(m, "model", r->op == OP_MODEL_LOAD || r->op == OP_MODEL_UNLOAD, PROTO_MAX_MODEL, &r->model,
	    err)) ||
	    (rc = get_str(m, "title", r->op == OP_SESSION_RENAME, SIZE_MAX, &r->title, err)) ||
	    (rc = get_str(m, "system", 0, SIZE_MAX, &r->system, err)) ||
	    (rc = get_str(m, "client", 0, PROTO_MAX_CLIENT, &r->client, err)) ||
	    (rc = get_bool(m, "special", &r->special, err)) || (rc = get_bool(m, "bos", &r->bos, err)))
		return rc;
	switch (r->op) {
	case OP_SESSION_NEW:
		return decode_defaults(m, r, err);
	case OP_SESSION_LIST:
		if ((rc = get_uint(m, "limit", PROTO_MAX_LIST, &u, &found, err)) != 0)
			return rc;
		r->limit = found ? (int)u : 100;
		if ((rc = get_uint(m, "offset", INT32_MAX, &u, &found, err)) != 0)
			return rc;
		r->offset = found ? (int)u : 0;
		return 0;
	case OP_CANCEL:
		if ((rc = get_uint(m, "target", UINT64_MAX, &r->target, &found, err)) != 0)
			return rc;
		return found ? 0 : err_set(err, PE_BAD_REQUEST, "field 'target' is required");
	case OP_TOKENIZE:
		return get_str(m, "text", 1, PROTO_MAX_TEXT, &r->text, err);
	case OP_DETOKENIZE:
		return get_tokens(m, r, err);
	case OP_EMBED:
		return decode_embed(m, r, err);
	default:
		return 0;
	}
}

int
proto_decode(const char *buf, size_t len, struct proto_req *r, int *has_id, char *err)
{
	msgpack_unpacked u;
	const msgpack_object *m, *id, *op;
	const char *why;
	size_t off = 0;
	int i, rc = 0;

	memset(r, 0, sizeof *r);
	*has_id = 0;
	if ((why = scan_frame((const uint8_t *)buf, len)) != NULL)
		return err_set(err, PE_BAD_FRAME, "%s", why);
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
		msgpack_unpacked_destroy(&u);
		return err_set(err, PE_BAD_FRAME, "the frame is not one msgpack object");
	}
	m = &u.data;
	if (m->type != MSGPACK_OBJECT_MAP) {
		rc = err_set(err, PE_BAD_FRAME, "the frame is not a msgpack map");
		goto out;
	}
	id = map_get(m, "id");
	if (id == NULL || id->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
		rc = err_set(err, PE_BAD_REQUEST, "field 'id' (an unsigned integer) is required");
		goto out;
	}
	r->id = id->via.u64;
	*has_id = 1;
	op = map_get(m, "op");
	if (op == NULL || op->type != MSGPACK_OBJECT_STR) {
		rc = err_set(err, PE_BAD_REQUEST, "field 'op' (a string) is required");
		goto out;
	}
	for (i = 0; i < OP_COUNT_; i++)
		if (strlen(op_names[i]) == op->via.str.size && memcmp(op_names[i], op->via.str.ptr, op->via.str.size) == 0)
			break;
	if (i == OP_COUNT_) {
		/* at most 40 bytes of the name, cut at a character boundary */
		size_t n = MIN(op->via.str.size, 40);

		while (n > 0 && n < op->via.str.size && ((uint8_t)op->via.str.ptr[n] & 0xc0) == 0x80)
			n--;
		if (utf8_valid(op->via.str.ptr, op->via.str.size))
			rc = err_set(err, PE_UNKNOWN_OP, "unknown op '%.*s'", (int)n, op->via.str.ptr);
		else
			rc = err_set(err, PE_UNKNOWN_OP, "unknown op '?'");
		goto out;
	}
	r->op = (enum proto_op)i;
	rc = r->op == OP_GENERATE ? decode_generate(m, r, err) : decode_other(m, r, err);
out:
	msgpack_unpacked_destroy(&u);
	return rc;
}

void
proto_req_free(struct proto_req *r)
{
	int i;

	for (i = 0; i < r->n_msgs; i++)
		proto_msg_free(&r->msgs[i]);
	for (i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	for (i = 0; i < r->n_inputs; i++)
		free(r->inputs[i].text), free(r->inputs[i].tokens);
	free(r->inputs);
	free(r->msgs), free(r->client), free(r->prompt), free(r->session), free(r->model);
	free(r->title), free(r->system), free(r->defaults), free(r->text), free(r->tokens);
	free(r->grammar), free(r->json_schema), free(r->tools), free(r->tool_name), free(r->draft);
	memset(r, 0, sizeof *r);
}

void
proto_msg_free(struct proto_msg *m)
{
	free(m->role), free(m->content), free(m->reasoning);
	chat_calls_free(m->calls, (size_t)m->n_calls);
	free(m->tool_call_id), free(m->name);
	memset(m, 0, sizeof *m);
}

int
proto_constraints(const struct proto_req *r)
{
	return (r->grammar != NULL) + (r->json_schema != NULL) + (r->json != 0);
}

void
proto_sample_defaults(struct proto_req *r)
{
	sample_params_chat(&r->sample);
	r->max_tokens = 512;
}

/* ---- replies ---- */

#define REPLY_START 256 /* bytes a reply's buffer starts with (a token's is about 50) */

void
proto_reply_begin(msgpack_sbuffer *sb, msgpack_packer *pk, int has_id, uint64_t id,
    const char *type, size_t n_more)
{
	static const char len_placeholder[4];

	/*
	 * msgpack's first allocation would be 8 KiB, past the allocator's
	 * per-thread cache, for each of a step's 64 token replies, which the
	 * loop thread frees.
	 */
	msgpack_sbuffer_init(sb);
	sb->data = xmalloc(REPLY_START);
	sb->alloc = REPLY_START;
	msgpack_sbuffer_write(sb, len_placeholder, 4);
	msgpack_packer_init(pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(pk, 2 + n_more);
	proto_pack_str(pk, "id");
	if (has_id)
		msgpack_pack_uint64(pk, id);
	else
		msgpack_pack_nil(pk);
	proto_pack_kv_str(pk, "type", type);
}

void
proto_reply_end(msgpack_sbuffer *sb)
{
	uint32_t n = (uint32_t)(sb->size - 4);

	sb->data[0] = (char)(n >> 24);
	sb->data[1] = (char)(n >> 16);
	sb->data[2] = (char)(n >> 8);
	sb->data[3] = (char)n;
}

void
proto_pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

void
proto_pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
	proto_pack_str(pk, k);
	proto_pack_str(pk, v ? v : "");
}

void
proto_pack_kv_strn(msgpack_packer *pk, const char *k, const char *v, size_t n)
{
	proto_pack_str(pk, k);
	msgpack_pack_str(pk, n);
	if (n > 0)
		msgpack_pack_str_body(pk, v, n);
}

void
proto_pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v)
{
	proto_pack_str(pk, k);
	msgpack_pack_uint64(pk, v);
}

void
proto_pack_kv_float(msgpack_packer *pk, const char *k, double v)
{
	proto_pack_str(pk, k);
	msgpack_pack_double(pk, v);
}

void
proto_pack_kv_bool(msgpack_packer *pk, const char *k, int v)
{
	proto_pack_str(pk, k);
	if (v)
		msgpack_pack_true(pk);
	else
		msgpack_pack_false(pk);
}

void
proto_pack_calls(msgpack_packer *pk, const struct chat_call *calls, size_t n)
{
	msgpack_pack_array(pk, n);
	for (size_t i = 0; i < n; i++) {
		msgpack_pack_map(pk, 3);
		proto_pack_kv_str(pk, "id", calls[i].id ? calls[i].id : "");
		proto_pack_kv_str(pk, "name", calls[i].name);
		proto_pack_kv_str(pk, "arguments", calls[i].arguments);
	}
}

void
proto_error(msgpack_sbuffer *sb, int has_id, uint64_t id, enum proto_err code, const char *msg)
{
	msgpack_packer pk;

	size_t n = msg ? strlen(msg) : 0;

	/* a message cut at ERR_LEN may end inside a character: strings must be UTF-8 */
	while (n > 0 && !utf8_valid(msg, n))
		n--;
	proto_reply_begin(sb, &pk, has_id, id, "error", 2);
	proto_pack_kv_str(&pk, "code", err_names[code]);
	proto_pack_str(&pk, "message");
	msgpack_pack_str(&pk, n);
	msgpack_pack_str_body(&pk, msg ? msg : "", n);
	proto_reply_end(sb);
}
