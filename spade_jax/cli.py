"""What every command-line entry point shares: absl flag parsing that fails in one line."""

from __future__ import annotations

import sys

from absl import flags


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing; an unparsable value (`--config.seed=abc`) is one `error:` line."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as err:
        sys.exit(f"error: {err}")
