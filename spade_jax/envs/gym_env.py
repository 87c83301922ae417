"""Expose a sandboxed environment as a real `gymnasium.Env` (Text spaces, TimeLimit).

The designer's class never runs in this process: every `reset` starts a fresh worker from the
pool (so `random.seed(seed)` inside the environment is deterministic and no state survives an
episode) and `step` is one round trip. A crash or timeout mid-episode ends it with
`truncated=True`, reward 0 and `info["status"]` set to "crashed"/"timeout"; a failing `reset`
raises `EnvCrashed`, since gymnasium has no way to return a failed reset.
"""

import string

import gymnasium
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

from spade_jax.envs.sandbox import EnvPool, SandboxConfig

MAX_OBSERVATION_CHARS = 1_000_000
MAX_ACTION_CHARS = 100_000


class EnvCrashed(RuntimeError):
    """The sandboxed environment failed to load or reset."""


class SandboxedEnv(gymnasium.Env):
    """A gymnasium view of designer code running in an `EnvPool` worker."""

    metadata = {"render_modes": []}

    def __init__(self, code: str, *, max_turns: int = 25, pool: EnvPool | None = None):
        self.code, self.max_turns = code, max_turns
        self._own_pool = pool is None
        self.pool = pool or EnvPool(SandboxConfig(), warm=1, max_turns=max_turns)
        self.observation_space = spaces.Text(MAX_OBSERVATION_CHARS, min_length=0,
                                             charset=string.printable)
        self.action_space = spaces.Text(MAX_ACTION_CHARS, min_length=0, charset=string.printable)
        loaded = self.pool.open(code, max_turns=max_turns)
        if not loaded.ok:
            self.pool.close(loaded.handle)
            raise EnvCrashed(f"environment failed to load ({loaded.status}): {loaded.error}")
        self.env_class = loaded.env_class
        self._handle, self._fresh = loaded.handle, True

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset in a fresh worker; without a seed, one is drawn from `self.np_random`."""
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        if not self._fresh:
            self.pool.close(self._handle)
            loaded = self.pool.open(self.code, max_turns=self.max_turns)
            self._handle = loaded.handle
            if not loaded.ok:
                raise EnvCrashed(f"environment failed to load ({loaded.status}): {loaded.error}")
        self._fresh = False
        result = self.pool.reset(self._handle, seed)
        if not result.ok:
            raise EnvCrashed(f"reset(seed={seed}) failed ({result.status}): {result.error}")
        return result.observation, dict(result.info)

    def step(self, action: str):
        """One sandboxed step; failures end the episode instead of raising."""
        result = self.pool.step(self._handle, str(action))
        if not result.ok:
            info = {"status": result.status, "error": result.error}
            return "", 0.0, False, True, info
        info = dict(result.info)
        return result.observation, result.reward, result.terminated, result.truncated, info

    def close(self):
        """Kill the worker (and the private pool, if this env made one)."""
        self.pool.close(self._handle)
        if self._own_pool:
            self.pool.shutdown()
        super().close()


def load_env(code: str, *, max_turns: int = 25, pool: EnvPool | None = None) -> gymnasium.Env:
    """Load designer code in the sandbox as `TimeLimit(SandboxedEnv(code), max_turns)`.

    Raises EnvCrashed when the code does not load (syntax error, no/two *Env classes, raising
    __init__); SandboxUnavailable when no safe sandbox exists on this machine.
    """
    env = SandboxedEnv(code, max_turns=max_turns, pool=pool)
    return TimeLimit(env, max_episode_steps=max_turns)
