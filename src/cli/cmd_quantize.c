/* cmd_quantize.c — `kiln quantize IN.gguf OUT.gguf TYPE`: requantizes a model's weight matrices. */
#include "cli/cli.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "formats/formats.h"
#include "tools/quantize.h"

static const char usage[] =
    "usage: kiln quantize [--threads N] [--quiet] [--pure] [--output-type T] [--embd-type T] IN.gguf OUT.gguf TYPE\n"
    "\n"
    "Rewrites IN with its weight matrices converted to TYPE, following llama-quantize's rules (no\n"
    "importance matrix): norms and other 1-D tensors are copied unchanged; with a quantized TYPE other\n"
    "than Q8_0 the output matrix (or the token embedding when it doubles as the output) becomes Q6_K;\n"
    "the K mixes (_S/_M/_L) raise attn_v, ffn_down and attn_output; a matrix whose rows do not fit the\n"
    "type's block falls back to a compatible type (reported). All metadata is copied and\n"
    "general.file_type is set. IN may be F32, F16, BF16 or already quantized (requantizing is reported).\n"
    "OUT is written as OUT.tmp and renamed at the end; OUT must not be IN.\n"
    "\n"
    "  TYPE          F32 F16 BF16 Q8_0 Q5_1 Q5_0 Q4_1 Q4_0 Q6_K Q5_K_M Q5_K_S Q4_K_M Q4_K_S Q3_K_L\n"
    "                Q3_K_M Q3_K_S Q2_K (Q4_K = Q4_K_M, Q5_K = Q5_K_M, Q3_K = Q3_K_M; any case)\n"
    "  --threads N   conversion threads, 1..64 (default: KILN_THREADS or all CPUs)\n"
    "  --quiet       no per-tensor progress or summary\n"
    "  --pure        no mixes: every matrix gets TYPE (rows that do not fit its block still fall back)\n"
    "  --output-type T  type of output.weight (or of the token embedding when it doubles as the output):\n"
    "                f32 f16 bf16 q8_0 q5_1 q5_0 q4_1 q4_0 q6_K q5_K q4_K q3_K q2_K\n"
    "  --embd-type T    type of token_embd.weight (same types)\n";

/* A tensor type kiln can write, by name; -1 when unknown or not writable. */
static int writable_type(const char *name) {
    static const char *const ok[] = {"f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0",
                                     "q6_K", "q5_K", "q4_K", "q3_K", "q2_K"};
    const int t = kiln_type_from_name(name);
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (t >= 0 && kiln_type_from_name(ok[i]) == t) return t;
    return -1;
}

/* The temporary file of the run in progress, removed when the run is interrupted. */
static char interrupted_tmp[4096];

static void on_signal(int sig) {
    if (interrupted_tmp[0]) unlink(interrupted_tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

int cmd_quantize(int argc, char **argv) {
    const char *cmd = argv[0], *val = NULL;
    const char *pos[3] = {NULL, NULL, NULL};
    int n_pos = 0;
    long threads = 0;
    bool quiet = false, pure = false, err = false;
    int output_type = -1, embd_type = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(usage, stdout); return 0; }
        if (!strcmp(argv[i], "--quiet")) { quiet = true; continue; }
        if (!strcmp(argv[i], "--pure")) { pure = true; continue; }
        if (cli_opt(argc, argv, &i, "--output-type", &val, &err)) {
            if (err) return 2;
            if ((output_type = writable_type(val)) < 0)
                return cli_usage_error(cmd, usage, "--output-type: unknown or unwritable type '%s'", val);
            continue;
        }
        if (cli_opt(argc, argv, &i, "--embd-type", &val, &err)) {
            if (err) return 2;
            if ((embd_type = writable_type(val)) < 0)
                return cli_usage_error(cmd, usage, "--embd-type: unknown or unwritable type '%s'", val);
            continue;
        }
        if (cli_opt(argc, argv, &i, "--threads", &val, &err)) {
            if (err || !cli_parse_int(cmd, "--threads", val, 1, 64, &threads)) return 2;
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error(cmd, usage, "unknown option '%s'", argv[i]);
        if (n_pos == 3) return cli_usage_error(cmd, usage, "unexpected argument '%s'", argv[i]);
        pos[n_pos++] = argv[i];
    }
    if (n_pos < 3) return cli_usage_error(cmd, usage, "expected IN.gguf OUT.gguf TYPE");
    const kiln_quant_target *target = kiln_quant_find_target(pos[2]);
    if (!target) return cli_usage_error(cmd, usage, "TYPE: unknown type '%s'", pos[2]);
    if (!cli_check_output_dir(cmd, pos[1])) return 1;
    if (!threads) threads = kiln_env_threads() > 64 ? 64 : kiln_env_threads();
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (n > 64 ? 64 : n) : 1;
    }
    if (strlen(pos[1]) + 5 > sizeof interrupted_tmp) return cli_usage_error(cmd, usage, "OUT: path too long");
    snprintf(interrupted_tmp, sizeof interrupted_tmp, "%s.tmp", pos[1]);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    kiln_quantize_options o = {.in_path = pos[0], .out_path = pos[1], .target = target, .n_threads = (int)threads,
                               .progress = quiet ? NULL : stderr, .pure = pure,
                               .set_output_type = output_type >= 0, .output_type = (kiln_type)(output_type >= 0 ? output_type : 0),
                               .set_embd_type = embd_type >= 0, .embd_type = (kiln_type)(embd_type >= 0 ? embd_type : 0)};
    kiln_quantize_report rep;
    kiln_status st = kiln_quantize_file(&o, &rep);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    interrupted_tmp[0] = 0;
    if (st != KILN_OK) return cli_error(cmd, "%s", kiln_last_error());
    if (quiet) return 0;
    return 0;
}
