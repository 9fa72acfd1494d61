#!/bin/bash
# cpu_side_by_side.sh — issue 14's CPU table in one run: kiln against the reference engine's `llama-bench` on the
# same mkmodel files (smollm2-135m Q8_0, llama-3.2-1b Q8_0 and Q4_K, made into $KILN_BENCH_MODELS unless present),
# alternated engine by engine within each round, then the median of the rounds and the ratio of the medians.
#   prefill: `kiln bench --device cpu --threads T -p P -n 1 -r 3` against `llama-bench -t T -p P -n 0 -r 3`
#   decode:  `kiln bench --device cpu --threads T -p 16 -n 64 -r 3` against `llama-bench -t T -p 0 -n 64 -r 3`
#            (tg64), and after a prompt of 512: `-p 512 -n 64` against `-p 0 -n 64 -d 512` (tg64@512)
# Usage: KILN_LLAMA_BENCH=path/to/llama-bench bash bench/cpu_side_by_side.sh [ROUNDS [THREADS [PROMPTS [FILES]]]]
#   defaults (DEPTH_TESTS="" leaves tg64@512 out): 3 rounds, threads "1 2", prompts "128 512", files
#   "smollm2-135m-q8_0 llama-3.2-1b-q8_0 llama-3.2-1b-q4_K"; also qwen3-30b-a3b-q4_K (17.3 GB, --expert-codes;
#   keep it on a disk, not a tmpfs, where the box has less than ~40 GB: the reference copies its experts into
#   repacked buffers); KILN_BIN (default ./kiln); the reference unpacked from ../shared/ref/cpu/llama-bench.xz
#   when KILN_LLAMA_BENCH is unset. Logs in $KILN_BENCH_OUT (default bench/out); the table on stdout.
set -u
ROUNDS=${1:-3} THREADS=${2:-1 2} PROMPTS=${3:-128 512}
FILES=${4:-smollm2-135m-q8_0 llama-3.2-1b-q8_0 llama-3.2-1b-q4_K}
SHARED=${KILN_SHARED:-../shared}
KILN=${KILN_BIN:-./kiln}
M=${KILN_BENCH_MODELS:-/dev/shm/kiln-bench-models}
OUT=${KILN_BENCH_OUT:-bench/out}
mkdir -p "$M" "$OUT"
REF=${KILN_LLAMA_BENCH:-}
if [ -z "$REF" ]; then
    REF=$OUT/llama-bench
    [ -x "$REF" ] || { xz -dc "$SHARED/ref/cpu/llama-bench.xz" > "$REF" && chmod +x "$REF"; } || exit 1
fi
for f in $FILES; do # NAME = SHAPE-TYPE; the vocabulary by family
    [ -f "$M/$f.gguf" ] && continue
    case $f in smollm2*) v=smollm2-135m-instruct ;; llama-3*) v=llama3 ;; qwen3*) v=qwen3 ;;
        *) echo "no vocabulary for $f" >&2; exit 2 ;; esac
    x="" # a mixture of experts: random codes under fixed scales (quantizing 29B values takes hours here)
    case $f in *-a3b-*) x=--expert-codes ;; esac
    "$KILN" mkmodel --quiet --shape "${f%-*}" --type "${f##*-}" --vocab "$SHARED/models/tokenizers/$v" $x \
        -o "$M/$f.gguf" || exit 1
done
kiln_tps() { # file threads prompt gen what -> tok/s
    "$KILN" bench -m "$M/$1.gguf" --device cpu --threads "$2" -p "$3" -n "$4" -r 3 --json 2> /dev/null |
        sed -n "s/.*\"$5_tok_s\":\([0-9.e+]*\).*/\1/p"
}
ref_tps() { # file threads prompt gen [depth] -> tok/s (avg_ts of its one test)
    "$REF" -m "$M/$1.gguf" -t "$2" -p "$3" -n "$4" -d "${5:-0}" -r 3 -o csv 2> /dev/null |
        python3 -c "import csv,sys; print(' '.join(r['avg_ts'] for r in csv.DictReader(sys.stdin)))"
}
med() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {if (NR) printf "%.1f", NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
echo "| file | threads | test | kiln (rounds) | reference (rounds) | kiln median / reference median |"
echo "|---|---|---|---|---|---|"
for f in $FILES; do
    for t in $THREADS; do
        for test in $(for p in $PROMPTS; do echo "pp$p"; done) tg64 ${DEPTH_TESTS-tg64@512}; do
            k="" r=""
            for _ in $(seq "$ROUNDS"); do
                case $test in
                    pp*) k="$k $(kiln_tps "$f" "$t" "${test#pp}" 1 prefill)"; r="$r $(ref_tps "$f" "$t" "${test#pp}" 0)" ;;
                    tg64) k="$k $(kiln_tps "$f" "$t" 16 64 decode)"; r="$r $(ref_tps "$f" "$t" 0 64)" ;;
                    tg64@*) k="$k $(kiln_tps "$f" "$t" "${test#tg64@}" 64 decode)"; r="$r $(ref_tps "$f" "$t" 0 64 "${test#tg64@}")" ;;
                esac
            done
            km=$(echo "$k" | med) rm=$(echo "$r" | med)
            echo "| $f | $t | $test | $km ($(echo $k | sed 's/ /, /g')) | $rm ($(echo $r | sed 's/ /, /g')) |" \
                "$(awk -v a="$km" -v b="$rm" 'BEGIN {if (b > 0) printf "%.2f", a / b}') |" | tee -a "$OUT/cpu_side_by_side.md"
        done
    done
done
