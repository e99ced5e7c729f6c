# The two commands of the README:
#   make run    the built-in default job (sets up .venv and builds the extension if needed)
#   make test   every check: lints, Rust tests, the Python test suite, stub check
# Both are idempotent: the venv and the build are redone only when their inputs change.
# `make run` installs only what running needs (requirements.txt); `make test` adds the test
# tools, torch and ray (requirements-dev.txt).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_DEPS_STAMP := $(VENV)/.deps-run
DEV_DEPS_STAMP := $(VENV)/.deps-dev
BUILD_STAMP := $(VENV)/.tokenyard-built
RUST_SOURCES := $(shell find rust -name '*.rs' -o -name 'Cargo.toml') Cargo.toml Cargo.lock
PY_SOURCES := $(shell find python kernels -type f -not -path '*/__pycache__/*') pyproject.toml
PY_PATHS := python tests benches kernels

.PHONY: run test lint rust-test py-test stubs build bench

run: $(BUILD_STAMP)
	$(BIN)/tokenyard simulate --output results --plots

test: lint rust-test py-test stubs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUN_DEPS_STAMP): requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $@

$(DEV_DEPS_STAMP): requirements-dev.txt requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

$(BUILD_STAMP): $(RUN_DEPS_STAMP) $(RUST_SOURCES) $(PY_SOURCES)
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/maturin develop --release --quiet
	touch $@

build: $(BUILD_STAMP)

lint: $(DEV_DEPS_STAMP)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	$(BIN)/ruff check $(PY_PATHS)
	$(BIN)/ruff format --check $(PY_PATHS)

rust-test:
	cargo test --workspace --quiet

py-test: $(BUILD_STAMP) $(DEV_DEPS_STAMP)
	$(BIN)/python -m pytest -q

stubs: $(BUILD_STAMP) $(DEV_DEPS_STAMP)
	$(BIN)/python -m mypy.stubtest tokenyard._core
	$(BIN)/python -m mypy

bench: $(BUILD_STAMP)
	cargo bench -p tokenyard-core --bench kv
