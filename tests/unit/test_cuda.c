/*
 * test_cuda.c: the CUDA backend against the CPU reference, whole-model
 * logits, for every family and weight type the generator writes (the
 * mixtures of experts too, every token through all of a layer's experts:
 * their grouped products on the tensor cores in the gemm variant, their
 * slots on the matrix-vector kernels in the others; gpt-oss's MXFP4 and
 * float experts, its sinks and biases).
 *
 * Each model runs one schedule of steps on the CPU backend (its exact mode,
 * float activations) and on four CUDA backends: one that sends every
 * product to the many-token path (the tensor-core kernels on quantized
 * blocks, cuBLAS on float weights), one that sends every product to the
 * matrix-vector kernels (RESIDENT_CUDA_MMV_MAX), the default (a token on
 * the matrix-vector kernels, more on the tensor cores), and
 * the exact mode (backend_opts.exact, loaded with RESIDENT_CUDA_MMV_MAX=0,
 * which it must override); and the default and the exact mode again with
 * the even layers' feed-forwards kept in host memory (backend_opts.host_ffn:
 * computed by the host inside the step, as a model larger than the device
 * budget runs), the exact one with half of each host layer's experts kept
 * on the device as well (backend_opts.hot_experts: every step of fewer
 * than stream_min tokens splits those layers' experts between the device
 * and the host) and half of the chosen others brought up over the bus
 * (RESIDENT_CUDA_BUS_SHARE); and the default and the exact mode with a
 * q8_0 KV cache (backend_opts.kv_type), against a CPU backend with one
 * (its exact mode too); and the default with each pool again with every
 * decode token on the tensor-core decode kernel (RESIDENT_CUDA_TC_DECODE=1:
 * the backend takes it only from contexts of 2,048 positions, which the
 * schedule does not reach); and the first variant again with the quantized
 * weights dequantized for cuBLAS (RESIDENT_CUDA_BLAS_MIN=1: the backend
 * does so only from 256 tokens, which the schedule's steps do not reach),
 * and with every many-token product of Q4_K, Q5_K and Q6_K weights on qgemm's
 * wgmma form (RESIDENT_CUDA_WG_MIN=1 and RESIDENT_CUDA_WG_ELEMS=0, where
 * the device runs it: sm_90a; elsewhere that variant repeats gemm). gemm
 * and blas keep to their paths (RESIDENT_CUDA_WG_MIN off); the default
 * takes the wgmma form from 33 tokens for weights of 2M elements, more
 * than the generated test models have.
 * The schedule mixes prefill chunks and decode
 * tokens of seven sequences in one step, reaches positions well past the
 * gemma sliding window (16), forks a sequence in the middle of a block
 * (kv_copy), moves a sequence's blocks to others through host memory
 * (kv_move: what the KV tiers do) and ends with one-, two- and
 * sixteen-token steps. Every logits row
 * must agree with the CPU's within a bound on max |gpu - cpu| / max |cpu|
 * per row:
 * - gemm, matvec and blas, TOL: the KV pool is fp16 (2^-11 of every K and V
 *   element; the real Gemma's logits move by up to 2.4e-3 of their
 *   largest on the matrix-vector path) and the tensor-core path rounds its
 *   inputs to fp16 too (4.5e-3), the rest is float32;
 * - exact, TOL_EXACT: float32 everywhere, the KV pool included, so the
 *   rows differ by summation order alone: each float32 dot product of k
 *   terms in another order moves by about sqrt(k) * 2^-24 of its terms'
 *   size (under 3e-6 for k = 2048), and norms and softmax keep that from
 *   growing through the layers; 1e-4 leaves a margin of tens over that and
 *   is five times below one fp16 rounding of the pool, so an fp16 K/V
 *   element or activation anywhere fails it;
 * - host, TOL_HOST: the host layers multiply as the CPU's fast mode does,
 *   with 8-bit activations of one scale a block (the GPU's integer
 *   kernels keep a second int8 plane for the remainder), which alone moves
 *   these models' logits by up to 2e-2 of a row's largest (tiny-gemma3
 *   Q4_K_M, measured on an H200); a layer computed wrong or skipped moves
 *   them by the order of the logits themselves. host-exact keeps
 *   TOL_EXACT: float32 on both sides, the host's products included;
 * - q8, TOL_Q8, and q8-exact, TOL_Q8_EXACT: both sides quantize K and V
 *   the same way (cpu_q8.c's rule), but a value the two compute a little
 *   apart (summation order; fp16 activations in the default mode) can
 *   round to the next level, 1/127 of its group's largest, and move its
 *   row by far more than the sums' order alone: up to 3.1e-3 (exact) and
 *   1.3e-2 (default) on these models, measured on an H200; the bounds are
 *   about four times those. A wrong scale or a row of another position
 *   moves rows by the order of the logits themselves, and test_cuda_attn
 *   checks each kernel against a float64 reference on the pool's values;
 * - tc and q8-tc, TOL and TOL_Q8: the decode kernel's queries and softmax
 *   weights are fp16, as the prefill tiles' kernel's are in the default.
 *
 * The real Gemma 3 270M file runs too when RESIDENT_GEMMA names it.
 * Without a CUDA device the program says so and exits 77 (a skip).
 * TEST_CUDA_ONLY="tiny/q8_0,tiny-gemma3/q4_k_m" runs only those models
 * (for slow tools such as compute-sanitizer).
 */
#include "config.h"
#include "genmodel.h"
#include "kernels.h"
#include "model.h"
#include "quant.h"
#include "util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define SEQS 6          /* sequences of the schedule; a seventh is forked */
#define MAX_BLOCKS 8    /* blocks per sequence: 128 positions */
#define MAX_STEP 256
#define DECODE_TO 84    /* sequence 0 decodes up to this length */
#define TOL 1e-2
#define TOL_EXACT 1e-4
#define TOL_HOST 4e-2
#define TOL_Q8 5e-2
#define TOL_Q8_EXACT 1.5e-2
#define N_GPU 12        /* the CUDA variants */

/* RESIDENT_CUDA_MMV_MAX of each ("": unset, the default) */
static const char *const gpu_names[N_GPU] = { "gemm", "matvec", "default", "exact", "host", "host-exact", "q8",
	"q8-exact", "tc", "q8-tc", "blas", "wgmma" };
static const char *const gpu_mmv[N_GPU] = { "0", "1000000", "", "0", "", "", "", "", "", "", "0", "0" };
static const int gpu_exact[N_GPU] = { 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0 };
/* 1: the even layers' feed-forwards kept in host memory (backend_opts.host_ffn) */
static const int gpu_host[N_GPU] = { 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0 };
/* 1: half of each host layer's experts kept on the device too (backend_opts.hot_experts) */
static const int gpu_hot[N_GPU] = { 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0 };
/* 1: a q8_0 KV cache, against the CPU's */
static const int gpu_q8[N_GPU] = { 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0 };
/* 1: every decode token on the tensor-core decode kernel (RESIDENT_CUDA_TC_DECODE=1) */
static const int gpu_tc[N_GPU] = { 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0 };
/* 1: the many-token products of quantized weights on cuBLAS, dequantized (RESIDENT_CUDA_BLAS_MIN=1) */
static const int gpu_blas[N_GPU] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0 };
/*
 * qgemm's wgmma form (sm_90a): -1 off (gemm and blas keep their paths), 0
 * the default, 1 every many-token product of the types it takes
 * (RESIDENT_CUDA_WG_MIN=1, RESIDENT_CUDA_WG_ELEMS=0)
 */
static const int gpu_wg[N_GPU] = { -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, 1 };
static const double gpu_tol[N_GPU] = { TOL, TOL, TOL, TOL_EXACT, TOL_HOST, TOL_EXACT, TOL_Q8, TOL_Q8_EXACT, TOL,
	TOL_Q8, TOL, TOL };
/*
 * The real Gemma 3 270M's: its activations have outliers that move it
 * further where values are rounded. Measured on an H200: the CPU's 8-bit
 * activations in the host layers 0.11 of a row's largest, a q8_0 level
 * moved by the float order 3.1e-2 (exact) and with fp16 activations
 * 8.2e-2; the bounds are 2.5-3 times those.
 */
static const double gemma_tol[N_GPU] = { TOL, TOL, TOL, TOL_EXACT, 0.25, TOL_EXACT, 0.25, 0.1, TOL, 0.25, TOL,
	TOL };

struct fixture {
	char dir[64];
	char path[128];
	int generated;
	struct model_desc *m;
	struct backend *cpu[2], *gpu[N_GPU]; /* cpu[1]: with a q8_0 KV cache */
	int32_t n_vocab;
	double worst[N_GPU];
	int rows;
	const double *tol;    /* each variant's bound: gpu_tol, or the real Gemma's */
	char bad[N_GPU][160]; /* each variant's first row past its bound (test_model fails after printing all) */
};

/* One step of the schedule: sequence id[k] gets n_new[k] tokens from pos[k]. */
struct plan {
	int n;
	int id[SEQS + 1], pos[SEQS + 1], n_new[SEQS + 1];
};

static int32_t tables[SEQS + 2][MAX_BLOCKS]; /* the last row: blocks a sequence moves to */

static struct backend_opts
opts(void)
{
	struct backend_opts bo = { .n_threads = 0, .kv_blocks = (SEQS + 2) * MAX_BLOCKS,
		.max_tokens = MAX_STEP, .max_seqs = SEQS + 1, .device = 0, .exact = 1 };

	return bo;
}

/* Sets name to value, or unsets it where value is "" (the backend's default). */
static void
env_or_unset(const char *name, const char *value)
{
	if (*value != '\0')
		setenv(name, value, 1);
	else
		unsetenv(name);
}

/* Loads m on the CPU and on every CUDA variant. */
static void
load_all(struct fixture *f)
{
	struct backend_opts bo = opts();
	uint8_t *even = xcalloc((size_t)f->m->hp.n_layer, 1);
	char err[ERR_LEN];
	int g;

	for (int l = 0; l < f->m->hp.n_layer; l += 2)
		even[l] = 1;
	for (int q8 = 0; q8 < 2; q8++) {
		bo.kv_type = q8 ? KV_Q8_0 : KV_F16;
		if (cpu_backend.load(f->m, &bo, &f->cpu[q8], err) != 0)
			fail_msg("cpu load: %s", err);
	}
	for (g = 0; g < N_GPU; g++) {
		bo.exact = gpu_exact[g];
		bo.kv_type = gpu_q8[g] ? KV_Q8_0 : KV_F16;
		bo.host_ffn = gpu_host[g] ? even : NULL;
		bo.hot_experts = gpu_hot[g] ? f->m->hp.n_expert / 2 : 0;
		/* the hot variant's steps bring half the chosen experts it does not hold up over the bus */
		setenv("RESIDENT_CUDA_BUS_SHARE", gpu_hot[g] ? "0.5" : "", 1);
		env_or_unset("RESIDENT_CUDA_MMV_MAX", gpu_mmv[g]);
		env_or_unset("RESIDENT_CUDA_TC_DECODE", gpu_tc[g] ? "1" : "");
		env_or_unset("RESIDENT_CUDA_BLAS_MIN", gpu_blas[g] ? "1" : "");
		env_or_unset("RESIDENT_CUDA_WG_MIN", gpu_wg[g] < 0 ? "1000000" : gpu_wg[g] > 0 ? "1" : "");
		env_or_unset("RESIDENT_CUDA_WG_ELEMS", gpu_wg[g] > 0 ? "0" : "");
		if (cuda_backend.load(f->m, &bo, &f->gpu[g], err) != 0)
			fail_msg("cuda load (%s): %s", gpu_names[g], err);
		/* the exact mode's pool is fp32, the others' fp16; a q8 row 36 bytes a 32 */
		assert_int_equal(cuda_backend.kv_row_bytes(f->gpu[g]), (size_t)f->m->hp.n_head_kv *
		    (size_t)f->m->hp.head_dim * (gpu_q8[g] ? 36 : gpu_exact[g] ? 128 : 64) / 32);
	}
	unsetenv("RESIDENT_CUDA_MMV_MAX");
	unsetenv("RESIDENT_CUDA_BUS_SHARE");
	unsetenv("RESIDENT_CUDA_TC_DECODE");
	unsetenv("RESIDENT_CUDA_BLAS_MIN");
	unsetenv("RESIDENT_CUDA_WG_MIN");
	unsetenv("RESIDENT_CUDA_WG_ELEMS");
	free(even); /* load copies the flags */
	f->n_vocab = f->m->hp.n_vocab;
}

/* 0 if TEST_CUDA_ONLY ("shape/type,...") is set and does not name this model. */
static int
selected(const char *shape, const char *type)
{
	const char *only = getenv("TEST_CUDA_ONLY");
	char name[64];

	snprintf(name, sizeof name, "%s/%s", shape, type);
	for (const char *p = only; p != NULL && *p != '\0'; p += strcspn(p, ",") + (p[strcspn(p, ",")] != '\0'))
		if (strncmp(p, name, strcspn(p, ",")) == 0 && strlen(name) == strcspn(p, ","))
			return 1;
	return only == NULL || *only == '\0';
}

/*
 * Generates SHAPE in TYPE into a temporary directory and loads it
 * everywhere; leaves the state NULL (the test skips) if not selected.
 */
static int
setup_model(void **state, const char *shape, const char *type)
{
	struct fixture *f;
	struct genmodel_opts o = { .shape = shape, .format = "gguf", .type = type, .seed = 11, .threads = 0 };
	char err[ERR_LEN];

	*state = NULL;
	if (!selected(shape, type))
		return 0;
	f = xcalloc(1, sizeof *f);
	snprintf(f->dir, sizeof f->dir, "/tmp/test_cuda_XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof f->path, "%s/m.gguf", f->dir);
	f->generated = 1;
	f->tol = gpu_tol;
	o.out = f->path;
	if (genmodel_run(&o, err) != 0 || model_open(f->path, &f->m, err) != 0)
		fail_msg("%s %s: %s", shape, type, err);
	/*
	 * Every token through every expert: whether a token takes its k-th or
	 * (k+1)-th expert turns on a sum that the GPU's fp16 activations move
	 * by ~1e-3 of its size, so a near tie now and then routes it elsewhere
	 * and its row jumps. The weights and the products stay those of a
	 * routed step; which experts win is checked on identical inputs by
	 * test_cuda_ops (test_moe), and exact mode against transformers.
	 */
	f->m->hp.n_expert_used = f->m->hp.n_expert;
	load_all(f);
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;
	int g;

	if (f == NULL)
		return 0;
	cpu_backend.free(f->cpu[0]);
	cpu_backend.free(f->cpu[1]);
	for (g = 0; g < N_GPU; g++)
		cuda_backend.free(f->gpu[g]);
	model_close(f->m);
	if (f->generated) {
		unlink(f->path);
		rmdir(f->dir);
	}
	free(f);
	return 0;
}

/* Deterministic token ids of sequence s. */
static int32_t
tok(int s, int i, int32_t n_vocab)
{
	return (int32_t)(((uint32_t)s * 7919u + (uint32_t)i * 104729u + 17u) % (uint32_t)n_vocab);
}

/* max |a - b| / max |b| over one row; infinite if a has a NaN or an infinity. */
static double
rel_err(const float *a, const float *b, int32_t n)
{
	double d = 0, m = 0;
	int32_t i;

	for (i = 0; i < n; i++) {
		if (!isfinite(a[i]))
			return INFINITY;
		d = fmax(d, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	return d / m;
}

/* Runs one step with every row's logits on backend be; returns them (malloc'd). */
static float *
run_step(const struct backend_ops *ops, struct backend *be, const struct plan *p, int32_t n_vocab,
    int *n_rows)
{
	struct fwd_seq fs[SEQS + 1];
	int32_t toks[MAX_STEP];
	int k, i, t = 0;
	struct fwd_batch b = { .n_seqs = p->n, .seqs = fs, .tokens = toks };
	float *logits;
	char err[ERR_LEN];

	for (k = 0; k < p->n; k++) {
		fs[k] = (struct fwd_seq){ p->n_new[k], p->pos[k], tables[p->id[k]], MAX_BLOCKS, p->n_new[k], 0, 0 };
		for (i = 0; i < p->n_new[k]; i++)
			toks[t++] = tok(p->id[k], p->pos[k] + i, n_vocab);
	}
	assert_true(t <= MAX_STEP);
	b.n_tokens = t;
	logits = xmalloc((size_t)t * (size_t)n_vocab * sizeof *logits);
	for (i = 0; i < t * n_vocab; i++)
		logits[i] = NAN; /* every row must be written */
	if (ops->forward(be, &b, logits, err) != 0)
		fail_msg("%s forward: %s", ops->name, err);
	*n_rows = t;
	return logits;
}

/* Runs a step everywhere and compares every row with the CPU's (with the same KV cache). */
static void
step_all(struct fixture *f, const struct plan *p)
{
	int rows, g, r;
	float *ref[2], *got;

	for (int q8 = 0; q8 < 2; q8++)
		ref[q8] = run_step(&cpu_backend, f->cpu[q8], p, f->n_vocab, &rows);
	for (g = 0; g < N_GPU; g++) {
		const float *want = ref[gpu_q8[g]];

		got = run_step(&cuda_backend, f->gpu[g], p, f->n_vocab, &rows);
		for (r = 0; r < rows; r++) {
			double e = rel_err(got + (size_t)r * f->n_vocab, want + (size_t)r * f->n_vocab, f->n_vocab);

			f->worst[g] = fmax(f->worst[g], isnan(e) ? INFINITY : e);
			if (!(e < f->tol[g]) && f->bad[g][0] == '\0')
				snprintf(f->bad[g], sizeof f->bad[g], "%s: row %d of a %d-token step: relative error %g "
				    "(bound %g)", gpu_names[g], r, rows, e, f->tol[g]);
		}
		free(got);
	}
	f->rows += rows;
	free(ref[0]), free(ref[1]);
}

/* Copies the first n positions of block src into dst on every backend. */
static void
kv_copy_all(struct fixture *f, int32_t src, int32_t dst, int32_t n)
{
	char err[ERR_LEN];
	int g;

	for (int q8 = 0; q8 < 2; q8++)
		if (cpu_backend.kv_copy(f->cpu[q8], src, dst, n, err) != 0)
			fail_msg("cpu kv_copy: %s", err);
	for (g = 0; g < N_GPU; g++)
		if (cuda_backend.kv_copy(f->gpu[g], src, dst, n, err) != 0)
			fail_msg("cuda kv_copy: %s", err);
}

/* n host buffers of bytes each, every other one pinned (host_alloc: straight across) and the others pageable (staged). */
static void **
host_bufs(int32_t n, size_t bytes)
{
	void **h = xcalloc((size_t)n, sizeof *h);

	for (int32_t i = 0; i < n; i++) {
		h[i] = i % 2 ? cuda_backend.host_alloc(bytes) : xmalloc(bytes);
		assert_non_null(h[i]);
	}
	return h;
}

static void
host_bufs_free(void **h, int32_t n)
{
	for (int32_t i = 0; i < n; i++) {
		if (i % 2)
			cuda_backend.host_free(h[i]);
		else
			free(h[i]);
	}
	free(h);
}

/*
 * Moves sequence s's first n blocks to the spare row's through host
 * memory, on every backend, as the host tier does: out alone, then the
 * spare row's old K/V out and the moved ones in by one call, whose copy
 * out must see each block before its copy in (checked against the old
 * K/V read alone first).
 */
static void
move_all(struct fixture *f, int s, int32_t n)
{
	const struct model_hparams *hp = &f->m->hp;
	/* the largest block: an fp32 pool's */
	size_t bytes = (size_t)hp->n_layer * 2 * KV_BLOCK_TOKENS * (size_t)hp->n_head_kv * (size_t)hp->head_dim * 4;
	void **host = host_bufs(n, bytes), **old = host_bufs(n, bytes), **ref = host_bufs(n, bytes);
	char err[ERR_LEN];
	int32_t i;
	int g;

	for (int q8 = 0; q8 < 2; q8++)
		if (cpu_backend.kv_move(f->cpu[q8], tables[s], n, host, NULL, err) != 0 ||
		    cpu_backend.kv_move(f->cpu[q8], tables[SEQS + 1], n, NULL, (const void *const *)host, err) != 0)
			fail_msg("cpu kv_move: %s", err);
	for (g = 0; g < N_GPU; g++) {
		size_t per = (size_t)hp->n_layer * 2 * KV_BLOCK_TOKENS * cuda_backend.kv_row_bytes(f->gpu[g]);

		if (cuda_backend.kv_move(f->gpu[g], tables[s], n, host, NULL, err) != 0 ||
		    cuda_backend.kv_move(f->gpu[g], tables[SEQS + 1], n, ref, NULL, err) != 0 ||
		    cuda_backend.kv_move(f->gpu[g], tables[SEQS + 1], n, old, (const void *const *)host, err) != 0)
			fail_msg("cuda kv_move (%s): %s", gpu_names[g], err);
		for (i = 0; i < n; i++)
			if (memcmp(old[i], ref[i], per) != 0)
				fail_msg("cuda kv_move (%s): block %d's copy out did not come before its copy in", gpu_names[g], i);
	}
	for (i = 0; i < n; i++)
		tables[s][i] = tables[SEQS + 1][i];
	host_bufs_free(host, n), host_bufs_free(old, n), host_bufs_free(ref, n);
}

/* Adds sequence s with n_new tokens to the plan. */
static void
plan_add(struct plan *p, int s, int pos, int n_new)
{
	p->id[p->n] = s;
	p->pos[p->n] = pos;
	p->n_new[p->n] = n_new;
	p->n++;
}

/* The whole schedule (see the top of the file). */
static void
run_schedule(struct fixture *f)
{
	static const int prompt[SEQS] = { 37, 5, 23, 61, 1, 44 };
	int done[SEQS + 1] = { 0 }, s, i, busy, chunk = 24, fork_at;
	struct plan p;

	for (s = 0; s <= SEQS + 1; s++)
		for (i = 0; i < MAX_BLOCKS; i++)
			tables[s][i] = s * MAX_BLOCKS + i;
	/* prompts in chunks, beside the decodes of the sequences already done */
	do {
		memset(&p, 0, sizeof p);
		for (busy = 0, s = 0; s < SEQS; s++) {
			int n = done[s] < prompt[s] ? MIN(chunk, prompt[s] - done[s]) : 1;

			busy |= done[s] < prompt[s];
			plan_add(&p, s, done[s], n);
			done[s] += n;
		}
		step_all(f, &p);
		chunk = chunk == 24 ? 13 : 24;
	} while (busy);
	/* sequence 6 forks sequence 0 in the middle of a block: shared full blocks, a copied partial one */
	fork_at = done[0] % KV_BLOCK_TOKENS ? done[0] : done[0] - 3;
	for (i = 0; i < fork_at / KV_BLOCK_TOKENS; i++)
		tables[SEQS][i] = tables[0][i];
	kv_copy_all(f, tables[0][i], tables[SEQS][i], fork_at % KV_BLOCK_TOKENS);
	done[SEQS] = fork_at;
	/* sequence 5 goes on from other blocks, its K/V carried through host memory */
	move_all(f, 5, (done[5] + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS);
	/* everyone decodes until sequence 0 is DECODE_TO long */
	while (done[0] < DECODE_TO) {
		memset(&p, 0, sizeof p);
		for (s = 0; s <= SEQS; s++) {
			plan_add(&p, (s + done[0]) % (SEQS + 1), done[(s + done[0]) % (SEQS + 1)], 1);
		}
		for (s = 0; s <= SEQS; s++)
			done[s]++;
		step_all(f, &p);
	}
	/* one token alone, two sequences a token each, then a step of sixteen */
	memset(&p, 0, sizeof p);
	plan_add(&p, 4, done[4]++, 1);
	step_all(f, &p);
	memset(&p, 0, sizeof p);
	plan_add(&p, 2, done[2]++, 1);
	plan_add(&p, 3, done[3]++, 1);
	step_all(f, &p);
	memset(&p, 0, sizeof p);
	plan_add(&p, 1, done[1], 12);
	done[1] += 12;
	for (s = 2; s < 6; s++)
		plan_add(&p, s, done[s]++, 1);
	step_all(f, &p);
}

static void
test_model(void **state)
{
	struct fixture *f = *state;
	const struct quant_traits *qt;
	char errs[N_GPU * 32]; /* "name 1.23e-04, " each */

	if (f == NULL)
		skip();
	qt = quant_traits(f->m->tok_embd->type);
	if (!f->rows)
		run_schedule(f);
	for (int g = 0, at = 0; g < N_GPU; g++)
		at += snprintf(errs + at, sizeof errs - (size_t)at, "%s%s %.2e", g > 0 ? ", " : "", gpu_names[g],
		    f->worst[g]);
	print_message("%-12s %-5s embd %-5s: %4d rows, max relative error: %s\n", f->m->name,
	    model_arch_name(f->m->arch), qt ? qt->name : "?", f->rows, errs);
	for (int g = 0; g < N_GPU; g++)
		if (f->bad[g][0] != '\0')
			fail_msg("%s", f->bad[g]);
}

/* The real Gemma 3 270M file: a 40-token prompt in chunks, then decoding, one sequence. */
static void
test_real_gemma(void **state)
{
	const char *path = getenv("RESIDENT_GEMMA");
	struct fixture *f;
	struct plan p;
	char err[ERR_LEN];
	int pos = 0, n;

	if (path == NULL || *path == '\0') {
		print_message("RESIDENT_GEMMA not set: the real Gemma 3 270M is not compared\n");
		skip();
	}
	f = xcalloc(1, sizeof *f);
	*state = f;
	f->tol = gemma_tol;
	if (model_open(path, &f->m, err) != 0)
		fail_msg("%s: %s", path, err);
	load_all(f);
	for (n = 0; n < MAX_BLOCKS; n++)
		tables[0][n] = n;
	while (pos < 60) {
		memset(&p, 0, sizeof p);
		n = pos < 40 ? MIN(17, 40 - pos) : 1;
		plan_add(&p, 0, pos, n);
		pos += n;
		step_all(f, &p);
	}
	test_model(state);
}

static int setup_llama_f32(void **s) { return setup_model(s, "tiny", "f32"); }
static int setup_llama_f16(void **s) { return setup_model(s, "tiny", "f16"); }
static int setup_llama_bf16(void **s) { return setup_model(s, "tiny", "bf16"); }
static int setup_llama_q8(void **s) { return setup_model(s, "tiny", "q8_0"); }
static int setup_llama_q4km(void **s) { return setup_model(s, "tiny", "q4_k_m"); }
static int setup_qwen2_f16(void **s) { return setup_model(s, "tiny-qwen2", "f16"); }
static int setup_qwen2_q4km(void **s) { return setup_model(s, "tiny-qwen2", "q4_k_m"); }
static int setup_qwen3_q8(void **s) { return setup_model(s, "tiny-qwen3", "q8_0"); }
static int setup_qwen3_q4km(void **s) { return setup_model(s, "tiny-qwen3", "q4_k_m"); }
static int setup_qwen3_q5km(void **s) { return setup_model(s, "tiny-qwen3", "q5_k_m"); }
static int setup_gemma3_f32(void **s) { return setup_model(s, "tiny-gemma3", "f32"); }
static int setup_gemma3_q4km(void **s) { return setup_model(s, "tiny-gemma3", "q4_k_m"); }
static int setup_qwen3moe_f16(void **s) { return setup_model(s, "tiny-qwen3moe", "f16"); }
static int setup_qwen3moe_q4km(void **s) { return setup_model(s, "tiny-qwen3moe", "q4_k_m"); }
static int setup_mixtral_q4km(void **s) { return setup_model(s, "tiny-mixtral", "q4_k_m"); }
static int setup_gptoss_bf16(void **s) { return setup_model(s, "tiny-gptoss", "bf16"); }
static int setup_gptoss_mxfp4(void **s) { return setup_model(s, "tiny-gptoss", "mxfp4"); }

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_model, setup_llama_f32, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_llama_f16, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_llama_bf16, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_llama_q8, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_llama_q4km, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_qwen2_f16, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_qwen2_q4km, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_qwen3_q8, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_qwen3_q4km, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_qwen3_q5km, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_gemma3_f32, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_gemma3_q4km, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_qwen3moe_f16, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_qwen3moe_q4km, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_mixtral_q4km, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_gptoss_bf16, teardown),
		cmocka_unit_test_setup_teardown(test_model, setup_gptoss_mxfp4, teardown),
		cmocka_unit_test_teardown(test_real_gemma, teardown),
	};

	if (cuda_backend_devices() <= 0) {
		printf("SKIP: no CUDA device\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}
