# kiln — build, test, run.
#   make            libkiln.a, libkiln.so (libkiln.so.0.1.0, SONAME libkiln.so.0), kiln, kiln.pc; never
#                   runs a package manager; honours CC, CFLAGS, CPPFLAGS, LDFLAGS
#   make run        installs missing build packages (scripts/install-deps.sh), builds, generates text
#                   from the default model (MODEL=path.gguf to override)
#   make test       installs missing build + test packages, then the ASan+UBSan test suite;
#                   last line "N passed, N failed, N skipped"
#   make bench      benchmarks (bench/), results go to bench/RESULTS.md by hand
#   make fuzz       libFuzzer target for the GGUF reader (clang)
#   make cross-aarch64   compiles every library and tool .c file with aarch64-linux-gnu-gcc -Werror
#   make test-aarch64    the format, kernel and thread-pool tests built for aarch64 (static), run under qemu-aarch64
#   make install PREFIX=/usr/local [DESTDIR=...]
# CUDA machine code: CUDA_ARCHS=native|all|check|"80 90 ..." (see src/backend/cuda/cuda.mk).
KILN_SHARED ?= ../shared
MODEL ?= $(KILN_SHARED)/models/tinystories-656K/TinyStories-656K-Q8_0.gguf
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
# parallel jobs of the recursive builds (make run, make test)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif
# the packager's flags: CFLAGS replaces the default optimisation of the release build; CPPFLAGS and LDFLAGS
# are added to every release compile and link
CFLAGS ?= -O2 -g
CPPFLAGS ?=
LDFLAGS ?=

VERSION := $(shell sed -n 's/^\#define KILN_VERSION_STRING "\(.*\)"/\1/p' include/kiln.h)
SOVERSION := $(firstword $(subst ., ,$(VERSION)))
SONAME := libkiln.so.$(SOVERSION)
SOFILE := libkiln.so.$(VERSION)

WARN := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
BASEFLAGS := -std=c11 -D_GNU_SOURCE -Iinclude -Isrc $(WARN) -pthread -MMD -MP
REL_CFLAGS := $(BASEFLAGS) -fPIC $(CFLAGS) $(CPPFLAGS)
ASAN_CFLAGS := $(BASEFLAGS) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined -DKILN_TESTING $(CPPFLAGS)
LDLIBS := -lpcre2-8 -ljansson -lm -lpthread

# ---- the target's ISA: the AVX2 / AVX-512 files and flags exist only on x86 (elsewhere the portable C
# kernels run; the dispatch code references the x86 variants only under KILN_X86, see src/formats/blocks.h)
TARGET_MACHINE := $(shell $(CC) -dumpmachine 2>/dev/null)
IS_X86 := $(if $(filter x86_64-% i386-% i486-% i586-% i686-% amd64-%,$(TARGET_MACHINE)),1)
AVX2_FLAGS := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c
X86_ONLY_SRC := %_avx2.c %_avx512.c
# the NEON files exist only in aarch64 builds (NEON is part of its base ISA; no flags, no run-time check)
IS_ARM64 := $(if $(filter aarch64-% arm64-%,$(TARGET_MACHINE)),1)
NEON_ONLY_SRC := %_neon.c
# the files of other ISAs than the target's
OTHER_ISA_SRC := $(if $(IS_X86),$(NEON_ONLY_SRC),$(X86_ONLY_SRC) $(if $(IS_ARM64),,$(NEON_ONLY_SRC)))
# per-file ISA flags: *_avx2.c and *_avx512.c are compiled for those ISAs and dispatched at run time
isa_flags = $(if $(findstring _avx512,$<),$(AVX512_FLAGS),$(if $(findstring _avx2,$<),$(AVX2_FLAGS)))

# ---- sources (wildcards, so that a new folder's files join without editing this list)
# the shipped library
LIB_SRC_ALL := $(sort $(wildcard src/base/*.c src/gguf/*.c src/formats/*.c src/model/*.c src/tokenizer/*.c \
                 src/chat/*.c src/sample/*.c src/session/*.c src/backend/cpu/*.c))
LIB_SRC := $(filter-out $(OTHER_ISA_SRC),$(LIB_SRC_ALL))
# offline tools (quantize, mkmodel, tokenizer.json importer): build/libkiln-tools.a, linked into the CLI
# and the tests, not part of libkiln
TOOLS_SRC := $(sort $(wildcard src/tools/*.c))
# the command line, with the HTTP server
CLI_SRC := $(sort $(wildcard src/cli/*.c src/server/*.c))
# the CLI only (kiln chat's line editing); chat_input.c builds without it when the header is missing
EDIT_LDLIBS ?= $(if $(wildcard /usr/include/editline/readline.h),-ledit)
# the CLI only: kiln serve's HTTP (src/server)
CLI_LDLIBS := -lmicrohttpd
TEST_SRC := $(sort $(wildcard tests/*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

# ---- optional CUDA backend (built when nvcc is present)
NVCC ?= $(shell command -v nvcc 2>/dev/null || ( [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc ))
CU_SRC := $(sort $(wildcard src/backend/cuda/*.cu))
-include src/backend/cuda/cuda.mk

REL_OBJ := $(LIB_SRC:%.c=build/rel/%.o) $(CU_OBJ)
ASAN_OBJ := $(LIB_SRC:%.c=build/asan/%.o) $(CU_OBJ)
TOOLS_REL_OBJ := $(TOOLS_SRC:%.c=build/rel/%.o)
TOOLS_ASAN_OBJ := $(TOOLS_SRC:%.c=build/asan/%.o)
CLI_REL_OBJ := $(CLI_SRC:%.c=build/rel/%.o)
CLI_ASAN_OBJ := $(CLI_SRC:%.c=build/asan/%.o)
# the CLI's commands minus main(), linked into the tests
CLI_ASAN_NOMAIN := $(filter-out build/asan/src/cli/main.o,$(CLI_ASAN_OBJ))
TEST_OBJ := $(TEST_SRC:%.c=build/asan/%.o)

.PHONY: all build deps test-deps run test test-build bench fuzz install clean kiln.pc cross-aarch64 test-aarch64
.DEFAULT_GOAL := all

all: build

# only `make run`, `make test` (and fuzz) install packages; `make` and `make install` never do
deps:
	@sh scripts/install-deps.sh

test-deps:
	@sh scripts/install-deps.sh --test

build: libkiln.a libkiln.so kiln kiln.pc

build/rel/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(REL_CFLAGS) $(CUDA_DEFS) $(isa_flags) -c $< -o $@

build/asan/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(CUDA_DEFS) $(isa_flags) -c $< -o $@

# libkiln.a holds one object: every library object prelinked (-r), then every symbol that include/kiln.h
# does not declare made local, so a static link never collides with another library's names either (ggml's
# gguf_*, ...). The kiln command and the tests link the objects themselves (they use internal functions).
OBJCOPY ?= objcopy
build/rel/libkiln_all.o: $(REL_OBJ) build/kiln.syms
	$(CC) -r -nostdlib -o $@.tmp $(REL_OBJ)
	$(OBJCOPY) --keep-global-symbols=build/kiln.syms $@.tmp $@
	@rm -f $@.tmp

libkiln.a: build/rel/libkiln_all.o
	@rm -f $@
	$(AR) rcs $@ $^

# the same objects with their internal names, for programs inside the tree (bench/)
build/libkiln-internal.a: $(REL_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

build/libkiln-tools.a: $(TOOLS_REL_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

# The libraries export exactly the functions declared in include/kiln.h: their names come from the
# preprocessed header (every kiln_name followed by '('); the shared library's version script makes
# everything else local.
build/kiln.syms: include/kiln.h
	@mkdir -p $(dir $@)
	@$(CC) -E -P -x c include/kiln.h | grep -o 'kiln_[A-Za-z0-9_]*[[:space:]]*(' | \
	    sed 's/[[:space:]]*($$//' | sort -u > $@.tmp && mv $@.tmp $@

build/kiln.map: build/kiln.syms
	@{ echo '{'; echo '  global:'; sed 's/^/    /; s/$$/;/' build/kiln.syms; echo '  local: *;'; echo '};'; } > $@.tmp && \
	    mv $@.tmp $@

$(SOFILE): $(REL_OBJ) build/kiln.map
	$(CC) -shared -pthread -Wl,-soname,$(SONAME) -Wl,--version-script,build/kiln.map $(LDFLAGS) \
		-o $@ $(REL_OBJ) $(CUDA_LDLIBS) $(LDLIBS)

$(SONAME): $(SOFILE)
	ln -sf $(SOFILE) $@

libkiln.so: $(SONAME)
	ln -sf $(SONAME) $@

kiln: $(CLI_REL_OBJ) build/libkiln-tools.a $(REL_OBJ)
	$(CC) -pthread $(LDFLAGS) -o $@ $(CLI_REL_OBJ) build/libkiln-tools.a $(REL_OBJ) $(CUDA_LDLIBS) $(LDLIBS) $(EDIT_LDLIBS) $(CLI_LDLIBS)

# always rewritten, so that `make install PREFIX=...` records that prefix
kiln.pc:
	@printf 'prefix=%s\nlibdir=%s\nincludedir=$${prefix}/include\n\nName: kiln\nDescription: LLM inference engine for GGUF models\nVersion: %s\nLibs: -L$${libdir} -lkiln\nLibs.private: %s\nCflags: -I$${includedir}\n' \
		'$(PREFIX)' '$(LIBDIR)' '$(VERSION)' '$(CUDA_LDLIBS) $(LDLIBS)' > $@

install: build
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 644 libkiln.a $(DESTDIR)$(LIBDIR)/
	install -m 755 $(SOFILE) $(DESTDIR)$(LIBDIR)/
	ln -sf $(SOFILE) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libkiln.so
	install -m 644 include/kiln.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 kiln $(DESTDIR)$(PREFIX)/bin/
	install -m 644 kiln.pc $(DESTDIR)$(LIBDIR)/pkgconfig/

run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) build
	./kiln run -m $(MODEL) -p "Once upon a time" -n 120

# ---- cross compile check: every library and tool .c file for aarch64 (portable and NEON kernels), -Werror.
# pcre2.h and jansson.h are architecture-independent and come from the host's /usr/include, searched last.
CROSS_CC ?= aarch64-linux-gnu-gcc
CROSS_CC_FOUND := $(shell command -v $(CROSS_CC) 2>/dev/null)
CROSS_SRC := $(filter-out $(X86_ONLY_SRC),$(LIB_SRC_ALL) $(TOOLS_SRC))
CROSS_OBJ := $(CROSS_SRC:%.c=build/aarch64/%.o)
build/aarch64/%.o: %.c
	@mkdir -p $(dir $@)
	$(CROSS_CC) $(BASEFLAGS) -O2 -fPIC -idirafter /usr/include -c $< -o $@

# then linked into one shared object whose every needed symbol must exist on aarch64 (no x86 kernel named)
cross-aarch64: $(CROSS_OBJ)
	@echo "kiln: $(words $(CROSS_OBJ)) files compiled for aarch64 with $(CROSS_CC) -Werror"
	@sh scripts/cross-link-check.sh $(CROSS_CC) build/aarch64/libkiln.so $(CROSS_OBJ)

# ---- tests ----
TEST_WRAP := -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc -Wl,--wrap=posix_memalign \
             -Wl,--wrap=aligned_alloc -Wl,--wrap=strdup -Wl,--wrap=strndup
# ---- the format, kernel and thread-pool tests on aarch64: one static test binary (the test runner, test_base.c,
# test_formats.c, test_cpu_kernels.c and the library files they need; no PCRE2 or Jansson) run under qemu-user
QEMU_AARCH64 ?= qemu-aarch64
ARM_TEST_SRC := tests/main.c tests/test_base.c tests/test_formats.c tests/test_cpu_kernels.c \
                $(filter-out $(X86_ONLY_SRC),$(wildcard src/base/*.c src/formats/*.c src/gguf/*.c)) \
                src/backend/cpu/cpu_attn.c src/backend/cpu/cpu_attn_neon.c src/backend/cpu/cpu_gemm.c \
                src/backend/cpu/cpu_matmul.c src/backend/cpu/cpu_ops.c src/backend/cpu/cpu_repack.c
build/aarch64/kiln_kernel_tests: $(ARM_TEST_SRC:%.c=build/aarch64/%.o)
	$(CROSS_CC) -static -pthread $(TEST_WRAP) -o $@ $^ -lm

test-aarch64: build/aarch64/kiln_kernel_tests
	@KILN_SHARED=$(KILN_SHARED) $(QEMU_AARCH64) build/aarch64/kiln_kernel_tests

build/asan/kiln_tests: $(TEST_OBJ) $(ASAN_OBJ) $(TOOLS_ASAN_OBJ) $(CLI_ASAN_NOMAIN) $(CU_TESTING_OBJ)
	$(CC) -fsanitize=address,undefined -pthread $(TEST_WRAP) -o $@ $^ $(CUDA_LDLIBS) $(LDLIBS) $(EDIT_LDLIBS) $(CLI_LDLIBS) -lutil

build/asan/kiln: $(CLI_ASAN_OBJ) $(TOOLS_ASAN_OBJ) $(ASAN_OBJ)
	$(CC) -fsanitize=address,undefined -pthread -o $@ $^ $(CUDA_LDLIBS) $(LDLIBS) $(EDIT_LDLIBS) $(CLI_LDLIBS)

test-build: build/asan/kiln_tests build/asan/kiln build $(if $(CROSS_CC_FOUND),cross-aarch64 build/aarch64/kiln_kernel_tests)

test: test-deps
	@$(MAKE) --no-print-directory -j$(JOBS) test-build
	@if command -v $(CROSS_CC) >/dev/null 2>&1 && command -v $(QEMU_AARCH64) >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory test-aarch64; \
	else echo "kiln: $(CROSS_CC) or $(QEMU_AARCH64) missing: the aarch64 tests did not run"; fi
	@KILN_SHARED=$(KILN_SHARED) KILN_BIN=build/asan/kiln KILN_REL_BIN=./kiln sh scripts/run-tests.sh

# ---- benchmarks and fuzzing ----
bench: deps
	@$(MAKE) --no-print-directory -j$(JOBS) build build/libkiln-internal.a
	@KILN_SHARED=$(KILN_SHARED) KILN_BENCH_LIBS='build/libkiln-tools.a build/libkiln-internal.a $(CUDA_LDLIBS) $(LDLIBS)' \
		sh bench/run.sh

fuzz: test-deps
	@$(MAKE) --no-print-directory build/fuzz/gguf_fuzz

FUZZ_SRC := $(sort $(wildcard src/base/*.c src/gguf/*.c src/formats/*.c))
FUZZ_SRC := $(filter-out $(OTHER_ISA_SRC),$(FUZZ_SRC))
# (gguf engineer) objects built one by one so that *_avx2.c / *_avx512.c get their ISA flags
FUZZ_OBJ := $(FUZZ_SRC:%.c=build/fuzz/%.o)
build/fuzz/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(BASEFLAGS) -O1 -g -fsanitize=fuzzer-no-link,address,undefined $(isa_flags) -c $< -o $@
build/fuzz/gguf_fuzz: fuzz/gguf_fuzz.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	clang $(BASEFLAGS) -O1 -g -fsanitize=fuzzer,address,undefined -o $@ fuzz/gguf_fuzz.c $(FUZZ_OBJ) -lm

clean:
	rm -rf build libkiln.a libkiln.so libkiln.so.* kiln kiln.pc

-include $(shell find build -name '*.d' 2>/dev/null)
