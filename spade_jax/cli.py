"""What every command-line entry point shares: absl flag parsing, and bad input reported in one
`error:` line instead of a traceback."""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from spade_jax.errors import SpadeError


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing; an unparsable value (`--config.seed=abc`) or a config file that does
    not exist (`--config=configs/nope.py`) is one `error:` line."""
    try:
        rest = flags.FLAGS(argv)
    except flags.Error as err:
        sys.exit(f"error: {err}")
    for name in flags.FLAGS:
        if not flags.FLAGS[name].present:
            continue
        try:  # ml_collections defers a missing file's error to the config's first use
            path = config_flags.get_config_filename(flags.FLAGS[name])
        except TypeError:  # not a config-file flag
            continue
        path = (path or "").split(":", 1)[0]  # "file.py:arg" passes arg to get_config
        if path and not os.path.isfile(path):
            sys.exit(f"error: --{name}={path}: no such config file (the recipes are in configs/)")
    return rest


def run(main) -> None:
    """absl's `app.run(main)` with `parse_flags`; the project's own errors (`SpadeError`: a bad
    config, a missing file, an unwritable directory) end it with one `error:` line."""

    def main_or_error(argv):
        try:
            return main(argv)
        except SpadeError as err:
            sys.exit(f"error: {err}")

    app.run(main_or_error, flags_parser=parse_flags)
