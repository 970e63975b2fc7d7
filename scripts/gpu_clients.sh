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
# comparison under $OUT (or ./gpu_clients_out). Each run gets its own caches (TRITON_CACHE_DIR, JITKEY_CACHE_DIR,
# ...), so both compile.
# CACHE_ROOT: each mode and shard keeps its caches (Triton's, jitkey's disk index and L2, Inductor's, FlagGems')
# under CACHE_ROOT/<mode>-<shard>/ instead of fresh folders, so a second invocation starts warm: with
# JITKEY_TRITON_L2=1 its jitkey runs load what the first one compiled from the L2, its plain runs from Triton's cache.
# SUITE_TIMEOUT (s, default 280) stops a run at the first test boundary after it (JITKEY_DEADLINE of
# scripts/pytest_shard.py: pytest still writes the JUnit XML of the tests it finished); GRACE (s, default 60) later
# a run still inside one test gets SIGINT (which may abort it inside a compiler, losing its XML).
# SHARDS=N (default 1): each mode runs as N processes at once, shard k on GPU k % (the GPUs nvidia-smi lists),
# both modes side by side; a test's shard is the crc32 of its node id (scripts/pytest_shard.py), so the two runs
# of a shard run the same tests. The comparison merges the shards' XML; the shards' files end up in one archive.
# Many processes on one GPU can run it out of memory (FlagGems' suite at 12 per GPU did, in both modes, and a
# CUDA context that hit it fails its later tests too): keep to about 4 processes per GPU per mode, and let
# RERUN_TIMEOUT (s, default 0 = off) rerun the tests that passed plain and not with jitkey, alone in both modes
# (one process per GPU per mode, JITKEY_ONLY of scripts/pytest_shard.py); the rerun's comparison is the verdict.
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
  helion) dir=.clients/helion; dsl=1
    # Helion's tests load its examples from <the helion package>/../examples: point that at the copy here.
    site=$("$PY" -c 'import helion, os; print(os.path.dirname(os.path.dirname(helion.__file__)))') || exit 2
    [[ -e "$site/examples" ]] || ln -s "$root/.clients/helion/examples" "$site/examples" || exit 2 ;;
  flaggems) dir=.clients/flaggems; dsl=1; export GEMS_VENDOR=nvidia ;;
  torch) dir=.clients/torch_tests ;;
  *) echo "unknown suite $suite"; exit 2 ;;
esac
# The suite's own settings only: without an ini of its own, pytest would take jitkey's pyproject.toml (the
# suite sits inside this repository), whose filterwarnings=error and addopts are not the suite's.
[[ -e "$dir/pytest.ini" || -e "$dir/pyproject.toml" || -e "$dir/setup.cfg" ]] || printf '[pytest]\n' > "$dir/pytest.ini"
shards="${SHARDS:-1}"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); (( gpus > 0 )) || gpus=1
cache_dir() {  # $1 = mode-shard, $2 = which cache: a fresh folder, or with CACHE_ROOT the same one on every invocation
  if [[ -n "${CACHE_ROOT:-}" ]]; then mkdir -p "$CACHE_ROOT/$1/$2" && echo "$CACHE_ROOT/$1/$2"; else mktemp -d; fi
}
run() {  # $1 = run label (e.g. flaggems-plain-3), $2 = plain|jitkey, $3 = shard index, $4 = shards; the rest: pytest arguments
  local name="$1" tag="$2" k="$3" n="$4"; shift 4
  local plugin=(-p jitkey.pytest_plugin --jitkey-report-json="$OUTDIR/$name-report.json")
  [[ "$tag" == plain ]] && plugin+=(--jitkey-off)
  [[ "$tag" == jitkey && "$dsl" == 1 ]] && plugin+=(--jitkey-integrations)
  ( cd "$dir" && export PYTHONPATH="$root/scripts${PYTHONPATH:+:$PYTHONPATH}" && \
      { (( n > 1 )) && export JITKEY_SHARD="$k/$n" CUDA_VISIBLE_DEVICES=$((k % gpus)) || true; } && \
      FLAGGEMS_CACHE_DIR="$(cache_dir "$tag-$k" flaggems)" TRITON_CACHE_DIR="$(cache_dir "$tag-$k" triton)" \
      TORCHINDUCTOR_CACHE_DIR="$(cache_dir "$tag-$k" inductor)" JITKEY_CACHE_DIR="$(cache_dir "$tag-$k" jitkey)" \
      JITKEY_DEADLINE=$(( $(date +%s) + ${TIME_LIMIT:-${SUITE_TIMEOUT:-280}} )) \
      timeout -s INT -k 60 $(( ${TIME_LIMIT:-${SUITE_TIMEOUT:-280}} + ${GRACE:-60} )) "$PY" -m pytest -q \
      -p no:cacheprovider -p pytest_shard --tb=line -o junit_family=xunit2 --junitxml="$OUTDIR/$name.xml" \
      "${plugin[@]}" "$@" ) > "$OUTDIR/$name.log" 2>&1
  local rc=$? where=""
  (( n > 1 )) && where=" shard $k/$n"
  echo "[$name$where] exit $rc · $(tail -n 1 "$OUTDIR/$name.log")"
}
both() {  # $1 = label prefix, $2 = shards; the rest: pytest arguments. Both modes, every shard, side by side.
  local label="$1" n="$2"; shift 2
  if (( n > 1 )); then
    for ((k = 0; k < n; k++)); do
      run "$label-plain-$k" plain "$k" "$n" "$@" & run "$label-jitkey-$k" jitkey "$k" "$n" "$@" &
    done
    wait
    "$PY" scripts/compare_junit.py "$OUTDIR/$label-plain-*.xml" "$OUTDIR/$label-jitkey-*.xml" \
      --json "$OUTDIR/$label-compare.json" > "$OUTDIR/$label-compare.txt"
    [[ "$(ls "$OUTDIR/$label-jitkey-"*-report.json 2>/dev/null)" ]] && \
      "$PY" scripts/merge_reports.py "$OUTDIR/$label-report.json" "$OUTDIR/$label-jitkey-"*-report.json \
        > "$OUTDIR/$label-report.txt"
  else
    run "$label-plain" plain 0 1 "$@"
    run "$label-jitkey" jitkey 0 1 "$@"
    grep -A 30 "jitkey fast-path report" "$OUTDIR/$label-jitkey.log" > "$OUTDIR/$label-report.txt"
    "$PY" scripts/compare_junit.py "$OUTDIR/$label-plain.xml" "$OUTDIR/$label-jitkey.xml" \
      --json "$OUTDIR/$label-compare.json" > "$OUTDIR/$label-compare.txt"
  fi
  head -n 40 "$OUTDIR/$label-compare.txt"; head -n 60 "$OUTDIR/$label-report.txt" 2>/dev/null
}
both "$suite" "$shards" "$@"
if (( ${RERUN_TIMEOUT:-0} > 0 )); then
  "$PY" -c 'import json, sys; sys.stdout.writelines(n + "\n" for n in json.load(open(sys.argv[1]))["regressions"])' \
    "$OUTDIR/$suite-compare.json" > "$OUTDIR/$suite-rerun.names" 2>/dev/null
  if [[ -s "$OUTDIR/$suite-rerun.names" ]]; then
    echo "== rerun alone, both modes: $(wc -l < "$OUTDIR/$suite-rerun.names") tests that passed plain and not with jitkey"
    JITKEY_ONLY="$OUTDIR/$suite-rerun.names" TIME_LIMIT="$RERUN_TIMEOUT" both "$suite-rerun" "$gpus" "$@"
  fi
fi
# The shards' XML, logs and reports in one archive (a device that returns only a few files gets them all).
if (( shards > 1 )); then
  ( cd "$OUTDIR" && tar czf "$suite-shards.tgz" "$suite"-*plain-* "$suite"-*jitkey-* && rm -f "$suite"-*plain-* "$suite"-*jitkey-* )
fi
