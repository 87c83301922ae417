"""BFCL v4 overall: every single-turn category scored by bfcl-eval's checker, the v4 roll-up."""

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval")

from spade_jax.eval import bfcl, tables  # noqa: E402
from spade_jax.eval.report import episode_record, read_jsonl  # noqa: E402
from tests.commands import command_env  # noqa: E402

ACEBENCH_DATA = Path(__file__).resolve().parent / "fixtures" / "acebench"  # rq2 needs its data
REFUSAL = "None of these functions fits the request, so I make no call."


def _play(task, reply):
    env = task.make_local()
    env.reset()
    _, reward, terminated, _, info = env.step(reply)
    assert terminated
    return reward, info


def _wrong_values(reply: str) -> str:
    """The reply's tool calls with every argument replaced by an unlikely string."""
    calls = json.loads(reply[len("<tool_call>"):-len("</tool_call>")])
    for call in calls:
        call["arguments"] = {key: "zzz-wrong" for key in call["arguments"]}
    return "<tool_call>" + json.dumps(calls) + "</tool_call>"


def test_the_installed_bfcl_ships_the_categories_the_overall_needs():
    groups = bfcl.v4_categories()
    assert len(groups["non_live"]) == 7 and len(groups["live"]) == 6
    assert groups["multi_turn"] == list(bfcl.CATEGORIES)


@pytest.mark.parametrize("category", [c for g in ("non_live", "live")
                                      for c in bfcl.v4_categories()[g]])
def test_every_single_turn_category_is_scored_by_bfcls_checker(category):
    (task,) = bfcl.single_turn_tasks(category, limit=1)
    assert (task.suite, task.category, task.max_turns) == ("bfcl_v4", category, 1)
    solution = task.make_local().solution()
    assert _play(task, solution)[0] == 1.0
    refused = _play(task, REFUSAL)[0]
    assert refused == (1.0 if "irrelevance" in category else 0.0)
    if "relevance" not in category:
        reward, info = _play(task, _wrong_values(solution))
        assert reward == 0.0 and info["error_type"], info


def test_python_call_syntax_is_decoded_by_bfcls_prompting_decoder():
    (task,) = bfcl.single_turn_tasks("simple_python", limit=1)
    env = task.make_local()
    (call,) = json.loads(env.solution()[len("<tool_call>"):-len("</tool_call>")])
    arguments = ", ".join(f"{key}={value!r}" for key, value in call["arguments"].items())
    assert _play(task, f"[{call['name']}({arguments})]")[0] == 1.0
    assert _play(task, "<tool_call>{not json</tool_call>")[1]["error_type"] == (
        "ast_decoder:decoder_failed")


def test_v4_overall_weighs_its_groups_as_bfcls_leaderboard():
    scores = {c: (0.0, 10) for g in bfcl.v4_categories().values() for c in g}
    scores.update({"simple_python": (0.9, 400), "simple_java": (0.6, 100),
                   "simple_javascript": (0.3, 50), "multiple": (0.8, 200),
                   "live_simple": (0.5, 100), "live_multiple": (1.0, 300),
                   "irrelevance": (1.0, 240), "multi_turn_base": (0.4, 200)})
    non_live = ((0.9 + 0.6 + 0.3) / 3 + 0.8 + 0 + 0) / 4
    live = (0.5 * 100 + 1.0 * 300) / (100 + 300 + 10 + 10)  # weighted by entries
    irrelevance = (1.0 + 0.0) / 2
    multi_turn = 0.4 / 4
    expected = (10 * non_live + 10 * live + 10 * irrelevance + 30 * multi_turn) / 100
    assert bfcl.v4_overall_accuracy(scores) == pytest.approx(expected)
    del scores["live_relevance"]  # not part of the overall
    assert bfcl.v4_overall_accuracy(scores) == pytest.approx(expected)
    del scores["simple_java"]
    with pytest.raises(ValueError, match="simple_java"):
        bfcl.v4_overall_accuracy(scores)


def test_rq2_table_runs_bfcl_v4_and_needs_every_category_for_its_value():
    settings = tables.table_settings("rq2")
    assert settings["bfcl_v4"].decoding.temperature == 0.0
    assert tables.runnable_suites("rq2", settings) == ["bfcl_v4", "tau2", "acebench"]
    settings["tau2"] = dataclasses.replace(settings["tau2"], unavailable="no clone in the data")
    tasks = tables.table_tasks("rq2", settings, data_dir=ACEBENCH_DATA, limit=17)["bfcl_v4"]
    categories = [c for g in bfcl.v4_categories().values() for c in g]
    assert sorted(t.category for t in tasks) == sorted(categories)  # one entry of each
    records = [episode_record(t, 1.0) for t in tasks]
    values = tables.table_values("rq2", records)
    assert values["BFCL-v4"]["value"] == pytest.approx(0.6)  # all but the agentic 40 %
    assert values["Tau2-Retail"]["value"] is None
    partial = tables.table_values("rq2", records[1:])
    assert partial["BFCL-v4"]["value"] is None


def test_bfcl_single_turn_scores_inside_the_sandbox():
    from spade_jax import envs

    try:
        pool = envs.EnvPool(envs.SandboxConfig(), warm=1)
    except envs.SandboxUnavailable as error:
        pytest.skip(f"no sandbox here: {error}")
    (task,) = bfcl.single_turn_tasks("live_multiple", limit=1)
    try:
        for reply, reward in ((task.make_local().solution(), 1.0), (REFUSAL, 0.0)):
            first = pool.start(task.code, task.seed, max_turns=task.max_turns)
            assert first.ok, first.error
            result = pool.step(first.handle, reply)
            pool.close(first.handle)
            assert (result.reward, result.terminated) == (reward, True), result
    finally:
        pool.shutdown()


@pytest.mark.slow
def test_tiny_model_plays_the_rq2_table_from_the_command_line(tmp_path):
    """launch/eval.py --table=rq2 on the tiny random model, one entry per BFCL category and
    one item per ACEBench category of the fixture clone (its user played by the same model)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "rq2"
    result = subprocess.run(
        [sys.executable, str(root / "launch" / "eval.py"), "--config=configs/tiny.py",
         "--table=rq2", "--table_suites=bfcl_v4,acebench", "--limit=17",
         f"--data_dir={ACEBENCH_DATA}",
         "--table_settings=bfcl_v4.max_new_tokens=4,acebench.max_new_tokens=4,"
         "acebench.max_turns=6,acebench.user_max_new_tokens=4", f"--out={out}"], cwd=root,
        env=command_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(
        "| Method | BFCL-v4 | Tau2-Retail | Tau2-Airline | Tau2-Telecom | ACEBench-N | "
        "ACEBench-S | ACEBench-A | ACEBench |\n")
    assert "tau2: not selected" in result.stdout
    table = json.loads((out / tables.TABLE_JSON).read_text())
    bfcl_v4 = table["values"]["BFCL-v4"]
    assert (bfcl_v4["episodes"], bfcl_v4["items"]) == (17, 17)
    assert 0.0 <= bfcl_v4["value"] <= 0.6  # every category played; agentic counts 0
    ace = table["values"]["ACEBench"]
    assert (ace["episodes"], ace["items"]) == (17, 17)  # one item of each ACEBench category
    assert 0.0 <= ace["value"] <= 1.0
    rows = read_jsonl(out / "acebench" / "items.jsonl")
    assert not [r["task_id"] for r in rows if r["crashed"]]  # the Agent dialogues ran
