/*
 * test.h — the tiny test framework of kiln. Each TEST runs in its own forked process (a crash or a
 * sanitizer report fails that test only). Checks record failures with file:line and go on; REQUIRE
 * stops the test. Shared data is found through test_shared(); missing data fails loudly.
 */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln.h"

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn, const char *file);

#define TEST(name)                                                                     \
    static void name(void);                                                            \
    __attribute__((constructor)) static void name##_register(void) {                   \
        test_register(#name, name, __FILE__);                                          \
    }                                                                                  \
    static void name(void)

void test_failf(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Marks the current test skipped with a printed reason (it must then return). */
void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int test_failures(void);

#define CHECK(cond) \
    do { if (!(cond)) test_failf(__FILE__, __LINE__, "CHECK(%s)", #cond); } while (0)
#define CHECKF(cond, ...) \
    do { if (!(cond)) test_failf(__FILE__, __LINE__, __VA_ARGS__); } while (0)
#define REQUIRE(cond) \
    do { if (!(cond)) { test_failf(__FILE__, __LINE__, "REQUIRE(%s)", #cond); return; } } while (0)
#define REQUIREF(cond, ...) \
    do { if (!(cond)) { test_failf(__FILE__, __LINE__, __VA_ARGS__); return; } } while (0)
#define CHECK_EQ_INT(a, b) \
    do { long long a_ = (long long)(a), b_ = (long long)(b); \
         if (a_ != b_) test_failf(__FILE__, __LINE__, "%s == %s (%lld != %lld)", #a, #b, a_, b_); } while (0)
#define CHECK_STR(a, b) \
    do { const char *a_ = (a), *b_ = (b); \
         if (!a_ || !b_ || strcmp(a_, b_)) test_failf(__FILE__, __LINE__, "%s == %s (\"%s\" != \"%s\")", #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)"); } while (0)
/* A kiln call must succeed; on failure prints kiln_last_error() and stops the test. */
#define REQUIRE_OK(expr) \
    do { kiln_status st_ = (expr); \
         if (st_ != KILN_OK) { test_failf(__FILE__, __LINE__, "%s -> %s: %s", #expr, kiln_status_name(st_), kiln_last_error()); return; } } while (0)
#define CHECK_OK(expr) \
    do { kiln_status st_ = (expr); \
         if (st_ != KILN_OK) test_failf(__FILE__, __LINE__, "%s -> %s: %s", #expr, kiln_status_name(st_), kiln_last_error()); } while (0)

/* Path of a file under the shared data folder (KILN_SHARED or ../shared). Fails the test loudly when
 * the file does not exist; the returned string lives until the test ends. */
const char *test_shared(const char *rel);
/* Path of the ASan-built CLI (KILN_BIN) for tests that run commands. */
const char *test_kiln_bin(void);
/* A python3 that can import jinja2 (the chat-template reference): `python3` on PATH, else /usr/bin/python3
 * (Debian's python3-jinja2, which `make deps` installs). Fails the test loudly when neither has it. */
const char *test_python_jinja(void);
/* A fresh scratch directory for this test (removed by the runner afterwards). */
const char *test_tmpdir(void);

/* Reads a whole file into a malloc'd, NUL-terminated buffer (NULL and a failure on error). */
char *test_read_file(const char *path, size_t *len);
/* Runs a shell command, captures stdout (malloc'd) and returns the exit status. */
int test_run_cmd(const char *cmd, char **out);

/* Deterministic PRNG for tests (splitmix64). */
uint64_t test_rand_u64(uint64_t *state);
float test_rand_normal(uint64_t *state);

/* Cosine similarity of a and b (n floats), in double. */
double test_cosine(const float *a, const float *b, int n);
/* Index of the largest of x[0..n) (the lowest on ties). */
int32_t test_argmax(const float *x, int n);
/* Whether logits x (n) put ids a and b within frac of their range of each other: a near-tie, where greedy ids of
 * two runs that differ by rounding may go either way. */
bool test_near_tie(const float *x, int n, int32_t a, int32_t b, double frac);

/* Heap calls made by any code in the test binary (counted by -Wl,--wrap wrappers). */
uint64_t test_heap_calls(void);

/* The first-call contract after open: prints what (e.g. "after open") with the session's counters and the heap
 * calls counted around the calls, and fails at the caller's line unless every one of them is 0. */
void test_check_after_open(const char *file, int line, const char *what, const kiln_stats *st, uint64_t heap_calls);
#define CHECK_NOTHING_AFTER_OPEN(what, st, heap_calls) test_check_after_open(__FILE__, __LINE__, what, &(st), heap_calls)

#endif
