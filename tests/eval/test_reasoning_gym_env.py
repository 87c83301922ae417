"""reasoning-gym env: reference answers score 1, wrong or unboxed answers do not."""

import pytest

pytest.importorskip("reasoning_gym", reason="pip install reasoning-gym")

from spade_jax.envs.contract import solution_actions  # noqa: E402
from spade_jax.eval.reasoning_gym import (  # noqa: E402
    DEFAULT_CATEGORIES,
    available_categories,
    reasoning_gym_tasks,
)
from spade_jax.eval.tasks import replay_actions  # noqa: E402


def test_default_categories_exist():
    assert set(DEFAULT_CATEGORIES) <= set(available_categories())


def test_reference_answers_score_one():
    for task in reasoning_gym_tasks(size=5):
        env = task.make_local()
        env.reset(seed=task.seed)
        episode_return, terminated, info = replay_actions(
            env, task.seed, solution_actions(env.solution())
        )
        assert (episode_return, terminated) == (1.0, True), (task.task_id, info)


def test_wrong_and_missing_answers_do_not_score():
    task = reasoning_gym_tasks(["basic_arithmetic"], size=3)[1]
    env = task.make_local()
    assert replay_actions(env, task.seed, ["the answer is 3"])[0] == 0.0
    assert replay_actions(env, task.seed, ["\\boxed{not a number}"])[0] == 0.0


def test_seed_picks_the_item_deterministically():
    first, second = reasoning_gym_tasks(["chain_sum"], size=4)[:2]
    env = first.make_local()
    assert env.reset(seed=0)[0] == first.make_local().reset(seed=0)[0]
    assert env.reset(seed=0)[0] != env.reset(seed=second.seed)[0]
    assert "\\boxed{" in env.reset(seed=0)[0]


def test_config_reaches_the_dataset():
    task = reasoning_gym_tasks(
        ["chain_sum"], size=2, configs={"chain_sum": {"min_terms": 5, "max_terms": 5}}
    )[0]
    question = task.make_local().reset(seed=0)[0]
    assert question.count("+") + question.count("-") >= 4


def test_unknown_category_is_named():
    with pytest.raises(ValueError, match="no_such_task"):
        reasoning_gym_tasks(["no_such_task"])
