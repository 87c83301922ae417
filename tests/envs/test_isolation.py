"""The sandbox worker runs the interpreter of the environment it was started from (venv, a venv
reached through a link, system-site venv, base interpreter) and sees that environment's packages
(site-packages, `.pth` paths, editable finders) and no more. Each case starts a real bwrap pool
in a subprocess run by the environment's python."""

import json
import os
import pathlib
import site
import subprocess
import sys

import pytest

import spade_jax
from spade_jax.envs.sandbox.isolation import exposes_host_secrets

REPO_ROOT = pathlib.Path(spade_jax.__file__).resolve().parents[1]
MARKERS = ("spade_marker_site", "spade_marker_pth", "spade_marker_finder")

# Environment code run in the worker: which markers import, where the interpreter's prefix is,
# whether a base site-packages module is findable, and whether /etc/shadow is visible.
PROBE_ENV = """
class ProbeEnv:
    def reset(self, seed=None):
        import importlib, importlib.util, os, sys
        seen = {"prefix": sys.prefix, "shadow": os.path.exists("/etc/shadow"),
                "base_module": importlib.util.find_spec(BASE_MODULE) is not None}
        for name in MARKERS:
            try:
                seen[name] = importlib.import_module(name).WHERE
            except ImportError as exc:
                seen[name] = repr(exc)
        return json.dumps(seen), {}

    def step(self, action):
        return "", 0.0, True, False, {}
"""

# Run by the environment's python: a default (bwrap) pool plays PROBE_ENV once.
START_POOL = """
import json, sys
from spade_jax.envs.sandbox import EnvPool, SandboxConfig
with EnvPool(SandboxConfig(), warm=0) as pool:
    first = pool.start(sys.argv[1], seed=0)
    print(json.dumps({"bwrap": pool.layers.bwrap, "error": first.error,
                      "seen": json.loads(first.observation) if first.ok else None}))
"""

# Mirrors setuptools' generated editable finder: a module named __editable___*_finder with a
# MAPPING from package names to source directories, installed from a .pth import line.
FINDER = """
import importlib.util, os, sys
MAPPING = {"spade_marker_finder": %r}

class _Finder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname in MAPPING:
            return importlib.util.spec_from_file_location(
                fullname, os.path.join(MAPPING[fullname], "__init__.py"))
        return None

def install():
    sys.meta_path.append(_Finder)
"""


def _python_output(python: str, *args: str, env: dict | None = None) -> str:
    done = subprocess.run([python, *args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _base_module(base_python: str) -> str:
    """A top-level module in the base interpreter's site-packages (not in a fresh venv)."""
    dirs = json.loads(_python_output(
        base_python, "-s", "-c", "import json, site; print(json.dumps(site.getsitepackages()))"))
    for directory in map(pathlib.Path, dirs):
        names = sorted(directory.glob("*/__init__.py")) if directory.is_dir() else []
        for init in names:
            if init.parent.name.isidentifier():
                return init.parent.name
    pytest.skip(f"the base interpreter has no packages in {dirs}")


def _make_venv(root: pathlib.Path, system_site_packages: bool) -> pathlib.Path:
    """A fresh venv with one marker in its site-packages, one on a .pth path, one behind an
    editable finder; its .pth also lists `/`, which must not be bound."""
    flags = ["--system-site-packages"] if system_site_packages else []
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, str(root / "venv")],
                   check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    purelib = pathlib.Path(_python_output(
        str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    (purelib / "spade_marker_site.py").write_text("WHERE = 'site-packages'\n")
    (root / "src_pth").mkdir()
    (root / "src_pth" / "spade_marker_pth.py").write_text("WHERE = 'pth'\n")
    (purelib / "spade_marker_pth.pth").write_text(f"{root / 'src_pth'}\n/\n")
    package = root / "src_finder" / "spade_marker_finder"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("WHERE = 'finder'\n")
    (purelib / "__editable___spade_marker_finder.py").write_text(FINDER % str(package))
    (purelib / "__editable__.spade_marker_finder.pth").write_text(
        "import __editable___spade_marker_finder; __editable___spade_marker_finder.install()\n")
    return python


def _seen_in_worker(python: str, base_module: str) -> dict:
    """What PROBE_ENV reports from a bwrap worker of a pool made by `python`."""
    code = f"MARKERS = {MARKERS!r}\nBASE_MODULE = {base_module!r}\n{PROBE_ENV}"
    # spade_jax and its own dependencies come from this test's environment, via PYTHONPATH,
    # which the worker's cleared environment does not inherit.
    path = os.pathsep.join([str(REPO_ROOT), *site.getsitepackages()])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": path}
    report = json.loads(_python_output(python, "-c", START_POOL, code, env=env).splitlines()[-1])
    assert report["bwrap"] and report["seen"], report
    return report["seen"]


@pytest.fixture(scope="module")
def venvs(tmp_path_factory) -> dict[bool, pathlib.Path]:
    """The python of a plain and of a --system-site-packages venv, by system_site_packages."""
    return {flag: _make_venv(tmp_path_factory.mktemp(f"system_site_{flag}"), flag)
            for flag in (False, True)}


@pytest.mark.parametrize("system_site_packages", [False, True])
def test_worker_sees_the_venvs_packages_and_not_the_hosts_secrets(venvs, system_site_packages):
    python = venvs[system_site_packages]
    base_module = _base_module(os.path.realpath(python))
    seen = _seen_in_worker(str(python), base_module)
    assert seen["prefix"] == str(python.parents[1])
    assert [seen[name] for name in MARKERS] == ["site-packages", "pth", "finder"], seen
    assert seen["base_module"] == system_site_packages, (base_module, seen)
    assert seen["shadow"] is False


def test_worker_of_a_venv_reached_through_a_link(venvs, tmp_path):
    link = tmp_path / "linked_venv"
    link.symlink_to(venvs[False].parents[1], target_is_directory=True)
    seen = _seen_in_worker(str(link / "bin" / "python"), "json")
    assert seen["prefix"] == str(link)
    assert [seen[name] for name in MARKERS] == ["site-packages", "pth", "finder"], seen


def test_base_interpreter_worker_does_not_see_the_venvs_packages(venvs):
    base_python = os.path.realpath(venvs[False])
    base_module = _base_module(base_python)
    seen = _seen_in_worker(base_python, base_module)
    assert all("No module named" in seen[name] for name in MARKERS), seen
    assert seen["base_module"] is True


def test_directories_holding_host_secrets_are_never_bound():
    home = os.path.expanduser("~")
    assert all(map(exposes_host_secrets, ["/", "/etc", "/root", "/home", home, "/root/"]))
    assert not any(map(exposes_host_secrets, ["/usr", "/opt/conda", "/root/.pyenv/versions/3.11",
                                               os.path.join(home, "venv"), "/etcetera"]))
