"""Test set-up: 8 fake CPU devices before JAX is imported, so sharding tests run anywhere,
XLA's fast-compiling CPU settings (tests/commands.py), and the split of the suite over
pytest-xdist workers (pyproject.toml's addopts)."""

import os

import pytest

from tests.commands import DIRECTORY_VARIABLE, TEST_XLA_FLAGS
from tests.workers import SharedFixtureScheduling, unit_of

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += f" {TEST_XLA_FLAGS}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the files that share a session fixture as one unit."""
    if config.getvalue("dist") == "loadfile":
        return SharedFixtureScheduling(config, log)
    return None


def pytest_collection_modifyitems(config, items):
    """Units of work with a slow test first, so the xdist workers finish together; and
    `heavy` tests need SPADE_HEAVY_TESTS=1: the two-process run compared with one process
    (about 7 minutes on 2 cores), kept out of CI's budget. Run them with
    `SPADE_HEAVY_TESTS=1 python -m pytest -m heavy`.
    """
    slow_units = {unit_of(item.nodeid) for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: unit_of(item.nodeid) not in slow_units)

    if os.environ.get("SPADE_HEAVY_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="heavy: set SPADE_HEAVY_TESTS=1 to run (minutes)")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    """One persistent compilation cache for the whole test session (a fresh directory each
    time, shared by the xdist workers, which inherit its name): tests that build the same small
    model compile each program once, not once per test, and so do the commands they start
    (tests/commands.py). SPADE_TEST_COMPILE_CACHE=0 turns it off."""
    if os.environ.get("SPADE_TEST_COMPILE_CACHE", "1") == "0":
        return
    import atexit
    import shutil
    import tempfile

    import jax

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    directory = os.environ.get(DIRECTORY_VARIABLE) if worker else None
    if directory is None:  # the controller, or a run without workers
        directory = tempfile.mkdtemp(prefix="spade-test-compile-cache-")
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        os.environ[DIRECTORY_VARIABLE] = directory  # for the workers and commands tests start
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
