#!/usr/bin/env bash
# Real clients of jitkey.triton on the GPU: a suite run plain and under `-p jitkey.pytest_plugin`, compared.
#
#   scripts/gpu_clients.sh SUITE [pytest args...]
#     SUITE = triton: Triton 3.6's own python/test/unit (copy ../shared/clients/triton-3.6 to .clients/triton)
#     SUITE = liger:  Liger-Kernel's test/ with its src/ (a snapshot of the repository in .clients/liger)
#     SUITE = helion: Helion 1.4.0's test/ (copy ../shared/clients/helion-1.4.0 to .clients/helion; the helion
#                     wheel installed on PYTHONPATH); the jitkey run also routes Helion (--jitkey-integrations)
#     SUITE = flaggems: FlagGems 5.0.0's tests/ (copy ../shared/clients/flaggems-5.0.0 to .clients/flaggems; the
#                     flag_gems and sqlalchemy wheels on PYTHONPATH); GEMS_VENDOR=nvidia, one FLAGGEMS_CACHE_DIR
#                     per run; the jitkey run also routes FlagGems (--jitkey-integrations)
#     SUITE = torch:  torch's test/inductor/test_triton_kernels.py (in .clients/torch_tests)
#
# Needs jitkey importable (PYTHONPATH) and pytest-xdist. Writes JUnit XML, the fast-path report and the
# comparison under $OUT (or ./gpu_clients_out). Each run gets its own TRITON_CACHE_DIR, so both compile.
# SUITE_TIMEOUT (s) stops a run with SIGINT: pytest still writes the JUnit XML of the tests it finished.
# SHARDS=N (default 1): each mode runs as N processes at once, shard k on GPU k % (the GPUs nvidia-smi lists),
# both modes side by side; a test's shard is the crc32 of its node id (scripts/pytest_shard.py), so the two runs
# of a shard run the same tests. The comparison merges the shards' XML; the shards' files end up in one archive.
set -uo pipefail
cd "$(dirname "$0")/.."
suite="$1"; shift
OUTDIR="${OUT:-$PWD/gpu_clients_out}"; mkdir -p "$OUTDIR"
PY="${PYTHON:-python3}"
root="$PWD"
dsl=0
case "$suite" in
  triton) dir=.clients/triton ;;
  liger) dir=.clients/liger; export PYTHONPATH="$root/.clients/liger/src:$root/.clients/liger${PYTHONPATH:+:$PYTHONPATH}" ;;
  helion) dir=.clients/helion; dsl=1 ;;
  flaggems) dir=.clients/flaggems; dsl=1; export GEMS_VENDOR=nvidia ;;
  torch) dir=.clients/torch_tests ;;
  *) echo "unknown suite $suite"; exit 2 ;;
esac
# The suite's own settings only: without an ini of its own, pytest would take jitkey's pyproject.toml (the
# suite sits inside this repository), whose filterwarnings=error and addopts are not the suite's.
[[ -e "$dir/pytest.ini" || -e "$dir/pyproject.toml" || -e "$dir/setup.cfg" ]] || printf '[pytest]\n' > "$dir/pytest.ini"
shards="${SHARDS:-1}"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); (( gpus > 0 )) || gpus=1
run() {  # $1 = plain|jitkey, $2 = shard index; the rest: pytest arguments
  local tag="$1" k="$2"; shift 2
  local name="$suite-$tag"; (( shards > 1 )) && name="$suite-$tag-$k"
  local plugin=(-p jitkey.pytest_plugin --jitkey-report-json="$OUTDIR/$name-report.json")
  [[ "$tag" == plain ]] && plugin+=(--jitkey-off)
  [[ "$tag" == jitkey && "$dsl" == 1 ]] && plugin+=(--jitkey-integrations)
  local shard=()
  (( shards > 1 )) && shard=(-p pytest_shard)
  ( cd "$dir" && export PYTHONPATH="$root/scripts${PYTHONPATH:+:$PYTHONPATH}" && \
      { (( shards > 1 )) && export JITKEY_SHARD="$k/$shards" CUDA_VISIBLE_DEVICES=$((k % gpus)) || true; } && \
      FLAGGEMS_CACHE_DIR="$(mktemp -d)" TRITON_CACHE_DIR="$(mktemp -d)" TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" \
      timeout -s INT -k 60 "${SUITE_TIMEOUT:-280}" "$PY" -m pytest -q -p no:cacheprovider "${shard[@]}" \
      --tb=line -o junit_family=xunit2 --junitxml="$OUTDIR/$name.xml" "${plugin[@]}" "$@" ) \
      > "$OUTDIR/$name.log" 2>&1
  echo "[$suite/$tag${shard:+ shard $k/$shards}] exit $? · $(tail -n 1 "$OUTDIR/$name.log")"
}
if (( shards > 1 )); then
  for ((k = 0; k < shards; k++)); do run plain "$k" "$@" & run jitkey "$k" "$@" & done
  wait
  "$PY" scripts/compare_junit.py "$OUTDIR/$suite-plain-*.xml" "$OUTDIR/$suite-jitkey-*.xml" \
    --json "$OUTDIR/$suite-compare.json" | head -n 40
  # The shards' XML, logs and reports in one archive (a device that returns only a few files gets them all).
  ( cd "$OUTDIR" && tar czf "$suite-shards.tgz" "$suite"-plain-* "$suite"-jitkey-* && rm -f "$suite"-plain-* "$suite"-jitkey-* )
else
  run plain 0 "$@"
  run jitkey 0 "$@"
  grep -A 30 "jitkey fast-path report" "$OUTDIR/$suite-jitkey.log" | head -n 40
  "$PY" scripts/compare_junit.py "$OUTDIR/$suite-plain.xml" "$OUTDIR/$suite-jitkey.xml" --json "$OUTDIR/$suite-compare.json" | head -n 40
fi
