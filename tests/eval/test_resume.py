"""A long evaluation killed part-way continues from its written rows (no model: plays stubbed)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from spade_jax.eval import report, runner
from spade_jax.eval.tasks import EvalTask
from spade_jax.spade.rollout import Episode, EpisodeStatus

TASKS = [EvalTask("s", "c", f"item/{i}", "class AEnv: pass", seed=0) for i in range(5)]


class _Killed(BaseException):
    """Stands for the process being killed between two batches."""


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "reply"


def _runtime():
    return SimpleNamespace(sampler=None, chat=SimpleNamespace(tokenizer=_Tokenizer()),
                           run=SimpleNamespace(sandbox=None,
                                               sampling=SimpleNamespace(max_context=256)))


def _episode(spec):
    won = int(spec.env_id.split("/")[1]) % 2 == 0
    return Episode(spec, tokens=np.array([1, 2]), loss_mask=np.array([0, 1]),
                   behaviour_logp=np.zeros(2), rewards=[1.0 if won else 0.0], terminated=True,
                   status=EpisodeStatus.OK, turns=1, generated_tokens=1)


@pytest.fixture
def plays(monkeypatch):
    """The env ids each batch played; `plays.kill_at` batches in, the run is killed."""
    played = SimpleNamespace(batches=[], kill_at=None)

    def play(specs, **kwargs):
        if len(played.batches) == played.kill_at:
            raise _Killed()
        played.batches.append([spec.env_id for spec in specs])
        return [_episode(spec) for spec in specs]

    monkeypatch.setattr(runner, "play_episodes", play)
    monkeypatch.setattr(runner, "_eval_pool",
                        lambda sandbox, overrides: SimpleNamespace(shutdown=lambda: None))
    return played


def _evaluate(out, **kwargs):
    return runner.evaluate(_runtime(), TASKS, out, decoding=runner.greedy(4), batch_size=2,
                           with_hints=False, **kwargs)


def test_a_killed_eval_continues_from_its_written_rows(tmp_path, plays, capsys):
    plays.kill_at = 2
    with pytest.raises(_Killed):
        _evaluate(tmp_path, progress=False)
    rows = report.read_jsonl(tmp_path / report.ITEMS_FILE)
    assert [r["task_id"] for r in rows] == [f"item/{i}" for i in range(4)]  # two batches
    assert not (tmp_path / report.SUMMARY_JSON).exists()

    plays.kill_at = None
    summary = _evaluate(tmp_path)
    assert plays.batches[2:] == [["item/4"]]  # only the episode not yet scored
    assert "4/5" in capsys.readouterr().err  # the bar starts at the rows already scored
    rows = report.read_jsonl(tmp_path / report.ITEMS_FILE)
    assert [r["task_id"] for r in rows] == [f"item/{i}" for i in range(5)]
    (mean,) = [row for row in summary["rows"] if row["category"] == report.SUITE_MEAN]
    assert mean["episodes"] == 5 and mean["mean_return"] == pytest.approx(3 / 5)


def test_a_row_torn_by_the_kill_is_replayed(tmp_path, plays):
    _evaluate(tmp_path, progress=False)
    items = tmp_path / report.ITEMS_FILE
    text = items.read_text()
    items.write_text(text[:-20])  # killed while writing the last row
    plays.batches.clear()
    _evaluate(tmp_path, progress=False)
    assert plays.batches == [["item/4"]]
    rows = [json.loads(line) for line in items.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == [f"item/{i}" for i in range(5)]
