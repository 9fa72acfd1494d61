/*
 * slot.h — the engine's slots (one per session sequence) and what happens to a generated token: the
 * streaming detokenizer, stop sequences (text that might begin one is held back), logprobs, and the end
 * of a job. Engine-internal: everything here runs on the engine thread, the marked parts under S->mu.
 */
#ifndef KILN_SERVER_SLOT_H
#define KILN_SERVER_SLOT_H

#include "server/srv.h"

#define SLOT_PEND_CAP (2048 + 2 * SRV_MAX_STOP_LEN)

typedef enum { SLOT_FREE = 0, SLOT_PREFILL, SLOT_DECODE } slot_state;

typedef struct slot {
    int idx;
    slot_state state;
    srv_job *job;
    int32_t *cache;        /* the tokens this sequence's KV holds (n_ctx) */
    kiln_sampler *smp;     /* opened at startup; each job reconfigures it */
    int n_cache;
    int n_fed;             /* prompt tokens in the KV */
    int chunk;             /* rows this slot has in the current batch */
    int32_t next;          /* the token to feed at the next step */
    int mode;              /* KILN_OUT_ARGMAX, _SAMPLE or _LOGITS */
    bool blocked;          /* its stream buffer is full: no row this step */
    uint64_t blocked_since, t_prev, last_use;
    kiln_detok dt;
    char pend[SLOT_PEND_CAP];
    size_t pend_len;
    lp_entry lp;           /* this step's logprobs */
} slot;

struct engine {
    slot *slots;
    kiln_batch_row *rows;
    kiln_batch_output *outs;
    int *out_slot;         /* the slot of each output */
    int max_batch;
    uint64_t tick, t_keepalive;
    struct MHD_Connection **resume;
    int n_resume, resume_cap;
};

/* Marks j's connection to be resumed after the lock is dropped (under S->mu). */
void slot_notify(srv *S, srv_job *j);
/* A generated token of the slot's job (under S->mu): accepted, detokenized, checked for the end. */
void slot_token(srv *S, slot *s, int32_t id, uint64_t now);
/* Ends the slot's job with reason (under S->mu); msg for cancellations and errors. The slot is free after. */
void slot_finish(srv *S, slot *s, job_finish reason, const char *msg);
/* Log-probabilities of id and the top n ids under logits (no lock needed). */
void slot_logprobs(lp_entry *e, const float *logits, int n_vocab, int32_t id, int top_n);

#endif
