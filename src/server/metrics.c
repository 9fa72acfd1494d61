/*
 * metrics.c — the server's counters and histograms and their Prometheus text exposition (GET /metrics):
 * requests by route and status, prompt / cached / generated tokens, time to first token and per-token
 * latency histograms, queue length and busy slots.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "server/srv.h"

static const double ttft_bounds[SRV_TTFT_BUCKETS - 1] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                          0.25,  0.5,    1,     2.5,  5,     10};
static const double tpot_bounds[SRV_TPOT_BUCKETS - 1] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                          0.05,   0.1,   0.25,   0.5,   1,    2.5};
static const char *route_names[SRV_N_ROUTES] = {"chat_completions", "completions", "models", "health", "metrics",
                                                "tokenize", "detokenize", "page", "other"};
static const int statuses[] = {200, 400, 401, 404, 405, 413, 500, 503};
#define N_STATUS (int)(sizeof statuses / sizeof statuses[0])

void metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void metrics_destroy(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_reset(srv_metrics *m) {
    pthread_mutex_lock(&m->mu);
    const size_t at = offsetof(srv_metrics, requests);
    memset((char *)m + at, 0, sizeof *m - at);
    pthread_mutex_unlock(&m->mu);
}

void metrics_request(srv_metrics *m, int route, int status) {
    int k = N_STATUS - 1;
    for (int i = 0; i < N_STATUS; i++)
        if (statuses[i] == status) k = i;
    if (route < 0 || route >= SRV_N_ROUTES) route = SRV_ROUTE_OTHER;
    pthread_mutex_lock(&m->mu);
    m->requests[route][k]++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(srv_metrics *m, srv_hist *h, const double *bounds, int n_bounds, double v) {
    int b = 0;
    while (b < n_bounds && v > bounds[b]) b++;
    pthread_mutex_lock(&m->mu);
    h->counts[b]++;
    h->n++;
    h->sum += v;
    pthread_mutex_unlock(&m->mu);
}

void metrics_ttft(srv_metrics *m, double s) { observe(m, &m->ttft, ttft_bounds, SRV_TTFT_BUCKETS - 1, s); }
void metrics_tpot(srv_metrics *m, double s) { observe(m, &m->tpot, tpot_bounds, SRV_TPOT_BUCKETS - 1, s); }

void metrics_tokens(srv_metrics *m, int prompt, int cached, int generated) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)prompt;
    m->cached_tokens += (uint64_t)cached;
    m->generated_tokens += (uint64_t)generated;
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_cancel(srv_metrics *m, bool slow_reader) {
    pthread_mutex_lock(&m->mu);
    m->cancelled++;
    if (slow_reader) m->slow_readers++;
    pthread_mutex_unlock(&m->mu);
}

typedef struct out { char *s; size_t n, cap; bool oom; } out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = o->oom ? 0 : vsnprintf(o->s + o->n, o->cap - o->n, fmt, ap);
        va_end(ap);
        if (o->oom || k < 0) { o->oom = true; return; }
        if ((size_t)k < o->cap - o->n) { o->n += (size_t)k; return; }
        size_t cap = o->cap * 2 + (size_t)k + 1;
        char *s = realloc(o->s, cap);
        if (!s) { o->oom = true; return; }
        o->s = s;
        o->cap = cap;
    }
}

static void put_hist(out *o, const char *name, const char *help, const srv_hist *h, const double *bounds, int nb) {
    put(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < nb; b++) {
        cum += h->counts[b];
        put(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[b], (unsigned long long)cum);
    }
    put(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)h->n, name, h->sum,
        name, (unsigned long long)h->n);
}

static void put_counter(out *o, const char *name, const char *help, uint64_t v) {
    put(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

char *metrics_render(srv *S, size_t *len) {
    pthread_mutex_lock(&S->mu);
    int q = S->q_len, busy = S->slots_busy;
    pthread_mutex_unlock(&S->mu);
    srv_metrics *m = &S->metrics;
    out o = {0};
    pthread_mutex_lock(&m->mu);
    put(&o, "# HELP kiln_requests_total HTTP requests answered, by route and status.\n"
            "# TYPE kiln_requests_total counter\n");
    for (int r = 0; r < SRV_N_ROUTES; r++)
        for (int k = 0; k < N_STATUS; k++)
            if (m->requests[r][k])
                put(&o, "kiln_requests_total{route=\"%s\",status=\"%d\"} %llu\n", route_names[r], statuses[k],
                    (unsigned long long)m->requests[r][k]);
    put_counter(&o, "kiln_prompt_tokens_total", "Prompt tokens prefilled.", m->prompt_tokens);
    put_counter(&o, "kiln_prompt_tokens_cached_total", "Prompt tokens reused from a slot's cache.", m->cached_tokens);
    put_counter(&o, "kiln_generated_tokens_total", "Tokens generated.", m->generated_tokens);
    put_counter(&o, "kiln_requests_cancelled_total", "Generations cancelled (client gone, slow reader, shutdown).",
                m->cancelled);
    put_counter(&o, "kiln_slow_readers_total", "Streams cancelled because the client stopped reading.", m->slow_readers);
    put_hist(&o, "kiln_time_to_first_token_seconds", "From request arrival to its first token.", &m->ttft, ttft_bounds,
             SRV_TTFT_BUCKETS - 1);
    put_hist(&o, "kiln_time_per_output_token_seconds", "Between consecutive tokens of one request.", &m->tpot,
             tpot_bounds, SRV_TPOT_BUCKETS - 1);
    pthread_mutex_unlock(&m->mu);
    put(&o, "# HELP kiln_queue_length Requests waiting for a slot.\n# TYPE kiln_queue_length gauge\nkiln_queue_length %d\n", q);
    put(&o, "# HELP kiln_slots_busy Slots generating.\n# TYPE kiln_slots_busy gauge\nkiln_slots_busy %d\n", busy);
    put(&o, "# HELP kiln_slots_total Slots of the session.\n# TYPE kiln_slots_total gauge\nkiln_slots_total %d\n",
        S->n_seq);
    if (o.oom) { free(o.s); return NULL; }
    *len = o.n;
    return o.s;
}
