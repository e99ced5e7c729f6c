# The two commands of the README:
#   make run    the built-in default job (sets up .venv and builds the extension if needed)
#   make test   every check: lints, Rust tests, the Python test suite, stub check
# Both are idempotent: the venv and the build are redone only when their inputs change.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.deps-installed
BUILD_STAMP := $(VENV)/.tokenyard-built
RUST_SOURCES := $(shell find rust -name '*.rs' -o -name 'Cargo.toml') Cargo.toml Cargo.lock
PY_SOURCES := $(shell find python -type f -not -path '*/__pycache__/*') pyproject.toml

.PHONY: run test lint rust-test py-test stubs build bench

run: $(BUILD_STAMP)
	$(BIN)/tokenyard simulate --output results --plots

test: lint rust-test py-test stubs

$(DEPS_STAMP): requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

$(BUILD_STAMP): $(DEPS_STAMP) $(RUST_SOURCES) $(PY_SOURCES)
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/maturin develop --release --quiet
	touch $@

build: $(BUILD_STAMP)

lint: $(DEPS_STAMP)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	$(BIN)/ruff check python tests benches
	$(BIN)/ruff format --check python tests benches

rust-test:
	cargo test --workspace --quiet

py-test: $(BUILD_STAMP)
	$(BIN)/python -m pytest -q

stubs: $(BUILD_STAMP)
	$(BIN)/python -m mypy.stubtest tokenyard._core
	$(BIN)/python -m mypy

bench: $(BUILD_STAMP)
	cargo bench -p tokenyard-core --bench kv
