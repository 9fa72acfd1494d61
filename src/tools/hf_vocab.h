/*
 * hf_vocab.h — imports a Hugging Face byte-level BPE tokenizer (tokenizer.json, plus tokenizer_config.json
 * and config.json when they sit beside it) into the tokenizer.* keys of a GGUF, laid out the way
 * llama.cpp's convert_hf_to_gguf.py writes them (get_vocab_base() + _set_vocab_gpt2() + gguf-py's
 * SpecialVocab):
 *   tokenizer.ggml.model        "gpt2"
 *   tokenizer.ggml.pre          detected from the pre-tokenizer's shape (see kiln_hf_detect_pre)
 *   tokenizer.ggml.tokens       entry i = the string with id i (model vocabulary + added tokens); ids
 *                               missing in between are filled with "[PAD<i>]" of type UNUSED
 *   tokenizer.ggml.token_type   1 NORMAL, 3 CONTROL (added token marked special, or that looks special:
 *                               "<|...|>", "<｜...｜>", "<unused...>", "<pad>", "<mask>", "<2mass>",
 *                               "[@BOS@]"), 4 USER_DEFINED (other added tokens), 5 UNUSED (padding)
 *   tokenizer.ggml.merges       "a b" strings; pair-form merges are joined with a space after encoding
 *                               any space inside a part as U+0120, like gguf-py
 *   tokenizer.ggml.{bos,eos,unknown,seperator,padding,cls,mask}_token_id
 *                               from tokenizer_config.json's "<typ>_token" (looked up among the added
 *                               tokens), then config.json's "<typ>_token_id"; the first one found wins
 *   tokenizer.ggml.add_{bos,eos}_token   from tokenizer_config.json; for the smollm pre-tokenizer without
 *                               that key, add_bos_token = false (the converter does so for 49152-token
 *                               llama vocabularies)
 *   tokenizer.chat_template[.NAME]       from tokenizer_config.json
 * The vocabulary size is config.json's "vocab_size" when present, else max id + 1.
 */
#ifndef KILN_TOOLS_HF_VOCAB_H
#define KILN_TOOLS_HF_VOCAB_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln.h"
#include "gguf/gguf.h"

/* token_type values of llama.cpp's vocabulary. */
enum { KILN_TOKTYPE_NORMAL = 1, KILN_TOKTYPE_UNKNOWN = 2, KILN_TOKTYPE_CONTROL = 3,
       KILN_TOKTYPE_USER_DEFINED = 4, KILN_TOKTYPE_UNUSED = 5, KILN_TOKTYPE_BYTE = 6 };

/* Special-token slots, in gguf-py's order. */
enum { KILN_HF_SPECIAL_BOS, KILN_HF_SPECIAL_EOS, KILN_HF_SPECIAL_UNK, KILN_HF_SPECIAL_SEP,
       KILN_HF_SPECIAL_PAD, KILN_HF_SPECIAL_CLS, KILN_HF_SPECIAL_MASK, KILN_HF_SPECIAL_COUNT };

typedef struct kiln_hf_template { gguf_str name; gguf_str text; } kiln_hf_template;

/* An imported vocabulary. All strings stay valid until kiln_hf_vocab_free. */
typedef struct kiln_hf_vocab {
    uint32_t n_tokens;
    gguf_str *tokens;                       /* [n_tokens] */
    int32_t *token_types;                   /* [n_tokens] */
    uint64_t n_merges;
    gguf_str *merges;                       /* [n_merges] */
    const char *pre;                        /* tokenizer.ggml.pre */
    int64_t special[KILN_HF_SPECIAL_COUNT]; /* token ids, -1 when unset */
    int add_bos, add_eos;                   /* -1 unset, else 0/1 */
    gguf_str chat_template;                 /* ptr NULL when absent */
    uint32_t n_named_templates;             /* tokenizer.chat_template.NAME entries */
    kiln_hf_template *named_templates;
    void *priv;                             /* parsed JSON and owned strings */
} kiln_hf_vocab;

/* Loads path: a directory holding tokenizer.json, or a tokenizer.json file (its directory is searched
 * for tokenizer_config.json and config.json). Fails with KILN_ERR_IO (unreadable), KILN_ERR_FORMAT
 * (malformed JSON or a field of the wrong kind; the message names the file, the field and the byte
 * offset) or KILN_ERR_UNSUPPORTED (not a BPE model, or an unknown pre-tokenizer). *out is NULL then. */
kiln_status kiln_hf_vocab_load(const char *path, kiln_hf_vocab **out);

/* Sets the tokenizer.* keys of v on w (see the header comment for the layout). */
kiln_status kiln_hf_vocab_write(const kiln_hf_vocab *v, gguf_writer *w);

void kiln_hf_vocab_free(kiln_hf_vocab *v);

/* The tokenizer.ggml.pre name for a tokenizer.json's pre_tokenizer object (a json_t *, passed as void *
 * to keep jansson out of this header): "smollm" for Digits(individual)+ByteLevel, "llama-bpe" and
 * "qwen2" for a Split with Llama 3's or Qwen2's regex, "gpt-2" for a lone regex-splitting ByteLevel.
 * NULL when the shape is not one of these. (llama.cpp itself hashes the tokenization of a probe text;
 * kiln recognises the pre-tokenizer definitions those hashes stand for.) */
const char *kiln_hf_detect_pre(const void *pre_tokenizer);

#endif
