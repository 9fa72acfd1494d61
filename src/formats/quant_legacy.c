/*
 * quant_legacy.c — the 32-value block formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the activation format
 * Q8_1: dequantization, ggml's reference quantizers (same rounding, bit for bit) and the scalar
 * reference dot products in the order of operations of ggml's generic kernels.
 *
 * Float expressions are never contracted into FMA here (GCC's ISO C mode; the pragma for clang), except
 * where ggml's generic kernels are (explicit fmaf), so results match ggml bit for bit.
 */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#include <float.h>
#include <math.h>

#include "formats/blocks.h"

#define F16(h) kiln_f16_to_f32(h)
#define TO_F16(f) kiln_f32_to_f16(f)

/* ------------------------------------------------------------------------------------ dequantize */

void kiln_q4_0_to_float(const void *vx, float *y, int64_t n) {
    const block_q4_0 *x = vx;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float d = F16(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int x0 = (x[i].qs[j] & 0x0F) - 8;
            const int x1 = (x[i].qs[j] >> 4) - 8;
            y[i * QK4_0 + j] = x0 * d;
            y[i * QK4_0 + j + QK4_0 / 2] = x1 * d;
        }
    }
}

void kiln_q4_1_to_float(const void *vx, float *y, int64_t n) {
    const block_q4_1 *x = vx;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        const float d = F16(x[i].d), m = F16(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int x0 = x[i].qs[j] & 0x0F;
            const int x1 = x[i].qs[j] >> 4;
            y[i * QK4_1 + j] = x0 * d + m;
            y[i * QK4_1 + j + QK4_1 / 2] = x1 * d + m;
        }
    }
}

void kiln_q5_0_to_float(const void *vx, float *y, int64_t n) {
    const block_q5_0 *x = vx;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const float d = F16(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const uint8_t xh0 = (uint8_t)(((qh >> j) << 4) & 0x10);
            const uint8_t xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
            const int x0 = ((x[i].qs[j] & 0x0F) | xh0) - 16;
            const int x1 = ((x[i].qs[j] >> 4) | xh1) - 16;
            y[i * QK5_0 + j] = x0 * d;
            y[i * QK5_0 + j + QK5_0 / 2] = x1 * d;
        }
    }
}

void kiln_q5_1_to_float(const void *vx, float *y, int64_t n) {
    const block_q5_1 *x = vx;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        const float d = F16(x[i].d), m = F16(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const uint8_t xh0 = (uint8_t)(((qh >> j) << 4) & 0x10);
            const uint8_t xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
            const int x0 = (x[i].qs[j] & 0x0F) | xh0;
            const int x1 = (x[i].qs[j] >> 4) | xh1;
            y[i * QK5_1 + j] = x0 * d + m;
            y[i * QK5_1 + j + QK5_1 / 2] = x1 * d + m;
        }
    }
}

void kiln_q8_0_to_float(const void *vx, float *y, int64_t n) {
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float d = F16(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[i * QK8_0 + j] = x[i].qs[j] * d;
    }
}

void kiln_q8_1_to_float(const void *vx, float *y, int64_t n) {
    const block_q8_1 *x = vx;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        const float d = F16(x[i].d);
        for (int j = 0; j < QK8_1; j++) y[i * QK8_1 + j] = x[i].qs[j] * d;
    }
}

/* -------------------------------------------------------------------------------------- quantize */

/* The value of largest magnitude in a block (the first one on ties) and its magnitude. */
static float signed_absmax(const float *x, int n, float *amax_out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        const float v = x[j];
        if (amax < fabsf(v)) {
            amax = fabsf(v);
            max = v;
        }
    }
    *amax_out = amax;
    return max;
}

void kiln_q4_0_from_float(const float *x, void *vy, int64_t n) {
    block_q4_0 *y = vy;
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
        float amax;
        const float max = signed_absmax(x, QK4_0, &amax);
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = TO_F16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[QK4_0 / 2 + j] * id;
            int8_t t0 = (int8_t)(x0 + 8.5f), t1 = (int8_t)(x1 + 8.5f);
            const uint8_t q0 = (uint8_t)(t0 < 15 ? t0 : 15), q1 = (uint8_t)(t1 < 15 ? t1 : 15);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void kiln_q4_1_from_float(const float *x, void *vy, int64_t n) {
    block_q4_1 *y = vy;
    for (int64_t i = 0; i < n / QK4_1; i++, x += QK4_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK4_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / ((1 << 4) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = TO_F16(d);
        y[i].m = TO_F16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[QK4_1 / 2 + j] - min) * id;
            int8_t t0 = (int8_t)(x0 + 0.5f), t1 = (int8_t)(x1 + 0.5f);
            const uint8_t q0 = (uint8_t)(t0 < 15 ? t0 : 15), q1 = (uint8_t)(t1 < 15 ? t1 : 15);
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void kiln_q5_0_from_float(const float *x, void *vy, int64_t n) {
    block_q5_0 *y = vy;
    for (int64_t i = 0; i < n / QK5_0; i++, x += QK5_0) {
        float amax;
        const float max = signed_absmax(x, QK5_0, &amax);
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = TO_F16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const float x0 = x[j] * id, x1 = x[QK5_0 / 2 + j] * id;
            int8_t t0 = (int8_t)(x0 + 16.5f), t1 = (int8_t)(x1 + 16.5f);
            const uint8_t q0 = (uint8_t)(t0 < 31 ? t0 : 31), q1 = (uint8_t)(t1 < 31 ? t1 : 31);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + QK5_0 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh);
    }
}

void kiln_q5_1_from_float(const float *x, void *vy, int64_t n) {
    block_q5_1 *y = vy;
    for (int64_t i = 0; i < n / QK5_1; i++, x += QK5_1) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / ((1 << 5) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = TO_F16(d);
        y[i].m = TO_F16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const float x0 = (x[j] - min) * id, x1 = (x[QK5_1 / 2 + j] - min) * id;
            const uint8_t q0 = (uint8_t)(x0 + 0.5f), q1 = (uint8_t)(x1 + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + QK5_1 / 2);
        }
        memcpy(y[i].qh, &qh, sizeof qh);
    }
}

void kiln_q8_0_from_float(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax;
        (void)signed_absmax(x, QK8_0, &amax);
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = TO_F16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void kiln_q8_1_from_float(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float amax;
        (void)signed_absmax(x, QK8_1, &amax);
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = TO_F16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            const float v0 = x[j] * id, v1 = x[QK8_1 / 2 + j] * id;
            y[i].qs[j] = (int8_t)roundf(v0);
            y[i].qs[QK8_1 / 2 + j] = (int8_t)roundf(v1);
            sum += y[i].qs[j] + y[i].qs[QK8_1 / 2 + j];
        }
        y[i].s = TO_F16(sum * d);
    }
}

/* ------------------------------------------------------------------------------- reference dots */

void kiln_dot_q4_0_q8_0(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK8_0; ib++) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK8_0 / 2; j++) {
            const int v0 = (x[ib].qs[j] & 0x0F) - 8;
            const int v1 = (x[ib].qs[j] >> 4) - 8;
            sumi0 += v0 * y[ib].qs[j];
            sumi1 += v1 * y[ib].qs[j + QK8_0 / 2];
        }
        const int sumi = sumi0 + sumi1;
        sumf = fmaf(sumi * F16(x[ib].d), F16(y[ib].d), sumf);
    }
    *s = sumf;
}

void kiln_dot_q4_1_q8_1(int n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK8_1; ib++) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            const int v0 = x[ib].qs[j] & 0x0F;
            const int v1 = x[ib].qs[j] >> 4;
            sumi0 += v0 * y[ib].qs[j];
            sumi1 += v1 * y[ib].qs[j + QK8_1 / 2];
        }
        const int sumi = sumi0 + sumi1;
        sumf += fmaf(F16(x[ib].d) * F16(y[ib].d), (float)sumi, F16(x[ib].m) * F16(y[ib].s));
    }
    *s = sumf;
}

void kiln_dot_q5_0_q8_0(int n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK8_0; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof qh);
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK8_0 / 2; j++) {
            const uint8_t xh0 = (uint8_t)(((qh & (1u << j)) >> j) << 4);
            const uint8_t xh1 = (uint8_t)((qh & (1u << (j + 16))) >> (j + 12));
            const int32_t x0 = (int8_t)(((x[ib].qs[j] & 0x0F) | xh0) - 16);
            const int32_t x1 = (int8_t)(((x[ib].qs[j] >> 4) | xh1) - 16);
            sumi0 += x0 * y[ib].qs[j];
            sumi1 += x1 * y[ib].qs[j + QK8_0 / 2];
        }
        const int sumi = sumi0 + sumi1;
        sumf = fmaf(F16(x[ib].d) * F16(y[ib].d), (float)sumi, sumf);
    }
    *s = sumf;
}

void kiln_dot_q5_1_q8_1(int n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK8_1; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof qh);
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            const uint8_t xh0 = (uint8_t)(((qh >> j) << 4) & 0x10);
            const uint8_t xh1 = (uint8_t)((qh >> (j + 12)) & 0x10);
            const int32_t x0 = (x[ib].qs[j] & 0xF) | xh0;
            const int32_t x1 = (x[ib].qs[j] >> 4) | xh1;
            sumi0 += x0 * y[ib].qs[j];
            sumi1 += x1 * y[ib].qs[j + QK8_1 / 2];
        }
        const int sumi = sumi0 + sumi1;
        sumf += fmaf(F16(x[ib].d) * F16(y[ib].d), (float)sumi, F16(x[ib].m) * F16(y[ib].s));
    }
    *s = sumf;
}

void kiln_dot_q8_0_q8_0(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK8_0; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[ib].qs[j] * y[ib].qs[j];
        sumf = fmaf((float)sumi, F16(x[ib].d) * F16(y[ib].d), sumf);
    }
    *s = sumf;
}

/* ---- activation quantizers of the reference engine's CPU matmul (AVX2 build): id = 127 / amax and round
 * half to even (nearbyintf under the default rounding mode); Q8_1 also stores s = d * sum(q). */
static void q8_act_block(const float *x, float *d_out, int8_t *q, int *sum) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    *d_out = amax / 127.f;
    *sum = 0;
    for (int j = 0; j < 32; j++) {
        q[j] = (int8_t)nearbyintf(x[j] * id);
        *sum += q[j];
    }
}

void kiln_q8_0_act_ref(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d;
        int sum;
        q8_act_block(x + i * QK8_0, &d, y[i].qs, &sum);
        y[i].d = kiln_f32_to_f16(d);
    }
}

void kiln_q8_1_act_ref(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        float d;
        int sum;
        q8_act_block(x + i * QK8_1, &d, y[i].qs, &sum);
        y[i].d = kiln_f32_to_f16(d);
        y[i].s = kiln_f32_to_f16(d * (float)sum);
    }
}
