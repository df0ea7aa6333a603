/*
 * gentext.c: a turn's text (gentext.h). Each token's bytes go through the
 * detokenizer's stream and the splitter into one growing text a part; stop
 * strings are looked for in what the answer has not handed out yet, which
 * is enough: what was handed out never ends in the start of one.
 */
#include "config.h"
#include "gentext.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define PART_CAP 256

/*
 * Appends decoded bytes to a part, a U+0000 (a model may generate the byte
 * token <0x00>) as U+FFFD: the text is kept and rendered again as a C
 * string (a session's stored reply, the chat template of its next turn),
 * and no request may carry a NUL either.
 */
static void
part_append(struct gentext_part *p, const char *s, size_t n)
{
	static const char replacement[] = "\xef\xbf\xbd";
	size_t i;

	if (p->len + 3 * n + 1 > p->cap) {
		p->cap = MAX(p->cap * 2, p->len + 3 * n + PART_CAP);
		p->text = xrealloc(p->text, p->cap);
	}
	for (i = 0; i < n; i++) {
		if (s[i] != '\0') {
			p->text[p->len++] = s[i];
		} else {
			memcpy(p->text + p->len, replacement, 3);
			p->len += 3;
		}
	}
	p->text[p->len] = '\0';
}

/*
 * Looks for a stop string in the answer not yet handed out; cuts the answer
 * there if found (returns 1). Otherwise sets safe to how far the answer can
 * be handed out: not into a suffix that could still grow into a stop string.
 */
static int
find_stop(struct gentext *g)
{
	struct gentext_part *a = &g->part[CHAT_PART_ANSWER];
	size_t from = a->emitted, k, n, best = a->len;
	const char *hit;
	int i;

	g->safe = a->len;
	for (i = 0; i < g->n_stop; i++) {
		n = strlen(g->stop[i]);
		/* a stop string may straddle what was held back */
		hit = memmem(a->text + from, a->len - from, g->stop[i], n);
		if (hit != NULL && (size_t)(hit - a->text) < best)
			best = (size_t)(hit - a->text);
		for (k = MIN(n - 1, a->len - from); k > 0; k--) {
			if (memcmp(a->text + a->len - k, g->stop[i], k) == 0) {
				g->safe = MIN(g->safe, a->len - k);
				break;
			}
		}
	}
	if (best == a->len)
		return 0;
	a->len = best;
	a->text[best] = '\0';
	g->safe = best;
	g->stopped = 1;
	return 1;
}

/* Appends what the splitter gave to the parts; returns 1 if the answer reached a stop string. */
static int
take(struct gentext *g, const struct chat_split *sp)
{
	int k;

	for (k = 0; k < CHAT_N_PARTS; k++)
		if (sp->len[k] > 0)
			part_append(&g->part[k], sp->text[k], sp->len[k]);
	return sp->len[CHAT_PART_ANSWER] > 0 && find_stop(g);
}

int
gentext_init(struct gentext *g, const struct tokenizer *tok, enum chat_tmpl split,
    const char *const *stop, int n_stop, char *err)
{
	int rc, k;

	memset(g, 0, sizeof *g);
	/* no prompt chat_render makes leaves a reasoning block open: in_reasoning is 0 */
	if ((rc = chat_reason_init(&g->split, split, tok, 0, err)) != 0)
		return rc;
	for (k = 0; k < CHAT_N_PARTS; k++) {
		g->part[k].cap = PART_CAP;
		g->part[k].text = xmalloc(PART_CAP);
		g->part[k].text[0] = '\0';
		g->part[k].piece = g->part[k].text;
	}
	g->tok = tok;
	tok_stream_init(&g->stream);
	g->buf_cap = tok_stream_cap(tok);
	g->buf = xmalloc(g->buf_cap);
	g->stop = xcalloc((size_t)MAX(n_stop, 1), sizeof *g->stop);
	for (g->n_stop = 0; g->n_stop < n_stop; g->n_stop++)
		g->stop[g->n_stop] = xstrdup(stop[g->n_stop]);
	return 0;
}

int
gentext_token(struct gentext *g, int32_t id)
{
	struct chat_split sp;
	int n = tok_stream_push(g->tok, &g->stream, id, 0, g->buf, g->buf_cap);

	/* cannot fail: buf holds tok_stream_cap bytes, what the splitter takes at most */
	chat_reason_feed(&g->split, id, g->buf, (size_t)MAX(n, 0), &sp);
	return take(g, &sp);
}

int
gentext_end(struct gentext *g)
{
	struct chat_split sp;
	int n;

	if (g->stopped)
		return 0;
	/* the bytes of an unfinished character are the last token's: fed without an id of their own */
	n = tok_stream_flush(&g->stream, g->buf, g->buf_cap);
	chat_reason_feed(&g->split, -1, g->buf, (size_t)MAX(n, 0), &sp);
	if (take(g, &sp))
		return 1;
	chat_reason_flush(&g->split, &sp);
	return take(g, &sp);
}

void
gentext_emit(struct gentext *g, int over)
{
	struct gentext_part *p;
	size_t upto;
	int k;

	for (k = 0; k < CHAT_N_PARTS; k++) {
		p = &g->part[k];
		upto = k == CHAT_PART_ANSWER && !over ? MIN(g->safe, p->len) : p->len;
		upto = MAX(upto, p->emitted);
		p->piece = p->text + p->emitted;
		p->piece_len = upto - p->emitted;
		p->emitted = upto;
	}
}

size_t
gentext_piece_bytes(const struct gentext *g)
{
	size_t n = 0;
	int k;

	for (k = 0; k < CHAT_N_PARTS; k++)
		n += g->part[k].piece_len;
	return n;
}

void
gentext_no_piece(struct gentext *g)
{
	int k;

	for (k = 0; k < CHAT_N_PARTS; k++)
		g->part[k].piece_len = 0;
}

void
gentext_free(struct gentext *g)
{
	int k;

	for (k = 0; k < CHAT_N_PARTS; k++)
		free(g->part[k].text);
	for (k = 0; k < g->n_stop; k++)
		free(g->stop[k]);
	free(g->stop);
	free(g->buf);
	chat_reason_free(&g->split);
	memset(g, 0, sizeof *g);
}
