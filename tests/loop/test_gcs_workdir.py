"""Workdirs in a `gs://` bucket: the I/O helpers, the checkpointer, and a tiny run that is
SIGKILLed mid-cycle after its first checkpoint, resumes from the bucket and continues exactly
as an uninterrupted local run: the same metrics, generated environments and play statistics,
cycle by cycle (the reproducibility contract: same config and seed, same run).

The bucket is a local GCS emulator (`tests/gcs_emulator.py` around `gcp-storage-emulator`, a
test extra, with GCS's generation header and preconditions). Every I/O path of
a run is pointed at it: gcsfs (etils.epath: metrics, envs, config.json, TensorBoard events, orbax's
directory handling, JAX's compilation cache) by STORAGE_EMULATOR_HOST, tensorstore (orbax's
array writes) by TENSORSTORE_GCS_HTTP_URL with a fixed test token. The resumed run is also
the second run in that workdir, so it must load compiled programs from the bucket's cache.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from spade_jax.checkpoint import Checkpointer
from spade_jax.metrics import MetricsWriter
from spade_jax.workdir import compile_cache_dir, open_append, write_text_atomic
from tests.commands import ROOT, one_device_xla_flags

BUCKET = "spade-test"
CACHE_LINE = re.compile(r"compilation cache (\S+): (\d+) hits, (\d+) misses")
# Two cycles, a new Designer batch each: the killed run dies in the second, which the resumed
# run then plays from the first one's checkpoint (tiny's plays are multi-turn, so cycle 1
# lasts past the kill).
RUN_ARGS = ["--config.total_cycles=2", "--config.spade.regen_interval=1"]


def start_run(workdir, log, env_extra=None) -> subprocess.Popen:
    """Start launch/train.py on configs/tiny.py with RUN_ARGS on one CPU device; its log goes
    to the file `log` (a pipe could fill up and block it)."""
    with open(log, "w") as handle:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "launch" / "train.py"),
             f"--config={ROOT}/configs/tiny.py", f"--workdir={workdir}", *RUN_ARGS],
            stdout=subprocess.DEVNULL, stderr=handle, cwd=log.parent,
            env={**os.environ, "XLA_FLAGS": one_device_xla_flags(), **(env_extra or {})})


def finish(proc, log) -> str:
    """Wait for a run to succeed; its log."""
    proc.wait(timeout=1200)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    return text


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """(workdir, log) of one uninterrupted local run with its own compilation cache (the
    default, <workdir>/compile_cache, fresh): what the killed-and-resumed run must reproduce."""
    root = tmp_path_factory.mktemp("reference_run")
    workdir, log = root / "reference", root / "reference.log"
    return workdir, finish(start_run(workdir, log), log)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def emulator_env(tmp_path_factory):
    """Environment variables that send every gs:// access of a child process to an emulator."""
    pytest.importorskip("gcp_storage_emulator",
                        reason="gcp-storage-emulator is not installed (pip install -e '.[test]')")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "gcs_emulator.py"), str(port), BUCKET],
        cwd=tmp_path_factory.mktemp("emulator"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("localhost", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"GCS emulator did not start on port {port}") from None
            time.sleep(0.2)
    url = f"http://localhost:{port}"
    yield {
        "STORAGE_EMULATOR_HOST": url,  # gcsfs (and google-cloud-storage)
        "FSSPEC_GCS_TOKEN": "anon",  # gcsfs: no credential lookup against the emulator
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # no bucket-type probe needing credentials
        "TENSORSTORE_GCS_HTTP_URL": url,  # tensorstore's gcs kvstore (orbax's arrays)
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",  # tensorstore: skip credential discovery
    }
    server.kill()
    server.wait()


def bucket_path(*parts):
    """An epath.Path into the emulator's bucket (the test sets the emulator's environment)."""
    from etils import epath

    return epath.Path(f"gs://{BUCKET}").joinpath(*parts)


@pytest.fixture
def bucket(emulator_env, monkeypatch):
    """The emulator's bucket as an epath.Path, with this process's gs:// I/O pointed at it."""
    for name, value in emulator_env.items():
        monkeypatch.setenv(name, value)
    return bucket_path()


def test_the_bucket_keeps_gcs_generation_promises(emulator_env, monkeypatch):
    """What OCDBT commits rely on: a read names the object's generation, and a write
    conditioned on a stale generation is refused (without these, checkpoints fail at random)."""
    for name, value in emulator_env.items():
        monkeypatch.setenv(name, value)
    import tensorstore as ts

    store = ts.KvStore.open({"driver": "gcs", "bucket": BUCKET, "path": "generations/"}).result()
    first = store.write("manifest", b"one").result().generation
    read = store.read("manifest").result()
    assert read.value == b"one" and read.stamp.generation == first
    second = store.write("manifest", b"two", if_equal=first).result().generation
    assert second not in (first, b"")
    stale = store.write("manifest", b"three", if_equal=first).result().generation
    assert stale == b""  # refused: GCS answers 412
    assert store.read("manifest").result().value == b"two"


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_open_append_keeps_what_was_written_before(where, tmp_path, request):
    root = request.getfixturevalue("bucket") / tmp_path.name if where == "bucket" else tmp_path
    root.mkdir(parents=True, exist_ok=True)
    path = root / "log.jsonl"
    for line in ("one\n", "two\n"):  # two writers in turn, as a run and its resumption
        with open_append(path) as handle:
            handle.write(line)
    with open_append(path) as handle:
        handle.write("three\n")
        handle.flush()
        assert path.read_text() == "one\ntwo\nthree\n"
    write_text_atomic(root / "config.json", "{}")
    write_text_atomic(root / "config.json", '{"a": 1}')
    assert (root / "config.json").read_text() == '{"a": 1}'
    assert sorted(p.name for p in root.iterdir()) == ["config.json", "log.jsonl"]


def test_metrics_and_checkpoints_land_in_the_bucket(bucket, tmp_path, monkeypatch):
    import jax.numpy as jnp

    monkeypatch.chdir(tmp_path)
    workdir = str(bucket / "unit")
    for cycle in (0, 1):
        writer = MetricsWriter(workdir)
        writer.write(cycle, {"loss": float(cycle)})
        writer.close()
    lines = (bucket / "unit" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["cycle"] for line in lines] == [0, 1]
    events = list((bucket / "unit" / "tensorboard").iterdir())
    assert len(events) == 2 and all(e.stat().length > 0 for e in events)  # one per writer

    checkpointer = Checkpointer(workdir)
    assert checkpointer.directory == f"{workdir}/checkpoints"
    state = {"w": jnp.arange(6.0)}
    checkpointer.save(1, state, {"cycle": 1})
    checkpointer.close()
    restored, host = Checkpointer(workdir).restore(1, state)
    assert host == {"cycle": 1} and (restored["w"] == state["w"]).all()
    assert (bucket / "unit" / "checkpoints" / "1" / "commit_success.txt").exists()
    assert list(tmp_path.iterdir()) == []  # nothing under <cwd>/gs:


def test_export_reads_a_bucket_workdir_and_writes_a_bucket_directory(bucket, tmp_path):
    """launch/export.py on a workdir in the bucket, writing its HF directory to the bucket,
    gives the same files, byte for byte, as on a local copy of that workdir."""
    import flax.nnx as nnx
    import jax

    from spade_jax.config import load_config_file, parse
    from spade_jax.models.transformer import Transformer
    from spade_jax.rl.trainer import TrainConfig, init_train_state, make_optimizer
    from spade_jax.sharding import make_mesh

    cfg = load_config_file("tiny")
    model = Transformer(parse(cfg).model.arch, rngs=nnx.Rngs(5))
    state = init_train_state(model, make_optimizer(TrainConfig()),
                             make_mesh((1, 1, 1), jax.devices()[:1]))
    local, remote = tmp_path / "run", bucket / tmp_path.name / "run"
    for workdir in (local, remote):
        checkpointer = Checkpointer(str(workdir))
        checkpointer.save(3, state, {"cycle": 3})
        checkpointer.close()
        write_text_atomic(workdir / "config.json", cfg.to_json_best_effort())
    ours, theirs = tmp_path / "hf", bucket / tmp_path.name / "hf"
    for checkpoint, out in ((local / "checkpoints" / "3", ours), (remote, theirs)):
        result = subprocess.run(
            [sys.executable, str(ROOT / "launch" / "export.py"), f"--checkpoint={checkpoint}",
             f"--out={out}"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
            env={**os.environ, "XLA_FLAGS": one_device_xla_flags()})
        assert result.returncode == 0, result.stderr[-3000:]
    names = files_under(ours)
    assert "model.safetensors" in names and files_under(theirs) == names
    for name in names:
        assert (theirs / name).read_bytes() == (ours / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]  # no <cwd>/gs: dir


def test_compile_cache_dir_defaults_to_the_workdir_and_empty_turns_it_off():
    assert compile_cache_dir("gs://b/run", None) == "gs://b/run/compile_cache"
    assert compile_cache_dir("runs/t", None) == "runs/t/compile_cache"
    assert compile_cache_dir("runs/t", "/cache") == "/cache"
    assert compile_cache_dir("runs/t", "") is None


def files_under(directory, prefix="") -> list[str]:
    """Relative paths of the files below `directory`, walked one listing at a time (epath's
    gs:// paths refuse recursive globs)."""
    found = []
    for path in directory.iterdir():
        name = f"{prefix}{path.name}"
        found += files_under(path, f"{name}/") if path.is_dir() else [name]
    return sorted(found)


def cache_counts(stderr: str) -> tuple[str, int, int]:
    match = CACHE_LINE.search(stderr)
    assert match, stderr[-3000:]
    return match.group(1), int(match.group(2)), int(match.group(3))


@pytest.mark.slow  # about 4 min on 2 shared cores: runs in CI
def test_gs_workdir_killed_mid_cycle_resumes_from_the_bucket_exactly(
        tmp_path, emulator_env, bucket, reference_run):
    reference, stderr = reference_run
    _, ref_hits, ref_misses = cache_counts(stderr)
    assert any((reference / "compile_cache").iterdir()) and ref_misses > 0

    workdir = f"gs://{BUCKET}/run"
    committed = bucket / "run" / "checkpoints" / "1" / "commit_success.txt"
    proc = start_run(workdir, tmp_path / "killed.log", env_extra=emulator_env)
    deadline = time.time() + 900
    while not committed.exists():
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.time() < deadline, "checkpoint 1 did not appear in the bucket"
        time.sleep(0.5)
    time.sleep(3)  # into cycle 1
    assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "gs:").exists()  # nothing under <cwd>/gs:/... (the old bug)

    stderr = finish(start_run(workdir, tmp_path / "resumed.log", env_extra=emulator_env),
                    tmp_path / "resumed.log")
    assert "resuming at cycle 1" in stderr, stderr[-3000:]
    cache_dir, hits, _ = cache_counts(stderr)
    # Fewer cycles than the reference, so more hits can only come from the killed run's cache.
    assert cache_dir == f"{workdir}/compile_cache" and hits > ref_hits, (cache_dir, hits)

    ref_rows = {r["cycle"]: r for r in map(json.loads,
                                           (reference / "metrics.jsonl").read_text().splitlines())}
    run = bucket / "run"
    # The killed run logged cycle 0 (perhaps part of cycle 1); the resumed run re-does cycle 1.
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = {r["cycle"]: r for r in map(json.loads, lines)}
    assert sorted(rows) == [0, 1]
    for cycle in (0, 1):
        for key in ("regret/mean", "return/nohint", "return/hint", "train/loss",
                    "designer/attempts", "agent/generated_tokens"):
            if key in ref_rows[cycle]:
                assert rows[cycle][key] == pytest.approx(ref_rows[cycle][key], abs=1e-6), (
                    cycle, key)
    assert (run / "config.json").exists()
    assert any((run / "tensorboard").iterdir())
    # Identical generated environments (code, validation reports, play statistics).
    for cycle in (0, 1):
        ref_dir = reference / "envs" / f"cycle_{cycle:05d}"
        got_dir = run / "envs" / f"cycle_{cycle:05d}"
        ref_files = files_under(ref_dir)
        assert files_under(got_dir) == ref_files
        for name in ref_files:
            assert (got_dir / name).read_text() == (ref_dir / name).read_text(), name
