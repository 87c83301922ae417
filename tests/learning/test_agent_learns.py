"""The Agent learns: a tiny random model's return rises from chance to reading the target.

Golden-value tests catch a wrong formula, not a wrong pipeline. Here a randomly initialised
model plays the target family of `world.py` (every turn shows the episode's target symbol; a
turn is right when the answer's first word is that symbol; the return is the share of right
turns) through the real cycle in fixed-pool mode: `run_cycle` with the real Sampler, sandboxed
environments, K no-hint and K hint plays, per-environment z-scores, `agent_sample`, batch
assembly and one PPO step per cycle. A random policy is right about once in thirty. Each
symbol is a target in two of the four members, so a policy that ignores the observation is
right at most a quarter of the time: a mean above 0.25 means the Agent reads the target.

The criterion is the mean return over WINDOW consecutive cycles, which must reach TARGET_MEAN
within BUDGET_CYCLES: one cycle's mean over 32 plays is noisy, and the path differs by seed
(and by CPU). TARGET_MEAN sits between the observation-free 0.25 and the plateau of the slowest
seed measured, far above the sabotaged runs (README "Does it learn?" has the curves). Teeth (run
by hand, see the sabotage test): the same run with the advantage sign flipped or with the loss
mask (and its log-probs) shifted by one token stays far below.
"""

from __future__ import annotations

import os

import pytest

from spade_jax.config import parse
from spade_jax.spade import loop
from spade_jax.spade.artifacts import Artifacts
from spade_jax.spade.driver import fresh_state
from tests.learning.world import SABOTAGES, best_window_mean, sabotaged_train, train_until

pytestmark = pytest.mark.slow  # about 1.5 minutes on 2 cores: runs in CI

BUDGET_CYCLES = 40
WINDOW = 5
TARGET_MEAN = 0.4
INITIAL_CEILING = 0.2
SABOTAGED_CEILING = 0.2


def agent_config(base, seed: int):
    cfg = base.copy_and_resolve_references()
    cfg.seed = seed
    cfg.mode = "fixed"
    cfg.spade.plays_per_env = 8
    return parse(cfg)


def train_agent(rt, cfg, workdir) -> list[float]:
    """Mean no-hint return per cycle, until a WINDOW of cycles averages TARGET_MEAN or the
    budget ends."""
    state = fresh_state(cfg.memory, rt.seed_envs)
    artifacts = Artifacts(str(workdir), enabled=False)
    return train_until(
        lambda: loop.run_cycle(rt, cfg, state, None, artifacts)["return/nohint"],
        budget=BUDGET_CYCLES, window=WINDOW, threshold=TARGET_MEAN)


def test_agent_learns_to_read_the_target(learning_world, learning_seed, learning_runtime,
                                         tmp_path):
    curve = train_agent(learning_runtime, agent_config(learning_world, learning_seed), tmp_path)
    best = best_window_mean(curve, WINDOW)
    print(f"seed {learning_seed}: agent mean return per cycle {curve}; best {WINDOW}-cycle "
          f"mean {best:.3f}")
    assert curve[0] <= INITIAL_CEILING, curve
    assert best >= TARGET_MEAN, f"no {WINDOW} cycles averaged {TARGET_MEAN}: {curve}"


@pytest.mark.skipif(not os.environ.get("SPADE_LEARNING_TEETH"),
                    reason="proof that the learning test has teeth: SPADE_LEARNING_TEETH=1")
@pytest.mark.parametrize("sabotage", list(SABOTAGES))
def test_sabotaged_agent_does_not_learn(learning_world, learning_seed, learning_runtime,
                                        tmp_path, monkeypatch, sabotage):
    rt = learning_runtime
    monkeypatch.setattr(rt, "train", sabotaged_train(rt.train, "agent", sabotage))
    curve = train_agent(rt, agent_config(learning_world, learning_seed), tmp_path)
    best = best_window_mean(curve, WINDOW)
    print(f"seed {learning_seed}, {sabotage}: agent mean return per cycle {curve}; best "
          f"{WINDOW}-cycle mean {best:.3f}")
    assert best <= SABOTAGED_CEILING, curve
