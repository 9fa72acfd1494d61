/*
 * test_quantize.c — `kiln quantize`: TinyStories-656K F32 requantized to every legacy type and F16/BF16
 * must equal the files llama-quantize made (../shared/models/tinystories-656K/quants/, tensor by tensor and
 * byte for byte), the K-quant mixes follow llama-quantize's per-tensor rules on a synthetic 8-layer model,
 * fallbacks and requantizing are reported, the input is never overwritten, and the CLI validates options.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/formats.h"
#include "gguf/gguf.h"
#include "test.h"
#include "tools/quantize.h"

#define TS_DIR "models/tinystories-656K/quants/"

static char *path_in(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Every tensor of a equals the same-named tensor of b (type, shape, bytes); returns the number compared. */
static int compare_tensors(const char *path_a, const char *path_b) {
    gguf_file *a = NULL, *b = NULL;
    if (gguf_open(path_a, &a) || gguf_open(path_b, &b)) {
        test_failf(__FILE__, __LINE__, "cannot open %s / %s: %s", path_a, path_b, kiln_last_error());
        gguf_close(a);
        return 0;
    }
    CHECK_EQ_INT(gguf_n_tensors(a), gguf_n_tensors(b));
    int n = 0;
    for (size_t i = 0; i < gguf_n_tensors(b); i++) {
        const gguf_tensor *tb = gguf_tensor_at(b, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)tb->name.len, tb->name.ptr);
        const gguf_tensor *ta = gguf_find_tensor(a, name);
        if (!ta) {
            test_failf(__FILE__, __LINE__, "%s: tensor %s missing", path_a, name);
            continue;
        }
        CHECKF(ta->type == tb->type, "%s: type %s, reference %s", name, kiln_type_get(ta->type)->name,
               kiln_type_get(tb->type)->name);
        CHECKF(!memcmp(ta->ne, tb->ne, sizeof ta->ne), "%s: shape differs", name);
        CHECKF(ta->nbytes == tb->nbytes && !memcmp(ta->data, tb->data, tb->nbytes), "%s: bytes differ from %s", name,
               path_b);
        n++;
    }
    gguf_close(a);
    gguf_close(b);
    return n;
}

static kiln_status run_quantize(const char *in, const char *out, const char *type, int threads,
                                kiln_quantize_report *rep) {
    const kiln_quant_target *t = kiln_quant_find_target(type);
    if (!t) return KILN_ERR_INVALID_ARG;
    kiln_quantize_options o = {.in_path = in, .out_path = out, .target = t, .n_threads = threads};
    return kiln_quantize_file(&o, rep);
}

TEST(quantize_tinystories_matches_llama_quantize) {
    static const char *types[] = {"F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0"};
    const char *src = test_shared(TS_DIR "TinyStories-656K-F32.gguf");
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        char name[64], ref_rel[128];
        snprintf(name, sizeof name, "ts-%s.gguf", types[k]);
        snprintf(ref_rel, sizeof ref_rel, TS_DIR "TinyStories-656K-%s.gguf", types[k]);
        char *out = path_in(test_tmpdir(), name);
        kiln_quantize_report rep;
        /* 2 threads: the split over rows must not change a byte */
        CHECK_OK(run_quantize(src, out, types[k], 2, &rep));
        const char *ref = test_shared(ref_rel);
        CHECKF(compare_tensors(out, ref) == 20, "%s: not every tensor compared", types[k]);
        /* llama-quantize falls back from Q6_K to Q8_0 for the tied 128-wide embedding of the legacy types */
        const bool legacy = types[k][0] == 'Q' && strcmp(types[k], "Q8_0");
        CHECKF(rep.n_fallback == (legacy ? 1 : 0), "%s: %d fallbacks", types[k], rep.n_fallback);
        CHECK_EQ_INT(rep.n_tensors, 20);
        CHECK_EQ_INT(rep.n_copied, 5);
        /* the whole file too: same metadata order, same tensor order, same padding */
        size_t na, nb;
        char *a = test_read_file(out, &na), *b = test_read_file(ref, &nb);
        CHECKF(a && b && na == nb && !memcmp(a, b, na), "%s: file differs from %s", types[k], ref);
        free(a);
        free(b);
        free(out);
    }
}

/* ---- the K-quant mixes on a synthetic 8-layer llama ---- */

#define SYN_LAYERS 8
#define SYN_EMBD 256
#define SYN_FF 256
#define SYN_ROWS 32 /* rows of every matrix: the rules only look at names and row lengths */
#define SYN_VOCAB 64

static void fill(float *x, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) x[i] = 0.05f * test_rand_normal(rng);
}

/* Writes a small llama GGUF (F32) with or without output.weight. */
static bool write_synthetic(const char *path, bool with_output) {
    gguf_writer *w = NULL;
    if (gguf_writer_open(&w)) return false;
    gguf_set_str(w, "general.architecture", "llama", 5);
    gguf_set_u32(w, "llama.block_count", SYN_LAYERS);
    gguf_set_u32(w, "llama.embedding_length", SYN_EMBD);
    gguf_set_u32(w, "llama.attention.head_count", 8);
    gguf_set_u32(w, "llama.attention.head_count_kv", 2);
    gguf_set_u32(w, "general.file_type", 0);
    uint64_t rng = 7;
    float *bufs[128];
    int nb = 0;
#define ADD(name_, d0, d1)                                                         \
    do {                                                                           \
        uint64_t ne_[2] = {(d0), (d1)};                                            \
        float *b_ = malloc(sizeof(float) * (d0) * (d1));                           \
        fill(b_, (size_t)(d0) * (d1), &rng);                                       \
        bufs[nb++] = b_;                                                           \
        gguf_add_tensor(w, (name_), KILN_TYPE_F32, (d1) > 1 ? 2 : 1, ne_, b_);     \
    } while (0)
    ADD("token_embd.weight", SYN_EMBD, SYN_VOCAB);
    for (int l = 0; l < SYN_LAYERS; l++) {
        char n[64];
        static const char *sq[] = {"attn_q", "attn_k", "attn_v", "attn_output"};
        for (int k = 0; k < 4; k++) {
            snprintf(n, sizeof n, "blk.%d.%s.weight", l, sq[k]);
            ADD(n, SYN_EMBD, SYN_ROWS);
        }
        snprintf(n, sizeof n, "blk.%d.attn_norm.weight", l);
        ADD(n, SYN_EMBD, 1);
        snprintf(n, sizeof n, "blk.%d.ffn_gate.weight", l);
        ADD(n, SYN_EMBD, SYN_ROWS);
        snprintf(n, sizeof n, "blk.%d.ffn_up.weight", l);
        ADD(n, SYN_EMBD, SYN_ROWS);
        snprintf(n, sizeof n, "blk.%d.ffn_down.weight", l);
        ADD(n, SYN_FF, SYN_ROWS);
    }
    ADD("output_norm.weight", SYN_EMBD, 1);
    if (with_output) ADD("output.weight", SYN_EMBD, SYN_VOCAB);
#undef ADD
    kiln_status st = gguf_writer_write(w, path, NULL, NULL);
    gguf_writer_close(w);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    return st == KILN_OK;
}

static uint32_t type_of(gguf_file *f, const char *name) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    return t ? t->type : 9999;
}

/* llama-quantize's use_more_bits pattern for 8 layers: layers 0, 3, 6, 7. */
static bool more_bits(int l) { return l < 1 || l >= 7 || (l - 1) % 3 == 2; }

TEST(quantize_k_mixes_follow_llama_quantize_rules) {
    char *in = path_in(test_tmpdir(), "syn.gguf"), *in_tied = path_in(test_tmpdir(), "syn-tied.gguf");
    REQUIRE(write_synthetic(in, true) && write_synthetic(in_tied, false));
    static const char *targets[] = {"Q4_K_M", "Q4_K_S", "Q5_K_M", "Q3_K_M", "Q3_K_L", "Q2_K", "Q6_K", "Q5_K_S", "Q3_K_S"};
    gguf_file *src = NULL;
    REQUIRE_OK(gguf_open(in, &src));
    for (size_t k = 0; k < sizeof targets / sizeof targets[0]; k++) {
        const char *tg = targets[k];
        char *out = path_in(test_tmpdir(), "syn-out.gguf");
        kiln_quantize_report rep;
        REQUIRE_OK(run_quantize(in, out, tg, 2, &rep));
        CHECK_EQ_INT(rep.n_fallback, 0);
        gguf_file *f = NULL;
        REQUIRE_OK(gguf_open(out, &f));
        uint32_t ft = 0;
        CHECK_OK(gguf_get_u32(f, "general.file_type", &ft));
        CHECK_EQ_INT(ft, kiln_quant_find_target(tg)->ftype);
        const kiln_type base = kiln_quant_find_target(tg)->default_type;
        CHECKF(type_of(f, "output.weight") == KILN_TYPE_Q6_K, "%s: output.weight", tg);
        CHECKF(type_of(f, "token_embd.weight") == base, "%s: token_embd.weight", tg);
        CHECKF(type_of(f, "output_norm.weight") == KILN_TYPE_F32, "%s: norm", tg);
        for (int l = 0; l < SYN_LAYERS; l++) {
            char n[64];
            kiln_type v = base, down = base, o = base;
            if (!strcmp(tg, "Q4_K_M") || !strcmp(tg, "Q5_K_M")) {
                if (more_bits(l)) v = down = KILN_TYPE_Q6_K;
            } else if (!strcmp(tg, "Q4_K_S")) {
                if (l < 4) v = KILN_TYPE_Q5_K;
                if (l < 1) down = KILN_TYPE_Q5_K;
            } else if (!strcmp(tg, "Q3_K_M")) {
                v = l < 2 ? KILN_TYPE_Q5_K : KILN_TYPE_Q4_K;
                down = KILN_TYPE_Q4_K;
                o = KILN_TYPE_Q4_K;
            } else if (!strcmp(tg, "Q3_K_L")) {
                v = down = o = KILN_TYPE_Q5_K;
            } else if (!strcmp(tg, "Q2_K")) {
                v = KILN_TYPE_Q4_K; /* n_gqa = 8 / 2 >= 4 */
                down = o = KILN_TYPE_Q3_K;
            }
            snprintf(n, sizeof n, "blk.%d.attn_v.weight", l);
            CHECKF(type_of(f, n) == v, "%s: %s is %s, expected %s", tg, n, kiln_type_get(type_of(f, n))->name,
                   kiln_type_get(v)->name);
            snprintf(n, sizeof n, "blk.%d.ffn_down.weight", l);
            CHECKF(type_of(f, n) == down, "%s: %s is %s, expected %s", tg, n, kiln_type_get(type_of(f, n))->name,
                   kiln_type_get(down)->name);
            snprintf(n, sizeof n, "blk.%d.attn_output.weight", l);
            CHECKF(type_of(f, n) == o, "%s: %s", tg, n);
            snprintf(n, sizeof n, "blk.%d.attn_q.weight", l);
            CHECKF(type_of(f, n) == base, "%s: %s", tg, n);
            snprintf(n, sizeof n, "blk.%d.attn_norm.weight", l);
            CHECKF(type_of(f, n) == KILN_TYPE_F32, "%s: %s", tg, n);
        }
        /* every converted tensor holds exactly the reference quantizer's bytes of the source */
        for (size_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            char n[96];
            snprintf(n, sizeof n, "%.*s", (int)t->name.len, t->name.ptr);
            const gguf_tensor *s = gguf_find_tensor(src, n);
            REQUIRE(s);
            uint8_t *q = malloc(t->nbytes);
            kiln_type_get(t->type)->from_float(s->data, q, (int64_t)(s->ne[0] * s->ne[1]));
            CHECKF(!memcmp(q, t->data, t->nbytes), "%s: %s is not the reference quantization", tg, n);
            free(q);
        }
        gguf_close(f);
        free(out);
    }
    /* tied embedding: token_embd doubles as the output and becomes Q6_K */
    char *out = path_in(test_tmpdir(), "syn-tied-out.gguf");
    REQUIRE_OK(run_quantize(in_tied, out, "Q4_K_M", 1, NULL));
    gguf_file *f = NULL;
    REQUIRE_OK(gguf_open(out, &f));
    CHECK(type_of(f, "token_embd.weight") == KILN_TYPE_Q6_K);
    gguf_close(f);
    gguf_close(src);
    free(out);
    free(in);
    free(in_tied);
}

TEST(quantize_pure_and_type_overrides) {
    char *in = path_in(test_tmpdir(), "syn.gguf"), *in_tied = path_in(test_tmpdir(), "syn-tied.gguf");
    char *out = path_in(test_tmpdir(), "syn-pure.gguf");
    REQUIRE(write_synthetic(in, true) && write_synthetic(in_tied, false));
    /* --pure: every matrix gets the target type, even where the mix would raise it */
    kiln_quantize_options o = {.in_path = in, .out_path = out, .target = kiln_quant_find_target("Q4_K_M"), .n_threads = 2, .pure = true};
    REQUIRE_OK(kiln_quantize_file(&o, NULL));
    gguf_file *f = NULL;
    REQUIRE_OK(gguf_open(out, &f));
    CHECK(type_of(f, "output.weight") == KILN_TYPE_Q4_K);
    CHECK(type_of(f, "blk.0.attn_v.weight") == KILN_TYPE_Q4_K);  /* Q6_K in the mix */
    CHECK(type_of(f, "blk.7.ffn_down.weight") == KILN_TYPE_Q4_K);
    CHECK(type_of(f, "blk.7.attn_norm.weight") == KILN_TYPE_F32);
    gguf_close(f);
    /* explicit output and embedding types */
    kiln_quantize_options o2 = {.in_path = in, .out_path = out, .target = kiln_quant_find_target("Q4_0"), .n_threads = 1, .set_output_type = true,
                                .output_type = KILN_TYPE_Q8_0, .set_embd_type = true, .embd_type = KILN_TYPE_Q5_K};
    REQUIRE_OK(kiln_quantize_file(&o2, NULL));
    REQUIRE_OK(gguf_open(out, &f));
    CHECK(type_of(f, "output.weight") == KILN_TYPE_Q8_0);
    CHECK(type_of(f, "token_embd.weight") == KILN_TYPE_Q5_K);
    CHECK(type_of(f, "blk.3.attn_q.weight") == KILN_TYPE_Q4_0);
    gguf_close(f);
    /* tied: the output type applies to the embedding that doubles as the output */
    kiln_quantize_options o3 = {.in_path = in_tied, .out_path = out, .target = kiln_quant_find_target("Q4_0"), .n_threads = 1, .set_output_type = true,
                                .output_type = KILN_TYPE_F16};
    REQUIRE_OK(kiln_quantize_file(&o3, NULL));
    REQUIRE_OK(gguf_open(out, &f));
    CHECK(type_of(f, "token_embd.weight") == KILN_TYPE_F16);
    gguf_close(f);
    free(in); free(in_tied); free(out);
}

TEST(quantize_k_types_fall_back_on_short_rows) {
    /* TinyStories rows are 128 and 384 values: no K block fits, every matrix falls back */
    const char *src = test_shared(TS_DIR "TinyStories-656K-F32.gguf");
    char *out = path_in(test_tmpdir(), "ts-q4k.gguf");
    kiln_quantize_report rep;
    REQUIRE_OK(run_quantize(src, out, "Q4_K_M", 2, &rep));
    /* the embedding goes straight to Q8_0 (its rows do not fit the Q4_K block), the 14 others fall back */
    CHECK_EQ_INT(rep.n_fallback, 14);
    gguf_file *f = NULL;
    REQUIRE_OK(gguf_open(out, &f));
    CHECK(type_of(f, "token_embd.weight") == KILN_TYPE_Q8_0);
    CHECK(type_of(f, "blk.0.attn_q.weight") == KILN_TYPE_Q5_0);    /* Q4_K -> Q5_0 */
    CHECK(type_of(f, "blk.0.ffn_down.weight") == KILN_TYPE_Q5_0);
    CHECK(type_of(f, "blk.1.ffn_down.weight") == KILN_TYPE_Q8_0);  /* use_more_bits(1, 2): Q6_K -> Q8_0 */
    CHECK(type_of(f, "blk.0.attn_v.weight") == KILN_TYPE_Q5_0);
    CHECK(type_of(f, "blk.1.attn_v.weight") == KILN_TYPE_Q8_0);
    CHECK(type_of(f, "blk.1.attn_norm.weight") == KILN_TYPE_F32);
    gguf_close(f);
    free(out);
}

TEST(quantize_requantizes_with_report) {
    /* Q8_0 input -> Q4_0: allowed, counted; the result decodes close to the F32 original */
    const char *src = test_shared(TS_DIR "TinyStories-656K-Q8_0.gguf");
    const char *orig = test_shared(TS_DIR "TinyStories-656K-F32.gguf");
    char *out = path_in(test_tmpdir(), "requant.gguf");
    kiln_quantize_report rep;
    REQUIRE_OK(run_quantize(src, out, "Q4_0", 1, &rep));
    CHECK_EQ_INT(rep.n_requantized, 14); /* token_embd stays Q8_0 (its fallback type): copied */
    gguf_file *f = NULL, *o = NULL;
    REQUIRE_OK(gguf_open(out, &f));
    REQUIRE_OK(gguf_open(orig, &o));
    const gguf_tensor *t = gguf_find_tensor(f, "blk.1.ffn_up.weight"), *r = gguf_find_tensor(o, "blk.1.ffn_up.weight");
    REQUIRE(t && r && t->type == KILN_TYPE_Q4_0);
    const int64_t n = (int64_t)(r->ne[0] * r->ne[1]);
    float *d = malloc(sizeof(float) * (size_t)n);
    kiln_type_get(t->type)->to_float(t->data, d, n);
    double err = 0, energy = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = ((const float *)r->data)[i];
        err += (d[i] - x) * (d[i] - x);
        energy += x * x;
    }
    CHECKF(err < 0.02 * energy, "relative squared error %.4f", err / energy);
    free(d);
    gguf_close(f);
    gguf_close(o);
    free(out);
}

TEST(quantize_accepts_f16_and_bf16_input) {
    /* half-precision inputs are widened to F32 and quantized: every converted tensor equals the reference
     * quantizer applied to the widened rows; 1-D tensors stay as they were */
    static const struct { const char *file, *target; } cases[] = {
        {TS_DIR "TinyStories-656K-F16.gguf", "Q8_0"}, {TS_DIR "TinyStories-656K-BF16.gguf", "Q4_1"}};
    for (size_t k = 0; k < 2; k++) {
        const char *in = test_shared(cases[k].file);
        char *out = path_in(test_tmpdir(), "half-in.gguf");
        kiln_quantize_report rep;
        REQUIRE_OK(run_quantize(in, out, cases[k].target, 2, &rep));
        CHECK_EQ_INT(rep.n_requantized, 0);
        gguf_file *a = NULL, *b = NULL;
        REQUIRE_OK(gguf_open(in, &a));
        REQUIRE_OK(gguf_open(out, &b));
        int converted = 0;
        for (size_t i = 0; i < gguf_n_tensors(b); i++) {
            const gguf_tensor *t = gguf_tensor_at(b, i);
            char n[96];
            snprintf(n, sizeof n, "%.*s", (int)t->name.len, t->name.ptr);
            const gguf_tensor *s = gguf_find_tensor(a, n);
            REQUIRE(s);
            if (t->type == s->type) {
                CHECKF(t->nbytes == s->nbytes && !memcmp(t->data, s->data, t->nbytes), "%s: copied bytes differ", n);
                continue;
            }
            const int64_t cnt = (int64_t)(s->ne[0] * s->ne[1]);
            float *f = malloc(sizeof(float) * (size_t)cnt);
            uint8_t *q = malloc(t->nbytes);
            kiln_type_get(s->type)->to_float(s->data, f, cnt);
            kiln_type_get(t->type)->from_float(f, q, cnt);
            CHECKF(!memcmp(q, t->data, t->nbytes), "%s (%s -> %s): bytes differ", n, kiln_type_get(s->type)->name,
                   kiln_type_get(t->type)->name);
            converted++;
            free(f);
            free(q);
        }
        CHECK_EQ_INT(converted, 15);
        gguf_close(a);
        gguf_close(b);
        free(out);
    }
}

TEST(quantize_refuses_to_overwrite_input) {
    /* a copy of the input, reached by its own name and through a symlink */
    char *in = path_in(test_tmpdir(), "in.gguf"), *link_path = path_in(test_tmpdir(), "link.gguf");
    size_t len;
    char *bytes = test_read_file(test_shared(TS_DIR "TinyStories-656K-F32.gguf"), &len);
    REQUIRE(bytes);
    FILE *fp = fopen(in, "wb");
    REQUIRE(fp && fwrite(bytes, 1, len, fp) == len);
    fclose(fp);
    REQUIRE(symlink(in, link_path) == 0);
    kiln_status st = run_quantize(in, in, "Q4_0", 1, NULL);
    CHECK(st == KILN_ERR_INVALID_ARG && strstr(kiln_last_error(), "refusing"));
    st = run_quantize(in, link_path, "Q4_0", 1, NULL);
    CHECK(st == KILN_ERR_INVALID_ARG);
    size_t len2;
    char *after = test_read_file(in, &len2);
    CHECK(after && len2 == len && !memcmp(after, bytes, len));
    /* a failed write leaves nothing behind */
    char *bad = path_in(test_tmpdir(), "no/such/dir/out.gguf");
    CHECK(run_quantize(in, bad, "Q4_0", 1, NULL) == KILN_ERR_IO);
    struct stat sb;
    CHECK(stat(bad, &sb) != 0);
    free(after); free(bytes); free(in); free(link_path); free(bad);
}

TEST(quantize_rejects_non_finite_input) {
    /* the F32 TinyStories file with one weight set to NaN: the run fails naming the tensor and the row, and
     * leaves neither OUT nor OUT.tmp behind */
    size_t len;
    char *bytes = test_read_file(test_shared(TS_DIR "TinyStories-656K-F32.gguf"), &len);
    REQUIRE(bytes);
    gguf_file *f = NULL;
    REQUIRE_OK(gguf_open_memory(bytes, len, "ts", &f));
    const gguf_tensor *t = gguf_find_tensor(f, "blk.1.ffn_up.weight");
    REQUIRE(t && t->type == KILN_TYPE_F32);
    const size_t off = (size_t)((const uint8_t *)t->data - (const uint8_t *)bytes) + sizeof(float) * (5 * 128 + 7);
    gguf_close(f);
    const float nan_value = NAN;
    memcpy(bytes + off, &nan_value, sizeof nan_value);
    char *in = path_in(test_tmpdir(), "nan.gguf"), *out = path_in(test_tmpdir(), "nan-q4_0.gguf");
    FILE *fp = fopen(in, "wb");
    REQUIRE(fp && fwrite(bytes, 1, len, fp) == len);
    fclose(fp);
    kiln_status st = run_quantize(in, out, "Q4_0", 2, NULL);
    CHECK_EQ_INT(st, KILN_ERR_FORMAT);
    const char *msg = kiln_last_error();
    CHECKF(strstr(msg, "blk.1.ffn_up.weight") && strstr(msg, "row 5 column 7") && strstr(msg, "not a finite"), "message: %s", msg);
    struct stat sb;
    CHECK(stat(out, &sb) != 0);
    char *tmp = malloc(strlen(out) + 5);
    sprintf(tmp, "%s.tmp", out);
    CHECK(stat(tmp, &sb) != 0);
    free(tmp); free(in); free(out); free(bytes);
}

TEST(quantize_cli) {
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s quantize --help", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECK(out && strstr(out, "usage: kiln quantize"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s quantize a.gguf b.gguf Q9_9 2>&1", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 2);
    CHECK(out && strstr(out, "Q9_9"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s quantize --threads x a.gguf b.gguf Q4_0 2>&1", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 2);
    CHECK(out && strstr(out, "--threads"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s quantize --output-type iq2_xxs a.gguf b.gguf Q4_0 2>&1", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 2);
    CHECK(out && strstr(out, "--output-type"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s quantize a.gguf b.gguf 2>&1", test_kiln_bin());
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 2);
    free(out);
    char *dst = path_in(test_tmpdir(), "cli-q5_1.gguf");
    snprintf(cmd, sizeof cmd, "%s quantize --threads 2 %s %s q5_1 2>&1", test_kiln_bin(),
             test_shared(TS_DIR "TinyStories-656K-F32.gguf"), dst);
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECK(out && strstr(out, "fallback: token_embd.weight") && strstr(out, "summary") && strstr(out, "[  20/  20]"));
    free(out);
    CHECK_EQ_INT(compare_tensors(dst, test_shared(TS_DIR "TinyStories-656K-Q5_1.gguf")), 20);
    free(dst);
}
