# jitkey: `make test` and `make bench` set everything up on a fresh machine (venv, pinned deps, release build).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.deps-$(shell cat requirements-dev.txt | sha1sum | cut -c1-12)
MATURIN := VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH $(abspath $(VENV))/bin/maturin
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# CARGO_PROFILE: release (default, what the numbers are measured with) or dev-release (faster to build).
CARGO_PROFILE ?= release
# BUILD_FEATURES: cargo features of the development build (`make build`, so `make test` and `make bench`).
# fault-injection adds DiskIndex._arm_fault, the crash points the crash tests need (tests/test_disk_processes.py,
# tests/test_disk_torture.py); it costs a branch per append and per compaction step. `make wheel` and `make sdist` never turn it on
# (pyproject.toml's [tool.maturin] features leave it off), so no released build has the hook.
# `make build BUILD_FEATURES=` builds what users get.
BUILD_FEATURES ?= fault-injection
PYTEST_ARGS ?=
# The CPU test matrix over Triton versions: the main run uses the pinned triton (requirements-dev.txt); then
# the Triton-dependent tests run again against TRITON_LATEST (the newest on PyPI that we support), installed
# with --no-deps into a git-ignored folder and put first on PYTHONPATH for that run only (torch stays pinned).
TRITON_PINNED := $(shell sed -n 's/^triton==//p' requirements-dev.txt)
TRITON_LATEST ?= 3.9.0
TRITON_LATEST_DIR := .triton-latest
TRITON_LATEST_STAMP := $(TRITON_LATEST_DIR)/.installed-$(TRITON_LATEST)
# Every test/bench module that imports triton (new ones join the matrix automatically), and the bench cases
# (benches/test_bench_cli_cases.py: its lookup and autotune sections use triton through jitkey.bench).
TRITON_TESTS = $(shell grep -lE '^[[:space:]]*(import triton|from triton[ .]|.*importorskip..triton)' tests/test_*.py benches/test_*.py) \
  benches/test_bench_cli_cases.py

.PHONY: all help venv build test test-rust test-python test-triton-latest bench lint format wheel sdist install-check clean redis-server

all: lint test

## help: this list (each target's `## name: what it does` line)
help:
	@awk '/^## [a-z-]+: /{sub(/^## /,""); n=index($$0,": "); printf "  %-20s %s\n", substr($$0,1,n-1), substr($$0,n+2); next} /^## /{sub(/^## /,""); printf "  %-20s %s\n", "", $$0}' $(MAKEFILE_LIST)

$(DEPS_STAMP): requirements-dev.txt
	@test -x $(PY) || { echo "[make] creating $(VENV)"; python3 -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	@echo "[make] installing the pinned dependencies of requirements-dev.txt into $(VENV) (first run: about 3 GB"
	@echo "[make] of wheels, torch's CUDA libraries included; several minutes; pip lists what it installs)"
	set -o pipefail; $(PY) -m pip install --progress-bar off -r requirements-dev.txt | { grep -v '^Requirement already satisfied' || true; }
	@rm -f $(VENV)/.deps-*; touch $@

## venv: the virtualenv with the pinned dependencies of requirements-dev.txt

venv: $(DEPS_STAMP)

## build: compile the extension (release, lto) into the venv
build: venv
	@echo "[make] building the extension ($(CARGO_PROFILE) profile; the first release build takes a few minutes)"
	$(MATURIN) develop -q --profile $(CARGO_PROFILE) $(if $(BUILD_FEATURES),--features $(BUILD_FEATURES))

## test: every test: the Rust core, then pytest (tests + benches as correctness checks), then the Triton matrix
test: build test-rust test-python
	$(MAKE) --no-print-directory test-triton-latest

# With the fault-injection feature, so the crash points' own tests run too; then the doctests without it,
# which check that a release build exposes no crash point (rust/core/src/disk/mod.rs).
## test-rust: the Rust core's tests (cargo test, with the crash points; then the doctests without)

test-rust:
	cargo test -p jitkey-core --features fault-injection
	cargo test -p jitkey-core --doc

## test-python: pytest over tests/ and benches/ (benchmarks run once, as correctness checks)

test-python: build redis-server
	JITKEY_EXPECT_TRITON=$(TRITON_PINNED) $(PY) -m pytest -q $(PYTEST_ARGS)

## redis-server: the Redis tier tests' server (Debian's package), installed quietly with apt when missing and
## apt is usable (root); otherwise those tests skip with the reason (and fail under CI=true).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing redis-server with apt-get (for tests/test_remote.py)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      redis-server; } >/dev/null 2>&1 || echo "warning: apt-get could not install redis-server"; \
	  fi; \
	  command -v redis-server >/dev/null 2>&1 || echo "note: no redis-server: the Redis tests skip (CI=true: they fail)"; }

$(TRITON_LATEST_STAMP): | venv
	rm -rf $(TRITON_LATEST_DIR)
	$(PY) -m pip install -q --no-deps --target $(TRITON_LATEST_DIR) triton==$(TRITON_LATEST)
	touch $@

## test-triton-latest: the Triton-dependent tests against TRITON_LATEST (asserted by tests/test_triton_matrix.py)
test-triton-latest: build $(TRITON_LATEST_STAMP)
	PYTHONPATH=$(abspath $(TRITON_LATEST_DIR))$${PYTHONPATH:+:$$PYTHONPATH} JITKEY_EXPECT_TRITON=$(TRITON_LATEST) \
		$(PY) -m pytest -q $(PYTEST_ARGS) $(TRITON_TESTS)

## bench: the main job, the launch-overhead / key-cost microbenchmark
bench: build
	$(PY) -m jitkey bench $(BENCH_ARGS)

## lint: rustfmt, clippy, ruff, mypy (settings in pyproject.toml), stubtest
lint: build
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --workspace --all-targets --all-features -- -D warnings
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(PY) -m mypy python/jitkey
	$(PY) -m mypy.stubtest jitkey._core --allowlist .stubtest-allowlist

## format: cargo fmt and ruff format, in place

format: venv
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches examples
	$(VENV)/bin/ruff check --fix python tests benches examples

RELEASE_STAMP := $(VENV)/.release-$(shell cat requirements-release.txt | sha1sum | cut -c1-12)
$(RELEASE_STAMP): requirements-release.txt | venv
	@echo "[make] installing the release tools (ziglang, auditwheel) into $(VENV)"
	$(PY) -m pip install -q -r requirements-release.txt
	@rm -f $(VENV)/.release-*; touch $@

## wheel: the release wheel, manylinux_2_28 abi3 (linked against glibc 2.28 through zig), checked by auditwheel
wheel: $(RELEASE_STAMP)
	rm -f dist/jitkey-*.whl
	$(MATURIN) build --release --zig --compatibility manylinux_2_28 --out dist
	$(VENV)/bin/auditwheel show dist/jitkey-*.whl | tee dist/auditwheel.txt
	@grep -q 'manylinux_2_28_x86_64' dist/auditwheel.txt || { echo "auditwheel: not manylinux_2_28"; exit 1; }

## sdist: the source distribution (builds with pip/maturin anywhere Rust is installed)
sdist: venv
	rm -f dist/jitkey-*.tar.gz
	$(MATURIN) sdist --out dist

## install-check: fresh venvs install the wheel and the sdist; `jitkey info`, `jitkey cache info` and the
## snippets of the README and docs/ run against each (what a user gets from `pip install`)
install-check: wheel sdist
	bash scripts/install_check.sh dist

## clean: remove what the build made: target/, dist/, the venv and the Triton matrix folder

clean:
	rm -rf target dist $(VENV) $(TRITON_LATEST_DIR)
