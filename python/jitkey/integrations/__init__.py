"""jitkey under real kernel DSLs: one adapter per library, each over the public DSL layer (:mod:`jitkey.dsl`).

Each adapter module has the same face: ``LIBRARY`` (its distribution name), ``SUPPORTED`` (the versions it
knows), ``install()`` / ``uninstall()`` / ``installed()``, and ``report()``. ``install()`` refuses a version it
does not know with :class:`jitkey.errors.UnsupportedVersionError` (naming the supported versions) and leaves the
library untouched. :func:`install_available` installs every adapter whose library is installed and supported
(what :func:`jitkey.install` and the pytest plugin's ``--jitkey-integrations`` do); :func:`status` says, for
each, whether it is on and why not (``jitkey info`` shows it).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from jitkey import _deps
from jitkey.errors import UnsupportedVersionError

#: Adapter name → module.
ADAPTERS = {"helion": "jitkey.integrations.helion", "flag_gems": "jitkey.integrations.flag_gems"}

__all__ = ["ADAPTERS", "adapter", "install_available", "status", "uninstall_all"]


def adapter(name: str) -> ModuleType:
    """The adapter module ``name`` (a key of :data:`ADAPTERS`)."""
    return importlib.import_module(ADAPTERS[name])


def library_version(dist: str) -> str | None:
    """An installed distribution's version, without importing it (None if absent)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_version(library: str, dist: str, supported: tuple[str, ...]) -> str:
    """The installed version of ``dist``; raises :class:`MissingDependencyError` if absent and
    :class:`UnsupportedVersionError` if it is not one of ``supported``."""
    v = library_version(dist)
    if v is None:
        raise _deps.missing(dist, f"jitkey.integrations ({library})")
    if v not in supported:
        raise UnsupportedVersionError(
            f"jitkey.integrations: {library} {v} is not supported (supported: {', '.join(supported)}); "
            f"{library} is left as it is"
        )
    return v


def install_once(
    library: str,
    dist: str,
    supported: tuple[str, ...],
    lock: threading.Lock,
    installed: Callable[[], bool],
    patch: Callable[[], None],
) -> None:
    """An adapter's ``install()``: the version check (:func:`check_version`), then, under the adapter's
    ``lock`` and unless ``installed()``, ``triton.jit`` routed through jitkey (:func:`jitkey.triton.install`)
    and the adapter's own ``patch()``."""
    check_version(library, dist, supported)
    import jitkey.triton

    with lock:
        if installed():
            return
        jitkey.triton.install()
        patch()


def adapter_report(dsl_name: str) -> dict[str, Any]:
    """:func:`jitkey.dsl.report` of one adapter: its sites (named ``"<dsl_name>:..."``) and, under ``declined``,
    the entry points it left to its DSL (:func:`jitkey.dsl.decline` with ``dsl_name``). Each adapter's
    ``report()``."""
    from jitkey import dsl

    out = dsl.report(where=lambda s: s.name.startswith(f"{dsl_name}:"))
    out["declined"] = {k: n for k, n in out["declined"].items() if k.startswith(f"{dsl_name}: ")}
    return out


def status() -> dict[str, dict[str, Any]]:
    """name → ``{"library": version or None, "supported": versions, "installed": bool, "why": str or None}``.
    Imports no DSL."""
    out: dict[str, dict[str, Any]] = {}
    for name in ADAPTERS:
        mod = adapter(name)
        v = library_version(mod.LIBRARY)
        why = None
        if v is None:
            why = f"{mod.LIBRARY} is not installed"
        elif v not in mod.SUPPORTED:
            why = f"{mod.LIBRARY} {v} is not a supported version ({', '.join(mod.SUPPORTED)})"
        elif not mod.installed():
            why = "not installed (jitkey.install() or jitkey.integrations.<name>.install())"
        out[name] = {"library": v, "supported": mod.SUPPORTED, "installed": mod.installed(), "why": why}
    return out


def install_available() -> dict[str, str | None]:
    """Install every adapter whose library is installed in a supported version: name → None (installed) or
    why not. Never raises: a missing, unsupported or failing library is reported, and left as it is."""
    out: dict[str, str | None] = {}
    for name, st in status().items():
        if st["installed"]:
            out[name] = None
            continue
        if st["library"] is None or st["library"] not in st["supported"]:
            out[name] = st["why"]
            continue
        try:
            adapter(name).install()
            out[name] = None
        except Exception as exc:  # e.g. a library that cannot import here (FlagGems without a GPU)
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def uninstall_all() -> None:
    """Uninstall every installed adapter."""
    for name in ADAPTERS:
        mod = adapter(name)
        if mod.installed():
            mod.uninstall()
