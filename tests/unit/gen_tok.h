/*
 * gen_tok.h: the tokenizers of generated qwen3 and harmony vocabularies
 * (contrib/tools/genvocab.c), as a cmocka group fixture, for the unit tests
 * that read generated text (test_chat_reason.c, test_gentext.c).
 */
#ifndef RESIDENT_TEST_GEN_TOK_H
#define RESIDENT_TEST_GEN_TOK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer.h"
#include "util.h"
#include "../../contrib/tools/genvocab.h"

static struct tokenizer *qwen3, *harmony;
static char tmpdir[64];

/* Makes a flavour's vocabulary, writes its tokenizer.json and loads it; NULL on failure. */
static struct tokenizer *
gen_tok(const char *flavour, int32_t n_vocab)
{
	char err[ERR_LEN], dir[128], path[160];
	struct genvocab v;
	struct tokenizer *t;

	snprintf(dir, sizeof dir, "%s/%s", tmpdir, flavour);
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	if (genvocab_make(&v, flavour, n_vocab, 5, err) != 0 || genvocab_write_json(&v, dir, err) != 0 ||
	    tok_load_json(path, NULL, &t, err) != 0) {
		fprintf(stderr, "%s: %s\n", flavour, err);
		t = NULL;
	}
	genvocab_free(&v);
	return t;
}

/* The group's setup: qwen3 and harmony, in a temporary directory. */
static int
gen_tok_setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof tmpdir, "/tmp/test_gen_tok.XXXXXX");
	if (mkdtemp(tmpdir) == NULL)
		return -1;
	qwen3 = gen_tok("qwen3", 2600);
	harmony = gen_tok("harmony", 3000);
	return qwen3 != NULL && harmony != NULL ? 0 : -1;
}

static int
gen_tok_teardown(void **state)
{
	char cmd[128];

	(void)state;
	tok_free(qwen3);
	tok_free(harmony);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

#endif
