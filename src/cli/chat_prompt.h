/* chat_prompt.h — the chat template of a model for `kiln run --chat` and `kiln chat`. */
#ifndef KILN_CLI_CHAT_PROMPT_H
#define KILN_CLI_CHAT_PROMPT_H

#include <stdbool.h>

#include "kiln.h"
#include "tokenizer/chat.h"

typedef struct chat_prompt {
    kiln_chat_template *tmpl;
    char bos[64], eos[64];     /* the bos/eos token texts the template sees */
} chat_prompt;

/* Compiles the template: `override` (a built-in name or a file) when given, else the model's
 * tokenizer.chat_template, else an error naming the way out (--chat-template). Prints errors. */
bool chat_prompt_open(const char *cmd, const kiln_model *m, const char *override, chat_prompt *cp);
void chat_prompt_close(chat_prompt *cp);

/* Renders msgs with the generation prompt; *out is malloc'd (free it). Prints errors. */
bool chat_prompt_render(const char *cmd, const chat_prompt *cp, const kiln_chat_message *msgs, size_t n, char **out,
                        size_t *len);

/* Tokenizes a rendered prompt with parse_special; adds BOS only when the vocabulary wants one and the
 * template did not already write it. ids is malloc'd. */
bool chat_prompt_tokenize(const char *cmd, const kiln_model *m, const chat_prompt *cp, const char *text, size_t len,
                          int32_t **ids, size_t *n);

#endif
