/*
 * moe_ffn.c — the CPU MoE feed-forward of one real-shaped qwen3-30b-a3b layer (n_embd 2048, 128 experts of
 * n_ff 768, 8 used, Q4_K experts with random bytes and sane scales, an F32 router), the fused path
 * (cpu_moe_ffn) against its reference (cpu_moe_ffn_ref: per expert three cpu_matmul calls, which is what
 * main ran before the fused path), alternated call by call in one process so that a busy machine hits
 * both alike. Decode: one row per call, a new random row each time (other experts, so the weights come
 * from memory as in real decode); prefill: 64 rows per call. Prints the median wall time per call, the
 * expert bytes read per call and their rate, and the machine's read bandwidth (a 256 MiB sum, same
 * threads) as the floor: a decode call cannot take less than its bytes / that bandwidth.
 *   usage: moe_ffn [--quick]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/cpu_moe.h"
#include "base/pool.h"
#include "formats/blocks.h"
#include "formats/formats.h"
#include "bench_time.h"

enum { E = 2048, F = 768, NX = 128, K = 8, PB = 64 };

/* one thread: the calling thread's CPU time (not inflated by preemption on a shared box); more: wall time */
static int g_threads = 1;
static double now_s(void) {
    struct timespec ts;
    clock_gettime(g_threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static float rnd_normalish(uint64_t *s) { /* sum of 4 uniforms, centred: enough for routing diversity */
    float a = 0;
    for (int i = 0; i < 4; i++) a += (float)(rng_next(s) >> 40) / (float)(1 << 24);
    return a - 2.0f;
}

/* n Q4_K blocks of random quants with scales around 1e-3 (so the SwiGLU stays finite). */
static block_q4_K *random_q4_k(uint64_t *s, size_t n) {
    block_q4_K *b = aligned_alloc(64, (n * sizeof *b + 63) & ~(size_t)63);
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = (uint8_t *)&b[i];
        for (size_t j = 0; j < sizeof *b; j++) p[j] = (uint8_t)rng_next(s);
        b[i].d = kiln_f32_to_f16(1e-3f), b[i].dmin = kiln_f32_to_f16(5e-4f);
    }
    return b;
}

static volatile float sink;

/* GB/s of summing a 256 MiB buffer on the pool's threads (the read bandwidth). */
typedef struct { const float *p; size_t n; float part[64]; } sum_job;
static void sum_run(void *ctx, int ith, int nth) {
    sum_job *j = ctx;
    size_t per = j->n / (size_t)nth, lo = per * (size_t)ith;
    float a[16] = {0};
    for (size_t i = lo; i < lo + per; i += 16)
        for (int k = 0; k < 16; k++) a[k] += j->p[i + k];
    float t = 0;
    for (int k = 0; k < 16; k++) t += a[k];
    j->part[ith] = t;
}

static double bandwidth(kiln_pool *pool) {
    sum_job j = {.n = (size_t)64 << 20};
    float *p = aligned_alloc(64, j.n * 4);
    for (size_t i = 0; i < j.n; i++) p[i] = (float)(i & 7);
    j.p = p;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        const double t0 = now_s();
        kiln_pool_run(pool, sum_run, &j);
        const double g = (double)j.n * 4 / (now_s() - t0) / 1e9;
        best = g > best ? g : best;
        sink += j.part[0];
    }
    free(p);
    return best;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 && !strcmp(argv[1], "--quick") ? 10 : 40;
    kiln_formats_init();
    uint64_t s = 0x9e3779b97f4a7c15ull;
    const size_t nb = (size_t)NX * F * (E / 256);
    block_q4_K *gate = random_q4_k(&s, nb), *up = random_q4_k(&s, nb), *down = random_q4_k(&s, nb);
    float *router = malloc(sizeof(float) * NX * E);
    for (int i = 0; i < NX * E; i++) router[i] = 0.05f * rnd_normalish(&s);
    kiln_weight wr = {.data = router, .type = KILN_TYPE_F32, .ne = {E, NX, 1}, .nbytes = (uint64_t)4 * NX * E};
    kiln_weight wg = {.data = gate, .type = KILN_TYPE_Q4_K, .ne = {E, F, NX}, .nbytes = nb * sizeof(block_q4_K)};
    kiln_weight wu = wg, wd = {.data = down, .type = KILN_TYPE_Q4_K, .ne = {F, E, NX}, .nbytes = wg.nbytes};
    wu.data = up;
    kiln_block blk = {.ffn = {.kind = KILN_FFN_MOE, .gate = &wg, .up = &wu, .down = &wd, .router = &wr, .n_ff = F,
                              .n_expert = NX, .n_expert_used = K, .norm_topk = true}};
    kiln_blocks d = {.n_block = 1, .n_embd = E, .blocks = &blk};
    cpu_moe_buf b;
    const size_t nbuf = cpu_moe_layout(&b, NULL, &d, PB);
    uint8_t *mem = aligned_alloc(64, (nbuf + 63) & ~(size_t)63);
    cpu_moe_layout(&b, mem, &d, PB);
    size_t sb = cpu_matmul_scratch_bytes(KILN_TYPE_Q4_K, E, PB);
    if (cpu_matmul_scratch_bytes(KILN_TYPE_Q4_K, F, PB) > sb) sb = cpu_matmul_scratch_bytes(KILN_TYPE_Q4_K, F, PB);
    void *scratch = aligned_alloc(64, (sb + 63) & ~(size_t)63);
    float *x = malloc(sizeof(float) * PB * E), *o1 = malloc(sizeof(float) * PB * E), *o2 = malloc(sizeof(float) * PB * E);
    printf("| threads | case | fused ms/call | reference ms/call | ratio ref/fused | expert MB/call | fused GB/s | read GB/s (floor ms) |\n");
    printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int nt = 1; nt <= 2; nt++) {
        kiln_pool *pool;
        if (kiln_pool_open(nt, &pool) != KILN_OK) return 1;
        g_threads = nt;
        const double bw = bandwidth(pool);
        for (int rows = 1; rows <= PB; rows += PB - 1) {
            const int n = rows == 1 ? reps * 4 : reps / 2 + 1;
            double *tf = malloc(sizeof(double) * n), *tr = malloc(sizeof(double) * n);
            uint64_t bytes = 0;
            bool same = true;
            for (int i = 0; i < n; i++) {
                for (int c = 0; c < rows * E; c++) x[c] = rnd_normalish(&s);
                const uint64_t b0 = b.expert_bytes_read;
                double t0 = now_s();
                cpu_moe_ffn(pool, &blk.ffn, x, rows, o1, &b, scratch);
                tf[i] = now_s() - t0;
                bytes += b.expert_bytes_read - b0;
                for (int c = 0; c < rows * E; c++) x[c] = rnd_normalish(&s); /* other experts: from memory */
                t0 = now_s();
                cpu_moe_ffn_ref(pool, &blk.ffn, x, rows, o2, &b, scratch);
                tr[i] = now_s() - t0;
                cpu_moe_ffn(pool, &blk.ffn, x, rows, o1, &b, scratch);
                same &= !memcmp(o1, o2, sizeof(float) * (size_t)rows * E);
            }
            qsort(tf, (size_t)n, sizeof *tf, bench_cmp_double), qsort(tr, (size_t)n, sizeof *tr, bench_cmp_double);
            const double mf = tf[n / 2], mr = tr[n / 2], mb = (double)bytes / n / 1e6;
            printf("| %d | %s %d row%s | %.3f | %.3f | %.2f | %.1f | %.1f | %.1f (%.3f)%s |\n", nt,
                   rows == 1 ? "decode" : "prefill", rows, rows > 1 ? "s" : "", mf * 1e3, mr * 1e3, mr / mf, mb,
                   mb / 1e3 / mf, bw, mb / 1e3 / bw * 1e3, same ? "" : " MISMATCH");
            free(tf), free(tr);
        }
        kiln_pool_close(pool);
    }
    free(x), free(o1), free(o2), free(scratch), free(mem), free(gate), free(up), free(down), free(router);
    return 0;
}
