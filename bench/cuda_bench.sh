#!/bin/sh
# cuda_bench.sh — `make bench-cuda`: the CUDA backend on real model shapes (run on the GPU machine).
#   1. makes the models with `kiln mkmodel` (smollm2-135m Q8_0, llama-3.2-1b Q8_0 and Q4_K) unless present
#   2. `kiln bench --device cuda`: open breakdown, prefill 512 and decode 128, medians of 5 repetitions
#   3. fresh process -> first token of a 13-token prompt (smollm2-135m), wall time of 5 processes
#   4. `kiln run --device cuda --rounds 2`: the first-call penalty
# Everything goes to $KILN_BENCH_OUT (default bench/out); a summary table is printed last.
set -u
OUT=${KILN_BENCH_OUT:-bench/out}
SHARED=${KILN_SHARED:-../shared}
MODELS=${KILN_BENCH_MODELS:-$OUT}
KILN=./kiln
mkdir -p "$OUT" "$MODELS"
SUMMARY="$OUT/cuda_summary.txt"
: > "$SUMMARY"

$KILN info > "$OUT/cuda_info.txt" 2>&1
cat "$OUT/cuda_info.txt"

gen() { # shape type vocab file
    if [ ! -f "$4" ]; then
        $KILN mkmodel --shape "$1" --type "$2" --vocab "$3" -o "$4" > "$OUT/mkmodel-$1-$2.log" 2>&1 ||
            echo "mkmodel $1 $2 failed (see $OUT/mkmodel-$1-$2.log)"
    fi
}
SMOL="$MODELS/smollm2-135m-q8_0.gguf"
L1Q8="$MODELS/llama-3.2-1b-q8_0.gguf"
L1Q4="$MODELS/llama-3.2-1b-q4_K.gguf"
gen smollm2-135m q8_0 "$SHARED/models/tokenizers/smollm2-135m-instruct" "$SMOL"
gen llama-3.2-1b q8_0 "$SHARED/models/tokenizers/llama3" "$L1Q8"
gen llama-3.2-1b q4_K "$SHARED/models/tokenizers/llama3" "$L1Q4"

json_get() { # file key
    sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1" | head -1
}

for m in "$SHARED/models/stories260K/stories260K.gguf" "$SMOL" "$L1Q8" "$L1Q4"; do
    [ -f "$m" ] || { echo "missing $m" | tee -a "$SUMMARY"; continue; }
    name=$(basename "$m" .gguf)
    $KILN bench -m "$m" --device cuda -p 512 -n 128 -r 5 --json > "$OUT/bench-$name.json" 2> "$OUT/bench-$name.err"
    if [ -s "$OUT/bench-$name.json" ]; then
        printf '%-28s prefill512 %10s tok/s  decode %8s tok/s  open %8.1f ms\n' "$name" \
            "$(json_get "$OUT/bench-$name.json" prefill_tok_s)" "$(json_get "$OUT/bench-$name.json" decode_tok_s)" \
            "$(awk "BEGIN{print $(json_get "$OUT/bench-$name.json" open_ns) / 1000000}")" | tee -a "$SUMMARY"
        cat "$OUT/bench-$name.json"
    else
        echo "$name: bench failed: $(tail -2 "$OUT/bench-$name.err")" | tee -a "$SUMMARY"
    fi
done

PROMPT="The quick brown fox jumps over the lazy dog near the old river"
if [ -f "$SMOL" ]; then
    : > "$OUT/first_token_ms.txt"
    for i in 1 2 3 4 5; do
        t0=$(date +%s%N)
        $KILN run -m "$SMOL" -p "$PROMPT" -n 1 --temp 0 --device cuda > "$OUT/first_token_$i.log" 2>&1
        t1=$(date +%s%N)
        echo $(( (t1 - t0) / 1000000 )) >> "$OUT/first_token_ms.txt"
    done
    echo "fresh process -> first token (smollm2-135m, 13-token prompt), ms: $(tr '\n' ' ' < "$OUT/first_token_ms.txt")" \
        "median $(sort -n "$OUT/first_token_ms.txt" | sed -n 3p)" | tee -a "$SUMMARY"
    tail -3 "$OUT/first_token_1.log"
    $KILN run -m "$SMOL" -p "$PROMPT" -n 64 --temp 0 --ignore-eos --device cuda --rounds 2 > "$OUT/rounds.log" 2>&1
    tail -5 "$OUT/rounds.log" | tee -a "$SUMMARY"
fi
$KILN run -m "$SHARED/models/stories260K/stories260K.gguf" -n 64 --temp 0 --device cuda --rounds 2 > "$OUT/rounds-stories.log" 2>&1
tail -3 "$OUT/rounds-stories.log" | tee -a "$SUMMARY"
echo "---- summary"
cat "$SUMMARY"
