/*
 * chat_api.c — the chat part of the public API (include/kiln.h): kiln_chat_template_open / _close,
 * kiln_chat_apply (render to text) and kiln_chat_tokenize (render and tokenize with message content kept
 * out of special-token parsing), plus the safe tokenization of a rendered prompt that `kiln template
 * --ids` shares (kiln_chat_tokenize_marked).
 */
#include "chat/chat.h"

#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

kiln_status kiln_chat_template_open(const kiln_model *m, const char *name_or_path, kiln_chat_template **out) {
    if (!out) return kiln_fail(KILN_ERR_INVALID_ARG, "chat template: out is NULL");
    *out = NULL;
    if (!m) return kiln_fail(KILN_ERR_INVALID_ARG, "chat template: no model given");
    kiln_chat_gguf g;
    KILN_TRY(kiln_chat_from_gguf(m->file, &g));
    kiln_chat_template *t = NULL;
    if (name_or_path && *name_or_path) KILN_TRY(kiln_chat_template_resolve(name_or_path, &t));
    else if (g.chat_template.len)
        KILN_TRY(kiln_chat_template_parse(g.chat_template.ptr, g.chat_template.len, "tokenizer.chat_template", &t));
    else
        return kiln_fail(KILN_ERR_INVALID_ARG, "the model has no tokenizer.chat_template; name a built-in template (%s) or a file",
                         kiln_chat_builtin_names());
    t->model = m;
    t->bos = kiln_strndup(g.bos_token.ptr, g.bos_token.len);
    t->eos = kiln_strndup(g.eos_token.ptr, g.eos_token.len);
    if (!t->bos || !t->eos) {
        kiln_chat_template_free(t);
        return kiln_fail(KILN_ERR_NOMEM, "chat template: out of memory");
    }
    *out = t;
    return KILN_OK;
}

void kiln_chat_template_close(kiln_chat_template *t) { kiln_chat_template_free(t); }

static kiln_status check_call(const char *what, const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n,
                              size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!t) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: no template given", what);
    if (!n_out) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: n_out is NULL", what);
    if (!msgs && n) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: msgs is NULL but n is %zu", what, n);
    return KILN_OK;
}

static kiln_status render(const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n, bool add_gen,
                          char **text, size_t *len, uint8_t **mask) {
    kiln_chat_render_opts o = {.add_generation_prompt = add_gen, .bos_token = t->bos, .eos_token = t->eos,
                               .content_mask = mask};
    return kiln_chat_render(t, msgs, n, &o, text, len);
}

kiln_status kiln_chat_apply(const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n,
                            bool add_generation_prompt, char *buf, size_t cap, size_t *n_out) {
    KILN_TRY(check_call("chat apply", t, msgs, n, n_out));
    if (!buf && cap) return kiln_fail(KILN_ERR_INVALID_ARG, "chat apply: buf is NULL but cap is %zu", cap);
    char *text = NULL;
    size_t len = 0;
    KILN_TRY(render(t, msgs, n, add_generation_prompt, &text, &len, NULL));
    *n_out = len;
    kiln_status st = KILN_OK;
    if (len + 1 > cap) {
        if (cap) buf[0] = '\0';
        st = kiln_fail(KILN_ERR_INVALID_ARG, "chat apply: the prompt of %zu bytes does not fit the %zu given", len, cap);
    } else {
        memcpy(buf, text, len + 1);
    }
    kiln_free(text);
    return st;
}

kiln_status kiln_chat_check_role(const char *role, size_t i) {
    size_t n = role ? strlen(role) : 0;
    bool ok = n >= 1 && n <= 32;
    for (size_t k = 0; ok && k < n; k++) {
        char ch = role[k];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
    }
    if (!ok)
        return kiln_fail(KILN_ERR_INVALID_ARG, "message %zu: the role must be 1 to 32 ASCII letters, digits, '_' or '-' "
                         "(it is template markup)", i);
    return KILN_OK;
}

kiln_status kiln_chat_tokenize_marked(const kiln_tokenizer *tok, const char *text, const uint8_t *mask, size_t len,
                                      int32_t *ids, size_t cap, size_t *n_out) {
    KILN_ASSERT(tok && n_out && (text || !len) && (ids || !cap));
    *n_out = 0;
    size_t tcap = len + 16, n = 0;
    int32_t *tmp = NULL;
    kiln_status st;
    for (int pass = 0; pass < 2; pass++) {   /* the second pass only when the first guess was short */
        tmp = kiln_malloc(tcap * sizeof *tmp);
        if (!tmp) return kiln_fail(KILN_ERR_NOMEM, "chat tokenize: out of memory");
        st = kiln_tokenizer_encode_marked(tok, text, mask, len, KILN_TOK_PARSE_SPECIAL, tmp, tcap, &n);
        if (st != KILN_ERR_INVALID_ARG || n <= tcap) break;
        kiln_free(tmp);
        tmp = NULL;
        tcap = n;
    }
    if (st != KILN_OK) { kiln_free(tmp); return st; }
    int32_t bos = kiln_tokenizer_bos(tok);
    size_t lead = kiln_tokenizer_add_bos(tok) && bos >= 0 && !(n > 0 && tmp[0] == bos) ? 1 : 0;
    *n_out = n + lead;
    if (n + lead > cap) {
        kiln_free(tmp);
        return kiln_fail(KILN_ERR_INVALID_ARG, "chat tokenize: %zu tokens do not fit the %zu given", n + lead, cap);
    }
    if (lead) ids[0] = bos;
    if (n) memcpy(ids + lead, tmp, n * sizeof *tmp);
    kiln_free(tmp);
    return KILN_OK;
}

kiln_status kiln_chat_tokenize(const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n,
                               bool add_generation_prompt, int32_t *ids, size_t cap, size_t *n_out) {
    KILN_TRY(check_call("chat tokenize", t, msgs, n, n_out));
    if (!ids && cap) return kiln_fail(KILN_ERR_INVALID_ARG, "chat tokenize: ids is NULL but cap is %zu", cap);
    if (!t->model || !t->model->tok)
        return kiln_fail(KILN_ERR_INVALID_ARG, "chat tokenize: the template was not opened with a model that has a tokenizer");
    for (size_t i = 0; i < n; i++) KILN_TRY(kiln_chat_check_role(msgs[i].role, i));
    char *text = NULL;
    uint8_t *mask = NULL;
    size_t len = 0;
    KILN_TRY(render(t, msgs, n, add_generation_prompt, &text, &len, &mask));
    kiln_status st = kiln_chat_tokenize_marked(t->model->tok, text, mask, len, ids, cap, n_out);
    kiln_free(text);
    kiln_free(mask);
    return st;
}
