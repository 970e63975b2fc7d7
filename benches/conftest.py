from __future__ import annotations

import pytest

from jitkey.bench._sections import triton_style_key  # the CLI's key shape (one definition)

# The benches double as correctness tests in the default (--benchmark-disable) run; time them with
#   .venv/bin/python -m pytest benches --benchmark-enable --benchmark-disable-gc --benchmark-min-time=0.2
# and compare the groups' medians (ratios within one run; absolute ns depend on the machine).


@pytest.fixture(params=[4, 16], ids=lambda n: f"{n}-entry")
def key_tuple(request: pytest.FixtureRequest) -> tuple[object, ...]:
    return triton_style_key(request.param)
