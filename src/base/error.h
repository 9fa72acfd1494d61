/*
 * error.h — the two error channels of kiln.
 *   KILN_ASSERT(cond): programmer errors; prints file:line and aborts.
 *   kiln_fail(st, fmt, ...): bad input from outside; records a message for kiln_last_error() and returns st.
 */
#ifndef KILN_BASE_ERROR_H
#define KILN_BASE_ERROR_H

#include "kiln.h"

#if defined(__GNUC__)
#define KILN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KILN_PRINTF(a, b)
#endif

void kiln_assert_fail(const char *file, int line, const char *expr) __attribute__((noreturn));

#define KILN_ASSERT(cond) \
    do { if (!(cond)) kiln_assert_fail(__FILE__, __LINE__, #cond); } while (0)

/* Records a formatted message as this thread's last error and returns st. */
kiln_status kiln_fail(kiln_status st, const char *fmt, ...) KILN_PRINTF(2, 3);

/* Prefixes the current last-error message with a context string ("model.gguf: " ...). Returns st. */
kiln_status kiln_fail_prefix(kiln_status st, const char *fmt, ...) KILN_PRINTF(2, 3);

void kiln_clear_error(void);

/* Checked call: returns the status of expr from the enclosing function when it is not KILN_OK. */
#define KILN_TRY(expr) \
    do { kiln_status kiln_try_st_ = (expr); if (kiln_try_st_ != KILN_OK) return kiln_try_st_; } while (0)

#endif
