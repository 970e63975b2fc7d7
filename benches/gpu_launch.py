"""``python benches/gpu_launch.py --json out.json``: the GPU launch-overhead table (jitkey.triton_bench)."""

from __future__ import annotations

import sys

from jitkey.triton_bench import main

if __name__ == "__main__":
    sys.exit(main())
