/*
 * half.c — F32, F16 and BF16: scalar conversions (round to nearest even, NaN kept quiet, like ggml),
 * row to_float / from_float, and the scalar reference dots (products in float, summed in double as
 * ggml's portable kernels do).
 */
#include <string.h>

#include "formats/blocks.h"

float kiln_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        memcpy(&bits, &v, sizeof bits);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t kiln_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN: a quiet NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                         /* rounds to inf */
    if (ax < 0x38800000u) {
        /* below the smallest normal half (2^-14): adding 0.5 aligns the value to multiples of 2^-24
         * (the half subnormal step) with the FPU's round-to-nearest-even. */
        float af, t;
        memcpy(&af, &ax, sizeof af);
        t = af + 0.5f;
        uint32_t tb;
        memcpy(&tb, &t, sizeof tb);
        return (uint16_t)(sign | (tb - 0x3f000000u));
    }
    /* normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even */
    uint32_t odd = (ax >> 13) & 1u;
    ax += 0xc8000fffu + odd;
    return (uint16_t)(sign | (ax >> 13));
}

float kiln_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t kiln_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64u); /* NaN: force quiet */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

void kiln_f32_to_float(const void *x, float *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }
void kiln_f32_from_float(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

void kiln_f16_to_float(const void *x, float *y, int64_t n) {
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = kiln_f16_to_f32(h[i]);
}

void kiln_f16_from_float(const float *x, void *y, int64_t n) {
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++) h[i] = kiln_f32_to_f16(x[i]);
}

void kiln_bf16_to_float(const void *x, float *y, int64_t n) {
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = kiln_bf16_to_f32(h[i]);
}

void kiln_bf16_from_float(const float *x, void *y, int64_t n) {
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++) h[i] = kiln_f32_to_bf16(x[i]);
}

void kiln_dot_f32(int n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * y[i]);
    *s = (float)sum;
}

void kiln_dot_f16(int n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(kiln_f16_to_f32(x[i]) * kiln_f16_to_f32(y[i]));
    *s = (float)sum;
}

void kiln_dot_bf16(int n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(kiln_bf16_to_f32(x[i]) * kiln_bf16_to_f32(y[i]));
    *s = (float)sum;
}
