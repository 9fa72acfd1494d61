/* main.c — the `kiln` command: dispatches to a subcommand. */
#include "cli/cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const struct { const char *name; int (*fn)(int, char **); const char *help; } commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"chat", cmd_chat, "talk with a chat model in the terminal"},
    {"inspect", cmd_inspect, "print a GGUF file's metadata and tensors"},
    {"tokenize", cmd_tokenize, "print the tokens of a text"},
    {"template", cmd_template, "render a chat template for a conversation"},
    {"quantize", cmd_quantize, "requantize a model to another type"},
    {"mkmodel", cmd_mkmodel, "write a real-shaped model with random weights"},
    {"bench", cmd_bench, "measure open, prefill and decode"},
    {"info", cmd_info, "print build, CPU and GPU facts"},
};

static void usage(FILE *f) {
    fprintf(f, "kiln %s — LLM inference for GGUF models; the first token costs what a later one does.\n\n"
               "usage: kiln COMMAND [options]   (kiln COMMAND --help for each)\n\ncommands:\n",
            KILN_VERSION_STRING);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

/* Output that could not be written (a full disk, a closed pipe) fails the command, whichever it was. */
static int finish(int rc) {
    if ((fflush(stdout) != 0 || ferror(stdout)) && rc == 0) {
        fprintf(stderr, "kiln: cannot write the output: %s\n", errno ? strerror(errno) : "write error");
        rc = 1;
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) { usage(stdout); return 0; }
    if (!strcmp(argv[1], "--version")) { printf("kiln %s\n", KILN_VERSION_STRING); return 0; }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return finish(commands[i].fn(argc - 1, argv + 1));
    fprintf(stderr, "kiln: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
