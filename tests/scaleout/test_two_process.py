"""A real two-process run equals a one-process run.

Two processes on localhost (gloo CPU collectives, 4 fake CPU devices each, mesh (1, 8, 1) over
the 8 global devices) train 2 SPADE cycles of configs/tiny.py; one process with 8 fake devices
does the same. The sampled tokens, the environments' results and the saved checkpoints are
identical, and the one-process checkpoint restores bit-identically in the two-process run
(cross-topology restore).

Float reductions are not bit-identical: gloo's all-reduce adds the 8 devices' partial sums in
another order than XLA's in-process all-reduce, so gradients, losses and log-probs differ in
the last bits (measured: loss 1e-7 relative; after one train step with non-zero advantages, at
most 5e-4 of the largest update of a parameter, on 1-4% of the elements). Hence the tolerances
in `assert_close_metrics` and `assert_close_update`; a real bug (wrong batch shard, missing
gradient all-reduce) moves values by the size of the update itself. (The tiny random model's
own SPADE steps have zero advantages, so their weights change by weight decay only and match
exactly; a probe step on a fixed batch exercises the gradient path.)
A light test runs spade_jax.distributed's host/device helpers on two processes (seconds).
See tests/scaleout/two_process_worker.py for what each process does.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 1800
# Wall-clock metrics differ between runs; everything else must match exactly.
VOLATILE = ("time/", "throughput/")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def worker_env(devices: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPADE_")}
    env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", **extra)
    return env


def launch(out_dir, devices: int, *args, **extra) -> subprocess.Popen:
    """Start one worker (`two_process_worker.py` with `args`), logging to out_dir."""
    args = [sys.executable, "-m", "tests.scaleout.two_process_worker", *map(str, args)]
    log = open(out_dir / f"process{extra.get('SPADE_PROCESS_ID', '0')}.log", "w")  # noqa: SIM115
    return subprocess.Popen(args, cwd=ROOT, env=worker_env(devices, **extra), stdout=log,
                            stderr=subprocess.STDOUT)


def wait_all(procs, out_dir) -> None:
    codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    if any(codes):
        logs = "\n".join(p.read_text()[-3000:] for p in sorted(out_dir.glob("process*.log")))
        pytest.fail(f"worker exit codes {codes}:\n{logs}")


def metrics(out_dir) -> list[dict]:
    lines = (out_dir / "run" / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items()
             if k != "time" and not k.startswith(VOLATILE)} for line in lines]


def load(path) -> dict[str, np.ndarray]:
    with np.load(path) as arrays:
        return {k: arrays[k] for k in arrays.files}


def assert_same_arrays(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def assert_close_metrics(got: dict, want: dict) -> None:
    """Counts exact; float metrics to 1e-5 relative (approx_kl is 0 up to 1e-13 noise)."""
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert np.isclose(got[key], value, rtol=1e-5, atol=1e-9), (key, got[key], value)


def assert_close_update(got: dict, want: dict, before: dict) -> None:
    """Each leaf within 1% of the largest change the step made to that leaf."""
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        step = np.abs(value.astype(np.float64) - before[key]).max()
        error = np.abs(got[key].astype(np.float64) - value).max()
        assert error <= 1e-2 * step, (key, error, step)


def launch_two(out_dir, *args) -> None:
    """Two workers with 4 devices each joined into one run on localhost; waits for both."""
    coordinator = f"localhost:{free_port()}"
    wait_all([launch(out_dir, 4, *args, SPADE_COORDINATOR=coordinator, SPADE_NUM_PROCESSES="2",
                     SPADE_PROCESS_ID=str(i), SPADE_CPU_COLLECTIVES="gloo")
              for i in range(2)], out_dir)


def test_host_device_helpers_across_two_processes(tmp_path):
    launch_two(tmp_path, "helpers")


@pytest.mark.heavy
def test_two_processes_match_one_process(tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    single.mkdir()
    multi.mkdir()
    wait_all([launch(single, 8, "train", single)], single)
    launch_two(multi, "train", multi, single / "run")

    rows, got = metrics(single), metrics(multi)
    assert [r["cycle"] for r in rows] == [r["cycle"] for r in got] == [0, 1]
    for got_row, row in zip(got, rows, strict=True):
        assert_close_metrics(got_row, row)
    saved = load(single / "saved.npz")
    assert_same_arrays(load(multi / "saved.npz"), saved)
    assert_same_arrays(load(multi / "restored.npz"), saved)
    probe = json.loads((single / "probe.json").read_text())
    assert probe["train/grad_norm"] > 0  # the probe really exercises the gradient path
    assert_close_metrics(json.loads((multi / "probe.json").read_text()), probe)
    assert_close_update(load(multi / "probe.npz"), load(single / "probe.npz"), saved)
    # Only process 0 wrote host files (config, metrics); both took part in the checkpoint.
    assert (multi / "run" / "checkpoints" / "2").is_dir()
