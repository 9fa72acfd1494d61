#!/bin/sh
# Installs the Debian packages kiln builds against, when they are missing (needs root and apt).
# Run by `make run` / `make bench` (build packages) and, with --test, by `make test` / `make fuzz`; never by
# plain `make` or `make install`.
# Build: gcc, make, pkg-config, libpcre2-dev (BPE pre-tokenizer), libjansson-dev (JSON), libedit-dev
# (line editing in `kiln chat`), libmicrohttpd-dev (kiln serve's HTTP).
# --test adds: python3-jinja2 (chat-template reference), gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and
# qemu-user (the cross-compile check and the aarch64 format/kernel tests under qemu-aarch64),
# chromium, node + npm and the npm packages of tests/server/package.json (the official openai client,
# puppeteer-core) into tests/server/node_modules (ignored by git), and clang's libFuzzer runtime where clang
# exists (optional).
set -e
tests=no
[ "$1" = "--test" ] && tests=yes
need=""
[ -f /usr/include/pcre2.h ] || need="$need libpcre2-dev"
[ -f /usr/include/jansson.h ] || need="$need libjansson-dev"
[ -f /usr/include/editline/readline.h ] || need="$need libedit-dev"
[ -f /usr/include/microhttpd.h ] || need="$need libmicrohttpd-dev"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
command -v cc >/dev/null 2>&1 || need="$need gcc"
if [ $tests = yes ]; then
    # the chat-template tests compare with Python's jinja2: Debian's package, unless a python3 on PATH has it
    if ! python3 -c 'import jinja2' >/dev/null 2>&1 && ! /usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1; then
        need="$need python3-jinja2"
    fi
    # `make cross-aarch64` (part of make test): the portable kernels compile and link for arm64
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need="$need gcc-aarch64-linux-gnu"
    # `make test-aarch64` (part of make test): the static aarch64 test binary and the emulator that runs it
    [ -f /usr/aarch64-linux-gnu/lib/libc.a ] || need="$need libc6-dev-arm64-cross"
    command -v qemu-aarch64 >/dev/null 2>&1 || need="$need qemu-user"
    # kiln serve's tests: the official openai client (Node) and the chat page in headless Chromium
    [ -x /usr/bin/chromium ] || need="$need chromium"
    command -v node >/dev/null 2>&1 || need="$need nodejs"
    command -v npm >/dev/null 2>&1 || need="$need npm"
fi
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
if [ -n "$need" ]; then
    echo "kiln: installing build dependencies:$need"
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq $need >/dev/null
fi
# kiln serve's test clients (pinned by tests/server/package-lock.json); puppeteer-core drives /usr/bin/chromium
srv_tests="$(dirname "$0")/../tests/server"
if [ $tests = yes ] && command -v npm >/dev/null 2>&1 && { [ ! -f "$srv_tests/node_modules/openai/package.json" ] ||
                                       [ ! -f "$srv_tests/node_modules/puppeteer-core/package.json" ]; }; then
    echo "kiln: installing the server tests' npm packages into tests/server/node_modules"
    npm ci --prefix "$srv_tests" --no-audit --no-fund --loglevel=error >/dev/null ||
        echo "kiln: npm ci failed; the server tests that use the openai client and Chromium will fail"
fi
# Optional: the libFuzzer runtime for `make fuzz`, only where clang exists; never fails the script.
if [ $tests = yes ] && command -v clang >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    probe=$(mktemp -d 2>/dev/null || echo /tmp/kiln-fuzz-probe.$$)
    mkdir -p "$probe"
    echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return (int)(d[0] + n) * 0; }' > "$probe/p.c"
    if ! clang -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then
        ver=$(clang --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
        if [ -n "$ver" ]; then
            echo "kiln: installing the libFuzzer runtime (libclang-rt-$ver-dev), optional"
            { $SUDO apt-get install -y -qq "libclang-rt-$ver-dev" >/dev/null 2>&1 ||
              $SUDO apt-get install -y -qq "libclang-common-$ver-dev" >/dev/null 2>&1; } ||
                echo "kiln: libFuzzer runtime not available; make fuzz and the fuzz smoke test will be skipped"
        fi
    fi
    rm -rf "$probe"
fi
exit 0
