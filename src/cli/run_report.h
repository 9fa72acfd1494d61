/* run_report.h — the generation loop shared by `kiln run` and `kiln bench`, with its timing report. */
#ifndef KILN_CLI_RUN_REPORT_H
#define KILN_CLI_RUN_REPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "kiln.h"

typedef struct run_setup {
    const char *model_path;
    const char *prompt;        /* plain text, or an already rendered chat prompt when parse_special */
    size_t prompt_len;
    bool parse_special;        /* tokenize special-token strings */
    bool chat;                 /* prompt is one user turn: render it with the chat template */
    const char *system;        /* chat: optional system message */
    const char *chat_template; /* chat: a built-in name or a file overriding the model's template */
    int n_predict;             /* tokens to generate; -1: until end of generation or a full context */
    int rounds;
    bool json, ignore_eos, quiet;
    kiln_sampler_params sampler;
    kiln_session_options sopt;
    kiln_model_options mopt;
} run_setup;

/* Opens the model and a session, generates `rounds` times (KV reset between rounds), streams the text
 * of each round to stdout (unless json/quiet) and prints the timings to stderr (with json: one object
 * on stdout, the prompt's and each round's generated token ids included). A failed write of stdout stops
 * the run with a message. Returns an exit code. */
int run_generate(const run_setup *s);

#endif
