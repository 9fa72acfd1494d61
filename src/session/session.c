/*
 * session.c — kiln_session_open / close, the getters and the first-call contract: open picks the
 * backend, lets it allocate and prepare everything for n_seq sequences of n_ctx positions and the largest
 * batch, runs a warm pass over the batch shapes a request can produce (a mixed prefill + decode step and
 * decode steps of 1, 2, 4, ... sequences), then forgets every position and zeroes the session's counters.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/timing.h"
#include "session/session_internal.h"

#ifndef KILN_HAVE_CUDA
const kiln_backend_ops *kiln_backend_cuda(void) { return NULL; }
#endif

#define WARM_PREFILL 8
#define MAX_SEQ 256

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

/* Forgets every position of every sequence. */
static void reset_all(kiln_session *s) {
    for (int q = 0; q < s->cfg.n_seq; q++) {
        s->ops->reset(s->state, q);
        s->n_past[q] = 0;
    }
}

/* One warm step: sequence 0 runs n0 rows (a prompt when n0 > 1; its last one asks for out0), sequences
 * 1..k-1 one row each, alternating argmax and logits. Starts over at position 0 where a context would end. */
static kiln_status warm_step(kiln_session *s, int n0, int32_t out0, int k) {
    const int V = s->model->hp.n_vocab;
    kiln_batch_row *rows = s->chunk;
    for (int q = 0; q < k; q++)
        if (s->n_past[q] + (q ? 1 : n0) > s->cfg.n_ctx) reset_all(s);
    int n = 0;
    for (int i = 0; i < n0; i++) rows[n++] = (kiln_batch_row){.seq = 0, .id = (i + 1) % V, .out = KILN_OUT_NONE};
    rows[n - 1].out = out0;
    for (int q = 1; q < k; q++)
        rows[n++] = (kiln_batch_row){.seq = q, .id = (q + 7) % V, .out = q % 2 ? KILN_OUT_ARGMAX : KILN_OUT_LOGITS};
    return kiln_session_run(s, rows, (size_t)n, s->outs, (size_t)s->cfg.max_out, NULL, "warm pass");
}

/* The warm pass through the real paths: a mixed step (a prompt of sequence 0 beside a decode row of as
 * many other sequences as fit), then decode steps of 1, 2, 4, ... up to max_out sequences, with logits and
 * with the argmax only, then reset. It uses the session's own buffers (nothing is allocated). */
static kiln_status warm(kiln_session *s) {
    const int max_out = s->cfg.max_out;
    int n0 = s->cfg.n_ctx < WARM_PREFILL ? s->cfg.n_ctx : WARM_PREFILL;
    if (n0 > s->cfg.max_batch) n0 = s->cfg.max_batch;
    int k = s->cfg.max_batch - n0 + 1;
    KILN_TRY(warm_step(s, n0, KILN_OUT_LOGITS, k < max_out ? k : max_out));
    for (int b = 1;; b = b * 2 < max_out ? b * 2 : max_out) {
        KILN_TRY(warm_step(s, 1, KILN_OUT_LOGITS, b));
        KILN_TRY(warm_step(s, 1, KILN_OUT_ARGMAX, b));
        if (b == max_out) break;
    }
    reset_all(s);
    return KILN_OK;
}

/* Checks the options and fills in the defaults. */
static kiln_status resolve_options(const kiln_model *m, const kiln_session_options *opt, kiln_session_options *o) {
    memset(o, 0, sizeof *o);
    if (opt) *o = *opt;
    const kiln_hparams *hp = &m->hp;
    if (o->n_ctx < 0 || o->n_ctx > (1 << 20))
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: n_ctx %d out of range 1..%d", o->n_ctx, 1 << 20);
    if (o->n_threads < 0 || o->n_threads > 1024)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: n_threads %d out of range 1..1024", o->n_threads);
    if (o->max_batch < 0) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: max_batch %d < 0", o->max_batch);
    if (o->n_seq < 0 || o->n_seq > MAX_SEQ)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: n_seq %d out of range 1..%d", o->n_seq, MAX_SEQ);
    if (o->device != KILN_DEVICE_AUTO && o->device != KILN_DEVICE_CPU && o->device != KILN_DEVICE_CUDA)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: unknown device %d", (int)o->device);
    if (o->n_ctx == 0) o->n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (o->n_ctx > hp->n_ctx_train)
        KILN_WARN("n_ctx %d exceeds the model's training context %d", o->n_ctx, hp->n_ctx_train);
    if (o->n_threads == 0) o->n_threads = default_threads();
    if (o->max_batch == 0 || o->max_batch > o->n_ctx) o->max_batch = o->n_ctx < 512 ? o->n_ctx : 512;
    if (o->n_seq == 0) o->n_seq = 1;
    return KILN_OK;
}

/* The session's own buffers, sized for the configuration. */
static kiln_status alloc_buffers(kiln_session *s) {
    const size_t V = (size_t)s->model->hp.n_vocab, O = (size_t)s->cfg.max_out, B = (size_t)s->cfg.max_batch,
                 N = (size_t)s->cfg.n_seq;
    s->logits = kiln_calloc(O * V, sizeof(float));
    s->argmax = kiln_calloc(O, sizeof(int32_t));
    s->outs = kiln_calloc(O, sizeof(kiln_batch_output));
    s->brows = kiln_calloc(B, sizeof(kiln_backend_row));
    s->chunk = kiln_calloc(B, sizeof(kiln_batch_row));
    s->specs = kiln_calloc(O, sizeof(kiln_sample_spec));
    s->spec_smp = kiln_calloc(O, sizeof(kiln_sampler *));
    s->spec_rng = kiln_calloc(O, sizeof(uint64_t));
    s->host_k = kiln_calloc(O, sizeof(int));
    s->n_past = kiln_calloc(N, sizeof(int));
    s->pending = kiln_calloc(N, sizeof(int));
    if (!s->logits || !s->argmax || !s->outs || !s->brows || !s->chunk || !s->n_past || !s->pending ||
        !s->specs || !s->spec_smp || !s->spec_rng || !s->host_k)
        return kiln_fail(KILN_ERR_NOMEM, "kiln_session_open: out of memory for the session's buffers");
    return KILN_OK;
}

kiln_status kiln_session_open_ops(kiln_model *m, const kiln_session_options *opt, const kiln_backend_ops *ops,
                                  kiln_session **out) {
    if (!out) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: out is NULL");
    *out = NULL;
    if (!m) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_open: model is NULL");
    kiln_session_options o;
    KILN_TRY(resolve_options(m, opt, &o));
    kiln_session *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "kiln_session_open: out of memory");
    s->model = m;
    s->cfg = (kiln_backend_config){
        .n_ctx = o.n_ctx, .max_batch = o.max_batch, .n_seq = o.n_seq,
        .max_out = o.n_seq < o.max_batch ? o.n_seq : o.max_batch, .n_threads = o.n_threads,
        .cuda_no_graph = o.cuda_no_graph, .cuda_no_pdl = o.cuda_no_pdl,
        .cuda_moe_per_row = o.cuda_moe_per_row,
    };
    s->phases = m->phases;
    kiln_status st = alloc_buffers(s);
    if (st == KILN_OK && ops) {
        st = ops->open(m, &s->cfg, &s->phases, &s->state);
        if (st == KILN_OK) s->ops = ops;
    } else if (st == KILN_OK) {
        st = open_backend(s, o.device);
    }
    if (st == KILN_OK && !o.no_warm) {
        uint64_t t0 = kiln_now_ns();
        st = warm(s);
        kiln_phases_add(&s->phases, "open.warm", kiln_now_ns() - t0);
    }
    if (st != KILN_OK) {
        kiln_session_close(s);
        return st;
    }
    s->kv_bytes_per_seq = s->ops->kv_bytes_per_seq(s->state);
    KILN_INFO("session: %s, %d sequences of %d positions, KV cache %.2f MiB per sequence (%.1f MiB in all)",
              s->ops->name, s->cfg.n_seq, s->cfg.n_ctx, s->kv_bytes_per_seq / 1048576.0,
              s->kv_bytes_per_seq * (double)s->cfg.n_seq / 1048576.0);
    memset(&s->counts, 0, sizeof s->counts);
    s->n_prefilled = s->n_decoded = 0;
    s->host_sample_ns = 0;
    *out = s;
    return KILN_OK;
}

kiln_status kiln_session_open(kiln_model *m, const kiln_session_options *opt, kiln_session **out) {
    return kiln_session_open_ops(m, opt, NULL, out);
}

void kiln_session_close(kiln_session *s) {
    if (!s) return;
    if (s->ops && s->state) s->ops->close(s->state);
    kiln_free(s->logits);
    kiln_free(s->argmax);
    kiln_free(s->outs);
    kiln_free(s->brows);
    kiln_free(s->chunk);
    kiln_free(s->specs);
    kiln_free(s->spec_smp);
    kiln_free(s->spec_rng);
    kiln_free(s->host_k);
    kiln_free(s->n_past);
    kiln_free(s->pending);
    kiln_free(s);
}

int kiln_session_n_seq(const kiln_session *s) { return s ? s->cfg.n_seq : 0; }
uint64_t kiln_session_kv_bytes_per_seq(const kiln_session *s) { return s ? s->kv_bytes_per_seq : 0; }
int kiln_session_n_ctx(const kiln_session *s) { return s ? s->cfg.n_ctx : 0; }
int kiln_session_n_threads(const kiln_session *s) { return s ? s->cfg.n_threads : 0; }
const char *kiln_session_backend(const kiln_session *s) { return s ? s->ops->name : ""; }

void kiln_session_stats(const kiln_session *s, kiln_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!s) return;
    kiln_counters c;
    kiln_counters_snapshot(&s->counts, &c);
    out->host_allocs = c.host_allocs;
    out->device_allocs = c.device_allocs;
    out->module_loads = c.module_loads;
    out->graph_captures = c.graph_captures;
    out->jit_compiles = c.jit_compiles;
    out->tokens_prefilled = s->n_prefilled;
    out->tokens_decoded = s->n_decoded;
    out->host_sample_ns = s->host_sample_ns;
}

size_t kiln_session_open_phases(const kiln_session *s, const kiln_phase **out) {
    if (!out) return 0;
    *out = NULL;
    if (!s) return 0;
    *out = s->phases.items;
    return s->phases.n;
}
