/*
 * tokenizer.h: SentencePiece-style and byte-level BPE tokenizers, loaded from
 * a GGUF file's tokenizer.ggml.* keys or from a Hugging Face tokenizer.json.
 * Encoding follows llama.cpp (GGUF) and Hugging Face `tokenizers` (JSON); a
 * loaded tokenizer is immutable, so one may be shared between threads.
 */
#ifndef RESIDENT_TOKENIZER_H
#define RESIDENT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct tokenizer;

enum tok_kind {
	TOK_SPM, /* GGUF "llama": pieces with scores, U+2581 for spaces, <0xXX> byte fallback */
	TOK_BPE, /* GGUF "gpt2" / tokenizer.json ByteLevel: byte-to-unicode alphabet, ranked merges */
};

/* Pre-tokenizer split rules for byte-level BPE. */
enum tok_pre {
	TOK_PRE_DEFAULT, /* GPT-2 regex */
	TOK_PRE_LLAMA3,  /* llama-bpe / llama3 */
	TOK_PRE_QWEN2,   /* qwen2 */
	TOK_PRE_GPT4O,   /* gpt-4o: o200k (gpt-oss), as llama.cpp rewrites its regex */
};

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. */
enum tok_type {
	TOK_TYPE_NORMAL = 1,
	TOK_TYPE_UNKNOWN = 2,
	TOK_TYPE_CONTROL = 3,      /* matched in text only with parse_special */
	TOK_TYPE_USER_DEFINED = 4, /* always matched whole in text, before any merging */
	TOK_TYPE_UNUSED = 5,
	TOK_TYPE_BYTE = 6,         /* <0xXX> byte fallback */
};

/* Loads the tokenizer.ggml.* keys of a GGUF file. */
int tok_load_gguf(const struct gguf_file *f, struct tokenizer **out, char *err);

/*
 * Loads a Hugging Face tokenizer.json (+ optional tokenizer_config.json, for
 * bos/eos and add_bos_token; NULL if absent).
 */
int tok_load_json(const char *tokenizer_json, const char *tokenizer_config,
    struct tokenizer **out, char *err);

void tok_free(struct tokenizer *t);

enum tok_kind tok_kind(const struct tokenizer *t);
int32_t tok_n_vocab(const struct tokenizer *t);
int32_t tok_bos(const struct tokenizer *t);  /* -1 if none */
int32_t tok_eos(const struct tokenizer *t);  /* -1 if none */
int tok_add_bos(const struct tokenizer *t);  /* whether prompts start with BOS */
/*
 * 1 if generating id ends the turn (eos, eot, <end_of_turn>, <|im_end|>,
 * <|eot_id|>...). In a harmony vocabulary (gpt-oss) <|return|> and <|call|>
 * do, and <|end|> does not: it closes a message (the analysis) and the
 * model goes on, as llama.cpp reads it.
 */
int tok_is_eog(const struct tokenizer *t, int32_t id);
/* Id of an exact token text (e.g. "<end_of_turn>"), or -1. */
int32_t tok_find(const struct tokenizer *t, const char *text);
/* The stored text of a token (not decoded), or NULL if id is out of range. */
const char *tok_piece(const struct tokenizer *t, int32_t id);
/*
 * The bytes token id decodes to (*len of them, not NUL-terminated; a
 * control token's text included), as tok_stream_push hands them out but
 * for SentencePiece's strip of the first piece's leading space; NULL if id
 * is out of range.
 */
const char *tok_bytes(const struct tokenizer *t, int32_t id, size_t *len);
/*
 * A 64-bit hash of every id's tok_bytes (their lengths and bytes, in id
 * order), made at load: two vocabularies of one size with the same hash
 * spell every id alike, as far as a draft model's check needs (a
 * collision would cost guesses, never output: the target checks them).
 */
uint64_t tok_bytes_hash(const struct tokenizer *t);
/* The type of a token, or 0 if id is out of range. */
enum tok_type tok_type(const struct tokenizer *t, int32_t id);

/*
 * Encodes len bytes of UTF-8 text. With parse_special, control token texts
 * in the input (e.g. "<start_of_turn>") become their ids; without it they
 * are encoded as plain text (user-defined tokens are always matched whole).
 * With add_special, BOS is prepended and EOS appended where the tokenizer
 * asks for them (tok_add_bos, add_eos_token). *ids is malloc'd. Returns 0 or
 * a negative code (ERR_INVAL for invalid UTF-8).
 */
int tok_encode(const struct tokenizer *t, const char *text, size_t len,
    int parse_special, int add_special, int32_t **ids, size_t *n_ids, char *err);

/*
 * Streaming decode: bytes of a token that end in the middle of a UTF-8
 * character are held until the character is complete, so every piece handed
 * out is whole UTF-8; bytes that cannot become a character turn into U+FFFD
 * (one per maximal invalid subsequence, as Python and Rust do). Control and
 * unknown tokens decode to their text only if render_special.
 */
struct tok_stream {
	unsigned char pending[8];
	int n_pending;
	int first;       /* nothing emitted yet: SPM strips the leading space of the first piece */
};

void tok_stream_init(struct tok_stream *s);
/* An output capacity that is enough for tok_stream_push with any token of t. */
size_t tok_stream_cap(const struct tokenizer *t);
/*
 * Appends the complete UTF-8 produced by token id to out (capacity cap;
 * tok_stream_cap(t) always suffices, the bytes actually completed are
 * enough). Returns the number of bytes written (not NUL-terminated), or
 * ERR_RANGE, with the stream unchanged, for an out-of-range id or a cap too
 * small for this token.
 */
int tok_stream_push(const struct tokenizer *t, struct tok_stream *s, int32_t id,
    int render_special, char *out, size_t cap);
/* Flushes held bytes at the end of a stream (leftovers become U+FFFD); cap >= 3. */
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

/* Decodes a whole id sequence into a malloc'd NUL-terminated string. */
int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n,
    int render_special, char **text, size_t *len, char *err);

/* The split regex (PCRE2 syntax) of a byte-level BPE pre-tokenizer. */
const char *tok_pre_regex(enum tok_pre pre);
/* The GPT-2 byte-level alphabet: writes the UTF-8 of byte b's character, returns its length. */
int tok_byte_char(unsigned char b, char out[2]);

#endif
