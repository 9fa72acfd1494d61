/* log.h — leveled logging to stderr; the level comes from KILN_LOG (error|warn|info|debug). */
#ifndef KILN_BASE_LOG_H
#define KILN_BASE_LOG_H

#include "base/error.h"

typedef enum { KILN_LOG_ERROR = 0, KILN_LOG_WARN = 1, KILN_LOG_INFO = 2, KILN_LOG_DEBUG = 3 } kiln_log_level;

void kiln_log(kiln_log_level level, const char *fmt, ...) KILN_PRINTF(2, 3);
void kiln_log_set_level(kiln_log_level level);

#define KILN_WARN(...) kiln_log(KILN_LOG_WARN, __VA_ARGS__)
#define KILN_INFO(...) kiln_log(KILN_LOG_INFO, __VA_ARGS__)
#define KILN_DEBUG(...) kiln_log(KILN_LOG_DEBUG, __VA_ARGS__)

#endif
