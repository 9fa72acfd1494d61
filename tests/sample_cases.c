/* sample_cases.c — the random logits and parameter mixes of sample_cases.h. */
#include "sample_cases.h"

#include <math.h>

#include "test.h"

/* Random logits of a few shapes: 0 normal * scale, 1 quantized to halves (many exact ties), 2 normal plus a
 * few spikes (peaked), 3 normal with some -inf (masked ids), 4 a ladder 0, -6, -12, ... (scale unused). */
void sample_case_logits(float *x, int n, int shape, float scale, uint64_t *rng) {
    for (int i = 0; i < n; i++) x[i] = test_rand_normal(rng) * scale;
    if (shape == 1)
        for (int i = 0; i < n; i++) x[i] = floorf(x[i] * 2.0f) / 2.0f;
    if (shape == 2)
        for (int i = 0; i < 5 && i < n; i++) x[test_rand_u64(rng) % (uint64_t)n] += 6.0f + (float)i * 2.0f;
    if (shape == 3)
        for (int i = 0; i < n / 8; i++) x[test_rand_u64(rng) % (uint64_t)n] = -INFINITY;
    if (shape == 4) /* a ladder of exact multiples of 6 below 0: ids sit on the sampler's band boundaries */
        for (int i = 0; i < n; i++) x[i] = -6.0f * (float)(test_rand_u64(rng) % 4) * (i % 5 ? 1.0f : 2.0f);
}

kiln_sampler_params sample_case_params(float temp, int k, float top_p, float min_p) {
    kiln_sampler_params p = kiln_sampler_defaults();
    p.temperature = temp;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

int sample_case_mixes(sample_mix *m, int n_vocab) {
    int n = 0;
    m[n++] = (sample_mix){"greedy", sample_case_params(0.0f, 40, 0.95f, 0.05f)};
    m[n++] = (sample_mix){"defaults", kiln_sampler_defaults()};
    m[n++] = (sample_mix){"t1 top-p 0.9 k off", sample_case_params(1.0f, 0, 0.9f, 0.0f)};
    m[n++] = (sample_mix){"t0.7 only", sample_case_params(0.7f, 0, 1.0f, 0.0f)};
    m[n++] = (sample_mix){"t3 only", sample_case_params(3.0f, 0, 1.0f, 0.0f)};
    m[n++] = (sample_mix){"min-p 0.1 t1.2", sample_case_params(1.2f, 0, 1.0f, 0.1f)};
    m[n++] = (sample_mix){"top-p 0.9 min-p 0.05", sample_case_params(1.0f, 0, 0.9f, 0.05f)};
    m[n++] = (sample_mix){"top-p 0.999 t1.5", sample_case_params(1.5f, 0, 0.999f, 0.0f)};
    m[n++] = (sample_mix){"k1000 top-p 0.5 t1.5", sample_case_params(1.5f, 1000, 0.5f, 0.0f)};
    m[n++] = (sample_mix){"k >= vocab top-p 0.8", sample_case_params(0.9f, n_vocab + 5, 0.8f, 0.0f)};
    kiln_sampler_params p = sample_case_params(1.0f, 0, 0.9f, 0.0f);
    p.repeat_penalty = 1.3f, p.presence_penalty = 0.7f, p.frequency_penalty = 0.4f, p.repeat_last_n = 32;
    m[n++] = (sample_mix){"penalties top-p 0.9", p};
    p = sample_case_params(0.9f, 0, 1.0f, 0.02f);
    p.repeat_penalty = 0.8f, p.presence_penalty = -1.5f, p.frequency_penalty = -0.5f, p.repeat_last_n = 16;
    m[n++] = (sample_mix){"negative penalties min-p", p};
    p = kiln_sampler_defaults();
    p.repeat_penalty = 1.1f, p.frequency_penalty = 2.0f, p.repeat_last_n = 64;
    m[n++] = (sample_mix){"penalties defaults", p};
    p = sample_case_params(0.0f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 1.5f, p.presence_penalty = 1.0f, p.repeat_last_n = 8;
    m[n++] = (sample_mix){"penalties greedy", p};
    return n;
}


double sample_case_chi2(const double *prob, const int *count, int n, int draws, int *df, double *limit, int *kept,
                        double *support) {
    double chi2 = 0.0, pool_e = 0.0, pool_o = 0.0;
    *df = -1, *kept = 0, *support = 0.0;
    for (int i = 0; i < n; i++) {
        const double e = prob[i] * draws;
        *kept += prob[i] > 0;
        *support += prob[i];
        if (e >= 5.0) { chi2 += (count[i] - e) * (count[i] - e) / e; (*df)++; }
        else { pool_e += e; pool_o += count[i]; }
    }
    if (pool_e > 0.0) { chi2 += (pool_o - pool_e) * (pool_o - pool_e) / (pool_e > 5.0 ? pool_e : 5.0); (*df)++; }
    *limit = *df + 6.0 * sqrt(2.0 * (*df > 1 ? *df : 1)) + 10.0;
    return chi2;
}
