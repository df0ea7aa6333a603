/*
 * genvocab.c: deterministic vocabularies for generated models.
 *
 * Byte-level BPE (llama3, qwen2, qwen3, harmony): the 256 byte characters
 * in GPT-2's order, then merges learned greedily (most frequent pair first)
 * from the built-in text below, then random merges of existing tokens, each
 * making a token whose text is new, then the family's special tokens.
 * SentencePiece (gemma, llama): special and user-defined tokens, the 256
 * <0xXX> byte tokens, pieces learned the same way over the text with spaces
 * as U+2581 and scored by creation order (earlier merges first), then the
 * single characters: those of the text and a sample of many scripts.
 */
#include "config.h"
#include "genvocab.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "gguf.h"
#include "util.h"

#define GV_MAX_VOCAB (1 << 20)
#define GV_MAX_CHARS 16      /* random merges make tokens of at most this many characters */
#define GV_MAX_LEARNED 4000  /* merges learned from the text, at most */
#define SPACE_ESC "\xe2\x96\x81"

/* The text merges are learned from: many scripts, code, numbers. */
static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. A tokenizer splits text into pieces "
    "that a language model reads one at a time; the pieces it knows best are the ones "
    "that occurred most often in the text it was trained on. Residents of the city "
    "said that the weather was nice, and they walked to the station together. "
    "It's what we've done, and they'll do it again: isn't that the point?\n"
    "Die Größe der Straße überrascht jeden, der zum ersten Mal hier ist. "
    "Wir möchten, dass Sie sich wohlfühlen und Ihre Zeit genießen.\n"
    "Le château se trouve près de la rivière; les élèves étudient à la bibliothèque "
    "où ils préfèrent travailler ensemble.\n"
    "El niño comió una manzana en la mañana y después fue a la escuela con su hermano.\n"
    "Привет, как дела? Сегодня хорошая погода, и мы пойдём гулять в парк.\n"
    "Καλημέρα σας, τι κάνετε σήμερα; Η θάλασσα είναι ήρεμη.\n"
    "我们今天去公园散步，天气很好。中文的分词和英文不一样，每个字都有意义。\n"
    "今日はとても良い天気ですね。東京の桜はもうすぐ咲きます。カタカナとひらがな。\n"
    "안녕하세요, 오늘 날씨가 정말 좋네요. 한국어를 공부하고 있습니다.\n"
    "مرحبا بكم في المدينة، الطقس جميل اليوم ونحن نذهب إلى الحديقة.\n"
    "नमस्ते, आप कैसे हैं? आज मौसम बहुत अच्छा है और हम बाज़ार जा रहे हैं।\n"
    "Xin chào, hôm nay trời đẹp quá. Türkçe öğrenmek güzel bir şey.\n"
    "Emoji: 😀 😂 👍 🎉 ❤️ 🚀 — and symbols: € £ ¥ © ® ™ ± × ÷ ≤ ≥ ≠ ∞ → ←\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 3.14159 2.71828 1,000,000 "
    "in 2024 and 1999, at 12:30 on 07/08.\n"
    "def tokenize(text):\n    for word in text.split():\n        yield word.lower()\n\n"
    "int main(int argc, char **argv)\n{\n\tfor (int i = 0; i < argc; i++)\n"
    "\t\tprintf(\"%s\\n\", argv[i]);\n\treturn 0;\n}\n"
    "if (x == nullptr) { return -1; } else { x->next = y; }  // comment\n"
    "SELECT name, count(*) FROM users WHERE id > 10 GROUP BY name;\n"
    "<html><body><div class=\"main\">Hello, world!</div></body></html>\n"
    "The the the and and of of to to in in is is that that for for it it with with "
    "as as was was on on be be at at by by this this had had not not are are but but "
    "from from or or have have an an they they which which one one you you were were\n";

/* Extra single characters for SentencePiece vocabularies: first, last, step. */
static const uint32_t script_sample[][3] = {
	{ 0x21, 0x7e, 1 }, { 0xc0, 0xff, 1 }, { 0x100, 0x17f, 3 }, { 0x391, 0x3c9, 1 },
	{ 0x410, 0x44f, 1 }, { 0x5d0, 0x5ea, 1 }, { 0x621, 0x64a, 1 }, { 0x905, 0x939, 1 },
	{ 0xe01, 0xe2e, 2 }, { 0x3041, 0x3093, 1 }, { 0x30a1, 0x30f3, 1 }, { 0x4e00, 0x9fff, 40 },
	{ 0xac00, 0xd7a3, 97 }, { 0x2010, 0x2027, 1 }, { 0x1f600, 0x1f64f, 1 }, { 0x1f300, 0x1f3ff, 8 },
};

/* A special or user-defined token of a flavour, and the roles it plays. */
struct gv_special {
	const char *text;
	int type;          /* TOK_TYPE_CONTROL, TOK_TYPE_USER_DEFINED, TOK_TYPE_UNKNOWN */
	const char *roles; /* of 'b' bos, 'e' eos, 't' eot, 'p' pad, 'u' unk */
};

#define C TOK_TYPE_CONTROL
#define U TOK_TYPE_USER_DEFINED
static const struct gv_special sp_llama3[] = {
	{ "<|begin_of_text|>", C, "b" }, { "<|end_of_text|>", C, "e" },
	{ "<|reserved_special_token_0|>", C, "" }, { "<|reserved_special_token_1|>", C, "" },
	{ "<|finetune_right_pad_id|>", C, "p" }, { "<|reserved_special_token_2|>", C, "" },
	{ "<|start_header_id|>", C, "" }, { "<|end_header_id|>", C, "" }, { "<|eom_id|>", C, "" },
	{ "<|eot_id|>", C, "t" }, { "<|python_tag|>", C, "" }, { NULL, 0, NULL },
};
static const struct gv_special sp_qwen2[] = {
	{ "<|endoftext|>", C, "e" }, { "<|im_start|>", C, "" }, { "<|im_end|>", C, "t" },
	{ "<tool_call>", U, "" }, { "</tool_call>", U, "" }, { NULL, 0, NULL },
};
/*
 * Qwen3's added tokens in their order, typed as llama.cpp's converter types
 * them (special ones and <|...|> look-alikes control, the tags user-defined,
 * so that <think> decodes to text), with the ids its GGUFs name: bos and
 * pad <|endoftext|> (config.json's bos_token_id), eos <|im_end|>.
 */
static const struct gv_special sp_qwen3[] = {
	{ "<|endoftext|>", C, "bp" }, { "<|im_start|>", C, "" }, { "<|im_end|>", C, "e" },
	{ "<|object_ref_start|>", C, "" }, { "<|object_ref_end|>", C, "" },
	{ "<|box_start|>", C, "" }, { "<|box_end|>", C, "" }, { "<|quad_start|>", C, "" },
	{ "<|quad_end|>", C, "" }, { "<|vision_start|>", C, "" }, { "<|vision_end|>", C, "" },
	{ "<|vision_pad|>", C, "" }, { "<|image_pad|>", C, "" }, { "<|video_pad|>", C, "" },
	{ "<tool_call>", U, "" }, { "</tool_call>", U, "" }, { "<|fim_prefix|>", C, "" },
	{ "<|fim_middle|>", C, "" }, { "<|fim_suffix|>", C, "" }, { "<|fim_pad|>", C, "" },
	{ "<|repo_name|>", C, "" }, { "<|file_sep|>", C, "" }, { "<tool_response>", U, "" },
	{ "</tool_response>", U, "" }, { "<think>", U, "" }, { "</think>", U, "" },
	{ NULL, 0, NULL },
};
/*
 * gpt-oss's o200k_harmony specials, in their order up to <|endofprompt|>
 * (the real vocabulary goes on with reserved tokens to 201088), all
 * control, with the roles of its tokenizer_config.json and GGUFs.
 */
static const struct gv_special sp_harmony[] = {
	{ "<|startoftext|>", C, "b" }, { "<|endoftext|>", C, "p" },
	{ "<|reserved_200000|>", C, "" }, { "<|reserved_200001|>", C, "" }, { "<|return|>", C, "e" },
	{ "<|constrain|>", C, "" }, { "<|reserved_200004|>", C, "" }, { "<|channel|>", C, "" },
	{ "<|start|>", C, "" }, { "<|end|>", C, "" }, { "<|message|>", C, "" },
	{ "<|reserved_200009|>", C, "" }, { "<|reserved_200010|>", C, "" },
	{ "<|reserved_200011|>", C, "" }, { "<|call|>", C, "" }, { "<|reserved_200013|>", C, "" },
	{ "<|reserved_200014|>", C, "" }, { "<|reserved_200015|>", C, "" },
	{ "<|reserved_200016|>", C, "" }, { "<|reserved_200017|>", C, "" },
	{ "<|endofprompt|>", C, "" }, { NULL, 0, NULL },
};
static const struct gv_special sp_gemma[] = {
	{ "<pad>", C, "p" }, { "<eos>", C, "e" }, { "<bos>", C, "b" },
	{ "<unk>", TOK_TYPE_UNKNOWN, "u" }, { "<mask>", C, "" }, { "[multimodal]", U, "" },
	{ "<start_of_turn>", C, "" }, { "<end_of_turn>", C, "t" },
	{ "\n", U, "" }, { "\n\n", U, "" }, { "\n\n\n", U, "" }, { "\n\n\n\n", U, "" },
	{ "  ", U, "" }, { "   ", U, "" }, { "    ", U, "" }, { "        ", U, "" },
	{ "\t", U, "" }, { "\t\t", U, "" }, { "<table>", U, "" }, { "</table>", U, "" },
	{ NULL, 0, NULL },
};
static const struct gv_special sp_llama[] = {
	{ "<unk>", TOK_TYPE_UNKNOWN, "u" }, { "<s>", C, "b" }, { "</s>", C, "e" }, { NULL, 0, NULL },
};
#undef C
#undef U

static const struct gv_flavour {
	const char *name;
	enum tok_kind kind;
	enum tok_pre pre;
	const char *gguf_pre;
	const struct gv_special *sp;
	int add_bos, add_space_prefix;
	float special_score;  /* SPM: the score GGUF files give special tokens */
} flavours[] = {
	{ "llama3", TOK_BPE, TOK_PRE_LLAMA3, "llama-bpe", sp_llama3, 1, 0, 0 },
	{ "qwen2", TOK_BPE, TOK_PRE_QWEN2, "qwen2", sp_qwen2, 0, 0, 0 },
	{ "qwen3", TOK_BPE, TOK_PRE_QWEN2, "qwen2", sp_qwen3, 0, 0, 0 },
	{ "harmony", TOK_BPE, TOK_PRE_GPT4O, "gpt-4o", sp_harmony, 0, 0, 0 },
	{ "gemma", TOK_SPM, TOK_PRE_DEFAULT, "default", sp_gemma, 1, 0, -1000 },
	{ "llama", TOK_SPM, TOK_PRE_DEFAULT, "default", sp_llama, 1, 1, 0 },
};

/* splitmix64: small, fast, and the same everywhere. */
static uint64_t
rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ---- the token list under construction ---- */

/* An index slot: the token's text, hash and id, so that a probe touches one string at most. */
struct vslot {
	const char *s;
	uint32_t h;
	int32_t id;
};

/* Tokens by text, with an open-addressing index. */
struct vb {
	char **tok;
	uint16_t *len;     /* bytes */
	uint8_t *nch;      /* characters */
	uint8_t *lead;     /* 1 if the text starts with U+2581 */
	int32_t n, cap;
	struct vslot *slot;
	size_t mask;
};

/* FNV-1a, 64 bits. */
static uint64_t
hash_n(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	size_t i;

	for (i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
	return h;
}

/*
 * The id of text s[0..n), or -1; *at is its slot or the empty slot for it.
 * Token texts hold no NUL, so strncmp and the NUL after the stored text
 * compare lengths too.
 */
static int32_t
vb_find(const struct vb *b, const char *s, size_t n, size_t *at)
{
	uint64_t h = hash_n(s, n);
	const struct vslot *v;
	size_t i;

	for (i = h & b->mask; (v = &b->slot[i])->id >= 0; i = (i + 1) & b->mask)
		if (v->h == (uint32_t)(h >> 32) && strncmp(v->s, s, n) == 0 && v->s[n] == '\0')
			break;
	if (at != NULL)
		*at = i;
	return b->slot[i].id;
}

/* Fills slot at with token id. */
static void
vb_set(struct vb *b, size_t at, int32_t id)
{
	b->slot[at].s = b->tok[id];
	b->slot[at].h = (uint32_t)(hash_n(b->tok[id], b->len[id]) >> 32);
	b->slot[at].id = id;
}

/* Empties an index of cap slots. */
static void
vb_slots(struct vb *b, size_t cap)
{
	free(b->slot);
	b->slot = xmalloc(cap * sizeof *b->slot);
	memset(b->slot, 0xff, cap * sizeof *b->slot);
	b->mask = cap - 1;
}

/* Doubles the index when it is half full. */
static void
vb_grow(struct vb *b)
{
	size_t at;
	int32_t i;

	vb_slots(b, (b->mask + 1) * 2);
	for (i = 0; i < b->n; i++) {
		vb_find(b, b->tok[i], b->len[i], &at);
		vb_set(b, at, i);
	}
}

/* Characters of a UTF-8 string. */
static size_t
n_chars(const char *s, size_t n)
{
	size_t i, c = 0;

	for (i = 0; i < n; i++)
		c += ((unsigned char)s[i] & 0xc0) != 0x80;
	return c;
}

/* Adds s[0..n) as a new token; returns its id, or -1 if the text exists. */
static int32_t
vb_add(struct vb *b, const char *s, size_t n)
{
	size_t at;

	if (vb_find(b, s, n, &at) >= 0)
		return -1;
	if (b->n == b->cap) {
		b->cap = b->cap ? b->cap * 2 : 1024;
		b->tok = xrealloc(b->tok, (size_t)b->cap * sizeof *b->tok);
		b->len = xrealloc(b->len, (size_t)b->cap * sizeof *b->len);
		b->nch = xrealloc(b->nch, (size_t)b->cap * sizeof *b->nch);
		b->lead = xrealloc(b->lead, (size_t)b->cap * sizeof *b->lead);
	}
	b->tok[b->n] = xstrndup(s, n);
	b->len[b->n] = (uint16_t)n;
	b->nch[b->n] = (uint8_t)MIN(n_chars(s, n), 255);
	b->lead[b->n] = n >= 3 && memcmp(s, SPACE_ESC, 3) == 0;
	vb_set(b, at, b->n);
	if ((size_t)++b->n * 2 > b->mask)
		vb_grow(b);
	return b->n - 1;
}

/* vb_add of a NUL-terminated text. */
static int32_t
vb_add_str(struct vb *b, const char *s)
{
	return vb_add(b, s, strlen(s));
}

/* An empty token list. */
static void
vb_init(struct vb *b)
{
	memset(b, 0, sizeof *b);
	vb_slots(b, 1024);
}

/* Frees the list and the texts still in it. */
static void
vb_free(struct vb *b)
{
	int32_t i;

	for (i = 0; i < b->n; i++)
		free(b->tok[i]);
	free(b->tok);
	free(b->len);
	free(b->nch);
	free(b->lead);
	free(b->slot);
}

/* Writes the UTF-8 of cp into out (NUL-terminated). */
static void
put_utf8(uint32_t cp, char out[5])
{
	int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4, i;

	out[n] = '\0';
	for (i = n - 1; i > 0; i--, cp >>= 6)
		out[i] = (char)(0x80 | (cp & 0x3f));
	out[0] = (char)(n == 1 ? cp : ((0xf00u >> n) & 0xf0) | cp);
}

/* ---- learning merges from the text ---- */

/* The text cut into words: each a run of symbol ids, with how often it occurs. */
struct words {
	int32_t *sym;      /* all words' symbols, back to back */
	size_t *start;     /* word k is sym[start[k] .. start[k + 1]) */
	int32_t *count;
	size_t n, n_sym;
	size_t cap, cap_sym;
};

/* Character classes of the word splitter, a rough stand-in for the split regexes. */
enum { CL_SPACE, CL_BREAK, CL_LETTER, CL_DIGIT, CL_OTHER };

/* The class of the character at s (len bytes); spm: U+2581 is the space. */
static int
char_class(const char *s, int len, int spm)
{
	unsigned char c = (unsigned char)s[0];

	if (spm ? (len == 3 && memcmp(s, SPACE_ESC, 3) == 0) : c == ' ')
		return CL_SPACE;
	if (c == '\n' || c == '\t' || c == '\r' || (spm && c == ' '))
		return CL_BREAK;
	if (c >= 0x80 || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'))
		return CL_LETTER;
	return c >= '0' && c <= '9' ? CL_DIGIT : CL_OTHER;
}

/* Length of the UTF-8 character at s (the corpus is valid UTF-8). */
static int
char_len(const char *s)
{
	unsigned char c = (unsigned char)*s;

	return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

/* Appends one word's symbols (words repeat: equal ones are counted, not stored twice). */
static void
words_add(struct words *w, const int32_t *sym, size_t n)
{
	size_t k;

	if (n == 0)
		return;
	for (k = 0; k < w->n; k++)
		if (w->start[k + 1] - w->start[k] == n &&
		    memcmp(w->sym + w->start[k], sym, n * sizeof *sym) == 0) {
			w->count[k]++;
			return;
		}
	if (w->n + 2 > w->cap) {
		w->cap = w->cap ? w->cap * 2 : 256;
		w->start = xrealloc(w->start, w->cap * sizeof *w->start);
		w->count = xrealloc(w->count, w->cap * sizeof *w->count);
	}
	if (w->n_sym + n > w->cap_sym) {
		w->cap_sym = (w->n_sym + n) * 2;
		w->sym = xrealloc(w->sym, w->cap_sym * sizeof *w->sym);
	}
	if (w->n == 0)
		w->start[0] = 0;
	memcpy(w->sym + w->n_sym, sym, n * sizeof *sym);
	w->n_sym += n;
	w->count[w->n++] = 1;
	w->start[w->n] = w->n_sym;
}

/*
 * Cuts text into words (an optional space, then a run of one class) and maps
 * each to symbols: BPE one per byte (byte_id), SPM one per character that is
 * a piece (a character that is not one ends the word).
 */
static void
words_build(struct words *w, const char *text, const struct vb *b, const int32_t *byte_id,
    int spm)
{
	int32_t sym[256];
	size_t ns = 0, i;
	int l, k, cl, prev = CL_BREAK, id;
	char ch[5];

	memset(w, 0, sizeof *w);
	for (i = 0; text[i] != '\0'; i += (size_t)l, prev = cl) {
		l = char_len(text + i);
		cl = char_class(text + i, l, spm);
		/* a new word starts at a space, a break, or a change of class not after a space */
		if (cl == CL_SPACE || cl == CL_BREAK || (cl != prev && prev != CL_SPACE) ||
		    ns + 4 > ARRAY_LEN(sym)) {
			words_add(w, sym, ns);
			ns = 0;
		}
		if (cl == CL_BREAK)
			continue;
		if (!spm) {
			for (k = 0; k < l; k++)
				sym[ns++] = byte_id[(unsigned char)text[i + (size_t)k]];
			continue;
		}
		memcpy(ch, text + i, (size_t)l);
		ch[l] = '\0';
		if ((id = vb_find(b, ch, (size_t)l, NULL)) >= 0)
			sym[ns++] = id;
		else {
			words_add(w, sym, ns);
			ns = 0;
		}
	}
	words_add(w, sym, ns);
}

/* Frees the words. */
static void
words_free(struct words *w)
{
	free(w->sym);
	free(w->start);
	free(w->count);
}

/* Pair counts of one learning round, in an open-addressing table. */
struct pairs {
	uint64_t *key;
	int64_t *count;
	size_t mask;
};

/* Table mask: a power of two minus one, at least twice n. */
static size_t
table_mask_for(size_t n)
{
	size_t cap = 64;

	while (cap < 2 * n)
		cap *= 2;
	return cap - 1;
}

/* The key of a pair: both ids in one word. */
static uint64_t
pkey(int32_t a, int32_t b)
{
	return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

/* Adds c occurrences of pair k. */
static void
pairs_add(struct pairs *p, uint64_t k, int64_t c)
{
	size_t i = (size_t)((k * 0x9e3779b97f4a7c15ull) >> 20) & p->mask;

	for (; p->key[i] != UINT64_MAX && p->key[i] != k; i = (i + 1) & p->mask)
		;
	p->key[i] = k;
	p->count[i] += c;
}

/* 1 if pair k was banned (its merge would repeat an existing text). */
static int
banned(const uint64_t *ban, size_t n_ban, uint64_t k)
{
	size_t i;

	for (i = 0; i < n_ban; i++)
		if (ban[i] == k)
			return 1;
	return 0;
}

/* The most frequent pair (ties: the smallest ids), or UINT64_MAX if none occurs twice. */
static uint64_t
best_pair(struct pairs *p, const struct words *w, const uint64_t *ban, size_t n_ban)
{
	uint64_t best = UINT64_MAX;
	int64_t best_c = 1;
	size_t k, j;

	memset(p->key, 0xff, (p->mask + 1) * sizeof *p->key);
	memset(p->count, 0, (p->mask + 1) * sizeof *p->count);
	for (k = 0; k < w->n; k++)
		for (j = w->start[k]; j + 1 < w->start[k + 1]; j++)
			if (w->sym[j] >= 0 && w->sym[j + 1] >= 0)
				pairs_add(p, pkey(w->sym[j], w->sym[j + 1]), w->count[k]);
	for (k = 0; k <= p->mask; k++) {
		if (p->key[k] == UINT64_MAX || banned(ban, n_ban, p->key[k]))
			continue;
		if (p->count[k] > best_c || (p->count[k] == best_c && best_c > 1 && p->key[k] < best)) {
			best = p->key[k];
			best_c = p->count[k];
		}
	}
	return best;
}

/* Replaces every (a, b) in the words by id, left to right. */
static void
apply_merge(struct words *w, int32_t a, int32_t b, int32_t id)
{
	size_t k, i, o;

	for (k = 0; k < w->n; k++) {
		for (i = o = w->start[k]; i < w->start[k + 1]; i++, o++) {
			if (i + 1 < w->start[k + 1] && w->sym[i] == a && w->sym[i + 1] == b) {
				w->sym[o] = id;
				i++;
			} else
				w->sym[o] = w->sym[i];
		}
		for (; o < w->start[k + 1]; o++)
			w->sym[o] = -1;  /* padding left by merges: never part of a pair */
	}
}

/*
 * Greedy BPE training: up to max_new merges of the most frequent pair, each
 * making a new token. The merged pairs go to pair_a/pair_b (for BPE merges).
 */
static void
learn(struct vb *b, struct words *w, int32_t max_new, int32_t *pair_a, int32_t *pair_b)
{
	struct pairs p;
	uint64_t *ban = NULL, k;
	size_t n_ban = 0;
	int32_t made = 0, a, c, id;
	char *s;

	p.mask = table_mask_for(w->n_sym);
	p.key = xmalloc((p.mask + 1) * sizeof *p.key);
	p.count = xmalloc((p.mask + 1) * sizeof *p.count);
	while (made < max_new && (k = best_pair(&p, w, ban, n_ban)) != UINT64_MAX) {
		a = (int32_t)(k >> 32);
		c = (int32_t)(k & 0xffffffff);
		s = xmalloc((size_t)b->len[a] + b->len[c]);
		memcpy(s, b->tok[a], b->len[a]);
		memcpy(s + b->len[a], b->tok[c], b->len[c]);
		id = vb_add(b, s, (size_t)b->len[a] + b->len[c]);
		free(s);
		if (id < 0) {
			ban = xrealloc(ban, (n_ban + 1) * sizeof *ban);
			ban[n_ban++] = k;
			continue;
		}
		apply_merge(w, a, c, id);
		if (pair_a != NULL) {
			pair_a[made] = a;
			pair_b[made] = c;
		}
		made++;
	}
	free(ban);
	free(p.key);
	free(p.count);
}

/* ---- random merges ---- */

/*
 * Random merges of two tokens of ids [from, b->n) until there are target
 * tokens, each with a new text of at most GV_MAX_CHARS characters; SPM
 * keeps U+2581 at the start of a piece only. Merged pairs go to pair_a/b.
 */
static int
fill_random(struct vb *b, int32_t from, int32_t target, uint64_t *rng, int spm,
    int32_t *pair_a, int32_t *pair_b, char *err)
{
	uint64_t tries = 0, max_tries = 64 * (uint64_t)target + 1000000;
	int32_t a, c, id, span;
	char s[4 * GV_MAX_CHARS];

	while (b->n < target) {
		if (++tries > max_tries)
			return err_set(err, ERR_RANGE, "cannot find %d distinct tokens", target);
		span = b->n - from;
		a = from + (int32_t)(rng_next(rng) % (uint64_t)span);
		c = from + (int32_t)(rng_next(rng) % (uint64_t)span);
		if (b->nch[a] + b->nch[c] > GV_MAX_CHARS || (spm && b->lead[c]))
			continue;
		memcpy(s, b->tok[a], b->len[a]);
		memcpy(s + b->len[a], b->tok[c], b->len[c]);
		if ((id = vb_add(b, s, (size_t)b->len[a] + b->len[c])) < 0)
			continue;
		if (pair_a != NULL) {
			pair_a[id - from - 256] = a;
			pair_b[id - from - 256] = c;
		}
	}
	return 0;
}

/* ---- assembly ---- */

/* Allocates the output arrays of n tokens. */
static void
gv_alloc(struct genvocab *v, const struct gv_flavour *f, int32_t n)
{
	memset(v, 0, sizeof *v);
	v->flavour = f->name;
	v->kind = f->kind;
	v->pre = f->pre;
	v->n = n;
	v->tokens = xcalloc((size_t)n, sizeof *v->tokens);
	v->scores = xcalloc((size_t)n, sizeof *v->scores);
	v->types = xcalloc((size_t)n, sizeof *v->types);
	v->bos = v->eos = v->eot = v->pad = v->unk = -1;
	v->add_bos = f->add_bos;
	v->add_space_prefix = f->add_space_prefix;
}

/* Places the flavour's special tokens (vb ids 0..) at ids at.. and notes their roles. */
static void
gv_specials(struct genvocab *v, const struct gv_flavour *f, struct vb *b, int32_t at)
{
	const struct gv_special *sp;
	const char *r;
	int32_t i, id;

	for (i = 0, sp = f->sp; sp->text != NULL; i++, sp++) {
		id = at + i;
		v->tokens[id] = b->tok[i];
		b->tok[i] = NULL;
		v->types[id] = sp->type;
		v->scores[id] = f->special_score;
		for (r = sp->roles; *r != '\0'; r++) {
			switch (*r) {
			case 'b': v->bos = id; break;
			case 'e': v->eos = id; break;
			case 't': v->eot = id; break;
			case 'p': v->pad = id; break;
			case 'u': v->unk = id; break;
			}
		}
	}
}

/* Moves tokens [from, to) of b to ids at.., as normal tokens scored by position. */
static void
gv_move(struct genvocab *v, struct vb *b, int32_t from, int32_t to, int32_t at, float score0)
{
	int32_t i;

	for (i = from; i < to; i++, at++) {
		v->tokens[at] = b->tok[i];
		b->tok[i] = NULL;
		v->types[at] = TOK_TYPE_NORMAL;
		v->scores[at] = v->kind == TOK_SPM ? score0 - (float)(i - from) : 0;
	}
}

/* Number of special tokens of a flavour. */
static int32_t
n_special(const struct gv_flavour *f)
{
	int32_t n = 0;

	while (f->sp[n].text != NULL)
		n++;
	return n;
}

/* Adds the flavour's specials to b (they must never be made by merges). */
static void
add_specials(struct vb *b, const struct gv_flavour *f)
{
	const struct gv_special *sp;

	for (sp = f->sp; sp->text != NULL; sp++)
		vb_add_str(b, sp->text);
}

/* GPT-2's byte order: the printable bytes first, then the others ascending. */
static int
gpt2_byte_order(int i)
{
	static const int printable = 94 + 12 + 82;
	int b, k = 0;

	if (i < 94)
		return 33 + i;
	if (i < 94 + 12)
		return 161 + (i - 94);
	if (i < printable)
		return 174 + (i - 94 - 12);
	for (b = 0; b < 256; b++)
		if ((b < 33 || (b > 126 && b < 161) || b == 173) && k++ == i - printable)
			break;
	return b;
}

/* Byte-level BPE: bytes, learned merges, random merges, then the specials. */
static int
make_bpe(struct genvocab *v, const struct gv_flavour *f, int32_t n, uint64_t *rng, char *err)
{
	int32_t ns = n_special(f), base = ns, n_norm = n - ns, byte_id[256], *pa, *pb, i, k;
	struct words w;
	struct vb b;
	char ch[3];
	int rc;

	vb_init(&b);
	add_specials(&b, f);
	for (i = 0; i < 256; i++) {
		k = gpt2_byte_order(i);
		ch[tok_byte_char((unsigned char)k, ch)] = '\0';
		byte_id[k] = vb_add_str(&b, ch);
	}
	pa = xmalloc((size_t)(n_norm - 256) * sizeof *pa);
	pb = xmalloc((size_t)(n_norm - 256) * sizeof *pb);
	words_build(&w, corpus, &b, byte_id, 0);
	learn(&b, &w, MIN(GV_MAX_LEARNED, n_norm - 256), pa, pb);
	words_free(&w);
	rc = fill_random(&b, base, n, rng, 0, pa, pb, err);
	if (rc == 0) {
		gv_alloc(v, f, n);
		v->n_merges = n_norm - 256;
		v->merges = xcalloc((size_t)v->n_merges, sizeof *v->merges);
		for (i = 0; i < v->n_merges; i++) {
			v->merges[i] = xmalloc(strlen(b.tok[pa[i]]) + strlen(b.tok[pb[i]]) + 2);
			sprintf(v->merges[i], "%s %s", b.tok[pa[i]], b.tok[pb[i]]);
		}
		gv_move(v, &b, base, n, 0, 0);
		gv_specials(v, f, &b, n_norm);
	}
	free(pa);
	free(pb);
	vb_free(&b);
	return rc;
}

/* The text as SentencePiece sees it: spaces as U+2581, and one starting each line if asked. */
static char *
spm_corpus(int prefix)
{
	struct { char *p; size_t n; } o;
	const char *s;

	o.p = xmalloc(sizeof corpus * 3 + 256);
	o.n = 0;
	for (s = corpus; *s; s++) {
		if (prefix && (s == corpus || s[-1] == '\n') && *s != '\n') {
			memcpy(o.p + o.n, SPACE_ESC, 3);
			o.n += 3;
		}
		if (*s == ' ') {
			memcpy(o.p + o.n, SPACE_ESC, 3);
			o.n += 3;
		} else
			o.p[o.n++] = *s;
	}
	o.p[o.n] = '\0';
	return o.p;
}

/* Adds single characters: U+2581, those of the text, then the script sample, up to max. */
static void
add_alphabet(struct vb *b, const char *text, int32_t max)
{
	int32_t first = b->n;
	size_t i, k;
	uint32_t cp;
	char ch[5];
	int l;

	vb_add_str(b, SPACE_ESC);
	for (i = 0; text[i] != '\0' && b->n - first < max; i += (size_t)l) {
		l = char_len(text + i);
		if (char_class(text + i, l, 1) == CL_BREAK)
			continue;
		memcpy(ch, text + i, (size_t)l);
		ch[l] = '\0';
		vb_add_str(b, ch);
	}
	for (k = 0; k < ARRAY_LEN(script_sample); k++)
		for (cp = script_sample[k][0]; cp <= script_sample[k][1] && b->n - first < max;
		    cp += script_sample[k][2]) {
			put_utf8(cp, ch);
			vb_add_str(b, ch);
		}
}

/* SentencePiece: specials, byte tokens, merged pieces by score, then single characters. */
static int
make_spm(struct genvocab *v, const struct gv_flavour *f, int32_t n, uint64_t *rng, char *err)
{
	int32_t ns = n_special(f), base = ns + 256, n_pieces = n - base, n_alpha, first, i;
	char *text = spm_corpus(f->add_space_prefix), hex[8];
	struct words w;
	struct vb b;
	int rc;

	vb_init(&b);
	add_specials(&b, f);
	for (i = 0; i < 256; i++) {
		snprintf(hex, sizeof hex, "<0x%02X>", i);
		vb_add_str(&b, hex);
	}
	add_alphabet(&b, text, MAX(2, n_pieces / 2));
	first = n_alpha = b.n;
	n_alpha -= base;
	words_build(&w, text, &b, NULL, 1);
	learn(&b, &w, MIN(GV_MAX_LEARNED, n - b.n), NULL, NULL);
	words_free(&w);
	free(text);
	rc = fill_random(&b, base, n, rng, 1, NULL, NULL, err);
	if (rc == 0) {
		gv_alloc(v, f, n);
		gv_specials(v, f, &b, 0);
		for (i = 0; i < 256; i++) {
			v->tokens[ns + i] = b.tok[ns + i];
			b.tok[ns + i] = NULL;
			v->types[ns + i] = TOK_TYPE_BYTE;
		}
		gv_move(v, &b, first, n, base, 0);
		gv_move(v, &b, base, first, n - n_alpha, -(float)(n - first));
	}
	vb_free(&b);
	return rc;
}

int
genvocab_make(struct genvocab *v, const char *flavour, int32_t n_vocab, uint64_t seed,
    char *err)
{
	const struct gv_flavour *f = NULL;
	int32_t min;
	uint64_t rng;
	size_t i;

	for (i = 0; i < ARRAY_LEN(flavours); i++)
		if (strcmp(flavours[i].name, flavour) == 0)
			f = &flavours[i];
	if (f == NULL)
		return err_set(err, ERR_INVAL, "unknown vocabulary flavour '%s' (llama3, qwen2, qwen3, "
		    "harmony, gemma, llama)", flavour);
	min = n_special(f) + 256 + 64;
	if (n_vocab < min || n_vocab > GV_MAX_VOCAB)
		return err_set(err, ERR_RANGE, "a %s vocabulary needs %d to %d tokens, not %d",
		    flavour, min, GV_MAX_VOCAB, n_vocab);
	/* the flavour's name goes into the stream, so flavours of one seed differ */
	rng = seed ^ hash_n(flavour, strlen(flavour));
	return f->kind == TOK_BPE ? make_bpe(v, f, n_vocab, &rng, err) :
	    make_spm(v, f, n_vocab, &rng, err);
}

void
genvocab_free(struct genvocab *v)
{
	int32_t i;

	for (i = 0; i < v->n; i++)
		free(v->tokens[i]);
	for (i = 0; i < v->n_merges; i++)
		free(v->merges[i]);
	free(v->tokens);
	free(v->scores);
	free(v->types);
	free(v->merges);
	memset(v, 0, sizeof *v);
}

/* ---- writers ---- */

/* The flavour a vocabulary was made with, or NULL. */
static const struct gv_flavour *
flavour_of(const struct genvocab *v)
{
	size_t i;

	for (i = 0; i < ARRAY_LEN(flavours); i++)
		if (v->flavour != NULL && strcmp(flavours[i].name, v->flavour) == 0)
			return &flavours[i];
	return NULL;
}

/* Writes an id key if the token exists. */
static void
w_id(struct gguf_writer *w, const char *key, int32_t id)
{
	if (id >= 0)
		gguf_w_u32(w, key, (uint32_t)id);
}

int
genvocab_write_gguf(const struct genvocab *v, struct gguf_writer *w, char *err)
{
	const struct gv_flavour *f = flavour_of(v);
	int spm = v->kind == TOK_SPM;

	if (f == NULL)
		return err_set(err, ERR_INVAL, "not a generated vocabulary");
	gguf_w_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
	gguf_w_str(w, "tokenizer.ggml.pre", f->gguf_pre);
	gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, (size_t)v->n);
	if (spm)
		gguf_w_arr_f32(w, "tokenizer.ggml.scores", v->scores, (size_t)v->n);
	gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v->types, (size_t)v->n);
	if (!spm)
		gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
		    (size_t)v->n_merges);
	w_id(w, "tokenizer.ggml.bos_token_id", v->bos);
	w_id(w, "tokenizer.ggml.eos_token_id", v->eos);
	w_id(w, "tokenizer.ggml.eot_token_id", v->eot);
	w_id(w, "tokenizer.ggml.unknown_token_id", v->unk);
	w_id(w, "tokenizer.ggml.padding_token_id", v->pad);
	gguf_w_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
	gguf_w_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos);
	if (spm)
		gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", v->add_space_prefix);
	return 0;
}

/* {"type": type}, to be filled in. */
static json_t *
jtyped(const char *type)
{
	json_t *o = json_object();

	json_object_set_new(o, "type", json_string(type));
	return o;
}

/* HF's pattern member: {"String": s} or {"Regex": r}. */
static json_t *
jpattern(const char *kind, const char *s)
{
	json_t *o = json_object();

	json_object_set_new(o, kind, json_string(s));
	return o;
}

/* A Replace normalizer or decoder. */
static json_t *
jreplace(const char *from, const char *to)
{
	json_t *o = jtyped("Replace");

	json_object_set_new(o, "pattern", jpattern("String", from));
	json_object_set_new(o, "content", json_string(to));
	return o;
}

/* A Sequence of the given kind ("normalizers", "pretokenizers", "decoders", "processors"). */
static json_t *
jseq(const char *member, json_t *items)
{
	json_t *o = jtyped("Sequence");

	json_object_set_new(o, member, items);
	return o;
}

/* added_tokens: every token that is not normal or a byte. */
static json_t *
j_added(const struct genvocab *v)
{
	json_t *a = json_array(), *t;
	int32_t i;

	for (i = 0; i < v->n; i++) {
		if (v->types[i] == TOK_TYPE_NORMAL || v->types[i] == TOK_TYPE_BYTE)
			continue;
		t = json_object();
		json_object_set_new(t, "id", json_integer(i));
		json_object_set_new(t, "content", json_string(v->tokens[i]));
		json_object_set_new(t, "single_word", json_false());
		json_object_set_new(t, "lstrip", json_false());
		json_object_set_new(t, "rstrip", json_false());
		json_object_set_new(t, "normalized", json_false());
		json_object_set_new(t, "special", json_boolean(v->types[i] != TOK_TYPE_USER_DEFINED));
		json_array_append_new(a, t);
	}
	return a;
}

/* A buffer of strings that grows. */
struct strv {
	char **s;
	int32_t n, cap;
};

/* Appends s, taken over. */
static void
strv_add(struct strv *v, char *s)
{
	if (v->n == v->cap) {
		v->cap = v->cap ? v->cap * 2 : 1024;
		v->s = xrealloc(v->s, (size_t)v->cap * sizeof *v->s);
	}
	v->s[v->n++] = s;
}

/* Frees the strings and the buffer. */
static void
strv_free(struct strv *v)
{
	int32_t i;

	for (i = 0; i < v->n; i++)
		free(v->s[i]);
	free(v->s);
}

/* 1 if s[0..n) is a normal piece of v (indexed by b, built in id order). */
static int
is_piece(const struct genvocab *v, const struct vb *b, const char *s, size_t n)
{
	int32_t id = vb_find(b, s, n, NULL);

	return id >= 0 && v->types[id] == TOK_TYPE_NORMAL;
}

/*
 * SPM merges as Hugging Face converts a SentencePiece model: for each
 * normal piece, best-scored first, every split into two normal pieces. The
 * GGUF needs none (SPM merges by score), so they are made only for JSON.
 */
static void
spm_merges(const struct genvocab *v, struct strv *m)
{
	const char *t;
	size_t len, k;
	struct vb b;
	int32_t i;
	char *pair;

	vb_init(&b);
	for (i = 0; i < v->n; i++)
		vb_add_str(&b, v->tokens[i]);
	for (i = 0; i < v->n; i++) {
		if (v->types[i] != TOK_TYPE_NORMAL)
			continue;
		t = v->tokens[i];
		len = strlen(t);
		for (k = (size_t)char_len(t); k < len; k += (size_t)char_len(t + k)) {
			if (!is_piece(v, &b, t, k) || !is_piece(v, &b, t + k, len - k))
				continue;
			pair = xmalloc(len + 2);
			memcpy(pair, t, k);
			pair[k] = ' ';
			memcpy(pair + k + 1, t + k, len - k + 1);
			strv_add(m, pair);
		}
	}
	vb_free(&b);
}

/* The BPE model: byte-level ones leave the added tokens out of vocab, as Llama 3 and Qwen2 do. */
static json_t *
j_model(const struct genvocab *v)
{
	json_t *m = jtyped("BPE"), *vocab = json_object(), *merges = json_array(), *pair;
	struct strv sm = { 0 };
	int spm = v->kind == TOK_SPM;
	char **mv = v->merges;
	int32_t i, nm = v->n_merges;
	const char *sp;

	json_object_set_new(m, "dropout", json_null());
	json_object_set_new(m, "unk_token", v->unk >= 0 ? json_string(v->tokens[v->unk]) : json_null());
	json_object_set_new(m, "continuing_subword_prefix", json_null());
	json_object_set_new(m, "end_of_word_suffix", json_null());
	json_object_set_new(m, "fuse_unk", json_boolean(spm));
	json_object_set_new(m, "byte_fallback", json_boolean(spm));
	/*
	 * As llama.cpp reads the GGUF: Llama 3's only, so that both files agree
	 * (gpt-oss's own tokenizer.json sets it, as tiktoken works; llama.cpp
	 * does not for its GGUF)
	 */
	json_object_set_new(m, "ignore_merges", json_boolean(v->pre == TOK_PRE_LLAMA3 && !spm));
	for (i = 0; i < v->n; i++)
		if (spm || v->types[i] == TOK_TYPE_NORMAL)
			json_object_set_new(vocab, v->tokens[i], json_integer(i));
	if (spm) {
		spm_merges(v, &sm);
		mv = sm.s;
		nm = sm.n;
	}
	for (i = 0; i < nm; i++) {
		sp = strchr(mv[i] + 1, ' ');
		pair = json_array();
		json_array_append_new(pair, json_stringn(mv[i], (size_t)(sp - mv[i])));
		json_array_append_new(pair, json_string(sp + 1));
		json_array_append_new(merges, pair);
	}
	strv_free(&sm);
	json_object_set_new(m, "vocab", vocab);
	json_object_set_new(m, "merges", merges);
	return m;
}

/*
 * Byte-level: Split by the family's regex, then ByteLevel without its own
 * regex. The regex is the one the GGUF reader uses, llama.cpp's: for
 * harmony its rewrite of o200k's (letter case by ASCII alone, no \p{M}),
 * not the original gpt-oss's tokenizer.json has, so that both files agree.
 */
static json_t *
j_pre_bpe(const struct genvocab *v)
{
	json_t *split = jtyped("Split"), *bl = jtyped("ByteLevel"), *seq = json_array();

	json_object_set_new(split, "pattern", jpattern("Regex", tok_pre_regex(v->pre)));
	json_object_set_new(split, "behavior", json_string("Isolated"));
	json_object_set_new(split, "invert", json_false());
	json_object_set_new(bl, "add_prefix_space", json_false());
	json_object_set_new(bl, "trim_offsets", json_true());
	json_object_set_new(bl, "use_regex", json_false());
	json_array_append_new(seq, split);
	json_array_append_new(seq, bl);
	return jseq("pretokenizers", seq);
}

/* SentencePiece as HF converts it: spaces replaced (and one prepended, Llama 2). */
static json_t *
j_norm_spm(const struct genvocab *v)
{
	json_t *seq = json_array(), *pre;

	if (v->add_space_prefix) {
		pre = jtyped("Prepend");
		json_object_set_new(pre, "prepend", json_string(SPACE_ESC));
		json_array_append_new(seq, pre);
	}
	json_array_append_new(seq, jreplace(" ", SPACE_ESC));
	return jseq("normalizers", seq);
}

/* Decoder: ByteLevel, or U+2581 back to spaces, bytes, and the prefix space stripped. */
static json_t *
j_decoder(const struct genvocab *v)
{
	json_t *d, *seq, *strip;

	if (v->kind == TOK_BPE) {
		d = jtyped("ByteLevel");
		json_object_set_new(d, "add_prefix_space", json_true());
		json_object_set_new(d, "trim_offsets", json_true());
		json_object_set_new(d, "use_regex", json_true());
		return d;
	}
	seq = json_array();
	json_array_append_new(seq, jreplace(SPACE_ESC, " "));
	json_array_append_new(seq, jtyped("ByteFallback"));
	json_array_append_new(seq, jtyped("Fuse"));
	if (v->add_space_prefix) {
		strip = jtyped("Strip");
		json_object_set_new(strip, "content", json_string(" "));
		json_object_set_new(strip, "start", json_integer(1));
		json_object_set_new(strip, "stop", json_integer(0));
		json_array_append_new(seq, strip);
	}
	return jseq("decoders", seq);
}

/* One element of a TemplateProcessing list. */
static json_t *
j_tpl_item(const char *kind, const char *id)
{
	json_t *o = json_object(), *in = json_object();

	json_object_set_new(in, "id", json_string(id));
	json_object_set_new(in, "type_id", json_integer(0));
	json_object_set_new(o, kind, in);
	return o;
}

/* post_processor: BOS before each sequence when the family adds it. */
static json_t *
j_post(const struct genvocab *v)
{
	json_t *p, *single, *pair, *st, *entry, *ids, *toks;
	const char *bos;

	if (!v->add_bos || v->bos < 0)
		return json_null();
	bos = v->tokens[v->bos];
	single = json_array();
	json_array_append_new(single, j_tpl_item("SpecialToken", bos));
	json_array_append_new(single, j_tpl_item("Sequence", "A"));
	pair = json_deep_copy(single);
	json_array_append_new(pair, j_tpl_item("SpecialToken", bos));
	json_array_append_new(pair, j_tpl_item("Sequence", "B"));
	ids = json_array();
	json_array_append_new(ids, json_integer(v->bos));
	toks = json_array();
	json_array_append_new(toks, json_string(bos));
	entry = json_object();
	json_object_set_new(entry, "id", json_string(bos));
	json_object_set_new(entry, "ids", ids);
	json_object_set_new(entry, "tokens", toks);
	st = json_object();
	json_object_set_new(st, bos, entry);
	p = jtyped("TemplateProcessing");
	json_object_set_new(p, "single", single);
	json_object_set_new(p, "pair", pair);
	json_object_set_new(p, "special_tokens", st);
	return p;
}

/* The whole tokenizer.json document. */
static json_t *
j_tokenizer(const struct genvocab *v)
{
	json_t *root = json_object();
	int spm = v->kind == TOK_SPM;

	json_object_set_new(root, "version", json_string("1.0"));
	json_object_set_new(root, "truncation", json_null());
	json_object_set_new(root, "padding", json_null());
	json_object_set_new(root, "added_tokens", j_added(v));
	json_object_set_new(root, "normalizer", spm ? j_norm_spm(v) :
	    v->pre == TOK_PRE_QWEN2 ? jtyped("NFC") : json_null());
	json_object_set_new(root, "pre_tokenizer", spm ? json_null() : j_pre_bpe(v));
	json_object_set_new(root, "post_processor", j_post(v));
	json_object_set_new(root, "decoder", j_decoder(v));
	json_object_set_new(root, "model", j_model(v));
	return root;
}

/* A token text for tokenizer_config.json, or null. */
static json_t *
j_tok(const struct genvocab *v, int32_t id)
{
	return id >= 0 ? json_string(v->tokens[id]) : json_null();
}

/* tokenizer_config.json: what transformers reads besides tokenizer.json. */
static json_t *
j_config(const struct genvocab *v)
{
	json_t *c = json_object();

	json_object_set_new(c, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
	json_object_set_new(c, "add_bos_token", json_boolean(v->add_bos));
	json_object_set_new(c, "add_eos_token", json_boolean(v->add_eos));
	json_object_set_new(c, "bos_token", j_tok(v, v->bos));
	json_object_set_new(c, "eos_token", j_tok(v, v->eos));
	json_object_set_new(c, "pad_token", j_tok(v, v->pad));
	json_object_set_new(c, "unk_token", j_tok(v, v->unk));
	json_object_set_new(c, "clean_up_tokenization_spaces", json_false());
	json_object_set_new(c, "model_max_length", json_integer(131072));
	return c;
}

/* Writes one JSON document to dir/name. */
static int
dump(json_t *doc, const char *dir, const char *name, char *err)
{
	char path[4096];
	int rc = 0;

	snprintf(path, sizeof path, "%s/%s", dir, name);
	if (json_dump_file(doc, path, JSON_COMPACT) != 0)
		rc = err_set(err, ERR_IO, "%s: cannot write", path);
	json_decref(doc);
	return rc;
}

int
genvocab_write_json(const struct genvocab *v, const char *dir, char *err)
{
	int rc;

	if (flavour_of(v) == NULL)
		return err_set(err, ERR_INVAL, "not a generated vocabulary");
	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		return err_set(err, ERR_IO, "%s: %s", dir, strerror(errno));
	if ((rc = dump(j_tokenizer(v), dir, "tokenizer.json", err)) != 0)
		return rc;
	return dump(j_config(v), dir, "tokenizer_config.json", err);
}
