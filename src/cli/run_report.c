/* run_report.c — the generation loop of `kiln run` and its phase/timing report (text or JSON). */
#include "cli/run_report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/chat_prompt.h"
#include "base/timing.h"
#include "cli/cli.h"

typedef struct round_result {
    size_t n_prompt;
    uint64_t prefill_ns, decode_ns, decode_min, decode_max;
    int n_gen, n_decode;
    bool eog, write_failed;
    char *text;
    size_t text_len, text_cap;
    int32_t *ids;   /* the generated ids (n_gen; the end-of-generation id included), room for n_predict */
} round_result;

static void text_append(round_result *r, const char *s, size_t n) {
    if (r->text_len + n + 1 > r->text_cap) {
        size_t cap = (r->text_cap ? r->text_cap * 2 : 4096) + n;
        char *t = realloc(r->text, cap);
        if (!t) return;
        r->text = t;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, s, n);
    r->text_len += n;
    r->text[r->text_len] = '\0';
}

/* Appends to the round's text and streams it; a failed write (a full disk, a closed pipe) stops the round. */
static void emit(const run_setup *s, round_result *r, const char *buf, size_t n) {
    if (!n) return;
    text_append(r, buf, n);
    if (!s->json && !s->quiet && (fwrite(buf, 1, n, stdout) != n || fflush(stdout) != 0)) r->write_failed = true;
}

/* One round: prefill the prompt, then sample/decode up to n_predict tokens. */
static kiln_status generate_round(const run_setup *s, int n_predict, kiln_model *m, kiln_session *sess,
                                  kiln_sampler *smp, const int32_t *ids, size_t n_ids, bool strip_space,
                                  round_result *r) {
    kiln_session_reset(sess);
    kiln_sampler_reset(smp);
    for (size_t i = 0; i < n_ids; i++) kiln_sampler_accept(smp, ids[i]);
    r->n_prompt = n_ids;
    r->decode_min = UINT64_MAX;
    const float *logits;
    uint64_t t0 = kiln_now_ns();
    kiln_status st = kiln_prefill(sess, ids, n_ids, &logits);
    r->prefill_ns = kiln_now_ns() - t0;
    if (st != KILN_OK) return st;
    kiln_detok d;
    kiln_detok_init(&d, m, strip_space);
    char buf[1024]; /* the longest vocabulary piece is about 1 KiB */
    const bool greedy = s->sampler.temperature <= 0.0f && s->sampler.repeat_penalty == 1.0f;
    int32_t id = kiln_sample(smp, logits);
    for (int i = 0; i < n_predict; i++) {
        r->ids[r->n_gen++] = id;
        kiln_sampler_accept(smp, id);
        if (!s->ignore_eos && kiln_token_is_eog(m, id)) { r->eog = true; break; } /* not printed */
        emit(s, r, buf, kiln_detok_push(&d, id, buf, sizeof buf));
        if (i + 1 == n_predict || r->write_failed) break;
        uint64_t t1 = kiln_now_ns();
        if (greedy) {
            st = kiln_decode_greedy(sess, id, &id);
        } else {
            st = kiln_decode(sess, id, &logits);
            if (st == KILN_OK) id = kiln_sample(smp, logits);
        }
        uint64_t dt = kiln_now_ns() - t1;
        if (st != KILN_OK) return st;
        r->decode_ns += dt;
        r->n_decode++;
        if (dt < r->decode_min) r->decode_min = dt;
        if (dt > r->decode_max) r->decode_max = dt;
    }
    emit(s, r, buf, kiln_detok_flush(&d, buf, sizeof buf));
    if (!r->n_decode) r->decode_min = 0;
    return KILN_OK;
}

static double ms(uint64_t ns) { return ns / 1e6; }

static void print_ids(const char *key, const int32_t *ids, size_t n) {
    printf(",\"%s\":[", key);
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", (int)ids[i]);
    putchar(']');
}

void run_print_open(FILE *f, const kiln_phase *ph, size_t n, uint64_t open_ns) {
    fprintf(f, "open %.1f ms (", ms(open_ns));
    for (size_t i = 0; i < n; i++) {
        const char *name = strncmp(ph[i].name, "open.", 5) ? ph[i].name : ph[i].name + 5;
        fprintf(f, "%s%s %.2f", i ? ", " : "", name, ms(ph[i].ns));
    }
    fputc(')', f);
}

static void print_round(FILE *f, const round_result *r) {
    fprintf(f, "prefill %zu tokens %.2f ms (%.0f tok/s)", r->n_prompt, ms(r->prefill_ns),
            r->prefill_ns ? r->n_prompt / (r->prefill_ns / 1e9) : 0.0);
    if (r->n_decode)
        fprintf(f, " · decode %d steps %.2f ms (mean %.3f, min %.3f, max %.3f ms; %.0f tok/s)", r->n_decode,
                ms(r->decode_ns), ms(r->decode_ns) / r->n_decode, ms(r->decode_min), ms(r->decode_max),
                r->n_decode / (r->decode_ns / 1e9));
}

/* stats: the first-call counters over the generation rounds (prefill + decode) only */
static void print_json(const run_setup *s, kiln_session *sess, const kiln_model_info *mi, const kiln_phase *ph,
                       size_t n_ph, uint64_t open_ns, const int32_t *prompt_ids, size_t n_prompt,
                       const round_result *rs, int n_rounds, const kiln_stats *base) {
    kiln_stats st;
    kiln_session_stats(sess, &st);
    st.host_allocs -= base->host_allocs;
    st.device_allocs -= base->device_allocs;
    st.module_loads -= base->module_loads;
    st.graph_captures -= base->graph_captures;
    st.jit_compiles -= base->jit_compiles;
    printf("{\"model\":");
    cli_json_str(stdout, s->model_path, strlen(s->model_path));
    printf(",\"arch\":\"%s\",\"backend\":\"%s\",\"n_ctx\":%d,\"seed\":%llu,\"load_duration\":%llu,\"open_phases\":{",
           mi->arch, kiln_session_backend(sess), kiln_session_n_ctx(sess), (unsigned long long)s->sampler.seed,
           (unsigned long long)open_ns);
    for (size_t i = 0; i < n_ph; i++) printf("%s\"%s\":%llu", i ? "," : "", ph[i].name, (unsigned long long)ph[i].ns);
    putchar('}');
    print_ids("prompt_ids", prompt_ids, n_prompt);
    printf(",\"rounds\":[");
    for (int i = 0; i < n_rounds; i++) {
        const round_result *r = &rs[i];
        printf("%s{\"prompt_eval_count\":%zu,\"prompt_eval_duration\":%llu,\"eval_count\":%d,\"decode_steps\":%d,"
               "\"eval_duration\":%llu,\"decode_min\":%llu,\"decode_max\":%llu,\"total_duration\":%llu,"
               "\"done_reason\":\"%s\",\"text\":",
               i ? "," : "", r->n_prompt, (unsigned long long)r->prefill_ns, r->n_gen, r->n_decode,
               (unsigned long long)r->decode_ns, (unsigned long long)r->decode_min, (unsigned long long)r->decode_max,
               (unsigned long long)(r->prefill_ns + r->decode_ns), r->eog ? "stop" : "length");
        cli_json_str(stdout, r->text ? r->text : "", r->text_len);
        print_ids("ids", r->ids, (size_t)r->n_gen);
        putchar('}');
    }
    printf("]");
    if (n_rounds >= 2)
        printf(",\"first_call_penalty_ns\":%lld",
               (long long)(rs[0].prefill_ns + rs[0].decode_ns) - (long long)(rs[1].prefill_ns + rs[1].decode_ns));
    printf(",\"stats\":{\"host_allocs\":%llu,\"device_allocs\":%llu,\"module_loads\":%llu,\"graph_captures\":%llu,"
           "\"jit_compiles\":%llu}}\n",
           (unsigned long long)st.host_allocs, (unsigned long long)st.device_allocs, (unsigned long long)st.module_loads,
           (unsigned long long)st.graph_captures, (unsigned long long)st.jit_compiles);
}

int run_generate(const run_setup *s) {
    kiln_model *m = NULL;
    kiln_session *sess = NULL;
    kiln_sampler *smp = NULL;
    int32_t *ids = NULL;
    round_result *rs = calloc((size_t)s->rounds, sizeof *rs);
    int rc = 1;
    if (!rs) return cli_error("run", "out of memory");
    uint64_t t0 = kiln_now_ns();
    kiln_status st = kiln_model_open_ex(s->model_path, &s->mopt, &m);
    if (st != KILN_OK) { cli_error("run", "%s", kiln_last_error()); goto done; }
    st = kiln_session_open(m, &s->sopt, &sess);
    if (st != KILN_OK) { cli_error("run", "%s", kiln_last_error()); goto done; }
    uint64_t open_ns = kiln_now_ns() - t0;
    kiln_model_info mi;
    kiln_model_get_info(m, &mi);

    /* tokenize: an empty prompt starts from BOS; a chat prompt is rendered with the template first */
    size_t n_ids = 0;
    const bool from_bos = s->prompt_len == 0 && !s->chat;
    if (s->chat) {
        chat_prompt cp;
        if (!chat_prompt_open("run", m, s->chat_template, &cp)) goto done;
        kiln_chat_message msgs[2];
        size_t nm = 0;
        if (s->system) msgs[nm++] = (kiln_chat_message){"system", s->system};
        msgs[nm++] = (kiln_chat_message){"user", s->prompt};
        bool ok = chat_prompt_tokens("run", &cp, msgs, nm, &ids, &n_ids);
        chat_prompt_close(&cp);
        if (!ok) goto done;
    } else {
        size_t cap = s->prompt_len + 8;
        ids = malloc(cap * sizeof *ids);
        if (!ids) { cli_error("run", "out of memory"); goto done; }
        int flags = KILN_TOK_ADD_BOS | (s->parse_special ? KILN_TOK_PARSE_SPECIAL : 0);
        st = kiln_tokenize(m, s->prompt, s->prompt_len, flags, ids, cap, &n_ids);
        if (st != KILN_OK) { cli_error("run", "tokenizing the prompt: %s", kiln_last_error()); goto done; }
    }
    if (n_ids == 0) {
        if (mi.bos_id < 0) { cli_error("run", "the prompt is empty and the model has no BOS token to start from"); goto done; }
        ids[0] = mi.bos_id;
        n_ids = 1;
    }
    const int n_ctx = kiln_session_n_ctx(sess);
    /* -n -1: until end of generation or a full context */
    const int n_predict = s->n_predict >= 0 ? s->n_predict : n_ctx - (int)(n_ids < (size_t)n_ctx ? n_ids : (size_t)n_ctx);
    if (n_ids + (size_t)n_predict > (size_t)n_ctx || (s->n_predict < 0 && n_predict == 0)) {
        cli_error("run", "the prompt (%zu tokens) plus %d tokens to generate exceed the context of %d positions "
                  "(raise --ctx or lower -n)", n_ids, s->n_predict < 0 ? 1 : n_predict, n_ctx);
        goto done;
    }
    for (int i = 0; i < s->rounds; i++)
        if (!(rs[i].ids = malloc(((size_t)n_predict + 1) * sizeof *rs[i].ids))) { cli_error("run", "out of memory"); goto done; }
    st = kiln_sampler_open(&s->sampler, mi.n_vocab, &smp);
    if (st != KILN_OK) { cli_error("run", "%s", kiln_last_error()); goto done; }

    const kiln_phase *ph;
    size_t n_ph = kiln_session_open_phases(sess, &ph);
    kiln_stats base;
    kiln_session_stats(sess, &base);
    for (int round = 0; round < s->rounds; round++) {
        if (!s->json && !s->quiet && round == 0 && !from_bos && !s->chat) { fwrite(s->prompt, 1, s->prompt_len, stdout); fflush(stdout); }
        st = generate_round(s, n_predict, m, sess, smp, ids, n_ids, from_bos, &rs[round]);
        if (st != KILN_OK) { cli_error("run", "round %d: %s", round + 1, kiln_last_error()); goto done; }
        if (!s->json && !s->quiet && round == 0) putchar('\n');
        if (rs[round].write_failed || fflush(stdout) != 0) { cli_error("run", "cannot write the output: %s", strerror(errno)); goto done; }
    }
    if (s->json) {
        print_json(s, sess, &mi, ph, n_ph, open_ns, ids, n_ids, rs, s->rounds, &base);
        if (fflush(stdout) != 0) { cli_error("run", "cannot write the output: %s", strerror(errno)); goto done; }
    } else {
        FILE *f = stderr;
        run_print_open(f, ph, n_ph, open_ns);
        for (int i = 0; i < s->rounds; i++) {
            fprintf(f, s->rounds > 1 ? "\nround %d: " : " · ", i + 1);
            print_round(f, &rs[i]);
            uint64_t tot = rs[i].prefill_ns + rs[i].decode_ns + (i == 0 ? open_ns : 0);
            fprintf(f, " · total %.2f ms", ms(tot));
        }
        fprintf(f, "\n%s · %s · %d threads ctx %d · seed %llu\n", mi.name[0] ? mi.name : mi.arch,
                kiln_session_backend(sess), kiln_session_n_threads(sess), n_ctx, (unsigned long long)s->sampler.seed);
        if (s->rounds >= 2) {
            double r1 = ms(rs[0].prefill_ns + rs[0].decode_ns), r2 = ms(rs[1].prefill_ns + rs[1].decode_ns);
            fprintf(f, "first-call penalty: %+.3f ms (round 1 %.3f ms − round 2 %.3f ms)\n", r1 - r2, r1, r2);
        }
    }
    rc = 0;
done:
    if (rs)
        for (int i = 0; i < s->rounds; i++) free(rs[i].text), free(rs[i].ids);
    free(rs);
    free(ids);
    kiln_sampler_close(smp);
    kiln_session_close(sess);
    kiln_model_close(m);
    return rc;
}
