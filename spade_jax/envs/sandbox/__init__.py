"""Sandboxed execution of designer-written environments: one bwrap+rlimits+seccomp worker each."""

from spade_jax.envs.sandbox.isolation import Layers, SandboxConfig, SandboxUnavailable
from spade_jax.envs.sandbox.pool import CRASHED, ERROR, OK, TIMEOUT, CallResult, EnvPool, StepResult
from spade_jax.envs.sandbox.probe import probe_layers

__all__ = [
    "CRASHED", "ERROR", "OK", "TIMEOUT", "CallResult", "EnvPool", "Layers", "SandboxConfig",
    "SandboxUnavailable", "StepResult", "probe_layers",
]
