"""BFCL v4 multi-turn as evaluation tasks (host side).

Loads entries and ground truth from the `bfcl-eval` wheel and binds each entry into the text of
`bfcl_env.py` (one environment per entry, so every entry gets its own backend state). The
environment scores itself with `bfcl_eval`'s multi-turn checker at the end of the last turn.
Accuracy per category is the mean return; BFCL's multi-turn overall score is the unweighted
mean of the four category accuracies (`overall_accuracy`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from spade_jax.eval import bfcl_env
from spade_jax.eval.tasks import EvalTask, bound_env_code

CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
BFCL_INSTALL = bfcl_env.BFCL_INSTALL


def load_entries(category: str) -> list[tuple[dict, list[list[str]]]]:
    """(entry with function docs, ground-truth calls per turn) for every entry of a category."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; choose from {CATEGORIES}")
    bfcl_env.import_bfcl()
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    entries = load_dataset_entry(category)
    truths = {row["id"]: row["ground_truth"] for row in load_ground_truth_entry(category)}
    return [(entry, truths[entry["id"]]) for entry in entries]


def bfcl_tasks(
    categories: Sequence[str] = CATEGORIES, limit: int | None = None, step_limit: int | None = None
) -> list[EvalTask]:
    """One task per entry of each category (the first `limit` per category when given).

    `max_turns` leaves room for BFCL's per-turn step limit in every user turn, so only the
    environment's own force-quit (a failed entry) ends a long episode.
    """
    step_limit = bfcl_env.import_bfcl()["step_limit"] if step_limit is None else step_limit
    tasks = []
    for category in categories:
        for entry, truth in load_entries(category)[:limit]:
            code = bound_env_code(
                bfcl_env,
                entry_json=json.dumps(entry),
                ground_truth_json=json.dumps(truth),
                step_limit=step_limit,
            )
            tasks.append(
                EvalTask(
                    suite="bfcl",
                    category=category,
                    task_id=entry["id"],
                    code=code,
                    max_turns=len(truth) * (step_limit + 2),
                )
            )
    return tasks


def overall_accuracy(accuracy_by_category: dict[str, float]) -> float:
    """BFCL's multi-turn overall score: the unweighted mean of the category accuracies."""
    if not accuracy_by_category:
        raise ValueError("no category accuracies to average")
    return sum(accuracy_by_category.values()) / len(accuracy_by_category)
