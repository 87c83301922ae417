"""BFCL multi-turn through our env: ground-truth replay is valid, broken scripts fail."""

import json

import pytest

pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval (see docs/DESIGN.md §7)")

from spade_jax.envs.contract import solution_actions
from spade_jax.eval import bfcl  # noqa: E402
from spade_jax.eval.tasks import replay_actions  # noqa: E402


def _replay(task, actions=None):
    env = task.make_local()
    env.reset(seed=0)
    actions = solution_actions(env.solution()) if actions is None else actions
    episode_return, terminated, info = replay_actions(env, 0, actions)
    env.close()
    return episode_return, terminated, info


@pytest.fixture(scope="module")
def first_tasks():
    return {c: bfcl.bfcl_tasks([c], limit=3) for c in bfcl.CATEGORIES}


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_ground_truth_replay_is_valid(first_tasks, category):
    for task in first_tasks[category]:
        episode_return, terminated, info = _replay(task)
        assert (episode_return, terminated, info["valid"]) == (1.0, True, True), info


def _drop_one_call(actions):
    """The script without its first call (solution blocks hold a turn's calls as a list)."""
    index = next(i for i, action in enumerate(actions) if action.startswith("<tool_call>"))
    payload = json.loads(actions[index].removeprefix("<tool_call>").removesuffix("</tool_call>"))
    calls = payload[1:] if isinstance(payload, list) else []
    if not calls:
        return actions[:index] + actions[index + 1 :]
    return [*actions[:index], f"<tool_call>{json.dumps(calls)}</tool_call>", *actions[index + 1 :]]


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_dropping_one_call_fails(first_tasks, category):
    task = first_tasks[category][0]
    env = task.make_local()
    env.reset(seed=0)
    episode_return, terminated, info = _replay(
        task, _drop_one_call(solution_actions(env.solution()))
    )
    assert (episode_return, terminated, info["valid"]) == (0.0, True, False)
    assert info["error_type"].startswith("multi_turn:")


def test_python_call_syntax_is_accepted(first_tasks):
    task = first_tasks["multi_turn_base"][1]
    actions = []
    for calls in task.make_local().ground_truth:
        if calls:
            actions.append("[" + ", ".join(calls) + "]")
        actions.append("All done.")
    assert _replay(task, actions)[0] == 1.0


def test_turns_advance_and_held_out_functions_arrive_at_their_turn(first_tasks):
    task = first_tasks["multi_turn_miss_func"][0]
    env = task.make_local()
    first, _ = env.reset(seed=0)
    [(held_out_turn, names)] = {
        turn: [doc["name"] for doc in docs] for turn, docs in env.entry["missed_function"].items()
    }.items()
    assert all(f'"name": "{name}"' not in first for name in names)
    observations = [first]
    for turn in range(int(held_out_turn)):
        observation, reward, terminated, _, info = env.step("<answer>nothing to do</answer>")
        assert (reward, terminated, info["turn"]) == (0.0, False, turn + 1)
        observations.append(observation)
    assert all(f'"name": "{name}"' in observations[-1] for name in names)
    assert "I have updated some more functions" in observations[-1]


def test_backend_state_is_per_entry_and_carried_across_turns(first_tasks):
    task = first_tasks["multi_turn_base"][0]
    env_a, env_b = task.make_local(), task.make_local()
    env_a.reset(seed=0)
    env_b.reset(seed=0)
    call = '<tool_call>{"name": "mkdir", "arguments": {"dir_name": "only_in_a"}}</tool_call>'
    env_a.step(call)
    env_a.step("<answer>ok</answer>")  # next user turn: state must survive
    listing = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    assert "only_in_a" in env_a.step(listing)[0]
    assert "only_in_a" not in env_b.step(listing)[0]
    env_a.close()
    env_b.close()


def test_bad_tool_calls_get_error_feedback_and_step_limit_fails(first_tasks):
    task = first_tasks["multi_turn_base"][0]
    env = task.make_local(step_limit=2)
    env.reset(seed=0)
    bad = '<tool_call>{"name": "__import__(\'os\').system", "arguments": {}}</tool_call>'
    observation, reward, terminated, _, _ = env.step(bad)
    assert "invalid tool call" in observation and not terminated
    assert not env.step("<tool_call>not json</tool_call>")[2]
    _, reward, terminated, _, info = env.step(bad)
    assert (reward, terminated, info["error_type"]) == (0.0, True, "multi_turn:force_terminated")


def test_close_releases_backend_instances(first_tasks):
    task = first_tasks["multi_turn_base"][0]
    env = task.make_local()
    env.reset(seed=0)
    cache = vars(env.bfcl["utils"])
    assert any(key.startswith(env.run_id) for key in cache)
    env.close()
    assert not any(key.startswith(env.run_id) for key in cache)


def test_overall_accuracy_is_unweighted_mean():
    assert bfcl.overall_accuracy({"a": 1.0, "b": 0.5, "c": 0.0, "d": 0.5}) == 0.5


@pytest.mark.slow
def test_ground_truth_replay_scores_800_of_800_and_dropping_a_call_fails():
    tasks = bfcl.bfcl_tasks()
    assert len(tasks) == 800
    invalid, still_valid = [], []
    for task in tasks:
        env = task.make_local()
        env.reset(seed=0)
        actions = solution_actions(env.solution())
        env.close()
        if _replay(task, actions)[0] != 1.0:
            invalid.append(task.task_id)
        if _replay(task, _drop_one_call(actions))[0] != 0.0:
            still_valid.append(task.task_id)
    assert invalid == []
    assert still_valid == []
