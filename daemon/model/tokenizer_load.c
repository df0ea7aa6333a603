/*
 * tokenizer_load.c: a tokenizer from a GGUF file's tokenizer.ggml.* keys or
 * from a Hugging Face tokenizer.json (and tokenizer_config.json).
 *
 * Each loader reads its format's vocabulary and merges into tokenizer.c's
 * tables and maps the format's options onto the tokenizer's settings: the
 * kind, the pre-tokenizer regexes (compiled here, with GGUF's named split
 * rules as llama.cpp spells them), the space marker and escaping, the special
 * ids and the add_* flags. What the encoder could not follow (another model
 * type, an unknown pre-tokenizer or normalizer) is refused with an error.
 */
#include "config.h"
#include "tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gguf.h"
#include "util.h"

#define TOK_MAX_VOCAB (1 << 24)

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

/* ---- merges ---- */

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
	rc = tok_set_texts(t, tok, (int32_t)n, err);
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
	tok_pmap_init(&t->merges, n);
	for (j = 0; j < n && rc == 0; j++) {
		s = gguf_arr_str(f, mi, j);
		if (split_merge(s.s, s.n, &a, &b) != 0)
			rc = err_set(err, ERR_FORMAT, "merge %llu ('%.*s') is not two tokens",
			    (unsigned long long)j, (int)s.n, s.s);
		else
			rc = tok_add_merge(t, a, b, (int32_t)j, &tmp, err);
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
		rc = tok_finish(t, err);
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
	tok_pmap_init(&t->merges, json_array_size(merges));
	json_array_foreach(merges, i, m) {
		if (json_is_string(m) && split_merge(json_string_value(m), json_string_length(m),
		    &a, &b) == 0) {
			rc = tok_add_merge(t, a, b, (int32_t)i, &tmp, err);
		} else if (json_is_array(m) && json_array_size(m) == 2 &&
		    json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
			a.s = json_string_value(json_array_get(m, 0));
			a.n = json_string_length(json_array_get(m, 0));
			b.s = json_string_value(json_array_get(m, 1));
			b.n = json_string_length(json_array_get(m, 1));
			rc = tok_add_merge(t, a, b, (int32_t)i, &tmp, err);
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
	if (unk != NULL && (t->unk = tok_find_text(t, unk, strlen(unk))) < 0)
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
	*id = tok_find_text(t, text, strlen(text));
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
	return tok_finish(t, err);
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
	    (rc = tok_set_texts(t, tok, n, err)) == 0)
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
