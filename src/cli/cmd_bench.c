/* cmd_bench.c — `kiln bench` (placeholder until its issue lands). */
#include "cli/cli.h"

int cmd_bench(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not built yet");
}
