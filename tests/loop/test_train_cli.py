"""The commands on bad input: an error saying what to change, no traceback, nothing written."""

import subprocess
import sys

import gguf
import pytest

from spade_jax.errors import WorkdirError
from spade_jax.workdir import check_writable
from tests.commands import ROOT


@pytest.mark.parametrize("override, message", [
    ("--config.corpus.source=jsonl:/nonexistent/corpus.jsonl", "not found"),
    ("--config.spade.plays_per_env=1000000", "the Agent's plays do not fit in memory"),
    ("--config.spade.reward_variant=best", "spade.reward_variant='best'"),
    ("--config.seed=-1", "seed=-1: use an integer in [0, 2147483647]"),
    ("--config.seed=2147483648", "seed=2147483648: use an integer in [0, 2147483647]"),
    ("--config.seed=1.5", "--config.seed=1.5"),  # refused by the flag parser
    ("--config.seed=abc", "--config.seed=abc"),
    ("--config.sampling.agent_temperature=-1", "agent_temperature=-1.0 must be >= 0 (0: greedy)"),
])
def test_bad_input_is_one_clear_error(tmp_path, override, message):
    assert_one_clear_error(tmp_path, override, message)


def test_gguf_without_tokenizer_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    writer = gguf.GGUFWriter(str(bad), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert_one_clear_error(tmp_path, f"--config.model.tokenizer={bad}",
                           f"{bad} has no tokenizer: its metadata lacks tokenizer.ggml.model")


def test_a_workdir_under_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    workdir = tmp_path / "file" / "run"
    assert_one_clear_error(tmp_path, f"--workdir={workdir}",
                           f"{workdir}: {tmp_path / 'file'} is a file, not a directory")


def test_bad_in_loop_eval_suites_are_one_clear_error_before_the_model_loads(tmp_path):
    assert_one_clear_error(tmp_path, "--config.eval.every=1", "eval: unknown eval suites",
                           "--config.eval.suites=games,bogus",
                           "--config.model.tokenizer=/no/such/tokenizer")


@pytest.mark.parametrize("pool, message", [
    (None, "no .py environment files there"),  # an empty directory
    ("reasoning_gym:chain_sum,bogus", "unknown reasoning-gym categories ['bogus']"),
])
def test_a_fixed_pool_that_cannot_be_built_is_one_clear_error_before_the_model_loads(
        tmp_path, pool, message):
    # The tokenizer source would fail the model load: the pool must be refused before it.
    pool = pool or str(tmp_path)
    assert_one_clear_error(tmp_path, "--config.mode=fixed", f"fixed_pool='{pool}': {message}",
                           f"--config.fixed_pool={pool}",
                           "--config.model.tokenizer=/no/such/tokenizer")


def test_check_writable_leaves_nothing_behind_and_refuses_a_file_parent(tmp_path):
    check_writable(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []
    check_writable("gs://bucket/run")  # a bucket is checked at its first write
    (tmp_path / "file").write_text("")
    with pytest.raises(WorkdirError, match="is a file, not a directory"):
        check_writable(tmp_path / "file" / "run")


def assert_one_clear_error(tmp_path, override, message, *more_overrides):
    """launch/train.py with the overrides exits non-zero with one `error:` line holding
    `message`."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "launch" / "train.py"), f"--config={ROOT}/configs/tiny.py",
         f"--workdir={tmp_path / 'run'}", override, *more_overrides],
        capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    error = result.stderr[result.stderr.rfind("\nerror: ") + 1:]
    assert error.startswith("error: ") and message in error, result.stderr[-2000:]
    assert [line.startswith("error:") for line in result.stderr.splitlines()].count(True) == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", [
    ["launch/eval.py", "--config=configs/tiny.py", "--out=unused", "--limit=abc"],
    ["launch/export.py", "--config=configs/tiny.py", "--limit=abc"],
    ["-m", "spade_jax.plan", "--config=configs/tiny.py", "--limit=abc"],
    ["-m", "spade_jax.readiness", "--config=configs/tiny.py", "--limit=abc"],
])
def test_every_entry_point_refuses_a_bad_flag_in_one_line(command):
    """The other commands parse flags like launch/train.py (spade_jax.cli.parse_flags)."""
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "FATAL" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "limit" in lines[-1], result.stderr[-2000:]


@pytest.mark.parametrize("command", [
    ["launch/train.py", "--config=configs/nope.py"],
    ["launch/eval.py", "--config=configs/nope.py", "--out=unused"],
    ["launch/export.py", "--config=configs/nope.py", "--checkpoint=unused", "--out=unused"],
    ["-m", "spade_jax.plan", "--config=configs/nope.py", "--devices=1", "--hbm_gib=16"],
    ["-m", "spade_jax.readiness", "--config=configs/nope.py", "--topology=v5p-8"],
])
def test_every_entry_point_names_a_missing_config_file_in_one_line(command):
    assert_one_line_error(command, "--config=configs/nope.py: no such config file")


@pytest.mark.parametrize("command, message", [
    (["launch/export.py", "--checkpoint=no/such/run", "--out=unused"],
     "no checkpoints under"),
    (["launch/export.py", "--checkpoint=no/such/run", "--out=README.md/hf"],
     "README.md is a file, not a directory"),
    (["launch/eval.py", "--config=configs/tiny.py", "--suites=games", "--out=README.md/eval"],
     "README.md is a file, not a directory"),
    (["-m", "spade_jax.plan", "--config=configs/tiny.py", "--topology=v9-8"],
     "unknown topology 'v9-8'"),
    (["-m", "spade_jax.readiness", "--config=configs/tiny.py", "--topology=v9-8"],
     "unknown topology 'v9-8'"),
])
def test_the_other_commands_report_bad_input_in_one_line(command, message):
    assert_one_line_error(command, message)


def assert_one_line_error(command, message):
    """`python *command` in the checkout exits non-zero, its last line `error: ...message...`,
    without a traceback."""
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last, result.stderr[-2000:]
