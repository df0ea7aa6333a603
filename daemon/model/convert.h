/*
 * convert.h: weights whose Hugging Face layout is not GGUF's, converted
 * once at load into memory the model owns (model_desc.owned).
 */
#ifndef RESIDENT_CONVERT_H
#define RESIDENT_CONVERT_H

#include "model.h"

struct st_model;

/* What one conversion made: tensors (names malloc'd) over buffers (malloc'd), both the caller's. */
struct convert_out {
	struct model_tensor t[5];
	void *buf[5];
	int n;
};

/*
 * gpt-oss stores a layer's experts fused and transposed, as x @ W:
 * mlp.experts.gate_up_proj [E, H, 2I] with gate and up columns
 * interleaved, its bias [E, 2I] likewise, and mlp.experts.down_proj
 * [E, I, H]. Makes what llama.cpp's converter writes from them:
 * blk.L.ffn_gate_exps.weight and ffn_up_exps.weight [H, I, E],
 * ffn_down_exps.weight [I, H, E] (GGML order: rows of the input), and
 * ffn_gate_exps.bias / ffn_up_exps.bias [I, E], each in its source's
 * float type, bit for bit. Returns 0 (out->n 0 if the layer has no such
 * tensors), or ERR_FORMAT / ERR_UNSUPPORTED / ERR_NOMEM with a message.
 */
int convert_gptoss_experts(const struct st_model *st, int layer, struct convert_out *out, char *err);

#endif
