/*
 * genvocab.h: deterministic vocabularies for generated models. A flavour
 * ("llama3", "qwen2", "qwen3", "harmony": byte-level BPE; "gemma", "llama":
 * SentencePiece, the latter Llama 2's and Mixtral's) gives the family's
 * shape and special tokens; merges are learned from a small built-in
 * multilingual text, then random merges fill the vocabulary up to its
 * size. The same (flavour, n_vocab, seed) always gives the same
 * vocabulary: tests store ids computed from it, so changing the output
 * means updating tests/py/test_tokenizer_ids.py.
 */
#ifndef RESIDENT_GENVOCAB_H
#define RESIDENT_GENVOCAB_H

#include <stdint.h>

#include "tokenizer.h"

struct gguf_writer;

struct genvocab {
	const char *flavour;
	enum tok_kind kind;
	enum tok_pre pre;        /* TOK_BPE: the pre-tokenizer the merges were learned for */
	int32_t n;
	char **tokens;           /* n texts; byte-level BPE ones in the GPT-2 alphabet */
	float *scores;           /* SPM: piece scores (higher merges first); BPE: 0 */
	int32_t *types;          /* enum tok_type */
	int32_t n_merges;
	char **merges;           /* "a b", best first; for SPM every split, as HF converts */
	int32_t bos, eos, eot, pad, unk; /* -1 if none */
	int add_bos, add_eos;
	int add_space_prefix;    /* SPM: a space marker starts the text (Llama 2) */
};

/*
 * Makes a vocabulary of exactly n_vocab tokens. Returns 0, ERR_INVAL for an
 * unknown flavour, or ERR_RANGE for a size too small to hold the bytes and
 * special tokens (or larger than 1 << 20).
 */
int genvocab_make(struct genvocab *v, const char *flavour, int32_t n_vocab, uint64_t seed,
    char *err);
void genvocab_free(struct genvocab *v);

/* Adds the tokenizer.ggml.* keys to a GGUF being written. */
int genvocab_write_gguf(const struct genvocab *v, struct gguf_writer *w, char *err);

/*
 * Writes dir/tokenizer.json and dir/tokenizer_config.json in Hugging Face's
 * format (creating dir if needed), loadable by `tokenizers` and tok_load_json.
 */
int genvocab_write_json(const struct genvocab *v, const char *dir, char *err);

#endif
