"""Evaluation results: per-episode JSONL, summary JSON, markdown tables, run comparison.

A record is one played episode (`episode_record`). The summary has one row per
(suite, category, hint) and one "(mean)" row per (suite, hint) that averages its categories
without weights (BFCL's multi-turn overall score is exactly that mean over its four
categories). Rows carry episodes, items, mean return, solved rate (return >= 1) and pass@k
for every requested k that all items of the row have enough samples for.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from etils import epath

from spade_jax.eval.humaneval import mean_pass_at_k
from spade_jax.eval.tasks import EvalTask
from spade_jax.workdir import open_append

log = logging.getLogger(__name__)

ITEMS_FILE = "items.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
SUITE_MEAN = "(mean)"


def episode_record(
    task: EvalTask,
    episode_return: float,
    *,
    hint: bool = False,
    crashed: bool = False,
    n_steps: int | None = None,
    info: dict | None = None,
) -> dict[str, Any]:
    """One result row for a played task (`episode_return` per the contract's return rule)."""
    return {
        "suite": task.suite,
        "category": task.category,
        "task_id": task.task_id,
        "seed": task.seed,
        "hint": hint,
        "return": float(episode_return),
        "crashed": crashed,
        "n_steps": n_steps,
        "info": info or {},
    }


def append_jsonl(path: str | Path, records: Iterable[dict]) -> None:
    """Append records to a JSONL file (one JSON object per line), creating parents.

    `path` may be local or `gs://` (a bucket object is rewritten whole: GCS has no append)."""
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_append(path) as handle:
        for record in records:
            handle.write(json.dumps(record, default=str) + "\n")


def resume_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSONL file whose writer may have been killed mid-line: a torn last line
    (no newline) is dropped, from the file too, so that appends continue on a clean line."""
    path = epath.Path(path)
    text = path.read_text()
    complete = text[:text.rfind("\n") + 1]
    if complete != text:
        log.warning("%s: dropping a torn last line of %d characters", path,
                    len(text) - len(complete))
        path.write_text(complete)
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSONL file."""
    with epath.Path(path).open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def summarize(records: Sequence[dict], ks: Sequence[int] = (1,)) -> dict[str, Any]:
    """Summary rows per (suite, category, hint) plus an unweighted "(mean)" row per suite."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in records:
        groups[(record["suite"], record["category"], bool(record["hint"]))].append(record)
    rows = [
        _row(suite, category, hint, group, ks) for (suite, category, hint), group in groups.items()
    ]
    rows.sort(key=lambda row: (row["suite"], row["hint"], row["category"]))
    suite_rows = defaultdict(list)
    for row in rows:
        suite_rows[(row["suite"], row["hint"])].append(row)
    means = [_mean_row(suite, hint, members) for (suite, hint), members in suite_rows.items()]
    return {"ks": list(ks), "rows": rows + sorted(means, key=lambda r: (r["suite"], r["hint"]))}


def markdown_table(summary: dict[str, Any]) -> str:
    """The summary as a markdown table (suites' "(mean)" rows after their categories)."""
    pass_columns = [f"pass@{k}" for k in summary["ks"]]
    header = ["suite", "category", "hint", "episodes", "items", "mean return", "solved"]
    lines = [md_line(header + pass_columns), md_line(["---"] * (len(header) + len(pass_columns)))]
    for row in _display_order(summary["rows"]):
        cells = [
            row["suite"],
            row["category"],
            "yes" if row["hint"] else "no",
            str(row["episodes"]),
            str(row["items"]),
            _fmt(row["mean_return"]),
            _fmt(row["solved"]),
        ] + [_fmt(row.get(column)) for column in pass_columns]
        lines.append(md_line(cells))
    return "\n".join(lines) + "\n"


def write_results(out_dir: str | Path, records: Sequence[dict], ks: Sequence[int] = (1,)) -> dict:
    """Write items.jsonl, summary.json and summary.md under `out_dir`; return the summary."""
    out_dir = epath.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / ITEMS_FILE).unlink(missing_ok=True)
    append_jsonl(out_dir / ITEMS_FILE, records)
    return write_summary(out_dir, records, ks)


def write_summary(out_dir: str | Path, records: Sequence[dict], ks: Sequence[int] = (1,)) -> dict:
    """Write summary.json and summary.md of `records` under `out_dir`; return the summary."""
    out_dir = epath.Path(out_dir)
    summary = summarize(records, ks)
    (out_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n")
    (out_dir / SUMMARY_MD).write_text(markdown_table(summary))
    return summary


def compare(dir_a: str | Path, dir_b: str | Path) -> str:
    """Markdown table of mean return per row in two result dirs, side by side, with B - A."""
    rows_a, rows_b = (_rows_by_key(load_summary(d)) for d in (dir_a, dir_b))
    names = (Path(dir_a).name or str(dir_a), Path(dir_b).name or str(dir_b))
    lines = [
        md_line(["suite", "category", "hint", names[0], names[1], "delta"]),
        md_line(["---"] * 6),
    ]
    ordered = _display_order([*rows_a.values(), *rows_b.values()])
    for key in dict.fromkeys((r["suite"], r["category"], r["hint"]) for r in ordered):
        a = rows_a.get(key, {}).get("mean_return")
        b = rows_b.get(key, {}).get("mean_return")
        delta = b - a if a is not None and b is not None else None
        hint = "yes" if key[2] else "no"
        lines.append(md_line([key[0], key[1], hint, _fmt(a), _fmt(b), _fmt(delta, signed=True)]))
    return "\n".join(lines) + "\n"


def load_summary(out_dir: str | Path) -> dict[str, Any]:
    """The summary.json of a result dir."""
    return json.loads((epath.Path(out_dir) / SUMMARY_JSON).read_text())


def _row(suite: str, category: str, hint: bool, group: list[dict], ks: Sequence[int]) -> dict:
    per_item: dict[str, list[bool]] = defaultdict(list)
    for record in group:
        per_item[record["task_id"]].append(record["return"] >= 1.0)
    row = {
        "suite": suite,
        "category": category,
        "hint": hint,
        "episodes": len(group),
        "items": len(per_item),
        "crashed": sum(bool(record.get("crashed")) for record in group),
        "mean_return": sum(record["return"] for record in group) / len(group),
        "solved": sum(record["return"] >= 1.0 for record in group) / len(group),
    }
    fewest_samples = min(len(samples) for samples in per_item.values())
    for k in ks:
        if k <= fewest_samples:
            row[f"pass@{k}"] = mean_pass_at_k(per_item.values(), k)
    return row


def _mean_row(suite: str, hint: bool, members: list[dict]) -> dict:
    row = {
        "suite": suite,
        "category": SUITE_MEAN,
        "hint": hint,
        "episodes": sum(m["episodes"] for m in members),
        "items": sum(m["items"] for m in members),
        "crashed": sum(m["crashed"] for m in members),
    }
    metrics = {key for m in members for key in m if key.startswith("pass@")}
    for key in ["mean_return", "solved", *sorted(metrics)]:
        if all(key in m for m in members):
            row[key] = sum(m[key] for m in members) / len(members)
    return row


def _display_order(rows: Iterable[dict]) -> list[dict]:
    return sorted(
        rows, key=lambda r: (r["suite"], r["hint"], r["category"] == SUITE_MEAN, r["category"])
    )


def _rows_by_key(summary: dict) -> dict[tuple, dict]:
    return {(r["suite"], r["category"], r["hint"]): r for r in summary["rows"]}


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def md_line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
