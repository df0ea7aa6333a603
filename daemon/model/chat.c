/*
 * chat.c: chat template families: detection from Jinja source, rendering.
 *
 * Each render_* function is the C transcription of one official template
 * (named in chat.h, kept in tests/data/chat_templates), down to where it
 * strips whitespace and where it puts the system message. Conversations are
 * validated before rendering, so the renderers cannot fail.
 */
#include "config.h"
#include "chat.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of template source quoted in "unknown template" messages. */
#define CHAT_EXCERPT 40

enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_BAD };

/* A growing output string. */
struct sbuf {
	char *p;
	size_t n, cap;
};

static const char *const tmpl_names[] = {
	[CHAT_RAW] = "raw", [CHAT_LLAMA3] = "llama3", [CHAT_CHATML] = "chatml",
	[CHAT_GEMMA] = "gemma", [CHAT_MISTRAL] = "mistral", [CHAT_LLAMA2] = "llama2",
};

/* The BOS text a family's vocabularies use, for a NULL bos_text. */
static const char *const default_bos[] = {
	[CHAT_RAW] = "", [CHAT_LLAMA3] = "<|begin_of_text|>", [CHAT_CHATML] = "",
	[CHAT_GEMMA] = "<bos>", [CHAT_MISTRAL] = "<s>", [CHAT_LLAMA2] = "<s>",
};

/* Appends n bytes. */
static void
sb_add(struct sbuf *b, const char *s, size_t n)
{
	if (b->cap - b->n <= n) {
		while (b->cap - b->n <= n)
			b->cap = b->cap ? b->cap * 2 : 256;
		b->p = xrealloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
}

/* Appends a NUL-terminated string. */
static void
sb_str(struct sbuf *b, const char *s)
{
	sb_add(b, s, strlen(s));
}

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

/* Appends s (valid UTF-8) without leading and trailing whitespace, as Python's str.strip(). */
static void
sb_strip(struct sbuf *b, const char *str, size_t n)
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
	sb_add(b, str + i, j - i);
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
	    "or set the template family (llama3, chatml, gemma, mistral, llama2)",
	    what ? what : "unknown", ex, strlen(src) > strlen(ex) ? "..." : "");
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
	if (strstr(src, " [INST]") != NULL)
		return unsupported(src, "the Mistral v1", err);
	if (strstr(src, "\"[INST]\"") != NULL)
		return unsupported(src, "the Mistral v3-Tekken", err);
	*out = CHAT_MISTRAL;
	return 0;
}

int
chat_detect(const char *src, enum chat_tmpl *out, char *err)
{
	if (src == NULL || *src == '\0')
		return err_set(err, ERR_NOTFOUND, "the model has no chat template");
	if (strstr(src, "<|im_start|>") != NULL) {
		if (strstr(src, "<|im_sep|>") != NULL || strstr(src, "<end_of_utterance>") != NULL)
			return unsupported(src, "a ChatML variant (Phi-4, SmolVLM)", err);
		*out = CHAT_CHATML;
		return 0;
	}
	if (strncmp(src, "mistral", 7) == 0 || strstr(src, "[INST]") != NULL)
		return detect_inst(src, out, err);
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
	return err_set(err, ERR_INVAL, "unknown chat template '%.32s' (raw, llama3, chatml, gemma, "
	    "mistral, llama2)", name ? name : "(null)");
}

/* Whether the family's template insists on user/assistant alternation after one optional system message. */
static int
needs_alternation(enum chat_tmpl t)
{
	return t == CHAT_GEMMA || t == CHAT_MISTRAL || t == CHAT_LLAMA2;
}

/* Checks the turn order the gemma, mistral and llama2 templates require. */
static int
check_alternation(enum chat_tmpl t, const struct chat_msg *m, size_t n, char *err)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;
	enum chat_role r, want;

	for (i = first; i < n; i++) {
		r = role_of(&m[i]);
		want = (i - first) % 2 == 0 ? ROLE_USER : ROLE_ASSISTANT;
		if (r == ROLE_SYSTEM)
			return err_set(err, ERR_INVAL, "message %zu: the %s template allows a system "
			    "message only as the first message", i, tmpl_names[t]);
		if (r != want)
			return err_set(err, ERR_INVAL, "message %zu: the %s template needs roles to "
			    "alternate user/assistant/user/... after the optional system message",
			    i, tmpl_names[t]);
	}
	return 0;
}

/* Validates roles, contents and, where the template requires it, the turn order. */
static int
check_msgs(enum chat_tmpl t, const struct chat_msg *m, size_t n, char *err)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (role_of(&m[i]) == ROLE_BAD)
			return err_set(err, ERR_INVAL, "message %zu: unknown role '%.32s' (system, "
			    "user or assistant)", i, m[i].role ? m[i].role : "(null)");
		if (m[i].content == NULL)
			return err_set(err, ERR_INVAL, "message %zu: no content", i);
		if (!utf8_valid(m[i].content, strlen(m[i].content)))
			return err_set(err, ERR_INVAL, "message %zu: content is not valid UTF-8", i);
	}
	if (n == 0 && t != CHAT_RAW)
		return err_set(err, ERR_INVAL, "no messages to render");
	if (needs_alternation(t))
		return check_alternation(t, m, n, err);
	return 0;
}

/* Raw prompt mode: the contents, nothing else. */
static void
render_raw(const struct chat_msg *m, size_t n, struct sbuf *b)
{
	size_t i;

	for (i = 0; i < n; i++)
		sb_str(b, m[i].content);
}

/* Meta-Llama-3-8B-Instruct: BOS, then each turn with its content trimmed. */
static void
render_llama3(const struct chat_msg *m, size_t n, int gen, const char *bos, struct sbuf *b)
{
	size_t i;

	sb_str(b, bos);
	for (i = 0; i < n; i++) {
		sb_str(b, "<|start_header_id|>");
		sb_str(b, m[i].role);
		sb_str(b, "<|end_header_id|>\n\n");
		sb_strip(b, m[i].content, strlen(m[i].content));
		sb_str(b, "<|eot_id|>");
	}
	if (gen)
		sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* ChatML (Qwen2.5): contents verbatim, no BOS. */
static void
render_chatml(const struct chat_msg *m, size_t n, int gen, struct sbuf *b)
{
	size_t i;

	for (i = 0; i < n; i++) {
		sb_str(b, "<|im_start|>");
		sb_str(b, m[i].role);
		sb_str(b, "\n");
		sb_str(b, m[i].content);
		sb_str(b, "<|im_end|>\n");
	}
	if (gen)
		sb_str(b, "<|im_start|>assistant\n");
}

/* Gemma 3: the system text (untrimmed) + blank line opens the first user turn; contents trimmed. */
static void
render_gemma(const struct chat_msg *m, size_t n, int gen, const char *bos, struct sbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;

	sb_str(b, bos);
	for (i = first; i < n; i++) {
		sb_str(b, role_of(&m[i]) == ROLE_USER ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
		if (first && i == first) {
			sb_str(b, m[0].content);
			sb_str(b, "\n\n");
		}
		sb_strip(b, m[i].content, strlen(m[i].content));
		sb_str(b, "<end_of_turn>\n");
	}
	if (gen)
		sb_str(b, "<start_of_turn>model\n");
}

/* Mistral v3: the system text joins the last message if it is a user turn, else it is dropped. */
static void
render_mistral(const struct chat_msg *m, size_t n, const char *bos, struct sbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;

	sb_str(b, bos);
	for (i = first; i < n; i++) {
		if (role_of(&m[i]) == ROLE_ASSISTANT) {
			sb_str(b, " ");
			sb_strip(b, m[i].content, strlen(m[i].content));
			sb_str(b, "</s>");
			continue;
		}
		sb_str(b, "[INST] ");
		if (first && i == n - 1) {
			sb_str(b, m[0].content);
			sb_str(b, "\n\n");
		}
		sb_str(b, m[i].content);
		sb_str(b, "[/INST]");
	}
}

/* Llama 2 chat: <<SYS>> joins the first user turn; each whole turn is stripped; BOS before every user turn. */
static void
render_llama2(const struct chat_msg *m, size_t n, const char *bos, struct sbuf *b)
{
	size_t i, first = role_of(&m[0]) == ROLE_SYSTEM;
	struct sbuf turn = { 0 };

	for (i = first; i < n; i++) {
		turn.n = 0;
		if (first && i == first) {
			sb_str(&turn, "<<SYS>>\n");
			sb_str(&turn, m[0].content);
			sb_str(&turn, "\n<</SYS>>\n\n");
		}
		sb_str(&turn, m[i].content);
		if (role_of(&m[i]) == ROLE_USER) {
			sb_str(b, bos);
			sb_str(b, "[INST] ");
			sb_strip(b, turn.p, turn.n);
			sb_str(b, " [/INST]");
		} else {
			sb_str(b, " ");
			sb_strip(b, turn.p, turn.n);
			sb_str(b, " </s>");
		}
	}
	free(turn.p);
}

int
chat_render(enum chat_tmpl t, const struct chat_msg *msgs, size_t n,
    int add_generation_prompt, const char *bos_text, char **out,
    size_t *out_len, char *err)
{
	struct sbuf b = { 0 };
	int rc;

	if ((size_t)t >= ARRAY_LEN(tmpl_names))
		return err_set(err, ERR_INVAL, "chat template %d does not exist", (int)t);
	if ((rc = check_msgs(t, msgs, n, err)) != 0)
		return rc;
	if (bos_text == NULL)
		bos_text = default_bos[t];
	sb_add(&b, "", 0);
	switch (t) {
	case CHAT_RAW:
		render_raw(msgs, n, &b);
		break;
	case CHAT_LLAMA3:
		render_llama3(msgs, n, add_generation_prompt, bos_text, &b);
		break;
	case CHAT_CHATML:
		render_chatml(msgs, n, add_generation_prompt, &b);
		break;
	case CHAT_GEMMA:
		render_gemma(msgs, n, add_generation_prompt, bos_text, &b);
		break;
	case CHAT_MISTRAL:
		render_mistral(msgs, n, bos_text, &b);
		break;
	case CHAT_LLAMA2:
		render_llama2(msgs, n, bos_text, &b);
		break;
	}
	*out = b.p;
	*out_len = b.n;
	return 0;
}
