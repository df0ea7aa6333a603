/*
 * tokenizer_encode.c: text to token ids, from the tables tokenizer.c builds.
 *
 * One struct serves three encoders:
 *  - SPM scores (GGUF "llama"): llama.cpp's llm_tokenizer_spm, the bigram
 *    merge that always joins the adjacent pair whose concatenation is the
 *    best-scored piece, with <0xXX> byte fallback;
 *  - BPE ranks over the GPT-2 byte alphabet (GGUF "gpt2", tokenizer.json
 *    ByteLevel), after a regex pre-tokenizer split;
 *  - BPE ranks over characters with byte fallback (tokenizer.json of
 *    Llama 2 / Gemma: SentencePiece converted to merges).
 * Before any of them, the text is cut at added tokens (user-defined always,
 * control tokens with parse_special), leftmost-longest as Hugging Face's
 * AddedVocabulary does; each remaining fragment is encoded on its own.
 */
#include "config.h"
#include "tokenizer_int.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Word boundaries produced by the pre-tokenizer. */
struct ranges {
	size_t *a; /* pairs: start, end */
	size_t n, cap;
};

/* One symbol of a word being merged. */
struct sym {
	int32_t prev, next;
	uint32_t off, len; /* SPM: bytes of the symbol in the word */
	int32_t id;        /* BPE: the symbol's token; -1 once merged away */
};

/* A candidate merge; lower key first, then leftmost. */
struct hent {
	float key;         /* BPE: rank; SPM: minus the merged piece's score */
	int32_t left, right;
	int32_t lid, rid;  /* BPE: the pair's ids when queued */
	uint32_t size;     /* SPM: bytes of the merged symbol when queued */
};

/* Scratch state of one tok_encode call. */
struct enc {
	int32_t *ids;
	size_t n_ids, cap_ids;
	struct sym *sym;
	size_t cap_sym;
	struct hent *heap;
	size_t n_heap, cap_heap;
	struct buf esc;      /* the text with spaces escaped, for escape_added */
	struct buf norm;
	struct ranges w, w2;
	pcre2_match_data *md;
};

/* Length of the UTF-8 character whose lead byte is c (input already validated). */
static int
utf8_len_lead(unsigned char c)
{
	if (c < 0x80)
		return 1;
	if (c < 0xe0)
		return 2;
	if (c < 0xf0)
		return 3;
	return 4;
}

/* ---- encoding ---- */

/* Appends an id to the output. */
static void
enc_push(struct enc *x, int32_t id)
{
	if (x->n_ids == x->cap_ids) {
		x->cap_ids = x->cap_ids ? x->cap_ids * 2 : 256;
		x->ids = xrealloc(x->ids, x->cap_ids * sizeof *x->ids);
	}
	x->ids[x->n_ids++] = id;
}

/* Room for n symbols; the heap never holds more than two candidates per merge plus n. */
static void
enc_reserve(struct enc *x, size_t n)
{
	if (x->cap_sym < n) {
		x->cap_sym = n;
		x->sym = xrealloc(x->sym, n * sizeof *x->sym);
	}
	x->n_heap = 0;
}

/* Appends the range [a, b). */
static void
ranges_add(struct ranges *r, size_t a, size_t b)
{
	if (r->n + 2 > r->cap) {
		r->cap = r->cap ? r->cap * 2 : 64;
		r->a = xrealloc(r->a, r->cap * sizeof *r->a);
	}
	r->a[r->n++] = a;
	r->a[r->n++] = b;
}

/* 1 if heap entry a goes before b: lower key, then the leftmost. */
static int
hent_less(const struct hent *a, const struct hent *b)
{
	return a->key < b->key || (a->key == b->key && a->left < b->left);
}

/* Queues a candidate merge. */
static void
heap_push(struct enc *x, const struct hent *h)
{
	size_t i, p;

	if (x->n_heap == x->cap_heap) {
		x->cap_heap = x->cap_heap ? x->cap_heap * 2 : 256;
		x->heap = xrealloc(x->heap, x->cap_heap * sizeof *x->heap);
	}
	for (i = x->n_heap++; i > 0; i = p) {
		p = (i - 1) / 2;
		if (!hent_less(h, &x->heap[p]))
			break;
		x->heap[i] = x->heap[p];
	}
	x->heap[i] = *h;
}

/* Removes the best entry into *out. */
static void
heap_pop(struct enc *x, struct hent *out)
{
	struct hent last = x->heap[--x->n_heap];
	size_t i = 0, c;

	*out = x->heap[0];
	for (;;) {
		c = 2 * i + 1;
		if (c >= x->n_heap)
			break;
		if (c + 1 < x->n_heap && hent_less(&x->heap[c + 1], &x->heap[c]))
			c++;
		if (!hent_less(&x->heap[c], &last))
			break;
		x->heap[i] = x->heap[c];
		i = c;
	}
	if (x->n_heap > 0)
		x->heap[i] = last;
}

/* Links n symbols into a list. */
static void
link_syms(struct sym *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		s[i].prev = (int32_t)i - 1;
		s[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
	}
}

/* Removes symbol r, which was merged into its left neighbour l. */
static void
unlink_sym(struct sym *s, int32_t l, int32_t r)
{
	s[l].next = s[r].next;
	if (s[r].next >= 0)
		s[s[r].next].prev = l;
}

/* The byte's fallback token, else <unk>; an error if the vocabulary has neither. */
static int
push_byte(const struct tokenizer *t, struct enc *x, unsigned char b, char *err)
{
	int32_t id = t->byte_tok[b] >= 0 ? t->byte_tok[b] : t->unk;

	if (id < 0)
		return err_set(err, ERR_UNSUPPORTED, "byte 0x%02x cannot be encoded: the vocabulary "
		    "has neither a byte token nor <unk>", b);
	enc_push(x, id);
	return 0;
}

/* SPM: the piece that can come out of merging, or -1 (control and byte tokens cannot). */
static int32_t
spm_piece(const struct tokenizer *t, const char *s, size_t n)
{
	int32_t id = tok_find_text(t, s, n);

	if (id < 0)
		return -1;
	return t->e[id].type == TOK_TYPE_NORMAL || t->e[id].type == TOK_TYPE_USER_DEFINED ? id : -1;
}

/* SPM: queues the merge of symbols l and r if their concatenation is a piece. */
static void
spm_try(const struct tokenizer *t, struct enc *x, const char *w, int32_t l, int32_t r)
{
	struct hent h;
	int32_t id;

	if (l < 0 || r < 0)
		return;
	h.size = x->sym[l].len + x->sym[r].len;
	id = spm_piece(t, w + x->sym[l].off, h.size);
	if (id < 0)
		return;
	h.key = -t->e[id].score;
	h.left = l;
	h.right = r;
	h.lid = h.rid = 0;
	heap_push(x, &h);
}

/* SPM: emits the final symbols, falling back to bytes for those that are no piece. */
static int
spm_emit(const struct tokenizer *t, struct enc *x, const char *w, char *err)
{
	int32_t i, id;
	uint32_t k;
	int rc;

	for (i = 0; i >= 0; i = x->sym[i].next) {
		id = spm_piece(t, w + x->sym[i].off, x->sym[i].len);
		if (id >= 0) {
			enc_push(x, id);
			continue;
		}
		for (k = 0; k < x->sym[i].len; k++)
			if ((rc = push_byte(t, x, (unsigned char)w[x->sym[i].off + k], err)) != 0)
				return rc;
	}
	return 0;
}

/* SPM (llama.cpp's llm_tokenizer_spm): merge the best-scored adjacent pair until none is left. */
static int
spm_word(const struct tokenizer *t, struct enc *x, const char *w, size_t n, char *err)
{
	size_t i, ns = 0;
	struct hent h;
	struct sym *s;

	enc_reserve(x, n);
	s = x->sym;
	for (i = 0; i < n; i += s[ns++].len) {
		s[ns].off = (uint32_t)i;
		s[ns].len = (uint32_t)MIN((size_t)utf8_len_lead((unsigned char)w[i]), n - i);
	}
	link_syms(s, ns);
	for (i = 1; i < ns; i++)
		spm_try(t, x, w, (int32_t)i - 1, (int32_t)i);
	while (x->n_heap > 0) {
		heap_pop(x, &h);
		/* stale: one side was merged away, or grew, since it was queued */
		if (s[h.left].len == 0 || s[h.right].len == 0 || s[h.left].next != h.right ||
		    s[h.left].len + s[h.right].len != h.size)
			continue;
		s[h.left].len += s[h.right].len;
		s[h.right].len = 0;
		unlink_sym(s, h.left, h.right);
		spm_try(t, x, w, s[h.left].prev, h.left);
		spm_try(t, x, w, h.left, s[h.left].next);
	}
	return spm_emit(t, x, w, err);
}

/* BPE: queues the merge of symbols l and r if the pair is ranked. */
static void
bpe_try(const struct tokenizer *t, struct enc *x, int32_t l, int32_t r)
{
	struct hent h;
	ssize_t m;

	if (l < 0 || r < 0)
		return;
	m = tok_pmap_get(&t->merges, x->sym[l].id, x->sym[r].id);
	if (m < 0)
		return;
	h.key = (float)t->merges.rank[m];
	h.left = l;
	h.right = r;
	h.lid = x->sym[l].id;
	h.rid = x->sym[r].id;
	h.size = 0;
	heap_push(x, &h);
}

/* BPE: a character-level symbol: its token, else byte fallback, else <unk>. */
static int
bpe_char_syms(const struct tokenizer *t, struct enc *x, const char *w, size_t n, size_t *ns,
    char *err)
{
	size_t i, k;
	int32_t id;
	int l;

	for (i = 0; i < n; i += (size_t)l) {
		l = utf8_len_lead((unsigned char)w[i]);
		id = tok_find_text(t, w + i, (size_t)l);
		if (id >= 0 || !t->byte_fallback) {
			if (id < 0 && (id = t->unk) < 0)
				return err_set(err, ERR_UNSUPPORTED, "character U+%04X is not in the "
				    "vocabulary, which has no <unk>", tok_utf8_cp((const unsigned char *)w + i, l));
			/* HF fuse_unk: a run of unknown characters is one <unk> */
			if (id == t->unk && t->fuse_unk && *ns > 0 && x->sym[*ns - 1].id == t->unk)
				continue;
			x->sym[(*ns)++].id = id;
			continue;
		}
		for (k = 0; k < (size_t)l; k++) {
			id = t->byte_tok[(unsigned char)w[i + k]];
			if (id < 0 && (id = t->unk) < 0)
				return err_set(err, ERR_UNSUPPORTED, "byte 0x%02x has no token",
				    (unsigned char)w[i + k]);
			x->sym[(*ns)++].id = id;
		}
	}
	return 0;
}

/* ignore_merges: a word that is a normal token as a whole is taken as it is. */
static int32_t
bpe_whole(const struct tokenizer *t, const char *w, size_t n)
{
	int32_t id;

	if (t->byte_level)
		return tok_smap_get(&t->by_dec, t, 1, w, n);
	id = tok_find_text(t, w, n);
	return id >= 0 && t->e[id].type == TOK_TYPE_NORMAL ? id : -1;
}

/* BPE (HF's BPE::merge_word): apply the best-ranked merge, leftmost first, until none applies. */
static int
bpe_word(const struct tokenizer *t, struct enc *x, const char *w, size_t n, char *err)
{
	size_t i, ns = 0;
	struct hent h;
	struct sym *s;
	int32_t id;
	int rc;

	if (t->ignore_merges && (id = bpe_whole(t, w, n)) >= 0) {
		enc_push(x, id);
		return 0;
	}
	enc_reserve(x, n);
	s = x->sym;
	if (t->byte_level)
		for (ns = 0; ns < n; ns++)
			s[ns].id = t->byte_tok[(unsigned char)w[ns]];
	else if ((rc = bpe_char_syms(t, x, w, n, &ns, err)) != 0)
		return rc;
	link_syms(s, ns);
	for (i = 1; i < ns; i++)
		bpe_try(t, x, (int32_t)i - 1, (int32_t)i);
	while (x->n_heap > 0) {
		heap_pop(x, &h);
		if (s[h.left].id != h.lid || s[h.left].next != h.right || s[h.right].id != h.rid)
			continue;
		s[h.left].id = t->merges.id[tok_pmap_get(&t->merges, h.lid, h.rid)];
		s[h.right].id = -1;
		unlink_sym(s, h.left, h.right);
		bpe_try(t, x, s[h.left].prev, h.left);
		bpe_try(t, x, h.left, s[h.left].next);
	}
	for (i = 0; ns > 0 && (int32_t)i >= 0; i = (size_t)s[i].next)
		enc_push(x, s[i].id);
	return 0;
}

/* Splits s[0..n) by one regex into matches and the gaps between them (HF "Isolated"). */
static int
re_split(const pcre2_code *re, struct enc *x, const char *s, size_t base, size_t n,
    struct ranges *out, char *err)
{
	PCRE2_UCHAR msg[160];
	PCRE2_SIZE *ov;
	size_t pos = 0, at = 0;
	int rc;

	for (;;) {
		rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, x->md, NULL);
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0) {
			pcre2_get_error_message(rc, msg, sizeof msg);
			return err_set(err, ERR_INVAL, "pre-tokenizer regex: %s", (const char *)msg);
		}
		ov = pcre2_get_ovector_pointer(x->md);
		if (ov[1] == ov[0]) {
			/* an empty match splits nothing: look again one character on */
			if (ov[0] >= n)
				break;
			at = ov[0] + (size_t)utf8_len_lead((unsigned char)s[ov[0]]);
			continue;
		}
		if (ov[0] > pos)
			ranges_add(out, base + pos, base + ov[0]);
		ranges_add(out, base + ov[0], base + ov[1]);
		pos = at = ov[1];
	}
	if (pos < n)
		ranges_add(out, base + pos, base + n);
	return 0;
}

/* Runs the pre-tokenizer's regexes in turn, each on the pieces of the one before. */
static int
pre_split(const struct tokenizer *t, struct enc *x, const char *s, size_t n, char *err)
{
	struct ranges tmp;
	size_t i;
	int k, rc;

	x->w.n = 0;
	ranges_add(&x->w, 0, n);
	for (k = 0; k < t->n_re; k++) {
		x->w2.n = 0;
		for (i = 0; i < x->w.n; i += 2) {
			rc = re_split(t->re[k], x, s + x->w.a[i], x->w.a[i],
			    x->w.a[i + 1] - x->w.a[i], &x->w2, err);
			if (rc != 0)
				return rc;
		}
		tmp = x->w;
		x->w = x->w2;
		x->w2 = tmp;
	}
	return 0;
}

/* 1 if the fragment gets the space marker in front. */
static int
wants_prefix(const struct tokenizer *t, const char *s, size_t n, int at_start)
{
	int has = (n > 0 && s[0] == ' ') || (n >= 3 && memcmp(s, SPACE_ESC, 3) == 0);

	switch (t->prefix) {
	case PREFIX_ALWAYS:
		return 1;
	case PREFIX_MISSING:
		return !has;
	case PREFIX_FIRST_MISSING:
		return at_start && !has;
	case PREFIX_NONE:
		break;
	}
	return 0;
}

/* The normalized fragment: the space marker, then spaces escaped if the model wants it. */
static void
normalize(const struct tokenizer *t, struct enc *x, const char *s, size_t n, int at_start)
{
	const char *sp = t->escape_space ? SPACE_ESC : " ";

	x->norm.n = 0;
	if (wants_prefix(t, s, n, at_start))
		tok_buf_put(&x->norm, sp, strlen(sp));
	if (t->escape_space)
		tok_put_escaped(&x->norm, s, n);
	else
		tok_buf_put(&x->norm, s, n);
}

/* Encodes a fragment of plain text (between added tokens). */
static int
encode_fragment(const struct tokenizer *t, struct enc *x, const char *s, size_t n,
    int at_start, char *err)
{
	const char *w;
	size_t i, a, b;
	int rc;

	if (n == 0)
		return 0;
	normalize(t, x, s, n, at_start);
	if ((rc = pre_split(t, x, x->norm.p, x->norm.n, err)) != 0)
		return rc;
	for (i = 0; i < x->w.n; i += 2) {
		a = x->w.a[i];
		b = x->w.a[i + 1];
		w = x->norm.p + a;
		rc = t->merges.key != NULL ? bpe_word(t, x, w, b - a, err) :
		    spm_word(t, x, w, b - a, err);
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* A crude word character for single_word tokens: ASCII alphanumeric, '_' or non-ASCII. */
static int
word_byte(unsigned char c)
{
	return isalnum(c) || c == '_' || c >= 0x80;
}

/* The allowed added token that matches longest at text[pos..), or -1. */
static int32_t
match_added(const struct tokenizer *t, const char *text, size_t len, size_t pos,
    int parse_special, size_t *mlen)
{
	const struct trie *tr = &t->added;
	int32_t node = 0, best = -1, id;
	size_t i;

	for (i = pos; i < len && (node = tok_trie_step(tr, node, (unsigned char)text[i])) >= 0; i++) {
		id = tr->id[node];
		if (id < 0 || (!parse_special && t->e[id].type != TOK_TYPE_USER_DEFINED))
			continue;
		if ((t->e[id].flags & TOKF_SINGLE_WORD) &&
		    ((pos > 0 && word_byte((unsigned char)text[pos - 1])) ||
		    (i + 1 < len && word_byte((unsigned char)text[i + 1]))))
			continue;
		best = id;
		*mlen = i + 1 - pos;
	}
	return best;
}

/*
 * Cuts the text at added tokens, leftmost-longest, and encodes the fragments
 * between them; lstrip/rstrip tokens take the whitespace next to them.
 */
static int
partition(const struct tokenizer *t, struct enc *x, const char *text, size_t len,
    int parse_special, char *err)
{
	size_t pos = 0, seg = 0, mlen = 0, end;
	int32_t id;
	int rc;

	while (t->added.n > 0 && pos < len) {
		if (!t->added.first[(unsigned char)text[pos]] ||
		    (id = match_added(t, text, len, pos, parse_special, &mlen)) < 0) {
			pos++;
			continue;
		}
		end = pos;
		if (t->e[id].flags & TOKF_LSTRIP)
			while (end > seg && isspace((unsigned char)text[end - 1]))
				end--;
		if ((rc = encode_fragment(t, x, text + seg, end - seg, seg == 0, err)) != 0)
			return rc;
		enc_push(x, id);
		pos += mlen;
		if (t->e[id].flags & TOKF_RSTRIP)
			while (pos < len && isspace((unsigned char)text[pos]))
				pos++;
		seg = pos;
	}
	return encode_fragment(t, x, text + seg, len - seg, seg == 0, err);
}

/* Byte offset of the first invalid UTF-8 sequence in s. */
static size_t
utf8_bad_at(const char *s, size_t n)
{
	size_t i = 0;
	int l;

	while (i < n && (l = utf8_seq_len((const unsigned char *)s + i, n - i)) > 0)
		i += (size_t)l;
	return i;
}

/* Frees the scratch state (not the ids, which go to the caller). */
static void
enc_free(struct enc *x)
{
	free(x->sym);
	free(x->heap);
	free(x->esc.p);
	free(x->norm.p);
	free(x->w.a);
	free(x->w2.a);
	if (x->md != NULL)
		pcre2_match_data_free(x->md);
}

int
tok_encode(const struct tokenizer *t, const char *text, size_t len, int parse_special,
    int add_special, int32_t **ids, size_t *n_ids, char *err)
{
	struct enc x;
	int rc = 0;

	if (!utf8_valid(text, len))
		return err_set(err, ERR_INVAL, "text is not valid UTF-8 (at byte %zu)",
		    utf8_bad_at(text, len));
	memset(&x, 0, sizeof x);
	if (t->n_re > 0)
		x.md = pcre2_match_data_create(1, NULL);
	if (add_special && t->add_bos && t->bos >= 0)
		enc_push(&x, t->bos);
	if (len > 0 && t->escape_added) {
		/* SentencePiece matches user-defined pieces in the escaped text */
		tok_put_escaped(&x.esc, text, len);
		rc = partition(t, &x, x.esc.p, x.esc.n, parse_special, err);
	} else if (len > 0)
		rc = partition(t, &x, text, len, parse_special, err);
	if (rc == 0 && add_special && t->add_eos && t->eos >= 0)
		enc_push(&x, t->eos);
	enc_free(&x);
	if (rc != 0) {
		free(x.ids);
		return rc;
	}
	/* never NULL, even for no ids, so that callers may memcpy and free freely */
	*ids = x.ids != NULL ? x.ids : xmalloc(sizeof **ids);
	*n_ids = x.n_ids;
	return 0;
}
