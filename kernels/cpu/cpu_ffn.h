/*
 * cpu_ffn.h: a layer's feed-forward on the host, dense or experts (the
 * router, the tokens grouped by expert, each expert's products over its
 * own tokens, the weighted sum), straight from the stored weights. The
 * CPU backend runs every layer's through it; the CUDA backend runs the
 * layers that a placement keeps in host memory (backend_opts.host_ffn)
 * through it, inside its step, so that both compute a host layer alike.
 */
#ifndef RESIDENT_CPU_FFN_H
#define RESIDENT_CPU_FFN_H

#include <stddef.h>
#include <stdint.h>

struct cpu_ffn;
struct cpu_pool;
struct model_desc;

/* Host bytes a cpu_ffn takes for steps of max_tokens on threads threads (its buffers; not the weights). */
size_t cpu_ffn_bytes(const struct model_desc *m, int max_tokens, int exact, int threads);

/*
 * A feed-forward runner for m's layers (those that use_layer marks, or
 * every one when it is NULL) over steps of up to max_tokens rows, on
 * pool's threads (which must outlive it). exact: float activations in
 * every product (the reference mode), else 8-bit ones where a weight has
 * an integer kernel. NULL (with err) when memory runs out.
 */
struct cpu_ffn *cpu_ffn_new(const struct model_desc *m, const uint8_t *use_layer, int max_tokens, int exact,
    struct cpu_pool *pool, char *err);
void cpu_ffn_free(struct cpu_ffn *f);

/*
 * Layer l's feed-forward of the T normed rows in h (n_embd floats each,
 * T <= max_tokens) into the T rows of out, the experts' biases included,
 * a sandwich norm after it not.
 */
void cpu_ffn_run(struct cpu_ffn *f, int l, const float *h, int T, float *out);

/*
 * cpu_ffn_run for a layer of experts whose routing was made elsewhere (the
 * GPU's): token t's choices are expert[t k + j] with weights weight[t k +
 * j] (k the experts a token uses), and only the choices of experts e
 * whose on_dev[e] is negative are computed here, each with its down
 * bias; the others (computed on the device) add nothing to out.
 */
void cpu_ffn_run_routed(struct cpu_ffn *f, int l, const float *h, int T, const int32_t *expert, const float *weight,
    const int32_t *on_dev, float *out);

/*
 * Layer l's count of choices of each of its experts (n_expert floats), one
 * added for every token that chose it in cpu_ffn_run or cpu_ffn_run_routed;
 * the caller may scale them (to let old choices fade). NULL for a model
 * without experts.
 */
float *cpu_ffn_chosen(struct cpu_ffn *f, int l);

#endif
