#!/usr/bin/env bash
# What a user gets from `pip install`: fresh venvs install the built wheel and the sdist (no dev tools, no
# torch), then `jitkey --version`, `jitkey info`, `jitkey cache info|verify` and the README's snippets run; the
# wheel also under every other Python 3.10-3.14 this machine has (the key vectors too).
# A second pass lends the fresh venv the dev venv's torch + triton (through a .pth, after its own
# site-packages, so jitkey still comes from the install) to run the snippets and checks that need them.
#
#   bash scripts/install_check.sh [DIST_DIR]      (make install-check builds the wheel and the sdist first)
#
# Needs python3 with venv and pip; the sdist pass needs Rust and PyPI (pip builds it with maturin).
set -euo pipefail
cd "$(dirname "$0")/.."
DIST="${1:-dist}"
DEV_PY="${DEV_PY:-.venv/bin/python}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/jitkey-install-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
log() { echo "[install-check] $*"; }
fail() { echo "[install-check] FAILED: $*" >&2; exit 1; }

wheel="$(ls "$DIST"/jitkey-*.whl 2>/dev/null | head -n1 || true)"
sdist="$(ls "$DIST"/jitkey-*.tar.gz 2>/dev/null | head -n1 || true)"
[[ -n "$wheel" ]] || fail "no wheel in $DIST (make wheel)"
[[ -n "$sdist" ]] || fail "no sdist in $DIST (make sdist)"
version="$(basename "$wheel" | cut -d- -f2)"

check_venv() {  # $1: label, $2: venv dir
  local label="$1" venv="$2" py="$2/bin/python" jk="$2/bin/jitkey"
  export JITKEY_CACHE_DIR="$WORK/cache-$label"
  log "$label: jitkey --version / info / info --json / cache info"
  out="$("$jk" --version)"; [[ "$out" == "jitkey $version" ]] || fail "$label: --version printed '$out'"
  "$py" -m jitkey --version >/dev/null
  "$py" -c "import jitkey, sys; p = jitkey.__file__; sys.exit(0 if p.startswith('$venv/') else 'jitkey from ' + p)"
  "$jk" info
  "$jk" info --json | "$py" -c "import json, sys; d = json.load(sys.stdin); assert d['jitkey'] == '$version', d"
  "$py" -c "import inspect, jitkey; assert 'Single-flight' in inspect.getdoc(jitkey.LruCache.get_or_insert)" \
    || fail "$label: help() shows no docs on the native classes"
  "$py" -c "import jitkey; assert not hasattr(jitkey.DiskIndex, '_arm_fault')" \
    || fail "$label: the crash tests' fault hook (cargo feature fault-injection) is in a release build"
  "$jk" cache info | grep -q "no index here yet" || fail "$label: cache info on an empty directory"
  "$py" -c "import jitkey; ix = jitkey.DiskIndex(); ix.put(('k', 1), b'v'); ix.close()"
  "$jk" cache info | grep -qE "entries +1" || fail "$label: cache info after one put"
  "$jk" cache verify >/dev/null || fail "$label: cache verify"
  log "$label: README snippets (those needing torch/triton are skipped here)"
  "$py" tests/readme_snippets.py README.md docs/*.md
  unset JITKEY_CACHE_DIR
}

with_dev_torch() {  # $1: label, $2: venv dir — lend it the dev venv's torch and triton, run what needs them
  local label="$1" venv="$2" py="$2/bin/python"
  [[ -x "$DEV_PY" ]] || { log "$label: no dev venv at $DEV_PY; the torch pass is skipped"; return 0; }
  local site; site="$("$DEV_PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')"
  local tsite; tsite="$("$DEV_PY" -c 'import os, triton; print(os.path.dirname(os.path.dirname(triton.__file__)))')"
  "$py" -c 'import site; print(site.getsitepackages()[0])' | {
    read -r own; printf '%s\n%s\n' "$site" "$tsite" > "$own/zz_dev_torch.pth"; }
  export JITKEY_CACHE_DIR="$WORK/cache-$label-torch"
  log "$label + dev torch/triton: every CPU README snippet, and a forced-off fast path is reported"
  "$py" -c "import jitkey, sys; p = jitkey.__file__; sys.exit(0 if p.startswith('$venv/') else 'jitkey from ' + p)"
  "$py" tests/readme_snippets.py README.md docs/*.md --require-all
  "$venv/bin/jitkey" info --json | "$py" -c "import json, sys; d = json.load(sys.stdin); assert d['fast_paths']['tensor_fields']['on'] is True, d['fast_paths']"
  JITKEY_TENSOR_FIELDS=0 "$venv/bin/jitkey" info --json | "$py" -c "import json, sys; t = json.load(sys.stdin)['fast_paths']['tensor_fields']; assert t['on'] is False and 'JITKEY_TENSOR_FIELDS=0' in t['why'], t"
  unset JITKEY_CACHE_DIR
}

log "wheel: $wheel"
python3 -m venv "$WORK/venv-wheel"
"$WORK/venv-wheel/bin/python" -m pip install -q --no-deps "$wheel"
check_venv wheel "$WORK/venv-wheel"
with_dev_torch wheel "$WORK/venv-wheel"

# The abi3 wheel under every other CPython it supports (3.10+) that this machine has: on PATH, or under pyenv.
# Each gets the checks above (no torch) and the committed key vectors (the same key bytes on every version).
"$WORK/venv-wheel/bin/python" tests/vectors/vectors.py || fail "wheel: the key vectors"
for v in 3.10 3.12 3.13 3.14; do
  # pyenv's versions first (its shims on PATH name every version but run only the selected ones)
  py="$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v" 2>/dev/null | tail -n1 || true)"
  if [[ -z "$py" ]] && command -v "python$v" >/dev/null && "python$v" -c "" 2>/dev/null; then py="$(command -v "python$v")"; fi
  if [[ -z "$py" ]]; then log "python$v: not installed on this machine, skipped"; continue; fi
  "$py" -m venv "$WORK/venv-py$v" || { log "python$v ($py): cannot make a venv, skipped"; continue; }
  "$WORK/venv-py$v/bin/python" -m pip install -q --no-deps "$wheel"
  check_venv "py$v" "$WORK/venv-py$v"
  "$WORK/venv-py$v/bin/python" tests/vectors/vectors.py || fail "python$v: the key vectors"
done

log "sdist: $sdist (pip builds it: maturin from PyPI, cargo release build)"
python3 -m venv "$WORK/venv-sdist"
t0=$SECONDS
# a build from scratch, as a user's pip does it (not from a target directory this machine already has)
env -u CARGO_TARGET_DIR "$WORK/venv-sdist/bin/python" -m pip install -q --no-cache-dir "$sdist"
log "sdist built and installed in $((SECONDS - t0)) s"
check_venv sdist "$WORK/venv-sdist"
log "all passed"
