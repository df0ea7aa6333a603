/*
 * chat_reason.c: the reasoning/answer splitter of chat_reason.h.
 *
 * Two machines share one struct. Harmony's moves on marker ids alone: the
 * markers are control tokens, so they never hide in text. Qwen's moves on
 * the text, byte by byte, holding back what may still become its next tag
 * (and, for Qwen3's think tags, the newlines before it, which the template
 * owns); only it copies bytes, into one region a part, so that a released
 * tag start and the token's own text come out together. Other families
 * pass each piece through as answer.
 */
#include "config.h"
#include "chat_reason.h"
#include "tokenizer.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* ---- harmony ---- */

/* The part of a harmony channel: the first word of its name. */
static enum chat_part
channel_part(const struct chat_reason *r)
{
	size_t n = 0;

	while (n < r->n_chan && r->chan[n] != ' ')
		n++;
	if (n == 8 && memcmp(r->chan, "analysis", 8) == 0)
		return CHAT_PART_REASONING;
	if (n == 10 && memcmp(r->chan, "commentary", 10) == 0)
		return CHAT_PART_TOOL;
	return CHAT_PART_ANSWER;
}

/* Resolves harmony's markers; the generation starts in the header the prompt opened. */
static int
harmony_init(struct chat_reason *r, const struct tokenizer *tok, int in_reasoning, char *err)
{
	const struct { const char *text; int32_t *id; } marks[] = {
		{ "<|start|>", &r->start }, { "<|channel|>", &r->channel },
		{ "<|message|>", &r->message }, { "<|end|>", &r->end },
		{ "<|return|>", &r->ret }, { "<|call|>", &r->call },
	};
	size_t i;

	for (i = 0; i < ARRAY_LEN(marks); i++)
		if ((*marks[i].id = tok_find(tok, marks[i].text)) < 0)
			return err_set(err, ERR_UNSUPPORTED, "the harmony template needs a vocabulary "
			    "with %s", marks[i].text);
	r->state = in_reasoning ? CHAT_RS_BODY : CHAT_RS_HEADER;
	r->part = CHAT_PART_REASONING; /* the body's, where the prompt left off in the analysis */
	return 0;
}

/* One harmony token: a marker moves the machine, text goes to the body's part or nowhere. */
static void
harmony_feed(struct chat_reason *r, int32_t id, const char *piece, size_t len,
    struct chat_split *out)
{
	size_t k;

	if (id == r->start || id == r->end || id == r->ret || id == r->call) {
		r->state = CHAT_RS_HEADER;
	} else if (id == r->channel) {
		r->state = CHAT_RS_CHANNEL;
		r->n_chan = 0;
	} else if (id == r->message) {
		/* a message without a channel is taken for an answer */
		r->part = r->state == CHAT_RS_CHANNEL ? channel_part(r) : CHAT_PART_ANSWER;
		r->state = CHAT_RS_BODY;
	} else if (r->state == CHAT_RS_BODY) {
		out->text[r->part] = piece;
		out->len[r->part] = len;
	} else if (r->state == CHAT_RS_CHANNEL) {
		k = MIN(len, sizeof r->chan - r->n_chan);
		memcpy(r->chan + r->n_chan, piece, k);
		r->n_chan += k;
	}
}

/* ---- Qwen ---- */

/* Appends one byte to part p of the output. */
static void
put(struct chat_reason *r, struct chat_split *out, enum chat_part p, char c)
{
	r->buf[(size_t)p * r->cap + out->len[p]++] = c;
}

/*
 * Whether the held bytes, past their leading newlines, may still become
 * the tag the state looks for; *whole if they are it.
 */
static int
hold_fits(const struct chat_reason *r, int *whole)
{
	const char *tag = r->state == CHAT_RS_OPEN ? "<think>" : "</think>";
	size_t k = 0, n, t = strlen(tag);

	while (k < r->n_hold && r->hold[k] == '\n')
		k++;
	n = r->n_hold - k;
	*whole = n == t && memcmp(r->hold + k, tag, t) == 0;
	return n <= t && memcmp(r->hold + k, tag, n) == 0;
}

static void call_byte(struct chat_reason *r, char c, struct chat_split *out);

/*
 * The first held byte is text, not a tag's: reasoning in a think block.
 * Before any answer it begins the answer, and no think tag is looked for
 * after it: all that is held goes on as answer (where a call may open).
 */
static void
release_first(struct chat_reason *r, struct chat_split *out)
{
	char held[CHAT_REASON_HOLD];
	size_t n = r->n_hold, i;

	if (r->state != CHAT_RS_OPEN) {
		put(r, out, CHAT_PART_REASONING, r->hold[0]);
		memmove(r->hold, r->hold + 1, --r->n_hold);
		return;
	}
	memcpy(held, r->hold, n);
	r->n_hold = 0;
	r->state = CHAT_RS_ANSWER;
	for (i = 0; i < n; i++)
		call_byte(r, held[i], out);
}

/* One byte where a tag may come (before the answer, in a think block). */
static void
tag_byte(struct chat_reason *r, char c, struct chat_split *out)
{
	enum chat_rs was = r->state;
	int whole = 0, open = was == CHAT_RS_OPEN;

	if (r->n_hold == sizeof r->hold)
		release_first(r, out);
	if (r->state == CHAT_RS_ANSWER) {
		/* that began the answer */
		call_byte(r, c, out);
		return;
	}
	r->hold[r->n_hold++] = c;
	while (r->state == was && r->n_hold > 0 && !hold_fits(r, &whole))
		release_first(r, out);
	if (r->state == was && whole) {
		r->n_hold = 0;
		r->state = open ? CHAT_RS_THINK_LEAD : CHAT_RS_ANSWER_LEAD;
	}
}

/*
 * One byte of Qwen's answer or tool call: a <tool_call> opens a call, a
 * </tool_call> closes it, and both tags go with the call's text; bytes
 * that may begin the tag are held.
 */
static void
call_byte(struct chat_reason *r, char c, struct chat_split *out)
{
	int in_call = r->state == CHAT_RS_CALL;
	const char *tag = in_call ? "</tool_call>" : "<tool_call>";
	enum chat_part p = in_call ? CHAT_PART_TOOL : CHAT_PART_ANSWER;
	size_t t = strlen(tag), i;

	r->hold[r->n_hold++] = c;
	while (r->n_hold > 0 && memcmp(r->hold, tag, MIN(r->n_hold, t)) != 0) {
		put(r, out, p, r->hold[0]);
		memmove(r->hold, r->hold + 1, --r->n_hold);
	}
	if (r->n_hold < t)
		return;
	for (i = 0; i < t; i++)
		put(r, out, CHAT_PART_TOOL, r->hold[i]);
	r->n_hold = 0;
	r->state = in_call ? CHAT_RS_ANSWER : CHAT_RS_CALL;
}

/* One byte of Qwen3's output. */
static void
qwen3_byte(struct chat_reason *r, char c, struct chat_split *out)
{
	switch (r->state) {
	case CHAT_RS_THINK_LEAD:
	case CHAT_RS_ANSWER_LEAD:
		if (c == '\n')
			return;
		r->state = r->state == CHAT_RS_THINK_LEAD ? CHAT_RS_THINK : CHAT_RS_ANSWER;
		qwen3_byte(r, c, out);
		return;
	case CHAT_RS_OPEN:
	case CHAT_RS_THINK:
		tag_byte(r, c, out);
		return;
	default:
		call_byte(r, c, out);
	}
}

/* Whether the family's machine is Qwen's, on the text. */
static int
qwen(enum chat_tmpl t)
{
	return t == CHAT_QWEN3 || t == CHAT_CHATML;
}

/* Points the output at the regions, empty. */
static void
qwen3_begin(struct chat_reason *r, struct chat_split *out)
{
	int p;

	for (p = 0; p < CHAT_N_PARTS; p++)
		out->text[p] = r->buf + (size_t)p * r->cap;
}

/* ---- the interface ---- */

int
chat_reason_init(struct chat_reason *r, enum chat_tmpl t, const struct tokenizer *tok,
    int in_reasoning, char *err)
{
	memset(r, 0, sizeof *r);
	r->tmpl = t;
	r->state = CHAT_RS_ANSWER;
	if (t == CHAT_HARMONY)
		return harmony_init(r, tok, in_reasoning, err);
	if (qwen(t)) {
		/* ChatML has no reasoning: its answer starts at once */
		r->state = t == CHAT_CHATML ? CHAT_RS_ANSWER : in_reasoning ? CHAT_RS_THINK_LEAD : CHAT_RS_OPEN;
		/* a token's text, and what was held before it */
		r->cap = tok_stream_cap(tok) + CHAT_REASON_HOLD;
		r->buf = xmalloc(CHAT_N_PARTS * r->cap);
	}
	return 0;
}

int
chat_reason_feed(struct chat_reason *r, int32_t id, const char *piece, size_t len,
    struct chat_split *out)
{
	size_t i;

	memset(out, 0, sizeof *out);
	if (r->tmpl == CHAT_HARMONY) {
		harmony_feed(r, id, piece, len, out);
	} else if (qwen(r->tmpl)) {
		if (len > r->cap - CHAT_REASON_HOLD)
			return ERR_RANGE;
		qwen3_begin(r, out);
		for (i = 0; i < len; i++)
			qwen3_byte(r, piece[i], out);
	} else {
		out->text[CHAT_PART_ANSWER] = piece;
		out->len[CHAT_PART_ANSWER] = len;
	}
	return 0;
}

void
chat_reason_flush(struct chat_reason *r, struct chat_split *out)
{
	memset(out, 0, sizeof *out);
	if (!qwen(r->tmpl))
		return;
	qwen3_begin(r, out);
	if (r->state == CHAT_RS_ANSWER || r->state == CHAT_RS_CALL) {
		/* a tag's start at the end is the text of where it stands */
		for (size_t i = 0; i < r->n_hold; i++)
			put(r, out, r->state == CHAT_RS_CALL ? CHAT_PART_TOOL : CHAT_PART_ANSWER, r->hold[i]);
		r->n_hold = 0;
	}
	while (r->n_hold > 0)
		release_first(r, out);
}

void
chat_reason_free(struct chat_reason *r)
{
	free(r->buf);
	r->buf = NULL;
}
