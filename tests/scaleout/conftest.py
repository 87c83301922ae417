"""Shared fixtures: one real tiny training run (one SPADE cycle) reused by the scale-out tests."""

import pathlib

import pytest

from spade_jax.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_workdir(tmp_path_factory):
    """A workdir left by `run_training` on configs/tiny.py, one cycle, mesh (1, 8, 1)."""
    from spade_jax.spade.driver import run_training

    cfg = load_config_file("tiny")
    cfg.total_cycles = 1
    workdir = tmp_path_factory.mktemp("tiny_run")
    run_training(cfg, str(workdir))
    return workdir
