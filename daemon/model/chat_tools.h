/*
 * chat_tools.h: the tools a request offers the model and the calls it
 * makes, as each chat family spells them (PROTOCOL.md, Tool calls).
 *
 * Tools arrive as JSON text: an array of OpenAI's tool objects
 * ({"type": "function", "function": {"name", "description",
 * "parameters"}}) or of the flat {"name", "description", "parameters"};
 * chat_tools_check validates them and writes them in OpenAI's shape, the
 * one chat.c renders. A call is {id, name, arguments}, arguments the JSON
 * text of an object. chat_calls_parse reads the calls back out of what a
 * model generated, in its family's format; chat_py_json writes JSON the
 * way the official templates' tojson filter does (Python's json.dumps),
 * so that tools and calls render byte for byte as they do.
 */
#ifndef RESIDENT_CHAT_TOOLS_H
#define RESIDENT_CHAT_TOOLS_H

#include <jansson.h>
#include <stddef.h>

#include "chat.h"
#include "util.h"

/* Most tools one request offers. */
#define CHAT_MAX_TOOLS 128
/* Most bytes of a tool's name: OpenAI's rule, ^[A-Za-z0-9_-]{1,64}$. */
#define CHAT_MAX_TOOL_NAME 64
/* Most calls one assistant message carries. */
#define CHAT_MAX_CALLS 128
/* Bytes of a call id, its NUL included: "call_" and 16 characters, or Mistral's 9. */
#define CHAT_CALL_ID_LEN 24

/*
 * Checks a request's tools (JSON text) and writes them, in OpenAI's shape
 * and the given order of their keys, to *out (malloc'd JSON text, compact);
 * *n the number of tools. Refused (ERR_INVAL, the message names the tool):
 * not a JSON array, no tool or more than CHAT_MAX_TOOLS, a tool that is not
 * an object of either shape, a "type" other than "function", a name that
 * breaks OpenAI's rule or is given twice, a description that is not a
 * string, parameters that are not an object.
 */
int chat_tools_check(const char *text, char **out, size_t *n, char *err);

/* Whether a tool of this name is among the tools (checked JSON text). */
int chat_tools_has(const char *tools, const char *name);

/* Whether s is a tool name by OpenAI's rule. */
int chat_tool_name_ok(const char *s);

/*
 * Appends v as Python's json.dumps(v, ensure_ascii=False) writes it, with
 * indent spaces a level when indent > 0 (the templates' tojson(indent=4)),
 * else ", " and ": " between items. Reals as Python's repr.
 */
void chat_py_json(struct strbuf *b, const json_t *v, int indent);

/* Parses JSON text (NULL if it is not JSON). */
json_t *chat_json(const char *text);

/* Whether text (NULL: no) is the JSON text of an object. */
int chat_json_is_object(const char *text);

/*
 * A new call id for family t, unique with high probability: Mistral's
 * template wants 9 letters and digits, the others get "call_" and 16.
 */
void chat_call_id(enum chat_tmpl t, char id[CHAT_CALL_ID_LEN]);

/*
 * The calls a model's output holds, in family t's format (raw: its text
 * with the control tokens spelled out, from the generation prompt's end):
 * Qwen's <tool_call> blocks, Llama 3.1's and Gemma's JSON object
 * {"name", "parameters"}, Mistral's [TOOL_CALLS] array, harmony's
 * messages to=functions.NAME. Each call gets a new id (chat_call_id).
 * *calls is malloc'd (free with chat_calls_free). Returns the number of
 * calls found, or -1 when the output holds a call that does not parse
 * (err says which and why; the calls before it are in *calls).
 */
int chat_calls_parse(enum chat_tmpl t, const char *raw, size_t len, struct chat_call **calls, size_t *n,
    char *err);

/* Frees n calls and the array. */
void chat_calls_free(struct chat_call *calls, size_t n);

/* Calls as JSON text: [{"id", "name", "arguments"}], arguments a string (for the store). */
char *chat_calls_json(const struct chat_call *calls, size_t n);

/* The calls of chat_calls_json's text; 0, or ERR_INVAL. */
int chat_calls_from_json(const char *text, struct chat_call **calls, size_t *n, char *err);

#endif
