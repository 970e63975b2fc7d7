"""Key encoding under hostile or unusual types (issue 13, classes 7 and 8): the native encoder and
`jitkey._reference` agree on every `__jitkey__` type name (classes of the main script, nested
classes, modules), and only the real `torch.dtype` / `torch.device` type objects are keyed as such."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import jitkey
from jitkey import _reference
from jitkey.errors import UnsupportedKeyError


def test_main_script_classes_and_module_classes_do_not_collide(tmp_path: Path) -> None:
    """`class x: class Thing` in the main script vs. `x.Thing` in a module named `x`: different
    types, different keys; native == reference for both, and for builtins, nested and odd modules."""
    (tmp_path / "x.py").write_text("class Thing:\n    def __jitkey__(self):\n        return 1\n")
    script = textwrap.dedent(
        """
        import sys
        import jitkey
        from jitkey import _reference
        import x

        class x:  # shadows the module name inside __main__
            class Thing:
                def __jitkey__(self):
                    return 1

        class Top:
            def __jitkey__(self):
                return ("top", 2)

        class Odd:
            def __jitkey__(self):
                return 3
        Odd.__module__ = "builtins"

        class NonStr:
            def __jitkey__(self):
                return 4
        NonStr.__module__ = 42

        mod_thing = sys.modules["x"].Thing()
        main_thing = x.Thing()
        assert jitkey.encode(mod_thing) != jitkey.encode(main_thing), "collision"
        for v in (mod_thing, main_thing, Top(), Odd(), (main_thing, (Top(),))):
            assert jitkey.encode(v) == _reference.encode(v), (type(v), jitkey.encode(v), _reference.encode(v))
            assert jitkey.digest(v) == _reference.digest(v)
        # format v2: module and qualname are two u16-length-prefixed fields
        assert b"\\x08\\x00__main__\\x07\\x00x.Thing" in jitkey.encode(main_thing)
        assert b"\\x08\\x00__main__\\x03\\x00Top" in jitkey.encode(Top())
        assert b"\\x08\\x00builtins\\x03\\x00Odd" in jitkey.encode(Odd())
        # a non-str __module__ would have to be keyed through its str(): refused by both
        for encode in (jitkey.encode, _reference.encode):
            try:
                encode(NonStr())
            except jitkey.errors.UnsupportedKeyError as e:
                assert "__module__" in str(e), e
            else:
                raise AssertionError("NonStr was keyed")
        print("OK")
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stderr[-3000:]


class Outer:
    class Inner:
        def __jitkey__(self) -> int:
            return 5


class Plain:
    def __jitkey__(self) -> tuple[str, int]:
        return ("p", 1)


@pytest.mark.parametrize("value", [Outer.Inner(), Plain(), (Plain(), Outer.Inner())], ids=repr)
def test_module_and_nested_class_names_match_reference(value: object) -> None:
    assert jitkey.encode(value) == _reference.encode(value)


def _fake_type(name: str, **extra: object) -> type:
    ns: dict[str, object] = {"__module__": "torch", "__qualname__": name, **extra}
    return type(name, (), ns)


@pytest.mark.parametrize("name", ["dtype", "device"])
def test_impersonated_torch_types_are_not_torch(name: str) -> None:
    torch = pytest.importorskip("torch")
    real = torch.float32 if name == "dtype" else torch.device("cpu")
    Fake = _fake_type(
        name,
        __str__=lambda self: "torch.float32",
        type=property(lambda self: "cpu"),
        index=property(lambda self: None),
    )
    assert Fake.__module__ == "torch" and Fake.__name__ == name
    with pytest.raises(UnsupportedKeyError):
        jitkey.encode(Fake())
    with pytest.raises(UnsupportedKeyError):
        _reference.encode(Fake())
    # With __jitkey__ it is an ordinary object: never the real type's key.
    Keyed = _fake_type(name, __str__=lambda self: "torch.float32", __jitkey__=lambda self: 1)
    assert jitkey.encode(Keyed()) != jitkey.encode(real)
    assert jitkey.encode(Keyed()) == _reference.encode(Keyed())
    assert jitkey.encode(real) == _reference.encode(real)


def test_fake_dtypes_do_not_fill_the_signature_dtype_table() -> None:
    """Before the fix, 128 impersonating dtypes passing through a Signature filled its table and
    real dtypes were refused for the rest of the process (so: run in a fresh process)."""
    script = textwrap.dedent(
        """
        import warnings
        import torch
        from jitkey import Signature, rules

        sig = Signature([("x", rules.tensor(align=None, device=False))])

        class T(torch.Tensor):
            pass

        refused = 0
        for i in range(300):
            F = type("dtype", (), {"__module__": "torch", "__str__": lambda self, i=i: f"torch.fake{i}"})
            fake = F()
            T.dtype = property(lambda self, fake=fake: fake)
            try:
                sig.encode((torch.zeros(2).as_subclass(T),))
            except TypeError as e:
                assert "not a torch.dtype" in str(e), e
                refused += 1
        assert refused == 300, refused
        del T.dtype
        keys = set()
        for name in dir(torch):
            dt = getattr(torch, name)
            if isinstance(dt, torch.dtype):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        t = torch.empty(1, dtype=dt)
                except (RuntimeError, TypeError):
                    continue
                keys.add((dt, sig.encode((t,))))
        assert len({k for _, k in keys}) == len({d for d, _ in keys})
        print("OK")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "OK", r.stderr[-3000:]


# ---- format v2: a type is (module, qualname), never one dotted string (issue 24) ---------------------

# Pairs of types that v1 keyed alike: one dotted name split two ways, and names PyO3's
# fully_qualified_name() shortened (it drops __main__ and builtins).
SPLIT_NAMES = [
    (("pkg.sub", "K"), ("pkg", "sub.K")),
    (("a.b.c", "D"), ("a", "b.c.D")),
    (("__main__", "x.P"), ("x", "P")),
    (("__main__", "P"), ("builtins", "P")),
]


def _jitkey_class(module: str, qualname: str) -> type:
    cls = type(
        qualname.rpartition(".")[2], (), {"__jitkey__": lambda self: ("same", 1), "__module__": module}
    )
    cls.__qualname__ = qualname
    return cls


def _namedtuple_class(module: str, qualname: str) -> type:
    from collections import namedtuple

    cls = namedtuple(qualname.rpartition(".")[2], "x y")
    cls.__module__, cls.__qualname__ = module, qualname
    return cls


@pytest.mark.parametrize(("one", "two"), SPLIT_NAMES, ids=lambda t: ":".join(t))
def test_types_named_alike_never_share_a_key(
    one: tuple[str, str], two: tuple[str, str], tmp_path: Path
) -> None:
    a, b = _jitkey_class(*one)(), _jitkey_class(*two)()
    assert jitkey.encode(a) != jitkey.encode(b) and jitkey.digest(a) != jitkey.digest(b)
    assert jitkey.encode(a) == _reference.encode(a) and jitkey.encode(b) == _reference.encode(b)
    cache = jitkey.LruCache(16)
    cache[a] = "value of A"
    assert b not in cache and cache.get(b) is None
    with jitkey.DiskIndex(tmp_path / "ix") as ix:
        ix.put(a, b"value of A")
        assert ix.get(b) is None and ix.get(a) == b"value of A"


@pytest.mark.parametrize(("one", "two"), SPLIT_NAMES, ids=lambda t: ":".join(t))
def test_signature_names_named_tuples_as_encode_names_types(
    one: tuple[str, str], two: tuple[str, str]
) -> None:
    from jitkey import MISS, Signature, rules

    sig = Signature([("p", rules.by_type(int_=rules.int_("value"), tuples=True))])
    a, b = _namedtuple_class(*one)(1, 2), _namedtuple_class(*two)(1, 2)
    assert sig.digest((a,)) != sig.digest((b,))
    cache = jitkey.LruCache(16)
    assert sig.get_or_insert(cache, (a,), lambda: "A") == "A"
    assert sig.lookup(cache, (b,)) is MISS
    # the type component is exactly (type.__module__, type.__qualname__), as jitkey.encode writes it
    _extra, (kind, type_part, *_items) = sig.flatten((a,))
    assert kind == "namedtuple" and type_part == (one, ("x", "y"))
