/*
 * bench_seqs.h — `kiln bench --seqs K1,K2,...`: decode throughput of k sequences advancing together.
 */
#ifndef KILN_CLI_BENCH_SEQS_H
#define KILN_CLI_BENCH_SEQS_H

#include <stdbool.h>

#include "kiln.h"

#define BENCH_MAX_KS 16

typedef struct bench_seqs_args {
    const char *model;
    kiln_device device;
    long P, N, R, threads;
    int ks[BENCH_MAX_KS], n_ks;
    bool json;
    bool sample, host_sample;   /* decode rows sampled with sp (KILN_OUT_SAMPLE, or logits + kiln_sample) */
    kiln_sampler_params sp;
} bench_seqs_args;

/* "greedy", "sampled" (KILN_OUT_SAMPLE rows: on the device where the backend can) or "host-sampled". */
const char *bench_sample_mode(const bench_seqs_args *a);

/* One decode step of rows[0..k) (their ids in place): greedy argmax rows, or each row sampled with smp[q] as
 * a says (the ids accepted into the samplers). */
kiln_status bench_step(kiln_session *s, const bench_seqs_args *a, kiln_batch_row *rows, int k, kiln_batch_output *out,
                       kiln_sampler **smp);

/* Parses "1,2,4,8" (each 1..256, at most BENCH_MAX_KS); false with a message on a bad list. */
bool bench_parse_seqs(const char *s, bench_seqs_args *a);

/* For each k: k sequences each prefilled with P tokens, then N decode steps of all k together (one
 * kiln_batch per step), R times; prints the medians and the first step's penalty. Returns the exit code. */
int bench_seqs(const bench_seqs_args *a);

#endif
