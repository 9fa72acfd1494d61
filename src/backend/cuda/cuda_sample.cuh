/*
 * cuda_sample.cuh — sampling on the device (cuda_sample.cu): one block per row draws the row's next id from its
 * logits as its kiln_sample_spec says (sample_spec.h), with the math of kiln_sample (src/sample/sample.c), so
 * that only 4 bytes per row come back. Host launchers for cuda_backend.cu and cuda_testing.cu.
 */
#ifndef KILN_CUDA_SAMPLE_CUH
#define KILN_CUDA_SAMPLE_CUH

#include <cuda_runtime.h>
#include <stddef.h>

#include "sample/sample_spec.h"

/* Threads of the sampling kernel's block (one block per row). */
#define CK_SAMPLE_THREADS 1024

/* The sampling kernel, for the eager load at open (cudaFuncGetAttributes). */
const void *ck_sample_kernel(void);

/* For each row r < n_rows whose specs[r].mode is KILN_SPEC_SAMPLE: applies the penalties to logits + r * stride
 * in place (n_vocab floats), then writes the chosen id to ids[r]; rows of mode KILN_SPEC_NONE are left alone
 * (ids[r] untouched). scratch: n_rows x n_vocab ints (the ids a cut keeps). specs, logits, ids and scratch are
 * device memory. An ordinary launch (no PDL): it starts after the kernel before it has finished. */
void ck_sample(const kiln_sample_spec *specs, float *logits, int n_vocab, size_t stride, int n_rows, int *ids,
               int *scratch, cudaStream_t stream);

#endif
