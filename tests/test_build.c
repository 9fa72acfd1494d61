/* test_build.c — what the build ships and how it is built: the shared library's exported symbols (exactly
 * the functions declared in include/kiln.h), its SONAME and symlinks, `make install`, the packager's flags,
 * that plain `make` never runs a package manager, the CUDA machine-code choice and the aarch64 cross build.
 * The tests run make and the binutils from the repository root, as `make test` does. */
#include "test.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* make as a user runs it: without the variables of a make that runs these tests (`make test-cuda CUDA_ARCHS=90`
 * passes CUDA_ARCHS to every make below it through MAKEFLAGS and the environment, which would override what a
 * test sets or leaves to the default). */
#define MAKE_ALONE "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u CUDA_ARCHS -u CUDA_WANT_SASS make --no-print-directory"

/* ---- the public function names, parsed from the header (never a hard-coded list) ---- */

typedef struct names {
    char (*v)[64];
    int n, cap;
} names;

static bool names_has(const names *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], name)) return true;
    return false;
}

static void names_add(names *s, const char *name, size_t len) {
    char buf[64];
    if (len >= sizeof buf) return;
    memcpy(buf, name, len);
    buf[len] = '\0';
    if (names_has(s, buf)) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
    }
    memcpy(s->v[s->n++], buf, len + 1);
}

/* Blanks comments and preprocessor lines, so that only declarations remain. */
static void strip_comments(char *t) {
    for (char *p = t; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            char *end = e ? e + 2 : p + strlen(p);
            memset(p, ' ', (size_t)(end - p));
            p = end - 1;
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n') *p++ = ' ';
            if (!*p) break;
        } else if (*p == '#' && (p == t || p[-1] == '\n')) {
            while (*p && *p != '\n') *p++ = ' ';
            if (!*p) break;
        }
    }
}

/* Every identifier kiln_... directly followed by '(' in include/kiln.h: the declared functions. */
static bool header_functions(names *out) {
    char *h = test_read_file("include/kiln.h", NULL);
    if (!h) return false;
    strip_comments(h);
    for (char *p = h; *p; p++) {
        if (strncmp(p, "kiln_", 5) || (p > h && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))) continue;
        char *e = p;
        while (isalnum((unsigned char)*e) || *e == '_') e++;
        char *q = e;
        while (isspace((unsigned char)*q)) q++;
        if (*q == '(') names_add(out, p, (size_t)(e - p));
        p = e - 1;
    }
    free(h);
    return true;
}

/* The defined dynamic symbols of a shared object (nm -D --defined-only). */
static bool exported_symbols(const char *so, names *out) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only %s", so);
    char *text = NULL;
    if (test_run_cmd(cmd, &text) != 0 || !text) {
        free(text);
        return false;
    }
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *name = strrchr(line, ' ');
        name = name ? name + 1 : line;
        size_t len = strcspn(name, "@");
        if (len) names_add(out, name, len);
    }
    free(text);
    return true;
}

TEST(build_shared_library_exports_only_kiln_h) {
    names decl = {0}, exp = {0};
    REQUIRE(header_functions(&decl));
    CHECKF(decl.n >= 30, "only %d functions parsed from include/kiln.h", decl.n);
    REQUIREF(exported_symbols("libkiln.so", &exp), "nm -D libkiln.so failed (build it: make build)");
    int bad = 0;
    for (int i = 0; i < exp.n; i++)
        if (!names_has(&decl, exp.v[i])) {
            if (bad++ < 20) test_failf(__FILE__, __LINE__, "libkiln.so exports %s, not declared in kiln.h", exp.v[i]);
        }
    CHECKF(bad == 0, "%d symbols exported beyond include/kiln.h", bad);
    /* the functions every user calls are there (declared functions that are not implemented yet are not) */
    static const char *const key[] = {"kiln_model_open", "kiln_model_close", "kiln_session_open", "kiln_prefill",
                                      "kiln_decode", "kiln_decode_greedy", "kiln_sample", "kiln_sampler_open",
                                      "kiln_tokenize", "kiln_detok_push", "kiln_last_error", "kiln_status_name",
                                      "kiln_session_stats", "kiln_session_close"};
    for (size_t i = 0; i < sizeof key / sizeof key[0]; i++) {
        CHECKF(names_has(&decl, key[i]), "%s is no longer declared in kiln.h", key[i]);
        CHECKF(names_has(&exp, key[i]), "libkiln.so does not export %s", key[i]);
    }
    printf("%d symbols exported, %d functions declared\n", exp.n, decl.n);
    free(decl.v);
    free(exp.v);
}

/* The version from kiln.h: "0.1.0" -> libkiln.so.0.1.0, SONAME libkiln.so.0. */
static void so_names(char *file, char *soname, size_t cap) {
    const char *v = KILN_VERSION_STRING;
    snprintf(file, cap, "libkiln.so.%s", v);
    snprintf(soname, cap, "libkiln.so.%.*s", (int)strcspn(v, "."), v);
}

static void check_link(const char *dir, const char *link, const char *target) {
    char path[1024], got[256];
    snprintf(path, sizeof path, "%s/%s", dir, link);
    ssize_t n = readlink(path, got, sizeof got - 1);
    CHECKF(n > 0, "%s is not a symlink", path);
    if (n <= 0) return;
    got[n] = '\0';
    CHECKF(!strcmp(got, target), "%s -> %s, expected %s", path, got, target);
}

TEST(build_shared_library_soname_and_symlinks) {
    char file[64], soname[64], cmd[256];
    so_names(file, soname, sizeof file);
    struct stat sb;
    CHECKF(lstat(file, &sb) == 0 && S_ISREG(sb.st_mode), "%s is not a file", file);
    check_link(".", soname, file);
    check_link(".", "libkiln.so", soname);
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "readelf -d %s", file);
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    char want[128];
    snprintf(want, sizeof want, "Library soname: [%s]", soname);
    CHECKF(out && strstr(out, want), "no '%s' in:\n%s", want, out ? out : "");
    free(out);
}

TEST(build_install_places_library_with_symlinks) {
    char file[64], soname[64], cmd[1024], dir[600], lib[700];
    so_names(file, soname, sizeof file);
    snprintf(dir, sizeof dir, "%s/root", test_tmpdir());
    snprintf(cmd, sizeof cmd, MAKE_ALONE " -s install DESTDIR=%s PREFIX=/usr 2>&1", dir);
    char *out = NULL;
    int rc = test_run_cmd(cmd, &out);
    CHECKF(rc == 0, "make install failed (%d):\n%s", rc, out ? out : "");
    free(out);
    snprintf(lib, sizeof lib, "%s/usr/lib", dir);
    struct stat sb;
    char path[800];
    snprintf(path, sizeof path, "%s/%s", lib, file);
    CHECKF(lstat(path, &sb) == 0 && S_ISREG(sb.st_mode), "%s missing", path);
    check_link(lib, soname, file);
    check_link(lib, "libkiln.so", soname);
    static const char *const files[] = {"usr/lib/libkiln.a", "usr/include/kiln.h", "usr/bin/kiln",
                                        "usr/lib/pkgconfig/kiln.pc"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        CHECKF(stat(path, &sb) == 0, "%s missing", path);
    }
    /* the shipped library has no offline tools or test hooks */
    snprintf(cmd, sizeof cmd, "nm %s/libkiln.a 2>/dev/null | grep -c -E ' T (kiln_quantize_file|kiln_quant_|kiln_mk|kiln_hf_)'", lib);
    out = NULL;
    test_run_cmd(cmd, &out);
    CHECKF(out && atoi(out) == 0, "libkiln.a defines tool functions (%s)", out ? out : "?");
    free(out);
}

/* The commands `make -n TARGETS` would run (it runs nothing but recursive makes, which only print too). */
static char *make_dry(const char *args) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, MAKE_ALONE " -n %s 2>&1", args);
    char *out = NULL;
    int rc = test_run_cmd(cmd, &out);
    if (rc != 0) test_failf(__FILE__, __LINE__, "make -n %s failed (%d):\n%s", args, rc, out ? out : "");
    return out;
}

TEST(build_plain_make_and_install_never_run_a_package_manager) {
    char *out = make_dry("all install DESTDIR=/nonexistent-kiln-dry-run");
    REQUIRE(out);
    CHECKF(!strstr(out, "install-deps") && !strstr(out, "apt-get"), "make / make install would run:\n%s", out);
    free(out);
    /* make run and make test do install what they need */
    out = make_dry("run");
    CHECKF(out && strstr(out, "install-deps"), "make run does not run scripts/install-deps.sh:\n%s", out ? out : "");
    free(out);
    out = make_dry("test");
    CHECKF(out && strstr(out, "install-deps"), "make test does not run scripts/install-deps.sh:\n%s", out ? out : "");
    free(out);
}

TEST(build_honours_cflags_cppflags_ldflags) {
    char *out = make_dry("-B build/rel/src/base/env.o kiln libkiln.so CFLAGS=-DKILN_PKG_CFLAGS "
                         "CPPFLAGS=-DKILN_PKG_CPPFLAGS LDFLAGS=-Wl,-O1,--as-needed");
    REQUIRE(out);
    char *cc = strstr(out, "-c src/base/env.c");
    char *line = cc;
    while (line && line > out && line[-1] != '\n') line--;
    REQUIREF(cc, "no compile of env.c in:\n%.3000s", out);
    size_t len = (size_t)(strchr(cc, '\n') ? strchr(cc, '\n') - line : (long)strlen(line));
    char *l = strndup(line, len);
    CHECKF(strstr(l, "-DKILN_PKG_CFLAGS") && strstr(l, "-DKILN_PKG_CPPFLAGS"), "CFLAGS/CPPFLAGS not used: %s", l);
    CHECKF(!strstr(l, " -O2 -g "), "CFLAGS did not replace the default optimisation: %s", l);
    free(l);
    /* the link of the shared library and of the CLI carry LDFLAGS */
    int links = 0;
    for (char *p = out; (p = strstr(p, "-Wl,-O1,--as-needed")); p++) links++;
    CHECKF(links >= 2, "LDFLAGS on %d link lines, expected the .so and kiln:\n%.3000s", links, out);
    free(out);
}

TEST(build_cuda_machine_code_choice) {
    char *probe = NULL;
    bool nvcc = test_run_cmd("command -v nvcc || test -x /usr/local/cuda/bin/nvcc", &probe) == 0;
    free(probe);
    if (!nvcc) {
        test_skip("nvcc not found: no CUDA build to check");
        return;
    }
    const char *obj = "build/cuda/src/backend/cuda/cuda_kernels.o";
    char args[512];
    probe = NULL;
    bool gpu = test_run_cmd("nvidia-smi --query-gpu=compute_cap --format=csv,noheader >/dev/null 2>&1", &probe) == 0;
    free(probe);
    /* the default: this machine's GPU, or without one only the quick compile check of every kernel */
    snprintf(args, sizeof args, "-B %s", obj);
    char *out = make_dry(args);
    REQUIRE(out);
    if (!gpu) {
        CHECKF(strstr(out, "arch=compute_80,code=compute_80 -Xcicc -O0") && !strstr(out, "code=sm_"),
               "the default without a GPU is not the PTX compile check:\n%.2000s", out);
    } else {
        CHECKF(strstr(out, "code=sm_") && !strstr(out, "-Xcicc -O0"), "the default with a GPU builds no SASS:\n%.2000s", out);
    }
    free(out);
    /* native: the compute capability nvidia-smi reports (a stand-in nvidia-smi reporting an H200 and an A100) */
    char fake[700];
    snprintf(fake, sizeof fake, "%s/nvidia-smi", test_tmpdir());
    FILE *f = fopen(fake, "w");
    REQUIRE(f);
    fputs("#!/bin/sh\necho 9.0\necho 8.0\necho 9.0\n", f);
    fclose(f);
    REQUIRE(chmod(fake, 0755) == 0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "PATH=%s:$PATH " MAKE_ALONE " -n -B %s 2>&1", test_tmpdir(), obj);
    out = NULL;
    CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
    CHECKF(out && strstr(out, "arch=compute_80,code=sm_80") && strstr(out, "arch=compute_90,code=sm_90") &&
           strstr(out, "arch=compute_90,code=compute_90") && !strstr(out, "sm_86") && !strstr(out, "-Xcicc -O0"),
           "CUDA_ARCHS=native with GPUs 9.0 and 8.0:\n%.2000s", out ? out : "");
    free(out);
    /* the fat binary of a package */
    snprintf(args, sizeof args, "-B %s CUDA_ARCHS=all", obj);
    out = make_dry(args);
    CHECKF(out && strstr(out, "code=sm_80") && strstr(out, "code=sm_86") && strstr(out, "code=sm_89") &&
           strstr(out, "code=sm_90") && !strstr(out, "-Xcicc -O0"), "CUDA_ARCHS=all:\n%.2000s", out ? out : "");
    free(out);
    /* the spelling the GPU machine uses */
    snprintf(args, sizeof args, "-B %s CUDA_WANT_SASS=90", obj);
    out = make_dry(args);
    CHECKF(out && strstr(out, "arch=compute_90,code=sm_90") && strstr(out, "code=compute_90") &&
           !strstr(out, "sm_80"), "CUDA_WANT_SASS=90:\n%.2000s", out ? out : "");
    free(out);
}

TEST(build_cross_aarch64_compiles_and_links) {
    char *out = NULL;
    if (test_run_cmd("command -v aarch64-linux-gnu-gcc", &out) != 0) {
        free(out);
        test_skip("aarch64-linux-gnu-gcc not installed (scripts/install-deps.sh --test installs gcc-aarch64-linux-gnu)");
        return;
    }
    free(out);
    out = NULL;
    int rc = test_run_cmd(MAKE_ALONE " -s cross-aarch64 2>&1", &out);
    CHECKF(rc == 0 && out && strstr(out, "links; every symbol"), "make cross-aarch64 failed (%d):\n%.4000s", rc,
           out ? out : "");
    free(out);
}

/* The static archive: only kiln.h's functions are global in it, so a program that defines gguf_open or
 * jinja_parse itself (as one linked with llama.cpp's ggml does) still links with it, and runs. */
static const char prog_src[] =
    "#include <stdio.h>\n#include \"kiln.h\"\n"
    "int gguf_open(void) { return 7; }\nint jinja_parse(void) { return 8; }\n"
    "int main(int argc, char **argv) {\n"
    "    kiln_model *m; kiln_session *s; int32_t next = -1;\n"
    "    if (argc < 2 || kiln_model_open(argv[1], &m) != KILN_OK) return 1;\n"
    "    if (kiln_session_open(m, &(kiln_session_options){.n_ctx = 64, .n_threads = 1}, &s) != KILN_OK) return 1;\n"
    "    if (kiln_decode_greedy(s, 1, &next) != KILN_OK) return 1;\n"
    "    printf(\"%d\\n\", (int)next);\n"
    "    kiln_session_close(s); kiln_model_close(m);\n"
    "    return gguf_open() + jinja_parse() == 15 ? 0 : 1;\n}\n";

TEST(build_static_archive_has_only_kiln_h_names_and_links_beside_ggml) {
    names decl = {0}, glob = {0};
    REQUIRE(header_functions(&decl));
    char *text = NULL;
    REQUIRE(test_run_cmd("nm -g --defined-only libkiln.a", &text) == 0 && text);
    free(text);
    /* the test entry points (tools, kiln_cuda_test_*) are not in the shipped archive at all, not even local */
    REQUIRE(test_run_cmd("nm libkiln.a | grep -c -e kiln_cuda_test -e kiln_quantize_file -e kiln_mkmodel || true", &text) == 0 && text);
    CHECKF(atoi(text) == 0, "libkiln.a holds %d test-entry or tool symbols", atoi(text));
    free(text);
    REQUIRE(test_run_cmd("nm -g --defined-only libkiln.a", &text) == 0 && text);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *sp = strrchr(line, ' ');
        if (sp && sp > line + 1 && sp[-2] == ' ' && sp[-1] != 'U') names_add(&glob, sp + 1, strlen(sp + 1));
    }
    free(text);
    CHECKF(glob.n >= 25, "only %d global symbols in libkiln.a", glob.n);
    for (int i = 0; i < glob.n; i++) CHECKF(names_has(&decl, glob.v[i]), "libkiln.a has the global %s", glob.v[i]);
    /* link a program that defines gguf_open and jinja_parse, with the flags kiln.pc gives */
    char src[600], exe[600], cmd[2048];
    snprintf(src, sizeof src, "%s/prog.c", test_tmpdir());
    snprintf(exe, sizeof exe, "%s/prog", test_tmpdir());
    FILE *f = fopen(src, "w");
    REQUIRE(f);
    fputs(prog_src, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cc -std=c11 -Iinclude %s libkiln.a $(sed -n 's/^Libs.private: //p' kiln.pc) -o %s 2>&1",
             src, exe);
    char *out = NULL;
    int rc = test_run_cmd(cmd, &out);
    CHECKF(rc == 0, "static link beside gguf_open/jinja_parse failed:\n%s", out ? out : "");
    free(out);
    if (rc == 0) {
        /* the first greedy token after BOS is llama.cpp's */
        json_error_t e;
        json_t *ref = json_load_file(test_shared("models/stories260K/expected/llama.cpp/stories260K.greedy-BOS-200.json"), 0, &e);
        REQUIREF(ref, "%s", e.text);
        snprintf(cmd, sizeof cmd, "%s %s", exe, test_shared("models/stories260K/stories260K.gguf"));
        out = NULL;
        CHECK_EQ_INT(test_run_cmd(cmd, &out), 0);
        CHECK_EQ_INT(out ? atoi(out) : -1, json_integer_value(json_array_get(json_object_get(ref, "generated_token_ids"), 0)));
        free(out);
        json_decref(ref);
    }
    free(decl.v);
    free(glob.v);
}

/* Every deliberate defect of tests/defects (shown red by hand on a GPU: `make defects-cuda`, apply.sh) still applies
 * to this tree: a patch that no longer applies is a gate nobody can show red any more. */
TEST(build_defect_patches_apply_to_this_tree) {
    char *out = NULL;
    const char *cmd =
        "n=0; for p in tests/defects/*.patch tests/defects/*/*.patch; do [ -f \"$p\" ] || continue; n=$((n+1)); "
        "if command -v patch > /dev/null 2>&1; then patch -p1 --dry-run --batch --silent --forward < \"$p\" > /dev/null 2>&1; "
        "else git apply --check \"$p\" > /dev/null 2>&1; fi || echo \"stale: $p\"; done; echo \"patches: $n\"";
    REQUIRE(test_run_cmd(cmd, &out) == 0 && out);
    int n = 0;
    const char *c = strstr(out, "patches: ");
    if (c) n = atoi(c + 9);
    CHECKF(n >= 8, "expected the 8+ defect patches of tests/defects, found %d:\n%s", n, out);
    CHECKF(!strstr(out, "stale:"), "defect patches that no longer apply (refresh them against this tree):\n%s", out);
    free(out);
}
