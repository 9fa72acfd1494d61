/*
 * quantize.h — `kiln quantize`: rewrites a GGUF model with its weight matrices in another tensor type,
 * following llama-quantize's rules (no importance matrix) so the result matches its files:
 *   - every tensor whose name ends in "weight", with 2 or more dimensions, that is not a norm
 *     ("_norm.weight"), an expert gate (ffn_gate_inp), or a position / token-type embedding, is converted;
 *     everything else is copied unchanged (norms stay F32);
 *   - K-type mixes: the output matrix (or the token embedding when it doubles as the output) is Q6_K for
 *     every quantized target except Q8_0; Q2_K / Q3_K_* / Q4_K_* / Q5_K_* raise attn_v, ffn_down and
 *     attn_output as llama-quantize does (use_more_bits layer pattern);
 *   - a matrix whose row length is not a multiple of the chosen type's block falls back (Q4_K->Q5_0,
 *     Q5_K->Q5_1, Q6_K->Q8_0, Q2_K/Q3_K->Q4_0 where llama-quantize would pick IQ4_NL, which kiln does not
 *     write; then F16 if even that does not fit) and the fallback is reported;
 *   - tensors are written in llama-quantize's order (by layer number, then by name), metadata is copied in
 *     order with general.quantization_version = 2 and general.file_type (llama_ftype) moved to the end;
 *   - input tensors may be F32, F16, BF16 or any type kiln dequantizes (requantizing is reported);
 *   - conversion runs on a thread pool, straight into the writer's buffer; the file is written to
 *     OUT.tmp and renamed at the end (gguf_writer_write), and OUT must not be IN.
 */
#ifndef KILN_TOOLS_QUANTIZE_H
#define KILN_TOOLS_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "formats/formats.h"
#include "kiln.h"

/* A target as llama-quantize names it ("Q4_K_M", "Q8_0", "F16", ...). */
typedef struct kiln_quant_target {
    const char *name;        /* canonical name, "Q4_K_M" */
    uint32_t ftype;          /* llama_ftype written to general.file_type */
    kiln_type default_type;  /* the type of ordinary matrices */
} kiln_quant_target;

/* Looks a target up by name (case-insensitive; "Q4_K" = "Q4_K_M", "Q3_K" = "Q3_K_M", "Q5_K" = "Q5_K_M").
 * NULL when unknown. */
const kiln_quant_target *kiln_quant_find_target(const char *name);
/* The table of targets; *n receives its length. */
const kiln_quant_target *kiln_quant_targets(int *n);

typedef struct kiln_quantize_options {
    const char *in_path, *out_path;
    const kiln_quant_target *target;
    int n_threads;           /* 1..64 */
    FILE *progress;          /* per-tensor lines, warnings and the summary; NULL: silent */
    bool pure;               /* no K mixes: every matrix gets the target's type (row-length fallbacks still apply) */
    bool set_output_type;    /* output.weight (or the tied token_embd.weight) gets output_type */
    kiln_type output_type;
    bool set_embd_type;      /* token_embd.weight gets embd_type */
    kiln_type embd_type;
} kiln_quantize_options;

typedef struct kiln_quantize_report {
    int n_tensors, n_converted, n_copied, n_fallback, n_requantized;
    uint64_t bytes_in, bytes_out;          /* tensor data */
    uint64_t values_converted;             /* elements of the converted tensors */
    double seconds;                        /* wall time of the whole run */
    double convert_seconds;                /* time spent converting tensor data */
    int count_by_type[KILN_TYPE_COUNT];    /* output tensors per type */
    uint64_t bytes_by_type[KILN_TYPE_COUNT];
} kiln_quantize_report;

/* Runs the conversion. Fails (nothing written at out_path) when IN cannot be read, OUT is IN, a tensor
 * type cannot be converted, or writing fails; the message names the file and the tensor. report may be NULL. */
kiln_status kiln_quantize_file(const kiln_quantize_options *o, kiln_quantize_report *report);

#endif
