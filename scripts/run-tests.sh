#!/bin/sh
# Runs the test binary (built by `make test-build`). Its last line is "N passed, N failed, N skipped".
# The libFuzzer smoke run (a test inside the suite) uses build/fuzz/gguf_fuzz when clang can build it.
if command -v clang >/dev/null 2>&1; then
    make --no-print-directory build/fuzz/gguf_fuzz >/dev/null 2>&1 || echo "note: libFuzzer target not built (clang without libFuzzer runtime)"
fi
exec build/asan/kiln_tests "$@"
