/* test_mkmodel.c — `kiln mkmodel`: shapes against published configurations and parameter counts,
 * determinism (same seed -> same bytes, whatever the thread count), different seeds, the written file's
 * tensors, keys and value statistics, type fallbacks, errors, and the CLI. */
#include "test.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/formats.h"
#include "gguf/gguf.h"
#include "tools/mkmodel.h"

#define STORIES_VOCAB "models/stories260K/stories260K.gguf"

static int json_int(json_t *o, const char *k) { return (int)json_integer_value(json_object_get(o, k)); }

/* smollm2-135m against the real config.json in the shared data. */
TEST(mkmodel_smollm2_shape_equals_its_config_json) {
    json_error_t err;
    json_t *c = json_load_file(test_shared("models/tokenizers/smollm2-135m-instruct/config.json"), 0, &err);
    REQUIRE(c);
    const kiln_mk_shape *s = kiln_mk_find_shape("smollm2-135m");
    REQUIRE(s);
    CHECK_STR(s->arch, "llama");
    CHECK_EQ_INT(s->n_embd, json_int(c, "hidden_size"));
    CHECK_EQ_INT(s->n_layer, json_int(c, "num_hidden_layers"));
    CHECK_EQ_INT(s->n_head, json_int(c, "num_attention_heads"));
    CHECK_EQ_INT(s->n_head_kv, json_int(c, "num_key_value_heads"));
    CHECK_EQ_INT(s->n_ff, json_int(c, "intermediate_size"));
    CHECK_EQ_INT(s->n_vocab, json_int(c, "vocab_size"));
    CHECK_EQ_INT(s->n_ctx, json_int(c, "max_position_embeddings"));
    CHECK_EQ_INT(s->head_dim * s->n_head, s->n_embd);
    CHECK(s->rope_base == (float)json_number_value(json_object_get(c, "rope_theta")));
    CHECK(s->rms_eps == (float)json_number_value(json_object_get(c, "rms_norm_eps")));
    CHECK(s->tied == json_is_true(json_object_get(c, "tie_word_embeddings")));
    json_decref(c);
}

/* Parameter counts published for each model (model cards / safetensors metadata), which pin the
 * whole shape: SmolLM2-135M 134,515,008; SmolLM2-360M 361,821,120; Qwen3-0.6B 0.6B total with 0.44B
 * non-embedding; TinyLlama-1.1B 1,100,048,384; Llama-3.2-1B 1,235,814,400; Llama-3-8B 8,030,261,248. */
TEST(mkmodel_shapes_have_published_parameter_counts) {
    static const struct { const char *name; uint64_t params; } want[] = {
        {"smollm2-135m", 134515008ull}, {"smollm2-360m", 361821120ull}, {"tinyllama-1.1b", 1100048384ull},
        {"llama-3.2-1b", 1235814400ull}, {"llama-3-8b", 8030261248ull}, {"qwen2.5-0.5b", 494032768ull}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const kiln_mk_shape *s = kiln_mk_find_shape(want[i].name);
        REQUIRE(s);
        kiln_mk_plan p;
        REQUIRE_OK(kiln_mk_plan_make(s, 0, s->n_vocab, KILN_TYPE_F16, &p));
        CHECKF(p.n_params == want[i].params, "%s: %llu params, published %llu", want[i].name,
               (unsigned long long)p.n_params, (unsigned long long)want[i].params);
        kiln_mk_plan_free(&p);
    }
    const kiln_mk_shape *q = kiln_mk_find_shape("qwen3-0.6b");
    REQUIRE(q);
    CHECK_STR(q->arch, "qwen3");
    CHECK(q->qk_norm && q->head_dim == 128 && q->tied);
    kiln_mk_plan p;
    REQUIRE_OK(kiln_mk_plan_make(q, 0, q->n_vocab, KILN_TYPE_F16, &p));
    uint64_t non_embd = p.n_params - (uint64_t)q->n_vocab * (uint64_t)q->n_embd;
    CHECKF(llround((double)p.n_params / 1e8) == 6 && llround((double)non_embd / 1e7) == 44, "qwen3-0.6b: %llu params, %llu non-embedding",
           (unsigned long long)p.n_params, (unsigned long long)non_embd);
    kiln_mk_plan_free(&p);
    /* Qwen3-30B-A3B: 30.5B total, 29.9B non-embedding, 3.3B activated (8 of 128 experts per token; 3.35B
     * counting both the token embedding and the output matrix) */
    const kiln_mk_shape *x = kiln_mk_find_shape("qwen3-30b-a3b");
    REQUIRE(x);
    CHECK(x->n_expert == 128 && x->n_expert_used == 8 && x->n_ff_exp == 768 && !x->tied && x->qk_norm);
    REQUIRE_OK(kiln_mk_plan_make(x, 0, x->n_vocab, KILN_TYPE_F16, &p));
    uint64_t experts = 0;
    for (int i = 0; i < p.n_tensors; i++)
        if (p.tensors[i].n_dims == 3) experts += p.tensors[i].ne[0] * p.tensors[i].ne[1] * p.tensors[i].ne[2];
    non_embd = p.n_params - 2 * (uint64_t)x->n_vocab * (uint64_t)x->n_embd;
    const uint64_t active = p.n_params - experts + experts / 128 * 8;
    CHECKF(llround((double)p.n_params / 1e8) == 305 && llround((double)non_embd / 1e8) == 299 &&
           active > 3300000000ull && active < 3400000000ull, "qwen3-30b-a3b: %llu params, %llu non-embedding, %llu active",
           (unsigned long long)p.n_params, (unsigned long long)non_embd, (unsigned long long)active);
    CHECK_EQ_INT(p.n_tensors, 3 + 48 * 12);
    kiln_mk_plan_free(&p);
}

/* The sizes the issue gives: smollm2-135m in Q8_0 about 145 MB, llama-3-8b in Q4_K about 4.6 GB. */
TEST(mkmodel_planned_sizes_match_the_expected_files) {
    kiln_mk_plan p;
    const kiln_mk_shape *s = kiln_mk_find_shape("smollm2-135m");
    REQUIRE_OK(kiln_mk_plan_make(s, 0, 49152, KILN_TYPE_Q8_0, &p));
    CHECKF(p.data_bytes > 140000000ull && p.data_bytes < 150000000ull, "smollm2-135m q8_0: %llu bytes",
           (unsigned long long)p.data_bytes);
    CHECK_EQ_INT(p.n_tensors, 2 + 30 * 9);
    kiln_mk_plan_free(&p);
    s = kiln_mk_find_shape("llama-3-8b");
    REQUIRE_OK(kiln_mk_plan_make(s, 0, 128256, KILN_TYPE_Q4_K, &p));
    CHECKF(p.data_bytes > 4500000000ull && p.data_bytes < 4750000000ull, "llama-3-8b q4_K: %llu bytes",
           (unsigned long long)p.data_bytes);
    CHECK_EQ_INT(p.tensors[p.n_tensors - 1].type, KILN_TYPE_Q6_K); /* output.weight, like llama-quantize */
    CHECK_EQ_INT(p.tensors[0].type, KILN_TYPE_Q4_K);
    kiln_mk_plan_free(&p);
}

static kiln_status make(const char *shape, uint32_t type, const char *vocab, uint64_t seed, int threads, const char *out,
                        kiln_mk_result *r) {
    kiln_mk_opts o = {.shape = shape, .type = type, .vocab = vocab, .seed = seed, .out = out, .n_threads = threads};
    return kiln_mkmodel(&o, r);
}

static bool quantizer_missing(uint32_t type) {
    const kiln_type_info *t = kiln_type_get(type);
    return type != KILN_TYPE_F32 && !t->from_float;
}

TEST(mkmodel_same_seed_same_bytes_any_thread_count) {
    if (quantizer_missing(KILN_TYPE_Q8_0)) { test_skip("no Q8_0 quantizer yet"); return; }
    char a[512], b[512], c[512];
    snprintf(a, sizeof a, "%s/a.gguf", test_tmpdir());
    snprintf(b, sizeof b, "%s/b.gguf", test_tmpdir());
    snprintf(c, sizeof c, "%s/c.gguf", test_tmpdir());
    kiln_mk_result r;
    REQUIRE_OK(make("test-llama", KILN_TYPE_Q8_0, test_shared(STORIES_VOCAB), 7, 3, a, &r));
    REQUIRE_OK(make("test-llama", KILN_TYPE_Q8_0, test_shared(STORIES_VOCAB), 7, 1, b, NULL));
    REQUIRE_OK(make("test-llama", KILN_TYPE_Q8_0, test_shared(STORIES_VOCAB), 8, 2, c, NULL));
    size_t na, nb;
    char *da = test_read_file(a, &na), *db = test_read_file(b, &nb);
    REQUIRE(da && db);
    CHECK(na == nb && na == r.file_bytes && !memcmp(da, db, na));
    free(da);
    free(db);
    /* another seed: every random tensor differs, every norm is the same */
    gguf_file *fa, *fc;
    REQUIRE_OK(gguf_open(a, &fa));
    if (gguf_open(c, &fc) != KILN_OK) { gguf_close(fa); REQUIRE(0); }
    CHECK_EQ_INT(gguf_n_tensors(fa), gguf_n_tensors(fc));
    int n_random = 0;
    for (size_t i = 0; i < gguf_n_tensors(fa) && i < gguf_n_tensors(fc); i++) {
        const gguf_tensor *x = gguf_tensor_at(fa, i), *y = gguf_tensor_at(fc, i);
        REQUIRE(x->nbytes == y->nbytes);
        bool same = !memcmp(x->data, y->data, x->nbytes);
        bool is_norm = x->n_dims == 1;
        n_random += !is_norm;
        CHECKF(same == is_norm, "tensor %.*s: %s across seeds", (int)x->name.len, x->name.ptr, same ? "equal" : "different");
    }
    CHECK(n_random == 2 * 7 + 2);
    gguf_close(fa);
    gguf_close(fc);
}

/* A qwen3 file: tensor names, shapes, types and sizes as llama.cpp's; hyperparameter keys; every
 * tokenizer.* key of the vocabulary GGUF copied; values distributed as specified. */
TEST(mkmodel_qwen3_file_parses_with_the_expected_tensors) {
    char out[512];
    snprintf(out, sizeof out, "%s/q.gguf", test_tmpdir());
    kiln_mk_result r;
    REQUIRE_OK(make("test-qwen3", KILN_TYPE_F32, test_shared(STORIES_VOCAB), 3, 2, out, &r));
    gguf_file *f, *voc;
    REQUIRE_OK(gguf_open(out, &f));
    if (gguf_open(test_shared(STORIES_VOCAB), &voc) != KILN_OK) { gguf_close(f); REQUIRE(0); }
    const kiln_mk_shape *s = kiln_mk_find_shape("test-qwen3");
    const uint64_t E = (uint64_t)s->n_embd, H = (uint64_t)s->head_dim, Q = s->n_head * H, KV = s->n_head_kv * H,
                   F = (uint64_t)s->n_ff, V = 512;
    CHECK_EQ_INT(gguf_n_tensors(f), 2 + 2 * 11); /* tied: no output.weight */
    CHECK_EQ_INT(r.n_tensors, gguf_n_tensors(f));
    CHECK_EQ_INT(r.n_vocab, V);
    struct { const char *name; uint64_t ne0, ne1; } want[] = {
        {"token_embd.weight", E, V}, {"blk.1.attn_norm.weight", E, 1}, {"blk.1.attn_q.weight", E, Q},
        {"blk.1.attn_k.weight", E, KV}, {"blk.1.attn_v.weight", E, KV}, {"blk.1.attn_output.weight", Q, E},
        {"blk.1.attn_q_norm.weight", H, 1}, {"blk.1.attn_k_norm.weight", H, 1}, {"blk.1.ffn_norm.weight", E, 1},
        {"blk.1.ffn_gate.weight", E, F}, {"blk.1.ffn_up.weight", E, F}, {"blk.1.ffn_down.weight", F, E},
        {"output_norm.weight", E, 1}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, want[i].name);
        CHECKF(t != NULL, "no tensor %s", want[i].name);
        if (!t) continue;
        CHECKF(t->ne[0] == want[i].ne0 && t->ne[1] == want[i].ne1 && t->n_dims == (want[i].ne1 > 1 ? 2u : 1u),
               "%s: shape [%llu, %llu]", want[i].name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1]);
        CHECK_EQ_INT(t->type, KILN_TYPE_F32);
        CHECK_EQ_INT(t->nbytes, 4 * want[i].ne0 * want[i].ne1);
    }
    CHECK(gguf_find_tensor(f, "output.weight") == NULL);
    uint32_t u;
    gguf_str str;
    CHECK_OK(gguf_get_str(f, "general.architecture", &str));
    CHECK(gguf_str_eq(str, "qwen3"));
    CHECK_OK(gguf_get_u32(f, "qwen3.block_count", &u)); CHECK_EQ_INT(u, 2);
    CHECK_OK(gguf_get_u32(f, "qwen3.attention.key_length", &u)); CHECK_EQ_INT(u, H);
    CHECK_OK(gguf_get_u32(f, "qwen3.attention.value_length", &u)); CHECK_EQ_INT(u, H);
    CHECK_OK(gguf_get_u32(f, "qwen3.vocab_size", &u)); CHECK_EQ_INT(u, V);
    CHECK_OK(gguf_get_u32(f, "qwen3.embedding_length", &u)); CHECK_EQ_INT(u, E);
    CHECK_OK(gguf_get_u32(f, "general.file_type", &u)); CHECK_EQ_INT(u, 0);
    float eps;
    CHECK_OK(gguf_get_f32(f, "qwen3.attention.layer_norm_rms_epsilon", &eps)); CHECK(eps == s->rms_eps);
    int n_tok_keys = 0;
    for (size_t i = 0; i < gguf_n_kv(voc); i++) {
        const gguf_kv *kv = gguf_kv_at(voc, i);
        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10)) continue;
        n_tok_keys++;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        const gguf_kv *m = gguf_find(f, key);
        CHECKF(m && m->value.type == kv->value.type, "key %s not copied", key);
        if (m && kv->value.type == GGUF_VT_ARRAY) {
            CHECKF(m->value.v.arr.n == kv->value.v.arr.n, "%s: %llu elements", key, (unsigned long long)m->value.v.arr.n);
            for (uint64_t j = 0; kv->value.v.arr.elem == GGUF_VT_STRING && j < kv->value.v.arr.n && j < m->value.v.arr.n; j++) {
                gguf_str x = gguf_arr_str(&kv->value.v.arr, j), y = gguf_arr_str(&m->value.v.arr, j);
                if (x.len != y.len || memcmp(x.ptr, y.ptr, x.len)) { CHECKF(0, "%s[%llu] differs", key, (unsigned long long)j); break; }
            }
        }
    }
    CHECK(n_tok_keys >= 5);
    /* values: std 0.02 around 0 for matrices, exactly 1 for norms */
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    REQUIRE(t);
    const float *x = t->data;
    uint64_t n = t->ne[0] * t->ne[1];
    double sum = 0, sq = 0, mx = 0;
    for (uint64_t i = 0; i < n; i++) { sum += x[i]; sq += (double)x[i] * x[i]; if (fabs(x[i]) > mx) mx = fabs(x[i]); }
    double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
    CHECKF(fabs(mean) < 2e-4 && fabs(sd - 0.02) < 4e-4 && mx > 0.05 && mx < 0.0695, "mean %g std %g max %g", mean, sd, mx);
    t = gguf_find_tensor(f, "blk.0.attn_q_norm.weight");
    REQUIRE(t);
    for (uint64_t i = 0; i < t->ne[0]; i++) CHECK(((const float *)t->data)[i] == 1.0f);
    gguf_close(voc);
    gguf_close(f);
}

/* A HF tokenizer directory as the vocabulary, and a K type whose 256-blocks do not fit 128-wide rows:
 * those matrices fall back to Q5_0, the tied embedding (the output) to Q8_0. */
TEST(mkmodel_hf_vocab_and_k_type_fallback) {
    if (quantizer_missing(KILN_TYPE_Q5_0) || quantizer_missing(KILN_TYPE_Q8_0) || quantizer_missing(KILN_TYPE_Q4_K)) {
        test_skip("quantizers for q4_K/q5_0/q8_0 not all there yet");
        return;
    }
    char out[512];
    snprintf(out, sizeof out, "%s/k.gguf", test_tmpdir());
    kiln_mk_result r;
    REQUIRE_OK(make("test-qwen3", KILN_TYPE_Q4_K, test_shared("models/tokenizers/smollm2-135m-instruct"), 5, 2, out, &r));
    CHECK_EQ_INT(r.n_vocab, 49152);
    gguf_file *f;
    REQUIRE_OK(gguf_open(out, &f));
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->type == KILN_TYPE_Q8_0 && t->ne[1] == 49152);
    t = gguf_find_tensor(f, "blk.0.attn_q.weight");       /* row 128: falls back */
    CHECK(t && t->type == KILN_TYPE_Q5_0);
    t = gguf_find_tensor(f, "blk.0.attn_output.weight");  /* row 256: fits */
    CHECK(t && t->type == KILN_TYPE_Q4_K);
    t = gguf_find_tensor(f, "blk.0.ffn_down.weight");
    CHECK(t && t->type == KILN_TYPE_Q4_K);
    gguf_str s;
    CHECK_OK(gguf_get_str(f, "tokenizer.ggml.pre", &s));
    CHECK(gguf_str_eq(s, "smollm"));
    uint32_t u;
    CHECK_OK(gguf_get_u32(f, "qwen3.vocab_size", &u));
    CHECK_EQ_INT(u, 49152);
    CHECK_OK(gguf_get_u32(f, "general.file_type", &u));
    CHECK_EQ_INT(u, 14);
    gguf_close(f);
}

TEST(mkmodel_errors_leave_no_file) {
    char out[512], tmp[600];
    snprintf(out, sizeof out, "%s/e.gguf", test_tmpdir());
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    struct stat st;
    CHECK_EQ_INT(make("no-such-shape", KILN_TYPE_F32, test_shared(STORIES_VOCAB), 1, 1, out, NULL), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(make("test-llama", KILN_TYPE_Q8_K, test_shared(STORIES_VOCAB), 1, 1, out, NULL), KILN_ERR_INVALID_ARG);
    CHECK_EQ_INT(make("test-llama", KILN_TYPE_F32, "/nonexistent/vocab.gguf", 1, 1, out, NULL), KILN_ERR_IO);
    char voc[512];
    snprintf(voc, sizeof voc, "%s/v.gguf", test_tmpdir());
    FILE *fp = fopen(voc, "wb");
    REQUIRE(fp);
    fputs("GGUF\x03", fp); /* truncated header */
    fclose(fp);
    CHECK_EQ_INT(make("test-llama", KILN_TYPE_F32, voc, 1, 1, out, NULL), KILN_ERR_FORMAT);
    CHECK(stat(out, &st) != 0 && stat(tmp, &st) != 0);
}

TEST(mkmodel_cli_options_and_generation) {
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s mkmodel --help", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECK(out && strstr(out, "usage: kiln mkmodel"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s mkmodel --list-shapes", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    static const char *const names[] = {"smollm2-135m", "smollm2-360m", "qwen3-0.6b", "tinyllama-1.1b", "llama-3.2-1b", "llama-3-8b"};
    for (size_t i = 0; i < 6; i++) CHECKF(out && strstr(out, names[i]), "--list-shapes lacks %s", names[i]);
    CHECK(out && !strstr(out, "test-llama"));
    free(out);
    char gguf[512];
    snprintf(gguf, sizeof gguf, "%s/cli.gguf", test_tmpdir());
    const char *bad[] = {"--shape nope --type q8_0", "--shape test-llama --type q9_9", "--shape test-llama --type f32",
                         "--shape test-llama --type f32 --vocab V --seed -3", "--shape test-llama --type f32 --vocab V --threads 0",
                         "--bogus"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s mkmodel %s -o %s 2>/dev/null", test_kiln_bin(), bad[i], gguf);
        CHECKF(test_run_cmd(cmd, NULL) == 2, "'%s' is not a usage error", bad[i]);
    }
    snprintf(cmd, sizeof cmd, "%s mkmodel --shape test-llama --type f16 --vocab %s --seed 9 -o %s 2>&1", test_kiln_bin(),
             test_shared(STORIES_VOCAB), gguf);
    int rc = test_run_cmd(cmd, &out);
    if (quantizer_missing(KILN_TYPE_F16)) CHECK(rc != 0);
    else CHECKF(rc == 0 && out && strstr(out, "wrote"), "rc %d: %s", rc, out ? out : "");
    free(out);
}

/* The generated models load in kiln and run: logits finite and neither flat nor one-hot through a
 * prefill and greedy decode steps (llama with Q8_0 matrices and an SPM vocabulary; qwen3 with q/k norms,
 * head_dim != n_embd / n_head, F16 matrices and a byte-level BPE vocabulary). */
static void run_generated_file(const char *shape, const char *out);

static void run_generated(const char *shape, uint32_t type, const char *vocab) {
    if (quantizer_missing(type)) { test_skip("no quantizer for type %u yet", type); return; }
    char out[512];
    snprintf(out, sizeof out, "%s/%s.gguf", test_tmpdir(), shape);
    REQUIRE_OK(make(shape, type, test_shared(vocab), 11, 2, out, NULL));
    run_generated_file(shape, out);
}

static void run_generated_file(const char *shape, const char *out) {
    kiln_model *m;
    REQUIRE_OK(kiln_model_open(out, &m));
    kiln_model_info mi;
    kiln_model_get_info(m, &mi);
    const kiln_mk_shape *s = kiln_mk_find_shape(shape);
    CHECK_EQ_INT(mi.n_layer, s->n_layer);
    CHECK_EQ_INT(mi.head_dim, s->head_dim);
    kiln_session_options so = {.n_ctx = 64, .n_threads = 2, .device = KILN_DEVICE_CPU};
    kiln_session *ss;
    kiln_status st = kiln_session_open(m, &so, &ss);
    if (st != KILN_OK) { kiln_model_close(m); REQUIRE_OK(st); }
    int32_t ids[4] = {1, 5, 9, 13};
    const float *lg;
    st = kiln_prefill(ss, ids, 4, &lg);
    for (int step = 0; st == KILN_OK && step < 8; step++) {
        int nonfinite = 0, best = 0;
        double sum = 0, sq = 0, mx = -1e30;
        for (int i = 0; i < mi.n_vocab; i++) {
            if (!isfinite(lg[i])) { nonfinite++; continue; }
            sum += lg[i];
            sq += (double)lg[i] * lg[i];
            if (lg[i] > mx) { mx = lg[i]; best = i; }
        }
        double mean = sum / mi.n_vocab, sd = sqrt(sq / mi.n_vocab - mean * mean), z = 0;
        for (int i = 0; i < mi.n_vocab; i++) z += exp(lg[i] - mx);
        CHECKF(nonfinite == 0 && sd > 0.05 && sd < 20 && 1.0 / z < 0.9, "%s step %d: %d non-finite, std %g, top-1 p %g",
               shape, step, nonfinite, sd, 1.0 / z);
        st = kiln_decode(ss, best, &lg);
    }
    CHECK_OK(st);
    kiln_session_close(ss);
    kiln_model_close(m);
}

TEST(mkmodel_generated_llama_runs_without_nan) { run_generated("test-llama", KILN_TYPE_Q8_0, STORIES_VOCAB); }

/* The small MoE shape with Q4_K experts (3-D tensors, F32 router) runs a few tokens without NaN. */
TEST(mkmodel_generated_qwen3moe_runs_without_nan) { run_generated("qwen3moe-tiny", KILN_TYPE_Q4_K, STORIES_VOCAB); }

/* --expert-codes: the 3-D expert tensors are random codes whose every block carries the fixed scales (Q4_K: d =
 * std/260, dmin = 7.5 d), their dequantized values have about the planned std and mean 0, the same bytes come out
 * for any thread count, every other tensor is byte-identical to the normal file, and the model runs; unsupported
 * types and shapes without experts are refused, leaving no file. */
static kiln_status make_codes(const char *shape, uint32_t type, int threads, const char *out) {
    kiln_mk_opts o = {.shape = shape, .type = type, .vocab = test_shared(STORIES_VOCAB), .seed = 11, .out = out,
                      .n_threads = threads, .expert_codes = true};
    return kiln_mkmodel(&o, NULL);
}

TEST(mkmodel_expert_codes_fixed_scales_and_the_rest_unchanged) {
    char a[512], b[512], n[512];
    snprintf(a, sizeof a, "%s/codes-a.gguf", test_tmpdir());
    snprintf(b, sizeof b, "%s/codes-b.gguf", test_tmpdir());
    snprintf(n, sizeof n, "%s/codes-n.gguf", test_tmpdir());
    REQUIRE_OK(make_codes("qwen3moe-tiny", KILN_TYPE_Q4_K, 3, a));
    REQUIRE_OK(make_codes("qwen3moe-tiny", KILN_TYPE_Q4_K, 1, b));
    REQUIRE_OK(make("qwen3moe-tiny", KILN_TYPE_Q4_K, test_shared(STORIES_VOCAB), 11, 2, n, NULL));
    size_t na, nb;
    char *da = test_read_file(a, &na), *db = test_read_file(b, &nb);
    REQUIRE(da && db);
    CHECK(na == nb && !memcmp(da, db, na));
    free(da);
    free(db);
    gguf_file *fa, *fn;
    REQUIRE_OK(gguf_open(a, &fa));
    if (gguf_open(n, &fn) != KILN_OK) { gguf_close(fa); REQUIRE(0); }
    CHECK_EQ_INT(gguf_n_tensors(fa), gguf_n_tensors(fn));
    const uint16_t hd = kiln_f32_to_f16(0.02f / 260.0f), hm = kiln_f32_to_f16(0.02f / 260.0f * 7.5f);
    int n_codes = 0, n_same = 0;
    float *row = malloc(sizeof(float) * 4096);
    REQUIRE(row);
    for (size_t i = 0; i < gguf_n_tensors(fa) && i < gguf_n_tensors(fn); i++) {
        const gguf_tensor *t = gguf_tensor_at(fa, i), *u = gguf_tensor_at(fn, i);
        REQUIRE(t->type == u->type && t->nbytes == u->nbytes && t->ne[0] <= 4096);
        if (t->n_dims != 3) {
            n_same += !memcmp(t->data, u->data, t->nbytes);
            continue;
        }
        n_codes++;
        CHECK_EQ_INT(t->type, KILN_TYPE_Q4_K);
        const uint8_t *d = t->data;
        int bad_scale = 0;
        for (uint64_t o = 0; o < t->nbytes; o += 144) {
            uint16_t h0, h1;
            memcpy(&h0, d + o, 2);
            memcpy(&h1, d + o + 2, 2);
            bad_scale += h0 != hd || h1 != hm;
        }
        const size_t rb = kiln_row_bytes(t->type, t->ne[0]);
        double sum = 0, sq = 0, cnt = 0;
        for (uint64_t r = 0; r < t->ne[1] * t->ne[2]; r++) {
            kiln_type_get(t->type)->to_float(d + r * rb, row, (int64_t)t->ne[0]);
            for (uint64_t c = 0; c < t->ne[0]; c++) sum += row[c], sq += (double)row[c] * row[c], cnt++;
        }
        const double mean = sum / cnt, sd = sqrt(sq / cnt - mean * mean);
        CHECKF(bad_scale == 0 && sd > 0.01 && sd < 0.04 && fabs(mean) < 0.1 * sd && memcmp(t->data, u->data, t->nbytes),
               "%.*s: %d blocks with other scales, mean %g, std %g (planned 0.02)", (int)t->name.len, t->name.ptr,
               bad_scale, mean, sd);
    }
    free(row);
    CHECK_EQ_INT(n_codes, 3 * kiln_mk_find_shape("qwen3moe-tiny")->n_layer);
    CHECK_EQ_INT(n_same + n_codes, gguf_n_tensors(fa));
    gguf_close(fa);
    gguf_close(fn);
    run_generated_file("qwen3moe-tiny", a);
    char e[512], et[600];
    snprintf(e, sizeof e, "%s/codes-e.gguf", test_tmpdir());
    snprintf(et, sizeof et, "%s.tmp", e);
    CHECK_EQ_INT(make_codes("qwen3moe-tiny", KILN_TYPE_Q5_1, 1, e), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "q5_1") != NULL);
    CHECK_EQ_INT(make_codes("test-llama", KILN_TYPE_Q4_K, 1, e), KILN_ERR_INVALID_ARG);
    CHECK(strstr(kiln_last_error(), "no expert tensors") != NULL);
    struct stat st;
    CHECK(stat(e, &st) != 0 && stat(et, &st) != 0);
}

TEST(mkmodel_generated_qwen3_runs_without_nan) {
    run_generated("test-qwen3", KILN_TYPE_F16, "models/tokenizers/qwen3");
}
