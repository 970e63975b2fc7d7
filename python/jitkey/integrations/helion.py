"""jitkey under Helion: a ``helion.Kernel`` call through :mod:`jitkey.dsl`.

:func:`install` routes ``helion.Kernel.__call__`` through one :class:`jitkey.dsl.Site` per kernel:

* **Key**: every argument exactly (:func:`jitkey.dsl.exact`: tensor dtype, shape, strides, device and alignment;
  scalar values; ``hl.constexpr`` values; tuples), finer than Helion's own bound-kernel key (which keeps
  scalars by type and tensors by dtype, shape, strides and device type).
* **Bind**: Helion's own ``Kernel.bind(args)``; the bound call is the ``BoundKernel``'s compiled host function
  (``_run``), guarded so that ``set_config``, autotuning or ``Kernel.reset()`` make Helion's path run again.
* **Plan**: the host function's work (output allocation and every other torch call, the grid, the argument
  order and its launches through ``default_launcher``, which reach jitkey's native Triton launcher) recorded
  on a miss and replayed natively on a hit. Calls Helion compiles or tunes (its first call for a key) run
  Helion's own ``__call__``.

Kernels it leaves to Helion (counted in :func:`report` under ``declined``): a backend other than Triton,
``static_shapes=False`` (``torch._dynamo.mark_static`` on an argument changes Helion's key there and is not in
jitkey's), a ``key=`` function, distributed kernels and ref mode. Calls it leaves to Helion (counted as
fallbacks): arguments the exact key cannot hold (functions, graph modules), an initialized
``torch.distributed`` (symmetric-memory tensors change Helion's key), active torch modes. Keyword arguments
and defaults are bound natively, as Helion's ``normalize_args`` binds them. Helion's launches become jitkey launches only where ``triton.jit`` is routed
(:func:`jitkey.triton.install`, which :func:`install` turns on).

Supported: Helion 1.4.0 (``SUPPORTED``).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from jitkey import dsl
from jitkey._core import _SiteMethod
from jitkey.integrations import adapter_report, install_once

LIBRARY = "helion"
SUPPORTED = ("1.4.0",)

__all__ = ["LIBRARY", "SUPPORTED", "install", "installed", "report", "uninstall"]

_lock = threading.Lock()
_saved: tuple[Any, Any, Any] | None = None


class _Unset:
    """The class-level ``_jk_call`` of ``helion.Kernel``: the kernel has no site yet (``call`` is None, so
    ``Kernel.__call__`` runs :func:`_call`, which makes it). A kernel's own ``_jk_call`` copies and pickles
    as this (a copy makes its own site)."""

    __slots__ = ()
    call = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unset, ())


_UNSET = _Unset()


def _unset() -> _Unset:
    return _UNSET


class _SiteRef:
    """A kernel's site (``call`` is the per-call entry, or None: the kernel is left to Helion)."""

    __slots__ = ("call", "site")

    def __init__(self, site: dsl.Site | None) -> None:
        self.site = site
        self.call = None if site is None else site.call

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unset, ())

    def __deepcopy__(self, memo: Any) -> _Unset:
        return _UNSET

    def __copy__(self) -> _Unset:
        return _UNSET


def _ineligible(kernel: Any) -> str | None:
    from helion.runtime.ref_mode import is_ref_mode_enabled

    s = kernel.settings
    if getattr(s, "backend", "triton") != "triton":
        return f"backend {s.backend!r} (jitkey launches Triton kernels)"
    if not s.static_shapes:
        return "static_shapes=False (torch._dynamo.mark_static changes Helion's key there)"
    if kernel._key_fn is not None:
        return "a key= function"
    if getattr(s, "distributed", False) or getattr(kernel, "_declares_process_group", False):
        return "a distributed kernel"
    if is_ref_mode_enabled(s):
        return "ref mode"
    return None


def _returns(fn: Any, expr: str) -> bool:
    """Whether ``fn``'s body is (a docstring and) ``return <expr>``, by its source's syntax tree."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    want = ast.parse(f"return {expr}", mode="exec").body
    return len(body) == 1 and ast.dump(body[0]) == ast.dump(want[0])


_dist_check: Any = None


def _dist_initialized(torch: Any) -> Any:
    """``torch.distributed.is_initialized``, or a read of what it returns with no Python frame:
    ``operator.attrgetter("_world._default_pg")`` on c10d's module, where torch's own source shows that
    ``is_initialized()`` is ``GroupMember.WORLD is not None``, ``WORLD`` is ``_world.default_pg`` and that is
    ``_world._default_pg`` (a ``ProcessGroup``, which has no ``__bool__`` or ``__len__``: truthy exactly when set).
    Decided once per process; anything else keeps ``is_initialized`` (a Python call per Helion call)."""
    global _dist_check
    if _dist_check is None:
        import operator

        fn = torch.distributed.is_initialized
        check = fn
        try:
            c10d = torch.distributed.distributed_c10d
            pg = torch._C._distributed_c10d.ProcessGroup
            world = c10d._world
            if (
                fn is c10d.is_initialized
                and _returns(fn, "GroupMember.WORLD is not None")
                and _returns(type(c10d.GroupMember).WORLD.fget, "_world.default_pg")
                and _returns(type(world).default_pg.fget, "self._default_pg")
                and not hasattr(pg, "__bool__")
                and not hasattr(pg, "__len__")
            ):
                read = operator.attrgetter("_world._default_pg")  # c10d's _world as it is at each call
                if (read(c10d) is not None) == fn():
                    check = functools.partial(read, c10d)
        except Exception:  # torch's source is not there or not as expected: its own function
            check = fn
        _dist_check = check
    return _dist_check


def _checks() -> list[tuple[Any, str]]:
    checks = dsl._default_checks()
    import torch

    if torch.distributed.is_available():
        checks.append((_dist_initialized(torch), "torch.distributed is initialized"))
    return checks


def _make(kernel: Any) -> _SiteRef:
    why = _ineligible(kernel)
    if why is not None:
        dsl.decline("helion", why)
        ref = _SiteRef(None)
    else:
        orig_call = _saved[0] if _saved is not None else type(kernel).__call__

        def bind(args: tuple[Any, ...]) -> dsl.Bound | None:
            bk = kernel.bind(args)
            run = bk._run
            if run is None:  # Helion compiles or tunes on this call: its own path runs it
                return None
            return dsl.Bound(run, (bk, "_run"))

        try:
            site = dsl.Site(
                f"helion:{kernel.name}",
                kernel.signature,
                bind,
                fallback=functools.partial(orig_call, kernel),
                checks=_checks(),
                device=False,  # Helion's host code allocates and launches by its tensors' devices
            )
        except Exception as exc:  # e.g. a default jitkey cannot key (a function): Helion's own path, counted
            dsl.decline("helion", exc)
            site = None
        ref = _SiteRef(site)
    kernel._jk_call = ref
    return ref


def _call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``helion.Kernel.__call__`` under :func:`install` where the kernel has no native call: its first call
    (makes the site) and kernels left to Helion. Once the site exists, ``Kernel.__call__`` (a
    ``jitkey._core._SiteMethod``) resolves a kernel's call to its site's native ``call`` with no Python frame."""
    ref = self._jk_call
    if ref is _UNSET:
        ref = _make(self)
    if ref.call is None:
        return _saved[0](self, *args, **kwargs)  # type: ignore[index]
    return ref.call(*args, **kwargs)


def _reset(self: Any) -> None:
    """``helion.Kernel.reset`` under :func:`install`: Helion's caches and the kernel's plans are dropped."""
    _saved[1](self)  # type: ignore[index]
    ref = self.__dict__.get("_jk_call")
    if isinstance(ref, _SiteRef) and ref.site is not None:
        ref.site.clear()


def install() -> None:
    """Route every ``helion.Kernel`` call through jitkey (kernels made before and after), and route
    ``triton.jit`` through jitkey (:func:`jitkey.triton.install`) so Helion's generated kernels launch natively.
    Raises :class:`jitkey.errors.UnsupportedVersionError` for a Helion other than ``SUPPORTED``. Idempotent."""
    install_once("Helion", LIBRARY, SUPPORTED, _lock, installed, _patch)


def _patch() -> None:
    """What :func:`install` changes in Helion (under the adapter's lock, once)."""
    global _saved
    from helion.runtime.kernel import Kernel

    _saved = (Kernel.__call__, Kernel.reset, Kernel.__dict__.get("_jk_call"))
    Kernel._jk_call = _UNSET
    Kernel.__call__ = _SiteMethod("_jk_call", _call)
    Kernel.reset = _reset


def uninstall() -> None:
    """Undo :func:`install` (sites of existing kernels are dropped; ``triton.jit`` routing stays, see
    :func:`jitkey.triton.uninstall`)."""
    global _saved
    from helion.runtime.kernel import Kernel

    with _lock:
        if _saved is None:
            return
        Kernel.__call__, Kernel.reset = _saved[0], _saved[1]
        del Kernel._jk_call
        _saved = None


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _saved is not None


def report() -> dict[str, Any]:
    """The DSL report (:func:`jitkey.dsl.report`) of Helion's sites (``declined``: kernels left to Helion)."""
    return adapter_report("helion")
