/*
 * genmodel.c: writes random-weight models of named shapes.
 *
 * Every value is a function of (seed, GGUF tensor name, row, column) only, so
 * the GGUF and safetensors files of one shape and seed hold the same weights
 * and rows can be generated in parallel without changing the output. The
 * quantization plan follows llama.cpp's Q4_K_M, so the files look like the
 * ones users download. Like the real Gemma 3 GGUF, the files carry no chat
 * template: the loader infers the family from the vocabulary's special tokens.
 */
#include "config.h"
#include "genmodel.h"
#include "genvocab.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct gen_shape {
	const char *name;
	enum model_arch arch;
	const char *vocab;   /* genvocab flavour */
	int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx;
	float rope_theta, norm_eps;
	int32_t sliding_window;
	int tied;
	int32_t n_expert, n_expert_used, n_ff_exp; /* no experts: a dense feed-forward */
	float yarn_factor;   /* YaRN over an original context of n_ctx / yarn_factor */
	/* an embedding model: its pooling (sentence-transformers' modules, GGUF pooling_type), whether its
	 * attention is bidirectional, and its two Dense modules' width (n_embd -> dense_ff -> n_embd; 0: none) */
	enum pool_kind pool;
	int bidir;
	int32_t dense_ff;
};

static const struct gen_shape shapes[] = {
	{ "tiny", ARCH_LLAMA, "llama3", 1024, 256, 2, 4, 2, 64, 512, 2048, 500000, 1e-5f, 0, 0, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	{ "tiny-qwen2", ARCH_QWEN2, "qwen2", 1024, 256, 2, 4, 2, 64, 512, 2048, 1e6f, 1e-6f, 0, 1, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	{ "tiny-qwen3", ARCH_QWEN3, "qwen2", 1024, 256, 2, 4, 2, 64, 512, 2048, 1e6f, 1e-6f, 0, 1, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	{ "tiny-gemma3", ARCH_GEMMA3, "gemma", 1024, 256, 6, 4, 1, 64, 512, 2048, 1e6f, 1e-6f, 16, 1, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	/*
	 * Every layer slides (Gemma 3 makes one in 6 global), so that a prompt costs the same per
	 * token at any length; the large vocabulary makes a generated token (its logits) cost
	 * several times a prompt token, as in real models.
	 */
	{ "tiny-swa", ARCH_GEMMA3, "gemma", 65536, 256, 2, 4, 1, 64, 256, 65536, 1e6f, 1e-6f, 64, 1, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	{ "llama3-1b", ARCH_LLAMA, "llama3", 128256, 2048, 16, 32, 8, 64, 8192, 131072, 500000, 1e-5f, 0, 1, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	{ "llama3-8b", ARCH_LLAMA, "llama3", 128256, 4096, 32, 32, 8, 128, 14336, 131072, 500000, 1e-5f, 0, 0, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	{ "qwen2-0.5b", ARCH_QWEN2, "qwen2", 151936, 896, 24, 14, 2, 64, 4864, 32768, 1e6f, 1e-6f, 0, 1, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	{ "qwen3-0.6b", ARCH_QWEN3, "qwen2", 151936, 1024, 28, 16, 8, 128, 3072, 40960, 1e6f, 1e-6f, 0, 1, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	{ "gemma3-270m", ARCH_GEMMA3, "gemma", 262144, 640, 18, 4, 1, 256, 2048, 32768, 1e6f, 1e-6f, 512, 1, 0, 0, 0, 0,
	    POOL_NONE, 0, 0 },
	/* mixtures of experts: small ones for tests, and the shapes of the models people run */
	{ "tiny-qwen3moe", ARCH_QWEN3MOE, "qwen3", 1024, 256, 2, 4, 2, 64, 512, 2048, 1e6f, 1e-6f, 0, 0, 8, 2, 128, 0,
	    POOL_NONE, 0, 0 },
	{ "tiny-mixtral", ARCH_LLAMA, "llama", 1024, 256, 2, 4, 2, 64, 512, 2048, 1e6f, 1e-5f, 0, 0, 4, 2, 512, 0,
	    POOL_NONE, 0, 0 },
	{ "tiny-gptoss", ARCH_GPTOSS, "harmony", 1024, 256, 2, 4, 2, 64, 256, 131072, 150000, 1e-5f, 16, 0, 8, 2,
	    256, 32, POOL_NONE, 0, 0 },
	{ "qwen3-30b-a3b", ARCH_QWEN3MOE, "qwen3", 151936, 2048, 48, 32, 4, 128, 6144, 40960, 1e6f, 1e-6f, 0, 0, 128,
	    8, 768, 0, POOL_NONE, 0, 0 },
	{ "gpt-oss-20b", ARCH_GPTOSS, "harmony", 201088, 2880, 24, 64, 8, 64, 2880, 131072, 150000, 1e-5f, 128, 0, 32,
	    4, 2880, 32, POOL_NONE, 0, 0 },
	{ "mixtral-8x1b", ARCH_LLAMA, "llama", 32000, 2048, 16, 32, 8, 64, 4096, 32768, 1e6f, 1e-5f, 0, 0, 8, 2, 4096,
	    0, POOL_NONE, 0, 0 },
	/* embedding models: Qwen3-Embedding's last-token pooling, EmbeddingGemma's bidirectional attention,
	 * mean pooling and Dense modules (a window shorter than a test's inputs) */
	{ "tiny-qwen3-embed", ARCH_QWEN3, "qwen2", 1024, 256, 2, 4, 2, 64, 512, 2048, 1e6f, 1e-6f, 0, 1, 0, 0, 0, 0,
	    POOL_LAST, 0, 0 },
	{ "tiny-gemma3-embed", ARCH_GEMMA3, "gemma", 1024, 256, 6, 4, 1, 64, 512, 1024, 1e6f, 1e-6f, 16, 1, 0, 0, 0, 0,
	    POOL_MEAN, 1, 1024 },
};

/* What a tensor holds decides how its values are drawn, and routers stay float as llama.cpp keeps them. */
enum gen_kind { K_EMBD, K_LINEAR, K_OUT, K_NORM, K_BIAS, K_ROUTER };

struct gen_tensor {
	char name[96];
	enum gen_kind kind;
	int n_dims;
	int64_t ne[3];      /* ne[2]: the experts of a stacked expert tensor, else 1 */
	int layer;          /* -1 for global tensors */
	int permute_heads;  /* GGUF llama Q/K: rows permuted for ROPE_NORM; the head count */
	uint32_t type;
};

enum gen_type { G_F32, G_F16, G_BF16, G_Q8_0, G_Q4_K_M, G_Q5_K_M, G_MXFP4 };

static const struct { const char *name; enum gen_type t; uint32_t file_type; } gen_types[] = {
	{ "f32", G_F32, 0 }, { "f16", G_F16, 1 }, { "bf16", G_BF16, 32 },
	{ "q8_0", G_Q8_0, 7 }, { "q4_k_m", G_Q4_K_M, 15 }, { "q5_k_m", G_Q5_K_M, 17 }, { "mxfp4", G_MXFP4, 38 },
};

void
genmodel_list_shapes(void)
{
	size_t i;

	for (i = 0; i < ARRAY_LEN(shapes); i++) {
		const struct gen_shape *s = &shapes[i];

		printf("%-13s %-8s vocab %6d  embd %5d  layers %2d  heads %2d/%d  ff %5d", s->name,
		    model_arch_name(s->arch), s->n_vocab, s->n_embd, s->n_layer, s->n_head,
		    s->n_head_kv, s->n_expert ? s->n_ff_exp : s->n_ff);
		if (s->n_expert)
			printf("  experts %d of %d", s->n_expert_used, s->n_expert);
		if (s->pool != POOL_NONE)
			printf("  embedding%s%s", s->bidir ? ", bidirectional" : "", s->dense_ff ? ", dense" : "");
		printf("\n");
	}
}

/* ---- values ---- */

/* splitmix64: a well-mixed 64-bit step, for seeding. */
static uint64_t
mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* FNV-1a of a tensor name. */
static uint64_t
name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	while (*s)
		h = (h ^ (uint8_t)*s++) * 1099511628211ull;
	return h;
}

/* Row index of the Hugging Face layout that GGUF llama row r holds (convert_hf_to_gguf's permute). */
static int64_t
hf_row(const struct gen_tensor *t, int64_t r)
{
	int64_t hd, h, rem;

	if (t->permute_heads == 0)
		return r;
	hd = t->ne[1] / t->permute_heads;
	h = r / hd;
	rem = r % hd;
	return h * hd + (rem % 2) * (hd / 2) + rem / 2;
}

/*
 * Fills one row (in the Hugging Face layout's numbering) with values in
 * [-a, a): a keeps activations near unit scale through random layers.
 */
static void
fill_row(const struct gen_tensor *t, const struct gen_shape *s, uint64_t seed, int64_t row,
    int gguf_norm, float *dst)
{
	uint64_t x = mix64(seed ^ mix64(name_hash(t->name) + (uint64_t)row));
	float a, base = 0;
	int64_t i;

	switch (t->kind) {
	case K_EMBD:
		a = s->arch == ARCH_GEMMA3 ? sqrtf(3.0f / (float)s->n_embd) : 1.0f;
		break;
	case K_LINEAR:
		a = sqrtf(3.0f / (float)t->ne[0]);
		break;
	case K_OUT:
		/*
		 * a layer's products into the residual stream, scaled down by sqrt(2 layers):
		 * at full scale each of gpt-oss-20b's layers added about as much as the stream
		 * held, a token's rounding grew ~20-fold through its 24 layers, and any two
		 * implementations' logits parted by 27-33 % (tests/bench/RESULTS.md)
		 */
		a = sqrtf(3.0f / (float)t->ne[0]) / sqrtf(2.0f * (float)s->n_layer);
		break;
	case K_ROUTER:
		/* logits of sd 4, not 1: trained routers choose clearly, and near ties would make
		 * any two implementations (or quantizations) route some tokens differently */
		a = 4.0f * sqrtf(3.0f / (float)t->ne[0]);
		break;
	case K_NORM:
		a = 0.1f;
		/* gemma stores w and computes 1 + w; GGUF stores 1 + w (as convert_hf_to_gguf) */
		base = s->arch == ARCH_GEMMA3 && !gguf_norm ? 0.0f : 1.0f;
		break;
	default:
		a = 0.1f;
		break;
	}
	for (i = 0; i < t->ne[0]; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		dst[i] = base + a * ((float)(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
	}
}

/* ---- tensor list ---- */

/* Adds a tensor to the list (ne2 > 1: one matrix per expert, stacked). */
static struct gen_tensor *
add_tensor3(struct gen_tensor *ts, int *n, const char *name, enum gen_kind k, int64_t ne0,
    int64_t ne1, int64_t ne2, int layer)
{
	struct gen_tensor *t = &ts[(*n)++];

	memset(t, 0, sizeof *t);
	snprintf(t->name, sizeof t->name, "%s", name);
	t->kind = k;
	t->ne[0] = ne0;
	t->ne[1] = ne1;
	t->ne[2] = ne2;
	t->n_dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
	t->layer = layer;
	return t;
}

static struct gen_tensor *
add_tensor(struct gen_tensor *ts, int *n, const char *name, enum gen_kind k, int64_t ne0,
    int64_t ne1, int layer)
{
	return add_tensor3(ts, n, name, k, ne0, ne1, 1, layer);
}

/* Rows of a tensor, every expert's. */
static int64_t
gen_rows(const struct gen_tensor *t)
{
	return t->ne[1] * t->ne[2];
}

/* Layer l's router and experts, named as llama.cpp's converter names them. */
static void
add_experts(struct gen_tensor *ts, int *n, const struct gen_shape *s, int l)
{
	int64_t E = s->n_expert, F = s->n_ff_exp, D = s->n_embd;
	char b[96];

#define T(suffix, kind, a, c, e) (snprintf(b, sizeof b, "blk.%d.%s", l, suffix), add_tensor3(ts, n, b, kind, a, c, e, l))
	T("ffn_gate_inp.weight", K_ROUTER, D, E, 1);
	T("ffn_gate_exps.weight", K_LINEAR, D, F, E);
	T("ffn_up_exps.weight", K_LINEAR, D, F, E);
	T("ffn_down_exps.weight", s->arch == ARCH_GPTOSS ? K_OUT : K_LINEAR, F, D, E);
	if (s->arch == ARCH_GPTOSS) {
		T("ffn_gate_inp.bias", K_BIAS, E, 1, 1);
		T("ffn_gate_exps.bias", K_BIAS, F, E, 1);
		T("ffn_up_exps.bias", K_BIAS, F, E, 1);
		T("ffn_down_exps.bias", K_BIAS, D, E, 1);
	}
#undef T
}

/* Adds the weights of layer l. */
static void
add_layer(struct gen_tensor *ts, int *n, const struct gen_shape *s, int l, int gguf)
{
	int64_t q = (int64_t)s->n_head * s->head_dim, kv = (int64_t)s->n_head_kv * s->head_dim;
	int permute = gguf && s->arch == ARCH_LLAMA;
	char b[96];

#define T(suffix, kind, a, c) (snprintf(b, sizeof b, "blk.%d.%s", l, suffix), add_tensor(ts, n, b, kind, a, c, l))
	T("attn_norm.weight", K_NORM, s->n_embd, 1);
	T("attn_q.weight", K_LINEAR, s->n_embd, q)->permute_heads = permute ? s->n_head : 0;
	T("attn_k.weight", K_LINEAR, s->n_embd, kv)->permute_heads = permute ? s->n_head_kv : 0;
	T("attn_v.weight", K_LINEAR, s->n_embd, kv);
	T("attn_output.weight", s->arch == ARCH_GPTOSS ? K_OUT : K_LINEAR, q, s->n_embd);
	if (s->arch == ARCH_QWEN2 || s->arch == ARCH_GPTOSS) {
		T("attn_q.bias", K_BIAS, q, 1);
		T("attn_k.bias", K_BIAS, kv, 1);
		T("attn_v.bias", K_BIAS, kv, 1);
	}
	if (s->arch == ARCH_GPTOSS) {
		T("attn_output.bias", K_BIAS, s->n_embd, 1);
		T("attn_sinks.weight", K_BIAS, s->n_head, 1);
	}
	if (s->arch == ARCH_QWEN3 || s->arch == ARCH_GEMMA3 || s->arch == ARCH_QWEN3MOE) {
		T("attn_q_norm.weight", K_NORM, s->head_dim, 1);
		T("attn_k_norm.weight", K_NORM, s->head_dim, 1);
	}
	if (s->arch == ARCH_GEMMA3)
		T("post_attention_norm.weight", K_NORM, s->n_embd, 1);
	/* gpt-oss's GGUF keeps the Hugging Face name of the FFN's norm */
	T(s->arch == ARCH_GPTOSS ? "post_attention_norm.weight" : "ffn_norm.weight", K_NORM, s->n_embd, 1);
	if (s->n_expert > 0) {
		add_experts(ts, n, s, l);
	} else {
		T("ffn_gate.weight", K_LINEAR, s->n_embd, s->n_ff);
		T("ffn_up.weight", K_LINEAR, s->n_embd, s->n_ff);
		T("ffn_down.weight", K_LINEAR, s->n_ff, s->n_embd);
	}
	if (s->arch == ARCH_GEMMA3)
		T("post_ffw_norm.weight", K_NORM, s->n_embd, 1);
#undef T
}

/* llama.cpp's use_more_bits: the layers Q4_K_M gives Q6_K. */
static int
more_bits(int i, int n)
{
	return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* llama.cpp's Q4_K_M choice for an attention tensor of a model with experts (8 of them: Mixtral's). */
static uint32_t
moe_attn_type(const struct gen_tensor *t, const struct gen_shape *s, uint32_t type)
{
	if (s->n_expert != 8)
		return type;
	if (strstr(t->name, "attn_v.weight") || strstr(t->name, "attn_k.weight"))
		return TT_Q8_0;
	return strstr(t->name, "attn_output.weight") ? TT_Q5_K : type;
}

/*
 * The storage type of a tensor under a plan: llama.cpp's choices for
 * Q4_K_M and Q5_K_M (Q5_K where Q4_K_M has Q4_K), and for MXFP4_MOE
 * (experts MXFP4, the other matrices Q8_0). The routers and every vector
 * stay F32, as llama.cpp keeps them.
 */
static uint32_t
plan_type(const struct gen_tensor *t, const struct gen_shape *s, enum gen_type g)
{
	static const uint32_t dense[] = { [G_F32] = TT_F32, [G_F16] = TT_F16, [G_BF16] = TT_BF16,
		[G_Q8_0] = TT_Q8_0 };
	uint32_t type = g == G_Q5_K_M ? TT_Q5_K : TT_Q4_K;

	if (t->n_dims == 1 || t->kind == K_BIAS || (t->kind == K_ROUTER && g > G_BF16))
		return TT_F32;
	if (g == G_MXFP4)
		return t->ne[2] > 1 ? TT_MXFP4 : TT_Q8_0;
	if (g != G_Q4_K_M && g != G_Q5_K_M)
		return dense[g];
	if (strcmp(t->name, "output.weight") == 0 || (s->tied && t->kind == K_EMBD))
		type = TT_Q6_K;
	else if ((strstr(t->name, "attn_v.weight") || strstr(t->name, "ffn_down")) &&
	    more_bits(t->layer, s->n_layer))
		type = TT_Q6_K;
	type = moe_attn_type(t, s, type);
	/* rows that K-quant blocks do not divide fall back as llama.cpp does (Q5_K to Q5_0, not its Q5_1) */
	if (t->ne[0] % QK_K != 0 && type != TT_Q8_0)
		type = type == TT_Q6_K ? TT_Q8_0 : TT_Q5_0;
	return type;
}

/* The whole tensor list of a shape. Returns the count; ts has room for all. */
static int
build_tensors(struct gen_tensor *ts, const struct gen_shape *s, enum gen_type g, int gguf)
{
	int n = 0, l, i;

	add_tensor(ts, &n, "token_embd.weight", K_EMBD, s->n_embd, s->n_vocab, -1);
	for (l = 0; l < s->n_layer; l++)
		add_layer(ts, &n, s, l, gguf);
	add_tensor(ts, &n, "output_norm.weight", K_NORM, s->n_embd, 1, -1);
	if (!s->tied)
		add_tensor(ts, &n, "output.weight", K_LINEAR, s->n_embd, s->n_vocab, -1);
	/* llama.cpp's names of EmbeddingGemma's 2_Dense and 3_Dense */
	if (s->dense_ff > 0) {
		add_tensor(ts, &n, "dense_2.weight", K_LINEAR, s->n_embd, s->dense_ff, -1);
		add_tensor(ts, &n, "dense_3.weight", K_LINEAR, s->dense_ff, s->n_embd, -1);
	}
	for (i = 0; i < n; i++)
		ts[i].type = plan_type(&ts[i], s, g);
	return n;
}

/* ---- parallel generation ---- */

struct gen_job {
	const struct gen_tensor *t;
	const struct gen_shape *s;
	uint64_t seed;
	int gguf;
	uint8_t *out;
	size_t row_bytes;
	atomic_llong next_row;
	atomic_int failed;
};

#define ROWS_PER_TAKE 64

/* A worker: takes rows until none are left, draws and quantizes them. */
static void *
gen_worker(void *arg)
{
	struct gen_job *j = arg;
	float *row = xmalloc((size_t)j->t->ne[0] * sizeof *row);
	long long r0, r;

	while ((r0 = atomic_fetch_add(&j->next_row, ROWS_PER_TAKE)) < gen_rows(j->t)) {
		for (r = r0; r < r0 + ROWS_PER_TAKE && r < gen_rows(j->t); r++) {
			fill_row(j->t, j->s, j->seed, j->gguf ? hf_row(j->t, r) : r, j->gguf, row);
			if (quant_quantize(j->t->type, row, j->out + (size_t)r * j->row_bytes, j->t->ne[0]) != 0)
				atomic_store(&j->failed, 1);
		}
	}
	free(row);
	return NULL;
}

/* Draws and stores a whole tensor into a malloc'd buffer of *bytes. */
static int
gen_tensor_data(const struct gen_tensor *t, const struct gen_shape *s, uint64_t seed, int gguf,
    int threads, uint8_t **data, size_t *bytes, char *err)
{
	struct gen_job j = { .t = t, .s = s, .seed = seed, .gguf = gguf };
	pthread_t tid[64];
	int i, n = MIN(threads, (int)ARRAY_LEN(tid));

	if (quant_row_bytes(t->type, t->ne[0], &j.row_bytes) != 0)
		return err_set(err, ERR_INVAL, "%s: rows of %lld cannot be type %s", t->name,
		    (long long)t->ne[0], quant_traits(t->type)->name);
	*bytes = j.row_bytes * (size_t)gen_rows(t);
	j.out = *data = xmalloc(*bytes);
	atomic_init(&j.next_row, 0);
	atomic_init(&j.failed, 0);
	for (i = 0; i < n; i++)
		if (pthread_create(&tid[i], NULL, gen_worker, &j) != 0)
			fatal("pthread_create failed");
	for (i = 0; i < n; i++)
		pthread_join(tid[i], NULL);
	if (atomic_load(&j.failed)) {
		free(*data);
		return err_set(err, ERR_UNSUPPORTED, "%s: cannot quantize to %s", t->name,
		    quant_traits(t->type)->name);
	}
	return 0;
}

/* ---- GGUF ---- */

/* The GGUF architecture: llama.cpp's gemma-embedding for a bidirectional Gemma 3. */
static const char *
gguf_arch(const struct gen_shape *s)
{
	return s->bidir ? "gemma-embedding" : model_arch_name(s->arch);
}

/* Writes "<arch>.<key>". */
static void
w_hp_u32(struct gguf_writer *w, const struct gen_shape *s, const char *key, uint32_t v)
{
	char full[128];

	snprintf(full, sizeof full, "%s.%s", gguf_arch(s), key);
	gguf_w_u32(w, full, v);
}

static void
w_hp_f32(struct gguf_writer *w, const struct gen_shape *s, const char *key, float v)
{
	char full[128];

	snprintf(full, sizeof full, "%s.%s", gguf_arch(s), key);
	gguf_w_f32(w, full, v);
}

/* Metadata keys of a GGUF model. */
static void
gguf_metadata(struct gguf_writer *w, const struct gen_shape *s, uint32_t file_type)
{
	char name[96];

	snprintf(name, sizeof name, "resident random %s", s->name);
	gguf_w_str(w, "general.architecture", gguf_arch(s));
	gguf_w_str(w, "general.name", name);
	gguf_w_u32(w, "general.file_type", file_type);
	gguf_w_u32(w, "general.quantization_version", 2);
	w_hp_u32(w, s, "context_length", (uint32_t)s->n_ctx);
	w_hp_u32(w, s, "embedding_length", (uint32_t)s->n_embd);
	w_hp_u32(w, s, "block_count", (uint32_t)s->n_layer);
	w_hp_u32(w, s, "feed_forward_length", (uint32_t)s->n_ff);
	w_hp_u32(w, s, "attention.head_count", (uint32_t)s->n_head);
	w_hp_u32(w, s, "attention.head_count_kv", (uint32_t)s->n_head_kv);
	w_hp_u32(w, s, "attention.key_length", (uint32_t)s->head_dim);
	w_hp_u32(w, s, "attention.value_length", (uint32_t)s->head_dim);
	w_hp_f32(w, s, "attention.layer_norm_rms_epsilon", s->norm_eps);
	w_hp_f32(w, s, "rope.freq_base", s->rope_theta);
	w_hp_u32(w, s, "rope.dimension_count", (uint32_t)s->head_dim);
	if (s->sliding_window > 0)
		w_hp_u32(w, s, "attention.sliding_window", (uint32_t)s->sliding_window);
	if (s->pool != POOL_NONE)
		w_hp_u32(w, s, "pooling_type", (uint32_t)s->pool);
	if (s->dense_ff > 0) {
		w_hp_u32(w, s, "dense_2_feat_in", (uint32_t)s->n_embd);
		w_hp_u32(w, s, "dense_2_feat_out", (uint32_t)s->dense_ff);
		w_hp_u32(w, s, "dense_3_feat_in", (uint32_t)s->dense_ff);
		w_hp_u32(w, s, "dense_3_feat_out", (uint32_t)s->n_embd);
	}
	if (s->n_expert > 0) {
		w_hp_u32(w, s, "expert_count", (uint32_t)s->n_expert);
		w_hp_u32(w, s, "expert_used_count", (uint32_t)s->n_expert_used);
		if (s->arch != ARCH_LLAMA)
			w_hp_u32(w, s, "expert_feed_forward_length", (uint32_t)s->n_ff_exp);
	}
	if (s->yarn_factor > 0) {
		char key[128];

		snprintf(key, sizeof key, "%s.rope.scaling.type", model_arch_name(s->arch));
		gguf_w_str(w, key, "yarn");
		w_hp_f32(w, s, "rope.scaling.factor", s->yarn_factor);
		w_hp_u32(w, s, "rope.scaling.original_context_length", (uint32_t)(s->n_ctx / s->yarn_factor));
	}
}

/* Writes the model as one GGUF file. */
static int
write_gguf(const struct genmodel_opts *o, const struct gen_shape *s, const struct genvocab *v,
    uint32_t file_type, struct gen_tensor *ts, int n, int threads, char *err)
{
	struct gguf_writer *w = gguf_writer_new();
	uint8_t *data;
	size_t bytes;
	int i, rc = 0;

	gguf_metadata(w, s, file_type);
	if ((rc = genvocab_write_gguf(v, w, err)) != 0)
		goto out;
	for (i = 0; i < n && rc == 0; i++)
		rc = gguf_w_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne, err);
	if (rc != 0 || (rc = gguf_writer_begin(w, o->out, err)) != 0)
		goto out;
	for (i = 0; i < n && rc == 0; i++) {
		if (o->verbose)
			fprintf(stderr, "\r[%3d/%3d] %-32s %-5s", i + 1, n, ts[i].name,
			    quant_traits(ts[i].type)->name);
		if ((rc = gen_tensor_data(&ts[i], s, o->seed, 1, threads, &data, &bytes, err)) != 0)
			break;
		rc = gguf_writer_data(w, data, bytes, err);
		free(data);
	}
	if (o->verbose)
		fputc('\n', stderr);
	if (rc == 0)
		rc = gguf_writer_end(w, err);
out:
	gguf_writer_free(w);
	return rc;
}

/* ---- safetensors ---- */

/* The config.json fields of a model with experts, as its transformers class names them. */
static void
config_moe(json_t *c, const struct gen_shape *s)
{
	json_t *types, *rope;

	if (s->n_expert == 0)
		return;
	json_object_set_new(c, s->arch == ARCH_QWEN3MOE ? "num_experts" : "num_local_experts",
	    json_integer(s->n_expert));
	json_object_set_new(c, "num_experts_per_tok", json_integer(s->n_expert_used));
	if (s->arch == ARCH_QWEN3MOE) {
		json_object_set_new(c, "moe_intermediate_size", json_integer(s->n_ff_exp));
		json_object_set_new(c, "norm_topk_prob", json_true());
	} else {
		json_object_set_new(c, "intermediate_size", json_integer(s->n_ff_exp));
	}
	if (s->arch != ARCH_GPTOSS)
		return;
	json_object_set_new(c, "attention_bias", json_true());
	json_object_set_new(c, "sliding_window", json_integer(s->sliding_window));
	types = json_array();
	for (int l = 0; l < s->n_layer; l++)
		json_array_append_new(types, json_string(l % 2 == 0 ? "sliding_attention" : "full_attention"));
	json_object_set_new(c, "layer_types", types);
	rope = json_object();
	json_object_set_new(rope, "rope_type", json_string("yarn"));
	json_object_set_new(rope, "factor", json_real(s->yarn_factor));
	json_object_set_new(rope, "original_max_position_embeddings", json_integer((json_int_t)(s->n_ctx / s->yarn_factor)));
	json_object_set_new(rope, "beta_fast", json_real(32.0));
	json_object_set_new(rope, "beta_slow", json_real(1.0));
	/* the published config's: llama.cpp truncates, so a GGUF twin differs a little */
	json_object_set_new(rope, "truncate", json_false());
	json_object_set_new(c, "rope_scaling", rope);
}

/* config.json of a Hugging Face model directory. */
static int
write_config(const char *dir, const struct gen_shape *s, const char *dtype, char *err)
{
	static const char *const model_type[] = { [ARCH_LLAMA] = "llama", [ARCH_QWEN2] = "qwen2",
		[ARCH_QWEN3] = "qwen3", [ARCH_GEMMA3] = "gemma3_text", [ARCH_QWEN3MOE] = "qwen3_moe",
		[ARCH_GPTOSS] = "gpt_oss" };
	char path[4096];
	json_t *c = json_object();
	int rc = 0;

	json_object_set_new(c, "model_type", json_string(s->arch == ARCH_LLAMA && s->n_expert > 0 ? "mixtral" :
	    model_type[s->arch]));
	json_object_set_new(c, "vocab_size", json_integer(s->n_vocab));
	json_object_set_new(c, "hidden_size", json_integer(s->n_embd));
	json_object_set_new(c, "num_hidden_layers", json_integer(s->n_layer));
	json_object_set_new(c, "num_attention_heads", json_integer(s->n_head));
	json_object_set_new(c, "num_key_value_heads", json_integer(s->n_head_kv));
	json_object_set_new(c, "head_dim", json_integer(s->head_dim));
	json_object_set_new(c, "intermediate_size", json_integer(s->n_ff));
	json_object_set_new(c, "max_position_embeddings", json_integer(s->n_ctx));
	json_object_set_new(c, "rms_norm_eps", json_real(s->norm_eps));
	json_object_set_new(c, "rope_theta", json_real(s->rope_theta));
	json_object_set_new(c, "tie_word_embeddings", json_boolean(s->tied));
	json_object_set_new(c, "torch_dtype", json_string(strcmp(dtype, "f32") == 0 ? "float32" :
	    strcmp(dtype, "f16") == 0 ? "float16" : "bfloat16"));
	json_object_set_new(c, s->arch == ARCH_GEMMA3 ? "hidden_activation" : "hidden_act",
	    json_string(s->arch == ARCH_GEMMA3 ? "gelu_pytorch_tanh" : "silu"));
	if (s->arch == ARCH_LLAMA)
		json_object_set_new(c, "attention_bias", json_false());
	config_moe(c, s);
	if (s->bidir)
		json_object_set_new(c, "use_bidirectional_attention", json_true());
	if (s->arch == ARCH_GEMMA3) {
		json_object_set_new(c, "sliding_window", json_integer(s->sliding_window));
		json_object_set_new(c, "sliding_window_pattern", json_integer(6));
		json_object_set_new(c, "rope_local_base_freq", json_real(10000.0));
		json_object_set_new(c, "query_pre_attn_scalar", json_integer(s->head_dim));
	}
	snprintf(path, sizeof path, "%s/config.json", dir);
	if (json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
		rc = err_set(err, ERR_IO, "%s: cannot write", path);
	json_decref(c);
	return rc;
}

/*
 * gpt-oss's fused layout of a layer's gate and up, as x @ W: [E, H, 2I]
 * with gate and up interleaved, and its bias [E, 2I]; from the two
 * tensors' GGUF-layout data (rows of H, or of I for the biases; es bytes
 * an element). The inverse of convert_gptoss_experts.
 */
static uint8_t *
fuse_gate_up(const uint8_t *g, const uint8_t *u, int64_t E, int64_t I, int64_t H, size_t es)
{
	uint8_t *f = xmalloc((size_t)(E * H * 2 * I) * es);

	for (int64_t e = 0; e < E; e++)
		for (int64_t i = 0; i < I; i++)
			for (int64_t h = 0; h < H; h++) {
				size_t src = (size_t)((e * I + i) * H + h) * es, dst = (size_t)((e * H + h) * 2 * I + 2 * i) * es;

				memcpy(f + dst, g + src, es);
				memcpy(f + dst + es, u + src, es);
			}
	return f;
}

/* Each of E matrices of R rows of C elements transposed (gpt-oss's down_proj: [E, I, H] from [E, H, I]). */
static uint8_t *
transpose_experts(const uint8_t *a, int64_t E, int64_t R, int64_t C, size_t es)
{
	uint8_t *t = xmalloc((size_t)(E * R * C) * es);

	for (int64_t e = 0; e < E; e++)
		for (int64_t r = 0; r < R; r++)
			for (int64_t c = 0; c < C; c++)
				memcpy(t + (size_t)((e * C + c) * R + r) * es, a + (size_t)((e * R + r) * C + c) * es, es);
	return t;
}

/* A tensor of the HF layout under its Hugging Face name. */
static int
st_put(struct st_writer *w, const struct gen_shape *s, const char *gguf_name, uint32_t type, int n_dims,
    const int64_t *ne, const void *data, size_t bytes, char *err)
{
	char *hf = model_name_to_hf(gguf_name, s->arch);
	int rc;

	if (hf == NULL)
		return err_set(err, ERR_INVAL, "%s has no Hugging Face name", gguf_name);
	rc = st_w_tensor(w, hf, type, n_dims, ne, data, bytes, err);
	free(hf);
	return rc;
}

/* A stacked expert tensor as one tensor per expert (Qwen3-MoE's and Mixtral's checkpoints). */
static int
st_per_expert(struct st_writer *w, const struct gen_shape *s, const struct gen_tensor *t, const uint8_t *data,
    size_t bytes, char *err)
{
	char name[128], proj[32];
	size_t each = bytes / (size_t)t->ne[2];
	int rc = 0, layer;

	if (sscanf(t->name, "blk.%d.ffn_%31[a-z]_exps.weight", &layer, proj) != 2)
		return err_set(err, ERR_INVAL, "%s: not an expert tensor", t->name);
	for (int64_t e = 0; e < t->ne[2] && rc == 0; e++) {
		snprintf(name, sizeof name, "blk.%d.ffn_%s.%lld.weight", layer, proj, (long long)e);
		rc = st_put(w, s, name, t->type, 2, t->ne, data + (size_t)e * each, each, err);
	}
	return rc;
}

/* gpt-oss's layer l experts, fused and transposed as its checkpoints hold them; gu: gate, up, gate bias, up bias. */
static int
st_gptoss_experts(struct st_writer *w, const struct gen_shape *s, int l, uint8_t *const *gu, uint32_t type, char *err)
{
	int64_t E = s->n_expert, I = s->n_ff_exp, H = s->n_embd;
	size_t es = (size_t)quant_traits(type)->block_bytes;
	uint8_t *f = fuse_gate_up(gu[0], gu[1], E, I, H, es);
	uint8_t *fb = fuse_gate_up(gu[2], gu[3], 1, E * I, 1, 4);
	char name[128];
	int rc;

	/* the biases interleave along each expert's 2I: as one expert of E * I rows of one element */
	snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
	rc = st_w_tensor(w, name, type, 3, (int64_t[]){ 2 * I, H, E }, f, (size_t)(E * H * 2 * I) * es, err);
	snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
	if (rc == 0)
		rc = st_w_tensor(w, name, TT_F32, 2, (int64_t[]){ 2 * I, E }, fb, (size_t)(E * 2 * I) * 4, err);
	free(f), free(fb);
	return rc;
}

/* Writes JSON into dir/sub/name (sub made); takes the reference. */
static int
write_json(const char *dir, const char *sub, const char *name, json_t *j, char *err)
{
	char path[4096];
	int rc = 0;

	snprintf(path, sizeof path, "%s/%s", dir, sub);
	if (sub[0] != '\0' && mkdir(path, 0755) != 0 && errno != EEXIST)
		rc = err_set(err, ERR_IO, "%s: %s", path, strerror(errno));
	snprintf(path, sizeof path, "%s/%s%s%s", dir, sub, sub[0] ? "/" : "", name);
	if (rc == 0 && json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
		rc = err_set(err, ERR_IO, "%s: cannot write", path);
	json_decref(j);
	return rc;
}

/* One module of modules.json. */
static json_t *
st_module(int idx, const char *path, const char *kind)
{
	char type[96];

	snprintf(type, sizeof type, "sentence_transformers.models.%s", kind);
	return json_pack("{si ss ss ss}", "idx", idx, "name", path[0] ? path : "0", "path", path, "type", type);
}

/* A Dense module's directory: config.json and model.safetensors with linear.weight (the GGUF tensor's rows). */
static int
st_dense(const char *dir, const char *sub, const struct gen_tensor *t, const void *data, size_t bytes, char *err)
{
	struct st_writer *w;
	char path[4096];
	int rc;

	if ((rc = write_json(dir, sub, "config.json", json_pack("{sI sI sb ss}", "in_features", (json_int_t)t->ne[0],
	    "out_features", (json_int_t)t->ne[1], "bias", 0, "activation_function", "torch.nn.modules.linear.Identity"),
	    err)) != 0)
		return rc;
	w = st_writer_new();
	snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, sub);
	if ((rc = st_w_tensor(w, "linear.weight", t->type, 2, t->ne, data, bytes, err)) == 0)
		rc = st_writer_save(w, path, err);
	st_writer_free(w);
	return rc;
}

/*
 * An embedding model's sentence-transformers modules: modules.json, the
 * Pooling's config, Normalize's (empty) one (its Dense modules are written
 * with the tensors, st_dense).
 */
static int
write_st_modules(const char *dir, const struct gen_shape *s, char *err)
{
	json_t *mods = json_array();
	int i = 0, rc;

	json_array_append_new(mods, st_module(i++, "", "Transformer"));
	json_array_append_new(mods, st_module(i++, "1_Pooling", "Pooling"));
	if (s->dense_ff > 0) {
		json_array_append_new(mods, st_module(i++, "2_Dense", "Dense"));
		json_array_append_new(mods, st_module(i++, "3_Dense", "Dense"));
	}
	json_array_append_new(mods, st_module(i, s->dense_ff > 0 ? "4_Normalize" : "2_Normalize", "Normalize"));
	if ((rc = write_json(dir, "", "modules.json", mods, err)) != 0 ||
	    (rc = write_json(dir, s->dense_ff > 0 ? "4_Normalize" : "2_Normalize", "config.json", json_object(), err)) != 0)
		return rc;
	return write_json(dir, "1_Pooling", "config.json", json_pack("{si sb sb sb sb sb sb}",
	    "word_embedding_dimension", s->n_embd, "pooling_mode_cls_token", s->pool == POOL_CLS,
	    "pooling_mode_mean_tokens", s->pool == POOL_MEAN, "pooling_mode_max_tokens", 0,
	    "pooling_mode_mean_sqrt_len_tokens", 0, "pooling_mode_weightedmean_tokens", 0,
	    "pooling_mode_lasttoken", s->pool == POOL_LAST), err);
}

/* Writes a Hugging Face directory: config, tokenizer, model.safetensors. */
static int
write_safetensors(const struct genmodel_opts *o, const struct gen_shape *s, const struct genvocab *v,
    struct gen_tensor *ts, int n, int threads, char *err)
{
	struct st_writer *w;
	char path[4096];
	uint8_t *data, *gu[4] = { NULL };
	uint32_t gu_type = TT_F32;
	size_t bytes;
	int i, rc, k;

	if (mkdir(o->out, 0755) != 0 && errno != EEXIST)
		return err_set(err, ERR_IO, "%s: %s", o->out, strerror(errno));
	if ((rc = write_config(o->out, s, o->type, err)) != 0 ||
	    (rc = genvocab_write_json(v, o->out, err)) != 0 ||
	    (s->pool != POOL_NONE && (rc = write_st_modules(o->out, s, err)) != 0))
		return rc;
	w = st_writer_new();
	for (i = 0; i < n && rc == 0; i++) {
		const struct gen_tensor *t = &ts[i];
		const char *const fused[] = { "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_gate_exps.bias",
			"ffn_up_exps.bias" };

		if ((rc = gen_tensor_data(t, s, o->seed, 0, threads, &data, &bytes, err)) != 0)
			break;
		for (k = 0; s->arch == ARCH_GPTOSS && k < 4 && !strstr(t->name, fused[k]); k++)
			;
		if (s->arch == ARCH_GPTOSS && k < 4) {
			gu[k] = data, data = NULL;
			gu_type = k == 0 ? t->type : gu_type;
			if (k == 3)
				rc = st_gptoss_experts(w, s, t->layer, gu, gu_type, err);
		} else if (s->arch == ARCH_GPTOSS && strstr(t->name, "ffn_down_exps.weight")) {
			uint8_t *tr = transpose_experts(data, t->ne[2], t->ne[1], t->ne[0],
			    (size_t)quant_traits(t->type)->block_bytes);
			char name[128];

			snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", t->layer);
			rc = st_w_tensor(w, name, t->type, 3, (int64_t[]){ t->ne[1], t->ne[0], t->ne[2] }, tr, bytes, err);
			free(tr);
		} else if (strncmp(t->name, "dense_", 6) == 0) {
			rc = st_dense(o->out, t->name[6] == '2' ? "2_Dense" : "3_Dense", t, data, bytes, err);
		} else if (t->ne[2] > 1) {
			rc = st_per_expert(w, s, t, data, bytes, err);
		} else {
			rc = st_put(w, s, t->name, t->type, t->n_dims, t->ne, data, bytes, err);
		}
		free(data);
		for (k = 0; k < 4 && gu[3] != NULL; k++)
			free(gu[k]), gu[k] = NULL;
	}
	for (k = 0; k < 4; k++)
		free(gu[k]);
	snprintf(path, sizeof path, "%s/model.safetensors", o->out);
	if (rc == 0)
		rc = st_writer_save(w, path, err);
	st_writer_free(w);
	return rc;
}

/* ---- entry ---- */

/* Looks up a shape by name. */
static const struct gen_shape *
find_shape(const char *name)
{
	size_t i;

	for (i = 0; i < ARRAY_LEN(shapes); i++)
		if (strcmp(shapes[i].name, name) == 0)
			return &shapes[i];
	return NULL;
}

int
genmodel_run(const struct genmodel_opts *o, char *err)
{
	const struct gen_shape *found = find_shape(o->shape);
	struct gen_shape shape, *s = &shape;
	struct gen_tensor *ts;
	struct genvocab v;
	int gguf, n, rc, threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
	size_t ti;

	if (found == NULL)
		return err_set(err, ERR_INVAL, "unknown shape '%s' (see 'resident-model shapes')", o->shape);
	shape = *found;
	if (o->layers < 0 || o->layers > shape.n_layer)
		return err_set(err, ERR_INVAL, "--layers %d: %s has 1 to %d", o->layers, o->shape, shape.n_layer);
	if (o->layers > 0)
		shape.n_layer = o->layers;
	for (ti = 0; ti < ARRAY_LEN(gen_types) && strcmp(gen_types[ti].name, o->type) != 0; ti++)
		;
	if (ti == ARRAY_LEN(gen_types))
		return err_set(err, ERR_INVAL, "unknown type '%s' (f32, f16, bf16, q8_0, q4_k_m, q5_k_m, mxfp4)",
		    o->type);
	if (strcmp(o->format, "gguf") != 0 && strcmp(o->format, "safetensors") != 0)
		return err_set(err, ERR_INVAL, "unknown format '%s' (gguf, safetensors)", o->format);
	gguf = strcmp(o->format, "gguf") == 0;
	if (!gguf && gen_types[ti].t > G_BF16)
		return err_set(err, ERR_INVAL, "safetensors holds f32, f16 or bf16, not %s", o->type);
	if ((rc = genvocab_make(&v, s->vocab, s->n_vocab, o->seed, err)) != 0)
		return rc;
	ts = xcalloc((size_t)s->n_layer * 24 + 8, sizeof *ts);
	n = build_tensors(ts, s, gen_types[ti].t, gguf);
	if (gguf)
		rc = write_gguf(o, s, &v, gen_types[ti].file_type, ts, n, threads, err);
	else
		rc = write_safetensors(o, s, &v, ts, n, threads, err);
	free(ts);
	genvocab_free(&v);
	return rc;
}
