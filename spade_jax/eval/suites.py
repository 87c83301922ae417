"""Every evaluation suite as a list of `EvalTask`s: the one entry point for launch/eval.py.

Play each task like any environment (`spade_jax.envs.load_env(task.code, max_turns=...)` or
`EnvPool.start(task.code, task.seed, max_turns=task.max_turns)`, then agent turns until done),
turn each result into a row with `report.episode_record` (the return is clip(last reward, -1, 1)
if terminated, else 0; crashed episodes -1), and write rows and summary with
`report.write_results(out_dir, rows, ks=...)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from spade_jax.eval import bfcl, games, humaneval, reasoning_gym
from spade_jax.eval.tasks import EvalTask

SUITES = ("bfcl", "humaneval", "reasoning_gym", "games")


def build_eval_tasks(
    suites: Sequence[str] = ("bfcl", "humaneval", "reasoning_gym"),
    *,
    bfcl_categories: Sequence[str] = bfcl.CATEGORIES,
    bfcl_limit: int | None = None,
    bfcl_step_limit: int | None = None,
    humaneval_samples: int = 1,
    humaneval_limit: int | None = None,
    reasoning_gym_categories: Sequence[str] = reasoning_gym.DEFAULT_CATEGORIES,
    reasoning_gym_size: int = 50,
    reasoning_gym_seed: int = 0,
    games_dir: str | Path | None = None,
    games_seeds: int = 8,
    games_max_turns: int = 25,
) -> dict[str, list[EvalTask]]:
    """Tasks per suite name; `*_limit` keep the first items of a suite (None: all).

    `bfcl_step_limit` overrides BFCL's calls-per-user-turn limit (None: BFCL's own).
    """
    unknown = [name for name in suites if name not in SUITES]
    if unknown:
        raise ValueError(f"unknown eval suites {unknown}; choose from {SUITES}")
    tasks: dict[str, list[EvalTask]] = {}
    for name in suites:
        if name == "bfcl":
            tasks[name] = bfcl.bfcl_tasks(
                bfcl_categories, limit=bfcl_limit, step_limit=bfcl_step_limit
            )
        elif name == "humaneval":
            tasks[name] = humaneval.humaneval_tasks(humaneval_samples, limit=humaneval_limit)
        elif name == "reasoning_gym":
            tasks[name] = reasoning_gym.reasoning_gym_tasks(
                reasoning_gym_categories, size=reasoning_gym_size, dataset_seed=reasoning_gym_seed
            )
        else:
            if games_dir is None:
                raise ValueError("the games suite needs games_dir (a directory of env files)")
            tasks[name] = games.game_tasks(games_dir, games_seeds, games_max_turns)
    return tasks
