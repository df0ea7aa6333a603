/* rng_seed.h: the seed of the xorshift draws in the unit tests that make random cases (test_grammar.c, test_jschema.c). */
#ifndef RESIDENT_TEST_RNG_SEED_H
#define RESIDENT_TEST_RNG_SEED_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/*
 * The seed that the environment variable var holds, else one from the clock;
 * never 0 (xorshift stays at 0). Printed as test's, with how to repeat the run.
 */
static uint64_t
test_seed(const char *test, const char *var)
{
	const char *env = getenv(var);
	uint64_t seed = env != NULL && *env != '\0' ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) * 2654435761u + 1;

	seed += seed == 0;
	printf("%s: seed %llu (%s=%llu repeats this run)\n", test, (unsigned long long)seed, var,
	    (unsigned long long)seed);
	return seed;
}

#endif
