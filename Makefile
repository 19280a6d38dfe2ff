# Makefile — builds the jdt-train binary, its engine library and its tests.
#
#   make            build build/jdt-train (warnings are errors)
#   make run        install missing packages, build, prepare data, train configs/llm.yaml
#   make test       install missing packages, build, run every unit and end-to-end test
#   make lint       clang-format check and cppcheck (scripts/lint.sh)
#   make SANITIZE=1 ASan/UBSan build in build-asan/ (make SANITIZE=1 test runs the suite there)
#   make CUDA=1     also build the CUDA backend (NVRTC kernels, cuBLAS, NCCL)
#   make fuzz SECONDS=N   build the libFuzzer targets (tests/fuzz/fuzz_*.c, clang, ASan+UBSan)
#                   in build-fuzz/ and run each for N seconds (default 60) on its corpus
#
# Sources are discovered by folder, so adding a file needs no edit here:
#   engine/*/*.c models/*.c datasets/*.c -> libjdt.a;  cmd/*.c -> jdt-train;
#   tests/unit/check_*.c -> one Check suite binary each (linked with tests/unit/testutil.c).

CC      ?= cc
PKGS    := yaml-0.1 hdf5 libcurl libcrypto openblas zlib libpcre2-8 icu-uc cairo
SANITIZE ?= 0
CUDA    ?= 0
CUDA_HOME ?= /usr/local/cuda
WERROR  ?= 1

ifeq ($(CUDA),1)
BUILD   ?= build-cuda
endif
ifeq ($(SANITIZE),1)
BUILD   ?= build-asan
export LSAN_OPTIONS ?= suppressions=$(CURDIR)/tests/infra/lsan.supp
OPT     := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDSAN   := -fsanitize=address,undefined
else
BUILD   ?= build
OPT     ?= -O2 -g
LDSAN   :=
endif

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter \
           -Wpointer-arith -Wvla -Wformat=2 -Wno-format-nonliteral -Wswitch-enum
ifeq ($(WERROR),1)
WARN    += -Werror
endif

# OpenBLAS: Debian's OpenMP build when installed (scripts/install-deps.sh installs it), so GEMMs
# and the OpenMP kernels share libgomp's one thread pool instead of two pools spinning against
# each other. Its directory is searched first by pkg-config and baked in as the run path, so the
# binary gets that variant whatever the libopenblas.so.0 alternative points to.
OPENBLAS_OMP_PC := $(firstword $(wildcard /usr/lib/*/openblas-openmp/pkgconfig/openblas.pc))
# a GNU build ID in every binary (Debian's gcc adds one anyway): the CUDA backend keys the
# attention verdicts it remembers by it (engine/backend/cuda/cuk_cudnn.c)
LDFLAGS    += -Wl,--build-id
ifneq ($(OPENBLAS_OMP_PC),)
PKG_ENV    := PKG_CONFIG_PATH=$(dir $(OPENBLAS_OMP_PC))
LDFLAGS    += -Wl,-rpath,$(shell PKG_CONFIG_PATH=$(dir $(OPENBLAS_OMP_PC)) pkg-config --variable=libdir openblas)
endif
PKG_CFLAGS := $(shell $(PKG_ENV) pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell $(PKG_ENV) pkg-config --libs $(PKGS) 2>/dev/null)
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS   := $(shell pkg-config --libs check 2>/dev/null)

# oneDNN (Debian's libdnnl-dev, no pkg-config file): bf16 GEMMs on AVX512-BF16 CPUs
# (engine/runtime/bf16.c). Optional: without it bf16 GEMMs run as SGEMMs on rounded inputs.
ifneq ($(wildcard /usr/include/oneapi/dnnl/dnnl.h),)
PKG_CFLAGS += -DJDT_HAVE_DNNL
PKG_LIBS   += -ldnnl
endif

CPPFLAGS += -Iengine -I. -D_GNU_SOURCE
CFLAGS   += -std=c11 $(OPT) $(WARN) -fopenmp -pthread $(PKG_CFLAGS)
LDLIBS   += $(PKG_LIBS) -ldl -lm -fopenmp -pthread
LDFLAGS  += $(LDSAN)

LIB_SRCS := $(wildcard engine/*/*.c) $(wildcard engine/backend/cpu/*.c) engine/backend/cuda/emit.c $(wildcard models/*.c) $(wildcard datasets/*.c)

ifeq ($(CUDA),1)
# The CUDA backend's run-time half (the emitter is in every build). Links the CUDA runtime,
# NVRTC and cuBLASLt only: no -lcuda, no -lnccl (NCCL is dlopen'ed), so the binary starts on
# machines without a GPU driver and says so in one line.
CPPFLAGS  += -DJDT_CUDA=1 -I$(CUDA_HOME)/include
LIB_SRCS  += $(filter-out engine/backend/cuda/emit.c,$(wildcard engine/backend/cuda/*.c))
LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lnvrtc -lcublasLt
# The builtin CUDA kernels (engine/backend/cuda/kernels/*.cu[h]) are embedded as C strings in a
# generated file and compiled by NVRTC at run time (engine/backend/cuda/cuk.c).
CUK_KERNEL_SRCS := $(sort $(wildcard engine/backend/cuda/kernels/*.cuh engine/backend/cuda/kernels/*.cu))
CUK_GEN   := $(BUILD)/gen/cuk_sources.c
LIB_SRCS  += $(CUK_GEN)
endif

CMD_SRCS  := $(wildcard cmd/*.c)
UNIT_SRCS := $(wildcard tests/unit/check_*.c)
ifneq ($(CUDA),1)
# the builtin CUDA kernels' suite tests CUDA code only: built and run by `make test-cuda`
UNIT_SRCS := $(filter-out tests/unit/check_cuk.c,$(UNIT_SRCS))
endif
BENCH_SRCS := $(wildcard scripts/bench/*.c)
TESTUTIL  := tests/unit/testutil.c

LIB_OBJS  := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)
CMD_OBJS  := $(CMD_SRCS:%.c=$(BUILD)/obj/%.o)
TU_OBJS   := $(TESTUTIL:%.c=$(BUILD)/obj/%.o)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_BINS := $(BENCH_SRCS:scripts/bench/%.c=$(BUILD)/bench/%)
LIB       := $(BUILD)/libjdt.a
BIN       := $(BUILD)/jdt-train

.SECONDARY:
.PHONY: all deps run test test-cuda unit e2e clean bench bench-build tests-build format lint fuzz fuzz-build
all: $(BIN)

ifeq ($(CUDA),1)
$(CUK_GEN): $(CUK_KERNEL_SRCS) engine/backend/cuda/embed.sh
	@mkdir -p $(dir $@)
	sh engine/backend/cuda/embed.sh $@ $(CUK_KERNEL_SRCS)
endif

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(CHECK_CFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

$(BIN): $(CMD_OBJS) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(CMD_OBJS) $(LIB) $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(TU_OBJS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(TU_OBJS) $(LIB) $(CHECK_LIBS) $(LDLIBS)

ifeq ($(CUDA),1)
# The host CUDA emulator (tests/infra/cudaemu): a stand-in for libcudart, libnvrtc and
# libcublasLt that runs every kernel on the CPU. jdt-train-emu and the *-emu test binaries are
# the CUDA build linked against it instead, so the CUDA backend runs end to end without a GPU.
CUDAEMU_SO := $(BUILD)/libjdtcudaemu.so
EMU_LDLIBS := $(filter-out -lcudart -lnvrtc -lcublasLt,$(LDLIBS)) -L$(BUILD) \
              -Wl,-rpath,$(CURDIR)/$(BUILD) -ljdtcudaemu
$(CUDAEMU_SO): tests/infra/cudaemu/cudaemu.c tests/infra/cudaemu/emu.hpp
	$(CC) -std=c11 $(OPT) $(WARN) -Wno-missing-prototypes -Wno-switch-enum -fPIC -shared -isystem $(CUDA_HOME)/include \
	    -DCUDAEMU_DIR='"$(CURDIR)/tests/infra/cudaemu"' $< -o $@ -ldl

NCCLEMU_SO := $(BUILD)/libjdtncclemu.so
$(NCCLEMU_SO): tests/infra/cudaemu/ncclemu.c
	$(CC) -std=c11 $(OPT) $(WARN) -Wno-missing-prototypes -Wno-switch-enum -fPIC -shared \
	    -isystem $(CUDA_HOME)/include $< -o $@

# the emulator's cuDNN (cuDNN's graph API interpreted on the host), where cuDNN's headers are
# installed; without them the cuDNN attention tests skip, saying cuDNN cannot be loaded
CUDNNEMU_SO := $(if $(wildcard $(CUDA_HOME)/include/cudnn_graph.h),$(BUILD)/libjdtcudnnemu.so)
$(BUILD)/libjdtcudnnemu.so: tests/infra/cudaemu/cudnnemu.c
	$(CC) -std=c11 $(OPT) $(WARN) -Wno-missing-prototypes -Wno-switch-enum -fPIC -shared \
	    -isystem $(CUDA_HOME)/include $< -o $@ -lm -ldl

$(BUILD)/jdt-train-emu: $(CMD_OBJS) $(LIB) $(CUDAEMU_SO) $(NCCLEMU_SO) $(CUDNNEMU_SO)
	$(CC) $(LDFLAGS) -o $@ $(CMD_OBJS) $(LIB) $(EMU_LDLIBS)

$(BUILD)/tests/%-emu: $(BUILD)/obj/tests/unit/%.o $(TU_OBJS) $(LIB) $(CUDAEMU_SO) $(NCCLEMU_SO) $(CUDNNEMU_SO)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(TU_OBJS) $(LIB) $(CHECK_LIBS) $(EMU_LDLIBS)
endif

# scripts/bench/*.c: benchmark drivers linked with the engine (run by scripts/bench/*.sh)
$(BUILD)/bench/%: $(BUILD)/obj/scripts/bench/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

bench-build: $(BENCH_BINS)

deps:
	@bash scripts/install-deps.sh

run: deps
	@$(MAKE) --no-print-directory all
	@bash scripts/run-main.sh $(BIN)

# Where CUDA's headers and NVRTC are installed (CI has them, but no GPU), `make test` also
# builds the CUDA backend (build-cuda/) and runs its suite: NVRTC compiles every generated
# kernel for sm_90; its GPU tests skip, printing why. The default build never needs CUDA.
CUDA_FOUND := $(wildcard $(CUDA_HOME)/include/nvrtc.h)
test: deps
	@$(MAKE) --no-print-directory all tests-build
	@if [ "$(CUDA)" != 1 ] && [ -n "$(CUDA_FOUND)" ]; then \
	    $(MAKE) --no-print-directory CUDA=1 build-cuda/jdt-train-emu; fi
	@st=0; sum=$$(mktemp /tmp/jdt-test-summary.XXXXXX); \
	JDT_TEST_SUMMARY=$$sum bash tests/run-all.sh $(BUILD) || st=1; \
	if [ "$(CUDA)" != 1 ] && [ -n "$(CUDA_FOUND)" ]; then \
	    JDT_TEST_SUMMARY=$$sum $(MAKE) --no-print-directory test-cuda || st=1; fi; \
	echo "== make test: $$([ $$st = 0 ] && echo passed || echo FAILED)"; cat $$sum; rm -f $$sum; exit $$st

# The CUDA suites (tests/run-cuda.sh, two queues side by side): NVRTC and host-side checks, then
# their GPU test cases on the host CUDA emulator (tests/infra/cudaemu; the *-emu binaries;
# MALLOC_PERTURB_ fills freed memory, so a use after free of deferred work crashes every time),
# then the command-line checks. On a machine with a GPU the plain binaries run the GPU cases on
# it too. The emulator runs a block's warps one at a time, the last first, each thread of a warp
# in reverse order, for check_cuda-emu and check_cuk-emu (tests/e2e/cuda_emu.sh, whose training
# runs every builtin, runs them forward: a race between barriers shows up in one of the two
# orders), lands check_cuk-emu's cp.async copies when issued (the others' when waited for),
# and builds check_cuk-emu's kernels with UBSan (misaligned vector accesses, shifts, signed
# overflow).
EMU_TESTS := build-cuda/jdt-train-emu build-cuda/tests/check_cuda-emu build-cuda/tests/check_cuk-emu
test-cuda:
	@$(MAKE) --no-print-directory CUDA=1 build-cuda/jdt-train build-cuda/tests/check_cuda build-cuda/tests/check_cuk $(EMU_TESTS)
	@bash tests/run-cuda.sh $(BUILD)

tests-build: $(BIN) $(UNIT_BINS) $(BENCH_BINS)

unit: tests-build
	@bash tests/run-all.sh $(BUILD) unit

e2e: $(BIN)
	@bash tests/run-all.sh $(BUILD) e2e

bench: all bench-build
	@bash scripts/bench/run-all.sh $(BIN)

# lint: clang-format --dry-run -Werror and cppcheck over the C sources (scripts/lint.sh; files
# in scripts/lint/format-baseline.txt predate the format check and are skipped by it)
lint: deps
	@bash scripts/lint.sh

format:
	clang-format -i $(LIB_SRCS) $(CMD_SRCS) $(UNIT_SRCS) $(wildcard engine/*/*.h)

# print-VAR: prints a make variable (tests/e2e/build_switch_enum.sh reads WARN)
print-%:
	@echo $($*)

clean:
	rm -rf build build-asan build-cuda build-fuzz

# ---- fuzzing (tests/fuzz/README.md) ----------------------------------------------------------
# The engine is rebuilt with clang, ASan, UBSan and libFuzzer's coverage hooks; each target is
# linked with libFuzzer's main. `make fuzz` runs them one after another, each for $(SECONDS) s,
# on build-fuzz/corpus/<target> (new inputs) seeded from tests/fuzz/corpus/<target> (kept in
# git); a finding stops make with the crash file named (build-fuzz/crash-*).
FUZZ_CC     ?= clang
FUZZ_BUILD  := build-fuzz
SECONDS     ?= 60
FUZZ_OPT    := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS := -std=c11 $(FUZZ_OPT) $(filter-out -Werror,$(WARN)) -Wno-unknown-pragmas -Wno-pass-failed -fopenmp -pthread $(PKG_CFLAGS)
FUZZ_SRCS   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS   := $(FUZZ_SRCS:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
FUZZ_OBJS   := $(LIB_SRCS:%.c=$(FUZZ_BUILD)/obj/%.o)

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_BUILD)/libjdt.a: $(FUZZ_OBJS)
	rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz-input.h tests/fuzz/fuzz-h5.h $(FUZZ_BUILD)/libjdt.a
	$(FUZZ_CC) $(CPPFLAGS) -Itests/fuzz $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< \
	    $(FUZZ_BUILD)/libjdt.a $(PKG_LIBS) -ldl -lm -fopenmp -pthread

fuzz-build: $(FUZZ_BINS)

fuzz: fuzz-build
	@for b in $(FUZZ_BINS); do t=$$(basename $$b | sed 's/^fuzz_//'); \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	  echo "fuzz: $$t for $(SECONDS) s (log: $(FUZZ_BUILD)/$$t.log)"; \
	  $$b -max_total_time=$(SECONDS) -timeout=20 -rss_limit_mb=3072 -max_len=4096 \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/ \
	    $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t > $(FUZZ_BUILD)/$$t.log 2>&1; rc=$$?; \
	  grep -E "^#[0-9]+ *(INITED|DONE)|^stat::(number_of_executed_units|peak_rss_mb)" \
	    $(FUZZ_BUILD)/$$t.log | sed 's/^/  /'; \
	  if [ $$rc -ne 0 ]; then tail -n 60 $(FUZZ_BUILD)/$$t.log; \
	    echo "fuzz: $$t found a failure (exit $$rc; input saved as $(FUZZ_BUILD)/crash-* or leak-*)"; \
	    exit 1; fi; \
	done

-include $(FUZZ_OBJS:.o=.d)
-include $(LIB_OBJS:.o=.d) $(CMD_OBJS:.o=.d) $(TU_OBJS:.o=.d) $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/obj/tests/unit/%.d)
