#!/usr/bin/env bash
# Bring a redis-server to a machine without network or apt (the GPU host): on a Debian/Ubuntu machine WITH
# apt, download Debian's redis-server + redis-tools packages and the libraries they link that a stock host
# may lack (libjemalloc2, liblzf1, libatomic1) into .redis-debs/ (git-ignored), unpack them there with
# `dpkg -x` (no root, nothing installed) and check that the unpacked server starts and answers PING.
#
#   scripts/fetch_redis_server.sh              # -> .redis-debs/*.deb and .redis-debs/root/usr/bin/redis-server
#   EXTRA_DEBS="libssl3 libsystemd0" scripts/fetch_redis_server.sh   # for hosts missing those too
#
# It also downloads the pinned redis-py wheel (requirements-dev.txt) into .redis-debs/wheels/ for a host
# without a package index: `pip install --no-index .redis-debs/wheels/redis-*.whl` there.
# Carry .redis-debs/ to the other machine (or just the .deb files and re-run with --unpack-only there);
# jitkey._redis_server (the tests, the bench CLI's remote section, examples/shared_autotune.py
# --second-host) finds .redis-debs/root/usr/bin/redis-server (under the current directory or the source
# checkout; or set JITKEY_REDIS_SERVER) and sets LD_LIBRARY_PATH for it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.redis-debs
unpack_only=0
[[ "${1:-}" == "--unpack-only" ]] && unpack_only=1

mkdir -p "$out"
if [[ $unpack_only == 0 ]]; then
    command -v apt-get >/dev/null || { echo "apt-get not found: run this on a Debian/Ubuntu machine" >&2; exit 1; }
    # shellcheck disable=SC2086
    pkgs=(redis-server redis-tools libjemalloc2 liblzf1 libatomic1 ${EXTRA_DEBS:-})
    rm -f "$out"/*.deb
    (cd "$out" && apt-get download -q "${pkgs[@]}" 2>&1 | grep -v '^Get:' || true)
    ls "$out"/redis-tools_*.deb >/dev/null 2>&1 || {
        echo "apt-get download failed (run apt-get update first?)" >&2
        exit 1
    }
    py=python3
    [[ -x .venv/bin/python ]] && py=.venv/bin/python
    pin=$(grep -E '^redis==' requirements-dev.txt || echo redis)
    rm -rf "$out/wheels"
    "$py" -m pip download -q --no-deps -d "$out/wheels" "$pin" ||
        echo "warning: could not download the $pin wheel (pip); the server is still unpacked" >&2
fi

rm -rf "$out/root"
mkdir -p "$out/root"
for deb in "$out"/*.deb; do
    dpkg -x "$deb" "$out/root"
done
bin="$out/root/usr/bin/redis-server"
libs="$PWD/$out/root/usr/lib/x86_64-linux-gnu:$PWD/$out/root/lib/x86_64-linux-gnu"
echo "unpacked: $bin -> $(readlink "$bin" || echo '(file)')"
missing=$(LD_LIBRARY_PATH="$libs" ldd "$bin" | grep 'not found' || true)
if [[ -n "$missing" ]]; then
    echo "missing libraries (add their packages with EXTRA_DEBS=...):" >&2
    echo "$missing" >&2
    exit 1
fi
LD_LIBRARY_PATH="$libs" ldd "$bin" | grep -E "$out|jemalloc|lzf|atomic" || true

# Start it on a free loopback port with a temp directory, PING it, stop it.
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LD_LIBRARY_PATH="$libs" "$bin" --port "$port" --bind 127.0.0.1 --dir "$tmp" --save "" --appendonly no \
    --daemonize no --loglevel warning >"$tmp/log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do
    if reply=$(python3 - "$port" <<'EOF' 2>/dev/null
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.2) as s:
    s.sendall(b"PING\r\n")
    print(s.recv(16).decode().strip())
EOF
    ); then
        if [[ "$reply" == "+PONG" ]]; then
            echo "OK: $("$bin" --version 2>/dev/null || LD_LIBRARY_PATH="$libs" "$bin" --version) answered PING on 127.0.0.1:$port"
            exit 0
        fi
    fi
    sleep 0.05
done
echo "the unpacked redis-server did not answer PING; its log:" >&2
cat "$tmp/log" >&2
exit 1
