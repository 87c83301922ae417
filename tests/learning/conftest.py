"""One tiny-vocabulary Runtime shared by the learning tests, reset to a seed's first weights per
test. `SPADE_LEARNING_SEEDS` (default `0`, e.g. `0,1,2`) runs every learning test once per seed:
the seed sets the random initial weights and every sampling and episode seed of the run."""

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

SEEDS_VARIABLE = "SPADE_LEARNING_SEEDS"


def learning_seeds() -> list[int]:
    """The seeds of `SPADE_LEARNING_SEEDS`, a comma-separated list of integers (default 0)."""
    text = os.environ.get(SEEDS_VARIABLE, "0")
    try:
        return [int(seed) for seed in text.split(",")]
    except ValueError:
        raise ValueError(f"{SEEDS_VARIABLE}={text!r}: expected integers like 0,1,2") from None


def pytest_generate_tests(metafunc):
    if "learning_seed" in metafunc.fixturenames:
        metafunc.parametrize("learning_seed", learning_seeds(), ids=lambda s: f"seed{s}")


@pytest.fixture(scope="session")
def learning_world(tmp_path_factory):
    """The tiny tokenizer and the Agent's environment family on disk; returns the base config
    (seed 0: a test sets its own `learning_seed`)."""
    root = tmp_path_factory.mktemp("learning_world")
    vocab_size = build_tokenizer(root / "tokenizer")
    family = root / "target_family"
    family.mkdir()
    for i, choices in enumerate(AGENT_FAMILY):
        (family / f"target_{i}.py").write_text(target_env_code(f"Member{i}", choices))
    cfg = learning_config(root / "tokenizer", vocab_size)
    cfg.fixed_pool = str(family)
    return cfg


@pytest.fixture(scope="session")
def learning_runtime_session(learning_world):
    """The Runtime (compiled once) and a cache of each seed's initial weights."""
    from spade_jax.config import parse
    from spade_jax.spade.runtime import Runtime

    rt = Runtime.create(parse(learning_world, 1), jax.devices()[:1])  # as on a laptop
    yield rt, {}
    rt.close()


@pytest.fixture
def learning_runtime(learning_runtime_session, learning_world, learning_seed):
    """The shared Runtime with the random initial weights of `learning_seed` and a fresh
    optimizer state."""
    from spade_jax.config import parse
    from spade_jax.rl.trainer import init_train_state
    from spade_jax.spade.runtime import load_model_and_tokenizer

    rt, initial = learning_runtime_session
    if learning_seed not in initial:
        cfg = learning_world.copy_and_resolve_references()
        cfg.seed = learning_seed
        run = parse(cfg)
        model, _ = load_model_and_tokenizer(run.model, run.seed, rt.mesh)
        initial[learning_seed] = jax.device_get(nnx.state(model))
    nnx.update(rt.model, initial[learning_seed])
    rt.set_device_state(init_train_state(rt.model, rt.optimizer, rt.mesh))
    return rt
