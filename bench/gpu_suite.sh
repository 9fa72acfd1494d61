#!/bin/bash
# gpu_suite.sh [DEFECT...] — the whole GPU test suite in one device run (from the repository root, after sourcing
# the env.sh of bench/gpu_kit.sh):
#   1. make -j16 build build/cuda/kiln_tests_cuda CUDA_ARCHS=${CUDA_ARCHS:-90}
#   2. `make test-cuda` under CUDA_MODULE_LOADING=LAZY (lazy loading would show in the CUPTI gates)
#   3. each DEFECT (a name under tests/defects, e.g. kernels/pipe-b-lag) applied to a copy of the tree with its
#      build objects (tests/defects/apply.sh), rebuilt and the CUDA tests run there: a defect must turn some red
# Logs under $OUT (the device tool's folder) or bench/out; a summary on stdout. Missing archs models (not in the
# kit) fail their tests loudly: read which.
set -u
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
ARCHS=${CUDA_ARCHS:-90}
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
nvidia-smi -L 2>/dev/null
el build
make -j16 build build/cuda/kiln_tests_cuda CUDA_ARCHS="$ARCHS" > "$OUT/suite-build.log" 2>&1 ||
    { tail -30 "$OUT/suite-build.log"; exit 1; }
el test-cuda
CUDA_MODULE_LOADING=LAZY make --no-print-directory test-cuda CUDA_ARCHS="$ARCHS" > "$OUT/suite-test-cuda.log" 2>&1
grep -E "^FAIL|passed" "$OUT/suite-test-cuda.log"
for d in "$@"; do
    dir=/tmp/defect-$(echo "$d" | tr / -)
    rm -rf "$dir"
    sh tests/defects/apply.sh "$d" "$dir" > /dev/null || { echo "$d: does not apply"; continue; }
    log="$OUT/suite-defect-$(echo "$d" | tr / -).log"
    el "defect $d"
    (cd "$dir" && make -j16 build/cuda/kiln_tests_cuda CUDA_ARCHS="$ARCHS" > "$log" 2>&1 &&
        CUDA_MODULE_LOADING=LAZY KILN_BIN=./kiln KILN_REL_BIN=./kiln build/cuda/kiln_tests_cuda cuda >> "$log" 2>&1)
    echo "$d: $(grep -E '^FAIL' "$log" | awk '{print $2}' | tr '\n' ' ')($(grep -E 'passed' "$log" | tail -1))"
done
el done
