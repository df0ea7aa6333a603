/*
 * embed.h: what makes a model an embedding model (model.h, struct
 * model_embed), read from its files, and the last stages of its vectors,
 * run on the host after the backend's pooled hidden states.
 *
 * A Hugging Face directory is one when its modules.json (sentence-
 * transformers) has a Pooling module: mean, CLS or last token, then Dense
 * modules (their config.json and model.safetensors) and Normalize; its
 * config.json's use_bidirectional_attention (EmbeddingGemma) makes its
 * attention bidirectional. A GGUF file is one when it has
 * {arch}.pooling_type (as llama.cpp's converter writes it) or is of the
 * gemma-embedding architecture (bidirectional, with dense_2 and dense_3
 * when converted with the sentence-transformers dense modules); its
 * {arch}.attention.causal false also makes it bidirectional.
 */
#ifndef RESIDENT_EMBED_H
#define RESIDENT_EMBED_H

#include <jansson.h>
#include <stdint.h>

#include "model.h"

struct gguf_file;

/* From a Hugging Face directory (m->path) and its parsed config.json. 0, or a code with a message. */
int embed_open_hf(struct model_desc *m, json_t *cfg, char *err);
/*
 * From a GGUF file whose keys start with prefix ("qwen3",
 * "gemma-embedding"); bidirectional: its architecture is (gemma-embedding).
 */
int embed_open_gguf(struct model_desc *m, const struct gguf_file *f, const char *prefix, int bidirectional,
    char *err);
void embed_close(struct model_embed *e);

/*
 * One input's vector from its pooled hidden state (n_embd floats, the mean
 * already divided): through the Dense modules, normalised as the model is,
 * then cut to its first dims floats (0: all of them), which are normalised
 * again when the model normalises. out gets dims floats; scratch holds
 * twice the widest Dense output.
 */
void embed_finish(const struct model_embed *e, const float *pooled, int32_t n_embd, int32_t dims, float *out,
    float *scratch);
/* Floats of scratch embed_finish needs. */
size_t embed_scratch(const struct model_embed *e, int32_t n_embd);

#endif
