"""The Designer learns: trained on regret, it moves its designs into the maximum-regret band.

The tiny random model is the Designer of a parametric family: its first generated token picks
the difficulty (`L0`..`L4`: the dial environment of `world.py` with a bigger dial), any other
token is a design without code. The real cycle (`run_cycle`) runs with the real generation,
validation gate, rewards (variant `regret`, invalid penalty), per-skill centring, role scale,
batch assembly and PPO step. Only the Agent's play is scripted: an agent of fixed skill that
wins with a probability set by the level and by whether it got the hint (`SCRIPTED_WIN`), so
the hint helps most at L2. The share of L2 designs must rise from chance to 0.8.

Bypass, documented: the gate runs for real once per level; later designs of the same level
(the same code up to a design tag that keeps them distinct in memory) reuse that report, so
the test does not spend a minute per cycle re-validating one environment.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from spade_jax.config import parse
from spade_jax.spade import loop
from spade_jax.spade.artifacts import Artifacts
from spade_jax.spade.driver import fresh_state
from spade_jax.spade.rollout import Episode
from tests.learning.world import LEVELS, MAX_REGRET_LEVEL, SCRIPTED_WIN, dial_env_code

pytestmark = pytest.mark.slow  # about 1 minute on 2 cores: runs in CI

BUDGET_CYCLES = 30
TARGET_SHARE = 0.8
LEVEL_PATTERN = re.compile(r"^    LEVEL = (\d+)$", re.MULTILINE)


def designer_config(base):
    cfg = base.copy_and_resolve_references()
    cfg.mode = "spade"
    cfg.spade.skills = ("Logical_Deduction",)
    cfg.spade.skills_per_regen = 1
    cfg.spade.regen_interval = 1
    cfg.spade.games_per_cycle = 16
    cfg.spade.plays_per_env = 4
    cfg.spade.reward_variant = "regret"
    cfg.spade.no_memory = True
    cfg.sampling.designer_max_new_tokens = 1
    return parse(cfg)


class ParametricDesigner:
    """Wraps the Runtime: the policy's first token picks a level, the scripted agent plays."""

    def __init__(self, rt):
        self.rt = rt
        self.real_generate, self.real_validate = rt.generate, rt.validate
        self.level_ids = rt.tokenizer.convert_tokens_to_ids(LEVELS)
        self.levels_per_call: list[list[int | None]] = []
        self.reports: dict[int, object] = {}
        self.designs = 0

    def generate(self, messages_list, **kwargs):
        completions = self.real_generate(messages_list, **kwargs)
        levels, out = [], []
        for completion in completions:
            first = completion.tokens[0] if completion.tokens else None
            level = self.level_ids.index(first) if first in self.level_ids else None
            levels.append(level)
            if level is not None:
                self.designs += 1
                code = dial_env_code(level, design=f"design-{self.designs}")
                completion = dataclasses.replace(completion, text=f"```python\n{code}\n```")
            out.append(completion)
        self.levels_per_call.append(levels)
        return out

    def validate(self, text: str):
        match = LEVEL_PATTERN.search(text)
        if match is None:
            return self.real_validate(text)
        level = int(match.group(1))
        if level not in self.reports:
            self.reports[level] = self.real_validate(text)
        report = self.reports[level]
        return dataclasses.replace(report, code=text.split("```python\n")[1].split("\n```")[0])

    @staticmethod
    def play(specs, *, seed):
        episodes = []
        for spec in specs:
            level = int(LEVEL_PATTERN.search(spec.code).group(1))
            hinted = spec.hint is not None
            won = np.random.default_rng([spec.seed, hinted]).random() < SCRIPTED_WIN[level][hinted]
            none = np.zeros(2, bool)  # nothing generated: the scripted plays train nothing
            episodes.append(Episode(spec, np.zeros(2, np.int32), none, np.zeros(2, np.float32),
                                    [float(won)], True, "ok", 1, 0))
        return episodes


def test_designer_moves_to_the_max_regret_band(learning_world, learning_runtime, tmp_path,
                                               monkeypatch):
    rt, cfg = learning_runtime, designer_config(learning_world)
    designer = ParametricDesigner(rt)
    monkeypatch.setattr(rt, "generate", designer.generate)
    monkeypatch.setattr(rt, "validate", designer.validate)
    monkeypatch.setattr(rt, "play", designer.play)
    state = fresh_state(cfg.memory, rt.seed_envs)
    artifacts = Artifacts(str(tmp_path), enabled=False)
    shares = []
    for _ in range(BUDGET_CYCLES):
        metrics = loop.run_cycle(rt, cfg, state, None, artifacts)
        assert metrics["samples/designer"] == cfg.spade.games_per_cycle
        levels = designer.levels_per_call[-1]
        shares.append(round(float(np.mean([lv == MAX_REGRET_LEVEL for lv in levels])), 3))
        if len(shares) >= 2 and min(shares[-2:]) >= TARGET_SHARE:
            break
    print("share of max-regret designs per cycle:", shares)
    assert shares[0] <= 0.2, shares  # chance: one token in len(vocab) = 29
    assert min(shares[-2:]) >= TARGET_SHARE, (
        f"share of L{MAX_REGRET_LEVEL} designs did not reach {TARGET_SHARE}: {shares}")
