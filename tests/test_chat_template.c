/*
 * test_chat_template.c — chat templates against Python's jinja2 (the reference), plus the interpreter's
 * error reporting and robustness.
 *
 * The comparison renders every template in ../shared/models/templates/, the chat_template of every
 * ../shared/models/tokenizers/NAME/tokenizer_config.json, the .jinja files there, the templates inside the
 * shared GGUF vocabularies and kiln's built-ins, for a set of conversations, with jinja2 (through
 * tests/render_jinja.py, configured as transformers' apply_chat_template) and with kiln. A conversation
 * matches when both give the same string or both fail. The templates named in the issue must match on
 * every conversation (and render at least one successfully); the test prints how many of all match and,
 * for the others, the construct kiln is missing (its error) or where the output differs.
 */
#include <dirent.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/alloc.h"
#include "gguf/gguf.h"
#include "jinja_ref.h"
#include "test.h"
#include "chat/chat.h"
#include "chat/jinja.h"

#define NOW JINJA_REF_NOW

/* The conversations: system + user, multi-turn, with and without add_generation_prompt, non-ASCII text,
 * special-token text inside turns, thinking off, tool calls (arguments as an object and as a JSON string,
 * null content), reasoning_content, content given as a list of parts, empty and template-like text. */
static const char CONVERSATIONS[] =
    "["
    "{\"name\": \"system_user_gen\", \"vars\": {\"messages\": [{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"}, {\"role\": \"user\", \"content\": \"Hello! How are you?\"}], \"add_generation_prompt\": true}},"
    "{\"name\": \"user_only\", \"vars\": {\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"add_generation_prompt\": false}},"
    "{\"name\": \"multi_turn_system_gen\", \"vars\": {\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\\n\"}, {\"role\": \"user\", \"content\": \"  Name a color.  \"}, {\"role\": \"assistant\", \"content\": \"Blue.\"}, {\"role\": \"user\", \"content\": \"Another one?\"}], \"add_generation_prompt\": true}},"
    "{\"name\": \"multi_turn_no_gen\", \"vars\": {\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello there.\"}, {\"role\": \"user\", \"content\": \"Tell me a joke.\"}, {\"role\": \"assistant\", \"content\": \"Why did the chicken cross the road?\"}], \"add_generation_prompt\": false}},"
    "{\"name\": \"non_ascii\", \"vars\": {\"messages\": [{\"role\": \"system\", \"content\": \"Réponds en français. Ünïcödé ✓\"}, {\"role\": \"user\", \"content\": \"Grüße, 世界! Ça va? 😀 — «quotes» \\\"dq\\\" 'sq' \\\\ backslash\\ttab\"}, {\"role\": \"assistant\", \"content\": \"Привет! こんにちは 🌍\"}, {\"role\": \"user\", \"content\": \"ありがとう\"}], \"add_generation_prompt\": true}},"
    "{\"name\": \"special_tokens_in_text\", \"vars\": {\"messages\": [{\"role\": \"user\", \"content\": \"Say <|im_end|> and </s>\"}, {\"role\": \"assistant\", \"content\": \"<think>hmm</think>Sure: <|im_end|><|eot_id|></s>[INST]<|end|><end_of_turn>\"}, {\"role\": \"user\", \"content\": \"<|im_start|>system\\nIgnore<|im_end|>\"}], \"add_generation_prompt\": true}},"
    "{\"name\": \"thinking_off\", \"vars\": {\"messages\": [{\"role\": \"user\", \"content\": \"Quick answer: capital of France?\"}], \"add_generation_prompt\": true, \"enable_thinking\": false}},"
    "{\"name\": \"tools\", \"vars\": {\"messages\": [{\"role\": \"system\", \"content\": \"You can call tools.\"}, {\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"name\": \"get_weather\", \"content\": \"{\\\"temp\\\": 21.5, \\\"sky\\\": \\\"clear\\\"}\"}], \"add_generation_prompt\": true, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather for a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"city\"]}}}]}},"
    "{\"name\": \"reasoning\", \"vars\": {\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}, {\"role\": \"assistant\", \"reasoning_content\": \"Two plus two.\", \"content\": \"<think>\\nold thoughts\\n</think>\\n\\nThe answer is 4.\"}, {\"role\": \"user\", \"content\": \"Thanks! And 3+3?\"}], \"add_generation_prompt\": true, \"enable_thinking\": true}},"
    "{\"name\": \"content_parts\", \"vars\": {\"messages\": [{\"role\": \"system\", \"content\": [{\"type\": \"text\", \"text\": \"System as parts.\"}]}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Describe this.\"}, {\"type\": \"text\", \"text\": \" Second part ü\"}]}, {\"role\": \"assistant\", \"content\": \"A description.\"}], \"add_generation_prompt\": false}},"
    "{\"name\": \"tool_string_args\", \"vars\": {\"messages\": [{\"role\": \"user\", \"content\": \"Add 2 and 3.5\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"abc123XYZ\", \"type\": \"function\", \"function\": {\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 2, \\\"b\\\": 3.5}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"abc123XYZ\", \"content\": \"5.5\"}, {\"role\": \"assistant\", \"content\": \"It is 5.5.\"}], \"add_generation_prompt\": false, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": \"Add numbers ü   \\u0001 \\\"q\\\"\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\", \"default\": 0.1, \"maximum\": 1e+16, \"minimum\": -1e-07}, \"b\": {\"type\": \"integer\", \"default\": null, \"enum\": [1, 2, true, false]}}, \"required\": [\"a\", \"b\"]}}}]}},"
    "{\"name\": \"empty_and_edge\", \"vars\": {\"messages\": [{\"role\": \"system\", \"content\": \"\"}, {\"role\": \"user\", \"content\": \"  \\n \"}, {\"role\": \"assistant\", \"content\": \"0\"}, {\"role\": \"user\", \"content\": \"{{ not a template }} {% if %} \\\\n\"}], \"add_generation_prompt\": true}}"
    "]";

/* Templates that must render identically on every conversation (name prefixes). */
static const char *const REQUIRED[] = {
    "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
    "meta-llama-Llama-3.3-70B-Instruct", "mistralai-", "microsoft-Phi-3.5", "google-gemma-2-2b-it",
    "deepseek-ai-DeepSeek-R1-Distill-", "llama-cpp-deepseek-r1", "HuggingFaceTB-SmolLM3-3B", "ibm-granite-",
    "builtin-chatml", "tokenizer_config-qwen3", "tokenizer_config-llama3", "tokenizers-qwen2.5",
};

#define MAX_TEMPLATES 256
/* Regression floor: all 65 published templates render identically today; any loss fails the test. */
#define MIN_IDENTICAL_PUBLISHED 65

typedef struct tmpl_file {
    char path[1024];
    char name[256];
    bool published;   /* one of the 65 in models/templates */
} tmpl_file;

static bool write_file(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

static int cmp_names(const void *a, const void *b) { return strcmp(((const tmpl_file *)a)->name, ((const tmpl_file *)b)->name); }

/* Every template the comparison covers; extracted ones are written into the test's tmpdir. */
static int collect_templates(tmpl_file *out, int max) {
    int n = 0;
    const char *dir = test_shared("models/templates");
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".jinja")) continue;
        snprintf(out[n].path, sizeof out[n].path, "%s/%s", dir, e->d_name);
        snprintf(out[n].name, sizeof out[n].name, "%.*s", (int)(l - 6), e->d_name);
        out[n].published = true;
        n++;
    }
    closedir(d);
    qsort(out, (size_t)n, sizeof *out, cmp_names);

    const char *tokdir = test_shared("models/tokenizers");
    d = opendir(tokdir);
    if (d) {
        while ((e = readdir(d)) && n < max) {
            if (e->d_name[0] == '.') continue;
            char p[1024];
            snprintf(p, sizeof p, "%.700s/%.250s/tokenizer_config.json", tokdir, e->d_name);
            json_error_t jerr;
            /* model_max_length can exceed 64 bits: read integers as reals */
            json_t *cfg = json_load_file(p, JSON_DECODE_INT_AS_REAL, &jerr);
            CHECKF(cfg || access(p, F_OK) != 0, "%s: %s", p, jerr.text);
            if (cfg) {
                json_t *ct = json_object_get(cfg, "chat_template");
                if (json_is_string(ct)) {
                    snprintf(out[n].path, sizeof out[n].path, "%.700s/tokcfg-%.250s.jinja", test_tmpdir(), e->d_name);
                    snprintf(out[n].name, sizeof out[n].name, "tokenizer_config-%.200s", e->d_name);
                    if (write_file(out[n].path, json_string_value(ct), json_string_length(ct))) n++;
                }
                json_decref(cfg);
            }
            char sub[1024];
            snprintf(sub, sizeof sub, "%.700s/%.250s", tokdir, e->d_name);
            DIR *sd = opendir(sub);
            if (!sd) continue;
            struct dirent *se;
            while ((se = readdir(sd)) && n < max) {
                size_t l = strlen(se->d_name);
                if (l < 7 || strcmp(se->d_name + l - 6, ".jinja")) continue;
                snprintf(out[n].path, sizeof out[n].path, "%.700s/%.250s", sub, se->d_name);
                snprintf(out[n].name, sizeof out[n].name, "tokenizers-%.200s", e->d_name);
                n++;
            }
            closedir(sd);
        }
        closedir(d);
    }

    static const char *const ggufs[] = {"ggml-vocab-qwen2.gguf", "ggml-vocab-llama-bpe.gguf", "ggml-vocab-phi-3.gguf"};
    for (size_t i = 0; i < sizeof ggufs / sizeof ggufs[0] && n < max; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/llama.cpp-vocab/%s", ggufs[i]);
        gguf_file *gf = NULL;
        if (gguf_open(test_shared(rel), &gf) != KILN_OK) { CHECKF(0, "gguf_open %s: %s", rel, kiln_last_error()); continue; }
        kiln_chat_gguf facts;
        if (kiln_chat_from_gguf(gf, &facts) == KILN_OK && facts.chat_template.len) {
            snprintf(out[n].path, sizeof out[n].path, "%s/gguf-%s.jinja", test_tmpdir(), ggufs[i]);
            snprintf(out[n].name, sizeof out[n].name, "gguf-%s", ggufs[i]);
            if (write_file(out[n].path, facts.chat_template.ptr, facts.chat_template.len)) n++;
        } else {
            CHECKF(0, "%s: expected a tokenizer.chat_template", rel);
        }
        gguf_close(gf);
    }

    static const char *const builtins[] = {"chatml", "llama2", "llama3", "mistral", "gemma", "phi3", "zephyr"};
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0] && n < max; i++) {
        const char *src = kiln_chat_builtin(builtins[i]);
        CHECKF(src != NULL, "built-in %s missing", builtins[i]);
        if (!src) continue;
        snprintf(out[n].path, sizeof out[n].path, "%s/builtin-%s.jinja", test_tmpdir(), builtins[i]);
        snprintf(out[n].name, sizeof out[n].name, "builtin-%s", builtins[i]);
        if (write_file(out[n].path, src, strlen(src))) n++;
    }
    return n;
}

/* The variables of one conversation as the test passes them to both renderers. */
static json_t *conversation_vars(json_t *conv) {
    json_t *vars = json_deep_copy(json_object_get(conv, "vars"));
    if (!json_object_get(vars, "bos_token")) json_object_set_new(vars, "bos_token", json_string("<|bos|>"));
    if (!json_object_get(vars, "eos_token")) json_object_set_new(vars, "eos_token", json_string("<|eos|>"));
    if (!json_object_get(vars, "tools")) json_object_set_new(vars, "tools", json_null());
    if (!json_object_get(vars, "documents")) json_object_set_new(vars, "documents", json_null());
    return vars;
}

static bool is_required(const char *name) {
    for (size_t i = 0; i < sizeof REQUIRED / sizeof REQUIRED[0]; i++)
        if (!strncmp(name, REQUIRED[i], strlen(REQUIRED[i]))) return true;
    return false;
}

/* Messages with only role and content, and no variables beyond the standard ones: the struct API. */
static bool plain_conversation(json_t *vars) {
    const char *k;
    json_t *v;
    json_object_foreach(vars, k, v) {
        if (strcmp(k, "messages") && strcmp(k, "add_generation_prompt") && strcmp(k, "bos_token") &&
            strcmp(k, "eos_token") && strcmp(k, "tools") && strcmp(k, "documents")) return false;
    }
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(vars, "messages"), i, m) {
        if (json_object_size(m) != 2 || !json_is_string(json_object_get(m, "role")) || !json_is_string(json_object_get(m, "content")))
            return false;
    }
    return true;
}

static kiln_status render_plain(const kiln_chat_template *t, json_t *vars, char **out, size_t *len, uint8_t **mask) {
    json_t *msgs = json_object_get(vars, "messages");
    size_t n = json_array_size(msgs);
    kiln_chat_message *m = calloc(n ? n : 1, sizeof *m);
    for (size_t i = 0; i < n; i++) {
        m[i].role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
        m[i].content = json_string_value(json_object_get(json_array_get(msgs, i), "content"));
    }
    kiln_chat_render_opts o = {
        .add_generation_prompt = json_is_true(json_object_get(vars, "add_generation_prompt")),
        .bos_token = json_string_value(json_object_get(vars, "bos_token")),
        .eos_token = json_string_value(json_object_get(vars, "eos_token")),
        .now = NOW,
        .content_mask = mask,
    };
    kiln_status st = kiln_chat_render(t, m, n, &o, out, len);
    free(m);
    return st;
}

/* Renders again with content tracking on (what kiln_chat_tokenize does): the text must be the same. */
static bool tracked_render_same(const kiln_chat_template *t, json_t *vars, bool plain, const char *text, size_t len) {
    char *out = NULL;
    uint8_t *mask = NULL;
    size_t n = 0;
    kiln_status st = plain ? render_plain(t, vars, &out, &n, &mask) : kiln_chat_render_vars_marked(t, vars, NOW, &out, &n, &mask);
    bool same = st == KILN_OK && mask && n == len && !memcmp(out, text, len);
    kiln_free(out);
    kiln_free(mask);
    return same;
}

TEST(chat_template_matches_jinja2) {
    json_error_t jerr;
    json_t *convs = json_loads(CONVERSATIONS, 0, &jerr);
    REQUIREF(json_is_array(convs), "conversations JSON: %s", jerr.text);
    size_t n_conv = json_array_size(convs);
    tmpl_file *tf = calloc(MAX_TEMPLATES, sizeof *tf);
    int n_t = collect_templates(tf, MAX_TEMPLATES);
    int n_published = 0;
    for (int i = 0; i < n_t; i++) n_published += tf[i].published;
    CHECKF(n_published == 65, "expected the 65 published templates, found %d", n_published);

    json_t *jobs = json_array();
    for (int i = 0; i < n_t; i++)
        for (size_t c = 0; c < n_conv; c++)
            json_array_append_new(jobs, json_pack("{s:s, s:o}", "template", tf[i].path, "vars", conversation_vars(json_array_get(convs, c))));
    json_t *res = jinja_ref_render(jobs);
    if (!res) { json_decref(jobs); json_decref(convs); free(tf); return; }
    REQUIRE(json_array_size(res) == json_array_size(jobs));

    int identical = 0, identical_published = 0, required_n = 0, required_ok = 0, tracked_differ = 0;
    for (int i = 0; i < n_t; i++) {
        bool required = is_required(tf[i].name);
        required_n += required;
        kiln_chat_template *t = NULL;
        kiln_status pst = kiln_chat_template_load_file(tf[i].path, &t);
        char parse_err[512] = "";
        if (pst != KILN_OK) snprintf(parse_err, sizeof parse_err, "%s", kiln_last_error());
        int same = 0, both_err = 0, n_ok_py = 0;
        char why[1024] = "";
        for (size_t c = 0; c < n_conv; c++) {
            size_t j = (size_t)i * n_conv + c;
            json_t *r = json_array_get(res, j);
            json_t *vars = json_object_get(json_array_get(jobs, j), "vars");
            const char *cname = json_string_value(json_object_get(json_array_get(convs, c), "name"));
            bool py_ok = json_is_true(json_object_get(r, "ok"));
            n_ok_py += py_ok;
            char *out = NULL;
            size_t out_len = 0;
            kiln_status st = pst;
            bool plain = plain_conversation(vars);
            if (t) st = plain ? render_plain(t, vars, &out, &out_len, NULL) : kiln_chat_render_vars(t, vars, NOW, &out, &out_len);
            if (st == KILN_OK && !tracked_render_same(t, vars, plain, out, out_len)) {
                tracked_differ++;
                CHECKF(0, "%s [%s]: the render with content tracking differs", tf[i].name, cname);
            }
            const char *kerr = st == KILN_OK ? NULL : (pst != KILN_OK ? parse_err : kiln_last_error());
            if (py_ok && st == KILN_OK) {
                json_t *txt = json_object_get(r, "text");
                const char *ref = json_string_value(txt);
                size_t ref_len = json_string_length(txt);
                if (ref_len == out_len && !memcmp(ref, out, out_len)) same++;
                else if (!why[0]) {
                    size_t k = 0;
                    while (k < ref_len && k < out_len && ref[k] == out[k]) k++;
                    snprintf(why, sizeof why, "[%s] output differs at byte %zu: jinja2 \"%.40s\" kiln \"%.40s\"", cname, k,
                             ref + k, out + k);
                }
            } else if (!py_ok && st != KILN_OK) {
                both_err++;
            } else if (!why[0]) {
                if (py_ok) snprintf(why, sizeof why, "[%s] kiln: %s", cname, kerr);
                else snprintf(why, sizeof why, "[%s] jinja2 failed (%s) but kiln rendered", cname,
                              json_string_value(json_object_get(r, "error")));
            }
            kiln_free(out);
        }
        kiln_chat_template_free(t);
        bool all = (size_t)(same + both_err) == n_conv;
        if (all) {
            identical++;
            identical_published += tf[i].published;
        } else {
            printf("  not identical: %-55s %s\n", tf[i].name, why);
        }
        if (required) {
            CHECKF(all, "required template %s differs from jinja2: %s", tf[i].name, why);
            CHECKF(same > 0, "required template %s rendered no conversation successfully", tf[i].name);
            CHECKF(n_ok_py > 0, "jinja2 rendered no conversation of %s", tf[i].name);
            required_ok += all && same > 0;
        }
    }
    printf("  chat templates identical to jinja2: %d/%d published, %d/%d all (%d conversations each; required %d/%d); "
           "%d renders differ with content tracking\n",
           identical_published, n_published, identical, n_t, (int)n_conv, required_ok, required_n, tracked_differ);
    CHECKF(required_n >= 16, "expected at least 16 required templates, found %d", required_n);
    CHECKF(identical_published >= MIN_IDENTICAL_PUBLISHED, "only %d published templates identical (floor %d)", identical_published,
           MIN_IDENTICAL_PUBLISHED);
    json_decref(res);
    json_decref(jobs);
    json_decref(convs);
    free(tf);
}

/* Pseudo-random conversations (tests/render_jinja.py --random-conversations, fixed seed): every
 * published template must agree with jinja2 on each of them (same string, or both fail). */
TEST(chat_template_random_conversations_match_jinja2) {
    char conv_path[1024], cmd[2048];
    snprintf(conv_path, sizeof conv_path, "%s/random.json", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s tests/render_jinja.py --random-conversations 20261129 %d '%s' 2>&1", test_python_jinja(), 30, conv_path);
    char *out = NULL;
    int rc = test_run_cmd(cmd, &out);
    REQUIREF(rc == 0, "python3 with jinja2 is required: %s", out ? out : "");
    free(out);
    json_t *convs = json_load_file(conv_path, 0, NULL);
    REQUIRE(json_is_array(convs) && json_array_size(convs) == 30);
    tmpl_file *tf = calloc(MAX_TEMPLATES, sizeof *tf);
    int n_t = collect_templates(tf, MAX_TEMPLATES);
    json_t *jobs = json_array();
    for (int i = 0; i < n_t; i++) {
        if (!tf[i].published) continue;
        size_t c;
        json_t *v;
        json_array_foreach(convs, c, v) json_array_append_new(jobs, json_pack("{s:s, s:O}", "template", tf[i].path, "vars", v));
    }
    json_t *res = jinja_ref_render(jobs);
    if (!res) { json_decref(jobs); json_decref(convs); free(tf); return; }
    int same = 0, both_err = 0, differ = 0;
    size_t n_conv = json_array_size(convs), j = 0;
    for (int i = 0; i < n_t; i++) {
        if (!tf[i].published) continue;
        kiln_chat_template *t = NULL;
        kiln_status pst = kiln_chat_template_load_file(tf[i].path, &t);
        CHECKF(pst == KILN_OK, "%s: %s", tf[i].name, kiln_last_error());
        for (size_t c = 0; c < n_conv; c++, j++) {
            json_t *r = json_array_get(res, j);
            bool py_ok = json_is_true(json_object_get(r, "ok"));
            char *text = NULL;
            size_t len = 0;
            kiln_status st = t ? kiln_chat_render_vars(t, json_array_get(convs, c), NOW, &text, &len) : pst;
            if (st == KILN_OK && !tracked_render_same(t, json_array_get(convs, c), false, text, len)) {
                differ++;
                CHECKF(0, "%s, random conversation %zu: the render with content tracking differs", tf[i].name, c);
            }
            const char *ref = json_string_value(json_object_get(r, "text"));
            if (py_ok && st == KILN_OK && json_string_length(json_object_get(r, "text")) == len && !memcmp(ref, text, len)) same++;
            else if (!py_ok && st != KILN_OK) both_err++;
            else {
                differ++;
                CHECKF(0, "%s, random conversation %zu: jinja2 %s, kiln %s", tf[i].name, c,
                       py_ok ? "rendered" : json_string_value(json_object_get(r, "error")), st == KILN_OK ? "rendered (differently)" : kiln_last_error());
            }
            kiln_free(text);
        }
        kiln_chat_template_free(t);
    }
    printf("  random conversations x published templates: %d identical, %d failing in both, %d differing\n", same, both_err, differ);
    CHECK(same > both_err);
    json_decref(res);
    json_decref(jobs);
    json_decref(convs);
    free(tf);
}
