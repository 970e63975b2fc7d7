#!/usr/bin/env bash
# GPU check for jitkey's Triton binding: installs a prebuilt jitkey wheel, runs the cuda-marked GPU tests, the
# CPU tests of the binding (they also run on a GPU host), the launch-overhead benchmark and the cold-path bench.
#
#   Build here (one abi3 wheel serves CPython >= 3.10):  .venv/bin/maturin build --release --out .whl
#   Run there, from the repository root:                 bash scripts/gpu_check.sh
#   (with the device tool: carry [".whl"], since .whl/ is git-ignored)
#
# Writes logs, JUnit XML and bench JSON under $OUT (or ./gpu_check_out). Needs no network: uses the
# python3 that has torch + triton, and pytest + hypothesis already installed there (checked below).
# Exit status: 0 only if every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUTDIR"
PY="${PYTHON:-python3}"
SITE="${JITKEY_SITE:-/tmp/jitkey-site}"
status=0
log() { echo "[gpu_check] $*" | tee -a "$OUTDIR/gpu_check.log"; }

log "host: $(hostname) · $(date -u +%FT%TZ)"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true; } | tee -a "$OUTDIR/gpu_check.log"

wheel="$(ls -t .whl/jitkey-*.whl dist/jitkey-*.whl 2>/dev/null | head -n1 || true)"
if [[ -n "$wheel" ]]; then
  log "installing $wheel into $SITE"
  rm -rf "$SITE"
  if ! "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$wheel" >>"$OUTDIR/gpu_check.log" 2>&1; then
    log "FAILED: pip install of $wheel (see gpu_check.log)"; exit 2
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
elif ! "$PY" -c "import jitkey._core" 2>/dev/null; then
  log "FAILED: no wheel in .whl/ or dist/ and jitkey is not importable; build one with 'maturin build --release --out .whl'"
  exit 2
fi

"$PY" - <<'PYEOF' 2>&1 | tee -a "$OUTDIR/gpu_check.log"
import importlib, sys
import torch, triton, jitkey
print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__,
      "| jitkey", jitkey.__version__, "from", jitkey.__file__)
print("cuda available:", torch.cuda.is_available(), "| devices:", torch.cuda.device_count())
missing = [m for m in ("pytest", "hypothesis", "pytest_benchmark") if importlib.util.find_spec(m) is None]
print("missing python packages:", missing or "none")
import jitkey.triton
print("jitkey.triton fast paths on this triton:", jitkey.triton.fast_paths())
PYEOF
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  log "FAILED: torch sees no CUDA GPU here (every GPU test would only be skipped)"; status=1
fi
if ! "$PY" -c "import pytest, hypothesis" 2>/dev/null; then
  log "FAILED: pytest and hypothesis are needed (carry their wheels and install with --no-index)"; exit 2
fi
# pyproject's addopts name pytest-benchmark's --benchmark-disable; drop the addopts if the plugin is missing.
PYTEST_OPTS=(-p no:cacheprovider -ra -W default)  # one-shot run: report warnings, do not fail on them
"$PY" -c "import pytest_benchmark" 2>/dev/null || PYTEST_OPTS+=(-o addopts="--strict-markers")

log "step 1/6: GPU tests (pytest -m cuda tests benches)"
"$PY" -m pytest -m cuda tests benches "${PYTEST_OPTS[@]}" -v --junitxml="$OUTDIR/gpu_tests.xml" \
  >"$OUTDIR/gpu_tests.log" 2>&1
rc=$?; tail -n 25 "$OUTDIR/gpu_tests.log"; log "GPU tests exit $rc"; [[ $rc -eq 0 ]] || status=1

log "step 2/6: CPU tests of the binding on this host (tests/test_triton_cpu.py)"
"$PY" -m pytest tests/test_triton_cpu.py "${PYTEST_OPTS[@]}" -q --junitxml="$OUTDIR/cpu_tests.xml" \
  >"$OUTDIR/cpu_tests.log" 2>&1
rc=$?; tail -n 5 "$OUTDIR/cpu_tests.log"; log "CPU tests exit $rc"; [[ $rc -eq 0 ]] || status=1

log "step 3/6: launch benchmark (benches/gpu_launch.py)"
"$PY" benches/gpu_launch.py --json "$OUTDIR/gpu_launch.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/gpu_launch.txt"
rc=${PIPESTATUS[0]}; log "benchmark exit $rc"; [[ $rc -eq 0 ]] || status=1

log "step 4/6: the bench CLI, every default section (python -m jitkey bench)"
"$PY" -m jitkey bench ${CLI_ARGS:-} --json "$OUTDIR/bench.json" --plot "$OUTDIR/bench.png" 2>&1 | tee "$OUTDIR/bench.txt"
rc=${PIPESTATUS[0]}; log "bench CLI exit $rc"; [[ $rc -eq 0 ]] || status=1

log "step 5/6: the cold path, plain Triton vs jitkey in fresh processes (python -m jitkey bench --only cold)"
"$PY" -m jitkey bench --only cold ${COLD_ARGS:-} --json "$OUTDIR/bench_cold.json" 2>&1 | tee "$OUTDIR/bench_cold.txt"
rc=${PIPESTATUS[0]}; log "cold bench exit $rc"; [[ $rc -eq 0 ]] || status=1

log "step 6/6: the examples in GPU mode (shared_autotune.py, minimal_dsl.py, ninetoothed_scenario.py)"
for ex in examples/shared_autotune.py examples/minimal_dsl.py examples/ninetoothed_scenario.py; do
  "$PY" "$ex" 2>&1 | tail -n 4 | tee -a "$OUTDIR/examples.txt"
  rc=${PIPESTATUS[0]}; log "$ex exit $rc"; [[ $rc -eq 0 ]] || status=1
done

log "done: status $status; outputs in $OUTDIR"
exit $status
