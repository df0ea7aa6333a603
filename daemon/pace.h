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
 * has no measure for about as many decoders, and again every
 * PACE_REMEASURE mixed steps, and takes the shortest of the last
 * PACE_SAMPLES (a step is only ever slowed down by what else runs on the
 * machine). It starts from a chunk that costs no more than half the
 * margin where a prompt token costs what a decoding one does (a CPU),
 * grows it while mixed steps stay under the target (doubling it while they
 * stay far under; on a GPU, where a step is mostly reading the weights, to
 * many tokens) and shrinks it in proportion when one goes over (by half
 * at most). With no sequence decoding, prefill has every step.
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
	int32_t chunk;          /* prefill tokens of the next mixed step */
	int mixed;              /* mixed steps since the last decode-only one */
};

/*
 * The prefill tokens the next step may carry, given how many sequences
 * decode in it and how many wait to be prefilled: -1 for no limit, 0 for
 * a decode-only step.
 */
int32_t pace_budget(struct pace *p, int n_dec, int n_pre);
/*
 * What a step did: its decoding and prefilling sequences, its prefill
 * tokens, its seconds; max_tokens caps the chunk.
 */
void pace_done(struct pace *p, int n_dec, int n_pre, int32_t n_prefill, double seconds, int32_t max_tokens);

#endif
