"""One process of the multi-host tests (tests/scaleout/test_two_process.py).

    python -m tests.scaleout.two_process_worker helpers
    python -m tests.scaleout.two_process_worker train OUT_DIR [RESTORE_FROM]

Joins a multi-process run when SPADE_COORDINATOR / SPADE_NUM_PROCESSES / SPADE_PROCESS_ID are
set (otherwise runs alone). `helpers` checks the host/device helpers of spade_jax.distributed
on the global mesh and the sharded episode runner (seconds). `train`, on configs/tiny.py (2 cycles):
  1. with RESTORE_FROM, restores that workdir's newest checkpoint onto this run's mesh and dumps
     it (`restored.npz`): cross-topology restore;
  2. trains 2 cycles into OUT_DIR/run and dumps the final checkpoint read back (`saved.npz`);
  3. probes the gradient path, which a random tiny model leaves idle (all its returns are 0, so
     every advantage is 0 and the SPADE steps change the weights by weight decay only): one
     train step on a fixed batch with non-zero advantages; dumps its metrics (`probe.json`) and
     the weights after it (`probe.npz`).
Every process takes part in every step (checkpointing and the gathers are collective); only
process 0 writes the dumps.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np

from spade_jax import distributed
from spade_jax.checkpoint import Checkpointer
from spade_jax.config import load_config_file, parse
from spade_jax.spade.batch import TrainSample
from spade_jax.spade.driver import run_training
from spade_jax.spade.runtime import Runtime


def dump(state, path: str) -> None:
    """Every leaf of `state` gathered to the host, saved as `path` (npz) by process 0."""
    leaves = jax.tree_util.tree_leaves_with_path(state)
    arrays = {jax.tree_util.keystr(key): distributed.to_host(x) for key, x in leaves}
    if distributed.is_main_process():
        np.savez(path, **arrays)


def restore_newest(workdir: str, rt: Runtime):
    checkpointer = Checkpointer(workdir)
    state, _ = checkpointer.restore(checkpointer.latest_step(), rt.device_state())
    checkpointer.close()
    return state


def probe_samples(n: int = 8, length: int = 24) -> list[TrainSample]:
    rng = np.random.RandomState(0)
    samples = []
    for i in range(n):
        mask = np.arange(length) >= length // 2
        samples.append(TrainSample(
            rng.randint(0, 1000, length).astype(np.int32), mask,
            np.where(mask, -5.0 + rng.rand(length), 0.0).astype(np.float32),
            float(rng.randn()), "agent" if i % 2 else "designer"))
    return samples


def check_helpers() -> None:
    """Host data -> global array -> jit -> host, on every process; divergence is caught."""
    from jax.sharding import NamedSharding, PartitionSpec

    from spade_jax.sharding import make_mesh

    mesh = make_mesh((1, jax.device_count(), 1))
    batch_sharding = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None))
    host = np.arange(4 * jax.device_count() * 3, dtype=np.int32).reshape(-1, 3)
    sharded = jax.device_put(host, batch_sharding)
    assert not sharded.is_fully_addressable
    doubled = jax.jit(lambda a: 2 * a, out_shardings=batch_sharding)(sharded)
    np.testing.assert_array_equal(distributed.to_host(doubled), 2 * host)
    total = jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(mesh, PartitionSpec()))(sharded)
    assert int(distributed.to_host(total)) == int(host.sum())
    distributed.assert_same_on_all_processes({"x": host}, "the host data")
    try:
        distributed.assert_same_on_all_processes({"x": host + jax.process_index()}, "x")
    except AssertionError:
        check_sharded_episodes()
        return
    raise AssertionError("diverged host data went unnoticed")


def check_sharded_episodes() -> None:
    """Each process runs only its rows' environments; every process sees every result."""
    from spade_jax.envs import EnvPool
    from spade_jax.envs.seeds import list_seed_envs
    from spade_jax.spade.envrunner import SandboxEnvRunner, ShardedEnvRunner
    from spade_jax.spade.rollout import EpisodeSpec

    rank, count = jax.process_index(), jax.process_count()
    parts = distributed.allgather_json({"rank": rank, "text": "é" * (rank + 1)})
    assert parts == [{"rank": r, "text": "é" * (r + 1)} for r in range(count)], parts
    seed_env = list_seed_envs()[0]
    specs = [EpisodeSpec(seed_env.name, seed_env.code, seed) for seed in range(6)]
    with EnvPool(warm=1, max_turns=5) as pool:
        runner = ShardedEnvRunner(SandboxEnvRunner(pool, 5), rank, count)
        starts = runner.reset_many(specs)
        assert len(pool._episodes) == len(range(rank, len(specs), count))
        results = runner.step_many([(s.handle, "\\boxed{1}") for s in starts])
        runner.close_many([s.handle for s in starts])
        assert not pool._episodes
    assert all(s.ok for s in starts) and all(r.ok for r in results), (starts, results)
    seen = json.dumps([[s.observation for s in starts], [r.observation for r in results],
                       [r.reward for r in results]])
    distributed.assert_same_on_all_processes(
        {"episodes": np.frombuffer(seen.encode(), np.uint8)}, "the sharded episodes")


def train(out_dir: str, restore_from: str | None = None) -> None:
    cfg = load_config_file("tiny")
    rt = Runtime.create(parse(cfg))
    try:
        if restore_from:
            dump(restore_newest(restore_from, rt), os.path.join(out_dir, "restored.npz"))
        workdir = os.path.join(out_dir, "run")
        run_training(cfg, workdir, runtime=rt)
        dump(restore_newest(workdir, rt), os.path.join(out_dir, "saved.npz"))
        metrics = rt.train(probe_samples())
        dump(rt.device_state(), os.path.join(out_dir, "probe.npz"))
        if distributed.is_main_process():
            with open(os.path.join(out_dir, "probe.json"), "w", encoding="utf-8") as f:
                json.dump(metrics, f)
    finally:
        rt.close()


if __name__ == "__main__":
    distributed.initialize_from_environment()
    if sys.argv[1] == "helpers":
        check_helpers()
    else:
        train(*sys.argv[2:])
