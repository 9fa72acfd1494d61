/* sample_kernels.c — scalar reference kernels of the sampler's passes over the logits, and the run-time
 * choice between them and their AVX2 / AVX-512 variants (sample_kernels_avx2.c, sample_kernels_avx512.c). */
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

_Alignas(64) const uint64_t sample_exp2f_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

/* One block's terms t[0..64) summed in SAMPLE_SUM_ORDER. */
static double block_sum_ordered(const double *t) {
    double l[8] = {0};
    for (int i = 0; i < SAMPLE_BLOCK; i += 8)
        for (int j = 0; j < 8; j++) l[j] += t[i + j];
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

double sample_exp_sum_ref(const float *x, int nblk, float m, float temp, double z) {
    double t[SAMPLE_BLOCK];
    for (int b = 0; b < nblk; b++, x += SAMPLE_BLOCK) {
        for (int j = 0; j < SAMPLE_BLOCK; j++) t[j] = (double)expf((x[j] - m) / temp);
        z += block_sum_ordered(t);
    }
    return z;
}

double sample_hist_block_ref(const float *x, float m, float temp, float lo, float scale, float *e1, float *et,
                             uint16_t *bin, double z) {
    double t[SAMPLE_BLOCK];
    for (int j = 0; j < SAMPLE_BLOCK; j++) {
        e1[j] = expf(x[j] - m);
        et[j] = expf((x[j] - m) / temp);
        t[j] = (double)e1[j];
        const float d = (m - x[j]) * scale;
        bin[j] = !(x[j] >= lo) ? (uint16_t)(HIST_BINS + j % HIST_DUMP)
                 : d < (float)HIST_BINS ? (uint16_t)d
                                        : HIST_BINS - 1;
    }
    return z + block_sum_ordered(t);
}

int sample_hist_moments_ref(const float *x, float m, float lo, float w, uint16_t *bin, double *mom) {
    const float scale = 1.0f / w; /* exact: w is a power of two */
    int top = -1;
    for (int j = 0; j < SAMPLE_BLOCK; j++) {
        if (!(x[j] >= lo)) {
            bin[j] = (uint16_t)(HIST_BINS + j % HIST_DUMP);
            continue;
        }
        const float t = (m - x[j]) * scale;
        const int kb = t < (float)HIST_BINS ? (int)t : HIST_BINS - 1;
        const float c = -((float)kb + 0.5f) * w;
        const double e = (x[j] - m) - c, e2 = e * e;
        double *q = mom + 4 * kb;
        q[0] += 1.0, q[1] += e, q[2] += e2, q[3] += e2 * e;
        bin[j] = (uint16_t)kb;
        top = kb > top ? kb : top;
    }
    return top;
}

void sample_prefix_block_ref(const float *t, const uint16_t *bin, int kb, double norm, double *acc, float *least) {
    double q[SAMPLE_BLOCK];
    float l = *least;
    for (int j = 0; j < SAMPLE_BLOCK; j++) {
        const float v = (float)(t[j] / norm);
        q[j] = bin[j] < kb ? v : 0.0;
        l = bin[j] < kb && v < l ? v : l;
    }
    *acc += block_sum_ordered(q);
    *least = l;
}

int sample_bin_find_ref(const uint16_t *bin, int n, uint16_t kb, int32_t *ids) {
    int c = 0;
    for (int i = 0; i < n; i++)
        if (bin[i] == kb) ids[c++] = i;
    return c;
}

sample_kernels sample_kernels_select(void) {
    sample_kernels k = {sample_block_max_ref, sample_exp_sum_ref, sample_exp_sum_ref, sample_hist_block_ref,
                        sample_hist_moments_ref, sample_prefix_block_ref, sample_bin_find_ref};
#if KILN_X86 /* the AVX2 and AVX-512 kernels exist only there */
    if (kiln_cpu_level() >= KILN_CPU_AVX2) {
        k.block_max = sample_block_max_avx2;
        k.exp_sum = sample_exp_sum_avx2;
        k.exp_sum_fast = sample_exp_sum_fast_avx2;
        k.hist_block = sample_hist_block_avx2;
        k.hist_moments = sample_hist_moments_avx2;
        k.prefix_block = sample_prefix_block_avx2;
        k.bin_find = sample_bin_find_avx2;
    }
    if (kiln_cpu_level() >= KILN_CPU_AVX512) { /* the fast sum stays AVX2's */
        k.exp_sum = sample_exp_sum_avx512;
        k.hist_block = sample_hist_block_avx512;
        k.hist_moments = sample_hist_moments_avx512;
        k.prefix_block = sample_prefix_block_avx512;
        k.bin_find = sample_bin_find_avx512;
    }
#endif
    return k;
}
