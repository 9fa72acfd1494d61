/* chat_prompt.c — loading a model's chat template and turning a conversation into prompt tokens. */
#include "cli/chat_prompt.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "cli/cli.h"
#include "model/model.h"

static void copy_str(char *dst, size_t cap, gguf_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

bool chat_prompt_open(const char *cmd, const kiln_model *m, const char *override, chat_prompt *cp) {
    memset(cp, 0, sizeof *cp);
    kiln_chat_gguf g;
    if (kiln_chat_from_gguf(m->file, &g) != KILN_OK) { cli_error(cmd, "%s", kiln_last_error()); return false; }
    copy_str(cp->bos, sizeof cp->bos, g.bos_token);
    copy_str(cp->eos, sizeof cp->eos, g.eos_token);
    kiln_status st;
    if (override) st = kiln_chat_template_resolve(override, &cp->tmpl);
    else if (g.chat_template.len)
        st = kiln_chat_template_parse(g.chat_template.ptr, g.chat_template.len, "tokenizer.chat_template", &cp->tmpl);
    else {
        cli_error(cmd, "the model has no tokenizer.chat_template; choose one with --chat-template (%s or a file)",
                  kiln_chat_builtin_names());
        return false;
    }
    if (st != KILN_OK) { cli_error(cmd, "chat template: %s", kiln_last_error()); return false; }
    return true;
}

void chat_prompt_close(chat_prompt *cp) {
    kiln_chat_template_free(cp->tmpl);
    cp->tmpl = NULL;
}

bool chat_prompt_render(const char *cmd, const chat_prompt *cp, const kiln_chat_message *msgs, size_t n, char **out,
                        size_t *len) {
    kiln_chat_render_opts o = {.add_generation_prompt = true, .bos_token = cp->bos, .eos_token = cp->eos};
    char *r = NULL;
    if (kiln_chat_render(cp->tmpl, msgs, n, &o, &r, len) != KILN_OK) {
        cli_error(cmd, "rendering the chat template: %s", kiln_last_error());
        return false;
    }
    *out = malloc(*len + 1);
    if (*out) memcpy(*out, r, *len + 1);
    kiln_free(r);
    return *out != NULL;
}

bool chat_prompt_tokenize(const char *cmd, const kiln_model *m, const chat_prompt *cp, const char *text, size_t len,
                          int32_t **ids, size_t *n) {
    size_t bl = strlen(cp->bos);
    int flags = KILN_TOK_PARSE_SPECIAL;
    if (!(bl && len >= bl && !memcmp(text, cp->bos, bl))) flags |= KILN_TOK_ADD_BOS;
    size_t cap = len + 8;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) { cli_error(cmd, "out of memory"); return false; }
    if (kiln_tokenize(m, text, len, flags, *ids, cap, n) != KILN_OK) {
        cli_error(cmd, "tokenizing the chat prompt: %s", kiln_last_error());
        free(*ids);
        *ids = NULL;
        return false;
    }
    return true;
}
