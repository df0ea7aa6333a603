/*
 * gentext.h: the text of one turn, as its tokens are generated. Each token
 * becomes whole UTF-8 (tok_stream), which a splitter (chat_reason.h) parts
 * into answer, reasoning and tool text where the prompt was rendered with a
 * chat family that marks them; anything else is all answer. Stop strings
 * are looked for in the answer alone, since they are the caller's end of
 * the reply: reasoning that happens to spell one goes on. The answer is
 * held back while its end could still become a stop string; the other
 * parts are handed out as they come.
 */
#ifndef RESIDENT_GENTEXT_H
#define RESIDENT_GENTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "chat_reason.h"
#include "tokenizer.h"

/* One part of the turn's text, and the last step's share of it. */
struct gentext_part {
	char *text;             /* NUL-terminated; a U+0000 generated is a U+FFFD here */
	size_t len, cap;
	size_t emitted;         /* bytes handed out */
	const char *piece;      /* what the last gentext_emit handed out: piece_len bytes of text, whole
	                           UTF-8, not NUL-terminated; valid until the next call on the gentext */
	size_t piece_len;
};

struct gentext {
	struct gentext_part part[CHAT_N_PARTS];  /* by enum chat_part */
	const struct tokenizer *tok;
	struct tok_stream stream;
	struct chat_reason split;
	char *buf;                  /* one token's bytes: tok_stream_cap */
	size_t buf_cap;
	char **stop;
	int n_stop;
	size_t safe;                /* the answer may be handed out up to here */
	int stopped;                /* a stop string ended the answer */
};

/*
 * Starts a turn's text for tokenizer tok, split as the family split marks
 * its output (CHAT_RAW: all answer), looking for n_stop stop strings in the
 * answer (copied; non-empty). g is zeroed or freed before. Returns 0, or
 * chat_reason_init's error (g then holds nothing to free).
 */
int gentext_init(struct gentext *g, const struct tokenizer *tok, enum chat_tmpl split,
    const char *const *stop, int n_stop, char *err);

/* The text of a generated token. Returns 1 if a stop string ended the answer: it is cut before it. */
int gentext_token(struct gentext *g, int32_t id);

/*
 * The turn ended (not by a stop string: what followed one is not the
 * turn's): the bytes the detokenizer and the splitter held back are
 * released. Returns 1 if they completed a stop string.
 */
int gentext_end(struct gentext *g);

/*
 * Hands out each part's new text as its piece: the answer up to where a
 * stop string may begin, or all of it once the turn is over.
 */
void gentext_emit(struct gentext *g, int over);

/* Bytes the last gentext_emit handed out, all parts together. */
size_t gentext_piece_bytes(const struct gentext *g);

/* Empty pieces, for a step that gave the sequence no token. */
void gentext_no_piece(struct gentext *g);

/* Frees the texts and zeroes g; a zeroed g is allowed. */
void gentext_free(struct gentext *g);

#endif
