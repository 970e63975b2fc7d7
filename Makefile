# jitkey: `make test` and `make bench` set everything up on a fresh machine (venv, pinned deps, release build).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-$(shell cat requirements-dev.txt | sha1sum | cut -c1-12)
MATURIN := VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH $(abspath $(VENV))/bin/maturin
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# CARGO_PROFILE: release (default, what the numbers are measured with) or dev-release (faster to build).
CARGO_PROFILE ?= release
PYTEST_ARGS ?=

.PHONY: all venv build test test-rust test-python bench lint format wheel clean

all: lint test

$(DEPS_STAMP): requirements-dev.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	@rm -f $(VENV)/.deps-*; touch $@

venv: $(DEPS_STAMP)

## build: compile the extension (release, lto) into the venv
build: venv
	$(MATURIN) develop -q --profile $(CARGO_PROFILE)

## test: every test: the Rust core, then pytest (tests + benches as correctness checks)
test: build test-rust test-python

test-rust:
	cargo test -p jitkey-core

test-python: build
	$(PY) -m pytest -q $(PYTEST_ARGS)

## bench: the main job, the launch-overhead / key-cost microbenchmark
bench: build
	$(PY) -m jitkey bench $(BENCH_ARGS)

## lint: rustfmt, clippy, ruff, stubtest
lint: build
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(PY) -m mypy.stubtest jitkey._core --allowlist .stubtest-allowlist

format: venv
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches examples
	$(VENV)/bin/ruff check --fix python tests benches examples

wheel: venv
	$(MATURIN) build --release --out dist

clean:
	rm -rf target dist $(VENV)
