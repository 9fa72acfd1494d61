/* cmd_template.c — `kiln template` (placeholder until its issue lands). */
#include "cli/cli.h"

int cmd_template(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not built yet");
}
