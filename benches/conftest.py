from __future__ import annotations

import pytest

# The benches double as correctness tests in the default (--benchmark-disable) run; time them with
#   .venv/bin/python -m pytest benches --benchmark-enable --benchmark-disable-gc --benchmark-min-time=0.2
# and compare the groups' medians (ratios within one run; absolute ns depend on the machine).


def triton_style_key(n: int) -> tuple[object, ...]:
    """A Triton-style flat key: per-arg (type, attr) pairs, a constexpr and num_warps."""
    kinds = ["*fp16", "*fp32", "*bf16", "i32"]
    items: list[object] = [(kinds[i % 4], "D" if i % 3 else "") for i in range(n - 2)]
    items += [("constexpr", 1024), 4]
    return tuple(items)


@pytest.fixture(params=[4, 16], ids=lambda n: f"{n}-entry")
def key_tuple(request: pytest.FixtureRequest) -> tuple[object, ...]:
    return triton_style_key(request.param)
