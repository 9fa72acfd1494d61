#!/bin/sh
# cuda_budget.sh [MODEL.gguf] [CONTEXT] — the per-kernel budget of one decode step on the GPU (part of
# `make bench-cuda`; run on the GPU machine): ncu profiles every kernel of
#   ./kiln bench -m MODEL --device cuda -p CONTEXT -n 2 -r 1
# (clocks not locked, so the kernels run at the clocks they get in use), and cuda_budget.py prints the table of
# the last decode step: per kernel name + grid the launches, us and DRAM bytes each, the bytes' floor at
# 4.3 TB/s, and the sums. Defaults: smollm2-135m Q8_0 (made with `kiln mkmodel` unless present) at context 512.
# The raw report and the table go to $KILN_BENCH_OUT (default bench/out).
set -u
OUT=${KILN_BENCH_OUT:-bench/out}
SHARED=${KILN_SHARED:-../shared}
MODELS=${KILN_BENCH_MODELS:-$OUT}
KILN=./kiln
mkdir -p "$OUT" "$MODELS"
M=${1:-$MODELS/smollm2-135m-q8_0.gguf}
P=${2:-512}
NCU=${NCU:-$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)}
[ -n "$NCU" ] || { echo "cuda_budget.sh: ncu (Nsight Compute) not found: set NCU=/path/to/ncu"; exit 1; }
if [ ! -f "$M" ] && [ -z "${1:-}" ]; then
    $KILN mkmodel --shape smollm2-135m --type q8_0 --vocab "$SHARED/models/tokenizers/smollm2-135m-instruct" -o "$M" \
        > "$OUT/mkmodel-budget.log" 2>&1 || { echo "cuda_budget.sh: mkmodel failed (see $OUT/mkmodel-budget.log)"; exit 1; }
fi
[ -f "$M" ] || { echo "cuda_budget.sh: no model $M"; exit 1; }
name=$(basename "$M" .gguf)
CSV="$OUT/budget-$name-$P.csv"
"$NCU" --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
    --csv --log-file "$CSV" $KILN bench -m "$M" --device cuda -p "$P" -n 2 -r 1 > "$OUT/budget-$name-$P.bench.txt" 2>&1 ||
    { echo "cuda_budget.sh: ncu failed:"; tail -5 "$OUT/budget-$name-$P.bench.txt" "$CSV"; exit 1; }
python3 bench/cuda_budget.py "$CSV" --title "decode step of $name at context $P (ncu, --clock-control none)" |
    tee "$OUT/budget-$name-$P.md"
