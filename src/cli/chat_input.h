/* chat_input.h — the user's lines for `kiln chat`: line editing and history through libedit when stdin
 * is a terminal, plain reads otherwise; Ctrl-C as a flag that the reply loop polls. */
#ifndef KILN_CLI_CHAT_INPUT_H
#define KILN_CLI_CHAT_INPUT_H

#include <stdbool.h>

typedef enum chat_in {
    CHAT_IN_LINE,        /* *line holds a line (malloc'd, without the newline) */
    CHAT_IN_EOF,         /* Ctrl-D or the end of piped input */
    CHAT_IN_CANCEL,      /* Ctrl-C after something was typed: the line is dropped, ask again */
    CHAT_IN_QUIT,        /* Ctrl-C at an empty prompt */
} chat_in;

/* Installs the SIGINT handler (no SA_RESTART, so a blocked read returns) and, when tty, sets up libedit. */
void chat_input_open(bool tty);
/* Restores the previous SIGINT handler. */
void chat_input_close(void);
/* Reads one line; the prompt is shown only on a terminal. */
chat_in chat_input_read(char **line);
/* True once Ctrl-C was pressed since the last chat_input_clear (async-signal-safe flag). */
bool chat_input_interrupted(void);
void chat_input_clear(void);

#endif
