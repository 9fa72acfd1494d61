/*
 * batch.c — kiln_batch and everything built on it: the per-sequence calls (kiln_seq_prefill, reset,
 * rewind, n_past) and the single-sequence calls (kiln_prefill, kiln_decode, kiln_decode_greedy, ...) as
 * the sequence-0 case. A call is checked whole before the backend runs, and positions are committed only
 * after it succeeded, so a failed call changes nothing for any sequence. KILN_OUT_SAMPLE rows go to a backend
 * that samples (ops->samples) as specs (sample_spec.h), else they are logits rows sampled here with kiln_sample
 * (on the backend's threads, ops->pool, when their samplers are distinct); a failed forward gives the specs'
 * draws back to their samplers.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/timing.h"
#include "session/session_internal.h"

/* Checks one row: its sequence, its id, its output kind. */
static kiln_status check_row(const kiln_session *s, const kiln_batch_row *r, size_t i, const char *fn) {
    if (r->seq < 0 || r->seq >= s->cfg.n_seq)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: row %zu: unknown sequence %d (the session has 0..%d)", fn, i,
                         (int)r->seq, s->cfg.n_seq - 1);
    if (r->id < 0 || r->id >= s->model->hp.n_vocab)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: row %zu: id %d is outside the vocabulary 0..%d", fn, i, (int)r->id,
                         s->model->hp.n_vocab - 1);
    if (r->out < KILN_OUT_NONE || r->out > KILN_OUT_SAMPLE)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: row %zu: unknown output kind %d", fn, i, (int)r->out);
    if (r->out == KILN_OUT_SAMPLE && !r->sampler)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: row %zu: KILN_OUT_SAMPLE without a sampler", fn, i);
    return KILN_OK;
}

/* Checks every row and builds the backend's rows with their positions; returns the output count. */
static kiln_status plan(kiln_session *s, const kiln_batch_row *rows, size_t n, size_t out_cap, bool have_out,
                        int *n_out, const char *fn) {
    if (n == 0) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: empty batch", fn);
    if (n > (size_t)s->cfg.max_batch)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %zu rows exceed the session's max_batch %d", fn, n, s->cfg.max_batch);
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        KILN_TRY(check_row(s, &rows[i], i, fn));
        s->pending[rows[i].seq] = 0;
        if (rows[i].out != KILN_OUT_NONE && ++k > s->cfg.max_out)
            return kiln_fail(KILN_ERR_INVALID_ARG, "%s: row %zu: more than %d rows ask for an output (at most n_seq)", fn,
                             i, s->cfg.max_out);
    }
    if (k > 0 && ((size_t)k > out_cap || !have_out))
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: %d rows ask for an output but out holds %zu", fn, k,
                         have_out ? out_cap : 0);
    for (size_t i = 0; i < n; i++) {
        const int seq = rows[i].seq, pos = s->n_past[seq] + s->pending[seq]++;
        if (pos >= s->cfg.n_ctx)
            return kiln_fail(KILN_ERR_CONTEXT_FULL, "%s: row %zu: sequence %d would overflow its context (%d of %d "
                             "positions used, %d more rows in this call)", fn, i, seq, s->n_past[seq], s->cfg.n_ctx,
                             s->pending[seq]);
        const int bk = rows[i].out == KILN_OUT_NONE ? KILN_BK_OUT_NONE
                       : rows[i].out == KILN_OUT_ARGMAX ? KILN_BK_OUT_ARGMAX : KILN_BK_OUT_LOGITS;
        s->brows[i] = (kiln_backend_row){.seq = seq, .pos = pos, .id = rows[i].id, .out = bk, .spec = NULL};
    }
    *n_out = k;
    return KILN_OK;
}

/* The KILN_OUT_SAMPLE rows the backend samples on its device (ops->samples): each gets its sampler's spec
 * (the uniform draw taken now) and KILN_BK_OUT_SAMPLE; the others stay logits rows sampled on the host. */
static void prepare_samples(kiln_session *s, const kiln_batch_row *rows, size_t n) {
    for (size_t i = 0, k = 0; i < n; i++) {
        if (rows[i].out == KILN_OUT_NONE) continue;
        s->spec_smp[k] = NULL;
        if (rows[i].out == KILN_OUT_SAMPLE && s->ops->samples &&
            kiln_sampler_spec(rows[i].sampler, &s->specs[k], &s->spec_rng[k])) {
            s->spec_smp[k] = rows[i].sampler;
            s->brows[i].out = KILN_BK_OUT_SAMPLE;
            s->brows[i].spec = &s->specs[k];
        }
        k++;
    }
}

/* After a failed forward: every spec's draw is given back, the last first (rows may share a sampler). */
static void undo_samples(kiln_session *s, int n_out) {
    for (int k = n_out - 1; k >= 0; k--)
        if (s->spec_smp[k]) kiln_sampler_spec_undo(s->spec_smp[k], s->spec_rng[k]);
}

/* The host-sampled outputs of a call (s->host_k), drawn on the backend's threads. */
typedef struct host_draws {
    kiln_session *s;
    const kiln_batch_row *rows;
    kiln_batch_output *out;
} host_draws;

static void draw_range(void *ctx, int lo, int hi, int ith) {
    (void)ith;
    const host_draws *d = ctx;
    const size_t V = (size_t)d->s->model->hp.n_vocab;
    for (int q = lo; q < hi; q++) {
        kiln_batch_output *o = &d->out[d->s->host_k[q]];
        o->id = kiln_sample(d->rows[o->row].sampler, d->s->logits + (size_t)d->s->host_k[q] * V);
    }
}

/* Draws the nh host-sampled outputs: on the backend's pool when their samplers are distinct (each draw then
 * touches only its own sampler, so the ids are those of draws one after the other), else in row order on the
 * caller (rows that share a sampler draw in turn from its one RNG). */
static void draw_on_host(kiln_session *s, const kiln_batch_row *rows, kiln_batch_output *out, int nh) {
    host_draws d = {s, rows, out};
    kiln_pool *pool = nh > 1 && s->ops->pool ? s->ops->pool(s->state) : NULL;
    for (int a = 0; pool && a < nh; a++)
        for (int b = a + 1; pool && b < nh; b++)
            if (rows[out[s->host_k[a]].row].sampler == rows[out[s->host_k[b]].row].sampler) pool = NULL;
    const uint64_t t0 = kiln_now_ns();
    if (pool) kiln_pool_for(pool, nh, 1, draw_range, &d);
    else draw_range(&d, 0, nh, 0);
    s->host_sample_ns += kiln_now_ns() - t0;
}

/* After a successful forward: positions, counters and the outputs. */
static void commit(kiln_session *s, const kiln_batch_row *rows, size_t n, kiln_batch_output *out) {
    const int V = s->model->hp.n_vocab;
    int k = 0, nh = 0;
    for (size_t i = 0; i < n; i++) {
        const int seq = rows[i].seq;
        s->n_past[seq] = s->brows[i].pos + 1;
        if (s->pending[seq] == 1) s->n_decoded++;
        else s->n_prefilled++;
        if (rows[i].out == KILN_OUT_NONE) continue;
        const float *lg = s->logits + (size_t)k * V;
        out[k].row = (int32_t)i;
        const bool on_host = rows[i].out == KILN_OUT_SAMPLE && s->brows[i].out != KILN_BK_OUT_SAMPLE;
        if (on_host) s->host_k[nh++] = k;
        else out[k].id = s->argmax[k];
        out[k].logits = rows[i].out == KILN_OUT_LOGITS ? lg : NULL;
        k++;
    }
    if (nh) draw_on_host(s, rows, out, nh);
}

kiln_status kiln_session_run(kiln_session *s, const kiln_batch_row *rows, size_t n, kiln_batch_output *out,
                             size_t out_cap, size_t *n_out, const char *fn) {
    if (n_out) *n_out = 0;
    if (!rows && n) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: rows is NULL", fn);
    int k = 0;
    KILN_TRY(plan(s, rows, n, out_cap, out != NULL, &k, fn));
    kiln_backend_batch b = {.rows = s->brows, .n = (int)n, .n_out = k, .logits = s->logits, .argmax = s->argmax};
    prepare_samples(s, rows, n);
    kiln_status st = s->ops->forward(s->state, &b);
    if (st != KILN_OK) {
        undo_samples(s, k);
        return kiln_fail_prefix(st, "%s: ", fn);
    }
    commit(s, rows, n, out);
    if (n_out) *n_out = (size_t)k;
    return KILN_OK;
}

kiln_status kiln_batch(kiln_session *s, const kiln_batch_row *rows, size_t n, kiln_batch_output *out,
                       size_t out_cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!s) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_batch: session is NULL");
    SESSION_ENTER(s);
    kiln_status st = kiln_session_run(s, rows, n, out, out_cap, n_out, "kiln_batch");
    SESSION_LEAVE();
    return st;
}

static kiln_status check_seq(const kiln_session *s, int seq, const char *fn) {
    if (!s) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: session is NULL", fn);
    if (seq < 0 || seq >= s->cfg.n_seq)
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: unknown sequence %d (the session has 0..%d)", fn, seq,
                         s->cfg.n_seq - 1);
    return KILN_OK;
}

/* The chunks of a prefill; on failure the sequence's positions are put back as they were. */
static kiln_status prefill_chunks(kiln_session *s, int seq, const int32_t *ids, size_t n, const char *fn) {
    const int before = s->n_past[seq];
    const size_t mb = (size_t)s->cfg.max_batch;
    kiln_batch_output o;
    char name[96];
    for (size_t done = 0; done < n;) {
        const size_t c = n - done < mb ? n - done : mb;
        const bool last = done + c == n;
        snprintf(name, sizeof name, "%s (tokens %zu..%zu)", fn, done, done + c - 1);
        for (size_t i = 0; i < c; i++)
            s->chunk[i] = (kiln_batch_row){.seq = seq, .id = ids[done + i],
                                           .out = last && i + 1 == c ? KILN_OUT_LOGITS : KILN_OUT_NONE};
        kiln_status st = kiln_session_run(s, s->chunk, c, &o, 1, NULL, name);
        if (st != KILN_OK) {
            s->n_past[seq] = before; /* later positions are overwritten before attention reads them */
            return st;
        }
        done += c;
    }
    return KILN_OK;
}

static kiln_status seq_prefill(kiln_session *s, int seq, const int32_t *ids, size_t n, const float **logits,
                               const char *fn) {
    if (logits) *logits = NULL;
    KILN_TRY(check_seq(s, seq, fn));
    if (!ids && n) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: ids is NULL", fn);
    if (n == 0) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: no tokens", fn);
    if (n > (size_t)(s->cfg.n_ctx - s->n_past[seq]))
        return kiln_fail(KILN_ERR_CONTEXT_FULL, "%s: %zu tokens do not fit the context of sequence %d (%d of %d "
                         "positions used)", fn, n, seq, s->n_past[seq], s->cfg.n_ctx);
    SESSION_ENTER(s);
    const uint64_t pre = s->n_prefilled, dec = s->n_decoded;
    kiln_status st = prefill_chunks(s, seq, ids, n, fn);
    s->n_decoded = dec;          /* a one-token chunk is still prefill */
    s->n_prefilled = pre + (st == KILN_OK ? n : 0);
    SESSION_LEAVE();
    if (st == KILN_OK && logits) *logits = s->logits;
    return st;
}

kiln_status kiln_seq_prefill(kiln_session *s, int seq, const int32_t *ids, size_t n, const float **logits) {
    return seq_prefill(s, seq, ids, n, logits, "kiln_seq_prefill");
}

kiln_status kiln_seq_reset(kiln_session *s, int seq) {
    KILN_TRY(check_seq(s, seq, "kiln_seq_reset"));
    SESSION_ENTER(s);
    s->ops->reset(s->state, seq);
    s->n_past[seq] = 0;
    SESSION_LEAVE();
    return KILN_OK;
}

kiln_status kiln_seq_rewind(kiln_session *s, int seq, int n) {
    KILN_TRY(check_seq(s, seq, "kiln_seq_rewind"));
    if (n < 0 || n > s->n_past[seq])
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_seq_rewind: %d is outside 0..%d (sequence %d)", n, s->n_past[seq], seq);
    s->n_past[seq] = n; /* later positions are overwritten before attention reads them */
    return KILN_OK;
}

int kiln_seq_n_past(const kiln_session *s, int seq) {
    if (!s || seq < 0 || seq >= s->cfg.n_seq) return -1;
    return s->n_past[seq];
}

/* ---- the single-sequence calls: sequence 0 */

kiln_status kiln_prefill(kiln_session *s, const int32_t *ids, size_t n, const float **logits) {
    return seq_prefill(s, 0, ids, n, logits, "kiln_prefill");
}

/* One row of sequence 0 with output kind `out`. */
static kiln_status decode_one(kiln_session *s, int32_t id, int32_t out, kiln_batch_output *o, const char *fn) {
    if (!s) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: session is NULL", fn);
    const kiln_batch_row row = {.seq = 0, .id = id, .out = out};
    SESSION_ENTER(s);
    kiln_status st = kiln_session_run(s, &row, 1, o, 1, NULL, fn);
    SESSION_LEAVE();
    return st;
}

kiln_status kiln_decode(kiln_session *s, int32_t id, const float **logits) {
    if (logits) *logits = NULL;
    kiln_batch_output o;
    KILN_TRY(decode_one(s, id, KILN_OUT_LOGITS, &o, "kiln_decode"));
    if (logits) *logits = o.logits;
    return KILN_OK;
}

kiln_status kiln_decode_greedy(kiln_session *s, int32_t id, int32_t *next) {
    if (!next) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_decode_greedy: next is NULL");
    kiln_batch_output o;
    KILN_TRY(decode_one(s, id, KILN_OUT_ARGMAX, &o, "kiln_decode_greedy"));
    *next = o.id;
    return KILN_OK;
}

kiln_status kiln_session_rewind(kiln_session *s, int n) {
    if (!s) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_session_rewind: session is NULL");
    return kiln_seq_rewind(s, 0, n);
}

void kiln_session_reset(kiln_session *s) {
    if (s) kiln_seq_reset(s, 0);
}

int kiln_session_n_past(const kiln_session *s) { return s ? s->n_past[0] : -1; }
