#!/bin/sh
# demo.sh [MAKE ARGS...] — shows each CUPTI first-call gate red on its deliberate defect (`make defects-cuda`,
# on a GPU machine): for every tests/defects/*.patch, a scratch copy in ${KILN_DEFECT_DIR:-/tmp}/kiln-defect-NAME
# (apply.sh), build/cuda/kiln_tests_cuda built there (make ARGS, e.g. CUDA_ARCHS=90), and the gate test run
# in it; the gate must FAIL. Prints each defect's failing checks and counts, then one line per defect; exits 1
# when a gate stayed green on its defect (or a build failed). Run from the repository root.
set -u
SHARED=$(cd "${KILN_SHARED:-../shared}" && pwd) || { echo "demo.sh: no shared data (KILN_SHARED)" >&2; exit 2; }
BASE=${KILN_DEFECT_DIR:-/tmp}
JOBS=$(nproc 2>/dev/null || echo 2)
status=0
summary=""
for p in tests/defects/*.patch; do
    name=$(basename "$p" .patch)
    dir="$BASE/kiln-defect-$name"
    rm -rf "$dir"
    echo "== defect $name: $(sed -n 1p "$p" | sed 's/^DEFECT [^:]*: //')"
    if ! sh tests/defects/apply.sh "$name" "$dir"; then
        summary="$summary$name: patch failed\n"; status=1; continue
    fi
    if ! (cd "$dir" && make -j"$JOBS" "$@" build/cuda/kiln_tests_cuda > "$dir/build.log" 2>&1); then
        tail -20 "$dir/build.log"
        summary="$summary$name: build failed ($dir/build.log)\n"; status=1; continue
    fi
    (cd "$dir" && KILN_SHARED="$SHARED" KILN_TEST_VERBOSE=1 build/cuda/kiln_tests_cuda cuda_gates_cupti > "$dir/gate.log" 2>&1)
    grep -E '^\s+\[|cupti|free memory|FAIL|tests/test_cuda_gates.c:[0-9]+|passed' "$dir/gate.log" | cut -c1-400
    if grep -q '^0 passed, 1 failed' "$dir/gate.log"; then
        summary="$summary$name: RED as expected ($(grep -c 'tests/test_cuda_gates.c:[0-9]*:' "$dir/gate.log") failed checks)\n"
    else
        summary="$summary$name: NOT red: $(tail -1 "$dir/gate.log")\n"; status=1
    fi
done
printf "== defects\n$summary"
exit $status
