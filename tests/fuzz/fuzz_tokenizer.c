/*
 * fuzz_tokenizer.c: libFuzzer target for the tokenizer.json loader and the
 * tokenizer it builds (daemon/model/tokenizer_load.c).
 *
 * Input: NUL-separated parts: tokenizer.json, then a text to encode, then
 * tokenizer_config.json (each optional after the first; JSON text holds
 * no raw NUL). A loaded tokenizer encodes the text (first 4 KiB) with and
 * without special tokens and decodes the ids again, whole and streamed.
 *
 * Whatever the input: loading refuses it with a message, or encoding
 * gives ids inside the vocabulary (or refuses with a message: text that
 * is not UTF-8, or that the vocabulary cannot represent), and decoding
 * gives valid UTF-8.
 *
 * Run (from a build configured with --enable-fuzz CC=clang):
 *   tests/fuzz/fuzz_tokenizer -max_total_time=600 CORPUS $(SRCDIR)/tests/fuzz/corpus/tokenizer
 */
#include "config.h"
#include "fuzz.h"
#include "tokenizer.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TEXT 4096

/* Decodes ids whole and streamed; both must be valid UTF-8. */
static void
decode(const struct tokenizer *t, const int32_t *ids, size_t n, int special)
{
	struct tok_stream s;
	size_t cap = tok_stream_cap(t), i, len = 0;
	char *text = NULL, *buf = xmalloc(cap + 4);
	int w;

	FUZZ_CHECK(tok_decode(t, ids, n, special, &text, &len, NULL) == 0);
	FUZZ_CHECK(utf8_valid(text, len) && strlen(text) <= len);
	free(text);
	tok_stream_init(&s);
	for (i = 0; i < n; i++) {
		w = tok_stream_push(t, &s, ids[i], special, buf, cap);
		FUZZ_CHECK(w >= 0 && utf8_valid(buf, (size_t)w));
	}
	w = tok_stream_flush(&s, buf, cap + 4);
	FUZZ_CHECK(w >= 0 && utf8_valid(buf, (size_t)w));
	free(buf);
}

/* Encodes text both ways and decodes what came out. */
static void
exercise(const struct tokenizer *t, const char *text, size_t len)
{
	char err[ERR_LEN];
	int32_t *ids;
	size_t n, i;
	int special, rc;

	for (special = 0; special < 2; special++) {
		ids = NULL;
		err[0] = '\0';
		rc = tok_encode(t, text, len, special, special, &ids, &n, err);
		/* text no vocabulary token covers (without <unk> or byte fallback), or a
		 * split regex that gives up, is refused with a message */
		FUZZ_CHECK(rc == 0 || ((rc == ERR_INVAL || rc == ERR_UNSUPPORTED) && err[0] != '\0'));
		FUZZ_CHECK(rc != 0 || utf8_valid(text, len));
		if (rc == 0) {
			for (i = 0; i < n; i++)
				FUZZ_CHECK(ids[i] >= 0 && ids[i] < tok_n_vocab(t) && tok_piece(t, ids[i]) != NULL);
			decode(t, ids, n, special);
		}
		free(ids);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *end = data + size, *text, *cfg = NULL, *p;
	char err[ERR_LEN], jpath[FUZZ_PATH_LEN], cpath[FUZZ_PATH_LEN];
	struct tokenizer *t = NULL;
	size_t text_len = 0;
	int jfd, cfd = -1, rc;

	p = memchr(data, '\0', size);
	text = p ? p + 1 : end;
	jfd = fuzz_memfile(data, (size_t)((p ? p : end) - data), jpath);
	if (text < end) {
		p = memchr(text, '\0', (size_t)(end - text));
		text_len = (size_t)((p ? p : end) - text);
		if (p != NULL) {
			cfg = p + 1;
			cfd = fuzz_memfile(cfg, (size_t)(end - cfg), cpath);
		}
	}
	err[0] = '\0';
	rc = tok_load_json(jpath, cfg ? cpath : NULL, &t, err);
	close(jfd);
	if (cfd >= 0)
		close(cfd);
	if (rc != 0) {
		FUZZ_CHECK(rc < 0 && err[0] != '\0' && memchr(err, '\0', ERR_LEN) != NULL);
		return 0;
	}
	FUZZ_CHECK(tok_n_vocab(t) > 0);
	exercise(t, (const char *)text, MIN(text_len, MAX_TEXT));
	tok_free(t);
	return 0;
}
