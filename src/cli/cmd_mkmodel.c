/* cmd_mkmodel.c — `kiln mkmodel`: writes a real-shaped GGUF with deterministic random weights. */
#include "cli/cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "tools/mkmodel.h"

static const char usage[] =
    "usage: kiln mkmodel --shape NAME --type TYPE --vocab FILE -o OUT.gguf [--seed N] [--threads N]\n"
    "       kiln mkmodel --list-shapes\n"
    "\n"
    "Writes a GGUF with the shape of a published model (hyperparameters and tensor layout as llama.cpp's\n"
    "files have them) and random weights drawn deterministically from the seed: normal with std 0.02 for\n"
    "embeddings and projections, 1.0 for norms. The same seed gives the same bytes on every machine.\n"
    "\n"
    "  --shape NAME     the architecture's shape (see --list-shapes)\n"
    "  --type TYPE      weight type of the matrices: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K\n"
    "                   q6_K; norms stay f32; with a quantized type other than q8_0 the output matrix is q6_K;\n"
    "                   rows that do not fit the type's block fall back (reported)\n"
    "  --vocab FILE     the tokenizer: a .gguf (every tokenizer.* key is copied), or a Hugging Face\n"
    "                   tokenizer.json / a directory holding one (tokenizer_config.json and config.json beside\n"
    "                   it are read too); the model's vocabulary size is the tokenizer's\n"
    "  -o, --out FILE   output path (written as FILE.tmp, then renamed)\n"
    "  --seed N         random seed (default 1)\n"
    "  --threads N      generator threads (default: all CPUs)\n"
    "  --layers N       override the layer count (for tests and quick experiments)\n"
    "  --expert-codes   mixture-of-experts shapes: the expert tensors get random codes with fixed scales\n"
    "                   instead of quantized normal values (~50x faster; types q4_0, q8_0, q4_K; for speed\n"
    "                   measurements of the largest shapes, e.g. qwen3-30b-a3b on a slow machine)\n"
    "  --list-shapes    print the shapes and exit\n"
    "  --quiet          no progress output\n";

static void list_shapes(void) {
    int n;
    const kiln_mk_shape *s = kiln_mk_shapes(&n);
    printf("%-16s %-6s %6s %6s %5s %4s %8s %6s %7s %8s %10s %7s %s\n", "shape", "arch", "layers", "embd", "heads", "kv",
           "head_dim", "ffn", "vocab", "ctx", "rope_base", "rms_eps", "output");
    for (int i = 0; i < n; i++) {
        if (s[i].hidden) continue;
        printf("%-16s %-6s %6d %6d %5d %4d %8d %6d %7d %8d %10.0f %7.0e %s\n", s[i].name, s[i].arch, s[i].n_layer,
               s[i].n_embd, s[i].n_head, s[i].n_head_kv, s[i].head_dim, s[i].n_ff, s[i].n_vocab, s[i].n_ctx,
               (double)s[i].rope_base, (double)s[i].rms_eps, s[i].tied ? "tied" : "separate");
    }
}

int cmd_mkmodel(int argc, char **argv) {
    const char *cmd = argv[0];
    const char *shape = NULL, *type_name = NULL, *vocab = NULL, *out = NULL, *val = NULL;
    long threads = 0, layers = 0;
    unsigned long long seed = 1;
    bool quiet = false, err = false, expert_codes = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(usage, stdout); return 0; }
        if (!strcmp(argv[i], "--list-shapes")) { list_shapes(); return 0; }
        if (!strcmp(argv[i], "--quiet")) { quiet = true; continue; }
        if (!strcmp(argv[i], "--expert-codes")) { expert_codes = true; continue; }
        if (cli_opt(argc, argv, &i, "--shape", &shape, &err)) { if (err) return 2; continue; }
        if (cli_opt(argc, argv, &i, "--type", &type_name, &err)) { if (err) return 2; continue; }
        if (cli_opt(argc, argv, &i, "--vocab", &vocab, &err)) { if (err) return 2; continue; }
        if (cli_opt(argc, argv, &i, "-o", &out, &err) || cli_opt(argc, argv, &i, "--out", &out, &err)) {
            if (err) return 2;
            continue;
        }
        if (cli_opt(argc, argv, &i, "--seed", &val, &err)) {
            if (err) return 2;
            char *end;
            errno = 0;
            seed = strtoull(val, &end, 10);
            if (!*val || *val == '-' || *end || errno)
                return cli_usage_error(cmd, usage, "--seed: expected a non-negative integer, got '%s'", val);
            continue;
        }
        if (cli_opt(argc, argv, &i, "--threads", &val, &err)) {
            if (err || !cli_parse_int(cmd, "--threads", val, 1, 256, &threads)) return 2;
            continue;
        }
        if (cli_opt(argc, argv, &i, "--layers", &val, &err)) {
            if (err || !cli_parse_int(cmd, "--layers", val, 1, 512, &layers)) return 2;
            continue;
        }
        return cli_usage_error(cmd, usage, "unknown option '%s'", argv[i]);
    }
    if (!shape) return cli_usage_error(cmd, usage, "--shape is required (see --list-shapes)");
    if (!kiln_mk_find_shape(shape)) return cli_usage_error(cmd, usage, "--shape: unknown shape '%s' (see --list-shapes)", shape);
    if (!type_name) return cli_usage_error(cmd, usage, "--type is required");
    int type = kiln_type_from_name(type_name);
    if (type < 0) return cli_usage_error(cmd, usage, "--type: unknown type '%s'", type_name);
    if (!vocab) return cli_usage_error(cmd, usage, "--vocab is required");
    if (!out) return cli_usage_error(cmd, usage, "-o is required");
    if (!cli_check_output_dir(cmd, out)) return 1;

    kiln_mk_opts o = {.shape = shape, .type = (uint32_t)type, .vocab = vocab, .seed = seed, .out = out,
                      .n_layer = (int)layers, .n_threads = (int)threads, .progress = quiet ? NULL : stderr,
                      .expert_codes = expert_codes};
    kiln_mk_result r;
    kiln_status st = kiln_mkmodel(&o, &r);
    if (st == KILN_ERR_INVALID_ARG) return cli_usage_error(cmd, usage, "%s", kiln_last_error());
    if (st != KILN_OK) return cli_error(cmd, "%s", kiln_last_error());
    fprintf(stderr, "mkmodel: wrote %s: %d tensors, %.1fM params, vocab %u, %.1f MB (%llu bytes) in %.1f s\n", out,
            r.n_tensors, (double)r.n_params / 1e6, r.n_vocab, (double)r.file_bytes / 1e6,
            (unsigned long long)r.file_bytes, r.seconds);
    return 0;
}
