/* kv_tokens.h: the tokens of a block in the KV unit tests (test_kv.c, test_kvhost.c). */
#ifndef RESIDENT_TEST_KV_TOKENS_H
#define RESIDENT_TEST_KV_TOKENS_H

#include "kernels.h"

#include <stdint.h>

/* The KV_BLOCK_TOKENS tokens v, v + 1, ...; valid until the next call. */
static const int32_t *
toks(int32_t v)
{
	static int32_t t[KV_BLOCK_TOKENS];

	for (int i = 0; i < KV_BLOCK_TOKENS; i++)
		t[i] = v + i;
	return t;
}

#endif
