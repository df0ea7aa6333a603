/*
 * jschema_int.h: what the JSON Schema compiler's two files share, and
 * nothing outside them includes (the daemon sees jschema.h alone).
 * jschema.c walks the schema and owns the compiler's state (struct jsc,
 * opaque here), the rules it writes and the errors it reports;
 * jschema_text.c spells the text inside a value that a keyword narrows
 * (bounded integers and numbers, patterns) and writes its rules through
 * jschema.c. The few small helpers both need to build grammar text are
 * jschema.c's, and the names crossing files carry the js_ prefix.
 */
#ifndef RESIDENT_JSCHEMA_INT_H
#define RESIDENT_JSCHEMA_INT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define XSTR(x) #x
#define STR(x) XSTR(x)

#define NAME_LEN 48

/* The fixed rules, written once at the end of the grammar, those used (jschema.c's fixed_rules). */
enum fixed_rule {
	FX_WS, FX_HX, FX_JU, FX_JESC, FX_JCHAR, FX_STRING, FX_INTEGER, FX_NUMBER, FX_VALUE, FX_OBJECT, FX_OBJMORE,
	FX_MEMBER, FX_ARRAY, FX_ARRMORE, FX_NEVER, FX_KEYTAIL, FX_KEY, FX_FRAC, FX_FRACNZ, FX_FRACZ, FX_CTL,
	FX_PCHAR, FX_YEAR, FX_LEAPYY, FX_LEAP, FX_MDAY, FX_DATE, FX_TIME, FX_DATETIME, FX_UUID, FX_COUNT
};

struct jsc;    /* the compiler's state, jschema.c's own */
struct strbuf;

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

/* jschema_text.c */
int js_number_item(struct jsc *c, const json_t *s, int integers, struct strbuf *b);
int js_pattern_item(struct jsc *c, const char *pattern, size_t n, struct strbuf *b);

#endif
