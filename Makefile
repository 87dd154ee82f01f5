# Troupe's front door. Every target installs missing Debian packages first, then drives CMake.
#   make test        build and run the whole test suite
#   make demo        train a small byte-level GPT on this repository's text (~2 minutes; bf16
#                    mixed precision where the CPU has AVX512-BF16, else fp32; DEMO_BF16=0|1)
#   make demo-pipeline  the same GPT through 4 pipeline stage actors, and 1F1B's and zb's
#                    bubbles measured with synthetic layers beside theory, with a timeline
#   make demo-big    a GPT-2 of GPT-2 XL's shape (1.56 B parameters) trained from scratch for
#                    5 steps on 2 ranks, ZeRO 3 with parameters and optimizer state on NVMe:
#                    memory per rank predicted and measured, loss, tokens/s, I/O hidden, swap
#                    space (DEMO_BIG_ARGS="--shape small": a 38.9 M-parameter check, < 1 minute)
#   make test-asan   the suite under AddressSanitizer + UBSan
#   make test-tsan   the suite under ThreadSanitizer (TSAN_LABELS selects CTest labels)
#   make bench       every benchmark; bench-actors, bench-kernels, bench-demo-bf16, bench-engine,
#                    bench-dp, bench-nvme, bench-pipeline
#                    one group (bench-kernels: Adam and a GPT-2 step against PyTorch 2 at its
#                    best, the `make peers` environment, skipped without it; bench-demo-bf16:
#                    the demo's training in fp32 and in bf16,
#                    their validation losses; bench-dp: data-parallel training and collectives against MPI and
#                    PyTorch 2's DDP, ZeRO-1 and FSDP (the `make peers` environment; skipped
#                    without it), ZeRO 0-3 (stage 3 in DeepSpeed's default window and a tight
#                    one: tokens/s and peak RSS over ZeRO 2's, the all-gathers' time hidden);
#                    bench-nvme: the aio engine against fio on the same file, then
#                    a GPT-2 step with the optimizer state on NVMe and a save's stall)
#   make peers       the benchmark peers' Python environment: pinned PyTorch 2 and DeepSpeed 0.19
#                    from the Python index, in ~/.cache/troupe/peers (TROUPE_PEERS_DIR), kept
#                    by `make clean` (bench/peers/setup.sh; about 5.4 GB). Never called by
#                    test: Troupe's build and tests use Debian packages only
#   make bench-peers Troupe beside DeepSpeed on CPU: per config, the per-step losses from the
#                    same weights, data and JSON compared (bench/peers/equivalence.py), then
#                    tokens/s and peak RSS per rank side by side (bench/peers/speed.py)
#   make fuzz-config the config parser under libFuzzer for FUZZ_SECONDS (600) seconds
#                    (BENCH_ARGS passes options on, e.g. BENCH_ARGS="--reps 9 --only skynet")
#   make install     install libtroupe, headers, troupe.pc and the CMake package (PREFIX)
#   make check       the style (.clang-format) and folder-dependency (docs/architecture.md) checks
#   make format      rewrite every C file as .clang-format says

MAKEFLAGS += --no-print-directory
JOBS    ?= $(shell nproc)
PREFIX  ?= /usr/local
CMAKE   ?= cmake
CTEST_ARGS ?=
TSAN_LABELS ?= unit|stress

.PHONY: all deps build test demo demo-pipeline demo-big pingpong test-asan test-tsan bench bench-actors bench-kernels bench-demo-bf16 bench-engine bench-dp bench-nvme \
        bench-pipeline peers bench-peers install clean fuzz-config check format

all: build

deps:
	@scripts/install-deps.sh

build/CMakeCache.txt: | deps
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX)

build: deps build/CMakeCache.txt
	$(CMAKE) --build build -j $(JOBS)

test: build
	cd build && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

check: deps
	scripts/check-format.sh
	scripts/check-layers.sh

format: deps
	scripts/check-format.sh --fix

# The demo: a byte-level GPT (vocab 256) trained on this repository's own docs and sources
# (packed into build/demo-data/ at build time by tools/pack_text.c) for about two minutes on
# two cores; checkpoint, llm.c export, monitor outputs, the actor trace (3 steps from step 52),
# its summary and a timeline picture go to demo-out/.
DEMO_STEPS ?= 1000
DEMO_MODEL = --model gpt2 --vocab 256 --context 128 --channels 128 --layers 4 --heads 4 \
	--train-data build/demo-data/text_train.bin --val-data build/demo-data/text_val.bin
# bf16 mixed precision where the CPU multiplies bf16 itself (AVX512-BF16), else fp32 (bf16
# would only be emulated); DEMO_BF16=0 or 1 chooses. The config is demo.json plus the bf16 section.
DEMO_BF16 ?= $(shell grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null && echo 1 || echo 0)
demo: build
	rm -rf demo-out
	mkdir -p demo-out
	@if [ "$(DEMO_BF16)" = 1 ]; then \
	    echo "demo: bf16 mixed precision (DEMO_BF16=1, the default where the CPU has AVX512-BF16; DEMO_BF16=0 trains in fp32)"; \
	    sed 's/^{/{ "bf16": { "enabled": true },/' examples/configs/demo.json > demo-out/demo.json; \
	else \
	    echo "demo: fp32 (DEMO_BF16=0, the default where the CPU has no AVX512-BF16 and bf16 is only emulated; DEMO_BF16=1 trains in bf16)"; \
	    cp examples/configs/demo.json demo-out/demo.json; \
	fi
	./build/troupe train --deepspeed_config demo-out/demo.json $(DEMO_MODEL) \
	    --steps $(DEMO_STEPS) --val-every 100 --val-batches 16 --sample 200 \
	    --save-dir demo-out/ckpt --trace demo-out/trace --export-llmc demo-out/gpt2_demo.bin
	./build/troupe trace summary demo-out/trace > demo-out/trace_summary.txt
	cat demo-out/trace_summary.txt
	./build/troupe trace plot demo-out/trace -o demo-out/timeline.svg
	@echo "demo: trace, summary and timeline picture in demo-out/ (open demo-out/timeline.svg)"

# Pipeline parallelism in one process: the byte-level GPT of `make demo` trained through 4
# stage actors (1F1B, 8 micro-batches a step), then 4 stages with synthetic layer costs
# (sleeps) under 1F1B and zb: the measured bubble beside theory, the timeline in
# demo-out/pipeline/ (~20 s).
demo-pipeline: build
	rm -rf demo-out/pipeline
	mkdir -p demo-out/pipeline
	./build/examples/pipeline/pipeline_demo --stages 4 --micro-batches 8 --layer-cost-ms 2 \
	    --train-data build/demo-data/text_train.bin --steps 40 --trace demo-out/pipeline/trace
	./build/troupe trace plot demo-out/pipeline/trace -o demo-out/pipeline/timeline.svg
	@echo "demo-pipeline: timeline picture in demo-out/pipeline/timeline.svg"

# The big demo (examples/demo_big/run.sh, which says what it prints): a GPT-2 of GPT-2 XL's
# shape trained from scratch on the demo's text, 2 ranks, bf16, ZeRO 3 with offload_param and
# offload_optimizer on NVMe (examples/demo_big/ds_config.json). It refuses up front when
# mpirun is missing, when `troupe memory` predicts a rank would not fit this machine, or when
# the disk lacks room for the swap files (up to 20 bytes per parameter and 1 GiB: 30 GiB at
# XL); the swap folder (under build/demo-big, or --dir DIR) is removed at the end, also after
# a failure or an interrupt. Logs and the trace stay in build/demo-big/. DEMO_BIG_ARGS passes
# options on: "--shape small" (4 layers, 512 channels: the harness's check, under a minute),
# "--steps N", "--seq-len T", "--dir DIR".
DEMO_BIG_ARGS ?=
demo-big: build
	@scripts/install-deps.sh time
	examples/demo_big/run.sh build $(DEMO_BIG_ARGS)

# The actor runtime's smallest example (two actors exchanging messages).
pingpong: build
	./build/examples/pingpong/pingpong

build-asan/CMakeCache.txt: | deps
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTR_ASAN=ON -DTR_BUILD_BENCH=OFF

test-asan: deps build-asan/CMakeCache.txt
	$(CMAKE) --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

build-tsan/CMakeCache.txt: | deps
	$(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTR_TSAN=ON -DTR_BUILD_BENCH=OFF

test-tsan: deps build-tsan/CMakeCache.txt
	$(CMAKE) --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
	    ctest --output-on-failure -j $(JOBS) -L '$(TSAN_LABELS)' $(CTEST_ARGS)

bench: bench-actors bench-kernels bench-demo-bf16 bench-engine bench-dp bench-nvme bench-pipeline

# The pipeline's bubble with stage actors and synthetic layers, 1F1B and zb, beside theory.
bench-pipeline: build
	bench/pipeline/run.sh build $(BENCH_ARGS)

# The actor benchmarks against CAF, Go and Erlang (bench/peers/); a peer whose packages cannot
# be installed is skipped, and run.sh says so.
bench-actors: build
	@scripts/install-deps.sh libcaf-dev g++
	@scripts/install-deps.sh golang-go || echo "bench-actors: golang-go could not be installed; the Go peer will be skipped"
	@scripts/install-deps.sh erlang-base || echo "bench-actors: erlang-base could not be installed; the Erlang peer will be skipped"
	$(CMAKE) -S . -B build -DTR_BENCH_PEERS=ON
	$(CMAKE) --build build -j $(JOBS) --target bench-actors-all
	bench/actors/run.sh build $(BENCH_ARGS)

# make demo's training in fp32 and in bf16, same seed: the validation losses and their ratio.
bench-demo-bf16: build
	bench/kernels/demo_bf16.sh build $(DEMO_STEPS) $(DEMO_MODEL)

# Adam against its memory bound, the thread budget's GEMMs beside the gradient norm, and a GPT-2
# step in fp32 and bf16, each beside PyTorch 2 at its best (its Adam implementations; eager or
# torch.compile x fp32 or bf16 autocast x threads x ATen's CPU capability), then head-to-head
# rounds (bench/kernels/run.sh; ROUNDS=3; about 12 minutes on 2 cores, most of it torch.compile
# compiling and bf16 autocast where it is emulated). PyTorch 2 is the
# environment of bench/peers/setup.sh (`make peers`), which run.sh calls: without it, one line
# says why and Troupe's figures print without the ratios.
bench-kernels: build
	$(CMAKE) --build build -j $(JOBS) --target bench-kernels-all
	bench/kernels/run.sh build

# The engine against a plain loop on the same GPT-2 step, and with tracing on (BENCH_ARGS).
bench-engine: build
	$(CMAKE) --build build -j $(JOBS) --target bench_engine
	./build/bench/engine/bench_engine $(BENCH_ARGS)

# Data parallelism: the comm actor against bare MPI collectives, then `troupe train` on 1, 2
# and 4 ranks x ZeRO 0/1/2/3 (stage 3 in two windows, fp32) x overlap_comm beside PyTorch 2's
# DDP, ZeroRedundancyOptimizer and FSDP, each at its best of threads x eager/torch.compile
# (bench/dp/run.sh; about 22 minutes on 2 cores; BENCH_ARGS="--long" for longer runs,
# "--no-peer" without PyTorch). PyTorch 2 is the venv of bench/peers/setup.sh (`make peers`),
# which run.sh calls: without it, one line says why and Troupe's figures print alone.
bench-dp: build
	$(CMAKE) --build build -j $(JOBS) --target bench-dp-all
	bench/dp/run.sh build $(BENCH_ARGS)

# The peers' environment; exit status 3 when it cannot be had (no network), said in one line.
peers:
	bench/peers/setup.sh

# DeepSpeed beside Troupe (bench/peers/run.sh): the equivalence table, then speed and memory.
# Each script runs setup.sh itself; without the environment the equivalence prints why and no
# table, the speed table Troupe's figures alone. numactl: DeepSpeed's --bind_cores_to_rank.
# One table: BENCH_ARGS="--equiv-only --only zero0_1r_adamw --verbose" or "--speed-only --steps 5".
bench-peers: build
	@scripts/install-deps.sh numactl || echo "bench-peers: numactl could not be installed; DeepSpeed's --bind_cores_to_rank runs will fail"
	bench/peers/run.sh build $(BENCH_ARGS)

# The aio engine (`troupe nvme-bench`) against fio (libaio, direct=1) writing then reading the
# same size in a fresh file, same block size, queue depth and jobs, interleaved repetitions,
# medians and the ratios (bench/nvme/run.sh; under a minute). fio is installed if missing.
# The directory defaults to build/bench-nvme: BENCH_ARGS="--dir /mnt/nvme" to measure a drive.
bench-nvme: build
	@scripts/install-deps.sh fio
	bench/nvme/run.sh build $(BENCH_ARGS)
	bench/nvme/step.sh build

build-fuzz/CMakeCache.txt: | deps
	CC=clang $(CMAKE) -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTR_FUZZ=ON \
	    -DTR_BUILD_TESTS=OFF -DTR_BUILD_BENCH=OFF

# New inputs go to build-fuzz/corpus-config; tests/fuzz/config/ holds the kept seeds. A crash
# is written as tests/fuzz/config/crash-* (ignored by git until it becomes a test).
fuzz-config: deps build-fuzz/CMakeCache.txt
	$(CMAKE) --build build-fuzz -j $(JOBS) --target fuzz_config
	mkdir -p build-fuzz/corpus-config
	./build-fuzz/tests/fuzz/fuzz_config -max_total_time=$${FUZZ_SECONDS:-600} \
	    -artifact_prefix=tests/fuzz/config/ -dict=tests/fuzz/config.dict \
	    -print_final_stats=1 build-fuzz/corpus-config tests/fuzz/config

# PREFIX is given at install time, so it takes effect whatever prefix build/ was configured
# with (the configure-time one only chose the default and the lib directory's name).
install: build
	$(CMAKE) --install build --prefix "$(PREFIX)"

clean:
	rm -rf build build-asan build-tsan build-fuzz demo-out
