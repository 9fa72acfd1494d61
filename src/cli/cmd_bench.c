/*
 * cmd_bench.c — `kiln bench`: open once, then repeat (reset, prefill P tokens, G decode steps, greedy or sampled) and
 * print the open phases and the medians of prefill and decode throughput; with --seqs, the throughput of
 * k sequences decoding together (bench_seqs.c).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/bench_seqs.h"
#include "base/timing.h"
#include "cli/cli.h"
#include "formats/formats.h"

static const char *usage_text =
    "usage: kiln bench -m MODEL [options]\n"
    "Measures session open, prefill and decode on MODEL (token ids are a fixed pseudo-random sequence).\n"
    "  -m, --model FILE     GGUF model\n"
    "  -p, --prompt N       prefill length in tokens (default 512)\n"
    "  -n, --gen N          decode steps per repetition (default 128; greedy unless a sampler option is given)\n"
    "  -r, --reps N         repetitions; medians are reported (default 5)\n"
    "      --seqs K1,K2,..  for each k: k sequences prefilled with P tokens each, then N decode steps of all\n"
    "                       k together (one batch per step); aggregate and per-sequence decode tok/s\n"
    "      --ctx N          context length (default: prompt + gen)\n"
    "      --threads N      CPU threads (default: all cores)\n"
    "      --device D       cpu, cuda or auto (default auto)\n"
    "      --temp T, --top-k K, --top-p P, --min-p M, --repeat-penalty R, --repeat-last-n N, --seed S\n"
    "                       sample every decode step (defaults as `kiln run`: 0.8, 40, 0.95, 0.05, 1.0, 64)\n"
    "                       through KILN_OUT_SAMPLE rows (on the GPU, the device sampler)\n"
    "      --host-sample    with a sampler option: logits back to the host and kiln_sample there\n"
    "      --json           one JSON object instead of text\n"
    "      --strict         refuse a model file with tensors its architecture does not use\n"
    "      --cuda-moe-per-row  CUDA, mixture of experts: each row reads its own chosen experts in every call\n"
    "                       (not the grouped path of prefill; to measure what grouping buys)\n"
    "  -h, --help           this help\n";

int cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    kiln_device device = KILN_DEVICE_AUTO;
    long P = 512, G = 128, R = 5, ctx = 0, threads = 0;
    bool json = false, moe_per_row = false;
    kiln_model_options mo = {0};
    bench_seqs_args sa = {0};
    sa.sp = kiln_sampler_defaults();
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *a = argv[i];
        bool err = false;
        int src;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--host-sample")) sa.host_sample = true;
        else if ((src = cli_sampler_opt("bench", argc, argv, &i, &sa.sp, NULL)) != 0) {
            if (src == 2) return 2;
            sa.sample = true;
        }
        else if (!strcmp(a, "--strict")) mo.strict = true;
        else if (!strcmp(a, "--cuda-moe-per-row")) moe_per_row = true;
        else if (cli_opt(argc, argv, &i, "-m", &v, &err) || cli_opt(argc, argv, &i, "--model", &v, &err)) model = v;
        else if (cli_opt(argc, argv, &i, "--device", &v, &err)) { if (!err && !cli_parse_device("bench", v, &device)) return 2; }
        else if (cli_opt(argc, argv, &i, "--seqs", &v, &err)) { if (!err && !bench_parse_seqs(v, &sa)) return 2; }
        else if (cli_opt(argc, argv, &i, "-p", &v, &err) || cli_opt(argc, argv, &i, "--prompt", &v, &err)) {
            if (!err && !cli_parse_int("bench", a, v, 1, 1 << 20, &P)) return 2;
        } else if (cli_opt(argc, argv, &i, "-n", &v, &err) || cli_opt(argc, argv, &i, "--gen", &v, &err)) {
            if (!err && !cli_parse_int("bench", a, v, 0, 1 << 20, &G)) return 2;
        } else if (cli_opt(argc, argv, &i, "-r", &v, &err) || cli_opt(argc, argv, &i, "--reps", &v, &err)) {
            if (!err && !cli_parse_int("bench", a, v, 1, 1000, &R)) return 2;
        } else if (cli_opt(argc, argv, &i, "--ctx", &v, &err)) {
            if (!err && !cli_parse_int("bench", a, v, 1, 1 << 20, &ctx)) return 2;
        } else if (cli_opt(argc, argv, &i, "--threads", &v, &err)) {
            if (!err && !cli_parse_int("bench", a, v, 1, 1024, &threads)) return 2;
        } else return cli_usage_error("bench", usage_text, "unknown option '%s'", a);
        if (err) return 2;
    }
    if (!model) return cli_usage_error("bench", usage_text, "a model is required (-m MODEL.gguf)");
    if (sa.host_sample && !sa.sample)
        return cli_usage_error("bench", usage_text, "--host-sample needs a sampler option (--temp, --top-k, ...)");
    if (sa.n_ks) {
        if (moe_per_row) return cli_usage_error("bench", usage_text, "--cuda-moe-per-row is not taken with --seqs");
        if (ctx) return cli_usage_error("bench", usage_text, "--ctx is set by --seqs (prompt + gen + 1)");
        sa.model = model, sa.device = device, sa.P = P, sa.N = G, sa.R = R, sa.threads = threads, sa.json = json;
        return bench_seqs(&sa);
    }
    kiln_session_options o = {.n_ctx = (int)(ctx ? ctx : P + G + 1), .n_threads = (int)threads, .max_batch = (int)P,
                              .device = device, .cuda_moe_per_row = moe_per_row};
    if (P + G + 1 > o.n_ctx) return cli_error("bench", "prompt %ld + gen %ld do not fit --ctx %d", P, G, o.n_ctx);

    kiln_model *m = NULL;
    kiln_session *s = NULL;
    uint64_t t0 = kiln_now_ns();
    if (kiln_model_open_ex(model, &mo, &m) != KILN_OK || kiln_session_open(m, &o, &s) != KILN_OK) {
        cli_error("bench", "%s", kiln_last_error());
        kiln_model_close(m);
        return 1;
    }
    uint64_t open_ns = kiln_now_ns() - t0;
    kiln_model_info mi;
    kiln_model_get_info(m, &mi);
    int32_t *ids = malloc((size_t)P * sizeof *ids);
    uint64_t *pre = calloc((size_t)R, sizeof *pre), *dec = calloc((size_t)R, sizeof *dec);
    kiln_sampler *smp = NULL;
    int rc = 1;
    if (!ids || !pre || !dec) { cli_error("bench", "out of memory"); goto done; }
    if (sa.sample && kiln_sampler_open(&sa.sp, mi.n_vocab, &smp) != KILN_OK) { cli_error("bench", "%s", kiln_last_error()); goto done; }
    uint64_t x = 12345;
    for (long i = 0; i < P; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((x >> 33) % (uint64_t)mi.n_vocab);
    }
    if (mi.bos_id >= 0) ids[0] = mi.bos_id;
    for (long r = 0; r < R; r++) {
        kiln_session_reset(s);
        const float *logits;
        uint64_t a = kiln_now_ns();
        if (kiln_prefill(s, ids, (size_t)P, &logits) != KILN_OK) { cli_error("bench", "%s", kiln_last_error()); goto done; }
        uint64_t b = kiln_now_ns();
        kiln_batch_row row = {.seq = 0, .id = ids[P - 1]};
        kiln_batch_output bo;
        if (smp) kiln_sampler_reset(smp);
        for (long g = 0; g < G; g++)
            if (bench_step(s, &sa, &row, 1, &bo, &smp) != KILN_OK) { cli_error("bench", "%s", kiln_last_error()); goto done; }
        pre[r] = b - a;
        dec[r] = kiln_now_ns() - b;
    }
    uint64_t first_pre = pre[0], first_dec = dec[0];
    uint64_t mp = cli_median_u64(pre, (int)R), md = cli_median_u64(dec, (int)R);
    const kiln_phase *ph;
    size_t nph = kiln_session_open_phases(s, &ph);
    if (json) {
        printf("{\"model\":");
        cli_json_str(stdout, model, strlen(model));
        printf(",\"backend\":\"%s\",\"decode\":\"%s\",\"threads\":%d,\"prompt_tokens\":%ld,\"gen_tokens\":%ld,\"reps\":%ld,\"open_ns\":%llu,"
               "\"prefill_median_ns\":%llu,\"decode_median_ns\":%llu,\"prefill_tok_s\":%.1f,\"decode_tok_s\":%.1f,"
               "\"first_prefill_ns\":%llu,\"first_decode_ns\":%llu,\"cpu_level\":\"%s\",\"open_phases\":{",
               kiln_session_backend(s), bench_sample_mode(&sa), kiln_session_n_threads(s), P, G, R, (unsigned long long)open_ns,
               (unsigned long long)mp, (unsigned long long)md, P / (mp / 1e9), md ? G / (md / 1e9) : 0.0,
               (unsigned long long)first_pre, (unsigned long long)first_dec, kiln_cpu_level_name(kiln_cpu_level()));
        for (size_t i = 0; i < nph; i++) printf("%s\"%s\":%llu", i ? "," : "", ph[i].name, (unsigned long long)ph[i].ns);
        printf("}}\n");
    } else {
        printf("%s (%s, %d layers, %d embd) · %s · %d threads · cpu kernels %s\n", model, mi.arch, mi.n_layer, mi.n_embd,
               kiln_session_backend(s), kiln_session_n_threads(s), kiln_cpu_level_name(kiln_cpu_level()));
        printf("open %.1f ms (", open_ns / 1e6);
        for (size_t i = 0; i < nph; i++) printf("%s%s %.2f", i ? ", " : "", ph[i].name + 5, ph[i].ns / 1e6);
        printf(")\n");
        printf("prefill %ld tokens: median %.2f ms (%.0f tok/s); first rep %.2f ms\n", P, mp / 1e6, P / (mp / 1e9), first_pre / 1e6);
        if (G)
            printf("decode %ld %s steps: median %.2f ms (%.0f tok/s, %.3f ms/token); first rep %.2f ms\n", G,
                   bench_sample_mode(&sa), md / 1e6,
                   G / (md / 1e9), md / 1e6 / G, first_dec / 1e6);
    }
    rc = 0;
done:
    kiln_sampler_close(smp);
    free(ids);
    free(pre);
    free(dec);
    kiln_session_close(s);
    kiln_model_close(m);
    return rc;
}
