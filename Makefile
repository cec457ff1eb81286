# make setup: the virtual environment (torch pinned and first, then the rest); idempotent.
# make run:   the default sweep (results/report/index.html).   make test: the test suite.
# make ports: the third-party ports (transcribe.cpp, whisper.cpp), built once into a cache.
PYTHON ?= python3
VENV ?= .venv
CORES ?= 2
BIN := $(VENV)/bin
STAMP := $(VENV)/.audioparity-installed
export PATH := $(abspath $(BIN)):$(PATH)
export GGML_NO_BACKTRACE := 1
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
GGML_CMAKE_ARGS ?= -DGGML_LLAMAFILE=ON

.PHONY: setup run test lint clean ports

setup: $(STAMP)

# ggml-python is compiled from source with llamafile's matmul kernels (-DGGML_LLAMAFILE=ON):
# 2.2x faster f32 encoder and 3.5x faster f16 prefill than the default build, same parity
# (BENCHMARKS.md). --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	CMAKE_ARGS="$(GGML_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet --no-cache-dir \
		--no-binary ggml-python --force-reinstall --no-deps ggml-python==0.0.45
	$(BIN)/python -m pip install --quiet -e ".[reference,workflow,dev]"
	touch $@

# A run killed mid-way (SIGKILL, power loss) leaves Snakemake's lock (.snakemake/locks/) and
# incomplete markers: unlock when a lock is there, and rerun what was incomplete. Do not start
# two runs in one checkout at once. A failed job's log is printed, so its one error line shows
# without opening logs/.
run: setup
	if ls .snakemake/locks/* >/dev/null 2>&1; then \
		$(BIN)/snakemake --unlock --quiet $(SNAKEMAKE_ARGS) >/dev/null 2>&1; fi
	$(BIN)/snakemake --cores $(CORES) --rerun-incomplete --show-failed-logs $(SNAKEMAKE_ARGS)

# The ports are built first when their snapshots are there (PORTS_SOURCE), and the tests that
# run them then fail, not skip, without them (AUDIOPARITY_REQUIRE_PORTS); a checkout without
# the snapshots runs every other test and says so.
test: setup
	if [ -d "$(PORTS_SOURCE)" ]; then $(MAKE) --no-print-directory ports || exit 1; require=1; \
	else echo "make test: no $(PORTS_SOURCE): the tests of the third-party ports will skip" \
		"(PORTS_SOURCE=<folder of the port snapshots>)" >&2; require=; fi; \
	AUDIOPARITY_REQUIRE_PORTS=$$require $(BIN)/python -m pytest $(PYTEST_ARGS)

# The ports are built from the snapshots in PORTS_SOURCE (docs/candidates.md) into PORTS_CACHE,
# outside the checkout, one folder per snapshot and its sha256: a built one is reused, so this
# takes seconds after the first time. .ports links to the cache (the ports config reads it).
PORTS_SOURCE ?= ../shared/ports
PORTS_CACHE ?= $(HOME)/.cache/audioparity/ports
ports: setup
	$(BIN)/audioparity ports --source $(PORTS_SOURCE) --cache $(PORTS_CACHE) --jobs $(CORES)
	ln -sfn $(PORTS_CACHE) .ports

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/snakemake --lint

clean:
	rm -rf results logs .snakemake

# make bench: the ggml ports vs PyTorch/NeMo on full-size random-weight models (BENCHMARKS.md);
# BENCH_ARGS=--quick (2 threads, fewer repetitions) or --small (MOSS with the Qwen3-0.6B shape).
BENCH_ARGS ?=
.PHONY: bench
bench: setup
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)
