#!/bin/sh
# bench/cpu_levels.sh — kiln's CPU kernel levels side by side with the reference engine, on the same GGUF files
# in one run: for each model and 1 and 2 threads, `kiln bench --device cpu -p 128 -n 64 -r 3` at the CPU's best
# level and with KILN_CPU_LEVEL=avx2 (when the best is avx512), then llama-bench with the same lengths, all
# pinned to the cores KILN_BENCH_CPUS (default 0,1). Prints one table row per model and thread count (tok/s).
# Usage: [KILN_LLAMA_BENCH=path/to/llama-bench] [KILN_BENCH_CPUS=2,3] sh bench/cpu_levels.sh MODEL.gguf...
cd "$(dirname "$0")/.."
CPUS=${KILN_BENCH_CPUS:-0,1}
best=$(./kiln info | sed -n 's/^cpu level: \([a-z0-9]*\).*/\1/p')
levels=$best
[ "$best" = avx512 ] && levels="avx512 avx2"
json() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" "$1"; }
tmp=$(mktemp -d)
printf '| model | threads |'; for l in $levels; do printf ' kiln %s pp128 | tg64 |' "$l"; done
[ -n "$KILN_LLAMA_BENCH" ] && printf ' reference pp128 | tg64 |'
printf '\n'
for m in "$@"; do for t in 1 2; do
    printf '| %s | %s |' "$(basename "$m")" "$t"
    for l in $levels; do
        KILN_CPU_LEVEL=$l taskset -c "$CPUS" ./kiln bench -m "$m" --device cpu -p 128 -n 64 -r 3 --threads $t --json \
            > "$tmp/k.json" 2> "$tmp/k.err" || tail -2 "$tmp/k.err" >&2
        printf ' %s | %s |' "$(json "$tmp/k.json" prefill_tok_s)" "$(json "$tmp/k.json" decode_tok_s)"
    done
    if [ -n "$KILN_LLAMA_BENCH" ]; then
        taskset -c "$CPUS" "$KILN_LLAMA_BENCH" -m "$m" -t $t -p 128 -n 64 -r 3 -o csv > "$tmp/r.csv" 2> "$tmp/r.err"
        awk -F, '{gsub(/"/, "")} NR == 1 {for (i = 1; i <= NF; i++) h[$i] = i; next} {printf " %s |", $h["avg_ts"]}' "$tmp/r.csv"
    fi
    printf '\n'
done; done
rm -rf "$tmp"
