"""launch/eval.py as a user runs it: argument errors, --compare, one tiny end-to-end run."""

import subprocess
import sys
from pathlib import Path

import pytest

from spade_jax.eval import report
from spade_jax.eval.tasks import EvalTask
from tests.commands import command_env

ROOT = Path(__file__).resolve().parents[2]


def _eval(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "launch" / "eval.py"), *args], cwd=ROOT,
                          env=command_env(), capture_output=True, text=True, timeout=timeout)


def _results(directory: Path, returns: list[float]) -> None:
    task = EvalTask("games", "maze", "maze/0", "class MazeEnv: pass")
    report.write_results(directory, [report.episode_record(task, r) for r in returns])


def test_bad_suite_name_is_refused_with_the_choices(tmp_path):
    result = _eval("--config=configs/tiny.py", "--suites=games,bfcl_single", f"--out={tmp_path}")
    assert result.returncode != 0
    assert "unknown eval suites ['bfcl_single']" in result.stderr
    assert "bfcl_multi_turn" in result.stderr


def test_missing_checkpoint_is_refused_before_loading_the_model(tmp_path):
    result = _eval("--config=configs/tiny.py", f"--checkpoint={tmp_path / 'run'}",
                   f"--out={tmp_path / 'out'}")
    assert result.returncode != 0
    assert "no checkpoints under" in result.stderr


def test_compare_prints_two_runs_side_by_side(tmp_path):
    _results(tmp_path / "base", [0.0, 1.0])
    _results(tmp_path / "trained", [1.0, 1.0])
    result = _eval("--compare", str(tmp_path / "base"), str(tmp_path / "trained"))
    assert result.returncode == 0, result.stderr
    assert "| suite | category | hint | base | trained | delta |" in result.stdout
    assert "| games | maze | no | 0.500 | 1.000 | +0.500 |" in result.stdout


def test_compare_needs_two_result_dirs(tmp_path):
    _results(tmp_path / "base", [0.0])
    assert "two result directories" in _eval("--compare", str(tmp_path / "base")).stderr
    missing = _eval("--compare", str(tmp_path / "base"), str(tmp_path / "none"))
    assert missing.returncode != 0 and "holds no summary.json" in missing.stderr


@pytest.mark.slow
def test_tiny_model_end_to_end(tmp_path):
    pytest.importorskip("reasoning_gym")
    out = tmp_path / "out"
    result = _eval("--config=configs/tiny.py", "--suites=games,reasoning_gym", "--limit=1",
                   "--games_max_turns=2", f"--out={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| reasoning_gym | (mean) | no |" in result.stdout
    rows = report.read_jsonl(out / report.ITEMS_FILE)
    assert sorted((r["suite"], r["hint"]) for r in rows) == [
        ("games", False), ("games", True), ("reasoning_gym", False)]
    assert (out / report.SUMMARY_JSON).is_file()
    assert (out / report.SUMMARY_MD).read_text() in result.stdout
