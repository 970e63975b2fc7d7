"""GPU check of the remote compile cache (issue 27): a kernel compiled on host 1 runs correctly on host 2.

    python scripts/gpu_remote_compile.py [--json OUT.json]

Starts a throwaway redis-server (``jitkey._redis_server``; Debian's package, or ``scripts/fetch_redis_server.sh``),
then runs two "hosts", each a fresh process with its own ``TRITON_CACHE_DIR``, ``JITKEY_REMOTE_CACHE`` pointing at
the server and one ``JITKEY_REMOTE_SECRET``, calling ``jitkey.triton.install()`` and launching a ``triton.jit``
kernel (three variants) on the GPU. Host 1 compiles; host 2 must compile nothing (Triton's compilation listener
reports every compile a cache hit) and produce results equal to torch's. Prints, per host, the compiles, the
remote counters and the wall time from the first call to the first finished launch (the number for the issue's
closing note). Exit status 0 when host 2 compiled nothing and every result matched, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HOST = textwrap.dedent(
    r"""
    import json, sys, time
    import torch, triton, triton.language as tl
    from triton import knobs
    import jitkey.triton as jt
    from jitkey.triton import remote_cache

    jt.install()
    compiles = []
    knobs.compilation.listener = lambda **kw: compiles.append(bool(kw["cache_hit"]))

    @triton.jit
    def scale_add(x, y, out, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) * alpha + tl.load(y + offs, mask=mask), mask=mask)

    n = 1 << 20
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    ok, first = True, None
    for block in (256, 512, 1024):
        out = torch.empty_like(x)
        t0 = time.perf_counter()
        scale_add[(triton.cdiv(n, block),)](x, y, out, n, 2.0, BLOCK=block)
        torch.cuda.synchronize()
        if first is None:
            first = time.perf_counter() - t0
        ok = ok and torch.allclose(out, x * 2.0 + y)
    print(json.dumps({"cache_hits": compiles, "correct": ok, "first_launch_s": first,
                      "remote": remote_cache.stats()}))
    """
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    from jitkey._redis_server import RedisServer

    results = {}
    with RedisServer() as srv, tempfile.TemporaryDirectory() as tmp:
        host = Path(tmp) / "host.py"  # Triton reads a kernel's source from its file: not python -c
        host.write_text(HOST)
        for name in ("host1", "host2"):
            env = dict(
                os.environ,
                TRITON_CACHE_DIR=str(Path(tmp) / name),
                JITKEY_REMOTE_CACHE=srv.url,
                JITKEY_REMOTE_SECRET="gpu-check-secret",
            )
            proc = subprocess.run(
                [sys.executable, str(host)], env=env, capture_output=True, text=True, timeout=900
            )
            if proc.returncode != 0:
                print(f"{name} failed:\n{proc.stderr[-4000:]}", file=sys.stderr)
                return 1
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            r = results[name]
            print(
                f"{name}: compiles {r['cache_hits'].count(False)} of {len(r['cache_hits'])}, correct {r['correct']}, "
                f"first launch {r['first_launch_s'] * 1e3:.1f} ms, remote hits {r['remote']['hits']}, "
                f"puts {r['remote']['puts']}, rejects {r['remote'].get('remote_rejects', 0)}"
            )
    h1, h2 = results["host1"], results["host2"]
    ok = h1["correct"] and h2["correct"] and h2["cache_hits"] and all(h2["cache_hits"])
    print(
        f"host 2 compiled nothing host 1 compiled: {bool(ok)}; first launch host 1 {h1['first_launch_s'] * 1e3:.1f} ms"
        f" -> host 2 {h2['first_launch_s'] * 1e3:.1f} ms"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
