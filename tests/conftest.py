"""Test set-up: 8 fake CPU devices before JAX is imported, so sharding tests run anywhere."""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """`heavy` tests need SPADE_HEAVY_TESTS=1: the two-process run compared with one process
    (about 7 minutes on 2 cores), kept out of CI's budget. Run them with
    `SPADE_HEAVY_TESTS=1 python -m pytest -m heavy`.
    """
    import pytest

    if os.environ.get("SPADE_HEAVY_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="heavy: set SPADE_HEAVY_TESTS=1 to run (minutes)")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)
