/*
 * test_tokenizer.c: the tokenizers on generated vocabularies of every
 * flavour, each loaded twice: from a GGUF and from a tokenizer.json.
 *
 * Random texts from many scripts must encode and decode back to themselves,
 * the GGUF and JSON loaders must agree id for id, streaming must hand out
 * whole UTF-8 only, and bad input must be refused with a message. Ids are
 * checked against Hugging Face and SentencePiece in tests/py.
 */
#include "config.h"
#include "gguf.h"
#include "tokenizer.h"
#include "util.h"
#include "../../contrib/tools/genvocab.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define N_TEXTS 2000
#define N_FLAVOURS 6

/* One generated vocabulary, as both kinds of file. */
struct fixture {
	const char *flavour;
	int32_t n_vocab;
	int prefix;                  /* SPM add_space_prefix: specials break text round trips */
	struct genvocab v;
	struct gguf_file *f;
	struct tokenizer *gguf, *json;
};

static struct fixture fx[N_FLAVOURS] = {
	{ .flavour = "llama3", .n_vocab = 3000 }, { .flavour = "qwen2", .n_vocab = 2500 },
	{ .flavour = "gemma", .n_vocab = 4000 }, { .flavour = "llama", .n_vocab = 2000, .prefix = 1 },
	{ .flavour = "qwen3", .n_vocab = 2600 }, { .flavour = "harmony", .n_vocab = 3500 },
};
static char tmpdir[64];

/* ---- random text ---- */

/* splitmix64: the texts are the same on every run. */
static uint64_t
rnd(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Appends the UTF-8 of cp. */
static size_t
put_cp(char *out, uint32_t cp)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | (cp >> 12));
		out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (cp >> 18));
	out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/*
 * A random text of up to 40 items: code points of many scripts and of the
 * control and private ranges, whitespace runs, words, and the texts of
 * special tokens of every family. Fills out (at least 1024 bytes).
 */
static size_t
random_text(uint64_t *s, char *out)
{
	static const uint32_t ranges[][2] = {
		{ 0x20, 0x7e }, { 0x20, 0x7e }, { 0x0, 0x1f }, { 0x7f, 0x9f }, { 0xa0, 0x24f },
		{ 0x370, 0x3ff }, { 0x400, 0x4ff }, { 0x590, 0x6ff }, { 0x900, 0x97f },
		{ 0xe00, 0xe7f }, { 0x1100, 0x11ff }, { 0x2000, 0x206f }, { 0x3000, 0x30ff },
		{ 0x4e00, 0x9fff }, { 0xac00, 0xd7a3 }, { 0xe000, 0xf8ff }, { 0xfe00, 0xfe0f },
		{ 0xfff0, 0xfffd }, { 0x10000, 0x1007f }, { 0x1f300, 0x1faff }, { 0xe0000, 0xe007f },
	};
	static const char *const words[] = {
		" ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n ", "hello", " world", "Größe",
		"日本語", "Привет", "مرحبا", "नमस्ते", "😀👍", "don't", "I'LL", "123456", "3.14",
		"<|eot_id|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
		"<tool_call>", "<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>", "<unk>", "<s>",
		"</s>", "<table>", "[multimodal]", "<0x41>", "\xe2\x96\x81", "\xe2\x96\x81\xe2\x96\x81x",
		"<think>", "</think>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>",
		"<|return|>", "HTTPServer", "McDONALD'S", "\xc3\x89" "COLE\xc3\xa9tude",
	};
	size_t n = 0, k, items = rnd(s) % 40, r;
	uint32_t cp;

	for (k = 0; k < items; k++) {
		r = rnd(s) % 10;
		if (r < 3) {
			r = rnd(s) % ARRAY_LEN(words);
			memcpy(out + n, words[r], strlen(words[r]));
			n += strlen(words[r]);
			continue;
		}
		r = rnd(s) % ARRAY_LEN(ranges);
		cp = ranges[r][0] + (uint32_t)(rnd(s) % (ranges[r][1] - ranges[r][0] + 1));
		if (cp >= 0xd800 && cp <= 0xdfff)
			cp = 'x';
		n += put_cp(out + n, cp);
	}
	return n;
}

/* ---- fixtures ---- */

/* Writes the vocabulary as a GGUF with no tensors and opens it. */
static void
load_gguf(struct fixture *x, const char *path)
{
	struct gguf_writer *w = gguf_writer_new();
	char err[ERR_LEN];

	assert_int_equal(genvocab_write_gguf(&x->v, w, err), 0);
	assert_int_equal(gguf_writer_begin(w, path, err), 0);
	assert_int_equal(gguf_writer_end(w, err), 0);
	gguf_writer_free(w);
	if (gguf_open(path, &x->f, err) != 0 || tok_load_gguf(x->f, &x->gguf, err) != 0)
		fail_msg("%s: %s", path, err);
}

/* Writes tokenizer.json and tokenizer_config.json into dir and loads them. */
static void
load_json(struct fixture *x, const char *dir)
{
	char err[ERR_LEN], j[320], c[320];

	assert_int_equal(genvocab_write_json(&x->v, dir, err), 0);
	snprintf(j, sizeof j, "%s/tokenizer.json", dir);
	snprintf(c, sizeof c, "%s/tokenizer_config.json", dir);
	if (tok_load_json(j, c, &x->json, err) != 0)
		fail_msg("%s: %s", j, err);
}

/* Makes every flavour's vocabulary and loads it both ways. */
static int
setup(void **state)
{
	char err[ERR_LEN], path[256];
	int i;

	(void)state;
	snprintf(tmpdir, sizeof tmpdir, "/tmp/test_tokenizer.XXXXXX");
	if (mkdtemp(tmpdir) == NULL)
		return -1;
	for (i = 0; i < N_FLAVOURS; i++) {
		if (genvocab_make(&fx[i].v, fx[i].flavour, fx[i].n_vocab, 7, err) != 0) {
			fprintf(stderr, "%s: %s\n", fx[i].flavour, err);
			return -1;
		}
		snprintf(path, sizeof path, "%s/%s.gguf", tmpdir, fx[i].flavour);
		load_gguf(&fx[i], path);
		snprintf(path, sizeof path, "%s/%s", tmpdir, fx[i].flavour);
		load_json(&fx[i], path);
	}
	return 0;
}

/* Frees the tokenizers and removes the files. */
static int
teardown(void **state)
{
	char cmd[128];
	int i;

	(void)state;
	for (i = 0; i < N_FLAVOURS; i++) {
		tok_free(fx[i].gguf);
		tok_free(fx[i].json);
		gguf_close(fx[i].f);
		genvocab_free(&fx[i].v);
	}
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

/* ---- helpers ---- */

/* Encodes or fails the test with the tokenizer's message. */
static size_t
encode(const struct tokenizer *t, const char *s, size_t n, int special, int add, int32_t **ids)
{
	char err[ERR_LEN];
	size_t n_ids;

	if (tok_encode(t, s, n, special, add, ids, &n_ids, err) != 0)
		fail_msg("encode: %s", err);
	return n_ids;
}

/* 1 if ids contains id. */
static int
has_id(const int32_t *ids, size_t n, int32_t id)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (ids[i] == id)
			return 1;
	return 0;
}

/*
 * SentencePiece reads a literal U+2581 as a space (so does the original
 * library): such texts cannot come back, and GGUF files match user-defined
 * pieces after escaping while tokenizer.json matches them before.
 */
static int
spm_ambiguous(const struct tokenizer *t, const char *s, size_t n)
{
	return tok_kind(t) == TOK_SPM && memmem(s, n, "\xe2\x96\x81", 3) != NULL;
}

/* Encodes, decodes, and checks the text comes back byte for byte. */
static void
check_roundtrip(const struct tokenizer *t, const char *flavour, const char *s, size_t n,
    int special)
{
	char err[ERR_LEN], *back;
	int32_t *ids;
	size_t n_ids, len;

	if (spm_ambiguous(t, s, n))
		return;
	n_ids = encode(t, s, n, special, 0, &ids);
	assert_int_equal(tok_decode(t, ids, n_ids, special, &back, &len, err), 0);
	if (len != n || memcmp(back, s, n) != 0)
		fail_msg("%s: '%.*s' came back as '%s'", flavour, (int)n, s, back);
	free(back);
	free(ids);
}

/* Streams ids one at a time: each piece whole UTF-8, all of them the whole decode. */
static void
check_stream(const struct tokenizer *t, const int32_t *ids, size_t n, int special)
{
	struct tok_stream st;
	struct { char *p; size_t n; } all = { xmalloc(16 * n + 16), 0 };
	size_t cap = tok_stream_cap(t), i, len;
	char *piece = xmalloc(cap), *whole, err[ERR_LEN];
	int w;

	tok_stream_init(&st);
	for (i = 0; i <= n; i++) {
		w = i < n ? tok_stream_push(t, &st, ids[i], special, piece, cap) :
		    tok_stream_flush(&st, piece, cap);
		assert_true(w >= 0);
		assert_true(utf8_valid(piece, (size_t)w));
		all.p = xrealloc(all.p, all.n + (size_t)w + 1);
		memcpy(all.p + all.n, piece, (size_t)w);
		all.n += (size_t)w;
	}
	assert_int_equal(tok_decode(t, ids, n, special, &whole, &len, err), 0);
	assert_int_equal(len, all.n);
	assert_memory_equal(whole, all.p, len);
	assert_true(utf8_valid(whole, len));
	free(whole);
	free(all.p);
	free(piece);
}

/* Writes text to dir/name. */
static void
write_text(const char *dir, const char *name, const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* ---- tests ---- */

/* Random texts of every script come back unchanged, from both loaders. */
static void
test_roundtrip(void **state)
{
	char text[4096];
	uint64_t s = 1;
	size_t n;
	int i, k;

	(void)state;
	for (k = 0; k < N_TEXTS; k++) {
		n = random_text(&s, text);
		for (i = 0; i < N_FLAVOURS; i++) {
			check_roundtrip(fx[i].gguf, fx[i].flavour, text, n, 0);
			check_roundtrip(fx[i].json, fx[i].flavour, text, n, 0);
			/* a space marker goes after every special token: only the first is stripped */
			if (!fx[i].prefix) {
				check_roundtrip(fx[i].gguf, fx[i].flavour, text, n, 1);
				check_roundtrip(fx[i].json, fx[i].flavour, text, n, 1);
			}
		}
	}
}

/* The GGUF and the tokenizer.json of one vocabulary give the same ids. */
static void
test_gguf_equals_json(void **state)
{
	int32_t *a, *b;
	char text[4096];
	uint64_t s = 2;
	size_t n, na, nb;
	int i, k, special;

	(void)state;
	for (k = 0; k < N_TEXTS; k++) {
		n = random_text(&s, text);
		special = k & 1;
		for (i = 0; i < N_FLAVOURS; i++) {
			if (spm_ambiguous(fx[i].gguf, text, n))
				continue;
			na = encode(fx[i].gguf, text, n, special, 1, &a);
			nb = encode(fx[i].json, text, n, special, 1, &b);
			if (na != nb || memcmp(a, b, na * sizeof *a) != 0)
				fail_msg("%s: GGUF and JSON differ on '%.*s'", fx[i].flavour, (int)n, text);
			free(a);
			free(b);
		}
	}
}

/*
 * tok_bytes_hash, a draft model's vocabulary check: one vocabulary's GGUF
 * and tokenizer.json spell every id alike and hash alike; no two flavours do.
 */
static void
test_bytes_hash(void **state)
{
	(void)state;
	for (int i = 0; i < N_FLAVOURS; i++) {
		assert_true(tok_bytes_hash(fx[i].gguf) == tok_bytes_hash(fx[i].json));
		for (int j = 0; j < i; j++)
			assert_true(tok_bytes_hash(fx[i].gguf) != tok_bytes_hash(fx[j].gguf));
	}
}

/* Streaming whole encodings, and random id sequences, hands out whole UTF-8 only. */
static void
test_stream(void **state)
{
	int32_t *ids, rid[64];
	char text[4096];
	uint64_t s = 3;
	size_t n, n_ids, j;
	int i, k;

	(void)state;
	for (k = 0; k < N_TEXTS / 4; k++) {
		n = random_text(&s, text);
		for (i = 0; i < N_FLAVOURS; i++) {
			n_ids = encode(fx[i].gguf, text, n, 1, 1, &ids);
			check_stream(fx[i].gguf, ids, n_ids, k & 1);
			free(ids);
			/* random ids cut characters anywhere: the bytes become U+FFFD */
			for (j = 0; j < ARRAY_LEN(rid); j++)
				rid[j] = (int32_t)(rnd(&s) % (uint64_t)tok_n_vocab(fx[i].json));
			check_stream(fx[i].json, rid, ARRAY_LEN(rid), k & 1);
		}
	}
}

/* A character cut over byte tokens is held back until complete; a cut one becomes U+FFFD. */
static void
test_stream_bytes(void **state)
{
	const struct tokenizer *t = fx[3].gguf; /* llama: <0xXX> tokens */
	char out[64], hex[8];
	struct tok_stream st;
	int32_t b[4];
	int i;

	(void)state;
	for (i = 0; i < 4; i++) {
		snprintf(hex, sizeof hex, "<0x%02X>", (unsigned char)"\xf0\x9f\x98\x80"[i]);
		b[i] = tok_find(t, hex);
		assert_true(b[i] >= 0);
	}
	tok_stream_init(&st);
	assert_int_equal(tok_stream_push(t, &st, b[0], 0, out, sizeof out), 0);
	assert_int_equal(tok_stream_push(t, &st, b[1], 0, out, sizeof out), 0);
	assert_int_equal(tok_stream_push(t, &st, b[2], 0, out, sizeof out), 0);
	assert_int_equal(tok_stream_push(t, &st, b[3], 0, out, sizeof out), 4);
	assert_memory_equal(out, "\xf0\x9f\x98\x80", 4);
	assert_int_equal(tok_stream_push(t, &st, b[0], 0, out, sizeof out), 0);
	assert_int_equal(tok_stream_push(t, &st, b[1], 0, out, sizeof out), 0);
	assert_int_equal(tok_stream_flush(&st, out, sizeof out), 3);
	assert_memory_equal(out, "\xef\xbf\xbd", 3);
	assert_int_equal(tok_stream_flush(&st, out, sizeof out), 0);
	/* out of range ids and a capacity too small are refused, the stream untouched */
	assert_int_equal(tok_stream_push(t, &st, -1, 0, out, sizeof out), ERR_RANGE);
	assert_int_equal(tok_stream_push(t, &st, tok_n_vocab(t), 0, out, sizeof out), ERR_RANGE);
	assert_int_equal(tok_stream_push(t, &st, b[3], 0, out, 2), ERR_RANGE);
	assert_int_equal(st.n_pending, 0);
}

/* Invalid UTF-8 is refused with a message naming the offset. */
static void
test_invalid_utf8(void **state)
{
	static const char *const bad[] = {
		"abc\x80", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
		"ok \xe6\x97", "\xff", "\xf0\x9f\x98",
	};
	char err[ERR_LEN];
	int32_t *ids;
	size_t k, n;
	int i;

	(void)state;
	for (i = 0; i < N_FLAVOURS; i++)
		for (k = 0; k < ARRAY_LEN(bad); k++) {
			err[0] = '\0';
			assert_int_equal(tok_encode(fx[i].gguf, bad[k], strlen(bad[k]), 1, 1, &ids, &n,
			    err), ERR_INVAL);
			assert_non_null(strstr(err, "UTF-8"));
		}
}

/* Control tokens are parsed only on request; user-defined ones always. */
static void
test_special(void **state)
{
	static const struct { int fx; const char *text, *control, *user; } cases[] = {
		{ 0, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<|eot_id|>", NULL },
		{ 1, "<|im_start|>user\n<tool_call>x</tool_call><|im_end|>", "<|im_end|>", "<tool_call>" },
		{ 2, "<start_of_turn>user\n<table>hi\n\n<end_of_turn>", "<end_of_turn>", "<table>" },
		{ 3, "<s>hello</s>", "</s>", NULL },
		{ 4, "<|im_start|>assistant\n<think>\nx\n</think>\n\nok<|im_end|>", "<|im_end|>",
		  "</think>" },
		{ 5, "<|start|>assistant<|channel|>final<|message|>hi<|return|>", "<|channel|>", NULL },
	};
	const struct tokenizer *t;
	int32_t *ids, c, u;
	size_t k, n;
	int j;

	(void)state;
	for (k = 0; k < ARRAY_LEN(cases); k++) {
		for (j = 0; j < 2; j++) {
			t = j ? fx[cases[k].fx].json : fx[cases[k].fx].gguf;
			c = tok_find(t, cases[k].control);
			u = cases[k].user ? tok_find(t, cases[k].user) : -1;
			assert_true(c >= 0);
			n = encode(t, cases[k].text, strlen(cases[k].text), 1, 0, &ids);
			assert_true(has_id(ids, n, c));
			assert_true(u < 0 || has_id(ids, n, u));
			free(ids);
			n = encode(t, cases[k].text, strlen(cases[k].text), 0, 0, &ids);
			assert_false(has_id(ids, n, c));
			assert_true(u < 0 || has_id(ids, n, u));
			free(ids);
		}
	}
}

/* BOS where the family adds it, and the tokens that end a turn. */
static void
test_bos_eog(void **state)
{
	static const struct { int fx; const char *bos, *eog[3]; } cases[] = {
		{ 0, "<|begin_of_text|>", { "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>" } },
		{ 1, NULL, { "<|endoftext|>", "<|im_end|>", NULL } },
		{ 2, "<bos>", { "<eos>", "<end_of_turn>", NULL } },
		{ 3, "<s>", { "</s>", NULL, NULL } },
		{ 4, NULL, { "<|endoftext|>", "<|im_end|>", NULL } },
		{ 5, NULL, { "<|return|>", "<|call|>", "<|endoftext|>" } },
	};
	const struct tokenizer *t;
	int32_t *ids;
	size_t k, e, n;
	int j;

	(void)state;
	for (k = 0; k < ARRAY_LEN(cases); k++) {
		for (j = 0; j < 2; j++) {
			t = j ? fx[cases[k].fx].json : fx[cases[k].fx].gguf;
			n = encode(t, "hi", 2, 0, 1, &ids);
			if (cases[k].bos != NULL) {
				assert_true(tok_add_bos(t));
				assert_int_equal(ids[0], tok_find(t, cases[k].bos));
				assert_int_equal(tok_bos(t), ids[0]);
			} else {
				assert_false(tok_add_bos(t));
				assert_false(has_id(ids, n, tok_find(t, "<|endoftext|>")));
			}
			free(ids);
			for (e = 0; e < 3 && cases[k].eog[e] != NULL; e++)
				assert_true(tok_is_eog(t, tok_find(t, cases[k].eog[e])));
			assert_true(tok_is_eog(t, tok_eos(t)));
			assert_false(tok_is_eog(t, tok_find(t, "<table>")));
			assert_false(tok_is_eog(t, 300));
			assert_false(tok_is_eog(t, -1));
		}
	}
}

/* Harmony's <|end|> closes a message, not the turn; elsewhere (Phi-3) it ends the turn. */
static void
test_harmony_eog(void **state)
{
	static const char phi3[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, "
	    "\"added_tokens\": [{\"id\": 1, \"content\": \"<|end|>\", \"special\": true}, "
	    "{\"id\": 2, \"content\": \"<|return|>\", \"special\": true}]}";
	struct tokenizer *t;
	char err[ERR_LEN], path[256];
	int j;

	(void)state;
	for (j = 0; j < 2; j++) {
		t = j ? fx[5].json : fx[5].gguf;
		assert_int_equal(tok_piece(t, tok_eos(t)) != NULL, 1);
		assert_string_equal(tok_piece(t, tok_eos(t)), "<|return|>");
		assert_false(tok_is_eog(t, tok_find(t, "<|end|>")));
		assert_false(tok_is_eog(t, tok_find(t, "<|channel|>")));
		assert_false(tok_is_eog(t, tok_find(t, "<|start|>")));
	}
	/* <|return|> without <|call|>: not harmony, so <|end|> keeps ending turns */
	write_text(tmpdir, "phi3.json", phi3);
	snprintf(path, sizeof path, "%s/phi3.json", tmpdir);
	if (tok_load_json(path, NULL, &t, err) != 0)
		fail_msg("%s", err);
	assert_true(tok_is_eog(t, 1));
	assert_true(tok_is_eog(t, 2));
	tok_free(t);
}

/* Qwen3's <think> and </think> are text: decoded without render_special, never control. */
static void
test_think_tags(void **state)
{
	static const char text[] = "<think>\nplan\n</think>\n\nanswer";
	char err[ERR_LEN], *back;
	int32_t *ids, open, close;
	size_t n, len;
	int j;

	(void)state;
	for (j = 0; j < 2; j++) {
		const struct tokenizer *t = j ? fx[4].json : fx[4].gguf;

		open = tok_find(t, "<think>");
		close = tok_find(t, "</think>");
		assert_int_equal(tok_type(t, open), TOK_TYPE_USER_DEFINED);
		assert_int_equal(tok_type(t, close), TOK_TYPE_USER_DEFINED);
		n = encode(t, text, strlen(text), 0, 0, &ids);
		assert_int_equal(ids[0], open);
		assert_true(has_id(ids, n, close));
		assert_int_equal(tok_decode(t, ids, n, 0, &back, &len, err), 0);
		assert_string_equal(back, text);
		free(back);
		free(ids);
	}
}

/* The same flavour, size and seed always make the same vocabulary; another seed another. */
static void
test_genvocab_deterministic(void **state)
{
	struct genvocab a, b, c;
	char err[ERR_LEN];
	int32_t i, same = 1, differ = 0;

	(void)state;
	assert_int_equal(genvocab_make(&a, "llama3", 3000, 7, err), 0);
	assert_int_equal(genvocab_make(&b, "llama3", 3000, 7, err), 0);
	assert_int_equal(genvocab_make(&c, "llama3", 3000, 8, err), 0);
	for (i = 0; i < a.n; i++) {
		same &= strcmp(a.tokens[i], b.tokens[i]) == 0;
		differ |= strcmp(a.tokens[i], c.tokens[i]) != 0;
	}
	assert_true(same);
	assert_true(differ);
	assert_int_equal(a.n_merges, b.n_merges);
	genvocab_free(&a);
	genvocab_free(&b);
	genvocab_free(&c);
	assert_int_equal(genvocab_make(&a, "bert", 3000, 7, err), ERR_INVAL);
	assert_int_equal(genvocab_make(&a, "llama3", 100, 7, err), ERR_RANGE);
}

/* Missing, malformed and unsupported tokenizer.json files are refused with a message. */
static void
test_load_errors(void **state)
{
	static const struct { const char *json; int code; } cases[] = {
		{ "{", ERR_FORMAT },
		{ "[]", ERR_FORMAT },
		{ "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", ERR_UNSUPPORTED },
		{ "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1}}}", ERR_FORMAT },
		{ "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, "
		  "\"merges\": [\"a b\"]}}", ERR_FORMAT },
		{ "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, "
		  "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
		  "\"behavior\": \"Isolated\"}}", ERR_FORMAT },
		{ "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, "
		  "\"normalizer\": {\"type\": \"Lowercase\"}}", ERR_UNSUPPORTED },
	};
	struct tokenizer *t;
	char err[ERR_LEN], path[256];
	size_t k;

	(void)state;
	snprintf(path, sizeof path, "%s/bad.json", tmpdir);
	for (k = 0; k < ARRAY_LEN(cases); k++) {
		write_text(tmpdir, "bad.json", cases[k].json);
		err[0] = '\0';
		assert_int_equal(tok_load_json(path, NULL, &t, err), cases[k].code);
		assert_true(strlen(err) > 0);
	}
	snprintf(path, sizeof path, "%s/none.json", tmpdir);
	assert_int_equal(tok_load_json(path, NULL, &t, err), ERR_IO);
}

/* A GGUF without a vocabulary is refused. */
static void
test_gguf_no_vocab(void **state)
{
	struct gguf_writer *w = gguf_writer_new();
	struct gguf_file *f;
	struct tokenizer *t;
	char err[ERR_LEN], path[256];

	(void)state;
	snprintf(path, sizeof path, "%s/empty.gguf", tmpdir);
	gguf_w_str(w, "general.architecture", "llama");
	assert_int_equal(gguf_writer_begin(w, path, err), 0);
	assert_int_equal(gguf_writer_end(w, err), 0);
	gguf_writer_free(w);
	assert_int_equal(gguf_open(path, &f, err), 0);
	assert_int_equal(tok_load_gguf(f, &t, err), ERR_NOTFOUND);
	assert_non_null(strstr(err, "tokenizer.ggml.model"));
	gguf_close(f);
}

/* A long prompt encodes fast: merges use a heap, lookups a hash table. */
static void
test_long_prompt(void **state)
{
	size_t n = 0, n_ids;
	char *text = xmalloc(200000);
	uint64_t s = 4, t0;
	int32_t *ids;
	int i;

	(void)state;
	for (; n < 1000; n++)
		text[n] = 'a';  /* one long word: a worst case for merging */
	while (n < 100000)
		n += random_text(&s, text + n);
	for (i = 0; i < N_FLAVOURS; i++) {
		t0 = now_ns();
		n_ids = encode(fx[i].gguf, text, n, 1, 1, &ids);
		assert_true(n_ids > 0);
		assert_true(now_ns() - t0 < 2000000000ull);
		free(ids);
	}
	free(text);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_gguf_equals_json),
		cmocka_unit_test(test_bytes_hash),
		cmocka_unit_test(test_stream),
		cmocka_unit_test(test_stream_bytes),
		cmocka_unit_test(test_invalid_utf8),
		cmocka_unit_test(test_special),
		cmocka_unit_test(test_bos_eog),
		cmocka_unit_test(test_harmony_eog),
		cmocka_unit_test(test_think_tags),
		cmocka_unit_test(test_genvocab_deterministic),
		cmocka_unit_test(test_load_errors),
		cmocka_unit_test(test_gguf_no_vocab),
		cmocka_unit_test(test_long_prompt),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
