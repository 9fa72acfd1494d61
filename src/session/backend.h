/*
 * backend.h — the backend interface: a small table of functions the session drives. A backend owns
 * every buffer it computes with; after open it must not allocate, load or compile anything.
 * The model (weights as views into the map, hyperparameters) is read-only to a backend.
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stdint.h>

#include "kiln.h"
#include "base/timing.h"
#include "model/model.h"

typedef struct kiln_backend_config {
    int n_ctx;       /* KV cache length (positions) */
    int max_batch;   /* largest n passed to forward */
    int n_threads;   /* CPU threads */
} kiln_backend_config;

typedef struct kiln_backend_ops {
    const char *name;  /* "cpu", "cuda" */
    /* Allocates and touches everything for cfg, prepares weights, loads kernels; appends its open
     * phases (open.arena, open.weights, open.kernels, ...) to phases. *state is NULL on failure. */
    kiln_status (*open)(const kiln_model *m, const kiln_backend_config *cfg, kiln_phases *phases, void **state);
    /* Runs tokens ids[0..n) at positions pos..pos+n-1 (1 <= n <= max_batch, pos + n <= n_ctx), appends
     * their K/V to the cache, and writes the logits of the last position to logits (n_vocab floats).
     * When logits is NULL and argmax is not, writes only the argmax (greedy, lowest id on ties). */
    kiln_status (*forward)(void *state, const int32_t *ids, int n, int pos, float *logits, int32_t *argmax);
    /* Forgets the cache contents (positions restart at 0). Never frees. */
    void (*reset)(void *state);
    void (*close)(void *state);
} kiln_backend_ops;

extern const kiln_backend_ops kiln_backend_cpu;
/* NULL when kiln was built without CUDA; its open fails with KILN_ERR_DEVICE when no GPU is present. */
const kiln_backend_ops *kiln_backend_cuda(void);

#endif
