/*
 * respond.c — response bodies in OpenAI's wire format: errors, chat.completion / text_completion
 * objects, their streamed chunks as Server-Sent Events, usage, logprobs, and kiln's `timings` (the
 * request's own phases: queue, template + tokenize, prompt tokens reused from the cache, prefill, time
 * to first token, decode).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "server/srv.h"

json_t *respond_text(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    /* not valid UTF-8 (a stream cut inside a character never reaches here; this is a safety net) */
    char *clean = malloc(n * 3 + 1);
    if (!clean) return json_string("");
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t u = cli_utf8_len((const unsigned char *)s + i, n - i);
        if (u && s[i]) { memcpy(clean + o, s + i, u); o += u; i += u; }
        else { memcpy(clean + o, "\xef\xbf\xbd", 3); o += 3; i++; }
    }
    j = json_stringn(clean, o);
    free(clean);
    return j ? j : json_string("");
}

json_t *respond_error_json(const srv_error *e) {
    return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->msg, "type", e->type, "param",
                     e->param[0] ? json_string(e->param) : json_null(), "code",
                     e->code ? json_string(e->code) : json_null());
}

static double ms(uint64_t a, uint64_t b) { return b > a ? (b - a) / 1e6 : 0.0; }

json_t *respond_usage(const srv_job *j) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", j->n_prompt, "completion_tokens", j->n_gen,
                     "total_tokens", j->n_prompt + j->n_gen, "prompt_tokens_details", "cached_tokens", j->n_cached);
}

json_t *respond_timings(const srv_job *j) {
    double prefill = ms(j->t_start, j->t_first), decode = ms(j->t_first, j->t_last);
    int n_prefill = j->n_prompt - j->n_cached, n_decode = j->n_gen > 1 ? j->n_gen - 1 : 0;
    json_t *t = json_pack("{s:f,s:f,s:i,s:i,s:f,s:f,s:i,s:f}", "queue_ms", ms(j->t_queued, j->t_start),
                          "template_ms", j->template_ns / 1e6, "cache_n", j->n_cached, "prompt_n", n_prefill,
                          "prompt_ms", prefill, "ttft_ms", ms(j->t_arrive, j->t_first), "predicted_n", n_decode,
                          "predicted_ms", decode);
    if (t) {
        json_object_set_new(t, "prompt_per_second", json_real(prefill > 0 ? n_prefill / (prefill / 1e3) : 0));
        json_object_set_new(t, "predicted_per_second", json_real(decode > 0 ? n_decode / (decode / 1e3) : 0));
    }
    return t;
}

static const char *finish_name(job_finish f) { return f == FIN_LENGTH ? "length" : "stop"; }

static json_t *token_text(const srv_job *j, int32_t id, json_t **bytes) {
    char buf[1024];
    size_t n = 0;
    if (kiln_token_piece(j->S->model, id, buf, sizeof buf, &n) != KILN_OK || n > sizeof buf) n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)buf[i]));
    }
    return respond_text(buf, n);
}

/* Chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}; completions: OpenAI's legacy
 * {tokens, token_logprobs, top_logprobs: [{token: lp}], text_offset}. */
static json_t *logprobs_json(const srv_job *j, int from, int to) {
    if (j->kind == JOB_CHAT) {
        json_t *content = json_array();
        for (int i = from; i < to; i++) {
            const lp_entry *e = &j->lps[i];
            json_t *bytes, *tops = json_array();
            json_t *tok = token_text(j, e->id, &bytes);
            for (int k = 0; k < e->n_top; k++) {
                json_t *tb, *tt = token_text(j, e->top[k].id, &tb);
                json_array_append_new(tops, json_pack("{s:o,s:f,s:o}", "token", tt, "logprob", e->top[k].lp, "bytes", tb));
            }
            json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:o}", "token", tok, "logprob", e->lp, "bytes",
                                                     bytes, "top_logprobs", tops));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array();
    for (int i = from; i < to; i++) {
        const lp_entry *e = &j->lps[i];
        json_array_append_new(tokens, token_text(j, e->id, NULL));
        json_array_append_new(lps, json_real(e->lp));
        json_t *top = json_object();
        for (int k = 0; k < e->n_top; k++) {
            json_t *tt = token_text(j, e->top[k].id, NULL);
            json_object_set_new(top, json_string_value(tt), json_real(e->top[k].lp));
            json_decref(tt);
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops);
}

static json_t *envelope(const srv_job *j, const char *object, json_t *choices) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", j->id, "object", object, "created", (json_int_t)j->created,
                     "model", j->S->model_id, "system_fingerprint", "kiln-" KILN_VERSION_STRING, "choices", choices);
}

json_t *respond_completion(const srv_job *j) {
    json_t *text = respond_text(j->text ? j->text : "", j->text_len);
    json_t *lp = j->p.logprobs ? logprobs_json(j, 0, j->n_lp) : json_null();
    json_t *choice;
    if (j->kind == JOB_CHAT)
        choice = json_pack("{s:i,s:{s:s,s:o},s:o,s:s}", "index", 0, "message", "role", "assistant", "content", text,
                           "logprobs", lp, "finish_reason", finish_name(j->finish));
    else
        choice = json_pack("{s:i,s:o,s:o,s:s}", "index", 0, "text", text, "logprobs", lp, "finish_reason",
                           finish_name(j->finish));
    json_t *r = envelope(j, j->kind == JOB_CHAT ? "chat.completion" : "text_completion", json_pack("[o]", choice));
    if (r) {
        json_object_set_new(r, "usage", respond_usage(j));
        json_object_set_new(r, "timings", respond_timings(j));
    }
    return r;
}

/* ---------------------------------------------------------------- streaming */

static bool stage_add(srv_job *j, const char *s, size_t n) {
    if (j->stage_len + n > j->stage_cap) {
        size_t cap = j->stage_cap * 2 + n + 1024;
        char *b = realloc(j->stage, cap);
        if (!b) return false;
        j->stage = b;
        j->stage_cap = cap;
    }
    memcpy(j->stage + j->stage_len, s, n);
    j->stage_len += n;
    return true;
}

/* "data: {json}\n\n" (steals ev) */
static bool stage_event(srv_job *j, json_t *ev) {
    char *s = ev ? json_dumps(ev, JSON_COMPACT | JSON_REAL_PRECISION(7)) : NULL;
    json_decref(ev);
    if (!s) return false;
    bool ok = stage_add(j, "data: ", 6) && stage_add(j, s, strlen(s)) && stage_add(j, "\n\n", 2);
    free(s);
    return ok;
}

/* One chunk with one choice: chat's delta (role and/or content) or a completion's text. */
static json_t *chunk(const srv_job *j, json_t *text, bool role, json_t *lp, const char *finish) {
    json_t *c;
    if (j->kind == JOB_CHAT) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (text) json_object_set_new(delta, "content", text);
        c = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "logprobs", lp ? lp : json_null(),
                      "finish_reason", finish ? json_string(finish) : json_null());
    } else {
        c = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "text", text ? text : json_string(""), "logprobs",
                      lp ? lp : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
    }
    return envelope(j, j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion", json_pack("[o]", c));
}

static bool stream_final(srv_job *j) {
    if (j->finish == FIN_CANCELLED || j->finish == FIN_ERROR) {
        srv_error e;
        srv_fail(&e, j->finish == FIN_ERROR ? 500 : 503, "server_error", NULL, NULL, "%s", j->errmsg);
        if (!stage_event(j, respond_error_json(&e))) return false;
    } else {
        json_t *last = chunk(j, NULL, false, NULL, finish_name(j->finish));
        if (!last) return false;
        json_object_set_new(last, "timings", respond_timings(j));
        if (!j->p.include_usage) json_object_set_new(last, "usage", respond_usage(j));
        if (!stage_event(j, last)) return false;
        if (j->p.include_usage) {
            json_t *u = envelope(j, j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion", json_array());
            if (u) {
                json_object_set_new(u, "usage", respond_usage(j));
                json_object_set_new(u, "timings", respond_timings(j));
            }
            if (!stage_event(j, u)) return false;
        }
    }
    j->sent_final = true;
    return stage_add(j, "data: [DONE]\n\n", 14);
}

bool respond_stream_step(srv_job *j) {
    if (j->sent_final) return true;
    size_t before = j->stage_len;
    if (j->kind == JOB_CHAT && !j->sent_role) {
        if (!stage_event(j, chunk(j, json_string(""), true, NULL, NULL))) return false;
        j->sent_role = true;
    }
    if (j->text_len > j->sent || j->n_lp > j->sent_lp) {
        json_t *lp = j->p.logprobs ? logprobs_json(j, j->sent_lp, j->n_lp) : NULL;
        if (!stage_event(j, chunk(j, respond_text(j->text + j->sent, j->text_len - j->sent), false, lp, NULL)))
            return false;
        j->sent = j->text_len;
        j->sent_lp = j->n_lp;
    }
    if (j->done) return stream_final(j);
    if (j->keepalive && j->stage_len == before && !stage_add(j, ": keep-alive\n\n", 14)) return false;
    j->keepalive = false;
    return true;
}
