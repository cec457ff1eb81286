# make setup: the virtual environment (torch pinned and first, then the rest); idempotent.
# make run:   the default sweep (results/report/index.html).   make test: the test suite.
PYTHON ?= python3
VENV ?= .venv
CORES ?= 2
BIN := $(VENV)/bin
STAMP := $(VENV)/.audioparity-installed
export PATH := $(abspath $(BIN)):$(PATH)
export GGML_NO_BACKTRACE := 1
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: setup run test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[reference,workflow,dev]"
	touch $@

# A run killed mid-way (SIGKILL, power loss) leaves Snakemake's lock and incomplete markers:
# unlock, and rerun what was incomplete. Do not start two runs in one checkout at once.
run: setup
	$(BIN)/snakemake --unlock --quiet $(SNAKEMAKE_ARGS) >/dev/null
	$(BIN)/snakemake --cores $(CORES) --rerun-incomplete $(SNAKEMAKE_ARGS)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/snakemake --lint

clean:
	rm -rf results logs .snakemake
