/*
 * cmd_chat.c — `kiln chat`: an interactive conversation in the terminal. Each user line is added to the
 * history, the whole conversation is rendered with the chat template and tokenized with parse_special;
 * the tokens shared with what the KV cache already holds are kept (kiln_session_rewind), only the rest is
 * prefilled. The reply streams until an end-of-generation token. Ctrl-D ends; a full context is a clear
 * message, never a silent wrap.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/chat_prompt.h"
#include "cli/cli.h"

static const char *usage_text =
    "usage: kiln chat -m MODEL [options]\n"
    "Talks with a chat model in the terminal: type a message and Enter; Ctrl-D ends the conversation.\n"
    "  -m, --model FILE        GGUF model with a chat template\n"
    "      --system TEXT       system message\n"
    "      --chat-template T   a built-in template (chatml, llama2, llama3, mistral, gemma, phi3, zephyr) or a\n"
    "                          file, instead of the model's tokenizer.chat_template\n"
    "  -n, --n-predict N       most tokens per reply (default: until end of turn or the context is full)\n"
    "      --temp T, --top-k K, --top-p P, --min-p M, --repeat-penalty R, --seed S   sampling (as kiln run)\n"
    "      --ctx N             context length (default min(model context, 4096))\n"
    "      --threads N         CPU threads\n"
    "      --device D          cpu, cuda or auto\n"
    "  -h, --help              this help\n";

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

static void history_free(history *h) {
    for (size_t i = 0; i < h->n; i++) free(h->owned[i]);
    free(h->msgs);
    free(h->owned);
}

int cmd_chat(int argc, char **argv) {
    const char *model = NULL, *system = NULL, *tmpl = NULL;
    kiln_device device = KILN_DEVICE_AUTO;
    long n_predict = -1, ctx = 0, threads = 0;
    kiln_sampler_params sp = kiln_sampler_defaults();
    sp.seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *a = argv[i];
        bool err = false;
        int rc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(usage_text, stdout); return 0; }
        else if (cli_opt(argc, argv, &i, "-m", &v, &err) || cli_opt(argc, argv, &i, "--model", &v, &err)) model = v;
        else if (cli_opt(argc, argv, &i, "--system", &v, &err)) system = v;
        else if (cli_opt(argc, argv, &i, "--chat-template", &v, &err)) tmpl = v;
        else if (cli_opt(argc, argv, &i, "--device", &v, &err)) { if (!err && !cli_parse_device("chat", v, &device)) return 2; }
        else if (cli_opt(argc, argv, &i, "-n", &v, &err) || cli_opt(argc, argv, &i, "--n-predict", &v, &err)) {
            if (!err && !cli_parse_int("chat", a, v, 1, 1 << 24, &n_predict)) return 2;
        } else if (cli_opt(argc, argv, &i, "--ctx", &v, &err)) {
            if (!err && !cli_parse_int("chat", a, v, 16, 1 << 20, &ctx)) return 2;
        } else if (cli_opt(argc, argv, &i, "--threads", &v, &err)) {
            if (!err && !cli_parse_int("chat", a, v, 1, 1024, &threads)) return 2;
        } else if ((rc = cli_sampler_opt("chat", argc, argv, &i, &sp, NULL)) != 0) {
            if (rc == 2) return 2;
        } else return cli_usage_error("chat", usage_text, "unknown option '%s'", a);
        if (err) return 2;
    }
    if (!model) return cli_usage_error("chat", usage_text, "a model is required (-m MODEL.gguf)");
    kiln_session_options so = {.n_ctx = (int)ctx, .n_threads = (int)threads, .device = device};

    kiln_model *m = NULL;
    kiln_session *s = NULL;
    kiln_sampler *smp = NULL;
    chat_prompt cp = {0};
    history h = {0};
    int32_t *cached = NULL;   /* the tokens the KV cache holds, in order */
    size_t n_cached = 0;
    char *line = NULL;
    size_t line_cap = 0;
    int rc = 1;
    if (kiln_model_open(model, &m) != KILN_OK || kiln_session_open(m, &so, &s) != KILN_OK) {
        cli_error("chat", "%s", kiln_last_error());
        goto done;
    }
    if (!chat_prompt_open("chat", m, tmpl, &cp)) goto done;
    kiln_model_info mi;
    kiln_model_get_info(m, &mi);
    if (kiln_sampler_open(&sp, mi.n_vocab, &smp) != KILN_OK) { cli_error("chat", "%s", kiln_last_error()); goto done; }
    const int n_ctx = kiln_session_n_ctx(s);
    cached = malloc((size_t)n_ctx * sizeof *cached);
    if (!cached || (system && !history_add(&h, "system", system))) { cli_error("chat", "out of memory"); goto done; }
    const bool tty = isatty(0);
    if (tty) fprintf(stderr, "kiln chat · %s · %s · context %d tokens · Ctrl-D to end\n", mi.name[0] ? mi.name : model,
                     kiln_session_backend(s), n_ctx);
    for (;;) {
        if (tty) fputs("> ", stderr);
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0) continue;
        if (!history_add(&h, "user", line)) { cli_error("chat", "out of memory"); goto done; }
        size_t n_ids;
        int32_t *ids = NULL;
        if (!chat_prompt_tokens("chat", &cp, h.msgs, h.n, &ids, &n_ids)) goto done;
        if (n_ids + 1 > (size_t)n_ctx) {
            fprintf(stderr, "kiln chat: the context is full: the conversation needs %zu tokens of %d; start a new chat "
                    "or raise --ctx\n", n_ids + 1, n_ctx);
            free(ids);
            rc = 0;
            goto done;
        }
        /* keep the common prefix of what the cache holds, prefill the rest */
        size_t keep = 0;
        while (keep < n_cached && keep < n_ids && cached[keep] == ids[keep]) keep++;
        if (keep == n_ids) keep--; /* the last prompt token must run to give logits */
        kiln_session_rewind(s, (int)keep);
        const float *logits;
        kiln_status st = kiln_prefill(s, ids + keep, n_ids - keep, &logits);
        memcpy(cached, ids, n_ids * sizeof *ids);
        n_cached = n_ids;
        free(ids);
        if (st != KILN_OK) { cli_error("chat", "%s", kiln_last_error()); goto done; }
        /* the reply */
        kiln_detok d;
        kiln_detok_init(&d, m, false);
        char buf[1024], *reply = NULL; /* the longest piece is about 1 KiB */
        size_t reply_len = 0;
        bool full = false;
        for (long i = 0; n_predict < 0 || i < n_predict; i++) {
            int32_t id = kiln_sample(smp, logits);
            kiln_sampler_accept(smp, id);
            if (kiln_token_is_eog(m, id)) break;
            size_t nb = kiln_detok_push(&d, id, buf, sizeof buf);
            fwrite(buf, 1, nb, stdout);
            fflush(stdout);
            char *r = realloc(reply, reply_len + nb + 1);
            if (!r) break;
            reply = r;
            memcpy(reply + reply_len, buf, nb);
            reply_len += nb;
            reply[reply_len] = '\0';
            if (kiln_session_n_past(s) >= n_ctx) { full = true; break; }
            if (kiln_decode(s, id, &logits) != KILN_OK) { cli_error("chat", "%s", kiln_last_error()); free(reply); goto done; }
            cached[n_cached++] = id;
        }
        size_t nb = kiln_detok_flush(&d, buf, sizeof buf);
        fwrite(buf, 1, nb, stdout);
        putchar('\n');
        fflush(stdout);
        bool added = history_add(&h, "assistant", reply ? reply : "");
        free(reply);
        if (!added) { cli_error("chat", "out of memory"); goto done; }
        if (full) {
            fprintf(stderr, "kiln chat: the context is full (%d tokens); start a new chat or raise --ctx\n", n_ctx);
            rc = 0;
            goto done;
        }
    }
    if (tty) fputc('\n', stderr);
    rc = 0;
done:
    free(line);
    free(cached);
    history_free(&h);
    chat_prompt_close(&cp);
    kiln_sampler_close(smp);
    kiln_session_close(s);
    kiln_model_close(m);
    return rc;
}
