/*
 * cmd_serve.c — `kiln serve`: parse the options and run the OpenAI-compatible server (src/server).
 */
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "cli/cli.h"
#include "cli/run_report.h"
#include "server/server.h"

static const char *usage_text =
    "usage: kiln serve -m MODEL [options]\n"
    "Serves the model over HTTP with OpenAI's API (/v1/chat/completions, /v1/completions, /v1/models),\n"
    "plus /health, /metrics, /tokenize, /detokenize and a chat page at /. /health answers 503 until the\n"
    "session is open and warm, then 200. SIGINT or SIGTERM stops it (exit 0).\n"
    "  -m, --model FILE        GGUF model\n"
    "      --host ADDR         address to bind (default 127.0.0.1)\n"
    "      --port N            port (default 8080; 0 = any free port, printed)\n"
    "  -np, --parallel N       slots: requests generated together (default 4)\n"
    "      --ctx N             positions per slot (default min(model context, 4096))\n"
    "      --threads N         CPU threads (default: all cores)\n"
    "      --device D          cpu, cuda or auto (default auto)\n"
    "      --api-key KEY       require Authorization: Bearer KEY (default: $KILN_API_KEY, else none)\n"
    "      --chat-template T   a built-in template (chatml, llama2, llama3, ...) or a file, instead of the\n"
    "                          model's tokenizer.chat_template\n"
    "      --alias NAME        the model's id in the API (default: the file name)\n"
    "      --max-queue N       requests waiting for a slot before 503 (default 64)\n"
    "      --max-body BYTES    largest request body (default 1048576; larger: 413)\n"
    "      --timeout S         idle connection timeout and slow-reader limit in seconds (default 600)\n"
    "      --grace S           on SIGINT/SIGTERM, how long running requests may finish (default 5)\n"
    "  -h, --help              this help\n";

static void on_open(const kiln_session *s, unsigned long long open_ns, void *ud) {
    (void)ud;
    const kiln_phase *ph;
    size_t n = kiln_session_open_phases(s, &ph);
    fputs("kiln serve: ", stderr);
    run_print_open(stderr, ph, n, open_ns);
    fputc('\n', stderr);
}

static int parse(int argc, char **argv, srv_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->parallel = 4;
    c->max_queue = 64;
    c->max_body = 1 << 20;
    c->timeout_s = 600;
    c->shutdown_grace_s = 5;
    c->api_key = kiln_env_api_key();
    c->on_open = on_open;
    static const struct { const char *name, *alt; long lo, hi; } ints[] = {
        {"--port", NULL, 0, 65535}, {"--parallel", "-np", 1, 256}, {"--ctx", NULL, 1, 1 << 20},
        {"--threads", NULL, 1, 1024}, {"--max-queue", NULL, 0, 1 << 20}, {"--max-body", NULL, 1, 1L << 34},
        {"--timeout", NULL, 1, 86400}, {"--grace", NULL, 0, 3600},
    };
    for (int i = 1; i < argc; i++) {
        const char *v = NULL, *a = argv[i];
        bool err = false, done = false;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(usage_text, stdout); exit(0); }
        if (cli_opt(argc, argv, &i, "-m", &v, &err) || cli_opt(argc, argv, &i, "--model", &v, &err)) c->model_path = v;
        else if (cli_opt(argc, argv, &i, "--host", &v, &err)) c->host = v;
        else if (cli_opt(argc, argv, &i, "--api-key", &v, &err)) c->api_key = v;
        else if (cli_opt(argc, argv, &i, "--chat-template", &v, &err)) c->chat_template = v;
        else if (cli_opt(argc, argv, &i, "--alias", &v, &err)) c->alias = v;
        else if (cli_opt(argc, argv, &i, "--device", &v, &err)) { if (!err && !cli_parse_device("serve", v, &c->device)) return 2; }
        else {
            for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !done; k++) {
                if (!cli_opt(argc, argv, &i, ints[k].name, &v, &err) &&
                    !(ints[k].alt && cli_opt(argc, argv, &i, ints[k].alt, &v, &err)))
                    continue;
                done = true;
                long x;
                if (err) break;
                if (!cli_parse_int("serve", ints[k].name, v, ints[k].lo, ints[k].hi, &x)) return 2;
                switch (k) {
                case 0: c->port = (int)x; break;
                case 1: c->parallel = (int)x; break;
                case 2: c->n_ctx = (int)x; break;
                case 3: c->n_threads = (int)x; break;
                case 4: c->max_queue = (int)x; break;
                case 5: c->max_body = (size_t)x; break;
                case 6: c->timeout_s = (int)x; break;
                default: c->shutdown_grace_s = (int)x; break;
                }
            }
            if (!done) return cli_usage_error("serve", usage_text, "unknown option '%s'", a);
        }
        if (err) return 2;
    }
    if (!c->model_path) return cli_usage_error("serve", usage_text, "a model is required (-m MODEL.gguf)");
    return 0;
}

int cmd_serve(int argc, char **argv) {
    srv_config c;
    int rc = parse(argc, argv, &c);
    return rc ? rc : srv_run(&c);
}
