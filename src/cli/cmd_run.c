/* cmd_run.c — `kiln run` (placeholder until its issue lands). */
#include "cli/cli.h"

int cmd_run(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not built yet");
}
