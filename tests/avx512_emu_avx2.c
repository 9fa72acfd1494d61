/*
 * avx512_emu_avx2.c — the AVX-512 kernels (formats/dot_avx512.c, backend/cpu/cpu_gemm_avx512.c) compiled over
 * an emulation of the AVX-512 intrinsics they use: a zmm is two ymm halves, the lane-wise operations run as
 * their AVX2 twins per half, vpdpbusd / vpdpwssd as scalar loops written from Intel's definitions
 * (non-saturating int32 sums). So the kernels' logic — operand order, bias and seed, halves, tile edges —
 * is tested bit for bit against the AVX2 kernels on a CPU without AVX-512; the real instructions are
 * tested by the same checks where the CPU has them. Test scaffolding only (avx512_kernels.h).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct { __m256i lo, hi; } emu_m512i;
typedef struct { __m256 lo, hi; } emu_m512;
typedef struct { __m256d lo, hi; } emu_m512d;

#define AVX2EMU __attribute__((target("avx2,fma,f16c"))) static inline
AVX2EMU emu_m512i emu_i(__m256i lo, __m256i hi) { emu_m512i r = {lo, hi}; return r; }
AVX2EMU emu_m512 emu_f(__m256 lo, __m256 hi) { emu_m512 r = {lo, hi}; return r; }
AVX2EMU emu_m512d emu_d(__m256d lo, __m256d hi) { emu_m512d r = {lo, hi}; return r; }

#define EMU_BIN_I(name, avx2)                                                                    \
    AVX2EMU emu_m512i emu_##name(emu_m512i a, emu_m512i b) { return emu_i(avx2(a.lo, b.lo), avx2(a.hi, b.hi)); }
EMU_BIN_I(and_si512, _mm256_and_si256)
EMU_BIN_I(xor_si512, _mm256_xor_si256)
EMU_BIN_I(sub_epi8, _mm256_sub_epi8)
EMU_BIN_I(sub_epi32, _mm256_sub_epi32)
EMU_BIN_I(srlv_epi64, _mm256_srlv_epi64)
EMU_BIN_I(shuffle_epi8, _mm256_shuffle_epi8) /* both: per 128-bit lane */
EMU_BIN_I(maddubs_epi16, _mm256_maddubs_epi16)
EMU_BIN_I(madd_epi16, _mm256_madd_epi16)
EMU_BIN_I(add_epi32, _mm256_add_epi32)
EMU_BIN_I(or_si512, _mm256_or_si256)
EMU_BIN_I(mullo_epi32, _mm256_mullo_epi32)
#undef EMU_BIN_I

AVX2EMU emu_m512i emu_srli_epi32(emu_m512i a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return emu_i(_mm256_srl_epi32(a.lo, c), _mm256_srl_epi32(a.hi, c));
}
AVX2EMU emu_m512i emu_slli_epi32(emu_m512i a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return emu_i(_mm256_sll_epi32(a.lo, c), _mm256_sll_epi32(a.hi, c));
}
/* VPTERNLOGD: bit j of the result is bit (a_j << 2 | b_j << 1 | c_j) of imm. */
AVX2EMU emu_m512i emu_ternarylogic_epi32(emu_m512i a, emu_m512i b, emu_m512i c, int imm) {
    uint64_t x[8], y[8], z[8], r[8];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    memcpy(z, &c, sizeof z);
    for (int w = 0; w < 8; w++) {
        r[w] = 0;
        for (int m = 0; m < 8; m++)
            if (imm >> m & 1) r[w] |= (m & 4 ? x[w] : ~x[w]) & (m & 2 ? y[w] : ~y[w]) & (m & 1 ? z[w] : ~z[w]);
    }
    memcpy(&a, r, sizeof r);
    return a;
}

AVX2EMU emu_m512i emu_broadcast_i32x4(__m128i v) { const __m256i b = _mm256_broadcastsi128_si256(v); return emu_i(b, b); }
AVX2EMU emu_m512i emu_broadcast_i64x4(__m256i v) { return emu_i(v, v); }
/* VSHUFI64X2: 128-bit lanes 0, 1 of the result from a (imm bits 1:0, 3:2), lanes 2, 3 from b (bits 5:4, 7:6). */
AVX2EMU emu_m512i emu_shuffle_i64x2(emu_m512i a, emu_m512i b, int imm) {
    __m128i la[4], lb[4], r[4];
    memcpy(la, &a, sizeof la);
    memcpy(lb, &b, sizeof lb);
    for (int i = 0; i < 4; i++) r[i] = i < 2 ? la[(imm >> (2 * i)) & 3] : lb[(imm >> (2 * i)) & 3];
    memcpy(&a, r, sizeof r);
    return a;
}
AVX2EMU emu_m512i emu_castsi256_si512(__m256i v) { return emu_i(v, _mm256_setzero_si256()); }
AVX2EMU __m256i emu_castsi512_si256(emu_m512i v) { return v.lo; }
AVX2EMU emu_m512i emu_inserti64x4(emu_m512i v, __m256i h, int imm) { return imm & 1 ? emu_i(v.lo, h) : emu_i(h, v.hi); }
AVX2EMU __m256i emu_extracti64x4_epi64(emu_m512i v, int imm) { return imm & 1 ? v.hi : v.lo; }
AVX2EMU emu_m512i emu_setr_epi64(long long e0, long long e1, long long e2, long long e3, long long e4, long long e5,
                                 long long e6, long long e7) {
    return emu_i(_mm256_setr_epi64x(e0, e1, e2, e3), _mm256_setr_epi64x(e4, e5, e6, e7));
}
AVX2EMU emu_m512i emu_setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6, int e7, int e8, int e9,
                                 int e10, int e11, int e12, int e13, int e14, int e15) {
    return emu_i(_mm256_setr_epi32(e0, e1, e2, e3, e4, e5, e6, e7), _mm256_setr_epi32(e8, e9, e10, e11, e12, e13, e14, e15));
}
AVX2EMU emu_m512i emu_set1_epi8(char c) { return emu_i(_mm256_set1_epi8(c), _mm256_set1_epi8(c)); }
AVX2EMU emu_m512i emu_set1_epi32(int v) { return emu_i(_mm256_set1_epi32(v), _mm256_set1_epi32(v)); }
AVX2EMU emu_m512i emu_setzero_si512(void) { return emu_i(_mm256_setzero_si256(), _mm256_setzero_si256()); }
AVX2EMU emu_m512i emu_loadu_si512(const void *p) {
    return emu_i(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)((const char *)p + 32)));
}

/* VPDPBUSD: dword i += sum_k (unsigned byte a[4i+k]) * (signed byte b[4i+k]), wrapping; n dwords. */
static void dpbusd_lanes(int32_t *dst, const uint8_t *a, const int8_t *b, int n) {
    for (int i = 0; i < n; i++) {
        int64_t s = dst[i];
        for (int k = 0; k < 4; k++) s += (int64_t)a[4 * i + k] * b[4 * i + k];
        const uint32_t u = (uint32_t)(uint64_t)s;
        memcpy(&dst[i], &u, sizeof u);
    }
}
/* VPDPWSSD: dword i += sum_k (signed word a[2i+k]) * (signed word b[2i+k]), wrapping. */
static void dpwssd_lanes(int32_t *dst, const int16_t *a, const int16_t *b, int n) {
    for (int i = 0; i < n; i++) {
        int64_t s = dst[i];
        for (int k = 0; k < 2; k++) s += (int64_t)a[2 * i + k] * b[2 * i + k];
        const uint32_t u = (uint32_t)(uint64_t)s;
        memcpy(&dst[i], &u, sizeof u);
    }
}
#define EMU_DP(name, lanes, T, A, B, N)                                                          \
    AVX2EMU T emu_##name(T src, T a, T b) {                                                      \
        int32_t d[N];                                                                            \
        A ua[4 * (N)];                                                                           \
        B ub[4 * (N)];                                                                           \
        memcpy(d, &src, sizeof d);                                                               \
        memcpy(ua, &a, sizeof(T));                                                               \
        memcpy(ub, &b, sizeof(T));                                                               \
        lanes(d, ua, ub, N);                                                                     \
        memcpy(&src, d, sizeof d);                                                               \
        return src;                                                                              \
    }
EMU_DP(dpbusd_epi32, dpbusd_lanes, emu_m512i, uint8_t, int8_t, 16)
EMU_DP(dpwssd_epi32, dpwssd_lanes, emu_m512i, int16_t, int16_t, 16)
EMU_DP(dpbusd256_epi32, dpbusd_lanes, __m256i, uint8_t, int8_t, 8)
#undef EMU_DP

AVX2EMU emu_m512 emu_setzero_ps(void) { return emu_f(_mm256_setzero_ps(), _mm256_setzero_ps()); }
AVX2EMU emu_m512 emu_set1_ps(float v) { return emu_f(_mm256_set1_ps(v), _mm256_set1_ps(v)); }
AVX2EMU emu_m512 emu_sub_ps(emu_m512 a, emu_m512 b) { return emu_f(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
AVX2EMU emu_m512 emu_mul_ps(emu_m512 a, emu_m512 b) { return emu_f(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
AVX2EMU emu_m512 emu_fmadd_ps(emu_m512 a, emu_m512 b, emu_m512 c) {
    return emu_f(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
AVX2EMU emu_m512 emu_cvtepi32_ps(emu_m512i v) { return emu_f(_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)); }
AVX2EMU emu_m512 emu_cvtph_ps(__m256i h) {
    return emu_f(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}
AVX2EMU void emu_storeu_ps(void *p, emu_m512 v) {
    _mm256_storeu_ps((float *)p, v.lo);
    _mm256_storeu_ps((float *)p + 8, v.hi);
}
AVX2EMU __m256 emu_castps512_ps256(emu_m512 v) { return v.lo; }
AVX2EMU emu_m512 emu_castps256_ps512(__m256 v) { return emu_f(v, _mm256_setzero_ps()); }
AVX2EMU emu_m512 emu_castps128_ps512(__m128 v) { return emu_f(_mm256_castps128_ps256(v), _mm256_setzero_ps()); }
/* VPERMPS zmm: lane i = v[idx[i] & 15]. */
AVX2EMU emu_m512 emu_permutexvar_ps(emu_m512i idx, emu_m512 v) {
    int32_t ix[16];
    float src[16], dst[16];
    memcpy(ix, &idx, sizeof ix);
    memcpy(src, &v, sizeof src);
    for (int i = 0; i < 16; i++) dst[i] = src[ix[i] & 15];
    memcpy(&v, dst, sizeof dst);
    return v;
}
AVX2EMU emu_m512d emu_castps_pd(emu_m512 v) { return emu_d(_mm256_castps_pd(v.lo), _mm256_castps_pd(v.hi)); }
AVX2EMU emu_m512 emu_castpd_ps(emu_m512d v) { return emu_f(_mm256_castpd_ps(v.lo), _mm256_castpd_ps(v.hi)); }
AVX2EMU emu_m512d emu_castpd256_pd512(__m256d v) { return emu_d(v, _mm256_setzero_pd()); }
AVX2EMU emu_m512d emu_insertf64x4(emu_m512d v, __m256d h, int imm) { return imm & 1 ? emu_d(v.lo, h) : emu_d(h, v.hi); }
AVX2EMU __m256d emu_extractf64x4_pd(emu_m512d v, int imm) { return imm & 1 ? v.hi : v.lo; }

/* the kernels' names for these */
#define __m512i emu_m512i
#define __m512 emu_m512
#define __m512d emu_m512d
#undef _mm512_and_si512
#define _mm512_and_si512 emu_and_si512
#undef _mm512_xor_si512
#define _mm512_xor_si512 emu_xor_si512
#undef _mm512_sub_epi8
#define _mm512_sub_epi8 emu_sub_epi8
#undef _mm512_sub_epi32
#define _mm512_sub_epi32 emu_sub_epi32
#undef _mm512_srlv_epi64
#define _mm512_srlv_epi64 emu_srlv_epi64
#undef _mm512_shuffle_epi8
#define _mm512_shuffle_epi8 emu_shuffle_epi8
#undef _mm512_maddubs_epi16
#define _mm512_maddubs_epi16 emu_maddubs_epi16
#undef _mm512_madd_epi16
#define _mm512_madd_epi16 emu_madd_epi16
#undef _mm512_add_epi32
#define _mm512_add_epi32 emu_add_epi32
#undef _mm512_or_si512
#define _mm512_or_si512 emu_or_si512
#undef _mm512_mullo_epi32
#define _mm512_mullo_epi32 emu_mullo_epi32
#undef _mm512_srli_epi32
#define _mm512_srli_epi32 emu_srli_epi32
#undef _mm512_slli_epi32
#define _mm512_slli_epi32 emu_slli_epi32
#undef _mm512_ternarylogic_epi32
#define _mm512_ternarylogic_epi32 emu_ternarylogic_epi32
#undef _mm512_set1_epi32
#define _mm512_set1_epi32 emu_set1_epi32
#undef _mm512_shuffle_i64x2
#define _mm512_shuffle_i64x2 emu_shuffle_i64x2
#undef _mm512_broadcast_i32x4
#define _mm512_broadcast_i32x4 emu_broadcast_i32x4
#undef _mm512_broadcast_i64x4
#define _mm512_broadcast_i64x4 emu_broadcast_i64x4
#undef _mm512_castsi256_si512
#define _mm512_castsi256_si512 emu_castsi256_si512
#undef _mm512_castsi512_si256
#define _mm512_castsi512_si256 emu_castsi512_si256
#undef _mm512_inserti64x4
#define _mm512_inserti64x4 emu_inserti64x4
#undef _mm512_extracti64x4_epi64
#define _mm512_extracti64x4_epi64 emu_extracti64x4_epi64
#undef _mm512_setr_epi64
#define _mm512_setr_epi64 emu_setr_epi64
#undef _mm512_set1_epi8
#define _mm512_set1_epi8 emu_set1_epi8
#undef _mm512_setr_epi32
#define _mm512_setr_epi32 emu_setr_epi32
#undef _mm512_setzero_si512
#define _mm512_setzero_si512 emu_setzero_si512
#undef _mm512_loadu_si512
#define _mm512_loadu_si512 emu_loadu_si512
#undef _mm512_dpbusd_epi32
#define _mm512_dpbusd_epi32 emu_dpbusd_epi32
#undef _mm512_dpwssd_epi32
#define _mm512_dpwssd_epi32 emu_dpwssd_epi32
#undef _mm256_dpbusd_epi32
#define _mm256_dpbusd_epi32 emu_dpbusd256_epi32
#undef _mm512_setzero_ps
#define _mm512_setzero_ps emu_setzero_ps
#undef _mm512_set1_ps
#define _mm512_set1_ps emu_set1_ps
#undef _mm512_sub_ps
#define _mm512_sub_ps emu_sub_ps
#undef _mm512_mul_ps
#define _mm512_mul_ps emu_mul_ps
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps emu_fmadd_ps
#undef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps emu_cvtepi32_ps
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps emu_cvtph_ps
#undef _mm512_storeu_ps
#define _mm512_storeu_ps emu_storeu_ps
#undef _mm512_castps512_ps256
#define _mm512_castps512_ps256 emu_castps512_ps256
#undef _mm512_castps256_ps512
#define _mm512_castps256_ps512 emu_castps256_ps512
#undef _mm512_castps128_ps512
#define _mm512_castps128_ps512 emu_castps128_ps512
#undef _mm512_permutexvar_ps
#define _mm512_permutexvar_ps emu_permutexvar_ps
#undef _mm512_castps_pd
#define _mm512_castps_pd emu_castps_pd
#undef _mm512_castpd_ps
#define _mm512_castpd_ps emu_castpd_ps
#undef _mm512_castpd256_pd512
#define _mm512_castpd256_pd512 emu_castpd256_pd512
#undef _mm512_insertf64x4
#define _mm512_insertf64x4 emu_insertf64x4
#undef _mm512_extractf64x4_pd
#define _mm512_extractf64x4_pd emu_extractf64x4_pd

/* the kernels under other names, beside the real ones in the library */
#define kiln_dot_q8_0_vnni emu_dot_q8_0_vnni
#define kiln_dot_q4_0_vnni emu_dot_q4_0_vnni
#define kiln_dot_q4_K_vnni emu_dot_q4_K_vnni
#define cpu_gemm_q8_0_avx512 emu_gemm_q8_0_avx512
#define cpu_gemm_q4_0_avx512 emu_gemm_q4_0_avx512
#define cpu_gemm_q4_K_avx512 emu_gemm_q4_K_avx512
#define cpu_gemm_rows_q8_0_vnni emu_gemm_rows_q8_0_vnni
#define cpu_gemm_rows_q4_0_vnni emu_gemm_rows_q4_0_vnni
#define cpu_gemm_row1_q4_K_vnni emu_gemm_row1_q4_K_vnni
#define cpu_gemm_row1_q6_K_avx512 emu_gemm_row1_q6_K_avx512
#define cpu_gemm_q8_0_r16_avx512 emu_gemm_q8_0_r16_avx512
#define cpu_gemm_q4_K_r16_avx512 emu_gemm_q4_K_r16_avx512

/* this file is compiled for AVX2 (its name): so are the kernels included here */
#include "formats/dot_avx512.c"
#include "backend/cpu/cpu_gemm_avx512.c"

#include "avx512_kernels.h"

const avx512_kernels avx512_emulated = {emu_dot_q8_0_vnni, emu_dot_q4_0_vnni, emu_dot_q4_K_vnni,
                                        emu_gemm_q8_0_avx512, emu_gemm_q4_0_avx512, emu_gemm_q4_K_avx512,
                                        emu_gemm_rows_q8_0_vnni, emu_gemm_rows_q4_0_vnni, emu_gemm_row1_q4_K_vnni,
                                        emu_gemm_row1_q6_K_avx512, emu_gemm_q8_0_r16_avx512, emu_gemm_q4_K_r16_avx512};
