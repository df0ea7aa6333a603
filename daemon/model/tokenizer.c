/*
 * tokenizer.c: the tables one loaded tokenizer is made of, and decoding.
 *
 * The loaders (tokenizer_load.c) hand this file a vocabulary's texts, types
 * and merges; it indexes them (a hash map from text to id, one from a pair of
 * ids to their merge, a byte trie of the added tokens) and derives what the
 * encoder (tokenizer_encode.c) and decoding read: each token's decoded bytes,
 * the tokens that stand for single bytes, the tokens that end a turn. Once
 * built the tables are never written again, which is what lets threads share
 * a tokenizer. Decoding lives here because it only reads the decoded bytes
 * built here: a stream that hands out whole UTF-8 characters.
 */
#include "config.h"
#include "tokenizer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Texts that end a turn when they are control tokens (llama.cpp's EOG list). */
static const char *const eog_texts[] = {
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|eom_id|>", "<|end_of_text|>", "</s>", "<eos>", "<EOT>", "<|return|>", "<|call|>",
};

/* ---- byte-level alphabet ---- */

/*
 * GPT-2's bytes_to_unicode, in closed form: the printable Latin-1 bytes
 * stand for themselves, the others (0-32, 127-160, 173) are moved in order
 * to U+0100..U+0143.
 */
static uint32_t
byte_cp(unsigned b)
{
	if (b <= 32)
		return 256 + b;
	if (b >= 127 && b <= 160)
		return b + 162;
	if (b == 173)
		return 323;
	return b;
}

/* The byte a byte-level character stands for, or -1. */
static int
cp_byte(uint32_t cp)
{
	if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 255 && cp != 173))
		return (int)cp;
	if (cp >= 256 && cp <= 288)
		return (int)(cp - 256);
	if (cp >= 289 && cp <= 322)
		return (int)(cp - 162);
	if (cp == 323)
		return 173;
	return -1;
}

int
tok_byte_char(unsigned char b, char out[2])
{
	uint32_t cp = byte_cp(b);

	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xc0 | (cp >> 6));
	out[1] = (char)(0x80 | (cp & 0x3f));
	return 2;
}

/* Decodes the valid UTF-8 character at s (l bytes, from utf8_seq_len). */
uint32_t
tok_utf8_cp(const unsigned char *s, int l)
{
	static const unsigned char lead_mask[5] = { 0, 0x7f, 0x1f, 0x0f, 0x07 };
	uint32_t cp = s[0] & lead_mask[l];
	int i;

	for (i = 1; i < l; i++)
		cp = (cp << 6) | (s[i] & 0x3f);
	return cp;
}

/* ---- hash maps ---- */

static uint64_t
hash_bytes(const char *s, size_t n)
{
	return hash64(HASH64_START, s, n);
}

/* Table size: a power of two at least twice n. */
static size_t
table_size(size_t n)
{
	size_t cap = 16;

	while (cap < 2 * n)
		cap *= 2;
	return cap;
}

/* An empty text map for n tokens. */
static void
smap_init(struct smap *m, size_t n)
{
	size_t cap = table_size(n);

	m->slot = xmalloc(cap * sizeof *m->slot);
	memset(m->slot, 0xff, cap * sizeof *m->slot);
	m->mask = cap - 1;
}

/* The key of token id in a map: its text, or its decoded bytes. */
static struct span
key_of(const struct tokenizer *t, int dec, int32_t id)
{
	const struct tok_entry *e = &t->e[id];
	struct span k;

	k.s = dec ? t->dec + e->doff : t->text + e->off;
	k.n = dec ? e->dlen : e->len;
	return k;
}

/* The id whose key is s[0..n), or -1. */
int32_t
tok_smap_get(const struct smap *m, const struct tokenizer *t, int dec, const char *s, size_t n)
{
	size_t i = hash_bytes(s, n) & m->mask;
	struct span k;

	for (; m->slot[i] >= 0; i = (i + 1) & m->mask) {
		k = key_of(t, dec, m->slot[i]);
		if (k.n == n && memcmp(k.s, s, n) == 0)
			return m->slot[i];
	}
	return -1;
}

/* Inserts id under its key; returns the id already there, or -1. */
static int32_t
smap_put(struct smap *m, const struct tokenizer *t, int dec, int32_t id)
{
	struct span k = key_of(t, dec, id);
	size_t i = hash_bytes(k.s, k.n) & m->mask;
	struct span o;

	for (; m->slot[i] >= 0; i = (i + 1) & m->mask) {
		o = key_of(t, dec, m->slot[i]);
		if (o.n == k.n && memcmp(o.s, k.s, k.n) == 0)
			return m->slot[i];
	}
	m->slot[i] = id;
	return -1;
}

/* The key of a pair: both ids in one word. */
static uint64_t
pair_key(int32_t a, int32_t b)
{
	return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

/* Fibonacci hashing of a pair key. */
static size_t
pair_hash(uint64_t k, size_t mask)
{
	return (size_t)((k * 0x9e3779b97f4a7c15ull) >> 17) & mask;
}

/* An empty merge map for n merges. */
void
tok_pmap_init(struct pmap *m, size_t n)
{
	size_t cap = table_size(n);

	m->key = xmalloc(cap * sizeof *m->key);
	memset(m->key, 0xff, cap * sizeof *m->key);
	m->rank = xmalloc(cap * sizeof *m->rank);
	m->id = xmalloc(cap * sizeof *m->id);
	m->mask = cap - 1;
}

/* Adds a merge; the first (best-ranked) one wins for a repeated pair, as in llama.cpp. */
static void
pmap_put(struct pmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
	uint64_t k = pair_key(a, b);
	size_t i = pair_hash(k, m->mask);

	for (; m->key[i] != UINT64_MAX; i = (i + 1) & m->mask)
		if (m->key[i] == k)
			return;
	m->key[i] = k;
	m->rank[i] = rank;
	m->id[i] = id;
}

/* The merge of (a, b): its slot, or -1. */
ssize_t
tok_pmap_get(const struct pmap *m, int32_t a, int32_t b)
{
	uint64_t k = pair_key(a, b);
	size_t i;

	if (m->key == NULL)
		return -1;
	for (i = pair_hash(k, m->mask); m->key[i] != UINT64_MAX; i = (i + 1) & m->mask)
		if (m->key[i] == k)
			return (ssize_t)i;
	return -1;
}

/* ---- the added-token trie ---- */

/* A new node for byte c, unlinked. */
static int32_t
trie_new_node(struct trie *tr, unsigned char c)
{
	if (tr->n == tr->cap) {
		tr->cap = tr->cap ? tr->cap * 2 : 256;
		tr->child = xrealloc(tr->child, (size_t)tr->cap * sizeof *tr->child);
		tr->sibling = xrealloc(tr->sibling, (size_t)tr->cap * sizeof *tr->sibling);
		tr->id = xrealloc(tr->id, (size_t)tr->cap * sizeof *tr->id);
		tr->c = xrealloc(tr->c, (size_t)tr->cap);
	}
	tr->child[tr->n] = tr->sibling[tr->n] = tr->id[tr->n] = -1;
	tr->c[tr->n] = c;
	return tr->n++;
}

/* The child of node for byte c, or -1. */
int32_t
tok_trie_step(const struct trie *tr, int32_t node, unsigned char c)
{
	int32_t k;

	for (k = tr->child[node]; k >= 0; k = tr->sibling[k])
		if (tr->c[k] == c)
			return k;
	return -1;
}

/* Adds the text s[0..n) of token id. */
static void
trie_add(struct trie *tr, const char *s, size_t n, int32_t id)
{
	int32_t node = 0, k;
	size_t i;

	if (tr->n == 0)
		trie_new_node(tr, 0);
	tr->first[(unsigned char)s[0]] = 1;
	for (i = 0; i < n; i++) {
		k = tok_trie_step(tr, node, (unsigned char)s[i]);
		if (k < 0) {
			k = trie_new_node(tr, (unsigned char)s[i]);
			tr->sibling[k] = tr->child[node];
			tr->child[node] = k;
		}
		node = k;
	}
	/* two added tokens with one text: the first keeps it */
	if (tr->id[node] < 0)
		tr->id[node] = id;
}

/* Frees the nodes. */
static void
trie_free(struct trie *tr)
{
	free(tr->child);
	free(tr->sibling);
	free(tr->id);
	free(tr->c);
}

/* ---- construction ---- */

/* An empty tokenizer: no special tokens, no byte tokens. */
struct tokenizer *
tok_new(void)
{
	struct tokenizer *t = xcalloc(1, sizeof *t);

	t->bos = t->eos = t->eot = t->unk = -1;
	memset(t->byte_tok, 0xff, sizeof t->byte_tok);
	return t;
}

void
tok_free(struct tokenizer *t)
{
	int i;

	if (t == NULL)
		return;
	free(t->e);
	free(t->text);
	free(t->dec);
	free(t->by_text.slot);
	free(t->by_dec.slot);
	free(t->merges.key);
	free(t->merges.rank);
	free(t->merges.id);
	for (i = 0; i < t->n_re; i++)
		pcre2_code_free(t->re[i]);
	trie_free(&t->added);
	free(t);
}

/* Appends n bytes, keeping room for a NUL after them. */
void
tok_buf_put(struct buf *b, const void *s, size_t n)
{
	if (b->cap - b->n < n + 1) {
		while (b->cap - b->n < n + 1)
			b->cap = b->cap ? b->cap * 2 : 256;
		b->p = xrealloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
}

/*
 * Copies the token texts into one NUL-separated blob and indexes them.
 * Fails on a repeated text: a vocabulary maps each text to one id.
 */
int
tok_set_texts(struct tokenizer *t, const struct span *tok, int32_t n, char *err)
{
	struct buf b = { 0 };
	int32_t i, dup;

	t->n = n;
	t->e = xcalloc((size_t)n, sizeof *t->e);
	for (i = 0; i < n; i++) {
		if (b.n + tok[i].n + 1 > UINT32_MAX)
			return err_set(err, ERR_RANGE, "token texts exceed 4 GiB");
		t->e[i].off = (uint32_t)b.n;
		t->e[i].len = (uint32_t)tok[i].n;
		t->e[i].type = TOK_TYPE_NORMAL;
		tok_buf_put(&b, tok[i].s, tok[i].n);
		tok_buf_put(&b, "", 1);
	}
	t->text = b.p;
	smap_init(&t->by_text, (size_t)n);
	for (i = 0; i < n; i++) {
		if (t->e[i].len == 0)
			continue;
		dup = smap_put(&t->by_text, t, 0, i);
		if (dup >= 0)
			return err_set(err, ERR_FORMAT, "token '%s' appears twice (ids %d and %d)",
			    t->text + t->e[i].off, dup, i);
	}
	return 0;
}

/* The token whose stored text is s[0..n), or -1. */
int32_t
tok_find_text(const struct tokenizer *t, const char *s, size_t n)
{
	return tok_smap_get(&t->by_text, t, 0, s, n);
}

/* The value of a hex digit, or -1. */
static int
hex_digit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Parses "<0xXX>"; returns the byte or -1. */
static int
hex_byte_token(const char *s, size_t n)
{
	int hi, lo;

	if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
		return -1;
	hi = hex_digit(s[3]);
	lo = hex_digit(s[4]);
	return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Appends the bytes that a byte-level token's characters stand for; 0 if one is foreign. */
static int
put_byte_level(struct buf *d, const char *s, size_t n)
{
	size_t i = 0, start = d->n;
	unsigned char c;
	int l, b;

	while (i < n) {
		l = utf8_seq_len((const unsigned char *)s + i, n - i);
		b = l ? cp_byte(tok_utf8_cp((const unsigned char *)s + i, l)) : -1;
		if (b < 0) {
			d->n = start;
			return 0;
		}
		c = (unsigned char)b;
		tok_buf_put(d, &c, 1);
		i += (size_t)l;
	}
	return 1;
}

/* Appends s with every U+2581 turned back into a space. */
static void
put_unescaped(struct buf *d, const char *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		if (n - i >= 3 && memcmp(s + i, SPACE_ESC, 3) == 0) {
			tok_buf_put(d, " ", 1);
			i += 3;
		} else
			tok_buf_put(d, s + i++, 1);
	}
}

/* Appends what token e decodes to (control tokens: their text, shown only on request). */
static void
put_decoded(const struct tokenizer *t, const struct tok_entry *e, struct buf *d)
{
	const char *s = t->text + e->off;
	unsigned char c;
	int b;

	switch (e->type) {
	case TOK_TYPE_BYTE:
		b = hex_byte_token(s, e->len);
		if (b >= 0) {
			c = (unsigned char)b;
			tok_buf_put(d, &c, 1);
			return;
		}
		break;
	case TOK_TYPE_NORMAL:
		if (t->byte_level && put_byte_level(d, s, e->len))
			return;
		/* FALLTHROUGH */
	case TOK_TYPE_USER_DEFINED:
		if (t->unescape_space) {
			put_unescaped(d, s, e->len);
			return;
		}
		break;
	case TOK_TYPE_UNUSED:
		return;
	}
	tok_buf_put(d, s, e->len);
}

/* Fills the decoded piece of every token. */
static void
set_decoded(struct tokenizer *t)
{
	struct buf d = { 0 };
	int32_t i;

	tok_buf_put(&d, "", 0);
	t->dec_hash = HASH64_START;
	for (i = 0; i < t->n; i++) {
		t->e[i].doff = (uint32_t)d.n;
		put_decoded(t, &t->e[i], &d);
		t->e[i].dlen = (uint32_t)(d.n - t->e[i].doff);
		if (t->e[i].dlen > t->max_dec)
			t->max_dec = t->e[i].dlen;
		t->dec_hash = hash64(t->dec_hash, &t->e[i].dlen, sizeof t->e[i].dlen);
		t->dec_hash = hash64(t->dec_hash, d.p + t->e[i].doff, t->e[i].dlen);
	}
	t->dec = d.p;
}

/* Byte-level vocabularies must spell all 256 bytes; byte fallback ones may lack some. */
static int
set_byte_tokens(struct tokenizer *t, char *err)
{
	char s[8];
	int b, l;

	for (b = 0; b < 256; b++) {
		if (t->byte_level) {
			l = tok_byte_char((unsigned char)b, s);
			t->byte_tok[b] = tok_find_text(t, s, (size_t)l);
			if (t->byte_tok[b] < 0)
				return err_set(err, ERR_FORMAT,
				    "byte-level vocabulary has no token for byte 0x%02x", b);
		} else if (t->byte_fallback) {
			snprintf(s, sizeof s, "<0x%02X>", b);
			t->byte_tok[b] = tok_find_text(t, s, 6);
			if (t->byte_tok[b] >= 0 && t->e[t->byte_tok[b]].type == TOK_TYPE_NORMAL)
				t->e[t->byte_tok[b]].type = TOK_TYPE_BYTE;
		}
	}
	return 0;
}

/* Appends s with every space escaped as U+2581. */
void
tok_put_escaped(struct buf *d, const char *s, size_t n)
{
	size_t i, k;

	for (i = 0; i < n; i = k + 1) {
		for (k = i; k < n && s[k] != ' '; k++)
			;
		tok_buf_put(d, s + i, k - i);
		if (k < n)
			tok_buf_put(d, SPACE_ESC, 3);
	}
}

/* Added tokens (user-defined, control, unknown) go into the trie, escaped if text will be. */
static void
set_added(struct tokenizer *t)
{
	const struct tok_entry *e;
	struct buf key = { 0 };
	int32_t i;

	for (i = 0; i < t->n; i++) {
		e = &t->e[i];
		if (e->len == 0 || !utf8_valid(t->text + e->off, e->len))
			continue;
		if (e->type != TOK_TYPE_USER_DEFINED && e->type != TOK_TYPE_CONTROL &&
		    e->type != TOK_TYPE_UNKNOWN)
			continue;
		key.n = 0;
		if (t->escape_added)
			tok_put_escaped(&key, t->text + e->off, e->len);
		else
			tok_buf_put(&key, t->text + e->off, e->len);
		trie_add(&t->added, key.p, key.n, i);
	}
	free(key.p);
}

/* 1 if the token of this text ends a turn. */
static int
eog_text(const struct tokenizer *t, const char *text)
{
	return tok_is_eog(t, tok_find_text(t, text, strlen(text)));
}

/*
 * Marks the tokens that end a turn: eos, eot, and control tokens named like
 * it, except harmony's <|end|> (where <|return|> and <|call|> end turns),
 * as llama.cpp does.
 */
static void
set_eog(struct tokenizer *t)
{
	size_t k;
	int32_t id;

	if (t->eos >= 0)
		t->e[t->eos].flags |= TOKF_EOG;
	if (t->eot >= 0)
		t->e[t->eot].flags |= TOKF_EOG;
	for (k = 0; k < ARRAY_LEN(eog_texts); k++) {
		id = tok_find_text(t, eog_texts[k], strlen(eog_texts[k]));
		if (id >= 0 && t->e[id].type == TOK_TYPE_CONTROL)
			t->e[id].flags |= TOKF_EOG;
	}
	id = tok_find_text(t, "<|end|>", 7);
	if (id >= 0 && eog_text(t, "<|return|>") && eog_text(t, "<|call|>"))
		t->e[id].flags &= (uint8_t)~TOKF_EOG;
}

/* Byte-level ignore_merges looks words up by their raw bytes. */
static void
set_by_dec(struct tokenizer *t)
{
	int32_t i;

	smap_init(&t->by_dec, (size_t)t->n);
	for (i = 0; i < t->n; i++)
		if (t->e[i].type == TOK_TYPE_NORMAL && t->e[i].dlen > 0)
			smap_put(&t->by_dec, t, 1, i);
}

/* The derived tables, once texts, types, flags and special ids are set. */
int
tok_finish(struct tokenizer *t, char *err)
{
	int rc;

	if ((rc = set_byte_tokens(t, err)) != 0)
		return rc;
	set_decoded(t);
	set_added(t);
	set_eog(t);
	if (t->ignore_merges && t->byte_level)
		set_by_dec(t);
	return 0;
}

/* Parses one merge "a b" (or a pair) into ids; rank is its position. */
int
tok_add_merge(struct tokenizer *t, struct span a, struct span b, int32_t rank, struct buf *tmp,
    char *err)
{
	int32_t ia, ib, ir;

	tmp->n = 0;
	tok_buf_put(tmp, a.s, a.n);
	tok_buf_put(tmp, b.s, b.n);
	ia = tok_find_text(t, a.s, a.n);
	ib = tok_find_text(t, b.s, b.n);
	ir = tok_find_text(t, tmp->p, tmp->n);
	if (ia < 0 || ib < 0 || ir < 0)
		return err_set(err, ERR_FORMAT, "merge %d ('%.*s %.*s') uses a token that is not "
		    "in the vocabulary", rank, (int)a.n, a.s, (int)b.n, b.s);
	pmap_put(&t->merges, ia, ib, rank, ir);
	return 0;
}

/* ---- accessors ---- */

enum tok_kind
tok_kind(const struct tokenizer *t)
{
	return t->kind;
}

int32_t
tok_n_vocab(const struct tokenizer *t)
{
	return t->n;
}

int32_t
tok_bos(const struct tokenizer *t)
{
	return t->bos;
}

int32_t
tok_eos(const struct tokenizer *t)
{
	return t->eos;
}

int
tok_add_bos(const struct tokenizer *t)
{
	return t->add_bos && t->bos >= 0;
}

int
tok_is_eog(const struct tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n && (t->e[id].flags & TOKF_EOG) != 0;
}

int32_t
tok_find(const struct tokenizer *t, const char *text)
{
	size_t n = strlen(text);

	return n ? tok_find_text(t, text, n) : -1;
}

const char *
tok_piece(const struct tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n ? t->text + t->e[id].off : NULL;
}

const char *
tok_bytes(const struct tokenizer *t, int32_t id, size_t *len)
{
	if (id < 0 || id >= t->n)
		return NULL;
	*len = t->e[id].dlen;
	return t->dec + t->e[id].doff;
}

uint64_t
tok_bytes_hash(const struct tokenizer *t)
{
	return t->dec_hash;
}

enum tok_type
tok_type(const struct tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n ? (enum tok_type)t->e[id].type : (enum tok_type)0;
}

/* ---- decoding ---- */

void
tok_stream_init(struct tok_stream *s)
{
	memset(s, 0, sizeof *s);
	s->first = 1;
}

size_t
tok_stream_cap(const struct tokenizer *t)
{
	/* every held or new byte may turn into a 3-byte U+FFFD */
	return 3 * ((size_t)t->max_dec + sizeof ((struct tok_stream *)0)->pending) + 1;
}

/* Bytes of the UTF-8 character that lead byte c starts, or 0 if c cannot start one. */
static int
utf8_need(unsigned char c)
{
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return 2;
	if (c >= 0xe0 && c <= 0xef)
		return 3;
	if (c >= 0xf0 && c <= 0xf4)
		return 4;
	return 0;
}

/* 1 if c may follow the held bytes (the second byte of E0, ED, F0, F4 is narrower). */
static int
utf8_cont_ok(const unsigned char *held, int n_held, unsigned char c)
{
	if ((c & 0xc0) != 0x80)
		return 0;
	if (n_held > 1)
		return 1;
	switch (held[0]) {
	case 0xe0: return c >= 0xa0;
	case 0xed: return c <= 0x9f;
	case 0xf0: return c >= 0x90;
	case 0xf4: return c <= 0x8f;
	}
	return 1;
}

/* Writes U+FFFD. */
static size_t
put_fffd(char *out)
{
	memcpy(out, "\xef\xbf\xbd", 3);
	return 3;
}

/* Feeds one byte through the UTF-8 assembler, writing whatever it completes. */
static size_t
stream_byte(struct tok_stream *s, unsigned char c, char *out)
{
	size_t w = 0;

	if (s->n_pending > 0 && !utf8_cont_ok(s->pending, s->n_pending, c)) {
		/* the held bytes are a maximal invalid prefix: one U+FFFD */
		w += put_fffd(out);
		s->n_pending = 0;
	}
	if (s->n_pending == 0 && utf8_need(c) <= 1) {
		if (utf8_need(c) == 1)
			out[w++] = (char)c;
		else
			w += put_fffd(out + w);
		return w;
	}
	s->pending[s->n_pending++] = c;
	if (s->n_pending == utf8_need(s->pending[0])) {
		memcpy(out + w, s->pending, (size_t)s->n_pending);
		w += (size_t)s->n_pending;
		s->n_pending = 0;
	}
	return w;
}

/* How many bytes feeding p[0..n) would write, without changing the stream. */
static size_t
stream_len(const struct tok_stream *s, const unsigned char *p, size_t n)
{
	struct tok_stream dry = *s;
	char tmp[8];
	size_t i, w = 0;

	for (i = 0; i < n; i++)
		w += stream_byte(&dry, p[i], tmp);
	return w;
}

int
tok_stream_push(const struct tokenizer *t, struct tok_stream *s, int32_t id,
    int render_special, char *out, size_t cap)
{
	const struct tok_entry *e;
	const unsigned char *p;
	size_t n, i, w = 0;

	if (id < 0 || id >= t->n)
		return ERR_RANGE;
	e = &t->e[id];
	if (!render_special && (e->type == TOK_TYPE_CONTROL || e->type == TOK_TYPE_UNKNOWN))
		return 0;
	p = (const unsigned char *)t->dec + e->doff;
	n = e->dlen;
	if (n > 0 && s->first && t->strip_first && p[0] == ' ') {
		p++;
		n--;
	}
	if (stream_len(s, p, n) > cap)
		return ERR_RANGE;
	if (e->dlen > 0)
		s->first = 0;
	for (i = 0; i < n; i++)
		w += stream_byte(s, p[i], out + w);
	return (int)w;
}

int
tok_stream_flush(struct tok_stream *s, char *out, size_t cap)
{
	if (s->n_pending == 0)
		return 0;
	if (cap < 3)
		return ERR_RANGE;
	s->n_pending = 0;
	return (int)put_fffd(out);
}

int
tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, int render_special,
    char **text, size_t *len, char *err)
{
	struct tok_stream s;
	struct buf b = { 0 };
	size_t i, cap = tok_stream_cap(t);
	char *piece = xmalloc(cap);
	int w = 0;

	tok_stream_init(&s);
	tok_buf_put(&b, "", 0);
	for (i = 0; i <= n && w >= 0; i++) {
		w = i < n ? tok_stream_push(t, &s, ids[i], render_special, piece, cap) :
		    tok_stream_flush(&s, piece, cap);
		if (w > 0)
			tok_buf_put(&b, piece, (size_t)w);
	}
	free(piece);
	if (w < 0) {
		free(b.p);
		return err_set(err, w, "token id %d is out of range (vocabulary of %d)",
		    ids[i - 1], t->n);
	}
	b.p[b.n] = '\0';
	*text = b.p;
	*len = b.n;
	return 0;
}
