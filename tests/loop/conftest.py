"""Shared fixture: one Runtime on the tiny config for the in-process loop tests."""

import pytest

from spade_jax.config import load_config_file, parse


@pytest.fixture(scope="session")
def tiny_runtime():
    """On one CPU device: these tests are not about sharding (tests/loop/pin.py's run and
    tests/scaleout/ use the 8 fake devices), and 8 would make them several times slower."""
    import jax

    from spade_jax.spade.runtime import Runtime

    rt = Runtime.create(parse(load_config_file("tiny"), 1), jax.devices()[:1])
    yield rt
    rt.close()
