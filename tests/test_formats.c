/*
 * test_formats.c — the block formats against ggml's reference vectors (../shared/quant/quant-vectors.gguf):
 * dequantization bit for bit (T.deq), the reference quantizers byte for byte (T.q, x.<vec_dot type>),
 * scalar dots equal to ggml's generic kernels (T.dot_generic), every fast variant within
 * 4 * FLT_EPSILON * sum|w_i * x_i| of T.dot / T.dot_generic and of the scalar reference on fresh random
 * inputs, plus the half-precision conversions and the table helpers.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/blocks.h"
#include "formats/formats.h"
#include "gguf/gguf.h"
#include "test.h"

#define ROWS 8
#define COLS 1024

static const kiln_type tested_types[] = {
    KILN_TYPE_F32, KILN_TYPE_F16, KILN_TYPE_BF16, KILN_TYPE_Q4_0, KILN_TYPE_Q4_1, KILN_TYPE_Q5_0, KILN_TYPE_Q5_1,
    KILN_TYPE_Q8_0, KILN_TYPE_Q2_K, KILN_TYPE_Q3_K, KILN_TYPE_Q4_K, KILN_TYPE_Q5_K, KILN_TYPE_Q6_K,
};
#define N_TESTED (sizeof tested_types / sizeof tested_types[0])

/* A tensor of the vectors file by name, checked for type and size. */
static const gguf_tensor *vec_tensor(gguf_file *f, const char *name, uint32_t type, uint64_t n_values) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) {
        test_failf(__FILE__, __LINE__, "quant-vectors.gguf: tensor %s missing", name);
        return NULL;
    }
    if (t->type != type || t->nbytes != kiln_row_bytes(type, n_values)) {
        test_failf(__FILE__, __LINE__, "tensor %s: type %u, %llu bytes (expected type %u, %zu bytes)", name, t->type,
                   (unsigned long long)t->nbytes, type, kiln_row_bytes(type, n_values));
        return NULL;
    }
    return t;
}

static gguf_file *open_vectors(void) {
    gguf_file *f = NULL;
    kiln_status st = gguf_open(test_shared("quant/quant-vectors.gguf"), &f);
    if (st != KILN_OK) test_failf(__FILE__, __LINE__, "gguf_open: %s", kiln_last_error());
    return f;
}

static const char *tname(kiln_type t) { return kiln_type_get(t)->name; }

/* ------------------------------------------------------------------------------- dequantization */

TEST(formats_dequantize_equals_reference) {
    gguf_file *f = open_vectors();
    REQUIRE(f);
    float *out = malloc(sizeof(float) * COLS);
    for (size_t k = 0; k < N_TESTED; k++) {
        const kiln_type t = tested_types[k];
        char name[64];
        snprintf(name, sizeof name, "%s.q", tname(t));
        const gguf_tensor *q = vec_tensor(f, name, t, (uint64_t)ROWS * COLS);
        snprintf(name, sizeof name, "%s.deq", tname(t));
        const gguf_tensor *deq = vec_tensor(f, name, KILN_TYPE_F32, (uint64_t)ROWS * COLS);
        if (!q || !deq) continue;
        const size_t rb = kiln_row_bytes(t, COLS);
        for (int r = 0; r < ROWS; r++) {
            kiln_type_get(t)->to_float((const uint8_t *)q->data + r * rb, out, COLS);
            const float *want = (const float *)deq->data + r * COLS;
            int bad = 0, first = -1;
            for (int i = 0; i < COLS; i++)
                if (memcmp(&out[i], &want[i], sizeof(float))) {
                    if (first < 0) first = i;
                    bad++;
                }
            CHECKF(bad == 0, "%s row %d: %d values differ from %s.deq (first at %d: %.9g vs %.9g)", tname(t), r, bad,
                   tname(t), first, first >= 0 ? out[first] : 0.0, first >= 0 ? want[first] : 0.0);
        }
    }
    free(out);
    gguf_close(f);
}

/* --------------------------------------------------------------------------------- quantization */

TEST(formats_quantize_equals_reference) {
    gguf_file *f = open_vectors();
    REQUIRE(f);
    const gguf_tensor *src = vec_tensor(f, "src", KILN_TYPE_F32, (uint64_t)ROWS * COLS);
    REQUIRE(src);
    uint8_t *out = malloc(kiln_row_bytes(KILN_TYPE_F32, COLS));
    for (size_t k = 0; k < N_TESTED; k++) {
        const kiln_type t = tested_types[k];
        const kiln_type_info *ti = kiln_type_get(t);
        char name[64];
        snprintf(name, sizeof name, "%s.q", ti->name);
        const gguf_tensor *q = vec_tensor(f, name, t, (uint64_t)ROWS * COLS);
        if (!q) continue;
        const size_t rb = kiln_row_bytes(t, COLS);
        for (int r = 0; r < ROWS; r++) {
            ti->from_float((const float *)src->data + r * COLS, out, COLS);
            const uint8_t *want = (const uint8_t *)q->data + r * rb;
            int bad_blocks = 0, first = -1;
            for (size_t b = 0; b < rb / ti->type_size; b++)
                if (memcmp(out + b * ti->type_size, want + b * ti->type_size, ti->type_size)) {
                    if (first < 0) first = (int)b;
                    bad_blocks++;
                }
            CHECKF(bad_blocks == 0, "%s row %d: %d of %zu blocks differ from %s.q (first: block %d)", ti->name, r,
                   bad_blocks, rb / ti->type_size, ti->name, first);
        }
    }
    free(out);
    gguf_close(f);
}

/* The activation conversions (the exact bytes ggml's dot kernels consumed). */
TEST(formats_activation_quantize_equals_reference) {
    gguf_file *f = open_vectors();
    REQUIRE(f);
    const gguf_tensor *x = vec_tensor(f, "x", KILN_TYPE_F32, COLS);
    REQUIRE(x);
    static const struct { const char *name; kiln_type type; } acts[] = {
        {"x.f16", KILN_TYPE_F16}, {"x.bf16", KILN_TYPE_BF16}, {"x.q8_0", KILN_TYPE_Q8_0},
        {"x.q8_1", KILN_TYPE_Q8_1}, {"x.q8_K", KILN_TYPE_Q8_K},
    };
    uint8_t *out = malloc(kiln_row_bytes(KILN_TYPE_F32, COLS));
    for (size_t k = 0; k < sizeof acts / sizeof acts[0]; k++) {
        const gguf_tensor *want = vec_tensor(f, acts[k].name, acts[k].type, COLS);
        if (!want) continue;
        memset(out, 0xAB, want->nbytes);
        kiln_type_get(acts[k].type)->from_float(x->data, out, COLS);
        CHECKF(!memcmp(out, want->data, want->nbytes), "from_float(x) != %s", acts[k].name);
    }
    /* the helper the CPU backend calls, for every weight type: the bytes of its vec_dot_type */
    for (size_t k = 0; k < N_TESTED; k++) {
        const kiln_type t = tested_types[k];
        const kiln_type vdt = kiln_type_get(t)->vec_dot_type;
        char name[64];
        snprintf(name, sizeof name, "x.%s", tname(vdt));
        const gguf_tensor *want = vdt == KILN_TYPE_F32 ? x : vec_tensor(f, name, vdt, COLS);
        if (!want) continue;
        memset(out, 0xAB, want->nbytes);
        kiln_quantize_row_for_dot(t, x->data, out, COLS);
        CHECKF(!memcmp(out, want->data, want->nbytes), "kiln_quantize_row_for_dot(%s) != %s", tname(t), name);
    }
    /* the AVX2 activation quantizers directly (whatever KILN_NO_SIMD says) */
#if KILN_X86
    if (kiln_cpu_has_avx2()) {
        const gguf_tensor *w0 = vec_tensor(f, "x.q8_0", KILN_TYPE_Q8_0, COLS);
        const gguf_tensor *wk = vec_tensor(f, "x.q8_K", KILN_TYPE_Q8_K, COLS);
        if (w0) {
            kiln_q8_0_from_float_avx2(x->data, out, COLS);
            CHECKF(!memcmp(out, w0->data, w0->nbytes), "AVX2 Q8_0 from_float(x) != x.q8_0");
        }
        if (wk) {
            kiln_q8_K_from_float_avx2(x->data, out, COLS);
            CHECKF(!memcmp(out, wk->data, wk->nbytes), "AVX2 Q8_K from_float(x) != x.q8_K");
        }
    }
#endif
    free(out);
    gguf_close(f);
}

/* ----------------------------------------------------------------------------------------- dots */

/* sum |w_i * x_i| over the dequantized row and activation, the scale of the dot tolerance. */
static double abs_product_sum(const float *w, const float *a, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += fabs((double)w[i] * (double)a[i]);
    return s;
}

static void dequantize_activation(kiln_type vdt, const void *q, float *out, int n) {
    kiln_type_get(vdt)->to_float(q, out, n);
}

/* The SIMD variant of each type in this build, called directly (whatever KILN_NO_SIMD says): AVX2 on x86 (only
 * when the CPU has it), NEON on aarch64, none elsewhere. */
typedef struct { kiln_type type; kiln_vec_dot_fn fn; } simd_variant;
#if KILN_X86
#define SIMD_ISA "avx2"
static const simd_variant simd_variants[] = {
    {KILN_TYPE_F32, kiln_dot_f32_avx2},   {KILN_TYPE_F16, kiln_dot_f16_avx2},   {KILN_TYPE_BF16, kiln_dot_bf16_avx2},
    {KILN_TYPE_Q4_0, kiln_dot_q4_0_avx2}, {KILN_TYPE_Q4_1, kiln_dot_q4_1_avx2}, {KILN_TYPE_Q5_0, kiln_dot_q5_0_avx2},
    {KILN_TYPE_Q5_1, kiln_dot_q5_1_avx2}, {KILN_TYPE_Q8_0, kiln_dot_q8_0_avx2}, {KILN_TYPE_Q2_K, kiln_dot_q2_K_avx2},
    {KILN_TYPE_Q3_K, kiln_dot_q3_K_avx2}, {KILN_TYPE_Q4_K, kiln_dot_q4_K_avx2}, {KILN_TYPE_Q5_K, kiln_dot_q5_K_avx2},
    {KILN_TYPE_Q6_K, kiln_dot_q6_K_avx2},
};
static bool have_simd(void) { return kiln_cpu_has_avx2(); }
#elif KILN_NEON
#define SIMD_ISA "neon"
static const simd_variant simd_variants[] = {
    {KILN_TYPE_F32, kiln_dot_f32_neon},   {KILN_TYPE_F16, kiln_dot_f16_neon},   {KILN_TYPE_Q4_0, kiln_dot_q4_0_neon},
    {KILN_TYPE_Q8_0, kiln_dot_q8_0_neon}, {KILN_TYPE_Q4_K, kiln_dot_q4_K_neon}, {KILN_TYPE_Q6_K, kiln_dot_q6_K_neon},
};
static bool have_simd(void) { return true; }
#else
#define SIMD_ISA "none"
static const simd_variant simd_variants[] = {{KILN_TYPE_F32, kiln_dot_f32}};
static bool have_simd(void) { return false; }
#endif
#define N_SIMD (sizeof simd_variants / sizeof simd_variants[0])

TEST(formats_dots_match_reference) {
    gguf_file *f = open_vectors();
    REQUIRE(f);
    float *w = malloc(sizeof(float) * COLS), *a = malloc(sizeof(float) * COLS);
    const bool simd_ok = have_simd();
    if (!simd_ok) printf("note: no SIMD variant in this build or CPU, only vec_dot_fast checked\n");
    for (size_t k = 0; k < N_TESTED; k++) {
        const kiln_type t = tested_types[k];
        const kiln_type_info *ti = kiln_type_get(t);
        const kiln_type vdt = ti->vec_dot_type;
        char name[64];
        snprintf(name, sizeof name, "%s.q", ti->name);
        const gguf_tensor *q = vec_tensor(f, name, t, (uint64_t)ROWS * COLS);
        snprintf(name, sizeof name, "%s.dot", ti->name);
        const gguf_tensor *dot = vec_tensor(f, name, KILN_TYPE_F32, ROWS);
        snprintf(name, sizeof name, "x.%s", tname(vdt));
        const gguf_tensor *x = vec_tensor(f, vdt == KILN_TYPE_F32 ? "x" : name, vdt, COLS);
        const gguf_tensor *generic = NULL;
        if (ti->is_quantized) {
            snprintf(name, sizeof name, "%s.dot_generic", ti->name);
            generic = vec_tensor(f, name, KILN_TYPE_F32, ROWS);
            if (!generic) continue;
        }
        if (!q || !dot || !x) continue;
        REQUIRE(ti->vec_dot && ti->vec_dot_fast);
        dequantize_activation(vdt, x->data, a, COLS);
        kiln_vec_dot_fn simd = NULL;
        for (size_t v = 0; v < N_SIMD; v++)
            if (simd_variants[v].type == t) simd = simd_variants[v].fn;
        const size_t rb = kiln_row_bytes(t, COLS);
        for (int r = 0; r < ROWS; r++) {
            const void *row = (const uint8_t *)q->data + r * rb;
            ti->to_float(row, w, COLS);
            const double tol = 4.0 * FLT_EPSILON * abs_product_sum(w, a, COLS);
            const float want = ((const float *)dot->data)[r];
            float s = NAN;
            ti->vec_dot(COLS, &s, row, x->data);
            if (generic) {
                const float wg = ((const float *)generic->data)[r];
                CHECKF(memcmp(&s, &wg, sizeof s) == 0, "%s row %d: scalar dot %.9g != dot_generic %.9g", ti->name, r, s, wg);
            } else {
                CHECKF(fabs((double)s - want) <= tol, "%s row %d: scalar dot %.9g vs dot %.9g (tol %.3g)", ti->name, r, s,
                       want, tol);
            }
            kiln_vec_dot_fn fasts[2] = {ti->vec_dot_fast, simd_ok ? simd : NULL};
            for (int v = 0; v < 2; v++) {
                if (!fasts[v]) continue;
                float fs = NAN;
                fasts[v](COLS, &fs, row, x->data);
                const double ref2 = generic ? ((const float *)generic->data)[r] : want;
                const double err = fmin(fabs((double)fs - want), fabs((double)fs - ref2));
                CHECKF(err <= tol, "%s row %d: %s dot %.9g vs dot %.9g / generic %.9g (tol %.3g)", ti->name, r,
                       v ? SIMD_ISA : "fast", fs, want, ref2, tol);
            }
        }
    }
    free(w);
    free(a);
    gguf_close(f);
}

/* Fast variants against the scalar reference on fresh random inputs of several lengths. */
TEST(formats_fast_dots_match_scalar_on_random_rows) {
    if (!have_simd()) {
        test_skip("no SIMD variant in this build or CPU");
        return;
    }
    uint64_t rng = 0x6b696c6e2d666d74ull;
    static const int lengths_small[] = {32, 64, 96, 256, 1056, 4096};
    static const int lengths_k[] = {256, 512, 768, 2048, 5120};
    static const int lengths_float[] = {1, 7, 8, 33, 100, 1000, 4099};
    const int max_n = 5120;
    float *wf = malloc(sizeof(float) * max_n), *xf = malloc(sizeof(float) * max_n);
    float *wd = malloc(sizeof(float) * max_n), *xd = malloc(sizeof(float) * max_n);
    uint8_t *wq = malloc(sizeof(float) * max_n), *xq = malloc(sizeof(float) * max_n);
    int checked = 0;
    for (size_t v = 0; v < N_SIMD; v++) {
        const kiln_type t = simd_variants[v].type;
        const kiln_type_info *ti = kiln_type_get(t);
        const int *lengths = ti->block_size == 256 ? lengths_k : ti->block_size == 32 ? lengths_small : lengths_float;
        const int n_len = ti->block_size == 256 ? 5 : ti->block_size == 32 ? 6 : 7;
        for (int li = 0; li < n_len; li++) {
            const int n = lengths[li];
            for (int trial = 0; trial < 4; trial++) {
                /* never zeros: normals, some rows with a scaled range and an outlier */
                const float scale = trial == 3 ? 1e-3f : 1.0f;
                for (int i = 0; i < n; i++) {
                    wf[i] = scale * test_rand_normal(&rng);
                    xf[i] = test_rand_normal(&rng);
                    if (wf[i] == 0) wf[i] = 0.5f;
                }
                if (trial == 2) wf[n / 2] = 40.0f;
                ti->from_float(wf, wq, n);
                kiln_quantize_row_for_dot(t, xf, xq, n);
                ti->to_float(wq, wd, n);
                kiln_type_get(ti->vec_dot_type)->to_float(xq, xd, n);
                const double tol = 4.0 * FLT_EPSILON * abs_product_sum(wd, xd, n);
                float ref = NAN, fast = NAN;
                ti->vec_dot(n, &ref, wq, xq);
                simd_variants[v].fn(n, &fast, wq, xq);
                CHECKF(fabs((double)fast - ref) <= tol && tol > 0, "%s n=%d trial %d: %s %.9g vs scalar %.9g (tol %.3g)",
                       ti->name, n, trial, SIMD_ISA, fast, ref, tol);
                checked++;
            }
        }
    }
    printf("checked %d random rows\n", checked);
    free(wf); free(xf); free(wd); free(xd); free(wq); free(xq);
}

#if KILN_NEON
/* The element (0..15 of a 16-byte half) to int32 lane map of the reference engine's NEON dot: the dot-product
 * instruction where the target has it, else its widening fallback (pairs 2l, 2l+1 of each 8-byte half). */
static int neon_lane(int e) {
#if defined(__ARM_FEATURE_DOTPROD)
    return e / 4;
#else
    return (e % 8) / 2;
#endif
}

/* A scalar model of ggml's NEON Q8_0 / Q4_0 order (ggml-cpu arch/arm quants.c): blocks in pairs into two 4-lane
 * accumulators (lane = exact integer sum, times the block scale dx * dy, fused), each reduced pairwise, the two
 * added, an odd last block in scalar (Q8_0: sumi * (dx * dy); Q4_0: sumi * dx * dy, fused into the sum). w and y:
 * the nb * 32 integer values in activation order. */
static float neon_order_model(int nb, const int *w, const int8_t *y, const float *dx, const float *dy, bool q4) {
    float acc[2][4] = {{0}};
    int ib = 0;
    for (; ib + 1 < nb; ib += 2)
        for (int k = 0; k < 2; k++) {
            int lanes[4] = {0};
            for (int e = 0; e < 32; e++) lanes[neon_lane(e % 16)] += w[(ib + k) * 32 + e] * y[(ib + k) * 32 + e];
            for (int l = 0; l < 4; l++) acc[k][l] = fmaf((float)lanes[l], dx[ib + k] * dy[ib + k], acc[k][l]);
        }
    float sum = ((acc[0][0] + acc[0][1]) + (acc[0][2] + acc[0][3])) + ((acc[1][0] + acc[1][1]) + (acc[1][2] + acc[1][3]));
    for (; ib < nb; ib++) {
        int sumi = 0;
        for (int e = 0; e < 32; e++) sumi += w[ib * 32 + e] * y[ib * 32 + e];
        sum = q4 ? fmaf((float)sumi * dx[ib], dy[ib], sum) : fmaf((float)sumi, dx[ib] * dy[ib], sum);
    }
    return sum;
}

/* The NEON Q8_0 and Q4_0 dots equal the model of the reference engine's NEON order bit for bit (odd and even
 * block counts), so a greedy run on Arm follows the reference's near-ties as the AVX2 kernels do on x86. */
TEST(formats_neon_q8_0_q4_0_follow_the_reference_order) {
    enum { MAXB = 33 };
    static const int blocks[] = {1, 2, 3, 7, 32, 33};
    uint64_t rng = 0x6e656f6e;
    float xf[MAXB * 32], dx8[MAXB], dx4[MAXB], dy[MAXB];
    int w8v[MAXB * 32], w4v[MAXB * 32];
    int8_t yv[MAXB * 32];
    block_q8_0 w8[MAXB], act[MAXB];
    block_q4_0 w4[MAXB];
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
        const int nb = blocks[bi], n = nb * 32;
        for (int trial = 0; trial < 8; trial++) {
            for (int i = 0; i < n; i++) xf[i] = test_rand_normal(&rng) * (float)(1 + i % 5);
            kiln_quantize_row_for_dot(KILN_TYPE_Q8_0, xf, act, n);
            for (int i = 0; i < n; i++) xf[i] = test_rand_normal(&rng);
            kiln_q8_0_from_float(xf, w8, n);
            kiln_q4_0_from_float(xf, w4, n);
            for (int b = 0; b < nb; b++) {
                dy[b] = kiln_f16_to_f32(act[b].d), dx8[b] = kiln_f16_to_f32(w8[b].d), dx4[b] = kiln_f16_to_f32(w4[b].d);
                memcpy(yv + b * 32, act[b].qs, 32);
                for (int e = 0; e < 32; e++) w8v[b * 32 + e] = w8[b].qs[e];
                for (int e = 0; e < 16; e++) {
                    w4v[b * 32 + e] = (w4[b].qs[e] & 0x0F) - 8;
                    w4v[b * 32 + 16 + e] = (w4[b].qs[e] >> 4) - 8;
                }
            }
            float got, want = neon_order_model(nb, w8v, yv, dx8, dy, false);
            kiln_dot_q8_0_neon(n, &got, w8, act);
            CHECKF(!memcmp(&got, &want, sizeof got), "q8_0 %d blocks trial %d: neon %.9g, model %.9g", nb, trial, got, want);
            want = neon_order_model(nb, w4v, yv, dx4, dy, true);
            kiln_dot_q4_0_neon(n, &got, w4, act);
            CHECKF(!memcmp(&got, &want, sizeof got), "q4_0 %d blocks trial %d: neon %.9g, model %.9g", nb, trial, got, want);
        }
    }
}

/* ggml's NEON Q4_K / Q6_K order: per super-block the exact integer sums, then (Q4_K) sum -= dmin * mins and
 * sum += d * sumi, (Q6_K) sum += (d * y.d) * (isum - 32 * mins), each fused. Computed here from the dequantized
 * integers of the scalar path. */
static float neon_k_model(kiln_type t, int n, const void *w, const block_q8_K *y) {
    float sum = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int sumi = 0, mins = 0;
        if (t == KILN_TYPE_Q4_K) {
            const block_q4_K *x = (const block_q4_K *)w + i;
            uint8_t sc[8], mn[8];
            kiln_k4_scales_mins(x->scales, sc, mn);
            for (int j = 0; j < 8; j++) {
                int s32 = 0;
                for (int l = 0; l < 32; l++) s32 += ((x->qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF) * y[i].qs[32 * j + l];
                sumi += sc[j] * s32;
                mins += mn[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
            }
            sum = fmaf(-(y[i].d * kiln_f16_to_f32(x->dmin)), (float)mins, sum);
            sum = fmaf(y[i].d * kiln_f16_to_f32(x->d), (float)sumi, sum);
        } else {
            const block_q6_K *x = (const block_q6_K *)w + i;
            for (int v = 0; v < QK_K; v++) { /* value v: half v / 128, quarter (v % 128) / 32, lane l */
                const int h = v / 128, qr = (v % 128) / 32, l = v % 32;
                const int lo = (x->ql[64 * h + l + 32 * (qr % 2)] >> (4 * (qr / 2))) & 0xF;
                const int hi = (x->qh[32 * h + l] >> (2 * qr)) & 3;
                sumi += x->scales[v / 16] * ((lo | hi << 4) - 32) * y[i].qs[v];
            }
            sum = fmaf(kiln_f16_to_f32(x->d) * y[i].d, (float)sumi, sum);
        }
    }
    return sum;
}

TEST(formats_neon_k_dots_follow_the_reference_order) {
    uint64_t rng = 0x6b6b6b;
    const int n = 1024;
    float xf[1024];
    uint8_t w[1024 * 2];
    block_q8_K act[4];
    const kiln_type types[] = {KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    for (int k = 0; k < 2; k++)
        for (int trial = 0; trial < 16; trial++) {
            for (int i = 0; i < n; i++) xf[i] = test_rand_normal(&rng) * (trial % 4 ? 1.0f : 0.01f);
            kiln_type_get(types[k])->from_float(xf, w, n);
            for (int i = 0; i < n; i++) xf[i] = test_rand_normal(&rng);
            kiln_quantize_row_for_dot(types[k], xf, act, n);
            float got, want = neon_k_model(types[k], n, w, act);
            (k ? kiln_dot_q6_K_neon : kiln_dot_q4_K_neon)(n, &got, w, act);
            CHECKF(!memcmp(&got, &want, sizeof got), "%s trial %d: neon %.9g, model %.9g", tname(types[k]), trial, got, want);
        }
}
#endif

/* Arbitrary block bytes (as a corrupt or hostile file could hold): dequantization and every dot run without
 * undefined behaviour (UBSan), and where everything is finite the AVX2 dot agrees with the scalar one. */
TEST(formats_arbitrary_block_bytes) {
    uint64_t rng = 0xb10cb10cull;
    const int n = 1024;
    uint8_t *w = malloc(sizeof(float) * n), *act = malloc(sizeof(float) * n);
    float *wd = malloc(sizeof(float) * n), *xd = malloc(sizeof(float) * n), *xf = malloc(sizeof(float) * n);
    int compared = 0;
    for (size_t v = 0; v < N_SIMD; v++) {
        const kiln_type t = simd_variants[v].type;
        const kiln_type_info *ti = kiln_type_get(t);
        for (int trial = 0; trial < 32; trial++) {
            for (size_t i = 0; i < kiln_row_bytes(t, n); i++) w[i] = (uint8_t)test_rand_u64(&rng);
            /* half the trials keep the F16 / F32 scales and values tame so that the results can be compared */
            if (trial % 2 && ti->is_quantized) {
                const size_t bs = ti->type_size;
                for (size_t b = 0; b < kiln_row_bytes(t, n) / bs; b++) {
                    uint8_t *blk = w + b * bs;
                    const size_t d_off = t == KILN_TYPE_Q2_K ? 80 : t == KILN_TYPE_Q3_K ? 108 : t == KILN_TYPE_Q6_K ? 208 : 0;
                    const uint16_t h = kiln_f32_to_f16(0.01f * (float)(test_rand_u64(&rng) % 100));
                    memcpy(blk + d_off, &h, 2);
                    if (t == KILN_TYPE_Q4_1 || t == KILN_TYPE_Q5_1 || t == KILN_TYPE_Q2_K || t == KILN_TYPE_Q4_K ||
                        t == KILN_TYPE_Q5_K)
                        memcpy(blk + d_off + 2, &h, 2);
                }
            } else if (trial % 2) {
                for (int i = 0; i < n; i++) xf[i] = test_rand_normal(&rng);
                ti->from_float(xf, w, n);
            }
            for (int i = 0; i < n; i++) xf[i] = test_rand_normal(&rng);
            kiln_quantize_row_for_dot(t, xf, act, n);
            ti->to_float(w, wd, n);
            kiln_type_get(ti->vec_dot_type)->to_float(act, xd, n);
            float ref = 0, fast = 0;
            ti->vec_dot(n, &ref, w, act);
            if (have_simd()) simd_variants[v].fn(n, &fast, w, act);
            else fast = ref;
            const double mag = abs_product_sum(wd, xd, n);
            if (isfinite(mag) && isfinite(ref) && mag < 1e30) {
                CHECKF(fabs((double)fast - ref) <= 4.0 * FLT_EPSILON * mag + 1e-30, "%s trial %d: %.9g vs %.9g",
                       ti->name, trial, fast, ref);
                compared++;
            }
        }
    }
    CHECK(compared >= (int)N_SIMD * 16);
    printf("compared %d rows of arbitrary bytes\n", compared);
    free(w); free(act); free(wd); free(xd); free(xf);
}

/* The AVX2 activation quantizers give the reference bytes on random rows too (ties included). */
TEST(formats_fast_activation_quantizers_match_scalar) {
#if !KILN_X86
    test_skip("the fast quantizers are AVX2 (x86) only; other builds use the reference ones");
#else
    if (!kiln_cpu_has_avx2()) {
        test_skip("no AVX2 on this CPU");
        return;
    }
    uint64_t rng = 42;
    const int n = 4096;
    float *x = malloc(sizeof(float) * n);
    uint8_t *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < n; i++) x[i] = test_rand_normal(&rng) * (trial + 1);
        if (trial % 2) /* exact halves after scaling: x = (k + 0.5) * d with amax = 127 d */
            for (int i = 0; i < n; i++) x[i] = (i % 32 == 0) ? 127.0f : (float)((int)(x[i] * 10) % 120) + 0.5f;
        if (trial == 4) for (int i = 0; i < 256; i++) x[i] = 0; /* a zero super-block */
        kiln_q8_0_from_float(x, a, n);
        kiln_q8_0_from_float_avx2(x, b, n);
        CHECKF(!memcmp(a, b, kiln_row_bytes(KILN_TYPE_Q8_0, n)), "q8_0 trial %d differs", trial);
        kiln_q8_K_from_float(x, a, n);
        kiln_q8_K_from_float_avx2(x, b, n);
        CHECKF(!memcmp(a, b, kiln_row_bytes(KILN_TYPE_Q8_K, n)), "q8_K trial %d differs", trial);
    }
    free(x); free(a); free(b);
#endif
}

/* The fast exact quantizers (kiln_from_float_fast) give the reference bytes: on the vectors' source
 * (edge rows included) and on random rows with constant, zero, tiny and outlier sub-blocks. */
TEST(formats_fast_quantizers_equal_reference) {
#if !KILN_X86
    test_skip("the fast quantizers are AVX2 (x86) only; other builds use the reference ones");
#else
    if (!kiln_cpu_has_avx2()) {
        test_skip("no AVX2 on this CPU");
        return;
    }
    static const struct { kiln_type type; kiln_from_float_fn fast; } fq[] = {
        {KILN_TYPE_Q2_K, kiln_q2_K_from_float_avx2}, {KILN_TYPE_Q4_K, kiln_q4_K_from_float_avx2},
        {KILN_TYPE_Q5_K, kiln_q5_K_from_float_avx2}, {KILN_TYPE_Q6_K, kiln_q6_K_from_float_avx2},
        {KILN_TYPE_Q8_0, kiln_q8_0_from_float_avx2}, {KILN_TYPE_Q8_K, kiln_q8_K_from_float_avx2},
        {KILN_TYPE_Q8_1, kiln_q8_1_from_float_avx2}, {KILN_TYPE_F16, kiln_f16_from_float_avx2},
    };
    gguf_file *f = open_vectors();
    REQUIRE(f);
    const gguf_tensor *src = vec_tensor(f, "src", KILN_TYPE_F32, (uint64_t)ROWS * COLS);
    REQUIRE(src);
    const int n = 4096;
    float *x = malloc(sizeof(float) * n);
    uint8_t *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    uint64_t rng = 0x5eed;
    int checked = 0;
    for (size_t k = 0; k < sizeof fq / sizeof fq[0]; k++) {
        const kiln_type_info *ti = kiln_type_get(fq[k].type);
        const size_t rb = kiln_row_bytes(fq[k].type, COLS);
        for (int r = 0; r < ROWS; r++) {
            const float *row = (const float *)src->data + r * COLS;
            ti->from_float(row, a, COLS);
            fq[k].fast(row, b, COLS);
            CHECKF(!memcmp(a, b, rb), "%s: fast quantizer differs on src row %d", ti->name, r);
        }
        for (int trial = 0; trial < 12; trial++) {
            const float scale = trial % 4 == 0 ? 1.0f : trial % 4 == 1 ? 0.02f : trial % 4 == 2 ? 1e-6f : 30.0f;
            for (int i = 0; i < n; i++) x[i] = scale * test_rand_normal(&rng) + (trial % 3 == 1 ? 0.3f * scale : 0.0f);
            if (trial >= 4) {
                for (int i = 0; i < 32; i++) x[64 + i] = 0.0f;           /* a zero sub-block */
                for (int i = 0; i < 32; i++) x[512 + i] = 0.25f;         /* a constant positive one */
                for (int i = 0; i < 16; i++) x[1024 + i] = -1.5f;        /* a constant negative one */
                for (int i = 0; i < 256; i++) x[2048 + i] = 0.0f;        /* a zero super-block */
                x[3000] = 60.0f * scale;                                 /* an outlier */
            }
            ti->from_float(x, a, n);
            fq[k].fast(x, b, n);
            CHECKF(!memcmp(a, b, kiln_row_bytes(fq[k].type, n)), "%s: fast quantizer differs, trial %d", ti->name, trial);
            checked++;
        }
        CHECK(kiln_from_float_fast(fq[k].type) != NULL);
    }
    printf("checked %d random rows\n", checked);
    /* F16 corner values: ties, subnormals, overflow, infinities and NaNs (the NaN groups go scalar) */
    static const float corners[] = {1.0f + 0x1p-11f, 1.0f + 0x1.8p-10f, 0x1p-25f, 0x1.8p-24f, 0x1p-14f, 65504.0f,
                                    65520.0f, 1e9f, -1e9f, INFINITY, -INFINITY, NAN, -0.0f, 0.0f, 3e-8f, -6e-5f};
    const int nc = (int)(sizeof corners / sizeof corners[0]);
    kiln_f16_from_float(corners, a, nc);
    kiln_f16_from_float_avx2(corners, b, nc);
    CHECK(!memcmp(a, b, sizeof(uint16_t) * (size_t)nc));
    free(x); free(a); free(b);
    gguf_close(f);
#endif
}

/* ------------------------------------------------------------------------------ round trips */

/* quantize -> dequantize error on the reference source, compared with ggml's own (T.deq). */
TEST(formats_roundtrip_error_no_worse_than_reference) {
    gguf_file *f = open_vectors();
    REQUIRE(f);
    const gguf_tensor *src = vec_tensor(f, "src", KILN_TYPE_F32, (uint64_t)ROWS * COLS);
    REQUIRE(src);
    uint8_t *q = malloc(sizeof(float) * COLS);
    float *d = malloc(sizeof(float) * COLS);
    for (size_t k = 3; k < N_TESTED; k++) {
        const kiln_type t = tested_types[k];
        const kiln_type_info *ti = kiln_type_get(t);
        char name[64];
        snprintf(name, sizeof name, "%s.deq", ti->name);
        const gguf_tensor *deq = vec_tensor(f, name, KILN_TYPE_F32, (uint64_t)ROWS * COLS);
        if (!deq) continue;
        for (int r = 0; r < ROWS; r++) {
            const float *x = (const float *)src->data + r * COLS, *ref = (const float *)deq->data + r * COLS;
            ti->from_float(x, q, COLS);
            ti->to_float(q, d, COLS);
            double mine = 0, theirs = 0, energy = 0;
            for (int i = 0; i < COLS; i++) {
                mine += ((double)d[i] - x[i]) * ((double)d[i] - x[i]);
                theirs += ((double)ref[i] - x[i]) * ((double)ref[i] - x[i]);
                energy += (double)x[i] * x[i];
            }
            CHECKF(mine <= theirs, "%s row %d: squared error %.6g > reference %.6g", ti->name, r, mine, theirs);
            /* a sanity bound: relative error of the lowest-precision type (Q2_K) stays below 40%; not for
             * row 4 (values near 1e-6), where the scales of several types underflow in ggml too */
            if (r != 4) CHECKF(mine <= 0.16 * energy, "%s row %d: relative squared error %.3g", ti->name, r, mine / energy);
        }
    }
    free(q);
    free(d);
    gguf_close(f);
}

/* ---------------------------------------------------------------------------- half precision */

TEST(formats_half_conversions) {
    /* every finite half survives half -> float -> half; NaNs stay NaN */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = kiln_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            if (!isnan(kiln_f16_to_f32(kiln_f32_to_f16(f)))) bad++;
            continue;
        }
        if (kiln_f32_to_f16(f) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* known values: ties to even, overflow, subnormals */
    CHECK_EQ_INT(kiln_f32_to_f16(1.0f), 0x3c00);
    CHECK_EQ_INT(kiln_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(kiln_f32_to_f16(65520.0f), 0x7c00);
    CHECK_EQ_INT(kiln_f32_to_f16(-1e9f), 0xfc00);
    CHECK_EQ_INT(kiln_f32_to_f16(0x1p-24f), 0x0001);
    CHECK_EQ_INT(kiln_f32_to_f16(0x1p-25f), 0x0000);             /* tie -> even (0) */
    CHECK_EQ_INT(kiln_f32_to_f16(0x1.8p-24f), 0x0002);           /* tie -> even (2) */
    CHECK_EQ_INT(kiln_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      /* tie -> even */
    CHECK_EQ_INT(kiln_f32_to_f16(1.0f + 0x1.8p-10f), 0x3c02);    /* tie -> even (up) */
    CHECK_EQ_INT(kiln_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);      /* tie -> even */
    CHECK_EQ_INT(kiln_f32_to_bf16(1.0f + 0x1.8p-7f), 0x3f82);
    CHECK(isnan(kiln_bf16_to_f32(kiln_f32_to_bf16(NAN))));
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = kiln_bf16_to_f32((uint16_t)h);
        if (!isnan(f) && kiln_f32_to_bf16(f) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

TEST(formats_table_helpers) {
    CHECK_EQ_INT(kiln_row_bytes(KILN_TYPE_Q4_K, 4096), 16 * 144);
    CHECK_EQ_INT(kiln_row_bytes(KILN_TYPE_Q4_0, 33), 0);
    CHECK_EQ_INT(kiln_row_bytes(999, 32), 0);
    CHECK_EQ_INT(kiln_type_from_name("Q5_K"), KILN_TYPE_Q5_K);
    CHECK_EQ_INT(kiln_type_from_name("bf16"), KILN_TYPE_BF16);
    CHECK_EQ_INT(kiln_type_from_name("q9_9"), -1);
    for (size_t k = 0; k < N_TESTED; k++) {
        const kiln_type_info *ti = kiln_type_get(tested_types[k]);
        CHECKF(ti->to_float && ti->from_float && ti->vec_dot && ti->vec_dot_fast, "%s lacks an operation", ti->name);
        const kiln_type_info *a = kiln_type_get(ti->vec_dot_type);
        CHECKF(a && a->from_float, "%s: vec_dot_type %s cannot be produced", ti->name, a ? a->name : "?");
    }
    CHECK(kiln_type_get(KILN_TYPE_IQ2_XXS)->vec_dot == NULL);
}
