"""The GPU launch scripts (launch/gpu): settings, single-node and SLURM dry runs.

Nothing here needs SLURM or a GPU: the scripts print the commands they would run in --dry-run
mode, and where a test runs them for real, scontrol / srun / python are small stubs on PATH
that record what they were asked to do. The helpers are those of test_scripts.py.
"""

from __future__ import annotations

import shlex

import pytest
from test_scripts import GPU, REPO, _run, _stub


@pytest.mark.parametrize(
    "missing, args",
    [
        ("CONFIG", ["--workdir=runs/x"]),
        ("WORKDIR", ["--config=configs/8b.py"]),
    ],
)
@pytest.mark.parametrize("script", ["train_single_node.sh", "submit_slurm.sh"])
def test_gpu_script_refuses_missing_setting(script, missing, args):
    extra = ["--nodes=2"] if script == "submit_slurm.sh" else []
    result = _run(GPU / script, [*extra, *args, "--dry-run"])
    assert result.returncode == 2 and missing in result.stderr and result.stdout == ""


def test_single_node_dry_run():
    result = _run(
        GPU / "train_single_node.sh",
        [
            "--config=configs/8b.py",
            "--workdir=runs/8b",
            "--gpus=0,1,2,3",
            "--model-path=/data/Qwen3-8B",
            "--dry-run",
            "--",
            "--config.total_cycles=2",
        ],
        {"SLURM_NTASKS": "4"},
    )
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert words[:3] == ["cd", str(REPO), "&&"]
    assert (
        "XLA_PYTHON_CLIENT_MEM_FRACTION=0.90" in words and "CUDA_VISIBLE_DEVICES=0,1,2,3" in words
    )
    assert words[words.index("launch/train.py") :] == [
        "launch/train.py",
        "--config=configs/8b.py",
        "--workdir=runs/8b",
        "--config.model.source=/data/Qwen3-8B",
        "--config.total_cycles=2",
    ]
    bad = _run(
        GPU / "train_single_node.sh",
        ["--config=configs/8b.py", "--workdir=r", "--mem-fraction=2", "--dry-run"],
    )
    assert bad.returncode == 2 and "MEM_FRACTION" in bad.stderr


def test_single_node_runs_one_process_alone(tmp_path):
    """Real mode with a fake python: inside a SLURM allocation it still runs a lone process."""
    out = tmp_path / "out"
    py = _stub(
        tmp_path / "bin",
        "fakepy",
        f"""
{{ echo "cwd=$PWD"; echo "frac=$XLA_PYTHON_CLIENT_MEM_FRACTION";
   echo "ntasks=${{SLURM_NTASKS:-unset}}"; echo "coord=${{SPADE_COORDINATOR:-unset}}";
   echo "args=$*"; }} > {out}
""",
    )
    result = _run(
        GPU / "train_single_node.sh",
        ["--config=configs/tiny.py", "--workdir=runs/t", f"--python={py}", "--mem-fraction=0.5"],
        {"SLURM_NTASKS": "4", "SPADE_COORDINATOR": "x:1"},
    )
    assert result.returncode == 0, result.stderr
    assert out.read_text().splitlines() == [
        f"cwd={REPO}",
        "frac=0.5",
        "ntasks=unset",
        "coord=unset",
        "args=launch/train.py --config=configs/tiny.py --workdir=runs/t",
    ]


def _slurm_env(tmp_path, nodes=3):
    bindir = tmp_path / "bin"
    _stub(
        bindir,
        "scontrol",
        '[ "$1 $2" = "show hostnames" ] || exit 1\n'
        f'for i in $(seq 1 {nodes}); do printf "gpu-%02d\\n" "$i"; done\n',
    )
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": f"gpu-[01-{nodes:02d}]",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NTASKS": str(nodes),
        "SLURM_SUBMIT_DIR": str(REPO),
    }
    return env, bindir


def test_slurm_batch_dry_run(tmp_path):
    env, bindir = _slurm_env(tmp_path)
    result = _run(
        GPU / "train_slurm.sbatch",
        [
            "--dry-run",
            "--config=configs/32b_dense.py",
            "--workdir=/shared/runs/32b",
            "--",
            "--config.total_cycles=5",
        ],
        env,
        path_prefix=bindir,
    )
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert "SPADE_COORDINATOR=gpu-01:14242" in words and "SPADE_NUM_PROCESSES=3" in words
    srun = words[words.index("srun") :]
    assert {"--nodes=3", "--ntasks=3", "--ntasks-per-node=1", f"--chdir={REPO}"} <= set(srun)
    assert srun[srun.index("-c") + 1] == 'export SPADE_PROCESS_ID="$SLURM_PROCID"; exec "$@"'
    assert srun[srun.index("launch/train.py") :] == [
        "launch/train.py",
        "--config=configs/32b_dense.py",
        "--workdir=/shared/runs/32b",
        "--config.total_cycles=5",
    ]


def test_slurm_batch_gives_each_task_its_process_id(tmp_path):
    """Real mode with stub srun (runs every task here) and a fake python that reports its env."""
    env, bindir = _slurm_env(tmp_path, nodes=2)
    out = tmp_path / "out"
    # The stub srun drops its own flags and runs the rest once per task with SLURM_PROCID set.
    _stub(
        bindir,
        "srun",
        'while [[ "$1" == --* ]]; do shift; done\n'
        'for i in $(seq 0 $((SLURM_NTASKS - 1))); do SLURM_PROCID=$i "$@" || exit 1; done\n',
    )
    py = _stub(
        bindir,
        "fakepy",
        f'echo "$SPADE_COORDINATOR $SPADE_NUM_PROCESSES $SPADE_PROCESS_ID $PWD $*" >> {out}\n',
    )
    result = _run(
        GPU / "train_slurm.sbatch",
        [f"--python={py}", "--config=configs/8b.py", "--workdir=/shared/r"],
        {**env, "SPADE_COORDINATOR_PORT": "5555"},
        path_prefix=bindir,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_text().splitlines() == [
        f"gpu-01:5555 2 {i} {REPO} launch/train.py --config=configs/8b.py --workdir=/shared/r"
        for i in (0, 1)
    ]


def test_slurm_batch_refusals(tmp_path):
    env, bindir = _slurm_env(tmp_path)
    outside = _run(
        GPU / "train_slurm.sbatch",
        ["--dry-run", "--config=configs/8b.py", "--workdir=/r"],
        {k: v for k, v in env.items() if k != "SLURM_JOB_ID"},
        path_prefix=bindir,
    )
    assert outside.returncode == 2 and "SLURM_JOB_ID" in outside.stderr
    two_per_node = _run(
        GPU / "train_slurm.sbatch",
        ["--dry-run", "--config=configs/8b.py", "--workdir=/r"],
        {**env, "SLURM_NTASKS": "6"},
        path_prefix=bindir,
    )
    assert two_per_node.returncode == 2 and "one task per node" in two_per_node.stderr
    no_config = _run(
        GPU / "train_slurm.sbatch", ["--dry-run", "--workdir=/r"], env, path_prefix=bindir
    )
    assert no_config.returncode == 2 and "CONFIG" in no_config.stderr


def test_submit_slurm_dry_run():
    result = _run(
        GPU / "submit_slurm.sh",
        [
            "--nodes=4",
            "--partition=gpu",
            "--time=12:00:00",
            "--config=configs/30b.py",
            "--workdir=/shared/r30",
            "--model-path=/shared/Qwen3-30B-A3B-Instruct-2507",
            "--dry-run",
            "--",
            "--config.total_cycles=9",
        ],
    )
    assert result.returncode == 0, result.stderr
    cmd = shlex.split(result.stdout)
    assert cmd[0] == "sbatch"
    assert {
        "--nodes=4",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--time=12:00:00",
        f"--chdir={REPO}",
        "--output=/shared/r30/slurm-%j.out",
    } <= set(cmd)
    script = cmd.index(str(GPU / "train_slurm.sbatch"))
    assert cmd[script + 1 :] == [
        "--config=configs/30b.py",
        "--workdir=/shared/r30",
        "--mem-fraction=0.90",
        "--python=python",
        "--model-path=/shared/Qwen3-30B-A3B-Instruct-2507",
        "--",
        "--config.total_cycles=9",
    ]
    missing = _run(
        GPU / "submit_slurm.sh", ["--config=configs/30b.py", "--workdir=/r", "--dry-run"]
    )
    assert missing.returncode == 2 and "NODES" in missing.stderr
