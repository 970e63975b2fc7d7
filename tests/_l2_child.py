"""Run by tests/test_triton_l2.py in a fresh process: Triton compiles for sm90 with its real ``ptxas`` (no GPU
needed) while the driver is a recording stand-in (``FakeDriver``: module loads and launches are recorded, never
run), so Triton's own path and jitkey's L2 can be compared on a CPU. Prints a JSON summary of what each call
gave: the compiled kernel (hash, binary digest, metadata, IR), what was loaded and launched, what Triton keeps in
``device_caches``, and the kernels' statistics.

Usage: ``python _l2_child.py CONFIG_JSON`` with ``{"mode": "jitkey" | "plain", "module": path of the kernels
module, "calls": [[kernel, [args...], {kwargs}], ...], "setup": python code run before the calls, "then": python
code run after them (``extra`` is reported), "watch": bool}`` (``watch``: report which of Triton's compile path,
``triton_key()``, binder, its generation and the parse of a kernel's source, ran); an arg ``["t", dtype]`` is a 4096-element CPU tensor of that dtype (offset by one
element with ``["t+1", dtype]``), ``["tl", name]`` is ``triton.language.<name>``, ``["fn", name]`` the kernels module's ``name`` (a jit function passed
as a constexpr), anything else is passed as it is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime.driver import driver

LOADS: list[list[Any]] = []
LAUNCHES: list[list[Any]] = []


class Utils:
    def load_binary(
        self, name: str, kernel: bytes, shared: int, device: int
    ) -> tuple[int, int, int, int, int]:
        LOADS.append([name, hashlib.sha256(kernel).hexdigest(), shared, device])
        return (len(LOADS), 0xF000 + len(LOADS), 32, 0, 1024)

    def unload_module(self, module: Any) -> None:  # Triton 3.9's CompiledKernel.__del__
        pass

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}


def _arg(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return [str(a.dtype), a.data_ptr() % 16]
    if isinstance(a, triton.runtime.jit.JITFunction):  # a jitkey kernel or Triton's: the same function
        return ["jit", a.cache_key]
    return a if isinstance(a, (int, float, bool, str, type(None))) else type(a).__name__


class Launcher:
    """What ``driver.active.launcher_cls(src, metadata)`` gives: records each launch."""

    FIELDS = ("global_scratch_size", "global_scratch_align", "profile_scratch_size", "profile_scratch_align")
    FIELDS += ("launch_cooperative_grid", "launch_pdl")

    def __init__(self, src: Any, metadata: Any) -> None:
        self.signature = dict(src.signature)
        self.num_ctas = getattr(metadata, "num_ctas", 1)
        for name in self.FIELDS:  # what CudaLauncher keeps of the metadata
            setattr(self, name, getattr(metadata, name))

    def __call__(
        self, gx: int, gy: int, gz: int, stream: int, function: int, packed: Any, *rest: Any
    ) -> None:
        _md, _enter, _exit, *args = rest
        LAUNCHES.append([gx, gy, gz, stream, function, list(packed), [_arg(a) for a in args]])


class FakeDriver(DriverBase):
    launcher_cls = Launcher

    def __init__(self) -> None:
        self.utils = Utils()
        self.get_current_device = lambda: 0
        self.get_current_stream = lambda device: 0x5EED
        self.set_current_device = lambda device: None

    @classmethod
    def is_active(cls) -> bool:
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> Any:
        return torch.device("cpu")

    def get_benchmarker(self) -> Any:
        raise NotImplementedError

    def get_device_interface(self) -> Any:
        raise NotImplementedError


def _value(a: Any) -> Any:
    if isinstance(a, list) and a and a[0] == "fn":
        return getattr(sys.modules["l2_kernels"], a[1])
    if isinstance(a, list) and a and a[0] in ("t", "t+1"):
        t = torch.empty(4096 + 16, dtype=getattr(torch, a[1]))
        return t[1:] if a[0] == "t+1" else t
    if isinstance(a, list) and a and a[0] == "tl":
        import triton.language as tl

        return getattr(tl, a[1])
    return a


def _ck(ck: Any) -> dict[str, Any]:
    md = ck.metadata._asdict()
    md["target"] = [md["target"].backend, md["target"].arch, md["target"].warp_size]
    return {
        "type": type(ck).__name__,
        "hash": ck.hash,
        "name": ck.name,
        "binary": hashlib.sha256(ck.kernel).hexdigest(),
        "metadata": json.loads(json.dumps(md, default=repr)),
        "asm": {
            k: hashlib.sha256(v if isinstance(v, bytes) else v.encode()).hexdigest()
            for k, v in ck.asm.items()
        },
        "group": sorted(ck.metadata_group),
        "packed": list(ck.packed_metadata),
        "src": [sorted(ck.src.signature.items()), repr(sorted(ck.src.constants.items())), repr(ck.src.attrs)],
        "src_hash": ck.src.hash(),
        "vars": sorted(vars(ck)),
    }


def main() -> None:
    cfg = json.loads(sys.argv[1])
    driver.set_active(FakeDriver())
    watched: list[str] = []
    if cfg.get("watch"):  # Triton's compile path, its installation hash, its binder: which of them ran
        targets = {
            ("compiler/compiler.py", "compile"),
            ("runtime/cache.py", "triton_key"),
            ("runtime/jit.py", "_do_compile"),
            ("runtime/jit.py", "dynamic_func"),
            ("<string>", "dynamic_func"),
            ("runtime/jit.py", "create_function_from_signature"),
            ("runtime/jit.py", "parse"),  # the walk behind cache_key (jitkey replays a recorded one)
        }

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                code = frame.f_code
                for suffix, name in targets:
                    if code.co_name == name and code.co_filename.endswith(suffix):
                        watched.append(name)

        sys.setprofile(profile)
    if cfg["mode"] == "jitkey":
        import jitkey.triton

        jitkey.triton.install()
    spec = importlib.util.spec_from_file_location("l2_kernels", cfg["module"])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["l2_kernels"] = mod
    spec.loader.exec_module(mod)
    scope: dict[str, Any] = {"triton": triton, "mod": mod, "torch": torch}
    exec(cfg.get("setup", ""), scope)
    out: dict[str, Any] = {"calls": []}
    for name, args, kwargs in cfg["calls"]:
        k = getattr(mod, name)
        vals = [_value(a) for a in args]
        try:
            ck = k[(4,)](*vals, **{n: _value(v) for n, v in kwargs.items()})
            out["calls"].append(_ck(ck))
        except Exception as exc:
            out["calls"].append({"error": f"{type(exc).__name__}: {exc}"})
    exec(cfg.get("then", ""), scope)  # after the calls (``extra`` is reported)
    out["loads"] = LOADS
    out["launches"] = LAUNCHES
    out["device_caches"] = {
        name: sorted(str(key) for key in getattr(mod, name).device_caches[0][0])
        for name in sorted({c[0] for c in cfg["calls"]})
    }
    if cfg["mode"] == "jitkey":
        import jitkey.triton

        out["stats"] = {
            name: getattr(mod, name).cache_stats() for name in sorted({c[0] for c in cfg["calls"]})
        }
        out["report"] = jitkey.triton.report()
        out["l2"] = jitkey.triton.fast_paths().get("l2")
    sys.setprofile(None)
    out["watched"] = sorted(set(watched))
    out["gluon"] = "triton.experimental.gluon" in sys.modules
    out["extra"] = scope.get("extra")
    print(json.dumps(out, default=repr))


if __name__ == "__main__":
    main()
