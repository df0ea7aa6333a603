/*
 * mask-bench: the cost of constrained decoding's token masks (gram_mask,
 * daemon/engine/grammar.h) on a llama3-like vocabulary.
 *
 *   mask-bench [-n MASKS] [-w STEPS] [-s SEED] [-g schema|json|both] [-f SCHEMA.json] [-t THREADS] [-c]
 *
 * The vocabulary is made here, deterministically (it does not depend on
 * -s): 128,000 byte-level pieces (all 256 single bytes; ASCII words with
 * and without a leading space, capitalised, their fragments; runs of
 * spaces, newlines and indents; JSON punctuation such as `":`, `{"` and
 * `"},`; numbers of up to three digits; escapes; pieces of several-byte
 * UTF-8 characters - accented Latin, Greek, Cyrillic, Arabic, Devanagari,
 * CJK, Hangul, emoji - whole, as words, and cut: ending inside a
 * character, or starting inside one) in a shuffled order of ids, then 256
 * control tokens, of which two end a sequence (as llama3's
 * <|end_of_text|> and <|eot_id|>).
 *
 * Two grammars: a nested JSON Schema (objects in arrays in objects,
 * enums, strings with a pattern, a format and lengths, bounded integers
 * and numbers, anyOf; or the schema in the file of -f) through
 * jschema.c, and a generic JSON grammar. For each, the time to make the
 * index (gram_index_new_threads, on THREADS threads; 0, the default: one
 * per online CPU; with -c, made again on one thread and checked the same,
 * gram_index_same), then seeded random walks: at each step the
 * mask is timed, and a token drawn uniformly among those it allows is
 * accepted, until an end token, STEPS tokens, or MASKS masks in all.
 * Printed: the masks' median, p90, p99 and max in microseconds, over all
 * of them and over those taken with a character half read (the text so
 * far ends inside one), and the index's entries that masks had to build
 * (gram_index_late: 0 when the index was made whole).
 */
#include "config.h"
#include "grammar.h"
#include "grammar_int.h"
#include "jschema.h"
#include "util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_TEXT 128000
#define N_CONTROL 256

static uint64_t rng_state;

static uint32_t
rng(void)
{
	rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 11);
}

/* ---- the vocabulary ---- */

struct vocab {
	char **b;
	uint32_t *len;
	uint8_t *skip, *end;
	int n;
	uint32_t *tab; /* a hash set of the pieces so far (index + 1), so that none repeats */
	uint32_t cap;
};

static uint32_t
vhash(const char *b, size_t n)
{
	return hash32(b, n) * 2654435761u;
}

/* Adds the n bytes of b as a text token unless the vocabulary holds them already or is full. */
static void
add(struct vocab *v, const char *b, size_t n)
{
	uint32_t i;

	if (n == 0 || v->n >= N_TEXT)
		return;
	for (i = vhash(b, n) & (v->cap - 1); v->tab[i] != 0; i = (i + 1) & (v->cap - 1)) {
		uint32_t k = v->tab[i] - 1;

		if (v->len[k] == n && memcmp(v->b[k], b, n) == 0)
			return;
	}
	v->tab[i] = (uint32_t)v->n + 1;
	v->b[v->n] = xmalloc(n + 1);
	memcpy(v->b[v->n], b, n);
	v->b[v->n][n] = '\0';
	v->len[v->n++] = (uint32_t)n;
}

static void
adds(struct vocab *v, const char *s)
{
	add(v, s, strlen(s));
}

static const char *const common[] = { "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was",
	"with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
	"an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been",
	"if", "more", "when", "will", "would", "who", "so", "no", "name", "id", "type", "value", "true", "false",
	"null", "items", "price", "status", "active", "order", "user", "email", "address", "street", "city",
	"zip", "code", "data", "list", "key", "string", "number", "object", "array", "count", "total", "date",
	"time", "created", "updated", "description", "title", "text", "content", "message", "error", "result",
	"response", "request", "color", "size", "red", "green", "blue", "small", "large", "first", "last",
	"new", "old", "good", "great", "world", "hello", "function", "return", "class", "import", "public",
	"private", "static", "void", "int", "char", "const", "self", "def", "print", "include", "define",
	"tags", "score", "note", "options", "gift", "quantity", "product", "customer", "amount", "currency",
	"country", "phone", "company", "street", "state", "region", "version", "config", "settings", "default",
	"enabled", "disabled", "pending", "inactive", "approved", "rejected", "level", "info", "warning",
	"debug", "index", "offset", "limit", "page", "query", "filter", "sort", "field", "format", "schema" };

static const char *const onsets[] = { "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t",
	"v", "w", "z", "br", "ch", "cl", "cr", "dr", "fl", "fr", "gr", "pl", "pr", "sh", "sl", "sp", "st", "str",
	"th", "tr", "wh", "", "qu", "sc", "sk" };
static const char *const vowels[] = { "a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "io", "ou", "oo", "y" };
static const char *const codas[] = { "", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "nt", "st", "ck", "rt",
	"ll", "ss", "tion", "ing", "ed", "er", "ly", "ment", "ness", "able", "al", "ic", "ous", "ive" };

/* A pronounceable word of 1-4 syllables into out (NUL-terminated). */
static void
pseudo_word(char *out)
{
	int syl = 1 + (int)(rng() % 4);

	out[0] = '\0';
	for (int i = 0; i < syl; i++) {
		strcat(out, onsets[rng() % ARRAY_LEN(onsets)]);
		strcat(out, vowels[rng() % ARRAY_LEN(vowels)]);
		if (i == syl - 1 || rng() % 3 == 0)
			strcat(out, codas[rng() % ARRAY_LEN(codas)]);
	}
}

/* A word's forms as pieces: itself, with a leading space, capitalised, and some fragments. */
static void
add_word(struct vocab *v, const char *w, int fragments)
{
	char b[96];
	size_t n = strlen(w);

	if (n == 0 || n > 60)
		return;
	adds(v, w);
	snprintf(b, sizeof b, " %s", w), adds(v, b);
	snprintf(b, sizeof b, "%s", w), b[0] = (char)(b[0] >= 'a' && b[0] <= 'z' ? b[0] - 32 : b[0]), adds(v, b);
	snprintf(b, sizeof b, " %s", w), b[1] = (char)(b[1] >= 'a' && b[1] <= 'z' ? b[1] - 32 : b[1]), adds(v, b);
	if (rng() % 8 == 0) { /* JSON keys and strings */
		snprintf(b, sizeof b, "\"%s", w), adds(v, b);
		snprintf(b, sizeof b, "%s\"", w), adds(v, b);
		snprintf(b, sizeof b, " \"%s", w), adds(v, b);
	}
	if (rng() % 16 == 0) {
		for (size_t i = 0; i < n; i++)
			b[i] = (char)(w[i] >= 'a' && w[i] <= 'z' ? w[i] - 32 : w[i]);
		add(v, b, n);
	}
	if (fragments && n > 3) {
		size_t from = 1 + rng() % (n - 2);

		add(v, w, 2 + rng() % (n - 2)); /* a prefix, and a suffix */
		add(v, w + from, n - from);
	}
}

/* Code point pools of several-byte characters, each a script's letters. */
struct pool {
	uint32_t lo, hi;
	int space; /* its words take a leading space */
};

static const struct pool pools[] = {
	{ 0x00e0, 0x00ff, 1 }, /* accented Latin */
	{ 0x0100, 0x017f, 1 }, /* Latin Extended-A */
	{ 0x03b1, 0x03c9, 1 }, /* Greek */
	{ 0x0430, 0x044f, 1 }, /* Cyrillic */
	{ 0x0621, 0x064a, 1 }, /* Arabic */
	{ 0x05d0, 0x05ea, 1 }, /* Hebrew */
	{ 0x0905, 0x0939, 1 }, /* Devanagari */
	{ 0x3041, 0x30ff, 0 }, /* kana */
	{ 0x4e00, 0x9fff, 0 }, /* CJK */
	{ 0xac00, 0xd7a3, 1 }, /* Hangul */
	{ 0x2010, 0x2027, 0 }, /* punctuation: dashes, quotes, ellipsis */
	{ 0x1f300, 0x1f64f, 0 }, /* emoji */
};

static uint32_t
pool_char(const struct pool *p)
{
	return p->lo + rng() % (p->hi - p->lo + 1);
}

/* A word of 1-6 characters of pool p (Latin pools mixed with ASCII letters) into b; returns its length. */
static size_t
script_word(const struct pool *p, char *b)
{
	size_t n = 0;
	int k = 1 + (int)(rng() % 6);

	if (p->space && rng() % 2 == 0)
		b[n++] = ' ';
	for (int i = 0; i < k; i++) {
		if (p->lo < 0x200 && rng() % 2 == 0)
			b[n++] = (char)('a' + rng() % 26);
		else
			n += (size_t)utf8_encode(pool_char(p), (unsigned char *)b + n);
	}
	return n;
}

static void
vocab_make(struct vocab *v)
{
	static const char punct[] = "{}[]\":, \n";
	char b[128], w[96];
	int n_multi;

	memset(v, 0, sizeof *v);
	v->cap = 1u << 18;
	v->tab = xcalloc(v->cap, sizeof *v->tab);
	v->b = xcalloc(N_TEXT + N_CONTROL, sizeof *v->b);
	v->len = xcalloc(N_TEXT + N_CONTROL, sizeof *v->len);
	v->skip = xcalloc(N_TEXT + N_CONTROL, 1);
	v->end = xcalloc(N_TEXT + N_CONTROL, 1);
	rng_state = 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < 256; i++) {
		b[0] = (char)i;
		add(v, b, 1);
	}
	for (int a = 0; a < 9; a++) /* JSON punctuation, two and three characters */
		for (int c = 0; c < 9; c++) {
			b[0] = punct[a], b[1] = punct[c];
			add(v, b, 2);
			for (int d = 0; d < 9; d++)
				b[2] = punct[d], add(v, b, 3);
		}
	{
		static const char *const more[] = { "\":\"", "\": \"", "\", \"", "\"},{\"", "\"}]", "\"}],", "\"},\n",
			"\": {", "\": [", "\": [{", "\": {\"", "\": true", "\": false", "\": null", "\\\"", "\\n", "\\\\",
			"\\t", "\\u", "\\u00", "\\/", "\"\n}", "\n}\n", "},\n", "],\n", "\"]\n", ".\"", ".\n", ", ", ". ",
			"://", "www", ".com", "@", "-", "--", "---", "...", "/*", "*/", "//", "()", "();", "{\n", "}\n" };

		for (size_t i = 0; i < ARRAY_LEN(more); i++)
			adds(v, more[i]);
	}
	for (int k = 1; k <= 16; k++) { /* spaces, newlines and indents */
		memset(b, ' ', (size_t)k), add(v, b, (size_t)k);
		b[0] = '\n', memset(b + 1, ' ', (size_t)k), add(v, b, (size_t)k + 1);
		memset(b, '\t', (size_t)k), add(v, b, (size_t)(k % 5 + 1));
		b[0] = '\n', memset(b + 1, '\t', (size_t)k), add(v, b, (size_t)(k % 5 + 2));
	}
	adds(v, "\n\n"), adds(v, "\r\n"), adds(v, " \n");
	for (int i = 0; i < 1000; i++) { /* numbers of up to three digits, and with leading zeros */
		snprintf(b, sizeof b, "%d", i), adds(v, b);
		snprintf(b, sizeof b, " %d", i), adds(v, b);
		if (i < 100)
			snprintf(b, sizeof b, "%02d", i), adds(v, b);
		snprintf(b, sizeof b, "%03d", i), adds(v, b);
	}
	for (size_t i = 0; i < ARRAY_LEN(common); i++)
		add_word(v, common[i], 1);
	/* several-byte characters: every one of the small pools, a few thousand CJK, Hangul and emoji */
	for (size_t p = 0; p < ARRAY_LEN(pools); p++)
		for (uint32_t cp = pools[p].lo; cp <= pools[p].hi && cp < pools[p].lo + 3000; cp++)
			if (pools[p].hi - pools[p].lo < 400 || rng() % 4 == 0)
				add(v, b, (size_t)utf8_encode(cp, (unsigned char *)b));
	n_multi = 0;
	while (n_multi < 24000) { /* words of several-byte characters, whole and cut inside a character */
		const struct pool *p = &pools[rng() % ARRAY_LEN(pools)];
		size_t n = script_word(p, b), cut;
		int before = v->n;

		switch (rng() % 8) {
		case 0: /* ends inside its last character: drop 1-3 of its bytes */
			cut = n;
			while (cut > 0 && ((uint8_t)b[cut - 1] & 0xc0) == 0x80)
				cut--;
			if (cut > 0 && (uint8_t)b[cut - 1] >= 0xc0) {
				size_t seq = (uint8_t)b[cut - 1] >= 0xf0 ? 4 : (uint8_t)b[cut - 1] >= 0xe0 ? 3 : 2;

				add(v, b, cut - 1 + 1 + rng() % (seq - 1));
			}
			break;
		case 1: /* starts inside its first character */
			if ((uint8_t)b[0] >= 0xc0) {
				size_t skip = 1;

				while (skip < n && ((uint8_t)b[skip] & 0xc0) == 0x80 && rng() % 2 == 0)
					skip++;
				add(v, b + skip, n - skip);
			}
			break;
		case 2: /* a character's first bytes after ASCII text */
			pseudo_word(w);
			{
				size_t k = strlen(w), m = (size_t)utf8_encode(pool_char(p), (unsigned char *)w + k);

				add(v, w, k + 1 + rng() % (m - 1));
			}
			break;
		default:
			add(v, b, n);
		}
		n_multi += v->n > before;
		if (v->n >= N_TEXT / 2)
			break;
	}
	while (v->n < N_TEXT) { /* the rest: more words, their forms and fragments */
		pseudo_word(w);
		add_word(v, w, rng() % 2 == 0);
		if (rng() % 5 == 0) {
			snprintf(b, sizeof b, "%s%s", common[rng() % ARRAY_LEN(common)], w);
			adds(v, b);
		}
		if (rng() % 7 == 0) {
			snprintf(b, sizeof b, "%c%s", ".,:;_-/(\"'#$"[rng() % 12], w);
			adds(v, b);
		}
	}
	for (int i = 255; i < N_TEXT - 1; i++) { /* ids shuffled past the single bytes, as merges' order would */
		int j = i + (int)(rng() % (uint32_t)(N_TEXT - i));
		char *tb = v->b[i];
		uint32_t tl = v->len[i];

		v->b[i] = v->b[j], v->len[i] = v->len[j];
		v->b[j] = tb, v->len[j] = tl;
	}
	for (int i = 0; i < N_CONTROL; i++) {
		snprintf(b, sizeof b, "<|reserved_special_token_%d|>", i);
		v->b[v->n] = xstrdup(b);
		v->len[v->n] = (uint32_t)strlen(b);
		v->skip[v->n] = 1;
		v->end[v->n] = i == 1 || i == 9; /* <|end_of_text|>, <|eot_id|> */
		v->n++;
	}
	free(v->tab);
	v->tab = NULL;
}

static void
vocab_free(struct vocab *v)
{
	for (int i = 0; i < v->n; i++)
		free(v->b[i]);
	free(v->b), free(v->len), free(v->skip), free(v->end);
}

/* ---- the grammars ---- */

static const char schema_text[] =
    "{\"type\": \"object\",\n"
    " \"properties\": {\n"
    "  \"id\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 1000000},\n"
    "  \"name\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 40},\n"
    "  \"email\": {\"type\": \"string\", \"pattern\": \"^[a-z0-9._]+@[a-z0-9]+\\\\.[a-z]{2,4}$\"},\n"
    "  \"status\": {\"enum\": [\"active\", \"inactive\", \"pending\"]},\n"
    "  \"score\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": 100},\n"
    "  \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 20}, \"maxItems\": 8},\n"
    "  \"orders\": {\"type\": \"array\", \"maxItems\": 5, \"items\": {\n"
    "    \"type\": \"object\",\n"
    "    \"properties\": {\n"
    "      \"sku\": {\"type\": \"string\", \"pattern\": \"^[A-Z]{3}-[0-9]{4}$\"},\n"
    "      \"qty\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 99},\n"
    "      \"price\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": 10000},\n"
    "      \"note\": {\"type\": \"string\"},\n"
    "      \"options\": {\"type\": \"object\", \"properties\": {\n"
    "        \"color\": {\"enum\": [\"red\", \"green\", \"blue\"]},\n"
    "        \"size\": {\"anyOf\": [{\"enum\": [\"S\", \"M\", \"L\", \"XL\"]},\n"
    "                             {\"type\": \"integer\", \"minimum\": 20, \"maximum\": 60}]},\n"
    "        \"gift\": {\"type\": \"boolean\"}},\n"
    "        \"required\": [\"color\"]}},\n"
    "    \"required\": [\"sku\", \"qty\", \"price\"]}},\n"
    "  \"address\": {\"type\": \"object\", \"properties\": {\n"
    "    \"street\": {\"type\": \"string\"},\n"
    "    \"city\": {\"type\": \"string\"},\n"
    "    \"zip\": {\"type\": \"string\", \"pattern\": \"^[0-9]{5}$\"},\n"
    "    \"geo\": {\"anyOf\": [{\"type\": \"null\"},\n"
    "                         {\"type\": \"object\", \"properties\": {\n"
    "                            \"lat\": {\"type\": \"number\", \"minimum\": -90, \"maximum\": 90},\n"
    "                            \"lon\": {\"type\": \"number\", \"minimum\": -180, \"maximum\": 180}},\n"
    "                          \"required\": [\"lat\", \"lon\"]}]}},\n"
    "    \"required\": [\"street\", \"city\"]},\n"
    "  \"created\": {\"type\": \"string\", \"format\": \"date-time\"}},\n"
    " \"required\": [\"id\", \"name\", \"status\", \"orders\"]}\n";

static const char json_grammar[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( string \":\" ws value ws (\",\" ws string \":\" ws value ws)* )? \"}\"\n"
    "array  ::= \"[\" ws ( value ws (\",\" ws value ws)* )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
    "number ::= \"-\"? ([0-9] | [1-9] [0-9]+) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
    "ws     ::= [ \\t\\n]{0,20}\n";

/* ---- the walks ---- */

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void
print_stats(const char *what, double *t, int n)
{
	if (n == 0) {
		printf("  %-22s none\n", what);
		return;
	}
	qsort(t, (size_t)n, sizeof *t, cmp_double);
	printf("  %-22s %6d masks: median %8.1f us, p90 %8.1f, p99 %8.1f, max %8.1f\n", what, n, t[n / 2],
	    t[(size_t)n * 9 / 10], t[(size_t)n * 99 / 100], t[n - 1]);
}

/* Resident memory in MiB (/proc/self/statm), 0 where unknown. */
static double
rss_mib(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long size = 0, res = 0;

	if (f == NULL)
		return 0;
	if (fscanf(f, "%lu %lu", &size, &res) != 2)
		res = 0;
	fclose(f);
	return (double)res * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

static int
bench(const char *label, const char *text, const struct vocab *voc, const struct gram_vocab *gv, int n_masks,
    int steps, uint64_t seed, int n_threads, int check)
{
	char err[ERR_LEN];
	struct grammar *g;
	struct gram_index *x;
	uint32_t words = ((uint32_t)voc->n + 31) / 32, *mask = xmalloc(words * sizeof *mask);
	double *all = xmalloc((size_t)n_masks * sizeof *all), *half = xmalloc((size_t)n_masks * sizeof *half);
	int n_all = 0, n_half = 0, walks = 0, done = 0, was_half = 0;
	uint8_t tail[3]; /* the walk's last three bytes */
	uint64_t t0 = now_ns(), t1, t2;
	double rss0;

	if (grammar_compile(text, strlen(text), &g, err) != 0) {
		fprintf(stderr, "mask-bench: %s: %s\n", label, err);
		return 1;
	}
	t1 = now_ns();
	rss0 = rss_mib();
	if (gram_index_new_threads(g, gv, n_threads, &x, err) != 0) {
		fprintf(stderr, "mask-bench: %s: %s\n", label, err);
		return 1;
	}
	t2 = now_ns();
	printf("%s: grammar of %zu bytes, compiled in %.1f ms; index made in %.1f ms (+%.0f MiB resident; threads %d)\n",
	    label, strlen(text), (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6, rss_mib() - rss0, n_threads);
	if (check) {
		struct gram_index *x1;
		uint64_t t3 = now_ns();

		if (gram_index_new_threads(g, gv, 1, &x1, err) != 0) {
			fprintf(stderr, "mask-bench: %s: %s\n", label, err);
			return 1;
		}
		printf("  made again on one thread in %.1f ms: %s\n", (double)(now_ns() - t3) / 1e6,
		    gram_index_same(x, x1) && gram_index_same(x1, x) ? "the same entries" : "DIFFERENT entries");
		if (!gram_index_same(x, x1) || !gram_index_same(x1, x))
			return 1;
		gram_index_free(x1);
	}
	rng_state = seed;
	while (n_all < n_masks) {
		struct gram_state *s;

		if (gram_state_new(g, &s, err) != 0) {
			fprintf(stderr, "mask-bench: %s: %s\n", label, err);
			return 1;
		}
		walks++, was_half = 0;
		memset(tail, 0, sizeof tail);
		for (int k = 0; k < steps && n_all < n_masks; k++) {
			uint64_t a = now_ns();
			int c = gram_mask(s, x, mask, err), pick, id = -1;
			double us = (double)(now_ns() - a) / 1e3;

			all[n_all++] = us;
			if (was_half)
				half[n_half++] = us;
			if (c <= 0) {
				fprintf(stderr, "mask-bench: %s: an empty mask (%d) after %d tokens: %s\n", label, c, k,
				    c < 0 ? err : "");
				return 1;
			}
			pick = (int)(rng() % (uint32_t)c);
			for (uint32_t w = 0; w < words && id < 0; w++) {
				int bits = __builtin_popcount(mask[w]);

				if (pick >= bits) {
					pick -= bits;
					continue;
				}
				for (uint32_t m = mask[w];; m &= m - 1)
					if (pick-- == 0) {
						id = (int)(w * 32 + (uint32_t)__builtin_ctz(m));
						break;
					}
			}
			if (voc->end[id]) {
				done++;
				break;
			}
			if (gram_accept(s, voc->b[id], voc->len[id], err) != 0) {
				fprintf(stderr, "mask-bench: %s: token %d allowed but refused: %s\n", label, id, err);
				return 1;
			}
			/* a character half read: the text so far ends inside a UTF-8 sequence */
			for (uint32_t i = 0; i < voc->len[id]; i++)
				tail[0] = tail[1], tail[1] = tail[2], tail[2] = (uint8_t)voc->b[id][i];
			was_half = 0;
			for (int i = 2, back = 1; i >= 0; i--, back++)
				if ((tail[i] & 0xc0) != 0x80) {
					was_half = tail[i] >= 0xc0 && back < (tail[i] >= 0xf0 ? 4 : tail[i] >= 0xe0 ? 3 : 2);
					break;
				}
		}
		gram_state_free(s);
	}
	printf("  %d walks (%d reached an end token), at most %d tokens each, seed %llu\n", walks, done, steps,
	    (unsigned long long)seed);
	printf("  entries built in a step (keys the index's enumeration missed): %u\n", gram_index_late(x));
	print_stats("all", all, n_all);
	print_stats("a character half read", half, n_half);
	gram_index_free(x);
	grammar_free(g);
	free(mask), free(all), free(half);
	return 0;
}

static void
usage(void)
{
	fprintf(stderr, "usage: mask-bench [-n MASKS] [-w STEPS] [-s SEED] [-g schema|json|both] [-f SCHEMA.json] "
	    "[-t THREADS] [-c]\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	int n_masks = 20000, steps = 200, opt, rc = 0, n_u8 = 0, n_cut = 0, n_threads = 0, check = 0;
	uint64_t seed = 1;
	const char *which = "both", *schema_file = NULL;
	struct vocab voc;
	struct gram_vocab *gv;
	char err[ERR_LEN], *schema_grammar;
	json_error_t je;
	json_t *schema;
	uint64_t t0;

	while ((opt = getopt(argc, argv, "n:w:s:g:f:t:c")) != -1) {
		if (opt == 'n')
			n_masks = atoi(optarg);
		else if (opt == 'w')
			steps = atoi(optarg);
		else if (opt == 's')
			seed = strtoull(optarg, NULL, 0);
		else if (opt == 'g')
			which = optarg;
		else if (opt == 'f')
			schema_file = optarg;
		else if (opt == 't')
			n_threads = atoi(optarg);
		else if (opt == 'c')
			check = 1;
		else
			usage();
	}
	if (n_masks <= 0 || steps <= 0 || seed == 0 || n_threads < 0 ||
	    (strcmp(which, "schema") != 0 && strcmp(which, "json") != 0 && strcmp(which, "both") != 0))
		usage();
	vocab_make(&voc);
	for (int i = 0; i < N_TEXT; i++) {
		const uint8_t *b = (const uint8_t *)voc.b[i];
		int multi = 0;

		for (uint32_t k = 0; k < voc.len[i]; k++)
			multi |= b[k] >= 0x80;
		n_u8 += multi && utf8_valid(voc.b[i], voc.len[i]);
		n_cut += multi && !utf8_valid(voc.b[i], voc.len[i]);
	}
	t0 = now_ns();
	if (gram_vocab_new(voc.n, (const char *const *)voc.b, voc.len, voc.skip, voc.end, &gv, err) != 0) {
		fprintf(stderr, "mask-bench: %s\n", err);
		return 1;
	}
	printf("vocabulary: %d tokens (%d text, %d control); %d with whole several-byte characters, %d with cut "
	       "ones; trie made in %.1f ms\n", voc.n, N_TEXT, N_CONTROL, n_u8, n_cut, (double)(now_ns() - t0) / 1e6);
	if (strcmp(which, "json") != 0) {
		schema = schema_file != NULL ? json_load_file(schema_file, 0, &je) : json_loads(schema_text, 0, &je);
		if (schema == NULL) {
			fprintf(stderr, "mask-bench: the schema: %s\n", je.text);
			return 1;
		}
		if (jschema_grammar(schema, &schema_grammar, err) != 0) {
			fprintf(stderr, "mask-bench: %s\n", err);
			return 1;
		}
		json_decref(schema);
		rc |= bench("json schema", schema_grammar, &voc, gv, n_masks, steps, seed, n_threads, check);
		free(schema_grammar);
	}
	if (strcmp(which, "schema") != 0)
		rc |= bench("generic json", json_grammar, &voc, gv, n_masks, steps, seed, n_threads, check);
	gram_vocab_free(gv);
	vocab_free(&voc);
	return rc;
}
