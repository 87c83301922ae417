"""Environments: the contract, the sandboxed runtime (EnvPool, load_env) and validation.

The package never executes designer code in this process: see `sandbox/` for the workers.
"""

from spade_jax.envs.contract import extract_code, hint_leaks, solution_actions
from spade_jax.envs.gym_env import EnvCrashed, SandboxedEnv, load_env
from spade_jax.envs.sandbox import (
    CallResult,
    EnvPool,
    SandboxConfig,
    SandboxUnavailable,
    StepResult,
)
from spade_jax.envs.validate import ValidationReport, validate

__all__ = [
    "CallResult", "EnvCrashed", "EnvPool", "SandboxConfig", "SandboxUnavailable", "SandboxedEnv",
    "StepResult", "ValidationReport", "extract_code", "hint_leaks", "load_env",
    "solution_actions", "validate",
]
