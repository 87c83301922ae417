"""Shared fixtures: the tiny config, one Runtime for the in-process loop tests, and one
uninterrupted launch/train.py run that the killed-and-resumed runs are compared with."""

import os
import pathlib
import subprocess
import sys

import pytest

from spade_jax.config import load_config_file, parse
from tests.commands import one_device_xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The runs of test_resume.py and test_gcs_workdir.py: three cycles, a new Designer batch each.
RUN_ARGS = ["--config.total_cycles=3", "--config.spade.regen_interval=1"]


@pytest.fixture(scope="session")
def tiny_runtime():
    """On one CPU device: these tests are not about sharding (tests/loop/pin.py's run and
    tests/scaleout/ use the 8 fake devices), and 8 would make them several times slower."""
    import jax

    from spade_jax.spade.runtime import Runtime

    rt = Runtime.create(parse(load_config_file("tiny"), 1), jax.devices()[:1])
    yield rt
    rt.close()


def start_run(workdir, log, *extra, env_extra=None) -> subprocess.Popen:
    """Start launch/train.py on configs/tiny.py with RUN_ARGS on one CPU device; its log goes
    to the file `log` (a pipe could fill up and block it)."""
    with open(log, "w") as handle:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "launch" / "train.py"),
             f"--config={ROOT}/configs/tiny.py", f"--workdir={workdir}", *RUN_ARGS, *extra],
            stdout=subprocess.DEVNULL, stderr=handle, cwd=log.parent,
            env={**os.environ, "XLA_FLAGS": one_device_xla_flags(), **(env_extra or {})})


def finish(proc, log) -> str:
    """Wait for a run to succeed; its log."""
    proc.wait(timeout=1200)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    return text


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> tuple[pathlib.Path, str]:
    """(workdir, log) of one uninterrupted run with its own compilation cache (the default,
    <workdir>/compile_cache, fresh): what every killed-and-resumed run must reproduce."""
    root = tmp_path_factory.mktemp("reference_run")
    workdir, log = root / "reference", root / "reference.log"
    return workdir, finish(start_run(workdir, log), log)
