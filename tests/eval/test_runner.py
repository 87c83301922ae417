"""The evaluation runner on the tiny random model: real sampler, real sandbox, result files."""

import json

import jax
import pytest

pytest.importorskip("reasoning_gym")

from spade_jax.config import load_config_file, parse  # noqa: E402
from spade_jax.errors import MissingFileError  # noqa: E402
from spade_jax.eval import report, runner  # noqa: E402
from spade_jax.eval.tasks import EvalTask  # noqa: E402

MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def runtime():
    from spade_jax.spade.runtime import Runtime

    rt = Runtime.create(parse(load_config_file("tiny"), 1), jax.devices()[:1])
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def tasks():
    return runner.build_tasks("games,reasoning_gym", limit=2, games_max_turns=2)


def _task(category: str, index: int) -> EvalTask:
    return EvalTask("s", category, f"{category}/{index}", "class AEnv: pass", seed=index)


def test_suite_names_map_to_builders_and_unknown_ones_are_refused():
    assert runner.parse_suites("bfcl_multi_turn, games") == ["bfcl", "games"]
    assert runner.parse_suites(["humaneval", "reasoning_gym"]) == ["humaneval", "reasoning_gym"]
    with pytest.raises(ValueError, match="unknown eval suites .*'bfcl'.*choose from"):
        runner.parse_suites("bfcl")
    with pytest.raises(ValueError, match="unknown eval suites"):
        runner.parse_suites("")


def test_fixed_subset_takes_categories_round_robin():
    tasks = [_task("a", 0), _task("a", 1), _task("a", 2), _task("b", 0), _task("c", 0)]
    chosen = runner.fixed_subset(tasks, 4)
    assert [t.task_id for t in chosen] == ["a/0", "b/0", "c/0", "a/1"]
    assert runner.fixed_subset(tasks, None) == tasks


def test_only_games_with_their_own_hint_get_a_hinted_variant(tasks):
    hinted = {t.suite: runner.defines_hint(t.code) for t in tasks}
    assert hinted == {"games": True, "reasoning_gym": False}
    assert [t.suite for t in tasks] == ["games"] * 2 + ["reasoning_gym"] * 2
    assert len({t.category for t in tasks}) == 4  # spread over categories


def test_evaluate_writes_items_and_summary_then_resumes(runtime, tasks, tmp_path, monkeypatch):
    summary = runner.evaluate(runtime, tasks, tmp_path, decoding=runner.greedy(MAX_NEW_TOKENS),
                              progress=False)
    rows = report.read_jsonl(tmp_path / report.ITEMS_FILE)
    assert len(rows) == 6  # 2 games with and without hint, 2 reasoning-gym items
    assert sum(r["hint"] for r in rows) == 2
    assert all(r["info"]["hint_shown"] for r in rows if r["hint"])
    # Whatever the random model emits, every episode starts and plays at least one turn.
    played = [(r["task_id"], r["info"]["status"], r["n_steps"], len(r["info"]["replies"]))
              for r in rows]
    assert all(n_steps >= 1 and n_replies >= 1 for _, _, n_steps, n_replies in played), played
    assert json.loads((tmp_path / report.SUMMARY_JSON).read_text()) == summary
    table = (tmp_path / report.SUMMARY_MD).read_text()
    for line in ("| games | (mean) | no |", "| games | (mean) | yes |",
                 "| reasoning_gym | (mean) | no |"):
        assert line in table

    # Forget one scored row: a rerun plays exactly that episode and keeps the others.
    (tmp_path / report.ITEMS_FILE).write_text(
        "".join(json.dumps(r) + "\n" for r in rows[:-1]))
    played = []
    real_play = runner.play_episodes

    def counting_play(specs, **kwargs):
        played.extend(specs)
        return real_play(specs, **kwargs)

    monkeypatch.setattr(runner, "play_episodes", counting_play)
    runner.evaluate(runtime, tasks, tmp_path, decoding=runner.greedy(MAX_NEW_TOKENS),
                    progress=False)
    assert [(s.env_id, s.hint is not None) for s in played] == [
        (rows[-1]["task_id"], rows[-1]["hint"])]
    assert len(report.read_jsonl(tmp_path / report.ITEMS_FILE)) == 6


def test_summary_metrics_names():
    records = [report.episode_record(_task("a", 0), 1.0),
               report.episode_record(_task("a", 0), 0.0, hint=True)]
    metrics = runner.summary_metrics(report.summarize(records))
    assert metrics == {"eval/s/a": 1.0, "eval/s/mean": 1.0, "eval/s/a/hint": 0.0,
                       "eval/s/mean/hint": 0.0}


def test_in_loop_eval_logs_metrics_and_a_checkpoint_restores(runtime, tmp_path, monkeypatch):
    from spade_jax.spade import driver

    def empty_cycle(rt, cfg, state, corpus, artifacts):  # the hook, not the cycle, is tested
        state.cycle += 1
        return {}

    monkeypatch.setattr(driver, "run_cycle", empty_cycle)
    cfg = load_config_file("tiny")
    cfg.total_cycles = 1
    cfg.eval.every = 1
    cfg.eval.limit = 1
    cfg.eval.suites = "games,reasoning_gym"
    driver.run_training(cfg, str(tmp_path), runtime=runtime)
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = {key for key in row if key.startswith("eval/")}
    assert {"eval/games/mean", "eval/reasoning_gym/mean"} <= evals
    assert len(evals) == 4  # one category per suite, plus the suite means; no hinted rows
    assert (tmp_path / "eval" / "cycle_00000" / report.SUMMARY_MD).is_file()

    assert runner.restore_checkpoint(runtime, tmp_path / "checkpoints" / "1") == 1
    assert runner.restore_checkpoint(runtime, tmp_path) == 1
    with pytest.raises(MissingFileError, match="no checkpoints under"):
        runner.restore_checkpoint(runtime, tmp_path / "eval")
