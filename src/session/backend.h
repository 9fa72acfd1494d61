/*
 * backend.h — the backend interface: a small table of functions the session drives. A backend owns
 * every buffer it computes with, including one KV region of n_ctx positions per sequence; after open it
 * must not allocate, load or compile anything. The model (weights as views into the map, hyperparameters,
 * the block description) is read-only to a backend.
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "base/pool.h"
#include "base/timing.h"
#include "model/model.h"
#include "sample/sample_spec.h"

typedef struct kiln_backend_config {
    int n_ctx;       /* KV positions per sequence */
    int max_batch;   /* most rows of one forward call */
    int n_seq;       /* sequences, each with its own KV region */
    int max_out;     /* most output rows of one forward call (min(n_seq, max_batch) or more) */
    int n_threads;   /* CPU threads */
    /* CUDA, experimental (kiln_session_options' cuda_* fields) */
    bool cuda_no_graph, cuda_no_pdl, cuda_moe_per_row;
} kiln_backend_config;

/* KILN_BK_OUT_SAMPLE (only for a backend whose ops say `samples`): the id drawn on the device as the row's
 * spec says (sample_spec.h) goes to argmax[k]; the logits stay on the device. */
enum { KILN_BK_OUT_NONE = 0, KILN_BK_OUT_ARGMAX = 1, KILN_BK_OUT_LOGITS = 2, KILN_BK_OUT_SAMPLE = 3 };

/* One row of a forward call: token id at position pos of sequence seq. */
typedef struct kiln_backend_row {
    int32_t seq, pos, id;
    int32_t out;     /* KILN_BK_OUT_*: nothing, the argmax only, logits and argmax, or a sampled id */
    const kiln_sample_spec *spec; /* KILN_BK_OUT_SAMPLE only */
} kiln_backend_row;

/* A forward call. Rows of one sequence come in order of position, each following that sequence's last
 * (pos = its n_past, +1 for each earlier row of it in the call); the rows that ask for an output are
 * numbered k = 0, 1, ... in row order, and output k goes to logits + k * n_vocab (logits rows; argmax
 * rows may use it as scratch) and argmax[k]. */
typedef struct kiln_backend_batch {
    const kiln_backend_row *rows;
    int n;           /* 1 .. max_batch */
    int n_out;       /* rows whose out != NONE, 0 .. max_out */
    float *logits;   /* n_out x n_vocab */
    int32_t *argmax; /* n_out */
} kiln_backend_batch;

typedef struct kiln_backend_ops {
    const char *name;  /* "cpu", "cuda" */
    bool samples;      /* takes KILN_BK_OUT_SAMPLE rows (samples on the device; only the id comes back) */
    /* Allocates and touches everything for cfg (n_seq KV regions of n_ctx), prepares weights, loads
     * kernels; appends its open phases (open.arena, open.weights, open.kernels, ...) to phases.
     * *state is NULL on failure. */
    kiln_status (*open)(const kiln_model *m, const kiln_backend_config *cfg, kiln_phases *phases, void **state);
    /* Runs a batch (validated by the session: sequences, positions, ids, counts), appends every row's K/V
     * to its sequence's cache and writes the outputs. */
    kiln_status (*forward)(void *state, const kiln_backend_batch *b);
    /* Forgets the cache contents of one sequence (its positions restart at 0). Never frees. */
    void (*reset)(void *state, int seq);
    /* Bytes of KV cache per sequence. */
    uint64_t (*kv_bytes_per_seq)(const void *state);
    void (*close)(void *state);
    /* The backend's thread pool, idle between forwards, for the session's host work on a call's outputs
     * (kiln_sample over its rows); NULL (or no hook): that work runs on the caller's thread alone. Last, so
     * that a table initialized in order (the CUDA backend's, C++) may leave it out. */
    kiln_pool *(*pool)(void *state);
} kiln_backend_ops;

extern const kiln_backend_ops kiln_backend_cpu;
/* NULL when kiln was built without CUDA; its open fails with KILN_ERR_DEVICE when no GPU is present. */
const kiln_backend_ops *kiln_backend_cuda(void);

#endif
