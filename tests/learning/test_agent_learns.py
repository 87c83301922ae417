"""The Agent learns: a tiny random model's return rises from chance to near 1 through the loop.

Golden-value tests catch a wrong formula, not a wrong pipeline. Here a randomly initialised
model plays the target family of `world.py` (every turn shows the episode's target symbol; a
turn is right when the answer's first word is that symbol; the return is the share of right
turns) through the real cycle in fixed-pool mode: `run_cycle` with the real Sampler, sandboxed
environments, K no-hint and K hint plays, per-environment z-scores, `agent_sample`, batch
assembly and one PPO step per cycle. A random policy is right about once in thirty; ignoring
the observation caps the return at 0.5; only reading the target reaches 0.9.

Teeth (run by hand, see the sabotage test): the same run with the advantage sign flipped or
with the loss mask (and its log-probs) shifted by one token stays near chance.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from spade_jax.config import parse
from spade_jax.spade import loop
from spade_jax.spade.artifacts import Artifacts
from spade_jax.spade.driver import fresh_state
from spade_jax.spade.rollout import Episode

pytestmark = pytest.mark.slow  # about 3 minutes on 2 cores: runs in CI

BUDGET_CYCLES = 40
TARGET_RETURN = 0.9
INITIAL_CEILING = 0.2


def agent_config(base):
    cfg = base.copy_and_resolve_references()
    cfg.mode = "fixed"
    cfg.spade.plays_per_env = 8
    return parse(cfg)


def train_agent(rt, cfg, workdir, budget: int = BUDGET_CYCLES) -> list[float]:
    """Run cycles until two in a row reach TARGET_RETURN or the budget ends; mean returns."""
    state = fresh_state(cfg.memory, rt.seed_envs)
    artifacts = Artifacts(str(workdir), enabled=False)
    curve = []
    for _ in range(budget):
        metrics = loop.run_cycle(rt, cfg, state, None, artifacts)
        curve.append(round(float(metrics["return/nohint"]), 3))
        if len(curve) >= 2 and min(curve[-2:]) >= TARGET_RETURN:
            break
    return curve


def learned(curve: list[float]) -> bool:
    return len(curve) >= 2 and min(curve[-2:]) >= TARGET_RETURN


def test_agent_return_rises_from_chance_to_mastery(learning_world, learning_runtime, tmp_path):
    curve = train_agent(learning_runtime, agent_config(learning_world), tmp_path)
    print("agent mean return per cycle:", curve)
    assert curve[0] <= INITIAL_CEILING, curve
    assert learned(curve), f"mean return stayed below {TARGET_RETURN}: {curve}"


def _sign_flipped(real):
    def agent_sample(episode, advantage, weight=1.0):
        return real(episode, -advantage, weight)
    return agent_sample


def _mask_shifted(real):
    def agent_sample(episode: Episode, advantage, weight=1.0):
        later = lambda a: np.concatenate([np.zeros(1, a.dtype), a[:-1]])  # noqa: E731
        shifted = Episode(**{**episode.__dict__, "loss_mask": later(episode.loss_mask),
                             "old_logp": later(episode.old_logp)})
        return real(shifted, advantage, weight)
    return agent_sample


@pytest.mark.skipif(not os.environ.get("SPADE_LEARNING_TEETH"),
                    reason="proof that the learning test has teeth: SPADE_LEARNING_TEETH=1")
@pytest.mark.parametrize("sabotage", [_sign_flipped, _mask_shifted],
                         ids=["advantage_sign_flipped", "loss_mask_shifted"])
def test_sabotaged_agent_does_not_learn(learning_world, learning_runtime, tmp_path, monkeypatch,
                                        sabotage):
    monkeypatch.setattr(loop, "agent_sample", sabotage(loop.agent_sample))
    curve = train_agent(learning_runtime, agent_config(learning_world), tmp_path)
    print(f"{sabotage.__name__} mean return per cycle:", curve)
    assert not learned(curve), curve
