/*
 * params.c: rs_params, the fields of a request in the order they were
 * first set. Names and values are not checked here; the daemon does.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

enum ftype { F_STR, F_UINT, F_FLOAT, F_BOOL, F_STRS, F_MSGS, F_UINTS, F_MAP };

struct field {
	char *key;
	enum ftype type;
	union {
		char *s;
		uint64_t u;
		double f;
		int b;
		rs_params *map;
	} v;
	char **strs;        /* F_STRS: n strings; F_MSGS: n (role, content) pairs */
	uint32_t *uints;    /* F_UINTS: n ids */
	size_t n;
};

struct rs_params {
	struct field *f;
	size_t n, cap;
};

static void
field_clear(struct field *f)
{
	size_t i;

	free(f->key);
	if (f->type == F_STR)
		free(f->v.s);
	if (f->type == F_MAP)
		rs_params_free(f->v.map);
	for (i = 0; f->strs != NULL && i < (f->type == F_MSGS ? 2 * f->n : f->n); i++)
		free(f->strs[i]);
	free(f->strs);
	free(f->uints);
	memset(f, 0, sizeof *f);
}

rs_params *
rs_params_new(void)
{
	return calloc(1, sizeof(rs_params));
}

void
rs_params_free(rs_params *p)
{
	size_t i;

	if (p == NULL)
		return;
	for (i = 0; i < p->n; i++)
		field_clear(&p->f[i]);
	free(p->f);
	free(p);
}

static struct field *
find(const rs_params *p, const char *key)
{
	size_t i;

	for (i = 0; i < p->n; i++)
		if (strcmp(p->f[i].key, key) == 0)
			return &p->f[i];
	return NULL;
}

/*
 * The field for key, emptied and typed, new ones appended; NULL for a bad
 * key or out of memory (*st says which).
 */
static struct field *
slot(rs_params *p, const char *key, enum ftype type, rs_status *st)
{
	struct field *f, *nf;
	char *k;

	*st = RS_ERR_INVAL;
	if (p == NULL || key == NULL || strcmp(key, "id") == 0 || strcmp(key, "op") == 0)
		return NULL;
	*st = RS_ERR_NOMEM;
	if ((f = find(p, key)) != NULL) {
		if ((k = strdup(key)) == NULL)
			return NULL;
		field_clear(f);
	} else {
		if (p->n == p->cap) {
			size_t cap = p->cap ? 2 * p->cap : 8;

			if ((nf = realloc(p->f, cap * sizeof *nf)) == NULL)
				return NULL;
			p->f = nf, p->cap = cap;
		}
		if ((k = strdup(key)) == NULL)
			return NULL;
		f = &p->f[p->n++];
		memset(f, 0, sizeof *f);
	}
	f->key = k;
	f->type = type;
	*st = RS_OK;
	return f;
}

rs_status
rs_params_set_str(rs_params *p, const char *key, const char *value)
{
	struct field *f;
	rs_status st;
	char *s;

	if (value == NULL)
		return RS_ERR_INVAL;
	if ((s = strdup(value)) == NULL)
		return RS_ERR_NOMEM;
	if ((f = slot(p, key, F_STR, &st)) == NULL) {
		free(s);
		return st;
	}
	f->v.s = s;
	return RS_OK;
}

rs_status
rs_params_set_uint(rs_params *p, const char *key, uint64_t value)
{
	struct field *f;
	rs_status st;

	if ((f = slot(p, key, F_UINT, &st)) != NULL)
		f->v.u = value;
	return st;
}

rs_status
rs_params_set_float(rs_params *p, const char *key, double value)
{
	struct field *f;
	rs_status st;

	if ((f = slot(p, key, F_FLOAT, &st)) != NULL)
		f->v.f = value;
	return st;
}

rs_status
rs_params_set_bool(rs_params *p, const char *key, int value)
{
	struct field *f;
	rs_status st;

	if ((f = slot(p, key, F_BOOL, &st)) != NULL)
		f->v.b = value != 0;
	return st;
}

/* Appends k strings to the array field key (created with type if missing). */
static rs_status
append_strs(rs_params *p, const char *key, enum ftype type, const char *const *s, size_t k)
{
	struct field *f;
	char *copy[2], **ns;
	rs_status st;
	size_t i, have;

	if (p == NULL || key == NULL)
		return RS_ERR_INVAL;
	for (i = 0; i < k; i++)
		if (s[i] == NULL)
			return RS_ERR_INVAL;
	if ((f = find(p, key)) == NULL || f->type != type)
		if ((f = slot(p, key, type, &st)) == NULL)
			return st;
	have = type == F_MSGS ? 2 * f->n : f->n;
	if ((ns = realloc(f->strs, (have + k) * sizeof *ns)) == NULL)
		return RS_ERR_NOMEM;
	f->strs = ns;
	for (i = 0; i < k; i++)
		if ((copy[i] = strdup(s[i])) == NULL) {
			while (i-- > 0)
				free(copy[i]);
			return RS_ERR_NOMEM;
		}
	memcpy(f->strs + have, copy, k * sizeof *copy);
	f->n++;
	return RS_OK;
}

rs_status
rs_params_add_message(rs_params *p, const char *role, const char *content)
{
	const char *pair[2] = { role, content };

	return append_strs(p, "messages", F_MSGS, pair, 2);
}

rs_status
rs_params_add_stop(rs_params *p, const char *stop)
{
	return append_strs(p, "stop", F_STRS, &stop, 1);
}

rs_status
params_set_uints(rs_params *p, const char *key, const uint32_t *v, size_t n)
{
	struct field *f;
	uint32_t *copy;
	rs_status st;

	if ((copy = malloc((n ? n : 1) * sizeof *copy)) == NULL)
		return RS_ERR_NOMEM;
	if (n > 0)
		memcpy(copy, v, n * sizeof *copy);
	if ((f = slot(p, key, F_UINTS, &st)) == NULL) {
		free(copy);
		return st;
	}
	f->uints = copy;
	f->n = n;
	return RS_OK;
}

rs_status
params_set_params(rs_params *p, const char *key, const rs_params *sub)
{
	rs_params *copy = rs_params_new();
	struct field *f;
	rs_status st = copy ? RS_OK : RS_ERR_NOMEM;
	size_t i;

	for (i = 0; st == RS_OK && i < sub->n; i++) {
		const struct field *s = &sub->f[i];

		switch (s->type) {
		case F_STR: st = rs_params_set_str(copy, s->key, s->v.s); break;
		case F_UINT: st = rs_params_set_uint(copy, s->key, s->v.u); break;
		case F_FLOAT: st = rs_params_set_float(copy, s->key, s->v.f); break;
		case F_BOOL: st = rs_params_set_bool(copy, s->key, s->v.b); break;
		case F_STRS: case F_MSGS:
			for (size_t j = 0; st == RS_OK && j < s->n; j++)
				st = append_strs(copy, s->key, s->type,
				    (const char *const *)s->strs + (s->type == F_MSGS ? 2 * j : j),
				    s->type == F_MSGS ? 2 : 1);
			break;
		case F_UINTS: st = params_set_uints(copy, s->key, s->uints, s->n); break;
		case F_MAP: st = params_set_params(copy, s->key, s->v.map); break;
		}
	}
	if (st == RS_OK && (f = slot(p, key, F_MAP, &st)) != NULL) {
		f->v.map = copy;
		return RS_OK;
	}
	rs_params_free(copy);
	return st;
}

size_t
params_count(const rs_params *p)
{
	return p ? p->n : 0;
}

int
params_has(const rs_params *p, const char *key)
{
	return p != NULL && find(p, key) != NULL;
}

void
params_pack(const rs_params *p, msgpack_packer *pk)
{
	size_t i, j;

	for (i = 0; p != NULL && i < p->n; i++) {
		const struct field *f = &p->f[i];

		frame_pack_str(pk, f->key);
		switch (f->type) {
		case F_STR: frame_pack_str(pk, f->v.s); break;
		case F_UINT: msgpack_pack_uint64(pk, f->v.u); break;
		case F_FLOAT: msgpack_pack_double(pk, f->v.f); break;
		case F_BOOL: f->v.b ? msgpack_pack_true(pk) : msgpack_pack_false(pk); break;
		case F_STRS:
			msgpack_pack_array(pk, f->n);
			for (j = 0; j < f->n; j++)
				frame_pack_str(pk, f->strs[j]);
			break;
		case F_MSGS:
			msgpack_pack_array(pk, f->n);
			for (j = 0; j < f->n; j++) {
				msgpack_pack_map(pk, 2);
				frame_pack_str(pk, "role");
				frame_pack_str(pk, f->strs[2 * j]);
				frame_pack_str(pk, "content");
				frame_pack_str(pk, f->strs[2 * j + 1]);
			}
			break;
		case F_UINTS:
			msgpack_pack_array(pk, f->n);
			for (j = 0; j < f->n; j++)
				msgpack_pack_uint32(pk, f->uints[j]);
			break;
		case F_MAP:
			msgpack_pack_map(pk, f->v.map->n);
			params_pack(f->v.map, pk);
			break;
		}
	}
}
