/*
 * engine.c — the engine thread: opens the model and the session (all slots, graphs and the warm pass),
 * then runs the batch loop. Each step: drop what was cancelled, give waiting jobs the free slot whose
 * cached tokens share the longest prefix with their prompt (rewound to it, so only the rest is
 * prefilled), then one kiln_batch over every running slot: one decode row per generating slot and
 * prompt rows of the prefilling ones (continuous batching), and hand the tokens to the jobs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "server/slot.h"

#define STREAM_CAP (64 * 1024)              /* unread stream bytes past which a slot pauses */
#define KEEPALIVE_NS (5ull * 1000000000ull) /* a stream without output gets a comment line this often */

static int pick_mode(const srv_job *j) {
    const kiln_sampler_params *sp = &j->p.sp;
    if (j->p.logprobs) return KILN_OUT_LOGITS;
    if (sp->temperature <= 0 && sp->repeat_penalty == 1.0f && sp->presence_penalty == 0 && sp->frequency_penalty == 0)
        return KILN_OUT_ARGMAX;
    return KILN_OUT_SAMPLE;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The free slot with the longest common prefix; ties go to the least recently used. */
static slot *best_slot(srv *S, const srv_job *j, int *prefix) {
    slot *best = NULL;
    int best_n = -1;
    for (int i = 0; i < S->n_seq; i++) {
        slot *s = &S->eng->slots[i];
        if (s->state != SLOT_FREE) continue;
        int n = common_prefix(s->cache, s->n_cache, j->prompt, j->n_prompt);
        if (n > best_n || (n == best_n && s->last_use < best->last_use)) { best = s; best_n = n; }
    }
    *prefix = best_n;
    return best;
}

/* Puts waiting jobs into free slots (under S->mu). */
static void assign(srv *S, uint64_t now) {
    engine *E = S->eng;
    while (S->q_head && S->slots_busy < S->n_seq) {
        srv_job *j = S->q_head;
        S->q_head = j->next;
        if (!S->q_head) S->q_tail = NULL;
        S->q_len--;
        int reuse;
        slot *s = best_slot(S, j, &reuse);
        if (reuse >= j->n_prompt) reuse = j->n_prompt - 1; /* the last prompt token gives the logits */
        if (kiln_seq_rewind(S->sess, s->idx, reuse) != KILN_OK) {
            kiln_seq_reset(S->sess, s->idx);
            reuse = 0;
        }
        s->n_cache = s->n_fed = reuse;
        /* the slot's sampler (opened at startup) takes the request's parameters; its window starts with the
         * prompt, as `kiln run` does; the parameters were checked when the request came in */
        const kiln_status rst = kiln_sampler_reconfigure(s->smp, &j->p.sp);
        KILN_ASSERT(rst == KILN_OK);
        for (int i = 0; i < j->n_prompt; i++) kiln_sampler_accept(s->smp, j->prompt[i]);
        j->smp = s->smp;
        s->job = j;
        s->state = SLOT_PREFILL;
        s->mode = pick_mode(j);
        s->last_use = ++E->tick;
        s->pend_len = 0;
        kiln_detok_init(&s->dt, S->model, j->strip_space);
        j->slot = s->idx;
        j->n_cached = reuse;
        j->t_start = j->t_ping = now;
        S->slots_busy++;
    }
}

/* A queued job that will not run (cancelled or the server stopping), under S->mu. */
static void drop_queued(srv *S, srv_job *j, const char *msg) {
    j->done = true;
    j->finish = FIN_CANCELLED;
    snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
    slot_notify(S, j);
    job_unref_locked(j);
}

/* Cancellations, shutdown, slow readers and keep-alives (under S->mu). */
static void sweep(srv *S, uint64_t now) {
    engine *E = S->eng;
    srv_job **pp = &S->q_head, *prev = NULL;
    while (*pp) {
        srv_job *j = *pp;
        if (j->cancelled || S->stop_engine) {
            *pp = j->next;
            S->q_len--;
            drop_queued(S, j, S->stop_engine ? "the server is shutting down" : "the client went away");
            continue;
        }
        prev = j;
        pp = &j->next;
    }
    S->q_tail = prev;
    for (int i = 0; i < S->n_seq; i++) {
        slot *s = &E->slots[i];
        srv_job *j = s->job;
        if (!j) continue;
        if (j->cancelled || S->cancel_all) {
            slot_finish(S, s, FIN_CANCELLED, S->cancel_all ? "the server is shutting down" : "the client went away");
            continue;
        }
        s->blocked = j->p.stream && s->state == SLOT_DECODE && j->text_len - j->sent > STREAM_CAP;
        if (!s->blocked) s->blocked_since = 0;
        else if (!s->blocked_since) s->blocked_since = now;
        else if (now - s->blocked_since > (uint64_t)S->cfg.timeout_s * 1000000000ull) {
            char msg[128];
            snprintf(msg, sizeof msg, "the client did not read its stream for %d s", S->cfg.timeout_s);
            slot_finish(S, s, FIN_CANCELLED, msg);
        }
    }
    if (now - E->t_keepalive < 1000000000ull) return;
    E->t_keepalive = now;
    for (srv_job *j = S->q_head; j; j = j->next)
        if (j->p.stream && now - j->t_ping > KEEPALIVE_NS) { j->t_ping = now; j->keepalive = true; slot_notify(S, j); }
    for (int i = 0; i < S->n_seq; i++) {
        srv_job *j = E->slots[i].job;
        if (j && j->p.stream && now - j->t_ping > KEEPALIVE_NS) { j->t_ping = now; j->keepalive = true; slot_notify(S, j); }
    }
}

/* The rows of one step: a decode row per generating slot, then prompt rows up to max_batch. */
static size_t build_rows(srv *S, size_t *n_out) {
    engine *E = S->eng;
    size_t n = 0, no = 0;
    for (int i = 0; i < S->n_seq; i++) {
        slot *s = &E->slots[i];
        s->chunk = 0;
        if (s->state != SLOT_DECODE || s->blocked) continue;
        E->rows[n++] = (kiln_batch_row){s->idx, s->next, s->mode, s->job->smp};
        E->out_slot[no++] = i;
        s->chunk = 1;
    }
    for (int i = 0; i < S->n_seq && n < (size_t)E->max_batch; i++) {
        slot *s = &E->slots[i];
        if (s->state != SLOT_PREFILL) continue;
        const srv_job *j = s->job;
        int k = j->n_prompt - s->n_fed, room = E->max_batch - (int)n;
        if (k > room) k = room;
        for (int t = 0; t < k; t++) {
            bool last = s->n_fed + t == j->n_prompt - 1;
            E->rows[n++] = (kiln_batch_row){s->idx, j->prompt[s->n_fed + t], last ? s->mode : KILN_OUT_NONE, j->smp};
            if (last) E->out_slot[no++] = i;
        }
        s->chunk = k;
    }
    *n_out = no;
    return n;
}

/* After a successful step (under S->mu): the KV of each slot grew by its rows; then the tokens. */
static void take_outputs(srv *S, size_t n_out, uint64_t now) {
    engine *E = S->eng;
    for (int i = 0; i < S->n_seq; i++) {
        slot *s = &E->slots[i];
        if (!s->chunk || !s->job) continue;
        if (s->state == SLOT_DECODE) s->cache[s->n_cache++] = s->next;
        else {
            memcpy(s->cache + s->n_cache, s->job->prompt + s->n_fed, (size_t)s->chunk * sizeof *s->cache);
            s->n_cache += s->chunk;
            s->n_fed += s->chunk;
        }
    }
    for (size_t k = 0; k < n_out; k++) {
        slot *s = &E->slots[E->out_slot[k]];
        if (s->job) slot_token(S, s, E->outs[k].id, now);
    }
}

/* Outside the lock: the ids of LOGITS rows (sampled here) and their logprobs. */
static void sample_logits(srv *S, size_t n_out) {
    engine *E = S->eng;
    for (size_t k = 0; k < n_out; k++) {
        slot *s = &E->slots[E->out_slot[k]];
        if (s->mode != KILN_OUT_LOGITS || !E->outs[k].logits) continue;
        E->outs[k].id = kiln_sample(s->job->smp, E->outs[k].logits);
        slot_logprobs(&s->lp, E->outs[k].logits, S->mi.n_vocab, E->outs[k].id, s->job->p.top_logprobs);
    }
}

static void resume_all(srv *S) {
    engine *E = S->eng;
    for (int i = 0; i < E->n_resume; i++) http_resume(E->resume[i]);
    E->n_resume = 0;
}

static bool any_running(const srv *S) { return S->slots_busy > 0; }

static void engine_loop(srv *S) {
    engine *E = S->eng;
    for (;;) {
        pthread_mutex_lock(&S->mu);
        uint64_t now = kiln_now_ns();
        sweep(S, now);
        assign(S, now);
        bool idle = !any_running(S);
        if (idle && S->stop_engine) { pthread_mutex_unlock(&S->mu); resume_all(S); break; }
        if (idle && E->n_resume == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&S->cv, &S->mu, &ts);
            pthread_mutex_unlock(&S->mu);
            continue;
        }
        size_t n_out = 0, n = idle ? 0 : build_rows(S, &n_out);
        pthread_mutex_unlock(&S->mu);
        resume_all(S);
        if (n == 0) { if (!idle) usleep(2000); continue; } /* every slot waits for a slow reader */
        kiln_status st = kiln_batch(S->sess, E->rows, n, E->outs, (size_t)S->n_seq, NULL);
        char err[256] = "";
        if (st != KILN_OK) snprintf(err, sizeof err, "the forward pass failed: %s", kiln_last_error());
        else sample_logits(S, n_out);
        pthread_mutex_lock(&S->mu);
        if (st == KILN_OK) take_outputs(S, n_out, kiln_now_ns());
        else
            for (int i = 0; i < S->n_seq; i++)
                if (E->slots[i].chunk && E->slots[i].job) slot_finish(S, &E->slots[i], FIN_ERROR, err);
        pthread_mutex_unlock(&S->mu);
        resume_all(S);
    }
}

static bool engine_alloc(srv *S, int max_batch) {
    engine *E = calloc(1, sizeof *E);
    if (!E) return false;
    S->eng = E;
    E->max_batch = max_batch;
    E->slots = calloc((size_t)S->n_seq, sizeof *E->slots);
    E->rows = calloc((size_t)max_batch, sizeof *E->rows);
    E->outs = calloc((size_t)S->n_seq, sizeof *E->outs);
    E->out_slot = calloc((size_t)S->n_seq, sizeof *E->out_slot);
    E->resume_cap = S->n_seq + S->cfg.max_queue + 1;
    E->resume = calloc((size_t)E->resume_cap, sizeof *E->resume);
    if (!E->slots || !E->rows || !E->outs || !E->out_slot || !E->resume) return false;
    for (int i = 0; i < S->n_seq; i++) {
        E->slots[i].idx = i;
        E->slots[i].cache = calloc((size_t)S->n_ctx, sizeof(int32_t));
        kiln_sampler_params sp = kiln_sampler_defaults();
        sp.repeat_last_n = S->n_ctx; /* the longest window a request may ask for */
        if (!E->slots[i].cache || kiln_sampler_open(&sp, S->mi.n_vocab, &E->slots[i].smp) != KILN_OK) return false;
    }
    return true;
}

static void engine_free(srv *S) {
    engine *E = S->eng;
    if (!E) return;
    for (int i = 0; E->slots && i < S->n_seq; i++) {
        free(E->slots[i].cache);
        kiln_sampler_close(E->slots[i].smp);
    }
    free(E->slots);
    free(E->rows);
    free(E->outs);
    free(E->out_slot);
    free(E->resume);
    free(E);
    S->eng = NULL;
}

/* Opens model, session and template; prints why it failed. */
static bool engine_open(srv *S) {
    const srv_config *c = &S->cfg;
    uint64_t t0 = kiln_now_ns();
    if (kiln_model_open(c->model_path, &S->model) != KILN_OK) {
        fprintf(stderr, "kiln serve: %s\n", kiln_last_error());
        return false;
    }
    kiln_model_get_info(S->model, &S->mi);
    int n_ctx = c->n_ctx ? c->n_ctx : (S->mi.n_ctx_train > 0 && S->mi.n_ctx_train < 4096 ? S->mi.n_ctx_train : 4096);
    int max_batch = n_ctx < 512 ? n_ctx : 512;
    kiln_session_options so = {.n_ctx = n_ctx, .n_threads = c->n_threads, .max_batch = max_batch,
                               .n_seq = c->parallel, .device = c->device};
    if (kiln_session_open(S->model, &so, &S->sess) != KILN_OK) {
        fprintf(stderr, "kiln serve: %s\n", kiln_last_error());
        return false;
    }
    S->n_ctx = kiln_session_n_ctx(S->sess);
    S->n_seq = kiln_session_n_seq(S->sess);
    if (kiln_chat_template_open(S->model, c->chat_template, &S->tmpl) != KILN_OK) {
        if (c->chat_template) {
            fprintf(stderr, "kiln serve: chat template '%s': %s\n", c->chat_template, kiln_last_error());
            return false;
        }
        snprintf(S->tmpl_error, sizeof S->tmpl_error, "%s", kiln_last_error());
        fprintf(stderr, "kiln serve: warning: no chat template (%s); /v1/chat/completions will refuse requests\n",
                S->tmpl_error);
    }
    if (!engine_alloc(S, max_batch)) {
        fprintf(stderr, "kiln serve: out of memory for %d slots\n", S->n_seq);
        return false;
    }
    if (c->on_open) c->on_open(S->sess, (unsigned long long)(kiln_now_ns() - t0), c->ud);
    return true;
}

/* The warm-up requests run on their own thread while the engine loop serves them, then the server is ready. */
static void *warm_main(void *arg) {
    srv *S = arg;
    warm_run(S);
    fprintf(stderr, "kiln serve: ready on http://%s:%d — %s, %d slots of %d positions, %s\n", S->cfg.host, S->port,
            S->model_id, S->n_seq, S->n_ctx, kiln_session_backend(S->sess));
    int expected = SRV_WARMING;
    atomic_compare_exchange_strong(&S->state, &expected, SRV_READY);
    return NULL;
}

static void *engine_main(void *arg) {
    srv *S = arg;
    if (!engine_open(S)) {
        atomic_store(&S->state, SRV_FAILED);
        return NULL;
    }
    int expected = SRV_LOADING;
    S->warm_started = atomic_compare_exchange_strong(&S->state, &expected, SRV_WARMING) &&
                      pthread_create(&S->warm_thread, NULL, warm_main, S) == 0;
    if (!S->warm_started) {
        expected = SRV_WARMING;
        atomic_compare_exchange_strong(&S->state, &expected, SRV_READY);
    }
    engine_loop(S);
    return NULL;
}

bool engine_start(srv *S) {
    if (pthread_create(&S->engine_thread, NULL, engine_main, S)) return false;
    S->engine_started = true;
    return true;
}

void engine_stop(srv *S, int grace_s) {
    if (!S->engine_started) return;
    pthread_mutex_lock(&S->mu);
    S->stop_engine = true;
    pthread_cond_signal(&S->cv);
    pthread_mutex_unlock(&S->mu);
    uint64_t until = kiln_now_ns() + (uint64_t)grace_s * 1000000000ull;
    for (;;) {
        pthread_mutex_lock(&S->mu);
        bool busy = S->slots_busy > 0;
        if (busy && kiln_now_ns() > until) S->cancel_all = true;
        pthread_cond_signal(&S->cv);
        pthread_mutex_unlock(&S->mu);
        if (!busy) break;
        usleep(20000);
    }
    pthread_join(S->engine_thread, NULL);
    S->engine_started = false;
    if (S->warm_started) pthread_join(S->warm_thread, NULL); /* its requests were answered or refused */
    S->warm_started = false;
    engine_free(S);
}

int engine_submit(srv *S, srv_job *j) {
    pthread_mutex_lock(&S->mu);
    int rc = 0;
    const int st = atomic_load(&S->state);
    if ((st != SRV_READY && st != SRV_WARMING) || S->stop_engine) rc = 2;
    else if (S->q_len + S->slots_busy >= S->cfg.max_queue + S->n_seq) rc = 1; /* no free slot, queue full */
    else {
        job_ref(j);
        j->t_queued = kiln_now_ns();
        j->next = NULL;
        if (S->q_tail) S->q_tail->next = j;
        else S->q_head = j;
        S->q_tail = j;
        S->q_len++;
        pthread_cond_signal(&S->cv);
    }
    pthread_mutex_unlock(&S->mu);
    return rc;
}
