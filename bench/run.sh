#!/bin/sh
# bench/run.sh — the `make bench` entry point: builds every bench/*.c against the library objects with their
# internal names (build/libkiln-internal.a, and the tools archive; KILN_BENCH_LIBS from make) at -O2 into
# build/bench/ and runs each in turn (no arguments; KILN_SHARED points at the shared data). Results are
# copied into bench/RESULTS.md by hand, with the command, the machine and the date.
# Usage: sh bench/run.sh [NAME ...]   (NAME: a bench program without .c, e.g. gguf_open; default: all)
set -e
cd "$(dirname "$0")/.."
CC=${CC:-gcc}
export KILN_SHARED="${KILN_SHARED:-../shared}"
libs=${KILN_BENCH_LIBS:-build/libkiln-tools.a build/libkiln-internal.a -lpcre2-8 -ljansson -lm -lpthread}
[ -f build/libkiln-internal.a ] || { echo "bench: build/libkiln-internal.a missing (run make bench)" >&2; exit 1; }
mkdir -p build/bench
if [ $# -gt 0 ]; then names="$*"; else names=$(ls bench/*.c | sed 's|bench/||; s|\.c$||'); fi
status=0
for name in $names; do
    src="bench/$name.c"
    exe="build/bench/$name"
    [ -f "$src" ] || { echo "bench: no $src" >&2; status=1; continue; }
    $CC -std=c11 -D_GNU_SOURCE -O2 -g -Iinclude -Isrc -pthread -o "$exe" "$src" $libs
    echo "== $name ($(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores)"
    "$exe" || status=1
    echo
done
exit $status
