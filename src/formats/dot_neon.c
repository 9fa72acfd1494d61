/*
 * dot_neon.c — NEON (AArch64 Advanced SIMD) variants of the row dot products: F32, F16, Q8_0 x Q8_0, Q4_0 x
 * Q8_0, Q4_K x Q8_K and Q6_K x Q8_K. The Makefile compiles this file only for aarch64 targets, where NEON is
 * part of the base ISA, and register.c selects these kernels there (unless KILN_NO_SIMD=1).
 *
 * Order of operations: the reference engine's NEON kernels (ggml-cpu arch/arm quants.c), so that a greedy run
 * on Arm stays on its tokens the way the AVX2 kernels do on x86 (see dot_avx2.c):
 *  - Q8_0 / Q4_0: blocks in pairs, block 2k into accumulator 0 and 2k+1 into accumulator 1 (4 float lanes each,
 *    lane l = an exact integer partial sum, times the block's scale, fused), the two accumulators reduced
 *    pairwise and added, an odd last block in scalar. The lane partition is that of the dot-product
 *    instruction (lane l = elements 4l..4l+3 of each 16-byte half) where the target has it (__ARM_FEATURE_DOTPROD,
 *    e.g. -march=armv8.2-a+dotprod, Apple silicon, Graviton 2+, Grace), else that of ggml's fallback (lane l =
 *    elements 2l, 2l+1, 8+2l, 8+2l+1 of each half), as ggml's build makes the same choice.
 *  - Q4_K / Q6_K: each super-block's integer sums are exact, then added into one float (fused), as ggml does.
 * ggml writes the scale multiply-adds as vmlaq_n_f32 / `sumf += a * b`, which gcc (-std=gnu11) and clang contract
 * to fused multiply-adds; these kernels spell the fused operation out (vfmaq_f32 / fmaf), so they do not depend
 * on kiln's -std=c11 (no contraction). Bit-identity with ggml on Arm is by construction (no Arm reference
 * vectors exist here); the tests hold every kernel within 4 * FLT_EPSILON * sum|w_i * x_i| of the scalar
 * reference and of the reference engine's x86 results.
 */
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#include <math.h>

#include "formats/blocks.h"

/* ------------------------------------------------------------------------------------- helpers */

/* acc + the 16-byte signed dot of a and b in 4 int32 lanes (exact): the dot-product instruction, or ggml's
 * widening fallback with its lane partition. */
static inline int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t p1 = vmull_s8(vget_high_s8(a), vget_high_s8(b));
    return vaddq_s32(acc, vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
#endif
}

static inline float f16(uint16_t h) { return kiln_f16_to_f32(h); }

/* ---------------------------------------------------------------------------------- float rows */

void kiln_dot_f32_neon(int n, float *s, const void *vx, const void *vy) {
    const float *x = vx, *y = vy;
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, vld1q_f32(x + i), vld1q_f32(y + i));
        a1 = vfmaq_f32(a1, vld1q_f32(x + i + 4), vld1q_f32(y + i + 4));
        a2 = vfmaq_f32(a2, vld1q_f32(x + i + 8), vld1q_f32(y + i + 8));
        a3 = vfmaq_f32(a3, vld1q_f32(x + i + 12), vld1q_f32(y + i + 12));
    }
    for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, vld1q_f32(x + i), vld1q_f32(y + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

/* 4 F16 values to floats (exact). */
static inline float32x4_t load_f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

void kiln_dot_f16_neon(int n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = vx, *y = vy;
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, load_f16x4(x + i), load_f16x4(y + i));
        a1 = vfmaq_f32(a1, load_f16x4(x + i + 4), load_f16x4(y + i + 4));
        a2 = vfmaq_f32(a2, load_f16x4(x + i + 8), load_f16x4(y + i + 8));
        a3 = vfmaq_f32(a3, load_f16x4(x + i + 12), load_f16x4(y + i + 12));
    }
    for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, load_f16x4(x + i), load_f16x4(y + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++) sum += f16(x[i]) * f16(y[i]);
    *s = sum;
}

/* ------------------------------------------------------------------------------- 32-value blocks */

/* The integer lanes of one Q8_0 x Q8_0 block. */
static inline int32x4_t q8_0_block(const block_q8_0 *x, const block_q8_0 *y) {
    const int32x4_t lo = dot_s8(vdupq_n_s32(0), vld1q_s8(x->qs), vld1q_s8(y->qs));
    const int32x4_t hi = dot_s8(vdupq_n_s32(0), vld1q_s8(x->qs + 16), vld1q_s8(y->qs + 16));
    return vaddq_s32(lo, hi);
}

/* The integer lanes of one Q4_0 x Q8_0 block: low nibbles (values 0..15) then high ones, each minus 8. */
static inline int32x4_t q4_0_block(const block_q4_0 *x, const block_q8_0 *y) {
    const uint8x16_t q = vld1q_u8(x->qs);
    const int8x16_t eight = vdupq_n_s8(8);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), eight);
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
    return dot_s8(dot_s8(vdupq_n_s32(0), lo, vld1q_s8(y->qs)), hi, vld1q_s8(y->qs + 16));
}

/* acc + lanes * scale, fused (ggml's vmlaq_n_f32 as its compilers contract it). */
static inline float32x4_t scaled(float32x4_t acc, int32x4_t lanes, float scale) {
    return vfmaq_f32(acc, vcvtq_f32_s32(lanes), vdupq_n_f32(scale));
}

void kiln_dot_q8_0_neon(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK8_0;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        acc0 = scaled(acc0, q8_0_block(&x[ib], &y[ib]), f16(x[ib].d) * f16(y[ib].d));
        acc1 = scaled(acc1, q8_0_block(&x[ib + 1], &y[ib + 1]), f16(x[ib + 1].d) * f16(y[ib + 1].d));
    }
    float sumf = vaddvq_f32(acc0) + vaddvq_f32(acc1);
    for (; ib < nb; ib++) { /* the odd last block: ggml's scalar tail */
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[ib].qs[j] * y[ib].qs[j];
        sumf = fmaf((float)sumi, f16(x[ib].d) * f16(y[ib].d), sumf);
    }
    *s = sumf;
}

void kiln_dot_q4_0_neon(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK8_0;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        acc0 = scaled(acc0, q4_0_block(&x[ib], &y[ib]), f16(x[ib].d) * f16(y[ib].d));
        acc1 = scaled(acc1, q4_0_block(&x[ib + 1], &y[ib + 1]), f16(x[ib + 1].d) * f16(y[ib + 1].d));
    }
    float sumf = vaddvq_f32(acc0) + vaddvq_f32(acc1);
    for (; ib < nb; ib++) { /* the odd last block: ggml's scalar tail */
        int sumi = 0;
        for (int j = 0; j < QK8_0 / 2; j++)
            sumi += ((x[ib].qs[j] & 0x0F) - 8) * y[ib].qs[j] + ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + QK8_0 / 2];
        sumf = fmaf((float)sumi * f16(x[ib].d), f16(y[ib].d), sumf);
    }
    *s = sumf;
}

/* ------------------------------------------------------------------------------------ K blocks */

/* sum over 16-value groups g of bsums[g] * m[g / 2] (Q4_K: 8 mins of 32 values each), exact. */
static inline int32_t k4_min_sum(const int16_t *bsums, const uint8_t mins[8]) {
    const int16x8_t pairs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mins)));
    const int32x4_t p = vaddq_s32(vmull_s16(vget_low_s16(pairs), vget_low_s16(m)), vmull_s16(vget_high_s16(pairs), vget_high_s16(m)));
    return vaddvq_s32(p);
}

/* The exact sum over 32 values of q (0..15 or 0..63, as bytes) times the Q8_K values at y. */
static inline int32_t dot32(int8x16_t q0, int8x16_t q1, const int8_t *y) {
    return vaddvq_s32(dot_s8(dot_s8(vdupq_n_s32(0), q0, vld1q_s8(y)), q1, vld1q_s8(y + 16)));
}

void kiln_dot_q4_K_neon(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8];
        kiln_k4_scales_mins(x[i].scales, sc, mn);
        const float d = y[i].d * f16(x[i].d), dmin = y[i].d * f16(x[i].dmin);
        sumf = fmaf(-dmin, (float)k4_min_sum(y[i].bsums, mn), sumf);
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int32_t sumi = 0;
        for (int j = 0; j < QK_K / 64; j++, q4 += 32, q8 += 64) {
            const uint8x16_t b0 = vld1q_u8(q4), b1 = vld1q_u8(q4 + 16);
            sumi += dot32(vreinterpretq_s8_u8(vandq_u8(b0, m4)), vreinterpretq_s8_u8(vandq_u8(b1, m4)), q8) * sc[2 * j];
            sumi += dot32(vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), q8 + 32) *
                    sc[2 * j + 1];
        }
        sumf = fmaf(d, (float)sumi, sumf);
    }
    *s = sumf;
}

/* The 16-value group sum of one 16-byte vector of 6-bit values (0..63) against y, exact. */
static inline int32_t dot16(uint8x16_t q, const int8_t *y) {
    return vaddvq_s32(dot_s8(vdupq_n_s32(0), vreinterpretq_s8_u8(q), vld1q_s8(y)));
}

/* 128 values of a Q6_K block (64 bytes of ql, 32 of qh) against y, each 16-value group times its scale;
 * the values are unsigned (0..63): the caller subtracts 32 * the scaled block sums. */
static inline int32_t q6_K_half(const uint8_t *ql, const uint8_t *qh, const int8_t *sc, const int8_t *y) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(3);
    const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
    const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16), l2 = vld1q_u8(ql + 32), l3 = vld1q_u8(ql + 48);
/* bits shift, shift + 1 of h as bits 4, 5 (HI2_0: shift 0; a NEON shift by an immediate 0 is not valid) */
#define HI2_0(h) vshlq_n_u8(vandq_u8(h, m2), 4)
#define HI2(h, shift) vshlq_n_u8(vandq_u8(vshrq_n_u8(h, shift), m2), 4)
    int32_t sum = dot16(vorrq_u8(vandq_u8(l0, m4), HI2_0(h0)), y) * sc[0] +
                  dot16(vorrq_u8(vandq_u8(l1, m4), HI2_0(h1)), y + 16) * sc[1] +
                  dot16(vorrq_u8(vandq_u8(l2, m4), HI2(h0, 2)), y + 32) * sc[2] +
                  dot16(vorrq_u8(vandq_u8(l3, m4), HI2(h1, 2)), y + 48) * sc[3];
    sum += dot16(vorrq_u8(vshrq_n_u8(l0, 4), HI2(h0, 4)), y + 64) * sc[4] +
           dot16(vorrq_u8(vshrq_n_u8(l1, 4), HI2(h1, 4)), y + 80) * sc[5] +
           dot16(vorrq_u8(vshrq_n_u8(l2, 4), HI2(h0, 6)), y + 96) * sc[6] +
           dot16(vorrq_u8(vshrq_n_u8(l3, 4), HI2(h1, 6)), y + 112) * sc[7];
#undef HI2_0
#undef HI2
    return sum;
}

/* sum over the 16 groups of bsums[g] * scales[g], exact. */
static inline int32_t q6_K_scaled_bsums(const int16_t *bsums, const int8_t *scales) {
    const int8x16_t sc = vld1q_s8(scales);
    const int16x8_t s0 = vmovl_s8(vget_low_s8(sc)), s1 = vmovl_s8(vget_high_s8(sc));
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    const int32x4_t p = vaddq_s32(vaddq_s32(vmull_s16(vget_low_s16(b0), vget_low_s16(s0)), vmull_s16(vget_high_s16(b0), vget_high_s16(s0))),
                                  vaddq_s32(vmull_s16(vget_low_s16(b1), vget_low_s16(s1)), vmull_s16(vget_high_s16(b1), vget_high_s16(s1))));
    return vaddvq_s32(p);
}

void kiln_dot_q6_K_neon(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const int32_t isum = q6_K_half(x[i].ql, x[i].qh, x[i].scales, y[i].qs) +
                             q6_K_half(x[i].ql + 64, x[i].qh + 32, x[i].scales + 8, y[i].qs + 128);
        const int32_t mins = q6_K_scaled_bsums(y[i].bsums, x[i].scales);
        sumf = fmaf(f16(x[i].d) * y[i].d, (float)(isum - 32 * mins), sumf);
    }
    *s = sumf;
}
#endif
