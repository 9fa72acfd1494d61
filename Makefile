# kiln — build, test, run.
#   make            libkiln.a, libkiln.so, kiln, kiln.pc (installs missing Debian build deps first)
#   make run        generate text from the default model (MODEL=path.gguf to override)
#   make test       ASan+UBSan test suite; last line "N passed, N failed, N skipped"
#   make bench      benchmarks (bench/), results go to bench/RESULTS.md by hand
#   make fuzz       libFuzzer target for the GGUF reader (clang)
#   make install PREFIX=/usr/local
KILN_SHARED ?= ../shared
MODEL ?= $(KILN_SHARED)/models/tinystories-656K/TinyStories-656K-Q8_0.gguf
PREFIX ?= /usr/local
# parallel jobs of the recursive builds (make, make test)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif

WARN := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
BASEFLAGS := -std=c11 -D_GNU_SOURCE -Iinclude -Isrc $(WARN) -pthread -MMD -MP
REL_CFLAGS := $(BASEFLAGS) -O2 -g -fPIC
ASAN_CFLAGS := $(BASEFLAGS) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined -DKILN_TESTING
AVX2_FLAGS := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c
LDLIBS := -lpcre2-8 -ljansson -lm -lpthread
# the CLI only (kiln chat's line editing); chat_input.c builds without it when the header is missing
EDIT_LDLIBS ?= $(if $(wildcard /usr/include/editline/readline.h),-ledit)
# the CLI only: kiln serve's HTTP (src/server)
CLI_LDLIBS := -lmicrohttpd
# per-file ISA flags: *_avx2.c and *_avx512.c are compiled for those ISAs and dispatched at run time
isa_flags = $(if $(findstring _avx512,$<),$(AVX512_FLAGS),$(if $(findstring _avx2,$<),$(AVX2_FLAGS)))

LIB_SRC := $(sort $(wildcard src/base/*.c src/gguf/*.c src/formats/*.c src/model/*.c src/tokenizer/*.c src/chat/*.c \
             src/sample/*.c src/session/*.c src/backend/cpu/*.c src/tools/*.c))
# the server (src/server) is part of the CLI, not of libkiln
CLI_SRC := $(sort $(wildcard src/cli/*.c src/server/*.c))
TEST_SRC := $(sort $(wildcard tests/*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

# ---- optional CUDA backend (built when nvcc is present) ----
NVCC ?= $(shell command -v nvcc 2>/dev/null || ( [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc ))
CU_SRC := $(sort $(wildcard src/backend/cuda/*.cu))
-include src/backend/cuda/cuda.mk

REL_OBJ := $(LIB_SRC:%.c=build/rel/%.o) $(CU_OBJ)
ASAN_OBJ := $(LIB_SRC:%.c=build/asan/%.o) $(CU_OBJ)
CLI_REL_OBJ := $(CLI_SRC:%.c=build/rel/%.o)
CLI_ASAN_OBJ := $(CLI_SRC:%.c=build/asan/%.o)
# the CLI's commands minus main(), linked into the tests
CLI_ASAN_NOMAIN := $(filter-out build/asan/src/cli/main.o,$(CLI_ASAN_OBJ))
TEST_OBJ := $(TEST_SRC:%.c=build/asan/%.o)

.PHONY: all build deps run test test-build bench fuzz install clean kiln.pc
.DEFAULT_GOAL := all

all: deps
	@$(MAKE) --no-print-directory -j$(JOBS) build

deps:
	@sh scripts/install-deps.sh

build: libkiln.a libkiln.so kiln kiln.pc

build/rel/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $(CUDA_DEFS) $(isa_flags) -c $< -o $@

build/asan/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(CUDA_DEFS) $(isa_flags) -c $< -o $@

libkiln.a: $(REL_OBJ)
	@rm -f $@
	ar rcs $@ $^

libkiln.so: $(REL_OBJ)
	$(CC) -shared -pthread -o $@ $^ $(CUDA_LDLIBS) $(LDLIBS)

kiln: $(CLI_REL_OBJ) libkiln.a
	$(CC) -pthread -o $@ $(CLI_REL_OBJ) libkiln.a $(CUDA_LDLIBS) $(LDLIBS) $(EDIT_LDLIBS) $(CLI_LDLIBS)

# always rewritten, so that `make install PREFIX=...` records that prefix
kiln.pc:
	@printf 'prefix=%s\nlibdir=$${prefix}/lib\nincludedir=$${prefix}/include\n\nName: kiln\nDescription: LLM inference engine for GGUF models\nVersion: 0.1.0\nLibs: -L$${libdir} -lkiln\nLibs.private: %s\nCflags: -I$${includedir}\n' \
		'$(PREFIX)' '$(CUDA_LDLIBS) $(LDLIBS)' > $@

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 libkiln.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 libkiln.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/kiln.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 kiln $(DESTDIR)$(PREFIX)/bin/
	install -m 644 kiln.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/

run: all
	./kiln run -m $(MODEL) -p "Once upon a time" -n 120

# ---- tests ----
TEST_WRAP := -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc -Wl,--wrap=posix_memalign \
             -Wl,--wrap=aligned_alloc -Wl,--wrap=strdup -Wl,--wrap=strndup
build/asan/kiln_tests: $(TEST_OBJ) $(ASAN_OBJ) $(CLI_ASAN_NOMAIN)
	$(CC) -fsanitize=address,undefined -pthread $(TEST_WRAP) -o $@ $^ $(CUDA_LDLIBS) $(LDLIBS) $(EDIT_LDLIBS) $(CLI_LDLIBS) -lutil

build/asan/kiln: $(CLI_ASAN_OBJ) $(ASAN_OBJ)
	$(CC) -fsanitize=address,undefined -pthread -o $@ $^ $(CUDA_LDLIBS) $(LDLIBS) $(EDIT_LDLIBS) $(CLI_LDLIBS)

test-build: build/asan/kiln_tests build/asan/kiln kiln

test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) test-build
	@KILN_SHARED=$(KILN_SHARED) KILN_BIN=build/asan/kiln KILN_REL_BIN=./kiln sh scripts/run-tests.sh

# ---- benchmarks and fuzzing ----
bench: all
	@KILN_SHARED=$(KILN_SHARED) sh bench/run.sh

fuzz: deps
	@$(MAKE) --no-print-directory build/fuzz/gguf_fuzz

FUZZ_SRC := $(sort $(wildcard src/base/*.c src/gguf/*.c src/formats/*.c))
# (gguf engineer) objects built one by one so that *_avx2.c / *_avx512.c get their ISA flags
FUZZ_OBJ := $(FUZZ_SRC:%.c=build/fuzz/%.o)
build/fuzz/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(BASEFLAGS) -O1 -g -fsanitize=fuzzer-no-link,address,undefined $(isa_flags) -c $< -o $@
build/fuzz/gguf_fuzz: fuzz/gguf_fuzz.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	clang $(BASEFLAGS) -O1 -g -fsanitize=fuzzer,address,undefined -o $@ fuzz/gguf_fuzz.c $(FUZZ_OBJ) -lm

clean:
	rm -rf build libkiln.a libkiln.so kiln kiln.pc

-include $(shell find build -name '*.d' 2>/dev/null)
