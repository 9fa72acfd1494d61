/* chat_prompt.h — the chat template of a model for `kiln run --chat` and `kiln chat` (over the public
 * kiln_chat_* calls of kiln.h), with the CLI's error messages. */
#ifndef KILN_CLI_CHAT_PROMPT_H
#define KILN_CLI_CHAT_PROMPT_H

#include <stdbool.h>

#include "kiln.h"

typedef struct chat_prompt {
    kiln_chat_template *tmpl;
} chat_prompt;

/* Compiles the template: `override` (a built-in name or a file) when given, else the model's
 * tokenizer.chat_template, else an error naming the way out (--chat-template). Prints errors. */
bool chat_prompt_open(const char *cmd, const kiln_model *m, const char *override, chat_prompt *cp);
void chat_prompt_close(chat_prompt *cp);

/* Renders msgs with the generation prompt and tokenizes them with kiln_chat_tokenize (the template's
 * markup gives special tokens, message content never does). *ids is malloc'd (free it). Prints errors. */
bool chat_prompt_tokens(const char *cmd, const chat_prompt *cp, const kiln_chat_message *msgs, size_t n,
                        int32_t **ids, size_t *n_ids);

#endif
