"""Shared fixtures: one real tiny training run (one SPADE cycle) reused by the scale-out tests."""

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
def tiny_workdir(tmp_path_factory):
    """A workdir left by `run_training` on configs/tiny.py, one cycle, mesh (1, 8, 1)."""
    from spade_jax.spade.driver import run_training

    cfg = load_config("tiny")
    cfg.total_cycles = 1
    workdir = tmp_path_factory.mktemp("tiny_run")
    run_training(cfg, str(workdir))
    return workdir
