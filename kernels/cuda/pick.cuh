/* pick.cuh: a token drawn from each logits row on the device (pick.cu). */
#ifndef RESIDENT_PICK_CUH
#define RESIDENT_PICK_CUH

#include "cuda_common.cuh"
#include "kernels.h"

/* Logits a block of the first kernel sorts (FWD_PICK_MAX_VOCAB is 64 of them). */
#define PICK_SLICE 4096
#define PICK_SLICES(n) (((size_t)(n) + PICK_SLICE - 1) / PICK_SLICE)
/* Scratch of cuda_pick, in uint64_t, for n_rows rows of n logits. */
#define CUDA_PICK_SCRATCH(n_rows, n) ((size_t)(n_rows) * PICK_SLICES(n) * FWD_PICK_TOP_K)

/*
 * ids[r] = the token drawn from row r of logits (n_rows rows of n) as
 * how[r] says (struct fwd_pick), r < n_rows; scratch holds
 * CUDA_PICK_SCRATCH(n_rows, n). ERR_UNSUPPORTED past FWD_PICK_MAX_VOCAB.
 */
int cuda_pick(const float *logits, int n_rows, int n, const struct fwd_pick *how, int32_t *ids, uint64_t *scratch,
    cudaStream_t st, char *err);

#endif
