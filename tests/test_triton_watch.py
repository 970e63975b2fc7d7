"""The watched state of a warm launch (jitkey/triton/_watch.py, rust/py/src/launch/state.rs): what a hit reads from
Triton's Python objects is kept between launches, and every change Triton would see between two launches is seen
by the second one, as with the state read on every call (``JITKEY_WATCH=0``).

Each scenario flips one watched value between two launches through one write path and checks what the second
launch did (a miss that Triton answers, a fallback, the hooks it was passed, an error); then it flips it back.
Every scenario runs with the state watched and with it read per call, on fresh kernels, and both must observe the
same; the watched run must also have reused its kept state (so it is the watch that is tested, not a re-read).
No GPU: Triton's path is the recording stand-in of tests/test_triton_cpu.py.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import inspect
import os
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402

import jitkey.triton as jt  # noqa: E402
import test_triton_cpu as cpu  # noqa: E402
from jitkey import _core  # noqa: E402
from jitkey.errors import GlobalsChangedError  # noqa: E402
from jitkey.triton import _watch  # noqa: E402

OFFSET = 3  # read by k_glob
fake_runtime = (
    cpu.fake_runtime
)  # the fixtures of tests/test_triton_cpu.py (Triton's path: a recording stand-in
fake_triton = cpu.fake_triton  # keying its kernels as Triton does, with the knob values Triton folds in)


def _k(a, n, m, BLOCK: tl.constexpr):
    pass


def _k_glob(a, n, m, BLOCK: tl.constexpr):
    tl.store(a + n, OFFSET)


ENV_KNOB = ("always_compile", "compilation", "always_compile")  # an env_bool knob (TRITON_ALWAYS_COMPILE)
ENV_KEY = "TRITON_ALWAYS_COMPILE"


@pytest.fixture(autouse=True)
def _knobs_as_imported() -> Iterator[None]:
    """Each test starts from the knob objects' class defaults (other tests leave values set) and gets its
    objects' state back afterwards; written around the watched paths, before any launch of the test."""
    saved = {name: dict(k.__dict__) for name, k in vars(knobs).items() if isinstance(k, knobs.base_knobs)}
    for name in saved:
        getattr(knobs, name).__dict__.clear()
    yield
    for name, d in saved.items():
        k = getattr(knobs, name)
        k.__dict__.clear()
        k.__dict__.update(d)
    _core._watch_bump()


def _observe(kernel: Any, state: dict[str, Any], x: Any, grid: Any = (1,)) -> tuple[Any, ...]:
    """One launch and what it did: Triton's call count, which of Triton's kernels launched (by Triton's key),
    the hook slots of that launch (metadata passed?, enter, exit), the fallbacks so far; or the error."""
    try:
        ck = kernel[grid](x, 16, 3, 64)
    except Exception as exc:  # what the launch raised is the observation
        return ("raised", type(exc).__name__, len(state["calls"]))
    launch = ck.launches[-1] if ck.launches else None
    hooks = None if launch is None else (launch[6] is not None, _hook_name(launch[7]), _hook_name(launch[8]))
    return (len(state["calls"]), ck.tag, hooks, kernel.cache_stats()["fallbacks"])


def _hook_name(h: Any) -> str | None:
    return None if h is None else type(h).__name__


# -- the scenarios: (name, apply) where apply(kernel) returns the undo ---------------------------------------


def _set(obj: Any, attr: str, value: Any) -> Callable[[], None]:
    """``setattr(obj, attr, value)``; the undo puts back the object's attribute and, for an env knob (whose setter
    also sets its variable), the environment."""
    old = obj.__dict__.get(attr, _MISSING)
    desc = inspect.getattr_static(type(obj), attr, None)
    env_key = desc.key if isinstance(desc, knobs.env_base) else None
    old_env = None if env_key is None else os.environ.get(env_key)

    def undo() -> None:
        if old is _MISSING:
            delattr(obj, attr)
        else:
            setattr(obj, attr, old)
        if env_key is not None:
            if old_env is None:
                os.environ.pop(env_key, None)
            else:
                os.environ[env_key] = old_env

    setattr(obj, attr, value)
    return undo


_MISSING = object()


def _flipped(v: Any) -> Any:
    return (not v) if isinstance(v, bool) or v is None else f"{v}x"


def _knob_setattr(section: str, attr: str) -> Callable[[Any], Callable[[], None]]:
    def apply(kernel: Any) -> Callable[[], None]:
        s = getattr(knobs, section)
        return _set(s, attr, _flipped(getattr(s, attr)))

    return apply


def _debug_then_delattr(kernel: Any) -> Callable[[], None]:
    assert "debug" not in knobs.runtime.__dict__
    knobs.runtime.debug = not knobs.runtime.debug
    return lambda: delattr(knobs.runtime, "debug")


def _debug_reset(kernel: Any) -> Callable[[], None]:
    saved = dict(knobs.compilation.__dict__)
    knobs.compilation.instrumentation_mode = "consan"

    def undo() -> None:
        knobs.compilation.reset()  # delattr of every descriptor knob (instrumentation_mode is a plain one)
        del knobs.compilation.instrumentation_mode
        for k, v in saved.items():
            setattr(knobs.compilation, k, v)

    return undo


def _in_scope(section: str, attr: str) -> Callable[[Any], Callable[[], None]]:
    def apply(kernel: Any) -> Callable[[], None]:
        stack = contextlib.ExitStack()
        s = getattr(knobs, section)
        stack.enter_context(s.scope())
        setattr(s, attr, _flipped(getattr(s, attr)))
        return stack.close

    return apply


def _section_replaced(kernel: Any) -> Callable[[], None]:
    old = knobs.compilation
    new = type(old).__new__(type(old))  # made without an attribute write: only the module assignment is seen
    new.__dict__.update(old.__dict__, instrumentation_mode="consan")
    knobs.compilation = new

    def undo() -> None:
        knobs.compilation = old

    return undo


def _fresh_knobs(kernel: Any) -> Callable[[], None]:
    """What Triton's own ``fresh_knobs`` fixture does (``triton._internal_testing._fresh_knobs_impl``, which
    needs a GPU driver to import): every knob object replaced by a reset copy, then restored."""
    saved = {n: k for n, k in vars(knobs).items() if isinstance(k, knobs.base_knobs)}
    for name, k in saved.items():
        setattr(knobs, name, k.copy().reset())
    knobs.runtime.debug = not saved["runtime"].debug

    def undo() -> None:
        for name, k in saved.items():
            setattr(knobs, name, k)

    return undo


def _kernel_debug(kernel: Any) -> Callable[[], None]:
    return _set(kernel, "debug", not kernel.debug)


def _hook() -> Callable[..., None]:
    return lambda *a, **k: None


def _pre_run_append(kernel: Any) -> Callable[[], None]:
    kernel.pre_run_hooks.append(_hook())
    return kernel.pre_run_hooks.clear


def _pre_run_add(kernel: Any) -> Callable[[], None]:
    kernel.add_pre_run_hook(_hook())
    return kernel.pre_run_hooks.clear


def _pre_run_rebound(kernel: Any) -> Callable[[], None]:
    return _set(kernel, "pre_run_hooks", [_hook()])


def _device_caches_cleared(kernel: Any) -> Callable[[], None]:
    kernel.device_caches.clear()
    return lambda: None


def _device_caches_rebound(kernel: Any) -> Callable[[], None]:
    kernel.device_caches = collections.defaultdict(kernel.create_binder)
    return lambda: None


def _chain_add(which: str) -> Callable[[Any], Callable[[], None]]:
    def apply(kernel: Any) -> Callable[[], None]:
        chain, h = getattr(knobs.runtime, which), _hook()
        chain.add(h)
        return lambda: chain.remove(h)

    return apply


def _chain_calls_append(kernel: Any) -> Callable[[], None]:
    chain = knobs.runtime.launch_exit_hook
    chain.calls.append(_hook())
    return chain.calls.clear


def _chain_calls_rebound(kernel: Any) -> Callable[[], None]:
    chain = knobs.runtime.launch_enter_hook
    return _set(chain, "calls", [_hook()])


def _chain_replaced(kernel: Any) -> Callable[[], None]:
    chain = knobs.HookChain()
    chain.add(_hook())
    return _set(knobs.runtime, "launch_enter_hook", chain)


def _hook_function(kernel: Any) -> Callable[[], None]:
    return _set(knobs.runtime, "launch_exit_hook", _hook())


def _globals_changed(kernel: Any) -> Callable[[], None]:
    global OFFSET
    old, OFFSET = OFFSET, OFFSET + 1

    def undo() -> None:
        global OFFSET
        OFFSET = old

    return undo


def _stages_hook(kernel: Any) -> Callable[[], None]:
    if not jt.triton_info().checks_stages_hook:
        pytest.skip("this Triton has no add_stages_inspection_hook")
    return _set(knobs.runtime, "add_stages_inspection_hook", lambda: ("key", "hash"))


SCENARIOS: dict[str, Callable[[Any], Callable[[], None]]] = {
    "knobs.runtime.debug = ...": _knob_setattr("runtime", "debug"),
    "del knobs.runtime.debug": _debug_then_delattr,
    "knobs.compilation.reset()": _debug_reset,
    "knobs.runtime.scope()": _in_scope("runtime", "debug"),
    "knobs.compilation.scope()": _in_scope("compilation", "instrumentation_mode"),
    "knobs.compilation replaced": _section_replaced,
    "triton's fresh_knobs": _fresh_knobs,
    "kernel.debug = ...": _kernel_debug,
    "kernel.pre_run_hooks.append": _pre_run_append,
    "kernel.add_pre_run_hook": _pre_run_add,
    "kernel.pre_run_hooks = [...]": _pre_run_rebound,
    "kernel.device_caches.clear()": _device_caches_cleared,
    "kernel.device_caches = ...": _device_caches_rebound,
    "launch_enter_hook.add": _chain_add("launch_enter_hook"),
    "launch_exit_hook.add": _chain_add("launch_exit_hook"),
    "launch_exit_hook.calls.append": _chain_calls_append,
    "launch_enter_hook.calls = [...]": _chain_calls_rebound,
    "knobs.runtime.launch_enter_hook = HookChain": _chain_replaced,
    "knobs.runtime.launch_exit_hook = function": _hook_function,
    "add_stages_inspection_hook": _stages_hook,
}
for _name, _section, _attr in [*jt.triton_info().knob_reads]:  # every knob Triton folds in (3.9: fpsan too)
    SCENARIOS[f"knobs.{_section}.{_attr} = ..."] = _knob_setattr(_section, _attr)


def _run(scenario: Callable[[Any], Callable[[], None]], fake_triton: Any, glob: bool = False) -> list[Any]:
    kernel = jt.jit(_k_glob if glob else _k)
    state = fake_triton(kernel)
    state["calls"].clear()  # the fixture's record is shared by the test's runs
    state["cks"].clear()
    if glob:
        kernel.cache_key  # noqa: B018 - computes used_global_vals as a compile would
    x = torch.empty(64)
    seen = [_observe(kernel, state, x), _observe(kernel, state, x)]  # a miss, then a hit
    undo = scenario(kernel)
    try:
        seen += [_observe(kernel, state, x), _observe(kernel, state, x)]  # the change is seen, and kept
    finally:
        undo()
    seen += [_observe(kernel, state, x), _observe(kernel, state, x)]  # and its undoing too
    ws = kernel.cache_stats()["watched_state"]
    seen.append(("watched", ws["unwatched"] is None and ws["watched"] > 0))
    return seen


@pytest.fixture
def watch_off(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("JITKEY_WATCH", "0")
    yield


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_change_between_two_launches_is_seen_as_when_read_per_call(
    name: str, fake_triton: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    watched = _run(SCENARIOS[name], fake_triton)
    monkeypatch.setenv("JITKEY_WATCH", "0")
    per_call = _run(SCENARIOS[name], fake_triton)
    assert watched[:-1] == per_call[:-1], name
    assert watched[-1] == ("watched", True) and per_call[-1] == ("watched", False)
    # The change itself was seen (not only the same in both modes): the launch after it did something else
    # than the hit before it, and the launch after the undo is a hit again.
    assert watched[2] != watched[1], (name, watched)
    assert watched[5][0] == watched[4][0], (name, watched)  # no Triton call after the undo's first launch


def test_expected_outcomes(fake_triton: Any) -> None:
    """What Triton would do, for a few scenarios (the test above compares the two modes)."""
    miss = _run(SCENARIOS["knobs.runtime.debug = ..."], fake_triton)
    assert [s[0] for s in miss[:6]] == [1, 1, 2, 2, 2, 2]  # a miss after the flip, a hit after the undo
    assert miss[2][1] != miss[1][1] and miss[4][1] == miss[1][1]  # another kernel of Triton's, then the first
    pre = _run(SCENARIOS["kernel.pre_run_hooks.append"], fake_triton)
    assert pre[2][0] == 2 and pre[3][0] == 3 and pre[3][3] == 2  # Triton's own path, counted, twice
    hooks = _run(SCENARIOS["launch_enter_hook.calls = [...]"], fake_triton)
    assert hooks[1][2] == (False, None, None) and hooks[2][2] == (True, "HookChain", "HookChain")
    assert hooks[4][2] == (False, None, None)
    fn_hook = _run(SCENARIOS["knobs.runtime.launch_exit_hook = function"], fake_triton)
    assert fn_hook[2][2] == (True, "HookChain", "function")


# -- a DSL plan's compiled launch (FlagGems' LibEntry launches): the launch hooks ------------------------------


def _runtime_replaced(kernel: Any) -> Callable[[], None]:
    """``triton.knobs.runtime`` assigned a copy that has a hook (only the module assignment is seen)."""
    old = knobs.runtime
    new = type(old).__new__(type(old))
    chain = knobs.HookChain()
    chain.add(_hook())
    new.__dict__.update(old.__dict__, launch_enter_hook=chain)
    knobs.runtime = new

    def undo() -> None:
        knobs.runtime = old

    return undo


HOOK_SCENARIOS = {
    name: SCENARIOS[name]
    for name in (
        "launch_enter_hook.add",
        "launch_exit_hook.add",
        "launch_exit_hook.calls.append",
        "launch_enter_hook.calls = [...]",
        "knobs.runtime.launch_enter_hook = HookChain",
        "knobs.runtime.launch_exit_hook = function",
        "triton's fresh_knobs",
    )
} | {"knobs.runtime replaced": _runtime_replaced}


def _compiled_launch(watched: bool) -> tuple[Any, Any]:
    from jitkey._core import _CompiledLaunch, _TritonEntry

    ck = cpu.FakeCK("compiled")
    entry = _TritonEntry(ck, ck.run, ck.function, ck.packed_metadata, None, None, None)
    watch = _watch.hook_watch(knobs.runtime) if watched else None
    assert (watch is type(knobs.runtime)) is watched
    return _CompiledLaunch(entry, cpu.FakeRuntime(), knobs, knobs.HookChain, watch, 0, []), ck


def _run_compiled(scenario: Callable[[Any], Callable[[], None]], watched: bool) -> list[Any]:
    cl, ck = _compiled_launch(watched)
    x = torch.empty(64)

    def observe() -> Any:
        assert cl((1, 1, 1), x, 16) is ck
        launch = ck.launches[-1]
        return (launch[6] is not None, _hook_name(launch[7]), _hook_name(launch[8]))

    seen = [observe(), observe()]
    undo = scenario(None)
    try:
        seen += [observe(), observe()]
    finally:
        undo()
    return [*seen, observe(), observe()]


@pytest.mark.parametrize("name", list(HOOK_SCENARIOS))
def test_a_compiled_launch_sees_a_hook_change_as_when_read_per_launch(name: str) -> None:
    """``_CompiledLaunch`` keeps the hooks it read under the watch; every change Triton's runner would see
    between two launches is seen by the second, as when they are read per launch."""
    watched = _run_compiled(HOOK_SCENARIOS[name], watched=True)
    assert watched == _run_compiled(HOOK_SCENARIOS[name], watched=False), name
    if name != "triton's fresh_knobs":  # (it changes no hook)
        assert watched[2] != watched[1] and watched[3] == watched[2], (name, watched)
    assert watched[0] == watched[1] == watched[4] == watched[5] == (False, None, None), (name, watched)


def test_a_compiled_launch_keeps_its_hook_reads_while_the_watch_version_holds() -> None:
    """What the watch does not see (a write to the knob object's ``__dict__``, documented) shows that the kept
    read is used; a bump, or a launch with the reads per launch, sees it."""
    kept, ck = _compiled_launch(watched=True)
    per_launch, ck2 = _compiled_launch(watched=False)
    x = torch.empty(64)
    kept((1, 1, 1), x, 16)
    knobs.runtime.__dict__["launch_exit_hook"] = _hook()
    try:
        kept((1, 1, 1), x, 16)
        per_launch((1, 1, 1), x, 16)
        assert ck.launches[-1][8] is None and _hook_name(ck2.launches[-1][8]) == "function"
        _core._watch_bump()
        kept((1, 1, 1), x, 16)
        assert _hook_name(ck.launches[-1][8]) == "function"
    finally:
        del knobs.runtime.__dict__["launch_exit_hook"]
        _core._watch_bump()


def test_a_kernels_globals_change_is_detected(fake_triton: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    watched = _run(_globals_changed, fake_triton, glob=True)
    assert watched[2] == ("raised", GlobalsChangedError.__name__, 1)
    assert watched[4][0] == 1 and watched[-1] == ("watched", True)
    monkeypatch.setenv("JITKEY_WATCH", "0")
    assert _run(_globals_changed, fake_triton, glob=True)[:-1] == watched[:-1]


# -- an env knob: the C environment is compared --------------------------------------------------------------


def _libc() -> Any:
    return ctypes.CDLL(None)


@pytest.fixture
def env_knob(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Launches fold one more knob into the key: TRITON_ALWAYS_COMPILE, an env_bool (Triton 3.9 reads one such
    knob per call, fpsan_homomorphic_casts; this makes every Triton version exercise the env path)."""
    info = jt.triton_info()
    monkeypatch.setattr(info, "knob_reads", [*info.knob_reads, ENV_KNOB])
    monkeypatch.delenv(ENV_KEY, raising=False)
    knobs.compilation.__dict__.pop("always_compile", None)
    assert _watch.install() is None
    assert _watch.kinds(info.knob_reads)[(type(knobs.compilation), "always_compile")] == "env"
    yield
    os.environ.pop(ENV_KEY, None)


def _env_os_environ(kernel: Any) -> Callable[[], None]:
    os.environ[ENV_KEY] = "1"
    return lambda: os.environ.pop(ENV_KEY)


def _env_putenv(kernel: Any) -> Callable[[], None]:
    os.putenv(ENV_KEY, "1")  # not through os.environ: only the C environment changes (what getenv reads)
    return lambda: os.unsetenv(ENV_KEY)


def _env_c_setenv(kernel: Any) -> Callable[[], None]:
    libc = _libc()
    assert libc.setenv(ENV_KEY.encode(), b"1", 1) == 0  # C code, as an extension module would
    return lambda: libc.unsetenv(ENV_KEY.encode())


def _env_knob_setter(kernel: Any) -> Callable[[], None]:
    knobs.compilation.always_compile = True  # the descriptor's setter (sets the object and the environment)

    def undo() -> None:
        delattr(knobs.compilation, "always_compile")
        os.environ.pop(ENV_KEY)

    return undo


@pytest.mark.parametrize(
    "apply", [_env_os_environ, _env_putenv, _env_c_setenv, _env_knob_setter], ids=lambda f: f.__name__
)
def test_an_env_knob_change_is_seen(
    apply: Callable[[Any], Callable[[], None]],
    env_knob: None,
    fake_triton: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if _core._environ_fingerprint() is None:
        pytest.skip("the C environment is compared under glibc only (elsewhere an env knob is read per call)")
    watched = _run(apply, fake_triton)
    assert [s[0] for s in watched[:6]] == [1, 1, 2, 2, 2, 2] and watched[-1] == ("watched", True)
    monkeypatch.setenv("JITKEY_WATCH", "0")
    assert _run(apply, fake_triton)[:-1] == watched[:-1]


def test_the_environment_fingerprint_follows_every_write_path() -> None:
    fp = _core._environ_fingerprint
    if fp() is None:
        pytest.skip("glibc only")
    key = "JITKEY_TEST_WATCH_ENV"
    for set_, unset in (
        (lambda: os.environ.__setitem__(key, "a"), lambda: os.environ.pop(key)),
        (lambda: os.putenv(key, "a"), lambda: os.unsetenv(key)),
        (lambda: _libc().setenv(key.encode(), b"a", 1), lambda: _libc().unsetenv(key.encode())),
    ):
        before = fp()
        set_()
        during = fp()
        assert during != before
        os.environ[key] = "b"  # a new value for an existing variable: its pointer is replaced
        assert fp() != during
        unset()
        os.environ.pop(key, None)
        assert fp() != during


# -- what cannot be watched is read per call, with the reason -------------------------------------------------


class _MyRuntime(knobs.runtime_knobs):  # a subclass of Triton's knob class, defined outside triton.knobs
    pass


def _run_unwatched(
    fake_triton: Any, setup: Callable[[Any], None], flip: Callable[[Any], None]
) -> dict[str, Any]:
    """A kernel launched under ``setup``; ``flip`` writes around the watched paths: it is seen anyway, because the
    state is read per call."""
    kernel = jt.jit(_k)
    state = fake_triton(kernel)
    state["calls"].clear()
    x = torch.empty(64)
    setup(kernel)
    kernel[(1,)](x, 16, 3, 64)
    kernel[(1,)](x, 16, 3, 64)
    assert len(state["calls"]) == 1
    flip(kernel)
    kernel[(1,)](x, 16, 3, 64)
    assert len(state["calls"]) == 2, "a write around the watched paths was not seen"
    ws = kernel.cache_stats()["watched_state"]
    assert ws["watched"] == 0 and ws["reads"] == 3, ws
    return ws


def test_a_subclassed_knob_is_read_per_call(fake_triton: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = _MyRuntime()
    monkeypatch.setattr(knobs, "runtime", mine)
    ws = _run_unwatched(fake_triton, lambda k: None, lambda k: mine.__dict__.__setitem__("debug", True))
    assert "knobs.runtime.debug" in ws["unwatched"]


def test_a_stand_in_knob_section_is_read_per_call(fake_triton: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {attr: getattr(knobs.compilation, attr) for _, s, attr in jt.triton_info().knob_reads}
    stand_in = types.SimpleNamespace(**fields)
    monkeypatch.setattr(knobs, "compilation", stand_in)
    ws = _run_unwatched(
        fake_triton, lambda k: None, lambda k: stand_in.__dict__.__setitem__("instrumentation_mode", "consan")
    )
    assert "knobs.compilation.instrumentation_mode" in ws["unwatched"]


def test_a_kernel_class_with_its_own_setattr_is_read_per_call(fake_triton: Any) -> None:
    class Mine(jt.TritonKernel):
        def __setattr__(self, name: str, value: Any) -> None:
            object.__setattr__(self, name, value)  # no bump

    kernel = Mine(_k)
    state = fake_triton(kernel)
    x = torch.empty(64)
    kernel[(1,)](x, 16, 3, 64)
    kernel.debug = not kernel.debug
    kernel[(1,)](x, 16, 3, 64)
    assert len(state["calls"]) == 2
    ws = kernel.cache_stats()["watched_state"]
    assert "replaces TritonKernel's __setattr__" in ws["unwatched"] and ws["watched"] == 0


def test_a_kernel_class_with_a_data_descriptor_for_a_read_is_read_per_call(fake_triton: Any) -> None:
    """A read attribute that a class (or a base of it) turns into a data descriptor is not an instance attribute
    the kernel's __setattr__ sees: such kernels read per call. A plain class attribute is not a descriptor."""

    class Base(jt.TritonKernel):
        @property
        def pre_run_hooks(self) -> list[Any]:
            return self.__dict__.setdefault("_hooks", [])

        @pre_run_hooks.setter
        def pre_run_hooks(self, v: list[Any]) -> None:
            self.__dict__["_hooks"] = v

    class Mine(Base):  # the descriptor is on a base class
        pass

    class Plain(jt.TritonKernel):
        used_global_vals: dict[Any, Any] = {}  # a plain class attribute, not a descriptor

    assert _watch.kernel_problem(Mine) == f"{__name__}.{Mine.__qualname__}.pre_run_hooks is a data descriptor"
    assert _watch.kernel_problem(Plain) is None
    assert _watch.kernel_problem(jt.TritonKernel) is None
    kernel = Mine(_k)
    fake_triton(kernel)
    x = torch.empty(64)
    kernel[(1,)](x, 16, 3, 64)
    kernel[(1,)](x, 16, 3, 64)
    ws = kernel.cache_stats()["watched_state"]
    assert "pre_run_hooks is a data descriptor" in ws["unwatched"] and ws["watched"] == 0


def test_watching_off(fake_triton: Any, watch_off: None) -> None:
    ws = _run_unwatched(
        fake_triton, lambda k: None, lambda k: knobs.runtime.__dict__.__setitem__("debug", True)
    )
    knobs.runtime.__dict__.pop("debug")
    assert ws["unwatched"] == "JITKEY_WATCH=0"
    assert jt.fast_paths()["watched_state"] == {"on": False, "why": "JITKEY_WATCH=0", "chosen": True}


def test_fast_paths_names_the_mode() -> None:
    assert jt.fast_paths()["watched_state"] == {"on": True, "why": None, "chosen": False}


def test_the_watch_is_installed_on_tritons_classes() -> None:
    jt.jit(_k).key_of((torch.empty(4), 16, 3, 64), device=0)  # any launcher installs the watch
    assert _watch.install() is None
    for cls in (knobs.base_knobs, knobs.HookChain):
        assert getattr(cls.__setattr__, "_jitkey_watch", False) and getattr(
            cls.__delattr__, "_jitkey_watch", False
        )
    v = _core._watch_version()
    knobs.runtime.launch_enter_hook.reversed = False  # a HookChain attribute write bumps
    assert _core._watch_version() > v


def test_knob_and_kernel_writes_behave_as_before() -> None:
    """The watched __setattr__/__delattr__ still write and raise exactly as object's do."""
    kernel = jt.jit(_k)
    kernel.anything = 5
    assert kernel.__dict__["anything"] == 5
    del kernel.anything
    with pytest.raises(AttributeError):
        del kernel.anything
    with knobs.runtime.scope():
        knobs.runtime.debug = True
        assert knobs.runtime.debug is True
    assert "debug" not in knobs.runtime.__dict__
    with pytest.raises(AttributeError):
        del knobs.runtime.not_a_knob
    knobs.compilation.always_compile = True
    assert os.environ.get(ENV_KEY) == "1"  # the env descriptor's setter still propagates to the environment
    del knobs.compilation.always_compile
    os.environ.pop(ENV_KEY, None)


def test_a_triton_whose_knobs_cannot_be_watched_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown Triton (no HookChain, knob classes with their own __setattr__, no scope()) is reported, and
    nothing is patched on it (it would then be read per call)."""
    monkeypatch.delattr(knobs, "HookChain")
    assert _watch._triton_problem() == "triton.knobs has no base_knobs or HookChain class"
    monkeypatch.undo()

    class OwnSetattr:
        def __setattr__(self, name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

    assert "defines its own __setattr__" in str(_watch._patchable(OwnSetattr))
    assert _watch._patchable(type("Plain", (), {})) is None
    monkeypatch.delattr(knobs.base_knobs, "scope")  # put back when the test ends
    assert _watch._triton_problem() == "triton.knobs.base_knobs has no scope()"


def test_an_unknown_knob_attribute_kind_is_not_watched() -> None:
    """Only plain values and Triton's own env descriptors are covered: a property or another descriptor is not."""

    class WithProperty(knobs.runtime_knobs):
        @property
        def debug(self) -> bool:  # type: ignore[override]
            return False

    env_types = _watch._env_types()
    assert _watch._kind(knobs.runtime_knobs, "debug", env_types) == "plain"
    assert _watch._kind(knobs.runtime_knobs, "launch_enter_hook", env_types) == "plain"
    assert _watch._kind(knobs.compilation_knobs, "always_compile", env_types) == "env"
    assert _watch._kind(WithProperty, "debug", env_types) is None
    assert _watch._kind(knobs.cache_knobs, "dir", env_types) is None  # env_str_callable_default: runs code


def test_construction_writes_unwatched_then_every_write_watched() -> None:
    """``JITFunction.__init__``'s attribute writes go through the plain ``object.__setattr__`` (no kernel can have
    kept state yet); the kernel is a ``TritonKernel`` when construction ends, one bump stands for them, and every
    later write bumps. ``object.__setattr__(kernel, ...)`` works on it as on a ``JITFunction``."""
    v = _core._watch_version()
    k = jt.TritonKernel(_k)
    assert type(k) is jt.TritonKernel and isinstance(k, triton.runtime.JITFunction)
    assert _core._watch_version() > v and k.arg_names == ["a", "n", "m", "BLOCK"]
    v = _core._watch_version()
    k.debug = True
    assert _core._watch_version() > v
    object.__setattr__(k, "noinline", True)  # no bump (Triton's own writes never do this), but no error
    assert k.noinline is True
    half = jt.TritonKernel.__new__(jt.TritonKernel)
    with pytest.raises(TypeError):  # a construction that fails leaves the object a TritonKernel
        half.__init__(42)
    assert type(half) is jt.TritonKernel

    class Mine(jt.TritonKernel):
        writes: list[str] = []

        def __setattr__(self, name: str, value: Any) -> None:
            Mine.writes.append(name)
            super().__setattr__(name, value)

    m = Mine(_k)
    assert type(m) is Mine and "params" in Mine.writes  # a subclass sees its construction's writes
