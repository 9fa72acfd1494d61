/*
 * cmd_template.c — `kiln template`: renders a conversation with a chat template and prints the prompt,
 * for checking a template by eye. The template comes from a model (-m: tokenizer.chat_template, and the
 * bos/eos token texts) or from --template (a built-in name or a file); the conversation from a JSON file.
 * --ids prints the prompt's token ids instead, tokenized as kiln_chat_tokenize does (the template's markup
 * gives special tokens, message content never does).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/alloc.h"
#include "cli/cli.h"
#include "gguf/gguf.h"
#include "chat/chat.h"
#include "tokenizer/tokenizer.h"

static const char usage[] =
    "usage: kiln template (-m MODEL.gguf | --template NAME|FILE) --messages FILE.json [options]\n"
    "  Renders a conversation with a chat template and prints the prompt exactly (no newline added).\n"
    "  -m MODEL.gguf            use the model's tokenizer.chat_template and its bos/eos token texts\n"
    "  --template NAME|FILE     a built-in template (chatml, llama2, llama3, mistral, gemma, phi3, zephyr),\n"
    "                           a .jinja file, or a tokenizer_config.json; overrides the model's template\n"
    "  --messages FILE.json     a JSON array of {\"role\", \"content\"} messages, or an object with\n"
    "                           \"messages\" and any other template variables (tools, enable_thinking, ...)\n"
    "  --add-generation-prompt  end with the opening of an assistant turn\n"
    "  --bos TEXT, --eos TEXT   the bos_token/eos_token texts (default: the model's, else empty)\n"
    "  --now SECONDS            the time strftime_now() formats, as UTC (default: the local time now)\n"
    "  --ids                    print the prompt's token ids (a JSON array; needs -m): special tokens come only\n"
    "                           from the template's own markup, message content is tokenized as plain text\n"
    "  --help                   this text\n";

/* The ids of a rendered prompt as one JSON array line. Returns the exit code. */
static int print_ids(const char *cmd, const kiln_tokenizer *tok, const char *text, const uint8_t *mask, size_t len) {
    size_t cap = len + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return cli_error(cmd, "out of memory");
    kiln_status st = kiln_chat_tokenize_marked(tok, text, mask, len, ids, cap, &n);
    if (st == KILN_ERR_INVALID_ARG && n > cap) {
        free(ids);
        cap = n;
        ids = malloc(cap * sizeof *ids);
        if (!ids) return cli_error(cmd, "out of memory");
        st = kiln_chat_tokenize_marked(tok, text, mask, len, ids, cap, &n);
    }
    if (st != KILN_OK) {
        free(ids);
        return cli_error(cmd, "tokenizing the prompt: %s", kiln_last_error());
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
    puts("]");
    free(ids);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : cli_error(cmd, "writing the output failed");
}

int cmd_template(int argc, char **argv) {
    const char *cmd = argv[0];
    const char *model = NULL, *tmpl_arg = NULL, *messages_path = NULL, *bos = NULL, *eos = NULL, *now_s = NULL;
    bool add_gen = false, err = false, want_ids = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(usage, stdout); return 0; }
        if (cli_opt(argc, argv, &i, "-m", &model, &err) || cli_opt(argc, argv, &i, "--model", &model, &err) ||
            cli_opt(argc, argv, &i, "--template", &tmpl_arg, &err) ||
            cli_opt(argc, argv, &i, "--chat-template", &tmpl_arg, &err) ||
            cli_opt(argc, argv, &i, "--messages", &messages_path, &err) || cli_opt(argc, argv, &i, "--bos", &bos, &err) ||
            cli_opt(argc, argv, &i, "--eos", &eos, &err) || cli_opt(argc, argv, &i, "--now", &now_s, &err)) {
            if (err) { fputs(usage, stderr); return 2; }
            continue;
        }
        if (!strcmp(argv[i], "--add-generation-prompt")) { add_gen = true; continue; }
        if (!strcmp(argv[i], "--ids")) { want_ids = true; continue; }
        return cli_usage_error(cmd, usage, "unknown option '%s'", argv[i]);
    }
    if (!model && !tmpl_arg) return cli_usage_error(cmd, usage, "give -m MODEL or --template NAME|FILE");
    if (!messages_path) return cli_usage_error(cmd, usage, "--messages FILE.json is required");
    if (want_ids && !model) return cli_usage_error(cmd, usage, "--ids needs -m MODEL (its vocabulary)");
    long now = 0;
    if (now_s && !cli_parse_int(cmd, "--now", now_s, 1, 253402300799L, &now)) return 2;

    int rc = 1;
    gguf_file *gf = NULL;
    kiln_chat_template *t = NULL;
    kiln_tokenizer *tok = NULL;
    json_t *vars = NULL;
    char *out = NULL, *bos_copy = NULL, *eos_copy = NULL;
    uint8_t *mask = NULL;
    size_t out_len = 0;

    if (model) {
        if (gguf_open(model, &gf) != KILN_OK) { cli_error(cmd, "%s", kiln_last_error()); goto done; }
        kiln_chat_gguf facts;
        if (kiln_chat_from_gguf(gf, &facts) != KILN_OK) { cli_error(cmd, "%s: %s", model, kiln_last_error()); goto done; }
        if (!bos) bos = bos_copy = kiln_strndup(facts.bos_token.ptr, facts.bos_token.len);
        if (!eos) eos = eos_copy = kiln_strndup(facts.eos_token.ptr, facts.eos_token.len);
        if (!bos || !eos) { cli_error(cmd, "out of memory"); goto done; }
        if (want_ids && kiln_tokenizer_open(gf, &tok) != KILN_OK) { cli_error(cmd, "%s: %s", model, kiln_last_error()); goto done; }
        if (!tmpl_arg) {
            if (!facts.chat_template.len) {
                cli_error(cmd, "%s has no tokenizer.chat_template; give --template NAME|FILE", model);
                goto done;
            }
            if (kiln_chat_template_parse(facts.chat_template.ptr, facts.chat_template.len, model, &t) != KILN_OK) {
                cli_error(cmd, "%s", kiln_last_error());
                goto done;
            }
        }
    }
    if (tmpl_arg && kiln_chat_template_resolve(tmpl_arg, &t) != KILN_OK) { cli_error(cmd, "%s", kiln_last_error()); goto done; }

    if (kiln_chat_template_note(t))
        fprintf(stderr, "kiln %s: warning: the template uses an %s (it fails only if that part is reached)\n", cmd,
                kiln_chat_template_note(t));
    json_error_t jerr;
    json_t *root = json_load_file(messages_path, 0, &jerr);
    if (!root) {
        cli_error(cmd, "%s:%d:%d: %s", messages_path, jerr.line, jerr.column, jerr.text);
        goto done;
    }
    if (json_is_array(root)) {
        vars = json_object();
        if (!vars || json_object_set_new(vars, "messages", root)) { json_decref(root); cli_error(cmd, "out of memory"); goto done; }
    } else if (json_is_object(root) && json_is_array(json_object_get(root, "messages"))) {
        vars = root;
    } else {
        json_decref(root);
        cli_error(cmd, "%s: expected a JSON array of messages or an object with a \"messages\" array", messages_path);
        goto done;
    }
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(vars, "messages"), i, m) {
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            cli_error(cmd, "%s: messages[%zu] must be an object with a string \"role\"", messages_path, i);
            goto done;
        }
        if (want_ids && kiln_chat_check_role(json_string_value(json_object_get(m, "role")), i) != KILN_OK) {
            cli_error(cmd, "%s: %s", messages_path, kiln_last_error());
            goto done;
        }
    }
    if (!json_object_get(vars, "bos_token")) json_object_set_new(vars, "bos_token", json_string(bos ? bos : ""));
    if (!json_object_get(vars, "eos_token")) json_object_set_new(vars, "eos_token", json_string(eos ? eos : ""));
    if (add_gen || !json_object_get(vars, "add_generation_prompt"))
        json_object_set_new(vars, "add_generation_prompt", json_boolean(add_gen));
    if (kiln_chat_render_vars_marked(t, vars, now, &out, &out_len, want_ids ? &mask : NULL) != KILN_OK) {
        cli_error(cmd, "%s", kiln_last_error());
        goto done;
    }
    rc = want_ids ? print_ids(cmd, tok, out, mask, out_len) : 0;
    if (!want_ids) {
        fwrite(out, 1, out_len, stdout);
        fflush(stdout);
    }
done:
    kiln_free(mask);
    kiln_tokenizer_close(tok);
    kiln_free(out);
    kiln_free(bos_copy);
    kiln_free(eos_copy);
    json_decref(vars);
    kiln_chat_template_free(t);
    gguf_close(gf);
    return rc;
}
