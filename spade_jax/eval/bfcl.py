"""BFCL v4 as evaluation tasks (host side): multi-turn, and the whole of BFCL-v4 for RQ2.

Loads entries and ground truth from the `bfcl-eval` wheel and binds each entry into the text of
`bfcl_env.py` (multi-turn; one environment per entry, so every entry gets its own backend
state) or `bfcl_single_env.py` (non-live and live single-turn). Each environment scores itself
with `bfcl_eval`'s own checker. Accuracy per category is the mean return; BFCL's multi-turn
overall score is the unweighted mean of the four category accuracies (`overall_accuracy`), and
its v4 overall score combines every group as its leaderboard does (`v4_overall_accuracy`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from spade_jax.eval import bfcl_env, bfcl_single_env
from spade_jax.eval.tasks import EvalTask, bound_env_code

CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
BFCL_INSTALL = bfcl_env.BFCL_INSTALL
SINGLE_TURN_INSTRUCTIONS = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls to "
    "achieve the purpose. If none of the functions can be used, point it out and make no call. "
    "If the given question lacks the parameters required by the function, also point it out.\n\n"
    "To call functions, write one block per call:\n"
    '<tool_call>{{"name": "function_name", "arguments": {{"param": "value"}}}}</tool_call>\n'
    "Several calls may also share one block as a JSON list. Your reply is final: give every "
    "call the request needs in it.\n\n"
    "Here is a list of functions in JSON format that you can invoke.\n{functions}\n"
)
# BFCL v4 overall = these weights over its group scores (bfcl_eval eval_runner_helper,
# generate_leaderboard_csv). The agentic group (web search, memory) needs network services
# and is not run, as in the reference's eval_offline/configs/tool_use.yaml; BFCL counts a
# group it did not run as 0.
V4_WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "agentic": 40}


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


def v4_categories() -> dict[str, list[str]]:
    """The installed bfcl-eval's categories per group: non_live, live and multi_turn."""
    bfcl_env.import_bfcl()
    from bfcl_eval.constants import category_mapping

    return {"non_live": list(category_mapping.NON_LIVE_CATEGORY),
            "live": list(category_mapping.LIVE_CATEGORY),
            "multi_turn": list(category_mapping.MULTI_TURN_CATEGORY)}


def single_turn_tasks(category: str, limit: int | None = None) -> list[EvalTask]:
    """One task (suite "bfcl_v4") per entry of a non-live or live category."""
    bfcl_env.import_bfcl()
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    # The prompt shows the docs with BFCL's language hints (Java / JavaScript types as strings);
    # its checker reads the docs as written, as BFCL's evaluator does.
    shown = load_dataset_entry(category)[:limit]
    as_written = load_dataset_entry(category, include_prereq=False,
                                    include_language_specific_hint=False)[:limit]
    answers = ({} if "relevance" in category else
               {row["id"]: row["ground_truth"] for row in load_ground_truth_entry(category)})
    tasks = []
    for entry, raw in zip(shown, as_written, strict=True):
        question = "\n".join(message["content"] for message in entry["question"][0])
        prompt = SINGLE_TURN_INSTRUCTIONS.format(
            functions=bfcl_env.function_schemas(entry["function"])) + "\n" + question
        answer = answers.get(entry["id"])
        code = bound_env_code(
            bfcl_single_env, prompt=prompt, entry_json=json.dumps(raw), category=category,
            possible_answer_json=None if answer is None else json.dumps(answer))
        tasks.append(EvalTask("bfcl_v4", category, entry["id"], code))
    return tasks


def v4_tasks(limit: int | None = None, step_limit: int | None = None) -> list[EvalTask]:
    """Every entry of every non-live, live and multi-turn category (suite "bfcl_v4"); with
    `limit`, the first `limit` entries of each category."""
    groups = v4_categories()
    tasks = [task for group in ("non_live", "live") for category in groups[group]
             for task in single_turn_tasks(category, limit)]
    multi_turn = bfcl_tasks(groups["multi_turn"], limit=limit, step_limit=step_limit)
    return tasks + [dataclasses.replace(task, suite="bfcl_v4") for task in multi_turn]


def v4_overall_accuracy(scores: dict[str, tuple[float, int]]) -> float:
    """BFCL v4's overall accuracy from (accuracy, entries) per category, as its leaderboard
    combines them: non-live AST (simple averaged over its languages), live AST (weighted by
    entries), irrelevance (non-live and live), multi-turn, and agentic (not run: 0)."""
    def accuracy(category):
        if category not in scores:
            raise ValueError(f"no score for BFCL category {category!r}")
        return scores[category][0]

    def mean(values):
        return sum(values) / len(values)

    simple = mean([accuracy(c) for c in ("simple_python", "simple_java", "simple_javascript")])
    live = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
    live_entries = sum(scores[c][1] for c in live if c in scores)
    groups = {
        "non_live": mean([simple, *(accuracy(c) for c in
                                    ("multiple", "parallel", "parallel_multiple"))]),
        "live": sum(accuracy(c) * scores[c][1] for c in live) / max(live_entries, 1),
        "irrelevance": mean([accuracy("irrelevance"), accuracy("live_irrelevance")]),
        "multi_turn": overall_accuracy({c: accuracy(c) for c in CATEGORIES}),
        "agentic": 0.0,
    }
    return sum(V4_WEIGHTS[g] * value for g, value in groups.items()) / sum(V4_WEIGHTS.values())
