/*
 * tiny_model.h: the generated model that the engine's tests run on (the
 * "tiny" llama3 shape, Q8_0, seed 5), made in a fresh temporary directory
 * by a test group's setup and removed by its teardown, and the engines and
 * grammars the tests make on it. Included by one test file each: the tests
 * that share it share one fixture.
 */
#ifndef RESIDENT_TINY_MODEL_H
#define RESIDENT_TINY_MODEL_H

#include "engine.h"
#include "genmodel.h"

#include <string.h>

static char tiny_dir[64], tiny_path[128];

static int
tiny_model_setup(void **state)
{
	struct genmodel_opts o = { .shape = "tiny", .format = "gguf", .type = "q8_0", .seed = 5, .threads = 2 };
	char err[ERR_LEN];

	(void)state;
	snprintf(tiny_dir, sizeof tiny_dir, "/tmp/resident_tiny_XXXXXX");
	assert_non_null(mkdtemp(tiny_dir));
	snprintf(tiny_path, sizeof tiny_path, "%s/m.gguf", tiny_dir);
	o.out = tiny_path;
	if (genmodel_run(&o, err) != 0)
		fail_msg("%s", err);
	return 0;
}

static int
tiny_model_teardown(void **state)
{
	(void)state;
	unlink(tiny_path);
	rmdir(tiny_dir);
	return 0;
}

/*
 * An engine on the tiny model, on the CPU backend (on a machine with a GPU
 * too): a context of n_ctx, a pool of kv_tokens, steps of 64 tokens, 2
 * threads (the tests' shared shape).
 */
static inline struct engine *
tiny_engine(int32_t n_ctx, int32_t kv_tokens)
{
	struct engine_opts o = { .device = "cpu", .n_threads = 2, .n_ctx = n_ctx, .kv_tokens = kv_tokens,
				 .max_step_tokens = 64 };
	struct engine *e;
	char err[ERR_LEN];

	if (engine_open(tiny_path, &o, &e, err) != 0)
		fail_msg("%s", err);
	return e;
}

/* The grammar of text over e's vocabulary, held (engine_grammar_put); the test fails if it does not compile. */
static inline struct cons_gram *
tiny_grammar(struct engine *e, const char *text)
{
	struct cons_gram *g;
	char err[ERR_LEN];

	if (engine_grammar(e, text, strlen(text), &g, err) != 0)
		fail_msg("%s: %s", text, err);
	return g;
}

#endif
