/*
 * srv.h — the server's internal types: the server state, a generation job (one request), its parsed
 * parameters, and the functions the server's files call across each other.
 *
 * Threads: the HTTP thread (libmicrohttpd's internal epoll loop) parses requests, tokenizes prompts and
 * formats responses; the engine thread owns the session and runs the batch loop. They share the queue and
 * each job's output under srv.mu. The engine never blocks on a client: it appends text to a job and resumes
 * the job's suspended connection; a job's client going away sets job->cancelled.
 */
#ifndef KILN_SERVER_SRV_H
#define KILN_SERVER_SRV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kiln.h"
#include "base/timing.h"
#include "server/server.h"

struct MHD_Connection;
struct MHD_Daemon;

/* ---------------------------------------------------------------- errors (OpenAI's shape) */

typedef struct srv_error {
    int status;          /* HTTP status */
    const char *type;    /* "invalid_request_error", ... */
    const char *code;    /* NULL or "context_length_exceeded", ... */
    char param[96];      /* the field, "" when none */
    char msg[512];
} srv_error;

/* Fills e and returns false (so that parsers can `return srv_fail(...)`). param may be NULL. */
bool srv_fail(srv_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
#define SRV_BAD_REQUEST(e, param, ...) srv_fail((e), 400, "invalid_request_error", NULL, (param), __VA_ARGS__)

/* ---------------------------------------------------------------- request parameters */

#define SRV_MAX_STOP 8            /* stop sequences per request */
#define SRV_MAX_STOP_LEN 256      /* bytes per stop sequence */
#define SRV_MAX_TOP_LOGPROBS 20

typedef enum { JOB_CHAT = 0, JOB_COMPLETION = 1 } job_kind;
typedef enum { FIN_NONE = 0, FIN_STOP, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR } job_finish;

typedef struct gen_params {
    kiln_sampler_params sp;
    int max_tokens;              /* 0: until end of generation or the slot's context is full */
    bool stream, include_usage;
    bool logprobs;               /* chat: logprobs true; completions: logprobs >= 0 given */
    int top_logprobs;            /* 0..SRV_MAX_TOP_LOGPROBS */
    int n_stop;
    char stop[SRV_MAX_STOP][SRV_MAX_STOP_LEN + 1];
    size_t stop_len[SRV_MAX_STOP];
} gen_params;

/* Parses and checks the fields common to chat and text completions (sampling, max_tokens, stop, stream,
 * n, logprobs). Unknown fields are ignored, as OpenAI's clients send extras; a field of the wrong type or
 * range fails with a message naming it. */
bool req_parse_gen(const json_t *body, job_kind kind, gen_params *p, srv_error *e);
/* Checks a chat request's messages (string content or an array of text parts) and refuses what kiln does
 * not do (tools, image parts, non-text response formats). */
bool req_check_messages(const json_t *body, srv_error *e);
/* The text of messages[i].content: a string or the concatenated text parts (malloc'd). */
char *req_message_text(const json_t *msg, size_t *len);
/* Parses a JSON body (an object). */
json_t *req_load_body(const char *body, size_t len, srv_error *e);

/* ---------------------------------------------------------------- jobs */

typedef struct lp_top { int32_t id; float lp; } lp_top;
typedef struct lp_entry {
    int32_t id;
    float lp;
    int n_top;
    lp_top top[SRV_MAX_TOP_LOGPROBS];
} lp_entry;

typedef struct srv srv;

typedef struct srv_job {
    srv *S;
    job_kind kind;
    gen_params p;
    int32_t *prompt;             /* prompt ids (n_prompt >= 1) */
    int n_prompt;
    bool strip_space;            /* the prompt is only BOS: strip the SPM space of the first piece */
    kiln_sampler *smp;           /* its slot's sampler while it runs (not owned) */
    char id[48];
    long long created;           /* unix seconds */
    uint64_t t_arrive, t_queued, t_start, t_first, t_last, template_ns;

    /* ---- shared with the engine: under S->mu ---- */
    int refs;                    /* http context + streaming response + engine */
    struct MHD_Connection *conn; /* NULL once the request completed */
    bool cancelled;              /* the client went away, or the server is stopping */
    bool suspended;              /* the connection is suspended: the engine must resume it */
    bool keepalive;              /* the engine asks the stream for a comment line */
    bool done;
    job_finish finish;
    char *text;                  /* the committed output text (stop sequences removed) */
    size_t text_len, text_cap;
    lp_entry *lps;               /* one per generated token when logprobs */
    int n_lp, lp_cap;
    int n_gen, n_cached;         /* generated tokens; prompt tokens reused from the slot's cache */
    int slot;                    /* -1 until the job runs */
    uint64_t t_ping;             /* engine: when the stream last got output or a keep-alive */
    char errmsg[256];

    /* ---- the HTTP thread's own ---- */
    size_t sent;                 /* bytes of text already streamed */
    int sent_lp;
    bool sent_role, sent_final;
    char *stage;                 /* formatted SSE bytes not yet handed to libmicrohttpd */
    size_t stage_len, stage_off, stage_cap;

    struct srv_job *next;        /* queue link */
} srv_job;

/* A new job with one reference (the HTTP context's); NULL when out of memory. */
srv_job *job_new(srv *S, job_kind kind);
/* Takes one more reference (under S->mu). */
void job_ref(srv_job *j);
/* Drops a reference under S->mu; the last one frees the job. */
void job_unref_locked(srv_job *j);
/* Appends committed text (engine, under S->mu); false when out of memory. */
bool job_append_text(srv_job *j, const char *s, size_t n);

/* ---------------------------------------------------------------- metrics */

enum { SRV_ROUTE_CHAT, SRV_ROUTE_COMPLETION, SRV_ROUTE_MODELS, SRV_ROUTE_HEALTH, SRV_ROUTE_METRICS,
       SRV_ROUTE_TOKENIZE, SRV_ROUTE_DETOKENIZE, SRV_ROUTE_PAGE, SRV_ROUTE_OTHER, SRV_N_ROUTES };

#define SRV_TTFT_BUCKETS 14
#define SRV_TPOT_BUCKETS 13

typedef struct srv_hist {
    uint64_t counts[16];   /* per bucket (not cumulative), the last one +Inf */
    uint64_t n;
    double sum;
} srv_hist;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t requests[SRV_N_ROUTES][8];  /* by status: 200 400 401 404 405 413 500 503 (metrics.c) */
    uint64_t prompt_tokens, cached_tokens, generated_tokens, cancelled, slow_readers;
    srv_hist ttft, tpot;
} srv_metrics;

void metrics_init(srv_metrics *m);
void metrics_destroy(srv_metrics *m);
/* Zeroes every counter and histogram (after the warm-up). */
void metrics_reset(srv_metrics *m);
void metrics_request(srv_metrics *m, int route, int status);
void metrics_ttft(srv_metrics *m, double seconds);
void metrics_tpot(srv_metrics *m, double seconds);
void metrics_tokens(srv_metrics *m, int prompt, int cached, int generated);
void metrics_count_cancel(srv_metrics *m, bool slow_reader);
/* The Prometheus text exposition (malloc'd). */
char *metrics_render(srv *S, size_t *len);

/* ---------------------------------------------------------------- the server */

/* WARMING: the session is open and the server sends its own warm-up requests (warm.c); only those are served */
enum { SRV_LOADING = 0, SRV_READY = 1, SRV_FAILED = 2, SRV_STOPPING = 3, SRV_WARMING = 4 };

typedef struct engine engine;

struct srv {
    srv_config cfg;
    struct MHD_Daemon *daemon;
    int port;
    atomic_int state;
    char model_id[256];
    /* set by the engine before state becomes SRV_READY; read-only afterwards */
    kiln_model *model;
    kiln_session *sess;
    kiln_chat_template *tmpl;    /* NULL when the model has no template and none was given */
    char tmpl_error[512];
    kiln_model_info mi;
    int n_ctx, n_seq;

    pthread_mutex_t mu;          /* the queue, each job's shared fields, the slot counters */
    pthread_cond_t cv;           /* wakes the engine */
    srv_job *q_head, *q_tail;
    int q_len, slots_busy;
    bool stop_engine;            /* the engine finishes what runs, then exits */
    bool cancel_all;             /* the engine cancels everything at its next step */
    atomic_int open_requests;    /* HTTP requests between their start and completion */
    engine *eng;
    pthread_t engine_thread;
    bool engine_started;
    srv_metrics metrics;
    char warm_token[40];         /* the X-Kiln-Warm header of the warm-up requests ("" outside the warm-up) */
    pthread_t warm_thread;       /* sends them (engine.c) */
    bool warm_started;
};

/* Warm-up (warm.c): the server's requests to itself before it reports ready. */
void warm_run(srv *S);
bool warm_is_warm_request(const srv *S, struct MHD_Connection *conn);

/* Engine (engine.c): the thread that opens the session and runs the batch loop. */
bool engine_start(srv *S);
/* Stops the engine thread: running jobs finish (or are cancelled after grace_s), then it exits. */
void engine_stop(srv *S, int grace_s);
/* Queues a job (taking the engine's reference): 0, or 1 when the queue is full, 2 when the server is not
 * ready or stopping (both 503). */
int engine_submit(srv *S, srv_job *j);

/* Resumes a suspended connection (any thread); the caller held S->mu when it cleared j->suspended. */
void http_resume(struct MHD_Connection *c);

/* Prompt (prompt.c): chat messages through the template, or a completion prompt, to ids. */
bool prompt_chat(srv *S, const json_t *body, srv_job *j, srv_error *e);
bool prompt_completion(srv *S, const json_t *body, srv_job *j, srv_error *e);

/* Response bodies (respond.c). */
json_t *respond_error_json(const srv_error *e);
json_t *respond_completion(const srv_job *j);          /* the whole non-streamed response */
/* Appends the SSE events the stream owes (role, new text and logprobs, final chunk, [DONE]) to j->stage. */
bool respond_stream_step(srv_job *j);
json_t *respond_usage(const srv_job *j);
json_t *respond_timings(const srv_job *j);
/* A JSON string from bytes that may hold invalid UTF-8 (replaced by U+FFFD). */
json_t *respond_text(const char *s, size_t n);

/* The chat page (page.c). */
extern const char srv_page_html[];

#endif
