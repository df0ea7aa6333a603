/*
 * pace.h: how many prompt tokens a forward step may carry while sequences
 * are decoding, so that their tokens keep coming at an even pace however
 * long the prompts being prefilled are.
 *
 * A step that carries a prefill chunk besides the decoding sequences takes
 * longer than one without. The pacer gives the prompts waiting to be
 * prefilled the share of a step that as many more decoding sequences would
 * take, with a margin: the step should take PACE_TARGET times as long as a
 * decode-only step, times (decoding + prefilling) / decoding. So one long
 * prompt beside 16 streams slows them by a third, and 63 new requests
 * that just arrived beside one stream are prefilled within a few steps
 * instead of waiting behind it.
 *
 * The lengths are measured, not modelled, since what a chunk costs depends
 * on the device, the model and how deep into its prompt the chunk is
 * (attention grows with it). The pacer measures a decode-only step when it
 * has no measure for about as many decoding tokens as the device runs
 * them as (a GPU rounds them up to its tile of tokens, engine_step_tokens:
 * on CUDA 33 and 64 decoders are one step shape, so a ramp of arrivals is
 * not held up by a decode-only step each time the decoders grow by a
 * third) and at most twice or half as many decoders, and again every
 * PACE_REMEASURE mixed steps, and takes the shortest of the last
 * PACE_SAMPLES (a step is only ever slowed down by what else runs on the
 * machine). What it learns about prompts is the time a prompt token adds
 * to a step; the chunk is the margin divided by that, so that a new
 * target (more prompts waiting, fewer decoders) gives a new chunk at
 * once. It starts from a step that only prefilled (twice its time per
 * token: on a GPU a step is mostly reading the weights, and 60 prompts
 * arriving beside 2 streams then fill their first step with hundreds of
 * tokens), or else from a prompt token as dear as a decoding one with
 * half the margin (a CPU). A mixed step over the target sets the cost to
 * what the step showed, the chunk shrinking by half at most; one under it
 * that carried the whole chunk moves the cost halfway (geometrically)
 * towards what it showed, the chunk doubling at most. A step over its
 * target leaves a debt (up to a decode-only step) that the next steps pay
 * back, decode-only while it lasts: so the target holds on average where
 * a device fills its tiles of tokens (the scheduler raises the chunk to
 * the tile's end, engine_step_tokens; a GPU step of 65 tokens costs 1.6
 * times one of 64, one of 128 about as much as 65). With no sequence
 * decoding, prefill has every step.
 */
#ifndef RESIDENT_PACE_H
#define RESIDENT_PACE_H

#include <stdint.h>

/*
 * A mixed step's length, in decode-only steps, for one prompt beside many.
 * A step on a shared machine now and then takes half as long again as its
 * median for reasons of its own (measured on a 2-core VM); at 1.5 such a
 * mixed step came to 2.2 times the streams' median gap, at 1.25 it stays
 * under twice.
 */
#define PACE_TARGET 1.25
#define PACE_REMEASURE 64   /* mixed steps between two decode-only ones */
#define PACE_SAMPLES 4      /* decode-only steps the measure is the shortest of */

struct pace {
	double t_dec;           /* seconds of a decode-only step; 0: not measured */
	double samples[PACE_SAMPLES]; /* the last decode-only steps' seconds, a ring */
	int n_samples, next;    /* samples there; where the next goes */
	int n_dec;              /* the decoders they were measured with */
	int32_t dec_tokens;     /* and those decoders' tokens as the device ran them */
	double t_tok;           /* seconds a prompt token adds to a step; 0: not known */
	int32_t chunk;          /* prefill tokens the last pace_budget allowed */
	double debt;            /* seconds mixed steps went over their target, less what steps since gave back */
	int mixed;              /* mixed steps since the last decode-only one */
};

/*
 * The prefill tokens the next step may carry, given how many sequences
 * decode in it (n_dec, which the device runs as dec_tokens tokens:
 * engine_step_tokens) and how many wait to be prefilled: -1 for no limit,
 * 0 for a decode-only step.
 */
int32_t pace_budget(struct pace *p, int n_dec, int32_t dec_tokens, int n_pre);
/*
 * What a step did: its decoding sequences (run as dec_tokens) and
 * prefilling ones, its prefill tokens, its seconds; max_tokens, the most
 * tokens a step takes.
 */
void pace_done(struct pace *p, int n_dec, int32_t dec_tokens, int n_pre, int32_t n_prefill, double seconds,
    int32_t max_tokens);

#endif
