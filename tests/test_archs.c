/*
 * test_archs.c — the architectures against llama.cpp on the tiny random-weight models of
 * ../shared/models/archs: the reference's prompt and then its generated tokens are fed one by one (teacher
 * forcing) and every step's full logits are compared (CPU and CUDA: qwen2, qwen3, qwen3moe and
 * llama with rope_freqs; qwen3moe also inside a batch of sequences on both). Also: RoPE scaling metadata (linear scaling checked against an independent double-precision
 * forward pass written here; YaRN and the rest refused naming the key) and tensors the model does not use
 * (a warning naming them; an error with a strict open).
 */
#include "test.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "formats/formats.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "test_gpu.h"

#define REF_DIR "models/archs/expected/llama.cpp/"
#define REF_SUFFIX ".greedy-The_capital_of_France_is-16"
#define ROPE_FREQS_MODEL "models/archs/tiny-llama-rope-freqs.gguf"

/* llama.cpp's run of one tiny model: prompt ids, the 16 greedy ids and the logits of every step. */
typedef struct arch_ref {
    int32_t prompt[64], gen[16];
    size_t n_prompt, n_gen;
    int n_vocab;
    float *logits;   /* n_gen x n_vocab */
} arch_ref;

static bool load_ref(const char *model, arch_ref *r) {
    char rel[256];
    snprintf(rel, sizeof rel, REF_DIR "%s" REF_SUFFIX ".json", model);
    json_error_t err;
    json_t *root = json_load_file(test_shared(rel), 0, &err);
    if (!root) {
        test_failf(__FILE__, __LINE__, "cannot parse %s: %s", rel, err.text);
        return false;
    }
    json_t *p = json_object_get(root, "prompt_token_ids"), *g = json_object_get(root, "generated_token_ids");
    r->n_prompt = json_array_size(p) < 64 ? json_array_size(p) : 64;
    r->n_gen = json_array_size(g) < 16 ? json_array_size(g) : 16;
    for (size_t i = 0; i < r->n_prompt; i++) r->prompt[i] = (int32_t)json_integer_value(json_array_get(p, i));
    for (size_t i = 0; i < r->n_gen; i++) r->gen[i] = (int32_t)json_integer_value(json_array_get(g, i));
    r->n_vocab = (int)json_integer_value(json_object_get(root, "n_vocab"));
    json_decref(root);
    snprintf(rel, sizeof rel, REF_DIR "%s" REF_SUFFIX ".logits.f32", model);
    size_t len = 0;
    r->logits = (float *)test_read_file(test_shared(rel), &len);
    if (!r->logits || r->n_prompt == 0 || r->n_gen != 16 || len != r->n_gen * (size_t)r->n_vocab * sizeof(float)) {
        test_failf(__FILE__, __LINE__, "%s: %zu bytes, expected %zu x %d floats", rel, len, r->n_gen, r->n_vocab);
        free(r->logits);
        return false;
    }
    return true;
}

/* Teacher forcing on `model` with the device dev: step 0 is the prompt's last position, step i the position
 * of generated token i-1; at every step the cosine to llama.cpp's logits must be >= min_cos and the argmax
 * must be llama.cpp's generated id. Prints and returns the worst cosine (-2 when nothing ran); keep (may be
 * NULL) receives every step's logits (16 x n_vocab). */
static double teacher_forced_keep(const char *model, kiln_device dev, double min_cos, float *keep) {
    arch_ref r;
    if (!load_ref(model, &r)) return -2;
    char rel[256];
    snprintf(rel, sizeof rel, "models/archs/%s.gguf", model);
    kiln_model *m = NULL;
    kiln_session *s = NULL;
    double worst = 2;
    size_t n_equal = 0;
    kiln_status st = kiln_model_open(test_shared(rel), &m);
    if (st == KILN_OK) st = kiln_session_open(m, &(kiln_session_options){.n_ctx = 64, .n_threads = 2, .device = dev}, &s);
    const float *lg = NULL;
    if (st == KILN_OK) st = kiln_prefill(s, r.prompt, r.n_prompt, &lg);
    for (size_t i = 0; st == KILN_OK && i < r.n_gen; i++) {
        if (i) st = kiln_decode(s, r.gen[i - 1], &lg);
        if (st != KILN_OK) break;
        const float *want = r.logits + i * (size_t)r.n_vocab;
        if (keep) memcpy(keep + i * (size_t)r.n_vocab, lg, sizeof(float) * (size_t)r.n_vocab);
        const double c = test_cosine(lg, want, r.n_vocab);
        worst = c < worst ? c : worst;
        CHECKF(c >= min_cos, "%s step %zu: cosine %.6f < %.4f", model, i, c, min_cos);
        n_equal += test_argmax(lg, r.n_vocab) == r.gen[i];
        CHECKF(test_argmax(lg, r.n_vocab) == r.gen[i], "%s step %zu: argmax %d, llama.cpp %d", model, i,
               test_argmax(lg, r.n_vocab), r.gen[i]);
    }
    CHECKF(st == KILN_OK, "%s: %s: %s", model, kiln_status_name(st), kiln_last_error());
    if (st == KILN_OK) printf("  %s: worst cosine %.7f over %zu steps, %zu argmax equal to llama.cpp's\n", model, worst, r.n_gen,
                             n_equal);
    kiln_session_close(s);
    kiln_model_close(m);
    free(r.logits);
    return worst;
}

static double teacher_forced(const char *model, kiln_device dev, double min_cos) {
    return teacher_forced_keep(model, dev, min_cos, NULL);
}

/* The reference's sequence (teacher forced) as sequence 0 of a batch beside three others (their own
 * prompts, then greedy decode rows; sequence 0's prompt arrives in the first batch, between their rows):
 * at every step the argmax is llama.cpp's and its logits equal those of the sequence alone, bit for bit on
 * the CPU; on CUDA (where a batch runs the prefill kernels and a row alone the decode graph) within cosine
 * min_cos of alone and of llama.cpp's. */
static void teacher_forced_in_batch(const char *model, kiln_device dev, double min_cos) {
    arch_ref r;
    if (!load_ref(model, &r)) return;
    const size_t V = (size_t)r.n_vocab;
    float *alone = malloc(sizeof(float) * V * r.n_gen);
    char rel[256];
    snprintf(rel, sizeof rel, "models/archs/%s.gguf", model);
    kiln_model *m = NULL;
    kiln_session *s = NULL;
    kiln_status st = teacher_forced_keep(model, dev, min_cos, alone) > -2 ? KILN_OK : KILN_ERR_INTERNAL;
    if (st == KILN_OK) st = kiln_model_open(test_shared(rel), &m);
    if (st == KILN_OK)
        st = kiln_session_open(m, &(kiln_session_options){.n_ctx = 64, .n_threads = 2, .max_batch = 32, .n_seq = 4,
                                                          .device = dev}, &s);
    int32_t next[4] = {0};
    for (int q = 1; st == KILN_OK && q < 4; q++) {
        const int32_t other[5] = {1, 100 + 7 * q, 2000 + 13 * q, 30 + q, 4000 + q};
        const float *lg;
        st = kiln_seq_prefill(s, q, other, 2 + (size_t)q, &lg);
        next[q] = test_argmax(lg, (int)V);
    }
    int same = 0;
    double worst = 2;
    for (size_t i = 0; st == KILN_OK && i < r.n_gen; i++) {
        kiln_batch_row rows[80];
        size_t n = 0;
        rows[n++] = (kiln_batch_row){.seq = 2, .id = next[2], .out = KILN_OUT_LOGITS};
        if (i == 0)
            for (size_t j = 0; j < r.n_prompt; j++)
                rows[n++] = (kiln_batch_row){.seq = 0, .id = r.prompt[j], .out = j + 1 == r.n_prompt ? KILN_OUT_LOGITS : KILN_OUT_NONE};
        else
            rows[n++] = (kiln_batch_row){.seq = 0, .id = r.gen[i - 1], .out = KILN_OUT_LOGITS};
        rows[n++] = (kiln_batch_row){.seq = 3, .id = next[3], .out = KILN_OUT_LOGITS};
        rows[n++] = (kiln_batch_row){.seq = 1, .id = next[1], .out = KILN_OUT_LOGITS};
        kiln_batch_output out[4];
        size_t n_out = 0;
        st = kiln_batch(s, rows, n, out, 4, &n_out);
        for (size_t k = 0; st == KILN_OK && k < n_out; k++) {
            const int q = rows[out[k].row].seq;
            next[q] = out[k].id;
            if (q) continue;
            const double c_ref = test_cosine(out[k].logits, r.logits + i * V, (int)V);
            worst = c_ref < worst ? c_ref : worst;
            CHECKF(c_ref >= min_cos, "%s step %zu in the batch: cosine %.6f to llama.cpp < %.4f", model, i, c_ref, min_cos);
            const bool eq = dev == KILN_DEVICE_CPU ? !memcmp(out[k].logits, alone + i * V, sizeof(float) * V)
                                                   : test_cosine(out[k].logits, alone + i * V, (int)V) >= min_cos;
            same += eq;
            CHECKF(eq, "%s step %zu: sequence 0's logits in the batch differ from alone", model, i);
            CHECKF(out[k].id == r.gen[i], "%s step %zu: argmax %d in the batch, llama.cpp %d", model, i, out[k].id, r.gen[i]);
        }
    }
    CHECKF(st == KILN_OK, "%s: %s: %s", model, kiln_status_name(st), kiln_last_error());
    printf("  %s in a batch of 4 sequences (%s): %d of %zu steps %s alone, worst cosine to llama.cpp %.7f\n", model,
           dev == KILN_DEVICE_CPU ? "cpu" : "cuda", same, r.n_gen, dev == KILN_DEVICE_CPU ? "bit-identical to" : "within the cosine of",
           worst);
    kiln_session_close(s);
    kiln_model_close(m);
    free(alone);
    free(r.logits);
}

TEST(archs_cpu_moe_in_a_batch_equals_alone_and_llamacpp) { teacher_forced_in_batch("tiny-qwen3moe", KILN_DEVICE_CPU, 0.9999); }

TEST(archs_cpu_teacher_forced_logits_match_llamacpp) {
    static const char *models[] = {"tiny-llama-rope-freqs", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3moe"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) teacher_forced(models[i], KILN_DEVICE_CPU, 0.9999);
}

/* The same on the CUDA backend (its Q/K/V post-processing kernel for the qwen biases, Q/K norm and NEOX RoPE). */
TEST(archs_cuda_teacher_forced_logits_match_llamacpp) {
    if (!test_gpu_ready()) return;
    static const char *models[] = {"tiny-llama-rope-freqs", "tiny-qwen2", "tiny-qwen3"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) teacher_forced(models[i], KILN_DEVICE_CUDA, 0.999);
}

/* The MoE model on CUDA (the routing and experts of cuda_moe.cu), teacher forced alone (the 6-token prompt
 * through the per-row expert kernels, then the decode graph) and inside a batch of four sequences (step 0: the
 * prompt beside three decode rows, 9 rows: at least cm_group_rows = 8 of this model (8 experts, 2 used), so
 * grouped by expert through the tensor-core GEMMs; then steps of 4 rows, one per sequence, per row). */
TEST(archs_cuda_moe_alone_and_in_a_batch_match_llamacpp) {
    if (!test_gpu_ready()) return;
    teacher_forced_in_batch("tiny-qwen3moe", KILN_DEVICE_CUDA, 0.999);
}

/* ---- variants of a model file */

/* A copy of src with metadata edits (key = value: a string, or an f32 when str is NULL, a u32 of that value
 * when str is KV_U32) and, when te is given, one tensor replaced (when the file has one of that name) or added. */
typedef struct kv_edit {
    const char *key, *str;
    float f32;
} kv_edit;
static const char KV_U32[] = "(u32)";

typedef struct tensor_edit {
    const char *name;
    uint32_t type;
    uint64_t ne[4];   /* 1-D */
    const void *data;
} tensor_edit;

static kiln_status write_variant(const char *src, const char *dst, const kv_edit *ed, size_t n_ed, const tensor_edit *te) {
    gguf_file *f;
    KILN_TRY(gguf_open(src, &f));
    gguf_writer *w;
    kiln_status st = gguf_writer_open(&w);
    for (size_t i = 0; st == KILN_OK && i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        st = gguf_set_value(w, key, &kv->value);
    }
    for (size_t i = 0; st == KILN_OK && i < n_ed; i++)
        st = ed[i].str == KV_U32 ? gguf_set_u32(w, ed[i].key, (uint32_t)ed[i].f32)
             : ed[i].str ? gguf_set_str(w, ed[i].key, ed[i].str, strlen(ed[i].str)) : gguf_set_f32(w, ed[i].key, ed[i].f32);
    bool replaced = false;
    for (size_t i = 0; st == KILN_OK && i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (te && !strcmp(name, te->name)) {
            st = gguf_add_tensor(w, name, te->type, 1, te->ne, te->data);
            replaced = true;
        } else {
            st = gguf_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
        }
    }
    if (st == KILN_OK && te && !replaced) st = gguf_add_tensor(w, te->name, te->type, 1, te->ne, te->data);
    if (st == KILN_OK) st = gguf_writer_write(w, dst, NULL, NULL);
    gguf_writer_close(w);
    gguf_close(f);
    return st;
}

static const char *variant_of(const char *src, const char *name, const kv_edit *ed, size_t n_ed, const tensor_edit *te) {
    static char path[8][512];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 512, "%s/%s.gguf", test_tmpdir(), name);
    kiln_status st = write_variant(test_shared(src), p, ed, n_ed, te);
    if (st != KILN_OK) test_failf(__FILE__, __LINE__, "writing %s: %s", p, kiln_last_error());
    return p;
}

static const char *variant(const char *name, const kv_edit *ed, size_t n_ed, const tensor_edit *te) {
    return variant_of(ROPE_FREQS_MODEL, name, ed, n_ed, te);
}

/* Expert counts out of range, more experts used than there are, expert counts on a dense architecture and
 * an expert tensor of the wrong shape are refused at open, naming the key or the tensor. */
TEST(archs_moe_bad_expert_metadata_is_refused_naming_it) {
    static const float f32[64 * 8] = {1};
    static const struct { kv_edit e; const char *src, *what; kiln_status st; } cases[] = {
        {{"qwen3moe.expert_used_count", KV_U32, 9}, "models/archs/tiny-qwen3moe.gguf", "expert_used_count 9", KILN_ERR_FORMAT},
        {{"qwen3moe.expert_used_count", KV_U32, 0}, "models/archs/tiny-qwen3moe.gguf", "'qwen3moe.expert_used_count' = 0", KILN_ERR_FORMAT},
        {{"qwen3moe.expert_count", KV_U32, 100000}, "models/archs/tiny-qwen3moe.gguf", "'qwen3moe.expert_count' = 100000", KILN_ERR_FORMAT},
        {{"qwen3moe.expert_feed_forward_length", KV_U32, 0}, "models/archs/tiny-qwen3moe.gguf", "expert_feed_forward_length", KILN_ERR_FORMAT},
        {{"llama.expert_count", KV_U32, 8}, ROPE_FREQS_MODEL, "'llama.expert_count' = 8", KILN_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_model *m = (kiln_model *)1;
        CHECK_EQ_INT(kiln_model_open(variant_of(cases[i].src, "moe", &cases[i].e, 1, NULL), &m), cases[i].st);
        CHECKF(strstr(kiln_last_error(), cases[i].what) != NULL, "case %zu: %s", i, kiln_last_error());
        CHECK(m == NULL);
        if (m && m != (kiln_model *)1) kiln_model_close(m);
    }
    /* the router of layer 2 as [64, 8, 1] is fine; as 1-D [512] it is refused naming it and both shapes */
    const tensor_edit bad = {"blk.2.ffn_gate_inp.weight", KILN_TYPE_F32, {512, 1, 1, 1}, f32};
    kiln_model *m = (kiln_model *)1;
    CHECK_EQ_INT(kiln_model_open(variant_of("models/archs/tiny-qwen3moe.gguf", "moe_t", NULL, 0, &bad), &m), KILN_ERR_FORMAT);
    CHECKF(strstr(kiln_last_error(), "'blk.2.ffn_gate_inp.weight' has shape [512, 1, 1, 1], expected [64, 8]"), "%s",
           kiln_last_error());
    CHECK(m == NULL);
    /* the file as made opens strictly (every tensor used), with its expert counts */
    REQUIRE_OK(kiln_model_open_ex(test_shared("models/archs/tiny-qwen3moe.gguf"), &(kiln_model_options){.strict = true}, &m));
    CHECK(m->hp.n_expert == 8 && m->hp.n_expert_used == 2 && m->hp.n_ff_exp == 96 && m->hp.moe_norm_topk);
    kiln_model_close(m);
}

/* Runs f(arg) with stderr captured into buf (NUL-terminated). */
static kiln_status with_stderr(char *buf, size_t cap, kiln_status (*fn)(const char *, kiln_model **), const char *path,
                               kiln_model **m) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s/stderr.txt", test_tmpdir());
    fflush(stderr);
    const int saved = dup(2), fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    dup2(fd, 2);
    kiln_status st = fn(path, m);
    fflush(stderr);
    dup2(saved, 2);
    close(fd), close(saved);
    size_t len = 0;
    char *text = test_read_file(tmp, &len);
    snprintf(buf, cap, "%s", text ? text : "");
    free(text);
    return st;
}

static kiln_status open_strict(const char *path, kiln_model **m) {
    return kiln_model_open_ex(path, &(kiln_model_options){.strict = true}, m);
}

TEST(archs_unused_tensor_warns_and_strict_open_refuses) {
    static const float ones[64] = {1};
    const tensor_edit extra = {"blk.0.attn_extra.weight", KILN_TYPE_F32, {64, 1, 1, 1}, ones};
    const char *p = variant("extra", NULL, 0, &extra);
    kiln_model *m = (kiln_model *)1;
    char err[4096];
    CHECK_EQ_INT(with_stderr(err, sizeof err, open_strict, p, &m), KILN_ERR_UNSUPPORTED);
    CHECK(m == NULL);
    CHECKF(strstr(kiln_last_error(), "'blk.0.attn_extra.weight'") != NULL, "%s", kiln_last_error());
    CHECK_EQ_INT(with_stderr(err, sizeof err, kiln_model_open, p, &m), KILN_OK);
    CHECKF(strstr(err, "warning") && strstr(err, "'blk.0.attn_extra.weight'"), "stderr: %s", err);
    kiln_model_close(m);
    /* the CLI: `kiln run --strict` refuses it, naming the tensor; without --strict it runs */
    char cmd[1200], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run -m %s -n 1 --temp 0 --strict 2>&1", test_kiln_bin(), p);
    CHECK(test_run_cmd(cmd, &out) != 0);
    CHECKF(out && strstr(out, "'blk.0.attn_extra.weight'"), "kiln run --strict said: %s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run -m %s -n 1 --temp 0 2>&1", test_kiln_bin(), p);
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    free(out);
    /* the file as made, with every tensor used (rope_freqs.weight included): no warning, strict opens it */
    CHECK_EQ_INT(with_stderr(err, sizeof err, open_strict, test_shared(ROPE_FREQS_MODEL), &m), KILN_OK);
    CHECKF(!strstr(err, "not used"), "stderr: %s", err);
    kiln_model_close(m);
}

/* Every RoPE scaling kiln does not implement is refused at open, naming the key. */
TEST(archs_rope_scaling_not_implemented_is_refused_naming_the_key) {
    static const struct { kv_edit e; const char *key; } cases[] = {
        {{"llama.rope.scaling.type", "yarn", 0}, "llama.rope.scaling.type"},
        {{"llama.rope.scaling.type", "longrope", 0}, "llama.rope.scaling.type"},
        {{"llama.rope.scaling.yarn_beta_fast", NULL, 32.0f}, "llama.rope.scaling.yarn_beta_fast"},
        {{"llama.rope.scaling.attn_factor", NULL, 1.2f}, "llama.rope.scaling.attn_factor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_model *m = (kiln_model *)1;
        CHECK_EQ_INT(kiln_model_open(variant("scaling", &cases[i].e, 1, NULL), &m), KILN_ERR_UNSUPPORTED);
        CHECKF(strstr(kiln_last_error(), cases[i].key) != NULL, "case %zu: %s", i, kiln_last_error());
        CHECK(m == NULL);
        if (m && m != (kiln_model *)1) kiln_model_close(m);
    }
    /* keys that do not change the math without YaRN are accepted */
    const kv_edit ok[] = {{"llama.rope.scaling.type", "linear", 0}, {"llama.rope.scaling.attn_factor", NULL, 1.0f}};
    kiln_model *m;
    CHECK_OK(kiln_model_open(variant("scaling_ok", ok, 2, NULL), &m));
    kiln_model_close(m);
}

/* ---- an independent forward pass (double precision, llama layout, adjacent-pair RoPE) */

static double half_to_double(uint16_t h) {
    const int e = (h >> 10) & 31, mant = h & 1023;
    const double v = e == 0 ? ldexp(mant, -24) : ldexp(1024 + mant, e - 25);
    return h & 0x8000 ? -v : v;
}

/* Row r of a 2-D F16/F32 tensor as doubles. */
static void row_of(const gguf_tensor *t, uint64_t r, double *out) {
    for (uint64_t i = 0; i < t->ne[0]; i++)
        out[i] = t->type == KILN_TYPE_F32 ? ((const float *)t->data)[r * t->ne[0] + i]
                                          : half_to_double(((const uint16_t *)t->data)[r * t->ne[0] + i]);
}

/* y (rows of t) = t x */
static void matvec(const gguf_tensor *t, const double *x, double *y, double *row) {
    for (uint64_t r = 0; r < t->ne[1]; r++) {
        row_of(t, r, row);
        double acc = 0;
        for (uint64_t i = 0; i < t->ne[0]; i++) acc += row[i] * x[i];
        y[r] = acc;
    }
}

static const gguf_tensor *tensor(const gguf_file *f, const char *fmt, int il) {
    char n[64];
    snprintf(n, sizeof n, fmt, il);
    const gguf_tensor *t = gguf_find_tensor(f, n);
    if (!t) test_failf(__FILE__, __LINE__, "reference forward: no tensor %s", n);
    return t;
}

static void rmsnorm_d(const double *x, const gguf_tensor *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * ((const float *)w->data)[i];
}

/* Rotates adjacent pairs of one head: theta_i = scale * p * base^(-2i/n_rot) / ff[i]. */
static void rope_d(double *x, int p, int n_rot, double base, double scale, const float *ff) {
    for (int i = 0; i < n_rot / 2; i++) {
        const double th = scale * p * pow(base, -2.0 * i / n_rot) / (ff ? ff[i] : 1.0);
        const double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * cos(th) - b * sin(th);
        x[2 * i + 1] = a * sin(th) + b * cos(th);
    }
}

/* The logits of the last of ids[0..n) (positions 0..n-1) of the llama file f with RoPE positions scaled
 * by `scale`; the hyperparameters are the tiny model's (n_rot = head_dim, rms eps 1e-6). */
static bool ref_forward(const gguf_file *f, const int32_t *ids, int n, double scale, float *logits) {
    enum { E = 64, NH = 4, NKV = 2, HD = 16, L = 4, T = 32, FF = 192 };
    if (n > T) return false;
    float base;
    if (gguf_get_f32(f, "llama.rope.freq_base", &base) != KILN_OK) return false;
    const gguf_tensor *rf = gguf_find_tensor(f, "rope_freqs.weight");
    const float *ff = rf ? rf->data : NULL;
    static double x[T][E], k[T][NKV * HD], v[T][NKV * HD];
    double xb[E], q[NH * HD], att[NH * HD], o[E], g[FF], u[FF], row[FF > E ? FF : E], sc[T];
    for (int t = 0; t < n; t++) row_of(gguf_find_tensor(f, "token_embd.weight"), (uint64_t)ids[t], x[t]);
    for (int il = 0; il < L; il++) {
        for (int t = 0; t < n; t++) {   /* causal: position t sees keys 0..t, computed in order */
            rmsnorm_d(x[t], tensor(f, "blk.%d.attn_norm.weight", il), E, 1e-6, xb);
            matvec(tensor(f, "blk.%d.attn_q.weight", il), xb, q, row);
            matvec(tensor(f, "blk.%d.attn_k.weight", il), xb, k[t], row);
            matvec(tensor(f, "blk.%d.attn_v.weight", il), xb, v[t], row);
            for (int h = 0; h < NH; h++) rope_d(q + h * HD, t, HD, base, scale, ff);
            for (int h = 0; h < NKV; h++) rope_d(k[t] + h * HD, t, HD, base, scale, ff);
            for (int h = 0; h < NH; h++) {
                const int kh = h / (NH / NKV);
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    sc[j] = 0;
                    for (int c = 0; c < HD; c++) sc[j] += q[h * HD + c] * k[j][kh * HD + c];
                    sc[j] /= sqrt((double)HD);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j <= t; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int c = 0; c < HD; c++) {
                    att[h * HD + c] = 0;
                    for (int j = 0; j <= t; j++) att[h * HD + c] += sc[j] / sum * v[j][kh * HD + c];
                }
            }
            matvec(tensor(f, "blk.%d.attn_output.weight", il), att, o, row);
            for (int e = 0; e < E; e++) x[t][e] += o[e];   /* later positions of this layer read only k, v */
            rmsnorm_d(x[t], tensor(f, "blk.%d.ffn_norm.weight", il), E, 1e-6, xb);
            matvec(tensor(f, "blk.%d.ffn_gate.weight", il), xb, g, row);
            matvec(tensor(f, "blk.%d.ffn_up.weight", il), xb, u, row);
            for (int i = 0; i < FF; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            matvec(tensor(f, "blk.%d.ffn_down.weight", il), g, o, row);
            for (int e = 0; e < E; e++) x[t][e] += o[e];
        }
    }
    rmsnorm_d(x[n - 1], gguf_find_tensor(f, "output_norm.weight"), E, 1e-6, xb);
    const gguf_tensor *out = gguf_find_tensor(f, "output.weight");
    for (uint64_t r = 0; r < out->ne[1]; r++) {
        row_of(out, r, row);
        double acc = 0;
        for (int i = 0; i < E; i++) acc += row[i] * xb[i];
        logits[r] = (float)acc;
    }
    return true;
}

/* kiln's logits after prefilling ids (n) on the CPU from the file at path. */
static bool kiln_logits(const char *path, const int32_t *ids, int n, float *out, int V) {
    kiln_model *m = NULL;
    kiln_session *s = NULL;
    const float *lg;
    kiln_status st = kiln_model_open(path, &m);
    if (st == KILN_OK) st = kiln_session_open(m, &(kiln_session_options){.n_ctx = 64, .n_threads = 2, .device = KILN_DEVICE_CPU}, &s);
    if (st == KILN_OK) st = kiln_prefill(s, ids, (size_t)n, &lg);
    if (st == KILN_OK) memcpy(out, lg, sizeof(float) * (size_t)V);
    else test_failf(__FILE__, __LINE__, "%s: %s", path, kiln_last_error());
    kiln_session_close(s);
    kiln_model_close(m);
    return st == KILN_OK;
}

/* Linear RoPE scaling (factor 4): kiln's logits follow the independent forward pass with positions / 4,
 * which itself reproduces llama.cpp's logits unscaled; the old key rope.scale_linear means the same; type
 * none ignores the factor (as llama.cpp does); and the scaling visibly changes the logits. */
TEST(archs_linear_rope_scaling_matches_independent_forward) {
    arch_ref r;
    if (!load_ref("tiny-llama-rope-freqs", &r)) return;
    const int V = r.n_vocab;
    int32_t ids[32];
    int n = 0;
    for (size_t i = 0; i < r.n_prompt; i++) ids[n++] = r.prompt[i];
    for (size_t i = 0; i + 1 < r.n_gen && n < 20; i++) ids[n++] = r.gen[i];
    float *ref = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V), *plain = malloc(sizeof(float) * V);
    gguf_file *f;
    REQUIRE_OK(gguf_open(test_shared(ROPE_FREQS_MODEL), &f));
    /* the independent pass, unscaled, against llama.cpp at step n - n_prompt (the last of the ids) */
    REQUIRE(ref_forward(f, ids, n, 1.0, ref));
    const double c_ref = test_cosine(ref, r.logits + (size_t)(n - (int)r.n_prompt) * V, V);
    CHECKF(c_ref >= 0.9999, "independent forward vs llama.cpp: cosine %.6f", c_ref);
    REQUIRE(kiln_logits(test_shared(ROPE_FREQS_MODEL), ids, n, plain, V));

    REQUIRE(ref_forward(f, ids, n, 0.25, ref));
    const kv_edit lin[] = {{"llama.rope.scaling.type", "linear", 0}, {"llama.rope.scaling.factor", NULL, 4.0f}};
    REQUIRE(kiln_logits(variant("linear4", lin, 2, NULL), ids, n, got, V));
    const double c_lin = test_cosine(got, ref, V), c_change = test_cosine(ref, plain, V);
    printf("  linear x4: kiln vs independent cosine %.7f; independent vs llama.cpp (unscaled) %.7f; scaled vs unscaled %.4f\n",
           c_lin, c_ref, c_change);
    CHECKF(c_lin >= 0.9999, "linear scaling: kiln vs independent forward cosine %.6f", c_lin);
    CHECKF(c_change < 0.99, "scaling by 4 changed the logits too little (cosine %.6f to unscaled)", c_change);
    /* the older key, with no type (absent type = linear) */
    const kv_edit old[] = {{"llama.rope.scale_linear", NULL, 4.0f}};
    REQUIRE(kiln_logits(variant("scale_linear4", old, 1, NULL), ids, n, plain, V));
    CHECKF(!memcmp(plain, got, sizeof(float) * V), "rope.scale_linear 4 differs from rope.scaling.factor 4");
    /* type none: the factor is not applied */
    const kv_edit none[] = {{"llama.rope.scaling.type", "none", 0}, {"llama.rope.scaling.factor", NULL, 4.0f}};
    REQUIRE(kiln_logits(variant("none4", none, 2, NULL), ids, n, got, V));
    REQUIRE(kiln_logits(test_shared(ROPE_FREQS_MODEL), ids, n, plain, V));
    CHECKF(!memcmp(plain, got, sizeof(float) * V), "scaling type none with a factor changed the logits");
    gguf_close(f);
    free(ref), free(got), free(plain), free(r.logits);
}

/* rope_freqs.weight must be F32 of n_rot/2 (8) finite values > 0: otherwise the open fails naming it. */
TEST(archs_bad_rope_freqs_is_refused_naming_the_tensor) {
    static const float f32[64] = {1, 2, 3, 4, 5, 6, 7, 8}, zero[8] = {1, 2, 0, 4, 5, 6, 7, 8};
    static const uint16_t f16[8] = {0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00};
    static const struct { tensor_edit te; kiln_status st; const char *what; } cases[] = {
        {{"rope_freqs.weight", KILN_TYPE_F32, {64, 1, 1, 1}, f32}, KILN_ERR_FORMAT, "expected [8]"},
        {{"rope_freqs.weight", KILN_TYPE_F16, {8, 1, 1, 1}, f16}, KILN_ERR_UNSUPPORTED, "f32"},
        {{"rope_freqs.weight", KILN_TYPE_F32, {8, 1, 1, 1}, zero}, KILN_ERR_FORMAT, "element 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kiln_model *m = (kiln_model *)1;
        CHECK_EQ_INT(kiln_model_open(variant("bad_freqs", NULL, 0, &cases[i].te), &m), cases[i].st);
        CHECKF(strstr(kiln_last_error(), "'rope_freqs.weight'") && strstr(kiln_last_error(), cases[i].what), "case %zu: %s",
               i, kiln_last_error());
        CHECK(m == NULL);
        if (m && m != (kiln_model *)1) kiln_model_close(m);
    }
}
