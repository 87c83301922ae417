"""Result files, summary rows, markdown and run comparison (pure functions, golden values)."""

import json

import pytest

from spade_jax.eval.report import (
    compare,
    episode_record,
    markdown_table,
    read_jsonl,
    summarize,
    write_results,
)
from spade_jax.eval.tasks import EvalTask


def _record(suite, category, task_id, ret, hint=False):
    task = EvalTask(suite=suite, category=category, task_id=task_id, code="")
    return episode_record(task, ret, hint=hint)


RECORDS = [
    _record("bfcl", "multi_turn_base", "b0", 1.0),
    _record("bfcl", "multi_turn_base", "b1", 0.0),
    _record("bfcl", "multi_turn_miss_func", "m0", 1.0),
    _record("humaneval", "humaneval", "H/0", 1.0),
    _record("humaneval", "humaneval", "H/0", 0.0),
    _record("humaneval", "humaneval", "H/1", 0.0),
    _record("humaneval", "humaneval", "H/1", 0.0),
    _record("games", "guess", "guess/0", 0.5, hint=True),
]


def _rows(summary):
    return {(r["suite"], r["category"], r["hint"]): r for r in summary["rows"]}


def test_summary_rows_and_unweighted_suite_mean():
    rows = _rows(summarize(RECORDS, ks=(1, 2)))
    base = rows[("bfcl", "multi_turn_base", False)]
    assert (base["episodes"], base["items"], base["mean_return"]) == (2, 2, 0.5)
    assert rows[("bfcl", "(mean)", False)]["mean_return"] == pytest.approx(0.75)  # (0.5 + 1) / 2
    humaneval = rows[("humaneval", "humaneval", False)]
    assert humaneval["pass@1"] == pytest.approx(0.25)  # (1/2 + 0) / 2
    assert humaneval["pass@2"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert "pass@2" not in base  # one sample per item
    assert rows[("games", "guess", True)]["solved"] == 0.0


def test_markdown_table_lists_categories_then_mean():
    table = markdown_table(summarize(RECORDS))
    lines = table.splitlines()
    assert lines[0].startswith("| suite | category | hint |") and "pass@1" in lines[0]
    bfcl = [line for line in lines if line.startswith("| bfcl")]
    assert [line.split(" | ")[1] for line in bfcl] == [
        "multi_turn_base",
        "multi_turn_miss_func",
        "(mean)",
    ]
    assert "| 0.750 |" in bfcl[-1]


def test_write_results_and_compare(tmp_path):
    summary_a = write_results(tmp_path / "a", RECORDS)
    better = [dict(r, **{"return": 1.0}) if r["task_id"] == "b1" else r for r in RECORDS]
    write_results(tmp_path / "b", better)
    assert read_jsonl(tmp_path / "a" / "items.jsonl") == json.loads(json.dumps(RECORDS))
    assert json.loads((tmp_path / "a" / "summary.json").read_text()) == summary_a
    assert (tmp_path / "a" / "summary.md").read_text() == markdown_table(summary_a)
    table = compare(tmp_path / "a", tmp_path / "b")
    assert "| bfcl | multi_turn_base | no | 0.500 | 1.000 | +0.500 |" in table
    assert "| humaneval | humaneval | no | 0.250 | 0.250 | +0.000 |" in table


def test_write_results_replaces_previous_items(tmp_path):
    write_results(tmp_path, RECORDS)
    write_results(tmp_path, RECORDS[:1])
    assert len(read_jsonl(tmp_path / "items.jsonl")) == 1
