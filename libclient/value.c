/*
 * value.c: rs_value, a read-only copy of a msgpack object. Strings are
 * NUL-terminated copies so that callers can use them as C strings; map
 * keys that are not strings are dropped (the protocol has none).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

struct rs_value {
	rs_type type;
	int root;                   /* the top of a tree: rs_value_free frees it */
	size_t n;                   /* string bytes, array elements, map pairs */
	union {
		int b;
		uint64_t u;
		int64_t i;
		double f;
		char *s;
		struct rs_value *items; /* array elements, map values */
	} v;
	char **keys;                /* map keys, n of them */
};

static int fill(rs_value *dst, const msgpack_object *o);
static void clear(rs_value *v);

/* Copies a string or bin payload. */
static int
fill_str(rs_value *dst, const char *p, size_t n)
{
	dst->type = RS_TYPE_STR;
	if ((dst->v.s = malloc(n + 1)) == NULL)
		return -1;
	memcpy(dst->v.s, p, n);
	dst->v.s[n] = '\0';
	dst->n = n;
	return 0;
}

static int
fill_array(rs_value *dst, const msgpack_object_array *a)
{
	uint32_t i;

	dst->type = RS_TYPE_ARRAY;
	if ((dst->v.items = calloc(a->size ? a->size : 1, sizeof *dst->v.items)) == NULL)
		return -1;
	for (i = 0; i < a->size; i++) {
		dst->n = i + 1;
		if (fill(&dst->v.items[i], &a->ptr[i]) != 0)
			return -1;
	}
	return 0;
}

static int
fill_map(rs_value *dst, const msgpack_object_map *m)
{
	uint32_t i;
	size_t n = 0;

	dst->type = RS_TYPE_MAP;
	if ((dst->v.items = calloc(m->size ? m->size : 1, sizeof *dst->v.items)) == NULL ||
	    (dst->keys = calloc(m->size ? m->size : 1, sizeof *dst->keys)) == NULL)
		return -1;
	for (i = 0; i < m->size; i++) {
		const msgpack_object_kv *kv = &m->ptr[i];

		if (kv->key.type != MSGPACK_OBJECT_STR)
			continue;
		if ((dst->keys[n] = malloc(kv->key.via.str.size + 1)) == NULL)
			return -1;
		memcpy(dst->keys[n], kv->key.via.str.ptr, kv->key.via.str.size);
		dst->keys[n][kv->key.via.str.size] = '\0';
		dst->n = ++n;
		if (fill(&dst->v.items[n - 1], &kv->val) != 0)
			return -1;
	}
	return 0;
}

/* Fills dst from o; on failure what was filled can still be cleared. */
static int
fill(rs_value *dst, const msgpack_object *o)
{
	switch (o->type) {
	case MSGPACK_OBJECT_BOOLEAN: dst->type = RS_TYPE_BOOL; dst->v.b = o->via.boolean; return 0;
	case MSGPACK_OBJECT_POSITIVE_INTEGER: dst->type = RS_TYPE_UINT; dst->v.u = o->via.u64; return 0;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: dst->type = RS_TYPE_INT; dst->v.i = o->via.i64; return 0;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: dst->type = RS_TYPE_FLOAT; dst->v.f = o->via.f64; return 0;
	case MSGPACK_OBJECT_STR: return fill_str(dst, o->via.str.ptr, o->via.str.size);
	case MSGPACK_OBJECT_BIN: return fill_str(dst, o->via.bin.ptr, o->via.bin.size);
	case MSGPACK_OBJECT_ARRAY: return fill_array(dst, &o->via.array);
	case MSGPACK_OBJECT_MAP: return fill_map(dst, &o->via.map);
	default: dst->type = RS_TYPE_NIL; return 0;
	}
}

/* Frees what v holds (not v itself). */
static void
clear(rs_value *v)
{
	size_t i;

	if (v->type == RS_TYPE_STR) {
		free(v->v.s);
	} else if (v->type == RS_TYPE_ARRAY || v->type == RS_TYPE_MAP) {
		for (i = 0; i < v->n; i++) {
			clear(&v->v.items[i]);
			if (v->keys != NULL)
				free(v->keys[i]);
		}
		free(v->v.items);
		free(v->keys);
	}
	memset(v, 0, sizeof *v);
}

rs_value *
value_from_msgpack(const msgpack_object *o)
{
	rs_value *v = calloc(1, sizeof *v);

	if (v == NULL)
		return NULL;
	if (fill(v, o) != 0) {
		clear(v);
		free(v);
		return NULL;
	}
	v->root = 1;
	return v;
}

void
value_map_remove(rs_value *m, const char *key)
{
	size_t i;

	if (m == NULL || m->type != RS_TYPE_MAP)
		return;
	for (i = 0; i < m->n; i++) {
		if (strcmp(m->keys[i], key) != 0)
			continue;
		clear(&m->v.items[i]);
		free(m->keys[i]);
		memmove(&m->v.items[i], &m->v.items[i + 1], (m->n - i - 1) * sizeof *m->v.items);
		memmove(&m->keys[i], &m->keys[i + 1], (m->n - i - 1) * sizeof *m->keys);
		m->n--;
		return;
	}
}

void
rs_value_free(rs_value *v)
{
	if (v == NULL || !v->root)
		return;
	clear(v);
	free(v);
}

/* ---- accessors ---- */

rs_type
rs_value_type(const rs_value *v)
{
	return v ? v->type : RS_TYPE_NONE;
}

const rs_value *
rs_get(const rs_value *m, const char *key)
{
	size_t i;

	if (m == NULL || m->type != RS_TYPE_MAP || key == NULL)
		return NULL;
	for (i = 0; i < m->n; i++)
		if (strcmp(m->keys[i], key) == 0)
			return &m->v.items[i];
	return NULL;
}

const rs_value *
rs_at(const rs_value *v, size_t i)
{
	if (v == NULL || (v->type != RS_TYPE_ARRAY && v->type != RS_TYPE_MAP) || i >= v->n)
		return NULL;
	return &v->v.items[i];
}

const char *
rs_key(const rs_value *m, size_t i)
{
	if (m == NULL || m->type != RS_TYPE_MAP || i >= m->n)
		return NULL;
	return m->keys[i];
}

size_t
rs_len(const rs_value *v)
{
	if (v == NULL || (v->type != RS_TYPE_STR && v->type != RS_TYPE_ARRAY && v->type != RS_TYPE_MAP))
		return 0;
	return v->n;
}

const char *
rs_str(const rs_value *v)
{
	return v != NULL && v->type == RS_TYPE_STR ? v->v.s : NULL;
}

uint64_t
rs_uint(const rs_value *v)
{
	return v != NULL && v->type == RS_TYPE_UINT ? v->v.u : 0;
}

int64_t
rs_int(const rs_value *v)
{
	if (v == NULL)
		return 0;
	if (v->type == RS_TYPE_INT)
		return v->v.i;
	if (v->type == RS_TYPE_UINT)
		return v->v.u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v->v.u;
	return 0;
}

double
rs_float(const rs_value *v)
{
	if (v == NULL)
		return 0;
	switch (v->type) {
	case RS_TYPE_FLOAT: return v->v.f;
	case RS_TYPE_UINT: return (double)v->v.u;
	case RS_TYPE_INT: return (double)v->v.i;
	default: return 0;
	}
}

int
rs_bool(const rs_value *v)
{
	return v != NULL && v->type == RS_TYPE_BOOL && v->v.b;
}
