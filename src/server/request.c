/*
 * request.c — parsing and checking request bodies: every field's type and range, with messages that
 * name the field (OpenAI's param). Sampling defaults are llama.cpp's (as llama-server's); OpenAI's fields
 * map onto kiln_sampler_params.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/srv.h"

bool srv_fail(srv_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

json_t *req_load_body(const char *body, size_t len, srv_error *e) {
    json_error_t je;
    json_t *j = json_loadb(body ? body : "", len, 0, &je);
    if (!j) {
        SRV_BAD_REQUEST(e, NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        SRV_BAD_REQUEST(e, NULL, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* A field that is absent or null counts as not given. */
static const json_t *field(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

static bool get_number(const json_t *o, const char *key, double lo, double hi, float *out, srv_error *e) {
    const json_t *v = field(o, key);
    if (!v) return true;
    if (!json_is_number(v)) return SRV_BAD_REQUEST(e, key, "%s must be a number", key);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi) return SRV_BAD_REQUEST(e, key, "%s must be in %g..%g, got %g", key, lo, hi, d);
    *out = (float)d;
    return true;
}

/* Integers: JSON integers, or reals with an integral value (some clients send 16.0). */
static bool get_int(const json_t *o, const char *key, long long lo, long long hi, long long *out, bool *given,
                    srv_error *e) {
    const json_t *v = field(o, key);
    if (given) *given = v != NULL;
    if (!v) return true;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else return SRV_BAD_REQUEST(e, key, "%s must be an integer", key);
    if (x < lo || x > hi) return SRV_BAD_REQUEST(e, key, "%s must be in %lld..%lld, got %lld", key, lo, hi, x);
    *out = x;
    return true;
}

static bool get_bool(const json_t *o, const char *key, bool *out, srv_error *e) {
    const json_t *v = field(o, key);
    if (!v) return true;
    if (!json_is_boolean(v)) return SRV_BAD_REQUEST(e, key, "%s must be true or false", key);
    *out = json_is_true(v);
    return true;
}

static bool add_stop(gen_params *p, const json_t *s, const char *param, srv_error *e) {
    if (!json_is_string(s)) return SRV_BAD_REQUEST(e, "stop", "%s must be a string", param);
    size_t n = json_string_length(s);
    if (n == 0) return SRV_BAD_REQUEST(e, "stop", "%s must not be empty", param);
    if (n > SRV_MAX_STOP_LEN) return SRV_BAD_REQUEST(e, "stop", "%s is longer than %d bytes", param, SRV_MAX_STOP_LEN);
    if (p->n_stop >= SRV_MAX_STOP) return SRV_BAD_REQUEST(e, "stop", "stop: at most %d sequences", SRV_MAX_STOP);
    memcpy(p->stop[p->n_stop], json_string_value(s), n);
    p->stop[p->n_stop][n] = '\0';
    p->stop_len[p->n_stop++] = n;
    return true;
}

static bool parse_stop(const json_t *body, gen_params *p, srv_error *e) {
    const json_t *v = field(body, "stop");
    if (!v) return true;
    if (json_is_string(v)) return add_stop(p, v, "stop", e);
    if (!json_is_array(v)) return SRV_BAD_REQUEST(e, "stop", "stop must be a string or an array of strings");
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s) {
        char name[32];
        snprintf(name, sizeof name, "stop[%zu]", i);
        if (!add_stop(p, s, name, e)) return false;
    }
    return true;
}

static bool parse_sampling(const json_t *body, gen_params *p, srv_error *e) {
    kiln_sampler_params *sp = &p->sp;
    long long top_k = sp->top_k, seed = -1, last_n = sp->repeat_last_n;
    bool seed_given;
    if (!get_number(body, "temperature", 0, 100, &sp->temperature, e) ||
        !get_number(body, "top_p", 0, 1, &sp->top_p, e) || !get_number(body, "min_p", 0, 1, &sp->min_p, e) ||
        !get_number(body, "presence_penalty", -2, 2, &sp->presence_penalty, e) ||
        !get_number(body, "frequency_penalty", -2, 2, &sp->frequency_penalty, e) ||
        !get_number(body, "repeat_penalty", 0.01, 10, &sp->repeat_penalty, e) ||
        !get_int(body, "top_k", 0, 1 << 24, &top_k, NULL, e) ||
        !get_int(body, "repeat_last_n", 0, 1 << 20, &last_n, NULL, e) ||
        !get_int(body, "seed", -1, INT64_MAX, &seed, &seed_given, e))
        return false;
    sp->top_k = (int)top_k;
    sp->repeat_last_n = (int)last_n;
    if (seed_given && seed >= 0) sp->seed = (uint64_t)seed;
    else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sp->seed = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    return true;
}

/* chat: logprobs (bool) + top_logprobs (0..20); completions: logprobs (0..5) */
static bool parse_logprobs(const json_t *body, job_kind kind, gen_params *p, srv_error *e) {
    long long top = 0;
    bool given;
    if (kind == JOB_COMPLETION) {
        if (!get_int(body, "logprobs", 0, 5, &top, &given, e)) return false;
        p->logprobs = given;
        p->top_logprobs = (int)top;
        return true;
    }
    if (!get_bool(body, "logprobs", &p->logprobs, e)) return false;
    if (!get_int(body, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &top, &given, e)) return false;
    if (given && !p->logprobs) return SRV_BAD_REQUEST(e, "top_logprobs", "top_logprobs needs logprobs: true");
    p->top_logprobs = (int)top;
    return true;
}

bool req_parse_gen(const json_t *body, job_kind kind, gen_params *p, srv_error *e) {
    memset(p, 0, sizeof *p);
    p->sp = kiln_sampler_defaults();
    const json_t *model = field(body, "model");
    if (model && !json_is_string(model)) return SRV_BAD_REQUEST(e, "model", "model must be a string");
    long long n = 1, max_tokens = 0, max_c = 0;
    bool mt_given, mc_given;
    if (!get_int(body, "n", 1, 1 << 20, &n, NULL, e)) return false;
    if (n != 1) return SRV_BAD_REQUEST(e, "n", "n must be 1 (kiln generates one choice per request), got %lld", n);
    if (!get_int(body, "max_tokens", 1, 1 << 24, &max_tokens, &mt_given, e) ||
        !get_int(body, "max_completion_tokens", 1, 1 << 24, &max_c, &mc_given, e))
        return false;
    p->max_tokens = (int)(mc_given ? max_c : max_tokens);
    if (!parse_sampling(body, p, e) || !parse_stop(body, p, e) || !parse_logprobs(body, kind, p, e)) return false;
    if (!get_bool(body, "stream", &p->stream, e)) return false;
    const json_t *so = field(body, "stream_options");
    if (so) {
        if (!json_is_object(so)) return SRV_BAD_REQUEST(e, "stream_options", "stream_options must be an object");
        if (!p->stream) return SRV_BAD_REQUEST(e, "stream_options", "stream_options needs stream: true");
        const json_t *iu = field(so, "include_usage");
        if (iu && !json_is_boolean(iu))
            return SRV_BAD_REQUEST(e, "stream_options.include_usage", "stream_options.include_usage must be true or false");
        p->include_usage = json_is_true(iu);
    }
    const json_t *echo = field(body, "echo");
    if (echo && json_is_true(echo)) return SRV_BAD_REQUEST(e, "echo", "echo is not supported");
    const json_t *lb = field(body, "logit_bias");
    if (lb && !(json_is_object(lb) && json_object_size(lb) == 0))
        return SRV_BAD_REQUEST(e, "logit_bias", "logit_bias is not supported");
    return true;
}

static bool check_content(const json_t *c, size_t i, srv_error *e) {
    char name[64];
    snprintf(name, sizeof name, "messages[%zu].content", i);
    if (!c) return true;
    if (json_is_string(c)) {
        if (strlen(json_string_value(c)) != json_string_length(c))
            return SRV_BAD_REQUEST(e, name, "%s contains a NUL character", name);
        return true;
    }
    if (!json_is_array(c)) return SRV_BAD_REQUEST(e, name, "%s must be a string or an array of text parts", name);
    size_t k;
    const json_t *part;
    json_array_foreach(c, k, part) {
        char pn[96];
        snprintf(pn, sizeof pn, "%s[%zu]", name, k);
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part)) return SRV_BAD_REQUEST(e, pn, "%s must be an object", pn);
        if (!json_is_string(type) || strcmp(json_string_value(type), "text"))
            return SRV_BAD_REQUEST(e, pn, "%s.type must be \"text\" (kiln reads text only)", pn);
        if (!json_is_string(text)) return SRV_BAD_REQUEST(e, pn, "%s.text must be a string", pn);
        if (strlen(json_string_value(text)) != json_string_length(text))
            return SRV_BAD_REQUEST(e, pn, "%s.text contains a NUL character", pn);
    }
    return true;
}

bool req_check_messages(const json_t *body, srv_error *e) {
    const json_t *msgs = json_object_get(body, "messages");
    if (!msgs) return SRV_BAD_REQUEST(e, "messages", "messages is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return SRV_BAD_REQUEST(e, "messages", "messages must be a non-empty array");
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        char name[64];
        snprintf(name, sizeof name, "messages[%zu]", i);
        if (!json_is_object(m)) return SRV_BAD_REQUEST(e, name, "%s must be an object", name);
        const json_t *role = json_object_get(m, "role");
        if (!json_is_string(role) || json_string_length(role) == 0 || json_string_length(role) > 64) {
            snprintf(name, sizeof name, "messages[%zu].role", i);
            return SRV_BAD_REQUEST(e, name, "%s must be a non-empty string", name);
        }
        if (!check_content(field(m, "content"), i, e)) return false;
    }
    const json_t *tools = field(body, "tools");
    if (tools && !(json_is_array(tools) && json_array_size(tools) == 0))
        return SRV_BAD_REQUEST(e, "tools", "tools are not supported");
    const json_t *rf = field(body, "response_format");
    if (rf) {
        const json_t *t = json_object_get(rf, "type");
        if (!json_is_object(rf) || !json_is_string(t) || strcmp(json_string_value(t), "text"))
            return SRV_BAD_REQUEST(e, "response_format", "response_format: only {\"type\": \"text\"} is supported");
    }
    return true;
}

char *req_message_text(const json_t *msg, size_t *len) {
    const json_t *c = field(msg, "content");
    size_t n = 0, k;
    const json_t *part;
    if (json_is_string(c)) n = json_string_length(c);
    else json_array_foreach(c, k, part) n += json_string_length(json_object_get(part, "text"));
    char *s = malloc(n + 1);
    if (!s) return NULL;
    if (json_is_string(c)) memcpy(s, json_string_value(c), n);
    else {
        size_t off = 0;
        json_array_foreach(c, k, part) {
            const json_t *t = json_object_get(part, "text");
            memcpy(s + off, json_string_value(t), json_string_length(t));
            off += json_string_length(t);
        }
    }
    s[n] = '\0';
    *len = n;
    return s;
}
