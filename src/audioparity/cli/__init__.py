"""The ``audioparity`` command line (docs/design.md, "Command line").

``fixture``, ``reference``, ``ggml``, ``weights``, ``replay`` and ``drilldown`` have one
subcommand per model family, built from the family's table (:mod:`audioparity.contract.family`): the
same flags for every family, plus its own options. Exit codes: 0 done, 1 failed (one line on
stderr), 2 usage.
"""

from __future__ import annotations

import logging
import os
import sys

from audioparity.cli.arguments import parser
from audioparity.contract.errors import AudioparityError


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``audioparity`` console script; returns the exit code."""
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("gguf").setLevel(logging.WARNING)  # a line per file it writes
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    try:
        return args.run(args) or 0
    except AudioparityError as err:
        print(f"audioparity: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
