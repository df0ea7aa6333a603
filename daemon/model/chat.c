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
#define HARMONY_SYS_TAIL "\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, " \
	"final. Channel must be included for every message.<|end|>"

enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_BAD };

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

/* Checks the turn order the alternating families' templates require. */
static int
check_alternation(enum chat_tmpl t, const struct chat_msg *m, size_t n, char *err)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;
	enum chat_role want;

	for (i = first; i < n; i++) {
		want = (i - first) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
		if (role_of(&m[i]) != want)
			return err_set(err, ERR_INVAL, "message %zu: the %s template needs roles to "
			    "alternate user/assistant/user/... after the optional system message",
			    i, tmpl_names[t]);
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
			    "user or assistant)", i, m[i].role ? m[i].role : "(null)");
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

/* Raw prompt mode: the contents, nothing else. */
static void
render_raw(const struct chat_msg *m, size_t n, struct strbuf *b)
{
	size_t i;

	for (i = 0; i < n; i++)
		strbuf_cat(b, m[i].content);
}

/* Meta-Llama-3-8B-Instruct: BOS, then each turn with its content trimmed. */
static void
render_llama3(const struct chat_msg *m, size_t n, int gen, const char *bos, struct strbuf *b)
{
	size_t i;

	strbuf_cat(b, bos);
	for (i = 0; i < n; i++) {
		strbuf_cat(b, "<|start_header_id|>");
		strbuf_cat(b, m[i].role);
		strbuf_cat(b, "<|end_header_id|>\n\n");
		sb_strip(b, m[i].content, strlen(m[i].content));
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

/* ChatML (Qwen2.5): contents verbatim, no BOS. */
static void
render_chatml(const struct chat_msg *m, size_t n, int gen, struct strbuf *b)
{
	size_t i;

	for (i = 0; i < n; i++)
		chatml_turn(&m[i], b);
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
	strbuf_cat(b, "<|im_end|>\n");
}

/* Qwen3: ChatML; assistant turns lose their reasoning before the last query. */
static void
render_qwen3(const struct chat_msg *m, size_t n, const struct chat_opts *o, struct strbuf *b)
{
	size_t i, q = qwen3_last_query(m, n);

	for (i = 0; i < n; i++) {
		if (role_of(&m[i]) == ROLE_ASSISTANT)
			qwen3_assistant(&m[i], i > q, i == n - 1, b);
		else
			chatml_turn(&m[i], b);
	}
	if (o->add_generation_prompt)
		strbuf_cat(b, o->no_thinking ? "<|im_start|>assistant\n<think>\n\n</think>\n\n" :
		    "<|im_start|>assistant\n");
}

/*
 * gpt-oss (harmony): the fixed system message, the user's system prompt as
 * the developer's instructions, assistant turns on their final channel (the
 * last one ending with <|return|> when no reply follows, with its reasoning
 * on the analysis channel before it).
 */
static void
render_harmony(const struct chat_msg *m, size_t n, int gen, const char *date, struct strbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;

	strbuf_cat(b, HARMONY_SYS_HEAD);
	strbuf_cat(b, date);
	strbuf_cat(b, HARMONY_SYS_TAIL);
	if (first && m[0].content[0] != '\0') {
		strbuf_cat(b, "<|start|>developer<|message|># Instructions\n\n");
		strbuf_cat(b, m[0].content);
		strbuf_cat(b, "\n\n<|end|>");
	}
	for (i = first; i < n; i++) {
		if (role_of(&m[i]) == ROLE_USER) {
			strbuf_cat(b, "<|start|>user<|message|>");
			strbuf_cat(b, m[i].content);
			strbuf_cat(b, "<|end|>");
			continue;
		}
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

/* Gemma 3: the system text (untrimmed) + blank line opens the first user turn; contents trimmed. */
static void
render_gemma(const struct chat_msg *m, size_t n, int gen, const char *bos, struct strbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;

	strbuf_cat(b, bos);
	for (i = first; i < n; i++) {
		strbuf_cat(b, role_of(&m[i]) == ROLE_USER ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
		if (first && i == first) {
			strbuf_cat(b, m[0].content);
			strbuf_cat(b, "\n\n");
		}
		sb_strip(b, m[i].content, strlen(m[i].content));
		strbuf_cat(b, "<end_of_turn>\n");
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

/* Mistral's v1 and v3 templates: BOS, user turns in [INST] markers, each reply closed by </s>. */
static void
render_inst(const struct chat_msg *m, size_t n, const char *bos, const struct inst_style *st,
    struct strbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM, sys_at = st->sys_last ? n - 1 : first;

	strbuf_cat(b, bos);
	for (i = first; i < n; i++) {
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
	const char *bos;
	char date[11];

	if ((size_t)t >= ARRAY_LEN(tmpl_names))
		return err_set(err, ERR_INVAL, "chat template %d does not exist", (int)t);
	if ((rc = check_msgs(t, msgs, n, err)) != 0 ||
	    (t == CHAT_HARMONY && (rc = harmony_date(o->date, date, err)) != 0))
		return rc;
	bos = o->bos_text != NULL ? o->bos_text : default_bos[t];
	strbuf_add(&b, "", 0);
	switch (t) {
	case CHAT_RAW:
		render_raw(msgs, n, &b);
		break;
	case CHAT_LLAMA3:
		render_llama3(msgs, n, gen, bos, &b);
		break;
	case CHAT_CHATML:
		render_chatml(msgs, n, gen, &b);
		break;
	case CHAT_GEMMA:
		render_gemma(msgs, n, gen, bos, &b);
		break;
	case CHAT_MISTRAL:
		render_inst(msgs, n, bos, &inst_v3, &b);
		break;
	case CHAT_LLAMA2:
		render_llama2(msgs, n, bos, &b);
		break;
	case CHAT_QWEN3:
		render_qwen3(msgs, n, o, &b);
		break;
	case CHAT_HARMONY:
		render_harmony(msgs, n, gen, date, &b);
		break;
	case CHAT_MISTRAL_V1:
		render_inst(msgs, n, bos, &inst_v1, &b);
		break;
	}
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
