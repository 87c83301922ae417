"""Start-up probe: which isolation layers actually work on this machine (cached per config).

Starts one worker with the requested layers and reads its `ready` line. If bubblewrap fails,
the reason is logged; with `allow_unsafe=True` the pool falls back to rlimits (+ seccomp),
otherwise `SandboxUnavailable` is raised. The result is logged once per configuration.
"""

import dataclasses
import logging
import select
import subprocess

from spade_jax.envs.sandbox.isolation import (
    SANDBOX_UID,
    Layers,
    SandboxConfig,
    bwrap_prefix,
    check_policy,
    worker_python,
)
from spade_jax.envs.sandbox.process import WorkerProcess

log = logging.getLogger(__name__)
_CACHE: dict[SandboxConfig, tuple[Layers, SandboxConfig]] = {}


def _ready_info(config: SandboxConfig) -> dict | None:
    """The worker's ready message, or None if it did not start within the start timeout."""
    worker = WorkerProcess(config)
    try:
        select.select([worker.fileno()], [], [], config.start_timeout_s)
        replies, eof = worker.read_replies()
        while not replies and not eof:
            if not select.select([worker.fileno()], [], [], config.start_timeout_s)[0]:
                return None
            replies, eof = worker.read_replies()
        return replies[0] if replies and replies[0].get("ready") else None
    except Exception as exc:  # noqa: BLE001 - any failure means "this layer set does not work"
        log.warning("a sandbox worker (bwrap=%s, seccomp=%s) failed to start: %r",
                    config.use_bwrap, config.use_seccomp, exc)
        return None
    finally:
        worker.kill()


def _bwrap_error(config: SandboxConfig) -> str:
    """bubblewrap's own error message, for the log."""
    try:
        done = subprocess.run(bwrap_prefix(config) + [worker_python(), "-c", "pass"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return done.stderr.strip()[-300:] or f"returncode {done.returncode}"


def probe_layers(config: SandboxConfig) -> tuple[Layers, SandboxConfig]:
    """(working layers, the config to use); raises SandboxUnavailable per `check_policy`."""
    if config in _CACHE:
        return _CACHE[config]
    effective, detail = config, ""
    info = _ready_info(config)
    if info is None and config.use_bwrap:
        detail = f"bwrap failed: {_bwrap_error(config)}"
        effective = dataclasses.replace(config, use_bwrap=False)
        info = _ready_info(effective) if config.allow_unsafe else None
    if info is None and effective.use_seccomp and config.allow_unsafe:
        detail += "; seccomp failed"
        effective = dataclasses.replace(effective, use_seccomp=False)
        info = _ready_info(effective)
    if info is None:
        layers = Layers(False, False, (), detail or "worker did not start")
    else:
        layers = Layers(
            bwrap=effective.use_bwrap and info.get("uid") == SANDBOX_UID,
            seccomp=bool(info["layers"].get("seccomp")),
            rlimits=tuple(info["layers"].get("rlimits", ())),
            detail=detail,
        )
    log.info("sandbox layers: %s", layers.describe())
    check_policy(config, layers)
    if info is None:
        from spade_jax.envs.sandbox.isolation import SandboxUnavailable

        raise SandboxUnavailable(f"sandbox worker does not start: {layers.describe()}")
    _CACHE[config] = (layers, effective)
    return layers, effective
