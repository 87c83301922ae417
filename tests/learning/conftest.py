"""One tiny-vocabulary Runtime shared by the learning tests, reset to its first weights per test."""

from __future__ import annotations

import os

import flax.nnx as nnx
import jax
import pytest

from tests.learning.world import (
    AGENT_FAMILY,
    build_tokenizer,
    learning_config,
    target_env_code,
)


@pytest.fixture(scope="session")
def learning_world(tmp_path_factory):
    """The tiny tokenizer and the Agent's environment family on disk; returns the base config."""
    root = tmp_path_factory.mktemp("learning_world")
    vocab_size = build_tokenizer(root / "tokenizer")
    family = root / "target_family"
    family.mkdir()
    for i, choices in enumerate(AGENT_FAMILY):
        (family / f"target_{i}.py").write_text(target_env_code(f"Member{i}", choices))
    # The tests pass with the default seed; SPADE_LEARNING_SEED checks other seeds by hand.
    seed = int(os.environ.get("SPADE_LEARNING_SEED", "0"))
    cfg = learning_config(root / "tokenizer", vocab_size, seed=seed)
    cfg.fixed_pool = str(family)
    return cfg


@pytest.fixture(scope="session")
def learning_runtime_session(learning_world):
    from spade_jax.config import parse
    from spade_jax.spade.runtime import Runtime

    rt = Runtime.create(parse(learning_world))
    initial = jax.device_get(nnx.state(rt.model))
    yield rt, initial
    rt.close()


@pytest.fixture
def learning_runtime(learning_runtime_session):
    """The shared Runtime with its initial random weights and a fresh optimizer state."""
    from spade_jax.rl.trainer import init_train_state

    rt, initial = learning_runtime_session
    nnx.update(rt.model, initial)
    rt.set_device_state(init_train_state(rt.model, rt.optimizer, rt.mesh))
    return rt
