/*
 * api.c — the routes: /v1/chat/completions, /v1/completions (and their unversioned aliases),
 * /v1/models, /health, /metrics, /tokenize, /detokenize and the chat page at /. Checks method (405),
 * route (404), API key (401) and readiness (503) before a handler runs; a generation request is parsed,
 * tokenized and checked against the slot's context here, then queued for the engine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/http.h"

typedef enum MHD_Result (*handler)(srv *S, req_ctx *c, struct MHD_Connection *conn);

static enum MHD_Result fail(srv *S, req_ctx *c, struct MHD_Connection *conn, int status, const char *type,
                            const char *code, const char *msg) {
    srv_error e;
    srv_fail(&e, status, type, code, NULL, "%s", msg);
    return http_error(S, c, conn, &e);
}

/* ---------------------------------------------------------------- simple routes */

static enum MHD_Result h_page(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    return http_text(S, c, conn, 200, "text/html; charset=utf-8", srv_page_html, strlen(srv_page_html), false);
}

static enum MHD_Result h_health(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    int st = atomic_load(&S->state);
    const char *name = st == SRV_READY                          ? "ok"
                       : st == SRV_LOADING || st == SRV_WARMING ? "loading"
                       : st == SRV_FAILED                       ? "error"
                                                                : "stopping";
    return http_json(S, c, conn, st == SRV_READY ? 200 : 503, json_pack("{s:s}", "status", name));
}

static enum MHD_Result h_models(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    json_t *m = json_pack("{s:s,s:s,s:I,s:s}", "id", S->model_id, "object", "model", "created", (json_int_t)0,
                          "owned_by", "kiln");
    if (m && atomic_load(&S->state) == SRV_READY)
        json_object_set_new(m, "meta", json_pack("{s:i,s:i,s:i,s:I,s:s}", "n_ctx", S->n_ctx, "n_slots", S->n_seq,
                                                 "n_vocab", S->mi.n_vocab, "n_params", (json_int_t)S->mi.n_params,
                                                 "arch", S->mi.arch));
    return http_json(S, c, conn, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", m));
}

static enum MHD_Result h_metrics(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    size_t len;
    char *text = metrics_render(S, &len);
    if (!text) return fail(S, c, conn, 500, "server_error", NULL, "out of memory");
    enum MHD_Result rc = http_text(S, c, conn, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, true);
    free(text);
    return rc;
}

static enum MHD_Result h_tokenize(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    srv_error e;
    json_t *body = req_load_body(c->body, c->len, &e);
    if (!body) return http_error(S, c, conn, &e);
    const json_t *content = json_object_get(body, "content"), *as = json_object_get(body, "add_special"),
                 *ps = json_object_get(body, "parse_special"), *wp = json_object_get(body, "with_pieces");
    if (!json_is_string(content)) SRV_BAD_REQUEST(&e, "content", "content must be a string");
    else if ((as && !json_is_boolean(as)) || (ps && !json_is_boolean(ps)) || (wp && !json_is_boolean(wp)))
        SRV_BAD_REQUEST(&e, as && !json_is_boolean(as) ? "add_special" : ps && !json_is_boolean(ps) ? "parse_special"
                                                                                                 : "with_pieces",
                        "add_special, parse_special and with_pieces must be true or false");
    else e.status = 0;
    if (e.status) { json_decref(body); return http_error(S, c, conn, &e); }
    int flags = (json_is_true(as) ? KILN_TOK_ADD_BOS : 0) | (ps && json_is_false(ps) ? 0 : KILN_TOK_PARSE_SPECIAL);
    size_t len = json_string_length(content), n = 0, cap = len + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    kiln_status st = ids ? kiln_tokenize(S->model, json_string_value(content), len, flags, ids, cap, &n) : KILN_ERR_NOMEM;
    json_t *arr = json_array();
    for (size_t i = 0; st == KILN_OK && i < n; i++) {
        if (!json_is_true(wp)) { json_array_append_new(arr, json_integer(ids[i])); continue; }
        char buf[1024];
        size_t pn = 0;
        if (kiln_token_piece(S->model, ids[i], buf, sizeof buf, &pn) != KILN_OK || pn > sizeof buf) pn = 0;
        json_array_append_new(arr, json_pack("{s:i,s:o}", "id", ids[i], "piece", respond_text(buf, pn)));
    }
    free(ids);
    json_decref(body);
    if (st != KILN_OK) {
        json_decref(arr);
        SRV_BAD_REQUEST(&e, "content", "content: %s", kiln_last_error());
        return http_error(S, c, conn, &e);
    }
    return http_json(S, c, conn, 200, json_pack("{s:o}", "tokens", arr));
}

static enum MHD_Result h_detokenize(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    srv_error e;
    json_t *body = req_load_body(c->body, c->len, &e);
    if (!body) return http_error(S, c, conn, &e);
    const json_t *toks = json_object_get(body, "tokens");
    e.status = 0;
    if (!json_is_array(toks)) SRV_BAD_REQUEST(&e, "tokens", "tokens must be an array of token ids");
    for (size_t i = 0; !e.status && i < json_array_size(toks); i++) {
        const json_t *v = json_array_get(toks, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= S->mi.n_vocab)
            SRV_BAD_REQUEST(&e, "tokens", "tokens[%zu] must be a token id in 0..%d", i, S->mi.n_vocab - 1);
    }
    if (e.status) { json_decref(body); return http_error(S, c, conn, &e); }
    kiln_detok d;
    kiln_detok_init(&d, S->model, false);
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; i <= json_array_size(toks); i++) {
        char buf[1024];
        size_t n = i < json_array_size(toks)
                       ? kiln_detok_push(&d, (int32_t)json_integer_value(json_array_get(toks, i)), buf, sizeof buf)
                       : kiln_detok_flush(&d, buf, sizeof buf);
        if (len + n + 1 > cap) {
            char *t = realloc(text, cap = cap * 2 + n + 64);
            if (!t) { free(text); json_decref(body); return fail(S, c, conn, 500, "server_error", NULL, "out of memory"); }
            text = t;
        }
        memcpy(text + len, buf, n);
        len += n;
    }
    json_t *r = json_pack("{s:o}", "content", respond_text(text ? text : "", len));
    free(text);
    json_decref(body);
    return http_json(S, c, conn, 200, r);
}

/* ---------------------------------------------------------------- generation */

/* The context check, the sampling parameters (the slot's sampler takes them in the engine) and buffers. */
static bool job_prepare(srv *S, srv_job *j, srv_error *e) {
    int want = j->n_prompt + (j->p.max_tokens ? j->p.max_tokens : 1);
    if (want > S->n_ctx)
        return srv_fail(e, 400, "invalid_request_error", "context_length_exceeded", j->kind == JOB_CHAT ? "messages" : "prompt",
                        "this server's context is %d tokens per slot, but the request needs %d (%d in the prompt, "
                        "%d to generate)", S->n_ctx, want, j->n_prompt, want - j->n_prompt);
    if (kiln_sampler_check(&j->p.sp, S->mi.n_vocab) != KILN_OK)
        return SRV_BAD_REQUEST(e, NULL, "%s", kiln_last_error());
    if (j->p.sp.repeat_last_n > S->n_ctx) /* the slots' samplers are opened with a window of n_ctx */
        return SRV_BAD_REQUEST(e, "repeat_last_n", "repeat_last_n %d is longer than a slot's context of %d tokens",
                               j->p.sp.repeat_last_n, S->n_ctx);
    int max_gen = j->p.max_tokens ? j->p.max_tokens : S->n_ctx - j->n_prompt;
    size_t cap = (size_t)max_gen * 8 + 64;
    j->text_cap = cap < (256u << 10) ? cap : (256u << 10);
    j->text = malloc(j->text_cap);
    if (j->p.logprobs) {
        j->lp_cap = max_gen;
        j->lps = malloc((size_t)max_gen * sizeof *j->lps);
    }
    if (!j->text || (j->p.logprobs && !j->lps))
        return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory for the output of %d tokens", max_gen);
    return true;
}

static void drop_job(srv *S, req_ctx *c) {
    pthread_mutex_lock(&S->mu);
    job_unref_locked(c->job);
    pthread_mutex_unlock(&S->mu);
    c->job = NULL;
}

static enum MHD_Result answer_done(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    srv_job *j = c->job;
    if (j->finish == FIN_ERROR) return fail(S, c, conn, 500, "server_error", NULL, j->errmsg);
    if (j->finish == FIN_CANCELLED) return fail(S, c, conn, 503, "unavailable_error", NULL, j->errmsg);
    return http_json(S, c, conn, 200, respond_completion(j));
}

/* Answers now when done, else suspends until the engine resumes the connection. */
static enum MHD_Result wait_or_answer(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    pthread_mutex_lock(&S->mu);
    bool done = c->job->done;
    if (!done) {
        c->job->suspended = true;
        MHD_suspend_connection(conn);
    }
    pthread_mutex_unlock(&S->mu);
    return done ? answer_done(S, c, conn) : MHD_YES;
}

enum MHD_Result api_resumed(srv *S, req_ctx *c, struct MHD_Connection *conn) { return wait_or_answer(S, c, conn); }

static enum MHD_Result generate(srv *S, req_ctx *c, struct MHD_Connection *conn, job_kind kind) {
    srv_error e;
    json_t *body = req_load_body(c->body, c->len, &e);
    if (!body) return http_error(S, c, conn, &e);
    c->job = job_new(S, kind);
    if (!c->job) { json_decref(body); return fail(S, c, conn, 500, "server_error", NULL, "out of memory"); }
    srv_job *j = c->job;
    j->t_arrive = c->t_arrive;
    j->conn = conn;
    bool ok = req_parse_gen(body, kind, &j->p, &e) &&
              (kind == JOB_CHAT ? req_check_messages(body, &e) && prompt_chat(S, body, j, &e)
                                : prompt_completion(S, body, j, &e)) &&
              job_prepare(S, j, &e);
    json_decref(body);
    if (!ok) { drop_job(S, c); return http_error(S, c, conn, &e); }
    int rc = engine_submit(S, j);
    if (rc) {
        drop_job(S, c);
        return rc == 1 ? fail(S, c, conn, 503, "unavailable_error", "queue_full",
                              "every slot is busy and the queue is full (--max-queue); retry later")
                       : fail(S, c, conn, 503, "unavailable_error", NULL, "the server is not serving (loading or stopping)");
    }
    return j->p.stream ? http_stream(S, c, conn) : wait_or_answer(S, c, conn);
}

static enum MHD_Result h_chat(srv *S, req_ctx *c, struct MHD_Connection *conn) { return generate(S, c, conn, JOB_CHAT); }
static enum MHD_Result h_completion(srv *S, req_ctx *c, struct MHD_Connection *conn) {
    return generate(S, c, conn, JOB_COMPLETION);
}

/* ---------------------------------------------------------------- routing */

static const struct route {
    const char *path, *method;
    int id;
    bool auth, ready;
    handler fn;
} routes[] = {
    {"/", "GET", SRV_ROUTE_PAGE, false, false, h_page},
    {"/health", "GET", SRV_ROUTE_HEALTH, false, false, h_health},
    {"/metrics", "GET", SRV_ROUTE_METRICS, true, false, h_metrics},
    {"/v1/models", "GET", SRV_ROUTE_MODELS, true, false, h_models},
    {"/models", "GET", SRV_ROUTE_MODELS, true, false, h_models},
    {"/v1/chat/completions", "POST", SRV_ROUTE_CHAT, true, true, h_chat},
    {"/chat/completions", "POST", SRV_ROUTE_CHAT, true, true, h_chat},
    {"/v1/completions", "POST", SRV_ROUTE_COMPLETION, true, true, h_completion},
    {"/completions", "POST", SRV_ROUTE_COMPLETION, true, true, h_completion},
    {"/tokenize", "POST", SRV_ROUTE_TOKENIZE, true, true, h_tokenize},
    {"/detokenize", "POST", SRV_ROUTE_DETOKENIZE, true, true, h_detokenize},
};

/* Constant-time comparison of the bearer token with the key. */
static bool authorized(srv *S, struct MHD_Connection *conn) {
    const char *key = S->cfg.api_key;
    if (!key || !*key) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    size_t n = strlen(key), m = strlen(h);
    unsigned diff = n != m;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < m ? h[i] : 0);
    return diff == 0;
}

enum MHD_Result api_handle(srv *S, req_ctx *c, struct MHD_Connection *conn, const char *url, const char *method) {
    const struct route *r = NULL;
    bool path_known = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path)) continue;
        path_known = true;
        c->route = routes[i].id;
        if (!strcmp(method, routes[i].method)) r = &routes[i];
    }
    srv_error e;
    if (!path_known) {
        srv_fail(&e, 404, "invalid_request_error", "not_found", NULL, "no route %s %.200s", method, url);
        return http_error(S, c, conn, &e);
    }
    if (!r) {
        srv_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%s is not allowed on %.200s", method, url);
        return http_error(S, c, conn, &e);
    }
    if (r->auth && !authorized(S, conn))
        return fail(S, c, conn, 401, "authentication_error", "invalid_api_key",
                    "missing or wrong API key (send Authorization: Bearer KEY)");
    int st = atomic_load(&S->state);
    if (st == SRV_WARMING && warm_is_warm_request(S, conn)) st = SRV_READY;
    if (st == SRV_WARMING) st = SRV_LOADING;
    if (r->ready && st != SRV_READY)
        return fail(S, c, conn, 503, "unavailable_error", st == SRV_LOADING ? "model_loading" : NULL,
                    st == SRV_LOADING ? "the model is loading" : "the server is stopping");
    return r->fn(S, c, conn);
}
