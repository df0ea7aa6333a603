/*
 * resident-model: look inside model files and make random ones.
 *
 *   resident-model shapes
 *   resident-model gen SHAPE OUT [--format gguf|safetensors] [--type T] [--seed N] [--threads N] [--layers N]
 *   resident-model info FILE.gguf [--json]
 *   resident-model show MODEL
 *   resident-model dequant FILE.gguf OUTDIR
 *   resident-model quantize TYPE IN.f32 OUT.bin
 *   resident-model tokenize [--special] [--no-bos] MODEL TEXTFILE
 *   resident-model detokenize [--special] MODEL ID...
 *   resident-model vocab FLAVOUR N SEED OUTDIR
 *   resident-model run MODEL PROMPT [options]
 *   resident-model logits MODEL --out FILE.f32 [--chunk N] [--device cpu|cuda] ID...
 *   resident-model perplexity MODEL TEXTFILE [--chunk N] [--kv-type f16|q8_0]
 */
#include "config.h"
#include "cmds.h"
#include "genmodel.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "tokenizer.h"
#include "util.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmd_shapes(int, char **);
static int cmd_gen(int, char **);
static int cmd_info(int, char **);
static int cmd_show(int, char **);

static const struct {
	const char *name;
	int (*fn)(int, char **);
	const char *usage;
} cmds[] = {
	{ "shapes", cmd_shapes, "shapes" },
	{ "gen", cmd_gen, "gen SHAPE OUT [--format gguf|safetensors] [--type f32|f16|bf16|q8_0|q4_k_m|q5_k_m|mxfp4] "
	    "[--seed N] [--threads N] [--layers N] [--quiet]" },
	{ "info", cmd_info, "info FILE.gguf [--json]" },
	{ "show", cmd_show, "show MODEL (a .gguf file or a Hugging Face directory)" },
	{ "dequant", cmd_dequant, "dequant FILE.gguf OUTDIR" },
	{ "quantize", cmd_quantize, "quantize TYPE IN.f32 OUT.bin" },
	{ "tokenize", cmd_tokenize, "tokenize [--special] [--no-bos] MODEL TEXTFILE" },
	{ "detokenize", cmd_detokenize, "detokenize [--special] MODEL ID..." },
	{ "vocab", cmd_vocab, "vocab FLAVOUR N SEED OUTDIR" },
	{ "run", cmd_run, "run MODEL PROMPT [--chat] [--max-tokens N] [--temp T] [--top-k K] [--top-p P] "
	    "[--min-p P] [--repeat-penalty R] [--seed S] [--stop STR]... [--ids] [--prompt-ids] [--threads N]" },
	{ "logits", cmd_logits, "logits MODEL --out FILE.f32 [--chunk N] [--device cpu|cuda] ID..." },
	{ "perplexity", cmd_perplexity, "perplexity MODEL TEXTFILE [--chunk N] [--kv-type f16|q8_0]" },
};

/* Prints every subcommand's usage. */
static void
usage(FILE *fp)
{
	size_t i;

	fprintf(fp, "usage:\n");
	for (i = 0; i < ARRAY_LEN(cmds); i++)
		fprintf(fp, "  resident-model %s\n", cmds[i].usage);
}

/* Lists the generator's shapes. */
static int
cmd_shapes(int argc, char **argv)
{
	genmodel_list_shapes();
	return 0;
}

/* Writes a random model. */
static int
cmd_gen(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "format", required_argument, NULL, 'f' }, { "type", required_argument, NULL, 't' },
		{ "seed", required_argument, NULL, 's' }, { "threads", required_argument, NULL, 'j' },
		{ "layers", required_argument, NULL, 'l' }, { "quiet", no_argument, NULL, 'q' }, { NULL, 0, NULL, 0 },
	};
	struct genmodel_opts o = { .format = "gguf", .type = "f16", .seed = 1, .verbose = 1 };
	char err[ERR_LEN];
	int c;

	while ((c = getopt_long(argc, argv, "f:t:s:j:l:q", longopts, NULL)) != -1) {
		switch (c) {
		case 'f': o.format = optarg; break;
		case 't': o.type = optarg; break;
		case 's': o.seed = strtoull(optarg, NULL, 0); break;
		case 'j': o.threads = atoi(optarg); break;
		case 'l': o.layers = atoi(optarg); break;
		case 'q': o.verbose = 0; break;
		default: return 2;
		}
	}
	if (argc - optind != 2) {
		fprintf(stderr, "usage: resident-model %s\n", cmds[1].usage);
		return 2;
	}
	o.shape = argv[optind];
	o.out = argv[optind + 1];
	if (genmodel_run(&o, err) != 0) {
		fprintf(stderr, "resident-model gen: %s\n", err);
		return 1;
	}
	return 0;
}

static const char *const vtype_names[] = {
	"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

/* A GGUF string as JSON: a string if it is UTF-8, else {"hex": "..."}. */
static json_t *
json_gstr(struct gguf_str s)
{
	json_t *j = json_stringn(s.s, (size_t)s.n);
	char *hex;
	uint64_t i;

	if (j != NULL)
		return j;
	hex = xmalloc((size_t)s.n * 2 + 1);
	for (i = 0; i < s.n; i++)
		snprintf(hex + 2 * i, 3, "%02x", (uint8_t)s.s[i]);
	j = json_pack("{s:s}", "hex", hex);
	free(hex);
	return j;
}

/* A scalar of type t: integers exactly, floats as doubles. */
static json_t *
json_scalar(enum gguf_vtype t, double f, int64_t i, uint64_t u)
{
	switch (t) {
	case GGUF_F32: case GGUF_F64: return json_real(f);
	case GGUF_BOOL: return json_boolean(i);
	case GGUF_U64: return u > INT64_MAX ? json_real((double)u) : json_integer((json_int_t)u);
	default: return json_integer(i);
	}
}

/* One metadata value as JSON. */
static json_t *
json_kv_value(const struct gguf_file *f, int64_t i)
{
	enum gguf_vtype t = gguf_kv_type(f, i), et;
	json_t *arr;
	uint64_t j, n;

	if (t == GGUF_STRING)
		return json_gstr(gguf_kv_str(f, i));
	if (t != GGUF_ARRAY)
		return json_scalar(t, gguf_kv_f64(f, i), gguf_kv_i64(f, i), gguf_kv_u64(f, i));
	et = gguf_arr_type(f, i);
	n = gguf_arr_n(f, i);
	arr = json_array();
	for (j = 0; j < n; j++) {
		if (et == GGUF_STRING)
			json_array_append_new(arr, json_gstr(gguf_arr_str(f, i, j)));
		else
			json_array_append_new(arr, json_scalar(et, gguf_arr_f64(f, i, j),
			    gguf_arr_i64(f, i, j), (uint64_t)gguf_arr_i64(f, i, j)));
	}
	return arr;
}

/* The whole listing of a GGUF file as one JSON object. */
static json_t *
json_listing(const struct gguf_file *f)
{
	json_t *root = json_object(), *kvs = json_array(), *tensors = json_array(), *shape;
	int64_t i;
	uint32_t d;

	json_object_set_new(root, "version", json_integer(gguf_version(f)));
	json_object_set_new(root, "alignment", json_integer(gguf_alignment(f)));
	json_object_set_new(root, "data_offset", json_integer((json_int_t)gguf_data_offset(f)));
	for (i = 0; i < gguf_n_kv(f); i++) {
		enum gguf_vtype t = gguf_kv_type(f, i);
		json_t *kv = json_object();

		json_object_set_new(kv, "key", json_gstr(gguf_kv_key(f, i)));
		json_object_set_new(kv, "type", json_string(vtype_names[t]));
		if (t == GGUF_ARRAY)
			json_object_set_new(kv, "element_type", json_string(vtype_names[gguf_arr_type(f, i)]));
		json_object_set_new(kv, "value", json_kv_value(f, i));
		json_array_append_new(kvs, kv);
	}
	for (i = 0; i < gguf_n_tensors(f); i++) {
		const struct gguf_tensor *t = gguf_tensor(f, i);

		shape = json_array();
		for (d = 0; d < t->n_dims; d++)
			json_array_append_new(shape, json_integer(t->ne[d]));
		json_array_append_new(tensors, json_pack("{s:o, s:s, s:i, s:o, s:I, s:I}",
		    "name", json_gstr(t->name), "type", quant_traits(t->type)->name, "type_id", (int)t->type,
		    "shape", shape, "offset", (json_int_t)t->offset, "bytes", (json_int_t)t->bytes));
	}
	json_object_set_new(root, "metadata", kvs);
	json_object_set_new(root, "tensors", tensors);
	return root;
}

/* A short human listing: keys (long arrays summarized) and tensors. */
static void
print_listing(const struct gguf_file *f)
{
	int64_t i;
	json_t *v;
	char *s;

	printf("GGUF v%u, %lld keys, %lld tensors, alignment %u\n", gguf_version(f),
	    (long long)gguf_n_kv(f), (long long)gguf_n_tensors(f), gguf_alignment(f));
	for (i = 0; i < gguf_n_kv(f); i++) {
		struct gguf_str k = gguf_kv_key(f, i);

		if (gguf_kv_type(f, i) == GGUF_ARRAY && gguf_arr_n(f, i) > 8) {
			printf("  %-44.*s [%llu x %s]\n", (int)k.n, k.s,
			    (unsigned long long)gguf_arr_n(f, i), vtype_names[gguf_arr_type(f, i)]);
			continue;
		}
		v = json_kv_value(f, i);
		s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
		printf("  %-44.*s %.100s%s\n", (int)k.n, k.s, s ? s : "?", s && strlen(s) > 100 ? "..." : "");
		free(s);
		json_decref(v);
	}
	for (i = 0; i < gguf_n_tensors(f); i++) {
		const struct gguf_tensor *t = gguf_tensor(f, i);

		printf("  %-40.*s %-5s [%lld, %lld, %lld, %lld]\n", (int)t->name.n, t->name.s,
		    quant_traits(t->type)->name, (long long)t->ne[0], (long long)t->ne[1],
		    (long long)t->ne[2], (long long)t->ne[3]);
	}
}

/* Lists a GGUF file's metadata and tensors. */
static int
cmd_info(int argc, char **argv)
{
	struct gguf_file *f;
	char err[ERR_LEN];
	int as_json = argc == 3 && strcmp(argv[2], "--json") == 0;
	json_t *j;

	if (argc != 2 && !as_json) {
		fprintf(stderr, "usage: resident-model %s\n", cmds[2].usage);
		return 2;
	}
	if (gguf_open(argv[1], &f, err) != 0) {
		fprintf(stderr, "resident-model info: %s\n", err);
		return 1;
	}
	if (as_json) {
		j = json_listing(f);
		json_dumpf(j, stdout, JSON_COMPACT | JSON_ENSURE_ASCII);
		putchar('\n');
		json_decref(j);
	} else {
		print_listing(f);
	}
	gguf_close(f);
	return 0;
}

/* Prints what the engine will see of a model. */
static int
cmd_show(int argc, char **argv)
{
	struct model_desc *m;
	const struct model_hparams *hp;
	char err[ERR_LEN];

	if (argc != 2) {
		fprintf(stderr, "usage: resident-model %s\n", cmds[3].usage);
		return 2;
	}
	if (model_open(argv[1], &m, err) != 0) {
		fprintf(stderr, "resident-model show: %s\n", err);
		return 1;
	}
	hp = &m->hp;
	printf("name          %s\narch          %s (%s)\nweights       %.1f MiB in %lld tensors\n",
	    m->name, model_arch_name(m->arch), m->format == MODEL_GGUF ? "gguf" : "safetensors",
	    (double)m->weight_bytes / (1 << 20), (long long)m->n_tensors);
	printf("vocab         %d (%s tokenizer)\nembedding     %d\nlayers        %d\n"
	    "heads         %d (kv %d, size %d)\nfeed-forward  %d\ncontext       %d\n",
	    hp->n_vocab, tok_kind(m->tok) == TOK_SPM ? "sentencepiece" : "byte-level BPE", hp->n_embd,
	    hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_ff, hp->n_ctx_train);
	printf("rope          %s, base %g (local %g), scale %g\nnorm eps      %g\n",
	    hp->rope == ROPE_NORM ? "normal" : "neox", hp->rope_theta, hp->rope_theta_local,
	    hp->rope_scale, hp->norm_eps);
	if (hp->yarn_factor > 0)
		printf("yarn          factor %g of %d tokens, attention factor %g\n", hp->yarn_factor, hp->yarn_orig_ctx,
		    hp->rope_mscale);
	if (hp->sliding_window) {
		int n = 0;

		for (int l = 0; l < hp->n_layer; l++)
			n += model_layer_is_swa(hp, l);
		printf("sliding       window %d on %d of %d layers\n", hp->sliding_window, n, hp->n_layer);
	}
	if (hp->n_expert > 0)
		printf("experts       %d of %d a token, %d rows each, weights %s\n", hp->n_expert_used, hp->n_expert,
		    hp->n_ff_exp, hp->expert_norm ? "renormalised" : "of all");
	printf("chat template %s%s%s\n", chat_tmpl_name(m->chat), m->chat_error ? ": " : "",
	    m->chat_error ? m->chat_error : "");
	model_close(m);
	return 0;
}

int
main(int argc, char **argv)
{
	size_t i;

	if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	for (i = 0; i < ARRAY_LEN(cmds); i++)
		if (strcmp(argv[1], cmds[i].name) == 0)
			return cmds[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "resident-model: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
