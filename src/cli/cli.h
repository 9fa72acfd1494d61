/* cli.h — the subcommands of the `kiln` command line and small helpers they share. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln.h"

/* Each subcommand: argv[0] is the subcommand's name. Returns the process exit code. */
int cmd_inspect(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* Prints "kiln CMD: message" to stderr and returns 1 (usage errors return 2 through cli_usage_error). */
/* Median of v[0..n) (sorts v; 0 when n <= 0). */
uint64_t cli_median_u64(uint64_t *v, long n);

int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Parses a whole decimal/float argument; false (and an error printed) when malformed or out of range. */
bool cli_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
bool cli_parse_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* True when argv[i] is opt and a value follows (advancing *i), or argv[i] is --opt=value (a long option
 * with its value in the same argument). Prints an error when the value is missing. */
bool cli_opt(int argc, char **argv, int *i, const char *opt, const char **val, bool *err);
/* Parses one sampling option at argv[*i] (--temp, --top-k, --top-p, --min-p, --repeat-penalty,
 * --repeat-last-n, --seed) into p. Returns 0 when argv[*i] is not one, 1 when it was parsed (advancing *i),
 * 2 on a bad value (the error is printed). *seed_given is set by --seed; --seed -1 picks a random seed. */
int cli_sampler_opt(const char *cmd, int argc, char **argv, int *i, kiln_sampler_params *p, bool *seed_given);
/* A seed from the clock and the process id (the default, and --seed -1). */
uint64_t cli_random_seed(void);
/* Parses -n / --n-predict: 0 .. 2^24 tokens, or -1: until end of generation or a full context. */
bool cli_parse_n_predict(const char *cmd, const char *opt, const char *s, long *out);
/* True when the directory that will hold path exists and is writable; else false with an error naming it
 * (commands that write a file call it before doing any work). */
bool cli_check_output_dir(const char *cmd, const char *path);
/* Parses --device's value; false (error printed) when it is not cpu, cuda or auto. */
bool cli_parse_device(const char *cmd, const char *s, kiln_device *out);
/* Length of the valid UTF-8 character at s (n bytes left), 0 when the bytes there are not one. */
size_t cli_utf8_len(const unsigned char *s, size_t n);
/* Writes s as a JSON string literal (with quotes); bytes that are not valid UTF-8 become U+FFFD, so the
 * output always parses. */
void cli_json_str(FILE *f, const char *s, size_t len);
/* Reads a whole file (for -f; "-" reads stdin); malloc'd, NUL-terminated. NULL and an error printed on failure. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);

#endif
