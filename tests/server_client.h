/*
 * server_client.h — what the server tests share: start `kiln serve` (the ASan CLI) on a free port of
 * 127.0.0.1 and always stop it (SIGTERM, bounded wait, then SIGKILL; it also dies with the test process),
 * check its log for sanitizer reports, and a small HTTP/1.1 client over a raw socket (so that tests can
 * send odd bodies and hang up mid-stream).
 */
#ifndef KILN_TESTS_SERVER_CLIENT_H
#define KILN_TESTS_SERVER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct test_server {
    pid_t pid;
    int port;
    char log[512];
} test_server;

/* Starts `[env] KILN_BIN serve -m MODEL --port 0 ARGS` (env: "NAME=value ..." or NULL) with its output in
 * a log file of the test's scratch directory, and waits (bounded) for its "listening on" line. */
bool ts_start(test_server *s, const char *model, const char *args, const char *env);
/* Polls /health until it answers 200 (at most timeout_ms); false otherwise. */
bool ts_wait_ready(test_server *s, int timeout_ms);
/* Stops the server with SIGTERM (SIGKILL after 20 s) and returns its exit status (-1 when killed); fails
 * the test when the log holds a sanitizer report. Safe to call twice. */
int ts_stop(test_server *s);
/* The server's resident memory in KiB (from /proc), -1 when unknown. */
long ts_rss_kib(const test_server *s);

typedef struct http_resp {
    int status;
    char *head;       /* the status line and headers */
    char *body;       /* de-chunked, NUL-terminated */
    size_t body_len;
} http_resp;

/* A connected socket to 127.0.0.1:port with 60 s send/receive timeouts, or -1. */
int http_connect(int port);
/* Writes all n bytes; false on error. */
bool http_send_all(int fd, const char *p, size_t n);
/* One request on a fresh connection (Connection: close); reads the answer to EOF. extra: header lines
 * each ending in \r\n, or NULL. false when the connection failed. */
bool http_do(int port, const char *method, const char *path, const char *extra, const char *body, size_t len,
             http_resp *r);
/* POST of a JSON body. */
bool http_post(int port, const char *path, const char *json, http_resp *r);
bool http_get(int port, const char *path, http_resp *r);
void http_resp_free(http_resp *r);
/* The value of a response header (case-insensitive name), copied into buf; NULL when absent. */
const char *http_header(const http_resp *r, const char *name, char *buf, size_t cap);

#endif
