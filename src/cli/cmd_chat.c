/*
 * cmd_chat.c — `kiln chat`: an interactive conversation in the terminal.
 *
 * Each user line is added to the history and the whole conversation is tokenized with the chat template
 * (kiln_chat_tokenize: the template's markup gives special tokens, message content never does). The
 * tokens shared with what the KV cache already holds are kept (kiln_session_rewind), only the rest is
 * prefilled. The reply streams until an end-of-generation token.
 *
 * - Ctrl-C during a reply stops it and returns to the prompt; the reply is kept in the conversation as
 *   far as it was generated (it is also what the cache holds). Ctrl-C at a prompt with typed text drops
 *   the text; at an empty prompt it ends the chat, as Ctrl-D does.
 * - When the conversation no longer fits the context (with room for a reply), the oldest turns after the
 *   system message are dropped, a note says so, and the cache is rebuilt for what remains.
 * - After each reply one line on stderr: tokens, time to first token (from Enter), tokens/s (--quiet
 *   hides it). --verbose prints the prompt ids of each turn on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/chat_input.h"
#include "cli/chat_prompt.h"
#include "base/timing.h"
#include "cli/cli.h"

static const char *usage_text =
    "usage: kiln chat -m MODEL [options]\n"
    "Talks with a chat model in the terminal: type a message and Enter. Ctrl-C stops a reply; Ctrl-C at an\n"
    "empty prompt or Ctrl-D ends the conversation. On a terminal the line can be edited (arrow keys, history,\n"
    "Ctrl-R); piped input is read line by line.\n"
    "  -m, --model FILE        GGUF model with a chat template\n"
    "      --system TEXT       system message\n"
    "      --chat-template T   a built-in template (chatml, llama2, llama3, mistral, gemma, phi3, zephyr) or a\n"
    "                          file, instead of the model's tokenizer.chat_template\n"
    "  -n, --n-predict N       most tokens per reply (default, or -1: until end of turn or the context is full)\n"
    "      --temp T, --top-k K, --top-p P, --min-p M, --repeat-penalty R, --seed S   sampling (as kiln run)\n"
    "      --ctx N             context length (default min(model context, 4096)); when the conversation\n"
    "                          outgrows it, the oldest turns after the system message are dropped\n"
    "      --threads N         CPU threads\n"
    "      --device D          cpu, cuda or auto\n"
      "      --strict            refuse a model file with tensors its architecture does not use\n"
    "      --quiet             no statistics line after each reply\n"
    "      --verbose           print each turn's prompt token ids on stderr\n"
    "  -h, --help              this help\n";

typedef struct chat_opts {
    const char *model, *system, *tmpl;
    kiln_device device;
    long n_predict, ctx, threads;
    bool quiet, verbose;
    kiln_model_options mo;
    kiln_sampler_params sp;
} chat_opts;

/* ---------------------------------------------------------------- the conversation */

typedef struct history {
    kiln_chat_message *msgs;
    char **owned;     /* the strings we copied, freed at the end */
    size_t n, cap;
} history;

static bool history_add(history *h, const char *role, const char *content) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 16;
        kiln_chat_message *m = realloc(h->msgs, cap * sizeof *m);
        char **o = m ? realloc(h->owned, cap * sizeof *o) : NULL;
        if (!m || !o) { if (m) h->msgs = m; return false; }
        h->msgs = m;
        h->owned = o;
        h->cap = cap;
    }
    char *c = strdup(content);
    if (!c) return false;
    h->owned[h->n] = c;
    h->msgs[h->n++] = (kiln_chat_message){role, c};
    return true;
}

/* Removes messages [from, from + count). */
static void history_drop(history *h, size_t from, size_t count) {
    for (size_t i = from; i < from + count; i++) free(h->owned[i]);
    memmove(h->msgs + from, h->msgs + from + count, (h->n - from - count) * sizeof *h->msgs);
    memmove(h->owned + from, h->owned + from + count, (h->n - from - count) * sizeof *h->owned);
    h->n -= count;
}

static void history_free(history *h) {
    for (size_t i = 0; i < h->n; i++) free(h->owned[i]);
    free(h->msgs);
    free(h->owned);
}

/* ---------------------------------------------------------------- one session of chatting */

typedef struct chat {
    const chat_opts *o;
    kiln_model *m;
    kiln_session *s;
    kiln_sampler *smp;
    chat_prompt cp;
    history h;
    int32_t *cached;   /* the tokens the KV cache holds, in order */
    size_t n_cached;
    int n_ctx;
} chat;

/* Prints "kiln chat: message" and returns false (for the chat's bool-returning steps). */
static bool chat_fail(const char *msg) {
    cli_error("chat", "%s", msg);
    return false;
}

/* Room a prompt leaves for the reply: -n when given, else a quarter of the context (at most half). */
static size_t reply_room(const chat *c) {
    size_t q = (size_t)c->n_ctx / 4, half = (size_t)c->n_ctx / 2;
    size_t want = c->o->n_predict > 0 ? (size_t)c->o->n_predict : q;
    return want < 1 ? 1 : want > half ? half : want;
}

/* Tokenizes the conversation, dropping the oldest turns after the system message until it fits with
 * room for a reply. Returns false (message printed) when even the last message alone does not fit: then
 * that message is removed from the history. *ids is malloc'd. */
static bool fit_prompt(chat *c, int32_t **ids, size_t *n_ids, bool *fatal) {
    size_t dropped = 0, room = reply_room(c);
    *fatal = false;
    for (;;) {
        if (!chat_prompt_tokens("chat", &c->cp, c->h.msgs, c->h.n, ids, n_ids)) { *fatal = true; return false; }
        size_t first = c->h.n && !strcmp(c->h.msgs[0].role, "system") ? 1 : 0;
        bool can_drop = c->h.n - 1 > first;   /* something between the system message and the new one */
        if (*n_ids + room <= (size_t)c->n_ctx || (!can_drop && *n_ids + 1 <= (size_t)c->n_ctx)) break;
        free(*ids);
        *ids = NULL;
        if (!can_drop) {
            fprintf(stderr, "kiln chat: this message needs %zu tokens with the conversation's start, more than the "
                    "context of %d; it was not sent (raise --ctx)\n", *n_ids, c->n_ctx);
            history_drop(&c->h, c->h.n - 1, 1);
            return false;
        }
        /* a user turn goes with the assistant's answer to it */
        size_t count = c->h.n - 1 > first + 1 && !strcmp(c->h.msgs[first].role, "user") &&
                       !strcmp(c->h.msgs[first + 1].role, "assistant") ? 2 : 1;
        history_drop(&c->h, first, count);
        dropped += count;
    }
    if (dropped)
        fprintf(stderr, "kiln chat: the context (%d tokens) is full: dropped the %zu oldest message%s; the cache is "
                "rebuilt for the %zu tokens that remain\n", c->n_ctx, dropped, dropped == 1 ? "" : "s", *n_ids);
    return true;
}

static void print_ids(const char *what, const int32_t *ids, size_t n, size_t reused) {
    fprintf(stderr, "kiln chat: %s %zu tokens (%zu reused from the cache): [", what, n, reused);
    for (size_t i = 0; i < n; i++) fprintf(stderr, i ? ",%d" : "%d", (int)ids[i]);
    fputs("]\n", stderr);
}

/* Runs the prompt: keeps the cache's common prefix, prefills the rest. */
static bool run_prompt(chat *c, const int32_t *ids, size_t n_ids, const float **logits) {
    size_t keep = 0;
    while (keep < c->n_cached && keep < n_ids && c->cached[keep] == ids[keep]) keep++;
    if (keep == n_ids) keep--; /* the last prompt token must run to give logits */
    if (c->o->verbose) print_ids("prompt", ids, n_ids, keep);
    kiln_status st = kiln_session_rewind(c->s, (int)keep);
    c->n_cached = keep;
    if (st == KILN_OK) st = kiln_prefill(c->s, ids + keep, n_ids - keep, logits);
    if (st != KILN_OK) return chat_fail(kiln_last_error());
    memcpy(c->cached, ids, n_ids * sizeof *ids);
    c->n_cached = n_ids;
    return true;
}

typedef struct reply {
    char *text;
    size_t len;
    long n_tokens;
    uint64_t t_first;
    bool full, interrupted;
} reply;

static bool reply_append(reply *r, const char *p, size_t n) {
    char *t = realloc(r->text, r->len + n + 1);
    if (!t) return false;
    r->text = t;
    memcpy(r->text + r->len, p, n);
    r->len += n;
    r->text[r->len] = '\0';
    return true;
}

/* Streams the reply from logits until an end of generation, -n, a full context or Ctrl-C. */
static bool generate(chat *c, const float *logits, reply *r) {
    kiln_detok d;
    kiln_detok_init(&d, c->m, false);
    char buf[1024]; /* the longest piece is about 1 KiB */
    bool ok = true;
    for (long i = 0; c->o->n_predict <= 0 || i < c->o->n_predict; i++) {
        if (chat_input_interrupted()) { r->interrupted = true; break; }
        int32_t id = kiln_sample(c->smp, logits);
        kiln_sampler_accept(c->smp, id);
        if (!r->t_first) r->t_first = kiln_now_ns();
        if (kiln_token_is_eog(c->m, id)) break;
        r->n_tokens++;
        size_t nb = kiln_detok_push(&d, id, buf, sizeof buf);
        fwrite(buf, 1, nb, stdout);
        fflush(stdout);
        if (!reply_append(r, buf, nb)) { ok = chat_fail("out of memory"); break; }
        if (kiln_session_n_past(c->s) >= c->n_ctx) { r->full = true; break; }
        if (kiln_decode(c->s, id, &logits) != KILN_OK) { ok = chat_fail(kiln_last_error()); break; }
        c->cached[c->n_cached++] = id;
    }
    size_t nb = kiln_detok_flush(&d, buf, sizeof buf);
    fwrite(buf, 1, nb, stdout);
    putchar('\n');
    fflush(stdout);
    return reply_append(r, buf, nb) && ok;
}

static void print_stats(const reply *r, uint64_t t_enter) {
    uint64_t t_end = kiln_now_ns();
    double ttft_ms = r->t_first ? (double)(r->t_first - t_enter) / 1e6 : 0;
    double gen_s = r->t_first ? (double)(t_end - r->t_first) / 1e9 : 0;
    if (r->n_tokens > 1 && gen_s > 0)
        fprintf(stderr, "[%ld tokens, first token %.0f ms, %.1f tokens/s]\n", r->n_tokens, ttft_ms,
                (double)(r->n_tokens - 1) / gen_s);
    else
        fprintf(stderr, "[%ld tokens, first token %.0f ms]\n", r->n_tokens, ttft_ms);
}

/* One turn: the user's line is in the history already. Returns false on a fatal error. */
static bool turn(chat *c, uint64_t t_enter) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    bool fatal;
    if (!fit_prompt(c, &ids, &n_ids, &fatal)) return !fatal;
    const float *logits;
    bool ok = run_prompt(c, ids, n_ids, &logits);
    free(ids);
    if (!ok) return false;
    reply r = {0};
    ok = generate(c, logits, &r);
    if (r.interrupted) fputs("kiln chat: interrupted (Ctrl-C again at an empty prompt ends the chat)\n", stderr);
    chat_input_clear();
    if (ok && !c->o->quiet) print_stats(&r, t_enter);
    if (ok && r.full)
        fprintf(stderr, "kiln chat: the reply reached the end of the context (%d tokens); the oldest turns will be "
                "dropped for the next message\n", c->n_ctx);
    if (ok && !history_add(&c->h, "assistant", r.text ? r.text : "")) ok = chat_fail("out of memory");
    free(r.text);
    return ok;
}

static bool chat_open(chat *c, const chat_opts *o) {
    memset(c, 0, sizeof *c);
    c->o = o;
    kiln_session_options so = {.n_ctx = (int)o->ctx, .n_threads = (int)o->threads, .device = o->device};
    if (kiln_model_open_ex(o->model, &o->mo, &c->m) != KILN_OK || kiln_session_open(c->m, &so, &c->s) != KILN_OK)
        return chat_fail(kiln_last_error());
    if (!chat_prompt_open("chat", c->m, o->tmpl, &c->cp)) return false;
    kiln_model_info mi;
    kiln_model_get_info(c->m, &mi);
    if (kiln_sampler_open(&o->sp, mi.n_vocab, &c->smp) != KILN_OK) return chat_fail(kiln_last_error());
    c->n_ctx = kiln_session_n_ctx(c->s);
    c->cached = malloc((size_t)c->n_ctx * sizeof *c->cached);
    if (!c->cached || (o->system && !history_add(&c->h, "system", o->system))) return chat_fail("out of memory");
    return true;
}

static void chat_close(chat *c) {
    free(c->cached);
    history_free(&c->h);
    chat_prompt_close(&c->cp);
    kiln_sampler_close(c->smp);
    kiln_session_close(c->s);
    kiln_model_close(c->m);
}

/* ---------------------------------------------------------------- the command */

static int parse_opts(int argc, char **argv, chat_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = KILN_DEVICE_AUTO;
    o->n_predict = -1;
    o->sp = kiln_sampler_defaults();
    o->sp.seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *a = argv[i];
        bool err = false;
        int rc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (!strcmp(a, "--strict")) o->mo.strict = true;
        else if (!strcmp(a, "--quiet")) o->quiet = true;
        else if (!strcmp(a, "--verbose")) o->verbose = true;
        else if (cli_opt(argc, argv, &i, "-m", &v, &err) || cli_opt(argc, argv, &i, "--model", &v, &err)) o->model = v;
        else if (cli_opt(argc, argv, &i, "--system", &v, &err)) o->system = v;
        else if (cli_opt(argc, argv, &i, "--chat-template", &v, &err)) o->tmpl = v;
        else if (cli_opt(argc, argv, &i, "--device", &v, &err)) { if (!err && !cli_parse_device("chat", v, &o->device)) return 2; }
        else if (cli_opt(argc, argv, &i, "-n", &v, &err) || cli_opt(argc, argv, &i, "--n-predict", &v, &err)) {
            if (!err && !cli_parse_n_predict("chat", a, v, &o->n_predict)) return 2;
            if (!err && o->n_predict == 0) return cli_usage_error("chat", usage_text, "-n must be -1 or at least 1");
        } else if (cli_opt(argc, argv, &i, "--ctx", &v, &err)) {
            if (!err && !cli_parse_int("chat", a, v, 16, 1 << 20, &o->ctx)) return 2;
        } else if (cli_opt(argc, argv, &i, "--threads", &v, &err)) {
            if (!err && !cli_parse_int("chat", a, v, 1, 1024, &o->threads)) return 2;
        } else if ((rc = cli_sampler_opt("chat", argc, argv, &i, &o->sp, NULL)) != 0) {
            if (rc == 2) return 2;
        } else return cli_usage_error("chat", usage_text, "unknown option '%s'", a);
        if (err) return 2;
    }
    if (!o->model) return cli_usage_error("chat", usage_text, "a model is required (-m MODEL.gguf)");
    return -1;
}

int cmd_chat(int argc, char **argv) {
    chat_opts o;
    int prc = parse_opts(argc, argv, &o);
    if (prc >= 0) return prc;
    chat c;
    int rc = 1;
    if (!chat_open(&c, &o)) goto done;
    const bool tty = isatty(0);
    if (tty) {
        kiln_model_info mi;
        kiln_model_get_info(c.m, &mi);
        fprintf(stderr, "kiln chat · %s · %s · context %d tokens · Ctrl-C stops a reply · Ctrl-D ends\n",
                mi.name[0] ? mi.name : o.model, kiln_session_backend(c.s), c.n_ctx);
    }
    chat_input_open(tty);
    for (;;) {
        char *line = NULL;
        chat_in in = chat_input_read(&line);
        if (in == CHAT_IN_EOF || in == CHAT_IN_QUIT) break;
        if (in == CHAT_IN_CANCEL || !line[0]) { free(line); continue; }
        uint64_t t_enter = kiln_now_ns();
        bool added = history_add(&c.h, "user", line);
        free(line);
        if (!added) { cli_error("chat", "out of memory"); goto done_input; }
        if (!turn(&c, t_enter)) goto done_input;
    }
    if (tty) fputc('\n', stderr);
    rc = 0;
done_input:
    chat_input_close();
done:
    chat_close(&c);
    return rc;
}
