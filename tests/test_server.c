/*
 * test_server.c — `kiln serve` (the ASan CLI) as clients see it: the official openai npm client (texts equal
 * `kiln run --temp 0`), every error with its status and OpenAI error type, a 10 MB body, a client hanging up
 * mid-stream, /health while loading, /metrics as Prometheus text, SIGTERM with a request in flight, a bounded
 * load test, and the chat page in headless Chromium. Each server binds 127.0.0.1 on a free port and is
 * stopped at the end of its test (and dies with the test process); its log must hold no sanitizer report.
 */
#include "test.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server_client.h"

#define TINY "models/tinystories-656K/TinyStories-656K-Q8_0.gguf"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Node and the npm packages the deps script installs into tests/server/node_modules. */
static bool have_node_modules(const char *pkg) {
    char path[256];
    snprintf(path, sizeof path, "tests/server/node_modules/%s/package.json", pkg);
    struct stat st;
    if (system("node --version >/dev/null 2>&1") != 0) {
        test_failf(__FILE__, __LINE__, "node is not on PATH (the server tests drive real clients with it)");
        return false;
    }
    if (stat(path, &st) != 0) {
        test_failf(__FILE__, __LINE__, "%s missing: run scripts/install-deps.sh (npm install --prefix tests/server)", path);
        return false;
    }
    return true;
}

/* The text `kiln run --temp 0 --json` generates (chat: one user turn with --chat). */
static char *kiln_run_text(const char *model, const char *prompt, int n, bool chat) {
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run -m %s -p '%s' -n %d --temp 0 --json %s 2>/dev/null", test_kiln_bin(), model,
             prompt, n, chat ? "--chat --chat-template chatml" : "");
    int rc = test_run_cmd(cmd, &out);
    json_t *j = rc == 0 && out ? json_loads(out, 0, NULL) : NULL;
    free(out);
    const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "rounds"), 0), "text"));
    char *r = t ? strdup(t) : NULL;
    json_decref(j);
    if (!r) test_failf(__FILE__, __LINE__, "kiln run failed: %s", cmd);
    return r;
}

TEST(server_openai_client_matches_kiln_run) {
    if (!have_node_modules("openai")) return;
    const char *model = test_shared(TINY);
    test_server s;
    REQUIRE(ts_start(&s, model, "--parallel 4 --chat-template chatml --threads 1", NULL));
    REQUIRE(ts_wait_ready(&s, 60000));
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "node tests/server/openai_client.cjs %d 'Tell me a story' 'Once upon a time' 48 2>&1", s.port);
    int rc = test_run_cmd(cmd, &out);
    CHECKF(rc == 0, "the openai client script failed (%d):\n%s", rc, out ? out : "");
    json_t *j = out ? json_loads(out, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    REQUIREF(j, "no JSON from the client script:\n%s", out ? out : "");
    char *chat = kiln_run_text(model, "Tell me a story", 48, true);
    char *text = kiln_run_text(model, "Once upon a time", 48, false);
    CHECK_STR(json_string_value(json_object_get(j, "chat")), chat);
    CHECK_STR(json_string_value(json_object_get(j, "completion")), text);
    CHECK_EQ_INT(ts_stop(&s), 0);
    free(chat);
    free(text);
    json_decref(j);
    free(out);
}

/* The error object of a response: status, error.type and (when want_code) error.code. */
static void check_error(int port, const char *method, const char *path, const char *headers, const char *body,
                        int status, const char *type, const char *code, const char *param) {
    http_resp r;
    REQUIREF(http_do(port, method, path, headers, body, body ? strlen(body) : 0, &r), "%s %s: no answer", method, path);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *e = json_object_get(j, "error");
    CHECKF(r.status == status, "%s %s %s: status %d, want %d: %s", method, path, body ? body : "", r.status, status, r.body);
    CHECKF(json_is_string(json_object_get(e, "message")) && json_string_length(json_object_get(e, "message")) > 0,
           "%s %s: no error.message: %s", method, path, r.body);
    CHECKF(json_object_get(e, "param") && json_object_get(e, "code"), "%s %s: error.param / error.code missing: %s",
           method, path, r.body);
    const char *t = json_string_value(json_object_get(e, "type"));
    CHECKF(t && !strcmp(t, type), "%s %s: error.type %s, want %s", method, path, t ? t : "(none)", type);
    if (code) {
        const char *c = json_string_value(json_object_get(e, "code"));
        CHECKF(c && !strcmp(c, code), "%s %s: error.code %s, want %s", method, path, c ? c : "(none)", code);
    }
    if (param) {
        const char *p = json_string_value(json_object_get(e, "param"));
        CHECKF(p && !strcmp(p, param), "%s %s: error.param %s, want %s (%s)", method, path, p ? p : "(none)", param, r.body);
    }
    json_decref(j);
    http_resp_free(&r);
}

#define AUTH "Authorization: Bearer sesame\r\n"
#define CHAT "/v1/chat/completions"

TEST(server_errors_have_status_and_openai_shape) {
    test_server s;
    REQUIRE(ts_start(&s, test_shared(TINY), "--parallel 1 --max-queue 0 --chat-template chatml --api-key sesame --threads 1", NULL));
    REQUIRE(ts_wait_ready(&s, 60000));
    const char *ok_body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4}";
    check_error(s.port, "POST", CHAT, NULL, ok_body, 401, "authentication_error", "invalid_api_key", NULL);
    check_error(s.port, "POST", CHAT, "Authorization: Bearer wrong\r\n", ok_body, 401, "authentication_error", NULL, NULL);
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\": [", 400, "invalid_request_error", NULL, NULL);
    check_error(s.port, "POST", CHAT, AUTH, "[1,2]", 400, "invalid_request_error", NULL, NULL);
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\":\"hi\"}", 400, "invalid_request_error", NULL, "messages");
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "invalid_request_error", NULL,
                "messages[0].role");
    check_error(s.port, "POST", CHAT, AUTH,
                "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
                "invalid_request_error", NULL, "messages[0].content[0]");
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":\"hot\"}",
                400, "invalid_request_error", NULL, "temperature");
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_p\":1.5}", 400,
                "invalid_request_error", NULL, "top_p");
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2.5}", 400,
                "invalid_request_error", NULL, "max_tokens");
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":2}", 400,
                "invalid_request_error", NULL, "n");
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":[1]}", 400,
                "invalid_request_error", NULL, "stop");
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_logprobs\":2}",
                400, "invalid_request_error", NULL, "top_logprobs");
    check_error(s.port, "POST", CHAT, AUTH, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":100000}",
                400, "invalid_request_error", "context_length_exceeded", NULL);
    check_error(s.port, "POST", "/v1/completions", AUTH, "{\"prompt\":[1,2,99999]}", 400, "invalid_request_error", NULL,
                "prompt");
    check_error(s.port, "GET", "/v1/nothing", AUTH, NULL, 404, "invalid_request_error", NULL, NULL);
    check_error(s.port, "GET", CHAT, AUTH, NULL, 405, "invalid_request_error", NULL, NULL);
    check_error(s.port, "DELETE", "/health", NULL, NULL, 405, "invalid_request_error", NULL, NULL);
    /* a 10 MB body: 413, and the server goes on serving */
    size_t big = 10u << 20;
    char *body = malloc(big + 1);
    REQUIRE(body);
    memset(body, ' ', big);
    memcpy(body, "{\"prompt\":\"", 11);
    memcpy(body + big - 2, "\"}", 2);
    body[big] = '\0';
    check_error(s.port, "POST", "/v1/completions", AUTH, body, 413, "invalid_request_error", "request_too_large", NULL);
    free(body);
    /* a client that waits for 100-continue gets the 413 before it sends its 10 MB */
    int fd = http_connect(s.port);
    REQUIRE(fd >= 0);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: 10485760\r\n"
                       "Expect: 100-continue\r\n\r\n";
    REQUIRE(http_send_all(fd, head, strlen(head)));
    char ans[512] = "";
    ssize_t k = recv(fd, ans, sizeof ans - 1, 0);
    CHECKF(k > 12 && !strncmp(ans, "HTTP/1.1 413", 12), "Expect: 100-continue with 10 MB: %s", ans);
    close(fd);
    /* the exempt routes and a served request with the key */
    http_resp r;
    REQUIRE(http_get(s.port, "/health", &r));
    CHECK_EQ_INT(r.status, 200);
    http_resp_free(&r);
    REQUIRE(http_do(s.port, "POST", CHAT, AUTH, ok_body, strlen(ok_body), &r));
    CHECKF(r.status == 200, "%d %s", r.status, r.body);
    http_resp_free(&r);
    CHECK_EQ_INT(ts_stop(&s), 0);
}

/* Starts a streaming request on its own socket and reads until the first data event; returns the fd. */
static int stream_begin(int port, const char *path, const char *headers, const char *body) {
    int fd = http_connect(port);
    if (fd < 0) return -1;
    char head[1024];
    int n = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n", path, headers ? headers : "", strlen(body));
    if (!http_send_all(fd, head, (size_t)n) || !http_send_all(fd, body, strlen(body))) { close(fd); return -1; }
    char buf[4096];
    size_t got = 0;
    while (got < sizeof buf - 1) {
        ssize_t k = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
        buf[got] = '\0';
        if (strstr(buf, "data: {")) return fd;
    }
    close(fd);
    return -1;
}

/* The value of one sample line of /metrics ("name" or "name{labels}"), -1 when absent. */
static double metric(int port, const char *name) {
    http_resp r;
    if (!http_get(port, "/metrics", &r)) return -1;
    double v = -1;
    size_t nl = strlen(name);
    for (char *line = r.body; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (!strncmp(line, name, nl) && line[nl] == ' ') { v = atof(line + nl + 1); break; }
    http_resp_free(&r);
    return v;
}

/* Waits (bounded) until no slot is busy. */
static bool wait_idle(int port) {
    for (int i = 0; i < 500; i++) {
        if (metric(port, "kiln_slots_busy") == 0) return true;
        sleep_ms(10);
    }
    return false;
}

/* A seeded sampling request that generates at least min_tokens when nobody hangs up (found by trying
 * seeds): the disconnect test needs a generation that would run on. */
static int long_seed(int port, int min_tokens, int max_tokens, int *len) {
    for (int seed = 1; seed <= 40; seed++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":%d,\"temperature\":1.5,\"top_k\":0,"
                 "\"top_p\":1,\"min_p\":0,\"seed\":%d}", max_tokens, seed);
        http_resp r;
        if (!http_post(port, "/v1/completions", body, &r)) return -1;
        json_t *j = json_loads(r.body, 0, NULL);
        *len = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
        json_decref(j);
        http_resp_free(&r);
        if (*len >= min_tokens) return seed;
    }
    return -1;
}

TEST(server_disconnect_mid_stream_cancels_and_frees_the_slot) {
    test_server s;
    REQUIRE(ts_start(&s, test_shared(TINY), "--parallel 1 --max-queue 0 --ctx 2048 --threads 1", NULL));
    REQUIRE(ts_wait_ready(&s, 60000));
    int full = 0, seed = long_seed(s.port, 300, 1500, &full);
    REQUIREF(seed > 0, "no seed gives a generation of 300+ tokens");
    double gen0 = metric(s.port, "kiln_generated_tokens_total");
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,\"temperature\":1.5,\"top_k\":0,"
             "\"top_p\":1,\"min_p\":0,\"seed\":%d,\"stream\":true}", seed);
    int fd = stream_begin(s.port, "/v1/completions", NULL, body);
    REQUIRE(fd >= 0);
    close(fd); /* hang up after the first tokens */
    CHECKF(wait_idle(s.port), "the slot is still busy after the client went away");
    double gen = metric(s.port, "kiln_generated_tokens_total") - gen0;
    CHECKF(gen < full / 2, "the cancelled stream generated %.0f of its %d tokens", gen, full);
    CHECK_EQ_INT((long long)metric(s.port, "kiln_requests_cancelled_total"), 1);
    /* the one slot serves the next request */
    http_resp r;
    REQUIRE(http_post(s.port, "/v1/completions", "{\"prompt\":\"The cat\",\"max_tokens\":8,\"temperature\":0}", &r));
    CHECKF(r.status == 200, "after the disconnect: %d %s", r.status, r.body);
    http_resp_free(&r);
    CHECK_EQ_INT(ts_stop(&s), 0);
}

TEST(server_queue_full_is_503_with_retry_after) {
    test_server s;
    REQUIRE(ts_start(&s, test_shared(TINY), "--parallel 1 --max-queue 0 --ctx 2048 --threads 1", NULL));
    REQUIRE(ts_wait_ready(&s, 60000));
    int full = 0, seed = long_seed(s.port, 300, 1500, &full);
    REQUIRE(seed > 0);
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,\"temperature\":1.5,\"top_k\":0,"
             "\"top_p\":1,\"min_p\":0,\"seed\":%d,\"stream\":true}", seed);
    int fd = stream_begin(s.port, "/v1/completions", NULL, body);
    REQUIRE(fd >= 0);
    http_resp r;
    REQUIRE(http_post(s.port, "/v1/completions", "{\"prompt\":\"The cat\",\"max_tokens\":8}", &r));
    char ra[32];
    CHECKF(r.status == 503, "a second request with one busy slot and no queue: %d %s", r.status, r.body);
    CHECKF(http_header(&r, "Retry-After", ra, sizeof ra) != NULL, "no Retry-After:\n%s", r.head);
    CHECKF(strstr(r.body, "\"queue_full\"") != NULL, "%s", r.body);
    http_resp_free(&r);
    close(fd);
    CHECK_EQ_INT(ts_stop(&s), 0);
}

TEST(server_health_is_503_while_loading_then_200) {
    test_server s;
    /* 64 slots of 2048 positions: the open (arena, warm pass) takes long enough to be seen */
    REQUIRE(ts_start(&s, test_shared(TINY), "--parallel 64 --ctx 2048 --threads 1", NULL));
    http_resp r;
    REQUIRE(http_get(s.port, "/health", &r));
    CHECKF(r.status == 503 && strstr(r.body, "\"loading\""), "/health right after listening: %d %s", r.status, r.body);
    http_resp_free(&r);
    REQUIRE(http_post(s.port, "/v1/completions", "{\"prompt\":\"x\"}", &r));
    CHECKF(r.status == 503 && strstr(r.body, "model_loading"), "a completion while loading: %d %s", r.status, r.body);
    http_resp_free(&r);
    REQUIRE(ts_wait_ready(&s, 120000));
    REQUIRE(http_get(s.port, "/health", &r));
    CHECKF(r.status == 200 && !strcmp(r.body, "{\"status\":\"ok\"}"), "%d %s", r.status, r.body);
    http_resp_free(&r);
    CHECK_EQ_INT(ts_stop(&s), 0);
}

/* Prometheus text format: every line a comment (# HELP / # TYPE) or `name{labels} value`. */
static void check_prometheus(const char *text) {
    int samples = 0;
    char *copy = strdup(text), *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') {
            CHECKF(!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7), "bad comment line: %s", line);
            continue;
        }
        size_t n = strspn(line, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:");
        CHECKF(n > 0, "bad metric name: %s", line);
        const char *p = line + n;
        if (*p == '{') {
            const char *e = strchr(p, '}');
            CHECKF(e, "unterminated labels: %s", line);
            if (!e) continue;
            p = e + 1;
        }
        char *end;
        CHECKF(*p == ' ', "no value: %s", line);
        double v = strtod(p + 1, &end);
        CHECKF(end != p + 1 && *end == '\0' && isfinite(v), "bad value: %s", line);
        samples++;
    }
    CHECK(samples > 20);
    free(copy);
}

TEST(server_metrics_are_prometheus_text) {
    test_server s;
    REQUIRE(ts_start(&s, test_shared(TINY), "--parallel 2 --threads 1", NULL));
    REQUIRE(ts_wait_ready(&s, 60000));
    http_resp r;
    for (int i = 0; i < 3; i++) {
        REQUIRE(http_post(s.port, "/v1/completions", "{\"prompt\":\"The dog\",\"max_tokens\":6,\"temperature\":0}", &r));
        CHECK_EQ_INT(r.status, 200);
        http_resp_free(&r);
    }
    REQUIRE(http_get(s.port, "/nope", &r));
    http_resp_free(&r);
    REQUIRE(http_get(s.port, "/metrics", &r));
    CHECK_EQ_INT(r.status, 200);
    char ct[128];
    CHECKF(http_header(&r, "Content-Type", ct, sizeof ct) && strstr(ct, "text/plain"), "content type %s", ct);
    check_prometheus(r.body);
    CHECKF(strstr(r.body, "kiln_requests_total{route=\"completions\",status=\"200\"} 3\n") &&
           strstr(r.body, "kiln_requests_total{route=\"other\",status=\"404\"} 1\n") &&
           strstr(r.body, "kiln_time_to_first_token_seconds_count 3\n") &&
           strstr(r.body, "kiln_time_per_output_token_seconds_bucket{le=\"+Inf\"} 15\n") &&
           strstr(r.body, "kiln_generated_tokens_total 18\n") && strstr(r.body, "kiln_queue_length 0\n") &&
           strstr(r.body, "kiln_slots_total 2\n"),
           "missing or wrong samples:\n%s", r.body);
    http_resp_free(&r);
    CHECK_EQ_INT(ts_stop(&s), 0);
}

TEST(server_tokenize_and_detokenize_round_trip) {
    const char *model = test_shared(TINY);
    test_server s;
    REQUIRE(ts_start(&s, model, "--parallel 1 --threads 1", NULL));
    REQUIRE(ts_wait_ready(&s, 60000));
    char cmd[1024], *want = NULL;
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s -p 'Once upon a time, Lily' --ids --no-bos", test_kiln_bin(), model);
    REQUIRE(test_run_cmd(cmd, &want) == 0 && want);
    json_t *ids = json_loads(want, 0, NULL);
    http_resp r;
    REQUIRE(http_post(s.port, "/tokenize", "{\"content\":\"Once upon a time, Lily\"}", &r));
    json_t *j = json_loads(r.body, 0, NULL);
    CHECKF(r.status == 200 && json_equal(json_object_get(j, "tokens"), ids), "/tokenize %s, kiln tokenize %s", r.body, want);
    http_resp_free(&r);
    json_t *req = json_pack("{s:O}", "tokens", ids);
    char *body = json_dumps(req, 0);
    json_decref(req);
    REQUIRE(http_post(s.port, "/detokenize", body, &r));
    json_t *d = json_loads(r.body, 0, NULL);
    const char *text = json_string_value(json_object_get(d, "content"));
    CHECKF(r.status == 200 && text && strstr(text, "Once upon a time, Lily") && strlen(text) <= 23, "/detokenize: %s", r.body);
    http_resp_free(&r);
    json_decref(d);
    free(body);
    json_decref(j);
    json_decref(ids);
    free(want);
    CHECK_EQ_INT(ts_stop(&s), 0);
}

TEST(server_sigterm_with_a_stream_in_flight_exits_0) {
    test_server s;
    REQUIRE(ts_start(&s, test_shared(TINY), "--parallel 1 --ctx 2048 --threads 1 --grace 1", NULL));
    REQUIRE(ts_wait_ready(&s, 60000));
    int fd = stream_begin(s.port, "/v1/completions", NULL,
                          "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,\"temperature\":1.5,\"top_k\":0,"
                          "\"top_p\":1,\"min_p\":0,\"seed\":3,\"stream\":true}");
    REQUIRE(fd >= 0);
    CHECK_EQ_INT(ts_stop(&s), 0);
    /* the stream ended (with its last events or closed), it does not hang */
    char buf[4096];
    ssize_t k;
    while ((k = recv(fd, buf, sizeof buf, 0)) > 0) {}
    CHECK(k == 0 || k < 0);
    close(fd);
}

/* ---------------------------------------------------------------- load test */

typedef struct load_state {
    int port;
    atomic_int next, done, ok, refused, hung_up, bad;
    long rss_after_50;
    test_server *s;
    pthread_mutex_t mu;
    char first_bad[3000];
} load_state;

static const char *words[] = {"the", "cat", "dog", "sun", "little", "girl", "boy", "played", "happy", "tree", "ball",
                              "ran", "big", "red", "park", "friend", "Tom", "Lily", "said", "jumped"};

static void load_one(load_state *L, uint64_t *rng) {
    char prompt[512] = "";
    int nw = 1 + (int)(test_rand_u64(rng) % 30);
    for (int i = 0; i < nw; i++) {
        strcat(prompt, i ? " " : "");
        strcat(prompt, words[test_rand_u64(rng) % (sizeof words / sizeof words[0])]);
    }
    bool chat = test_rand_u64(rng) % 2, stream = test_rand_u64(rng) % 2, hang_up = test_rand_u64(rng) % 6 == 0;
    int max_tokens = 1 + (int)(test_rand_u64(rng) % 24);
    char body[2048];
    if (chat)
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,\"stream\":%s,"
                 "\"seed\":%d}", prompt, max_tokens, stream ? "true" : "false", (int)(test_rand_u64(rng) % 1000));
    else
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"stream\":%s,\"temperature\":0}", prompt,
                 max_tokens, stream ? "true" : "false");
    const char *path = chat ? CHAT : "/v1/completions";
    if (hang_up) {
        int fd = stream ? stream_begin(L->port, path, NULL, body) : http_connect(L->port);
        if (fd >= 0 && !stream) {
            char head[256];
            int n = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n", path, strlen(body));
            http_send_all(fd, head, (size_t)n);
            http_send_all(fd, body, strlen(body));
        }
        if (fd >= 0) close(fd);
        atomic_fetch_add(&L->hung_up, 1);
        return;
    }
    http_resp r;
    bool got = http_post(L->port, path, body, &r);
    bool good = got && ((r.status == 200 && (stream ? strstr(r.body, "data: [DONE]") != NULL
                                                    : strstr(r.body, "\"finish_reason\"") != NULL)) ||
                        (r.status == 503 && strstr(r.body, "queue_full")));
    if (got && r.status == 503) { atomic_fetch_add(&L->refused, 1); sleep_ms(20); } /* a client backs off */
    else if (good) atomic_fetch_add(&L->ok, 1);
    if (!good) {
        atomic_fetch_add(&L->bad, 1);
        pthread_mutex_lock(&L->mu);
        if (!L->first_bad[0])
            snprintf(L->first_bad, sizeof L->first_bad, "%s %s -> %d %.300s", path, body, got ? r.status : -1,
                     got ? r.body : "(no answer)");
        pthread_mutex_unlock(&L->mu);
    }
    if (got) http_resp_free(&r);
}

static void *load_client(void *arg) {
    load_state *L = arg;
    uint64_t rng = 0x5eed + (uint64_t)pthread_self();
    for (;;) {
        int k = atomic_fetch_add(&L->next, 1);
        if (k >= 400) break;
        load_one(L, &rng);
        if (atomic_fetch_add(&L->done, 1) + 1 == 50) {
            wait_idle(L->port);
            L->rss_after_50 = ts_rss_kib(L->s);
        }
    }
    return NULL;
}

TEST(server_load_8_clients_400_requests) {
    test_server s;
    /* a small ASan quarantine, so that resident memory shows leaks rather than the sanitizer's cache */
    REQUIRE(ts_start(&s, test_shared(TINY), "--parallel 4 --max-queue 6 --chat-template chatml --threads 1",
                     "ASAN_OPTIONS=quarantine_size_mb=4:malloc_context_size=8"));
    REQUIRE(ts_wait_ready(&s, 60000));
    load_state L = {.port = s.port, .s = &s};
    pthread_mutex_init(&L.mu, NULL);
    pthread_t th[8];
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, load_client, &L);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    CHECKF(L.bad == 0, "%d requests neither answered nor cleanly refused; first: %s", (int)L.bad, L.first_bad);
    CHECKF(L.ok >= 200, "only %d of 400 answered (%d refused, %d hung up)", (int)L.ok, (int)L.refused, (int)L.hung_up);
    CHECK(wait_idle(s.port));
    long rss = ts_rss_kib(&s);
    printf("  load: %d answered, %d refused (queue full), %d hung up; RSS %ld KiB after 50, %ld KiB after 400\n",
           (int)L.ok, (int)L.refused, (int)L.hung_up, L.rss_after_50, rss);
    CHECKF(L.rss_after_50 > 0 && rss - L.rss_after_50 < 6 * 1024, "resident memory grew by %ld KiB", rss - L.rss_after_50);
    http_resp r;
    REQUIRE(http_get(s.port, "/health", &r));
    CHECK_EQ_INT(r.status, 200);
    http_resp_free(&r);
    REQUIRE(http_post(s.port, "/v1/completions", "{\"prompt\":\"The end\",\"max_tokens\":4}", &r));
    CHECK_EQ_INT(r.status, 200);
    http_resp_free(&r);
    CHECK_EQ_INT(ts_stop(&s), 0);
    pthread_mutex_destroy(&L.mu);
}

/* ---------------------------------------------------------------- the chat page */

TEST(server_chat_page_in_headless_chromium) {
    if (!have_node_modules("puppeteer-core")) return;
    if (access("/usr/bin/chromium", X_OK) != 0) {
        test_failf(__FILE__, __LINE__, "/usr/bin/chromium missing: run scripts/install-deps.sh (Debian's chromium)");
        return;
    }
    test_server s;
    REQUIRE(ts_start(&s, test_shared(TINY), "--parallel 2 --chat-template chatml --threads 1", NULL));
    REQUIRE(ts_wait_ready(&s, 60000));
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "node tests/server/chat_page.cjs %d build/server-chat-page.png %s/chromium 2>&1", s.port,
             test_tmpdir());
    int rc = test_run_cmd(cmd, &out);
    CHECKF(rc == 0, "the chat page script failed (%d):\n%s", rc, out ? out : "");
    json_t *j = out ? json_loads(out, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    const char *answer = json_string_value(json_object_get(j, "answer"));
    const char *stats = json_string_value(json_object_get(j, "stats"));
    CHECKF(answer && strlen(answer) > 0, "no answer on the page: %s", out ? out : "");
    CHECKF(stats && strstr(stats, "time to first token") && strstr(stats, "tokens/s"), "no timing line: %s", out ? out : "");
    struct stat st;
    CHECKF(stat("build/server-chat-page.png", &st) == 0 && st.st_size > 1000, "no screenshot");
    json_decref(j);
    free(out);
    CHECK_EQ_INT(ts_stop(&s), 0);
}
