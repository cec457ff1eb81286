# make setup: the virtual environment (torch pinned and first, then the rest); idempotent.
# make run:   the default sweep (results/report/index.html).   make test: the test suite.
# make ports: the third-party ports (transcribe.cpp, whisper.cpp, llama.cpp, openmoss), built once into a cache.
# make environments: the reference environments the configs name (NeMo 2.4.1), built once into a cache.
# make setup-vulkan, make setup-cuda: ggml-python rebuilt with that backend (docs/backends.md).
PYTHON ?= python3
VENV ?= .venv
CORES ?= 2
BIN := $(VENV)/bin
STAMP := $(VENV)/.audioparity-installed
VULKAN_STAMP := $(VENV)/.audioparity-vulkan
CUDA_STAMP := $(VENV)/.audioparity-cuda
export PATH := $(abspath $(BIN)):$(PATH)
export GGML_NO_BACKTRACE := 1
# ggml-python's compile (CMake, under pip: setup/ggml-python.sh) runs on every core of the
# machine; CORES stays what a run, the tests and the ports' builds (--jobs) take.
CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc)
export CMAKE_BUILD_PARALLEL_LEVEL := $(CMAKE_BUILD_PARALLEL_LEVEL)
# ggml-vulkan lists a CPU driver (Mesa's lavapipe) only when this names it; 0 is the device the
# workflow's Vulkan cells run on (--device 0), and every manifest and the report name it.
export GGML_VK_VISIBLE_DEVICES ?= 0
# The ggml builds, by GGML_BACKEND: the CMake arguments and the patch each adds to the CPU
# backend's, which every build applies: q8_0 x q8_0 and f32 x f32 matmul kernels for
# prompt-sized inputs (BENCHMARKS.md, "A q8_0 kernel", "An f32 kernel"; docs/backends.md).
GGML_CMAKE_ARGS ?= -DGGML_LLAMAFILE=ON
GGML_BACKEND ?= cpu
CUDA_ARCHITECTURES ?= native
GGML_ARGS_vulkan := -DGGML_VULKAN=ON
GGML_ARGS_cuda = -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHITECTURES)
GGML_PATCH_cpu := setup/patches/ggml-python-cpu-gemm.patch
GGML_PATCH_vulkan := setup/patches/ggml-python-vulkan-headers.patch
GGML_PATCH_cuda := setup/patches/ggml-python-cuda.patch
VULKAN_PACKAGES := mesa-vulkan-drivers libvulkan-dev glslc spirv-headers

.PHONY: setup run test lint clean ports environments setup-vulkan setup-cuda check ggml-python

setup: $(STAMP)

# ggml-python is compiled from source with llamafile's matmul kernels (-DGGML_LLAMAFILE=ON):
# the fastest portable build measured, with the same parity (BENCHMARKS.md, "Build variants").
# The wheel is cached outside the checkout (setup/ggml-python.sh), so a second setup installs it
# without compiling. It has no GPU backend: setup-vulkan and setup-cuda
# replace it, and a new setup drops theirs.
$(STAMP): pyproject.toml Makefile setup/ggml-python.sh $(GGML_PATCH_cpu)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(MAKE) --no-print-directory ggml-python GGML_BACKEND=cpu
	$(BIN)/python -m pip install --quiet -e ".[reference,workflow,dev]"
	rm -f $(VULKAN_STAMP) $(CUDA_STAMP)
	touch $@

# Vulkan: the headers, glslc and Mesa's drivers (lavapipe runs Vulkan on the CPU) from Debian,
# then ggml-python with -DGGML_VULKAN=ON. Debian 12's Vulkan headers (1.3.239) lack
# VK_EXT_layer_settings, which ggml-vulkan names; the patch guards that one use.
setup-vulkan: $(VULKAN_STAMP)
$(VULKAN_STAMP): $(STAMP) $(GGML_PATCH_vulkan) setup/ggml-python.sh setup/apt.sh
	setup/apt.sh $(VULKAN_PACKAGES)
	$(MAKE) --no-print-directory ggml-python GGML_BACKEND=vulkan
	$(BIN)/audioparity doctor --backend vulkan >/dev/null
	rm -f $(CUDA_STAMP)
	touch $@

# CUDA: nvcc must be on PATH (a CUDA toolkit); CUDA_ARCHITECTURES=native builds for the GPUs
# of this machine (90 for an H100/H200 without one attached). ggml-python 0.0.45 binds a CUDA
# function (ggml_backend_cuda_allreduce_tensor) that no source defines, which fails
# `import ggml`: the patch drops it, and adds GGML_CUDA_DISABLE_TF32 (f32 products without TF32).
setup-cuda: $(CUDA_STAMP)
$(CUDA_STAMP): $(STAMP) $(GGML_PATCH_cuda) setup/ggml-python.sh
	@command -v nvcc >/dev/null || { echo "setup-cuda: no nvcc on PATH (install a CUDA toolkit)" >&2; exit 1; }
	$(MAKE) --no-print-directory ggml-python GGML_BACKEND=cuda
	$(BIN)/audioparity doctor --backend cuda >/dev/null
	rm -f $(VULKAN_STAMP)
	touch $@

# ggml-python with GGML_BACKEND (cpu, vulkan, cuda) into VENV, and nothing else: what setup,
# setup-vulkan and setup-cuda build, and what a bundle's host builds offline (docs/bundles.md).
ggml-python:
	$(if $(filter $(GGML_BACKEND),cpu vulkan cuda),,$(error GGML_BACKEND=$(GGML_BACKEND): expected cpu, vulkan or cuda))
	setup/ggml-python.sh $(BIN)/python "$(strip $(GGML_CMAKE_ARGS) $(GGML_ARGS_$(GGML_BACKEND)))" \
		$(sort $(GGML_PATCH_cpu) $(GGML_PATCH_$(GGML_BACKEND)))

# A run killed mid-way (SIGKILL, power loss) leaves Snakemake's lock (.snakemake/locks/) and
# incomplete markers: unlock when a lock is there, and rerun what was incomplete. Do not start
# two runs in one checkout at once. A failed job's log is printed, so its one error line shows
# without opening logs/.
# The builds of ggml installed are brought to the checkout's first (a patch changed), so no
# dump runs on an older one: the workflow keys our port's dumps on setup/ (docs/design.md).
run: setup $(if $(wildcard $(VULKAN_STAMP)),setup-vulkan) $(if $(wildcard $(CUDA_STAMP)),setup-cuda) environments
	if ls .snakemake/locks/* >/dev/null 2>&1; then \
		$(BIN)/snakemake --unlock --quiet $(SNAKEMAKE_ARGS) >/dev/null 2>&1; fi
	$(BIN)/snakemake --cores $(CORES) --rerun-incomplete --show-failed-logs $(SNAKEMAKE_ARGS)

# The suite runs on PYTEST_WORKERS processes (pytest-xdist; 0: in this one), a test file to a
# worker, so a module's fixtures are built once; most of its time is workflow sweeps, whose
# serial stretches (imports, Snakemake's planning) the other worker fills. The files go out in
# the order tests/conftest.py gives them, the workflow's first (--no-loadscope-reorder: xdist
# would otherwise send the files with most tests first, and the longest sweeps, one or two
# tests a file, last).
PYTEST_WORKERS ?= $(CORES)

# The ports are built first when their snapshots are there (PORTS_SOURCE), and the tests that
# run them then fail, not skip, without them (AUDIOPARITY_REQUIRE_PORTS); a checkout without
# the snapshots runs every other test and says so.
test: setup environments
	if [ -d "$(PORTS_SOURCE)" ]; then $(MAKE) --no-print-directory ports || exit 1; require=1; \
	else echo "make test: no $(PORTS_SOURCE): the tests of the third-party ports will skip" \
		"(PORTS_SOURCE=<folder of the port snapshots>)" >&2; require=; fi; \
	AUDIOPARITY_REQUIRE_PORTS=$$require $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The ports are built from the snapshots in PORTS_SOURCE (docs/candidates.md) into PORTS_CACHE,
# outside the checkout, one folder per snapshot and its sha256: a built one is reused, so this
# takes seconds after the first time. .ports links to the cache (the ports config reads it).
PORTS_SOURCE ?= ../shared/ports
PORTS_CACHE ?= $(HOME)/.cache/audioparity/ports
# After setup-vulkan, the ports that have a Vulkan build get it too (transcribe.cpp).
ports: setup
	$(BIN)/audioparity ports --source $(PORTS_SOURCE) --cache $(PORTS_CACHE) --jobs $(CORES) \
		$(if $(wildcard $(VULKAN_STAMP)),--vulkan)
	ln -sfn $(PORTS_CACHE) .ports

# The reference environments of the configs (their `environments`: another version of a
# reference's library), each a venv layered on this one, built once into ENVIRONMENTS_CACHE and
# reused while its packages and this venv stay; the workflow finds them there
# (AUDIOPARITY_ENVIRONMENTS). docs/references.md.
ENVIRONMENTS_CACHE ?= $(HOME)/.cache/audioparity/environments
export AUDIOPARITY_ENVIRONMENTS := $(ENVIRONMENTS_CACHE)
environments: setup
	$(BIN)/audioparity environments --cache $(ENVIRONMENTS_CACHE) config/config.yaml \
		config/examples/*.yaml

# Fails when a cell of the last sweep fails, crashed or went missing against the reference
# without a declared expected failure, printing each such cell's culprit (for a user's CI), and
# when the summary is stale: the last run did not finish, or a cell is newer (one line). The
# command exits 1 and 2 for these; make itself exits 2 for either.
check: setup
	$(BIN)/audioparity report check results/report/summary.csv

lint: setup
	$(BIN)/ruff check src tests setup
	$(BIN)/snakemake --lint

clean:
	rm -rf results logs .snakemake

# make train-parakeet: the default Parakeet model, resources/models/parakeet-tdt-espeak, trained
# again from its seed on espeak-ng speech (its README.md: the data, the run, the held-out WER);
# about an hour of the CPU, checkpoints in results/train. `make run` never runs it: the trained
# weights are committed.
TRAIN_ARGS ?= --minutes 60
.PHONY: train-parakeet
train-parakeet: setup
	setup/apt.sh espeak-ng
	$(BIN)/audioparity train parakeet-tdt --output results/train/parakeet-tdt-espeak --seed 0 \
		$(TRAIN_ARGS)
	cp results/train/parakeet-tdt-espeak/model.nemo results/train/parakeet-tdt-espeak/training.json \
		resources/models/parakeet-tdt-espeak/

# make bench: the ggml ports vs PyTorch/NeMo on full-size random-weight models (BENCHMARKS.md);
# BENCH_ARGS=--quick (2 threads, fewer repetitions) or --small (MOSS with the Qwen3-0.6B shape).
BENCH_ARGS ?=
.PHONY: bench bench-sweep
bench: setup
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# make bench-sweep: the workflow itself at scale (BENCHMARKS.md, "Sweeps"): Parakeet v3 shape over
# 8, 16 and 32 clips of 2-30 s, MOSS 1.7B over 16 prompts, every weight type; hours on 2 cores.
# SWEEP_ARGS="--clips 4,8 --weight-types f32,q8_0 --prompts 4" for a shorter run.
SWEEP_ARGS ?=
bench-sweep: setup
	setup/apt.sh espeak-ng
	$(BIN)/python benchmarks/sweep.py --cores $(CORES) $(SWEEP_ARGS)
