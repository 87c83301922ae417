"""Every command block of the README runs: each command is extracted and run cut down.

The two fresh-machine commands are what `.ci/run` runs (the main job cut to one short cycle in
a fresh venv, then the test command); the other `train.py` examples run here with their own
flags on the tiny config for one cycle; the Python block runs as written. A command this file
does not know how to cut down fails the test, so no example can rot unseen.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import command_env, train_cache_flags

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CI_SCRIPT = ROOT / ".ci" / "run"
MAIN_CONFIG = "configs/smollm2_135m.py"
# What `.ci/run` adds to the README's main command: one cycle with short generations.
MAIN_JOB_CUT = ("--config.total_cycles=1", "--config.sampling.designer_max_new_tokens=")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every fenced block in `text`."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def shell_commands(body: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, trailing comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    commands = []
    for line in joined.splitlines():
        command = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
        if command:
            commands.append(command)
    return commands


def readme_shell_commands() -> list[str]:
    return [cmd for lang, body in fenced_blocks(README.read_text())
            if lang in ("bash", "sh") for cmd in shell_commands(body)]


def readme_python_blocks() -> list[str]:
    return [body for lang, body in fenced_blocks(README.read_text()) if lang == "python"]


def train_commands() -> list[str]:
    """The README's `launch/train.py` examples other than the two fresh-machine commands."""
    return [cmd for cmd in readme_shell_commands()
            if cmd.startswith("python launch/train.py ")]


def cut_down(command: str, workdir: Path) -> list[str]:
    """argv of a README `train.py` example on the tiny config, one cycle, in `workdir`."""
    words = shlex.split(command)
    kept = [w for w in words[2:] if not w.startswith(("--workdir=", "--config=",
                                                      "--config.total_cycles="))]
    return [sys.executable, "launch/train.py", "--config=configs/tiny.py",
            f"--workdir={workdir}", *kept, "--config.total_cycles=1"]


def test_readme_blocks_are_all_known():
    """Every untagged block is a listing, not a command; every shell command is one we run."""
    for lang, body in fenced_blocks(README.read_text()):
        if lang == "":
            first = body.lstrip().split(None, 1)[0] if body.strip() else ""
            assert first not in ("python", "bash", "pip", "import"), (
                f"an untagged README block looks like a command; tag it bash/python: {body!r}")
        else:
            assert lang in ("bash", "sh", "python"), f"README block tagged {lang!r}"
    main, tests, *rest = readme_shell_commands()
    assert main.startswith("bash launch/install.sh && python launch/train.py "), main
    assert tests == "bash launch/install.sh test && ruff check . && python -m pytest -q", tests
    unknown = [cmd for cmd in rest if cmd not in train_commands()]
    assert not unknown, f"README commands no test runs: {unknown}"
    assert len(train_commands()) >= 3  # the override examples exist and are parsed


def test_ci_runs_the_two_readme_commands():
    """`.ci/run` runs the main job (cut short, in a fresh venv without PyTorch), then the tests."""
    main, tests = readme_shell_commands()[:2]
    ci = re.sub(r"\\\n\s*", " ", CI_SCRIPT.read_text())
    install, train = main.split(" && ")
    assert install in ci.splitlines(), "CI does not run the README's install step on its own"
    train_argv = shlex.split(train)
    train_line = next((line for line in ci.splitlines()
                       if line.strip().startswith("python launch/train.py")), None)
    assert train_line is not None, "CI does not run the main job"
    ci_argv = shlex.split(train_line, comments=True)
    assert ci_argv[:3] == train_argv[:3] and train_argv[2] == f"--config={MAIN_CONFIG}"
    for flag in MAIN_JOB_CUT:
        assert any(arg.startswith(flag) for arg in ci_argv), (flag, ci_argv)
    assert "-m venv" in ci and "import torch" in ci
    assert tests in ci, "CI does not run the README's test command"
    assert ci.index(train_line) < ci.index(tests)


@pytest.mark.slow
@pytest.mark.parametrize("command", train_commands())
def test_readme_train_example_runs(command, tmp_path):
    workdir = tmp_path / "run"
    result = subprocess.run([*cut_down(command, workdir), *train_cache_flags()], cwd=ROOT,
                            capture_output=True, text=True, timeout=600,
                            env=command_env(PYTHONUNBUFFERED="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = (workdir / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 1, metrics


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(readme_python_blocks())))
def test_readme_python_block_runs(index, tmp_path):
    script = tmp_path / "readme_block.py"
    script.write_text(readme_python_blocks()[index])
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600, env=command_env())
    assert result.returncode == 0, result.stderr[-3000:]
