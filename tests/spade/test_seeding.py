"""Every seed derived from the run seed lies in [0, 2**31), is reproducible and per-purpose.

Run seeds 0, 3 and 2**31 - 1 go through each derivation of a cycle: episode seeds, the Agent's
play seed, and the cycle generator that draws the Designer's
and hints' sampling seeds, the corpus documents and the memory's replays.
"""

import re

import numpy as np
import pytest

from spade_jax.envs.seeds import list_seed_envs
from spade_jax.seeding import SEED_LIMIT, check_seed, derive_rng, derive_seed
from spade_jax.spade.corpus import load_corpus
from spade_jax.spade.loop import cycle_rng, episode_seed, play_seed
from spade_jax.spade.memory import EnvMemory

RUN_SEEDS = (0, 3, SEED_LIMIT - 1)


def cycle_seeds(run_seed: int) -> dict:
    """Every seed of cycles 0..2 of a run with two environments, 2 plays each."""
    seeds = {}
    for cycle in range(3):
        seeds[("play", cycle)] = play_seed(run_seed, cycle)
        for env_id in ("seed:grid_maze", "c00000_s0_a0"):
            for i in range(2):
                seeds[("episode", cycle, env_id, i)] = episode_seed(run_seed, cycle, env_id, i)
    return seeds


@pytest.mark.parametrize("run_seed", RUN_SEEDS)
def test_cycle_seeds_are_in_range_reproducible_and_distinct(run_seed):
    seeds = cycle_seeds(run_seed)
    assert all(0 <= s < SEED_LIMIT and type(s) is int for s in seeds.values()), seeds
    assert cycle_seeds(run_seed) == seeds
    assert len(set(seeds.values())) == len(seeds)
    assert seeds != cycle_seeds((run_seed + 1) % SEED_LIMIT)


def test_derived_seeds_do_not_change_across_machines_or_numpy_versions():
    # SeedSequence's output is fixed by numpy's stability policy; these pin our encoding.
    assert play_seed(3, 0) == 627485596
    assert derive_seed(SEED_LIMIT - 1, "turn", 2) == 198675409
    assert episode_seed(0, 0, "seed:x", 0) == 658936518
    assert derive_rng(3, 0, 0).integers(SEED_LIMIT) == np.random.default_rng([3, 0, 0]).integers(
        SEED_LIMIT)


@pytest.mark.parametrize("run_seed", RUN_SEEDS)
def test_cycle_generator_drives_generation_seeds_corpus_and_memory(run_seed):
    corpus = load_corpus("stdlib", max_words=50)

    def draws(seed):
        memory = EnvMemory()
        memory.seed_from((e.name, e.skill, e.code) for e in list_seed_envs())
        rng = cycle_rng(seed, 1, 0)
        return ([int(rng.integers(SEED_LIMIT)) for _ in range(4)],  # Designer / hint seeds
                [corpus.sample(rng).doc_id for _ in range(4)],
                [record.id for record, _ in memory.sample_for_replay(3, rng, 1)])

    generation, documents, replayed = draws(run_seed)
    assert all(0 <= s < SEED_LIMIT for s in generation)
    assert len(set(documents)) > 1 and len(replayed) == 3
    assert draws(run_seed) == (generation, documents, replayed)
    assert draws((run_seed + 1) % SEED_LIMIT)[0] != generation
    other_stream = derive_rng(run_seed, 1, 1)
    assert [int(other_stream.integers(SEED_LIMIT)) for _ in range(4)] != generation


@pytest.mark.parametrize("value", [-1, SEED_LIMIT, 1.5, "3", True, None])
def test_a_bad_seed_is_an_error_naming_it(value):
    with pytest.raises(ValueError, match=re.escape(f"seed={value!r}")):
        check_seed(value)
    with pytest.raises(ValueError, match=re.escape(f"seed={value!r}")):
        derive_seed(value, "play", 0)


@pytest.mark.parametrize("label", [-1, 2**32, 1.5, None])
def test_a_bad_label_is_an_error_naming_it(label):
    with pytest.raises(ValueError, match=re.escape(f"label {label!r}")):
        derive_seed(0, label)


def test_reasoning_gym_pool_takes_the_largest_run_seed():
    """The fixed reasoning-gym pool seeds its datasets with the run seed itself."""
    pytest.importorskip("reasoning_gym")
    from spade_jax.eval.reasoning_gym import DEFAULT_CATEGORIES
    from spade_jax.eval.reasoning_gym_env import create_dataset

    for category in DEFAULT_CATEGORIES:  # as Runtime.fixed_pool: 1000 items each
        dataset = create_dataset(category, {}, SEED_LIMIT - 1, 1000)
        assert dataset[0]["question"] and dataset[999]["question"]
