/*
 * cmd_run.c — `kiln run`: open a model and a session, generate from a prompt, stream the text, then
 * print every phase's time (and with --rounds the first-call penalty), or all of it as JSON.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_report.h"

static const char *usage_text =
    "usage: kiln run -m MODEL [-p PROMPT | -f FILE] [options]\n"
    "Generates text from PROMPT (default: start from BOS) and prints it as it is produced; the phase\n"
    "timings go to stderr after the run.\n"
    "  -m, --model FILE        GGUF model\n"
    "  -p, --prompt TEXT       prompt text\n"
    "  -f, --file FILE         read the prompt from FILE (- : standard input)\n"
    "  -n, --n-predict N       tokens to generate (default 128; -1: until end-of-generation or a full\n"
    "                          context); stops earlier at end-of-generation\n"
    "      --temp T            temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K           top-k (default 40; 0 = off)\n"
    "      --top-p P           top-p (default 0.95; 1 = off)\n"
    "      --min-p M           min-p (default 0.05; 0 = off)\n"
    "      --repeat-penalty R  repetition penalty (default 1.0 = off)\n"
    "      --repeat-last-n N   window of the repetition penalty (default 64)\n"
    "      --seed S            RNG seed (default or -1: random, printed with the timings)\n"
    "      --ctx N             context length (default min(model context, 4096))\n"
    "      --threads N         CPU threads (default: all cores)\n"
    "      --device D          cpu, cuda or auto (default auto: cuda when a GPU is present)\n"
    "      --rounds R          generate R times in one process and print the first-call penalty\n"
    "      --ignore-eos        do not stop at end-of-generation tokens\n"
    "      --no-warm           skip the warm pass of session open (to measure what it buys)\n"
    "      --strict            refuse a model file with tensors its architecture does not use\n"
    "      --chat              treat the prompt as one user turn of a chat (the model's chat template)\n"
    "      --system TEXT       with --chat: a system message\n"
    "      --chat-template T   with --chat: a built-in template (chatml, llama2, llama3, ...) or a file\n"
    "      --json              print the text, the prompt and generated token ids, every phase and\n"
    "                          the counters as one JSON object\n"
    "  -h, --help              this help\n"
    "Every long option also takes its value as --option=VALUE.\n";

typedef struct run_opts {
    const char *model, *prompt, *prompt_file, *system, *chat_template;
    kiln_device device;
    bool chat;
    long n_predict, ctx, threads, rounds;
    bool json, ignore_eos, no_warm, seed_given, strict;
    kiln_sampler_params sp;
} run_opts;

static int parse(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->rounds = 1;
    o->sp = kiln_sampler_defaults();
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        bool err = false;
        int rc;
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(usage_text, stdout); exit(0); }
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = true;
        else if (!strcmp(a, "--no-warm")) o->no_warm = true;
        else if (!strcmp(a, "--strict")) o->strict = true;
        else if (!strcmp(a, "--chat")) o->chat = true;
        else if (cli_opt(argc, argv, &i, "--system", &v, &err)) { if (!err) o->system = v; }
        else if (cli_opt(argc, argv, &i, "--chat-template", &v, &err)) { if (!err) o->chat_template = v; }
        else if (cli_opt(argc, argv, &i, "-m", &v, &err) || cli_opt(argc, argv, &i, "--model", &v, &err)) { if (!err) o->model = v; }
        else if (cli_opt(argc, argv, &i, "-p", &v, &err) || cli_opt(argc, argv, &i, "--prompt", &v, &err)) { if (!err) o->prompt = v; }
        else if (cli_opt(argc, argv, &i, "-f", &v, &err) || cli_opt(argc, argv, &i, "--file", &v, &err)) { if (!err) o->prompt_file = v; }
        else if (cli_opt(argc, argv, &i, "--device", &v, &err)) { if (!err && !cli_parse_device("run", v, &o->device)) return 2; }
        else if (cli_opt(argc, argv, &i, "-n", &v, &err) || cli_opt(argc, argv, &i, "--n-predict", &v, &err)) {
            if (!err && !cli_parse_n_predict("run", "-n", v, &o->n_predict)) return 2;
        } else if (cli_opt(argc, argv, &i, "--ctx", &v, &err)) {
            if (!err && !cli_parse_int("run", a, v, 1, 1 << 20, &o->ctx)) return 2;
        } else if (cli_opt(argc, argv, &i, "--threads", &v, &err)) {
            if (!err && !cli_parse_int("run", a, v, 1, 1024, &o->threads)) return 2;
        } else if (cli_opt(argc, argv, &i, "--rounds", &v, &err)) {
            if (!err && !cli_parse_int("run", a, v, 1, 1000, &o->rounds)) return 2;
        } else if ((rc = cli_sampler_opt("run", argc, argv, &i, &o->sp, &o->seed_given)) != 0) {
            if (rc == 2) return 2;
        } else {
            return cli_usage_error("run", usage_text, "unknown option '%s'", a);
        }
        if (err) return 2;
    }
    if (!o->model) return cli_usage_error("run", usage_text, "a model is required (-m MODEL.gguf)");
    if (o->prompt && o->prompt_file) return cli_usage_error("run", usage_text, "give either -p or -f, not both");
    if ((o->system || o->chat_template) && !o->chat)
        return cli_usage_error("run", usage_text, "--system and --chat-template need --chat");
    if (!o->seed_given) o->sp.seed = cli_random_seed();
    return 0;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    char *prompt_buf = NULL;
    const char *prompt = o.prompt ? o.prompt : "";
    size_t prompt_len = strlen(prompt);
    if (o.prompt_file) {
        prompt_buf = cli_read_file("run", o.prompt_file, &prompt_len);
        if (!prompt_buf) return 1;
        prompt = prompt_buf;
    }
    run_setup setup = {
        .model_path = o.model, .prompt = prompt, .prompt_len = prompt_len, .n_predict = (int)o.n_predict,
        .rounds = (int)o.rounds, .json = o.json, .ignore_eos = o.ignore_eos, .sampler = o.sp,
        .chat = o.chat, .system = o.system, .chat_template = o.chat_template, .mopt.strict = o.strict,
    };
    setup.sopt.n_ctx = (int)o.ctx;
    setup.sopt.n_threads = (int)o.threads;
    setup.sopt.no_warm = o.no_warm;
    setup.sopt.device = o.device;
    rc = run_generate(&setup);
    free(prompt_buf);
    return rc;
}
