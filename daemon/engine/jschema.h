/*
 * jschema.h: JSON Schema -> grammar (grammar.h) for constrained decoding.
 * A request's json_schema becomes the grammar its output must match.
 *
 * The grammar is sound, not complete: every text it accepts is one JSON
 * value that validates against the schema, but of the valid texts it
 * generates only some spellings, and for a few keywords only some
 * values (each narrowing below). A keyword that would constrain output
 * and is not supported is refused, never ignored.
 *
 * Spelling of the output:
 *   - whitespace only between the tokens of objects and arrays: nothing,
 *     one space or tab, or a newline and up to JSCHEMA_MAX_INDENT spaces
 *     or tabs; none before or after the whole value;
 *   - strings: characters raw except '"', '\' and controls, which are
 *     escaped; any JSON escape, but not \u0000 nor an unpaired surrogate;
 *   - members in the order of `properties`, then required names missing
 *     from it (in the order of `required`), then additional ones;
 *   - enum and const values exactly as compact JSON (jansson's spelling);
 *   - bounded integers and numbers never as -0.
 *
 * Keywords (others are refused with ERR_UNSUPPORTED, naming the
 * keyword's JSON pointer: "json_schema at /properties/when/format: ...";
 * a long pointer is shortened to its end, "json_schema at .../a/b: ..."):
 *   - ignored annotations: title, description, examples, default,
 *     deprecated, readOnly, writeOnly, $schema, $id (at the root only:
 *     below it, a new base for the $ref inside, refused), $comment; $defs
 *     and definitions hold schemas for $ref;
 *   - `true`, `false`, {}; type (a name or an array of names); without
 *     `type`, the types whose keywords appear ({"minimum": 0} generates
 *     numbers only), or any value if none does;
 *   - enum, const: any JSON values, beside `type` alone (which filters
 *     them); both: the values of enum equal to const;
 *   - objects: properties, required, additionalProperties (false, true
 *     or a schema), up to JSCHEMA_MAX_PROPERTIES named properties (those
 *     of `properties` and `required`; one whose schema is false is never
 *     generated). When additionalProperties is absent, only the named
 *     ones are generated - unless neither is given: then any object.
 *     Additional members come after the named ones; their keys are never
 *     a named key and use no escapes. A required name missing from
 *     `properties` takes the additionalProperties schema;
 *   - arrays: items (a schema), prefixItems (up to JSCHEMA_MAX_PREFIX),
 *     minItems, maxItems, uniqueItems false; items absent: any values
 *     (items as an array, draft 4's tuples, is refused);
 *   - strings: minLength, maxLength (code points); pattern, an ECMA-262
 *     subset matched by code points (as with the u flag): literals,
 *     escapes (\t \n \r \f \v \0 \xHH \uHHHH, a surrogate pair as one,
 *     escaped syntax characters), classes, '.', groups ( ) (?: ) (?<n> ),
 *     '|', * + ? {n} {n,} {n,m} (lazy forms too), ^ first and $ last in
 *     the pattern or a top-level alternative (an unanchored one may have
 *     any text around its match); \d \w and their negations are ASCII,
 *     \s and \S ECMA's white space and line terminators; '.' is not a
 *     line terminator. Refused: lookaround, backreferences, \b and \B
 *     (but [\b]), a class range from \d \w or \s, and a repetition
 *     without bound of what may match nothing. The string's characters
 *     are raw but '"' and '\' (as \" and \\) and controls (as \b \f \n
 *     \r \t or \u00XX). format: date, time, date-time (RFC 3339: years
 *     0001-9999, no leap second, T and Z upper case, a time with its
 *     offset), uuid. One of pattern, format, min/maxLength at a time;
 *   - integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum
 *     (draft 4's boolean forms too), as exact digit ranges, bounds within
 *     ±JSCHEMA_MAX_BOUND (one with a fraction rounds inward); the integer
 *     spelling only (no 1.0);
 *   - numbers: the same bounds when they are whole numbers; a bounded
 *     number has no exponent;
 *   - anyOf: alternatives. oneOf: alternatives, accepted only when no
 *     value can match two branches, as far as seen here: branches whose
 *     types differ (a branch without `type`, enum or const validates
 *     values of every type: {"maxItems": 2} generates arrays only but
 *     lets null through), branches of enum/const values none equal, or
 *     object branches with a property required by both whose enum/const
 *     values differ (a discriminator); else refused (use anyOf);
 *   - allOf: when at most one branch constrains (the others are `true`
 *     or annotations only); else refused;
 *   - $ref to "#" or a JSON pointer in the document ("#/$defs/a",
 *     "#/definitions/a", ~0 ~1 and %XX escapes), recursion allowed; a
 *     cycle of references that consumes no text is refused. $ref, allOf,
 *     anyOf and oneOf stand alone beside annotations; other siblings are
 *     refused.
 *
 * For any JSON object (a request's `json: true`) compile {"type":"object"};
 * for any JSON value, `true` or {}.
 */
#ifndef RESIDENT_JSCHEMA_H
#define RESIDENT_JSCHEMA_H

#include <jansson.h>

/* Deepest nesting of schemas (through properties, items, anyOf, $ref...), and of a pattern's groups. */
#define JSCHEMA_MAX_DEPTH 64
/* Most values of one enum. */
#define JSCHEMA_MAX_ENUM 4096
/* Most branches of one anyOf, oneOf or allOf. */
#define JSCHEMA_MAX_BRANCHES 256
/* Most named properties of one object (each optional one is a position alive while a key is read). */
#define JSCHEMA_MAX_PROPERTIES 1024
/* Most prefixItems (a rule each, for what may follow it). */
#define JSCHEMA_MAX_PREFIX 32
/* Most rules of the grammar text, named ones (groups and counts add more in grammar.c). */
#define JSCHEMA_MAX_RULES 16384
/* Most spaces or tabs after a newline between tokens. */
#define JSCHEMA_MAX_INDENT 20
/* Largest magnitude of a numeric bound. */
#define JSCHEMA_MAX_BOUND 9000000000000000000LL
/*
 * Counts (minItems, maxItems, minLength, maxLength, a pattern's {n,m})
 * up to GRAM_MAX_REPEAT; a greater one is refused with ERR_RANGE. The
 * grammar text stays under GRAM_MAX_TEXT, and the rules and elements
 * grammar.c makes of it (its counts expanded) under GRAM_MAX_RULES and
 * GRAM_MAX_ELEMS (else ERR_RANGE).
 */

/*
 * Compiles schema into grammar text whose rule `root` is the whole output
 * (*out: malloc'd, NUL-terminated). Returns 0, or ERR_UNSUPPORTED,
 * ERR_INVAL (a malformed schema) or ERR_RANGE (a limit above) with the
 * offending keyword's JSON pointer in err.
 */
int jschema_grammar(const json_t *schema, char **out, char *err);

/*
 * jschema_grammar with the whole value's rule named rule instead of root,
 * for a grammar that embeds it (a tool call's wrapper around its
 * arguments): rule must be a rule name the schema's own rules do not use
 * (they are named s<N>, r<N> and the JSON rules' names: "value", "string",
 * ...; a name with "tool-" in front is free).
 */
int jschema_grammar_rule(const json_t *schema, const char *rule, char **out, char *err);

#endif
