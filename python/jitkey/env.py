"""The environment that changes compiled code, as a keyable tuple to fold into persistent keys."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterable
from typing import Final

__all__ = ["DEFAULT_ENV_VARS", "env_key"]

DEFAULT_ENV_VARS: Final[tuple[str, ...]] = (
    # Triton's CACHE_INVALIDATING_ENV_VARS (include/triton/Tools/Sys/GetEnv.hpp) as of triton 3.6.0,
    # read back from the installed libtriton (tests/test_env_key.py checks this list still covers it).
    # When triton is importable, env_key also adds whatever newer names Triton reports as set.
    "ALLOW_LHS_TMEM_LAYOUT_CONVERSION",
    "AMDGCN_ENABLE_DUMP",
    "AMDGCN_USE_BUFFER_ATOMICS",
    "AMDGCN_USE_BUFFER_OPS",
    "DISABLE_LLVM_OPT",
    "DISABLE_MMA_V3",
    "DISABLE_MMA_V5",
    "DISABLE_PTXAS_OPT",
    "LLVM_ENABLE_TIMING",
    "LLVM_EXTRACT_DI_LOCAL_VARIABLES",
    "LLVM_IR_ENABLE_DUMP",
    "LLVM_PASS_PLUGIN_PATH",
    "MLIR_DISABLE_MULTITHREADING",
    "MLIR_DUMP_PATH",
    "MLIR_ENABLE_DIAGNOSTICS",
    "MLIR_ENABLE_DUMP",
    "MLIR_ENABLE_TIMING",
    "NVPTX_ENABLE_DUMP",
    "TRITON_DEFAULT_FP_FUSION",
    "TRITON_DISABLE_LINE_INFO",
    "TRITON_DUMP_MIR",
    "TRITON_ENABLE_ASAN",
    "TRITON_ENABLE_EXPERIMENTAL_CONSAN",
    "TRITON_ENABLE_LLVM_DEBUG",
    "TRITON_F32_DEFAULT",
    "TRITON_HIP_USE_ASYNC_COPY",
    "TRITON_HIP_USE_BLOCK_PINGPONG",
    "TRITON_HIP_USE_IN_THREAD_TRANSPOSE",
    "TRITON_LLVM_DEBUG_ONLY",
    "TRITON_OVERRIDE_ARCH",
    "USE_IR_LOC",
    # Triton knobs read in Python that change the generated code but are not in the C++ list.
    "TRITON_DEBUG",
    "TRITON_INTERPRET",
)
"""Environment variables that change the code Triton generates (the default of ``env_key(names=)``)."""


def _triton_set_env_vars() -> dict[str, str]:
    """Triton's own view of the cache-invalidating variables that are set (newer Tritons add names)."""
    if importlib.util.find_spec("triton") is None:
        return {}
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return {}
    return dict(get_cache_invalidating_env_vars())


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, str | None], ...]:
    from jitkey import __version__

    return (("jitkey", __version__), ("torch", _dist_version("torch")), ("triton", _dist_version("triton")))


@functools.lru_cache(maxsize=1)
def _triton_key() -> str | None:
    """``triton.runtime.cache.triton_key()``: a hash of Triton's compiler, backends and libtriton, folded to 32
    bytes (hex); None without Triton.

    Triton reads and hashes every compiler file for it (about a second) once per process; here it is computed
    once per installation: ``jitkey.triton`` keeps it in its disk index under the fingerprint of the installed
    files (path, size, mtime), and a process reads it back.
    """
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        from jitkey.triton._installation import triton_key_digest
    except ImportError:  # a Triton jitkey.triton cannot bind: computed here, every process
        return compute_triton_key()
    return triton_key_digest()


def compute_triton_key() -> str | None:
    """:func:`_triton_key` computed now (what ``jitkey.triton`` stores per installation)."""
    try:
        from triton.runtime.cache import triton_key  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        try:
            from triton.compiler.compiler import triton_key  # type: ignore[import-untyped,unused-ignore]
        except ImportError:
            return None
    from jitkey._core import digest

    # Folded to 32 bytes: the raw key is ~2 KB of concatenated file hashes.
    return digest(str(triton_key())).hex()


def _device_key(device: bool | int) -> tuple[object, ...]:
    """The current CUDA (or ROCm) device's name and full capability, without initialising CUDA needlessly."""
    if importlib.util.find_spec("torch") is None:
        return ("no-torch",)
    import torch

    # is_available() asks the driver for a device count without creating a context.
    if not torch.cuda.is_available():
        return ("cpu",)
    index = torch.cuda.current_device() if device is True else int(device)
    props = torch.cuda.get_device_properties(index)
    return (
        "cuda",
        str(props.name),
        int(props.major),
        int(props.minor),
        str(getattr(props, "gcnArchName", "") or ""),
        torch.version.cuda,
        torch.version.hip,
    )


def _env_text(s: str | None) -> str | bytes | None:
    """An environment name or value as a keyable value: the str, or, when it is not valid UTF-8
    (Python decodes such bytes with lone surrogates, which no key accepts), its raw bytes: a
    different type, so it never collides with a str."""
    if s is None:
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(s)
    return s


def env_key(
    names: Iterable[str] = DEFAULT_ENV_VARS,
    prefixes: Iterable[str] = (),
    *,
    versions: bool = True,
    device: bool | int = True,
    compiler: bool = True,
) -> tuple[object, ...]:
    """Return the environment that changes compiled code, as a keyable tuple (for :func:`jitkey.digest`).

    ``(("env", ((NAME, value or None), ...)), ("versions", ...), ("triton_key", ...), ("device", ...))``:

    * ``env``: the variables in ``names`` plus every variable whose name starts with one of
      ``prefixes``, sorted by name; an unset variable is ``None``, so unset and empty differ. With the
      default ``names``, the variables Triton itself reports as cache-invalidating and set are added.
    * ``versions`` (when ``versions``): jitkey, torch and triton distribution versions (None when absent).
    * ``triton_key`` (when ``compiler``): Triton's hash of its own compiler (computed once per
      process; about a second the first time), None without Triton.
    * ``device`` (when ``device``; an int picks a CUDA device index): ``("cuda", name, major, minor,
      gcn_arch, cuda_version, hip_version)`` for the current device, ``("cpu",)`` when torch sees no
      GPU, ``("no-torch",)`` without torch. Only the driver's device count is queried when there is
      no GPU.

    Sections left out by the flags are absent, so keys built with different flags never collide.

    Raises:
        TypeError: ``names`` or ``prefixes`` given as a single str (a likely mistake).
    """
    if isinstance(names, str) or isinstance(prefixes, str):
        raise TypeError("names= and prefixes= take iterables of names, not a single str")
    wanted = set(names)
    for name in wanted:
        if type(name) is not str:
            raise TypeError(f"environment variable names must be str, got {type(name).__qualname__!r}")
    prefix_list = tuple(prefixes)
    for prefix in prefix_list:
        if type(prefix) is not str or not prefix:
            raise TypeError("prefixes must be non-empty str")
    environ = os.environ
    if prefix_list:
        wanted.update(k for k in environ if k.startswith(prefix_list))
    if names is DEFAULT_ENV_VARS:
        wanted.update(_triton_set_env_vars())
    out: list[tuple[str, object]] = [
        ("env", tuple((_env_text(k), _env_text(environ.get(k))) for k in sorted(wanted, key=os.fsencode)))
    ]
    if versions:
        out.append(("versions", _versions()))
    if compiler:
        out.append(("triton_key", _triton_key()))
    if device is not False:
        out.append(("device", _device_key(device)))
    return tuple(out)
