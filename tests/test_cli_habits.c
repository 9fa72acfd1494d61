/* test_cli_habits.c — what a llama.cpp user types and the small errors around it: --opt=value, -n -1,
 * --seed -1, -f - (stdin), token ids in `run --json`, a failed write of the output, invalid KILN_* values,
 * quantize's output directory, mkmodel with a tokenizer.model, and the README's mkmodel + chat recipe. */
#include "test.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

static const char *stories(void) { return test_shared("models/stories260K/stories260K.gguf"); }

/* Runs the ASan CLI with a formatted argument string; stdout in *out. */
static int kiln(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int kiln(char **out, const char *fmt, ...) {
    char args[3072], cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s", test_kiln_bin(), args);
    *out = NULL;
    return test_run_cmd(cmd, out);
}

static json_t *load_json_out(const char *out) {
    json_error_t e;
    json_t *j = out ? json_loads(out, 0, &e) : NULL;
    if (!j) test_failf(__FILE__, __LINE__, "not JSON: %s\n%.2000s", out ? e.text : "no output", out ? out : "");
    return j;
}

/* The ids of a JSON array equal want[0..n) (and the array has at least n). */
static bool ids_equal(const json_t *arr, const json_t *want, size_t n) {
    if (json_array_size(arr) < n || json_array_size(want) < n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != json_integer_value(json_array_get(want, i))) return false;
    return true;
}

TEST(cli_run_json_has_prompt_and_generated_ids_like_llama_cpp) {
    json_error_t e;
    json_t *ref = json_load_file(test_shared("models/stories260K/expected/llama.cpp/stories260K.greedy-Once_upon_a_time-100.json"), 0, &e);
    REQUIREF(ref, "reference: %s", e.text);
    char *out;
    /* the prompt from stdin (-f -), every value as --opt=value */
    char args[1024];
    snprintf(args, sizeof args, "printf 'Once upon a time' | %s run --model=%s -f - --n-predict=50 --temp=0 --ctx=512 "
             "--threads=1 --json", test_kiln_bin(), stories());
    out = NULL;
    CHECK_EQ_INT(test_run_cmd(args, &out), 0);
    json_t *j = load_json_out(out);
    if (j) {
        const json_t *p = json_object_get(j, "prompt_ids"), *want_p = json_object_get(ref, "prompt_token_ids");
        CHECKF(json_array_size(p) == json_array_size(want_p) && ids_equal(p, want_p, json_array_size(want_p)),
               "prompt_ids differ from llama.cpp's prompt_token_ids:\n%s", out);
        const json_t *r0 = json_array_get(json_object_get(j, "rounds"), 0);
        const json_t *g = json_object_get(r0, "ids");
        CHECK_EQ_INT(json_array_size(g), json_integer_value(json_object_get(r0, "eval_count")));
        CHECKF(ids_equal(g, json_object_get(ref, "generated_token_ids"), 50),
               "the generated ids differ from llama.cpp's in the first 50:\n%s", out);
        json_decref(j);
    }
    free(out);
    json_decref(ref);
}

TEST(cli_run_n_minus_one_fills_the_context) {
    char *out;
    CHECK_EQ_INT(kiln(&out, "run -m %s -p 'Once upon a time' -n -1 --ctx 32 --temp 0 --ignore-eos --json", stories()), 0);
    json_t *j = load_json_out(out);
    if (j) {
        const json_t *r0 = json_array_get(json_object_get(j, "rounds"), 0);
        /* 5 prompt tokens (BOS + 4) in a context of 32: 27 generated */
        CHECK_EQ_INT(json_array_size(json_object_get(j, "prompt_ids")), 5);
        CHECK_EQ_INT(json_integer_value(json_object_get(r0, "eval_count")), 27);
        CHECK_STR(json_string_value(json_object_get(r0, "done_reason")), "length");
        json_decref(j);
    }
    free(out);
    /* without --ignore-eos it stops at end of generation or the full context, whichever comes first */
    CHECK_EQ_INT(kiln(&out, "run -m %s -n -1 --ctx 64 --temp 0 --json", stories()), 0);
    j = load_json_out(out);
    if (j) {
        const json_t *r0 = json_array_get(json_object_get(j, "rounds"), 0);
        CHECK(json_integer_value(json_object_get(r0, "eval_count")) >= 1 &&
              json_integer_value(json_object_get(r0, "eval_count")) <= 63);
        json_decref(j);
    }
    free(out);
    CHECK_EQ_INT(kiln(&out, "run -m %s -n -2 2>&1", stories()), 2);
    CHECKF(out && strstr(out, "-1.."), "%s", out ? out : "");
    free(out);
}

TEST(cli_seed_minus_one_is_random) {
    char *out;
    unsigned long long seeds[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(kiln(&out, "run -m %s -n 4 --seed -1 --json", stories()), 0);
        json_t *j = load_json_out(out);
        if (j) seeds[k] = (unsigned long long)json_integer_value(json_object_get(j, "seed"));
        json_decref(j);
        free(out);
    }
    CHECKF(seeds[0] != seeds[1], "two --seed -1 runs used the same seed %llu", seeds[0]);
    CHECK(seeds[0] != 0 && seeds[0] != 0xffffffffffffffffull);
    /* a fixed seed stays fixed, in both spellings */
    CHECK_EQ_INT(kiln(&out, "run -m %s -n 4 --seed=42 --json", stories()), 0);
    json_t *j = load_json_out(out);
    if (j) CHECK_EQ_INT(json_integer_value(json_object_get(j, "seed")), 42);
    json_decref(j);
    free(out);
    CHECK_EQ_INT(kiln(&out, "run -m %s --seed -2 2>&1", stories()), 2);
    CHECKF(out && strstr(out, "--seed") && strstr(out, "-1 (random)"), "%s", out ? out : "");
    free(out);
}

TEST(cli_opt_equals_value_works_for_every_command) {
    char *out;
    CHECK_EQ_INT(kiln(&out, "bench --model=%s --prompt=8 --gen=4 --reps=1 --threads=1 --json", stories()), 0);
    CHECKF(out && strstr(out, "\"prompt_tokens\":8"), "%s", out ? out : "");
    free(out);
    char msgs[600];
    snprintf(msgs, sizeof msgs, "%s/m.json", test_tmpdir());
    FILE *f = fopen(msgs, "w");
    REQUIRE(f);
    fputs("[{\"role\":\"user\",\"content\":\"hi\"}]", f);
    fclose(f);
    CHECK_EQ_INT(kiln(&out, "template --template=chatml --messages=%s", msgs), 0);
    CHECKF(out && strstr(out, "<|im_start|>user\nhi<|im_end|>"), "%s", out ? out : "");
    free(out);
    CHECK_EQ_INT(kiln(&out, "mkmodel --shape=smollm2-135m --type=q8_0 --layers=1 --vocab=%s --out=%s/m.gguf --quiet 2>&1",
                      test_shared("models/tokenizers/smollm2-135m-instruct"), test_tmpdir()), 0);
    free(out);
    CHECK_EQ_INT(kiln(&out, "quantize --threads=1 --quiet %s/m.gguf %s/q.gguf Q4_0 2>&1", test_tmpdir(), test_tmpdir()), 0);
    free(out);
    /* a value that looks like an option is still taken as a value after a separate flag */
    CHECK_EQ_INT(kiln(&out, "tokenize -m %s -p --x=y --ids", stories()), 0);
    free(out);
    CHECK_EQ_INT(kiln(&out, "run --model=%s --temp=hot 2>&1", stories()), 2);
    CHECKF(out && strstr(out, "--temp: expected a number"), "%s", out ? out : "");
    free(out);
}

TEST(cli_failed_write_of_the_output_exits_nonzero) {
    char *out;
    CHECK_EQ_INT(kiln(&out, "run -m %s -n 64 --temp 0 2>&1 >/dev/full", stories()), 1);
    CHECKF(out && strstr(out, "cannot write the output"), "%s", out ? out : "");
    free(out);
    CHECK_EQ_INT(kiln(&out, "run -m %s -n 4 --json 2>&1 >/dev/full", stories()), 1);
    CHECKF(out && strstr(out, "cannot write the output"), "%s", out ? out : "");
    free(out);
    /* any command */
    CHECK_EQ_INT(kiln(&out, "tokenize -m %s -p hello 2>&1 >/dev/full", stories()), 1);
    CHECKF(out && strstr(out, "cannot write the output"), "%s", out ? out : "");
    free(out);
}

TEST(cli_invalid_kiln_env_values_warn) {
    static const struct { const char *env, *name, *accepted; } cases[] = {
        {"KILN_THREADS=abc", "KILN_THREADS='abc'", "1..1024"},
        {"KILN_THREADS=0", "KILN_THREADS='0'", "1..1024"},
        {"KILN_LOG=loud", "KILN_LOG='loud'", "error, warn, info, debug"},
        {"KILN_NO_SIMD=yes", "KILN_NO_SIMD='yes'", "0, 1"},
        {"KILN_CPU_LEVEL=avx9", "KILN_CPU_LEVEL='avx9'", "scalar, avx2, avx512, neon"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s %s run -m %s -n 2 --temp 0 2>&1 >/dev/null", cases[i].env, test_kiln_bin(), stories());
        CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
        CHECKF(out && strstr(out, cases[i].name) && strstr(out, cases[i].accepted), "%s: no warning naming it:\n%s",
               cases[i].env, out ? out : "");
        free(out);
    }
    /* valid values are quiet */
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "KILN_THREADS=2 KILN_LOG=warn KILN_NO_SIMD=0 KILN_CPU_LEVEL=scalar %s run -m %s -n 2 --temp 0 2>&1 >/dev/null",
             test_kiln_bin(), stories());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECKF(out && !strstr(out, "warning"), "%s", out ? out : "");
    free(out);
}

/* The CPU kernel level: `kiln info` and `kiln bench` show it; KILN_CPU_LEVEL lowers it, never above the CPU's best
 * (a warning naming the best); KILN_NO_SIMD=1 is the scalar level. */
TEST(cli_cpu_level_is_shown_and_lowered) {
    const char *best = kiln_cpu_level_name(kiln_cpu_level_best());
    static const char *const levels[] = {"", "scalar", "avx2", "avx512"};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        char cmd[1024], want[128], *out = NULL;
        snprintf(cmd, sizeof cmd, "KILN_CPU_LEVEL=%s %s info 2>&1", levels[i], test_kiln_bin());
        CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
        /* a level runs when it is scalar, the best, or avx2 under avx512 */
        const bool runs = !*levels[i] || !strcmp(levels[i], "scalar") || !strcmp(levels[i], best) ||
                          (!strcmp(levels[i], "avx2") && !strcmp(best, "avx512"));
        snprintf(want, sizeof want, "cpu level: %s (best on this CPU: %s;", runs && *levels[i] ? levels[i] : best, best);
        CHECKF(out && strstr(out, want), "KILN_CPU_LEVEL=%s: no '%s' in:\n%s", levels[i], want, out ? out : "");
        snprintf(want, sizeof want, "support at most %s", best);
        CHECKF(out && !strstr(out, want) == runs, "KILN_CPU_LEVEL=%s (best %s): warning %s expected:\n%s", levels[i], best,
               runs ? "not" : "", out ? out : "");
        free(out);
    }
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "KILN_NO_SIMD=1 KILN_CPU_LEVEL=avx2 %s bench -m %s -p 8 -n 2 -r 1 --threads 1 --json 2>&1",
             test_kiln_bin(), stories());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECKF(out && strstr(out, "\"cpu_level\":\"scalar\""), "%s", out ? out : "");
    free(out);
}

TEST(cli_quantize_checks_the_output_directory_first) {
    char *out;
    const char *in = test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf");
    CHECK_EQ_INT(kiln(&out, "quantize %s %s/missing-dir/out.gguf Q4_0 2>&1", in, test_tmpdir()), 1);
    CHECKF(out && strstr(out, "missing-dir") && strstr(out, "does not exist"), "%s", out ? out : "");
    /* before any work: no planning notes, no progress */
    CHECKF(out && !strstr(out, "fallback") && !strstr(out, "tensors"), "work was done before the check:\n%s", out ? out : "");
    free(out);
    CHECK_EQ_INT(kiln(&out, "quantize %s %s/x.gguf Q4_0 2>&1", in, in), 1);
    CHECKF(out && strstr(out, "is not a directory"), "%s", out ? out : "");
    free(out);
}

TEST(cli_mkmodel_with_a_sentencepiece_file_says_what_it_needs) {
    char *out;
    CHECK_EQ_INT(kiln(&out, "mkmodel --shape smollm2-135m --type q8_0 --vocab %s -o %s/m.gguf 2>&1",
                      test_shared("models/tokenizers/llama2/tokenizer.model"), test_tmpdir()), 1);
    CHECKF(out && strstr(out, "tokenizer.json") && strstr(out, "GGUF") && strstr(out, "tokenizer.model") &&
           !strstr(out, "malformed JSON"), "%s", out ? out : "");
    free(out);
}

/* The README's recipe, run as written: its `kiln mkmodel --shape` line and the `kiln chat` line after it
 * (with ../shared pointing at the shared data and the files in a scratch directory). */
static char *readme_line(const char *readme, const char *prefix) {
    const char *p = strstr(readme, prefix);
    if (!p) return NULL;
    size_t n = strcspn(p, "\n");
    char *l = strndup(p, n);
    char *hash = strstr(l, "   #");
    if (hash) *hash = '\0';
    return l;
}

static void shell_recipe(char *dst, size_t cap, const char *line, const char *bin, const char *shared) {
    size_t n = 0;
    for (const char *p = line; *p && n + 600 < cap;) {
        if (!strncmp(p, "kiln ", 5) && (p == line || p[-1] == ' ' || p[-1] == '|')) {
            n += (size_t)snprintf(dst + n, cap - n, "%s ", bin);
            p += 5;
        } else if (!strncmp(p, "../shared", 9)) {
            n += (size_t)snprintf(dst + n, cap - n, "%s", shared);
            p += 9;
        } else {
            dst[n++] = *p++;
        }
    }
    dst[n] = '\0';
}

TEST(cli_readme_mkmodel_and_chat_recipe_works) {
    char *readme = test_read_file("README.md", NULL);
    REQUIRE(readme);
    char *mk = readme_line(readme, "kiln mkmodel --shape smollm2-135m");
    char *chat = readme_line(readme, "| kiln chat -m smollm2.gguf");
    REQUIREF(mk && chat, "README has no mkmodel + chat recipe (mkmodel: %s, chat: %s)", mk ? "yes" : "no",
             chat ? "yes" : "no");
    const char *chat_start = strstr(readme, chat);
    while (chat_start > readme && chat_start[-1] != '\n') chat_start--;
    free(chat);
    chat = strndup(chat_start, strcspn(chat_start, "\n"));
    char *hash = strstr(chat, "   #");
    if (hash) *hash = '\0';
    const char *bin = getenv("KILN_REL_BIN") ? getenv("KILN_REL_BIN") : "./kiln";
    char abs_bin[1024], shared[1024];
    REQUIRE(realpath(bin, abs_bin) && realpath(test_shared("models"), shared));
    shared[strlen(shared) - strlen("/models")] = '\0';
    char cmd[4096], line[3000];
    shell_recipe(line, sizeof line, mk, abs_bin, shared);
    snprintf(cmd, sizeof cmd, "cd %s && %s 2>&1", test_tmpdir(), line);
    char *out = NULL;
    int rc = test_run_cmd(cmd, &out);
    CHECKF(rc == 0, "%s\n-> %d\n%s", mk, rc, out ? out : "");
    free(out);
    shell_recipe(line, sizeof line, chat, abs_bin, shared);
    snprintf(cmd, sizeof cmd, "cd %s && %s 2>&1", test_tmpdir(), line);
    out = NULL;
    rc = test_run_cmd(cmd, &out);
    CHECKF(rc == 0 && out && !strstr(out, "no tokenizer.chat_template"), "%s\n-> %d\n%s", chat, rc, out ? out : "");
    free(out);
    free(mk);
    free(chat);
    free(readme);
}
