"""Direct TensorImpl reads: equal to the attribute path, and off for every tensor they do not cover."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from jitkey import Signature, _core, _tensor_fields, rules  # noqa: E402
from jitkey.errors import ArgumentError  # noqa: E402

FULL = Signature(
    [("x", rules.tensor(shape="exact", strides="exact", needs_int64=True))],
)
BUCKET = Signature([("x", rules.tensor(shape="bucket", device=False))])


def attribute_view(t: Any) -> tuple[Any, ...]:
    """What the key holds, computed from Python attributes."""
    return (
        "tensor",
        str(t.dtype).removeprefix("torch."),
        t.data_ptr() % 16 == 0,
        tuple(t.shape),
        tuple(t.stride()),
        t.device.type if t.device.index is None else f"{t.device.type}:{t.device.index}",
        t.numel() > 2**31 - 1,
    )


def test_layout_is_installed_for_the_pinned_torch() -> None:
    # torch 2.11 (requirements-dev.txt) matches the layout hypothesis; if a torch upgrade breaks it,
    # calibration refuses it (this test then says so) and the attribute path keeps working.
    assert _tensor_fields.calibrate(torch) is not None
    FULL.encode((torch.zeros(1),))
    assert _core._tensor_layout_installed()


DTYPES = [d for d in (getattr(torch, n) for n in dir(torch)) if isinstance(d, torch.dtype)]


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    dt = draw(
        st.sampled_from([torch.float16, torch.float32, torch.int8, torch.bool, torch.bfloat16, torch.int64])
    )
    ndim = draw(st.integers(0, 8))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    device = draw(st.sampled_from(["cpu", "cpu", "meta"]))
    t = torch.zeros(shape, dtype=dt, device=device)
    if ndim and draw(st.booleans()):
        d = draw(st.integers(0, ndim - 1))
        start = draw(st.integers(0, t.shape[d]))
        t = t.narrow(d, start, t.shape[d] - start)
    if ndim >= 2 and draw(st.booleans()):
        t = t.transpose(0, ndim - 1)
    if draw(st.booleans()):
        flat = torch.zeros(64, dtype=dt, device=device)
        off = draw(st.integers(0, 20))
        t = flat[off : off + draw(st.integers(0, 30))]
    if draw(st.integers(0, 5)) == 0:
        t = torch.nn.Parameter(t, requires_grad=False) if dt.is_floating_point else t
    return t


@settings(max_examples=400, deadline=None)
@given(t=tensors())
def test_direct_reads_equal_attribute_path(t: Any) -> None:
    assert FULL.flatten((t,))[1] == attribute_view(t)
    assert BUCKET.flatten((t,))[1] == (
        "tensor",
        attribute_view(t)[1],
        attribute_view(t)[2],
        tuple(min(s, 2) for s in t.shape),
    )


def test_every_dtype_equals_attribute_path() -> None:
    import warnings

    for dt in DTYPES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = torch.empty(3, 2, dtype=dt)[1:]
        except (RuntimeError, TypeError):
            continue
        assert FULL.flatten((t,))[1] == attribute_view(t), dt


def test_uncovered_tensors_take_the_attribute_path() -> None:
    class Sub(torch.Tensor):
        pass

    sub = torch.zeros(4, 3).as_subclass(Sub)[1:]
    assert FULL.flatten((sub,))[1] == attribute_view(sub)
    q = torch.quantize_per_tensor(torch.zeros(4), 0.1, 0, torch.qint8)
    assert FULL.flatten((q,))[1][1] == "qint8"
    sparse = torch.zeros(3, 3).to_sparse()
    with pytest.raises(ArgumentError, match="'x'"):
        FULL.encode((sparse,))  # sparse tensors have no data_ptr(): refused, never misread
    assert BUCKET.flatten((torch.zeros(1, 5).expand(3, 5),))[1][3] == (2, 2)


def test_same_keys_with_the_direct_path_off() -> None:
    """A process with JITKEY_TENSOR_FIELDS=0 (attribute path only) computes the same key bytes."""
    script = textwrap.dedent(
        """
        import json, torch
        from jitkey import Signature, _core, rules
        sig = Signature([("x", rules.tensor(shape="exact", strides="exact", needs_int64=True)),
                         ("y", rules.tensor(shape="bucket", strides="contiguous", device="type"))])
        base = torch.zeros(4096, dtype=torch.float16)
        ts = [base, base[3:], base[8:], base.view(64, 64).t(), base.view(2, 2, 2, 2, 2, 2, 64)[:, 1:],
              torch.zeros(()), base[:0], torch.zeros(3, 4, device="meta")[1:]]
        print(json.dumps([_core._tensor_layout_installed()] + [sig.encode((t, t)).hex() for t in ts]))
        """
    )
    env_on = {**os.environ, "JITKEY_TENSOR_FIELDS": "1"}
    env_off = {**os.environ, "JITKEY_TENSOR_FIELDS": "0"}
    on = json.loads(
        subprocess.run([sys.executable, "-c", script], env=env_on, capture_output=True, check=True).stdout
    )
    off = json.loads(
        subprocess.run([sys.executable, "-c", script], env=env_off, capture_output=True, check=True).stdout
    )
    assert on[0] is True and off[0] is False
    assert on[1:] == off[1:]
