# cuda.mk — the optional CUDA backend, included by the Makefile after NVCC and CU_SRC are set.
# With nvcc and sources: builds one fatbinary (which machine code: CUDA_ARCHS below), and defines CU_OBJ,
# CUDA_DEFS, CUDA_LDLIBS and the targets
#   make test-cuda    GPU tests (non-ASan binary build/cuda/kiln_tests_cuda; they skip without a GPU)
#   make bench-cuda   the H200 benchmarks of bench/cuda_bench.sh, then the decode budget (bench/cuda_budget.sh)
#   make budget-cuda  only the decode budget: per-kernel ncu table of one decode step
#   make defects-cuda each CUPTI first-call gate shown red on its deliberate defect (tests/defects/)
# Without nvcc it defines nothing and prints one line.
ifneq ($(strip $(NVCC)),)
ifneq ($(strip $(CU_SRC)),)

# nvcc may be a wrapper script (e.g. /usr/local/bin/nvcc), so ask nvcc itself where its toolkit lives and
# find the static runtime there; without it the backend is left out with one line (never a link failure)
CUDA_TOP := $(shell $(NVCC) --dryrun -c kiln_probe.cu 2>&1 | sed -n 's/^\#\$$ TOP=//p' | head -n 1)
CUDA_LIBDIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(CUDA_TOP)/lib64/libcudart_static.a \
                 $(CUDA_TOP)/targets/*/lib/libcudart_static.a $(patsubst %/bin/nvcc,%,$(NVCC))/lib64/libcudart_static.a))))
ifneq ($(strip $(CUDA_LIBDIR)),)
# Which machine code goes into the fatbinary (CUDA_ARCHS):
#   native  (default where nvidia-smi reports a GPU) SASS for the GPUs of this machine + their PTX
#   check   (default without a GPU) PTX of compute_80 only, device code unoptimised (-Xcicc -O0): proves in
#           seconds that every .cu file compiles (CI); a GPU would JIT slow code from it, so `kiln info` says so
#   all     the fat binary a package ships: SASS for every arch of CUDA_ALL this nvcc knows + PTX of the newest
#   "80 90" SASS for exactly these archs + PTX of the last (the older spelling CUDA_WANT_SASS="90" does the same)
CUDA_ALL := 80 86 89 90 100 110 120
CUDA_KNOWN := $(shell $(NVCC) --list-gpu-arch 2>/dev/null | sed -n 's/^compute_//p')
ifeq ($(strip $(CUDA_KNOWN)),)
CUDA_KNOWN := 80 86 89 90
endif
ifneq ($(origin CUDA_WANT_SASS),undefined)
CUDA_ARCHS ?= $(CUDA_WANT_SASS)
endif
CUDA_ARCHS ?= native
ifeq ($(strip $(CUDA_ARCHS)),native)
CUDA_GPU_ARCHS := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | sort -u)
CUDA_SASS := $(filter $(CUDA_KNOWN),$(CUDA_GPU_ARCHS))
ifneq ($(strip $(filter-out $(CUDA_KNOWN),$(CUDA_GPU_ARCHS))),)
$(info kiln: this nvcc cannot build SASS for the GPU arch $(filter-out $(CUDA_KNOWN),$(CUDA_GPU_ARCHS)))
endif
else ifeq ($(strip $(CUDA_ARCHS)),all)
CUDA_SASS := $(filter $(CUDA_KNOWN),$(CUDA_ALL))
else ifneq ($(strip $(CUDA_ARCHS)),check)
CUDA_SASS := $(filter $(CUDA_KNOWN),$(CUDA_ARCHS))
endif
ifeq ($(strip $(CUDA_SASS)),)
# check (or native without a GPU nvcc can target): the cheapest build that still compiles every kernel
CUDA_MODE := check
CUDA_PTX := 80
CUDA_GENCODE := -gencode arch=compute_80,code=compute_80 -Xcicc -O0 -DKILN_CUDA_CHECK_BUILD
else
CUDA_MODE := sass
CUDA_PTX := $(lastword $(CUDA_SASS))
CUDA_GENCODE := $(foreach a,$(CUDA_SASS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX)
endif

# cuda_testing.cu (kernels on test data for the GPU tests) goes into the test binaries, not into libkiln
CU_TESTING_OBJ := build/cuda/src/backend/cuda/cuda_testing.o
CU_OBJ := $(filter-out $(CU_TESTING_OBJ),$(CU_SRC:%.cu=build/cuda/%.o))
CUDA_DEFS := -DKILN_HAVE_CUDA
CUDA_LDLIBS := -L$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lstdc++
NVCCFLAGS := -std=c++17 -O3 -Iinclude -Isrc -DKILN_HAVE_CUDA -Xcompiler -fPIC,-Wall,-Wno-unused-function \
             -DKILN_CUDA_ARCHS='"$(CUDA_SASS)"' -DKILN_CUDA_PTX=$(CUDA_PTX) $(CUDA_GENCODE)

# the flags are part of what an object depends on: changing CUDA_ARCHS rebuilds the CUDA objects
CUDA_STAMP := build/cuda/flags.$(shell printf '%s' '$(NVCCFLAGS)' | cksum | cut -d' ' -f1)
$(CUDA_STAMP):
	@mkdir -p $(dir $@)
	@rm -f build/cuda/flags.*
	@touch $@

# every header a .cu includes is a prerequisite too (nvcc -MMD: the .d beside the object)
build/cuda/%.o: %.cu $(wildcard src/backend/cuda/*.cuh) $(wildcard src/backend/cuda/*.h) $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@
-include $(CU_SRC:%.cu=build/cuda/%.d)

# ---- GPU tests: the same tests/*.c without ASan (the CUDA driver and ASan do not mix)
# CUPTI for the first-call gates counted from outside kiln (tests/cuda/cupti_gate.c, tests/test_cuda_gates.c):
# linked into build/cuda/kiln_tests_cuda only, found beside nvcc like libcudart_static; without it the test
# binary is built without those gates (one line says so) and their test skips with the reason
CUPTI_LIB := $(firstword $(wildcard $(CUDA_TOP)/extras/CUPTI/lib64/libcupti.so $(CUDA_TOP)/lib64/libcupti.so \
               $(CUDA_TOP)/targets/*/lib/libcupti.so $(CUDA_LIBDIR)/libcupti.so))
CUPTI_HDR := $(firstword $(wildcard $(CUDA_TOP)/extras/CUPTI/include/cupti.h $(CUDA_TOP)/include/cupti.h \
               $(CUDA_TOP)/targets/*/include/cupti.h))
CUDA_HDR := $(firstword $(wildcard $(CUDA_TOP)/include/cuda_runtime_api.h $(CUDA_TOP)/targets/*/include/cuda_runtime_api.h))
ifneq ($(and $(CUPTI_LIB),$(CUPTI_HDR),$(CUDA_HDR)),)
CUPTI_LIBDIR := $(patsubst %/,%,$(dir $(CUPTI_LIB)))
CUPTI_DEFS := -DKILN_HAVE_CUPTI
CUPTI_OBJ := build/cudatest/tests/cuda/cupti_gate.o
CUPTI_LDLIBS := -L$(CUPTI_LIBDIR) -Wl,-rpath,$(CUPTI_LIBDIR) -lcupti -ldl
$(CUPTI_OBJ): tests/cuda/cupti_gate.c tests/cuda/cupti_gate.h
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) -Itests -isystem $(dir $(CUPTI_HDR)) -isystem $(dir $(CUDA_HDR)) -c $< -o $@
else
$(info kiln: libcupti.so / cupti.h not found beside $(NVCC): build/cuda/kiln_tests_cuda is built without the CUPTI first-call gates)
endif
CUDA_TEST_OBJ := $(TEST_SRC:%.c=build/cudatest/%.o)
CUDA_TEST_LIB := $(LIB_SRC:%.c=build/rel/%.o) $(TOOLS_SRC:%.c=build/rel/%.o) \
                 $(filter-out build/rel/src/cli/main.o,$(CLI_SRC:%.c=build/rel/%.o))

build/cudatest/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $(CUDA_DEFS) $(CUPTI_DEFS) -Itests $(isa_flags) -c $< -o $@
# the AVX-512 emulation (test scaffolding, every kernel unrolled over emulated intrinsics) at -O1, as in the ASan
# build: 18 s instead of 81 s at -O2 on a 2-core box, which held up the GPU machine's test build
build/cudatest/tests/avx512_emu_avx2.o: REL_CFLAGS += -O1

build/cuda/kiln_tests_cuda: $(CUDA_TEST_OBJ) $(CUDA_TEST_LIB) $(CU_OBJ) $(CU_TESTING_OBJ) $(CUPTI_OBJ)
	$(CC) -pthread $(TEST_WRAP) -o $@ $^ $(CUDA_LDLIBS) $(CUPTI_LDLIBS) $(LDLIBS) $(EDIT_LDLIBS) $(CLI_LDLIBS) -lutil

.PHONY: test-cuda bench-cuda budget-cuda defects-cuda
# (the CUPTI gates, tests/test_cuda_gates.c, are among the "cuda" tests)
test-cuda: build/cuda/kiln_tests_cuda kiln
	@KILN_SHARED=$(KILN_SHARED) KILN_BIN=./kiln KILN_REL_BIN=./kiln build/cuda/kiln_tests_cuda cuda

bench-cuda: kiln
	@KILN_SHARED=$(KILN_SHARED) sh bench/cuda_bench.sh
	@KILN_SHARED=$(KILN_SHARED) sh bench/cuda_budget.sh

# the per-kernel budget of one decode step (ncu): smollm2-135m Q8_0 at context 512 unless MODEL_BUDGET=file.gguf
# and / or CTX=n are given
budget-cuda: kiln
	@KILN_SHARED=$(KILN_SHARED) sh bench/cuda_budget.sh "$(MODEL_BUDGET)" "$(CTX)"

# each CUPTI gate red on its deliberate defect (tests/defects/*.patch, applied to scratch copies in /tmp)
defects-cuda:
	@KILN_SHARED=$(KILN_SHARED) sh tests/defects/demo.sh CUDA_ARCHS="$(CUDA_ARCHS)" EDIT_LDLIBS="$(EDIT_LDLIBS)"

else
$(info kiln: $(NVCC) found but not libcudart_static.a beside it, building without CUDA)
endif
else
$(info kiln: no CUDA sources, building without CUDA)
endif
else
$(info kiln: nvcc not found, building without CUDA)
endif
