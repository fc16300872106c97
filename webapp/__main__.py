"""`python -m webapp` and the `mtp-chat` console script (`mtp-chat attach-head ...` attaches an
MTP head to an MLX conversion, see webapp/attach_head.py)."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "attach-head":
        from .attach_head import main as attach_main

        return attach_main(argv[1:])
    from .cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
