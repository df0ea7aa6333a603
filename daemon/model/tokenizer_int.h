/*
 * tokenizer_int.h: a tokenizer's tables, shared by tokenizer.c (which builds
 * them and decodes), tokenizer_load.c (the GGUF and tokenizer.json loaders)
 * and tokenizer_encode.c (text to ids). Not for other parts of the daemon:
 * tokenizer.h is their interface.
 */
#ifndef RESIDENT_TOKENIZER_INT_H
#define RESIDENT_TOKENIZER_INT_H

#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#define TOK_MAX_SPLITS 4              /* regexes one pre-tokenizer may chain */
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
	uint64_t dec_hash;    /* of every id's tok_bytes, in order (tok_bytes_hash) */
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

/* ---- tokenizer.c ---- */

/* Decodes the valid UTF-8 character at s (l bytes, from utf8_seq_len). */
uint32_t tok_utf8_cp(const unsigned char *s, int l);
/* The id whose key is s[0..n) in map m (dec: keyed by decoded bytes), or -1. */
int32_t tok_smap_get(const struct smap *m, const struct tokenizer *t, int dec, const char *s,
    size_t n);
/* An empty merge map for n merges. */
void tok_pmap_init(struct pmap *m, size_t n);
/* The merge of (a, b): its slot, or -1. */
ssize_t tok_pmap_get(const struct pmap *m, int32_t a, int32_t b);
/* The child of an added-token trie node for byte c, or -1. */
int32_t tok_trie_step(const struct trie *tr, int32_t node, unsigned char c);
/* An empty tokenizer: no special tokens, no byte tokens. */
struct tokenizer *tok_new(void);
/* Appends n bytes, keeping room for a NUL after them. */
void tok_buf_put(struct buf *b, const void *s, size_t n);
/* Indexes the token texts; fails on a repeated text. */
int tok_set_texts(struct tokenizer *t, const struct span *tok, int32_t n, char *err);
/* The token whose stored text is s[0..n), or -1. */
int32_t tok_find_text(const struct tokenizer *t, const char *s, size_t n);
/* Appends s with every space escaped as U+2581. */
void tok_put_escaped(struct buf *d, const char *s, size_t n);
/* The derived tables, once texts, types, flags and special ids are set. */
int tok_finish(struct tokenizer *t, char *err);
/* Parses one merge "a b" (or a pair) into ids; rank is its position. */
int tok_add_merge(struct tokenizer *t, struct span a, struct span b, int32_t rank,
    struct buf *tmp, char *err);

#endif
