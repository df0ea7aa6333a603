/*
 * chat_reason.h: splits what a model generates into its reasoning and its
 * answer, token by token, as its chat family marks them: Qwen3 reasons
 * between <think> and </think>, gpt-oss (harmony) on its analysis channel
 * and answers on its final one (its commentary channel, where tool calls
 * go, is kept apart). Qwen's (ChatML's and Qwen3's) <tool_call> blocks,
 * their tags included, are tool text. The output of every other family is
 * all answer.
 *
 * The caller feeds each generated token: its id and the text the
 * detokenizer (tok_stream_push) produced for it, whole UTF-8, empty for a
 * control token. Harmony's markers are control tokens, seen by their ids
 * (resolved once, at init, with tok_find). Qwen3's tags are seen in the
 * text, so that one spelled by several tokens is found too: bytes that may
 * begin a tag are held back until the next token tells, and
 * chat_reason_flush releases them at the end. What is neither reasoning
 * nor answer (the markers, harmony's "<|start|>assistant" and channel
 * names) goes nowhere, and so does the whitespace Qwen3's template puts
 * around the reasoning: the newlines after <think>, before </think>, and
 * after </think> before the answer.
 */
#ifndef RESIDENT_CHAT_REASON_H
#define RESIDENT_CHAT_REASON_H

#include <stddef.h>
#include <stdint.h>

#include "chat.h"

struct tokenizer;

/* What a piece of the output is. */
enum chat_part {
	CHAT_PART_ANSWER,
	CHAT_PART_REASONING,
	CHAT_PART_TOOL,       /* tool calls: harmony's commentary channel, Qwen's <tool_call> blocks */
	CHAT_N_PARTS,
};

/* Bytes a Qwen3 split holds back at most: a tag's start and the newlines before it. */
#define CHAT_REASON_HOLD 16

/* Where the machine stands (private to chat_reason.c). */
enum chat_rs {
	CHAT_RS_ANSWER,      /* answer text (Qwen: a <tool_call> may open a call) */
	CHAT_RS_CALL,        /* Qwen: a <tool_call> block, until </tool_call> */
	CHAT_RS_OPEN,        /* Qwen3, before any answer text: a <think> may open reasoning */
	CHAT_RS_THINK_LEAD,  /* Qwen3, just after <think>: its newlines are the template's */
	CHAT_RS_THINK,       /* Qwen3 reasoning, until </think> */
	CHAT_RS_ANSWER_LEAD, /* Qwen3, just after </think>: its newlines are the template's */
	CHAT_RS_HEADER,      /* harmony: a message's header (role, recipient) */
	CHAT_RS_CHANNEL,     /* harmony: the channel name, after <|channel|> */
	CHAT_RS_BODY,        /* harmony: a message's body, of part `part` */
};

/* A splitter for one generation; its fields are private to chat_reason.c. */
struct chat_reason {
	enum chat_tmpl tmpl;
	enum chat_rs state;
	enum chat_part part;                      /* harmony: the body's */
	int32_t start, channel, message, end, ret, call; /* harmony's marker ids */
	char hold[CHAT_REASON_HOLD];              /* Qwen: newlines and a tag's start */
	size_t n_hold;
	char chan[16];                            /* harmony: the channel name's start */
	size_t n_chan;
	char *buf;                                /* Qwen: CHAT_N_PARTS regions of cap bytes */
	size_t cap;
};

/*
 * The parts of one token's text (or of a flush): text[p] holds len[p]
 * bytes of part p, whole UTF-8, valid until the next call on the splitter
 * and until the piece fed is freed (it may point into it); where len[p] is
 * 0, text[p] may be NULL. A token may give more than one part (a held
 * tag's start released as reasoning, then the answer).
 */
struct chat_split {
	const char *text[CHAT_N_PARTS];
	size_t len[CHAT_N_PARTS];
};

/*
 * Prepares a splitter for a generation with template t and tokenizer tok.
 * in_reasoning: the prompt ended inside an open reasoning block (a
 * template that puts "<think>\n" in the generation prompt); ignored by the
 * families without reasoning. Returns 0, or ERR_UNSUPPORTED for a harmony
 * template on a vocabulary without harmony's markers.
 */
int chat_reason_init(struct chat_reason *r, enum chat_tmpl t, const struct tokenizer *tok,
    int in_reasoning, char *err);

/*
 * Splits the text of one generated token (id, and the len bytes the
 * detokenizer gave for it, at most tok_stream_cap(tok)). Returns 0, or
 * ERR_RANGE for a longer text (nothing is split).
 */
int chat_reason_feed(struct chat_reason *r, int32_t id, const char *piece, size_t len,
    struct chat_split *out);

/* Releases the bytes held back, at the end of the generation. */
void chat_reason_flush(struct chat_reason *r, struct chat_split *out);

void chat_reason_free(struct chat_reason *r);

#endif
