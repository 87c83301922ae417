"""Multi-host rollouts: each host runs the environments of its own rows, all see every result.

Two `ShardedEnvRunner`s stand for two processes (threads here, each with its own sandbox pool;
`allgather_json` is replaced by an exchange between the threads). They must return exactly what
one `SandboxEnvRunner` returns for the whole batch, while each pool only ever held its rows.
The same runner across real processes (gloo) is exercised by tests/scaleout/test_two_process.py.
"""

import json
import threading

from spade_jax.envs import EnvPool
from spade_jax.spade.envrunner import SandboxEnvRunner, ShardedEnvRunner
from spade_jax.spade.rollout import EpisodeSpec
from tests.envs.conftest import TEST_CONFIG, case

CODE = case("good_guess")
SPECS = [EpisodeSpec("guess", CODE, seed) for seed in range(5)]
GUESSES = ["\\boxed{500}", "nonsense", "\\boxed{250}"]


class Exchange:
    """allgather_json between threads: every rank gets every rank's value, in rank order."""

    def __init__(self, ranks: int):
        self.barrier = threading.Barrier(ranks, timeout=60)
        self.slots = [None] * ranks

    def gather_for(self, rank: int):
        def gather(value):
            self.slots[rank] = json.loads(json.dumps(value))
            self.barrier.wait()
            values = list(self.slots)
            self.barrier.wait()
            return values
        return gather


def play(runner, record=None):
    """Reset every spec, step all live episodes with the same guesses, close; what was seen."""
    starts = runner.reset_many(SPECS)
    seen = [[(s.ok, s.status, s.observation, s.hint) for s in starts]]
    handles = [s.handle for s in starts]
    for guess in GUESSES:
        results = runner.step_many([(h, guess) for h in handles])
        seen.append([(r.status, r.observation, r.reward, r.terminated, r.truncated)
                     for r in results])
        if record is not None:
            record.append(len(runner.local.pool._episodes))
    runner.close_many(handles)
    return seen


def test_two_hosts_see_what_one_host_sees_while_each_runs_only_its_rows():
    with EnvPool(TEST_CONFIG, warm=2, max_turns=10) as pool:
        want = play(SandboxEnvRunner(pool, 10))

    exchange, seen, live = Exchange(2), [None, None], [[], []]
    pools = [EnvPool(TEST_CONFIG, warm=2, max_turns=10) for _ in range(2)]
    runners = [ShardedEnvRunner(SandboxEnvRunner(pools[r], 10), r, 2,
                                gather=exchange.gather_for(r)) for r in range(2)]
    errors = []

    def host(rank):
        try:
            seen[rank] = play(runners[rank], live[rank])
        except Exception as err:  # surfaced below, with the other thread released
            errors.append(err)
            exchange.barrier.abort()

    threads = [threading.Thread(target=host, args=(r,)) for r in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        for p in pools:
            p.shutdown()
    assert not errors, errors
    assert seen[0] == seen[1] == want
    # rows 0, 2, 4 live on host 0 and rows 1, 3 on host 1, for as long as they are open
    assert live == [[3] * len(GUESSES), [2] * len(GUESSES)]
    assert all(not r._local_handles for r in runners)  # every episode closed by its owner

