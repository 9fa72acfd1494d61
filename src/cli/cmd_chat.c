/* cmd_chat.c — `kiln chat` (placeholder until its issue lands). */
#include "cli/cli.h"

int cmd_chat(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not built yet");
}
