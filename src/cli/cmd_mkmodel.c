/* cmd_mkmodel.c — `kiln mkmodel` (placeholder until its issue lands). */
#include "cli/cli.h"

int cmd_mkmodel(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not built yet");
}
