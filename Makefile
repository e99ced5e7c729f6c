# The two commands of the README:
#   make run    the built-in default job (sets up .venv and builds the extension if needed)
#   make test   every check: lints, Rust tests, the Python test suite (the built wheel installed
#               into a fresh venv included), stub check
# Both are idempotent: the venv and the build are redone only when their inputs change.
# `make run` installs only what running needs (requirements.txt); `make test` adds the test
# tools, torch, ray and the wheel's linker (requirements-dev.txt).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_DEPS_STAMP := $(VENV)/.deps-run
DEV_DEPS_STAMP := $(VENV)/.deps-dev
BUILD_STAMP := $(VENV)/.tokenyard-built
RUST_SOURCES := $(shell find rust -name '*.rs' -o -name 'Cargo.toml') Cargo.toml Cargo.lock
PY_SOURCES := $(shell find python kernels -type f -not -path '*/__pycache__/*') pyproject.toml
PY_PATHS := python tests benches kernels
# The wheel users install (docs/install.md): abi3 (one wheel for CPython 3.10+), linked by
# zig (the ziglang package) against glibc 2.17's symbols, so it installs on every Linux with
# glibc 2.17 or newer (Amazon Linux 2 has 2.26, RHEL 8 2.28, Ubuntu 20.04 2.31), not only on
# this machine's. It builds in its own target folder, so it and `make build` (the editable
# install, target/release) never invalidate each other's artifacts; a fresh one costs one
# more release build (about 2 minutes on 2 cores), a Python-only change about a second.
WHEEL_DIR := dist
WHEEL_STAMP := $(WHEEL_DIR)/.wheel-built
WHEEL_COMPAT := manylinux_2_17
WHEEL_INPUTS := README.md $(wildcard docs/examples/*.toml)

.PHONY: run test lint rust-test py-test stubs build wheel bench

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

$(WHEEL_STAMP): $(DEV_DEPS_STAMP) $(RUST_SOURCES) $(PY_SOURCES) $(WHEEL_INPUTS)
	rm -f $(WHEEL_DIR)/tokenyard-*.whl
	PATH="$(abspath $(BIN)):$$PATH" CARGO_TARGET_DIR=target/wheel $(BIN)/maturin build --release \
		--quiet --zig --compatibility $(WHEEL_COMPAT) --interpreter $(BIN)/python --out $(WHEEL_DIR)
	touch $@

wheel: $(WHEEL_STAMP)

lint: $(DEV_DEPS_STAMP)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	$(BIN)/ruff check $(PY_PATHS)
	$(BIN)/ruff format --check $(PY_PATHS)

rust-test:
	cargo test --workspace --quiet

# TOKENYARD_WHEEL_DIR: tests/test_wheel.py installs the wheel from there, and fails (rather
# than skips) when it is missing.
py-test: $(BUILD_STAMP) $(DEV_DEPS_STAMP) $(WHEEL_STAMP)
	TOKENYARD_WHEEL_DIR=$(abspath $(WHEEL_DIR)) $(BIN)/python -m pytest -q

stubs: $(BUILD_STAMP) $(DEV_DEPS_STAMP)
	$(BIN)/python -m mypy.stubtest tokenyard._core
	$(BIN)/python -m mypy

bench: $(BUILD_STAMP)
	cargo bench -p tokenyard-core --bench kv
