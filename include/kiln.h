/*
 * kiln.h — the public C API of kiln, an LLM inference engine.
 *
 * The path of one token:
 *   kiln_model_open(path)          map + parse the GGUF, bind tensors, load the tokenizer
 *   kiln_session_open(model, opt)  allocate, prepare weights, load kernels, warm; nothing lazy is left
 *   kiln_prefill(s, ids, n)        logits of the last position
 *   kiln_decode(s, id)             logits of the next position
 *   kiln_sample(sampler, logits)   the next id
 *
 * Every function that can fail returns a kiln_status; on failure kiln_last_error() names what was wrong
 * (file, field, byte offset where it applies). The library never exits the process and a failed call
 * leaves no partial state behind (output handles stay NULL).
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_STRING "0.1.0"

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_IO = 1,            /* a file could not be opened, mapped, read or written */
    KILN_ERR_FORMAT = 2,        /* a file is malformed (bad magic, out-of-range field, ...) */
    KILN_ERR_UNSUPPORTED = 3,   /* well-formed but not supported (architecture, type, ...) */
    KILN_ERR_INVALID_ARG = 4,   /* a caller's argument or option is out of range */
    KILN_ERR_NOMEM = 5,         /* an allocation failed */
    KILN_ERR_CONTEXT_FULL = 6,  /* the request does not fit the session's context */
    KILN_ERR_DEVICE = 7,        /* the GPU or its driver failed */
    KILN_ERR_INTERNAL = 8,
} kiln_status;

/* Short name of a status ("ok", "io", "format", ...). Never NULL. */
const char *kiln_status_name(kiln_status st);

/* The message of the last failure on this thread ("" when none). Valid until the next failing call. */
const char *kiln_last_error(void);

/* ---------------------------------------------------------------- model */

typedef struct kiln_model kiln_model;

/* Opens a GGUF model: maps the file, parses it, binds every tensor of the architecture and loads the
 * tokenizer. On failure *out is NULL. Metadata that changes the math and is not implemented (RoPE scaling
 * other than none/linear, e.g. YaRN) is KILN_ERR_UNSUPPORTED naming the key; a tensor the architecture
 * does not use is a warning naming it (an error with kiln_model_options.strict). */
kiln_status kiln_model_open(const char *path, kiln_model **out);

typedef struct kiln_model_options {
    bool strict;   /* a tensor in the file that the architecture does not use is an error (default: a warning) */
} kiln_model_options;

/* kiln_model_open with options (opt may be NULL: the defaults). */
kiln_status kiln_model_open_ex(const char *path, const kiln_model_options *opt, kiln_model **out);
void kiln_model_close(kiln_model *m);

typedef struct kiln_model_info {
    const char *arch;        /* "llama", ... */
    const char *name;        /* general.name or "" */
    int n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim;
    uint64_t n_params, file_bytes;
    int32_t bos_id, eos_id;  /* -1 when absent */
    bool add_bos;
} kiln_model_info;

/* With m NULL: zeros, arch and name "", bos_id and eos_id -1. */
void kiln_model_get_info(const kiln_model *m, kiln_model_info *out);

/* ---------------------------------------------------------------- tokenizer */

enum {
    KILN_TOK_ADD_BOS = 1,       /* prepend BOS when the vocabulary asks for it */
    KILN_TOK_PARSE_SPECIAL = 2, /* split on special-token strings (chat templates); plain text never yields them */
};

/* Tokenizes text (len bytes, not necessarily NUL-terminated). Writes at most cap ids; *n_out receives the
 * total count (which may exceed cap: then KILN_ERR_INVALID_ARG and the caller retries with more room). */
kiln_status kiln_tokenize(const kiln_model *m, const char *text, size_t len, int flags,
                          int32_t *ids, size_t cap, size_t *n_out);

/* The raw piece of a token as the decoder would print it in isolation (may be a partial UTF-8 sequence). */
kiln_status kiln_token_piece(const kiln_model *m, int32_t id, char *buf, size_t cap, size_t *n_out);

/* Streaming detokenizer: feed ids, get bytes that form complete UTF-8 characters. */
typedef struct kiln_detok {
    const kiln_model *model;
    uint8_t pending[8];
    int n_pending;
    bool at_start;      /* strip the SPM dummy-prefix space of the first piece */
} kiln_detok;
void kiln_detok_init(kiln_detok *d, const kiln_model *m, bool strip_leading_space);
/* Appends the text of id to buf (cap bytes); returns the number of bytes written (complete chars only). */
size_t kiln_detok_push(kiln_detok *d, int32_t id, char *buf, size_t cap);
/* Flushes whatever is pending (invalid UTF-8 is replaced by U+FFFD). A NULL d (or buf with cap > 0)
 * writes nothing and returns 0; kiln_detok_init(NULL, ...) does nothing. */
size_t kiln_detok_flush(kiln_detok *d, char *buf, size_t cap);

bool kiln_token_is_eog(const kiln_model *m, int32_t id);

/* ---------------------------------------------------------------- session */

typedef enum kiln_device { KILN_DEVICE_AUTO = 0, KILN_DEVICE_CPU = 1, KILN_DEVICE_CUDA = 2 } kiln_device;

typedef struct kiln_session_options {
    int n_ctx;        /* positions per sequence; 0: min(model context, 4096) */
    int n_threads;    /* 0: number of online cores */
    int max_batch;    /* most rows of one forward pass (kiln_batch, a prefill chunk); 0: min(n_ctx, 512) */
    int n_seq;        /* independent sequences (slots), each with its own KV region of n_ctx; 0: 1; at most 256 */
    kiln_device device;
    bool no_warm;     /* skip the warm pass (for measuring what it buys; never the default) */
    /* Experimental CUDA paths (ignored on the CPU; may change between versions):
     * cuda_no_graph: launch the decode step's kernels eagerly instead of replaying the captured graph;
     * cuda_no_pdl: no programmatic dependent launch between kernels (sm_90+);
     * cuda_moe_per_row: a mixture-of-experts feed-forward reads each row's chosen experts for every call,
     * never the grouped path (each chosen expert's weights read once per call) that calls of many rows take. */
    bool cuda_no_graph, cuda_no_pdl, cuda_moe_per_row;
} kiln_session_options;

typedef struct kiln_session kiln_session;

/* Opens a session: picks the backend, allocates and touches every buffer for n_seq sequences of n_ctx
 * positions, prepares the weights, loads every kernel, runs a warm pass over the batch shapes (a mixed
 * prefill + decode step, decode steps of 1, 2, 4, ... sequences), then resets KV cache and counters.
 * On CUDA, one row runs its sequence's captured decode graph (one graph per sequence); larger batches run
 * eagerly through kernels loaded at open.
 * Sessions are independent: two of them (one model or two) may run at once from different threads; one
 * session is used by one thread at a time. Every session call given a NULL session returns
 * KILN_ERR_INVALID_ARG; the getters return 0 (kiln_session_n_past and kiln_seq_n_past -1, backend "") and
 * kiln_session_reset / kiln_session_close do nothing. */
kiln_status kiln_session_open(kiln_model *m, const kiln_session_options *opt, kiln_session **out);
void kiln_session_close(kiln_session *s);

/* ---- many sequences in one session (continuous batching) ----
 * A session holds n_seq sequences. kiln_batch advances any mix of them in one forward pass: each row is
 * (sequence, token id) at that sequence's next position (rows of one sequence follow each other in order),
 * so a new prompt (many rows of one sequence) is processed in the same pass as other sequences' decode
 * steps (one row each). Weights are read once per call for all rows. A sequence's results in a batch equal
 * its results alone. The single-sequence calls below (kiln_prefill, kiln_decode, ...) act on sequence 0. */

enum {
    KILN_OUT_NONE = 0,    /* no output for this row (a prompt row that is not the last) */
    KILN_OUT_LOGITS = 1,  /* the row's logits (n_vocab floats) and their argmax */
    KILN_OUT_ARGMAX = 2,  /* only the argmax (greedy; lowest id on ties; on a GPU 4 bytes come back) */
    KILN_OUT_SAMPLE = 3,  /* an id drawn with the row's sampler (the caller accepts it into the sampler) */
};

typedef struct kiln_sampler kiln_sampler;

typedef struct kiln_batch_row {
    int32_t seq;             /* 0 .. n_seq-1 */
    int32_t id;              /* token id */
    int32_t out;             /* KILN_OUT_* */
    kiln_sampler *sampler;   /* KILN_OUT_SAMPLE only */
} kiln_batch_row;

typedef struct kiln_batch_output {
    int32_t row;             /* index of the row in the call */
    int32_t id;              /* argmax (LOGITS, ARGMAX) or the sampled id (SAMPLE) */
    const float *logits;     /* KILN_OUT_LOGITS: n_vocab floats valid until the next call on the session; else NULL */
} kiln_batch_output;

/* Runs rows[0..n) in one forward pass (1 <= n <= max_batch; at most n_seq rows may ask for an output).
 * out receives one entry per row whose out != KILN_OUT_NONE, in row order (out_cap >= their count);
 * *n_out (may be NULL) their count. An unknown sequence, a sequence whose context would overflow, an
 * empty or oversize batch, a bad id or too many outputs fail with a message naming the row, and change
 * nothing for any sequence. */
kiln_status kiln_batch(kiln_session *s, const kiln_batch_row *rows, size_t n, kiln_batch_output *out,
                       size_t out_cap, size_t *n_out);
/* Prefills n tokens of one sequence, split into max_batch chunks (the helper for long prompts); *logits
 * (may be NULL) receives the last position's logits. On failure the sequence is as it was before. */
kiln_status kiln_seq_prefill(kiln_session *s, int seq, const int32_t *ids, size_t n, const float **logits);
/* Forgets every position of one sequence. */
kiln_status kiln_seq_reset(kiln_session *s, int seq);
/* Keeps the first n positions of one sequence (prompt-prefix reuse); n <= its n_past. */
kiln_status kiln_seq_rewind(kiln_session *s, int seq, int n);
/* Positions held by a sequence (-1 for an unknown sequence or a NULL session). */
int kiln_seq_n_past(const kiln_session *s, int seq);
int kiln_session_n_seq(const kiln_session *s);
/* Bytes of KV cache per sequence (all allocated at open). */
uint64_t kiln_session_kv_bytes_per_seq(const kiln_session *s);

/* Runs n prompt tokens (all in one call, chunked by max_batch); *logits receives the last position's
 * logits (n_vocab floats, valid until the next call). Fails with KILN_ERR_CONTEXT_FULL when the tokens do
 * not fit the remaining context; then nothing is changed. */
kiln_status kiln_prefill(kiln_session *s, const int32_t *ids, size_t n, const float **logits);
/* Runs one token at the next position. */
kiln_status kiln_decode(kiln_session *s, int32_t id, const float **logits);
/* Greedy decode: runs one token and returns the argmax of its logits (lowest id on ties) without
 * copying the logits (on a GPU only 4 bytes come back). */
kiln_status kiln_decode_greedy(kiln_session *s, int32_t id, int32_t *next);
/* Keeps the first n positions and forgets the rest (n <= kiln_session_n_past), e.g. to reuse the common
 * prefix of a re-rendered chat prompt. */
kiln_status kiln_session_rewind(kiln_session *s, int n);
/* Forgets every position of sequence 0 (the KV cache is reused, nothing is freed). */
void kiln_session_reset(kiln_session *s);
int kiln_session_n_past(const kiln_session *s);
int kiln_session_n_ctx(const kiln_session *s);
int kiln_session_n_threads(const kiln_session *s);
const char *kiln_session_backend(const kiln_session *s);

/* Counters of what happened inside this session's own calls since the end of kiln_session_open (the
 * first-call contract: all stay 0); what the caller does between them (tokenize, a sampler) is not counted. */
typedef struct kiln_stats {
    uint64_t host_allocs;      /* heap allocations by kiln */
    uint64_t device_allocs;    /* device memory allocations */
    uint64_t module_loads;     /* GPU module / kernel loads */
    uint64_t graph_captures;   /* graph captures or instantiations */
    uint64_t jit_compiles;     /* runtime compilations */
    uint64_t tokens_prefilled, tokens_decoded;
    uint64_t host_sample_ns;   /* wall time kiln_batch spent drawing KILN_OUT_SAMPLE rows on the host (kiln_sample
                                * on the backend's threads: the CPU backend's draws) */
} kiln_stats;
void kiln_session_stats(const kiln_session *s, kiln_stats *out);

/* Named phases measured once each (open.map, open.parse, ..., prefill, decode). */
typedef struct kiln_phase { const char *name; uint64_t ns; } kiln_phase;
/* The open phases of the model and the session, in order; valid while the session lives. */
size_t kiln_session_open_phases(const kiln_session *s, const kiln_phase **out);

/* ---------------------------------------------------------------- sampling */

typedef struct kiln_sampler_params {
    float temperature;     /* <= 0: greedy */
    int top_k;             /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off */
    int repeat_last_n;     /* window of the repetition, presence and frequency penalties */
    uint64_t seed;
    float presence_penalty;   /* OpenAI's: subtracted once from the logit of every id in the window; 0: off */
    float frequency_penalty;  /* OpenAI's: subtracted per occurrence in the window; 0: off */
} kiln_sampler_params;

/* llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.0 over 64. */
kiln_sampler_params kiln_sampler_defaults(void);

/* Validates p (temperature <= 100, top-p and min-p in 0..1, repeat penalty in (0, 10], presence and
 * frequency penalties in -2..2, repeat-last-n in 0..2^20; the message names the field) and allocates every
 * buffer that sampling over n_vocab ids needs. */
kiln_status kiln_sampler_open(const kiln_sampler_params *p, int n_vocab, kiln_sampler **out);
void kiln_sampler_close(kiln_sampler *s);
/* Validates p for n_vocab ids as kiln_sampler_open does, allocating nothing. */
kiln_status kiln_sampler_check(const kiln_sampler_params *p, int n_vocab);
/* Gives an open sampler new parameters and resets it (window emptied, RNG reseeded), allocating nothing, so a
 * server can open one sampler per slot at startup: p->repeat_last_n may not exceed the window the sampler was
 * opened with. On failure the sampler is unchanged. */
kiln_status kiln_sampler_reconfigure(kiln_sampler *s, const kiln_sampler_params *p);
/* Picks the next id from logits (n_vocab floats, not modified); does not allocate; -1 when s or logits is NULL
 * (kiln_sampler_accept / reset / close with a NULL sampler do nothing). The penalties apply first
 * (llama.cpp's order: repeat, then frequency * count + presence), then greedy or top-k -> top-p -> min-p ->
 * temperature -> draw. */
int32_t kiln_sample(kiln_sampler *s, const float *logits);
/* Records an id in the repetition window (prompt and generated tokens). */
void kiln_sampler_accept(kiln_sampler *s, int32_t id);
void kiln_sampler_reset(kiln_sampler *s);
/* What OpenAI's logprobs report, for the distribution of the last kiln_sample call: the log-softmax at
 * temperature 1 of that call's logits after the penalties (before top-k, top-p, min-p and temperature),
 * over the whole vocabulary. The logits passed to that call must still be valid (the session not called
 * since); kiln_sampler_accept in between is fine. Neither allocates.
 * kiln_sampler_top writes the min(n, n_vocab) most likely ids, most likely first (ties: lower id first), and
 * their logprobs; returns that count (0 before any kiln_sample since open / reset, or for n <= 0).
 * kiln_sampler_logprob returns one id's logprob (e.g. the chosen token's); NAN before any kiln_sample or
 * for an id outside the vocabulary. */
int kiln_sampler_top(kiln_sampler *s, int n, int32_t *ids, float *logprobs);
float kiln_sampler_logprob(kiln_sampler *s, int32_t id);

/* ---------------------------------------------------------------- chat */

typedef struct kiln_chat_message {
    const char *role;      /* "system", "user", "assistant", "tool", ... (UTF-8, NUL-terminated) */
    const char *content;
} kiln_chat_message;

typedef struct kiln_chat_template kiln_chat_template;

/* Compiles a chat template: name_or_path NULL or "" takes the model's tokenizer.chat_template; else a
 * built-in (chatml, llama2, llama3, mistral, gemma, phi3, zephyr) or a .jinja / tokenizer_config.json
 * file. An unsupported construct fails here, naming it and its line:column. The template keeps a pointer
 * to m (close it before the model). */
kiln_status kiln_chat_template_open(const kiln_model *m, const char *name_or_path, kiln_chat_template **out);
void kiln_chat_template_close(kiln_chat_template *t);

/* Renders a conversation to the prompt text (as llama_chat_apply_template does). Writes at most cap
 * bytes plus a NUL; *n_out receives the full length (> cap - 1: KILN_ERR_INVALID_ARG, retry with more). */
kiln_status kiln_chat_apply(const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n,
                            bool add_generation_prompt, char *buf, size_t cap, size_t *n_out);

/* Renders and tokenizes a conversation safely: the template's own markup is parsed for special tokens,
 * the text of message contents is not (a user cannot forge <|im_start|>system). BOS as the vocabulary
 * asks, unless the template wrote it. Writes at most cap ids; *n_out the total (> cap: KILN_ERR_INVALID_ARG). */
kiln_status kiln_chat_tokenize(const kiln_chat_template *t, const kiln_chat_message *msgs, size_t n,
                               bool add_generation_prompt, int32_t *ids, size_t cap, size_t *n_out);

#ifdef __cplusplus
}
#endif
#endif
