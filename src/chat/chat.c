/* chat.c — chat templates: built-ins, loading, rendering conversations, GGUF facts (see chat.h). */
#include "chat/chat.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "chat/jinja.h"

#define CHAT_MAX_FILE (16u << 20)

/* ---------------------------------------------------------------- built-ins */

static const struct { const char *name; const char *src; } BUILTINS[] = {
    {"chatml",
     "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {"llama2",
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
     "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
     "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if loop.index0 == 0 and system_message != false %}"
     "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
     "{% else %}{% set content = message['content'] %}{% endif %}"
     "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
     "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"},
    {"llama3",
     "{% set loop_messages = messages %}{% for message in loop_messages %}"
     "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}"
     "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"},
    {"mistral",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content'] %}"
     "{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}"
     "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if message['role'] == 'user' %}{% if loop.first and system_message is defined %}"
     "{{ '[INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}{% else %}"
     "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}"
     "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
     "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"},
    {"gemma",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
     "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
     "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"},
    {"phi3",
     "{% for message in messages %}{{ '<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"},
    {"zephyr",
     "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"},
};

const char *kiln_chat_builtin(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (!strcmp(BUILTINS[i].name, name)) return BUILTINS[i].src;
    return NULL;
}

const char *kiln_chat_builtin_names(void) { return "chatml, llama2, llama3, mistral, gemma, phi3, zephyr"; }

/* ---------------------------------------------------------------- compile and load */

kiln_status kiln_chat_template_parse(const char *src, size_t len, const char *name, kiln_chat_template **out) {
    KILN_ASSERT(out);
    *out = NULL;
    kiln_chat_template *t = kiln_calloc(1, sizeof *t);
    if (!t) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status st = jinja_parse(src, len, name, &t->tmpl);
    if (st != KILN_OK) {
        kiln_free(t);
        return st;
    }
    *out = t;
    return KILN_OK;
}

const char *kiln_chat_template_note(const kiln_chat_template *t) { return jinja_deferred_unsupported(t->tmpl); }

void kiln_chat_template_free(kiln_chat_template *t) {
    if (!t) return;
    jinja_free(t->tmpl);
    kiln_free(t->bos);
    kiln_free(t->eos);
    kiln_free(t);
}

static kiln_status read_file(const char *path, char **buf, size_t *len) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = kiln_malloc(cap);
    if (!b) { fclose(f); return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path); }
    for (;;) {
        if (n + 1 >= cap) {
            if (cap >= CHAT_MAX_FILE) {
                kiln_free(b);
                fclose(f);
                return kiln_fail(KILN_ERR_INVALID_ARG, "%s: larger than %u MiB", path, CHAT_MAX_FILE >> 20);
            }
            char *nb = kiln_realloc(b, cap * 2);
            if (!nb) { kiln_free(b); fclose(f); return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", path); }
            b = nb;
            cap *= 2;
        }
        size_t got = fread(b + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) { kiln_free(b); return kiln_fail(KILN_ERR_IO, "%s: read error", path); }
    b[n] = 0;
    *buf = b;
    *len = n;
    return KILN_OK;
}

/* A tokenizer_config.json's chat_template: a string, or a list of {name, template} ("default" wins). */
static kiln_status template_from_config(const char *path, const char *text, size_t len, char **src, size_t *src_len) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &jerr); /* model_max_length may exceed 64 bits */
    if (!root) return kiln_fail(KILN_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, jerr.line, jerr.column, jerr.text);
    json_t *ct = json_object_get(root, "chat_template");
    const char *s = NULL;
    size_t n = 0;
    if (json_is_string(ct)) {
        s = json_string_value(ct);
        n = json_string_length(ct);
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *item;
        json_array_foreach(ct, i, item) {
            json_t *nm = json_object_get(item, "name"), *tp = json_object_get(item, "template");
            if (json_is_string(tp) && (!s || (json_is_string(nm) && !strcmp(json_string_value(nm), "default")))) {
                s = json_string_value(tp);
                n = json_string_length(tp);
            }
        }
    }
    if (!s) {
        json_decref(root);
        return kiln_fail(KILN_ERR_FORMAT, "%s: no chat_template string in this JSON file", path);
    }
    *src = kiln_strndup(s, n);
    *src_len = n;
    json_decref(root);
    return *src ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
}

kiln_status kiln_chat_template_load_file(const char *path, kiln_chat_template **out) {
    KILN_ASSERT(path && out);
    *out = NULL;
    char *text;
    size_t len = 0;
    KILN_TRY(read_file(path, &text, &len));
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t')) i++;
    size_t e = strlen(path);
    bool is_json = e >= 5 && !strcmp(path + e - 5, ".json") && i < len && text[i] == '{';
    kiln_status st;
    if (is_json) {
        char *src = NULL;
        size_t src_len = 0;
        st = template_from_config(path, text, len, &src, &src_len);
        if (st == KILN_OK) {
            st = kiln_chat_template_parse(src, src_len, path, out);
            kiln_free(src);
        }
    } else {
        st = kiln_chat_template_parse(text, len, path, out);
    }
    kiln_free(text);
    return st;
}

kiln_status kiln_chat_template_resolve(const char *name_or_path, kiln_chat_template **out) {
    KILN_ASSERT(name_or_path && out);
    const char *src = kiln_chat_builtin(name_or_path);
    if (src) return kiln_chat_template_parse(src, strlen(src), name_or_path, out);
    kiln_status st = kiln_chat_template_load_file(name_or_path, out);
    if (st == KILN_ERR_IO)
        return kiln_fail(st, "chat template '%s' is neither a built-in (%s) nor a readable file", name_or_path, kiln_chat_builtin_names());
    return st;
}

/* ---------------------------------------------------------------- rendering */

kiln_status kiln_chat_render_vars(const kiln_chat_template *t, const json_t *vars, int64_t now, char **out, size_t *out_len) {
    return kiln_chat_render_vars_marked(t, vars, now, out, out_len, NULL);
}

kiln_status kiln_chat_render_vars_marked(const kiln_chat_template *t, const json_t *vars, int64_t now, char **out,
                                         size_t *out_len, uint8_t **mask) {
    KILN_ASSERT(t && out);
    *out = NULL;
    if (mask) *mask = NULL;
    if (!json_is_object(vars)) return kiln_fail(KILN_ERR_INVALID_ARG, "chat variables must be a JSON object");
    json_t *v = json_copy((json_t *)vars);
    if (!v) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    int rc = 0;
    if (!json_object_get(v, "tools")) rc |= json_object_set_new(v, "tools", json_null());
    if (!json_object_get(v, "documents")) rc |= json_object_set_new(v, "documents", json_null());
    if (!json_object_get(v, "add_generation_prompt")) rc |= json_object_set_new(v, "add_generation_prompt", json_false());
    if (rc) { json_decref(v); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
    jinja_render_opts o = {.now = now, .content_mask = mask};
    kiln_status st = jinja_render(t->tmpl, v, &o, out, out_len);
    json_decref(v);
    return st;
}

kiln_status kiln_chat_render(const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n,
                             const kiln_chat_render_opts *opts, char **out, size_t *out_len) {
    KILN_ASSERT(t && out && (msgs || !n));
    *out = NULL;
    kiln_chat_render_opts def = {0};
    if (!opts) opts = &def;
    json_t *vars = json_object(), *arr = json_array();
    kiln_status st = KILN_OK;
    if (!vars || !arr) { st = kiln_fail(KILN_ERR_NOMEM, "out of memory"); goto done; }
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) { st = kiln_fail(KILN_ERR_INVALID_ARG, "message %zu: role and content are required", i); goto done; }
        json_t *role = json_string(msgs[i].role), *content = json_string(msgs[i].content);
        json_t *m = json_object();
        if (!role || !content || !m) {
            json_decref(role);
            json_decref(content);
            json_decref(m);
            st = kiln_fail(KILN_ERR_INVALID_ARG, "message %zu: role and content must be valid UTF-8", i);
            goto done;
        }
        json_object_set_new(m, "role", role);
        json_object_set_new(m, "content", content);
        json_array_append_new(arr, m);
    }
    json_t *bos = json_string(opts->bos_token ? opts->bos_token : "");
    json_t *eos = json_string(opts->eos_token ? opts->eos_token : "");
    if (!bos || !eos) {
        json_decref(bos);
        json_decref(eos);
        st = kiln_fail(KILN_ERR_INVALID_ARG, "bos/eos token text must be valid UTF-8");
        goto done;
    }
    json_object_set_new(vars, "messages", arr);
    arr = NULL;
    json_object_set_new(vars, "bos_token", bos);
    json_object_set_new(vars, "eos_token", eos);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(opts->add_generation_prompt));
    st = kiln_chat_render_vars_marked(t, vars, opts->now, out, out_len, opts->content_mask);
done:
    json_decref(arr);
    json_decref(vars);
    return st;
}

/* ---------------------------------------------------------------- GGUF */

static kiln_status token_text(const gguf_file *f, const char *id_key, gguf_str *out) {
    out->ptr = "";
    out->len = 0;
    if (!gguf_find(f, id_key)) return KILN_OK;
    uint32_t id;
    KILN_TRY(gguf_get_u32(f, id_key, &id));
    gguf_arr toks;
    if (!gguf_find(f, "tokenizer.ggml.tokens")) return KILN_OK;
    KILN_TRY(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_VT_STRING, &toks));
    if (id >= toks.n) return kiln_fail(KILN_ERR_FORMAT, "%s = %u is out of range (%llu tokens)", id_key, id, (unsigned long long)toks.n);
    *out = gguf_arr_str(&toks, id);
    return KILN_OK;
}

kiln_status kiln_chat_from_gguf(const gguf_file *f, kiln_chat_gguf *out) {
    KILN_ASSERT(f && out);
    memset(out, 0, sizeof *out);
    out->chat_template.ptr = "";
    if (gguf_find(f, "tokenizer.chat_template")) KILN_TRY(gguf_get_str(f, "tokenizer.chat_template", &out->chat_template));
    KILN_TRY(token_text(f, "tokenizer.ggml.bos_token_id", &out->bos_token));
    KILN_TRY(token_text(f, "tokenizer.ggml.eos_token_id", &out->eos_token));
    return KILN_OK;
}
