/*
 * warm.c — the server's own warm pass, before /health says "ok": one streamed completion (and one chat
 * completion when there is a template) sent to itself over loopback, so that the HTTP thread, the JSON
 * parser, the request path, the engine loop and the response writers have each run once, and a fresh server's
 * first request costs what later ones do. The requests carry a per-process token (X-Kiln-Warm) and are the
 * only ones served while the state is SRV_WARMING; the metrics are reset after them.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "server/http.h"

/* The address to reach the listener at: loopback for a wildcard bind. */
static const char *warm_host(const srv *S) {
    const char *h = S->cfg.host && *S->cfg.host ? S->cfg.host : "127.0.0.1";
    if (!strcmp(h, "0.0.0.0")) return "127.0.0.1";
    if (!strcmp(h, "::") || !strcmp(h, "[::]")) return "::1";
    return h;
}

/* Sends one request and reads the response to its end (the server closes: Connection: close). */
static bool warm_request(srv *S, const char *path, const char *body) {
    char port[16], req[2048];
    snprintf(port, sizeof port, "%d", S->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(warm_host(S), port, &hints, &ai) || !ai) return false;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    bool ok = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    freeaddrinfo(ai);
    if (ok) {
        struct timeval tv = {.tv_sec = 30};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        const char *key = S->cfg.api_key && *S->cfg.api_key ? S->cfg.api_key : NULL;
        int n = snprintf(req, sizeof req,
                         "POST %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n"
                         "X-Kiln-Warm: %s\r\n%s%s%sContent-Length: %zu\r\n\r\n%s",
                         path, S->warm_token, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "",
                         strlen(body), body);
        ok = n > 0 && (size_t)n < sizeof req && write(fd, req, (size_t)n) == n;
        char buf[4096];
        ssize_t got = 0, first = -1;
        while (ok && (got = read(fd, buf, sizeof buf)) > 0)
            if (first < 0) first = got, ok = got >= 12 && !strncmp(buf + 9, "200", 3);
        ok = ok && got == 0 && first > 0;
    }
    if (fd >= 0) close(fd);
    return ok;
}

bool warm_is_warm_request(const srv *S, struct MHD_Connection *conn) {
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Kiln-Warm");
    return h && S->warm_token[0] && !strcmp(h, S->warm_token);
}

void warm_run(srv *S) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(S->warm_token, sizeof S->warm_token, "%08lx%08lx%08x", (unsigned long)ts.tv_nsec,
             (unsigned long)ts.tv_sec, (unsigned)getpid());
    const int32_t bos = S->mi.bos_id >= 0 ? S->mi.bos_id : 0, id = 1 % (S->mi.n_vocab > 1 ? S->mi.n_vocab : 1);
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":[%d,%d,%d,%d],\"max_tokens\":2,\"stream\":true,\"temperature\":0}", bos, id,
             id, id);
    bool ok = warm_request(S, "/v1/completions", body);
    if (ok && S->tmpl)
        ok = warm_request(S, "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}");
    if (!ok) fprintf(stderr, "kiln serve: warning: the warm-up request to itself failed; serving anyway\n");
    metrics_reset(&S->metrics);
    S->warm_token[0] = '\0';
}
