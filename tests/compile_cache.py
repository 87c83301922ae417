"""The test session's persistent compilation cache, shared with the commands tests start.

`tests/conftest.py` makes one cache directory per session and names it in
SPADE_TEST_COMPILE_CACHE_DIR. A command a test runs as a subprocess (launch/eval.py,
launch/train.py) compiles the same small programs as the tests before it; pointed at this
cache it loads them instead. Where the cache itself is what a test checks, it keeps its own.
"""

import os

DIRECTORY_VARIABLE = "SPADE_TEST_COMPILE_CACHE_DIR"


def session_cache_dir() -> str | None:
    """The session's cache directory, or None when SPADE_TEST_COMPILE_CACHE=0 turned it off."""
    return os.environ.get(DIRECTORY_VARIABLE) or None


def compile_cache_env() -> dict[str, str]:
    """Environment variables that point a child's JAX at the session cache (none when off)."""
    directory = session_cache_dir()
    if directory is None:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": directory,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def train_cache_flags() -> list[str]:
    """launch/train.py's flag for the session cache, in place of its <workdir>/compile_cache."""
    directory = session_cache_dir()
    return [] if directory is None else [f"--compile_cache_dir={directory}"]
