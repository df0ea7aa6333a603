/*
 * fault.c: the backends' fault injection (fault.h). A plan per backend,
 * parsed once from its environment variable; a counter per kind.
 */
#include "config.h"
#include "fault.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct fault_plan {
	pthread_once_t once;
	int rc;                         /* fault_init's answer */
	char err[ERR_LEN];
	int on;                         /* some kind is planned */
	uint64_t at[FAULT_KINDS];       /* the call that fails; 0: none */
	int from_on[FAULT_KINDS];       /* and every one after it */
	atomic_uint_fast64_t n[FAULT_KINDS];
};

static const char *const var[FAULT_BACKENDS] = { "RESIDENT_CUDA_FAULT", "RESIDENT_CPU_FAULT" };
static const char *const kind_names[FAULT_KINDS] = { "launch", "copy", "alloc", "step" };
/* The kinds each backend counts. */
static const int allowed[FAULT_BACKENDS][FAULT_KINDS] = {
	[FAULT_CUDA] = { [FAULT_LAUNCH] = 1, [FAULT_COPY] = 1, [FAULT_ALLOC] = 1 },
	[FAULT_CPU] = { [FAULT_COPY] = 1, [FAULT_STEP] = 1 },
};
static const char *const messages[FAULT_BACKENDS] = {
	"fault injected by RESIDENT_CUDA_FAULT", "fault injected by RESIDENT_CPU_FAULT",
};

static struct fault_plan plans[FAULT_BACKENDS] = {
	{ .once = PTHREAD_ONCE_INIT }, { .once = PTHREAD_ONCE_INIT },
};

/* Parses one "kind:N" or "kind:N+" of backend b's plan. */
static int
parse_item(enum fault_backend b, struct fault_plan *p, const char *item, size_t len, char *err)
{
	char *end;
	unsigned long long n;
	int k;

	for (k = 0; k < FAULT_KINDS; k++) {
		size_t kl = strlen(kind_names[k]);

		if (allowed[b][k] && len > kl && strncmp(item, kind_names[k], kl) == 0 && item[kl] == ':')
			break;
	}
	if (k == FAULT_KINDS)
		return err_set(err, ERR_INVAL, "%s: '%.*s' is not kind:N with a kind this backend counts", var[b],
		    (int)len, item);
	n = strtoull(item + strlen(kind_names[k]) + 1, &end, 10);
	if (n == 0 || (end != item + len && !(*end == '+' && end + 1 == item + len)))
		return err_set(err, ERR_INVAL, "%s: '%.*s': N must be a number from 1", var[b], (int)len, item);
	p->at[k] = n;
	p->from_on[k] = *end == '+';
	p->on = 1;
	return 0;
}

/* Parses backend b's variable into its plan; a malformed one leaves the plan off, its error kept. */
static void
parse(enum fault_backend b)
{
	struct fault_plan *p = &plans[b];
	const char *s = getenv(var[b]), *comma;
	size_t len;

	while (s != NULL && *s != '\0' && p->rc == 0) {
		comma = strchr(s, ',');
		len = comma ? (size_t)(comma - s) : strlen(s);
		p->rc = parse_item(b, p, s, len, p->err);
		s = comma ? comma + 1 : NULL;
	}
	if (p->rc != 0)
		p->on = 0;
}

/* pthread_once takes functions without arguments: one per backend. */
static void parse_cuda(void) { parse(FAULT_CUDA); }
static void parse_cpu(void) { parse(FAULT_CPU); }

int
fault_init(enum fault_backend b, char *err)
{
	pthread_once(&plans[b].once, b == FAULT_CUDA ? parse_cuda : parse_cpu);
	if (plans[b].rc != 0)
		return err_set(err, plans[b].rc, "%s", plans[b].err);
	return 0;
}

int
fault_hit(enum fault_backend b, enum fault_kind k)
{
	struct fault_plan *p = &plans[b];
	uint64_t n;

	if (!p->on || p->at[k] == 0)
		return 0;
	n = atomic_fetch_add(&p->n[k], 1) + 1;
	return n == p->at[k] || (p->from_on[k] && n > p->at[k]);
}

const char *
fault_message(enum fault_backend b)
{
	return messages[b];
}
