/*
 * test_gguf_inspect.c — `kiln inspect` run as a command (the ASan-built CLI from test_kiln_bin()): the text
 * report of stories260K holds the facts of shared/models/PROVENANCE.md, --json parses (jansson) and says the
 * same, --full --json lists a whole 50257-token vocabulary, and bad usage / bad files give the right exit codes.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

static int run_inspect(const char *args, char **out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", test_kiln_bin(), args);
    return test_run_cmd(cmd, out);
}

TEST(gguf_inspect_text_stories260K) {
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "'%s'", test_shared("models/stories260K/stories260K.gguf"));
    int rc = run_inspect(args, &out);
    REQUIREF(rc == 0 && out, "exit %d: %s", rc, out ? out : "");
    CHECK(strstr(out, "size       1185376 bytes") != NULL);
    CHECK(strstr(out, "version    GGUF v3\n") != NULL);
    CHECK(strstr(out, "keys       19\n") != NULL);
    CHECK(strstr(out, "tensors    48 (292800 elements)\n") != NULL);
    /* "open 0.42 ms (map 0.03, parse 0.39)" */
    const char *open_line = strstr(out, "\nopen ");
    REQUIRE(open_line);
    double total, map, parse;
    CHECK(sscanf(open_line, "\nopen %lf ms (map %lf, parse %lf)", &total, &map, &parse) == 3);
    CHECK(total > 0 && map >= 0 && parse > 0 && total >= map + parse - 0.011);
    CHECK(strstr(out, "general.architecture                    string \"llama\"") != NULL);
    CHECK(strstr(out, "llama.block_count                       u32    5\n") != NULL);
    CHECK(strstr(out, "tokenizer.ggml.tokens                   array of 512 string: [\"<unk>\", \"<s>\", \"</s>\",") != NULL);
    CHECK(strstr(out, "... 504 more]") != NULL);
    CHECK(strstr(out, "  token_embd.weight         f32      [64, 512]") != NULL);
    CHECK(strstr(out, "  f32            48          292800         1171200   100.0%") != NULL);
    free(out);
}

TEST(gguf_inspect_json_parses) {
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "--json '%s'", test_shared("models/stories260K/stories260K.gguf"));
    REQUIRE(run_inspect(args, &out) == 0 && out);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    REQUIREF(j, "JSON error line %d: %s", err.line, err.text);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "size")), 1185376);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "version")), 3);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "n_kv")), 19);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "n_tensors")), 48);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "metadata")), 19);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "tensors")), 48);
    json_t *open = json_object_get(j, "open_ms");
    CHECK(json_real_value(json_object_get(open, "total")) > 0);
    bool found_arch = false;
    size_t i;
    json_t *kv;
    json_array_foreach(json_object_get(j, "metadata"), i, kv) {
        if (!strcmp(json_string_value(json_object_get(kv, "key")), "general.architecture")) {
            found_arch = true;
            CHECK_STR(json_string_value(json_object_get(kv, "value")), "llama");
        }
        if (!strcmp(json_string_value(json_object_get(kv, "key")), "tokenizer.ggml.tokens")) {
            CHECK_EQ_INT(json_integer_value(json_object_get(kv, "n")), 512);
            CHECK(json_is_false(json_object_get(kv, "complete")));
        }
    }
    CHECK(found_arch);
    json_t *totals = json_object_get(j, "totals");
    REQUIRE(json_array_size(totals) == 1);
    CHECK_STR(json_string_value(json_object_get(json_array_get(totals, 0), "type")), "f32");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(totals, 0), "elements")), 292800);
    json_t *t0 = json_array_get(json_object_get(j, "tensors"), 0);
    CHECK_STR(json_string_value(json_object_get(t0, "name")), "token_embd.weight");
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(t0, "shape"), 1)), 512);
    json_decref(j);
    free(out);
}

TEST(gguf_inspect_full_json_vocab) {
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "--full --json '%s'", test_shared("models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf"));
    REQUIRE(run_inspect(args, &out) == 0 && out);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    REQUIREF(j, "JSON error line %d: %s", err.line, err.text);
    size_t i;
    json_t *kv;
    int seen = 0;
    json_array_foreach(json_object_get(j, "metadata"), i, kv) {
        const char *key = json_string_value(json_object_get(kv, "key"));
        json_t *v = json_object_get(kv, "value");
        if (!strcmp(key, "tokenizer.ggml.tokens")) {
            seen++;
            CHECK_EQ_INT(json_array_size(v), 50257);
            CHECK_STR(json_string_value(json_array_get(v, 50256)), "<|endoftext|>");
        }
        if (!strcmp(key, "tokenizer.ggml.merges")) {
            seen++;
            CHECK_EQ_INT(json_array_size(v), 50000);
        }
    }
    CHECK_EQ_INT(seen, 2);
    json_decref(j);
    free(out);
}

TEST(gguf_inspect_usage_and_errors) {
    char *out = NULL;
    CHECK_EQ_INT(run_inspect("--help", &out), 0);
    CHECK(out && strstr(out, "usage: kiln inspect MODEL.gguf"));
    free(out);
    CHECK_EQ_INT(run_inspect("", &out), 2);
    CHECK(out && strstr(out, "missing MODEL.gguf"));
    free(out);
    CHECK_EQ_INT(run_inspect("--bogus x.gguf", &out), 2);
    CHECK(out && strstr(out, "unknown option '--bogus'"));
    free(out);
    char path[512], args[600];
    snprintf(path, sizeof path, "%s/bad.gguf", test_tmpdir());
    FILE *fp = fopen(path, "wb");
    REQUIRE(fp);
    static const char v1[] = "GGUF\1\0\0\0 a version 1 header";
    fwrite(v1, 1, sizeof v1 - 1, fp);
    fclose(fp);
    snprintf(args, sizeof args, "'%s'", path);
    CHECK_EQ_INT(run_inspect(args, &out), 1);
    CHECK(out && strstr(out, "version 1") && strstr(out, "(offset 4)"));
    free(out);
}
