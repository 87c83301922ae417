"""launch/gcp/pod_run.sh, a whole TPU run: its dry run prints create, setup, train on every
worker, the watch, the resume after a preemption and the delete, in that order; run for real
against a gcloud stub, a preempted slice is replaced and the run resumed under the same name."""

from __future__ import annotations

import shlex

from test_scripts import GCP, GCP_ENV, _flag, _run, _stub

RUN = ["--accelerator-type=v5p-64", "--spot", "--config=configs/30b.py", "--run=30b-v5p64",
       "--model=gs://my-bucket/models/Qwen3-30B-A3B-Instruct-2507"]


def steps(stdout: str) -> list[tuple[str, list[list[str]]]]:
    """(the '# step' comment, the commands under it) of a dry run, in order."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("# "):
            out.append((line[2:], []))
        elif line.strip():
            out[-1][1].append(shlex.split(line))
    return out


def kind(cmd: list[str]) -> str:
    """A short name of a printed command: 'create', 'describe', 'delete', 'scp', 'archive',
    'ssh all' / 'ssh 0'."""
    if cmd[:2] == ["git", "-C"]:
        return cmd[3]
    if "queued-resources" in cmd:
        return cmd[cmd.index("queued-resources") + 1]
    if "tpu-vm" in cmd and cmd[cmd.index("tpu-vm") + 1] == "ssh":
        return f"ssh {_flag(cmd, '--worker')}"
    return cmd[cmd.index("tpu-vm") + 1]


def test_dry_run_prints_the_whole_run_in_order():
    result = _run(GCP / "pod_run.sh", [*RUN, "--dry-run", "--", "--config.total_cycles=100"],
                  GCP_ENV)
    assert result.returncode == 0, result.stderr
    plan = [(title.split()[0], [kind(c) for c in cmds]) for title, cmds in steps(result.stdout)]
    assert plan == [
        ("create", ["create", "describe"]),
        ("set", ["archive", "scp", "ssh all"]),
        ("train", ["ssh all"]),
        ("every", ["describe"]),
        ("and", ["ssh 0"]),
        ("follow", ["ssh 0"]),
        ("after", []),
        ("delete", ["delete"]),
        ("create", ["create", "describe"]),
        ("set", ["archive", "scp", "ssh all"]),
        ("resume", ["ssh all"]),
        ("the", ["delete"]),
    ]
    commands = [c for _, cmds in steps(result.stdout) for c in cmds]
    creates = [c for c in commands if kind(c) == "create"]
    assert all("--spot" in c and _flag(c, "--accelerator-type") == "v5p-64" for c in creates)
    trains = [_flag(c, "--command") for c in commands if kind(c) == "ssh all"
              and "launch/train.py" in _flag(c, "--command")]
    assert len(trains) == 2 and trains[0] == trains[1]  # the resume is the same command
    assert "--workdir=gs://my-bucket/runs/30b-v5p64" in trains[0]
    assert "--config.total_cycles=100" in trains[0]
    assert "--noresume" not in trains[0]
    deletes = [c for c in commands if kind(c) == "delete"]
    assert all("--force" in c for c in deletes) and len(deletes) == 2


def test_dry_run_refuses_a_run_without_a_name():
    result = _run(GCP / "pod_run.sh", [r for r in RUN if not r.startswith("--run")] +
                  ["--dry-run"], GCP_ENV)
    assert result.returncode == 2 and "--run=NAME" in result.stderr


def test_a_preempted_slice_is_replaced_and_the_run_resumed(tmp_path):
    """gcloud is a stub: the slice is ACTIVE, then SUSPENDED once (preempted), then ACTIVE; the
    training process runs, then ends. The script must delete and recreate the slice, start
    train.py again with the same workdir, and delete the slice at the end."""
    calls = tmp_path / "calls"
    _stub(tmp_path / "bin", "gcloud", f"""
printf "%q " "$@" >> {calls}; echo >> {calls}
count() {{ grep -c -- "$1" {calls} || true; }}
case "$*" in
  *"queued-resources describe"*)
    # the 1st describe is create_slice's wait; the 2nd the first watch: preempted
    [ "$(count 'queued-resources describe')" = 2 ] && echo SUSPENDED || echo ACTIVE ;;
  *"--worker=0"*)
    [ "$(count '--worker=0')" -ge 2 ] && echo ENDED || echo RUNNING ;;
esac
""")
    result = _run(GCP / "pod_run.sh", [*RUN, "--poll=1"],
                  {**GCP_ENV, "POLL_SECONDS": "0", "TMPDIR": str(tmp_path)},
                  path_prefix=tmp_path / "bin", timeout=120)
    assert result.returncode == 0, result.stderr
    log = [shlex.split(line) for line in calls.read_text().splitlines()]
    order = [kind(["gcloud", *c]) for c in log]
    assert order == ["create", "describe", "scp", "ssh all", "ssh all",  # create, setup, train
                     "describe",  # the watch sees SUSPENDED
                     "delete", "create", "describe", "scp", "ssh all", "ssh all",  # resume
                     "describe", "ssh 0",  # ACTIVE, RUNNING
                     "describe", "ssh 0",  # ACTIVE, ENDED
                     "delete"]
    trains = [_flag(c, "--command") for c in log if "launch/train.py" in " ".join(c)]
    assert len(trains) == 2 and trains[0] == trains[1]
    assert "--workdir=gs://my-bucket/runs/30b-v5p64" in trains[1]
    assert "restart 1 of 10" in result.stderr


def readme_pod_runs() -> list[tuple[dict, list[str]]]:
    """(the exported settings, the arguments) of each pod_run.sh command in the README."""
    text = (GCP / "README.md").read_text().replace("\\\n", " ")
    out, env = [], {}
    for line in text.splitlines():
        if not line.startswith(("export ", "bash launch/gcp/pod_run.sh")):
            continue
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            env = dict(w.split("=", 1) for w in words[1:])
        elif words[:2] == ["bash", "launch/gcp/pod_run.sh"]:
            out.append((env, words[2:]))
    return out


def test_readme_pod_runs_are_valid_dry_runs():
    """The README's pod recipes (v5p-64 and v5e-256) parse and print a whole run."""
    runs = readme_pod_runs()
    assert {_flag(args, "--accelerator-type") for _, args in runs} >= {"v5p-64",
                                                                       "v5litepod-256"}
    for env, args in runs:
        args = [a for a in args if a != "--dry-run"]
        cut = args.index("--") if "--" in args else len(args)  # train.py's arguments after --
        result = _run(GCP / "pod_run.sh", [*args[:cut], "--dry-run", *args[cut:]], env,
                      cwd=GCP.parents[1])
        assert result.returncode == 0, (args, result.stderr)
        assert [t.split()[0] for t, _ in steps(result.stdout)][-2:] == ["resume", "the"]
        for train_arg in args[cut + 1:]:  # the v5e recipe's 8k context reaches train.py
            assert train_arg in result.stdout, train_arg
