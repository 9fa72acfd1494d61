/*
 * register.c — fills the compute operations of the type table (to_float, from_float, the scalar
 * reference vec_dot and the best vec_dot_fast for this CPU), and the activation conversion helper
 * kiln_quantize_row_for_dot. SIMD variants are chosen once, at table initialization, by kiln_cpu_level():
 * AVX2 when the CPU has AVX2, FMA and F16C (x86), plus the VNNI dots of dot_avx512.c at the avx512 level
 * (Q8_0, Q4_0, Q4_K: bit-identical to their AVX2 versions), NEON in aarch64 builds; the scalar references
 * at the scalar level (KILN_NO_SIMD=1 or KILN_CPU_LEVEL=scalar).
 */
#include "base/env.h"
#include "base/error.h"
#include "formats/blocks.h"

/* Fast quantizers by type giving the reference bytes for finite input (NULL: use from_float); also the
 * activation converters of kiln_quantize_row_for_dot. Set with the table. */
static kiln_from_float_fn fast_quantizer[KILN_TYPE_COUNT];

static void set_ops(kiln_type_info *t, kiln_to_float_fn to_float, kiln_from_float_fn from_float,
                    kiln_vec_dot_fn dot, kiln_vec_dot_fn dot_simd) {
    t->to_float = to_float;
    t->from_float = from_float;
    t->vec_dot = dot;
    t->vec_dot_fast = dot_simd ? dot_simd : dot;
}

void kiln_formats_register(kiln_type_info *table) {
    const kiln_isa_level level = kiln_cpu_level();
#if KILN_X86
    const int simd = level >= KILN_CPU_AVX2, vnni = level >= KILN_CPU_AVX512;
#define SIMD(fn) (simd ? (fn) : NULL)
#define FAST(avx2, neon) SIMD(avx2)
#define BEST(avx512, avx2, neon) (vnni ? (avx512) : SIMD(avx2))
#elif KILN_NEON
    const int neon = level == KILN_CPU_NEON;
#define SIMD(fn) NULL
#define FAST(avx2, neon_fn) (neon ? (neon_fn) : NULL)
#define BEST(avx512, avx2, neon_fn) FAST(avx2, neon_fn)
#else
    (void)level;
#define SIMD(fn) NULL
#define FAST(avx2, neon) NULL
#define BEST(avx512, avx2, neon) NULL
#endif
    /* SIMD(f): an AVX2-only variant; FAST(f_avx2, f_neon): the variant of this build's ISA; BEST(f_avx512,
     * f_avx2, f_neon) the same with an AVX-512 VNNI variant on x86 */
    set_ops(&table[KILN_TYPE_F32], kiln_f32_to_float, kiln_f32_from_float, kiln_dot_f32, FAST(kiln_dot_f32_avx2, kiln_dot_f32_neon));
    set_ops(&table[KILN_TYPE_F16], kiln_f16_to_float, kiln_f16_from_float, kiln_dot_f16, FAST(kiln_dot_f16_avx2, kiln_dot_f16_neon));
    set_ops(&table[KILN_TYPE_BF16], kiln_bf16_to_float, kiln_bf16_from_float, kiln_dot_bf16, SIMD(kiln_dot_bf16_avx2));
    set_ops(&table[KILN_TYPE_Q4_0], kiln_q4_0_to_float, kiln_q4_0_from_float, kiln_dot_q4_0_q8_0, BEST(kiln_dot_q4_0_vnni, kiln_dot_q4_0_avx2, kiln_dot_q4_0_neon));
    set_ops(&table[KILN_TYPE_Q4_1], kiln_q4_1_to_float, kiln_q4_1_from_float, kiln_dot_q4_1_q8_1, SIMD(kiln_dot_q4_1_avx2));
    set_ops(&table[KILN_TYPE_Q5_0], kiln_q5_0_to_float, kiln_q5_0_from_float, kiln_dot_q5_0_q8_0, SIMD(kiln_dot_q5_0_avx2));
    set_ops(&table[KILN_TYPE_Q5_1], kiln_q5_1_to_float, kiln_q5_1_from_float, kiln_dot_q5_1_q8_1, SIMD(kiln_dot_q5_1_avx2));
    set_ops(&table[KILN_TYPE_Q8_0], kiln_q8_0_to_float, kiln_q8_0_from_float, kiln_dot_q8_0_q8_0, BEST(kiln_dot_q8_0_vnni, kiln_dot_q8_0_avx2, kiln_dot_q8_0_neon));
    set_ops(&table[KILN_TYPE_Q8_1], kiln_q8_1_to_float, kiln_q8_1_from_float, NULL, NULL);
    set_ops(&table[KILN_TYPE_Q2_K], kiln_q2_K_to_float, kiln_q2_K_from_float, kiln_dot_q2_K_q8_K, SIMD(kiln_dot_q2_K_avx2));
    set_ops(&table[KILN_TYPE_Q3_K], kiln_q3_K_to_float, kiln_q3_K_from_float, kiln_dot_q3_K_q8_K, SIMD(kiln_dot_q3_K_avx2));
    set_ops(&table[KILN_TYPE_Q4_K], kiln_q4_K_to_float, kiln_q4_K_from_float, kiln_dot_q4_K_q8_K, BEST(kiln_dot_q4_K_vnni, kiln_dot_q4_K_avx2, kiln_dot_q4_K_neon));
    set_ops(&table[KILN_TYPE_Q5_K], kiln_q5_K_to_float, kiln_q5_K_from_float, kiln_dot_q5_K_q8_K, SIMD(kiln_dot_q5_K_avx2));
    set_ops(&table[KILN_TYPE_Q6_K], kiln_q6_K_to_float, kiln_q6_K_from_float, kiln_dot_q6_K_q8_K, FAST(kiln_dot_q6_K_avx2, kiln_dot_q6_K_neon));
    set_ops(&table[KILN_TYPE_Q8_K], kiln_q8_K_to_float, kiln_q8_K_from_float, NULL, NULL);
#undef SIMD
#undef FAST
#undef BEST
    /* the fast activation quantizers produce the same bytes as the reference ones (tested) */
#if KILN_X86
    if (simd) {
        fast_quantizer[KILN_TYPE_Q8_0] = kiln_q8_0_from_float_avx2;
        fast_quantizer[KILN_TYPE_Q8_K] = kiln_q8_K_from_float_avx2;
        fast_quantizer[KILN_TYPE_Q8_1] = kiln_q8_1_from_float_avx2;
        fast_quantizer[KILN_TYPE_F16] = kiln_f16_from_float_avx2;
        fast_quantizer[KILN_TYPE_Q2_K] = kiln_q2_K_from_float_avx2;
        fast_quantizer[KILN_TYPE_Q4_K] = kiln_q4_K_from_float_avx2;
        fast_quantizer[KILN_TYPE_Q5_K] = kiln_q5_K_from_float_avx2;
        fast_quantizer[KILN_TYPE_Q6_K] = kiln_q6_K_from_float_avx2;
    }
#endif
}

kiln_from_float_fn kiln_from_float_fast(uint32_t type) {
    const kiln_type_info *t = kiln_type_get(type);
    if (!t) return NULL;
    return fast_quantizer[type] ? fast_quantizer[type] : t->from_float;
}

void kiln_quantize_row_for_dot(uint32_t weight_type, const float *x, void *dst, int64_t n) {
    const kiln_type_info *w = kiln_type_get(weight_type);
    KILN_ASSERT(w && w->vec_dot);
    const kiln_type_info *a = kiln_type_get(w->vec_dot_type);
    KILN_ASSERT(a && a->from_float && n % a->block_size == 0);
    if (w->vec_dot_type == KILN_TYPE_Q8_0 || w->vec_dot_type == KILN_TYPE_Q8_1) {
        const bool q80 = w->vec_dot_type == KILN_TYPE_Q8_0;
#if KILN_X86
        const bool avx2 = fast_quantizer[KILN_TYPE_Q8_0] != NULL;
        (q80 ? (avx2 ? kiln_q8_0_act_avx2 : kiln_q8_0_act_ref) : (avx2 ? kiln_q8_1_act_avx2 : kiln_q8_1_act_ref))(x, dst, n);
#else
        (q80 ? kiln_q8_0_act_ref : kiln_q8_1_act_ref)(x, dst, n);
#endif
        return;
    }
    kiln_from_float_fn fast = fast_quantizer[w->vec_dot_type];
    (fast ? fast : a->from_float)(x, dst, n);
}
