/*
 * tokenizer.c: SentencePiece-style and byte-level BPE tokenizers.
 *
 * One struct serves three encoders:
 *  - SPM scores (GGUF "llama"): llama.cpp's llm_tokenizer_spm, the bigram
 *    merge that always joins the adjacent pair whose concatenation is the
 *    best-scored piece, with <0xXX> byte fallback;
 *  - BPE ranks over the GPT-2 byte alphabet (GGUF "gpt2", tokenizer.json
 *    ByteLevel), after a regex pre-tokenizer split;
 *  - BPE ranks over characters with byte fallback (tokenizer.json of
 *    Llama 2 / Gemma: SentencePiece converted to merges).
 * Before any of them, the text is cut at added tokens (user-defined always,
 * control tokens with parse_special), leftmost-longest as Hugging Face's
 * AddedVocabulary does; each remaining fragment is encoded on its own.
 */
#include "config.h"
#include "tokenizer.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>

#include "gguf.h"
#include "util.h"

#define TOK_MAX_SPLITS 4              /* regexes one pre-tokenizer may chain */
#define TOK_MAX_VOCAB (1 << 24)
#define SPACE_ESC "\xe2\x96\x81"      /* U+2581, SentencePiece's visible space */

/* How a fragment of raw text gets a leading space marker before encoding. */
enum prefix_mode {
	PREFIX_NONE,
	PREFIX_ALWAYS,        /* SPM add_space_prefix, HF Prepend normalizer */
	PREFIX_MISSING,       /* HF Metaspace "always", ByteLevel add_prefix_space */
	PREFIX_FIRST_MISSING, /* HF Metaspace "first": the fragment at offset 0 only */
};

enum {
	TOKF_EOG = 1,
	TOKF_LSTRIP = 2,       /* an added token that swallows whitespace on its left */
	TOKF_RSTRIP = 4,       /* ... and on its right */
	TOKF_SINGLE_WORD = 8,  /* an added token matched only between non-word characters */
};

struct tok_entry {
	uint32_t off, len;   /* stored text, in t->text (NUL-terminated there) */
	uint32_t doff, dlen; /* decoded bytes, in t->dec */
	float score;
	uint8_t type;        /* enum tok_type */
	uint8_t flags;
};

/* Open-addressing hash from token text (or decoded bytes) to id. */
struct smap {
	int32_t *slot;
	size_t mask;
};

/* Open-addressing hash from a (left, right) id pair to its merge. */
struct pmap {
	uint64_t *key;
	int32_t *rank;
	int32_t *id;
	size_t mask;
};

/* A byte trie of the added tokens, for leftmost-longest matching. */
struct trie {
	int32_t *child, *sibling, *id;
	unsigned char *c;
	int32_t n, cap;
	unsigned char first[256]; /* bytes that start some added token */
};

struct tokenizer {
	enum tok_kind kind;
	int32_t n;
	struct tok_entry *e;
	char *text;
	char *dec;
	struct smap by_text;  /* every non-empty token */
	struct smap by_dec;   /* byte-level ignore_merges: normal tokens by their bytes */
	struct pmap merges;   /* no merges: SPM, merged by score */
	int32_t byte_tok[256];
	int32_t bos, eos, eot, unk;
	int add_bos, add_eos;
	enum prefix_mode prefix;
	int escape_space;     /* ' ' becomes U+2581 before encoding */
	int escape_added;     /* ... before added tokens are matched, too (SentencePiece) */
	int unescape_space;   /* and back when decoding */
	int strip_first;      /* decoding drops the leading space of the text */
	int byte_level;       /* GPT-2 byte alphabet */
	int byte_fallback;    /* unknown characters become <0xXX> tokens */
	int ignore_merges;    /* a word that is a token is taken whole */
	int fuse_unk;
	pcre2_code *re[TOK_MAX_SPLITS];
	int n_re;
	struct trie added;
	uint32_t max_dec;
};

/* A string that is not NUL-terminated. */
struct span {
	const char *s;
	size_t n;
};

/* A growable byte buffer. */
struct buf {
	char *p;
	size_t n, cap;
};

/* Word boundaries produced by the pre-tokenizer. */
struct ranges {
	size_t *a; /* pairs: start, end */
	size_t n, cap;
};

/* One symbol of a word being merged. */
struct sym {
	int32_t prev, next;
	uint32_t off, len; /* SPM: bytes of the symbol in the word */
	int32_t id;        /* BPE: the symbol's token; -1 once merged away */
};

/* A candidate merge; lower key first, then leftmost. */
struct hent {
	float key;         /* BPE: rank; SPM: minus the merged piece's score */
	int32_t left, right;
	int32_t lid, rid;  /* BPE: the pair's ids when queued */
	uint32_t size;     /* SPM: bytes of the merged symbol when queued */
};

/* Scratch state of one tok_encode call. */
struct enc {
	int32_t *ids;
	size_t n_ids, cap_ids;
	struct sym *sym;
	size_t cap_sym;
	struct hent *heap;
	size_t n_heap, cap_heap;
	struct buf esc;      /* the text with spaces escaped, for escape_added */
	struct buf norm;
	struct ranges w, w2;
	pcre2_match_data *md;
};

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
static uint32_t
utf8_cp(const unsigned char *s, int l)
{
	static const unsigned char lead_mask[5] = { 0, 0x7f, 0x1f, 0x0f, 0x07 };
	uint32_t cp = s[0] & lead_mask[l];
	int i;

	for (i = 1; i < l; i++)
		cp = (cp << 6) | (s[i] & 0x3f);
	return cp;
}

/* Length of the UTF-8 character whose lead byte is c (input already validated). */
static int
utf8_len_lead(unsigned char c)
{
	if (c < 0x80)
		return 1;
	if (c < 0xe0)
		return 2;
	if (c < 0xf0)
		return 3;
	return 4;
}

/* ---- pre-tokenizer regexes ---- */

static const char re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/*
 * o200k's as llama.cpp has it for "gpt-4o": a word's capitals, then its
 * small letters, told by ASCII case alone (llama.cpp's regex engine folds
 * all letters into one class). It splits apart from o200k's own regex (the
 * one gpt-oss's tokenizer.json carries, which that path uses) at combining
 * marks (\p{M}) and at a non-ASCII capital after small letters. llama.cpp
 * writes a letter that is not a-z as (?=[\p{L}])([^a-z]); here it is the
 * class [^\P{L}a-z], the same letters, which PCRE2's JIT repeats without a
 * stack frame a letter (the groups overflow its stack on a long word).
 */
static const char re_gpt4o[] =
    "[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]*[^\\P{L}A-Z]+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "[^\\r\\n\\p{L}\\p{N}]?[^\\P{L}a-z]+[^\\P{L}A-Z]*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *
tok_pre_regex(enum tok_pre pre)
{
	switch (pre) {
	case TOK_PRE_LLAMA3:
		return re_llama3;
	case TOK_PRE_QWEN2:
		return re_qwen2;
	case TOK_PRE_GPT4O:
		return re_gpt4o;
	case TOK_PRE_DEFAULT:
		break;
	}
	return re_gpt2;
}

/* Compiles one more split regex (PCRE2 with Unicode properties) into t. */
static int
add_regex(struct tokenizer *t, const char *pattern, size_t len, int literal, char *err)
{
	PCRE2_UCHAR msg[160];
	PCRE2_SIZE at;
	int code;
	uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
	pcre2_code *re;

	if (t->n_re == TOK_MAX_SPLITS)
		return err_set(err, ERR_UNSUPPORTED, "more than %d split patterns", TOK_MAX_SPLITS);
	re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &code, &at, NULL);
	if (re == NULL) {
		pcre2_get_error_message(code, msg, sizeof msg);
		return err_set(err, ERR_FORMAT, "split regex, at offset %zu: %s", (size_t)at,
		    (const char *)msg);
	}
	/* JIT is only an accelerator: without it pcre2_match interprets. */
	pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
	t->re[t->n_re++] = re;
	return 0;
}

/* ---- hash maps ---- */

/* FNV-1a, 64 bits. */
static uint64_t
hash_bytes(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	size_t i;

	for (i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 0x100000001b3ull;
	}
	return h;
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
static int32_t
smap_get(const struct smap *m, const struct tokenizer *t, int dec, const char *s, size_t n)
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
static void
pmap_init(struct pmap *m, size_t n)
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
static ssize_t
pmap_get(const struct pmap *m, int32_t a, int32_t b)
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
static int32_t
trie_step(const struct trie *tr, int32_t node, unsigned char c)
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
		k = trie_step(tr, node, (unsigned char)s[i]);
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
static struct tokenizer *
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
static void
buf_put(struct buf *b, const void *s, size_t n)
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
static int
set_texts(struct tokenizer *t, const struct span *tok, int32_t n, char *err)
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
		buf_put(&b, tok[i].s, tok[i].n);
		buf_put(&b, "", 1);
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
static int32_t
find_text(const struct tokenizer *t, const char *s, size_t n)
{
	return smap_get(&t->by_text, t, 0, s, n);
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
		b = l ? cp_byte(utf8_cp((const unsigned char *)s + i, l)) : -1;
		if (b < 0) {
			d->n = start;
			return 0;
		}
		c = (unsigned char)b;
		buf_put(d, &c, 1);
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
			buf_put(d, " ", 1);
			i += 3;
		} else
			buf_put(d, s + i++, 1);
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
			buf_put(d, &c, 1);
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
	buf_put(d, s, e->len);
}

/* Fills the decoded piece of every token. */
static void
set_decoded(struct tokenizer *t)
{
	struct buf d = { 0 };
	int32_t i;

	buf_put(&d, "", 0);
	for (i = 0; i < t->n; i++) {
		t->e[i].doff = (uint32_t)d.n;
		put_decoded(t, &t->e[i], &d);
		t->e[i].dlen = (uint32_t)(d.n - t->e[i].doff);
		if (t->e[i].dlen > t->max_dec)
			t->max_dec = t->e[i].dlen;
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
			t->byte_tok[b] = find_text(t, s, (size_t)l);
			if (t->byte_tok[b] < 0)
				return err_set(err, ERR_FORMAT,
				    "byte-level vocabulary has no token for byte 0x%02x", b);
		} else if (t->byte_fallback) {
			snprintf(s, sizeof s, "<0x%02X>", b);
			t->byte_tok[b] = find_text(t, s, 6);
			if (t->byte_tok[b] >= 0 && t->e[t->byte_tok[b]].type == TOK_TYPE_NORMAL)
				t->e[t->byte_tok[b]].type = TOK_TYPE_BYTE;
		}
	}
	return 0;
}

/* Appends s with every space escaped as U+2581. */
static void
put_escaped(struct buf *d, const char *s, size_t n)
{
	size_t i, k;

	for (i = 0; i < n; i = k + 1) {
		for (k = i; k < n && s[k] != ' '; k++)
			;
		buf_put(d, s + i, k - i);
		if (k < n)
			buf_put(d, SPACE_ESC, 3);
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
			put_escaped(&key, t->text + e->off, e->len);
		else
			buf_put(&key, t->text + e->off, e->len);
		trie_add(&t->added, key.p, key.n, i);
	}
	free(key.p);
}

/* 1 if the token of this text ends a turn. */
static int
eog_text(const struct tokenizer *t, const char *text)
{
	return tok_is_eog(t, find_text(t, text, strlen(text)));
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
		id = find_text(t, eog_texts[k], strlen(eog_texts[k]));
		if (id >= 0 && t->e[id].type == TOK_TYPE_CONTROL)
			t->e[id].flags |= TOKF_EOG;
	}
	id = find_text(t, "<|end|>", 7);
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
static int
finish(struct tokenizer *t, char *err)
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
static int
add_merge(struct tokenizer *t, struct span a, struct span b, int32_t rank, struct buf *tmp,
    char *err)
{
	int32_t ia, ib, ir;

	tmp->n = 0;
	buf_put(tmp, a.s, a.n);
	buf_put(tmp, b.s, b.n);
	ia = find_text(t, a.s, a.n);
	ib = find_text(t, b.s, b.n);
	ir = find_text(t, tmp->p, tmp->n);
	if (ia < 0 || ib < 0 || ir < 0)
		return err_set(err, ERR_FORMAT, "merge %d ('%.*s %.*s') uses a token that is not "
		    "in the vocabulary", rank, (int)a.n, a.s, (int)b.n, b.s);
	pmap_put(&t->merges, ia, ib, rank, ir);
	return 0;
}

/* Splits a merge string at its first space after the first byte, as llama.cpp does. */
static int
split_merge(const char *s, size_t n, struct span *a, struct span *b)
{
	const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;

	if (sp == NULL)
		return -1;
	a->s = s;
	a->n = (size_t)(sp - s);
	b->s = sp + 1;
	b->n = n - a->n - 1;
	return 0;
}

/* ---- GGUF ---- */

/* A string array key: its index, or a code if missing or of another type. */
static int64_t
gguf_str_array(const struct gguf_file *f, const char *key, int required, char *err)
{
	int64_t i = gguf_find_key(f, key);

	if (i < 0)
		return required ? err_set(err, ERR_NOTFOUND, "no %s key", key) : -1;
	if (gguf_kv_type(f, i) != GGUF_ARRAY || gguf_arr_type(f, i) != GGUF_STRING)
		return err_set(err, ERR_FORMAT, "%s is not an array of strings", key);
	return i;
}

/* A numeric array key of at least n elements: its index, -1 if absent, or a code. */
static int64_t
gguf_num_array(const struct gguf_file *f, const char *key, int32_t n, int want_float,
    char *err)
{
	int64_t i = gguf_find_key(f, key);
	enum gguf_vtype at;

	if (i < 0)
		return -1;
	at = gguf_kv_type(f, i) == GGUF_ARRAY ? gguf_arr_type(f, i) : GGUF_VTYPE_COUNT_;
	if (at == GGUF_VTYPE_COUNT_ || at == GGUF_STRING || at == GGUF_ARRAY ||
	    (!want_float && (at == GGUF_F32 || at == GGUF_F64)))
		return err_set(err, ERR_FORMAT, "%s is not an array of %s", key,
		    want_float ? "numbers" : "integers");
	if (gguf_arr_n(f, i) < (uint64_t)n)
		return err_set(err, ERR_FORMAT, "%s has %llu entries for %d tokens", key,
		    (unsigned long long)gguf_arr_n(f, i), n);
	return i;
}

/* tokens, scores and token_type. */
static int
gguf_vocab(struct tokenizer *t, const struct gguf_file *f, char *err)
{
	int64_t ti, si, yi, v;
	uint64_t n;
	struct span *tok;
	struct gguf_str s;
	int32_t i;
	int rc;

	if ((ti = gguf_str_array(f, "tokenizer.ggml.tokens", 1, err)) < 0)
		return (int)ti;
	n = gguf_arr_n(f, ti);
	if (n == 0 || n > TOK_MAX_VOCAB)
		return err_set(err, ERR_FORMAT, "tokenizer.ggml.tokens has %llu tokens",
		    (unsigned long long)n);
	tok = xmalloc(n * sizeof *tok);
	for (i = 0; i < (int32_t)n; i++) {
		s = gguf_arr_str(f, ti, (uint64_t)i);
		tok[i].s = s.s;
		tok[i].n = s.n;
	}
	rc = set_texts(t, tok, (int32_t)n, err);
	free(tok);
	if (rc != 0)
		return rc;
	if ((si = gguf_num_array(f, "tokenizer.ggml.scores", t->n, 1, err)) < -1)
		return (int)si;
	if ((yi = gguf_num_array(f, "tokenizer.ggml.token_type", t->n, 0, err)) < -1)
		return (int)yi;
	for (i = 0; i < t->n; i++) {
		if (si >= 0)
			t->e[i].score = (float)gguf_arr_f64(f, si, (uint64_t)i);
		if (yi < 0)
			continue;
		v = gguf_arr_i64(f, yi, (uint64_t)i);
		if (v < TOK_TYPE_NORMAL || v > TOK_TYPE_BYTE)
			return err_set(err, ERR_FORMAT, "token %d has type %lld", i, (long long)v);
		t->e[i].type = (uint8_t)v;
	}
	return 0;
}

/* tokenizer.ggml.merges, ranked by position. */
static int
gguf_merges(struct tokenizer *t, const struct gguf_file *f, char *err)
{
	int64_t mi = gguf_str_array(f, "tokenizer.ggml.merges", 1, err);
	struct buf tmp = { 0 };
	struct gguf_str s;
	struct span a, b;
	uint64_t j, n;
	int rc = 0;

	if (mi < 0)
		return (int)mi;
	n = gguf_arr_n(f, mi);
	if (n > TOK_MAX_VOCAB * 4ull)
		return err_set(err, ERR_FORMAT, "%llu merges", (unsigned long long)n);
	pmap_init(&t->merges, n);
	for (j = 0; j < n && rc == 0; j++) {
		s = gguf_arr_str(f, mi, j);
		if (split_merge(s.s, s.n, &a, &b) != 0)
			rc = err_set(err, ERR_FORMAT, "merge %llu ('%.*s') is not two tokens",
			    (unsigned long long)j, (int)s.n, s.s);
		else
			rc = add_merge(t, a, b, (int32_t)j, &tmp, err);
	}
	free(tmp.p);
	return rc;
}

/* Reads an optional token id key into *id, checking its range. */
static int
gguf_special(const struct tokenizer *t, const struct gguf_file *f, const char *key,
    int32_t *id, char *err)
{
	uint32_t v;
	int rc = gguf_get_u32(f, key, &v, err);

	if (rc == ERR_NOTFOUND)
		return 0;
	if (rc != 0)
		return rc;
	if (v >= (uint32_t)t->n)
		return err_set(err, ERR_FORMAT, "%s is %u, beyond the %d tokens", key, v, t->n);
	*id = (int32_t)v;
	return 0;
}

/* Reads an optional boolean key into *v. */
static int
gguf_flag(const struct gguf_file *f, const char *key, int *v, char *err)
{
	int rc = gguf_get_bool(f, key, v, err);

	return rc == ERR_NOTFOUND ? 0 : rc;
}

/* Maps tokenizer.ggml.pre to a split rule, as llama.cpp names them. */
static int
gguf_pre(struct tokenizer *t, const struct gguf_file *f, char *err)
{
	static const struct { const char *name; enum tok_pre pre; } names[] = {
		{ "default", TOK_PRE_DEFAULT }, { "gpt-2", TOK_PRE_DEFAULT },
		{ "llama3", TOK_PRE_LLAMA3 }, { "llama-v3", TOK_PRE_LLAMA3 },
		{ "llama-bpe", TOK_PRE_LLAMA3 }, { "smaug-bpe", TOK_PRE_LLAMA3 },
		{ "dbrx", TOK_PRE_LLAMA3 }, { "qwen2", TOK_PRE_QWEN2 },
		{ "deepseek-r1-qwen", TOK_PRE_QWEN2 }, { "gpt-4o", TOK_PRE_GPT4O },
	};
	struct gguf_str s = { "default", 7 };
	enum tok_pre pre;
	size_t k;
	int rc = gguf_get_str(f, "tokenizer.ggml.pre", &s, err);

	if (rc != 0 && rc != ERR_NOTFOUND)
		return rc;
	for (k = 0; k < ARRAY_LEN(names); k++)
		if (gguf_str_eq(s, names[k].name))
			break;
	if (k == ARRAY_LEN(names))
		return err_set(err, ERR_UNSUPPORTED, "pre-tokenizer '%.*s' is not supported",
		    (int)s.n, s.s);
	pre = names[k].pre;
	/* llama.cpp: llama3-style vocabularies take a word that is a token whole, and add BOS */
	t->ignore_merges = t->add_bos = pre == TOK_PRE_LLAMA3;
	return add_regex(t, tok_pre_regex(pre), PCRE2_ZERO_TERMINATED, 0, err);
}

/* Kind-specific settings: "llama" is SPM by score, "gpt2" byte-level BPE. */
static int
gguf_model(struct tokenizer *t, const struct gguf_file *f, char *err)
{
	struct gguf_str model;
	int rc = gguf_get_str(f, "tokenizer.ggml.model", &model, err);

	if (rc != 0)
		return rc == ERR_NOTFOUND ?
		    err_set(err, rc, "no tokenizer.ggml.model key: the file has no vocabulary") : rc;
	if (gguf_str_eq(model, "llama")) {
		t->kind = TOK_SPM;
		t->escape_space = t->unescape_space = t->byte_fallback = 1;
		t->escape_added = 1;
		t->add_bos = 1;
		t->prefix = PREFIX_ALWAYS;
		return 0;
	}
	if (gguf_str_eq(model, "gpt2")) {
		t->kind = TOK_BPE;
		t->byte_level = 1;
		return 0;
	}
	return err_set(err, ERR_UNSUPPORTED, "tokenizer model '%.*s' is not supported "
	    "(only llama and gpt2 are)", (int)model.n, model.s);
}

/* Special ids and the add_* flags. */
static int
gguf_specials(struct tokenizer *t, const struct gguf_file *f, char *err)
{
	int space = t->prefix != PREFIX_NONE, rc;

	if (t->kind == TOK_SPM) {
		/* llama.cpp's defaults for old SPM files that name no ids */
		t->unk = t->n > 0 ? 0 : -1;
		t->bos = t->n > 1 ? 1 : -1;
		t->eos = t->n > 2 ? 2 : -1;
	}
	if ((rc = gguf_special(t, f, "tokenizer.ggml.bos_token_id", &t->bos, err)) ||
	    (rc = gguf_special(t, f, "tokenizer.ggml.eos_token_id", &t->eos, err)) ||
	    (rc = gguf_special(t, f, "tokenizer.ggml.eot_token_id", &t->eot, err)) ||
	    (rc = gguf_special(t, f, "tokenizer.ggml.unknown_token_id", &t->unk, err)) ||
	    (rc = gguf_flag(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err)) ||
	    (rc = gguf_flag(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err)))
		return rc;
	if (t->kind == TOK_SPM) {
		if ((rc = gguf_flag(f, "tokenizer.ggml.add_space_prefix", &space, err)) != 0)
			return rc;
		t->prefix = space ? PREFIX_ALWAYS : PREFIX_NONE;
		t->strip_first = space;
	}
	return 0;
}

int
tok_load_gguf(const struct gguf_file *f, struct tokenizer **out, char *err)
{
	struct tokenizer *t = tok_new();
	int rc;

	if ((rc = gguf_model(t, f, err)) == 0 && (rc = gguf_vocab(t, f, err)) == 0 &&
	    (t->kind == TOK_SPM || ((rc = gguf_merges(t, f, err)) == 0 &&
	    (rc = gguf_pre(t, f, err)) == 0)) &&
	    (rc = gguf_specials(t, f, err)) == 0)
		rc = finish(t, err);
	if (rc != 0) {
		tok_free(t);
		return err_prefix(err, rc, "tokenizer");
	}
	*out = t;
	return 0;
}

/* ---- tokenizer.json ---- */

/* A string member, or NULL. */
static const char *
jstr(const json_t *o, const char *key)
{
	return json_string_value(json_object_get(o, key));
}

/* A boolean member, or def when absent or null. */
static int
jbool(const json_t *o, const char *key, int def)
{
	json_t *v = json_object_get(o, key);

	return json_is_boolean(v) ? json_is_true(v) : def;
}

/* A string of a tokenizer_config entry: "text" or {"content": "text"}. */
static const char *
jtoken_text(const json_t *v)
{
	return json_is_object(v) ? jstr(v, "content") : json_string_value(v);
}

/* Loads a JSON file (read whole: jansson's own file reading goes a byte at a time). */
static int
jload(const char *path, json_t **out, char *err)
{
	json_error_t je;
	size_t len;
	char *data;
	int rc;

	if ((rc = read_file(path, &data, &len, err)) != 0)
		return rc;
	*out = json_loadb(data, len, JSON_ALLOW_NUL, &je);
	free(data);
	if (*out == NULL)
		return err_set(err, ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
	if (!json_is_object(*out)) {
		json_decref(*out);
		return err_set(err, ERR_FORMAT, "%s: not a JSON object", path);
	}
	return 0;
}

/* Places text at id in the table, growing it; the id must be sane. */
static int
put_token(struct span **tok, int32_t *n, json_int_t id, const char *s, size_t len, char *err)
{
	int32_t old = *n;

	if (id < 0 || id >= TOK_MAX_VOCAB)
		return err_set(err, ERR_FORMAT, "token '%s' has id %lld", s, (long long)id);
	if (id >= *n) {
		*n = (int32_t)id + 1;
		*tok = xrealloc(*tok, (size_t)*n * sizeof **tok);
		memset(*tok + old, 0, (size_t)(*n - old) * sizeof **tok);
	}
	(*tok)[id].s = s;
	(*tok)[id].n = len;
	return 0;
}

/* model.vocab and added_tokens into one id-indexed table of texts. */
static int
json_texts(const json_t *model, const json_t *added, struct span **tok, int32_t *n,
    char *err)
{
	const json_t *vocab = json_object_get(model, "vocab"), *v;
	const char *key;
	size_t i;
	int32_t k;
	int rc;

	if (!json_is_object(vocab))
		return err_set(err, ERR_FORMAT, "model.vocab is not an object");
	json_object_foreach((json_t *)vocab, key, v) {
		if (!json_is_integer(v))
			return err_set(err, ERR_FORMAT, "vocab entry '%s' is not an id", key);
		if ((rc = put_token(tok, n, json_integer_value(v), key, strlen(key), err)) != 0)
			return rc;
	}
	json_array_foreach(added, i, v) {
		if (!json_is_string(json_object_get(v, "content")) ||
		    !json_is_integer(json_object_get(v, "id")))
			return err_set(err, ERR_FORMAT, "added_tokens[%zu] lacks id or content", i);
		/* an added token overrides the model's entry for its id, as in HF */
		rc = put_token(tok, n, json_integer_value(json_object_get(v, "id")),
		    jstr(v, "content"), json_string_length(json_object_get(v, "content")), err);
		if (rc != 0)
			return rc;
	}
	for (k = 0; k < *n; k++)
		if ((*tok)[k].s == NULL)
			return err_set(err, ERR_FORMAT, "no token has id %d", k);
	return 0;
}

/* Token types and strip flags of added_tokens. */
static void
json_added(struct tokenizer *t, const json_t *added)
{
	const json_t *v;
	struct tok_entry *e;
	size_t i;

	json_array_foreach(added, i, v) {
		e = &t->e[json_integer_value(json_object_get(v, "id"))];
		e->type = jbool(v, "special", 0) ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED;
		if (jbool(v, "lstrip", 0))
			e->flags |= TOKF_LSTRIP;
		if (jbool(v, "rstrip", 0))
			e->flags |= TOKF_RSTRIP;
		if (jbool(v, "single_word", 0))
			e->flags |= TOKF_SINGLE_WORD;
	}
}

/* model.merges: "a b" strings or [a, b] pairs. */
static int
json_merges(struct tokenizer *t, const json_t *model, char *err)
{
	const json_t *merges = json_object_get(model, "merges"), *m;
	struct buf tmp = { 0 };
	struct span a, b;
	size_t i;
	int rc = 0;

	if (merges == NULL || json_is_null(merges))
		merges = json_array();
	else if (!json_is_array(merges))
		return err_set(err, ERR_FORMAT, "model.merges is not an array");
	else
		json_incref((json_t *)merges);
	pmap_init(&t->merges, json_array_size(merges));
	json_array_foreach(merges, i, m) {
		if (json_is_string(m) && split_merge(json_string_value(m), json_string_length(m),
		    &a, &b) == 0) {
			rc = add_merge(t, a, b, (int32_t)i, &tmp, err);
		} else if (json_is_array(m) && json_array_size(m) == 2 &&
		    json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
			a.s = json_string_value(json_array_get(m, 0));
			a.n = json_string_length(json_array_get(m, 0));
			b.s = json_string_value(json_array_get(m, 1));
			b.n = json_string_length(json_array_get(m, 1));
			rc = add_merge(t, a, b, (int32_t)i, &tmp, err);
		} else
			rc = err_set(err, ERR_FORMAT, "model.merges[%zu] is not two tokens", i);
		if (rc != 0)
			break;
	}
	free(tmp.p);
	json_decref((json_t *)merges);
	return rc;
}

/* The BPE model's options; other model types are not supported. */
static int
json_model(struct tokenizer *t, const json_t *model, char *err)
{
	const char *type = jstr(model, "type"), *unk = jstr(model, "unk_token");
	const char *csp = jstr(model, "continuing_subword_prefix");
	const char *eow = jstr(model, "end_of_word_suffix");

	if (type == NULL || strcmp(type, "BPE") != 0)
		return err_set(err, ERR_UNSUPPORTED, "model type '%s' is not supported (only BPE)",
		    type ? type : "?");
	if ((csp != NULL && *csp != '\0') || (eow != NULL && *eow != '\0'))
		return err_set(err, ERR_UNSUPPORTED, "BPE subword prefixes/suffixes are not supported");
	t->byte_fallback = jbool(model, "byte_fallback", 0);
	t->ignore_merges = jbool(model, "ignore_merges", 0);
	t->fuse_unk = jbool(model, "fuse_unk", 0);
	if (unk != NULL && (t->unk = find_text(t, unk, strlen(unk))) < 0)
		return err_set(err, ERR_FORMAT, "unk_token '%s' is not in the vocabulary", unk);
	if (t->unk >= 0 && t->e[t->unk].type == TOK_TYPE_NORMAL)
		t->e[t->unk].type = TOK_TYPE_UNKNOWN;
	return json_merges(t, model, err);
}

/* One pattern member: {"String": s} or {"Regex": r}. */
static int
json_pattern(struct tokenizer *t, const json_t *pat, char *err)
{
	const json_t *s = json_object_get(pat, "String"), *r = json_object_get(pat, "Regex");

	if (json_is_string(s))
		return add_regex(t, json_string_value(s), json_string_length(s), 1, err);
	if (json_is_string(r))
		return add_regex(t, json_string_value(r), json_string_length(r), 0, err);
	return err_set(err, ERR_FORMAT, "pattern is neither String nor Regex");
}

/* Metaspace: spaces as U+2581, with a prefix scheme; split=true is not supported. */
static int
json_metaspace(struct tokenizer *t, const json_t *p, char *err)
{
	const char *rep = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");

	if (rep != NULL && strcmp(rep, SPACE_ESC) != 0)
		return err_set(err, ERR_UNSUPPORTED, "Metaspace replacement '%s'", rep);
	if (jbool(p, "split", 0))
		return err_set(err, ERR_UNSUPPORTED, "Metaspace with split=true");
	t->escape_space = 1;
	if (scheme == NULL)
		scheme = jbool(p, "add_prefix_space", 1) ? "always" : "never";
	if (strcmp(scheme, "always") == 0)
		t->prefix = PREFIX_MISSING;
	else if (strcmp(scheme, "first") == 0)
		t->prefix = PREFIX_FIRST_MISSING;
	else if (strcmp(scheme, "never") != 0)
		return err_set(err, ERR_UNSUPPORTED, "Metaspace prepend_scheme '%s'", scheme);
	return 0;
}

/* One pre-tokenizer: ByteLevel, Split (Isolated), Metaspace. */
static int
json_pre_one(struct tokenizer *t, const json_t *p, char *err)
{
	const char *type = jstr(p, "type"), *beh = jstr(p, "behavior");

	if (type == NULL)
		return err_set(err, ERR_FORMAT, "pre_tokenizer without a type");
	if (strcmp(type, "ByteLevel") == 0) {
		t->byte_level = 1;
		/* after a Split, HF would prefix every piece of it, not just every fragment */
		if (jbool(p, "add_prefix_space", 0) && t->n_re > 0)
			return err_set(err, ERR_UNSUPPORTED, "ByteLevel add_prefix_space after a Split");
		if (jbool(p, "add_prefix_space", 0))
			t->prefix = PREFIX_MISSING;
		return jbool(p, "use_regex", 1) ?
		    add_regex(t, re_gpt2, PCRE2_ZERO_TERMINATED, 0, err) : 0;
	}
	if (strcmp(type, "Split") == 0) {
		if (beh == NULL || strcmp(beh, "Isolated") != 0 || jbool(p, "invert", 0))
			return err_set(err, ERR_UNSUPPORTED, "Split behavior '%s'%s is not supported",
			    beh ? beh : "?", jbool(p, "invert", 0) ? " (inverted)" : "");
		return json_pattern(t, json_object_get(p, "pattern"), err);
	}
	if (strcmp(type, "Metaspace") == 0)
		return json_metaspace(t, p, err);
	return err_set(err, ERR_UNSUPPORTED, "pre_tokenizer '%s' is not supported", type);
}

/* pre_tokenizer: null, one, or a Sequence. */
static int
json_pre(struct tokenizer *t, const json_t *p, char *err)
{
	const json_t *seq = json_object_get(p, "pretokenizers"), *v;
	size_t i;
	int rc;

	if (p == NULL || json_is_null(p))
		return 0;
	if (!json_is_array(seq))
		return json_pre_one(t, p, err);
	json_array_foreach(seq, i, v)
		if ((rc = json_pre_one(t, v, err)) != 0)
			return rc;
	return 0;
}

/* One normalizer: Replace " " -> U+2581, Prepend U+2581, NFC. */
static int
json_norm_one(struct tokenizer *t, const json_t *n, char *err)
{
	const char *type = jstr(n, "type");

	if (type == NULL)
		return err_set(err, ERR_FORMAT, "normalizer without a type");
	if (strcmp(type, "Replace") == 0) {
		if (jstr(json_object_get(n, "pattern"), "String") == NULL ||
		    strcmp(jstr(json_object_get(n, "pattern"), "String"), " ") != 0 ||
		    jstr(n, "content") == NULL || strcmp(jstr(n, "content"), SPACE_ESC) != 0)
			return err_set(err, ERR_UNSUPPORTED, "only the Replace of ' ' by U+2581 is "
			    "supported");
		t->escape_space = 1;
		return 0;
	}
	if (strcmp(type, "Prepend") == 0) {
		if (jstr(n, "prepend") == NULL || strcmp(jstr(n, "prepend"), SPACE_ESC) != 0)
			return err_set(err, ERR_UNSUPPORTED, "only Prepend of U+2581 is supported");
		t->prefix = PREFIX_ALWAYS;
		return 0;
	}
	/*
	 * NFC is accepted and not applied, as llama.cpp does for the same
	 * vocabularies (qwen2): text already in NFC, nearly all text, encodes
	 * identically.
	 */
	if (strcmp(type, "NFC") == 0)
		return 0;
	return err_set(err, ERR_UNSUPPORTED, "normalizer '%s' is not supported", type);
}

/* normalizer: null, one, or a Sequence. */
static int
json_norm(struct tokenizer *t, const json_t *n, char *err)
{
	const json_t *seq = json_object_get(n, "normalizers"), *v;
	size_t i;
	int rc;

	if (n == NULL || json_is_null(n))
		return 0;
	if (!json_is_array(seq))
		return json_norm_one(t, n, err);
	json_array_foreach(seq, i, v)
		if ((rc = json_norm_one(t, v, err)) != 0)
			return rc;
	return 0;
}

/* One decoder step: what it means for our decoded pieces. */
static void
json_dec_one(struct tokenizer *t, const json_t *d)
{
	const char *type = jstr(d, "type"), *scheme;

	if (type == NULL)
		return;
	if (strcmp(type, "Replace") == 0 && jstr(d, "content") != NULL &&
	    strcmp(jstr(d, "content"), " ") == 0)
		t->unescape_space = 1;
	else if (strcmp(type, "Strip") == 0 && jstr(d, "content") != NULL &&
	    strcmp(jstr(d, "content"), " ") == 0 &&
	    json_integer_value(json_object_get(d, "start")) > 0)
		t->strip_first = 1;
	else if (strcmp(type, "Metaspace") == 0) {
		t->unescape_space = 1;
		scheme = jstr(d, "prepend_scheme");
		t->strip_first = scheme ? strcmp(scheme, "never") != 0 : jbool(d, "add_prefix_space", 1);
	}
}

/* decoder: ByteLevel needs nothing more; Replace, Strip and Metaspace set flags. */
static void
json_dec(struct tokenizer *t, const json_t *d)
{
	const json_t *seq = json_object_get(d, "decoders"), *v;
	size_t i;

	if (!json_is_array(seq)) {
		json_dec_one(t, d);
		return;
	}
	json_array_foreach(seq, i, v)
		json_dec_one(t, v);
}

/* The id of a special token text, checked. */
static int
json_special_id(const struct tokenizer *t, const char *what, const char *text, int32_t *id,
    char *err)
{
	if (text == NULL)
		return 0;
	*id = find_text(t, text, strlen(text));
	if (*id < 0)
		return err_set(err, ERR_FORMAT, "%s '%s' is not in the vocabulary", what, text);
	return 0;
}

/* TemplateProcessing: a special token before $A is BOS, one after it EOS. */
static int
json_template(struct tokenizer *t, const json_t *pp, char *err)
{
	const json_t *single = json_object_get(pp, "single"), *v, *st;
	int seen_a = 0, rc;
	size_t i;

	json_array_foreach(single, i, v) {
		if (json_object_get(v, "Sequence") != NULL) {
			seen_a = 1;
			continue;
		}
		st = json_object_get(v, "SpecialToken");
		if (st == NULL)
			continue;
		rc = json_special_id(t, "post_processor token", jstr(st, "id"),
		    seen_a ? &t->eos : &t->bos, err);
		if (rc != 0)
			return rc;
		if (seen_a)
			t->add_eos = 1;
		else
			t->add_bos = 1;
	}
	return 0;
}

/* post_processor: TemplateProcessing, alone or in a Sequence. */
static int
json_post(struct tokenizer *t, const json_t *pp, char *err)
{
	const json_t *seq = json_object_get(pp, "processors"), *v;
	const char *type;
	size_t i;
	int rc;

	if (json_is_array(seq)) {
		json_array_foreach(seq, i, v)
			if ((rc = json_post(t, v, err)) != 0)
				return rc;
		return 0;
	}
	type = jstr(pp, "type");
	return type != NULL && strcmp(type, "TemplateProcessing") == 0 ?
	    json_template(t, pp, err) : 0;
}

/* tokenizer_config.json: bos/eos tokens and add_bos/add_eos, which override the rest. */
static int
json_config(struct tokenizer *t, const char *path, char *err)
{
	json_t *c;
	int rc;

	if ((rc = jload(path, &c, err)) != 0)
		return rc;
	if ((rc = json_special_id(t, "bos_token", jtoken_text(json_object_get(c, "bos_token")),
	    &t->bos, err)) == 0 &&
	    (rc = json_special_id(t, "eos_token", jtoken_text(json_object_get(c, "eos_token")),
	    &t->eos, err)) == 0) {
		t->add_bos = jbool(c, "add_bos_token", t->add_bos);
		t->add_eos = jbool(c, "add_eos_token", t->add_eos);
	}
	json_decref(c);
	return rc;
}

/* Everything of tokenizer.json once the texts are in place. */
static int
json_setup(struct tokenizer *t, const json_t *root, const char *config, char *err)
{
	int rc;

	json_added(t, json_object_get(root, "added_tokens"));
	if ((rc = json_model(t, json_object_get(root, "model"), err)) != 0 ||
	    (rc = json_norm(t, json_object_get(root, "normalizer"), err)) != 0 ||
	    (rc = json_pre(t, json_object_get(root, "pre_tokenizer"), err)) != 0)
		return rc;
	json_dec(t, json_object_get(root, "decoder"));
	t->kind = t->byte_level ? TOK_BPE : TOK_SPM;
	if (t->byte_level && t->escape_space)
		return err_set(err, ERR_UNSUPPORTED, "ByteLevel together with U+2581 spaces");
	if ((rc = json_post(t, json_object_get(root, "post_processor"), err)) != 0)
		return rc;
	if (config != NULL && (rc = json_config(t, config, err)) != 0)
		return rc;
	return finish(t, err);
}

int
tok_load_json(const char *tokenizer_json, const char *tokenizer_config,
    struct tokenizer **out, char *err)
{
	struct tokenizer *t = tok_new();
	struct span *tok = NULL;
	int32_t n = 0;
	json_t *root, *added;
	int rc;

	if ((rc = jload(tokenizer_json, &root, err)) != 0) {
		tok_free(t);
		return rc;
	}
	added = json_object_get(root, "added_tokens");
	if (added != NULL && !json_is_array(added))
		rc = err_set(err, ERR_FORMAT, "added_tokens is not an array");
	else if (!json_is_object(json_object_get(root, "model")))
		rc = err_set(err, ERR_FORMAT, "no model object");
	else if ((rc = json_texts(json_object_get(root, "model"), added, &tok, &n, err)) == 0 &&
	    (rc = set_texts(t, tok, n, err)) == 0)
		rc = json_setup(t, root, tokenizer_config, err);
	free(tok);
	json_decref(root);
	if (rc != 0) {
		tok_free(t);
		return err_prefix(err, rc, "%s", tokenizer_json);
	}
	*out = t;
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

	return n ? find_text(t, text, n) : -1;
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

enum tok_type
tok_type(const struct tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n ? (enum tok_type)t->e[id].type : (enum tok_type)0;
}

/* ---- encoding ---- */

/* Appends an id to the output. */
static void
enc_push(struct enc *x, int32_t id)
{
	if (x->n_ids == x->cap_ids) {
		x->cap_ids = x->cap_ids ? x->cap_ids * 2 : 256;
		x->ids = xrealloc(x->ids, x->cap_ids * sizeof *x->ids);
	}
	x->ids[x->n_ids++] = id;
}

/* Room for n symbols; the heap never holds more than two candidates per merge plus n. */
static void
enc_reserve(struct enc *x, size_t n)
{
	if (x->cap_sym < n) {
		x->cap_sym = n;
		x->sym = xrealloc(x->sym, n * sizeof *x->sym);
	}
	x->n_heap = 0;
}

/* Appends the range [a, b). */
static void
ranges_add(struct ranges *r, size_t a, size_t b)
{
	if (r->n + 2 > r->cap) {
		r->cap = r->cap ? r->cap * 2 : 64;
		r->a = xrealloc(r->a, r->cap * sizeof *r->a);
	}
	r->a[r->n++] = a;
	r->a[r->n++] = b;
}

/* 1 if heap entry a goes before b: lower key, then the leftmost. */
static int
hent_less(const struct hent *a, const struct hent *b)
{
	return a->key < b->key || (a->key == b->key && a->left < b->left);
}

/* Queues a candidate merge. */
static void
heap_push(struct enc *x, const struct hent *h)
{
	size_t i, p;

	if (x->n_heap == x->cap_heap) {
		x->cap_heap = x->cap_heap ? x->cap_heap * 2 : 256;
		x->heap = xrealloc(x->heap, x->cap_heap * sizeof *x->heap);
	}
	for (i = x->n_heap++; i > 0; i = p) {
		p = (i - 1) / 2;
		if (!hent_less(h, &x->heap[p]))
			break;
		x->heap[i] = x->heap[p];
	}
	x->heap[i] = *h;
}

/* Removes the best entry into *out. */
static void
heap_pop(struct enc *x, struct hent *out)
{
	struct hent last = x->heap[--x->n_heap];
	size_t i = 0, c;

	*out = x->heap[0];
	for (;;) {
		c = 2 * i + 1;
		if (c >= x->n_heap)
			break;
		if (c + 1 < x->n_heap && hent_less(&x->heap[c + 1], &x->heap[c]))
			c++;
		if (!hent_less(&x->heap[c], &last))
			break;
		x->heap[i] = x->heap[c];
		i = c;
	}
	if (x->n_heap > 0)
		x->heap[i] = last;
}

/* Links n symbols into a list. */
static void
link_syms(struct sym *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		s[i].prev = (int32_t)i - 1;
		s[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
	}
}

/* Removes symbol r, which was merged into its left neighbour l. */
static void
unlink_sym(struct sym *s, int32_t l, int32_t r)
{
	s[l].next = s[r].next;
	if (s[r].next >= 0)
		s[s[r].next].prev = l;
}

/* The byte's fallback token, else <unk>; an error if the vocabulary has neither. */
static int
push_byte(const struct tokenizer *t, struct enc *x, unsigned char b, char *err)
{
	int32_t id = t->byte_tok[b] >= 0 ? t->byte_tok[b] : t->unk;

	if (id < 0)
		return err_set(err, ERR_UNSUPPORTED, "byte 0x%02x cannot be encoded: the vocabulary "
		    "has neither a byte token nor <unk>", b);
	enc_push(x, id);
	return 0;
}

/* SPM: the piece that can come out of merging, or -1 (control and byte tokens cannot). */
static int32_t
spm_piece(const struct tokenizer *t, const char *s, size_t n)
{
	int32_t id = find_text(t, s, n);

	if (id < 0)
		return -1;
	return t->e[id].type == TOK_TYPE_NORMAL || t->e[id].type == TOK_TYPE_USER_DEFINED ? id : -1;
}

/* SPM: queues the merge of symbols l and r if their concatenation is a piece. */
static void
spm_try(const struct tokenizer *t, struct enc *x, const char *w, int32_t l, int32_t r)
{
	struct hent h;
	int32_t id;

	if (l < 0 || r < 0)
		return;
	h.size = x->sym[l].len + x->sym[r].len;
	id = spm_piece(t, w + x->sym[l].off, h.size);
	if (id < 0)
		return;
	h.key = -t->e[id].score;
	h.left = l;
	h.right = r;
	h.lid = h.rid = 0;
	heap_push(x, &h);
}

/* SPM: emits the final symbols, falling back to bytes for those that are no piece. */
static int
spm_emit(const struct tokenizer *t, struct enc *x, const char *w, char *err)
{
	int32_t i, id;
	uint32_t k;
	int rc;

	for (i = 0; i >= 0; i = x->sym[i].next) {
		id = spm_piece(t, w + x->sym[i].off, x->sym[i].len);
		if (id >= 0) {
			enc_push(x, id);
			continue;
		}
		for (k = 0; k < x->sym[i].len; k++)
			if ((rc = push_byte(t, x, (unsigned char)w[x->sym[i].off + k], err)) != 0)
				return rc;
	}
	return 0;
}

/* SPM (llama.cpp's llm_tokenizer_spm): merge the best-scored adjacent pair until none is left. */
static int
spm_word(const struct tokenizer *t, struct enc *x, const char *w, size_t n, char *err)
{
	size_t i, ns = 0;
	struct hent h;
	struct sym *s;

	enc_reserve(x, n);
	s = x->sym;
	for (i = 0; i < n; i += s[ns++].len) {
		s[ns].off = (uint32_t)i;
		s[ns].len = (uint32_t)MIN((size_t)utf8_len_lead((unsigned char)w[i]), n - i);
	}
	link_syms(s, ns);
	for (i = 1; i < ns; i++)
		spm_try(t, x, w, (int32_t)i - 1, (int32_t)i);
	while (x->n_heap > 0) {
		heap_pop(x, &h);
		/* stale: one side was merged away, or grew, since it was queued */
		if (s[h.left].len == 0 || s[h.right].len == 0 || s[h.left].next != h.right ||
		    s[h.left].len + s[h.right].len != h.size)
			continue;
		s[h.left].len += s[h.right].len;
		s[h.right].len = 0;
		unlink_sym(s, h.left, h.right);
		spm_try(t, x, w, s[h.left].prev, h.left);
		spm_try(t, x, w, h.left, s[h.left].next);
	}
	return spm_emit(t, x, w, err);
}

/* BPE: queues the merge of symbols l and r if the pair is ranked. */
static void
bpe_try(const struct tokenizer *t, struct enc *x, int32_t l, int32_t r)
{
	struct hent h;
	ssize_t m;

	if (l < 0 || r < 0)
		return;
	m = pmap_get(&t->merges, x->sym[l].id, x->sym[r].id);
	if (m < 0)
		return;
	h.key = (float)t->merges.rank[m];
	h.left = l;
	h.right = r;
	h.lid = x->sym[l].id;
	h.rid = x->sym[r].id;
	h.size = 0;
	heap_push(x, &h);
}

/* BPE: a character-level symbol: its token, else byte fallback, else <unk>. */
static int
bpe_char_syms(const struct tokenizer *t, struct enc *x, const char *w, size_t n, size_t *ns,
    char *err)
{
	size_t i, k;
	int32_t id;
	int l;

	for (i = 0; i < n; i += (size_t)l) {
		l = utf8_len_lead((unsigned char)w[i]);
		id = find_text(t, w + i, (size_t)l);
		if (id >= 0 || !t->byte_fallback) {
			if (id < 0 && (id = t->unk) < 0)
				return err_set(err, ERR_UNSUPPORTED, "character U+%04X is not in the "
				    "vocabulary, which has no <unk>", utf8_cp((const unsigned char *)w + i, l));
			/* HF fuse_unk: a run of unknown characters is one <unk> */
			if (id == t->unk && t->fuse_unk && *ns > 0 && x->sym[*ns - 1].id == t->unk)
				continue;
			x->sym[(*ns)++].id = id;
			continue;
		}
		for (k = 0; k < (size_t)l; k++) {
			id = t->byte_tok[(unsigned char)w[i + k]];
			if (id < 0 && (id = t->unk) < 0)
				return err_set(err, ERR_UNSUPPORTED, "byte 0x%02x has no token",
				    (unsigned char)w[i + k]);
			x->sym[(*ns)++].id = id;
		}
	}
	return 0;
}

/* ignore_merges: a word that is a normal token as a whole is taken as it is. */
static int32_t
bpe_whole(const struct tokenizer *t, const char *w, size_t n)
{
	int32_t id;

	if (t->byte_level)
		return smap_get(&t->by_dec, t, 1, w, n);
	id = find_text(t, w, n);
	return id >= 0 && t->e[id].type == TOK_TYPE_NORMAL ? id : -1;
}

/* BPE (HF's BPE::merge_word): apply the best-ranked merge, leftmost first, until none applies. */
static int
bpe_word(const struct tokenizer *t, struct enc *x, const char *w, size_t n, char *err)
{
	size_t i, ns = 0;
	struct hent h;
	struct sym *s;
	int32_t id;
	int rc;

	if (t->ignore_merges && (id = bpe_whole(t, w, n)) >= 0) {
		enc_push(x, id);
		return 0;
	}
	enc_reserve(x, n);
	s = x->sym;
	if (t->byte_level)
		for (ns = 0; ns < n; ns++)
			s[ns].id = t->byte_tok[(unsigned char)w[ns]];
	else if ((rc = bpe_char_syms(t, x, w, n, &ns, err)) != 0)
		return rc;
	link_syms(s, ns);
	for (i = 1; i < ns; i++)
		bpe_try(t, x, (int32_t)i - 1, (int32_t)i);
	while (x->n_heap > 0) {
		heap_pop(x, &h);
		if (s[h.left].id != h.lid || s[h.left].next != h.right || s[h.right].id != h.rid)
			continue;
		s[h.left].id = t->merges.id[pmap_get(&t->merges, h.lid, h.rid)];
		s[h.right].id = -1;
		unlink_sym(s, h.left, h.right);
		bpe_try(t, x, s[h.left].prev, h.left);
		bpe_try(t, x, h.left, s[h.left].next);
	}
	for (i = 0; ns > 0 && (int32_t)i >= 0; i = (size_t)s[i].next)
		enc_push(x, s[i].id);
	return 0;
}

/* Splits s[0..n) by one regex into matches and the gaps between them (HF "Isolated"). */
static int
re_split(const pcre2_code *re, struct enc *x, const char *s, size_t base, size_t n,
    struct ranges *out, char *err)
{
	PCRE2_UCHAR msg[160];
	PCRE2_SIZE *ov;
	size_t pos = 0, at = 0;
	int rc;

	for (;;) {
		rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, x->md, NULL);
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0) {
			pcre2_get_error_message(rc, msg, sizeof msg);
			return err_set(err, ERR_INVAL, "pre-tokenizer regex: %s", (const char *)msg);
		}
		ov = pcre2_get_ovector_pointer(x->md);
		if (ov[1] == ov[0]) {
			/* an empty match splits nothing: look again one character on */
			if (ov[0] >= n)
				break;
			at = ov[0] + (size_t)utf8_len_lead((unsigned char)s[ov[0]]);
			continue;
		}
		if (ov[0] > pos)
			ranges_add(out, base + pos, base + ov[0]);
		ranges_add(out, base + ov[0], base + ov[1]);
		pos = at = ov[1];
	}
	if (pos < n)
		ranges_add(out, base + pos, base + n);
	return 0;
}

/* Runs the pre-tokenizer's regexes in turn, each on the pieces of the one before. */
static int
pre_split(const struct tokenizer *t, struct enc *x, const char *s, size_t n, char *err)
{
	struct ranges tmp;
	size_t i;
	int k, rc;

	x->w.n = 0;
	ranges_add(&x->w, 0, n);
	for (k = 0; k < t->n_re; k++) {
		x->w2.n = 0;
		for (i = 0; i < x->w.n; i += 2) {
			rc = re_split(t->re[k], x, s + x->w.a[i], x->w.a[i],
			    x->w.a[i + 1] - x->w.a[i], &x->w2, err);
			if (rc != 0)
				return rc;
		}
		tmp = x->w;
		x->w = x->w2;
		x->w2 = tmp;
	}
	return 0;
}

/* 1 if the fragment gets the space marker in front. */
static int
wants_prefix(const struct tokenizer *t, const char *s, size_t n, int at_start)
{
	int has = (n > 0 && s[0] == ' ') || (n >= 3 && memcmp(s, SPACE_ESC, 3) == 0);

	switch (t->prefix) {
	case PREFIX_ALWAYS:
		return 1;
	case PREFIX_MISSING:
		return !has;
	case PREFIX_FIRST_MISSING:
		return at_start && !has;
	case PREFIX_NONE:
		break;
	}
	return 0;
}

/* The normalized fragment: the space marker, then spaces escaped if the model wants it. */
static void
normalize(const struct tokenizer *t, struct enc *x, const char *s, size_t n, int at_start)
{
	const char *sp = t->escape_space ? SPACE_ESC : " ";

	x->norm.n = 0;
	if (wants_prefix(t, s, n, at_start))
		buf_put(&x->norm, sp, strlen(sp));
	if (t->escape_space)
		put_escaped(&x->norm, s, n);
	else
		buf_put(&x->norm, s, n);
}

/* Encodes a fragment of plain text (between added tokens). */
static int
encode_fragment(const struct tokenizer *t, struct enc *x, const char *s, size_t n,
    int at_start, char *err)
{
	const char *w;
	size_t i, a, b;
	int rc;

	if (n == 0)
		return 0;
	normalize(t, x, s, n, at_start);
	if ((rc = pre_split(t, x, x->norm.p, x->norm.n, err)) != 0)
		return rc;
	for (i = 0; i < x->w.n; i += 2) {
		a = x->w.a[i];
		b = x->w.a[i + 1];
		w = x->norm.p + a;
		rc = t->merges.key != NULL ? bpe_word(t, x, w, b - a, err) :
		    spm_word(t, x, w, b - a, err);
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* A crude word character for single_word tokens: ASCII alphanumeric, '_' or non-ASCII. */
static int
word_byte(unsigned char c)
{
	return isalnum(c) || c == '_' || c >= 0x80;
}

/* The allowed added token that matches longest at text[pos..), or -1. */
static int32_t
match_added(const struct tokenizer *t, const char *text, size_t len, size_t pos,
    int parse_special, size_t *mlen)
{
	const struct trie *tr = &t->added;
	int32_t node = 0, best = -1, id;
	size_t i;

	for (i = pos; i < len && (node = trie_step(tr, node, (unsigned char)text[i])) >= 0; i++) {
		id = tr->id[node];
		if (id < 0 || (!parse_special && t->e[id].type != TOK_TYPE_USER_DEFINED))
			continue;
		if ((t->e[id].flags & TOKF_SINGLE_WORD) &&
		    ((pos > 0 && word_byte((unsigned char)text[pos - 1])) ||
		    (i + 1 < len && word_byte((unsigned char)text[i + 1]))))
			continue;
		best = id;
		*mlen = i + 1 - pos;
	}
	return best;
}

/*
 * Cuts the text at added tokens, leftmost-longest, and encodes the fragments
 * between them; lstrip/rstrip tokens take the whitespace next to them.
 */
static int
partition(const struct tokenizer *t, struct enc *x, const char *text, size_t len,
    int parse_special, char *err)
{
	size_t pos = 0, seg = 0, mlen = 0, end;
	int32_t id;
	int rc;

	while (t->added.n > 0 && pos < len) {
		if (!t->added.first[(unsigned char)text[pos]] ||
		    (id = match_added(t, text, len, pos, parse_special, &mlen)) < 0) {
			pos++;
			continue;
		}
		end = pos;
		if (t->e[id].flags & TOKF_LSTRIP)
			while (end > seg && isspace((unsigned char)text[end - 1]))
				end--;
		if ((rc = encode_fragment(t, x, text + seg, end - seg, seg == 0, err)) != 0)
			return rc;
		enc_push(x, id);
		pos += mlen;
		if (t->e[id].flags & TOKF_RSTRIP)
			while (pos < len && isspace((unsigned char)text[pos]))
				pos++;
		seg = pos;
	}
	return encode_fragment(t, x, text + seg, len - seg, seg == 0, err);
}

/* Byte offset of the first invalid UTF-8 sequence in s. */
static size_t
utf8_bad_at(const char *s, size_t n)
{
	size_t i = 0;
	int l;

	while (i < n && (l = utf8_seq_len((const unsigned char *)s + i, n - i)) > 0)
		i += (size_t)l;
	return i;
}

/* Frees the scratch state (not the ids, which go to the caller). */
static void
enc_free(struct enc *x)
{
	free(x->sym);
	free(x->heap);
	free(x->esc.p);
	free(x->norm.p);
	free(x->w.a);
	free(x->w2.a);
	if (x->md != NULL)
		pcre2_match_data_free(x->md);
}

int
tok_encode(const struct tokenizer *t, const char *text, size_t len, int parse_special,
    int add_special, int32_t **ids, size_t *n_ids, char *err)
{
	struct enc x;
	int rc = 0;

	if (!utf8_valid(text, len))
		return err_set(err, ERR_INVAL, "text is not valid UTF-8 (at byte %zu)",
		    utf8_bad_at(text, len));
	memset(&x, 0, sizeof x);
	if (t->n_re > 0)
		x.md = pcre2_match_data_create(1, NULL);
	if (add_special && t->add_bos && t->bos >= 0)
		enc_push(&x, t->bos);
	if (len > 0 && t->escape_added) {
		/* SentencePiece matches user-defined pieces in the escaped text */
		put_escaped(&x.esc, text, len);
		rc = partition(t, &x, x.esc.p, x.esc.n, parse_special, err);
	} else if (len > 0)
		rc = partition(t, &x, text, len, parse_special, err);
	if (rc == 0 && add_special && t->add_eos && t->eos >= 0)
		enc_push(&x, t->eos);
	enc_free(&x);
	if (rc != 0) {
		free(x.ids);
		return rc;
	}
	/* never NULL, even for no ids, so that callers may memcpy and free freely */
	*ids = x.ids != NULL ? x.ids : xmalloc(sizeof **ids);
	*n_ids = x.n_ids;
	return 0;
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
	buf_put(&b, "", 0);
	for (i = 0; i <= n && w >= 0; i++) {
		w = i < n ? tok_stream_push(t, &s, ids[i], render_special, piece, cap) :
		    tok_stream_flush(&s, piece, cap);
		if (w > 0)
			buf_put(&b, piece, (size_t)w);
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
