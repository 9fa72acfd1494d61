/*
 * tokenizer.h — text <-> token ids from a GGUF's tokenizer.* metadata.
 *   tokenizer.ggml.model = llama: SentencePiece-style (scores, byte fallback, dummy prefix)
 *   tokenizer.ggml.model = gpt2:  byte-level BPE (merges by rank, pre-tokenizer by tokenizer.ggml.pre)
 * The vocabulary's strings are views into the GGUF map: the tokenizer must not outlive the gguf_file.
 */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "gguf/gguf.h"

typedef struct kiln_tokenizer kiln_tokenizer;

/* Loads the tokenizer described by f's tokenizer.* keys. *out is NULL on failure. */
kiln_status kiln_tokenizer_open(const gguf_file *f, kiln_tokenizer **out);
void kiln_tokenizer_close(kiln_tokenizer *t);

int kiln_tokenizer_n_vocab(const kiln_tokenizer *t);
int32_t kiln_tokenizer_bos(const kiln_tokenizer *t);   /* -1 when absent */
int32_t kiln_tokenizer_eos(const kiln_tokenizer *t);   /* -1 when absent */
bool kiln_tokenizer_add_bos(const kiln_tokenizer *t);
bool kiln_tokenizer_is_eog(const kiln_tokenizer *t, int32_t id);
const char *kiln_tokenizer_model_name(const kiln_tokenizer *t);  /* "llama", "gpt2" */
/* The chat template (NUL-terminated copy) or NULL when the file has none. */
const char *kiln_tokenizer_chat_template(const kiln_tokenizer *t);

/* Encodes text; flags as in kiln.h (KILN_TOK_ADD_BOS, KILN_TOK_PARSE_SPECIAL). Writes at most cap ids and
 * sets *n_out to the total; KILN_ERR_INVALID_ARG when cap was too small. */
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, int flags,
                                  int32_t *ids, size_t cap, size_t *n_out);

/* kiln_tokenizer_encode where mask (len bytes, may be NULL) marks bytes that are not to form control
 * tokens: with KILN_TOK_PARSE_SPECIAL, a control or unknown token is parsed only where every byte of its
 * text has mask 0; bytes marked nonzero are tokenized as plain text (the chat layer marks message content). */
kiln_status kiln_tokenizer_encode_marked(const kiln_tokenizer *t, const char *text, const uint8_t *mask, size_t len,
                                         int flags, int32_t *ids, size_t cap, size_t *n_out);

/* The bytes a token decodes to on its own (SPM: '▁' -> ' ', <0xNN> -> the byte; BPE: byte mapping
 * inverted; control tokens: empty). Returns the byte count, copies at most cap bytes. */
size_t kiln_tokenizer_piece(const kiln_tokenizer *t, int32_t id, char *buf, size_t cap);
/* The token's text as stored in the vocabulary (for printing ids and pieces). */
gguf_str kiln_tokenizer_token_text(const kiln_tokenizer *t, int32_t id);

/* ---- additions by the tokenizer engineer ---- */

/* The pre-tokenizer in use ("default" for SPM and for unknown/missing tokenizer.ggml.pre). */
const char *kiln_tokenizer_pre_name(const kiln_tokenizer *t);
/* An upper bound of the bytes one token decodes to (size buffers for kiln_tokenizer_piece with it). */
size_t kiln_tokenizer_max_piece_len(const kiln_tokenizer *t);
/* True for SPM vocabularies that put a dummy-prefix space before the text. */
bool kiln_tokenizer_add_space_prefix(const kiln_tokenizer *t);
/* True when id is a CONTROL token (decodes to nothing; never produced from plain text). */
bool kiln_tokenizer_is_control(const kiln_tokenizer *t, int32_t id);
/* The id of the token whose stored text is exactly text[0..len), -1 when none. */
int32_t kiln_tokenizer_find(const kiln_tokenizer *t, const char *text, size_t len);
/* As kiln_tokenizer_piece, but writes the piece's bytes from offset skip on (for pieces longer than a buffer).
 * Returns the piece's total length minus skip (0 when skip is past the end). */
size_t kiln_tokenizer_piece_at(const kiln_tokenizer *t, int32_t id, size_t skip, char *buf, size_t cap);

#endif
