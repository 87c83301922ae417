"""Sandbox benchmark: start latency, step round trip and throughput vs two baselines.

Baselines measured in the same run: in-process exec of the same environment (what the
reference does, no isolation) and a fresh `python -c` subprocess per call (no warm worker).
Usage: python bench/sandbox.py [--envs 64] [--steps 2000]
"""

import argparse
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from spade_jax.envs.sandbox import EnvPool, SandboxConfig  # noqa: E402
from spade_jax.envs.sandbox.injected import build_namespace  # noqa: E402

CODE = (pathlib.Path(__file__).resolve().parents[1] / "tests/envs/cases/good_guess.py").read_text()
ACTION = "\\boxed{500}"


def in_process_env(seed: int):
    namespace = build_namespace()
    exec(CODE, namespace)
    env = namespace["GuessNumberEnv"](max_turns=25)
    env.reset(seed=seed)
    return env


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    pool = EnvPool(SandboxConfig(), warm=8, max_turns=10**9, max_concurrent_calls=args.envs)
    print(f"layers: {pool.layers.describe()}")

    cold = []
    for _ in range(5):
        started = time.perf_counter()
        cold_pool = EnvPool(SandboxConfig(), warm=0)
        result = cold_pool.start(CODE, seed=0)
        cold.append(time.perf_counter() - started)
        cold_pool.shutdown()
        if not result.ok:
            raise SystemExit(f"error: the sandbox did not start the environment: {result}")
    time.sleep(2.0)  # let the warm pool finish booting
    warm = []
    for i in range(8):
        started = time.perf_counter()
        result = pool.start(CODE, seed=i)
        warm.append(time.perf_counter() - started)
        pool.close(result.handle)
        time.sleep(0.3)
    started = time.perf_counter()
    in_process_env(0)
    inproc_start = time.perf_counter() - started
    print(f"start: cold {statistics.median(cold) * 1e3:.1f} ms, "
          f"warm {statistics.median(warm) * 1e3:.1f} ms (min {min(warm) * 1e3:.1f}); "
          f"in-process {inproc_start * 1e3:.2f} ms")

    handle = pool.start(CODE, seed=1).handle
    rtts = []
    for _ in range(args.steps):
        started = time.perf_counter()
        pool.step(handle, ACTION)
        rtts.append(time.perf_counter() - started)
    env = in_process_env(1)
    started = time.perf_counter()
    for _ in range(args.steps):
        env.step(ACTION)
    inproc_step = (time.perf_counter() - started) / args.steps
    subproc = []
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        subproc.append(time.perf_counter() - started)
    med = statistics.median(rtts)
    fresh = statistics.median(subproc)
    print(f"step round trip: median {med * 1e6:.0f} us, p99 {percentile(rtts, 0.99) * 1e6:.0f} us; "
          f"in-process {inproc_step * 1e6:.1f} us ({med / inproc_step:.0f}x); "
          f"fresh python -c per call {fresh * 1e3:.1f} ms ({fresh / med:.0f}x the sandbox step)")
    pool.close(handle)

    starts = pool.start_many([(CODE, seed) for seed in range(args.envs)])
    handles = [s.handle for s in starts if s.ok]
    time.sleep(2.0)  # steady state: let the warm refill finish booting (starts are timed above)
    rounds = max(1, args.steps // 50)
    started = time.perf_counter()
    for _ in range(rounds):
        pool.step_many([(h, ACTION) for h in handles])
    elapsed = time.perf_counter() - started
    steps_per_s = rounds * len(handles) / elapsed
    envs = [in_process_env(seed) for seed in range(args.envs)]
    started = time.perf_counter()
    for _ in range(rounds):
        for e in envs:
            e.step(ACTION)
    inproc_rate = rounds * len(envs) / (time.perf_counter() - started)
    print(f"{len(handles)} concurrent envs: {steps_per_s:,.0f} steps/s "
          f"(in-process {inproc_rate:,.0f} steps/s, ratio {inproc_rate / steps_per_s:.0f}x)")
    for h in handles:
        pool.close(h)

    episodes, started = 0, time.perf_counter()
    while time.perf_counter() - started < 5.0:
        batch = pool.start_many([(CODE, seed) for seed in range(16)])
        for _ in range(10):
            pool.step_many([(s.handle, ACTION) for s in batch])
        for s in batch:
            pool.close(s.handle)
        episodes += len(batch)
    rate = episodes / (time.perf_counter() - started)
    print(f"episodes (start + 10 steps + close, 16 at a time): {rate:.1f} episodes/s")
    pool.shutdown()


if __name__ == "__main__":
    main()
