"""`python -m webapp` and the `mtp-chat` console script."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    from .cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
