/*
 * chat.c: chat template families: detection from Jinja source, rendering.
 *
 * Each render_* function is the C transcription of one official template
 * (named in chat.h, kept in tests/data/chat_templates), down to where it
 * strips whitespace and where it puts the system message; render_inst
 * serves Mistral's v1 and v3, which differ in those details alone.
 * Conversations are validated before rendering, so the renderers cannot
 * fail.
 */
#include "config.h"
#include "chat.h"
#include "chat_tools.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Bytes of template source quoted in "unknown template" messages. */
#define CHAT_EXCERPT 40

/*
 * Qwen3's template, told from other ChatML templates with reasoning: the
 * line that renders a kept reasoning block, and the enable_thinking switch
 * of its generation prompt (QwQ's and Qwen3 2507's open <think> instead).
 */
#define QWEN3_KEEP "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n')"
#define QWEN3_SWITCH "enable_thinking is defined and enable_thinking is false"

/* gpt-oss's system message, around the date. */
#define HARMONY_SYS_HEAD "<|start|>system<|message|>You are ChatGPT, a large language model " \
	"trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: "
#define HARMONY_SYS_TAIL "\n\n# Valid channels: analysis, commentary, final. Channel must be included for " \
	"every message."

enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL, ROLE_BAD };

static const char *const tmpl_names[] = {
	[CHAT_RAW] = "raw", [CHAT_LLAMA3] = "llama3", [CHAT_CHATML] = "chatml",
	[CHAT_GEMMA] = "gemma", [CHAT_MISTRAL] = "mistral", [CHAT_LLAMA2] = "llama2",
	[CHAT_QWEN3] = "qwen3", [CHAT_HARMONY] = "harmony", [CHAT_MISTRAL_V1] = "mistral-v1",
};

/* The families' names, for messages. */
static const char family_list[] = "raw, llama3, chatml, gemma, mistral, llama2, qwen3, harmony, "
    "mistral-v1";

/* The BOS text a family's vocabularies use, for a NULL bos_text. */
static const char *const default_bos[] = {
	[CHAT_RAW] = "", [CHAT_LLAMA3] = "<|begin_of_text|>", [CHAT_CHATML] = "",
	[CHAT_GEMMA] = "<bos>", [CHAT_MISTRAL] = "<s>", [CHAT_LLAMA2] = "<s>",
	[CHAT_QWEN3] = "", [CHAT_HARMONY] = "", [CHAT_MISTRAL_V1] = "<s>",
};

/* 1 for the code points Python's str.isspace accepts (what Jinja's trim and str.strip remove). */
static int
py_space(uint32_t c)
{
	return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 ||
	    c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
	    c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* The code point of a valid UTF-8 sequence of len bytes. */
static uint32_t
utf8_cp(const unsigned char *s, size_t len)
{
	static const unsigned char lead_mask[] = { 0, 0x7f, 0x1f, 0x0f, 0x07 };
	uint32_t cp = s[0] & lead_mask[len];
	size_t i;

	for (i = 1; i < len; i++)
		cp = (cp << 6) | (s[i] & 0x3f);
	return cp;
}

/* Which ends of a string sb_strip_nl strips. */
enum { NL_START = 1, NL_END = 2 };

/* Appends s[0..n) without the newlines at the given ends, as Python's lstrip('\n') and strip('\n'). */
static void
sb_strip_nl(struct strbuf *b, const char *s, size_t n, int ends)
{
	while ((ends & NL_START) && n > 0 && *s == '\n')
		s++, n--;
	while ((ends & NL_END) && n > 0 && s[n - 1] == '\n')
		n--;
	strbuf_add(b, s, n);
}

/* Appends s (valid UTF-8) without leading and trailing whitespace, as Python's str.strip(). */
static void
sb_strip(struct strbuf *b, const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0, j = n, k;
	int l;

	while (i < n) {
		l = utf8_seq_len(s + i, n - i);
		if (!py_space(utf8_cp(s + i, (size_t)l)))
			break;
		i += (size_t)l;
	}
	while (j > i) {
		for (k = j - 1; k > i && (s[k] & 0xc0) == 0x80; k--)
			;
		if (!py_space(utf8_cp(s + k, j - k)))
			break;
		j = k;
	}
	strbuf_add(b, str + i, j - i);
}

/* The role of a message, ROLE_BAD if unknown. */
static enum chat_role
role_of(const struct chat_msg *m)
{
	if (m->role == NULL)
		return ROLE_BAD;
	if (strcmp(m->role, "system") == 0)
		return ROLE_SYSTEM;
	if (strcmp(m->role, "user") == 0)
		return ROLE_USER;
	if (strcmp(m->role, "assistant") == 0)
		return ROLE_ASSISTANT;
	if (strcmp(m->role, "tool") == 0)
		return ROLE_TOOL;
	return ROLE_BAD;
}

/* Copies up to CHAT_EXCERPT bytes of src, on one line and cut between characters, for a message. */
static void
excerpt(const char *src, char *buf)
{
	const unsigned char *s = (const unsigned char *)src;
	size_t i = 0, o = 0, avail = strlen(src);
	int l;

	while (i < avail && o < CHAT_EXCERPT) {
		if (s[i] < 0x80) {
			buf[o++] = (s[i] < 0x20 || s[i] == 0x7f) ? ' ' : (char)s[i];
			i++;
			continue;
		}
		l = utf8_seq_len(s + i, avail - i);
		if (l == 0) {
			buf[o++] = '?';
			i++;
			continue;
		}
		if (o + (size_t)l > CHAT_EXCERPT)
			break;
		memcpy(buf + o, s + i, (size_t)l);
		o += (size_t)l;
		i += (size_t)l;
	}
	buf[o] = '\0';
}

/* The error for a template we do not render; what names a recognised variant, or is NULL. */
static int
unsupported(const char *src, const char *what, char *err)
{
	char ex[CHAT_EXCERPT + 1];

	excerpt(src, ex);
	return err_set(err, ERR_UNSUPPORTED, "%s chat template (\"%s%s\"); use raw prompt mode "
	    "or set the template family (%s)", what ? what : "unknown", ex,
	    strlen(src) > strlen(ex) ? "..." : "", family_list);
}

/* Tells the [INST] templates apart, as llama.cpp does: Mistral's official ones, or Llama 2's. */
static int
detect_inst(const char *src, enum chat_tmpl *out, char *err)
{
	if (strstr(src, "[SYSTEM_PROMPT]") != NULL)
		return unsupported(src, "the Mistral v7", err);
	if (strstr(src, "' [INST] ' + system_message") == NULL &&
	    strstr(src, "[AVAILABLE_TOOLS]") == NULL) {
		*out = CHAT_LLAMA2;
		return 0;
	}
	if (strstr(src, " [INST]") != NULL) {
		*out = CHAT_MISTRAL_V1;
		return 0;
	}
	if (strstr(src, "\"[INST]\"") != NULL)
		return unsupported(src, "the Mistral v3-Tekken", err);
	*out = CHAT_MISTRAL;
	return 0;
}

/* Tells the <|im_start|> templates apart: plain ChatML, Qwen3's, or a variant we do not render. */
static int
detect_chatml(const char *src, enum chat_tmpl *out, char *err)
{
	if (strstr(src, "<|im_sep|>") != NULL || strstr(src, "<end_of_utterance>") != NULL)
		return unsupported(src, "a ChatML variant (Phi-4, SmolVLM)", err);
	*out = CHAT_CHATML;
	if (strstr(src, QWEN3_KEEP) != NULL && strstr(src, QWEN3_SWITCH) != NULL)
		*out = CHAT_QWEN3;
	else if (strstr(src, "</think>") != NULL)
		return unsupported(src, "a ChatML variant with reasoning (QwQ, Qwen3 2507, SmolLM3)",
		    err);
	return 0;
}

int
chat_detect(const char *src, enum chat_tmpl *out, char *err)
{
	if (src == NULL || *src == '\0')
		return err_set(err, ERR_NOTFOUND, "the model has no chat template");
	if (strstr(src, "<|im_start|>") != NULL)
		return detect_chatml(src, out, err);
	if (strncmp(src, "mistral", 7) == 0 || strstr(src, "[INST]") != NULL)
		return detect_inst(src, out, err);
	if (strstr(src, "<|start|>") != NULL && strstr(src, "<|channel|>") != NULL) {
		*out = CHAT_HARMONY;
		return 0;
	}
	if (strstr(src, "<start_of_turn>") != NULL) {
		*out = CHAT_GEMMA;
		return 0;
	}
	if (strstr(src, "<|start_header_id|>") != NULL && strstr(src, "<|end_header_id|>") != NULL) {
		*out = CHAT_LLAMA3;
		return 0;
	}
	return unsupported(src, NULL, err);
}

const char *
chat_tmpl_name(enum chat_tmpl t)
{
	if ((size_t)t >= ARRAY_LEN(tmpl_names))
		return "?";
	return tmpl_names[t];
}

int
chat_tmpl_from_name(const char *name, enum chat_tmpl *out, char *err)
{
	size_t i;

	for (i = 0; name != NULL && i < ARRAY_LEN(tmpl_names); i++) {
		if (strcmp(name, tmpl_names[i]) == 0) {
			*out = (enum chat_tmpl)i;
			return 0;
		}
	}
	return err_set(err, ERR_INVAL, "unknown chat template '%.32s' (%s)", name ? name : "(null)",
	    family_list);
}

/* Whether the family's template insists on user/assistant alternation after one optional system message. */
static int
needs_alternation(enum chat_tmpl t)
{
	return t == CHAT_GEMMA || t == CHAT_MISTRAL || t == CHAT_LLAMA2 || t == CHAT_MISTRAL_V1;
}

/* Whether the family's template drops or garbles a system message that is not the first. */
static int
system_first_only(enum chat_tmpl t)
{
	return needs_alternation(t) || t == CHAT_HARMONY;
}

/*
 * The role message i takes in the turn order, ROLE_BAD for one outside it:
 * Mistral's template skips tool results and assistant turns with calls;
 * Gemma's user turn holds a run of tool results.
 */
static enum chat_role
turn_role(enum chat_tmpl t, const struct chat_msg *m, size_t i)
{
	enum chat_role r = role_of(&m[i]);

	if (t == CHAT_MISTRAL && (r == ROLE_TOOL || m[i].n_calls > 0))
		return ROLE_BAD;
	if (t == CHAT_GEMMA && r == ROLE_TOOL)
		return i > 0 && role_of(&m[i - 1]) == ROLE_TOOL ? ROLE_BAD : ROLE_USER;
	return r;
}

/* Checks the turn order the alternating families' templates require. */
static int
check_alternation(enum chat_tmpl t, const struct chat_msg *m, size_t n, char *err)
{
	size_t i, k = 0, first = role_of(&m[0]) == ROLE_SYSTEM;
	enum chat_role want, r;

	for (i = first; i < n; i++) {
		if ((r = turn_role(t, m, i)) == ROLE_BAD)
			continue;
		want = k++ % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
		if (r != want)
			return err_set(err, ERR_INVAL, "message %zu: the %s template needs roles to "
			    "alternate user/assistant/user/... after the optional system message",
			    i, tmpl_names[t]);
	}
	return 0;
}

/* Whether the family's template renders tools, tool calls and tool results. */
static int
has_tools(enum chat_tmpl t)
{
	return t == CHAT_LLAMA3 || t == CHAT_CHATML || t == CHAT_GEMMA || t == CHAT_MISTRAL ||
	    t == CHAT_QWEN3 || t == CHAT_HARMONY;
}

/* Whether s is an id Mistral's template takes: 9 letters or digits. */
static int
mistral_id(const char *s)
{
	size_t i;

	for (i = 0; s != NULL && s[i] != '\0'; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9')))
			return 0;
	return s != NULL && i == 9;
}

/* Checks an assistant message's calls: names, arguments that are JSON objects, what the family takes. */
static int
check_calls(enum chat_tmpl t, const struct chat_msg *m, size_t i, char *err)
{
	size_t k;

	if (m->n_calls > 0 && role_of(m) != ROLE_ASSISTANT)
		return err_set(err, ERR_INVAL, "message %zu: only an assistant message makes tool calls", i);
	if ((t == CHAT_LLAMA3 || t == CHAT_HARMONY) && m->n_calls > 1)
		return err_set(err, ERR_INVAL, "message %zu: the %s template renders one tool call a message", i,
		    tmpl_names[t]);
	if (t == CHAT_HARMONY && m->n_calls > 0 && m->content[0] != '\0' && m->reasoning != NULL &&
	    m->reasoning[0] != '\0')
		return err_set(err, ERR_INVAL, "message %zu: the harmony template refuses both content and "
		    "reasoning beside a tool call", i);
	for (k = 0; k < m->n_calls; k++) {
		if (m->calls[k].name == NULL || !chat_tool_name_ok(m->calls[k].name))
			return err_set(err, ERR_INVAL, "message %zu: tool call %zu has no valid name", i, k);
		if (!chat_json_is_object(m->calls[k].arguments))
			return err_set(err, ERR_INVAL, "message %zu: tool call %zu's arguments are not the JSON "
			    "text of an object", i, k);
		if (t == CHAT_MISTRAL && !mistral_id(m->calls[k].id))
			return err_set(err, ERR_INVAL, "message %zu: tool call %zu: the mistral template needs "
			    "call ids of 9 letters or digits", i, k);
	}
	return 0;
}

/*
 * What the family refuses of tool calls and results: a family without
 * them, Mistral's ids, harmony's result with no call before it, Llama
 * 3.1's tools with no first user message to carry them.
 */
static int
check_tools(enum chat_tmpl t, const struct chat_msg *m, size_t n, const struct chat_opts *o, char *err)
{
	size_t i, first = n > 0 && role_of(&m[0]) == ROLE_SYSTEM;
	int called = 0, rc;

	if (o->tools != NULL && !has_tools(t))
		return err_set(err, ERR_INVAL, "the %s template has no tools", tmpl_names[t]);
	if (o->tools != NULL && t == CHAT_LLAMA3 && (first == n || role_of(&m[first]) != ROLE_USER))
		return err_set(err, ERR_INVAL, "the llama3 template puts the tools in the first user message: "
		    "message %zu must be one", first);
	for (i = 0; i < n; i++) {
		if ((role_of(&m[i]) == ROLE_TOOL || m[i].n_calls > 0) && !has_tools(t))
			return err_set(err, ERR_INVAL, "message %zu: the %s template has no tool calls", i,
			    tmpl_names[t]);
		if ((rc = check_calls(t, &m[i], i, err)) != 0)
			return rc;
		if (role_of(&m[i]) == ROLE_ASSISTANT)
			called = m[i].n_calls > 0;
		if (role_of(&m[i]) != ROLE_TOOL)
			continue;
		if (t == CHAT_MISTRAL && !mistral_id(m[i].tool_call_id))
			return err_set(err, ERR_INVAL, "message %zu: the mistral template needs the tool_call_id "
			    "of its call (9 letters or digits)", i);
		if (t == CHAT_HARMONY && !called)
			return err_set(err, ERR_INVAL, "message %zu: a tool result with no assistant tool call "
			    "before it", i);
	}
	return 0;
}

/* Whether a text (NULL: none) holds a harmony channel header, which its template refuses in a message. */
static int
harmony_tagged(const char *s)
{
	return s != NULL && (strstr(s, "<|channel|>analysis<|message|>") != NULL ||
	    strstr(s, "<|channel|>final<|message|>") != NULL);
}

/* What one message's family refuses of it (a late system message, harmony's channel tags). */
static int
check_family(enum chat_tmpl t, const struct chat_msg *m, size_t i, char *err)
{
	enum chat_role r = role_of(m);

	if (i > 0 && r == ROLE_SYSTEM && system_first_only(t))
		return err_set(err, ERR_INVAL, "message %zu: the %s template allows a system "
		    "message only as the first message", i, tmpl_names[t]);
	if (t == CHAT_HARMONY && r == ROLE_ASSISTANT && (harmony_tagged(m->content) || harmony_tagged(m->reasoning)))
		return err_set(err, ERR_INVAL, "message %zu: the harmony template refuses "
		    "<|channel|> tags in an assistant message's content or reasoning", i);
	return 0;
}

/* Validates roles, contents and what the template refuses, the turn order included. */
static int
check_msgs(enum chat_tmpl t, const struct chat_msg *m, size_t n, char *err)
{
	size_t i;
	int rc;

	for (i = 0; i < n; i++) {
		if (role_of(&m[i]) == ROLE_BAD)
			return err_set(err, ERR_INVAL, "message %zu: unknown role '%.32s' (system, "
			    "user, assistant or tool)", i, m[i].role ? m[i].role : "(null)");
		if (m[i].content == NULL)
			return err_set(err, ERR_INVAL, "message %zu: no content", i);
		if (!utf8_valid(m[i].content, strlen(m[i].content)))
			return err_set(err, ERR_INVAL, "message %zu: content is not valid UTF-8", i);
		if (m[i].reasoning != NULL && !utf8_valid(m[i].reasoning, strlen(m[i].reasoning)))
			return err_set(err, ERR_INVAL, "message %zu: reasoning is not valid UTF-8", i);
		if ((rc = check_family(t, &m[i], i, err)) != 0)
			return rc;
	}
	if (n == 0 && t != CHAT_RAW)
		return err_set(err, ERR_INVAL, "no messages to render");
	if (needs_alternation(t))
		return check_alternation(t, m, n, err);
	return 0;
}

/* Checks a YYYY-MM-DD date, or writes today's (local time, as transformers' strftime_now) into buf. */
static int
harmony_date(const char *date, char buf[11], char *err)
{
	static const char shape[] = "dddd-dd-dd";
	struct tm tm;
	time_t now;
	size_t i;

	if (date == NULL) {
		now = time(NULL);
		if (localtime_r(&now, &tm) == NULL || strftime(buf, 11, "%Y-%m-%d", &tm) != 10)
			return err_set(err, ERR_RANGE, "today's date does not fit YYYY-MM-DD");
		return 0;
	}
	for (i = 0; i < sizeof shape - 1; i++)
		if (shape[i] == 'd' ? date[i] < '0' || date[i] > '9' : date[i] != shape[i])
			break;
	if (i < sizeof shape - 1 || date[i] != '\0')
		return err_set(err, ERR_INVAL, "date '%.16s' is not YYYY-MM-DD", date);
	memcpy(buf, date, 11);
	return 0;
}

/* ---- tools, calls and results, as the templates write them ---- */

/* Appends JSON text (checked before) as the templates' tojson writes it. */
static void
sb_py_text(struct strbuf *b, const char *text, int indent)
{
	json_t *v = chat_json(text);

	chat_py_json(b, v, indent);
	json_decref(v);
}

/* Appends a string as tojson writes it: a JSON string with Python's escapes. */
static void
sb_py_str(struct strbuf *b, const char *s)
{
	json_t *v = json_string(s);

	chat_py_json(b, v, 0);
	json_decref(v);
}

/* The function object of tool i. */
static const json_t *
tool_fn(const json_t *tools, size_t i)
{
	return json_object_get(json_array_get(tools, i), "function");
}

/* A string member of an object, or "" (what the templates print for one missing). */
static const char *
str_of(const json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s != NULL ? s : "";
}

/* Raw prompt mode: the contents, nothing else. */
static void
render_raw(const struct chat_msg *m, size_t n, struct strbuf *b)
{
	size_t i;

	for (i = 0; i < n; i++)
		strbuf_cat(b, m[i].content);
}

/* Llama 3.1's instructions for custom tools, in the first user message. */
#define LLAMA3_TOOLS "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please " \
	"respond with a JSON for a function call with its proper arguments that best answers the given " \
	"prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of argument " \
	"name and its value}.Do not use variables.\n\n"

/*
 * Llama 3.1's system turn and first user turn with the tools (its
 * tools_in_user_message default), its date as strftime's "%d %b %Y".
 * Returns the messages it rendered.
 */
static size_t
llama3_tools(const struct chat_msg *m, const json_t *tools, const char *date, struct strbuf *b)
{
	static const char *const months[] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep",
		"Oct", "Nov", "Dec" };
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;
	int month = atoi(date + 5);

	strbuf_cat(b, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
	    "Cutting Knowledge Date: December 2023\n");
	strbuf_printf(b, "Today Date: %.2s %s %.4s\n\n", date + 8, months[(month >= 1 && month <= 12 ? month : 1) - 1],
	    date);
	if (first)
		sb_strip(b, m[0].content, strlen(m[0].content));
	strbuf_cat(b, "<|eot_id|>" LLAMA3_TOOLS);
	for (i = 0; i < json_array_size(tools); i++) {
		chat_py_json(b, json_array_get(tools, i), 4);
		strbuf_cat(b, "\n\n");
	}
	sb_strip(b, m[first].content, strlen(m[first].content));
	strbuf_cat(b, "<|eot_id|>");
	return first + 1;
}

/*
 * Meta-Llama-3-8B-Instruct: BOS, then each turn with its content trimmed;
 * with tools, Llama 3.1's: the tools in the first user turn, a call as
 * {"name", "parameters"}, a result as an ipython turn of its JSON string.
 */
static void
render_llama3(const struct chat_msg *m, size_t n, int gen, const char *bos, const json_t *tools, const char *date,
    struct strbuf *b)
{
	size_t i = 0;

	strbuf_cat(b, bos);
	if (tools != NULL)
		i = llama3_tools(m, tools, date, b);
	for (; i < n; i++) {
		if (role_of(&m[i]) == ROLE_TOOL) {
			strbuf_cat(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
			sb_py_str(b, m[i].content);
		} else if (m[i].n_calls > 0) {
			strbuf_printf(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"%s\", "
			    "\"parameters\": ", m[i].calls[0].name);
			sb_py_text(b, m[i].calls[0].arguments, 0);
			strbuf_cat(b, "}");
		} else {
			strbuf_cat(b, "<|start_header_id|>");
			strbuf_cat(b, m[i].role);
			strbuf_cat(b, "<|end_header_id|>\n\n");
			sb_strip(b, m[i].content, strlen(m[i].content));
		}
		strbuf_cat(b, "<|eot_id|>");
	}
	if (gen)
		strbuf_cat(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* One ChatML turn, its content verbatim. */
static void
chatml_turn(const struct chat_msg *m, struct strbuf *b)
{
	strbuf_cat(b, "<|im_start|>");
	strbuf_cat(b, m->role);
	strbuf_cat(b, "\n");
	strbuf_cat(b, m->content);
	strbuf_cat(b, "<|im_end|>\n");
}

/* Qwen's tools, in the system turn after its system prompt. */
#define QWEN_TOOLS_HEAD "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" \
	"You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
#define QWEN_TOOLS_TAIL "\n</tools>\n\nFor each function call, return a json object with function name and " \
	"arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, " \
	"\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"

/* Qwen's system turn with the tools; returns the messages it rendered (its system prompt's). */
static size_t
qwen_tools(const struct chat_msg *m, size_t n, const json_t *tools, struct strbuf *b)
{
	size_t i, sys = n > 0 && role_of(&m[0]) == ROLE_SYSTEM;

	strbuf_cat(b, "<|im_start|>system\n");
	if (sys) {
		strbuf_cat(b, m[0].content);
		strbuf_cat(b, "\n\n");
	}
	strbuf_cat(b, QWEN_TOOLS_HEAD);
	for (i = 0; i < json_array_size(tools); i++) {
		strbuf_cat(b, "\n");
		chat_py_json(b, json_array_get(tools, i), 0);
	}
	strbuf_cat(b, QWEN_TOOLS_TAIL);
	return sys;
}

/* A tool result: Qwen puts a run of them in one user turn, each in a <tool_response> block. */
static void
qwen_tool_result(const struct chat_msg *m, size_t n, size_t i, struct strbuf *b)
{
	if (i == 0 || role_of(&m[i - 1]) != ROLE_TOOL)
		strbuf_cat(b, "<|im_start|>user");
	strbuf_cat(b, "\n<tool_response>\n");
	strbuf_cat(b, m[i].content);
	strbuf_cat(b, "\n</tool_response>");
	if (i == n - 1 || role_of(&m[i + 1]) != ROLE_TOOL)
		strbuf_cat(b, "<|im_end|>\n");
}

/*
 * One Qwen call. Qwen3's template writes arguments given as a string (the
 * protocol's JSON text) verbatim; Qwen2.5's has only tojson, which the
 * official examples feed an object: its Python spelling.
 */
static void
qwen_call(const struct chat_call *c, int verbatim, struct strbuf *b)
{
	strbuf_printf(b, "<tool_call>\n{\"name\": \"%s\", \"arguments\": ", c->name);
	if (verbatim)
		strbuf_cat(b, c->arguments);
	else
		sb_py_text(b, c->arguments, 0);
	strbuf_cat(b, "}\n</tool_call>");
}

/* A Qwen2.5 assistant turn with calls: its content (if any) on the header's next line, each call on its own. */
static void
chatml_calls(const struct chat_msg *m, struct strbuf *b)
{
	size_t k;

	strbuf_cat(b, "<|im_start|>assistant");
	if (m->content[0] != '\0') {
		strbuf_cat(b, "\n");
		strbuf_cat(b, m->content);
	}
	for (k = 0; k < m->n_calls; k++) {
		strbuf_cat(b, "\n");
		qwen_call(&m->calls[k], 0, b);
	}
	strbuf_cat(b, "<|im_end|>\n");
}

/*
 * ChatML (Qwen2.5): contents verbatim, no BOS. With tools, Qwen2.5's
 * system turn, without its default system prompt when none is given (as
 * for conversations without tools; Qwen3's template has none either).
 */
static void
render_chatml(const struct chat_msg *m, size_t n, int gen, const json_t *tools, struct strbuf *b)
{
	size_t i = tools != NULL ? qwen_tools(m, n, tools, b) : 0;

	for (; i < n; i++) {
		if (role_of(&m[i]) == ROLE_TOOL)
			qwen_tool_result(m, n, i, b);
		else if (m[i].n_calls > 0)
			chatml_calls(&m[i], b);
		else
			chatml_turn(&m[i], b);
	}
	if (gen)
		strbuf_cat(b, "<|im_start|>assistant\n");
}

/* 1 if s starts with p. */
static int
starts_with(const char *s, const char *p)
{
	return strncmp(s, p, strlen(p)) == 0;
}

/* 1 if s ends with p. */
static int
ends_with(const char *s, const char *p)
{
	size_t n = strlen(s), k = strlen(p);

	return n >= k && memcmp(s + n - k, p, k) == 0;
}

/* The last occurrence of p in s[0..n), or NULL. */
static const char *
find_last(const char *s, size_t n, const char *p)
{
	const char *at = NULL, *hit;
	size_t k = strlen(p);

	while ((hit = memmem(s, n, p, k)) != NULL) {
		at = hit;
		n -= (size_t)(hit + 1 - s);
		s = hit + 1;
	}
	return at;
}

/* Qwen3's last query: the last user turn that is not one tool response; n - 1 if none. */
static size_t
qwen3_last_query(const struct chat_msg *m, size_t n)
{
	size_t i;

	for (i = n; i-- > 0;)
		if (role_of(&m[i]) == ROLE_USER && !(starts_with(m[i].content, "<tool_response>") &&
		    ends_with(m[i].content, "</tool_response>")))
			return i;
	return n - 1;
}

/*
 * A Qwen3 assistant turn. Its reasoning is the message's own where it has
 * one; else content with a </think> is cut in two, as the template's
 * splits do: the reasoning is what precedes the first </think> (after the
 * last <think> there), the reply what follows the last one. keep: the turn
 * follows the last query, where the reasoning is rendered if it is not
 * empty or the turn ends the conversation.
 */
static void
qwen3_assistant(const struct chat_msg *m, int keep, int last, struct strbuf *b)
{
	const char *c = m->content, *end = m->reasoning ? NULL : strstr(c, "</think>"), *open;
	size_t len = strlen(c), r_len = m->reasoning ? strlen(m->reasoning) : 0;
	const char *reply = c, *reason = m->reasoning ? m->reasoning : c;

	if (end != NULL) {
		reply = find_last(c, len, "</think>") + 8;
		while (*reply == '\n')
			reply++;
		while (end > c && end[-1] == '\n')
			end--;
		open = find_last(c, (size_t)(end - c), "<think>");
		reason = open != NULL ? open + 7 : c;
		r_len = (size_t)(end - reason);
	}
	strbuf_cat(b, "<|im_start|>assistant\n");
	if (keep && (last || r_len > 0)) {
		strbuf_cat(b, "<think>\n");
		sb_strip_nl(b, reason, r_len, NL_START | NL_END);
		strbuf_cat(b, "\n</think>\n\n");
		sb_strip_nl(b, reply, strlen(reply), NL_START);
	} else {
		strbuf_cat(b, reply);
	}
	for (size_t k = 0; k < m->n_calls; k++) {
		if (k > 0 || reply[0] != '\0')
			strbuf_cat(b, "\n");
		qwen_call(&m->calls[k], 1, b);
	}
	strbuf_cat(b, "<|im_end|>\n");
}

/* Qwen3: ChatML; assistant turns lose their reasoning before the last query. */
static void
render_qwen3(const struct chat_msg *m, size_t n, const struct chat_opts *o, const json_t *tools, struct strbuf *b)
{
	size_t i = tools != NULL ? qwen_tools(m, n, tools, b) : 0, q = qwen3_last_query(m, n);

	for (; i < n; i++) {
		if (role_of(&m[i]) == ROLE_ASSISTANT)
			qwen3_assistant(&m[i], i > q, i == n - 1, b);
		else if (role_of(&m[i]) == ROLE_TOOL)
			qwen_tool_result(m, n, i, b);
		else
			chatml_turn(&m[i], b);
	}
	if (o->add_generation_prompt)
		strbuf_cat(b, o->think == THINK_OFF ? "<|im_start|>assistant\n<think>\n\n</think>\n\n" :
		    "<|im_start|>assistant\n");
}

/* Jinja's truth of a JSON value: not missing, null, false, 0, "" or empty. */
static int
truthy(const json_t *v)
{
	switch (v == NULL ? JSON_NULL : json_typeof(v)) {
	case JSON_OBJECT: return json_object_size(v) > 0;
	case JSON_ARRAY: return json_array_size(v) > 0;
	case JSON_STRING: return json_string_length(v) > 0;
	case JSON_INTEGER: return json_integer_value(v) != 0;
	case JSON_REAL: return json_real_value(v) != 0;
	case JSON_TRUE: return 1;
	default: return 0;
	}
}

/* Whether a JSON Schema's "type" is the name t. */
static int
type_is(const json_t *spec, const char *t)
{
	const char *s = json_string_value(json_object_get(spec, "type"));

	return s != NULL && strcmp(s, t) == 0;
}

/* Whether name is in the array req. */
static int
listed(const json_t *req, const char *name)
{
	const json_t *v;
	size_t i;

	json_array_foreach(req, i, v)
		if (json_is_string(v) && strcmp(json_string_value(v), name) == 0)
			return 1;
	return 0;
}

static void ts_type(struct strbuf *b, const json_t *spec);

/* An array's TypeScript type: its items' type and [], "any[]" for a long or doubled one. */
static void
ts_array(struct strbuf *b, const json_t *spec)
{
	const json_t *items = json_object_get(spec, "items");
	struct strbuf in = { 0 };

	if (!truthy(items)) {
		strbuf_cat(b, "any[]");
	} else if (type_is(items, "string")) {
		strbuf_cat(b, "string[]");
	} else if (type_is(items, "number") || type_is(items, "integer")) {
		strbuf_cat(b, "number[]");
	} else if (type_is(items, "boolean")) {
		strbuf_cat(b, "boolean[]");
	} else {
		strbuf_add(&in, "", 0);
		ts_type(&in, items);
		strbuf_cat(b, strcmp(in.s, "object | object") == 0 || in.n > 50 ? "any" : in.s);
		strbuf_cat(b, "[]");
		free(in.s);
	}
	if (truthy(json_object_get(spec, "nullable")))
		strbuf_cat(b, " | null");
}

/* An object's TypeScript type: its properties inline, with the template's line breaks. */
static void
ts_object(struct strbuf *b, const json_t *spec)
{
	const json_t *props = json_object_get(spec, "properties"), *req = json_object_get(spec, "required"), *p;
	const char *name;
	size_t i = 0;

	if (!truthy(props)) {
		strbuf_cat(b, "object");
		return;
	}
	strbuf_cat(b, "{\n");
	json_object_foreach((json_t *)props, name, p) {
		if (i++ > 0)
			strbuf_cat(b, ", ");
		strbuf_cat(b, name);
		if (!listed(req, name))
			strbuf_cat(b, "?");
		/* the macro's call is an unstripped {{ }} on its own line */
		strbuf_cat(b, ": \n                ");
		ts_type(b, p);
	}
	strbuf_cat(b, "}");
}

/*
 * gpt-oss's render_typescript_type: a JSON Schema as a TypeScript type.
 * oneOf is rendered as its branches joined by " | " (the template adds
 * each branch's description and default as comments; those are left out).
 */
static void
ts_type(struct strbuf *b, const json_t *spec)
{
	const json_t *type = json_object_get(spec, "type"), *one = json_object_get(spec, "oneOf"), *v;
	int objects = 0;
	size_t i;

	if (type_is(spec, "array")) {
		ts_array(b, spec);
	} else if (json_is_array(type) && json_array_size(type) > 0) {
		json_array_foreach(type, i, v) {
			strbuf_cat(b, i > 0 ? " | " : "");
			strbuf_cat(b, json_is_string(v) ? json_string_value(v) : "");
		}
	} else if (truthy(one)) {
		json_array_foreach(one, i, v)
			objects |= type_is(v, "object");
		if (objects && json_array_size(one) > 1) {
			strbuf_cat(b, "any");
			return;
		}
		json_array_foreach(one, i, v) {
			strbuf_cat(b, i > 0 ? " | " : "");
			ts_type(b, v);
		}
	} else if (type_is(spec, "string") && truthy(json_object_get(spec, "enum"))) {
		json_array_foreach(json_object_get(spec, "enum"), i, v) {
			strbuf_cat(b, i > 0 ? "\" | \"" : "\"");
			strbuf_cat(b, json_is_string(v) ? json_string_value(v) : "");
		}
		strbuf_cat(b, "\"");
	} else if (type_is(spec, "string")) {
		strbuf_cat(b, truthy(json_object_get(spec, "nullable")) ? "string | null" : "string");
	} else if (type_is(spec, "number") || type_is(spec, "integer")) {
		strbuf_cat(b, "number");
	} else if (type_is(spec, "boolean")) {
		strbuf_cat(b, "boolean");
	} else if (type_is(spec, "object")) {
		ts_object(b, spec);
	} else {
		strbuf_cat(b, "any");
	}
}

/* One parameter of a tool: its description as a comment, name, type, default. */
static void
ts_param(struct strbuf *b, const char *name, const json_t *spec, const json_t *req)
{
	const json_t *def = json_object_get(spec, "default");

	if (truthy(json_object_get(spec, "description")))
		strbuf_printf(b, "// %s\n", str_of(spec, "description"));
	strbuf_cat(b, name);
	if (!listed(req, name))
		strbuf_cat(b, "?");
	strbuf_cat(b, ": ");
	ts_type(b, spec);
	if (def != NULL && truthy(json_object_get(spec, "enum")) && json_is_string(def)) {
		strbuf_printf(b, ", // default: %s", json_string_value(def));
	} else if (def != NULL && !truthy(json_object_get(spec, "oneOf"))) {
		strbuf_cat(b, ", // default: ");
		chat_py_json(b, def, 0);
	}
	strbuf_cat(b, ",\n");
}

/* gpt-oss's developer message tools: the namespace functions, each tool a TypeScript type. */
static void
harmony_tools(const json_t *tools, struct strbuf *b)
{
	const json_t *fn, *params, *props, *p;
	const char *name;
	size_t i;

	strbuf_cat(b, "# Tools\n\n## functions\n\nnamespace functions {\n\n");
	for (i = 0; i < json_array_size(tools); i++) {
		fn = tool_fn(tools, i);
		params = json_object_get(fn, "parameters");
		props = json_object_get(params, "properties");
		strbuf_printf(b, "// %s\ntype %s = ", str_of(fn, "description"), str_of(fn, "name"));
		if (!truthy(params) || !truthy(props)) {
			strbuf_cat(b, "() => any;\n\n");
			continue;
		}
		strbuf_cat(b, "(_: {\n");
		json_object_foreach((json_t *)props, name, p)
			ts_param(b, name, p, json_object_get(params, "required"));
		strbuf_cat(b, "}) => any;\n\n");
	}
	strbuf_cat(b, "} // namespace functions");
}

/* Whether an assistant message without calls follows message i (gpt-oss then drops i's analysis). */
static int
final_follows(const struct chat_msg *m, size_t n, size_t i)
{
	for (size_t k = i + 1; k < n; k++)
		if (role_of(&m[k]) == ROLE_ASSISTANT && m[k].n_calls == 0)
			return 1;
	return 0;
}

/* A gpt-oss assistant turn with a call: its analysis unless a final answer follows, then the call. */
static void
harmony_call(const struct chat_msg *m, size_t n, size_t i, struct strbuf *b)
{
	const char *analysis = m[i].content[0] != '\0' ? m[i].content : m[i].reasoning;

	if (analysis != NULL && analysis[0] != '\0' && !final_follows(m, n, i)) {
		strbuf_cat(b, "<|start|>assistant<|channel|>analysis<|message|>");
		strbuf_cat(b, analysis);
		strbuf_cat(b, "<|end|>");
	}
	strbuf_printf(b, "<|start|>assistant to=functions.%s<|channel|>commentary json<|message|>",
	    m[i].calls[0].name);
	sb_py_text(b, m[i].calls[0].arguments, 0);
	strbuf_cat(b, "<|call|>");
}

/*
 * gpt-oss's system message (its reasoning effort, the channel for tool
 * calls), and the developer's instructions and tools.
 */
static void
harmony_head(const struct chat_msg *m, const json_t *tools, const char *date, enum chat_think think,
    struct strbuf *b)
{
	const char *dev = role_of(&m[0]) == ROLE_SYSTEM ? m[0].content : "";

	strbuf_cat(b, HARMONY_SYS_HEAD);
	strbuf_cat(b, date);
	strbuf_printf(b, "\n\nReasoning: %s", think == THINK_OFF || think == THINK_LOW ? "low" :
	    think == THINK_HIGH ? "high" : "medium");
	strbuf_cat(b, HARMONY_SYS_TAIL);
	if (tools != NULL)
		strbuf_cat(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
	strbuf_cat(b, "<|end|>");
	if (dev[0] == '\0' && tools == NULL)
		return;
	strbuf_cat(b, "<|start|>developer<|message|>");
	if (dev[0] != '\0') {
		strbuf_cat(b, "# Instructions\n\n");
		strbuf_cat(b, dev);
		strbuf_cat(b, "\n\n");
	}
	if (tools != NULL)
		harmony_tools(tools, b);
	strbuf_cat(b, "<|end|>");
}

/*
 * gpt-oss (harmony): the fixed system message, the user's system prompt as
 * the developer's instructions (with the tools as a TypeScript namespace),
 * assistant turns on their final channel (the last one ending with
 * <|return|> when no reply follows, with its reasoning on the analysis
 * channel before it), a call as a commentary message to=functions.NAME,
 * its result from functions.NAME as a JSON string.
 */
static void
render_harmony(const struct chat_msg *m, size_t n, int gen, const json_t *tools, const char *date,
    enum chat_think think, struct strbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;
	const char *called = NULL;

	harmony_head(m, tools, date, think, b);
	for (i = first; i < n; i++) {
		if (role_of(&m[i]) == ROLE_USER) {
			strbuf_cat(b, "<|start|>user<|message|>");
			strbuf_cat(b, m[i].content);
			strbuf_cat(b, "<|end|>");
			continue;
		}
		if (role_of(&m[i]) == ROLE_TOOL) {
			strbuf_printf(b, "<|start|>functions.%s to=assistant<|channel|>commentary<|message|>", called);
			sb_py_str(b, m[i].content);
			strbuf_cat(b, "<|end|>");
			continue;
		}
		if (m[i].n_calls > 0) {
			harmony_call(m, n, i, b);
			called = m[i].calls[0].name;
			continue;
		}
		called = NULL;
		if (i == n - 1 && !gen && m[i].reasoning != NULL) {
			strbuf_cat(b, "<|start|>assistant<|channel|>analysis<|message|>");
			strbuf_cat(b, m[i].reasoning);
			strbuf_cat(b, "<|end|>");
		}
		strbuf_cat(b, "<|start|>assistant<|channel|>final<|message|>");
		strbuf_cat(b, m[i].content);
		strbuf_cat(b, i == n - 1 && !gen ? "<|return|>" : "<|end|>");
	}
	if (gen)
		strbuf_cat(b, "<|start|>assistant");
}

/*
 * Gemma 3 has no tokens or template for tools: its function calling guide
 * (ai.google.dev/gemma/docs/capabilities/function-calling) prompts them in
 * the user turn, and of its two documented call formats this is the JSON
 * one, which a JSON Schema grammar can constrain. The tools follow as a
 * JSON list of their function objects.
 */
#define GEMMA_TOOLS "You have access to functions. If you decide to invoke any of the function(s), you MUST " \
	"put it in the format of\n{\"name\": function name, \"parameters\": dictionary of argument name and its " \
	"value}\n\nYou SHOULD NOT include any other text in the response if you call a function\n"

/* Gemma's tools, in the first user turn after the system text. */
static void
gemma_tools(const json_t *tools, struct strbuf *b)
{
	json_t *fns = json_array();

	for (size_t i = 0; i < json_array_size(tools); i++)
		json_array_append(fns, (json_t *)tool_fn(tools, i));
	strbuf_cat(b, GEMMA_TOOLS);
	chat_py_json(b, fns, 2);
	strbuf_cat(b, "\n\n");
	json_decref(fns);
}

/* A model turn's calls, one JSON object a line after its content (the format gemma_tools asks for). */
static void
gemma_calls(const struct chat_msg *m, size_t content_len, struct strbuf *b)
{
	for (size_t k = 0; k < m->n_calls; k++) {
		if (k > 0 || content_len > 0)
			strbuf_cat(b, "\n");
		strbuf_printf(b, "{\"name\": \"%s\", \"parameters\": ", m->calls[k].name);
		sb_py_text(b, m->calls[k].arguments, 0);
		strbuf_cat(b, "}");
	}
}

/*
 * Gemma 3: the system text (untrimmed) + blank line opens the first user
 * turn, then the tools; contents trimmed. Tool results are a user turn, a
 * run of them one turn with a blank line between.
 */
static void
render_gemma(const struct chat_msg *m, size_t n, int gen, const char *bos, const json_t *tools, struct strbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM, at;
	int tool, more;

	strbuf_cat(b, bos);
	for (i = first; i < n; i++) {
		tool = role_of(&m[i]) == ROLE_TOOL;
		more = tool && i + 1 < n && role_of(&m[i + 1]) == ROLE_TOOL;
		if (!tool || role_of(&m[i - 1]) != ROLE_TOOL)
			strbuf_cat(b, role_of(&m[i]) == ROLE_ASSISTANT ? "<start_of_turn>model\n" :
			    "<start_of_turn>user\n");
		if (first && i == first) {
			strbuf_cat(b, m[0].content);
			strbuf_cat(b, "\n\n");
		}
		if (tools != NULL && i == first)
			gemma_tools(tools, b);
		at = b->n;
		sb_strip(b, m[i].content, strlen(m[i].content));
		gemma_calls(&m[i], b->n - at, b);
		strbuf_cat(b, more ? "\n\n" : "<end_of_turn>\n");
	}
	if (gen)
		strbuf_cat(b, "<start_of_turn>model\n");
}

/* How one of Mistral's [INST] templates spells a conversation. */
struct inst_style {
	const char *open, *close; /* around a user turn */
	int sys_last;             /* the system text joins the last message, else the first user turn */
	int strip_reply;          /* assistant contents are stripped */
};

/* v3: the system text joins the last message if it is a user turn, else it is dropped. */
static const struct inst_style inst_v3 = { "[INST] ", "[/INST]", 1, 1 };
/* v1 (Mixtral 8x7B): spaces around the markers, the system text in the first turn, no stripping. */
static const struct inst_style inst_v1 = { " [INST] ", " [/INST]", 0, 0 };

/*
 * Mistral v3's tools, before the last user turn: each function object's
 * members written by hand as its template does (strings unescaped, other
 * values through tojson, "return" left out).
 */
static void
mistral_tools(const json_t *tools, struct strbuf *b)
{
	const char *key;
	const json_t *v;
	size_t i, k;

	strbuf_cat(b, "[AVAILABLE_TOOLS] [");
	for (i = 0; i < json_array_size(tools); i++) {
		strbuf_cat(b, "{\"type\": \"function\", \"function\": {");
		k = 0;
		json_object_foreach((json_t *)tool_fn(tools, i), key, v) {
			if (strcmp(key, "return") == 0)
				continue;
			strbuf_printf(b, "%s\"%s\": ", k++ > 0 ? ", " : "", key);
			if (json_is_string(v))
				strbuf_printf(b, "\"%s\"", json_string_value(v));
			else
				chat_py_json(b, v, 0);
		}
		strbuf_cat(b, i + 1 < json_array_size(tools) ? "}}, " : "}}]");
	}
	strbuf_cat(b, "[/AVAILABLE_TOOLS]");
}

/* Mistral v3's calls: the function objects {name, arguments} with their ids, then </s>. */
static void
mistral_calls(const struct chat_msg *m, struct strbuf *b)
{
	struct strbuf o = { 0 };
	json_t *fn;

	strbuf_cat(b, "[TOOL_CALLS] [");
	for (size_t k = 0; k < m->n_calls; k++) {
		fn = json_pack("{s:s,s:o}", "name", m->calls[k].name, "arguments", chat_json(m->calls[k].arguments));
		o.n = 0;
		chat_py_json(&o, fn, 0);
		json_decref(fn);
		/* the template cuts tojson's closing brace to add the id */
		strbuf_add(b, o.s, o.n - 1);
		strbuf_printf(b, ", \"id\": \"%s\"}%s", m->calls[k].id, k + 1 < m->n_calls ? ", " : "]</s>");
	}
	free(o.s);
}

/* The last user message's index, n if none. */
static size_t
last_user(const struct chat_msg *m, size_t n)
{
	for (size_t i = n; i-- > 0;)
		if (role_of(&m[i]) == ROLE_USER)
			return i;
	return n;
}

/*
 * Mistral's v1 and v3 templates: BOS, user turns in [INST] markers, each
 * reply closed by </s>; v3's tools before the last user turn, its calls
 * and results in [TOOL_CALLS] and [TOOL_RESULTS] (v1 has none: check_tools).
 */
static void
render_inst(const struct chat_msg *m, size_t n, const char *bos, const struct inst_style *st,
    const json_t *tools, struct strbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM, sys_at = st->sys_last ? n - 1 : first;
	size_t tools_at = tools != NULL ? last_user(m, n) : n;

	strbuf_cat(b, bos);
	for (i = first; i < n; i++) {
		if (role_of(&m[i]) == ROLE_TOOL) {
			strbuf_printf(b, "[TOOL_RESULTS] {\"content\": %s, \"call_id\": \"%s\"}[/TOOL_RESULTS]",
			    m[i].content, m[i].tool_call_id);
			continue;
		}
		if (m[i].n_calls > 0) {
			mistral_calls(&m[i], b);
			continue;
		}
		if (i == tools_at)
			mistral_tools(tools, b);
		if (role_of(&m[i]) == ROLE_ASSISTANT) {
			strbuf_cat(b, " ");
			if (st->strip_reply)
				sb_strip(b, m[i].content, strlen(m[i].content));
			else
				strbuf_cat(b, m[i].content);
			strbuf_cat(b, "</s>");
			continue;
		}
		strbuf_cat(b, st->open);
		if (first && i == sys_at) {
			strbuf_cat(b, m[0].content);
			strbuf_cat(b, "\n\n");
		}
		strbuf_cat(b, m[i].content);
		strbuf_cat(b, st->close);
	}
}

/* Llama 2 chat: <<SYS>> joins the first user turn; each whole turn is stripped; BOS before every user turn. */
static void
render_llama2(const struct chat_msg *m, size_t n, const char *bos, struct strbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;
	struct strbuf turn = { 0 };

	for (i = first; i < n; i++) {
		turn.n = 0;
		if (first && i == first) {
			strbuf_cat(&turn, "<<SYS>>\n");
			strbuf_cat(&turn, m[0].content);
			strbuf_cat(&turn, "\n<</SYS>>\n\n");
		}
		strbuf_cat(&turn, m[i].content);
		if (role_of(&m[i]) == ROLE_USER) {
			strbuf_cat(b, bos);
			strbuf_cat(b, "[INST] ");
			sb_strip(b, turn.s, turn.n);
			strbuf_cat(b, " [/INST]");
		} else {
			strbuf_cat(b, " ");
			sb_strip(b, turn.s, turn.n);
			strbuf_cat(b, " </s>");
		}
	}
	free(turn.s);
}

int
chat_render_opts(enum chat_tmpl t, const struct chat_msg *msgs, size_t n,
    const struct chat_opts *o, char **out, size_t *out_len, char *err)
{
	int gen = o->add_generation_prompt, rc;
	struct strbuf b = { 0 };
	json_t *tools = NULL;
	const char *bos;
	char date[11];

	if ((size_t)t >= ARRAY_LEN(tmpl_names))
		return err_set(err, ERR_INVAL, "chat template %d does not exist", (int)t);
	if ((rc = check_msgs(t, msgs, n, err)) != 0 || (rc = check_tools(t, msgs, n, o, err)) != 0 ||
	    ((t == CHAT_HARMONY || (t == CHAT_LLAMA3 && o->tools != NULL)) &&
	    (rc = harmony_date(o->date, date, err)) != 0))
		return rc;
	/* json_is_array evaluates its argument twice: parse first */
	if (o->tools != NULL && (tools = chat_json(o->tools), !json_is_array(tools))) {
		json_decref(tools);
		return err_set(err, ERR_INVAL, "the tools are not a JSON array");
	}
	bos = o->bos_text != NULL ? o->bos_text : default_bos[t];
	strbuf_add(&b, "", 0);
	switch (t) {
	case CHAT_RAW:
		render_raw(msgs, n, &b);
		break;
	case CHAT_LLAMA3:
		render_llama3(msgs, n, gen, bos, tools, date, &b);
		break;
	case CHAT_CHATML:
		render_chatml(msgs, n, gen, tools, &b);
		break;
	case CHAT_GEMMA:
		render_gemma(msgs, n, gen, bos, tools, &b);
		break;
	case CHAT_MISTRAL:
		render_inst(msgs, n, bos, &inst_v3, tools, &b);
		break;
	case CHAT_LLAMA2:
		render_llama2(msgs, n, bos, &b);
		break;
	case CHAT_QWEN3:
		render_qwen3(msgs, n, o, tools, &b);
		break;
	case CHAT_HARMONY:
		render_harmony(msgs, n, gen, tools, date, o->think, &b);
		break;
	case CHAT_MISTRAL_V1:
		render_inst(msgs, n, bos, &inst_v1, tools, &b);
		break;
	}
	json_decref(tools);
	*out = b.s;
	*out_len = b.n;
	return 0;
}

int
chat_render(enum chat_tmpl t, const struct chat_msg *msgs, size_t n,
    int add_generation_prompt, const char *bos_text, char **out,
    size_t *out_len, char *err)
{
	struct chat_opts o = { .add_generation_prompt = add_generation_prompt, .bos_text = bos_text };

	return chat_render_opts(t, msgs, n, &o, out, out_len, err);
}
