"""Shared fixtures: the tiny config and one Runtime for the in-process loop tests."""

import pathlib

import pytest

from spade_jax.config import load_config_file, parse

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_runtime():
    from spade_jax.spade.runtime import Runtime

    rt = Runtime.create(parse(load_config_file("tiny")))
    yield rt
    rt.close()
