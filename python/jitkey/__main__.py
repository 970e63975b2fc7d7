"""``python -m jitkey`` (and the ``jitkey`` console script): see :mod:`jitkey.cli`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the jitkey command line; returns the exit status."""
    from jitkey.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
