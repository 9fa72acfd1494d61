/*
 * http.c — the HTTP layer on libmicrohttpd: one internal epoll thread accepts connections and reads
 * bodies (with the --max-body limit: 413), routes complete requests (api.c), streams Server-Sent Events
 * from a job (a content reader that suspends the connection while the engine has nothing new and is
 * resumed by it), and learns from the completion callback that a client went away (its job is cancelled).
 * srv_run: listener first (/health says "loading"), model on the engine thread, SIGINT/SIGTERM to stop.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "server/http.h"

#define DISCARD_LIMIT (256u << 20) /* an oversize body is read and dropped up to this, then the connection closes */

void http_resume(struct MHD_Connection *c) { MHD_resume_connection(c); }

static enum MHD_Result queue(srv *S, req_ctx *c, struct MHD_Connection *conn, int status, struct MHD_Response *r) {
    if (!r) return MHD_NO;
    if (status == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    c->answered = true;
    MHD_destroy_response(r);
    metrics_request(&S->metrics, c->route, status);
    return rc;
}

enum MHD_Result http_text(srv *S, req_ctx *c, struct MHD_Connection *conn, int status, const char *ctype,
                          const char *text, size_t len, bool copy) {
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, (void *)text, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
    if (r) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    return queue(S, c, conn, status, r);
}

enum MHD_Result http_json(srv *S, req_ctx *c, struct MHD_Connection *conn, int status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(7)) : NULL;
    json_decref(j);
    if (!s) return http_text(S, c, conn, 500, "application/json",
                             "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}",
                             86, false);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(s); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    return queue(S, c, conn, status, r);
}

enum MHD_Result http_error(srv *S, req_ctx *c, struct MHD_Connection *conn, const srv_error *e) {
    return http_json(S, c, conn, e->status, respond_error_json(e));
}

/* ---------------------------------------------------------------- streaming */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_job *j = cls;
    srv *S = j->S;
    pthread_mutex_lock(&S->mu);
    if (j->stage_off == j->stage_len) {
        j->stage_off = j->stage_len = 0;
        if (!respond_stream_step(j)) { pthread_mutex_unlock(&S->mu); return MHD_CONTENT_READER_END_WITH_ERROR; }
    }
    if (j->stage_off == j->stage_len) {
        if (j->sent_final) { pthread_mutex_unlock(&S->mu); return MHD_CONTENT_READER_END_OF_STREAM; }
        j->suspended = true; /* the engine resumes it when there is more */
        MHD_suspend_connection(j->conn);
        pthread_mutex_unlock(&S->mu);
        return 0;
    }
    size_t n = j->stage_len - j->stage_off;
    if (n > max) n = max;
    memcpy(buf, j->stage + j->stage_off, n);
    j->stage_off += n;
    pthread_mutex_unlock(&S->mu);
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    srv_job *j = cls;
    srv *S = j->S;
    pthread_mutex_lock(&S->mu);
    job_unref_locked(j);
    pthread_mutex_unlock(&S->mu);
}

enum MHD_Result http_stream(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    srv_job *j = c->job;
    pthread_mutex_lock(&S->mu);
    job_ref(j); /* the response's reference, dropped by stream_free */
    pthread_mutex_unlock(&S->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, j, stream_free);
    if (!r) { stream_free(j); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return queue(S, c, conn, 200, r);
}

/* ---------------------------------------------------------------- requests */

static bool body_append(req_ctx *c, const char *data, size_t n, size_t limit) {
    if (c->too_big || c->len + n > limit) {
        c->too_big = true;
        free(c->body);
        c->body = NULL;
        c->len = c->cap = 0;
        c->discarded += n;
        return c->discarded <= DISCARD_LIMIT;
    }
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap * 2 + n + 1024;
        if (cap > limit + 1) cap = limit + 1;
        char *b = realloc(c->body, cap);
        if (!b) return false;
        c->body = b;
        c->cap = cap;
    }
    memcpy(c->body + c->len, data, n);
    c->len += n;
    c->body[c->len] = '\0';
    return true;
}

static enum MHD_Result too_large(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    srv_error e;
    srv_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
             "the request body is larger than the limit of %zu bytes (--max-body)", S->cfg.max_body);
    return http_error(S, c, conn, &e);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    srv *S = cls;
    req_ctx *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->t_arrive = kiln_now_ns();
        c->route = SRV_ROUTE_OTHER;
        *con_cls = c;
        atomic_fetch_add(&S->open_requests, 1);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *ex = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        if (cl && strtoull(cl, NULL, 10) > S->cfg.max_body) {
            c->too_big = true;
            /* a client waiting for 100-continue gets the 413 instead and never sends the body */
            if (ex && !strcasecmp(ex, "100-continue")) return too_large(S, c, conn);
        }
        return MHD_YES;
    }
    if (c->answered && !c->job) { *upload_size = 0; return MHD_YES; }
    if (*upload_size) {
        bool ok = body_append(c, upload_data, *upload_size, S->cfg.max_body);
        *upload_size = 0;
        return ok ? MHD_YES : MHD_NO;
    }
    if (c->job) return api_resumed(S, c, conn);
    if (c->too_big) return too_large(S, c, conn);
    return api_handle(S, c, conn, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)conn;
    (void)toe;
    srv *S = cls;
    req_ctx *c = *con_cls;
    if (!c) return;
    if (c->job) {
        pthread_mutex_lock(&S->mu);
        if (!c->job->done) c->job->cancelled = true;
        c->job->conn = NULL;
        job_unref_locked(c->job);
        pthread_cond_signal(&S->cv);
        pthread_mutex_unlock(&S->mu);
    }
    free(c->body);
    free(c);
    *con_cls = NULL;
    atomic_fetch_sub(&S->open_requests, 1);
}

/* ---------------------------------------------------------------- the daemon */

static struct MHD_Daemon *listen_on(srv *S) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    char port[16];
    snprintf(port, sizeof port, "%d", S->cfg.port);
    int rc = getaddrinfo(S->cfg.host, port, &hints, &ai);
    if (rc) {
        fprintf(stderr, "kiln serve: --host %s: %s\n", S->cfg.host, gai_strerror(rc));
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)S->cfg.port, NULL, NULL, on_request, S, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, S, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)S->cfg.timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, 1024u, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) fprintf(stderr, "kiln serve: cannot listen on %s:%d: %s\n", S->cfg.host, S->cfg.port, strerror(errno));
    return d;
}

static void model_id_from_path(srv *S) {
    const char *p = S->cfg.alias;
    if (!p || !*p) {
        p = strrchr(S->cfg.model_path, '/');
        p = p ? p + 1 : S->cfg.model_path;
    }
    snprintf(S->model_id, sizeof S->model_id, "%s", p);
}

/* Waits for SIGINT/SIGTERM (blocked in every thread) or for the model to fail; returns the exit code. */
static int wait_for_stop(srv *S, const sigset_t *set) {
    struct timespec tick = {0, 100 * 1000000};
    for (;;) {
        int sig = sigtimedwait(set, NULL, &tick);
        if (sig == SIGINT || sig == SIGTERM) {
            fprintf(stderr, "kiln serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
            return 0;
        }
        if (atomic_load(&S->state) == SRV_FAILED) return 1;
    }
}

static void shutdown_server(srv *S) {
    atomic_store(&S->state, SRV_STOPPING);
    MHD_socket ls = MHD_quiesce_daemon(S->daemon);
    engine_stop(S, S->cfg.shutdown_grace_s);
    /* the requests still open get their answers (the engine ended every job) */
    for (int i = 0; i < 100 && atomic_load(&S->open_requests) > 0; i++) usleep(20000);
    MHD_stop_daemon(S->daemon);
    if (ls != MHD_INVALID_SOCKET) close(ls);
}

int srv_run(const srv_config *cfg) {
    static srv S; /* one server per process: the signal set is process-wide anyway */
    memset(&S, 0, sizeof S);
    S.cfg = *cfg;
    model_id_from_path(&S);
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    metrics_init(&S.metrics);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread starts: they all inherit it */
    signal(SIGPIPE, SIG_IGN);
    int rc = 1;
    S.daemon = listen_on(&S);
    if (S.daemon) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(S.daemon, MHD_DAEMON_INFO_BIND_PORT);
        S.port = di ? di->port : cfg->port;
        fprintf(stderr, "kiln serve: listening on http://%s:%d (loading %s)\n", cfg->host, S.port, cfg->model_path);
        if (engine_start(&S)) rc = wait_for_stop(&S, &set);
        else fprintf(stderr, "kiln serve: cannot start the engine thread\n");
        shutdown_server(&S);
    }
    kiln_chat_template_close(S.tmpl);
    kiln_session_close(S.sess);
    kiln_model_close(S.model);
    metrics_destroy(&S.metrics);
    pthread_cond_destroy(&S.cv);
    pthread_mutex_destroy(&S.mu);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    if (rc == 0) fprintf(stderr, "kiln serve: stopped\n");
    return rc;
}
