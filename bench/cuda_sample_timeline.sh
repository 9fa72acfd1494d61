#!/bin/sh
# bench/cuda_sample_timeline.sh MODEL... — where a sampled decode step's device-sampler time goes, pass by pass:
# applies bench/cuda_sample_timeline.patch (%globaltimer stamps in k_sample) to a scratch copy of this tree
# (TL_DIR, default /tmp/kiln-timeline), builds kiln there (extra make arguments in TL_MAKE, e.g.
# "CUDA_WANT_SASS=90"), and for each MODEL and k = 1, 4, 16 runs a sampled `kiln bench` (temperature 0.8, top-p
# 0.95, top-k off) and prints its last SAMPLE_TL lines: per pass its grid, the first and last block's entry, its
# last block's step start and end, in us from pass 0's first block. Needs a GPU; run from the repository root.
set -eu
[ $# -ge 1 ] || { echo "usage: sh bench/cuda_sample_timeline.sh MODEL..." >&2; exit 2; }
D=${TL_DIR:-/tmp/kiln-timeline}
rm -rf "$D"
mkdir -p "$D"
tar --exclude=./.git --exclude=./build/asan --exclude='./.dev-*' -cf - . | tar -xf - -C "$D"
(cd "$D" && patch -p1 --batch --silent < bench/cuda_sample_timeline.patch && make -j"$(nproc)" kiln ${TL_MAKE:-} > build.log 2>&1) ||
    { tail -20 "$D/build.log" 2>/dev/null; exit 1; }
for m in "$@"; do
    for k in 1 4 16; do
        echo "== $m k = $k"
        "$D/kiln" bench -m "$m" --device cuda --seqs $k -p 128 -n 128 -r 1 --temp 0.8 --top-k 0 --top-p 0.95 2>&1 |
            grep SAMPLE_TL | tail -n 2
    done
done
