"""Shared fixtures: the tiny config and one Runtime for the in-process loop tests."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_config(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


@pytest.fixture(scope="session")
def tiny_runtime():
    from spade_jax.spade.runtime import Runtime

    rt = Runtime.create(load_config("tiny"))
    yield rt
    rt.close()
