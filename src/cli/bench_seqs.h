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
} bench_seqs_args;

/* Parses "1,2,4,8" (each 1..256, at most BENCH_MAX_KS); false with a message on a bad list. */
bool bench_parse_seqs(const char *s, bench_seqs_args *a);

/* For each k: k sequences each prefilled with P tokens, then N decode steps of all k together (one
 * kiln_batch per step), R times; prints the medians and the first step's penalty. Returns the exit code. */
int bench_seqs(const bench_seqs_args *a);

#endif
