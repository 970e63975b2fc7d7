"""Optional dependencies: one error for a missing one (:class:`jitkey.errors.MissingDependencyError`, a
``ModuleNotFoundError``), naming the feature, the package and the extra that installs it."""

from __future__ import annotations

import importlib.util
import sys

from jitkey.errors import MissingDependencyError

# module -> (pip package, jitkey extra)
_PACKAGES = {
    "torch": ("torch", "torch"),
    "triton": ("triton", "triton"),
    "matplotlib": ("matplotlib", "plot"),
    "redis": ("redis", "redis"),
}


def missing(module: str, feature: str) -> MissingDependencyError:
    """The error for ``feature`` needing ``module``, which is not installed."""
    package, extra = _PACKAGES.get(module, (module, None))
    hint = f"pip install {package}"
    if extra is not None:
        hint += f"  (or: pip install 'jitkey[{extra}]')"
    return MissingDependencyError(f"{feature} needs {package}, which is not installed: {hint}", name=module)


def require(module: str, feature: str) -> None:
    """Raise :func:`missing`'s error unless ``module`` can be imported (cheap when already imported)."""
    if sys.modules.get(module) is not None:
        return
    try:
        found = importlib.util.find_spec(module) is not None
    except ValueError:  # a module whose __spec__ is None (set up by hand): treat it as present
        found = True
    if not found:
        raise missing(module, feature)
