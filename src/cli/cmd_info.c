/* cmd_info.c — `kiln info` (placeholder until its issue lands). */
#include "cli/cli.h"

int cmd_info(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not built yet");
}
