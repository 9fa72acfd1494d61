/*
 * sample_spec.h — one sample of a kiln_sampler, spelled out for a backend that samples on its device: the
 * parameters, the penalty window's distinct ids with their counts, and the one uniform draw u taken from
 * the sampler's RNG on the host (so that seeds carry over). A plain struct of fixed size (C and CUDA): the
 * device computes the id from the row's logits as kiln_sample's math defines it (penalties, then greedy or
 * top-k -> top-p -> min-p -> temperature -> the walk to u), and only the id comes back.
 */
#ifndef KILN_SAMPLE_SPEC_H
#define KILN_SAMPLE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most distinct penalized ids one spec carries; a sampler whose window holds more samples on the host. */
#define KILN_SAMPLE_SPEC_MAX_PEN 256

enum { KILN_SPEC_NONE = 0, KILN_SPEC_SAMPLE = 1 };

typedef struct kiln_sample_spec {
    int32_t mode;            /* KILN_SPEC_NONE: the row is not sampled (the device leaves it alone) */
    int32_t top_k;           /* <= 0 or >= n_vocab: off */
    float temperature;       /* <= 0: greedy (u unused) */
    float top_p, min_p;      /* >= 1 / <= 0: off */
    float repeat, presence, frequency;
    int32_t n_pen;           /* penalized ids (0 when every penalty is off or the window is empty) */
    int32_t reserved;
    double u;                /* uniform in [0, 1), drawn once per sample when temperature > 0 */
    int32_t pen_id[KILN_SAMPLE_SPEC_MAX_PEN];    /* distinct ids of the window, inside the vocabulary */
    int32_t pen_count[KILN_SAMPLE_SPEC_MAX_PEN]; /* their occurrences in the window (>= 1) */
} kiln_sample_spec;

#ifndef __CUDACC__
typedef struct kiln_sampler kiln_sampler;

/* Fills *spec for the next sample of s and takes its uniform draw from s's RNG exactly when kiln_sample
 * would (temperature > 0: once), leaving *rng_before with the RNG state before it (for kiln_sampler_spec_undo).
 * The sampler's logprob view is forgotten (kiln_sampler_top returns 0 and kiln_sampler_logprob NAN until the
 * next kiln_sample): a caller that wants logprobs samples on the host. Returns false, with s and *spec
 * unchanged, when the window holds more than KILN_SAMPLE_SPEC_MAX_PEN distinct ids (sample on the host).
 * Allocates nothing. */
bool kiln_sampler_spec(kiln_sampler *s, kiln_sample_spec *spec, uint64_t *rng_before);
/* Puts s's RNG back to rng_before (a forward pass that failed after kiln_sampler_spec). */
void kiln_sampler_spec_undo(kiln_sampler *s, uint64_t rng_before);
#endif

#ifdef __cplusplus
}
#endif
#endif
