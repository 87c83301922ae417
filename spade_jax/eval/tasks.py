"""Evaluation tasks: environment code text plus the seed to play it with.

Every benchmark item is an `EvalTask`: the source of an environment under our contract
(docs/DESIGN.md §4.3) that the sandbox loads exactly like a generated environment
(`spade_jax.envs.load_env(task.code, max_turns=task.max_turns)`), and the seed for `reset`. The env
modules in this package (`*_env.py`) import only the standard library and the benchmark's own
package, so their text runs in a sandbox worker even where `spade_jax` is not importable; the
item they serve is bound by appending `BOUND_KWARGS = {...}` to the module text.

`EvalTask.make_local()` runs the same text in this process. It is for trusted action scripts
(ground-truth replay in tests); model output must be played through the sandbox.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path
from types import ModuleType
from typing import Any


@dataclasses.dataclass(frozen=True)
class EvalTask:
    """One evaluation episode: environment code, seed, and where its score is reported."""

    suite: str  # "bfcl", "humaneval", "reasoning_gym", "games"
    category: str  # e.g. "multi_turn_base", "basic_arithmetic", a game file stem
    task_id: str  # unique within the suite
    code: str  # environment source under our contract (exactly one *Env class)
    seed: int = 0
    max_turns: int = 1
    local_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def make_local(self, **overrides: Any) -> Any:
        """Instantiate the environment in this process (trusted actions only, e.g. tests)."""
        env_cls = env_class_from_code(self.code)
        return env_cls(max_turns=self.max_turns, **{**self.local_kwargs, **overrides})


def bound_env_code(module: ModuleType, **kwargs: Any) -> str:
    """Return `module`'s source with `BOUND_KWARGS` set to `kwargs` (literals only)."""
    source = Path(module.__file__).read_text()
    literal = repr(kwargs)
    if ast.literal_eval(literal) != kwargs:
        raise ValueError(f"bound kwargs of {module.__name__} must be Python literals")
    return f"{source}\n\nBOUND_KWARGS = {literal}\n"


@functools.lru_cache(maxsize=64)
def _compiled(code: str):
    """`code` compiled once (a replay instantiates the same task's environment many times)."""
    return compile(code, "<eval env>", "exec")


def env_class_from_code(code: str) -> type:
    """Execute environment source in a fresh namespace and return its single `*Env` class."""
    namespace: dict[str, Any] = {"__name__": "spade_eval_env"}
    exec(_compiled(code), namespace)  # noqa: S102 - trusted callers only
    classes = [
        value
        for name, value in namespace.items()
        if isinstance(value, type) and name.endswith("Env") and value.__module__ == "spade_eval_env"
    ]
    if len(classes) != 1:
        names = [cls.__name__ for cls in classes]
        raise ValueError(f"environment code must define exactly one *Env class, found {names}")
    return classes[0]


def replay_actions(env: Any, seed: int, actions: list[str]) -> tuple[float, bool, dict]:
    """Play `actions` from `reset(seed)`; return (episode return, terminated, last info).

    The return follows the contract: clip(last reward, -1, 1) if terminated, else 0.
    """
    env.reset(seed=seed)
    reward, terminated, truncated, info = 0.0, False, False, {}
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    episode_return = max(-1.0, min(1.0, float(reward))) if terminated else 0.0
    return episode_return, terminated, info
