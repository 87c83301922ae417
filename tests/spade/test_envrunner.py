"""Multi-host rollouts: each host runs the environments of its own rows, all see every result.

Two `ShardedEnvRunner`s stand for two processes (threads here, each with its own sandbox pool;
`allgather_json` is replaced by an exchange between the threads). They must return exactly what
one `SandboxEnvRunner` returns for the whole batch, while each pool only ever held its rows.
The same runner across real processes (gloo) is exercised by tests/scaleout/test_two_process.py.
"""

import math
import random

from spade_jax.envs import EnvPool
from spade_jax.spade.envrunner import ENV_HINT, SandboxEnvRunner, ShardedEnvRunner
from spade_jax.spade.rollout import EpisodeSpec
from tests.envs.conftest import TEST_CONFIG, case
from tests.exchange import run_as_processes

CODE = case("good_guess")


def target(seed: int) -> int:
    """The hidden number of good_guess for `seed` (its reset: random.seed, randint(10, 999))."""
    random.seed(seed)
    return random.randint(10, 999)


HINTED = [EpisodeSpec("guess", CODE, 0, hint=f"The number is {target(0)}."),  # leaks: dropped
          EpisodeSpec("guess", CODE, 1, hint="Start in the middle."),
          EpisodeSpec("guess", CODE, 2, hint=ENV_HINT)]  # good_guess has no hint()
SPECS = [EpisodeSpec("guess", CODE, seed) for seed in range(5)] + HINTED
GUESSES = ["\\boxed{500}", "nonsense", "\\boxed{250}"]


def play(runner, record=None):
    """Reset every spec, step all live episodes with the same guesses, close; what was seen."""
    starts = runner.reset_many(SPECS)
    seen = [[(s.ok, s.status, s.observation, s.hint, s.hint_status) for s in starts]]
    handles = [s.handle for s in starts]
    for guess in GUESSES:
        results = runner.step_many([(h, guess) for h in handles])
        seen.append([(r.status, r.observation, r.reward, r.terminated, r.truncated)
                     for r in results])
        if record is not None:
            record.append(len(runner.local.pool._episodes))
    runner.close_many(handles)
    return seen


def play_in_background(runner, collected=None):
    """`play`, with each round's steps submitted at once and collected as they come back."""
    starts = runner.reset_many(SPECS)
    seen = [[(s.ok, s.status, s.observation, s.hint, s.hint_status) for s in starts]]
    handles = [s.handle for s in starts]
    for guess in GUESSES:
        runner.submit_steps([(h, guess) for h in handles])
        results = []
        while len(results) < len(handles):
            batch = runner.collect_steps(fresh_s=0.0, wait_s=math.inf)
            results += batch
            if collected is not None:
                collected.append([r.handle for r in batch])
        results.sort(key=lambda r: handles.index(r.handle))
        seen.append([(r.status, r.observation, r.reward, r.terminated, r.truncated)
                     for r in results])
    runner.close_many(handles)
    return seen


def test_steps_collected_in_the_background_are_the_same_on_every_host():
    with EnvPool(TEST_CONFIG, warm=2, max_turns=10) as pool:
        want = play(SandboxEnvRunner(pool, 10))
        assert play_in_background(SandboxEnvRunner(pool, 10)) == want
    pools = [EnvPool(TEST_CONFIG, warm=2, max_turns=10) for _ in range(2)]

    def host(rank, gather):
        runner = ShardedEnvRunner(SandboxEnvRunner(pools[rank], 10), rank, 2, gather=gather)
        collected = []
        return play_in_background(runner, collected), collected

    try:
        (seen0, collected0), (seen1, collected1) = run_as_processes(2, host)
    finally:
        for p in pools:
            p.shutdown()
    assert seen0 == seen1 == want
    assert collected0 == collected1  # every collection returned the same steps on both hosts


def test_two_hosts_see_what_one_host_sees_while_each_runs_only_its_rows():
    with EnvPool(TEST_CONFIG, warm=2, max_turns=10) as pool:
        want = play(SandboxEnvRunner(pool, 10))
    assert [start[3:] for start in want[0]] == [(None, "")] * 5 + [
        (None, "leak"), ("Start in the middle.", "ok"), (None, "empty")]

    pools = [EnvPool(TEST_CONFIG, warm=2, max_turns=10) for _ in range(2)]
    runners = [None, None]

    def host(rank, gather):
        runners[rank] = ShardedEnvRunner(SandboxEnvRunner(pools[rank], 10), rank, 2, gather=gather)
        live = []
        return play(runners[rank], live), live

    try:
        (seen0, live0), (seen1, live1) = run_as_processes(2, host)
    finally:
        for p in pools:
            p.shutdown()
    seen, live = [seen0, seen1], [live0, live1]
    assert seen[0] == seen[1] == want
    # even rows live on host 0 and odd rows on host 1, for as long as they are open
    assert live == [[4] * len(GUESSES), [4] * len(GUESSES)]
    assert all(not r._local_handles for r in runners)  # every episode closed by its owner

