/*
 * gguf_open.c — benchmark of opening a GGUF: map + parse + index (gguf_open, then gguf_close), for every
 * .gguf under DIR (default $KILN_SHARED/models, recursively; that includes llama.cpp-vocab/). Each file is
 * opened 3 times to warm the page cache, then 50 times; the medians of the whole open, of the map and of the
 * parse are printed as a markdown table. Target: <= 1 ms for ggml-vocab-gpt-2.gguf (50257 tokens, 50000
 * merges).
 *   usage: gguf_open [DIR ...]
 */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timing.h"
#include "gguf/gguf.h"

#define RUNS 50
#define MAX_FILES 256

static char *files[MAX_FILES];
static size_t file_root[MAX_FILES]; /* length of the walked folder's prefix, for short names */
static int n_files;
static size_t root_len;

static int collect(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)ftw;
    size_t n = strlen(path);
    if (flag == FTW_F && n > 5 && !strcmp(path + n - 5, ".gguf") && n_files < MAX_FILES) {
        file_root[n_files] = root_len;
        files[n_files++] = strdup(path);
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double median_ms(uint64_t *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    return (n % 2 ? (double)v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0) / 1e6;
}

int main(int argc, char **argv) {
    char def[1024];
    if (argc < 2) {
        const char *shared = getenv("KILN_SHARED");
        snprintf(def, sizeof def, "%s/models", shared && *shared ? shared : "../shared");
        root_len = strlen(def) + 1;
        if (nftw(def, collect, 16, FTW_PHYS) != 0) { fprintf(stderr, "gguf_open: cannot walk %s\n", def); return 1; }
    }
    for (int i = 1; i < argc; i++)
        if ((root_len = strlen(argv[i]) + 1), nftw(argv[i], collect, 16, FTW_PHYS) != 0) { fprintf(stderr, "gguf_open: cannot walk %s\n", argv[i]); return 1; }
    /* sort by the short name (the prefix lengths travel with the names) */
    for (int i = 1; i < n_files; i++)
        for (int j = i; j > 0 && strcmp(files[j - 1] + file_root[j - 1], files[j] + file_root[j]) > 0; j--) {
            char *t = files[j]; files[j] = files[j - 1]; files[j - 1] = t;
            size_t r = file_root[j]; file_root[j] = file_root[j - 1]; file_root[j - 1] = r;
        }
    printf("| file | MiB | keys | tensors | open ms (median of %d) | map ms | parse ms | min open ms |\n", RUNS);
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int status = 0;
    for (int k = 0; k < n_files; k++) {
        uint64_t total[RUNS], map[RUNS], parse[RUNS];
        gguf_file *f = NULL;
        size_t n_kv = 0, n_tensors = 0;
        double mib = 0;
        bool ok = true;
        for (int r = -3; r < RUNS && ok; r++) {
            uint64_t t0 = kiln_now_ns();
            if (gguf_open(files[k], &f) != KILN_OK) {
                fprintf(stderr, "gguf_open: %s\n", kiln_last_error());
                ok = false;
                break;
            }
            uint64_t t1 = kiln_now_ns();
            n_kv = gguf_n_kv(f);
            n_tensors = gguf_n_tensors(f);
            mib = gguf_file_size(f) / 1048576.0;
            if (r >= 0) {
                total[r] = t1 - t0;
                gguf_open_ns(f, &map[r], &parse[r]);
            }
            gguf_close(f);
        }
        if (!ok) { status = 1; continue; }
        const char *name = strlen(files[k]) > file_root[k] ? files[k] + file_root[k] : files[k];
        uint64_t mn = total[0];
        for (int r = 1; r < RUNS; r++) if (total[r] < mn) mn = total[r];
        printf("| %s | %.2f | %zu | %zu | %.3f | %.3f | %.3f | %.3f |\n", name, mib, n_kv, n_tensors,
               median_ms(total, RUNS), median_ms(map, RUNS), median_ms(parse, RUNS), mn / 1e6);
    }
    return status;
}
