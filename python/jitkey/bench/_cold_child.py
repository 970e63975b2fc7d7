"""One fresh process of ``jitkey bench --only cold`` (run as a script, so that plain Triton runs never import
jitkey): decorate (import a module of N kernels) or launch every variant of a module's kernels once, timing
each step with ``time.perf_counter``; prints one JSON line.

``python _cold_child.py '{"phase": "decorate" | "launch", "mode": "plain" | "jitkey" | "install", "module": path,
"kernels": K, "dtypes": [...], "library": name}'`` (``library``: import that installed package instead of
``module``). ``torch`` and ``triton`` are imported before anything is timed (a kernel
library imports them first); in ``jitkey``/``install`` mode the import of ``jitkey.triton`` is timed with the
decoration (a one-time cost of the process).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from typing import Any


def _import(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("cold_kernels", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cold_kernels"] = mod
    spec.loader.exec_module(mod)
    return mod


def decorate(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch  # noqa: F401
    import triton  # noqa: F401

    t0 = time.perf_counter()
    if cfg["mode"] != "plain":
        import jitkey.triton

        if cfg["mode"] == "install":
            jitkey.triton.install()
    if cfg.get("library"):  # an installed kernel library, imported by name (FlagGems)
        importlib.import_module(cfg["library"])
        elapsed = time.perf_counter() - t0
        if cfg["mode"] == "install":
            assert jitkey.triton.report()["kernels"] > 0, "install() routed none of the library's kernels"
        return {"seconds": elapsed}
    mod = _import(cfg["module"])
    elapsed = time.perf_counter() - t0
    kernels = [getattr(mod, f"k{i}") for i in range(cfg["kernels"])]
    want = "TritonKernel" if cfg["mode"] != "plain" else "JITFunction"
    assert all(type(k).__name__ == want for k in kernels), "the kernels are not what the mode makes"
    return {"seconds": elapsed}


def launch(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import triton  # noqa: F401

    if cfg["mode"] != "plain":
        import jitkey.triton

        jitkey.triton.install()
    mod = _import(cfg["module"])
    n = 4096
    bufs = {
        dt: [torch.rand(n, device="cuda").to(getattr(torch, dt)) for _ in range(3)] for dt in cfg["dtypes"]
    }
    torch.cuda.synchronize()  # the CUDA context exists before anything is timed (both modes alike)
    first: list[float] = []
    second: list[float] = []
    for i in range(cfg["kernels"]):
        k = getattr(mod, f"k{i}")
        for dt in cfg["dtypes"]:
            x, y, out = bufs[dt]
            for times in (first, second):
                t0 = time.perf_counter()
                k[(n // 1024,)](x, y, out, n, BLOCK=1024)
                times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    # every kernel ran: check the last variant's output (out = x + y * i of the module's body)
    last = cfg["kernels"] - 1
    for dt in cfg["dtypes"]:
        x, y, out = bufs[dt]
        ref = (x.float() + y.float() * last).to(out.dtype)
        assert torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-2), f"wrong result for {dt}"
    result: dict[str, Any] = {"first": first, "second": second}
    if cfg["mode"] != "plain":
        import jitkey.triton

        rep = jitkey.triton.report()
        result["l2_hits"], result["l2_misses"] = rep["l2_hits"], rep["l2_misses"]
    return result


def main() -> None:
    cfg = json.loads(sys.argv[1])
    res = decorate(cfg) if cfg["phase"] == "decorate" else launch(cfg)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
