/* sample_kernels.c — scalar reference kernels of the sampler's passes over the logits, and the run-time
 * choice between them and their AVX2 variants (sample_kernels_avx2.c). */
#include <math.h>

#include "base/env.h"
#include "formats/formats.h"
#include "sample/sample_internal.h"

void sample_block_max_ref(const float *x, int nblk, float *bm) {
    for (int b = 0; b < nblk; b++) {
        const float *p = x + (size_t)b * SAMPLE_BLOCK;
        float m = p[0];
        for (int j = 1; j < SAMPLE_BLOCK; j++) m = p[j] > m ? p[j] : m;
        bm[b] = m;
    }
}

double sample_exp_sum_ref(const float *x, int n, float m, float temp) {
    double z = 0.0;
    for (int i = 0; i < n; i++) z += (double)expf((x[i] - m) / temp);
    return z;
}

void sample_hist_terms_ref(const float *x, int n, float m, float temp, float *e1, float *et) {
    for (int i = 0; i < n; i++) e1[i] = expf(x[i] - m), et[i] = expf((x[i] - m) / temp);
}

sample_kernels sample_kernels_select(void) {
    sample_kernels k = {sample_block_max_ref, sample_exp_sum_ref, sample_exp_sum_ref, sample_hist_terms_ref};
#if KILN_X86 /* the AVX2 kernels exist only there */
    if (kiln_cpu_level() >= KILN_CPU_AVX2) {
        k.block_max = sample_block_max_avx2;
        k.exp_sum = sample_exp_sum_avx2;
        k.exp_sum_fast = sample_exp_sum_fast_avx2;
        k.hist_terms = sample_hist_terms_avx2;
    }
#endif
    return k;
}
