/*
 * cmd_tokenize.c: resident-model tokenize, detokenize and vocab. They expose
 * the tokenizer on plain files so that tests/py/test_tokenizer_ids.py can
 * hold it against Hugging Face's and SentencePiece's ids, and a person can
 * see how a model cuts a text.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmds.h"
#include "genvocab.h"
#include "gguf.h"
#include "tokenizer.h"
#include "util.h"

/* A tokenizer with what it was loaded from. */
struct loaded {
	struct gguf_file *f;   /* NULL for a Hugging Face directory */
	struct tokenizer *t;
};

/* Loads the tokenizer of a .gguf file or of a directory holding tokenizer.json. */
static int
load(const char *model, struct loaded *l, char *err)
{
	char json[4096], config[4096];
	struct stat st;
	int rc;

	memset(l, 0, sizeof *l);
	if (stat(model, &st) != 0)
		return err_set(err, ERR_IO, "%s: %s", model, strerror(errno));
	if (S_ISDIR(st.st_mode)) {
		snprintf(json, sizeof json, "%s/tokenizer.json", model);
		snprintf(config, sizeof config, "%s/tokenizer_config.json", model);
		return tok_load_json(json, stat(config, &st) == 0 ? config : NULL, &l->t, err);
	}
	if ((rc = gguf_open(model, &l->f, err)) != 0)
		return rc;
	if ((rc = tok_load_gguf(l->f, &l->t, err)) != 0) {
		gguf_close(l->f);
		l->f = NULL;
	}
	return rc;
}

/* Frees what load made. */
static void
unload(struct loaded *l)
{
	tok_free(l->t);
	if (l->f != NULL)
		gguf_close(l->f);
}

/* Prints ids space-separated on one line. */
static void
print_ids(const int32_t *ids, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		printf("%s%d", i ? " " : "", ids[i]);
	putchar('\n');
}

/*
 * tokenize [--special] [--no-bos] MODEL TEXTFILE: the ids of the file's text.
 * --special parses control token texts; --no-bos adds neither BOS nor EOS.
 */
int
cmd_tokenize(int argc, char **argv)
{
	int special = 0, add = 1, i, rc;
	char err[ERR_LEN], *text;
	struct loaded l;
	int32_t *ids;
	size_t len, n;

	for (i = 1; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
		if (strcmp(argv[i], "--special") == 0)
			special = 1;
		else if (strcmp(argv[i], "--no-bos") == 0)
			add = 0;
		else
			break;
	}
	if (argc - i != 2) {
		fprintf(stderr, "usage: resident-model tokenize [--special] [--no-bos] MODEL TEXTFILE\n");
		return 2;
	}
	if ((rc = load(argv[i], &l, err)) != 0) {
		fprintf(stderr, "resident-model tokenize: %s\n", err);
		return 1;
	}
	if ((rc = read_file(argv[i + 1], &text, &len, err)) == 0) {
		rc = tok_encode(l.t, text, len, special, add, &ids, &n, err);
		free(text);
	}
	if (rc == 0) {
		print_ids(ids, n);
		free(ids);
	} else
		fprintf(stderr, "resident-model tokenize: %s\n", err);
	unload(&l);
	return rc == 0 ? 0 : 1;
}

/* Parses the ids of argv[0..n). */
static int
parse_ids(char **argv, int n, int32_t *ids, char *err)
{
	char *end;
	long v;
	int i;

	for (i = 0; i < n; i++) {
		errno = 0;
		v = strtol(argv[i], &end, 10);
		if (errno != 0 || end == argv[i] || *end != '\0' || v < 0 || v > INT32_MAX)
			return err_set(err, ERR_INVAL, "'%s' is not a token id", argv[i]);
		ids[i] = (int32_t)v;
	}
	return 0;
}

/*
 * detokenize [--special] MODEL ID...: prints the text of the ids exactly,
 * without a newline; --special shows control tokens.
 */
int
cmd_detokenize(int argc, char **argv)
{
	int special = argc > 1 && strcmp(argv[1], "--special") == 0, first = 1 + special, rc;
	char err[ERR_LEN], *text;
	struct loaded l;
	int32_t *ids;
	size_t len;

	if (argc - first < 1) {
		fprintf(stderr, "usage: resident-model detokenize [--special] MODEL ID...\n");
		return 2;
	}
	ids = xcalloc((size_t)argc, sizeof *ids);
	rc = parse_ids(argv + first + 1, argc - first - 1, ids, err);
	if (rc == 0 && (rc = load(argv[first], &l, err)) == 0) {
		rc = tok_decode(l.t, ids, (size_t)(argc - first - 1), special, &text, &len, err);
		unload(&l);
	}
	free(ids);
	if (rc != 0) {
		fprintf(stderr, "resident-model detokenize: %s\n", err);
		return 1;
	}
	fwrite(text, 1, len, stdout);
	free(text);
	return 0;
}

/* Writes the vocabulary alone as a GGUF file with no tensors. */
static int
write_vocab_gguf(const struct genvocab *v, const char *path, char *err)
{
	struct gguf_writer *w = gguf_writer_new();
	int rc;

	gguf_w_str(w, "general.architecture", "none");
	if ((rc = genvocab_write_gguf(v, w, err)) == 0 &&
	    (rc = gguf_writer_begin(w, path, err)) == 0)
		rc = gguf_writer_end(w, err);
	gguf_writer_free(w);
	return rc;
}

/*
 * vocab FLAVOUR N SEED OUTDIR: a generated vocabulary as OUTDIR/tokenizer.json,
 * OUTDIR/tokenizer_config.json and OUTDIR/vocab.gguf.
 */
int
cmd_vocab(int argc, char **argv)
{
	char err[ERR_LEN], path[4096], *end;
	struct genvocab v;
	unsigned long long seed;
	long n;
	int rc;

	if (argc != 5) {
		fprintf(stderr, "usage: resident-model vocab FLAVOUR N SEED OUTDIR\n");
		return 2;
	}
	n = strtol(argv[2], &end, 10);
	if (*end != '\0' || end == argv[2] || n <= 0 || n > INT32_MAX) {
		fprintf(stderr, "resident-model vocab: '%s' is not a vocabulary size\n", argv[2]);
		return 2;
	}
	seed = strtoull(argv[3], &end, 10);
	if (*end != '\0' || end == argv[3]) {
		fprintf(stderr, "resident-model vocab: '%s' is not a seed\n", argv[3]);
		return 2;
	}
	if ((rc = genvocab_make(&v, argv[1], (int32_t)n, seed, err)) == 0) {
		snprintf(path, sizeof path, "%s/vocab.gguf", argv[4]);
		if ((rc = genvocab_write_json(&v, argv[4], err)) == 0)
			rc = write_vocab_gguf(&v, path, err);
		genvocab_free(&v);
	}
	if (rc != 0) {
		fprintf(stderr, "resident-model vocab: %s\n", err);
		return 1;
	}
	return 0;
}
