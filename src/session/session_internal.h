/*
 * session_internal.h — the session struct shared by session.c (open, close, getters, counters) and
 * batch.c (kiln_batch, the per-sequence calls and the single-sequence calls), and the seam the tests use
 * to open a session over a backend table of their own.
 */
#ifndef KILN_SESSION_INTERNAL_H
#define KILN_SESSION_INTERNAL_H

#include "base/alloc.h"
#include "session/backend.h"

struct kiln_session {
    kiln_model *model;
    const kiln_backend_ops *ops;
    void *state;
    kiln_backend_config cfg;
    float *logits;             /* max_out x n_vocab: the outputs of the last call */
    int32_t *argmax;           /* max_out */
    kiln_batch_output *outs;   /* max_out: the warm pass's outputs */
    kiln_backend_row *brows;   /* max_batch: the backend's rows of the call being run */
    kiln_batch_row *chunk;     /* max_batch: the rows of one prefill chunk */
    kiln_sample_spec *specs;   /* max_out: the specs of the rows the backend samples (ops->samples) */
    kiln_sampler **spec_smp;   /* max_out: their samplers (NULL: sampled on the host), for the undo */
    uint64_t *spec_rng;        /* max_out: each sampler's RNG before its spec's draw */
    int *host_k;               /* max_out: the outputs of the call being committed that kiln_sample draws */
    int *n_past;               /* n_seq */
    int *pending;              /* n_seq: rows of each sequence in the call being checked */
    uint64_t kv_bytes_per_seq;
    kiln_phases phases;        /* model's open phases, then the session's */
    kiln_counters counts;      /* what happened inside this session's calls since the end of open */
    uint64_t n_prefilled, n_decoded;
    uint64_t host_sample_ns;   /* wall time of the host draws since the end of open */
};

/* Runs a checked batch (batch.c): the core of kiln_batch, kiln_seq_prefill and the warm pass. */
kiln_status kiln_session_run(kiln_session *s, const kiln_batch_row *rows, size_t n, kiln_batch_output *out,
                             size_t out_cap, size_t *n_out, const char *fn);

/* kiln_session_open over a given backend table instead of the device's (tests wrap the CPU's). */
kiln_status kiln_session_open_ops(kiln_model *m, const kiln_session_options *opt, const kiln_backend_ops *ops,
                                  kiln_session **out);

/* Every public session call runs between these, so that its counts land in the session's counters. */
#define SESSION_ENTER(s) kiln_counters *session_prev_sink_ = kiln_counters_enter(&(s)->counts)
#define SESSION_LEAVE() kiln_counters_leave(session_prev_sink_)

#endif
