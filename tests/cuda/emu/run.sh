#!/bin/sh
# tests/cuda/emu/run.sh — the device sampler's logic checked without a GPU: cuda_sample.cu compiled for the CPU
# with the emulated builtins of inc/ (a block's 1024 threads as fibers on one OS thread), against the reference
# chain over the sampling tests' mixes and shapes. Needs the release objects (make build). Usage from the
# repository root: sh tests/cuda/emu/run.sh [VOCAB ROWS [SHAPES [REPS]]] (default 5000 5 5 1; also
# EXTRA=1, a patched cuda_sample.cu through SAMPLE_CU=path, the build folder through EMU_O). Not part of make test
# (minutes per vocabulary).
set -eu
E=tests/cuda/emu; O=${EMU_O:-build/emu}; mkdir -p $O
CU=${SAMPLE_CU:-src/backend/cuda/cuda_sample.cu}
CXX="g++ -std=c++20 -O1 -ffp-contract=off -g -I$E/inc -Iinclude -Isrc -Itests"
$CXX -c -x c++ "$CU" -o $O/cuda_sample.o
$CXX -c $E/rt.cpp -o $O/rt.o
$CXX -c $E/sample_emu.cpp -o $O/sample_emu.o
gcc -std=c11 -O1 -Iinclude -Isrc -Itests -c tests/sample_cases.c -o $O/sample_cases.o
gcc -std=c11 -O1 -Iinclude -Isrc -Itests -c tests/sample_ref.c -o $O/sample_ref.o
g++ -o $O/sample_emu $O/cuda_sample.o $O/rt.o $O/sample_emu.o $O/sample_cases.o $O/sample_ref.o \
    build/rel/src/sample/*.o build/rel/src/base/*.o build/rel/src/formats/dot_avx2.o build/rel/src/formats/half.o build/rel/src/formats/cpu_level.o -lm
exec $O/sample_emu "${1:-5000}" "${2:-5}" "${3:-5}" "${4:-1}"
