"""Held-out game files become eval tasks under the contract."""

import pytest

from spade_jax.envs.contract import solution_actions
from spade_jax.eval.games import env_class_name, game_tasks
from spade_jax.eval.tasks import replay_actions

GUESS_ENV = """
import random


class GuessEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, 9)
        return "Guess a digit 1-9 in \\\\boxed{}.", {}

    def step(self, action):
        guess = action.rsplit("\\\\boxed{", 1)[-1].split("}")[0]
        if guess == str(self.secret):
            return "Correct.", 1.0, True, False, {}
        return "Wrong.", 0.0, False, False, {}

    def solution(self):
        return "\\\\boxed{%d}" % self.secret

    def close(self):
        pass
"""


def test_game_files_become_seeded_tasks(tmp_path):
    (tmp_path / "guess.py").write_text(GUESS_ENV)
    tasks = game_tasks(tmp_path, n_seeds=3, max_turns=5)
    assert [t.task_id for t in tasks] == ["guess/0", "guess/1", "guess/2"]
    for task in tasks:
        env = task.make_local()
        env.reset(seed=task.seed)
        actions = solution_actions(env.solution())
        assert replay_actions(env, task.seed, actions)[0] == 1.0


def test_bad_game_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError):
        game_tasks(tmp_path)
    (tmp_path / "two.py").write_text("class AEnv: pass\nclass BEnv: pass\n")
    with pytest.raises(ValueError, match="two.py"):
        game_tasks(tmp_path)
    with pytest.raises(ValueError, match="does not parse"):
        env_class_name("class (", "broken.py")
