"""``python -m jitkey``: command-line entry points (``bench``)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the jitkey command line."""
    from jitkey.bench import main as bench_main

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["bench"]:
        args = args[1:]
    return bench_main(args)


if __name__ == "__main__":
    sys.exit(main())
