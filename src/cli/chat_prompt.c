/* chat_prompt.c — loading a model's chat template and turning a conversation into prompt tokens. */
#include "cli/chat_prompt.h"

#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

bool chat_prompt_open(const char *cmd, const kiln_model *m, const char *override, chat_prompt *cp) {
    memset(cp, 0, sizeof *cp);
    if (kiln_chat_template_open(m, override, &cp->tmpl) != KILN_OK) {
        if (override) cli_error(cmd, "chat template: %s", kiln_last_error());
        else cli_error(cmd, "%s (--chat-template)", kiln_last_error());
        return false;
    }
    return true;
}

void chat_prompt_close(chat_prompt *cp) {
    kiln_chat_template_close(cp->tmpl);
    cp->tmpl = NULL;
}

bool chat_prompt_tokens(const char *cmd, const chat_prompt *cp, const kiln_chat_message *msgs, size_t n,
                        int32_t **ids, size_t *n_ids) {
    size_t cap = 256;
    for (size_t i = 0; i < n; i++) cap += strlen(msgs[i].content) + 16;
    for (int pass = 0; pass < 2; pass++) {   /* a second pass only when the first guess was short */
        *ids = malloc(cap * sizeof **ids);
        if (!*ids) { cli_error(cmd, "out of memory"); return false; }
        kiln_status st = kiln_chat_tokenize(cp->tmpl, msgs, n, true, *ids, cap, n_ids);
        if (st == KILN_OK) return true;
        free(*ids);
        *ids = NULL;
        if (st != KILN_ERR_INVALID_ARG || *n_ids <= cap) break;
        cap = *n_ids;
    }
    cli_error(cmd, "the chat prompt: %s", kiln_last_error());
    return false;
}
