/*
 * chat.h — the chat layer: compile a template (a model's tokenizer.chat_template, a built-in by name, or
 * a file), render a conversation to the prompt text the model expects, and tokenize it safely. Rendering
 * matches Hugging Face's apply_chat_template (jinja2 with trim_blocks and lstrip_blocks; see jinja.h).
 * The public calls (kiln_chat_template_open, kiln_chat_apply, kiln_chat_tokenize in kiln.h) are in
 * chat_api.c; this header is the internal part the CLI and the tests use.
 *
 * Safe tokenization: a render can return a content mask (one byte per output byte, 1 where the byte came
 * from message content, see jinja.h), and kiln_chat_tokenize_marked parses special tokens only where
 * every byte of the token is the template's own markup.
 */
#ifndef KILN_CHAT_CHAT_H
#define KILN_CHAT_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "kiln.h"
#include "gguf/gguf.h"

/* kiln_chat_template and kiln_chat_message are declared in kiln.h */
typedef struct jinja_template jinja_template;
typedef struct kiln_tokenizer kiln_tokenizer;

struct kiln_chat_template {
    jinja_template *tmpl;
    const kiln_model *model;   /* kiln_chat_template_open; NULL from the internal constructors */
    char *bos, *eos;           /* the model's bos/eos token texts (kiln_malloc'd); NULL from the internal ones */
};

typedef struct kiln_chat_render_opts {
    bool add_generation_prompt;   /* end with the opening of an assistant turn */
    const char *bos_token;        /* NULL = "" */
    const char *eos_token;        /* NULL = "" */
    /* strftime_now()'s time in seconds since the epoch, formatted as UTC (tests); 0 = local now */
    int64_t now;
    /* When not NULL: receives the content mask of the output (kiln_malloc'd, out_len bytes, see jinja.h) */
    uint8_t **content_mask;
} kiln_chat_render_opts;

/* The source of a built-in template (chatml, llama2, llama3, mistral, gemma, phi3, zephyr), or NULL. */
const char *kiln_chat_builtin(const char *name);
/* The built-in names, comma-separated (for usage texts). */
const char *kiln_chat_builtin_names(void);

/* Compiles src; unsupported constructs and syntax errors fail here with the construct and its
 * line:column. name is used in messages. */
kiln_status kiln_chat_template_parse(const char *src, size_t len, const char *name, kiln_chat_template **out);
/* Reads and compiles a template file (a .jinja file, or a tokenizer_config.json whose chat_template is
 * a string or a list of {name, template} where "default" is used). */
kiln_status kiln_chat_template_load_file(const char *path, kiln_chat_template **out);
/* A --chat-template value: a built-in name, else a file path. */
kiln_status kiln_chat_template_resolve(const char *name_or_path, kiln_chat_template **out);
void kiln_chat_template_free(kiln_chat_template *t);
/* A construct the template uses that kiln lacks but that fails only if reached (an unknown filter or
 * test inside an if, which jinja2 also defers), e.g. "unsupported filter 'from_json' at 90:33"; NULL
 * when none. For a warning at session open. */
const char *kiln_chat_template_note(const kiln_chat_template *t);

/* Renders n messages. *out is kiln_malloc'd and NUL-terminated (kiln_free it); out_len may be NULL.
 * A template's raise_exception() is KILN_ERR_INVALID_ARG with the template's message. */
kiln_status kiln_chat_render(const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n,
                             const kiln_chat_render_opts *opts, char **out, size_t *out_len);

/* Renders with every variable given as one JSON object: messages (with tool_calls, reasoning_content,
 * ... as the template wants), add_generation_prompt, bos_token, eos_token, tools, documents and any
 * template keyword such as enable_thinking. tools and documents default to null as in transformers. */
kiln_status kiln_chat_render_vars(const kiln_chat_template *t, const json_t *vars, int64_t now, char **out,
                                  size_t *out_len);
/* kiln_chat_render_vars that also returns the content mask (*mask kiln_malloc'd, *out_len bytes). */
kiln_status kiln_chat_render_vars_marked(const kiln_chat_template *t, const json_t *vars, int64_t now, char **out,
                                         size_t *out_len, uint8_t **mask);

/* Tokenizes a rendered prompt: a control token is parsed only where every byte of its text has mask 0
 * (the template's markup); everything else, message content included, is tokenized as plain text (as
 * without KILN_TOK_PARSE_SPECIAL). BOS is prepended when the vocabulary asks for it and the template did
 * not write it as its first token. mask NULL parses every special token (the unsafe way, for comparison).
 * Writes at most cap ids; *n_out the total (> cap: KILN_ERR_INVALID_ARG). */
kiln_status kiln_chat_tokenize_marked(const kiln_tokenizer *tok, const char *text, const uint8_t *mask, size_t len,
                                      int32_t *ids, size_t cap, size_t *n_out);
/* Roles are template markup (phi3 and zephyr build <|user|> from them): a role that kiln_chat_tokenize
 * accepts is 1..32 ASCII letters, digits, '_' or '-'. Fails naming the message otherwise. */
kiln_status kiln_chat_check_role(const char *role, size_t i);

/* A GGUF file's chat facts as views into its map (empty when absent): tokenizer.chat_template and the
 * text of the bos/eos tokens (tokenizer.ggml.{bos,eos}_token_id into tokenizer.ggml.tokens). Fails only
 * when a key exists with a wrong type or an id is out of range. */
typedef struct kiln_chat_gguf {
    gguf_str chat_template, bos_token, eos_token;
} kiln_chat_gguf;
kiln_status kiln_chat_from_gguf(const gguf_file *f, kiln_chat_gguf *out);

#endif
