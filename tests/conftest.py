from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

# CI shares 2 cores with the build and other suites: never fail a property test because one example was slow
# (each test still sets its own example budget; deadlines are off everywhere).
settings.register_profile(
    "jitkey", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("jitkey")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
