/*
 * cuda_probe.cu: the CUDA backend's kernels one at a time, on host data
 * (cuda_probe.h says what each call does). For tests only: each call
 * allocates its device buffers, runs one host entry point of matmul.cuh,
 * norm.cuh or attention.cuh exactly as cuda_backend.cu calls it, and frees
 * them again. The fp16 scratch of the tensor-core path outlives a call, so
 * that a second product can reuse the first one's fp16 activations.
 */
#include "attention.cuh"
#include "cuda_common.cuh"
#include "dequant.cuh"
#include "matmul.cuh"
#include "moe.cuh"
#include "norm.cuh"
#include "pick.cuh"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cuda_probe.h"
}

/* Bytes of 0xff kept after every buffer a kernel writes; any other value there is a stray write. */
#define GUARD 256
/* Device buffers one call may hold. */
#define MAX_BUFS 24

/* A device buffer of `bytes` followed by GUARD bytes of 0xff. */
struct dbuf {
	void *d;
	size_t bytes, cap;
};

/* The device buffers of one call, freed together at its end. */
struct bufs {
	struct dbuf b[MAX_BUFS];
	int written[MAX_BUFS]; /* the kernel writes it: its guard is checked */
	int n;
};

struct cuda_probe {
	cudaStream_t stream;
	struct cuda_mm mm;
	struct dbuf xh, xscale, wh;  /* the tensor-core path's scratch, behind mm's pointers */
	struct dbuf xq, xd;          /* the int8 activations of CUDA_PROBE_INT8 */
	struct dbuf part;            /* the tensor-core kernel's split sums */
	int sms;                     /* the device's multiprocessors */
	int cluster_sms;             /* sms where the device launches clusters (sm_90), else 0 */
	int wg;                      /* the device runs qgemm's wgmma form (cuda_qgemm_wg_device) */
	int x_valid;                 /* xh holds the fp16 copy of an x of x_k x x_tok */
	int64_t x_k;
	int x_tok;
};

/* Fills the buffer and its guard with 0xff, on the probe's stream. */
static int
poison(struct cuda_probe *p, struct dbuf *b, char *err)
{
	CK(cudaMemsetAsync(b->d, 0xff, b->cap + GUARD, p->stream));
	return 0;
}

/* Makes b at least `bytes` long (contents lost when it grows), poisoned if it grew. */
static int
dbuf_reserve(struct cuda_probe *p, struct dbuf *b, size_t bytes, char *err)
{
	b->bytes = bytes;
	if (b->d != NULL && bytes <= b->cap)
		return 0;
	CK(cudaStreamSynchronize(p->stream));
	CK(cudaFree(b->d));
	b->d = NULL;
	b->cap = 0;
	CK(cudaMalloc(&b->d, bytes + GUARD));
	b->cap = bytes;
	return poison(p, b, err);
}

/* 0 if the GUARD bytes after b's contents are all still 0xff. */
static int
guard_check(struct cuda_probe *p, const struct dbuf *b, const char *what, char *err)
{
	uint8_t g[GUARD];

	CK(cudaMemcpyAsync(g, (const uint8_t *)b->d + b->bytes, GUARD, cudaMemcpyDeviceToHost, p->stream));
	CK(cudaStreamSynchronize(p->stream));
	for (int i = 0; i < GUARD; i++)
		if (g[i] != 0xff)
			return err_set(err, ERR_DEVICE, "%s: byte %d past the end of a buffer of %zu was written",
			    what, i, b->bytes);
	return 0;
}

/*
 * A new device buffer of `bytes`, poisoned, then holding host's bytes if
 * host is not NULL; written: the kernel may write it (its guard is checked
 * by finish).
 */
static int
buf_new(struct cuda_probe *p, struct bufs *bs, const void *host, size_t bytes, int written, void **out,
    char *err)
{
	struct dbuf *b;
	int rc;

	if (bs->n == MAX_BUFS)
		return err_set(err, ERR_INVAL, "cuda_probe: more than %d buffers", MAX_BUFS);
	b = &bs->b[bs->n];
	bs->written[bs->n++] = written;
	if ((rc = dbuf_reserve(p, b, bytes, err)) != 0)
		return rc;
	if (host != NULL && bytes > 0)
		CK(cudaMemcpyAsync(b->d, host, bytes, cudaMemcpyHostToDevice, p->stream));
	*out = b->d;
	return 0;
}

/* As buf_new, but NULL stays NULL. */
static int
buf_opt(struct cuda_probe *p, struct bufs *bs, const void *host, size_t bytes, void **out, char *err)
{
	*out = NULL;
	return host == NULL ? 0 : buf_new(p, bs, host, bytes, 0, out, err);
}

static void
bufs_free(struct bufs *bs)
{
	for (int i = 0; i < bs->n; i++)
		cudaFree(bs->b[i].d);
	bs->n = 0;
}

/* Waits for the kernels, then checks the guard of every buffer they may write. */
static int
finish(struct cuda_probe *p, const struct bufs *bs, const char *what, char *err)
{
	int rc;

	CK(cudaStreamSynchronize(p->stream));
	for (int i = 0; i < bs->n; i++)
		if (bs->written[i] && (rc = guard_check(p, &bs->b[i], what, err)) != 0)
			return rc;
	return 0;
}

/* Copies a device buffer back to the host. */
static int
fetch(struct cuda_probe *p, void *host, const void *dev, size_t bytes, char *err)
{
	CK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, p->stream));
	CK(cudaStreamSynchronize(p->stream));
	return 0;
}

extern "C" int
cuda_probe_open(struct cuda_probe **out, char *err)
{
	struct cuda_probe *p;
	cublasStatus_t s;
	int n = 0, major = 0, rc = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		cudaGetLastError();
		return err_set(err, ERR_DEVICE, "no CUDA device");
	}
	CK(cudaSetDevice(0));
	p = (struct cuda_probe *)xcalloc(1, sizeof *p);
	if (cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking) != cudaSuccess) {
		free(p);
		return err_set(err, ERR_DEVICE, "cudaStreamCreate failed");
	}
	if ((s = cublasCreate(&p->mm.blas)) != CUBLAS_STATUS_SUCCESS ||
	    (s = cublasSetStream(p->mm.blas, p->stream)) != CUBLAS_STATUS_SUCCESS) {
		cuda_probe_close(p);
		return err_set(err, ERR_DEVICE, "cuBLAS setup: %s", cublasGetStatusString(s));
	}
	p->mm.stream = p->stream;
	p->mm.blas_min = INT_MAX; /* until a path says otherwise (probe_path) */
	p->mm.wg_min = INT_MAX;
	if (cudaDeviceGetAttribute(&p->sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
	    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) {
		cuda_probe_close(p);
		return err_set(err, ERR_DEVICE, "cuda_probe: no multiprocessor count or compute capability");
	}
	p->cluster_sms = major >= 9 ? p->sms : 0;
	/* every head size the attention kernels take, since the checks try many */
	for (int d = WARP; rc == 0 && d <= 8 * WARP; d += WARP)
		rc = cuda_attention_setup(d, err);
	if (rc != 0 || (rc = cuda_qgemm_setup(err)) != 0 || (rc = cuda_qgemm_wg_device(&p->wg, err)) != 0 ||
	    (p->wg && (rc = cuda_qgemm_wg_fit(&p->mm, err)) != 0)) {
		cuda_probe_close(p);
		return rc;
	}
	*out = p;
	return 0;
}

extern "C" void
cuda_probe_close(struct cuda_probe *p)
{
	if (p == NULL)
		return;
	cudaStreamSynchronize(p->stream);
	if (p->mm.blas != NULL)
		cublasDestroy(p->mm.blas);
	cudaFree(p->xh.d), cudaFree(p->xscale.d), cudaFree(p->wh.d), cudaFree(p->xq.d), cudaFree(p->xd.d);
	cudaFree(p->part.d);
	cudaStreamDestroy(p->stream);
	free(p);
}

/* The weight's device form, its data uploaded (at cw->d), or ERR_UNSUPPORTED for what the backend refuses. */
static int
weight_up(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_weight *w, struct cuda_weight *cw,
    char *err)
{
	void *d;
	int rc;

	if (cuda_weight_form(w->type, w->k, w->n, cw) != 0)
		return err_set(err, ERR_UNSUPPORTED, "cuda_probe: no kernel for %lld x %lld of type %u",
		    (long long)w->n, (long long)w->k, w->type);
	if ((rc = buf_new(p, bs, NULL, cw->row_bytes * (size_t)w->n, 0, &d, err)) != 0)
		return rc;
	cw->d = (const uint8_t *)d;
	return cuda_weight_upload(cw, w->data, (uint8_t *)d, p->stream, err);
}

/*
 * The tensor-core path's scratch for n_tok x k activations and a weight
 * tile of tile_elems, as cuda_backend.cu sizes it; poisoned, except the
 * fp16 activations a reusing call reads.
 */
static int
mm_scratch(struct cuda_probe *p, int64_t k, int n_tok, int64_t tile_elems, int reuse_x, char *err)
{
	int rc;

	if (reuse_x && (!p->x_valid || p->x_k != k || p->x_tok != n_tok))
		return err_set(err, ERR_INVAL, "cuda_probe: reuse_x without a previous cuBLAS product of "
		    "%d x %lld", n_tok, (long long)k);
	if ((rc = dbuf_reserve(p, &p->xh, (size_t)n_tok * (size_t)k * sizeof(__half), err)) != 0 ||
	    (rc = dbuf_reserve(p, &p->xscale, (size_t)n_tok * sizeof(float), err)) != 0 ||
	    (rc = dbuf_reserve(p, &p->wh, (size_t)MAX(tile_elems, 1) * sizeof(__half), err)) != 0 ||
	    (rc = poison(p, &p->wh, err)) != 0)
		return rc;
	if (!reuse_x && ((rc = poison(p, &p->xh, err)) != 0 || (rc = poison(p, &p->xscale, err)) != 0))
		return rc;
	p->mm.xh = (__half *)p->xh.d;
	p->mm.xscale = (float *)p->xscale.d;
	p->mm.wh = (__half *)p->wh.d;
	p->mm.wh_elems = MAX(tile_elems, 1);
	/* the split sums, sized as cuda_backend.cu sizes them */
	p->mm.part_elems = cuda_qgemm_part_elems(p->sms);
	if ((rc = dbuf_reserve(p, &p->part, (size_t)p->mm.part_elems * sizeof(float), err)) != 0 ||
	    (rc = poison(p, &p->part, err)) != 0)
		return rc;
	p->mm.part = (float *)p->part.d;
	return 0;
}

/*
 * The int8 activations of n_tok x k, sized as cuda_backend.cu sizes them
 * (two int8 rows a token, a float2 per 32), poisoned, for CUDA_PROBE_INT8;
 * the other paths run with none, as the backend's exact mode does.
 */
static int
int8_scratch(struct cuda_probe *p, enum cuda_probe_path path, int64_t k, int n_tok, char *err)
{
	int rc;

	p->mm.xq = NULL, p->mm.xd = NULL, p->mm.xq_ready = 0;
	if (path != CUDA_PROBE_INT8)
		return 0;
	if ((rc = dbuf_reserve(p, &p->xq, (size_t)n_tok * 2 * (size_t)k, err)) != 0 ||
	    (rc = dbuf_reserve(p, &p->xd, (size_t)n_tok * (size_t)(k / 32) * sizeof(float2), err)) != 0 ||
	    (rc = poison(p, &p->xq, err)) != 0 || (rc = poison(p, &p->xd, err)) != 0)
		return rc;
	p->mm.xq = (int8_t *)p->xq.d;
	p->mm.xd = (float2 *)p->xd.d;
	return 0;
}

/* The kernels of a path: the token counts that take the matrix-vector and mmt.cu kernels, K's splits. */
static void
probe_path(struct cuda_probe *p, enum cuda_probe_path path)
{
	int wg = path == CUDA_PROBE_WG || path == CUDA_PROBE_WG_WHOLE;

	p->mm.mmv_max = path == CUDA_PROBE_GEMM || path == CUDA_PROBE_GEMM_WHOLE || path == CUDA_PROBE_FEW ||
	    path == CUDA_PROBE_BLAS || wg ? 0 : INT_MAX;
	p->mm.mmt_max = path == CUDA_PROBE_FEW ? MMT_MAX_TOKENS : 0;
	p->mm.blas_min = path == CUDA_PROBE_BLAS ? 1 : INT_MAX;
	p->mm.wg_min = wg ? 1 : INT_MAX;
	p->mm.wg_elems = 0; /* every shape the checks try */
	p->mm.wg_cluster = QG_MAX_SPLIT; /* every split summed in its cluster */
	p->mm.wg_wide = WG_WIDE_TOKENS;
	p->mm.wg_wide_units = 0; /* the 256-token tiles on every shape the checks try past it */
	/* no multiprocessors to fill: no split */
	p->mm.sms = path == CUDA_PROBE_GEMM_WHOLE || path == CUDA_PROBE_WG_WHOLE ? 0 : p->sms;
}

int
cuda_probe_wg(const struct cuda_probe *p)
{
	return p->wg;
}

/*
 * y = W x as n_parts weights of consecutive rows of cw (the last takes the
 * rest), each writing its columns of y, and with cw2 (NULL: none) y2 = W2 x
 * after them: one cuda_matmul_multi, which fuses them on the
 * matrix-vector path; one weight: cuda_matmul.
 */
static int
matmul_parts(struct cuda_probe *p, const struct cuda_weight *cw, int n_parts, const struct cuda_weight *cw2,
    const float *x, int n_tok, float *y, float *y2, int reuse_x, char *err)
{
	struct cuda_weight part[MM_MAX_OUT];
	const struct cuda_weight *wp[MM_MAX_OUT];
	float *yp[MM_MAX_OUT];
	int ld[MM_MAX_OUT], n_w = n_parts + (cw2 != NULL);
	int64_t per = cw->n / n_parts, r0 = 0;

	if (n_w == 1)
		return cuda_matmul(&p->mm, cw, x, (int)cw->k, n_tok, y, (int)cw->n, reuse_x, err);
	if (n_parts < 1 || n_w > MM_MAX_OUT || per < 1 || reuse_x || (cw2 != NULL && cw2->k != cw->k))
		return err_set(err, ERR_INVAL, "cuda_probe: %lld rows in %d parts and %d more weights (reuse %d)",
		    (long long)cw->n, n_parts, n_w - n_parts, reuse_x);
	for (int i = 0; i < n_parts; i++) {
		part[i] = *cw;
		part[i].d = cw->d + (size_t)r0 * cw->row_bytes;
		part[i].n = i == n_parts - 1 ? cw->n - r0 : per;
		wp[i] = &part[i], yp[i] = y + r0, ld[i] = (int)cw->n;
		r0 += part[i].n;
	}
	if (cw2 != NULL)
		wp[n_parts] = cw2, yp[n_parts] = y2, ld[n_parts] = (int)cw2->n;
	return cuda_matmul_multi(&p->mm, wp, n_w, x, (int)cw->k, n_tok, yp, ld, 0, err);
}

static int
matmul_run(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_weight *w, int n_parts,
    const struct cuda_probe_weight *w2, const float *x, int n_tok, enum cuda_probe_path path, int64_t tile_rows,
    int reuse_x, float *y, float *y2, char *err)
{
	struct cuda_weight cw, cw2 = {};
	void *dx, *dy, *dy2 = NULL;
	size_t ybytes = (size_t)n_tok * (size_t)w->n * sizeof(float);
	size_t ybytes2 = w2 != NULL ? (size_t)n_tok * (size_t)w2->n * sizeof(float) : 0;
	int64_t tile;
	int rc;

	if (n_tok < 1)
		return err_set(err, ERR_INVAL, "cuda_probe: %d tokens", n_tok);
	if ((rc = weight_up(p, bs, w, &cw, err)) != 0 || (w2 != NULL && (rc = weight_up(p, bs, w2, &cw2, err)) != 0))
		return rc;
	if ((rc = buf_new(p, bs, x, (size_t)n_tok * (size_t)w->k * sizeof(float), 0, &dx, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, ybytes, 1, &dy, err)) != 0)
		return rc;
	if (w2 != NULL && (rc = buf_new(p, bs, NULL, ybytes2, 1, &dy2, err)) != 0)
		return rc;
	probe_path(p, path);
	tile = tile_rows > 0 ? tile_rows * w->k : cuda_matmul_tile_elems(&p->mm, &cw, n_tok);
	if (w2 != NULL)
		tile = MAX(tile, cuda_matmul_tile_elems(&p->mm, &cw2, n_tok));
	if ((rc = mm_scratch(p, w->k, n_tok, tile, reuse_x, err)) != 0)
		return rc;
	p->x_valid = 0;
	if ((rc = int8_scratch(p, path, w->k, n_tok, err)) != 0)
		return rc;
	if ((rc = matmul_parts(p, &cw, n_parts, w2 != NULL ? &cw2 : NULL, (const float *)dx, n_tok, (float *)dy,
	    (float *)dy2, reuse_x, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_matmul", err)) != 0 ||
	    (rc = guard_check(p, &p->xh, "cuda_matmul fp16 activations", err)) != 0 ||
	    (rc = guard_check(p, &p->xscale, "cuda_matmul row scales", err)) != 0 ||
	    (rc = guard_check(p, &p->wh, "cuda_matmul weight tile", err)) != 0 ||
	    (rc = guard_check(p, &p->part, "cuda_matmul split sums", err)) != 0 ||

	    (path == CUDA_PROBE_INT8 && ((rc = guard_check(p, &p->xq, "cuda_matmul int8 activations", err)) != 0 ||
	    (rc = guard_check(p, &p->xd, "cuda_matmul int8 scales", err)) != 0)))
		return rc;
	if (p->mm.mmv_max == 0) {
		p->x_valid = 1;
		p->x_k = w->k;
		p->x_tok = n_tok;
	}
	if (w2 != NULL && (rc = fetch(p, y2, dy2, ybytes2, err)) != 0)
		return rc;
	return fetch(p, y, dy, ybytes, err);
}

extern "C" int
cuda_probe_matmul(struct cuda_probe *p, const struct cuda_probe_weight *w, int n_parts, const float *x,
    int n_tok, enum cuda_probe_path path, int64_t tile_rows, int reuse_x, float *y, char *err)
{
	struct bufs bs = {};
	int rc = matmul_run(p, &bs, w, n_parts, NULL, x, n_tok, path, tile_rows, reuse_x, y, NULL, err);

	bufs_free(&bs);
	return rc;
}

extern "C" int
cuda_probe_matmul_two(struct cuda_probe *p, const struct cuda_probe_weight *w, const struct cuda_probe_weight *w2,
    const float *x, int n_tok, enum cuda_probe_path path, float *y, float *y2, char *err)
{
	struct bufs bs = {};
	int rc = matmul_run(p, &bs, w, 2, w2, x, n_tok, path, 0, 0, y, y2, err);

	bufs_free(&bs);
	return rc;
}

static int
embed_run(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_weight *w, const int32_t *tokens,
    int n_tok, float scale, float *out, char *err)
{
	struct cuda_weight cw;
	void *dt, *dout;
	size_t obytes = (size_t)n_tok * (size_t)w->k * sizeof(float);
	int rc;

	for (int t = 0; t < n_tok; t++)
		if (tokens[t] < 0 || tokens[t] >= w->n)
			return err_set(err, ERR_INVAL, "cuda_probe: token %d of %lld rows", tokens[t],
			    (long long)w->n);
	if ((rc = weight_up(p, bs, w, &cw, err)) != 0 ||
	    (rc = buf_new(p, bs, tokens, (size_t)n_tok * sizeof(int32_t), 0, &dt, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, obytes, 1, &dout, err)) != 0)
		return rc;
	if ((rc = cuda_embed(&cw, (const int32_t *)dt, n_tok, scale, (float *)dout, p->stream, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_embed", err)) != 0)
		return rc;
	return fetch(p, out, dout, obytes, err);
}

extern "C" int
cuda_probe_embed(struct cuda_probe *p, const struct cuda_probe_weight *w, const int32_t *tokens, int n_tok,
    float scale, float *out, char *err)
{
	struct bufs bs = {};
	int rc = embed_run(p, &bs, w, tokens, n_tok, scale, out, err);

	bufs_free(&bs);
	return rc;
}

/* Device buffers for n_rows rows of n in fp16 form (poisoned, guarded), when hh asks for them. */
static int
h16_new(struct cuda_probe *p, struct bufs *bs, const uint16_t *hh, int n_rows, int n, struct cuda_h16 *h16,
    char *err)
{
	void *dh = NULL, *ds = NULL;
	int rc;

	*h16 = (struct cuda_h16){ NULL, NULL };
	if (hh == NULL)
		return 0;
	if ((rc = buf_new(p, bs, NULL, (size_t)n_rows * (size_t)n * sizeof(__half), 1, &dh, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, (size_t)n_rows * sizeof(float), 1, &ds, err)) != 0)
		return rc;
	*h16 = (struct cuda_h16){ (__half *)dh, (float *)ds };
	return 0;
}

/* Copies the fp16 rows and their scales back. */
static int
h16_fetch(struct cuda_probe *p, const struct cuda_h16 *h16, uint16_t *hh, float *hscale, int n_rows, int n,
    char *err)
{
	int rc = fetch(p, hh, h16->h, (size_t)n_rows * (size_t)n * sizeof(__half), err);

	return rc != 0 ? rc : fetch(p, hscale, h16->scale, (size_t)n_rows * sizeof(float), err);
}

/* Device room for the int8 form of n_rows rows of n, if q (host) wants it; else q8 is none. */
static int
q8_new(struct cuda_probe *p, struct bufs *bs, const int8_t *q, int n_rows, int n, struct cuda_q8 *q8, char *err)
{
	void *dq, *dd;
	int rc;

	*q8 = (struct cuda_q8){ NULL, NULL };
	if (q == NULL)
		return 0;
	if ((rc = buf_new(p, bs, NULL, (size_t)n_rows * 2 * (size_t)n, 1, &dq, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, (size_t)n_rows * (size_t)n / 32 * sizeof(float2), 1, &dd, err)) != 0)
		return rc;
	*q8 = (struct cuda_q8){ (int8_t *)dq, (float2 *)dd };
	return 0;
}

/* Copies the int8 rows and their groups' scales and sums back, if q wants them. */
static int
q8_fetch(struct cuda_probe *p, const struct cuda_q8 *q8, int8_t *q, float *qd, int n_rows, int n, char *err)
{
	int rc;

	if (q == NULL)
		return 0;
	rc = fetch(p, q, q8->q, (size_t)n_rows * 2 * (size_t)n, err);
	return rc != 0 ? rc : fetch(p, qd, q8->d, (size_t)n_rows * (size_t)n / 32 * sizeof(float2), err);
}

static int
residual_norm_run(struct cuda_probe *p, struct bufs *bs, float *x, const float *r, const float *post,
    const float *w, float *h, uint16_t *hh, float *hscale, int8_t *q, float *qd, int n_rows, int n,
    struct cuda_norm nm, char *err)
{
	size_t rows = (size_t)n_rows * (size_t)n * sizeof(float), row = (size_t)n * sizeof(float);
	struct cuda_h16 h16;
	struct cuda_q8 q8;
	void *dx, *dr, *dpost, *dw, *dh = NULL;
	int rc;

	if ((rc = buf_new(p, bs, x, rows, 1, &dx, err)) != 0 ||
	    (rc = buf_opt(p, bs, r, rows, &dr, err)) != 0 ||
	    (rc = buf_opt(p, bs, post, row, &dpost, err)) != 0 ||
	    (rc = buf_opt(p, bs, w, row, &dw, err)) != 0 ||
	    (w != NULL && hh == NULL && (rc = buf_new(p, bs, NULL, rows, 1, &dh, err)) != 0) ||
	    (rc = h16_new(p, bs, w != NULL ? hh : NULL, n_rows, n, &h16, err)) != 0 ||
	    (rc = q8_new(p, bs, w != NULL ? q : NULL, n_rows, n, &q8, err)) != 0)
		return rc;
	if ((rc = cuda_residual_norm((float *)dx, (const float *)dr, NULL, (const float *)dpost, (const float *)dw,
	    (float *)dh, h16, q8, n_rows, n, nm, p->stream, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_residual_norm", err)) != 0 || (rc = fetch(p, x, dx, rows, err)) != 0)
		return rc;
	if (w == NULL)
		return 0;
	if ((rc = q8_fetch(p, &q8, q, qd, n_rows, n, err)) != 0)
		return rc;
	return hh != NULL ? h16_fetch(p, &h16, hh, hscale, n_rows, n, err) : fetch(p, h, dh, rows, err);
}

extern "C" int
cuda_probe_residual_norm(struct cuda_probe *p, float *x, const float *r, const float *post, const float *w,
    float *h, uint16_t *hh, float *hscale, int8_t *q, float *qd, int n_rows, int n, float offset, float eps,
    char *err)
{
	struct bufs bs = {};
	struct cuda_norm nm = { offset, eps };
	int rc = residual_norm_run(p, &bs, x, r, post, w, h, hh, hscale, q, qd, n_rows, n, nm, err);

	bufs_free(&bs);
	return rc;
}

static int
norm_router_run(struct cuda_probe *p, struct bufs *bs, const float *x, const float *r, const float *bias,
    const float *w, const float *router, int n_expert, float *logit, float *h, int8_t *q, float *qd, int n_tok,
    int n, struct cuda_norm nm, char *err)
{
	size_t rows = (size_t)n_tok * (size_t)n * sizeof(float), lbytes = (size_t)n_tok * (size_t)n_expert * sizeof(float);
	void *dx, *dr, *db = NULL, *dw, *drt, *dl, *dh, *dq = NULL, *dqd = NULL;
	struct cuda_q8 q8 = { NULL, NULL };
	int rc;

	if ((rc = buf_new(p, bs, x, rows, 0, &dx, err)) != 0 || (rc = buf_new(p, bs, r, rows, 0, &dr, err)) != 0 ||
	    (bias != NULL && (rc = buf_new(p, bs, bias, (size_t)n * sizeof(float), 0, &db, err)) != 0) ||
	    (rc = buf_new(p, bs, w, (size_t)n * sizeof(float), 0, &dw, err)) != 0 ||
	    (rc = buf_new(p, bs, router, (size_t)n_expert * (size_t)n * sizeof(float), 0, &drt, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, lbytes, 1, &dl, err)) != 0 || (rc = buf_new(p, bs, NULL, rows, 1, &dh, err)) != 0 ||
	    (q != NULL && (rc = buf_new(p, bs, NULL, rows / 2, 1, &dq, err)) != 0) ||
	    (q != NULL && (rc = buf_new(p, bs, NULL, rows / 16, 1, &dqd, err)) != 0))
		return rc;
	q8.q = (int8_t *)dq, q8.d = (float2 *)dqd;
	if ((rc = cuda_norm_router((const float *)dx, (const float *)dr, (const float *)db, (const float *)dw,
	    (const float *)drt, n_expert, (float *)dl, (float *)dh, q8, n_tok, n, nm, p->stream, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_norm_router", err)) != 0 || (rc = fetch(p, logit, dl, lbytes, err)) != 0 ||
	    (rc = fetch(p, h, dh, rows, err)) != 0 || (q != NULL && (rc = fetch(p, q, dq, rows / 2, err)) != 0))
		return rc;
	return q != NULL ? fetch(p, qd, dqd, rows / 16, err) : 0;
}

extern "C" int
cuda_probe_norm_router(struct cuda_probe *p, const float *x, const float *r, const float *bias, const float *w,
    const float *router, int n_expert, float *logit, float *h, int8_t *q, float *qd, int n_tok, int n, float offset,
    float eps, char *err)
{
	struct bufs bs = {};
	struct cuda_norm nm = { offset, eps };
	int rc = norm_router_run(p, &bs, x, r, bias, w, router, n_expert, logit, h, q, qd, n_tok, n, nm, err);

	bufs_free(&bs);
	return rc;
}

static int
norm_rows_run(struct cuda_probe *p, struct bufs *bs, const float *x, int n_x, const int32_t *rows,
    int n_rows, int n, const float *w, struct cuda_norm nm, float *h, char *err)
{
	size_t hbytes = (size_t)n_rows * (size_t)n * sizeof(float);
	void *dx, *drows, *dw, *dh;
	int rc;

	for (int i = 0; i < n_rows; i++)
		if (rows[i] < 0 || rows[i] >= n_x)
			return err_set(err, ERR_INVAL, "cuda_probe: row %d of %d", rows[i], n_x);
	if ((rc = buf_new(p, bs, x, (size_t)n_x * (size_t)n * sizeof(float), 0, &dx, err)) != 0 ||
	    (rc = buf_new(p, bs, rows, (size_t)n_rows * sizeof(int32_t), 0, &drows, err)) != 0 ||
	    (rc = buf_new(p, bs, w, (size_t)n * sizeof(float), 0, &dw, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, hbytes, 1, &dh, err)) != 0)
		return rc;
	if ((rc = cuda_norm_rows((const float *)dx, (const int32_t *)drows, (const float *)dw, (float *)dh,
	    n_rows, n, nm, p->stream, err)) != 0 || (rc = finish(p, bs, "cuda_norm_rows", err)) != 0)
		return rc;
	return fetch(p, h, dh, hbytes, err);
}

extern "C" int
cuda_probe_norm_rows(struct cuda_probe *p, const float *x, int n_x, const int32_t *rows, int n_rows, int n,
    const float *w, float offset, float eps, float *h, char *err)
{
	struct bufs bs = {};
	struct cuda_norm nm = { offset, eps };
	int rc = norm_rows_run(p, &bs, x, n_x, rows, n_rows, n, w, nm, h, err);

	bufs_free(&bs);
	return rc;
}

/* The fp16 rows, divisors and cleared flags of a GLU form (g, n_rows rows) back; an error if a flag is left. */
static int
glu16_fetch(struct cuda_probe *p, const struct cuda_glu16 *g, uint16_t *hh, float *hscale, int *big, int n_rows,
    char *err)
{
	struct cuda_h16 h16 = { g->h, g->scale };
	int rc;

	if ((rc = h16_fetch(p, &h16, hh, hscale, n_rows, g->ff, err)) != 0 ||
	    (rc = fetch(p, big, g->big, (size_t)n_rows * sizeof(int), err)) != 0)
		return rc;
	for (int r = 0; r < n_rows; r++)
		if (big[r] != 0)
			return err_set(err, ERR_DEVICE, "cuda_glu_fix: row %d's flag left %d", r, big[r]);
	return 0;
}

static int
matmul_glu_run(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_weight *w, const float *x, int n_tok,
    int gelu, uint16_t *hh, float *hscale, int *big, char *err)
{
	struct cuda_weight cw, gate, up;
	struct cuda_glu16 g = {};
	int ff = (int)(w->n / 2), rc;
	void *dx;

	if (n_tok < 1 || w->n % 2 != 0)
		return err_set(err, ERR_INVAL, "cuda_probe: a GLU form of %lld rows, %d tokens", (long long)w->n, n_tok);
	if ((rc = weight_up(p, bs, w, &cw, err)) != 0 ||
	    (rc = buf_new(p, bs, x, (size_t)n_tok * (size_t)w->k * sizeof(float), 0, &dx, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, (size_t)n_tok * ff * sizeof(__half), 1, (void **)&g.h, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, (size_t)n_tok * ff * sizeof(float), 1, (void **)&g.f, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, (size_t)n_tok * sizeof(float), 1, (void **)&g.scale, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, (size_t)n_tok * sizeof(int), 1, (void **)&g.big, err)) != 0)
		return rc;
	CK(cudaMemsetAsync(g.big, 0, (size_t)n_tok * sizeof(int), p->stream)); /* clear between steps, as at load */
	probe_path(p, CUDA_PROBE_WG_WHOLE);
	if ((rc = mm_scratch(p, w->k, n_tok, 1, 0, err)) != 0 ||
	    (rc = int8_scratch(p, CUDA_PROBE_WG_WHOLE, w->k, n_tok, err)) != 0)
		return rc;
	p->x_valid = 0;
	gate = cw, up = cw;
	gate.n = up.n = ff;
	up.d = cw.d + (size_t)ff * cw.row_bytes;
	g.ff = ff, g.gelu = gelu;
	if ((rc = cuda_matmul_glu(&p->mm, &gate, &up, (const float *)dx, (int)w->k, n_tok, &g, 0, err)) != 0 ||
	    (rc = cuda_glu_fix(&g, n_tok, p->stream, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_matmul_glu", err)) != 0 ||
	    (rc = guard_check(p, &p->xh, "cuda_matmul_glu fp16 activations", err)) != 0 ||
	    (rc = guard_check(p, &p->xscale, "cuda_matmul_glu row scales", err)) != 0 ||
	    (rc = guard_check(p, &p->part, "cuda_matmul_glu split sums", err)) != 0)
		return rc;
	return glu16_fetch(p, &g, hh, hscale, big, n_tok, err);
}

extern "C" int
cuda_probe_matmul_glu(struct cuda_probe *p, const struct cuda_probe_weight *w, const float *x, int n_tok,
    int gelu, uint16_t *hh, float *hscale, char *err)
{
	struct bufs bs = {};
	int *big = (int *)malloc((size_t)MAX(n_tok, 1) * sizeof(int));
	int rc = big == NULL ? err_set(err, ERR_NOMEM, "cuda_probe: %d flags", n_tok) :
			       matmul_glu_run(p, &bs, w, x, n_tok, gelu, hh, hscale, big, err);

	free(big);
	bufs_free(&bs);
	return rc;
}

static int
glu_fix_run(struct cuda_probe *p, struct bufs *bs, uint16_t *hh, const float *f, int *big, float *hscale,
    int n_rows, int n, char *err)
{
	struct cuda_glu16 g = {};
	int rc;

	if ((rc = buf_new(p, bs, hh, (size_t)n_rows * n * sizeof(__half), 1, (void **)&g.h, err)) != 0 ||
	    (rc = buf_new(p, bs, f, (size_t)n_rows * n * sizeof(float), 0, (void **)&g.f, err)) != 0 ||
	    (rc = buf_new(p, bs, hscale, (size_t)n_rows * sizeof(float), 1, (void **)&g.scale, err)) != 0 ||
	    (rc = buf_new(p, bs, big, (size_t)n_rows * sizeof(int), 1, (void **)&g.big, err)) != 0)
		return rc;
	g.ff = n;
	if ((rc = cuda_glu_fix(&g, n_rows, p->stream, err)) != 0 || (rc = finish(p, bs, "cuda_glu_fix", err)) != 0)
		return rc;
	return glu16_fetch(p, &g, hh, hscale, big, n_rows, err);
}

extern "C" int
cuda_probe_glu_fix(struct cuda_probe *p, uint16_t *hh, const float *f, int *big, float *hscale, int n_rows, int n,
    char *err)
{
	struct bufs bs = {};
	int rc = glu_fix_run(p, &bs, hh, f, big, hscale, n_rows, n, err);

	bufs_free(&bs);
	return rc;
}

static int
glu_run(struct cuda_probe *p, struct bufs *bs, float *a, const float *b, int n_rows, int n, int gelu,
    uint16_t *hh, float *hscale, int8_t *q, float *qd, char *err)
{
	size_t bytes = (size_t)n_rows * (size_t)n * sizeof(float);
	struct cuda_h16 h16;
	struct cuda_q8 q8;
	void *da, *db;
	int rc;

	if ((rc = buf_new(p, bs, a, bytes, 1, &da, err)) != 0 ||
	    (rc = buf_new(p, bs, b, bytes, 0, &db, err)) != 0 ||
	    (rc = h16_new(p, bs, hh, n_rows, n, &h16, err)) != 0 ||
	    (rc = q8_new(p, bs, q, n_rows, n, &q8, err)) != 0 ||
	    (rc = cuda_glu((float *)da, (const float *)db, n_rows, n, gelu, h16, q8, p->cluster_sms, p->stream, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_glu", err)) != 0 || (rc = q8_fetch(p, &q8, q, qd, n_rows, n, err)) != 0)
		return rc;
	return hh != NULL ? h16_fetch(p, &h16, hh, hscale, n_rows, n, err) : fetch(p, a, da, bytes, err);
}

extern "C" int
cuda_probe_glu(struct cuda_probe *p, float *a, const float *b, int n_rows, int n, int gelu, uint16_t *hh,
    float *hscale, int8_t *q, float *qd, char *err)
{
	struct bufs bs = {};
	int rc = glu_run(p, &bs, a, b, n_rows, n, gelu, hh, hscale, q, qd, err);

	bufs_free(&bs);
	return rc;
}

/* Bytes of the whole pool. */
static size_t
pool_bytes(const struct cuda_probe_heads *hd, const struct cuda_probe_kv *kv)
{
	return (size_t)kv->n_blocks * (size_t)kv->n_layer * 2 * KV_BLOCK_TOKENS *
	    kv_row_size((size_t)hd->n_head_kv * (size_t)hd->head_dim, kv->f32, kv->q8);
}

/* Refuses heads and token placements that would send a kernel outside its buffers. */
static int
check_heads(const struct cuda_probe_heads *hd, const struct cuda_probe_kv *kv, int n_tok, char *err)
{
	if (hd->n_head_kv < 1 || hd->n_head % hd->n_head_kv != 0 || hd->head_dim % 2 != 0 ||
	    hd->head_dim > 8 * WARP || kv->layer < 0 || kv->layer >= kv->n_layer || n_tok < 1)
		return err_set(err, ERR_INVAL, "cuda_probe: %d heads over %d, head_dim %d, layer %d of %d, "
		    "%d tokens", hd->n_head, hd->n_head_kv, hd->head_dim, kv->layer, kv->n_layer, n_tok);
	for (int t = 0; t < n_tok; t++) {
		int64_t e = (int64_t)kv->tok_tab[t] + kv->tok_pos[t] / KV_BLOCK_TOKENS;

		if (kv->tok_pos[t] < 0 || kv->tok_tab[t] < 0 || e >= kv->n_tables)
			return err_set(err, ERR_INVAL, "cuda_probe: token %d at position %d, table %d of %d",
			    t, kv->tok_pos[t], kv->tok_tab[t], kv->n_tables);
	}
	for (int i = 0; i < kv->n_tables; i++)
		if (kv->tables[i] < 0 || kv->tables[i] >= kv->n_blocks)
			return err_set(err, ERR_INVAL, "cuda_probe: block %d of %d", kv->tables[i], kv->n_blocks);
	return 0;
}

/*
 * The device form of the heads and the KV placement: small weights, the
 * RoPE table (as cuda_backend.cu's add_rope and cpu_rope compute it), the
 * pool and the token tables, all copied to the GPU.
 */
static int
heads_upload(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_heads *hd,
    const struct cuda_probe_kv *kv, int n_tok, int pool_written, struct cuda_heads *ch, struct cuda_kv *ck,
    char *err)
{
	size_t qb = (size_t)hd->n_head * (size_t)hd->head_dim * sizeof(float);
	size_t kb = (size_t)hd->n_head_kv * (size_t)hd->head_dim * sizeof(float);
	size_t db = (size_t)hd->head_dim * sizeof(float), ib = (size_t)n_tok * sizeof(int32_t);
	float freq[4 * WARP];
	void *d[10];
	int rc;

	struct model_hparams hp = {};

	*ch = {}, *ck = {}; /* fields the probe does not set (a bidirectional step's ends) stay off */
	hp.head_dim = hd->head_dim, hp.rope_theta = hp.rope_theta_local = hd->theta;
	model_rope_freqs(&hp, 0, freq);
	if ((rc = buf_opt(p, bs, hd->bq, qb, &d[0], err)) != 0 ||
	    (rc = buf_opt(p, bs, hd->bk, kb, &d[1], err)) != 0 ||
	    (rc = buf_opt(p, bs, hd->bv, kb, &d[2], err)) != 0 ||
	    (rc = buf_opt(p, bs, hd->q_norm, db, &d[3], err)) != 0 ||
	    (rc = buf_opt(p, bs, hd->k_norm, db, &d[4], err)) != 0 ||
	    (rc = buf_new(p, bs, freq, db / 2, 0, &d[5], err)) != 0 ||
	    (rc = buf_new(p, bs, kv->pool, pool_bytes(hd, kv), pool_written, &d[6], err)) != 0 ||
	    (rc = buf_new(p, bs, kv->tok_pos, ib, 0, &d[7], err)) != 0 ||
	    (rc = buf_new(p, bs, kv->tok_tab, ib, 0, &d[8], err)) != 0 ||
	    (rc = buf_new(p, bs, kv->tables, (size_t)kv->n_tables * sizeof(int32_t), 0, &d[9], err)) != 0)
		return rc;
	ch->n_head = hd->n_head, ch->n_head_kv = hd->n_head_kv, ch->head_dim = hd->head_dim;
	ch->bq = (const float *)d[0], ch->bk = (const float *)d[1], ch->bv = (const float *)d[2];
	ch->q_norm = (const float *)d[3], ch->k_norm = (const float *)d[4];
	ch->nm.offset = hd->norm_offset, ch->nm.eps = hd->norm_eps;
	ch->inv_freq = (const float *)d[5];
	ch->pos_div = hd->pos_div, ch->neox = hd->neox, ch->scale = hd->scale, ch->window = hd->window;
	ch->sinks = NULL;
	ck->pool = d[6];
	ck->f32 = kv->f32;
	ck->q8 = kv->q8;
	ck->part = NULL;
	ck->part_rows = 0;
	ck->kv_stride = KV_BLOCK_TOKENS * (kv->q8 ? kv_row_size((size_t)hd->n_head_kv * (size_t)hd->head_dim, 0, 1) :
	    (size_t)hd->n_head_kv * (size_t)hd->head_dim);
	ck->n_layer = kv->n_layer, ck->layer = kv->layer;
	ck->tok_pos = (const int32_t *)d[7], ck->tok_tab = (const int32_t *)d[8];
	ck->tables = (const int32_t *)d[9];
	ck->fa_tiles = ck->fa_tok = NULL;
	ck->fa_grid = 0;
	ck->dec_tc = 0;
	ck->sms = p->sms;
	ck->max_len = 0;
	for (int t = 0; t < n_tok; t++)
		ck->max_len = MAX(ck->max_len, kv->tok_pos[t] + 1);
	return cuda_attention_wide_blocks(hd->head_dim, kv->q8, kv->f32, &ck->wide, err);
}

/*
 * The prefill tiles of kv's tokens, as cuda_backend.cu's stage_tiles makes
 * them, uploaded into ck (nothing when the kernel does not serve the heads).
 */
static int
flash_tiles(struct cuda_probe *p, struct bufs *bs, const struct cuda_heads *ch, const struct cuda_probe_kv *kv,
    int n_tok, struct cuda_kv *ck, char *err)
{
	int32_t *tiles = (int32_t *)xcalloc((size_t)n_tok + 1, sizeof *tiles);
	int32_t *flags = (int32_t *)xcalloc((size_t)n_tok, sizeof *flags);
	void *dt = NULL, *df = NULL;
	int per = 0, rc;

	if (kv->flash && cuda_flash_usable(ch, kv->f32, &per)) {
		for (int t0 = 0, t1; t0 < n_tok; t0 = t1) {
			for (t1 = t0 + 1; t1 < n_tok && kv->tok_tab[t1] == kv->tok_tab[t0]; t1++)
				;
			for (int t = t0; t < t1 && t1 - t0 >= FLASH_MIN_TOKENS; t += per) {
				tiles[1 + tiles[0]++] = FLASH_TILE(t, MIN(per, t1 - t));
				for (int i = t; i < t + MIN(per, t1 - t); i++)
					flags[i] = 1;
			}
		}
	}
	rc = buf_new(p, bs, tiles, ((size_t)n_tok + 1) * sizeof *tiles, 0, &dt, err);
	if (rc == 0)
		rc = buf_new(p, bs, flags, (size_t)n_tok * sizeof *flags, 0, &df, err);
	if (rc == 0 && tiles[0] > 0) {
		ck->fa_tiles = (const int32_t *)dt;
		ck->fa_tok = (const int32_t *)df;
		ck->fa_grid = tiles[0] + 3;
	}
	free(tiles), free(flags);
	return rc;
}

static int
qk_run(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_heads *hd, struct cuda_probe_kv *kv,
    float *q, const float *k, const float *v, int n_tok, char *err)
{
	size_t qb = (size_t)n_tok * (size_t)hd->n_head * (size_t)hd->head_dim * sizeof(float);
	size_t kb = (size_t)n_tok * (size_t)hd->n_head_kv * (size_t)hd->head_dim * sizeof(float);
	struct cuda_heads ch;
	struct cuda_kv ck;
	void *dq, *dk, *dv;
	int rc;

	if ((rc = check_heads(hd, kv, n_tok, err)) != 0 ||
	    (rc = heads_upload(p, bs, hd, kv, n_tok, 1, &ch, &ck, err)) != 0 ||
	    (rc = buf_new(p, bs, q, qb, 1, &dq, err)) != 0 ||
	    (rc = buf_new(p, bs, k, kb, 1, &dk, err)) != 0 ||
	    (rc = buf_new(p, bs, v, kb, 0, &dv, err)) != 0)
		return rc;
	if ((rc = cuda_qk((float *)dq, (float *)dk, (const float *)dv, n_tok, &ch, &ck, p->stream, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_qk", err)) != 0 || (rc = fetch(p, q, dq, qb, err)) != 0)
		return rc;
	return fetch(p, kv->pool, ck.pool, pool_bytes(hd, kv), err);
}

extern "C" int
cuda_probe_qk(struct cuda_probe *p, const struct cuda_probe_heads *hd, struct cuda_probe_kv *kv, float *q,
    const float *k, const float *v, int n_tok, char *err)
{
	struct bufs bs = {};
	int rc = qk_run(p, &bs, hd, kv, q, k, v, n_tok, err);

	bufs_free(&bs);
	return rc;
}

/* The Q, K and V weights of cuda_probe_qkv: w's rows cut at the heads (V its last rows, or cw2's). */
static void
qkv_parts(const struct cuda_weight *cw, const struct cuda_weight *cw2, int nq, int nkv, struct cuda_weight part[3])
{
	for (int i = 0; i < 3; i++) {
		int64_t r0 = i == 0 ? 0 : i == 1 ? nq : nq + nkv;

		part[i] = *cw;
		part[i].d = cw->d + (size_t)r0 * cw->row_bytes;
		part[i].n = i == 0 ? nq : nkv;
	}
	if (cw2 != NULL)
		part[2] = *cw2;
}

static int
qkv_run(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_weight *w,
    const struct cuda_probe_weight *w2, const float *x, int n_tok, enum cuda_probe_path path,
    const struct cuda_probe_heads *hd, struct cuda_probe_kv *kv, float *q, char *err)
{
	int nq = hd->n_head * hd->head_dim, nkv = hd->n_head_kv * hd->head_dim;
	size_t qb = (size_t)n_tok * (size_t)nq * sizeof(float);
	struct cuda_weight cw, cw2, part[3];
	const struct cuda_weight *wp[3] = { &part[0], &part[1], &part[2] };
	struct cuda_heads ch;
	struct cuda_kv ck;
	void *dx, *dq;
	int rc;

	if (w->n != nq + (w2 != NULL ? 1 : 2) * nkv || (w2 != NULL && (w2->n != nkv || w2->k != w->k)))
		return err_set(err, ERR_INVAL, "cuda_probe: %lld + %lld rows for %d + 2 x %d", (long long)w->n,
		    (long long)(w2 != NULL ? w2->n : 0), nq, nkv);
	if (path != CUDA_PROBE_INT8 && path != CUDA_PROBE_FEW)
		return err_set(err, ERR_INVAL, "cuda_probe: Q/K/V with qk's work on the int8 or few-token path only");
	if ((rc = check_heads(hd, kv, n_tok, err)) != 0 ||
	    (rc = heads_upload(p, bs, hd, kv, n_tok, 1, &ch, &ck, err)) != 0 ||
	    (rc = weight_up(p, bs, w, &cw, err)) != 0 || (w2 != NULL && (rc = weight_up(p, bs, w2, &cw2, err)) != 0) ||
	    (rc = buf_new(p, bs, x, (size_t)n_tok * (size_t)w->k * sizeof(float), 0, &dx, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, qb, 1, &dq, err)) != 0 ||
	    (rc = mm_scratch(p, w->k, n_tok, 0, 0, err)) != 0 ||
	    (rc = int8_scratch(p, path, w->k, n_tok, err)) != 0)
		return rc;
	p->x_valid = 0;
	probe_path(p, path);
	qkv_parts(&cw, w2 != NULL ? &cw2 : NULL, nq, nkv, part);
	if ((rc = cuda_matmul_qkv(&p->mm, wp, (const float *)dx, (int)w->k, n_tok, (float *)dq, &ch, &ck, 0, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_matmul_qkv", err)) != 0 ||
	    (rc = guard_check(p, &p->xh, "cuda_matmul_qkv fp16 activations", err)) != 0 ||
	    (rc = guard_check(p, &p->xscale, "cuda_matmul_qkv row scales", err)) != 0 ||
	    (path == CUDA_PROBE_INT8 && ((rc = guard_check(p, &p->xq, "cuda_matmul_qkv int8 activations", err)) != 0 ||
	    (rc = guard_check(p, &p->xd, "cuda_matmul_qkv int8 scales", err)) != 0)) ||
	    (rc = fetch(p, q, dq, qb, err)) != 0)
		return rc;
	return fetch(p, kv->pool, ck.pool, pool_bytes(hd, kv), err);
}

extern "C" int
cuda_probe_qkv(struct cuda_probe *p, const struct cuda_probe_weight *w, const struct cuda_probe_weight *w2,
    const float *x, int n_tok, enum cuda_probe_path path, const struct cuda_probe_heads *hd,
    struct cuda_probe_kv *kv, float *q, char *err)
{
	struct bufs bs = {};
	int rc = qkv_run(p, &bs, w, w2, x, n_tok, path, hd, kv, q, err);

	bufs_free(&bs);
	return rc;
}

/* The scratch of split attention, as many rows as the backend gives it, into ck. */
static int
split_scratch(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_heads *hd, struct cuda_kv *ck, char *err)
{
	void *part;
	int rc;

	ck->part_rows = cuda_attention_part_rows(0);
	if ((rc = buf_new(p, bs, NULL, (size_t)ck->part_rows * (size_t)(hd->head_dim + 2) * sizeof(float), 1, &part,
	    err)) != 0)
		return rc;
	ck->part = (float *)part;
	return 0;
}

/*
 * cuda_attention of q over kv's pool; with k (and v) a decode step whose
 * K and V rows are given raw (cuda_kv.k_new), the pool copied back.
 */
static int
attention_run(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_heads *hd,
    const struct cuda_probe_kv *kv, const float *q, const float *k, const float *v, int n_tok, float *out,
    int8_t *q8, float *q8d, uint16_t *h16, float *h16s, char *err)
{
	size_t n = (size_t)n_tok * (size_t)hd->n_head * (size_t)hd->head_dim, qb = n * sizeof(float);
	size_t kb = (size_t)n_tok * (size_t)hd->n_head_kv * (size_t)hd->head_dim * sizeof(float);
	struct cuda_heads ch;
	struct cuda_kv ck;
	struct cuda_q8 dq8 = { NULL, NULL };
	struct cuda_h16 dh16 = { NULL, NULL };
	void *dq, *dout, *d8 = NULL, *d8d = NULL, *dh = NULL, *dhs = NULL, *dk, *dv;
	int rc;

	for (int t = 1; k != NULL && t < n_tok; t++)
		if (kv->tok_tab[t] == kv->tok_tab[t - 1])
			return err_set(err, ERR_INVAL, "cuda_probe: raw K and V rows are a decode step's, one token a "
			    "sequence");
	if ((rc = check_heads(hd, kv, n_tok, err)) != 0 ||
	    (rc = heads_upload(p, bs, hd, kv, n_tok, k != NULL, &ch, &ck, err)) != 0 ||
	    (rc = buf_new(p, bs, q, qb, 0, &dq, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, qb, 1, &dout, err)) != 0 ||
	    (q8 != NULL && ((rc = buf_new(p, bs, NULL, 2 * n, 1, &d8, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, n / 32 * sizeof(float2), 1, &d8d, err)) != 0)))
		return rc;
	if (h16 != NULL && ((rc = buf_new(p, bs, NULL, n * sizeof(uint16_t), 1, &dh, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, (size_t)n_tok * sizeof(float), 1, &dhs, err)) != 0))
		return rc;
	if (k != NULL) {
		if ((rc = buf_new(p, bs, k, kb, 0, &dk, err)) != 0 || (rc = buf_new(p, bs, v, kb, 0, &dv, err)) != 0)
			return rc;
		ck.k_new = (const float *)dk, ck.v_new = (const float *)dv;
	}
	dq8.q = (int8_t *)d8, dq8.d = (float2 *)d8d;
	dh16.h = (__half *)dh, dh16.scale = (float *)dhs;
	if (kv->split && (rc = split_scratch(p, bs, hd, &ck, err)) != 0)
		return rc;
	if (kv->dec_tc && (rc = cuda_flash_decode_blocks(hd->head_dim, kv->q8, &ck.dec_tc, err)) != 0)
		return rc;
	if (kv->dec_tc && ck.dec_tc < 1)
		return err_set(err, ERR_UNSUPPORTED, "decode attention on the tensor cores: head_dim %d%s does not fit "
		    "this device", hd->head_dim, kv->q8 ? " with a q8 pool" : "");
	if ((rc = flash_tiles(p, bs, &ch, kv, n_tok, &ck, err)) != 0)
		return rc;
	if ((rc = cuda_attention((const float *)dq, (float *)dout, dq8, dh16, n_tok, &ch, &ck, p->stream, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_attention", err)) != 0)
		return rc;
	if (q8 != NULL && ((rc = fetch(p, q8, d8, 2 * n, err)) != 0 ||
	    (rc = fetch(p, q8d, d8d, n / 32 * sizeof(float2), err)) != 0))
		return rc;
	if (h16 != NULL && ((rc = fetch(p, h16, dh, n * sizeof(uint16_t), err)) != 0 ||
	    (rc = fetch(p, h16s, dhs, (size_t)n_tok * sizeof(float), err)) != 0))
		return rc;
	if (k != NULL && (rc = fetch(p, kv->pool, ck.pool, pool_bytes(hd, kv), err)) != 0)
		return rc;
	return fetch(p, out, dout, qb, err);
}

extern "C" int
cuda_probe_attention(struct cuda_probe *p, const struct cuda_probe_heads *hd, const struct cuda_probe_kv *kv,
    const float *q, int n_tok, float *out, int8_t *q8, float *q8d, uint16_t *h16, float *h16s, char *err)
{
	struct bufs bs = {};
	int rc = attention_run(p, &bs, hd, kv, q, NULL, NULL, n_tok, out, q8, q8d, h16, h16s, err);

	bufs_free(&bs);
	return rc;
}

extern "C" int
cuda_probe_attention_new(struct cuda_probe *p, const struct cuda_probe_heads *hd, struct cuda_probe_kv *kv,
    const float *q, const float *k, const float *v, int n_tok, float *out, char *err)
{
	struct bufs bs = {};
	int rc = attention_run(p, &bs, hd, kv, q, k, v, n_tok, out, NULL, NULL, NULL, NULL, err);

	bufs_free(&bs);
	return rc;
}

static int
argmax_run(struct cuda_probe *p, struct bufs *bs, const float *x, int n_rows, int n, int32_t *ids, char *err)
{
	size_t ib = (size_t)n_rows * sizeof(int32_t);
	void *dx, *di, *dpart;
	int rc;

	if (n_rows < 1 || n < 1)
		return err_set(err, ERR_INVAL, "cuda_probe: argmax of %d rows of %d", n_rows, n);
	if ((rc = buf_new(p, bs, x, (size_t)n_rows * (size_t)n * sizeof(float), 0, &dx, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, ib, 1, &di, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, CUDA_ARGMAX_PARTS(n_rows) * sizeof(float2), 1, &dpart, err)) != 0)
		return rc;
	if ((rc = cuda_argmax((const float *)dx, n_rows, n, (int32_t *)di, (float2 *)dpart, p->stream, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_argmax", err)) != 0)
		return rc;
	return fetch(p, ids, di, ib, err);
}

extern "C" int
cuda_probe_argmax(struct cuda_probe *p, const float *x, int n_rows, int n, int32_t *ids, char *err)
{
	struct bufs bs = {};
	int rc = argmax_run(p, &bs, x, n_rows, n, ids, err);

	bufs_free(&bs);
	return rc;
}

static int
pick_run(struct cuda_probe *p, struct bufs *bs, const float *x, int n_rows, int n, const struct fwd_pick *how,
    const int32_t *pen_tok, const int32_t *pen_cnt, int n_pairs, int32_t *ids, float *logprob, int32_t *top_ids,
    float *top_lp, char *err)
{
	size_t ib = (size_t)n_rows * sizeof(int32_t), pb = (size_t)MAX(n_pairs, 1) * sizeof(int32_t);
	size_t tb = (size_t)n_rows * FWD_TOP_LOGPROBS * sizeof(int32_t);
	void *dx, *dhow, *dtok, *dcnt, *di, *dlp, *dpart, *dti, *dtl;
	int rc;

	if (n_rows < 1 || n < 1 || n > FWD_PICK_MAX_VOCAB || n_pairs < 0)
		return err_set(err, ERR_INVAL, "cuda_probe: picks of %d rows of %d", n_rows, n);
	for (int r = 0; r < n_rows; r++)
		if (how[r].pen0 < 0 || how[r].n_pen < 0 || how[r].pen0 + how[r].n_pen > n_pairs)
			return err_set(err, ERR_INVAL, "cuda_probe: row %d's penalty window", r);
	/* the penalties rewrite the logits in place */
	if ((rc = buf_new(p, bs, x, (size_t)n_rows * (size_t)n * sizeof(float), n_pairs > 0, &dx, err)) != 0 ||
	    (rc = buf_new(p, bs, how, (size_t)n_rows * sizeof *how, 0, &dhow, err)) != 0 ||
	    (rc = buf_new(p, bs, n_pairs > 0 ? pen_tok : NULL, pb, 0, &dtok, err)) != 0 ||
	    (rc = buf_new(p, bs, n_pairs > 0 ? pen_cnt : NULL, pb, 0, &dcnt, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, ib, 1, &di, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, (size_t)n_rows * sizeof(float), 1, &dlp, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, tb, 1, &dti, err)) != 0 || (rc = buf_new(p, bs, NULL, tb, 1, &dtl, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, CUDA_PICK_SCRATCH(n_rows, n) * sizeof(uint64_t), 1, &dpart, err)) != 0)
		return rc;
	if ((rc = cuda_pick((float *)dx, n_rows, n, (const struct fwd_pick *)dhow, (const int32_t *)dtok,
	    (const int32_t *)dcnt, n_pairs > 0, (int32_t *)di, (float *)dlp, (int32_t *)dti, (float *)dtl,
	    (uint64_t *)dpart, p->stream, err)) != 0 ||
	    (rc = finish(p, bs, "cuda_pick", err)) != 0)
		return rc;
	if ((rc = fetch(p, ids, di, ib, err)) != 0 || (rc = fetch(p, top_ids, dti, tb, err)) != 0 ||
	    (rc = fetch(p, top_lp, dtl, tb, err)) != 0)
		return rc;
	return fetch(p, logprob, dlp, (size_t)n_rows * sizeof(float), err);
}

extern "C" int
cuda_probe_pick(struct cuda_probe *p, const float *x, int n_rows, int n, const struct fwd_pick *how,
    const int32_t *pen_tok, const int32_t *pen_cnt, int n_pairs, int32_t *ids, float *logprob, int32_t *top_ids,
    float *top_lp, char *err)
{
	struct bufs bs = {};
	int rc = pick_run(p, &bs, x, n_rows, n, how, pen_tok, pen_cnt, n_pairs, ids, logprob, top_ids, top_lp, err);

	bufs_free(&bs);
	return rc;
}

/* A device copy of n floats of host, or NULL for NULL. */
static int
floats_opt(struct cuda_probe *p, struct bufs *bs, const float *host, size_t n, float **out, char *err)
{
	return buf_opt(p, bs, host, n * sizeof(float), (void **)out, err);
}

/* The routing's arrays and the experts' rows of R rows, poisoned, as scratch. */
static int
moe_scratch(struct cuda_probe *p, struct bufs *bs, int n_tok, int n_expert, int R, int64_t d, int64_t f,
    struct cuda_moe_scratch *s, char *err)
{
	struct cuda_route *r = &s->route;
	size_t ib = (size_t)R * sizeof(int32_t);
	int rc;

	memset(s, 0, sizeof *s);
	(void)((rc = buf_new(p, bs, NULL, (size_t)n_tok * n_expert * sizeof(float), 1, (void **)&r->logit, err)) ||
	    (rc = buf_new(p, bs, NULL, ib, 1, (void **)&r->expert, err)) ||
	    (rc = buf_new(p, bs, NULL, (size_t)R * sizeof(float), 1, (void **)&r->weight, err)) ||
	    (rc = buf_new(p, bs, NULL, ib, 1, (void **)&r->row, err)) ||
	    (rc = buf_new(p, bs, NULL, ib, 1, (void **)&r->row_expert, err)) ||
	    (rc = buf_new(p, bs, NULL, ib, 1, (void **)&r->row_slot, err)) ||
	    (rc = buf_new(p, bs, NULL, (1 + 3 * (size_t)cuda_moe_max_tiles(R, n_expert, MOE_MIN_TILE_ROWS)) * sizeof(int32_t), 1,
	    (void **)&r->tiles, err)) ||
	    (rc = buf_new(p, bs, NULL, (size_t)R * (size_t)f * sizeof(float), 1, (void **)&s->gate, err)) ||
	    (rc = buf_new(p, bs, NULL, (size_t)R * (size_t)f * sizeof(float), 1, (void **)&s->up, err)) ||
	    (rc = buf_new(p, bs, NULL, (size_t)R * (size_t)d * sizeof(float), 1, (void **)&s->down, err)));
	return rc;
}

static int
moe_run(struct cuda_probe *p, struct bufs *bs, const struct cuda_probe_moe *mo, const float *x, int n_tok,
    enum cuda_probe_path path, float *out, int32_t *expert, float *weight, char *err)
{
	struct cuda_moe e = {};
	struct cuda_moe_scratch s;
	struct cuda_rmix mix;
	struct cuda_h16 none = { NULL, NULL };
	struct cuda_q8 no_q8 = { NULL, NULL };
	struct cuda_norm nm = { 0, 1e-6f };
	int64_t d = mo->router.k, f = mo->down.k;
	int R = n_tok * mo->n_used, rc;
	float *dx, *dout;

	if ((rc = weight_up(p, bs, &mo->router, &e.router, err)) != 0 || (rc = weight_up(p, bs, &mo->gate_up, &e.gu, err)) != 0 ||
	    (rc = weight_up(p, bs, &mo->down, &e.down, err)) != 0)
		return rc;
	e.gu.n = 2 * f, e.down.n = d;
	e.gu_stride = (size_t)e.gu.n * e.gu.row_bytes, e.down_stride = (size_t)e.down.n * e.down.row_bytes;
	e.act.kind = mo->act, e.act.alpha = mo->alpha, e.act.limit = mo->limit;
	e.n_expert = mo->n_expert, e.n_used = mo->n_used, e.norm = mo->norm;
	probe_path(p, path);
	e.slots_max = p->mm.mmv_max;
	e.int_max = path == CUDA_PROBE_FEW ? INT_MAX : 0; /* grouped on the integer kernel; CUDA_PROBE_GEMM: tensor cores */
	if ((rc = floats_opt(p, bs, mo->router_b, (size_t)mo->n_expert, &e.router_b, err)) != 0 ||
	    (rc = floats_opt(p, bs, mo->gate_b, (size_t)(mo->n_expert * f), &e.gate_b, err)) != 0 ||
	    (rc = floats_opt(p, bs, mo->up_b, (size_t)(mo->n_expert * f), &e.up_b, err)) != 0 ||
	    (rc = floats_opt(p, bs, mo->down_b, (size_t)(mo->n_expert * d), &e.down_b, err)) != 0 ||
	    (rc = moe_scratch(p, bs, n_tok, mo->n_expert, R, d, f, &s, err)) != 0 ||
	    (rc = mm_scratch(p, MAX(d, f), R, 1, 0, err)) != 0 || (rc = int8_scratch(p, path == CUDA_PROBE_FEW ? CUDA_PROBE_INT8 : path, MAX(d, f), R, err)) != 0 ||
	    (rc = buf_new(p, bs, x, (size_t)n_tok * (size_t)d * sizeof(float), 0, (void **)&dx, err)) != 0 ||
	    (rc = buf_new(p, bs, NULL, (size_t)n_tok * (size_t)d * sizeof(float), 1, (void **)&dout, err)) != 0)
		return rc;
	CK(cudaMemsetAsync(dout, 0, (size_t)n_tok * (size_t)d * sizeof(float), p->stream));
	/* out = 0 + the mixture of each token's rows, as the residual stream takes it */
	if ((rc = cuda_moe_ffn(&p->mm, &e, &s, dx, (int)d, n_tok, 0, NULL, &mix, err)) != 0 ||
	    (rc = cuda_residual_norm(dout, s.down, &mix, NULL, NULL, NULL, none, no_q8, n_tok, (int)d, nm, p->stream,
	    err)) != 0 || (rc = finish(p, bs, "cuda_moe_ffn", err)) != 0 ||
	    (rc = fetch(p, out, dout, (size_t)n_tok * (size_t)d * sizeof(float), err)) != 0 ||
	    (rc = fetch(p, expert, s.route.expert, (size_t)R * sizeof(int32_t), err)) != 0)
		return rc;
	return fetch(p, weight, s.route.weight, (size_t)R * sizeof(float), err);
}

extern "C" int
cuda_probe_moe(struct cuda_probe *p, const struct cuda_probe_moe *mo, const float *x, int n_tok,
    enum cuda_probe_path path, float *out, int32_t *expert, float *weight, char *err)
{
	struct bufs bs = {};
	int rc = moe_run(p, &bs, mo, x, n_tok, path, out, expert, weight, err);

	bufs_free(&bs);
	return rc;
}
