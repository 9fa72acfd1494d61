/*
 * bench_seqs.c — `kiln bench --seqs`: one session with n_seq = the largest k; for each k and each
 * repetition, reset, prefill k sequences with P tokens each (kiln_seq_prefill), then N decode steps of all k
 * together (one kiln_batch of k rows per step; greedy, or sampled with the sampler options: KILN_OUT_SAMPLE
 * rows, or with --host-sample logits rows and kiln_sample, the path before the device sampler). Reports per k the median step time over every
 * step of every repetition and from it the aggregate decode tok/s (k / step) and per-sequence tok/s (the
 * median resists the preemption spikes of a shared machine; the mean step is printed beside it), and the
 * first step of size k in this process against the median step (the first-call penalty per batch size).
 */
#include "cli/bench_seqs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/timing.h"
#include "cli/cli.h"

#define TRY(expr) \
    do { kiln_status st_ = (expr); if (st_ != KILN_OK) return st_; } while (0)

bool bench_parse_seqs(const char *s, bench_seqs_args *a) {
    a->n_ks = 0;
    while (*s) {
        char *end;
        long k = strtol(s, &end, 10);
        if (end == s || k < 1 || k > 256 || (*end && *end != ',') || a->n_ks == BENCH_MAX_KS) {
            fprintf(stderr, "kiln bench: --seqs wants a list like 1,2,4,8 (each 1..256, at most %d)\n", BENCH_MAX_KS);
            return false;
        }
        a->ks[a->n_ks++] = (int)k;
        s = *end ? end + 1 : end;
    }
    if (!a->n_ks) fprintf(stderr, "kiln bench: --seqs is empty\n");
    return a->n_ks > 0;
}

const char *bench_sample_mode(const bench_seqs_args *a) {
    return !a->sample ? "greedy" : a->host_sample ? "host-sampled" : "sampled";
}

kiln_status bench_step(kiln_session *s, const bench_seqs_args *a, kiln_batch_row *rows, int k, kiln_batch_output *out,
                       kiln_sampler **smp) {
    for (int q = 0; q < k; q++) {
        rows[q].out = !a->sample ? KILN_OUT_ARGMAX : a->host_sample ? KILN_OUT_LOGITS : KILN_OUT_SAMPLE;
        rows[q].sampler = a->sample ? smp[q] : NULL;
    }
    TRY(kiln_batch(s, rows, (size_t)k, out, (size_t)k, NULL));
    for (int q = 0; q < k; q++) {
        if (a->sample && a->host_sample) out[q].id = kiln_sample(smp[q], out[q].logits);
        if (a->sample) kiln_sampler_accept(smp[q], out[q].id);
        rows[q].id = out[q].id;
    }
    return KILN_OK;
}

typedef struct seq_result {
    int k;
    uint64_t prefill_ns, decode_ns, step_ns, mean_step_ns, first_step_ns;
    uint64_t sample_ns; /* the mean host-draw time of a step (kiln_stats.host_sample_ns over the decode steps) */
} seq_result;

/* One k: R repetitions; medians into *r. prompt: P ids; scratch: rows/out of k, times of R*N steps. */
static kiln_status run_k(kiln_session *s, const bench_seqs_args *a, int k, const int32_t *prompt, seq_result *r,
                         kiln_batch_row *rows, kiln_batch_output *out, kiln_sampler **smp, uint64_t *pre, uint64_t *dec,
                         uint64_t *steps) {
    r->k = k;
    uint64_t drawn = 0;
    for (long rep = 0; rep < a->R; rep++) {
        for (int q = 0; q < k; q++) TRY(kiln_seq_reset(s, q));
        uint64_t t0 = kiln_now_ns();
        for (int q = 0; q < k; q++) TRY(kiln_seq_prefill(s, q, prompt, (size_t)a->P, NULL));
        uint64_t t1 = kiln_now_ns();
        for (int q = 0; q < k; q++) {
            rows[q] = (kiln_batch_row){.seq = q, .id = prompt[(q * 7) % a->P], .out = KILN_OUT_ARGMAX};
            if (a->sample) kiln_sampler_reset(smp[q]);
        }
        kiln_stats st0, st1;
        kiln_session_stats(s, &st0);
        for (long g = 0; g < a->N; g++) {
            uint64_t ts = kiln_now_ns();
            TRY(bench_step(s, a, rows, k, out, smp));
            steps[rep * a->N + g] = kiln_now_ns() - ts;
        }
        kiln_session_stats(s, &st1);
        drawn += st1.host_sample_ns - st0.host_sample_ns;
        pre[rep] = t1 - t0;
        dec[rep] = kiln_now_ns() - t1;
    }
    r->first_step_ns = a->N ? steps[0] : 0;
    r->prefill_ns = cli_median_u64(pre, a->R);
    uint64_t total = 0;
    for (long rep = 0; rep < a->R; rep++) total += dec[rep];
    r->mean_step_ns = a->N ? total / (uint64_t)(a->R * a->N) : 0;
    r->sample_ns = a->N ? drawn / (uint64_t)(a->R * a->N) : 0;
    r->decode_ns = cli_median_u64(dec, a->R);
    r->step_ns = a->N ? cli_median_u64(steps, a->R * a->N) : 0;
    return KILN_OK;
}

static void print_results(const bench_seqs_args *a, kiln_session *s, const seq_result *res) {
    const double base = res[0].step_ns ? res[0].k / (res[0].step_ns / 1e9) : 0;
    if (a->json) {
        printf("{\"model\":");
        cli_json_str(stdout, a->model, strlen(a->model));
        printf(",\"backend\":\"%s\",\"threads\":%d,\"prompt_tokens\":%ld,\"gen_tokens\":%ld,\"reps\":%ld,"
               "\"decode\":\"%s\",\"seqs\":[",
               kiln_session_backend(s), kiln_session_n_threads(s), a->P, a->N, a->R, bench_sample_mode(a));
        for (int i = 0; i < a->n_ks; i++) {
            const seq_result *r = &res[i];
            const double agg = r->step_ns ? r->k / (r->step_ns / 1e9) : 0;
            printf("%s{\"k\":%d,\"prefill_median_ns\":%llu,\"decode_median_ns\":%llu,\"step_median_ns\":%llu,"
                   "\"step_mean_ns\":%llu,\"first_step_ns\":%llu,\"decode_tok_s\":%.1f,\"per_seq_tok_s\":%.1f,"
                   "\"ratio_to_first_k\":%.3f,\"host_sample_ns_per_step\":%llu}",
                   i ? "," : "", r->k, (unsigned long long)r->prefill_ns, (unsigned long long)r->decode_ns,
                   (unsigned long long)r->step_ns, (unsigned long long)r->mean_step_ns,
                   (unsigned long long)r->first_step_ns, agg, agg / r->k, base ? agg / base : 0.0,
                   (unsigned long long)r->sample_ns);
        }
        printf("]}\n");
        return;
    }
    printf("%s · %s · %d threads · prompt %ld, %ld %s decode steps, %ld reps (medians)\n", a->model,
           kiln_session_backend(s), kiln_session_n_threads(s), a->P, a->N, bench_sample_mode(a), a->R);
    printf("%5s %12s %12s %10s %10s %12s %12s %8s\n", "k", "decode tok/s", "per-seq t/s", "step ms", "mean ms",
           "first step", "prefill ms", "ratio");
    for (int i = 0; i < a->n_ks; i++) {
        const seq_result *r = &res[i];
        const double agg = r->step_ns ? r->k / (r->step_ns / 1e9) : 0;
        printf("%5d %12.1f %12.1f %10.3f %10.3f %9.3f ms %12.2f %7.2fx\n", r->k, agg, agg / r->k, r->step_ns / 1e6,
               r->mean_step_ns / 1e6, r->first_step_ns / 1e6, r->prefill_ns / 1e6, base ? agg / base : 0.0);
    }
    printf("tok/s from the median step; first step: the first kiln_batch of k rows in this process\n");
    if (!res[0].sample_ns) return;
    /* the draws of KILN_OUT_SAMPLE rows on the host, timed inside kiln_batch: their share of the mean step */
    printf("host draws a step:");
    for (int i = 0; i < a->n_ks; i++)
        printf("%s k = %d %.3f ms (%.1f%%)", i ? "," : "", res[i].k, res[i].sample_ns / 1e6,
               res[i].mean_step_ns ? 100.0 * (double)res[i].sample_ns / (double)res[i].mean_step_ns : 0.0);
    printf("\n");
}

int bench_seqs(const bench_seqs_args *a) {
    int max_k = 0;
    for (int i = 0; i < a->n_ks; i++) max_k = a->ks[i] > max_k ? a->ks[i] : max_k;
    kiln_session_options o = {.n_ctx = (int)(a->P + a->N + 1), .n_threads = (int)a->threads, .n_seq = max_k,
                              .max_batch = (int)(a->P > max_k ? a->P : max_k), .device = a->device};
    kiln_model *m = NULL;
    kiln_session *s = NULL;
    if (kiln_model_open(a->model, &m) != KILN_OK || kiln_session_open(m, &o, &s) != KILN_OK) {
        cli_error("bench", "%s", kiln_last_error());
        kiln_model_close(m);
        return 1;
    }
    kiln_model_info mi;
    kiln_model_get_info(m, &mi);
    int32_t *prompt = malloc(sizeof *prompt * (size_t)a->P);
    kiln_batch_row *rows = calloc((size_t)max_k, sizeof *rows);
    kiln_batch_output *out = calloc((size_t)max_k, sizeof *out);
    kiln_sampler **smp = calloc((size_t)max_k, sizeof *smp);
    uint64_t *pre = calloc((size_t)a->R, 8), *dec = calloc((size_t)a->R, 8), *steps = calloc((size_t)(a->R * a->N + 1), 8);
    seq_result res[BENCH_MAX_KS];
    int rc = 1;
    if (!prompt || !rows || !out || !smp || !pre || !dec || !steps) { cli_error("bench", "out of memory"); goto done; }
    for (int q = 0; a->sample && q < max_k; q++) {
        kiln_sampler_params p = a->sp;
        p.seed += (uint64_t)q;
        if (kiln_sampler_open(&p, mi.n_vocab, &smp[q]) != KILN_OK) { cli_error("bench", "%s", kiln_last_error()); goto done; }
    }
    uint64_t x = 12345;
    for (long i = 0; i < a->P; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((x >> 33) % (uint64_t)mi.n_vocab);
    }
    if (mi.bos_id >= 0) prompt[0] = mi.bos_id;
    for (int i = 0; i < a->n_ks; i++)
        if (run_k(s, a, a->ks[i], prompt, &res[i], rows, out, smp, pre, dec, steps) != KILN_OK) {
            cli_error("bench", "%s", kiln_last_error());
            goto done;
        }
    print_results(a, s, res);
    rc = 0;
done:
    for (int q = 0; smp && q < max_k; q++) kiln_sampler_close(smp[q]);
    free(prompt), free(rows), free(out), free(smp), free(pre), free(dec), free(steps);
    kiln_session_close(s);
    kiln_model_close(m);
    return rc;
}
