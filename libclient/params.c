/*
 * params.c: rs_params, the fields of a request in the order they were
 * first set. Names and values are not checked here; the daemon does.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

enum ftype { F_STR, F_UINT, F_FLOAT, F_BOOL, F_STRS, F_MAPS, F_UINTS, F_MAP };

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
	char **strs;        /* F_STRS: n strings */
	rs_params **maps;   /* F_MAPS: n maps (messages, a message's tool calls) */
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
	for (i = 0; f->strs != NULL && i < f->n; i++)
		free(f->strs[i]);
	for (i = 0; f->maps != NULL && i < f->n; i++)
		rs_params_free(f->maps[i]);
	free(f->strs);
	free(f->maps);
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
 * key or out of memory (*st says which). Any key: slot refuses the ones
 * the library sets in a request.
 */
static struct field *
slot_any(rs_params *p, const char *key, enum ftype type, rs_status *st)
{
	struct field *f, *nf;
	char *k;

	*st = RS_ERR_INVAL;
	if (p == NULL || key == NULL)
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

/* Whether key is "id" or "op", which the library sets in a request. */
static int
reserved(const char *key)
{
	return key != NULL && (strcmp(key, "id") == 0 || strcmp(key, "op") == 0);
}

/* slot_any for a key other than "id" and "op". */
static struct field *
slot(rs_params *p, const char *key, enum ftype type, rs_status *st)
{
	*st = RS_ERR_INVAL;
	if (reserved(key))
		return NULL;
	return slot_any(p, key, type, st);
}

/* rs_params_set_str for any key: a map inside a request may have an "id" (a tool call's). */
static rs_status
set_str_any(rs_params *p, const char *key, const char *value)
{
	struct field *f;
	rs_status st;
	char *s;

	if (value == NULL)
		return RS_ERR_INVAL;
	if ((s = strdup(value)) == NULL)
		return RS_ERR_NOMEM;
	if ((f = slot_any(p, key, F_STR, &st)) == NULL) {
		free(s);
		return st;
	}
	f->v.s = s;
	return RS_OK;
}

rs_status
rs_params_set_str(rs_params *p, const char *key, const char *value)
{
	return reserved(key) ? RS_ERR_INVAL : set_str_any(p, key, value);
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

static rs_status params_copy(rs_params *copy, const rs_params *sub);

/* The array field key of type (created, or retyped, if it is not one). */
static struct field *
array_field(rs_params *p, const char *key, enum ftype type, rs_status *st)
{
	struct field *f;

	if ((f = find(p, key)) != NULL && f->type == type)
		return f;
	return slot(p, key, type, st);
}

/* Appends a string to the array field key. */
static rs_status
append_str(rs_params *p, const char *key, const char *s)
{
	struct field *f;
	char *copy, **ns;
	rs_status st = RS_OK;

	if (p == NULL || key == NULL || s == NULL)
		return RS_ERR_INVAL;
	if ((f = array_field(p, key, F_STRS, &st)) == NULL)
		return st;
	if ((ns = realloc(f->strs, (f->n + 1) * sizeof *ns)) == NULL)
		return RS_ERR_NOMEM;
	f->strs = ns;
	if ((copy = strdup(s)) == NULL)
		return RS_ERR_NOMEM;
	f->strs[f->n++] = copy;
	return RS_OK;
}

/* Appends map (taken, freed on failure) to the array field key. */
static rs_status
append_map(rs_params *p, const char *key, rs_params *map)
{
	struct field *f;
	rs_params **nm;
	rs_status st = RS_OK;

	if ((f = array_field(p, key, F_MAPS, &st)) == NULL || (nm = realloc(f->maps, (f->n + 1) * sizeof *nm)) == NULL) {
		rs_params_free(map);
		return f == NULL ? st : RS_ERR_NOMEM;
	}
	f->maps = nm;
	f->maps[f->n++] = map;
	return RS_OK;
}

/* Appends a copy of map to the array of maps key. */
static rs_status
copy_map(rs_params *p, const char *key, const rs_params *map)
{
	rs_params *copy;
	rs_status st;

	if ((copy = rs_params_new()) == NULL)
		return RS_ERR_NOMEM;
	if ((st = params_copy(copy, map)) != RS_OK) {
		rs_params_free(copy);
		return st;
	}
	return append_map(p, key, copy);
}

rs_status
rs_params_add_map(rs_params *p, const char *key, const rs_params *map)
{
	if (p == NULL || key == NULL || map == NULL || reserved(key))
		return RS_ERR_INVAL;
	return copy_map(p, key, map);
}

rs_status
rs_params_add_call(rs_params *msg, const char *id, const char *name, const char *arguments)
{
	rs_params *c;
	rs_status st;

	if (msg == NULL || name == NULL || arguments == NULL)
		return RS_ERR_INVAL;
	if ((c = rs_params_new()) == NULL)
		return RS_ERR_NOMEM;
	if ((id != NULL && (st = set_str_any(c, "id", id)) != RS_OK) ||
	    (st = set_str_any(c, "name", name)) != RS_OK || (st = set_str_any(c, "arguments", arguments)) != RS_OK) {
		rs_params_free(c);
		return st;
	}
	return append_map(msg, "tool_calls", c);
}

rs_status
rs_params_add_message(rs_params *p, const char *role, const char *content)
{
	rs_params *m;
	rs_status st;

	if (p == NULL || role == NULL || content == NULL)
		return RS_ERR_INVAL;
	if ((m = rs_params_new()) == NULL)
		return RS_ERR_NOMEM;
	if ((st = rs_params_set_str(m, "role", role)) != RS_OK || (st = rs_params_set_str(m, "content", content)) != RS_OK) {
		rs_params_free(m);
		return st;
	}
	return append_map(p, "messages", m);
}

rs_status
rs_params_add_stop(rs_params *p, const char *stop)
{
	return append_str(p, "stop", stop);
}

rs_status
rs_params_add_str(rs_params *p, const char *key, const char *value)
{
	return append_str(p, key, value);
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

/* Copies every field of sub into copy. */
static rs_status
params_copy(rs_params *copy, const rs_params *sub)
{
	rs_status st = RS_OK;
	size_t i, j;

	for (i = 0; st == RS_OK && i < sub->n; i++) {
		const struct field *s = &sub->f[i];

		switch (s->type) {
		case F_STR: st = set_str_any(copy, s->key, s->v.s); break;
		case F_UINT: st = rs_params_set_uint(copy, s->key, s->v.u); break;
		case F_FLOAT: st = rs_params_set_float(copy, s->key, s->v.f); break;
		case F_BOOL: st = rs_params_set_bool(copy, s->key, s->v.b); break;
		case F_STRS:
			for (j = 0; st == RS_OK && j < s->n; j++)
				st = append_str(copy, s->key, s->strs[j]);
			break;
		case F_MAPS:
			for (j = 0; st == RS_OK && j < s->n; j++)
				st = copy_map(copy, s->key, s->maps[j]);
			break;
		case F_UINTS: st = params_set_uints(copy, s->key, s->uints, s->n); break;
		case F_MAP: st = params_set_params(copy, s->key, s->v.map); break;
		}
	}
	return st;
}

rs_status
params_set_params(rs_params *p, const char *key, const rs_params *sub)
{
	rs_params *copy = rs_params_new();
	struct field *f;
	rs_status st = copy ? params_copy(copy, sub) : RS_ERR_NOMEM;

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
		case F_MAPS:
			msgpack_pack_array(pk, f->n);
			for (j = 0; j < f->n; j++) {
				msgpack_pack_map(pk, f->maps[j]->n);
				params_pack(f->maps[j], pk);
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
