"""Held-out game environments (a directory of `.py` files under our contract) as eval tasks.

Each file is one environment, played with seeds `0..n_seeds-1`; the file text goes to the
sandbox unchanged. Files are only parsed here (never executed) to check the one-`*Env`-class
rule early, with the file named in the error.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from spade_jax.envs.lint import parse_source
from spade_jax.eval.tasks import EvalTask


def env_class_name(code: str, origin: str = "<code>") -> str:
    """The single top-level class whose name ends in "Env"; ValueError naming `origin` else."""
    try:
        tree = parse_source(code)
    except SyntaxError as error:
        raise ValueError(f"{origin}: does not parse: {error}") from error
    names = [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name.endswith("Env")
    ]
    if len(names) != 1:
        raise ValueError(f"{origin}: needs exactly one top-level *Env class, found {names}")
    return names[0]


def game_tasks(directory: str | Path, n_seeds: int = 8, max_turns: int = 25) -> list[EvalTask]:
    """`n_seeds` tasks per `*.py` file of `directory` (sorted by name; category = file stem)."""
    directory = Path(directory)
    files = sorted(directory.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"no environment files (*.py) in {directory}")
    return named_game_tasks([(path.stem, path.read_text(), str(path)) for path in files],
                            n_seeds, max_turns)


def named_game_tasks(
    games: Iterable[tuple[str, str, str]], n_seeds: int = 8, max_turns: int = 25
) -> list[EvalTask]:
    """`n_seeds` tasks per (name, code, origin) game; category = name, seeds 0..n_seeds-1."""
    tasks = []
    for name, code, origin in games:
        env_class_name(code, origin)
        for seed in range(n_seeds):
            tasks.append(
                EvalTask(
                    suite="games",
                    category=name,
                    task_id=f"{name}/{seed}",
                    code=code,
                    seed=seed,
                    max_turns=max_turns,
                )
            )
    return tasks
