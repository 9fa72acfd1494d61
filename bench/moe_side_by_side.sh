#!/bin/sh
# moe_side_by_side.sh — issue 12's MoE figures in one GPU-machine run: qwen3-30b-a3b Q4_K (17.3 GB, expert tensors
# as random codes: `kiln mkmodel --expert-codes`, 40 s there, where quantizing 29B normal values ran at ~20 MB/s
# and took > 10 minutes) and qwen3-0.6b Q8_0, made into a RAM folder (a tmpfs, mounted as root), then side by side
# with the reference engine on the same files:
#   H200: `kiln bench --device cuda -p 512 -n 64` (prefill 512, decode after it), `-p 1` (decode from empty), the
#         grouped MoE prefill against `--cuda-moe-per-row`, `--seqs 1,4,8`; `llama bench -ngl 99 -p 512 -n 64
#         -d 0,512` and `llama batched-bench -npl 1,4,8`
#   CPU:  both pinned to KILN_BENCH_CPUS (default 2,3), 2 threads, the reference's CPU backend with no GPU visible
# Usage: KILN_LLAMA=/path/to/llama [KILN_BENCH_RAM=/mnt/k] [KILN_BENCH_CPUS=2,3] sh bench/moe_side_by_side.sh VOCAB
#   VOCAB: a tokenizer folder or GGUF vocabulary with qwen's 151669 tokens (../shared/models/tokenizers/qwen3)
set -u
[ $# -eq 1 ] || { echo "usage: KILN_LLAMA=path/to/llama sh bench/moe_side_by_side.sh VOCAB" >&2; exit 2; }
VOCAB=$1
LLAMA=${KILN_LLAMA:?KILN_LLAMA: path to the reference engine unified binary (../shared/ref/cuda/llama.xz, unpacked)}
RAM=${KILN_BENCH_RAM:-/mnt/k}
CPUS=${KILN_BENCH_CPUS:-2,3}
mkdir -p "$RAM"
grep -q " $RAM tmpfs " /proc/mounts || mount -t tmpfs -o size=40g tmpfs "$RAM" ||
    { echo "moe_side_by_side: $RAM is not a tmpfs and cannot be mounted (run as root, or give KILN_BENCH_RAM)" >&2; exit 1; }
MOE=$RAM/qwen3-30b-a3b-q4_K.gguf Q06=$RAM/qwen3-0.6b-q8_0.gguf LOG=$RAM/logs
mkdir -p "$LOG"
[ -f "$Q06" ] || ./kiln mkmodel --shape qwen3-0.6b --type q8_0 --vocab "$VOCAB" -o "$Q06" --quiet || exit 1
[ -f "$MOE" ] || ./kiln mkmodel --shape qwen3-30b-a3b --type q4_K --vocab "$VOCAB" -o "$MOE" --expert-codes || exit 1
tps() { grep -h "$2" "$1" | sed -n 's/.*(\([0-9.]*\) tok\/s.*/\1/p' | head -1; }
ref() { # csv -> the avg_ts of its rows in order
    python3 -c "import csv,sys
print(' '.join('%.1f' % float(r['avg_ts']) for r in csv.DictReader(open(sys.argv[1]))))" "$1" 2>/dev/null; }
for m in "$Q06" "$MOE"; do
    n=$(basename "$m" .gguf)
    ./kiln bench -m "$m" --device cuda -p 512 -n 64 -r 3 > "$LOG/$n-k512.txt" 2>&1
    ./kiln bench -m "$m" --device cuda -p 1 -n 64 -r 3 > "$LOG/$n-k1.txt" 2>&1
    ./kiln bench -m "$m" --device cuda -p 512 -n 4 -r 2 --cuda-moe-per-row > "$LOG/$n-kpr.txt" 2>&1
    ./kiln bench -m "$m" --device cuda -p 128 -n 32 -r 2 --seqs 1,4,8 > "$LOG/$n-kseqs.txt" 2>&1
    "$LLAMA" bench -m "$m" -ngl 99 -p 512 -n 64 -d 0,512 -r 3 -o csv > "$LOG/$n-r.csv" 2> "$LOG/$n-r.err"
    "$LLAMA" batched-bench -m "$m" -ngl 99 -c 4096 -npp 128 -ntg 32 -npl 1,4,8 > "$LOG/$n-rseqs.txt" 2>&1
    taskset -c "$CPUS" ./kiln bench -m "$m" --device cpu -p 32 -n 8 -r 1 --threads 2 > "$LOG/$n-kcpu.txt" 2>&1
    CUDA_VISIBLE_DEVICES= taskset -c "$CPUS" "$LLAMA" bench -m "$m" -ngl 0 -t 2 -p 32 -n 8 -r 1 -o csv \
        > "$LOG/$n-rcpu.csv" 2> "$LOG/$n-rcpu.err"
    echo "$n H200 kiln: prefill 512 $(tps "$LOG/$n-k512.txt" prefill) (per row $(tps "$LOG/$n-kpr.txt" prefill)), decode after 512 $(tps "$LOG/$n-k512.txt" decode), from empty $(tps "$LOG/$n-k1.txt" decode)"
    echo "$n H200 reference: pp512 tg64 at depth 0, then at depth 512: $(ref "$LOG/$n-r.csv")"
    echo "$n H200 k sequences: kiln"; grep -E '^ +[0-9]+ ' "$LOG/$n-kseqs.txt"
    echo "$n H200 k sequences: reference (S_TG t/s is aggregate decode)"; grep '^|' "$LOG/$n-rseqs.txt"
    echo "$n CPU ($CPUS, 2 threads): kiln prefill 32 $(tps "$LOG/$n-kcpu.txt" prefill) decode $(tps "$LOG/$n-kcpu.txt" decode); reference pp32 tg8 $(ref "$LOG/$n-rcpu.csv")"
done
echo "logs: $LOG"
