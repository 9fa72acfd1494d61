/* sample_cases.h — the sampling tests' inputs, shared by the CPU sampler's tests (test_sample.c) and the
 * device sampler's (test_cuda_sample.c): random logits of a few shapes and the parameter mixes. */
#ifndef KILN_TESTS_SAMPLE_CASES_H
#define KILN_TESTS_SAMPLE_CASES_H

#include <stdint.h>

#include "kiln.h"

/* Random logits of a few shapes: 0 normal * scale, 1 quantized to halves (many exact ties), 2 normal plus a
 * few spikes (peaked), 3 normal with some -inf (masked ids), 4 a ladder 0, -6, -12, ... (scale unused). */
void sample_case_logits(float *x, int n, int shape, float scale, uint64_t *rng);

/* The defaults with temperature, top-k, top-p and min-p replaced. */
kiln_sampler_params sample_case_params(float temp, int k, float top_p, float min_p);

typedef struct sample_mix { const char *name; kiln_sampler_params p; } sample_mix;

/* The mixes the tests run (at most 16): greedy, defaults, top-k off with top-p / min-p / temperature only,
 * large top-k, top-k >= the vocabulary, penalties (also negative, also greedy). */
int sample_case_mixes(sample_mix *m, int n_vocab);

/* Chi-squared of count[0..n) (draws ids) against the distribution prob (bins expecting < 5 pooled), its
 * degrees of freedom, the limit a correct sampler stays under (df + 6 sigma + 10), the support size and mass. */
double sample_case_chi2(const double *prob, const int *count, int n, int draws, int *df, double *limit, int *kept,
                        double *support);

#endif
