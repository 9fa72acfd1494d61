#!/bin/bash
# cuda_patch_ab.sh PATCH [TESTS...] — a CUDA change kept as a patch, measured against the tree it applies to, in
# one run on the GPU machine (from the repository root; the build dependencies found through the usual
# C_INCLUDE_PATH / LIBRARY_PATH / LD_LIBRARY_PATH):
#   1. builds this checkout's HEAD (or, without .git, this copy of the tree) (A) and HEAD with PATCH applied (B) side by side under $AB_DIR (default /tmp/ab),
#      CUDA_ARCHS=${CUDA_ARCHS:-90}
#   2. runs B's CUDA tests named by TESTS (substrings; default the GEMM, attention, long-prefill and model tests)
#      under CUDA_MODULE_LOADING=LAZY, with $KILN_SHARED as the test data
#   3. makes smollm2-135m Q8_0, llama-3.2-1b Q8_0 and Q4_K with `kiln mkmodel` (vocabularies from
#      $KILN_SHARED/models/tokenizers) in $AB_MODELS (default /dev/shm/ab-models) unless present
#   4. prefill 512 and decode of A, B and, when $KILN_LLAMA names the reference engine's `llama` binary, the
#      reference (`llama bench -ngl 99`), alternated over $AB_ROUNDS rounds (default 2)
#   5. when ncu is found: the per-kernel budget of B's prefill of 512 tokens on llama-3.2-1b Q8_0
#      (bench/cuda_budget.py --prefill 512)
# Logs and tables go to $KILN_BENCH_OUT (default bench/out).
set -u
PATCH=$(realpath "${1:?usage: bench/cuda_patch_ab.sh PATCH [TESTS...]}")
shift
TESTS=${*:-cuda_gemm cuda_attention cuda_long_prefill cuda_model}
OUT=$(realpath -m "${KILN_BENCH_OUT:-bench/out}")
SHARED=$(realpath "${KILN_SHARED:-../shared}")
AB=${AB_DIR:-/tmp/ab}
M=${AB_MODELS:-/dev/shm/ab-models}
ARCHS=${CUDA_ARCHS:-90}
mkdir -p "$OUT" "$M"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }

rm -rf "$AB" && mkdir -p "$AB/a" "$AB/b"
if git rev-parse --git-dir > /dev/null 2>&1; then tree() { git archive HEAD; } # a checkout: its HEAD
else tree() { tar -c --exclude=./build --exclude='./.dev-*' --exclude=./bench/out .; } # a copy without .git
fi
tree | tar -x -C "$AB/a" && tree | tar -x -C "$AB/b" || exit 1
(cd "$AB/b" && patch -s -p1 --dry-run < "$PATCH" > /dev/null && patch -s -p1 < "$PATCH") ||
    { echo "cuda_patch_ab.sh: $PATCH does not apply to HEAD"; exit 1; }
(cd "$AB/a" && make -j8 kiln CUDA_ARCHS="$ARCHS" > "$OUT/ab-build-a.log" 2>&1) &
(cd "$AB/b" && make -j8 kiln build/cuda/kiln_tests_cuda CUDA_ARCHS="$ARCHS" > "$OUT/ab-build-b.log" 2>&1) || {
    tail -30 "$OUT/ab-build-b.log"; exit 1; }
wait
[ -x "$AB/a/kiln" ] || { tail -30 "$OUT/ab-build-a.log"; exit 1; }
echo "built A and B in $(el) s"

gen() { # name shape type vocab
    [ -f "$M/$1.gguf" ] || "$AB/b/kiln" mkmodel --quiet --shape "$2" --type "$3" --vocab "$4" -o "$M/$1.gguf"
}
(gen smollm2-135m-q8_0 smollm2-135m q8_0 "$SHARED/models/tokenizers/smollm2-135m-instruct" &
 gen llama-3.2-1b-q8_0 llama-3.2-1b q8_0 "$SHARED/models/tokenizers/llama3" &
 gen llama-3.2-1b-q4_K llama-3.2-1b q4_K "$SHARED/models/tokenizers/llama3" & wait) > "$OUT/ab-models.log" 2>&1 &
(cd "$AB/b" && CUDA_MODULE_LOADING=LAZY KILN_SHARED="$SHARED" KILN_BIN=./kiln KILN_REL_BIN=./kiln \
    build/cuda/kiln_tests_cuda $TESTS) > "$OUT/ab-tests.log" 2>&1
grep -E "^FAIL|passed" "$OUT/ab-tests.log" | tail -20
wait
echo "tests and models in $(el) s"

json() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1" | head -1; }
for r in $(seq "${AB_ROUNDS:-2}"); do
    for m in smollm2-135m-q8_0 llama-3.2-1b-q8_0 llama-3.2-1b-q4_K; do
        [ -f "$M/$m.gguf" ] || { echo "no $M/$m.gguf (see $OUT/ab-models.log)"; continue; }
        for v in a b; do
            "$AB/$v/kiln" bench -m "$M/$m.gguf" --device cuda -p 512 -n 32 -r 3 --json > "$OUT/ab-$v-$m-$r.json" 2>/dev/null
            printf '%-20s %s round %s: prefill 512 %9s tok/s  decode %7s tok/s\n' "$m" "$(echo $v | tr ab AB)" "$r" \
                "$(json "$OUT/ab-$v-$m-$r.json" prefill_tok_s)" "$(json "$OUT/ab-$v-$m-$r.json" decode_tok_s)"
        done
        if [ -n "${KILN_LLAMA:-}" ]; then
            "$KILN_LLAMA" bench -m "$M/$m.gguf" -ngl 99 -p 512 -n 32 -r 3 -o csv > "$OUT/ab-ref-$m-$r.csv" 2> /dev/null
            printf '%-20s reference round %s: pp512 / tg32 %s tok/s\n' "$m" "$r" \
                "$(tail -2 "$OUT/ab-ref-$m-$r.csv" | awk -F, '{print $(NF-1)}' | tr -d '"' | tr '\n' ' ')"
        fi
    done
done

NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)}
if [ -n "$NCU" ] && [ -f "$M/llama-3.2-1b-q8_0.gguf" ]; then
    "$NCU" --clock-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
        --csv --log-file "$OUT/ab-ncu.csv" "$AB/b/kiln" bench -m "$M/llama-3.2-1b-q8_0.gguf" --device cuda -p 512 -n 1 -r 1 \
        > "$OUT/ab-ncu.txt" 2>&1
    python3 bench/cuda_budget.py "$OUT/ab-ncu.csv" --prefill 512 --title "B: prefill 512, llama-3.2-1b Q8_0" |
        tee "$OUT/ab-budget.md" | tail -1
fi
echo "done in $(el) s"
