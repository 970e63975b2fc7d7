"""Runs a child script of tests/ in a fresh interpreter under Triton's interpreter (``TRITON_INTERPRET=1``), with
tests/ on ``PYTHONPATH``: the DSL tests that launch real Triton kernels on a machine without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def run(script: str, timeout: int, **env: str) -> Any:
    """The JSON of the child's last line of output (it must exit 0); ``env`` is added to the environment."""
    full = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        **env,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    p = subprocess.run(
        [sys.executable, str(HERE / script)], env=full, capture_output=True, text=True, timeout=timeout
    )
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])
