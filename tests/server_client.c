/* server_client.c — starting and stopping `kiln serve` for the tests, and a raw-socket HTTP client. */
#include "server_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

/* A whole small file, NULL when it does not exist (yet); never fails the test. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        size_t k = fread(b + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
        if (cap - n < 2) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) { free(b); b = NULL; }
            else b = nb;
        }
    }
    fclose(f);
    if (b) b[n] = '\0';
    return b;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

bool ts_start(test_server *s, const char *model, const char *args, const char *env) {
    static int counter;
    memset(s, 0, sizeof *s);
    snprintf(s->log, sizeof s->log, "%s/serve%d.log", test_tmpdir(), counter++);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec env %s %s serve -m %s --port 0 %s >%s 2>&1", env ? env : "", test_kiln_bin(), model,
             args ? args : "", s->log);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test, whatever happens to it */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->pid = pid;
    for (int i = 0; i < 3000; i++) { /* 60 s */
        char *log = slurp(s->log);
        const char *p = log ? strstr(log, "listening on http://127.0.0.1:") : NULL;
        if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        free(log);
        if (s->port > 0) return true;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            char *l = slurp(s->log);
            test_failf(__FILE__, __LINE__, "kiln serve exited before listening:\n%s", l ? l : "");
            free(l);
            return false;
        }
        sleep_ms(20);
    }
    test_failf(__FILE__, __LINE__, "kiln serve did not print its address within 60 s");
    ts_stop(s);
    return false;
}

bool ts_wait_ready(test_server *s, int timeout_ms) {
    for (int t = 0; t < timeout_ms; t += 20) {
        http_resp r;
        if (http_get(s->port, "/health", &r)) {
            int st = r.status;
            http_resp_free(&r);
            if (st == 200) return true;
        }
        sleep_ms(20);
    }
    return false;
}

int ts_stop(test_server *s) {
    if (s->pid <= 0) return 0;
    kill(s->pid, SIGTERM);
    int st = 0, rc = -1;
    bool reaped = false;
    for (int i = 0; i < 1000 && !reaped; i++) { /* 20 s */
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) { reaped = true; rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1; }
        else sleep_ms(20);
    }
    if (!reaped) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, &st, 0);
        test_failf(__FILE__, __LINE__, "kiln serve did not stop within 20 s of SIGTERM");
    }
    s->pid = 0;
    char *log = slurp(s->log);
    CHECKF(log && !strstr(log, "AddressSanitizer") && !strstr(log, "LeakSanitizer") && !strstr(log, "runtime error"),
           "sanitizer report in the server's log:\n%s", log ? log : "(no log)");
    free(log);
    return rc;
}

long ts_rss_kib(const test_server *s) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)s->pid);
    char *st = slurp(path);
    const char *p = st ? strstr(st, "VmRSS:") : NULL;
    long v = p ? atol(p + 6) : -1;
    free(st);
    return v;
}

int http_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { close(fd); return -1; }
    return fd;
}

bool http_send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Decodes a chunked body in place; false when malformed. */
static bool dechunk(char *b, size_t *len) {
    size_t in = 0, out = 0;
    for (;;) {
        char *end;
        unsigned long n = strtoul(b + in, &end, 16);
        char *crlf = strstr(b + in, "\r\n");
        if (!crlf || end == b + in) return false;
        in = (size_t)(crlf - b) + 2;
        if (n == 0) break;
        if (in + n + 2 > *len) return false;
        memmove(b + out, b + in, n);
        out += n;
        in += n + 2;
    }
    b[out] = '\0';
    *len = out;
    return true;
}

bool http_do(int port, const char *method, const char *path, const char *extra, const char *body, size_t len,
             http_resp *r) {
    memset(r, 0, sizeof *r);
    int fd = http_connect(port);
    if (fd < 0) return false;
    char head[2048];
    int hn = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path,
                      extra ? extra : "");
    if (body) hn += snprintf(head + hn, sizeof head - (size_t)hn, "Content-Type: application/json\r\nContent-Length: %zu\r\n", len);
    hn += snprintf(head + hn, sizeof head - (size_t)hn, "\r\n");
    bool ok = http_send_all(fd, head, (size_t)hn) && (!body || http_send_all(fd, body, len));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 4096 > cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
        }
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    close(fd);
    if (!buf || (!ok && n == 0)) { free(buf); return false; } /* a server may answer before reading all */
    buf[n] = '\0';
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        free(buf);
        return false;
    }
    *sep = '\0';
    r->head = strdup(buf);
    size_t blen = n - (size_t)(sep + 4 - buf);
    r->body = malloc(blen + 1);
    memcpy(r->body, sep + 4, blen);
    r->body[blen] = '\0';
    r->body_len = blen;
    char te[64];
    if (http_header(r, "Transfer-Encoding", te, sizeof te) && !strcasecmp(te, "chunked")) dechunk(r->body, &r->body_len);
    free(buf);
    return true;
}

bool http_post(int port, const char *path, const char *json, http_resp *r) {
    return http_do(port, "POST", path, NULL, json, strlen(json), r);
}

bool http_get(int port, const char *path, http_resp *r) { return http_do(port, "GET", path, NULL, NULL, 0, r); }

void http_resp_free(http_resp *r) {
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

const char *http_header(const http_resp *r, const char *name, char *buf, size_t cap) {
    size_t nl = strlen(name);
    for (const char *p = r->head ? strstr(r->head, "\r\n") : NULL; p; p = strstr(p + 2, "\r\n")) {
        const char *line = p + 2;
        if (strncasecmp(line, name, nl) || line[nl] != ':') continue;
        const char *v = line + nl + 1;
        while (*v == ' ') v++;
        size_t k = strcspn(v, "\r\n");
        if (k >= cap) k = cap - 1;
        memcpy(buf, v, k);
        buf[k] = '\0';
        return buf;
    }
    return NULL;
}
