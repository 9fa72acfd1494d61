/*
 * test_cli_chat.c — `kiln chat` as people use it (the ASan-built CLI): piped turns with the statistics
 * line (and --quiet), a context too small for the conversation (the oldest turns are dropped and the chat
 * goes on), and Ctrl-C in a pseudo-terminal (the reply stops, the prompt returns, the next message is
 * answered; Ctrl-C with typed text drops the text; Ctrl-C at an empty prompt ends the chat).
 */
#include "test.h"

#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Runs `kiln chat` with input on stdin; stdout and stderr go to separate strings. */
static int chat_cmd(const char *input, const char *args, char **out, char **err) {
    char cmd[2048], errpath[512];
    snprintf(errpath, sizeof errpath, "%s/chat_err.txt", test_tmpdir());
    snprintf(cmd, sizeof cmd, "printf '%s' | %s chat %s 2>%s", input, test_kiln_bin(), args, errpath);
    int rc = test_run_cmd(cmd, out);
    *err = test_read_file(errpath, NULL);
    return rc;
}

TEST(cli_chat_piped_turns_and_stats_line) {
    const char *model = test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf");
    char args[1024], *out = NULL, *err = NULL;
    snprintf(args, sizeof args, "-m %s --chat-template chatml -n 12 --temp 0", model);
    CHECK_EQ_INT(chat_cmd("Tell me a story.\\nAnd then?\\n", args, &out, &err), 0);
    REQUIRE(out && err);
    CHECKF(strlen(out) > 20, "expected two replies on stdout:\n%s", out);
    CHECKF(count_of(err, "[12 tokens, first token ") == 2 && count_of(err, " tokens/s]\n") == 2,
           "expected one statistics line per reply on stderr:\n%s", err);
    char *replies = out;
    free(err);
    snprintf(args, sizeof args, "-m %s --chat-template chatml -n 12 --temp 0 --quiet", model);
    CHECK_EQ_INT(chat_cmd("Tell me a story.\\nAnd then?\\n", args, &out, &err), 0);
    REQUIRE(out && err);
    CHECKF(!strcmp(out, replies), "the replies differ with --quiet:\n%s", out);
    CHECKF(!strstr(err, "tokens"), "--quiet still printed statistics:\n%s", err);
    free(replies);
    free(out);
    free(err);
    /* --verbose: the prompt ids of each turn */
    snprintf(args, sizeof args, "-m %s --chat-template chatml -n 4 --temp 0 --verbose --quiet", model);
    CHECK_EQ_INT(chat_cmd("Hi\\nAgain\\n", args, &out, &err), 0);
    CHECKF(err && count_of(err, "kiln chat: prompt ") == 2 && strstr(err, "reused from the cache): [1,"), "%s", err ? err : "");
    free(out);
    free(err);
}

TEST(cli_chat_full_context_drops_oldest_turns) {
    const char *model = test_shared("models/tinystories-656K/TinyStories-656K-Q8_0.gguf");
    char args[1024], *out = NULL, *err = NULL;
    snprintf(args, sizeof args, "-m %s --chat-template chatml --ctx 64 -n 8 --temp 0 --system 'Be kind.'", model);
    CHECK_EQ_INT(chat_cmd("Tell me a story.\\nmore\\nmore\\nmore\\nThe end?\\n", args, &out, &err), 0);
    REQUIRE(out && err);
    CHECKF(count_of(err, "[8 tokens") == 5, "expected five replies of 8 tokens (the chat goes on):\n%s", err);
    CHECKF(strstr(err, "the context (64 tokens) is full: dropped the 2 oldest messages; the cache is rebuilt"),
           "no note about the dropped turns:\n%s", err);
    free(out);
    free(err);
    /* a message that cannot fit even alone is not sent, and the chat goes on */
    snprintf(args, sizeof args, "-m %s --chat-template chatml --ctx 32 -n 4 --temp 0", model);
    CHECK_EQ_INT(chat_cmd("Once upon a time there was a very long message that does not fit at all in the tiny "
                          "context of this chat, not even alone.\\nHi\\n", args, &out, &err), 0);
    REQUIRE(out && err);
    CHECKF(strstr(err, "it was not sent"), "%s", err);
    CHECKF(count_of(err, "[4 tokens") == 1, "expected the second message to be answered:\n%s", err);
    free(out);
    free(err);
}

/* ---------------------------------------------------------------- Ctrl-C in a terminal */

typedef struct term { int fd; pid_t pid; char buf[1 << 16]; size_t n; } term;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads what the terminal shows for up to secs seconds, until `needle` appears after offset `from`
 * (NULL: until the time is up) or, when grow > 0, until that many bytes came after `from`. */
static bool term_wait(term *t, double secs, size_t from, const char *needle, size_t grow) {
    double end = now_s() + secs;
    for (;;) {
        t->buf[t->n] = 0;
        if (needle && strstr(t->buf + from, needle)) return true;
        if (grow && t->n >= from + grow) return true;
        double left = end - now_s();
        if (left <= 0) return !needle && !grow;
        struct pollfd p = {t->fd, POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        ssize_t r = read(t->fd, t->buf + t->n, sizeof t->buf - 1 - t->n);
        if (r <= 0) { t->buf[t->n] = 0; return needle ? strstr(t->buf + from, needle) != NULL : false; }
        t->n += (size_t)r;
    }
}

static void term_send(term *t, const char *s) { CHECK(write(t->fd, s, strlen(s)) == (ssize_t)strlen(s)); }

/* Waits for the chat to exit (killing it after secs); its exit code, -1 when it had to be killed. */
static int term_exit(term *t, double secs) {
    double end = now_s() + secs;
    int st;
    while (now_s() < end) {
        term_wait(t, 0.1, t->n, NULL, 0);
        if (waitpid(t->pid, &st, WNOHANG) == t->pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    kill(t->pid, SIGKILL);
    waitpid(t->pid, &st, 0);
    return -1;
}

TEST(cli_chat_ctrl_c_stops_the_reply) {
    const char *model = test_shared("models/archs/tiny-qwen2.gguf");
    term *t = calloc(1, sizeof *t);
    REQUIRE(t);
    t->pid = forkpty(&t->fd, NULL, NULL, NULL);
    REQUIRE(t->pid >= 0);
    if (t->pid == 0) {
        /* random weights: replies run until the context is full unless stopped */
        execl(test_kiln_bin(), "kiln", "chat", "-m", model, "--chat-template", "chatml", "--temp", "1", "--seed", "3",
              (char *)NULL);
        _exit(127);
    }
    REQUIRE(term_wait(t, 60, 0, "> ", 0));
    size_t mark = t->n;
    term_send(t, "Hello there\r");
    CHECKF(term_wait(t, 30, mark, "Hello there\r\n", 0), "the line was not echoed:\n%s", t->buf);
    char *echo = strstr(t->buf + mark, "Hello there\r\n");
    size_t start = echo ? (size_t)(echo - t->buf) + 13 : t->n;
    CHECKF(term_wait(t, 30, start, NULL, 40), "no reply started:\n%s", t->buf + mark);
    term_send(t, "\x03");
    CHECKF(term_wait(t, 30, start, "interrupted", 0), "Ctrl-C did not stop the reply:\n%s", t->buf + mark);
    CHECKF(term_wait(t, 10, start, " tokens/s]", 0), "no statistics line after the stopped reply:\n%s", t->buf + mark);
    CHECKF(term_wait(t, 10, start, "\n> ", 0), "the prompt did not return:\n%s", t->buf + mark);
    /* the next message is answered (the conversation goes on), and Ctrl-C stops that reply too */
    mark = t->n;
    term_send(t, "Hi\r");
    CHECKF(term_wait(t, 30, mark, NULL, 60), "the next message was not answered:\n%s", t->buf + mark);
    term_send(t, "\x03");
    CHECKF(term_wait(t, 30, mark, "\n> ", 0), "the prompt did not return after the second reply:\n%s", t->buf + mark);
    /* Ctrl-C with typed text drops the text and asks again; at an empty prompt it ends the chat */
    /* readline puts the terminal in its own mode after printing the prompt; text typed before that sits in the
     * kernel's line buffer, unseen, and a Ctrl-C then flushes it (an empty prompt to kiln): give it time */
    usleep(500 * 1000);
    mark = t->n;
    term_send(t, "abc");
    CHECK(term_wait(t, 10, mark, "abc", 0));
    usleep(200 * 1000);
    term_send(t, "\x03");
    CHECKF(term_wait(t, 10, mark, "\n> ", 0), "Ctrl-C with typed text did not give a new prompt:\n%s", t->buf + mark);
    CHECK(waitpid(t->pid, NULL, WNOHANG) == 0);
    usleep(300 * 1000); /* as above: let readline take the terminal */
    term_send(t, "\x03");
    CHECK_EQ_INT(term_exit(t, 30), 0);
    if (getenv("KILN_TEST_VERBOSE")) printf("%s\n", t->buf);
    close(t->fd);
    free(t);
}
