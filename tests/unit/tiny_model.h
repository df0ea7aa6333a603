/*
 * tiny_model.h: the generated model that the engine's tests run on (the
 * "tiny" llama3 shape, Q8_0, seed 5), made in a fresh temporary directory
 * by a test group's setup and removed by its teardown. Included by one
 * test file each: the tests that share it share one fixture.
 */
#ifndef RESIDENT_TINY_MODEL_H
#define RESIDENT_TINY_MODEL_H

#include "genmodel.h"

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

#endif
