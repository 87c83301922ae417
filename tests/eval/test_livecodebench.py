"""LiveCodeBench v6: its public file format, LiveCodeBench's grading rules, the sandbox run."""

from pathlib import Path

import pytest

from spade_jax.errors import MissingFileError
from spade_jax.eval import livecodebench_env, rq1, runner, tables

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "rq1"

STDIN_SOLUTION = """Here it is:
```python
import sys

def main():
    data = sys.stdin.buffer.read().split()
    n, sums = int(data[0]), []
    for i in range(n):
        sums.append(int(data[1 + 2 * i]) + int(data[2 + 2 * i]))
    print(*sums, sep="\\n")
    print(f"{sum(sums) / n:.1f}")

if __name__ == "__main__":
    main()
```"""
# Right on the public test only (its private tests have other sizes).
PUBLIC_ONLY = "```python\nprint('3\\n7\\n5.0')\n```"
TWO_SUM = """```python
class Solution:
    def twoSum(self, nums, target):
        seen = {}
        for i, x in enumerate(nums):
            if target - x in seen:
                return (seen[target - x], i)
            seen[x] = i
```"""


def _lcb_tasks():
    return {t.category: t for t in rq1.lcb_tasks(FIXTURES, samples=1)}


def _play_local(task, reply, **overrides):
    env = task.make_local(**overrides)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(reply)
    assert terminated
    return reward, info


def test_problems_read_from_every_release_file_with_the_reference_prompt():
    tasks = rq1.lcb_tasks(FIXTURES, samples=2)
    assert [(t.task_id, t.category, t.seed) for t in tasks] == [
        ("lcb/abc999_a", "easy", 0), ("lcb/abc999_a", "easy", 1),
        ("lcb/3999", "medium", 0), ("lcb/3999", "medium", 1)]
    prompt, _ = tasks[2].make_local().reset()
    assert prompt.startswith("Given nums and target")
    assert "\nStarter code:\n```python\nclass Solution:\n    def twoSum(" in prompt
    assert prompt.endswith("\nWrite the complete solution in a single ```python ... ``` block.")
    assert "Starter code" not in tasks[0].make_local().reset()[0]
    assert runner._system_prompt(tasks[0]) is None  # the user message alone, as the reference


def test_stdin_programs_pass_all_tests_public_and_private():
    task = _lcb_tasks()["easy"]
    reward, info = _play_local(task, STDIN_SOLUTION)
    assert (reward, info["verdict"], info["tests"]) == (1.0, "passed", 3)  # 1 public, 2 private
    reward, info = _play_local(task, PUBLIC_ONLY)
    assert (reward, info["verdict"]) == (0.0, "test 1: wrong answer")


def test_functional_problems_call_the_solution_method():
    task = _lcb_tasks()["medium"]
    reward, info = _play_local(task, TWO_SUM)  # a tuple result counts as the list
    assert (reward, info["verdict"]) == (1.0, "passed")
    wrong = TWO_SUM.replace("(seen[target - x], i)", "[i, seen[target - x]]")
    assert _play_local(task, wrong)[1]["verdict"] == "test 0: wrong answer"
    assert _play_local(task, "no code")[1]["verdict"].startswith("compile error")


def test_outputs_compare_by_stripped_lines_then_as_decimals():
    assert livecodebench_env.lines_match(" 1 2 \n3\n\n", "1 2\n3")
    assert livecodebench_env.lines_match("2.0 1e1", "2.00 10")
    assert not livecodebench_env.lines_match("1\n2", "1 2")
    assert not livecodebench_env.lines_match("yes", "Yes")
    assert not livecodebench_env.lines_match("1\n2\n3", "1\n2")


def test_the_last_python_block_is_the_program_else_the_reply():
    reply = "```python\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```"
    assert livecodebench_env.extract_code(reply) == "print(2)"
    assert livecodebench_env.extract_code("print(3)") == "print(3)"


def test_a_program_over_the_per_test_time_limit_fails():
    task = _lcb_tasks()["easy"]
    reward, info = _play_local(task, "```python\nwhile True:\n    pass\n```", timeout_s=0.2)
    assert (reward, info["verdict"]) == (0.0, "test 0: time limit exceeded")


def test_missing_release_file_is_named(tmp_path):
    (tmp_path / "livecodebench").mkdir()
    (tmp_path / "livecodebench" / "test.jsonl").write_text("")
    with pytest.raises(MissingFileError, match=f"needs {tmp_path}/livecodebench/test2.jsonl"):
        rq1.lcb_tasks(tmp_path, samples=1)


def test_livecodebench_scores_inside_the_sandbox_with_its_limits():
    from spade_jax import envs

    limits = tables.SUITE_SETTINGS["livecodebench"].sandbox
    try:
        pool = envs.EnvPool(envs.SandboxConfig(**limits), warm=1)
    except envs.SandboxUnavailable as error:
        pytest.skip(f"no sandbox here: {error}")
    tasks = _lcb_tasks()
    plays = [(tasks["easy"], STDIN_SOLUTION, 1.0), (tasks["easy"], PUBLIC_ONLY, 0.0),
             (tasks["medium"], TWO_SUM, 1.0)]
    try:
        for task, reply, reward in plays:
            first = pool.start(task.code, task.seed, max_turns=task.max_turns)
            assert first.ok, first.error
            result = pool.step(first.handle, reply)
            pool.close(first.handle)
            assert (result.reward, result.terminated) == (reward, True), (task.task_id, result)
    finally:
        pool.shutdown()
