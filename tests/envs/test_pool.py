"""EnvPool and load_env: the runtime contract, concurrency, failures as values, gymnasium."""

import math
import time

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from spade_jax.envs import EnvCrashed, load_env
from tests.envs.conftest import case

COUNTER = """
class CounterEnv:
    def __init__(self, max_turns=25):
        self.max_turns = max_turns
    def reset(self, seed=None):
        random.seed(seed)
        self.n, self.goal = 0, random.randint(3, 6)
        self.seen = Counter(); self.q = deque(); self.best = reduce(max, [1, 2])
        print("reset called")
        return "count up", {"goal_hidden": True}
    def step(self, action):
        self.n += 1
        if action == "crash":
            raise ValueError("boom")
        if action == "badtype":
            return 1, 2, 3
        done = self.n >= self.goal
        return f"n={self.n} r={random.random():.6f}", float(done), done, False, {"n": self.n}
    def solution(self):
        return "\\\\boxed{up}" * self.goal
"""


def test_start_step_and_captured_output(pool):
    first = pool.start(COUNTER, seed=5)
    assert first.ok and first.observation == "count up" and first.info == {"goal_hidden": True}
    assert first.output == "reset called\n"
    step = pool.step(first.handle, "go")
    assert step.ok and step.observation.startswith("n=1") and step.info == {"n": 1}
    assert pool.call(first.handle, "solution").value.count("boxed") >= 3
    pool.close(first.handle)


def test_same_seed_same_trajectory_in_fresh_workers(pool):
    a, b = pool.start_many([(COUNTER, 11), (COUNTER, 11)])
    for _ in range(3):
        ra, rb = pool.step_many([(a.handle, "x"), (b.handle, "x")])
        assert ra.observation == rb.observation
    pool.close(a.handle)
    pool.close(b.handle)


def test_failures_are_results_not_exceptions(pool):
    first = pool.start(COUNTER, seed=1)
    crashed = pool.step(first.handle, "crash")
    assert crashed.status == "crashed" and "boom" in crashed.error and crashed.done
    again = pool.step(first.handle, "x")
    assert again.status == "crashed" and "already ended" in again.error
    second = pool.start(COUNTER, seed=1)
    bad = pool.step(second.handle, "badtype")
    assert bad.status == "crashed" and "5-tuple" in bad.error
    assert pool.step(12345678, "x").status == "crashed"
    broken = pool.start("class (", seed=0)
    assert broken.status == "crashed" and "SyntaxError" in broken.error


def test_a_play_past_its_environment_budget_times_out():
    """Each step takes 0.4 s, well inside the 3 s step limit, but the play's 1 s budget for all
    its environment calls runs out by the third step."""
    import dataclasses

    from spade_jax.envs.sandbox import EnvPool
    from tests.envs.conftest import TEST_CONFIG

    slow = COUNTER.replace("        self.n += 1\n",
                           "        self.n += 1\n        __import__('time').sleep(0.4)\n")
    assert slow != COUNTER
    with EnvPool(dataclasses.replace(TEST_CONFIG, play_timeout_s=1.0), warm=1) as budgeted:
        handle = budgeted.start(slow, seed=100).handle
        results = [budgeted.step(handle, "\\boxed{up}") for _ in range(4)]
    statuses = [r.status for r in results]
    assert statuses[:2] == ["ok", "ok"] and "timeout" in statuses, statuses
    timed_out = next(r for r in results if r.status == "timeout")
    assert "sandbox.play_timeout_s" in timed_out.error, timed_out.error


def test_truncation_after_max_turns(pool):
    first = pool.start(case("good_guess"), seed=0, max_turns=3)
    results = [pool.step(first.handle, "\\boxed{5}") for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    pool.close(first.handle)


TURN_LIMITED = """
class TurnLimitedEnv:
    def __init__(self, max_turns=DEFAULT):
        self.max_turns = max_turns
    def reset(self, seed=None):
        self.n = 0
        return "go", {}
    def step(self, action):
        self.n += 1
        return "again", 0.0, False, self.n >= self.max_turns, {}
"""


@pytest.mark.parametrize("game_turns, default, truncated_at", [
    (True, "3", 3),  # the game's own limit (reference respect_game_max_turns)
    (True, "9", 5),  # capped at the pool's
    (True, "None", 5),  # no limit of its own: the pool's
    (False, "3", 5),  # every game gets the pool's
])
def test_a_game_keeps_its_own_turn_limit_with_game_turns(game_turns, default, truncated_at):
    from spade_jax.envs.sandbox import EnvPool
    from tests.envs.conftest import TEST_CONFIG

    code = TURN_LIMITED.replace("DEFAULT", default)
    with EnvPool(TEST_CONFIG, warm=1, max_turns=5, game_turns=game_turns) as limited:
        handle = limited.start(code, seed=0).handle
        results = [limited.step(handle, "x") for _ in range(truncated_at)]
    assert [r.truncated for r in results] == [False] * (truncated_at - 1) + [True]


def test_many_concurrent_episodes_in_completion_order(pool):
    starts = pool.start_many([(case("good_guess"), seed) for seed in range(24)])
    assert all(s.ok for s in starts)
    pairs = [(s.handle, "\\boxed{500}") for s in starts]
    results = list(pool.iter_step_many(pairs))
    assert sorted(r.handle for r in results) == sorted(h for h, _ in pairs)
    assert all(r.ok for r in results)
    ordered = pool.step_many(pairs)
    assert [r.handle for r in ordered] == [h for h, _ in pairs]
    for s in starts:
        pool.close(s.handle)


def test_steps_in_the_background_come_back_as_they_finish(pool):
    fast, slow, fast2 = pool.start_many([(case("slow_counter"), seed) for seed in (0, 1, 2)])
    submitted = time.monotonic()
    pool.submit_steps([(h.handle, "one") for h in (fast, slow, fast2)])
    with pytest.raises(ValueError, match="already have a step submitted"):
        pool.submit_steps([(slow.handle, "two")])
    with pytest.raises(ValueError, match="has a step in the background"):
        pool.step(slow.handle, "two")
    arrived = {}
    while pool.steps_outstanding:  # the caller is free between collections
        for result in pool.collect_steps(wait_s=math.inf):
            arrived[result.handle] = (result, time.monotonic() - submitted)
    assert list(arrived)[-1] == slow.handle and all(r.ok for r, _ in arrived.values())
    assert arrived[slow.handle][1] >= 1.0 > max(arrived[h.handle][1] for h in (fast, fast2))
    # the grace waits for steps submitted less than fresh_s ago, not for older ones
    pool.submit_steps([(slow.handle, "two")])
    time.sleep(0.1)
    pool.submit_steps([(fast.handle, "two")])
    got = pool.collect_steps(fresh_s=0.5)
    assert [r.handle for r in got] == [fast.handle] and pool.steps_outstanding == 1
    assert [r.observation for r in pool.collect_steps(fresh_s=math.inf)] == [
        "turn 2 done; say the next number."]
    # closing an episode forgets its submitted step
    pool.submit_steps([(fast2.handle, "two")])
    for h in (fast, slow, fast2):
        pool.close(h.handle)
    assert pool.steps_outstanding == 0 and pool.collect_steps(wait_s=math.inf) == []


def test_load_env_passes_gymnasium_check_env(pool):
    env = load_env(case("good_guess"), max_turns=25, pool=pool)
    assert isinstance(env, gymnasium.Env)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=4)
    assert "Guess" in obs
    for _ in range(25):
        obs, reward, terminated, truncated, info = env.step("\\boxed{5}")
        if terminated or truncated:
            break
    assert truncated and not terminated
    env.close()


def test_load_env_rejects_broken_code(pool):
    with pytest.raises(EnvCrashed, match="SyntaxError"):
        load_env("class BrokenEnv(:\n", pool=pool)
    with pytest.raises(EnvCrashed, match="exactly one"):
        load_env("class AEnv: pass\nclass BEnv: pass\n", pool=pool)


def test_load_env_step_crash_ends_episode(pool):
    env = load_env(COUNTER, pool=pool)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("crash")
    assert truncated and info["status"] == "crashed"
    env.close()
