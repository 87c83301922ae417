"""Sandbox configuration, the worker command line, and the start-up probe of isolation layers.

Layers, outermost first: bubblewrap (user/pid/net/ipc/uts namespaces, uid 65534, a read-only
bind of only what Python needs, private tmpfs /tmp, cleared environment, --die-with-parent,
--new-session), rlimits (address space, CPU, file size, open files, no core) and a seccomp
filter (see `seccomp_filter.py`). Only the Python environment and the sandbox package are
visible inside: binding all of `/` would let the sandbox user, mapped to the host's root, read
root-owned files such as /etc/shadow.

The worker runs this process's interpreter as started (`sys.executable`, a venv's or conda's
`bin/python`, not the base binary behind its symlink), so it finds the same prefix and
site-packages. What that interpreter imports from (its stdlib, site-packages, the directories
`.pth` files add and setuptools' editable finders map to) is bound read-only, at both its own
path and its resolved path, so links into it resolve inside as outside.
"""

import dataclasses
import functools
import json
import logging
import os
import shutil
import subprocess
import sys

log = logging.getLogger(__name__)

SANDBOX_DIR = os.path.dirname(os.path.abspath(__file__))
WORKER_SCRIPT = os.path.join(SANDBOX_DIR, "worker.py")
TOOL_USE_PATH = os.path.join(os.path.dirname(SANDBOX_DIR), "tool_use.py")
SANDBOX_UID = 65534


class SandboxUnavailable(RuntimeError):
    """Raised when the isolation layers required for untrusted code are not available."""


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Limits and layers for sandbox workers; the defaults suit text games."""

    memory_bytes: int = 1 << 30
    cpu_seconds: int = 60
    file_size_bytes: int = 16 << 20
    open_files: int = 64
    tmpfs_bytes: int = 64 << 20
    output_cap_chars: int = 8192
    reply_cap_bytes: int = 2 << 20
    max_code_bytes: int = 512 << 10
    step_timeout_s: float = 5.0
    play_timeout_s: float = 300.0  # environment seconds one episode may spend in all
    # seconds a rollout waits for an Agent's environment step before decoding on without it
    # (its episode waits alone); inf: every step, so the schedule depends on the tokens alone
    step_wait_s: float = 1.0
    validation_timeout_s: float = 60.0  # the gate's random-action run (validate, V6)
    start_timeout_s: float = 30.0
    use_bwrap: bool = True
    use_seccomp: bool = True
    allow_unsafe: bool = False
    warm_workers: int = 8  # idle workers an EnvPool keeps started (the run's sandbox.warm_workers)
    # directories bound read-only (same path) for environments that read data outside Python
    # (an evaluation's benchmark clone, say); each must not expose host secrets
    read_only_paths: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        """What is wrong with these settings, one message per problem (key names as in config)."""
        out = [f"{key}={getattr(self, key)} must be > 0"
               for key in ("step_timeout_s", "play_timeout_s") if getattr(self, key) <= 0]
        if not self.step_wait_s >= 0:
            out.append(f"step_wait_s={self.step_wait_s} must be >= 0 (inf: wait for every step)")
        if self.validation_timeout_s <= 0:
            out.append(f"validation_timeout_s={self.validation_timeout_s} must be > 0")
        if self.warm_workers < 0:
            out.append(f"warm_workers={self.warm_workers} must be >= 0")
        for path in self.read_only_paths:
            if not os.path.isabs(path) or exposes_host_secrets(os.path.realpath(path)):
                out.append(f"read_only_paths entry {path!r} must be an absolute path that does "
                           "not hold /etc, /root or a home directory")
        return out

    def worker_config(self) -> dict:
        """The JSON configuration the worker receives on its command line."""
        return {
            "rlimits": {
                "as": self.memory_bytes, "cpu": self.cpu_seconds,
                "fsize": self.file_size_bytes, "nofile": self.open_files, "core": 0,
            },
            "seccomp": self.use_seccomp,
            "output_cap": self.output_cap_chars,
            "reply_cap": self.reply_cap_bytes,
            "tool_use_path": TOOL_USE_PATH,
        }


_WORKER_ENV = {
    "PYTHONHASHSEED": "0",  # set/dict-of-str order identical in every worker (determinism)
    "PYTHONDONTWRITEBYTECODE": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
}


# Printed by the worker's interpreter: where it imports from, as it starts in the worker (-s,
# cleared environment): sys.path plus the source directories of setuptools' editable finders
# (`__editable___<name>_finder.MAPPING`), which are meta-path hooks rather than sys.path entries.
_IMPORT_ROOTS_SCRIPT = """
import json, sys
roots = [entry for entry in sys.path if entry]
for name, module in list(sys.modules.items()):
    mapping = getattr(module, "MAPPING", None)
    if name.startswith("__editable__") and isinstance(mapping, dict):
        roots += [path for path in mapping.values() if isinstance(path, str)]
print(json.dumps(roots))
"""


def worker_python() -> str:
    """The interpreter workers run: this process's, unresolved, so a venv's stays a venv's."""
    if not sys.executable:
        raise SandboxUnavailable("sys.executable is empty: no Python interpreter to run workers")
    return os.path.abspath(sys.executable)


def _import_roots(python: str) -> list[str]:
    """The directories and archives `python -s` imports from when started as the worker is."""
    try:
        done = subprocess.run([python, "-s", "-B", "-c", _IMPORT_ROOTS_SCRIPT], cwd="/",
                              env=dict(_WORKER_ENV), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"cannot run the worker interpreter {python}: {exc}") from exc
    if done.returncode != 0:
        raise SandboxUnavailable(f"the worker interpreter {python} fails in a cleared "
                                 f"environment: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def exposes_host_secrets(path: str) -> bool:
    """True for `/` and other directories holding /etc, /root or a home directory: binding one
    would show the sandbox (mapped to the host's root) files such as /etc/shadow."""
    path = os.path.abspath(path)
    guarded = ("/etc", "/root", "/home", os.path.expanduser("~"))
    return any(g == path or g.startswith(path.rstrip("/") + "/") for g in guarded)


@functools.cache
def _readonly_binds() -> tuple[tuple[str, str], ...]:
    """(host path, sandbox path) of every read-only bind the worker needs, outermost first."""
    python = worker_python()
    needed = [sys.prefix, sys.base_prefix, SANDBOX_DIR, TOOL_USE_PATH, os.path.dirname(python),
              os.path.dirname(os.path.realpath(python)), *_import_roots(python)]
    sources: dict[str, str] = {}
    for path in map(os.path.abspath, needed):
        if not os.path.exists(path):
            continue
        real = os.path.realpath(path)
        if exposes_host_secrets(path) or exposes_host_secrets(real):
            log.warning("sandbox: not binding %s: it would expose host secrets", path)
            continue
        sources.setdefault(path, real)
        sources.setdefault(real, real)
    kept: list[str] = []
    for target in sorted(sources, key=len):
        if not any(target == k or target.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(target)
    return tuple((sources[target], target) for target in kept)


def bwrap_prefix(config: SandboxConfig) -> list[str]:
    """The bubblewrap arguments that precede the worker's own command."""
    args = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        "--ro-bind", "/usr", "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # The private /tmp comes before the read-only binds, so code installed under /tmp (a
    # checkout in /tmp, say) stays visible instead of being hidden by the tmpfs.
    args += ["--dev", "/dev", "--proc", "/proc",
             "--size", str(config.tmpfs_bytes), "--tmpfs", "/tmp"]
    for source, target in _readonly_binds():
        args += ["--ro-bind", source, target]
    for path in config.read_only_paths:
        args += ["--ro-bind", os.path.realpath(path), path]
    args += ["--chdir", "/tmp", "--clearenv"]
    for key, value in _WORKER_ENV.items():
        args += ["--setenv", key, value]
    return args + ["--die-with-parent", "--new-session", "--"]


def worker_command(config: SandboxConfig) -> list[str]:
    """Full argv of a worker: [bwrap ...] python -s -B worker.py CONFIG."""
    python = [worker_python(), "-s", "-B", WORKER_SCRIPT,
              json.dumps(config.worker_config(), separators=(",", ":"))]
    return (bwrap_prefix(config) + python) if config.use_bwrap else python


def worker_env(config: SandboxConfig) -> dict:
    """Minimal environment for the launched process, bwrap included: bwrap's own pid-1 copy
    inside the namespace exposes its environment via /proc/1/environ, so it must hold no
    host secrets."""
    del config
    return dict(_WORKER_ENV)


@dataclasses.dataclass(frozen=True)
class Layers:
    """Which isolation layers a probe found working."""

    bwrap: bool
    seccomp: bool
    rlimits: tuple[str, ...]
    detail: str = ""

    def describe(self) -> str:
        """One line for the log."""
        text = (f"bwrap={'on' if self.bwrap else 'OFF'} seccomp={'on' if self.seccomp else 'OFF'} "
                f"rlimits={','.join(self.rlimits) or 'none'}")
        return f"{text} ({self.detail})" if self.detail else text


def check_policy(config: SandboxConfig, layers: Layers) -> None:
    """Refuse untrusted code when the filesystem/namespace layer is missing, unless unsafe."""
    if layers.bwrap or config.allow_unsafe:
        if not layers.seccomp:
            log.warning("sandbox: seccomp layer is off (%s)", layers.describe())
        return
    raise SandboxUnavailable(
        "bubblewrap isolation is not working here, and rlimits alone do not contain designer "
        f"code (a host file write got through in that mode). Probe: {layers.describe()}. "
        "Install bubblewrap and enable unprivileged user namespaces "
        "(sysctl kernel.unprivileged_userns_clone=1), or pass allow_unsafe=True to run "
        "without it on a throwaway machine."
    )
