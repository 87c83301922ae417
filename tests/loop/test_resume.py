"""A run killed with SIGKILL mid-cycle resumes from its last checkpoint and continues exactly.

Also the reproducibility contract: the same config and seed give the same episode seeds,
generated environments and regrets (the killed-and-resumed run is compared with an
uninterrupted one, cycle by cycle).
"""

import json
import signal
import time

import pytest

from tests.loop.conftest import finish, start_run

pytestmark = pytest.mark.slow  # two launch/train.py runs (and the shared reference): runs in CI


def metrics(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def wait_for(path, timeout):
    deadline = time.time() + timeout
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(0.5)


def test_sigkill_mid_cycle_resumes_exactly(tmp_path, reference_run):
    reference, _ = reference_run
    # The reference's compiled programs: the same programs, loaded instead of compiled again.
    cache = f"--compile_cache_dir={reference / 'compile_cache'}"
    killed = tmp_path / "killed"
    proc = start_run(killed, tmp_path / "killed.log", cache)
    wait_for(killed / "checkpoints" / "1", timeout=900)
    time.sleep(3)  # into cycle 1
    assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (killed / "checkpoints" / "1").is_dir()
    finish(start_run(killed, tmp_path / "resumed.log", cache), tmp_path / "resumed.log")

    ref_rows = {r["cycle"]: r for r in metrics(reference)}
    # The killed run may have logged part of cycle 1 before dying; the resumed run re-does it.
    resumed_rows = {r["cycle"]: r for r in metrics(killed)}
    assert sorted(resumed_rows) == [0, 1, 2]
    for cycle in (0, 1, 2):
        for key in ("regret/mean", "return/nohint", "return/hint", "train/loss",
                    "designer/attempts", "agent/generated_tokens"):
            if key in ref_rows[cycle]:
                assert resumed_rows[cycle][key] == pytest.approx(ref_rows[cycle][key],
                                                                 abs=1e-6), (cycle, key)
    # Identical generated environments (files) and played statistics in both runs.
    for cycle in (0, 1, 2):
        ref_dir = reference / "envs" / f"cycle_{cycle:05d}"
        got_dir = killed / "envs" / f"cycle_{cycle:05d}"
        ref_files = sorted(p.relative_to(ref_dir) for p in ref_dir.rglob("*") if p.is_file())
        got_files = sorted(p.relative_to(got_dir) for p in got_dir.rglob("*") if p.is_file())
        assert ref_files == got_files
        for rel in ref_files:
            assert (ref_dir / rel).read_text() == (got_dir / rel).read_text(), rel
