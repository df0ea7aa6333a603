/*
 * jschema_int.h: what the JSON Schema compiler's two files share, and
 * nothing outside them includes (the daemon sees jschema.h alone).
 * jschema.c walks the schema and fills the compiler's state (struct jsc,
 * below), the rules it writes and the errors it reports;
 * jschema_text.c spells the text inside a value that a keyword narrows
 * (bounded integers and numbers, patterns) and writes its rules through
 * jschema.c; jschema_graph.c checks the whole once it is compiled (the
 * graph of references that consume no text: cycles, types, oneOf). The
 * few small helpers the files share are jschema.c's, and the names
 * crossing files carry the js_ prefix.
 */
#ifndef RESIDENT_JSCHEMA_INT_H
#define RESIDENT_JSCHEMA_INT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define XSTR(x) #x
#define STR(x) XSTR(x)

#define NAME_LEN 48

/* The fixed rules, written once at the end of the grammar, those used (jschema.c's fixed_rules). */
enum fixed_rule {
	FX_WS, FX_HX, FX_JU, FX_JESC, FX_JCHAR, FX_STRING, FX_INTEGER, FX_NUMBER, FX_VALUE, FX_OBJECT, FX_OBJMORE,
	FX_MEMBER, FX_ARRAY, FX_ARRMORE, FX_NEVER, FX_KEYTAIL, FX_KEY, FX_FRAC, FX_FRACNZ, FX_FRACZ, FX_CTL,
	FX_PCHAR, FX_YEAR, FX_LEAPYY, FX_LEAP, FX_MDAY, FX_DATE, FX_TIME, FX_DATETIME, FX_UUID, FX_COUNT
};

/* The compiler's state. */

/* JSON types, as masks: what a schema may generate. */
enum {
	T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_INT = 32, T_FRAC = 64,
	T_NUM = T_INT | T_FRAC, T_ALL = 127
};

enum ent_kind { EK_PLAIN, EK_REF, EK_ANY, EK_ONE, EK_ALL };

/* A schema object (or true, false) compiled into a rule. */
struct jent {
	const json_t *schema;
	char name[NAME_LEN];
	int kind;       /* enum ent_kind */
	int mask;       /* EK_PLAIN: the types it generates; else those of its edges, once the graph is walked */
	int acc;        /* the types of the values it validates (oneOf's check): a keyword of one type, say
			 * minimum without `type`, generates that type but lets every other through */
};

/* A reference that consumes no text first: from a combinator or $ref to what it names. */
struct jedge {
	uint32_t from, to;
	char *where; /* the JSON pointer of the reference */
};

/* A shared rule: its body, its name r<id>. */
struct jshared {
	char *body;
	uint32_t id;
};

struct jsc {
	const json_t *doc;
	char *err;
	struct strbuf out;  /* the rules so far */
	int n_rules;
	uint64_t low_rules, low_elems; /* what grammar.c will make of them, at most */
	struct strbuf path; /* the JSON pointer being compiled */
	int depth;
	struct jent *ent;
	uint32_t n_ent, cap_ent;
	uint32_t *ent_tab; /* schema address -> entry + 1 */
	uint32_t ent_tab_cap;
	struct jedge *edge;
	uint32_t n_edge, cap_edge;
	struct jshared *shared; /* hash of bodies */
	uint32_t shared_cap, n_shared;
	uint64_t fixed; /* fixed rules used */
};


/* jschema.c: grammar text */
void js_sb_clear(struct strbuf *b);
void js_gl_cp(struct strbuf *b, uint32_t cp);
uint32_t js_utf8_cp(const char *s, size_t avail, int *len);
int js_hex_val(char ch);
void js_alt(struct strbuf *b);

/* jschema.c: the compiler's rules and errors */
int js_err(struct jsc *c, int code, const char *key, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int js_rule_shared(struct jsc *c, const char *body, char *name);
const char *js_fixed(struct jsc *c, enum fixed_rule f);

/* jschema.c: schemas and values, for the checks of the whole */
int js_type_mask(struct jsc *c, const json_t *s, int *mask);
int js_enum_values(struct jsc *c, const json_t *s, int mask, const json_t ***out);
uint32_t js_value_hash(const json_t *v);
int js_in_strings(const json_t *arr, const char *k, size_t n);
/* The entry of schema s + 1 (0: none) and its slot in c->ent_tab. */
uint32_t js_ent_find(const struct jsc *c, const json_t *s, uint32_t *slot);
int js_value_equal(const json_t *a, const json_t *b);

/* jschema_graph.c: 0, or an error naming the schema (left recursion, oneOf's branches not disjoint) */
int js_graph_check(struct jsc *c);

/* jschema_text.c */
int js_number_item(struct jsc *c, const json_t *s, int integers, struct strbuf *b);
int js_pattern_item(struct jsc *c, const char *pattern, size_t n, struct strbuf *b);

#endif
