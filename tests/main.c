/* main.c — the test runner: forks each registered test, collects PASS/FAIL/SKIP, prints
 * "N passed, N failed, N skipped" as its last line. Usage: kiln_tests [substring-filter ...] */
#include "test.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_TESTS 2048
static struct { const char *name, *file; test_fn fn; } tests[MAX_TESTS];
static int n_tests;
static int failures;
static char skip_reason[512];
static char tmpdir[256];

void test_register(const char *name, test_fn fn, const char *file) {
    if (n_tests < MAX_TESTS) {
        tests[n_tests].name = name;
        tests[n_tests].fn = fn;
        tests[n_tests].file = file;
        n_tests++;
    }
}

void test_failf(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    failures++;
}

void test_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(skip_reason, sizeof skip_reason, fmt, ap);
    va_end(ap);
    printf("  skipped: %s\n", skip_reason);
}

int test_failures(void) { return failures; }

const char *test_shared(const char *rel) {
    static char bufs[8][1024];
    static int k;
    const char *root = getenv("KILN_SHARED");
    if (!root || !*root) root = "../shared";
    char *b = bufs[k++ % 8];
    snprintf(b, 1024, "%s/%s", root, rel);
    struct stat st;
    if (stat(b, &st) != 0)
        test_failf(__FILE__, __LINE__, "shared test data missing: %s (set KILN_SHARED to the shared folder)", b);
    return b;
}

const char *test_kiln_bin(void) {
    const char *b = getenv("KILN_BIN");
    return b && *b ? b : "build/asan/kiln";
}

const char *test_python_jinja(void) {
    static const char *const candidates[] = {"python3", "/usr/bin/python3"};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s -c 'import jinja2' >/dev/null 2>&1", candidates[i]);
        if (system(cmd) == 0) return candidates[i];
    }
    test_failf(__FILE__, __LINE__, "no python3 with jinja2 (the chat-template reference): run `make deps` "
               "or apt-get install python3-jinja2");
    return "python3";
}

const char *test_tmpdir(void) { return tmpdir; }

char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { test_failf(__FILE__, __LINE__, "cannot open %s: %s", path, strerror(errno)); return NULL; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        test_failf(__FILE__, __LINE__, "cannot read %s", path);
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

int test_run_cmd(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (cap - n < 1024) { cap *= 2; buf = realloc(buf, cap); }
    }
    if (buf) buf[n] = '\0';
    int st = pclose(p);
    if (out) *out = buf; else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

uint64_t test_rand_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float test_rand_normal(uint64_t *s) {
    double u1 = ((test_rand_u64(s) >> 11) + 1) * (1.0 / 9007199254740994.0);
    double u2 = (test_rand_u64(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- heap call counting through the linker's --wrap ---- */
static _Atomic uint64_t heap_calls;
double test_cosine(const float *a, const float *b, int n) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) ab += (double)a[i] * b[i], aa += (double)a[i] * a[i], bb += (double)b[i] * b[i];
    return ab / sqrt(aa * bb + 1e-300);
}

int32_t test_argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

bool test_near_tie(const float *x, int n, int32_t a, int32_t b, double frac) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;
    return fabs((double)x[a] - x[b]) < frac * ((double)hi - lo);
}

uint64_t test_heap_calls(void) { return atomic_load(&heap_calls); }

void test_check_after_open(const char *file, int line, const char *what, const kiln_stats *st, uint64_t heap) {
    const struct { const char *name; uint64_t n; } c[] = {
        {"heap calls", heap},           {"host_allocs", st->host_allocs},       {"device_allocs", st->device_allocs},
        {"module_loads", st->module_loads}, {"graph_captures", st->graph_captures}, {"jit_compiles", st->jit_compiles},
    };
    printf("  %s:", what);
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) printf(" %s %llu", c[i].name, (unsigned long long)c[i].n);
    printf("\n");
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (c[i].n) test_failf(file, line, "%s: %s %llu, want 0", what, c[i].name, (unsigned long long)c[i].n);
}
void *__real_malloc(size_t);
void *__real_calloc(size_t, size_t);
void *__real_realloc(void *, size_t);
int __real_posix_memalign(void **, size_t, size_t);
void *__real_aligned_alloc(size_t, size_t);
char *__real_strdup(const char *);
char *__real_strndup(const char *, size_t);
void *__wrap_malloc(size_t n) { atomic_fetch_add(&heap_calls, 1); return __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { atomic_fetch_add(&heap_calls, 1); return __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { atomic_fetch_add(&heap_calls, 1); return __real_realloc(p, n); }
int __wrap_posix_memalign(void **p, size_t a, size_t n) { atomic_fetch_add(&heap_calls, 1); return __real_posix_memalign(p, a, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { atomic_fetch_add(&heap_calls, 1); return __real_aligned_alloc(a, n); }
char *__wrap_strdup(const char *s) { atomic_fetch_add(&heap_calls, 1); return __real_strdup(s); }
char *__wrap_strndup(const char *s, size_t n) { atomic_fetch_add(&heap_calls, 1); return __real_strndup(s, n); }

static bool matches(const char *name, const char *file, int argc, char **argv) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i]) || strstr(file, argv[i])) return true;
    return false;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    const char *verbose = getenv("KILN_TEST_VERBOSE");
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < n_tests; i++) {
        if (!matches(tests[i].name, tests[i].file, argc, argv)) continue;
        char logpath[] = "/tmp/kiln-test-log-XXXXXX";
        int logfd = mkstemp(logpath);
        snprintf(tmpdir, sizeof tmpdir, "/tmp/kiln-test-%d-%d", (int)getpid(), i);
        mkdir(tmpdir, 0700);
        double t0 = now_s();
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            dup2(logfd, 1);
            dup2(logfd, 2);
            alarm(600);
            failures = 0;
            skip_reason[0] = '\0';
            tests[i].fn();
            fflush(stdout);
            fflush(stderr);
            exit(failures ? 1 : skip_reason[0] ? 77 : 0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        double dt = now_s() - t0;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        const char *verdict = code == 0 ? "PASS" : code == 77 ? "SKIP" : "FAIL";
        if (code == 0) passed++; else if (code == 77) skipped++; else failed++;
        printf("%s %-48s %8.2fs  (%s)\n", verdict, tests[i].name, dt, tests[i].file);
        /* print the test's output on failure, on skip (the reason), or when verbose */
        FILE *lf = fdopen(logfd, "r");
        if (lf) {
            fseek(lf, 0, SEEK_SET);
            char line[4096];
            int shown = 0;
            while (fgets(line, sizeof line, lf)) {
                if (code == 0 && !verbose) break;
                if (code == 77 && !verbose && !strstr(line, "skip")) continue;
                if (shown++ < 200) fputs(line[0] == ' ' ? line : line, stdout);
            }
            if (!WIFEXITED(status)) printf("  killed by signal %d\n", WTERMSIG(status));
            fclose(lf);
        }
        unlink(logpath);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) { }
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
