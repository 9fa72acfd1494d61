/*
 * tokenize.c — tokenizer benchmark: encoding speed on ~1 MiB of mixed English/code/Unicode text, and the
 * time to load a tokenizer from an open GGUF (the 151669-token Qwen2 vocabulary is the big case).
 *
 * Medians of repeated runs; "cpu" is the thread's CPU time, which excludes time the scheduler gave to other
 * processes (the development machine is shared).
 *
 * The text is built deterministically from files in $KILN_SHARED (nothing large is committed): paragraphs of
 * the markdown documentation (English), the chat templates (Jinja code), the tokenizer configs (JSON) and the
 * 46 llama.cpp tokenizer test strings (emoji, CJK, Khmer, Cyrillic, whitespace runs), shuffled with a fixed
 * seed and concatenated to 1 MiB.
 *   usage: tokenize [VOCAB.gguf ...]   (default: smollm, qwen2, llama-bpe, llama-spm from llama.cpp-vocab)
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/timing.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

#define TEXT_BYTES (1u << 20)
#define ENCODE_RUNS 5
#define LOAD_RUNS 21

typedef struct { char *p; size_t n; } chunk;
static chunk *chunks;
static size_t n_chunks, cap_chunks;

static void add_chunk(const char *p, size_t n) {
    if (!n) return;
    if (n_chunks == cap_chunks) {
        cap_chunks = cap_chunks ? cap_chunks * 2 : 1024;
        chunks = realloc(chunks, cap_chunks * sizeof *chunks);
    }
    chunks[n_chunks].p = malloc(n);
    memcpy(chunks[n_chunks].p, p, n);
    chunks[n_chunks].n = n;
    n_chunks++;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    b[*len] = 0;
    fclose(f);
    return b;
}

/* paragraphs (split on blank lines) of a file become chunks */
static void add_paragraphs(const char *path) {
    size_t len;
    char *b = read_all(path, &len);
    if (!b) return;
    char *p = b;
    for (;;) {
        char *q = strstr(p, "\n\n");
        if (!q) {
            add_chunk(p, strlen(p));
            break;
        }
        add_chunk(p, (size_t)(q - p) + 2);
        p = q + 2;
    }
    free(b);
}

static int collect(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)ftw;
    size_t n = strlen(path);
    if (flag != FTW_F) return 0;
    if ((n > 3 && !strcmp(path + n - 3, ".md")) || (n > 6 && !strcmp(path + n - 6, ".jinja")) ||
        (n > 22 && !strcmp(path + n - 22, "tokenizer_config.json")))
        add_paragraphs(path);
    return 0;
}

static int path_cmp(const void *a, const void *b) {
    const chunk *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

static char *build_text(const char *shared, size_t *len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models", shared);
    nftw(path, collect, 16, FTW_PHYS);
    snprintf(path, sizeof path, "%s/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf.inp", shared);
    size_t n;
    char *inp = read_all(path, &n);
    if (inp) {
        for (char *p = inp;;) {
            char *q = strstr(p, "\n__ggml_vocab_test__\n");
            if (!q) break;
            for (int rep = 0; rep < 48; rep++) add_chunk(p, (size_t)(q - p) + 1);   /* weight the Unicode strings */
            p = q + 21;
        }
        free(inp);
    }
    if (!n_chunks) return NULL;
    qsort(chunks, n_chunks, sizeof *chunks, path_cmp);   /* independent of directory order */
    char *text = malloc(TEXT_BYTES + 65536);
    size_t o = 0;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    while (o < TEXT_BYTES) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const chunk *c = &chunks[(s >> 33) % n_chunks];
        size_t k = c->n < 65536 ? c->n : 65536;
        memcpy(text + o, c->p, k);
        o += k;
    }
    o = TEXT_BYTES;
    while (o > 0 && ((unsigned char)text[o] & 0xC0) == 0x80) o--;   /* end on a character boundary */
    *len = o;
    return text;
}

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}
static uint64_t median(uint64_t *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    return v[n / 2];
}

int main(int argc, char **argv) {
    const char *shared = getenv("KILN_SHARED");
    if (!shared || !*shared) shared = "../shared";
    size_t len;
    char *text = build_text(shared, &len);
    if (!text) {
        fprintf(stderr, "tokenize: no source text under %s/models\n", shared);
        return 1;
    }
    size_t n_ascii = 0;
    for (size_t i = 0; i < len; i++) n_ascii += (unsigned char)text[i] < 0x80;
    printf("text: %zu bytes from %zu chunks (%.1f%% non-ASCII bytes)\n\n", len, n_chunks,
           100.0 * (double)(len - n_ascii) / (double)len);

    static const char *defaults[] = {"smollm", "qwen2", "llama-bpe", "llama-spm"};
    char paths[4][1024];
    const char *files[16];
    int n_files = 0;
    if (argc > 1) {
        for (int i = 1; i < argc && n_files < 16; i++) files[n_files++] = argv[i];
    } else {
        for (int i = 0; i < 4; i++) {
            snprintf(paths[i], sizeof paths[i], "%s/models/llama.cpp-vocab/ggml-vocab-%s.gguf", shared, defaults[i]);
            files[n_files++] = paths[i];
        }
    }
    printf("| vocabulary | tokens | pre | first gguf_open ms | tokenizer load ms, wall (cpu) | encode MB/s, wall (cpu) | "
           "tokens out | bytes/token |\n");
    printf("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
    int status = 0;
    size_t cap = len + 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    for (int k = 0; k < n_files; k++) {
        gguf_file *f;
        uint64_t t0 = kiln_now_ns();
        if (gguf_open(files[k], &f) != KILN_OK) {
            fprintf(stderr, "tokenize: %s\n", kiln_last_error());
            status = 1;
            continue;
        }
        uint64_t open_ns = kiln_now_ns() - t0;
        uint64_t load[LOAD_RUNS], enc[ENCODE_RUNS], load_cpu[LOAD_RUNS], enc_cpu[ENCODE_RUNS];
        kiln_tokenizer *t = NULL;
        for (int r = 0; r < LOAD_RUNS; r++) {
            kiln_tokenizer_close(t);
            t = NULL;
            t0 = kiln_now_ns();
            uint64_t c0 = cpu_ns();
            if (kiln_tokenizer_open(f, &t) != KILN_OK) break;
            load_cpu[r] = cpu_ns() - c0;
            load[r] = kiln_now_ns() - t0;
        }
        if (!t) {
            fprintf(stderr, "tokenize: %s\n", kiln_last_error());
            gguf_close(f);
            status = 1;
            continue;
        }
        size_t n = 0;
        for (int r = 0; r < ENCODE_RUNS; r++) {
            t0 = kiln_now_ns();
            uint64_t c0 = cpu_ns();
            if (kiln_tokenizer_encode(t, text, len, 0, ids, cap, &n) != KILN_OK) {
                fprintf(stderr, "tokenize: %s\n", kiln_last_error());
                status = 1;
                break;
            }
            enc_cpu[r] = cpu_ns() - c0;
            enc[r] = kiln_now_ns() - t0;
        }
        const char *name = strrchr(files[k], '/');
        name = name ? name + 1 : files[k];
        double mbs = (double)len / 1e6 / ((double)median(enc, ENCODE_RUNS) / 1e9);
        double mbs_cpu = (double)len / 1e6 / ((double)median(enc_cpu, ENCODE_RUNS) / 1e9);
        printf("| %s | %d | %s | %.2f | %.2f (%.2f) | %.1f (%.1f) | %zu | %.2f |\n", name, kiln_tokenizer_n_vocab(t),
               kiln_tokenizer_pre_name(t), (double)open_ns / 1e6, (double)median(load, LOAD_RUNS) / 1e6,
               (double)median(load_cpu, LOAD_RUNS) / 1e6, mbs, mbs_cpu, n, (double)len / (double)n);
        kiln_tokenizer_close(t);
        gguf_close(f);
    }
    free(ids);
    free(text);
    for (size_t i = 0; i < n_chunks; i++) free(chunks[i].p);
    free(chunks);
    return status;
}
