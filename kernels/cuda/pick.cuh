/* pick.cuh: a token drawn from each logits row on the device (pick.cu). */
#ifndef RESIDENT_PICK_CUH
#define RESIDENT_PICK_CUH

#include "cuda_common.cuh"
#include "kernels.h"

/* Logits a block of the first kernel sorts (FWD_PICK_MAX_VOCAB is 64 of them). */
#define PICK_SLICE 4096
#define PICK_SLICES(n) (((size_t)(n) + PICK_SLICE - 1) / PICK_SLICE)
/* Scratch of cuda_pick, in uint64_t, for n_rows rows of n logits: each slice's best keys, then its sums. */
#define CUDA_PICK_SCRATCH(n_rows, n) ((size_t)(n_rows) * PICK_SLICES(n) * (FWD_PICK_TOP_K + 1))

/*
 * ids[r] = the token drawn from row r of logits (n_rows rows of n) as
 * how[r] says (struct fwd_pick), r < n_rows, after its penalties (pen_tok,
 * pen_cnt; applied to logits in place, only when penalized) and, where
 * how[r].logprob, logprob[r] = its log-probability, and its how[r].top
 * most likely tokens and theirs from top_ids and top_lp + r *
 * FWD_TOP_LOGPROBS on; scratch holds CUDA_PICK_SCRATCH(n_rows, n).
 * ERR_UNSUPPORTED past FWD_PICK_MAX_VOCAB.
 */
int cuda_pick(float *logits, int n_rows, int n, const struct fwd_pick *how, const int32_t *pen_tok,
    const int32_t *pen_cnt, int penalized, int32_t *ids, float *logprob, int32_t *top_ids, float *top_lp,
    uint64_t *scratch, cudaStream_t st, char *err);

/*
 * Constrained rows: of the n_rows rows of n logits that are rows r0.. of
 * the step, those listed in rows[0..n_masked) keep the logits of the tokens
 * whose bits are set in their mask (bits + i * FWD_MASK_WORDS(n)); the
 * others become -inf.
 */
int cuda_mask_logits(float *logits, int r0, int n_rows, int n, const int32_t *rows, const uint32_t *bits,
    int n_masked, cudaStream_t st, char *err);

#endif
