"""The environment of the tests and of the commands they start (launch/train.py, launch/eval.py,
README code).

`tests/conftest.py` gives the test process 8 fake CPU devices for the sharding tests, XLA's CPU
backend at its cheapest compilation settings (TEST_XLA_FLAGS), and one persistent compilation cache
per session, named in SPADE_TEST_COMPILE_CACHE_DIR. A command a test starts keeps the flags
but runs on one CPU device, as on a user's laptop, unless the test is about sharding:
inheriting the 8 devices would run it on a mesh it does not test, and slower. Pointed at the
session cache, it loads the small programs the tests before it compiled. Where the cache
itself is what a test checks, the test keeps its own.
"""

import os
import pathlib
import re

DIRECTORY_VARIABLE = "SPADE_TEST_COMPILE_CACHE_DIR"
ROOT = pathlib.Path(__file__).resolve().parents[1]
_DEVICE_COUNT_FLAG = re.compile(r"\s*--xla_force_host_platform_device_count=\d+")
# The tests' programs are small and their time is mostly compilation: LLVM's optimization
# passes over the generated CPU code cost more than they save, and so do XLA-CPU's MLIR fusion
# emitters, which its older elemental emitters replace (`bench/compile_flags.py` measures
# both). The suite passes under either; XLA's memory and cost analyses of a program agree
# within a fraction of a percent (the fusions' temporaries may differ by a few bytes).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def one_device_xla_flags() -> str:
    """This process's XLA_FLAGS without the fake device count: one CPU device."""
    return _DEVICE_COUNT_FLAG.sub("", os.environ.get("XLA_FLAGS", "")).strip()


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


def command_env(**extra: str) -> dict[str, str]:
    """This process's environment for a command on one CPU device, with the repository on
    PYTHONPATH and the session cache; `extra` variables last."""
    return {**os.environ, "XLA_FLAGS": one_device_xla_flags(), "PYTHONPATH": str(ROOT),
            **compile_cache_env(), **extra}


def train_cache_flags() -> list[str]:
    """launch/train.py's flag for the session cache, in place of its <workdir>/compile_cache."""
    directory = session_cache_dir()
    return [] if directory is None else [f"--compile_cache_dir={directory}"]
