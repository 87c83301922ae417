"""The shell scripts (launch/gcp, install.sh, .ci/run): shellcheck of every script including
launch/gpu, settings, dry runs. The GPU scripts' own behaviour is in test_gpu_scripts.py.

Nothing here needs gcloud or a TPU: the scripts print the commands they would run in --dry-run
mode, and where a test runs them for real, gcloud and python are small stubs on PATH that
record what they were asked to do.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GCP = REPO / "launch" / "gcp"
GPU = REPO / "launch" / "gpu"
GCP_SCRIPTS = ["create_slice.sh", "setup_workers.sh", "train.sh", "logs.sh", "delete_slice.sh",
               "pod_run.sh"]
ALL_SCRIPTS = (
    [GCP / s for s in GCP_SCRIPTS]
    + [GCP / "common.sh"]
    + [
        GPU / s
        for s in ("common.sh", "train_single_node.sh", "submit_slurm.sh", "train_slurm.sbatch")
    ]
    + [REPO / "launch" / s for s in ("install.sh", "shell_lib.sh")] + [REPO / ".ci" / "run"]
)
SOURCED = ("common.sh", "shell_lib.sh")  # libraries the scripts source; never run themselves
# Settings the scripts read from the environment; the tests start from none of them.
SETTINGS = (
    "PROJECT",
    "ZONE",
    "BUCKET",
    "TPU_NAME",
    "QUEUED_RESOURCE",
    "ACCELERATOR_TYPE",
    "RUNTIME_VERSION",
    "DRY_RUN",
    "CONFIG",
    "WORKDIR",
    "MODEL_PATH",
    "SPADE_PYTHON",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "CUDA_VISIBLE_DEVICES",
    "SPADE_REPO",
    "POLL_SECONDS",
    "WAIT_TIMEOUT",
    "REMOTE_REPO",
    "REMOTE_VENV",
    "REMOTE_LOGS",
    "REMOTE_MODELS",
)
GCP_ENV = {
    "PROJECT": "my-proj",
    "ZONE": "us-east5-a",
    "BUCKET": "gs://my-bucket",
    "TPU_NAME": "spade-tpu",
}
# Arguments without which a script cannot get as far as its PROJECT/ZONE/BUCKET check.
GCP_ARGS = {
    "create_slice.sh": ["--accelerator-type=v5p-64"],
    "train.sh": ["--config=configs/30b.py", "--run=r1"],
    "pod_run.sh": ["--accelerator-type=v5p-64", "--config=configs/30b.py", "--run=r1"],
}


def _env(extra: dict | None = None, path_prefix: Path | None = None) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in SETTINGS and not k.startswith(("SLURM_", "SPADE_"))
    }
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    env.update(extra or {})
    return env


def _run(script: Path, args, env=None, path_prefix=None, cwd=None, timeout=60):
    return subprocess.run(
        ["bash", str(script), *args],
        env=_env(env, path_prefix),
        cwd=cwd or "/",
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _commands(stdout: str) -> list[list[str]]:
    """The printed commands of a dry run, each split into words as a shell would."""
    return [shlex.split(line) for line in stdout.splitlines() if line.strip()]


def _find(cmds, *prefix):
    found = [c for c in cmds if c[: len(prefix)] == list(prefix)]
    assert found, f"no command starting with {prefix} in {cmds}"
    return found[0]


def _flag(cmd, name):
    values = [w.split("=", 1)[1] for w in cmd if w.startswith(name + "=")]
    assert len(values) == 1, f"{name} appears {len(values)} times in {cmd}"
    return values[0]


def _stub(bindir: Path, name: str, body: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------------------------- shellcheck


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shellcheck(script):
    if shutil.which("shellcheck") is None:
        pytest.skip(
            "shellcheck is not installed: apt-get install -y shellcheck (launch/install.sh test "
            "should install it)"
        )
    result = subprocess.run(
        ["shellcheck", "-x", str(script)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_scripts_are_strict_and_executable():
    for script in ALL_SCRIPTS:
        text = script.read_text()
        if script.name not in SOURCED:
            assert "set -euo pipefail" in text, script
            assert os.access(script, os.X_OK), f"{script} is not executable"


# ------------------------------------------------------------------------- required settings


@pytest.mark.parametrize("missing", ["PROJECT", "ZONE", "BUCKET"])
@pytest.mark.parametrize("script", GCP_SCRIPTS)
def test_gcp_script_refuses_missing_setting(script, missing):
    env = {k: v for k, v in GCP_ENV.items() if k != missing}
    for dry in ([], ["--dry-run"]):
        result = _run(GCP / script, [*GCP_ARGS.get(script, []), *dry], env)
        assert result.returncode == 2, (result.stdout, result.stderr)
        assert missing in result.stderr
        assert f"--{missing.lower()}=" in result.stderr  # says how to set it
        assert result.stdout == "", "nothing may run before the settings are checked"


@pytest.mark.parametrize("script", GCP_SCRIPTS)
def test_gcp_script_refuses_missing_tpu_name_and_non_gs_bucket(script):
    env = {k: v for k, v in GCP_ENV.items() if k != "TPU_NAME"}
    result = _run(GCP / script, [*GCP_ARGS.get(script, []), "--dry-run"], env)
    assert result.returncode == 2 and "TPU_NAME" in result.stderr
    result = _run(
        GCP / script, [*GCP_ARGS.get(script, []), "--dry-run"], {**GCP_ENV, "BUCKET": "my-bucket"}
    )
    assert result.returncode == 2 and "gs://" in result.stderr


def test_flags_override_environment():
    args = [
        "--project=flag-proj",
        "--zone=europe-west4-a",
        "--bucket=gs://b2",
        "--tpu=t2",
        "--accelerator-type=v6e-16",
        "--dry-run",
    ]
    cmd = _find(
        _commands(_run(GCP / "create_slice.sh", args).stdout),
        "gcloud",
        "compute",
        "tpus",
        "queued-resources",
        "create",
    )
    assert _flag(cmd, "--project") == "flag-proj" and _flag(cmd, "--zone") == "europe-west4-a"
    assert _flag(cmd, "--node-id") == "t2"


def test_unknown_argument_is_an_error():
    result = _run(GCP / "delete_slice.sh", ["--dry-run", "--frobnicate"], GCP_ENV)
    assert result.returncode == 2 and "--frobnicate" in result.stderr


# ------------------------------------------------------------------------------ create_slice


@pytest.mark.parametrize(
    "accelerator, runtime",
    [
        ("v5litepod-16", "v2-alpha-tpuv5-lite"),
        ("v5p-64", "v2-alpha-tpuv5"),
        ("v6e-32", "v2-alpha-tpuv6e"),
    ],
)
def test_create_slice_dry_run(accelerator, runtime):
    result = _run(
        GCP / "create_slice.sh", [f"--accelerator-type={accelerator}", "--dry-run"], GCP_ENV
    )
    assert result.returncode == 0, result.stderr
    cmds = _commands(result.stdout)
    create = _find(cmds, "gcloud", "compute", "tpus", "queued-resources", "create")
    assert create[5] == "spade-tpu"  # queued resource id defaults to the TPU name
    assert _flag(create, "--node-id") == "spade-tpu"
    assert _flag(create, "--accelerator-type") == accelerator
    assert _flag(create, "--runtime-version") == runtime
    assert _flag(create, "--project") == "my-proj" and _flag(create, "--zone") == "us-east5-a"
    assert not {"--spot", "--best-effort", "--reserved"} & set(create)
    describe = _find(cmds, "gcloud", "compute", "tpus", "queued-resources", "describe")
    assert _flag(describe, "--format") == "value(state.state)"


def test_create_slice_tiers_and_runtime_override():
    base = [
        "--accelerator-type=v5p-128",
        "--runtime-version=my-runtime",
        "--queued-resource=qr1",
        "--dry-run",
    ]
    spot = _find(
        _commands(_run(GCP / "create_slice.sh", [*base, "--spot"], GCP_ENV).stdout),
        "gcloud",
        "compute",
        "tpus",
        "queued-resources",
        "create",
    )
    assert (
        "--spot" in spot and _flag(spot, "--runtime-version") == "my-runtime" and spot[5] == "qr1"
    )
    best = _find(
        _commands(
            _run(
                GCP / "create_slice.sh", [*base, "--best-effort", "--", "--internal-ips"], GCP_ENV
            ).stdout
        ),
        "gcloud",
        "alpha",
        "compute",
        "tpus",
        "queued-resources",
        "create",
    )
    assert "--best-effort" in best and best[-1] == "--internal-ips"
    both = _run(GCP / "create_slice.sh", [*base, "--spot", "--reserved"], GCP_ENV)
    assert both.returncode == 2


@pytest.mark.parametrize("bad, message", [("v5e-16", "v5litepod"), ("h100", "not a TPU type")])
def test_create_slice_rejects_bad_accelerator(bad, message):
    result = _run(GCP / "create_slice.sh", [f"--accelerator-type={bad}", "--dry-run"], GCP_ENV)
    assert result.returncode == 2 and message in result.stderr


def test_create_slice_requires_accelerator_type():
    result = _run(GCP / "create_slice.sh", ["--dry-run"], GCP_ENV)
    assert result.returncode == 2 and "ACCELERATOR_TYPE" in result.stderr


@pytest.mark.parametrize("final, code", [("ACTIVE", 0), ("FAILED", 1)])
def test_create_slice_waits_for_state(tmp_path, final, code):
    """Real mode against a gcloud stub: polls describe until ACTIVE (or gives up on FAILED)."""
    log = tmp_path / "calls"
    state = tmp_path / "n"
    _stub(
        tmp_path / "bin",
        "gcloud",
        f"""
echo "$*" >> {log}
if [[ "$*" == *describe*format* ]]; then
  n=$(cat {state} 2>/dev/null || echo 0); echo $((n + 1)) > {state}
  if [ "$n" -lt 2 ]; then echo WAITING_FOR_RESOURCES; else echo {final}; fi
fi
""",
    )
    result = _run(
        GCP / "create_slice.sh",
        ["--accelerator-type=v5p-8"],
        {**GCP_ENV, "POLL_SECONDS": "0"},
        path_prefix=tmp_path / "bin",
    )
    assert result.returncode == code, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("compute tpus queued-resources create spade-tpu")
    assert sum("describe" in c and "format" in c for c in calls) == 3


# ----------------------------------------------------------------------------- setup_workers


def test_setup_workers_dry_run():
    result = _run(
        GCP / "setup_workers.sh", ["--dry-run", "--model=gs://my-bucket/models/Qwen3-8B/"], GCP_ENV
    )
    assert result.returncode == 0, result.stderr
    cmds = _commands(result.stdout)
    archive = _find(cmds, "git", "-C", str(REPO), "archive")
    tarball = _flag(archive, "--output")
    scp = _find(cmds, "gcloud", "compute", "tpus", "tpu-vm", "scp")
    assert scp[5] == tarball and scp[6] == "spade-tpu:/tmp/spade_jax.tar.gz"
    assert _flag(scp, "--worker") == "all" and _flag(scp, "--zone") == "us-east5-a"
    ssh = _find(cmds, "gcloud", "compute", "tpus", "tpu-vm", "ssh", "spade-tpu")
    assert _flag(ssh, "--worker") == "all" and _flag(ssh, "--project") == "my-proj"
    remote = _flag(ssh, "--command")
    assert "tar -xzf /tmp/spade_jax.tar.gz" in remote
    assert "pip install" in remote and "-e '.[tpu]'" in remote
    assert "bubblewrap" in remote
    assert "gcloud storage cp -r 'gs://my-bucket/models/Qwen3-8B/*'" in remote
    assert "/tmp/spade_models/Qwen3-8B" in remote
    subprocess.run(["bash", "-n", "-c", remote], check=True)  # valid shell on the worker
    assert cmds.index(archive) < cmds.index(scp) < cmds.index(ssh)


# ------------------------------------------------------------------------------------- train


def _train_remote(args, env=None) -> tuple[list[str], str]:
    result = _run(GCP / "train.sh", ["--dry-run", *args], {**GCP_ENV, **(env or {})})
    assert result.returncode == 0, result.stderr
    cmds = _commands(result.stdout)
    assert len(cmds) == 1
    ssh = _find(cmds, "gcloud", "compute", "tpus", "tpu-vm", "ssh", "spade-tpu")
    assert _flag(ssh, "--worker") == "all"
    return ssh, _flag(ssh, "--command")


def test_train_dry_run():
    _, remote = _train_remote(
        [
            "--config=configs/30b.py",
            "--run=r1",
            "--model=gs://my-bucket/models/Qwen3-30B-A3B-Instruct-2507",
            "--env=LIBTPU_INIT_ARGS=--xla_tpu_a=1 --xla_tpu_b=2",
            "--config.total_cycles=3",
            "--",
            "--config.spade.plays_per_env=4",
            "--noresume",
        ]
    )
    subprocess.run(["bash", "-n", "-c", remote], check=True)
    words = shlex.split(remote.split("setsid nohup ", 1)[1].split(" > ", 1)[0])
    assert words[words.index("env") + 1 : words.index("env") + 3] == [
        "PYTHONUNBUFFERED=1",
        "LIBTPU_INIT_ARGS=--xla_tpu_a=1 --xla_tpu_b=2",
    ]
    train = words[words.index("launch/train.py") :]
    assert train == [
        "launch/train.py",
        "--config=configs/30b.py",
        "--workdir=gs://my-bucket/runs/r1",
        "--config.model.source=/tmp/spade_models/Qwen3-30B-A3B-Instruct-2507",
        "--config.total_cycles=3",
        "--config.spade.plays_per_env=4",
        "--noresume",
    ]
    assert "gcloud storage cp -r 'gs://my-bucket/models/Qwen3-30B-A3B-Instruct-2507/*'" in remote
    assert "$HOME/spade_logs/r1.log" in remote and "latest.log" in remote


def test_train_default_workdir_and_explicit_workdir():
    _, remote = _train_remote(["--config=configs/8b.py"])
    workdir = [
        w
        for w in shlex.split(remote.split("setsid nohup ", 1)[1].split(" > ")[0])
        if w.startswith("--workdir=")
    ][0]
    assert workdir.startswith("--workdir=gs://my-bucket/runs/8b-")
    _, remote = _train_remote(
        [
            "--config=configs/8b.py",
            "--workdir=gs://other/x/run7",
            "--model-path=/mnt/disks/m/Qwen3-8B",
        ]
    )
    assert "--workdir=gs://other/x/run7" in remote and "spade_logs/run7.log" in remote
    assert (
        "--config.model.source=/mnt/disks/m/Qwen3-8B" in remote and "gcloud storage" not in remote
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--run=r"], "CONFIG"),
        (["--config=configs/nope.py"], "no such file"),
        (["--config=configs/8b.py", "--workdir=/local/dir"], "gs://"),
        (["--config=configs/8b.py", "--model=/local/model"], "gs://"),
        (["--config=configs/8b.py", "--run=bad name"], "--run"),
        (["--config=configs/8b.py", "--noresume"], "after --"),
    ],
)
def test_train_rejects(args, message):
    result = _run(GCP / "train.sh", ["--dry-run", *args], GCP_ENV)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.skipif(shutil.which("setsid") is None, reason="setsid (util-linux) is not installed")
def test_train_remote_command_starts_refuses_and_stops(tmp_path):
    """Run the worker-side commands of train.sh on this machine with a fake venv python."""
    home = tmp_path / "home"
    (home / "spade_jax" / "launch").mkdir(parents=True)
    argfile = tmp_path / "args"
    _stub(
        home / "spade_venv" / "bin",
        "python",
        f'printf "%s\\n" "$@" > {argfile}; echo "training on $(hostname)"; exec sleep 60\n',
    )
    env = {"HOME": str(home)}
    _, start = _train_remote(
        ["--config=configs/tiny.py", "--run=t1", "--", "--config.total_cycles=1"]
    )
    first = subprocess.run(
        ["bash", "-c", start], env=_env(env), capture_output=True, text=True, timeout=30
    )
    assert first.returncode == 0, first.stderr
    pid = int((home / "spade_logs" / "train.pid").read_text())
    try:
        for _ in range(100):
            if argfile.exists() and argfile.read_text():
                break
            time.sleep(0.05)
        assert argfile.read_text().split() == [
            "launch/train.py",
            "--config=configs/tiny.py",
            "--workdir=gs://my-bucket/runs/t1",
            "--config.total_cycles=1",
        ]
        assert os.readlink(home / "spade_logs" / "latest.log") == "t1.log"
        second = subprocess.run(
            ["bash", "-c", start], env=_env(env), capture_output=True, text=True, timeout=30
        )
        assert second.returncode == 1 and "still going" in second.stderr
        _, stop = _train_remote(["--stop"])
        stopped = subprocess.run(
            ["bash", "-c", stop], env=_env(env), capture_output=True, text=True, timeout=90
        )
        assert stopped.returncode == 0 and "stopping pid" in stopped.stdout
        for _ in range(100):
            if (
                not Path(f"/proc/{pid}").exists()
                or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
            ):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the training process survived --stop")
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, 9)


# -------------------------------------------------------------------------- logs and delete


def test_logs_dry_run():
    cmd = _find(
        _commands(_run(GCP / "logs.sh", ["--dry-run"], GCP_ENV).stdout),
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "spade-tpu",
    )
    assert _flag(cmd, "--worker") == "0"
    assert _flag(cmd, "--command") == "tail -n 100 -F $HOME/spade_logs/latest.log"
    cmd = _find(
        _commands(
            _run(
                GCP / "logs.sh",
                ["--dry-run", "--worker=all", "--run=r1", "--lines=5", "--no-follow"],
                GCP_ENV,
            ).stdout
        ),
        "gcloud",
    )
    assert _flag(cmd, "--worker") == "all"
    assert _flag(cmd, "--command").startswith("tail -n 5 $HOME/spade_logs/r1.log | sed")
    assert _run(GCP / "logs.sh", ["--dry-run", "--worker=x"], GCP_ENV).returncode == 2


def test_delete_slice_dry_run():
    cmd = _find(
        _commands(_run(GCP / "delete_slice.sh", ["--dry-run", "--async"], GCP_ENV).stdout),
        "gcloud",
        "compute",
        "tpus",
        "queued-resources",
        "delete",
        "spade-tpu",
    )
    assert {"--force", "--quiet", "--async"} <= set(cmd) and _flag(cmd, "--zone") == "us-east5-a"
    cmd = _find(
        _commands(_run(GCP / "delete_slice.sh", ["--dry-run", "--node-only"], GCP_ENV).stdout),
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "delete",
        "spade-tpu",
    )
    assert "--quiet" in cmd


def test_delete_slice_asks_before_deleting(tmp_path):
    log = tmp_path / "calls"
    _stub(tmp_path / "bin", "gcloud", f'echo "$*" >> {log}\n')
    refused = _run(GCP / "delete_slice.sh", [], GCP_ENV, path_prefix=tmp_path / "bin")
    assert refused.returncode == 2 and "--yes" in refused.stderr and not log.exists()
    done = _run(GCP / "delete_slice.sh", ["--yes"], GCP_ENV, path_prefix=tmp_path / "bin")
    assert done.returncode == 0, done.stderr
    assert log.read_text().startswith("compute tpus queued-resources delete spade-tpu")

