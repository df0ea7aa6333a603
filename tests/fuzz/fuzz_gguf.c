/*
 * fuzz_gguf.c: libFuzzer target for the GGUF reader and the tokenizer
 * loader behind it. Whatever the input, gguf_open_mem either refuses it or
 * hands out a directory whose every value and tensor byte can be read.
 */
#include "config.h"
#include "gguf.h"
#include "tokenizer.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads every value, so that a bad offset shows up as a sanitizer report. */
static unsigned
touch_all(const struct gguf_file *f)
{
	unsigned sum = 0;
	int64_t i;
	uint64_t j;

	for (i = 0; i < gguf_n_kv(f); i++) {
		struct gguf_str k = gguf_kv_key(f, i);

		sum += k.n ? (uint8_t)k.s[k.n - 1] : 0;
		if (gguf_kv_type(f, i) == GGUF_STRING)
			sum += (unsigned)gguf_kv_str(f, i).n;
		else if (gguf_kv_type(f, i) != GGUF_ARRAY)
			sum += (unsigned)gguf_kv_i64(f, i);
		for (j = 0; j < gguf_arr_n(f, i); j++) {
			if (gguf_arr_type(f, i) == GGUF_STRING) {
				struct gguf_str s = gguf_arr_str(f, i, j);
				sum += s.n ? (uint8_t)s.s[s.n - 1] : 0;
			} else {
				sum += (unsigned)gguf_arr_i64(f, i, j);
			}
		}
	}
	for (i = 0; i < gguf_n_tensors(f); i++) {
		const struct gguf_tensor *t = gguf_tensor(f, i);
		sum += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->bytes - 1];
	}
	return sum;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_file *f;
	struct tokenizer *tok;
	char err[ERR_LEN];
	volatile unsigned sink;

	if (gguf_open_mem(data, size, &f, err) != 0)
		return 0;
	sink = touch_all(f);
	(void)sink;
	if (tok_load_gguf(f, &tok, err) == 0)
		tok_free(tok);
	gguf_close(f);
	return 0;
}
