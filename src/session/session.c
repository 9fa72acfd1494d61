/*
 * session.c — kiln_session_open / prefill / decode / reset / close and the first-call contract:
 * open picks the backend, lets it allocate and prepare everything for n_ctx, runs a warm pass over
 * the prefill and the decode path, then resets the KV cache and takes the counter baseline.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/timing.h"
#include "session/backend.h"

#ifndef KILN_HAVE_CUDA
const kiln_backend_ops *kiln_backend_cuda(void) { return NULL; }
#endif

#define WARM_PREFILL 8

struct kiln_session {
    kiln_model *model;
    const kiln_backend_ops *ops;
    void *state;
    kiln_backend_config cfg;
    float *logits;          /* n_vocab */
    int n_past;
    kiln_phases phases;     /* model's open phases, then the session's */
    kiln_counters base;     /* counters at the end of open */
    uint64_t n_prefilled, n_decoded;
};

static int default_threads(void) {
    int n = kiln_env_threads();
    if (n > 0) return n;
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)(c > 64 ? 64 : c) : 1;
}

/* Opens the backend for the requested device (auto: CUDA when it opens, else the CPU). */
static kiln_status open_backend(kiln_session *s, kiln_device dev) {
    const kiln_backend_ops *cuda = kiln_backend_cuda();
    if (dev == KILN_DEVICE_CUDA && !cuda)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "device cuda requested but kiln was built without CUDA");
    if (dev != KILN_DEVICE_CPU && cuda) {
        kiln_phases ph = {0};
        kiln_status st = cuda->open(s->model, &s->cfg, &ph, &s->state);
        if (st == KILN_OK) {
            s->ops = cuda;
            kiln_phases_append(&s->phases, &ph);
            return KILN_OK;
        }
        if (dev == KILN_DEVICE_CUDA) return st;
        KILN_INFO("cuda unavailable (%s); using the cpu", kiln_last_error());
    }
    kiln_status st = kiln_backend_cpu.open(s->model, &s->cfg, &s->phases, &s->state);
    if (st == KILN_OK) s->ops = &kiln_backend_cpu;
    return st;
}

/* The warm pass: a short prefill and two decode steps through the real paths, then reset. */
static kiln_status warm(kiln_session *s) {
    int32_t ids[WARM_PREFILL];
    int n = s->cfg.n_ctx - 2 < WARM_PREFILL ? s->cfg.n_ctx - 2 : WARM_PREFILL;
    if (n > s->cfg.max_batch) n = s->cfg.max_batch;
    int32_t bos = kiln_tokenizer_bos(s->model->tok);
    for (int i = 0; i < WARM_PREFILL; i++) ids[i] = (bos >= 0 ? bos + i : i) % s->model->hp.n_vocab;
    if (n >= 1) {
        KILN_TRY(s->ops->forward(s->state, ids, n, 0, s->logits, NULL));
        int32_t next;
        KILN_TRY(s->ops->forward(s->state, ids, 1, n, s->logits, NULL));
        if (n + 2 <= s->cfg.n_ctx) KILN_TRY(s->ops->forward(s->state, ids + 1, 1, n + 1, NULL, &next));
    }
    s->ops->reset(s->state);
    return KILN_OK;
}

kiln_status kiln_session_open(kiln_model *m, const kiln_session_options *opt, kiln_session **out) {
    *out = NULL;
    kiln_session_options o = {0};
    if (opt) o = *opt;
    if (!m) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: model is NULL");
    const kiln_hparams *hp = &m->hp;
    if (o.n_ctx < 0 || o.n_ctx > (1 << 20))
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: n_ctx %d out of range 1..%d", o.n_ctx, 1 << 20);
    if (o.n_threads < 0 || o.n_threads > 1024)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: n_threads %d out of range 1..1024", o.n_threads);
    if (o.max_batch < 0) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: max_batch %d < 0", o.max_batch);
    if (o.device != KILN_DEVICE_AUTO && o.device != KILN_DEVICE_CPU && o.device != KILN_DEVICE_CUDA)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: unknown device %d", (int)o.device);
    if (o.n_ctx == 0) o.n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (o.n_ctx > hp->n_ctx_train)
        KILN_WARN("n_ctx %d exceeds the model's training context %d", o.n_ctx, hp->n_ctx_train);
    if (o.n_threads == 0) o.n_threads = default_threads();
    if (o.max_batch == 0 || o.max_batch > o.n_ctx) o.max_batch = o.n_ctx < 512 ? o.n_ctx : 512;

    kiln_session *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "kiln_session_open: out of memory");
    s->model = m;
    s->cfg.n_ctx = o.n_ctx;
    s->cfg.max_batch = o.max_batch;
    s->cfg.n_threads = o.n_threads;
    s->phases = m->phases;
    s->logits = kiln_calloc((size_t)hp->n_vocab, sizeof(float));
    kiln_status st = s->logits ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "kiln_session_open: out of memory for logits");
    if (st == KILN_OK) st = open_backend(s, o.device);
    if (st == KILN_OK && !o.no_warm) {
        uint64_t t0 = kiln_now_ns();
        st = warm(s);
        kiln_phases_add(&s->phases, "open.warm", kiln_now_ns() - t0);
    }
    if (st != KILN_OK) {
        kiln_session_close(s);
        return st;
    }
    kiln_counters_read(&s->base);
    *out = s;
    return KILN_OK;
}

void kiln_session_close(kiln_session *s) {
    if (!s) return;
    if (s->ops && s->state) s->ops->close(s->state);
    kiln_free(s->logits);
    kiln_free(s);
}

static kiln_status check_ids(const kiln_session *s, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->model->hp.n_vocab)
            return kiln_fail(KILN_ERR_INVALID_ARG, "token %zu: id %d is outside the vocabulary 0..%d", i, (int)ids[i],
                             s->model->hp.n_vocab - 1);
    return KILN_OK;
}

kiln_status kiln_prefill(kiln_session *s, const int32_t *ids, size_t n, const float **logits) {
    if (logits) *logits = NULL;
    if (!s || (!ids && n)) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_prefill: NULL argument");
    if (n == 0) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_prefill: no tokens");
    if (n > (size_t)(s->cfg.n_ctx - s->n_past))
        return kiln_fail(KILN_ERR_CONTEXT_FULL, "kiln_prefill: %zu tokens do not fit the context (%d of %d positions used)",
                         n, s->n_past, s->cfg.n_ctx);
    KILN_TRY(check_ids(s, ids, n));
    size_t done = 0;
    while (done < n) {
        int chunk = (int)(n - done < (size_t)s->cfg.max_batch ? n - done : (size_t)s->cfg.max_batch);
        bool last = done + (size_t)chunk == n;
        kiln_status st = s->ops->forward(s->state, ids + done, chunk, s->n_past, last ? s->logits : NULL, NULL);
        if (st != KILN_OK) return st;
        s->n_past += chunk;
        done += (size_t)chunk;
    }
    s->n_prefilled += n;
    if (logits) *logits = s->logits;
    return KILN_OK;
}

kiln_status kiln_decode(kiln_session *s, int32_t id, const float **logits) {
    if (logits) *logits = NULL;
    if (!s) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_decode: session is NULL");
    if (s->n_past >= s->cfg.n_ctx)
        return kiln_fail(KILN_ERR_CONTEXT_FULL, "kiln_decode: the context is full (%d positions)", s->cfg.n_ctx);
    KILN_TRY(check_ids(s, &id, 1));
    KILN_TRY(s->ops->forward(s->state, &id, 1, s->n_past, s->logits, NULL));
    s->n_past++;
    s->n_decoded++;
    if (logits) *logits = s->logits;
    return KILN_OK;
}

kiln_status kiln_decode_greedy(kiln_session *s, int32_t id, int32_t *next) {
    if (!s || !next) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_decode_greedy: NULL argument");
    if (s->n_past >= s->cfg.n_ctx)
        return kiln_fail(KILN_ERR_CONTEXT_FULL, "kiln_decode_greedy: the context is full (%d positions)", s->cfg.n_ctx);
    KILN_TRY(check_ids(s, &id, 1));
    KILN_TRY(s->ops->forward(s->state, &id, 1, s->n_past, NULL, next));
    s->n_past++;
    s->n_decoded++;
    return KILN_OK;
}

kiln_status kiln_session_rewind(kiln_session *s, int n) {
    if (!s || n < 0 || n > s->n_past)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_rewind: %d is outside 0..%d", n, s ? s->n_past : 0);
    s->n_past = n; /* later positions are overwritten before attention reads them */
    return KILN_OK;
}

void kiln_session_reset(kiln_session *s) {
    s->ops->reset(s->state);
    s->n_past = 0;
}

int kiln_session_n_past(const kiln_session *s) { return s->n_past; }
int kiln_session_n_ctx(const kiln_session *s) { return s->cfg.n_ctx; }
int kiln_session_n_threads(const kiln_session *s) { return s->cfg.n_threads; }
const char *kiln_session_backend(const kiln_session *s) { return s->ops->name; }

void kiln_session_stats(const kiln_session *s, kiln_stats *out) {
    kiln_counters now;
    kiln_counters_read(&now);
    memset(out, 0, sizeof *out);
    out->host_allocs = now.host_allocs - s->base.host_allocs;
    out->device_allocs = now.device_allocs - s->base.device_allocs;
    out->module_loads = now.module_loads - s->base.module_loads;
    out->graph_captures = now.graph_captures - s->base.graph_captures;
    out->jit_compiles = now.jit_compiles - s->base.jit_compiles;
    out->tokens_prefilled = s->n_prefilled;
    out->tokens_decoded = s->n_decoded;
}

size_t kiln_session_open_phases(const kiln_session *s, const kiln_phase **out) {
    *out = s->phases.items;
    return s->phases.n;
}
