/*
 * grammar.h: constrained decoding. A grammar (GBNF-like text) compiles once
 * into an immutable struct grammar; each constrained sequence holds a
 * struct gram_state (where its text is in the grammar); before a step, the
 * tokens that may come next are a bitmask over the vocabulary (gram_mask,
 * from what struct gram_index keeps of the grammar over a trie of the
 * tokens' bytes, struct gram_vocab), and after it the drawn token's bytes
 * advance the state (gram_accept).
 *
 * The text:
 *
 *   # a comment, to the end of the line
 *   root   ::= "{" ws pair ("," ws pair)* "}"     the rule `root` is the whole output
 *   pair   ::= string ":" ws [0-9]+
 *   string ::= "\"" [^"\\]* "\""
 *   ws     ::= [ \t\n]{0,8}
 *
 * A rule is `name ::= alternatives`; names are letters, digits, '-' and
 * '_'; a rule may be defined once. Alternatives are separated by `|`, each
 * a sequence of items: "literal" (escapes \n \r \t \\ \" \' \[ \] \xHH
 * \uHHHH \UHHHHHHHH), [character class] (ranges a-z, a leading ^ negates;
 * the same escapes), `.` (any character), a rule's name, or a group
 * ( ... ). An item may be followed by * + ? {n} {n,} {n,m}. Text is UTF-8;
 * classes and `.` match whole code points. A definition ends where the
 * next `name ::=` begins. Limits (GRAM_MAX_*) are checked at compile time;
 * a grammar whose rule can reach itself without consuming a character
 * (left recursion) is refused.
 */
#ifndef RESIDENT_GRAMMAR_H
#define RESIDENT_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

/* Most bytes of grammar text. */
#define GRAM_MAX_TEXT (1 << 20)
/* Most rules, counting those that repetitions and groups make. */
#define GRAM_MAX_RULES 65536
/* Most elements over all rules. */
#define GRAM_MAX_ELEMS (1 << 21)
/* Largest count in {n,m} (each count copies its item). */
#define GRAM_MAX_REPEAT 1000
/* Deepest nesting of groups in the text. */
#define GRAM_MAX_NEST 64
/*
 * Most open rules a sequence's position may hold (nesting such as JSON's
 * arrays in arrays): text that would nest deeper is not allowed.
 */
#define GRAM_MAX_DEPTH 1024
/*
 * Most positions a grammar's index keeps (gram_index_new): each costs a
 * walk of the vocabulary and its allowed tokens' memory, and nested
 * repetitions or alternatives multiply them (an array of arrays of 1,000
 * items each would take tens of GiB): past it the grammar is refused.
 */
#define GRAM_MAX_INDEX (1 << 20)
/* Most alternative positions a state holds at once; an ambiguous grammar past it fails the request. */
#define GRAM_MAX_STACKS 4096

struct grammar;
struct gram_state;
struct gram_vocab;

/* Compiles len bytes of grammar text. Returns 0 or ERR_INVAL / ERR_RANGE with line and column in err. */
int grammar_compile(const char *text, size_t len, struct grammar **out, char *err);
void grammar_free(struct grammar *g);

/*
 * The vocabulary as the masks see it: token i's bytes (bytes[i], len[i]);
 * a token of no bytes, or with skip[i] set (control tokens), is never
 * allowed by the grammar. end[i] marks the tokens that end a sequence
 * (EOS, end of turn): allowed once the grammar's root is complete. The
 * bytes are not copied: the caller keeps them while v lives.
 */
int gram_vocab_new(int n_tokens, const char *const *bytes, const uint32_t *len, const uint8_t *skip,
    const uint8_t *end, struct gram_vocab **out, char *err);
void gram_vocab_free(struct gram_vocab *v);
int gram_vocab_size(const struct gram_vocab *v);

/* A sequence at the start of g's root. g must outlive it. */
int gram_state_new(const struct grammar *g, struct gram_state **out, char *err);
/* A copy of s (forks, drafts): advances separately. */
int gram_state_clone(const struct gram_state *s, struct gram_state **out, char *err);
void gram_state_free(struct gram_state *s);

/*
 * Advances s by n bytes of text (a token's, or a whole string); a
 * character may be split across calls. Returns 0, or ERR_INVAL (s
 * unchanged) if the grammar does not allow them there.
 */
int gram_accept(struct gram_state *s, const char *bytes, size_t n, char *err);

/* 1 if the root is complete at s (an end token is allowed), with no character half read. */
int gram_complete(const struct gram_state *s);

/* 1 if nothing may follow: complete, and no stack goes on. */
int gram_finished(const struct gram_state *s);

/*
 * What the masks of one grammar over one vocabulary keep between steps:
 * for each position a stack's top part can be in (its frames down to the
 * first of the root or of a rule that can reach itself), the tokens it
 * allows whatever lies below, and those that reach below, checked per
 * step. All are found when it is made (gram_index_new), so that no step
 * walks the vocabulary: a walk of it each (milliseconds a position; a
 * grammar without recursion is all positions of the root, so a nested
 * JSON Schema's can take seconds, shared among threads);
 * and where the position's character set holds characters of several
 * bytes, with a character half read there: one entry per class of such
 * characters (their length, the bytes read, and a first byte that bounds
 * the next: at most ten) and one per character whose possible code
 * points the set splits (at most three per boundary of its ranges), each
 * a walk of the tokens that begin inside a character. Shared by the
 * sequences of a grammar and model, from any thread: masks read it
 * without a lock; g and v must outlive it.
 */
struct gram_index;

/* Most threads gram_index_new_threads starts. */
#define GRAM_MAX_THREADS 256

/*
 * The index of g over v, its walks on n_threads threads (the caller's
 * among them; 0: one per online CPU): the keys are found first on the
 * caller's thread (milliseconds), then the threads take the walks one at
 * a time. The index is the same whatever the threads.
 */
int gram_index_new_threads(const struct grammar *g, const struct gram_vocab *v, int n_threads, struct gram_index **out,
    char *err);
/* gram_index_new_threads with one thread per online CPU. */
int gram_index_new(const struct grammar *g, const struct gram_vocab *v, struct gram_index **out, char *err);
void gram_index_free(struct gram_index *x);
/* The positions x holds (each costs up to a mask of the vocabulary: about 1 KiB on average). */
uint32_t gram_index_size(const struct gram_index *x);

/*
 * The tokens allowed at s (of x's grammar): bit i of mask (words of 32,
 * gram_vocab_size bits, all written) set when token i's bytes may come
 * next, or token i ends a sequence and s is complete. Returns the number
 * allowed (0: the grammar and the vocabulary leave nothing; the caller
 * ends the request with an error) or a negative ERR_*. Thread-safe for
 * distinct states; its scratch is kept in x between calls (up to eight
 * calls at once take one without allocating, and without a lock).
 */
int gram_mask(const struct gram_state *s, struct gram_index *x, uint32_t *mask, char *err);

#endif
