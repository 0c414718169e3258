"""The `schedlab` command (filled in by the Hydra CLI work)."""

from __future__ import annotations

import sys


def main() -> None:
    print("schedlab: the command line is not built yet", file=sys.stderr)
    sys.exit(2)
