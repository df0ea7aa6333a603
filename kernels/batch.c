/* batch.c: what every backend checks of a step before it runs it; the KV types' names. */
#include "config.h"
#include "kernels.h"
#include "util.h"

#include <math.h>
#include <string.h>

static const char *const kv_type_names[] = { [KV_F16] = "f16", [KV_Q8_0] = "q8_0" };

int
kv_type_parse(const char *s, enum kv_type *t, char *err)
{
	for (size_t i = 0; i < ARRAY_LEN(kv_type_names); i++)
		if (strcmp(s, kv_type_names[i]) == 0) {
			*t = (enum kv_type)i;
			return 0;
		}
	return err_set(err, ERR_INVAL, "KV type '%s': f16 or q8_0", s);
}

const char *
kv_type_name(enum kv_type t)
{
	return (size_t)t < ARRAY_LEN(kv_type_names) ? kv_type_names[t] : "?";
}

int
kv_type_check(enum kv_type t, int head_dim, char *err)
{
	if (t == KV_Q8_0 && head_dim % 32 != 0)
		return err_set(err, ERR_UNSUPPORTED, "a q8_0 KV cache needs heads of a multiple of 32 values (this "
		    "model's have %d): use --kv-type f16", head_dim);
	return 0;
}

int
fwd_batch_check(const struct fwd_batch *batch, int32_t max_tokens, int64_t kv_blocks, int32_t n_vocab,
    int64_t *max_len, int64_t *n_table, char *err)
{
	int32_t s, i, total = 0;

	if (batch->n_tokens < 1 || batch->n_tokens > max_tokens)
		return err_set(err, ERR_RANGE, "a step of %d tokens (1..%d allowed)", batch->n_tokens, max_tokens);
	*max_len = *n_table = 0;
	for (s = 0; s < batch->n_seqs; s++) {
		const struct fwd_seq *q = &batch->seqs[s];
		int64_t len = (int64_t)q->pos0 + q->n_new;

		if (q->n_new < 1 || q->pos0 < 0 || q->logits < 0 || q->logits > q->n_new ||
		    (q->logits != 0 && q->logits != 1 && q->logits != q->n_new))
			return err_set(err, ERR_INVAL, "sequence %d: bad token or logit counts", s);
		if (q->embd < 0 || q->embd > q->n_new || (q->embd != 0 && q->embd != 1 && q->embd != q->n_new) ||
		    (q->embd != 0 && (q->logits != 0 || batch->embd == NULL)))
			return err_set(err, ERR_INVAL, "sequence %d: bad hidden-state rows", s);
		if (q->bidir && q->pos0 != 0)
			return err_set(err, ERR_INVAL, "sequence %d: bidirectional attention over part of it", s);
		if ((int64_t)q->n_blocks * KV_BLOCK_TOKENS < len)
			return err_set(err, ERR_INVAL, "sequence %d: %d blocks cannot hold %lld positions",
			    s, q->n_blocks, (long long)len);
		for (i = 0; i < q->n_blocks; i++)
			if (q->block_table[i] < 0 || q->block_table[i] >= kv_blocks)
				return err_set(err, ERR_INVAL, "sequence %d: block %d out of the pool", s,
				    q->block_table[i]);
		*max_len = MAX(*max_len, len);
		*n_table += (len + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
		total += q->n_new;
	}
	if (total != batch->n_tokens)
		return err_set(err, ERR_INVAL, "sequences carry %d tokens, the batch %d", total, batch->n_tokens);
	for (i = 0; i < batch->n_tokens; i++)
		if (batch->tokens[i] < 0 || batch->tokens[i] >= n_vocab)
			return err_set(err, ERR_INVAL, "token id %d out of the vocabulary", batch->tokens[i]);
	return 0;
}

int
fwd_masks_get(const struct fwd_batch *batch, int32_t n_logits, struct fwd_masks *m, char *err)
{
	int rc;

	m->n = 0, m->rows = NULL, m->bits = NULL;
	if (batch->masks == NULL)
		return 0;
	if ((rc = batch->masks(batch->masks_arg, m, err)) != 0)
		return rc;
	for (int32_t i = 0; i < m->n; i++)
		if (m->rows[i] < 0 || m->rows[i] >= n_logits || (i > 0 && m->rows[i] <= m->rows[i - 1]))
			return err_set(err, ERR_INVAL, "constrained rows: row %d of %d logits rows", m->rows[i], n_logits);
	return m->n > n_logits ? err_set(err, ERR_INVAL, "%d constrained rows of %d", m->n, n_logits) : 0;
}

void
fwd_masks_apply(const struct fwd_masks *m, float *logits, int32_t n_vocab)
{
	size_t words = FWD_MASK_WORDS(n_vocab);

	for (int32_t i = 0; i < m->n; i++) {
		const uint32_t *bits = m->bits + (size_t)i * words;
		float *row = logits + (size_t)m->rows[i] * (size_t)n_vocab;

		for (int32_t t = 0; t < n_vocab; t++)
			if (!(bits[t >> 5] >> (t & 31) & 1))
				row[t] = -INFINITY;
	}
}
