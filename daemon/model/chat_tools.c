/*
 * chat_tools.c: tools in, calls out (chat_tools.h).
 *
 * Tools are checked once, when the request is decoded, and kept as JSON
 * text in OpenAI's shape; chat.c parses them again to render (a render is
 * rare next to the tokens it makes). Calls are read from what the model
 * generated with its control tokens spelled out, so that harmony's
 * recipient in a message header and Mistral's [TOOL_CALLS] token are seen
 * as the template wrote them.
 */
#include "config.h"
#include "chat_tools.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ---- tools ---- */

int
chat_tool_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > CHAT_MAX_TOOL_NAME)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
		    s[i] == '_' || s[i] == '-'))
			return 0;
	return 1;
}

json_t *
chat_json(const char *text)
{
	return json_loads(text, JSON_DECODE_ANY, NULL);
}

int
chat_json_is_object(const char *text)
{
	json_t *v = text != NULL ? chat_json(text) : NULL;
	int ok = json_is_object(v);

	json_decref(v);
	return ok;
}

/* The function object of tool i, in OpenAI's shape (a new reference), or NULL with err set. */
static json_t *
tool_function(const json_t *t, size_t i, char *err)
{
	const json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");

	if (!json_is_object(t)) {
		err_set(err, ERR_INVAL, "tools[%zu] is not an object", i);
		return NULL;
	}
	if (type != NULL && (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)) {
		err_set(err, ERR_INVAL, "tools[%zu]: type must be \"function\"", i);
		return NULL;
	}
	if (fn != NULL && !json_is_object(fn)) {
		err_set(err, ERR_INVAL, "tools[%zu]: function must be an object", i);
		return NULL;
	}
	/* the flat shape is the function object itself */
	return json_incref((json_t *)(fn != NULL ? fn : t));
}

/* Checks one function object's fields; names seen so far are in out's functions. */
static int
tool_fields(const json_t *fn, size_t i, const json_t *out, char *err)
{
	const json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description"),
	    *params = json_object_get(fn, "parameters");
	size_t k;

	if (!json_is_string(name) || !chat_tool_name_ok(json_string_value(name)))
		return err_set(err, ERR_INVAL, "tools[%zu]: name must be 1..%d letters, digits, '_' or '-'", i,
		    CHAT_MAX_TOOL_NAME);
	if (desc != NULL && !json_is_string(desc))
		return err_set(err, ERR_INVAL, "tools[%zu]: description must be a string", i);
	if (params != NULL && !json_is_object(params))
		return err_set(err, ERR_INVAL, "tools[%zu]: parameters must be a JSON Schema object", i);
	for (k = 0; k < i; k++)
		if (strcmp(json_string_value(json_object_get(json_object_get(json_array_get(out, k), "function"),
		    "name")), json_string_value(name)) == 0)
			return err_set(err, ERR_INVAL, "tools[%zu]: the name '%s' is also tools[%zu]'s", i,
			    json_string_value(name), k);
	return 0;
}

int
chat_tools_check(const char *text, char **out, size_t *n, char *err)
{
	json_error_t je;
	json_t *a = json_loads(text, 0, &je), *res, *fn;
	size_t i;
	int rc = 0;

	*out = NULL, *n = 0;
	if (a == NULL)
		return err_set(err, ERR_INVAL, "tools is not JSON: %s (line %d, column %d)", je.text, je.line,
		    je.column);
	if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > CHAT_MAX_TOOLS) {
		json_decref(a);
		return err_set(err, ERR_INVAL, "tools must be a JSON array of 1..%d tools", CHAT_MAX_TOOLS);
	}
	res = json_array();
	for (i = 0; i < json_array_size(a) && rc == 0; i++) {
		if ((fn = tool_function(json_array_get(a, i), i, err)) == NULL) {
			rc = ERR_INVAL;
			break;
		}
		if ((rc = tool_fields(fn, i, res, err)) == 0)
			json_array_append_new(res, json_pack("{s:s,s:o}", "type", "function", "function", fn));
		else
			json_decref(fn);
	}
	if (rc == 0) {
		*out = json_dumps(res, JSON_COMPACT);
		*n = json_array_size(res);
	}
	json_decref(res), json_decref(a);
	return rc;
}

int
chat_tools_has(const char *tools, const char *name)
{
	json_t *a = chat_json(tools), *t;
	size_t i;
	int found = 0;

	json_array_foreach(a, i, t)
		found |= strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), name) == 0;
	json_decref(a);
	return found;
}

/* ---- Python's json.dumps ---- */

/* A string as Python escapes it with ensure_ascii=False. */
static void
py_string(struct strbuf *b, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	char esc[7];

	strbuf_cat(b, "\"");
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" :
		    c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;

		if (e != NULL) {
			strbuf_cat(b, e);
		} else if (c < 0x20) {
			snprintf(esc, sizeof esc, "\\u00%c%c", hex[c >> 4], hex[c & 15]);
			strbuf_cat(b, esc);
		} else {
			strbuf_add(b, s + i, 1);
		}
	}
	strbuf_cat(b, "\"");
}

/*
 * A real as Python's repr: the shortest digits that read back the same,
 * positional for exponents -4..15 (with ".0" when whole), else d.ddde+XX.
 */
static void
py_real(struct strbuf *b, double v)
{
	char buf[40], digits[24];
	int p, exp, nd = 0;

	if (!isfinite(v)) {
		strbuf_cat(b, isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
		return;
	}
	for (p = 1; p <= 17; p++) {
		snprintf(buf, sizeof buf, "%.*e", p - 1, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	/* buf: [-]d.ddde[+-]XX */
	for (const char *q = buf; *q != 'e'; q++)
		if (*q >= '0' && *q <= '9')
			digits[nd++] = *q;
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	exp = atoi(strchr(buf, 'e') + 1);
	if (signbit(v))
		strbuf_cat(b, "-");
	if (exp < -4 || exp >= 16) {
		strbuf_add(b, digits, 1);
		if (nd > 1) {
			strbuf_cat(b, ".");
			strbuf_add(b, digits + 1, (size_t)nd - 1);
		}
		strbuf_printf(b, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
	} else if (exp < 0) {
		strbuf_cat(b, "0.");
		for (int z = -1; z > exp; z--)
			strbuf_cat(b, "0");
		strbuf_add(b, digits, (size_t)nd);
	} else {
		for (int k = 0; k <= MAX(exp, nd - 1); k++) {
			if (k == exp + 1)
				strbuf_cat(b, ".");
			strbuf_add(b, k < nd ? digits + k : "0", 1);
		}
		if (nd - 1 <= exp)
			strbuf_cat(b, ".0");
	}
}

/* A newline and the indentation of a level, or the separator's space without indent. */
static void
py_break(struct strbuf *b, int indent, int level)
{
	if (indent <= 0)
		return;
	strbuf_cat(b, "\n");
	for (int k = 0; k < indent * level; k++)
		strbuf_cat(b, " ");
}

static void
py_value(struct strbuf *b, const json_t *v, int indent, int level)
{
	const char *key, *sep = indent > 0 ? "," : ", ";
	const json_t *x;
	size_t i = 0, n;

	switch (json_typeof(v)) {
	case JSON_OBJECT:
		if (json_object_size(v) == 0) {
			strbuf_cat(b, "{}");
			return;
		}
		strbuf_cat(b, "{");
		json_object_foreach((json_t *)v, key, x) {
			if (i++ > 0)
				strbuf_cat(b, sep);
			py_break(b, indent, level + 1);
			py_string(b, key, strlen(key));
			strbuf_cat(b, ": ");
			py_value(b, x, indent, level + 1);
		}
		py_break(b, indent, level);
		strbuf_cat(b, "}");
		return;
	case JSON_ARRAY:
		if ((n = json_array_size(v)) == 0) {
			strbuf_cat(b, "[]");
			return;
		}
		strbuf_cat(b, "[");
		for (i = 0; i < n; i++) {
			if (i > 0)
				strbuf_cat(b, sep);
			py_break(b, indent, level + 1);
			py_value(b, json_array_get(v, i), indent, level + 1);
		}
		py_break(b, indent, level);
		strbuf_cat(b, "]");
		return;
	case JSON_STRING:
		py_string(b, json_string_value(v), json_string_length(v));
		return;
	case JSON_INTEGER:
		strbuf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		return;
	case JSON_REAL:
		py_real(b, json_real_value(v));
		return;
	case JSON_TRUE:
		strbuf_cat(b, "true");
		return;
	case JSON_FALSE:
		strbuf_cat(b, "false");
		return;
	case JSON_NULL:
		strbuf_cat(b, "null");
		return;
	}
}

void
chat_py_json(struct strbuf *b, const json_t *v, int indent)
{
	py_value(b, v, indent, 0);
}

/* ---- calls ---- */

void
chat_call_id(enum chat_tmpl t, char id[CHAT_CALL_ID_LEN])
{
	static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	unsigned char r[16];
	size_t got = 0, n = t == CHAT_MISTRAL ? 9 : 16, o = 0;
	ssize_t k;

	while (got < n) {
		k = getrandom(r + got, n - got, 0);
		if (k > 0) {
			got += (size_t)k;
		} else if (k < 0 && errno != EINTR) {
			/* no entropy source: a clock and a counter still make ids unique within the process */
			static unsigned counter;
			uint64_t x = now_ns() ^ ((uint64_t)++counter << 40);

			for (; got < n; got++, x = x * 6364136223846793005ULL + 1442695040888963407ULL)
				r[got] = (unsigned char)(x >> 56);
		}
	}
	if (t != CHAT_MISTRAL)
		o = (size_t)snprintf(id, CHAT_CALL_ID_LEN, "call_");
	for (size_t i = 0; i < n; i++)
		id[o++] = alnum[r[i] % (sizeof alnum - 1)];
	id[o] = '\0';
}

void
chat_calls_free(struct chat_call *calls, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(calls[i].id), free(calls[i].name), free(calls[i].arguments);
	free(calls);
}

/* Appends a call named name with the arguments args (an object, or JSON text of one) to the list. */
static int
call_add(enum chat_tmpl t, const json_t *name, const json_t *args, struct chat_call **calls, size_t *n,
    char *err)
{
	json_t *parsed = json_is_string(args) ? chat_json(json_string_value(args)) : json_incref((json_t *)args);
	struct strbuf b = { 0 };
	char id[CHAT_CALL_ID_LEN];

	if (!json_is_string(name) || !chat_tool_name_ok(json_string_value(name))) {
		json_decref(parsed);
		return err_set(err, ERR_INVAL, "tool call %zu has no valid \"name\"", *n);
	}
	if (!json_is_object(parsed)) {
		json_decref(parsed);
		return err_set(err, ERR_INVAL, "tool call %zu (%s): its arguments are not a JSON object", *n,
		    json_string_value(name));
	}
	chat_py_json(&b, parsed, 0);
	json_decref(parsed);
	chat_call_id(t, id);
	*calls = xrealloc(*calls, (*n + 1) * sizeof **calls);
	(*calls)[(*n)++] = (struct chat_call){ xstrdup(id), xstrdup(json_string_value(name)), b.s };
	return 0;
}

/* One call as a JSON object {name, <args_key>} in text s[0..n). */
static int
call_object(enum chat_tmpl t, const char *s, size_t n, const char *args_key, struct chat_call **calls,
    size_t *nc, char *err)
{
	json_error_t je;
	json_t *o = json_loadb(s, n, 0, &je);
	int rc;

	if (!json_is_object(o)) {
		json_decref(o);
		return err_set(err, ERR_INVAL, "tool call %zu is not a JSON object: %s", *nc,
		    o == NULL ? je.text : "another value");
	}
	rc = call_add(t, json_object_get(o, "name"), json_object_get(o, args_key), calls, nc, err);
	json_decref(o);
	return rc;
}

/* Qwen: each <tool_call>...</tool_call> block holds {"name", "arguments"}; the last may be unclosed. */
static int
parse_qwen(enum chat_tmpl t, const char *s, size_t n, struct chat_call **calls, size_t *nc, char *err)
{
	const char *end = s + n, *p = s, *open, *close;
	int rc;

	while ((open = memmem(p, (size_t)(end - p), "<tool_call>", 11)) != NULL) {
		open += 11;
		close = memmem(open, (size_t)(end - open), "</tool_call>", 12);
		if ((rc = call_object(t, open, (size_t)((close ? close : end) - open), "arguments", calls, nc, err)) != 0)
			return rc;
		p = close ? close + 12 : end;
	}
	return 0;
}

/* The text between leading and trailing whitespace. */
static const char *
trim(const char *s, size_t *n)
{
	while (*n > 0 && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r'))
		s++, (*n)--;
	while (*n > 0 && (s[*n - 1] == ' ' || s[*n - 1] == '\n' || s[*n - 1] == '\t' || s[*n - 1] == '\r'))
		(*n)--;
	return s;
}

/*
 * Llama 3.1 and Gemma: a reply that is one JSON object (after Llama's
 * <|python_tag|>, or in a ```json fence) is a call {"name", "parameters"};
 * any other reply is an answer.
 */
static int
parse_json_reply(enum chat_tmpl t, const char *s, size_t n, struct chat_call **calls, size_t *nc, char *err)
{
	static const char *const opens[] = { "<|python_tag|>", "```json", "```" };

	s = trim(s, &n);
	for (size_t i = 0; i < ARRAY_LEN(opens); i++)
		if (n >= strlen(opens[i]) && memcmp(s, opens[i], strlen(opens[i])) == 0) {
			s += strlen(opens[i]), n -= strlen(opens[i]);
			if (opens[i][0] == '`' && n >= 3 && memcmp(s + n - 3, "```", 3) == 0)
				n -= 3;
			s = trim(s, &n);
			break;
		}
	if (n == 0 || *s != '{')
		return 0;
	return call_object(t, s, n, "parameters", calls, nc, err);
}

/* Mistral: [TOOL_CALLS] and a JSON array of {"name", "arguments"}. */
static int
parse_mistral(enum chat_tmpl t, const char *s, size_t n, struct chat_call **calls, size_t *nc, char *err)
{
	const char *at = memmem(s, n, "[TOOL_CALLS]", 12);
	json_error_t je;
	json_t *a, *c;
	size_t i, len;
	int rc = 0;

	if (at == NULL)
		return 0;
	len = n - (size_t)(at + 12 - s);
	at = trim(at + 12, &len);
	a = json_loadb(at, len, 0, &je);
	if (!json_is_array(a)) {
		json_decref(a);
		return err_set(err, ERR_INVAL, "the tool calls are not a JSON array: %s", a ? "another value" : je.text);
	}
	json_array_foreach(a, i, c)
		if (rc == 0)
			rc = call_add(t, json_object_get(c, "name"), json_object_get(c, "arguments"), calls, nc, err);
	json_decref(a);
	return rc;
}

/*
 * Harmony: a message whose header (before <|message|>) names the recipient
 * functions.NAME holds the call's arguments, up to <|call|> (or the end).
 */
static int
parse_harmony(enum chat_tmpl t, const char *s, size_t n, struct chat_call **calls, size_t *nc, char *err)
{
	const char *end = s + n, *p = s, *body, *to, *stop;
	char name[CHAT_MAX_TOOL_NAME + 1];
	json_t *nm, *args;
	size_t k;
	int rc;

	while (p < end && (body = memmem(p, (size_t)(end - p), "<|message|>", 11)) != NULL) {
		to = memmem(p, (size_t)(body - p), "to=functions.", 13);
		p = body + 11;
		stop = memmem(p, (size_t)(end - p), "<|", 2);
		if (stop == NULL)
			stop = end;
		if (to != NULL) {
			to += 13;
			for (k = 0; k < CHAT_MAX_TOOL_NAME && to + k < body && strchr(" <", to[k]) == NULL; k++)
				name[k] = to[k];
			name[k] = '\0';
			nm = json_string(name);
			args = json_stringn(p, (size_t)(stop - p));
			rc = call_add(t, nm, args, calls, nc, err);
			json_decref(nm), json_decref(args);
			if (rc != 0)
				return rc;
		}
		p = stop;
	}
	return 0;
}

int
chat_calls_parse(enum chat_tmpl t, const char *raw, size_t len, struct chat_call **calls, size_t *n, char *err)
{
	int rc = 0;

	*calls = NULL, *n = 0;
	switch (t) {
	case CHAT_CHATML:
	case CHAT_QWEN3:
		rc = parse_qwen(t, raw, len, calls, n, err);
		break;
	case CHAT_LLAMA3:
	case CHAT_GEMMA:
		rc = parse_json_reply(t, raw, len, calls, n, err);
		break;
	case CHAT_MISTRAL:
		rc = parse_mistral(t, raw, len, calls, n, err);
		break;
	case CHAT_HARMONY:
		rc = parse_harmony(t, raw, len, calls, n, err);
		break;
	default:
		break;
	}
	return rc != 0 ? -1 : (int)*n;
}

char *
chat_calls_json(const struct chat_call *calls, size_t n)
{
	json_t *a = json_array();
	char *s;

	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_pack("{s:s,s:s,s:s}", "id", calls[i].id ? calls[i].id : "",
		    "name", calls[i].name, "arguments", calls[i].arguments));
	s = json_dumps(a, JSON_COMPACT);
	json_decref(a);
	return s;
}

int
chat_calls_from_json(const char *text, struct chat_call **calls, size_t *n, char *err)
{
	json_t *a = chat_json(text), *c;
	const char *id, *name, *args;
	size_t i;

	*calls = NULL, *n = 0;
	if (!json_is_array(a)) {
		json_decref(a);
		return err_set(err, ERR_INVAL, "stored tool calls are not a JSON array");
	}
	*calls = xcalloc(json_array_size(a) + 1, sizeof **calls);
	json_array_foreach(a, i, c) {
		if (json_unpack(c, "{s:s,s:s,s:s}", "id", &id, "name", &name, "arguments", &args) != 0) {
			json_decref(a);
			return err_set(err, ERR_INVAL, "stored tool call %zu is malformed", i);
		}
		(*calls)[(*n)++] = (struct chat_call){ xstrdup(id), xstrdup(name), xstrdup(args) };
	}
	json_decref(a);
	return 0;
}
