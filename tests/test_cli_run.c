/* test_cli_run.c — `kiln run`, `kiln bench` and `kiln chat` as a user runs them (the ASan-built CLI). */
#include "test.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int run(char **out, const char *fmt, const char *a, const char *b) {
    char cmd[2048];
    char inner[1536];
    snprintf(inner, sizeof inner, fmt, a, b);
    snprintf(cmd, sizeof cmd, "%s %s", test_kiln_bin(), inner);
    return test_run_cmd(cmd, out);
}

TEST(cli_run_greedy_story_and_timings) {
    const char *model = test_shared("models/stories260K/stories260K.gguf");
    size_t len;
    char *want = test_read_file(test_shared("models/stories260K/expected/llama2c-test_all-greedy200.txt"), &len);
    REQUIRE(want);
    char *out = NULL;
    char errpath[512];
    snprintf(errpath, sizeof errpath, "%s/err.txt", test_tmpdir());
    int rc = run(&out, "run -m %s -n 200 --temp 0 --threads 2 2>%s", model, errpath);
    CHECK_EQ_INT(rc, 0);
    REQUIRE(out);
    /* stdout is the text plus a final newline */
    CHECKF(strlen(out) == len + 1 && !strncmp(out, want, len), "stdout differs from llama2.c's output:\n%s", out);
    char *err = test_read_file(errpath, NULL);
    REQUIRE(err);
    CHECKF(strstr(err, "open ") && strstr(err, "map ") && strstr(err, "parse ") && strstr(err, "warm ") &&
           strstr(err, "prefill 1 tokens") && strstr(err, "decode 199 steps") && strstr(err, "total "),
           "timing line missing parts:\n%s", err);
    free(err);
    free(out);
    free(want);
}

TEST(cli_run_json_rounds_report_first_call_penalty) {
    char *out = NULL;
    int rc = run(&out, "run -m %s -p 'Once upon a time' -n 16 --temp 0 --rounds 2 --json %s",
                 test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"), "");
    CHECK_EQ_INT(rc, 0);
    REQUIRE(out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    REQUIREF(j, "not JSON: %s\n%s", e.text, out);
    json_t *rounds = json_object_get(j, "rounds");
    CHECK_EQ_INT(json_array_size(rounds), 2);
    CHECK(json_is_integer(json_object_get(j, "first_call_penalty_ns")));
    CHECK(json_integer_value(json_object_get(j, "load_duration")) > 0);
    json_t *r0 = json_array_get(rounds, 0), *r1 = json_array_get(rounds, 1);
    CHECK(json_integer_value(json_object_get(r0, "prompt_eval_duration")) > 0);
    CHECK(json_integer_value(json_object_get(r0, "eval_count")) >= 1);
    /* the same prompt greedily gives the same text in both rounds */
    CHECK_STR(json_string_value(json_object_get(r0, "text")), json_string_value(json_object_get(r1, "text")));
    CHECK(json_object_get(json_object_get(j, "open_phases"), "open.warm") != NULL);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "stats"), "host_allocs")), 0);
    json_decref(j);
    free(out);
}

TEST(cli_run_errors_are_clear) {
    char *out = NULL;
    const char *model = test_shared("models/stories260K/stories260K.gguf");
    CHECK_EQ_INT(run(&out, "run -m %s --ctx 32 -n 40 %s 2>&1", model, ""), 1);
    CHECKF(out && strstr(out, "exceed the context of 32"), "%s", out);
    free(out);
    CHECK_EQ_INT(run(&out, "run -m %s --temp abc %s 2>&1", model, ""), 2);
    CHECKF(out && strstr(out, "--temp"), "%s", out);
    free(out);
    CHECK_EQ_INT(run(&out, "run -m %s --bogus %s 2>&1", model, ""), 2);
    CHECKF(out && strstr(out, "unknown option '--bogus'"), "%s", out);
    free(out);
    CHECK_EQ_INT(run(&out, "run -m %s/nope.gguf %s 2>&1", test_tmpdir(), ""), 1);
    CHECKF(out && strstr(out, "nope.gguf"), "%s", out);
    free(out);
    CHECK_EQ_INT(run(&out, "run --help %s%s", "", ""), 0);
    CHECKF(out && strstr(out, "usage: kiln run"), "%s", out);
    free(out);
    CHECK_EQ_INT(run(&out, "run -m %s --chat -p hi %s 2>&1", test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf"), ""), 1);
    CHECKF(out && strstr(out, "--chat-template"), "%s", out);
    free(out);
}

TEST(cli_chat_turns_and_full_context) {
    const char *model = test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf");
    char *out = NULL;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "printf 'Tell me a story.\\nAnd then?\\n' | %s chat -m %s --chat-template chatml -n 12 --temp 0 2>&1",
             test_kiln_bin(), model);
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    REQUIRE(out);
    int lines = 0;
    for (char *p = out; *p; p++) lines += *p == '\n';
    CHECKF(lines >= 2 && strlen(out) > 20, "expected two replies:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "printf 'Tell me a long story.\\nmore\\nmore\\n' | %s chat -m %s --chat-template chatml --ctx 48 --temp 0 2>&1",
             test_kiln_bin(), model);
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECKF(out && strstr(out, "is full: dropped the"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run -m %s --chat -p 'Hello' --system 'Be brief.' --chat-template chatml -n 8 --temp 0 2>/dev/null",
             test_kiln_bin(), model);
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECK(out && strlen(out) > 1);
    free(out);
}

TEST(cli_bench_reports_medians) {
    char *out = NULL;
    CHECK_EQ_INT(run(&out, "bench -m %s -p 16 -n 8 -r 3 --json %s", test_shared("models/stories260K/stories260K.gguf"), ""), 0);
    json_error_t e;
    json_t *j = out ? json_loads(out, 0, &e) : NULL;
    REQUIREF(j, "not JSON: %s", out ? out : "(null)");
    CHECK(json_real_value(json_object_get(j, "prefill_tok_s")) > 0);
    CHECK(json_real_value(json_object_get(j, "decode_tok_s")) > 0);
    json_decref(j);
    free(out);
}
