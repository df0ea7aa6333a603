/* genmodel.h: random-weight models of named shapes, as GGUF or safetensors. */
#ifndef RESIDENT_GENMODEL_H
#define RESIDENT_GENMODEL_H

#include <stdint.h>

struct genmodel_opts {
	const char *shape;  /* "tiny", "llama3-8b", ... (genmodel_shapes lists them) */
	const char *format; /* "gguf" or "safetensors" */
	const char *type;   /* "f32", "f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "mxfp4" (GGUF only for the last four) */
	uint64_t seed;
	const char *out;    /* a .gguf file, or a directory for safetensors */
	int threads;        /* 0: all cores */
	int verbose;        /* progress on stderr */
	int layers;         /* > 0: only the shape's first this many layers (a quicker model of the same layer) */
};

/*
 * Writes the model. The same shape and seed give the same weights in every
 * format and type (before quantization), so a GGUF and a safetensors twin
 * can be compared. Returns 0 or a negative code with a message.
 */
int genmodel_run(const struct genmodel_opts *o, char *err);

/* Prints the shape names, one per line, with their sizes. */
void genmodel_list_shapes(void);

#endif
