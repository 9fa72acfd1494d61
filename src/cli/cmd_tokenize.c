/*
 * cmd_tokenize.c — `kiln tokenize`: prints the tokens of a text for any GGUF with a tokenizer (full models and
 * vocabulary-only files alike; only the metadata is read).
 */
#include "cli/cli.h"

#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

static const char usage_text[] =
    "usage: kiln tokenize -m MODEL (-p TEXT | -f FILE) [--ids] [--no-bos] [--parse-special]\n"
    "\n"
    "Prints the tokens of TEXT (or of FILE's contents), one per line: the id, a tab and the piece the token\n"
    "decodes to as a JSON string (control tokens show their text).\n"
    "\n"
    "  -m MODEL          a GGUF file with tokenizer metadata (a vocabulary-only file is enough)\n"
    "  -p TEXT           the text to tokenize\n"
    "  -f FILE           read the text from FILE\n"
    "  --ids             print only a JSON array of the ids\n"
    "  --no-bos          do not prepend BOS (by default it is added when the vocabulary asks for it)\n"
    "  --parse-special   turn special-token text (e.g. <|im_start|>) into those tokens\n"
    "  -h, --help        this help\n";

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = argv[0];
    const char *model = NULL, *prompt = NULL, *file = NULL;
    bool ids_only = false, no_bos = false, parse_special = false, err = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (cli_opt(argc, argv, &i, "-m", &model, &err) || cli_opt(argc, argv, &i, "-p", &prompt, &err) ||
            cli_opt(argc, argv, &i, "-f", &file, &err)) {
            if (err) return 2;   /* cli_opt printed which option lacks its value */
            continue;
        }
        if (!strcmp(a, "--ids")) ids_only = true;
        else if (!strcmp(a, "--no-bos")) no_bos = true;
        else if (!strcmp(a, "--parse-special")) parse_special = true;
        else return cli_usage_error(cmd, usage_text, "unknown option '%s'", a);
    }
    if (!model) return cli_usage_error(cmd, usage_text, "-m MODEL is required");
    if (!prompt == !file) return cli_usage_error(cmd, usage_text, "give exactly one of -p TEXT and -f FILE");

    char *text_buf = NULL;
    size_t len;
    const char *text;
    if (file) {
        text_buf = cli_read_file(cmd, file, &len);
        if (!text_buf) return 1;
        text = text_buf;
    } else {
        text = prompt;
        len = strlen(prompt);
    }

    gguf_file *f = NULL;
    kiln_tokenizer *t = NULL;
    int32_t *ids = NULL;
    int rc = 1;
    kiln_status st = gguf_open(model, &f);
    if (st == KILN_OK) st = kiln_tokenizer_open(f, &t);
    if (st != KILN_OK) {
        cli_error(cmd, "%s: %s", model, kiln_last_error());
        goto out;
    }
    int flags = (no_bos ? 0 : KILN_TOK_ADD_BOS) | (parse_special ? KILN_TOK_PARSE_SPECIAL : 0);
    size_t cap = len + 16, n = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        free(ids);
        ids = malloc(cap * sizeof *ids);
        if (!ids) {
            cli_error(cmd, "out of memory");
            goto out;
        }
        st = kiln_tokenizer_encode(t, text, len, flags, ids, cap, &n);
        if (st == KILN_OK || n <= cap) break;
        cap = n;
    }
    if (st != KILN_OK) {
        cli_error(cmd, "%s", kiln_last_error());
        goto out;
    }
    if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
        puts("]");
    } else {
        size_t piece_cap = kiln_tokenizer_max_piece_len(t) + 1;
        char *piece = malloc(piece_cap);
        if (!piece) {
            cli_error(cmd, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            printf("%d\t", (int)ids[i]);
            if (kiln_tokenizer_is_control(t, ids[i])) {
                gguf_str s = kiln_tokenizer_token_text(t, ids[i]);
                cli_json_str(stdout, s.ptr, (size_t)s.len);
            } else {
                size_t pn = kiln_tokenizer_piece(t, ids[i], piece, piece_cap);
                cli_json_str(stdout, piece, pn < piece_cap ? pn : piece_cap);
            }
            putchar('\n');
        }
        free(piece);
    }
    rc = 0;
out:
    free(ids);
    kiln_tokenizer_close(t);
    gguf_close(f);
    free(text_buf);
    return rc;
}
