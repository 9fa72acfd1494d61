/* sample_ref.h — the sampling tests' and bench's reference: kiln's sampler as it was before the one-pass
 * rewrite (copy the whole vocabulary, penalize the copy, quickselect top-k, qsort, softmax, cut, softmax at
 * the temperature, walk), plus llama.cpp's presence / frequency penalties. Same parameters and RNG as
 * kiln_sampler. Allocates only in ref_sampler_open. */
#ifndef KILN_TESTS_SAMPLE_REF_H
#define KILN_TESTS_SAMPLE_REF_H

#include "kiln.h"

typedef struct ref_sampler ref_sampler;

/* NULL on bad input or out of memory (the parameters are assumed valid). */
ref_sampler *ref_sampler_open(const kiln_sampler_params *p, int n_vocab);
void ref_sampler_close(ref_sampler *s);
void ref_sampler_reset(ref_sampler *s);
void ref_sampler_accept(ref_sampler *s, int32_t id);
int32_t ref_sample(ref_sampler *s, const float *logits);
/* The exact distribution ref_sample draws from for these logits and the current window: prob[id] for every
 * id (n_vocab doubles); consumes no random number. */
void ref_sample_distribution(ref_sampler *s, const float *logits, double *prob);

/* The same chain for one sample given explicitly (what a kiln_sample_spec carries): the penalties of the
 * distinct ids pen_id[0..n_pen) with their window counts, then greedy or the cuts and the walk to u. s's own
 * window and RNG are not used (s gives the parameters and the scratch). */
int32_t ref_sample_given(ref_sampler *s, const float *logits, const int32_t *pen_id, const int32_t *pen_count,
                         int n_pen, double u);

#endif
