/*
 * formats_quantize.c — quantization throughput.
 *   1. Per type, single thread: the reference quantizer (from_float), the fastest exact one
 *      (kiln_from_float_fast: same bytes; AVX2 scale searches for Q2_K/Q4_K/Q5_K/Q6_K) and the dequantizer
 *      (to_float) over a 64 MiB F32 buffer of normal values: MB/s of F32 input (resp. output).
 *   2. `kiln quantize` end to end (kiln_quantize_file, 2 threads) on a synthetic llama-shaped F32 model
 *      (2 layers of TinyLlama-1.1B's shapes: width 2048, FFN 5632, 32 heads / 4 KV heads, a tied 32000-row
 *      embedding; 0.67 GB): MB/s of input tensor data, whole run including the write to /tmp.
 * Each figure is the median of 3 runs. Usage: formats_quantize [--quick]  (quick: 16 MiB, part 1 only)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "formats/formats.h"
#include "gguf/gguf.h"
#include "tools/quantize.h"
#include "bench_time.h"

static double median3(double a, double b, double c) {
    double v[3] = {a, b, c};
    qsort(v, 3, sizeof v[0], bench_cmp_double);
    return v[1];
}

static uint64_t rng_state = 88172645463325252ull;
static float rand_normal(void) {
    /* xorshift64 + Box-Muller */
    double u[2];
    for (int k = 0; k < 2; k++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        u[k] = ((rng_state >> 11) + 0.5) * 0x1p-53;
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

static void fill(float *x, size_t n, float std) {
    for (size_t i = 0; i < n; i++) x[i] = std * rand_normal();
}

static void per_type(size_t n_floats) {
    static const kiln_type types[] = {KILN_TYPE_F16, KILN_TYPE_BF16, KILN_TYPE_Q8_0, KILN_TYPE_Q5_1, KILN_TYPE_Q5_0,
                                      KILN_TYPE_Q4_1, KILN_TYPE_Q4_0, KILN_TYPE_Q6_K, KILN_TYPE_Q5_K, KILN_TYPE_Q4_K,
                                      KILN_TYPE_Q3_K, KILN_TYPE_Q2_K};
    float *x = kiln_aligned_alloc(64, n_floats * sizeof(float)), *y = kiln_aligned_alloc(64, n_floats * sizeof(float));
    uint8_t *q = kiln_aligned_alloc(64, n_floats * sizeof(float));
    fill(x, n_floats, 0.02f);
    const double mb = (double)n_floats * 4 / 1e6;
    printf("| type | reference quantize MB/s | fast exact quantize MB/s | dequantize MB/s |\n|---|---:|---:|---:|\n");
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const kiln_type_info *ti = kiln_type_get(types[k]);
        double tq[3], tf[3], td[3];
        for (int r = 0; r < 3; r++) {
            double t0 = bench_thread_s();
            ti->from_float(x, q, (int64_t)n_floats);
            tq[r] = bench_thread_s() - t0;
            t0 = bench_thread_s();
            kiln_from_float_fast(types[k])(x, q, (int64_t)n_floats);
            tf[r] = bench_thread_s() - t0;
            t0 = bench_thread_s();
            ti->to_float(q, y, (int64_t)n_floats);
            td[r] = bench_thread_s() - t0;
        }
        printf("| %s | %.0f | %.0f | %.0f |\n", ti->name, mb / median3(tq[0], tq[1], tq[2]),
               mb / median3(tf[0], tf[1], tf[2]), mb / median3(td[0], td[1], td[2]));
        fflush(stdout);
    }
    kiln_free(x);
    kiln_free(y);
    kiln_free(q);
}

/* A 2-layer F32 llama with TinyLlama-1.1B's matrix shapes and a tied embedding. */
static int write_model(const char *path) {
    gguf_writer *w = NULL;
    if (gguf_writer_open(&w)) return -1;
    gguf_set_str(w, "general.architecture", "llama", 5);
    gguf_set_u32(w, "llama.block_count", 2);
    gguf_set_u32(w, "llama.embedding_length", 2048);
    gguf_set_u32(w, "llama.feed_forward_length", 5632);
    gguf_set_u32(w, "llama.attention.head_count", 32);
    gguf_set_u32(w, "llama.attention.head_count_kv", 4);
    gguf_set_u32(w, "general.file_type", 0);
    float *bufs[32];
    int nb = 0;
#define ADD(name, d0, d1)                                                    \
    do {                                                                     \
        uint64_t ne[2] = {(d0), (d1)};                                       \
        float *b = malloc(sizeof(float) * (size_t)(d0) * (d1));              \
        fill(b, (size_t)(d0) * (d1), (d1) > 1 ? 0.02f : 1.0f);               \
        bufs[nb++] = b;                                                      \
        gguf_add_tensor(w, name, KILN_TYPE_F32, (d1) > 1 ? 2 : 1, ne, b);    \
    } while (0)
    ADD("token_embd.weight", 2048, 32000);
    ADD("output_norm.weight", 2048, 1);
    for (int l = 0; l < 2; l++) {
        char n[64];
#define ADDL(suffix, d0, d1) do { snprintf(n, sizeof n, "blk.%d." suffix, l); ADD(n, d0, d1); } while (0)
        ADDL("attn_norm.weight", 2048, 1);
        ADDL("attn_q.weight", 2048, 2048);
        ADDL("attn_k.weight", 2048, 256);
        ADDL("attn_v.weight", 2048, 256);
        ADDL("attn_output.weight", 2048, 2048);
        ADDL("ffn_norm.weight", 2048, 1);
        ADDL("ffn_gate.weight", 2048, 5632);
        ADDL("ffn_up.weight", 2048, 5632);
        ADDL("ffn_down.weight", 5632, 2048);
    }
    kiln_status st = gguf_writer_write(w, path, NULL, NULL);
    gguf_writer_close(w);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    return st == KILN_OK ? 0 : -1;
}

static void end_to_end(void) {
    char in[] = "/tmp/kiln-bench-q-in-XXXXXX", out[64];
    int fd = mkstemp(in);
    if (fd < 0) return;
    close(fd);
    if (write_model(in)) {
        printf("cannot write %s\n", in);
        unlink(in);
        return;
    }
    snprintf(out, sizeof out, "%s.out", in);
    static const char *targets[] = {"F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K_M", "Q4_K_M",
                                    "Q3_K_M", "Q2_K"};
    printf("\n`kiln quantize` end to end, 2 threads, %s (F32, 2 layers of TinyLlama-1.1B shapes):\n\n", in);
    printf("| target | input MB | output MB | seconds | MB/s of input |\n|---|---:|---:|---:|---:|\n");
    for (size_t k = 0; k < sizeof targets / sizeof targets[0]; k++) {
        kiln_quantize_options o = {.in_path = in, .out_path = out, .target = kiln_quant_find_target(targets[k]), .n_threads = 2};
        kiln_quantize_report rep;
        double t[3];
        for (int r = 0; r < 3; r++) {
            const double t0 = bench_wall_s();
            if (kiln_quantize_file(&o, &rep) != KILN_OK) {
                printf("| %s | failed: %s |\n", targets[k], kiln_last_error());
                break;
            }
            t[r] = bench_wall_s() - t0;
        }
        const double s = median3(t[0], t[1], t[2]);
        printf("| %s | %.0f | %.0f | %.2f | %.0f |\n", targets[k], rep.bytes_in / 1e6, rep.bytes_out / 1e6, s,
               rep.bytes_in / 1e6 / s);
        fflush(stdout);
    }
    unlink(out);
    unlink(in);
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    per_type(quick ? (4u << 20) : (16u << 20)); /* floats: 16 or 64 MiB */
    if (!quick) end_to_end();
    return 0;
}
