/* cmd_inspect.c — `kiln inspect` (placeholder until its issue lands). */
#include "cli/cli.h"

int cmd_inspect(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not built yet");
}
