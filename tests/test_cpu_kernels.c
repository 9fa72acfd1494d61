/* test_cpu_kernels.c — the CPU backend's fast kernels against their scalar references on fresh random
 * inputs (never zeros), and the ops against straightforward formulas. */
#include "test.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_attn.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_repack.h"
#include "backend/cpu/cpu_ops.h"
#include "base/pool.h"
#include "formats/blocks.h"
#include "formats/formats.h"
#include "avx512_kernels.h"

TEST(cpu_attn_simd_matches_reference) {
    cpu_attn_kernels best = cpu_attn_select();
    if (best.dot == cpu_attn_dot_ref) { test_skip("no AVX2/FMA/F16C CPU or NEON build (or KILN_NO_SIMD=1)"); return; }
    uint64_t rng = 42;
    static const int lens[] = {1, 7, 8, 15, 16, 64, 80, 128, 129};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int n = lens[li];
        float q[160], o1[160], o2[160];
        uint16_t k[160];
        double mag = 0;
        for (int i = 0; i < n; i++) {
            q[i] = test_rand_normal(&rng);
            k[i] = kiln_f32_to_f16(test_rand_normal(&rng));
            o1[i] = o2[i] = test_rand_normal(&rng);
            mag += fabs(q[i] * kiln_f16_to_f32(k[i]));
        }
        float a = cpu_attn_dot_ref(q, k, n), b = best.dot(q, k, n);
        CHECKF(fabs(a - b) <= 4 * 1.2e-7 * mag + 1e-30, "dot n=%d: %.9g vs %.9g", n, a, b);
        float w = test_rand_normal(&rng);
        cpu_attn_axpy_ref(o1, w, k, n);
        best.axpy(o2, w, k, n);
        for (int i = 0; i < n; i++) CHECKF(fabsf(o1[i] - o2[i]) <= 1e-6f * (1 + fabsf(o1[i])), "axpy n=%d i=%d", n, i);
    }
}

TEST(cpu_ops_match_formulas) {
    uint64_t rng = 7;
    float x[64], w[64], y[64];
    double ss = 0;
    for (int i = 0; i < 64; i++) { x[i] = test_rand_normal(&rng); w[i] = test_rand_normal(&rng); ss += (double)x[i] * x[i]; }
    cpu_rmsnorm(y, x, w, 64, 1e-5f);
    for (int i = 0; i < 64; i++) CHECKF(fabs(y[i] - x[i] / sqrt(ss / 64 + 1e-5) * w[i]) < 1e-5, "rmsnorm %d", i);
    float s[9] = {1, 2, 3, -1, 0.5f, 7, 7, -3, 2};
    cpu_softmax(s, 9);
    double sum = 0;
    for (int i = 0; i < 9; i++) sum += s[i];
    CHECK(fabs(sum - 1) < 1e-6);
    CHECK(fabsf(s[5] - s[6]) < 1e-7f && s[5] > s[2]);
    CHECK_EQ_INT(cpu_argmax((float[]){1, 5, 5, 2}, 4), 1);
    /* llama RoPE on adjacent pairs at position 3 with base 10000, n_rot 4 */
    float ct[2 * 8], st[2 * 8], h[4] = {1, 2, 3, 4};
    cpu_rope_tables(ct, st, 8, 4, 10000.0f, 1.0f, NULL);
    cpu_rope_head(h, ct + 3 * 2, st + 3 * 2, 4, false);
    double t1 = 3.0 * pow(10000.0, -0.5);
    CHECK(fabs(h[0] - (cos(3.0) - 2 * sin(3.0))) < 1e-5 && fabs(h[1] - (sin(3.0) + 2 * cos(3.0))) < 1e-5);
    CHECK(fabs(h[2] - (3 * cos(t1) - 4 * sin(t1))) < 1e-5 && fabs(h[3] - (3 * sin(t1) + 4 * cos(t1))) < 1e-5);
    /* with frequency divisors {1, 4} and linear scaling 1/2: theta_i = p/2 * base^(-2i/n_rot) / ff[i] */
    cpu_rope_tables(ct, st, 8, 4, 10000.0f, 0.5f, (const float[]){1.0f, 4.0f});
    for (int i = 0; i < 2; i++) {
        const double th = 0.5 * 5.0 * pow(10000.0, -0.5 * i) / (i ? 4.0 : 1.0);
        CHECKF(fabs(ct[5 * 2 + i] - cos(th)) < 1e-6 && fabs(st[5 * 2 + i] - sin(th)) < 1e-6, "rope table p 5 i %d", i);
    }
}

#include "formats/blocks.h"
#include "gguf/gguf.h"

/* The activation quantizers of the matmul path: the reference's x.q8_0 / x.q8_1 bytes, AVX2 == scalar on
 * random rows, and halves rounded to even (the reference AVX2 build's rule). */
TEST(cpu_activation_quantizers_match_reference) {
    gguf_file *f;
    REQUIRE_OK(gguf_open(test_shared("quant/quant-vectors.gguf"), &f));
    const gguf_tensor *x = gguf_find_tensor(f, "x"), *q0 = gguf_find_tensor(f, "x.q8_0"), *q1 = gguf_find_tensor(f, "x.q8_1");
    REQUIRE(x && q0 && q1);
    uint8_t out[2048];
    kiln_quantize_row_for_dot(KILN_TYPE_Q4_0, x->data, out, 1024);
    CHECK(!memcmp(out, q0->data, kiln_row_bytes(KILN_TYPE_Q8_0, 1024)));
    kiln_quantize_row_for_dot(KILN_TYPE_Q4_1, x->data, out, 1024);
    CHECK(!memcmp(out, q1->data, kiln_row_bytes(KILN_TYPE_Q8_1, 1024)));
    gguf_close(f);
    uint64_t rng = 99;
    float row[256];
    uint8_t a[512], b[512];
    (void)b; /* the AVX2 variants are x86 only */
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 256; i++) row[i] = test_rand_normal(&rng) * (round % 5 ? 1.0f : 1e-3f);
        if (round % 7 == 0) { row[0] = 127.0f; row[1] = 0.5f; row[2] = 1.5f; row[3] = -2.5f; } /* exact halves */
        kiln_q8_0_act_ref(row, a, 256);
#if KILN_X86
        if (kiln_cpu_has_avx2()) { kiln_q8_0_act_avx2(row, b, 256); CHECKF(!memcmp(a, b, 8 * 34), "q8_0 round %d", round); }
#endif
        kiln_q8_1_act_ref(row, a, 256);
#if KILN_X86
        if (kiln_cpu_has_avx2()) { kiln_q8_1_act_avx2(row, b, 256); CHECKF(!memcmp(a, b, 8 * 36), "q8_1 round %d", round); }
#endif
    }
    /* amax 127: id 1, so 0.5 -> 0, 1.5 -> 2, -2.5 -> -2 (to even; roundf would give 1, 2, -3) */
    row[0] = 127.0f; row[1] = 0.5f; row[2] = 1.5f; row[3] = -2.5f;
    kiln_q8_0_act_ref(row, a, 32);
    const block_q8_0 *blk = (const block_q8_0 *)a;
    CHECK_EQ_INT(blk->qs[1], 0);
    CHECK_EQ_INT(blk->qs[2], 2);
    CHECK_EQ_INT(blk->qs[3], -2);
}

/* One random block product: weight rows 0..nw-1, activation rows 0..na-1 of n values, the tiled kernel over
 * the sub-block [r0, r1) x [b0, b1) against the single dot pair by pair (bit for bit) and the reference
 * (cpu_gemm_ref); cells outside the sub-block must stay untouched. */
static void gemm_case(uint32_t type, cpu_gemm_fn fast, kiln_vec_dot_fn dot, int n, int nw, int na, int r0, int r1, int b0,
                      int b1, uint64_t *rng) {
    enum { MAXW = 11, MAXA = 11, MAXN = 768 };
    const kiln_type_info *ti = kiln_type_get(type);
    static uint8_t w[MAXW][MAXN / 32 * 34 + 64], y[MAXA][MAXN / 32 * 36 + 64];
    static float yd[MAXA * (MAXN / 32)], got[MAXA * MAXW], ref[MAXA * MAXW];
    static uint8_t yu[MAXA * MAXN];
    float xf[MAXN];
    for (int r = 0; r < nw; r++) {
        for (int i = 0; i < n; i++) xf[i] = test_rand_normal(rng) * (1 + r % 3);
        ti->from_float(xf, w[r], n);
    }
    for (int b = 0; b < na; b++) {
        for (int i = 0; i < n; i++) xf[i] = test_rand_normal(rng) * (b % 4 ? 1.0f : 20.0f);
        kiln_quantize_row_for_dot(type, xf, y[b], n);
        if (ti->vec_dot_type == KILN_TYPE_Q8_0)
            for (int ib = 0; ib < n / 32; ib++) yd[b * (n / 32) + ib] = kiln_f16_to_f32(((const block_q8_0 *)y[b])[ib].d);
        if (ti->vec_dot_type == KILN_TYPE_Q8_0) cpu_gemm_flip_row(y[b], n, yu + (size_t)b * n);
        if (ti->vec_dot_type == KILN_TYPE_Q8_K) cpu_gemm_k4_order_row(y[b], n, yu + (size_t)b * n);
    }
    const cpu_gemm_args a = {.dot = dot, .n = n, .w = w[0], .w_stride = sizeof w[0], .y = y[0],
                             .y_stride = sizeof y[0], .yd = yd, .yu = yu, .out = got, .out_stride = MAXW};
    cpu_gemm_args aref = a;
    aref.out = ref;
    for (int i = 0; i < MAXA * MAXW; i++) got[i] = ref[i] = -1234.5f;
    fast(&a, r0, r1, b0, b1);
    cpu_gemm_ref(&aref, r0, r1, b0, b1);
    for (int b = 0; b < na; b++)
        for (int r = 0; r < nw; r++) {
            float want = -1234.5f;
            if (r >= r0 && r < r1 && b >= b0 && b < b1) dot(n, &want, w[r], y[b]);
            CHECKF(!memcmp(&want, &got[b * MAXW + r], sizeof want) && !memcmp(&want, &ref[b * MAXW + r], sizeof want),
                   "%s n %d rows [%d,%d) acts [%d,%d) cell (%d,%d): single %.9g tiled %.9g ref %.9g", ti->name, n, r0, r1,
                   b0, b1, r, b, want, got[b * MAXW + r], ref[b * MAXW + r]);
        }
}

/* The tiled block products (every tile shape and edge: 1..11 weight rows x 1..11 activation rows, sub-blocks
 * not starting at 0) give exactly each single dot, for the kernels the CPU backend picks. */
TEST(cpu_gemm_bit_identical_to_single_dots) {
    kiln_formats_init();
    static const uint32_t types[] = {KILN_TYPE_Q8_0, KILN_TYPE_Q4_0, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    static const int sizes[4][2] = {{288, 96}, {352, 64}, {768, 256}, {768, 256}};
    uint64_t rng = 2024;
    for (int t = 0; t < 4; t++) {
        const kiln_type_info *ti = kiln_type_get(types[t]);
        const cpu_gemm_fn fast = cpu_gemm_select(ti->vec_dot_fast);
        if (fast == cpu_gemm_ref) printf("  (no tiled %s kernel on this CPU: the reference only)\n", ti->name);
        for (int nw = 1; nw <= 11; nw++)
            for (int na = 1; na <= 11; na++) {
                gemm_case(types[t], fast, ti->vec_dot_fast, sizes[t][nw % 2], nw, na, 0, nw, 0, na, &rng);
                if (nw > 2 && na > 2) gemm_case(types[t], fast, ti->vec_dot_fast, sizes[t][0], nw, na, 1, nw - 1, 2, na, &rng);
            }
    }
}

/* The small-batch products of batched decode (one weight row at a time against up to 8 activation rows in one
 * pass, more in chunks of 8): every row count 1..11 x 1..11 and sub-blocks not starting at 0 give exactly each
 * single dot, for the kernels the CPU backend picks and for the reference. */
TEST(cpu_gemm_rows_bit_identical_to_single_dots) {
    kiln_formats_init();
    static const uint32_t types[] = {KILN_TYPE_Q8_0, KILN_TYPE_Q4_0, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    static const int sizes[4][2] = {{288, 96}, {352, 64}, {768, 256}, {768, 256}};
    uint64_t rng = 77;
    for (int t = 0; t < 4; t++) {
        const kiln_type_info *ti = kiln_type_get(types[t]);
        const cpu_gemm_fn fast = cpu_gemm_rows_select(ti->vec_dot_fast);
        if (fast == cpu_gemm_rows_ref) printf("  (no small-batch %s kernel on this CPU: the reference only)\n", ti->name);
        const cpu_gemm_fn kernels[2] = {fast, cpu_gemm_rows_ref};
        for (int k = 0; k < 2; k++)
            for (int nw = 1; nw <= 11; nw++)
                for (int na = 1; na <= 11; na++) {
                    gemm_case(types[t], kernels[k], ti->vec_dot_fast, sizes[t][(nw + na) % 2], nw, na, 0, nw, 0, na, &rng);
                    if (nw > 2 && na > 2) gemm_case(types[t], kernels[k], ti->vec_dot_fast, sizes[t][0], nw, na, 1, nw - 1, 2, na, &rng);
                }
    }
}

/* The single-activation-row kernels of decode (cpu_gemm_row1_select, where one exists for the dot in use, and the
 * AVX2 ones on any AVX2 CPU, VNNI or not): every weight row count 1..11, sub-blocks not starting at 0, the
 * activation row first or not, give exactly each single dot. */
static void row1_cases(uint32_t type, cpu_gemm_fn fast, kiln_vec_dot_fn dot, const int sizes[2], uint64_t *rng) {
    for (int nw = 1; nw <= 11; nw++)
        for (int b = 0; b < 3; b++) {
            gemm_case(type, fast, dot, sizes[nw % 2], nw, 3, 0, nw, b, b + 1, rng);
            if (nw > 2) gemm_case(type, fast, dot, sizes[0], nw, 3, 1, nw - 1, b, b + 1, rng);
        }
}

TEST(cpu_gemm_row1_bit_identical_to_single_dots) {
    kiln_formats_init();
    static const uint32_t types[] = {KILN_TYPE_Q8_0, KILN_TYPE_Q4_0, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    static const int sizes[4][2] = {{288, 96}, {352, 64}, {768, 256}, {768, 256}};
    uint64_t rng = 91;
    int kernels = 0;
    for (int t = 0; t < 4; t++) {
        const kiln_type_info *ti = kiln_type_get(types[t]);
        const cpu_gemm_fn fast = cpu_gemm_row1_select(ti->vec_dot_fast);
        if (fast) row1_cases(types[t], fast, ti->vec_dot_fast, sizes[t], &rng), kernels++;
    }
#if defined(__x86_64__)
    if (kiln_cpu_level() >= KILN_CPU_AVX2) {
        row1_cases(KILN_TYPE_Q8_0, cpu_gemm_row1_q8_0_avx2, kiln_dot_q8_0_avx2, sizes[0], &rng);
        row1_cases(KILN_TYPE_Q4_0, cpu_gemm_row1_q4_0_avx2, kiln_dot_q4_0_avx2, sizes[1], &rng);
        row1_cases(KILN_TYPE_Q4_K, cpu_gemm_row1_q4_K_avx2, kiln_dot_q4_K_avx2, sizes[2], &rng);
        row1_cases(KILN_TYPE_Q6_K, cpu_gemm_row1_q6_K_avx2, kiln_dot_q6_K_avx2, sizes[3], &rng);
        kernels += 4;
    }
    if (kiln_cpu_level() >= KILN_CPU_AVX512) {
        /* the avx512 level's Q6_K dot (no VNNI one) and its kernel there, so the loop above ran that one */
        CHECK(kiln_type_get(KILN_TYPE_Q6_K)->vec_dot_fast == kiln_dot_q6_K_avx2);
        CHECK(cpu_gemm_row1_select(kiln_dot_q6_K_avx2) == cpu_gemm_row1_q6_K_avx512);
    }
#endif
    if (!kernels) test_skip("no single-row kernel on this CPU (or KILN_NO_SIMD=1): the dots only");
}

/* The exact argmax (cpu_argmax_select) against the reference on random rows with ties, NaNs (also at 0), signed
 * zeros and infinities, every length 1..80 and a vocabulary-sized row. */
TEST(cpu_argmax_fast_equals_reference) {
    const cpu_argmax_fn fast = cpu_argmax_select();
    if (fast == cpu_argmax) { test_skip("no AVX2 CPU (or KILN_NO_SIMD=1): the reference only"); return; }
    enum { BIG = 49157 };
    static float x[BIG];
    uint64_t rng = 5;
    int cases = 0;
    for (int round = 0; round < 400; round++) {
        const int n = round < 320 ? 1 + round % 80 : BIG - round % 7;
        const int kind = round % 8;
        for (int i = 0; i < n; i++) {
            x[i] = test_rand_normal(&rng);
            if (kind == 1) x[i] = (float)(int)(x[i] * 2); /* many ties */
            if (kind == 2 && i % 5 == 0) x[i] = NAN;
            if (kind == 3) x[i] = i % 2 ? -0.0f : 0.0f;
            if (kind == 4) x[i] = -INFINITY;
        }
        if (kind == 5) x[0] = NAN;
        if (kind == 6) x[n - 1] = INFINITY;
        if (kind == 7) x[(int)(test_rand_u64(&rng) % (uint64_t)n)] = 100.0f, x[n / 2] = 100.0f;
        const int32_t want = cpu_argmax(x, n), got = fast(x, n);
        CHECKF(want == got, "round %d n %d kind %d: reference %d fast %d", round, n, kind, want, got);
        cases++;
    }
    CHECK_EQ_INT(cases, 400);
}

/* scores and mix (the whole-head attention loops) give bit for bit what their loops of the same variant's dot
 * and axpy give, and the reference's within float rounding, on random heads: head sizes with and without
 * 32- and 8-value tails, key counts not multiples of 4, a cache stride wider than the head. */
TEST(cpu_attn_scores_mix_equal_their_per_key_loops) {
    enum { MAXK = 37, MAXN = 136, STRIDE = 200 };
    static uint16_t kv[MAXK * STRIDE];
    float q[MAXN], w[MAXK], sc[MAXK], sc_ref[MAXK], o[MAXN], o_loop[MAXN], o_ref[MAXN];
    const cpu_attn_kernels best = cpu_attn_select();
    uint64_t rng = 314;
    static const int ns[] = {1, 7, 8, 40, 64, 72, 128, 136};
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (int n_keys = 1; n_keys <= MAXK; n_keys += 3) {
            const int n = ns[ni];
            for (int i = 0; i < MAXK * STRIDE; i++) kv[i] = kiln_f32_to_f16(test_rand_normal(&rng));
            for (int i = 0; i < n; i++) q[i] = test_rand_normal(&rng);
            for (int i = 0; i < n_keys; i++) w[i] = fabsf(test_rand_normal(&rng)) / n_keys;
            best.scores(sc, q, kv, STRIDE, n_keys, n, 0.125f);
            cpu_attn_scores_ref(sc_ref, q, kv, STRIDE, n_keys, n, 0.125f);
            for (int i = 0; i < n_keys; i++) {
                const float want = best.dot(q, kv + (size_t)i * STRIDE, n) * 0.125f;
                CHECKF(!memcmp(&want, &sc[i], sizeof want), "scores n %d keys %d key %d: %.9g vs dot %.9g", n, n_keys, i, sc[i], want);
                CHECKF(fabsf(sc[i] - sc_ref[i]) <= 1e-5f * (1 + fabsf(sc_ref[i])) * n, "scores vs ref n %d key %d", n, i);
            }
            best.mix(o, w, kv, STRIDE, n_keys, n);
            cpu_attn_mix_ref(o_ref, w, kv, STRIDE, n_keys, n);
            memset(o_loop, 0, sizeof o_loop);
            for (int i = 0; i < n_keys; i++) best.axpy(o_loop, w[i], kv + (size_t)i * STRIDE, n);
            for (int c = 0; c < n; c++) {
                CHECKF(!memcmp(&o[c], &o_loop[c], sizeof o[c]), "mix n %d keys %d dim %d: %.9g vs axpy loop %.9g", n, n_keys, c, o[c], o_loop[c]);
                CHECKF(fabsf(o[c] - o_ref[c]) <= 1e-5f * (1 + fabsf(o_ref[c])), "mix vs ref n %d dim %d", n, c);
            }
        }
}

/* The F16 round trip of attention (q and the softmax weights): bit for bit the scalar pair, on normal, subnormal,
 * halfway, overflowing and NaN values at every offset of an 8-value group. */
TEST(cpu_attn_round_f16_equals_scalar_pair) {
    const cpu_attn_kernels best = cpu_attn_select();
    enum { N = 4099 };
    static float a[N], b[N];
    uint64_t rng = 11;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < N; i++) {
            const uint64_t r = test_rand_u64(&rng);
            const int kind = (int)(r % 9);
            float v = test_rand_normal(&rng);
            if (kind == 1) v *= 1e-6f;                                            /* half subnormals */
            if (kind == 2) v = (float)((int)(r >> 8) % 2048) * 0x1p-24f * 1.5f; /* halfway cases */
            if (kind == 3) v *= 70000.0f;                                         /* overflow to inf */
            if (kind == 4 && r % 7 == 0) v = NAN;
            if (kind == 5) v *= 1e-30f;                                           /* to zero */
            a[i] = b[i] = v;
        }
        cpu_attn_round_f16_ref(a, N);
        best.round_f16(b, N - round);
        cpu_attn_round_f16_ref(b + N - round, round);
        for (int i = 0; i < N; i++) CHECKF(!memcmp(&a[i], &b[i], sizeof a[i]), "round %d i %d: %a vs %a", round, i, a[i], b[i]);
    }
}


#if KILN_X86
/* Weights interleaved by 16 (cpu_repack.h; Q8_0 or Q4_K): groups of 16 random rows of n values repacked,
 * activation rows converted as cpu_matmul does (Q8_0 scales as floats, cpu_r16_act_sums); `fast` over groups
 * [g0, g1) x activation rows [b0, b1) against the type's cpu_dot_*_r16 on the file's rows cell by cell, and the
 * scalar kernel over the copy, bit for bit; cells outside stay untouched; and that reference within float
 * tolerance of the type's scalar dot. */
static void r16_case(uint32_t type, cpu_gemm_fn fast, int n, int groups, int na, int g0, int g1, int b0, int b1, uint64_t *rng) {
    enum { MAXG = 3, MAXA = 11, MAXN = 1024, ROWB = MAXN / 32 * 34, YB = MAXN / 256 * 292 };
    const bool k4 = type == KILN_TYPE_Q4_K;
    const int nw = groups * CPU_R16, nb = n / 32;
    static uint8_t w[MAXG * CPU_R16 * ROWB], packed[MAXG * CPU_R16 * ROWB] __attribute__((aligned(64))), y[MAXA][YB];
    static float yd[MAXA * (MAXN / 32)], got[MAXA * MAXG * CPU_R16], ref[MAXA * MAXG * CPU_R16];
    static int32_t ys[MAXA * (MAXN / 32)];
    const kiln_type_info *ti = kiln_type_get(type);
    const size_t row = kiln_row_bytes(type, (uint64_t)n);
    float (*dot_r16)(int, const void *, const void *) = k4 ? cpu_dot_q4_K_r16 : cpu_dot_q8_0_r16;
    float xf[MAXN];
    for (int r = 0; r < nw; r++) {
        for (int i = 0; i < n; i++) xf[i] = test_rand_normal(rng) * (1 + r % 3) + (k4 && r % 2 ? 0.5f : 0.0f);
        ti->from_float(xf, w + (size_t)r * row, n);
    }
    const kiln_weight wt = {.data = w, .type = type, .ne = {(uint64_t)n, (uint64_t)nw, 1}, .nbytes = row * (size_t)nw};
    CHECK(cpu_repack_fits(&wt));
    cpu_repack_r16(&wt, packed, 0, groups);
    for (int b = 0; b < na; b++) {
        for (int i = 0; i < n; i++) xf[i] = test_rand_normal(rng) * (b % 4 ? 1.0f : 20.0f);
        kiln_quantize_row_for_dot(type, xf, y[b], n);
        cpu_r16_act_sums(type, y[b], n, ys + b * nb);
        if (!k4)
            for (int ib = 0; ib < nb; ib++) yd[b * nb + ib] = kiln_f16_to_f32(((const block_q8_0 *)y[b])[ib].d);
    }
    const cpu_gemm_args a = {.n = n, .w = packed, .w_stride = row, .y = y[0], .y_stride = sizeof y[0], .yd = yd,
                             .ys = ys, .out = got, .out_stride = MAXG * CPU_R16};
    cpu_gemm_args aref = a;
    aref.out = ref;
    for (int i = 0; i < MAXA * MAXG * CPU_R16; i++) got[i] = ref[i] = -1234.5f;
    fast(&a, g0 * CPU_R16, g1 * CPU_R16, b0, b1);
    (k4 ? cpu_gemm_q4_K_r16_ref : cpu_gemm_q8_0_r16_ref)(&aref, g0 * CPU_R16, g1 * CPU_R16, b0, b1);
    for (int b = 0; b < na; b++)
        for (int r = 0; r < nw; r++) {
            const bool in = r >= g0 * CPU_R16 && r < g1 * CPU_R16 && b >= b0 && b < b1;
            const float want = in ? dot_r16(n, w + (size_t)r * row, y[b]) : -1234.5f;
            const float cell = got[b * MAXG * CPU_R16 + r];
            CHECKF(!memcmp(&want, &cell, sizeof want) && !memcmp(&want, &ref[b * MAXG * CPU_R16 + r], sizeof want),
                   "r16 %s n %d groups [%d,%d) acts [%d,%d) cell (%d,%d): dot %.9g kernel %.9g scalar kernel %.9g", ti->name,
                   n, g0, g1, b0, b1, r, b, want, cell, ref[b * MAXG * CPU_R16 + r]);
            if (!in) continue;
            float plain = NAN;
            ti->vec_dot(n, &plain, w + (size_t)r * row, y[b]);
            CHECKF(fabsf(plain - want) <= 1e-4f * (1.0f + fabsf(plain)), "r16 %s n %d cell (%d,%d): %.9g vs the plain dot %.9g",
                   ti->name, n, r, b, want, plain);
        }
}

/* The AVX-512 kernels of k against the AVX2 ones, bit for bit: the VNNI dots on random rows of several lengths
 * (normals, a scaled row, an outlier), the tiles, the small-batch and the single-row kernels through gemm_case
 * (every tile shape and edge, sub-blocks) against their VNNI dot; and the VNNI dots within tolerance of the scalar references. */
static void check_avx512_kernels(const avx512_kernels *k) {
    static const struct { uint32_t type; int lengths[5]; } cases[] = {
        {KILN_TYPE_Q8_0, {32, 96, 288, 1056, 4096}}, {KILN_TYPE_Q4_0, {32, 64, 352, 1024, 4096}},
        {KILN_TYPE_Q4_K, {256, 512, 768, 2048, 4096}}};
    const kiln_vec_dot_fn vnni[3] = {k->dot_q8_0, k->dot_q4_0, k->dot_q4_K};
    const kiln_vec_dot_fn avx2[3] = {kiln_dot_q8_0_avx2, kiln_dot_q4_0_avx2, kiln_dot_q4_K_avx2};
    const cpu_gemm_fn gemm[3] = {k->gemm_q8_0, k->gemm_q4_0, k->gemm_q4_K}, rows[3] = {k->rows_q8_0, k->rows_q4_0, NULL};
    static float xf[4096], wf[4096], wd[4096], xd[4096];
    static uint8_t wq[4096 / 32 * 36], xq[4096 / 32 * 36 + 4096];
    uint64_t rng = 0x76e6e69;
    for (int t = 0; t < 3; t++) {
        const kiln_type_info *ti = kiln_type_get(cases[t].type);
        for (int li = 0; li < 5; li++) {
            const int n = cases[t].lengths[li];
            for (int trial = 0; trial < 4; trial++) {
                const float scale = trial == 3 ? 1e-3f : 1.0f;
                for (int i = 0; i < n; i++) {
                    wf[i] = test_rand_normal(&rng) * scale;
                    xf[i] = test_rand_normal(&rng) * (trial == 2 ? 30.0f : 1.0f);
                }
                if (trial == 1) xf[n / 3] = 500.0f;
                ti->from_float(wf, wq, n);
                kiln_quantize_row_for_dot(cases[t].type, xf, xq, n);
                float got = NAN, want = NAN, ref = NAN;
                vnni[t](n, &got, wq, xq);
                avx2[t](n, &want, wq, xq);
                ti->vec_dot(n, &ref, wq, xq);
                CHECKF(!memcmp(&got, &want, sizeof got), "%s n %d trial %d: vnni dot %.9g != avx2 dot %.9g", ti->name, n,
                       trial, got, want);
                ti->to_float(wq, wd, n);
                kiln_type_get(ti->vec_dot_type)->to_float(xq, xd, n);
                double mag = 0;
                for (int i = 0; i < n; i++) mag += fabs((double)wd[i] * xd[i]);
                CHECKF(fabs((double)got - ref) <= 4.0 * 1.2e-7 * mag + 1e-30, "%s n %d: vnni dot %.9g vs scalar %.9g",
                       ti->name, n, got, ref);
            }
        }
        static const int sizes[3][2] = {{288, 96}, {352, 64}, {768, 256}};
        for (int nw = 1; nw <= 11; nw++)
            for (int na = 1; na <= 11; na++) {
                gemm_case(cases[t].type, gemm[t], vnni[t], sizes[t][nw % 2], nw, na, 0, nw, 0, na, &rng);
                if (nw > 2 && na > 2) gemm_case(cases[t].type, gemm[t], vnni[t], sizes[t][0], nw, na, 1, nw - 1, 2, na, &rng);
                if (!rows[t]) continue;
                gemm_case(cases[t].type, rows[t], vnni[t], sizes[t][(nw + na) % 2], nw, na, 0, nw, 0, na, &rng);
                if (nw > 2 && na > 2) gemm_case(cases[t].type, rows[t], vnni[t], sizes[t][0], nw, na, 1, nw - 1, 2, na, &rng);
            }
        if (cases[t].type != KILN_TYPE_Q4_K) continue;
        for (int nw = 1; nw <= 11; nw++) /* the single-row kernel: one activation row of three */
            for (int b = 0; b < 3; b++) {
                gemm_case(cases[t].type, k->row1_q4_K, vnni[t], sizes[t][nw % 2], nw, 3, 0, nw, b, b + 1, &rng);
                if (nw > 2) gemm_case(cases[t].type, k->row1_q4_K, vnni[t], sizes[t][0], nw, 3, 1, nw - 1, b, b + 1, &rng);
            }
    }
    /* Q8_0 rows interleaved by 16: 1..11 activation rows (the tile's 8 and its edges), sub-ranges of groups */
    for (int na = 1; na <= 11; na++) {
        r16_case(KILN_TYPE_Q8_0, k->r16_q8_0, na % 2 ? 576 : 128, 1 + na % 3, na, 0, 1 + na % 3, 0, na, &rng);
        r16_case(KILN_TYPE_Q4_K, k->r16_q4_K, na % 2 ? 768 : 256, 1 + na % 3, na, 0, 1 + na % 3, 0, na, &rng);
        if (na < 3) continue;
        r16_case(KILN_TYPE_Q8_0, k->r16_q8_0, 1024, 3, na, 1, 3, 1, na - 1, &rng);
        r16_case(KILN_TYPE_Q4_K, k->r16_q4_K, 1024, 3, na, 1, 3, 1, na - 1, &rng);
    }
    /* Q6_K's single-row kernel against the dot of its level (Q6_K has no VNNI dot) */
    static const int q6_sizes[2] = {768, 256};
    row1_cases(KILN_TYPE_Q6_K, k->row1_q6_K, kiln_dot_q6_K_avx2, q6_sizes, &rng);
}
#endif

/* The real AVX-512 VNNI kernels (dot_avx512.c, cpu_gemm_avx512.c), where the CPU has AVX-512 F/BW/VL/VNNI. */
TEST(cpu_avx512_kernels_bit_identical_to_avx2) {
#if KILN_X86
    if (!kiln_cpu_has_avx512vnni()) { test_skip("no AVX-512 F/BW/VL/VNNI on this CPU"); return; }
    kiln_formats_init();
    const avx512_kernels real = {kiln_dot_q8_0_vnni, kiln_dot_q4_0_vnni, kiln_dot_q4_K_vnni,
                                 cpu_gemm_q8_0_avx512, cpu_gemm_q4_0_avx512, cpu_gemm_q4_K_avx512,
                                 cpu_gemm_rows_q8_0_vnni, cpu_gemm_rows_q4_0_vnni, cpu_gemm_row1_q4_K_vnni,
                                 cpu_gemm_row1_q6_K_avx512, cpu_gemm_q8_0_r16_avx512, cpu_gemm_q4_K_r16_avx512};
    check_avx512_kernels(&real);
    /* and the backend picks them at the avx512 level */
    if (kiln_cpu_level() == KILN_CPU_AVX512) {
        CHECK(kiln_type_get(KILN_TYPE_Q8_0)->vec_dot_fast == kiln_dot_q8_0_vnni);
        CHECK(cpu_gemm_select(kiln_dot_q8_0_vnni) == cpu_gemm_q8_0_avx512);
    }
#else
    test_skip("not an x86 build");
#endif
}

/* The same source over the AVX2 emulation of the AVX-512 intrinsics (avx512_emu_avx2.c): the kernels' logic
 * on any AVX2 CPU. */
TEST(cpu_avx512_kernels_emulated_bit_identical_to_avx2) {
#if KILN_X86
    if (!kiln_cpu_has_avx2()) { test_skip("no AVX2 on this CPU"); return; }
    kiln_formats_init();
    check_avx512_kernels(&avx512_emulated);
#else
    test_skip("not an x86 build");
#endif
}

#if KILN_X86
/* Distance in units in the last place between two floats of the same sign (or zeros): their bit patterns in
 * float order. */
static int64_t ulp_distance(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    const int64_t oa = ia < 0 ? (int64_t)INT32_MIN - ia : ia, ob = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return oa > ob ? oa - ob : ob - oa;
}

/* The largest ulp distance of cpu_exp_avx2 from expf over x[0..n) (n not a multiple of 8: the masked tail too);
 * infinities, zeros and NaNs must be the same. */
static int64_t exp_worst_ulp(const float *x, int n) {
    static float y[4099];
    cpu_exp_avx2(y, x, n);
    int64_t worst = 0;
    for (int i = 0; i < n; i++) {
        const float want = expf(x[i]);
        CHECKF(isnan(want) == isnan(y[i]) && isinf(want) == isinf(y[i]) && (want == 0) == (y[i] == 0),
               "exp(%a) = %a, expf %a", x[i], y[i], want);
        const int64_t d = isnan(want) ? 0 : ulp_distance(y[i], want);
        worst = d > worst ? d : worst;
    }
    return worst;
}

/* The vector exp of softmax and SwiGLU within 2 ulp of expf: every 997th float from -104 to 89 (the subnormal,
 * overflow and underflow edges inside), random arguments, and the edges: -inf and below -104 give 0, +-0 give
 * exactly 1, above 88.73 and +inf give inf, NaN gives NaN. */
TEST(cpu_exp_avx2_within_2ulp_of_expf) {
    if (kiln_cpu_level() < KILN_CPU_AVX2) { test_skip("no AVX2 CPU (or KILN_NO_SIMD=1)"); return; }
    enum { N = 4099 };
    static float x[N];
    int64_t worst = 0, count = 0;
    for (int sign = 0; sign < 2; sign++) {
        const uint32_t last = sign ? 0xC2D00000u /* -104 */ : 0x42B20000u /* 89 */;
        int k = 0;
        for (uint32_t b = sign ? 0x80000000u : 0; b <= last; b += 997) {
            memcpy(&x[k++], &b, 4);
            if (k == N || b + 997 > last) {
                const int64_t d = exp_worst_ulp(x, k);
                worst = d > worst ? d : worst;
                count += k;
                k = 0;
            }
        }
    }
    uint64_t rng = 99;
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < N; i++) x[i] = test_rand_normal(&rng) * (round % 2 ? 30.0f : 3.0f);
        const int64_t d = exp_worst_ulp(x, N - round % 8);
        worst = d > worst ? d : worst;
    }
    static const float edges[] = {-INFINITY, -1000.0f, -104.5f, -103.9f, -87.5f, -0.0f, 0.0f, 88.72f, 88.7228f,
                                  88.723f, 89.0f, 1000.0f, INFINITY, NAN};
    float y[sizeof edges / sizeof edges[0]];
    const int ne = (int)(sizeof edges / sizeof edges[0]);
    cpu_exp_avx2(y, edges, ne);
    CHECK(y[0] == 0 && y[1] == 0 && y[2] == 0 && y[5] == 1 && y[6] == 1);
    CHECK(isinf(y[9]) && isinf(y[10]) && isinf(y[11]) && isinf(y[12]) && isnan(y[13]) && y[8] < INFINITY);
    const int64_t d = exp_worst_ulp(edges, ne);
    worst = d > worst ? d : worst;
    printf("  exp: worst %lld ulp from expf over %lld sampled floats\n", (long long)worst, (long long)count);
    CHECKF(worst <= 2, "worst %lld ulp", (long long)worst);
}

/* a and b agree: both NaN, or equal infinities, or within 4 ulp relative (plus 4 subnormal steps). */
static bool close_or_same_special(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabsf(a - b) <= 4 * FLT_EPSILON * fabsf(b) + 4 * 0x1p-149f;
}

/* Random rows of length 1..70, 255, 4099 at three spreads, then rows with the defined specials: a NaN (also at 0),
 * +inf, all -inf (every value NaN), -inf among finite values (0 there), one value far above the rest. */
static void fill_softmax_row(float *x, int n, int round, uint64_t *rng) {
    const float spread = round % 3 == 0 ? 1.0f : round % 3 == 1 ? 8.0f : 40.0f;
    for (int i = 0; i < n; i++) x[i] = test_rand_normal(rng) * spread;
    const int at = (int)(test_rand_u64(rng) % (uint64_t)n), kind = round / 3 % 7;
    if (kind == 1) x[at] = NAN;
    if (kind == 2) x[0] = NAN;
    if (kind == 3) x[at] = INFINITY;
    if (kind == 4)
        for (int i = 0; i < n; i++) x[i] = -INFINITY;
    if (kind == 5) x[at] = -INFINITY;
    if (kind == 6) x[at] = 200.0f;
}

/* The AVX2 softmax and SwiGLU rows against the scalar references (expf), elementwise within 4 ulp, with the same
 * NaNs and infinities; SwiGLU on every split of a row bit for bit the same as the whole row (the fused MoE path
 * runs it in blocks of rows). */
TEST(cpu_softmax_swiglu_avx2_match_reference) {
    if (kiln_cpu_level() < KILN_CPU_AVX2) { test_skip("no AVX2 CPU (or KILN_NO_SIMD=1)"); return; }
    enum { N = 4099 };
    static float a[N], b[N], g[N], u[N], whole[N];
    uint64_t rng = 2024;
    int rows = 0;
    for (int round = 0; round < 3 * 7 * 4; round++)
        for (int len = 1; len <= 73; len++) {
            const int n = len <= 70 ? len : len == 71 ? 255 : N - round % 5;
            fill_softmax_row(a, n, round, &rng);
            memcpy(b, a, sizeof(float) * (size_t)n);
            cpu_softmax_ref(a, n);
            cpu_softmax_avx2(b, n);
            for (int i = 0; i < n; i++)
                CHECKF(close_or_same_special(b[i], a[i]), "softmax n %d round %d i %d: %a vs reference %a", n, round, i, b[i], a[i]);
            for (int i = 0; i < n; i++) {
                g[i] = a[i] = test_rand_normal(&rng) * (round % 2 ? 12.0f : 2.0f);
                u[i] = test_rand_normal(&rng);
            }
            static const float special[] = {NAN, INFINITY, -INFINITY, 100.0f, -100.0f, 0.0f, -0.0f};
            if (round % 4 == 3) g[round % n] = a[round % n] = special[round / 4 % 7];
            cpu_swiglu_ref(a, u, n);
            memcpy(whole, g, sizeof(float) * (size_t)n);
            cpu_swiglu_avx2(whole, u, n);
            for (int i = 0; i < n; i++)
                CHECKF(close_or_same_special(whole[i], a[i]), "swiglu n %d i %d: %a vs reference %a", n, i, whole[i], a[i]);
            for (int i = 0; i < n;) {
                const int piece = 1 + (int)(test_rand_u64(&rng) % 19);
                const int take = piece < n - i ? piece : n - i;
                cpu_swiglu_avx2(g + i, u + i, take);
                i += take;
            }
            CHECKF(!memcmp(g, whole, sizeof(float) * (size_t)n), "swiglu n %d: split rows differ from the whole row", n);
            rows++;
        }
    CHECK_EQ_INT(rows, 84 * 73);
}
#endif

/* cpu_matmul over Q8_0 and Q4_K weights interleaved by 16 (what the CPU backend does at the avx512 level; the
 * scalar kernels elsewhere) gives the type's cpu_dot_*_r16 of every pair bit for bit for 1, 3, 8, 9 and 40
 * activation rows, alone and as one of three weights in cpu_matmul_n (rows 48 + 16 + 32: the pool's chunks fall
 * inside the groups' bounds). */
TEST(cpu_matmul_interleaved_equals_r16_dots) {
    kiln_formats_init();
    enum { N = 768, MAXB = 40, NW = 3 };
    static const int rows[NW] = {48, 16, 32}, batches[] = {1, 3, 8, 9, MAXB};
    static const uint32_t types[] = {KILN_TYPE_Q8_0, KILN_TYPE_Q4_K};
    kiln_pool *pool = NULL;
    REQUIRE_OK(kiln_pool_open(2, &pool));
    uint64_t rng = 0x72313671;
    static float x[MAXB * N], wf[N], got[NW][MAXB * 48], alone[MAXB * 48];
    static uint8_t yq[N / 256 * 292];
    for (int i = 0; i < MAXB * N; i++) x[i] = test_rand_normal(&rng);
    for (int t = 0; t < 2; t++) {
        const uint32_t type = types[t];
        const size_t rb = kiln_row_bytes(type, N);
        float (*dot_r16)(int, const void *, const void *) = type == KILN_TYPE_Q4_K ? cpu_dot_q4_K_r16 : cpu_dot_q8_0_r16;
        void *scratch = malloc(cpu_matmul_scratch_bytes(type, N, MAXB));
        REQUIRE(scratch != NULL);
        kiln_weight w[NW];
        uint8_t *data[NW], *packed[NW];
        for (int i = 0; i < NW; i++) {
            data[i] = malloc(rb * (size_t)rows[i]);
            packed[i] = aligned_alloc(64, rb * (size_t)rows[i]);
            REQUIRE(data[i] && packed[i]);
            for (int r = 0; r < rows[i]; r++) {
                for (int c = 0; c < N; c++) wf[c] = 0.1f * test_rand_normal(&rng);
                kiln_type_get(type)->from_float(wf, data[i] + (size_t)r * rb, N);
            }
            w[i] = (kiln_weight){.data = data[i], .type = type, .ne = {N, (uint64_t)rows[i], 1}, .nbytes = rb * (size_t)rows[i]};
            cpu_repack_r16(&w[i], packed[i], 0, rows[i] / CPU_R16);
            w[i].data = packed[i];
            w[i].interleave = CPU_R16;
        }
        const kiln_weight *wp[NW] = {&w[0], &w[1], &w[2]};
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            const int B = batches[bi];
            float *outs[NW] = {got[0], got[1], got[2]};
            cpu_matmul_n(pool, NW, wp, x, B, outs, scratch);
            for (int i = 0; i < NW; i++) {
                cpu_matmul(pool, &w[i], x, B, alone, scratch);
                CHECKF(!memcmp(alone, got[i], sizeof(float) * (size_t)B * (size_t)rows[i]), "type %u B %d weight %d: cpu_matmul_n differs",
                       type, B, i);
                for (int b = 0; b < B; b++) {
                    kiln_quantize_row_for_dot(type, x + (size_t)b * N, yq, N);
                    for (int r = 0; r < rows[i]; r++) {
                        const float want = dot_r16(N, data[i] + (size_t)r * rb, yq);
                        CHECKF(!memcmp(&want, &alone[(size_t)b * rows[i] + r], sizeof want),
                               "type %u B %d weight %d cell (%d,%d): %.9g vs %.9g", type, B, i, r, b, alone[(size_t)b * rows[i] + r], want);
                    }
                }
            }
        }
        for (int i = 0; i < NW; i++) free(data[i]), free(packed[i]);
        free(scratch);
    }
    kiln_pool_close(pool);
}

/* cpu_matmul_n (q/k/v, gate/up: one conversion and one pool run over the weights' rows end to end) equals
 * cpu_matmul of each weight alone bit for bit: weights of one type whose row counts do not fall on the pool's
 * chunks (40 + 20 + 20 rows), and of mixed types (run one by one), for 1 row (the one-row kernel), 3 (the
 * small-batch kernel), 9 (the tiles) and 20 activation rows. */
TEST(cpu_matmul_n_equals_each_weight_alone) {
    kiln_formats_init();
    enum { N = 512, MAXB = 20, NW = 3 };
    static const int rows[NW] = {40, 20, 20};
    static const uint32_t kinds[2][NW] = {{KILN_TYPE_Q8_0, KILN_TYPE_Q8_0, KILN_TYPE_Q8_0},
                                          {KILN_TYPE_Q8_0, KILN_TYPE_Q4_K, KILN_TYPE_Q8_0}};
    static const int batches[] = {1, 3, 9, MAXB};
    kiln_pool *pool = NULL;
    REQUIRE_OK(kiln_pool_open(2, &pool));
    uint64_t rng = 0x6d61746d;
    static float x[MAXB * N], wf[N], got[NW][MAXB * 40], want[NW][MAXB * 40];
    for (int i = 0; i < MAXB * N; i++) x[i] = test_rand_normal(&rng);
    size_t scratch_bytes = 0;
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < NW; i++) {
            const size_t s = cpu_matmul_scratch_bytes(kinds[t][i], N, MAXB);
            scratch_bytes = s > scratch_bytes ? s : scratch_bytes;
        }
    void *scratch = malloc(scratch_bytes);
    REQUIRE(scratch != NULL);
    for (int t = 0; t < 2; t++) {
        kiln_weight w[NW];
        void *data[NW];
        for (int i = 0; i < NW; i++) {
            const size_t rb = kiln_row_bytes(kinds[t][i], N);
            data[i] = malloc(rb * (size_t)rows[i]);
            REQUIRE(data[i] != NULL);
            for (int r = 0; r < rows[i]; r++) {
                for (int c = 0; c < N; c++) wf[c] = 0.1f * test_rand_normal(&rng);
                kiln_type_get(kinds[t][i])->from_float(wf, (uint8_t *)data[i] + (size_t)r * rb, N);
            }
            w[i] = (kiln_weight){.data = data[i], .type = kinds[t][i], .ne = {N, (uint64_t)rows[i], 1},
                                 .nbytes = rb * (size_t)rows[i]};
        }
        const kiln_weight *wp[NW] = {&w[0], &w[1], &w[2]};
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            const int B = batches[bi];
            float *outs[NW] = {got[0], got[1], got[2]};
            cpu_matmul_n(pool, NW, wp, x, B, outs, scratch);
            for (int i = 0; i < NW; i++) cpu_matmul(pool, &w[i], x, B, want[i], scratch);
            for (int i = 0; i < NW; i++)
                CHECKF(!memcmp(got[i], want[i], sizeof(float) * (size_t)B * (size_t)rows[i]),
                       "types %d weight %d B %d: cpu_matmul_n differs from cpu_matmul", t, i, B);
        }
        for (int i = 0; i < NW; i++) free(data[i]);
    }
    free(scratch);
    kiln_pool_close(pool);
}
