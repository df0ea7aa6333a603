/*
 * jschema_graph.c: the JSON Schema compiler's checks of the whole, once
 * every schema is compiled (js_graph_check). References that consume no
 * text first (anyOf, oneOf, allOf, $ref) are the edges of a graph over the
 * compiled schemas: a cycle there is left recursion, refused with the
 * JSON pointer of the reference that closes it; acyclic, the graph gives
 * each schema the JSON types it may generate, and oneOf's branches are
 * checked disjoint by those types or by their enum/const values.
 * jschema.c builds the graph while it walks; this file only reads it.
 */
#include "config.h"
#include "jschema_int.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* Each entry's edges: order[first[e] .. first[e + 1]) index c->edge, in the order they were added. */
struct graph {
	uint32_t *first, *order;
};

static struct jedge *
out_edge(const struct jsc *c, const struct graph *gr, uint32_t e, uint32_t k)
{
	return &c->edge[gr->order[gr->first[e] + k]];
}

static uint32_t
n_out(const struct graph *gr, uint32_t e)
{
	return gr->first[e + 1] - gr->first[e];
}

/* An error at the pointer where (the graph's errors name a reference). */
static int
jerr_where(struct jsc *c, int code, const char *where, const char *msg)
{
	js_sb_clear(&c->path);
	strbuf_cat(&c->path, where);
	return js_err(c, code, NULL, "%s", msg);
}

/*
 * Depth first, iteratively (chains of references may be long): a cycle
 * is refused; each combinator's types are its edges' when it finishes.
 */
static int
graph_walk(struct jsc *c, const struct graph *gr)
{
	struct frame {
		uint32_t e, next;
	} *st = xmalloc(((size_t)c->n_ent + 1) * sizeof *st);
	uint8_t *colour = xcalloc((size_t)c->n_ent + 1, 1);
	int rc = 0;

	for (uint32_t r = 0; r < c->n_ent && rc == 0; r++) {
		uint32_t n = 0;

		if (colour[r] != 0)
			continue;
		st[n++] = (struct frame){ r, 0 }, colour[r] = 1;
		while (n > 0 && rc == 0) {
			struct frame *f = &st[n - 1];
			struct jent *x = &c->ent[f->e];
			const struct jedge *ed;

			if (f->next == n_out(gr, f->e)) {
				if (x->kind != EK_PLAIN) {
					x->mask = x->acc = x->kind == EK_ALL && n_out(gr, f->e) == 0 ? T_ALL : 0;
					for (uint32_t k = 0; k < n_out(gr, f->e); k++) {
						x->mask |= c->ent[out_edge(c, gr, f->e, k)->to].mask;
						x->acc |= c->ent[out_edge(c, gr, f->e, k)->to].acc;
					}
				}
				colour[f->e] = 2, n--;
				continue;
			}
			ed = out_edge(c, gr, f->e, f->next++);
			if (colour[ed->to] == 0)
				st[n++] = (struct frame){ ed->to, 0 }, colour[ed->to] = 1;
			else if (colour[ed->to] == 1)
				rc = jerr_where(c, ERR_UNSUPPORTED, ed->where,
				    "a cycle of references ($ref, anyOf, oneOf, allOf) that consumes no text");
		}
	}
	free(st), free(colour);
	return rc;
}

/* The entry e stands for, past $ref and allOf's single branch. */
static uint32_t
resolve(const struct jsc *c, const struct graph *gr, uint32_t e)
{
	while ((c->ent[e].kind == EK_REF || c->ent[e].kind == EK_ALL) && n_out(gr, e) == 1)
		e = out_edge(c, gr, e, 0)->to;
	return e;
}

struct hval {
	uint32_t h;
	const json_t *v;
};

static int
hval_cmp(const void *a, const void *b)
{
	const struct hval *x = a, *y = b;

	return x->h < y->h ? -1 : x->h > y->h;
}

/* The values of entry e if it is an enum or const (sorted by hash, malloc'd); 0 if not, or a negative ERR_*. */
static int
enum_set(struct jsc *c, const struct graph *gr, uint32_t e, struct hval **out)
{
	const json_t *s = c->ent[e = resolve(c, gr, e)].schema, **vals;
	int mask, n, rc;

	*out = NULL;
	if (c->ent[e].kind != EK_PLAIN || !json_is_object(s) ||
	    (json_object_get(s, "enum") == NULL && json_object_get(s, "const") == NULL))
		return 0;
	if ((rc = js_type_mask(c, s, &mask)) != 0 || (n = js_enum_values(c, s, mask, &vals)) < 0)
		return rc != 0 ? rc : n;
	*out = xmalloc((size_t)n * sizeof **out);
	for (int i = 0; i < n; i++)
		(*out)[i] = (struct hval){ js_value_hash(vals[i]), vals[i] };
	qsort(*out, (size_t)n, sizeof **out, hval_cmp);
	free(vals);
	return n;
}

/* 1 if a value is in both sorted sets. */
static int
sets_meet(const struct hval *a, int na, const struct hval *b, int nb)
{
	int i = 0, j = 0;

	while (i < na && j < nb) {
		if (a[i].h != b[j].h) {
			a[i].h < b[j].h ? i++ : j++;
			continue;
		}
		for (int x = i; x < na && a[x].h == a[i].h; x++)
			for (int y = j; y < nb && b[y].h == b[j].h; y++)
				if (js_value_equal(a[x].v, b[y].v))
					return 1;
		for (uint32_t h = a[i].h; i < na && a[i].h == h; i++)
			;
	}
	return 0;
}

/* 1 if the objects of entries a and b both require a property whose enum/const values differ. */
static int
discriminated(struct jsc *c, const struct graph *gr, uint32_t a, uint32_t b)
{
	const json_t *sa = c->ent[resolve(c, gr, a)].schema, *sb = c->ent[resolve(c, gr, b)].schema;
	const json_t *ra = json_object_get(sa, "required"), *rb = json_object_get(sb, "required");
	int found = 0;

	for (size_t i = 0; i < json_array_size(ra) && !found; i++) {
		const json_t *name = json_array_get(ra, i);
		const json_t *pa = json_object_getn(json_object_get(sa, "properties"), json_string_value(name),
		    json_string_length(name));
		const json_t *pb = json_object_getn(json_object_get(sb, "properties"), json_string_value(name),
		    json_string_length(name));
		struct hval *va = NULL, *vb = NULL;
		uint32_t ea, eb, slot;
		int na, nb;

		if (!js_in_strings(rb, json_string_value(name), json_string_length(name)) || pa == NULL || pb == NULL ||
		    (ea = js_ent_find(c, pa, &slot)) == 0 || (eb = js_ent_find(c, pb, &slot)) == 0)
			continue;
		na = enum_set(c, gr, ea - 1, &va);
		nb = enum_set(c, gr, eb - 1, &vb);
		found = na > 0 && nb > 0 && !sets_meet(va, na, vb, nb);
		free(va), free(vb);
	}
	return found;
}

/*
 * oneOf entry e: no two branches may match one value, as far as seen:
 * neither generates a type the other validates (a branch without `type`,
 * enum or const validates values of every type, whatever its keywords
 * generate), or both are enums none of whose values are equal, or both
 * are objects with a required discriminator.
 */
static int
one_check(struct jsc *c, const struct graph *gr, uint32_t e)
{
	uint32_t n = n_out(gr, e);
	struct hval **vals = xcalloc(n, sizeof *vals);
	int *nv = xcalloc(n, sizeof *nv), rc = 0;

	for (uint32_t i = 0; i < n && rc == 0; i++)
		if ((nv[i] = enum_set(c, gr, out_edge(c, gr, e, i)->to, &vals[i])) < 0)
			rc = nv[i];
	for (uint32_t j = 1; j < n && rc == 0; j++)
		for (uint32_t i = 0; i < j && rc == 0; i++) {
			uint32_t a = out_edge(c, gr, e, i)->to, b = out_edge(c, gr, e, j)->to;
			/* the types of values one branch generates that the other lets through */
			int both = (c->ent[a].mask & c->ent[b].acc) | (c->ent[b].mask & c->ent[a].acc);
			char msg[64];

			if (both == 0 || (nv[i] > 0 && nv[j] > 0 && !sets_meet(vals[i], nv[i], vals[j], nv[j])) ||
			    ((both & ~T_OBJ) == 0 && discriminated(c, gr, a, b)))
				continue;
			snprintf(msg, sizeof msg, "a value may match this and oneOf/%u (use anyOf)", i);
			rc = jerr_where(c, ERR_UNSUPPORTED, out_edge(c, gr, e, j)->where, msg);
		}
	for (uint32_t i = 0; i < n; i++)
		free(vals[i]);
	free(vals), free(nv);
	return rc;
}

int
js_graph_check(struct jsc *c)
{
	struct graph gr = { xcalloc((size_t)c->n_ent + 1, sizeof *gr.first),
		xmalloc(((size_t)c->n_edge + 1) * sizeof *gr.order) };
	uint32_t *fill = xcalloc((size_t)c->n_ent + 1, sizeof *fill);
	int rc;

	for (uint32_t k = 0; k < c->n_edge; k++)
		gr.first[c->edge[k].from + 1]++;
	for (uint32_t e = 0; e < c->n_ent; e++)
		gr.first[e + 1] += gr.first[e], fill[e] = gr.first[e];
	for (uint32_t k = 0; k < c->n_edge; k++)
		gr.order[fill[c->edge[k].from]++] = k;
	rc = graph_walk(c, &gr);
	for (uint32_t e = 0; e < c->n_ent && rc == 0; e++)
		if (c->ent[e].kind == EK_ONE)
			rc = one_check(c, &gr, e);
	free(gr.first), free(gr.order), free(fill);
	return rc;
}
