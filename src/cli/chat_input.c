/*
 * chat_input.c — reading the user's lines for `kiln chat` (see chat_input.h).
 *
 * On a terminal the line comes from libedit's readline(): arrow keys, history (of this session) and
 * Ctrl-R search. Its character reader is replaced by one that gives up when Ctrl-C arrived, so readline
 * returns at once; the number of bytes typed on the line tells a Ctrl-C that discards a line from one at
 * an empty prompt. Piped input is read with getline exactly as before (no prompt, no editing).
 * Without libedit's header (e.g. a cross build) the terminal is read with getline too.
 */
#include "cli/chat_input.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if !defined(KILN_NO_EDITLINE) && defined(__has_include)
#if __has_include(<editline/readline.h>)
#include <editline/readline.h>
#define CHAT_HAVE_EDITLINE 1
#endif
#endif

static volatile sig_atomic_t g_sigint;
static struct sigaction g_old;
static bool g_tty;
#ifdef CHAT_HAVE_EDITLINE
static size_t g_typed;   /* bytes read on the current line (terminal) */
#endif

static void on_sigint(int sig) {
    (void)sig;
    g_sigint = 1;
}

bool chat_input_interrupted(void) { return g_sigint != 0; }
void chat_input_clear(void) { g_sigint = 0; }

#ifdef CHAT_HAVE_EDITLINE
/* readline's character reader: a byte, or EOF at the end of input or once Ctrl-C was pressed. */
static int read_char(FILE *f) {
    for (;;) {
        if (g_sigint) return EOF; /* a Ctrl-C that came before this read (it would not interrupt it) */
        unsigned char ch;
        ssize_t n = read(fileno(f), &ch, 1);
        if (n == 1) {
            g_typed++;
            return ch;
        }
        if (n < 0 && errno == EINTR && !g_sigint) continue;
        return EOF;
    }
}
#endif

void chat_input_open(bool tty) {
    g_tty = tty;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, &g_old);
#ifdef CHAT_HAVE_EDITLINE
    if (tty) {
        rl_catch_signals = 0;
        rl_getc_function = read_char;
        rl_instream = stdin;
        rl_outstream = stderr;   /* the prompt and the echo; replies go to stdout */
        using_history();
    }
#endif
}

void chat_input_close(void) { sigaction(SIGINT, &g_old, NULL); }

static chat_in read_plain(char **line) {
    size_t cap = 0;
    *line = NULL;
    if (g_tty) fputs("> ", stderr);
    ssize_t got = getline(line, &cap, stdin);
    if (got < 0) {
        free(*line);
        *line = NULL;
        if (g_sigint) {
            clearerr(stdin);
            chat_input_clear();
            return CHAT_IN_QUIT;
        }
        return CHAT_IN_EOF;
    }
    while (got > 0 && ((*line)[got - 1] == '\n' || (*line)[got - 1] == '\r')) (*line)[--got] = '\0';
    return CHAT_IN_LINE;
}

chat_in chat_input_read(char **line) {
    *line = NULL;
#ifdef CHAT_HAVE_EDITLINE
    if (g_tty) {
        g_typed = 0;
        char *l = readline("> ");
        if (g_sigint) {
            free(l);
            chat_input_clear();
            fputs("^C\n", stderr);
            return g_typed > 0 ? CHAT_IN_CANCEL : CHAT_IN_QUIT;
        }
        if (!l) return CHAT_IN_EOF;
        if (l[0]) add_history(l);
        *line = l;
        return CHAT_IN_LINE;
    }
#endif
    return read_plain(line);
}
