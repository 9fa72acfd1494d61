/*
 * test_moe.c — the CPU mixture-of-experts block (backend/cpu/cpu_moe.c) against a straightforward
 * double-precision reference written here (softmax over the router logits, top-k, renormalized weights,
 * each chosen expert's SwiGLU mixed by its weight), on random inputs with experts stored in several
 * quantization types (the reference uses the dequantized weights); a row's output in a batch equals its
 * output alone, bit for bit; experts no row chose are never read (poisoned with NaN they change nothing);
 * the fused path equals its per-expert reference (cpu_moe_ffn_ref) bit for bit on 1 and 3 threads.
 * The CUDA MoE kernels (backend/cuda/cuda_moe.cu: RMSNorm, router, softmax / top-k / renormalization on the
 * device, the chosen experts' SwiGLU) against the same reference, with ties and without renormalization, on
 * both device paths: per row, and grouped by expert (the group kernel against a stable counting sort written
 * here; the tensor-core GEMMs on a batch of NG rows where one expert is chosen by every row, one by none).
 */
#include "test.h"
#include "q8_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_moe.h"
#include "base/pool.h"
#include "formats/formats.h"
#include "test_gpu.h"

enum { E = 256, F = 256, NX = 8, K = 3, NB = 13 };
/* the skewed batch: NG rows (more than one 64-row GEMM tile), expert EX_ALL chosen by every row, EX_NONE by none */
enum { NG = 72, EX_ALL = 5, EX_NONE = 2 };

/* One random MoE block whose experts are stored as `type`, with the dequantized weights beside it. */
typedef struct moe_case {
    uint32_t type;
    float router[NX * E];
    uint8_t *gate, *up, *down;      /* NX matrices each, in `type` */
    float *gate_f, *up_f, *down_f;  /* the same, dequantized */
    kiln_weight w_router, w_gate, w_up, w_down;
    kiln_block blk;
    kiln_blocks d;
} moe_case;

static void random_matrices(uint64_t *rng, uint32_t type, int rows, int cols, float std, uint8_t **q, float **deq) {
    const kiln_type_info *ti = kiln_type_get(type);
    const size_t rb = kiln_row_bytes(type, (uint64_t)cols), n = (size_t)NX * rows;
    *q = malloc(rb * n);
    *deq = malloc(sizeof(float) * n * cols);
    float *row = malloc(sizeof(float) * cols);
    for (size_t r = 0; r < n; r++) {
        for (int c = 0; c < cols; c++) row[c] = std * test_rand_normal(rng);
        if (type == KILN_TYPE_F32) memcpy(*q + r * rb, row, rb);
        else ti->from_float(row, *q + r * rb, cols);
        ti->to_float(*q + r * rb, *deq + r * cols, cols);
    }
    free(row);
}

static kiln_weight weight3(const void *data, uint32_t type, uint64_t ne0, uint64_t ne1, uint64_t ne2) {
    kiln_weight w = {.data = data, .type = type, .ne = {ne0, ne1, ne2}};
    w.nbytes = kiln_row_bytes(type, ne0) * ne1 * ne2;
    return w;
}

static void make_case(moe_case *c, uint32_t type, uint64_t seed) {
    memset(c, 0, sizeof *c);
    uint64_t rng = seed;
    c->type = type;
    for (int i = 0; i < NX * E; i++) c->router[i] = 0.2f * test_rand_normal(&rng);
    random_matrices(&rng, type, F, E, 0.1f, &c->gate, &c->gate_f);
    random_matrices(&rng, type, F, E, 0.1f, &c->up, &c->up_f);
    random_matrices(&rng, type, E, F, 0.1f, &c->down, &c->down_f);
    c->w_router = weight3(c->router, KILN_TYPE_F32, E, NX, 1);
    c->w_gate = weight3(c->gate, type, E, F, NX);
    c->w_up = weight3(c->up, type, E, F, NX);
    c->w_down = weight3(c->down, type, F, E, NX);
    c->blk.ffn = (kiln_block_ffn){.kind = KILN_FFN_MOE, .gate = &c->w_gate, .up = &c->w_up, .down = &c->w_down,
                                  .router = &c->w_router, .n_ff = F, .n_expert = NX, .n_expert_used = K,
                                  .norm_topk = true};
    c->d = (kiln_blocks){.n_block = 1, .n_embd = E, .blocks = &c->blk};
}

static void free_case(moe_case *c) {
    free(c->gate), free(c->up), free(c->down), free(c->gate_f), free(c->up_f), free(c->down_f);
}

/* h quantized as the CUDA down kernel takes it (block-quantized down types): 8-bit levels in blocks of 8 values
 * (n of them, a multiple of 8), level = rint(v * 127 / amax) in floats, d = amax / 127; out = d * level. */
static void q8_hidden_ref(const float *v, int n, double *out) {
    for (int b = 0; b < n; b += 8) {
        float amax = 0;
        for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[b + i]));
        const float id = amax != 0 ? 127.f / amax : 0.0f, d = amax / 127.f;
        for (int i = 0; i < 8; i++) out[b + i] = (double)d * rintf(v[b + i] * id);
    }
}

/* The reference: one row in double precision, the chosen weights renormalized when norm. ids receives the
 * chosen experts, w (may be NULL) their weights; returns the gap between the k-th and the (k+1)-th router
 * logit (a near tie would make the test's routing fragile). With q8 the gate and up products take x quantized
 * to 8-bit blocks, as the CUDA per-row kernels do for those types (test_q8_ref_dot). h_out (may be NULL)
 * receives the row's silu(gate) * up (k x F); with hq (the device's, k x F) the down products take that h
 * quantized as the CUDA down kernel does (q8_hidden_ref), so that only the kernels' rounding differs. */
static double ref_row_q(const moe_case *c, const float *x, bool norm, double *out, int *ids, double *wout, bool q8,
                        const float *hq, double *h_out) {
    double p[NX], mx = -1e300, sum = 0;
    for (int e = 0; e < NX; e++) {
        p[e] = 0;
        for (int i = 0; i < E; i++) p[e] += (double)c->router[e * E + i] * x[i];
        mx = fmax(mx, p[e]);
    }
    for (int e = 0; e < NX; e++) sum += p[e] = exp(p[e] - mx);
    for (int e = 0; e < NX; e++) p[e] /= sum;
    bool taken[NX] = {0};
    double w[K], wsum = 0;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < NX; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = true, ids[j] = best, wsum += w[j] = p[best];
    }
    double next = 0;
    for (int e = 0; e < NX; e++)
        if (!taken[e]) next = fmax(next, p[e]);
    for (int i = 0; i < E; i++) out[i] = 0;
    for (int j = 0; j < K; j++) {
        const float *G = c->gate_f + (size_t)ids[j] * F * E, *U = c->up_f + (size_t)ids[j] * F * E,
                    *D = c->down_f + (size_t)ids[j] * E * F;
        const size_t rb = kiln_row_bytes(c->type, E), e0 = (size_t)ids[j] * F; /* the expert's first row */
        double h[F];
        for (int r = 0; r < F; r++) {
            double g = 0, u = 0;
            if (q8) {
                g = test_q8_ref_dot(c->type, c->gate + (e0 + r) * rb, G + r * E, x, E);
                u = test_q8_ref_dot(c->type, c->up + (e0 + r) * rb, U + r * E, x, E);
            } else {
                for (int i = 0; i < E; i++) g += (double)G[r * E + i] * x[i], u += (double)U[r * E + i] * x[i];
            }
            h[r] = g / (1 + exp(-g)) * u;
            if (h_out) h_out[j * F + r] = h[r];
        }
        if (hq) q8_hidden_ref(hq + j * F, F, h);
        for (int r = 0; r < E; r++) {
            double y = 0;
            for (int i = 0; i < F; i++) y += (double)D[r * F + i] * h[i];
            out[r] += (norm ? w[j] / wsum : w[j]) * y;
        }
        if (wout) wout[j] = norm ? w[j] / wsum : w[j];
    }
    return log(p[ids[K - 1]] / next);
}

static double ref_row_w(const moe_case *c, const float *x, bool norm, double *out, int *ids, double *wout) {
    return ref_row_q(c, x, norm, out, ids, wout, false, NULL, NULL);
}

static double ref_row(const moe_case *c, const float *x, double *out, int *ids) { return ref_row_w(c, x, true, out, ids, NULL); }

/* cpu_moe_ffn (or with ref, cpu_moe_ffn_ref) over rows x (B of them) into out, with its own buffers. */
static void run_moe_with(kiln_pool *pool, moe_case *c, const float *x, int B, float *out, uint64_t *bytes_read,
                         bool ref) {
    cpu_moe_buf b;
    const int MB = B > NB ? B : NB;
    const size_t n = cpu_moe_layout(&b, NULL, &c->d, MB);
    uint8_t *mem = aligned_alloc(64, (n + 63) & ~(size_t)63);
    cpu_moe_layout(&b, mem, &c->d, MB);
    size_t sb = cpu_matmul_scratch_bytes(c->type, E, MB);
    if (cpu_matmul_scratch_bytes(c->type, F, MB) > sb) sb = cpu_matmul_scratch_bytes(c->type, F, MB);
    void *scratch = aligned_alloc(64, (sb + 63) & ~(size_t)63);
    (ref ? cpu_moe_ffn_ref : cpu_moe_ffn)(pool, &c->blk.ffn, x, B, out, &b, scratch);
    if (bytes_read) *bytes_read = b.expert_bytes_read;
    free(scratch);
    free(mem);
}

static void run_moe(kiln_pool *pool, moe_case *c, const float *x, int B, float *out, uint64_t *bytes_read) {
    run_moe_with(pool, c, x, B, out, bytes_read, false);
}

static double rel_err(const float *got, const double *want, int n) {
    double d = 0, w = 0;
    for (int i = 0; i < n; i++) d += (got[i] - want[i]) * (got[i] - want[i]), w += want[i] * want[i];
    return sqrt(d / (w + 1e-300));
}

TEST(cpu_moe_matches_scalar_reference_for_expert_types) {
    kiln_formats_init();
    kiln_pool *pool;
    REQUIRE_OK(kiln_pool_open(2, &pool));
    /* F32 experts: float rounding only. F16: the rows are rounded to F16 for the products. The others take
     * the rows quantized to 8 bits per block (Q8_0 / Q8_K) twice (x, then the SwiGLU output): ~1-3%. A wrong
     * expert, weight or routing is off by O(1). */
    static const struct { uint32_t type; double tol; } types[] = {
        {KILN_TYPE_F32, 1e-5}, {KILN_TYPE_F16, 2e-3}, {KILN_TYPE_Q8_0, 4e-2}, {KILN_TYPE_Q4_0, 4e-2},
        {KILN_TYPE_Q4_K, 4e-2}, {KILN_TYPE_Q5_K, 4e-2}, {KILN_TYPE_Q6_K, 4e-2}, {KILN_TYPE_BF16, 2e-2},
        {KILN_TYPE_Q4_1, 4e-2}, {KILN_TYPE_Q5_0, 4e-2}, {KILN_TYPE_Q5_1, 4e-2}, {KILN_TYPE_Q2_K, 4e-2},
        {KILN_TYPE_Q3_K, 4e-2},
    };
    static float x[NB * E], out[NB * E], one[E];
    static moe_case c;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        make_case(&c, types[ti].type, 1000 + ti);
        uint64_t rng = 77 + ti;
        for (int i = 0; i < NB * E; i++) x[i] = test_rand_normal(&rng);
        uint64_t bytes = 0;
        run_moe(pool, &c, x, NB, out, &bytes);
        double worst = 0;
        bool used[NX] = {0};
        for (int t = 0; t < NB; t++) {
            double ref[E];
            int ids[K];
            const double gap = ref_row(&c, x + t * E, ref, ids);
            CHECKF(gap > 1e-4, "%s row %d: the test data has a near tie (logit gap %g)", kiln_type_get(c.type)->name, t, gap);
            for (int j = 0; j < K; j++) used[ids[j]] = true;
            const double err = rel_err(out + t * E, ref, E);
            worst = err > worst ? err : worst;
            CHECKF(err <= types[ti].tol, "%s row %d: relative error %.3g > %.3g", kiln_type_get(c.type)->name, t, err,
                   types[ti].tol);
            /* the same row alone: bit for bit what it got in the batch */
            uint64_t one_bytes = 0;
            run_moe(pool, &c, x + t * E, 1, one, &one_bytes);
            CHECKF(!memcmp(one, out + t * E, sizeof one), "%s row %d: alone != in the batch", kiln_type_get(c.type)->name, t);
            CHECK_EQ_INT(one_bytes, (uint64_t)K * (c.w_gate.nbytes + c.w_up.nbytes + c.w_down.nbytes) / NX);
        }
        int n_used = 0;
        for (int e = 0; e < NX; e++) n_used += used[e];
        /* each expert any row chose is read once for the whole batch */
        CHECK_EQ_INT(bytes, (uint64_t)n_used * (c.w_gate.nbytes + c.w_up.nbytes + c.w_down.nbytes) / NX);
        printf("  %-5s worst relative error %.2e over %d rows (%d of %d experts used)\n", kiln_type_get(c.type)->name,
               worst, NB, n_used, NX);
        free_case(&c);
    }
    kiln_pool_close(pool);
}

/* The fused path equals the reference (per expert, three cpu_matmul calls) bit for bit, for a batch and
 * for one row, on one thread and on three (the work items go to whichever thread is free). */
TEST(cpu_moe_fused_equals_reference_bit_for_bit) {
    kiln_formats_init();
    static const uint32_t types[] = {KILN_TYPE_F32, KILN_TYPE_F16, KILN_TYPE_Q8_0, KILN_TYPE_Q4_0, KILN_TYPE_Q4_K,
                                     KILN_TYPE_Q6_K};
    static float x[NB * E], want[NB * E], got[NB * E];
    static moe_case c;
    for (int nt = 1; nt <= 3; nt += 2) {
        kiln_pool *pool;
        REQUIRE_OK(kiln_pool_open(nt, &pool));
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            make_case(&c, types[ti], 3000 + ti);
            uint64_t rng = 31 + ti;
            for (int i = 0; i < NB * E; i++) x[i] = test_rand_normal(&rng);
            for (int B = 1; B <= NB; B += NB - 1) {
                uint64_t bytes_ref = 0, bytes = 0;
                run_moe_with(pool, &c, x, B, want, &bytes_ref, true);
                run_moe_with(pool, &c, x, B, got, &bytes, false);
                int bad = -1;
                for (int i = 0; i < B * E && bad < 0; i++)
                    if (memcmp(&got[i], &want[i], sizeof(float))) bad = i;
                CHECKF(bad < 0, "%s, %d threads, %d rows: fused != reference at row %d col %d (%.9g vs %.9g)",
                       kiln_type_get(c.type)->name, nt, B, bad / E, bad % E, bad < 0 ? 0 : got[bad],
                       bad < 0 ? 0 : want[bad]);
                CHECK_EQ_INT(bytes, bytes_ref);
            }
            free_case(&c);
        }
        kiln_pool_close(pool);
    }
}

/* A model whose blocks convert x differently: one MoE block's gate and up dot against different activation types
 * (Q8_0 and Q8_K), so the buffers hold a conversion for the up of its own, and a uniform Q4_K block that must not
 * read that buffer (it holds nothing of this call: filled with a byte pattern here). The uniform block's fused
 * path equals its reference bit for bit, one row (decode) and a batch. */
TEST(cpu_moe_block_without_its_own_up_conversion_ignores_the_buffer) {
    kiln_formats_init();
    static moe_case mixed, q4k, q8;
    static float x[NB * E], want[NB * E], got[NB * E];
    make_case(&q4k, KILN_TYPE_Q4_K, 4100);
    make_case(&q8, KILN_TYPE_Q8_0, 4101);
    mixed = q8;
    mixed.blk.ffn.up = &q4k.w_up; /* gate Q8_0 (Q8_0 activations), up Q4_K (Q8_K activations) */
    kiln_block blocks[2] = {mixed.blk, q4k.blk};
    const kiln_blocks d = {.n_block = 2, .n_embd = E, .blocks = blocks};
    cpu_moe_buf b;
    const size_t n = cpu_moe_layout(&b, NULL, &d, NB);
    uint8_t *mem = aligned_alloc(64, (n + 63) & ~(size_t)63);
    REQUIRE(mem);
    cpu_moe_layout(&b, mem, &d, NB);
    REQUIRE(b.qg_up != b.qg);
    size_t sb = 0;
    for (int t = 0; t < 2; t++)
        for (int w = 0; w < 2; w++) {
            const size_t z = cpu_matmul_scratch_bytes(t ? KILN_TYPE_Q4_K : KILN_TYPE_Q8_0, w ? F : E, NB);
            sb = z > sb ? z : sb;
        }
    void *scratch = aligned_alloc(64, (sb + 63) & ~(size_t)63);
    REQUIRE(scratch);
    kiln_pool *pool;
    REQUIRE_OK(kiln_pool_open(2, &pool));
    uint64_t rng = 77;
    for (int i = 0; i < NB * E; i++) x[i] = test_rand_normal(&rng);
    for (int B = 1; B <= NB; B += NB - 1) {
        cpu_moe_ffn_ref(pool, &q4k.blk.ffn, x, B, want, &b, scratch);
        memset(mem, 0x5a, n); /* the up's own conversion (and everything else) stale */
        cpu_moe_ffn(pool, &q4k.blk.ffn, x, B, got, &b, scratch);
        int bad = -1;
        for (int i = 0; i < B * E && bad < 0; i++)
            if (memcmp(&got[i], &want[i], sizeof(float))) bad = i;
        CHECKF(bad < 0, "%d rows: the uniform block's fused path != its reference at row %d col %d (%.9g vs %.9g)", B,
               bad / E, bad % E, bad < 0 ? 0 : got[bad], bad < 0 ? 0 : want[bad]);
    }
    kiln_pool_close(pool);
    free(scratch);
    free(mem);
    free_case(&q4k);
    free_case(&q8);
}

/* Decode reads only the chosen experts: with every other expert's bytes set to 0xff (NaN scales and
 * values in every type), one row's output is unchanged, bit for bit. */
TEST(cpu_moe_reads_only_the_chosen_experts) {
    kiln_formats_init();
    kiln_pool *pool;
    REQUIRE_OK(kiln_pool_open(2, &pool));
    static const uint32_t types[] = {KILN_TYPE_F16, KILN_TYPE_Q8_0, KILN_TYPE_Q4_K};
    static moe_case c;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        make_case(&c, types[ti], 500 + ti);
        uint64_t rng = 5 + ti;
        float x[E], clean[E], poisoned[E];
        for (int i = 0; i < E; i++) x[i] = test_rand_normal(&rng);
        double ref[E];
        int ids[K];
        ref_row(&c, x, ref, ids);
        run_moe(pool, &c, x, 1, clean, NULL);
        const size_t gate_mb = c.w_gate.nbytes / NX, down_mb = c.w_down.nbytes / NX;
        for (int e = 0; e < NX; e++) {
            bool chosen = false;
            for (int j = 0; j < K; j++) chosen |= ids[j] == e;
            if (chosen) continue;
            memset(c.gate + e * gate_mb, 0xff, gate_mb);
            memset(c.up + e * gate_mb, 0xff, gate_mb);
            memset(c.down + e * down_mb, 0xff, down_mb);
        }
        run_moe(pool, &c, x, 1, poisoned, NULL);
        CHECKF(!memcmp(clean, poisoned, sizeof clean), "%s: an expert that was not chosen changed the output",
               kiln_type_get(types[ti])->name);
        bool finite = true;
        for (int i = 0; i < E; i++) finite &= isfinite(poisoned[i]) != 0;
        CHECK(finite);
        /* and poisoning a chosen one does show (the check above can fail) */
        memset(c.down + ids[0] * down_mb, 0xff, down_mb);
        run_moe(pool, &c, x, 1, poisoned, NULL);
        CHECK(!isfinite(poisoned[0]));
        free_case(&c);
    }
    kiln_pool_close(pool);
}

/* RMSNorm(x) * w (eps 1e-6) in float, as the reference's input. */
static void rmsnorm_f(const float *x, const float *w, float *out) {
    double ss = 0;
    for (int i = 0; i < E; i++) ss += (double)x[i] * x[i];
    const double sc = 1.0 / sqrt(ss / E + 1e-6);
    for (int i = 0; i < E; i++) out[i] = (float)(x[i] * sc * w[i]);
}

/* The skewed batch of NG rows: x = noise + v (v one random vector shared by every row), the router rows of
 * EX_ALL and EX_NONE +-v / 60 (logits near +-3 for every row), the others scaled to logits of about +-0.8:
 * every row chooses EX_ALL (with most of the weight), none EX_NONE, the other slots vary by row. */
static void make_skewed(moe_case *c, uint64_t seed, float *x) {
    uint64_t rng = seed;
    float v[E];
    for (int i = 0; i < E; i++) v[i] = test_rand_normal(&rng);
    for (int t = 0; t < NG; t++)
        for (int i = 0; i < E; i++) x[t * E + i] = test_rand_normal(&rng) + v[i];
    for (int e = 0; e < NX; e++)
        for (int i = 0; i < E; i++)
            c->router[e * E + i] = e == EX_ALL ? v[i] / 60 : e == EX_NONE ? -v[i] / 60 : 0.25f * c->router[e * E + i];
}

/* How many of the NG rows chose each expert (reference routing of the rows x, normalized or not). */
static void skewed_counts(const moe_case *c, const float *x, bool norm, int *count) {
    for (int e = 0; e < NX; e++) count[e] = 0;
    for (int t = 0; t < NG; t++) {
        double out[E];
        int ids[K];
        ref_row_w(c, x + t * E, norm, out, ids, NULL);
        for (int j = 0; j < K; j++) count[ids[j]]++;
    }
}

/* The skewed batch on the CPU (the data the CUDA grouped test uses): the routing has the expert every row
 * chose and the one none did, and cpu_moe_ffn over all NG rows matches the reference. */
TEST(cpu_moe_skewed_batch_every_row_one_expert_none_another) {
    kiln_formats_init();
    kiln_pool *pool;
    REQUIRE_OK(kiln_pool_open(2, &pool));
    static moe_case c;
    static float x[NG * E], out[NG * E];
    make_case(&c, KILN_TYPE_Q8_0, 7100);
    make_skewed(&c, 7101, x);
    int count[NX];
    skewed_counts(&c, x, true, count);
    CHECKF(count[EX_ALL] == NG && count[EX_NONE] == 0, "expert %d chosen by %d rows, expert %d by %d", EX_ALL,
           count[EX_ALL], EX_NONE, count[EX_NONE]);
    int n_used = 0;
    for (int e = 0; e < NX; e++) n_used += count[e] > 0;
    CHECKF(n_used >= NX - 2, "only %d experts chosen", n_used);
    /* the same holds for RMSNorm(x), which the device routes (cuda_moe_grouped_... below) */
    static float xn[NG * E], nw[E];
    for (int i = 0; i < E; i++) nw[i] = 1.0f;
    for (int t = 0; t < NG; t++) rmsnorm_f(x + t * E, nw, xn + t * E);
    int count_n[NX];
    skewed_counts(&c, xn, true, count_n);
    CHECKF(count_n[EX_ALL] == NG && count_n[EX_NONE] == 0, "normed: expert %d chosen by %d rows, expert %d by %d",
           EX_ALL, count_n[EX_ALL], EX_NONE, count_n[EX_NONE]);
    for (int t = 0; t < NG; t++) {
        double ref[E];
        int ids[K];
        const double gn = ref_row_w(&c, xn + t * E, true, ref, ids, NULL), gu = ref_row_w(&c, xn + t * E, false, ref, ids, NULL);
        CHECKF(gn > 1e-4 && gu > 1e-4, "normed row %d: near tie (logit gaps %g, %g)", t, gn, gu);
    }
    run_moe(pool, &c, x, NG, out, NULL);
    double worst = 0;
    for (int t = 0; t < NG; t++) {
        double ref[E];
        int ids[K];
        const double gap = ref_row(&c, x + t * E, ref, ids);
        CHECKF(gap > 1e-4, "row %d: the test data has a near tie (logit gap %g)", t, gap);
        const double err = rel_err(out + t * E, ref, E);
        worst = err > worst ? err : worst;
        CHECKF(err <= 4e-2, "row %d: relative error %.3g", t, err);
    }
    printf("  q8_0 skewed batch of %d rows: worst relative error %.2e; rows per expert", NG, worst);
    for (int e = 0; e < NX; e++) printf(" %d", count[e]);
    printf("\n");
    free_case(&c);
    kiln_pool_close(pool);
}

/* The routing of one row: softmax, the k largest (the lower id on ties), renormalized or not. */
TEST(cpu_moe_route_topk_ties_and_norm) {
    float p[6] = {1, 3, 3, 0, 3, -2};
    int32_t ids[3];
    float w[3];
    cpu_moe_route(p, 6, 3, true, ids, w);
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4);
    CHECKF(fabsf(w[0] + w[1] + w[2] - 1.0f) < 1e-6f && fabsf(w[0] - 1.0f / 3) < 1e-6f, "%g %g %g", w[0], w[1], w[2]);
    double z = 0;
    const double l[6] = {1, 3, 3, 0, 3, -2};
    for (int i = 0; i < 6; i++) z += exp(l[i]);
    float q[6] = {1, 3, 3, 0, 3, -2};
    cpu_moe_route(q, 6, 2, false, ids, w);
    CHECK(ids[0] == 1 && ids[1] == 2);
    CHECKF(fabs(w[0] - exp(3.0) / z) < 1e-6 && fabs(q[0] - exp(1.0) / z) < 1e-6, "unnormalized %g", w[0]);
    float r[4] = {-1, 5, 2, 4};
    cpu_moe_route(r, 4, 2, true, ids, w);
    CHECK(ids[0] == 1 && ids[1] == 3);
    CHECKF(fabs(w[0] - exp(5.0) / (exp(5.0) + exp(4.0))) < 1e-6, "normalized %g", w[0]);
}

/* ---- the CUDA kernels */

#ifdef KILN_HAVE_CUDA
/* The device's routing and output of the n rows x (path: per row or grouped) against the reference: same
 * experts in the same order, weights and outputs within tol, probabilities summing to 1. */
static void cuda_moe_rows(moe_case *c, int path, bool norm, const float *x, int n, const float *nw, double tol) {
    static float y[NG * E], probs[NG * NX], wts[NG * K], xn[E], h[NG * K * F];
    static int32_t ids[NG * K];
    const bool per_row = path == KILN_MOE_PER_ROW, q8h = per_row && test_q8_hidden(c->type);
    CHECK_OK(kiln_cuda_test_moe(path, c->type, E, F, NX, K, norm, c->router, c->gate, c->up, c->down, nw, 1e-6f, x, n,
                                probs, ids, wts, y, per_row ? h : NULL));
    const char *tn = kiln_type_get(c->type)->name, *pn = path == KILN_MOE_GROUPED ? "grouped" : "per row";
    double worst = 0;
    for (int t = 0; t < n; t++) {
        double ref[E], rw[K], href[K * F], psum = 0;
        int rid[K];
        rmsnorm_f(x + t * E, nw, xn);
        const double gap = ref_row_q(c, xn, norm, ref, rid, rw, per_row && test_q8_input(c->type),
                                     q8h ? h + (size_t)t * K * F : NULL, href);
        if (per_row) { /* gate_up's output itself, before down quantizes it */
            const double herr = rel_err(h + (size_t)t * K * F, href, K * F);
            CHECKF(herr <= tol, "%s %s norm=%d row %d: h relative error %.3g > %.3g", tn, pn, norm, t, herr, tol);
        }
        CHECKF(gap > 1e-4, "%s row %d: the test data has a near tie (logit gap %g)", tn, t, gap);
        for (int e = 0; e < NX; e++) psum += probs[t * NX + e];
        CHECKF(fabs(psum - 1) < 1e-5, "%s row %d: probabilities sum to %.7f", tn, t, psum);
        for (int j = 0; j < K; j++) {
            CHECKF(ids[t * K + j] == rid[j], "%s %s norm=%d row %d slot %d: expert %d, reference %d", tn, pn, norm, t, j,
                   ids[t * K + j], rid[j]);
            CHECKF(fabs(wts[t * K + j] - rw[j]) < 1e-5, "%s %s norm=%d row %d slot %d: weight %.7f, reference %.7f", tn,
                   pn, norm, t, j, wts[t * K + j], rw[j]);
        }
        float got[E];
        for (int i = 0; i < E; i++) got[i] = y[t * E + i] - x[t * E + i];
        const double err = rel_err(got, ref, E);
        worst = err > worst ? err : worst;
        CHECKF(err <= tol, "%s %s norm=%d row %d: relative error %.3g > %.3g", tn, pn, norm, t, err, tol);
    }
    printf("  cuda %-5s %-7s norm=%d: worst relative error %.2e over %d rows\n", tn, pn, (int)norm, worst, n);
}

/* NB rows of random inputs through the per-row path. */
static void cuda_moe_case(moe_case *c, bool norm, uint64_t seed, double tol) {
    static float x[NB * E], nw[E];
    uint64_t rng = seed;
    for (int i = 0; i < NB * E; i++) x[i] = test_rand_normal(&rng);
    for (int i = 0; i < E; i++) nw[i] = 1.0f + 0.2f * test_rand_normal(&rng);
    cuda_moe_rows(c, KILN_MOE_PER_ROW, norm, x, NB, nw, tol);
}

TEST(cuda_moe_matches_scalar_reference_for_expert_types) {
    if (!test_gpu_ready()) return;
    kiln_formats_init();
    /* the device reads the exact weights; the gate and up products of the 8-bit input types take 8-bit blocks
     * of the input (so does the reference for them, within 1e-4); the down products of the block types take
     * the device's h (checked against the reference's within 1e-4) in 8-bit blocks of 8, and so does the
     * reference */
    static const uint32_t types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q8_0, KILN_TYPE_Q4_0,
                                     KILN_TYPE_Q4_1, KILN_TYPE_Q5_0, KILN_TYPE_Q5_1, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    static moe_case c;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        make_case(&c, types[ti], 3000 + ti);
        cuda_moe_case(&c, true, 91 + ti, 1e-4);
        if (types[ti] == KILN_TYPE_Q4_K) cuda_moe_case(&c, false, 191, 1e-4);
        free_case(&c);
    }
}

/* The grouped path on the skewed batch (NG rows; expert EX_ALL chosen by all of them: two GEMM tiles of rows,
 * the second partial; EX_NONE by none: its blocks exit) for every expert type. The GEMMs take the inputs and
 * the weights as F16 (the dense prefill's precision): within 3e-3 of the reference (a wrong row, expert or
 * slot is off by O(1e-1) or more). */
TEST(cuda_moe_grouped_matches_scalar_reference_for_expert_types) {
    if (!test_gpu_ready()) return;
    kiln_formats_init();
    static const uint32_t types[] = {KILN_TYPE_F32,  KILN_TYPE_F16,  KILN_TYPE_BF16, KILN_TYPE_Q8_0, KILN_TYPE_Q4_0,
                                     KILN_TYPE_Q4_1, KILN_TYPE_Q5_0, KILN_TYPE_Q5_1, KILN_TYPE_Q4_K, KILN_TYPE_Q6_K};
    static moe_case c;
    static float x[NG * E], xn[NG * E], nw[E];
    for (int i = 0; i < E; i++) nw[i] = 1.0f;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        make_case(&c, types[ti], 7100); /* the CPU test's routing data (the router does not depend on the type) */
        make_skewed(&c, 7101, x);
        for (int t = 0; t < NG; t++) rmsnorm_f(x + t * E, nw, xn + t * E);
        int count[NX];
        skewed_counts(&c, xn, true, count);
        CHECKF(count[EX_ALL] == NG && count[EX_NONE] == 0, "%s: expert %d chosen by %d rows, expert %d by %d",
               kiln_type_get(c.type)->name, EX_ALL, count[EX_ALL], EX_NONE, count[EX_NONE]);
        cuda_moe_rows(&c, KILN_MOE_GROUPED, true, x, NG, nw, 3e-3);
        if (types[ti] == KILN_TYPE_Q4_K) {
            cuda_moe_rows(&c, KILN_MOE_GROUPED, false, x, NG, nw, 3e-3);
            cuda_moe_rows(&c, KILN_MOE_GROUPED, true, x, 1, nw, 3e-3); /* one row: the smallest call */
        }
        free_case(&c);
    }
}

/* The group kernel against a stable counting sort: offsets, the list (rows in expert order, ascending within an
 * expert) and every entry's position, for shapes from a few entries to the most one launch takes, with
 * experts no row chose and (skewed ids) experts most rows chose. */
TEST(cuda_moe_group_matches_counting_sort) {
    if (!test_gpu_ready()) return;
    static const struct { int rows, k, experts; bool skew; } shapes[] = {
        {1, 1, 1, false}, {3, 2, 8, false}, {40, 3, 8, true}, {37, 5, 512, false}, {512, 8, 128, false},
        {512, 8, 128, true}, {1000, 64, 64, false}, {8191, 8, 128, true},
    };
    static int32_t ids[65535], offsets[513], list[65535], pos[65535], want_off[513], want_list[65535];
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int R = shapes[si].rows, k = shapes[si].k, X = shapes[si].experts, n = R * k;
        uint64_t rng = 900 + si;
        for (int r = 0; r < R; r++) /* k distinct experts per row (as top-k gives) */
            for (int j = 0; j < k; j++) {
                int e;
                bool dup;
                do {
                    e = shapes[si].skew && j == 0 ? (int)(test_rand_u64(&rng) % 3) : (int)(test_rand_u64(&rng) % (uint64_t)X);
                    dup = false;
                    for (int i = 0; i < j; i++) dup |= ids[r * k + i] == e;
                } while (dup);
                ids[r * k + j] = e;
            }
        memset(want_off, 0, sizeof want_off);
        for (int i = 0; i < n; i++) want_off[ids[i] + 1]++;
        for (int e = 0; e < X; e++) want_off[e + 1] += want_off[e];
        CHECK_OK(kiln_cuda_test_moe_group(ids, R, k, X, offsets, list, pos));
        int bad = 0;
        for (int e = 0; e <= X; e++) bad += offsets[e] != want_off[e];
        CHECKF(bad == 0, "%d rows x %d of %d experts: %d offsets differ (offsets[1] %d, want %d)", R, k, X, bad,
               offsets[1 < X ? 1 : X], want_off[1 < X ? 1 : X]);
        for (int i = 0; i < n; i++) want_list[want_off[ids[i]]++] = i / k; /* stable: entries in order */
        int bad_list = 0, bad_pos = 0;
        for (int i = 0; i < n; i++) {
            bad_list += list[i] != want_list[i];
            bad_pos += pos[i] < 0 || pos[i] >= n || list[pos[i]] != i / k;
        }
        for (int e = 0, p = 0; e < X; e++) /* the positions of one expert's entries follow the entry order */
            for (int i = 0; i < n; i++)
                if (ids[i] == e) bad_pos += pos[i] != p++;
        CHECKF(bad_list == 0 && bad_pos == 0, "%d rows x %d of %d experts: %d list entries, %d positions wrong", R, k,
               X, bad_list, bad_pos);
    }
}

/* Ties on the device: experts 1, 2 and 4 with the same router row (the row's largest logit) are chosen in id
 * order with a third of the weight each; and experts no row chose are never read (NaN bytes change nothing),
 * on both paths (the grouped one: their GEMM blocks exit before reading a weight). */
TEST(cuda_moe_ties_and_only_chosen_experts_read) {
    if (!test_gpu_ready()) return;
    kiln_formats_init();
    static moe_case c;
    static float x[NB * E], y[NB * E], y2[NB * E], probs[NB * NX], wts[NB * K], nw[E];
    int32_t ids[NB * K];
    make_case(&c, KILN_TYPE_Q4_K, 4242);
    uint64_t rng = 17;
    for (int i = 0; i < NB * E; i++) x[i] = test_rand_normal(&rng);
    for (int i = 0; i < E; i++) nw[i] = 1.0f;
    /* one row: router rows 1, 2, 4 = x, the others = -x / 4 */
    for (int e = 0; e < NX; e++)
        for (int i = 0; i < E; i++) c.router[e * E + i] = (e == 1 || e == 2 || e == 4) ? 0.01f * x[i] : -0.0025f * x[i];
    CHECK_OK(kiln_cuda_test_moe(KILN_MOE_PER_ROW, c.type, E, F, NX, K, true, c.router, c.gate, c.up, c.down, nw, 1e-6f,
                                x, 1, probs, ids, wts, y, NULL));
    CHECKF(ids[0] == 1 && ids[1] == 2 && ids[2] == 4, "tie: experts %d %d %d, want 1 2 4", ids[0], ids[1], ids[2]);
    for (int j = 0; j < K; j++) CHECKF(fabsf(wts[j] - 1.0f / 3) < 1e-6f, "tie: weight %d = %.7f", j, wts[j]);
    /* 2 rows of random routing; then every expert no row chose poisoned */
    free_case(&c);
    for (int path = KILN_MOE_PER_ROW; path <= KILN_MOE_GROUPED; path++) {
        make_case(&c, KILN_TYPE_Q4_K, 4343);
        CHECK_OK(kiln_cuda_test_moe(path, c.type, E, F, NX, K, true, c.router, c.gate, c.up, c.down, nw, 1e-6f, x, 2,
                                    probs, ids, wts, y, NULL));
        bool chosen[NX] = {0};
        for (int i = 0; i < 2 * K; i++) chosen[ids[i]] = true;
        const size_t gate_mb = c.w_gate.nbytes / NX, down_mb = c.w_down.nbytes / NX;
        int n_poisoned = 0;
        for (int e = 0; e < NX; e++) {
            if (chosen[e]) continue;
            memset(c.gate + e * gate_mb, 0xff, gate_mb);
            memset(c.up + e * gate_mb, 0xff, gate_mb);
            memset(c.down + e * down_mb, 0xff, down_mb);
            n_poisoned++;
        }
        CHECK_OK(kiln_cuda_test_moe(path, c.type, E, F, NX, K, true, c.router, c.gate, c.up, c.down, nw, 1e-6f, x, 2,
                                    probs, ids, wts, y2, NULL));
        CHECKF(n_poisoned > 0 && !memcmp(y, y2, sizeof(float) * 2 * E),
               "path %d: an expert no row chose changed the output (%d poisoned)", path, n_poisoned);
        free_case(&c);
    }
}
#endif
