"""--config.logging.wandb=True: metrics also go to a Weights & Biases run (WANDB_MODE=offline)."""

import json
import time

import pytest

pytest.importorskip("wandb")

from spade_jax.config import LoggingConfig, load_config_file, parse  # noqa: E402
from spade_jax.metrics import WANDB_ID_FILE, MetricsWriter  # noqa: E402


def test_config_flag_turns_wandb_on():
    cfg = load_config_file("tiny")
    assert parse(cfg).logging == LoggingConfig(wandb=False)
    cfg.logging.wandb = True
    cfg.logging.wandb_project = "proj"
    assert parse(cfg).logging == LoggingConfig(wandb=True, wandb_project="proj")


def test_metrics_reach_an_offline_wandb_run_resumed_by_its_workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    workdir = tmp_path / "run"
    writer = MetricsWriter(str(workdir), logging=LoggingConfig(wandb=True),
                           config={"spade_probe_seed": 7})
    writer.write(0, {"spade_probe/first": 1234.5, "spade_probe/not_finite": float("nan")})
    writer.write(1, {"spade_probe/first": 6789.25})
    writer.close()
    run_id = (workdir / WANDB_ID_FILE).read_text().strip()
    (log,) = (workdir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    needles = (b"spade_probe/first", b"1234.5", b"6789.25", b"spade_probe_seed")
    deadline = time.monotonic() + 60  # W&B's service may still be writing after finish()
    while not all(n in log.read_bytes() for n in needles) and time.monotonic() < deadline:
        time.sleep(0.5)
    data = log.read_bytes()
    for needle in needles:
        assert needle in data, needle
    assert b"not_finite" not in data  # non-finite values are not sent
    assert [json.loads(line)["spade_probe/first"]
            for line in (workdir / "metrics.jsonl").read_text().splitlines()] == [1234.5, 6789.25]

    # W&B names an offline run's directory by its start time to the second: a resumed run
    # started within the first run's second would share its directory.
    time.sleep(1.1)
    MetricsWriter(str(workdir), logging=LoggingConfig(wandb=True)).close()  # a resumed run
    assert len(list((workdir / "wandb").glob(f"offline-run-*-{run_id}"))) == 2


def test_without_wandb_installed_the_error_says_how_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install -e \.\[wandb\]"):
        MetricsWriter(str(tmp_path), logging=LoggingConfig(wandb=True))
