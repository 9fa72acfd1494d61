/* util.c — argument parsing and printing helpers shared by the subcommands. */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n%s", usage);
    va_end(ap);
    return 2;
}

bool cli_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_error(cmd, "%s: expected an integer in %ld..%ld, got '%s'", opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        cli_error(cmd, "%s: expected a number in %g..%g, got '%s'", opt, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_opt(int argc, char **argv, int *i, const char *opt, const char **val, bool *err) {
    const size_t n = strlen(opt);
    if (!strncmp(argv[*i], opt, n) && argv[*i][n] == '=' && !strncmp(opt, "--", 2)) {
        *val = argv[*i] + n + 1; /* --opt=value */
        return true;
    }
    if (strcmp(argv[*i], opt)) return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kiln %s: option %s needs a value\n", argv[0], opt);
        *err = true;
        return true;
    }
    *val = argv[++*i];
    return true;
}

size_t cli_utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; min = 0x10000; }
    else return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x3f >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

void cli_json_str(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        size_t u = cli_utf8_len((const unsigned char *)s + i, len - i);
        if (c == '"' || c == '\\') { fprintf(f, "\\%c", c); i++; }
        else if (c == '\n') { fputs("\\n", f); i++; }
        else if (c == '\t') { fputs("\\t", f); i++; }
        else if (c == '\r') { fputs("\\r", f); i++; }
        else if (c < 0x20 || c == 0x7f) { fprintf(f, "\\u%04x", c); i++; }
        else if (u == 0) { fputs("\\ufffd", f); i++; }
        else { fwrite(s + i, 1, u, f); i += u; }
    }
    fputc('"', f);
}

char *cli_read_file(const char *cmd, const char *path, size_t *len) {
    const bool std_in = !strcmp(path, "-");
    FILE *f = std_in ? stdin : fopen(path, "rb");
    if (std_in) path = "(stdin)";
    if (!f) { cli_error(cmd, "cannot open '%s': %s", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) { if (!std_in) fclose(f); cli_error(cmd, "out of memory reading '%s'", path); return NULL; }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
        if (cap - n < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    if (ferror(f)) { if (!std_in) fclose(f); free(buf); cli_error(cmd, "cannot read '%s'", path); return NULL; }
    if (!std_in) fclose(f);
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

int cli_sampler_opt(const char *cmd, int argc, char **argv, int *i, kiln_sampler_params *p, bool *seed_given) {
    static const struct { const char *name; double lo, hi; bool integer; } opts[] = {
        {"--temp", 0, 100, false}, {"--top-k", 0, 1 << 24, true}, {"--top-p", 0, 1, false},
        {"--min-p", 0, 1, false}, {"--repeat-penalty", 0.01, 10, false}, {"--repeat-last-n", 0, 1 << 20, true},
    };
    const char *v = NULL;
    bool err = false;
    if (cli_opt(argc, argv, i, "--seed", &v, &err)) {
        if (err) return 2;
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if (!strcmp(v, "-1")) {
            s = cli_random_seed(); /* llama.cpp's spelling of "random" */
        } else if (errno || *end || end == v || v[0] == '-') {
            cli_error(cmd, "--seed: expected an unsigned integer or -1 (random), got '%s'", v);
            return 2;
        }
        p->seed = s;
        if (seed_given) *seed_given = true;
        return 1;
    }
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
        if (!cli_opt(argc, argv, i, opts[k].name, &v, &err)) continue;
        if (err) return 2;
        double d;
        long l;
        if (opts[k].integer ? !cli_parse_int(cmd, opts[k].name, v, (long)opts[k].lo, (long)opts[k].hi, &l)
                            : !cli_parse_float(cmd, opts[k].name, v, opts[k].lo, opts[k].hi, &d))
            return 2;
        switch (k) {
        case 0: p->temperature = (float)d; break;
        case 1: p->top_k = (int)l; break;
        case 2: p->top_p = (float)d; break;
        case 3: p->min_p = (float)d; break;
        case 4: p->repeat_penalty = (float)d; break;
        default: p->repeat_last_n = (int)l; break;
        }
        return 1;
    }
    return 0;
}

uint64_t cli_random_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007ull) ^ ((uint64_t)ts.tv_nsec << 20) ^ ((uint64_t)clock() << 40) ^
           (uint64_t)getpid();
}

bool cli_parse_n_predict(const char *cmd, const char *opt, const char *s, long *out) {
    return cli_parse_int(cmd, opt, s, -1, 1 << 24, out);
}

bool cli_check_output_dir(const char *cmd, const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    struct stat st;
    if (stat(dir, &st) != 0) {
        cli_error(cmd, "cannot write '%s': its directory '%s' does not exist (%s)", path, dir, strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        cli_error(cmd, "cannot write '%s': '%s' is not a directory", path, dir);
        return false;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        cli_error(cmd, "cannot write '%s': the directory '%s' is not writable (%s)", path, dir, strerror(errno));
        return false;
    }
    return true;
}

bool cli_parse_device(const char *cmd, const char *s, kiln_device *out) {
    if (!strcmp(s, "auto")) *out = KILN_DEVICE_AUTO;
    else if (!strcmp(s, "cpu")) *out = KILN_DEVICE_CPU;
    else if (!strcmp(s, "cuda")) *out = KILN_DEVICE_CUDA;
    else {
        cli_error(cmd, "--device: expected cpu, cuda or auto, got '%s'", s);
        return false;
    }
    return true;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t cli_median_u64(uint64_t *v, long n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
