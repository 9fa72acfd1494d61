#!/bin/sh
# Links the aarch64 objects of `make cross-aarch64` into one shared object and checks that every symbol it
# needs is provided by the aarch64 C library (libc, libm), PCRE2 or Jansson: so no code outside the x86
# build names an *_avx2 / *_avx512 kernel (which exist only there). The arm64 builds of PCRE2 and Jansson
# need not be installed: their symbols are recognised by name.
# usage: cross-link-check.sh CROSS_CC OUT.so OBJ...
set -e
cc=$1 out=$2
shift 2
"$cc" -shared -o "$out" "$@"
nm=$(echo "$cc" | sed 's/gcc$/nm/')
libc=$("$cc" -print-file-name=libc.so.6)
libm=$("$cc" -print-file-name=libm.so.6)
provided=$(mktemp)
trap 'rm -f "$provided"' EXIT
"$nm" -D --defined-only "$libc" "$libm" 2>/dev/null | awk 'NF >= 3 { sub(/@.*/, "", $3); print $3 }' | sort -u > "$provided"
missing=$("$nm" -D --undefined-only "$out" | awk '{ sub(/@.*/, "", $2); print $2 }' | sort -u |
          grep -v -E '^(pcre2_|json_|jansson_)' | comm -23 - "$provided" | grep -v -E '^(__gmon_start__|_ITM_|__cxa_finalize)' || true)
if [ -n "$missing" ]; then
    echo "kiln: the aarch64 build references symbols nothing provides:" >&2
    echo "$missing" | sed 's/^/  /' >&2
    exit 1
fi
echo "kiln: $out links; every symbol it needs is in libc, libm, PCRE2 or Jansson"
