/*
 * slot.c — one generated token of a slot's job: sampler window, end-of-generation, streaming
 * detokenization, stop sequences, max_tokens and the context limit; and the end of a job (usage
 * counters, metrics, the connection resumed, the slot freed with its KV kept as the prompt cache).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "server/slot.h"

void slot_notify(srv *S, srv_job *j) {
    engine *E = S->eng;
    if (!j->suspended || !j->conn || E->n_resume >= E->resume_cap) return;
    j->suspended = false;
    E->resume[E->n_resume++] = j->conn;
}

/* Looks for a stop sequence in the held-back text. Commits the text before the earliest one and returns
 * true, or commits all that cannot begin a stop sequence (everything when final) and returns false. */
static bool scan_stops(slot *s, bool final) {
    srv_job *j = s->job;
    const gen_params *p = &j->p;
    size_t best = SIZE_MAX;
    for (int k = 0; k < p->n_stop; k++) {
        const char *hit = memmem(s->pend, s->pend_len, p->stop[k], p->stop_len[k]);
        if (hit && (size_t)(hit - s->pend) < best) best = (size_t)(hit - s->pend);
    }
    if (best != SIZE_MAX) {
        job_append_text(j, s->pend, best);
        s->pend_len = 0;
        return true;
    }
    size_t hold = 0;
    for (int k = 0; k < p->n_stop && !final; k++) {
        size_t max = p->stop_len[k] - 1 < s->pend_len ? p->stop_len[k] - 1 : s->pend_len;
        for (size_t n = max; n > hold; n--)
            if (!memcmp(s->pend + s->pend_len - n, p->stop[k], n)) { hold = n; break; }
    }
    job_append_text(j, s->pend, s->pend_len - hold);
    memmove(s->pend, s->pend + s->pend_len - hold, hold);
    s->pend_len = hold;
    return false;
}

/* Adds detokenized bytes; true when a stop sequence ended the job. */
static bool emit(slot *s, const char *buf, size_t n, bool final) {
    if (n > SLOT_PEND_CAP - s->pend_len) n = SLOT_PEND_CAP - s->pend_len; /* pieces are < 1 KiB: never */
    memcpy(s->pend + s->pend_len, buf, n);
    s->pend_len += n;
    return scan_stops(s, final);
}

void slot_finish(srv *S, slot *s, job_finish reason, const char *msg) {
    srv_job *j = s->job;
    if (reason == FIN_STOP || reason == FIN_LENGTH) {
        char buf[16];
        size_t n = kiln_detok_flush(&s->dt, buf, sizeof buf);
        if (emit(s, buf, n, true)) reason = FIN_STOP;
    }
    s->pend_len = 0;
    if (msg) snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
    j->done = true;
    j->finish = reason;
    if (!j->t_first) j->t_first = j->t_last = kiln_now_ns();
    metrics_tokens(&S->metrics, j->n_prompt - j->n_cached, j->n_cached, j->n_gen);
    if (reason == FIN_CANCELLED) metrics_count_cancel(&S->metrics, msg && strstr(msg, "did not read"));
    slot_notify(S, j);
    s->state = SLOT_FREE;
    s->job = NULL;
    s->blocked = false;
    s->blocked_since = 0;
    S->slots_busy--;
    job_unref_locked(j);
}

void slot_token(srv *S, slot *s, int32_t id, uint64_t now) {
    srv_job *j = s->job;
    if (!j->n_gen) {
        j->t_first = now;
        metrics_ttft(&S->metrics, (now - j->t_arrive) / 1e9);
        s->state = SLOT_DECODE;
    } else {
        metrics_tpot(&S->metrics, (now - s->t_prev) / 1e9);
    }
    s->t_prev = j->t_last = j->t_ping = now;
    j->n_gen++;
    kiln_sampler_accept(j->smp, id);
    if (kiln_token_is_eog(S->model, id)) { slot_finish(S, s, FIN_STOP, NULL); return; }
    if (j->p.logprobs && j->n_lp < j->lp_cap) j->lps[j->n_lp++] = s->lp;
    char buf[1024]; /* the longest vocabulary piece is about 1 KiB */
    size_t n = kiln_detok_push(&s->dt, id, buf, sizeof buf);
    if (emit(s, buf, n, false)) { slot_finish(S, s, FIN_STOP, NULL); return; }
    slot_notify(S, j);
    if ((j->p.max_tokens && j->n_gen >= j->p.max_tokens) || s->n_cache >= S->n_ctx) {
        slot_finish(S, s, FIN_LENGTH, NULL);
        return;
    }
    s->next = id;
}

void slot_logprobs(lp_entry *e, const float *logits, int n_vocab, int32_t id, int top_n) {
    float mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)(logits[i] - mx));
    const float lse = mx + (float)log(sum);
    e->id = id;
    e->lp = logits[id] - lse;
    e->n_top = 0;
    for (int i = 0; i < n_vocab && top_n > 0; i++) {
        float v = logits[i];
        if (e->n_top == top_n && v <= e->top[top_n - 1].lp) continue;
        int k = e->n_top < top_n ? e->n_top++ : top_n - 1;
        while (k > 0 && e->top[k - 1].lp < v) { e->top[k] = e->top[k - 1]; k--; }
        e->top[k] = (lp_top){i, v};
    }
    for (int k = 0; k < e->n_top; k++) e->top[k].lp -= lse;
}
