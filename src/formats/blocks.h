/*
 * blocks.h — internal to src/formats: the on-disk block layouts of the quantized types (bit-compatible
 * with ggml / GGUF files) and the per-type kernels that register.c puts into the type table.
 *
 * Naming: kiln_<type>_to_float (dequantize), kiln_<type>_from_float (reference quantizer),
 * kiln_dot_<type>[_<vdt>] (scalar reference dot, ggml's generic order of operations) and
 * kiln_dot_<type>_avx2 (AVX2+FMA variant, only valid when the CPU has AVX2, FMA and F16C), kiln_dot_<type>_neon
 * (NEON variant, aarch64 builds only).
 */
#ifndef KILN_FORMATS_BLOCKS_H
#define KILN_FORMATS_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "formats/formats.h"

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } block_q4_0;                  /* 18 bytes */
typedef struct { uint16_t d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;               /* 20 bytes */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;   /* 22 bytes */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1; /* 24 bytes */
typedef struct { uint16_t d; int8_t qs[QK8_0]; } block_q8_0;                       /* 34 bytes */
typedef struct { uint16_t d, s; int8_t qs[QK8_1]; } block_q8_1;                    /* 36 bytes: s = d * sum(qs) */

/* 2-bit: 16 sub-blocks of 16; scales byte = scale (low 4 bits) | min (high 4 bits). */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; } block_q2_K;      /* 84 */
/* 3-bit: low 2 bits in qs, high bit in hmask, 16 6-bit signed scales (offset 32) packed in 12 bytes. */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; } block_q3_K; /* 110 */
/* 4-bit: 8 sub-blocks of 32, 6-bit scale and min each packed in 12 bytes. */
typedef struct { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;   /* 144 */
/* 5-bit: as Q4_K plus one high bit per value in qh. */
typedef struct { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K; /* 176 */
/* 6-bit: low 4 bits in ql, high 2 bits in qh, 16 int8 scales. */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K; /* 210 */
/* Activation format of the K types: f32 scale, 256 int8, 16 sums of 16 consecutive qs. */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;                   /* 292 */

_Static_assert(sizeof(block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(block_q8_1) == 36, "q8_1");
_Static_assert(sizeof(block_q2_K) == 84, "q2_K");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K");

/* ggml's nearest_int: round to nearest, ties to even, via the 1.5*2^23 trick (|f| <= 4194303). */
static inline int kiln_nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* Unpacks the j-th (0..7) 6-bit scale and min of a Q4_K / Q5_K block. */
static inline void kiln_k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* Unpacks the 16 6-bit scales of a Q3_K block to signed values (-32..31): scale j has its low 4 bits
 * in nibble j of bytes 0..7 (low nibbles first) and its high 2 bits in byte 8 + j%4, bits 2*(j/4). */
static inline void kiln_q3k_scales(const uint8_t *packed, int8_t out[16]) {
    uint32_t a[4];
    memcpy(a, packed, 12);
    const uint32_t lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u, tmp = a[2];
    a[2] = ((a[0] >> 4) & lo4) | (((tmp >> 4) & lo2) << 4);
    a[3] = ((a[1] >> 4) & lo4) | (((tmp >> 6) & lo2) << 4);
    a[0] = (a[0] & lo4) | (((tmp >> 0) & lo2) << 4);
    a[1] = (a[1] & lo4) | (((tmp >> 2) & lo2) << 4);
    uint8_t u[16];
    memcpy(u, a, 16);
    for (int j = 0; j < 16; j++) out[j] = (int8_t)(u[j] - 32);
}

/* Unpacks all 8 six-bit scales and mins of a Q4_K / Q5_K block at once (same values as
 * kiln_k4_scale_min for j = 0..7). */
static inline void kiln_k4_scales_mins(const uint8_t *packed, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3], s2[2], m2[2];
    memcpy(u, packed, 12);
    const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, lo2 = 0x03030303u;
    s2[0] = u[0] & lo6;
    m2[0] = u[1] & lo6;
    s2[1] = (u[2] & lo4) | (((u[0] >> 6) & lo2) << 4);
    m2[1] = ((u[2] >> 4) & lo4) | (((u[1] >> 6) & lo2) << 4);
    memcpy(sc, s2, 8);
    memcpy(mn, m2, 8);
}

/* ---- half.c ---- */
void kiln_f32_to_float(const void *x, float *y, int64_t n);
void kiln_f32_from_float(const float *x, void *y, int64_t n);
void kiln_f16_to_float(const void *x, float *y, int64_t n);
void kiln_f16_from_float(const float *x, void *y, int64_t n);
void kiln_bf16_to_float(const void *x, float *y, int64_t n);
void kiln_bf16_from_float(const float *x, void *y, int64_t n);
void kiln_dot_f32(int n, float *s, const void *x, const void *y);
void kiln_dot_f16(int n, float *s, const void *x, const void *y);
void kiln_dot_bf16(int n, float *s, const void *x, const void *y);

/* ---- quant_legacy.c ---- */
#define KILN_DECLARE_QTYPE(t) \
    void kiln_##t##_to_float(const void *x, float *y, int64_t n); \
    void kiln_##t##_from_float(const float *x, void *y, int64_t n);
KILN_DECLARE_QTYPE(q4_0)
KILN_DECLARE_QTYPE(q4_1)
KILN_DECLARE_QTYPE(q5_0)
KILN_DECLARE_QTYPE(q5_1)
KILN_DECLARE_QTYPE(q8_0)
KILN_DECLARE_QTYPE(q8_1)
/* ---- quant_k.c ---- */
KILN_DECLARE_QTYPE(q2_K)
KILN_DECLARE_QTYPE(q3_K)
KILN_DECLARE_QTYPE(q4_K)
KILN_DECLARE_QTYPE(q5_K)
KILN_DECLARE_QTYPE(q6_K)
KILN_DECLARE_QTYPE(q8_K)
#undef KILN_DECLARE_QTYPE

void kiln_dot_q4_0_q8_0(int n, float *s, const void *x, const void *y);
void kiln_dot_q4_1_q8_1(int n, float *s, const void *x, const void *y);
void kiln_dot_q5_0_q8_0(int n, float *s, const void *x, const void *y);
void kiln_dot_q5_1_q8_1(int n, float *s, const void *x, const void *y);
void kiln_dot_q8_0_q8_0(int n, float *s, const void *x, const void *y);
void kiln_dot_q2_K_q8_K(int n, float *s, const void *x, const void *y);
void kiln_dot_q3_K_q8_K(int n, float *s, const void *x, const void *y);
void kiln_dot_q4_K_q8_K(int n, float *s, const void *x, const void *y);
void kiln_dot_q5_K_q8_K(int n, float *s, const void *x, const void *y);
void kiln_dot_q6_K_q8_K(int n, float *s, const void *x, const void *y);

/* ---- K-type scale searches (quant_k.c scalar, quant_k_avx2.c eight sub-blocks at once in AVX2 lanes with
 * the same float operations in the same order per sub-block, so both give the same bytes) ---- */
typedef void (*kiln_search_qkx2_fn)(const float *x, int n_sub, int sub_len, int nmax, float rmin, int nstep,
                                    bool use_mad, bool rms_weights, float *scales, float *mins, uint8_t *L);
typedef void (*kiln_search_qx_fn)(const float *x, float *scales, int8_t *L);
void kiln_search_qkx2_scalar(const float *x, int n_sub, int sub_len, int nmax, float rmin, int nstep, bool use_mad,
                             bool rms_weights, float *scales, float *mins, uint8_t *L);
void kiln_search_qkx2_avx2(const float *x, int n_sub, int sub_len, int nmax, float rmin, int nstep, bool use_mad,
                           bool rms_weights, float *scales, float *mins, uint8_t *L);
void kiln_search_qx_scalar(const float *x, float *scales, int8_t *L);
void kiln_search_qx_avx2(const float *x, float *scales, int8_t *L);
/* Same bytes as the reference from_float, faster (AVX2 searches; call only when kiln_cpu_has_avx2()). */
void kiln_q2_K_from_float_avx2(const float *x, void *y, int64_t n);
void kiln_q4_K_from_float_avx2(const float *x, void *y, int64_t n);
void kiln_q5_K_from_float_avx2(const float *x, void *y, int64_t n);
void kiln_q6_K_from_float_avx2(const float *x, void *y, int64_t n);

/* ---- dot_avx2.c (call only when kiln_cpu_has_avx2()) ---- */
void kiln_dot_f32_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_f16_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_bf16_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q4_0_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q4_1_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q5_0_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q5_1_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q8_0_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q2_K_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q3_K_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q4_K_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q5_K_avx2(int n, float *s, const void *x, const void *y);
void kiln_dot_q6_K_avx2(int n, float *s, const void *x, const void *y);
void kiln_q8_0_from_float_avx2(const float *x, void *y, int64_t n);
void kiln_q8_K_from_float_avx2(const float *x, void *y, int64_t n);
void kiln_q8_1_from_float_avx2(const float *x, void *y, int64_t n);
/* The reference engine's activation quantizers (id = 127/amax, halves to even): scalar and AVX2. */
void kiln_q8_0_act_ref(const float *x, void *y, int64_t n);
void kiln_q8_1_act_ref(const float *x, void *y, int64_t n);
void kiln_q8_0_act_avx2(const float *x, void *y, int64_t n);
void kiln_q8_1_act_avx2(const float *x, void *y, int64_t n);
void kiln_f16_from_float_avx2(const float *x, void *y, int64_t n);

/* ---- dot_avx512.c (call only when kiln_cpu_has_avx512vnni()): VNNI integer block sums, the float operations
 * of the AVX2 dots above in the same order, so each result is bit-identical to its AVX2 version ---- */
void kiln_dot_q8_0_vnni(int n, float *s, const void *x, const void *y);
void kiln_dot_q4_0_vnni(int n, float *s, const void *x, const void *y);
void kiln_dot_q4_K_vnni(int n, float *s, const void *x, const void *y);

/* ---- dot_neon.c (aarch64 builds only) ---- */
void kiln_dot_f32_neon(int n, float *s, const void *x, const void *y);
void kiln_dot_f16_neon(int n, float *s, const void *x, const void *y);
void kiln_dot_q4_0_neon(int n, float *s, const void *x, const void *y);
void kiln_dot_q8_0_neon(int n, float *s, const void *x, const void *y);
void kiln_dot_q4_K_neon(int n, float *s, const void *x, const void *y);
void kiln_dot_q6_K_neon(int n, float *s, const void *x, const void *y);

#endif
