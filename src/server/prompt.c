/*
 * prompt.c — a request's prompt to token ids: chat messages through the model's chat template with
 * kiln_chat_tokenize (the template's markup parsed for special tokens, message contents not, so a user
 * cannot forge a turn), or a completion's prompt (a string, tokenized as `kiln run` does, or token ids).
 */
#include <stdlib.h>
#include <string.h>

#include "server/srv.h"

/* Calls kiln_chat_tokenize / kiln_tokenize with a buffer that grows once when the first guess is short. */
static bool set_ids(srv_job *j, size_t cap, bool chat, const kiln_chat_message *msgs, size_t n_msgs, const char *text,
                    size_t len, srv *S, srv_error *e) {
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
        if (!ids) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory for %zu prompt tokens", cap);
        size_t n = 0;
        kiln_status st = chat ? kiln_chat_tokenize(S->tmpl, msgs, n_msgs, true, ids, cap, &n)
                              : kiln_tokenize(S->model, text, len, KILN_TOK_ADD_BOS, ids, cap, &n);
        if (st == KILN_OK) {
            j->prompt = ids;
            j->n_prompt = (int)n;
            return true;
        }
        free(ids);
        if (st != KILN_ERR_INVALID_ARG || n <= cap)
            return SRV_BAD_REQUEST(e, chat ? "messages" : "prompt", "%s: %s", chat ? "messages" : "prompt",
                                   kiln_last_error());
        cap = n;
    }
    return srv_fail(e, 500, "server_error", NULL, NULL, "the prompt's token count changed between two calls");
}

bool prompt_chat(srv *S, const json_t *body, srv_job *j, srv_error *e) {
    if (!S->tmpl)
        return SRV_BAD_REQUEST(e, "messages", "this model has no chat template (%s); start the server with "
                               "--chat-template NAME or use /v1/completions", S->tmpl_error);
    const json_t *msgs = json_object_get(body, "messages");
    size_t n = json_array_size(msgs), total = 0;
    kiln_chat_message *cm = calloc(n, sizeof *cm);
    char **texts = calloc(n, sizeof *texts);
    bool ok = cm && texts;
    for (size_t i = 0; ok && i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        size_t len;
        texts[i] = req_message_text(m, &len);
        ok = texts[i] != NULL;
        cm[i].role = json_string_value(json_object_get(m, "role"));
        cm[i].content = texts[i];
        total += len + 16;
    }
    uint64_t t0 = kiln_now_ns();
    if (!ok) srv_fail(e, 500, "server_error", NULL, NULL, "out of memory for %zu messages", n);
    else ok = set_ids(j, total + 64, true, cm, n, NULL, 0, S, e);
    j->template_ns = kiln_now_ns() - t0;
    for (size_t i = 0; texts && i < n; i++) free(texts[i]);
    free(texts);
    free(cm);
    return ok;
}

static bool prompt_ids(srv *S, const json_t *arr, srv_job *j, srv_error *e) {
    size_t n = json_array_size(arr);
    if (n == 0) return SRV_BAD_REQUEST(e, "prompt", "prompt: an array of token ids must not be empty");
    j->prompt = malloc(n * sizeof *j->prompt);
    if (!j->prompt) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory for %zu prompt tokens", n);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= S->mi.n_vocab)
            return SRV_BAD_REQUEST(e, "prompt", "prompt[%zu] must be a token id in 0..%d", i, S->mi.n_vocab - 1);
        j->prompt[i] = (int32_t)json_integer_value(v);
    }
    j->n_prompt = (int)n;
    return true;
}

bool prompt_completion(srv *S, const json_t *body, srv_job *j, srv_error *e) {
    const json_t *p = json_object_get(body, "prompt");
    /* a one-element array of a string or of ids is that prompt (OpenAI's batch form with one prompt) */
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    uint64_t t0 = kiln_now_ns();
    bool ok;
    if (!p || json_is_null(p)) ok = SRV_BAD_REQUEST(e, "prompt", "prompt is required");
    else if (json_is_string(p)) {
        size_t len = json_string_length(p);
        j->strip_space = len == 0;
        ok = set_ids(j, len + 8, false, NULL, 0, json_string_value(p), len, S, e);
    } else if (json_is_array(p)) {
        if (json_array_size(p) > 1 && !json_is_integer(json_array_get(p, 0)))
            return SRV_BAD_REQUEST(e, "prompt", "prompt: one prompt per request (n = 1)");
        ok = prompt_ids(S, p, j, e);
    } else ok = SRV_BAD_REQUEST(e, "prompt", "prompt must be a string or an array of token ids");
    j->template_ns = kiln_now_ns() - t0;
    if (ok && j->n_prompt == 0) {
        /* an empty prompt starts from BOS, as `kiln run` does */
        if (S->mi.bos_id < 0) return SRV_BAD_REQUEST(e, "prompt", "prompt is empty and the model has no BOS token");
        j->prompt[0] = S->mi.bos_id;
        j->n_prompt = 1;
    }
    return ok;
}
