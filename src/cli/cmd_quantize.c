/* cmd_quantize.c — `kiln quantize` (placeholder until its issue lands). */
#include "cli/cli.h"

int cmd_quantize(int argc, char **argv) {
    (void)argc;
    return cli_error(argv[0], "not built yet");
}
