/*
 * job.c — a generation job's lifetime (reference counted: the HTTP context, the streaming response and
 * the engine each hold one) and its output buffer. Buffers are sized once for the request where that is
 * known, so the engine appends without allocating in the common case.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/srv.h"

srv_job *job_new(srv *S, job_kind kind) {
    static atomic_ullong counter;
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->S = S;
    j->kind = kind;
    j->refs = 1;
    j->slot = -1;
    j->created = (long long)time(NULL);
    unsigned long long k = atomic_fetch_add(&counter, 1) + 1;
    snprintf(j->id, sizeof j->id, "%s-%llx%08llx", kind == JOB_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)j->created, k);
    return j;
}

void job_ref(srv_job *j) { j->refs++; }

void job_unref_locked(srv_job *j) {
    if (!j || --j->refs > 0) return;
    free(j->prompt);
    free(j->text);
    free(j->lps);
    free(j->stage);
    free(j);
}

bool job_append_text(srv_job *j, const char *s, size_t n) {
    if (!n) return true;
    if (j->text_len + n + 1 > j->text_cap) {
        size_t cap = j->text_cap * 2 + n + 256;
        char *t = realloc(j->text, cap);
        if (!t) return false;
        j->text = t;
        j->text_cap = cap;
    }
    memcpy(j->text + j->text_len, s, n);
    j->text_len += n;
    j->text[j->text_len] = '\0';
    return true;
}
