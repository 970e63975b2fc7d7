"""``jitkey info``: versions, fast paths, the disk index and the ``JITKEY_*`` variables in effect.

The same facts head the bench's table and JSON, so two bench results can be told apart.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
import warnings
from pathlib import Path
from typing import Any

import jitkey
from jitkey import _fastpaths

# Every environment variable jitkey reads, and what it does (the README's table is checked against this).
ENV_VARS: dict[str, str] = {
    "JITKEY_CACHE_DIR": "directory of the default DiskIndex (else $XDG_CACHE_HOME/jitkey, else ~/.cache/jitkey)",
    "JITKEY_DISK_CACHE": "rw (default) | ro (read-only) | 0 (memory-only): forces the DiskIndex mode",
    "JITKEY_TENSOR_FIELDS": "0 turns the direct TensorImpl reads off (the attribute path; same keys, slower)",
    "JITKEY_TRITON": "plain makes jitkey.triton.jit return plain triton.jit kernels (the binding is bypassed)",
    "JITKEY_DRIVER_LAUNCH": "0 makes warm hits call Triton's launcher instead of cuLaunchKernelEx from jitkey",
    "JITKEY_WATCH": "0 makes warm hits read Triton's state (kernel attributes, knobs, hooks) on every call",
    "JITKEY_NATIVE_CURRENT": "0 makes warm hits read the device and stream through torch's Python getters",
    "JITKEY_NATIVE_ALLOC": "0 makes replayed DSL plans allocate through torch's Python functions (not its C shim)",
    "JITKEY_TRITON_L2": "1 turns the L2 on (off by default): a miss loads a kernel an earlier process compiled from the disk index",
    "JITKEY_LOG": "debug | info | warning | error: attach a stderr handler at that level to the jitkey logger",
}
# (The Redis tier's JITKEY_REMOTE_* variables are documented in jitkey.remote and
# jitkey.triton.remote_cache, and in docs/storage.md's Redis section.)
INDEX_FILE = "index.v1.jki"


def _version(dist: str) -> str | None:
    """An installed distribution's version, without importing it (None if absent)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu() -> dict[str, Any]:
    """torch's view of CUDA (imports torch when installed; never creates a context without a GPU)."""
    out: dict[str, Any] = {"cuda": None, "gpu": None, "gpu_capability": None}
    if importlib.util.find_spec("torch") is None:
        return out
    try:
        import torch

        out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name()
            out["gpu_capability"] = list(torch.cuda.get_device_capability())
    except Exception as e:  # a broken CUDA setup is a fact to report, not a crash
        out["gpu"] = f"error: {type(e).__name__}: {e}"
    return out


def disk_index(
    directory: str | os.PathLike[str] | None = None, *, open_existing: bool = True
) -> dict[str, Any]:
    """Facts about the DiskIndex in ``directory`` (default: the default directory). Never creates it:
    an index is opened only if its file exists."""
    d = Path(directory) if directory is not None else jitkey.DiskIndex.default_directory()
    out: dict[str, Any] = {
        "directory": None if d is None else str(d),
        "exists": False,
        "forced_mode": os.environ.get("JITKEY_DISK_CACHE") or None,
    }
    if d is not None:
        try:
            out["exists"] = (d / INDEX_FILE).exists()
        except OSError as e:  # an unsearchable directory: a fact to report, not a crash
            out["error"] = f"{type(e).__name__}: {e.strerror or e}: {d}"
            return out
    if d is None or not out["exists"] or not open_existing:
        return out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with jitkey.DiskIndex(d) as ix:
                st = ix.stats()
        except (OSError, ValueError) as e:
            out["error"] = f"{type(e).__name__}: {e}"
            return out
    for k in ("mode", "mode_reason", "entries", "file_bytes", "live_bytes", "generation", "max_bytes"):
        if k in st:
            out[k] = st[k]
    out["damaged_records"] = st.get("corrupt_records_skipped", 0)
    if caught:
        out["warnings"] = [str(w.message) for w in caught]
    return out


def _shown(name: str, value: str) -> str:
    """An environment variable's value as ``jitkey info`` shows it: secrets replaced by ``***``
    (``JITKEY_REMOTE_SECRET``, a URL's password)."""
    from jitkey.remote import _redact

    if any(word in name for word in ("SECRET", "PASSWORD", "TOKEN")):
        return "***"
    return _redact(value) if "://" in value else value


def _no_index_created() -> contextlib.AbstractContextManager[None]:
    """Reading the Triton binding's facts stores nothing in a disk index that does not exist yet."""
    if importlib.util.find_spec("triton") is None:
        return contextlib.nullcontext()
    try:
        from jitkey.triton import _installation
    except ImportError:  # a Triton jitkey.triton cannot import: fast_paths() reports it
        return contextlib.nullcontext()
    return _installation.passive()


def collect(*, decide: bool = True) -> dict[str, Any]:
    """Everything ``jitkey info`` reports, as plain JSON-able data.

    ``decide``: settle the lazily decided fast paths (imports torch, and triton for its facts).
    """
    env = {k: _shown(k, v) for k, v in sorted(os.environ.items()) if k.startswith("JITKEY_")}
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    info: dict[str, Any] = {
        "jitkey": jitkey.__version__,
        "jitkey_path": str(Path(jitkey.__file__).parent),
        "format_version": jitkey.FORMAT_VERSION,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "gil_enabled": bool(gil),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": _version("torch"),
        "triton": _version("triton"),
    }
    info.update(_gpu() if decide else {"cuda": None, "gpu": None, "gpu_capability": None})
    with _no_index_created() if decide else contextlib.nullcontext():
        info["fast_paths"] = _fastpaths.fast_paths(decide=decide, triton=decide)
    info["integrations"] = _integrations()
    info["disk_index"] = disk_index()
    info["remote_compile_cache"] = _remote_compile_cache() if decide and info["triton"] else None
    info["env"] = env
    return info


def _remote_compile_cache() -> dict[str, Any]:
    """Whether Triton's compiles would use the Redis tier (``jitkey.triton.remote_cache.state``)."""
    try:
        from jitkey.triton import remote_cache

        return remote_cache.state()
    except Exception as e:  # a broken Triton install is a fact to report, not a crash
        return {"on": None, "why": f"{type(e).__name__}: {e}"}


def _integrations() -> dict[str, Any]:
    """Each DSL integration: the library's version, the versions supported, whether it is installed in this
    process and why not (imports no DSL)."""
    from jitkey import integrations

    out: dict[str, Any] = {}
    for name, st in integrations.status().items():
        out[name] = {**st, "supported": list(st["supported"])}
    return out


def _onoff(fp: dict[str, Any]) -> str:
    if fp["on"] is None:
        return "unknown"
    return "on" if fp["on"] else "OFF"


def format_info(info: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = [
        f"jitkey {info['jitkey']} (key format v{info['format_version']}) at {info['jitkey_path']}",
        f"Python {info['python']} ({info['implementation']}{'' if info['gil_enabled'] else ', free-threaded'})"
        f" on {info['platform']}",
        f"CPU: {info['cpu']} ({info['cpu_count']} cores)",
        f"torch: {info['torch'] or 'not installed'} · triton: {info['triton'] or 'not installed'}"
        f" · CUDA: {info['cuda'] or 'none'} · GPU: {info['gpu'] or 'none'}",
        "",
        "fast paths:",
    ]
    width = max(len(n) for n in info["fast_paths"]) + 2
    for name, fp in info["fast_paths"].items():
        state = _onoff(fp)
        line = f"  {name:<{width}}{state:<9}{fp['what']}"
        if fp["on"] is not True and fp.get("why"):
            line += f"\n  {'':<{width}}{'':<9}-> {fp['why']}"
        lines.append(line)
    lines += ["", "DSL integrations (jitkey.install() turns on every supported one):"]
    for name, st in info.get("integrations", {}).items():
        lib = st["library"] or "not installed"
        state = "on" if st["installed"] else "off"
        line = f"  {name:<{width}}{state:<9}{lib} (supported: {', '.join(st['supported'])})"
        if st.get("why") and st["library"] is not None:
            line += f"\n  {'':<{width}}{'':<9}-> {st['why']}"
        lines.append(line)
    di = info["disk_index"]
    lines += ["", "disk index:"]
    lines.append(f"  directory   {di['directory'] or '(none: no HOME or cache directory)'}")
    if di.get("forced_mode"):
        lines.append(f"  forced      JITKEY_DISK_CACHE={di['forced_mode']}")
    if not di["exists"]:
        lines.append("  state       no index there yet (created on first use)")
    elif "error" in di:
        lines.append(f"  error       {di['error']}")
    else:
        mode = di.get("mode", "?") + (f" ({di['mode_reason']})" if di.get("mode_reason") else "")
        lines.append(f"  mode        {mode}")
        lines.append(f"  entries     {di.get('entries', '?')} · {di.get('file_bytes', '?')} bytes on disk")
        if di.get("damaged_records"):
            lines.append(f"  damaged     {di['damaged_records']} records skipped (run: jitkey cache verify)")
    rc = info.get("remote_compile_cache")
    if rc is not None:
        lines += ["", "remote compile cache (Triton's compiled kernels on the Redis tier):"]
        state = _onoff(rc) + (" (HMAC)" if rc.get("hmac") and rc["on"] else "")
        lines.append(f"  state       {state}" + (f" -> {rc['why']}" if rc.get("why") else ""))
        if rc["on"]:
            how = "Triton's cache manager" if rc.get("wired") else "once jitkey.triton.install() runs"
            lines.append(f"  wired       {how}; namespace {rc.get('namespace')}")
    lines += ["", "environment:"]
    if info["env"]:
        lines += [f"  {k}={v}" for k, v in info["env"].items()]
    else:
        lines.append("  no JITKEY_* variables set")
    return "\n".join(lines) + "\n"
