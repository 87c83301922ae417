"""The RQ1 table: scoring rules, GPQA shuffling, settings, roll-ups, data errors, launch/eval.py."""

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from spade_jax.errors import MissingFileError
from spade_jax.eval import answer_env, report, rq1, tables
from spade_jax.eval.reasoning_gym_env import rg_paper_answer
from spade_jax.eval.rg_hard_split import HARD_CONFIGS, HARD_SPLIT_BUCKETS
from spade_jax.eval.tasks import EvalTask
from spade_jax.spade.rollout import Decoding
from tests.commands import command_env

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "eval" / "fixtures" / "rq1"


@pytest.mark.parametrize("predicted, gold, equal", [
    ("42", "42", True), ("042", "42", True), ("43", "42", False), ("8.0", "8", True),
    ("2^3", "8", True), ("\\frac{1}{2}", "0.5", True), ("27\\%", "27", True),
    ("x", "8", False), (None, "1", False)])
def test_math_verify_decides_aime_answers(predicted, gold, equal):
    pytest.importorskip("math_verify")
    assert answer_env.math_equal(predicted, gold) is equal


def test_unparsable_answers_fall_back_to_integer_then_string_equality(monkeypatch):
    math_verify = pytest.importorskip("math_verify")

    def broken(*args, **kwargs):
        raise RuntimeError("cannot parse")

    monkeypatch.setattr(math_verify, "parse", broken)
    assert answer_env.math_equal(" 042", "42")
    assert answer_env.math_equal("abc", "abc")
    assert not answer_env.math_equal("abd", "abc")


def test_aime_takes_the_last_flat_boxed_answer():
    assert answer_env.boxed_answer("first \\boxed{12}, finally \\boxed{ 34 }") == "34"
    assert answer_env.boxed_answer("\\boxed{\\frac{1}{2}}") is None  # nested braces: no match
    assert answer_env.boxed_answer("no box") is None


@pytest.mark.parametrize("reply, letter", [
    ("\\boxed{B} on reflection \\boxed{C}", "C"), ("The answer is c.", "C"),
    ("Answer: D, though the answer is A", "D"), ("\\boxed{b}, so the answer is A", "A"),
    ("\\boxed{E}", None), ("no letter here", None)])
def test_gpqa_choice_is_the_last_boxed_letter_else_the_first_stated_one(reply, letter):
    assert answer_env.choice_letter(reply) == letter


def test_gpqa_choices_are_shuffled_by_one_seeded_generator_over_the_questions():
    problems = rq1.gpqa_problems(FIXTURES / "gpqa_diamond.csv")
    correct = ["Nitrogen", "4", "newton"]
    rng = random.Random(42)
    for problem, right in zip(problems, correct, strict=True):
        order = list(range(4))
        rng.shuffle(order)
        options = [line[3:] for line in problem["prompt"].split("\n\n")[1].splitlines()]
        assert options[ord(problem["answer"]) - ord("A")] == right
        assert problem["answer"] == "ABCD"[order.index(0)]
    assert [p["answer"] for p in problems] == ["D", "C", "D"]  # Random(42), as the reference
    assert "pascal, per square metre" in problems[2]["prompt"]  # CSV quoting kept


def test_answer_env_scores_one_reply_per_episode():
    code = rq1.aime_tasks(FIXTURES, 2025, samples=1)[0].code
    env = EvalTask("aime", "2025", "aime2025/0", code).make_local()
    prompt, _ = env.reset(seed=3)
    assert prompt.startswith("What is 17 + 25?")
    pytest.importorskip("math_verify")
    _, reward, terminated, _, info = env.step("so \\boxed{42}")
    assert (reward, terminated, info["predicted"]) == (1.0, True, "42")
    env.reset()
    assert env.step("\\boxed{41}")[1] == 0.0


def test_rq1_items_score_inside_the_sandbox():
    """math-verify runs in the sandbox worker: 84/2 equals 42 only by its rules."""
    pytest.importorskip("math_verify")
    pytest.importorskip("reasoning_gym")
    from spade_jax import envs

    try:
        pool = envs.EnvPool(envs.SandboxConfig(), warm=1)
    except envs.SandboxUnavailable as error:
        pytest.skip(f"no sandbox here: {error}")
    plays = [(rq1.aime_tasks(FIXTURES, 2025, 1)[0], "\\boxed{84/2}", 1.0),
             (rq1.aime_tasks(FIXTURES, 2025, 1)[0], "\\boxed{41}", 0.0),
             (rq1.gpqa_tasks(FIXTURES, 1)[0], "so the answer is \\boxed{D}", 1.0),
             (rq1.rg_hard_tasks(1, 2, ["gcd"])[0], None, 1.0)]
    try:
        for task, reply, reward in plays:
            first = pool.start(task.code, task.seed, max_turns=task.max_turns)
            assert first.ok, first.error
            if reply is None:
                reply = pool.call(first.handle, "solution").value
            result = pool.step(first.handle, reply)
            pool.close(first.handle)
            assert (result.reward, result.terminated) == (reward, True), (task.task_id, result)
    finally:
        pool.shutdown()


def test_rg_paper_answers_come_from_answer_tags_else_boxed():
    assert rg_paper_answer("<answer>1</answer> then <ANSWER> 2 </ANSWER>") == "2"
    assert rg_paper_answer("no tag, \\boxed{7}") == "7"
    assert rg_paper_answer("nothing") is None


def test_hard_split_is_the_reference_list_and_every_dataset_builds():
    pytest.importorskip("reasoning_gym")
    sizes = {bucket: len(names) for bucket, names in HARD_SPLIT_BUCKETS.items()}
    assert sizes == {"math": 31, "algorithmic": 36, "cognition": 24, "logic": 9}
    assert sorted(HARD_CONFIGS) == sorted(n for names in HARD_SPLIT_BUCKETS.values() for n in names)
    tasks = rq1.rg_hard_tasks(episodes=2, max_turns=2, datasets=["gcd", "maze"])
    assert [(t.category, t.seed, t.max_turns) for t in tasks] == [
        ("gcd", 0, 2), ("gcd", 1, 2), ("maze", 0, 2), ("maze", 1, 2)]
    env = tasks[0].make_local()
    prompt, info = env.reset(seed=1)
    assert info["index"] == random.Random(1).randrange(rq1.RG_HARD_DATASET_SIZE)
    assert "<answer>answer here</answer>" in prompt
    assert env.step(env.solution())[1] == 1.0
    with pytest.raises(ValueError, match="not in the hard split"):
        rq1.rg_hard_tasks(1, 2, datasets=["gcd", "nope"])


def _record(suite, category, task_id, ret):
    task = EvalTask(suite, category, task_id, "class AEnv: pass")
    return report.episode_record(task, ret)


def test_columns_are_solved_fractions_and_rg_buckets_weigh_episodes():
    records = [
        _record("aime", "2025", "a/0", 1.0), _record("aime", "2025", "a/0", 0.0),
        _record("aime", "2025", "a/1", 1.0), _record("aime", "2026", "b/0", 0.0),
        _record("gpqa_diamond", "diamond", "g/0", 1.0),
        _record("rg_hard", "gcd", "gcd", 1.0), _record("rg_hard", "gcd", "gcd", 0.5),
        _record("rg_hard", "lcm", "lcm", 1.0), _record("rg_hard", "ab", "ab", 1.0),
        _record("rg_hard", "maze", "maze", 0.0), _record("rg_hard", "acre", "acre", 1.0)]
    values = tables.table_values("rq1", records)
    got = {name: value["value"] for name, value in values.items()}
    assert got == pytest.approx({
        "AIME 2025": 2 / 3, "AIME 2026": 0.0, "GPQA-Diamond": 1.0, "LiveCodeBench v6": None,
        "RG:Math": 2 / 3, "RG:Algorithmic": 1.0, "RG:Cognition": 0.0, "RG:Logic": 1.0,
        "RG:Average": (2 / 3 + 1.0 + 0.0 + 1.0) / 4}, nan_ok=False)
    assert (values["AIME 2025"]["episodes"], values["AIME 2025"]["items"]) == (3, 2)
    assert values["RG:Math"]["items"] == 2
    no_logic = tables.table_values("rq1", records[:-1])
    assert no_logic["RG:Logic"]["value"] is None and no_logic["RG:Average"]["value"] is None


def test_settings_are_the_reference_values_and_overridable():
    settings = tables.table_settings("rq1")
    assert list(settings) == ["aime", "gpqa_diamond", "livecodebench", "rg_hard"]
    assert settings["aime"].decoding == Decoding(
        temperature=1.0, top_p=0.95, top_k=20, max_new_tokens=32768)
    assert (settings["aime"].samples, settings["gpqa_diamond"].samples) == (64, 8)
    assert settings["gpqa_diamond"].decoding == Decoding(  # games.yaml: no top_k
        temperature=0.7, top_p=0.95, top_k=0, max_new_tokens=32768)
    assert (settings["livecodebench"].samples, settings["livecodebench"].decoding) == (
        1, Decoding(temperature=0.2, top_p=0.95, top_k=0, max_new_tokens=16384))
    assert tables.AIME_YEARS == (2025, 2026)
    assert (settings["rg_hard"].samples, settings["rg_hard"].max_turns,
            settings["rg_hard"].decoding.temperature) == (8, 2, 0.6)
    changed = tables.table_settings("rq1", "aime.samples=4, rg_hard.temperature=0.3")
    assert (changed["aime"].samples, changed["rg_hard"].decoding) == (
        4, dataclasses.replace(settings["rg_hard"].decoding, temperature=0.3))
    assert changed["aime"].decoding == settings["aime"].decoding
    with pytest.raises(ValueError, match="unknown setting 'aime.beam'"):
        tables.table_settings("rq1", "aime.beam=2")
    with pytest.raises(ValueError, match="aime.samples='many': expected int"):
        tables.table_settings("rq1", "aime.samples=many")
    with pytest.raises(ValueError, match="unknown table 'rq3'"):
        tables.table_settings("rq3")
    with pytest.raises(ValueError, match="aime.user_top_k: aime has no simulated user"):
        tables.table_settings("rq1", "aime.user_top_k=2")
    users = tables.table_settings("rq2", "acebench.user_max_new_tokens=4")
    assert users["acebench"].user_decoding == Decoding(
        temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=4)
    assert users["acebench"].decoding == tables.SUITE_SETTINGS["acebench"].decoding
    rq2 = tables.table_settings("rq2")
    for suite in rq2:
        rq2[suite] = dataclasses.replace(rq2[suite], unavailable=f"{suite} off")
    with pytest.raises(ValueError, match="table rq2 cannot run yet: bfcl_v4 off; tau2 off; "
                                         "acebench off"):
        tables.table_tasks("rq2", rq2, data_dir=None)


def test_select_suites_marks_the_others_unavailable_and_refuses_unknown_names():
    rq2 = tables.table_settings("rq2")
    chosen = tables.select_suites(rq2, "bfcl_v4, acebench")
    assert tables.runnable_suites("rq2", chosen) == ["bfcl_v4", "acebench"]
    assert chosen["tau2"].unavailable == "not selected"
    assert tables.select_suites(rq2, "") == rq2
    with pytest.raises(ValueError, match=r"unknown suites \['tau3'\]"):
        tables.select_suites(rq2, "bfcl_v4,tau3")


def test_missing_data_names_the_file_expected(tmp_path):
    settings = tables.table_settings("rq1")
    with pytest.raises(MissingFileError,
                       match=r"--data_dir/aime-2025/aime-2025.jsonl \(--data_dir was not given\)"):
        tables.table_tasks("rq1", settings, data_dir=None)
    rq2 = tables.table_settings("rq2")
    rq2["bfcl_v4"] = dataclasses.replace(rq2["bfcl_v4"], unavailable="not this test's")
    with pytest.raises(MissingFileError, match=f"clone of tau2-bench at {tmp_path}/tau2-bench"):
        tables.table_tasks("rq2", rq2, data_dir=tmp_path)
    (tmp_path / "aime-2025").mkdir()
    (tmp_path / "aime-2025" / "aime-2025.jsonl").write_text("")
    with pytest.raises(MissingFileError, match=f"needs {tmp_path}/aime-2026/aime-2026.jsonl"):
        tables.table_tasks("rq1", settings, data_dir=tmp_path)


def _hub_dataset_file(cache, repo_id, name, text):
    """One file of an HF Hub dataset repository laid out in `cache` as huggingface_hub does."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"datasets--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (repo / "snapshots" / commit / name).write_text(text)


def test_gpqa_and_livecodebench_are_read_from_the_hub_cache_without_a_data_dir(
        tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(MissingFileError, match=r"gpqa_diamond.csv of the HF Hub dataset "
                                               r"Idavidrein/gpqa in the local Hugging Face cache"):
        rq1.gpqa_tasks(None, 1)
    _hub_dataset_file(tmp_path / "hub", "Idavidrein/gpqa", "gpqa_diamond.csv",
                      (FIXTURES / "gpqa_diamond.csv").read_text())
    from_hub = rq1.gpqa_tasks(None, 1)
    assert [t.task_id for t in from_hub] == [t.task_id for t in rq1.gpqa_tasks(FIXTURES, 1)]
    assert from_hub[0].code == rq1.gpqa_tasks(FIXTURES, 1)[0].code
    # --data_dir wins over the cache; a file missing from both names both places
    assert rq1.data_file(FIXTURES, rq1.GPQA_FILE, "GPQA") == FIXTURES / rq1.GPQA_FILE
    with pytest.raises(MissingFileError, match=rf"needs {tmp_path}/livecodebench/test.jsonl or "
                                               r"test.jsonl of the HF Hub dataset "
                                               r"livecodebench/code_generation_lite"):
        rq1.data_file(tmp_path, rq1.LCB_FILES[0], "LiveCodeBench v6")
    _hub_dataset_file(tmp_path / "hub", "livecodebench/code_generation_lite", "test6.jsonl", "")
    assert rq1.data_file(None, rq1.LCB_FILES[-1], "LiveCodeBench v6").name == "test6.jsonl"


def test_limit_keeps_every_sample_of_the_first_items_spread_over_categories():
    pytest.importorskip("reasoning_gym")
    settings = tables.table_settings("rq1", "aime.samples=3,gpqa_diamond.samples=2,"
                                            "rg_hard.samples=2")
    tasks = tables.table_tasks("rq1", settings, data_dir=FIXTURES, limit=1)
    assert [t.task_id for t in tasks["livecodebench"]] == ["lcb/abc999_a"]
    tasks = tables.table_tasks("rq1", settings, data_dir=FIXTURES, limit=2)
    assert [(t.task_id, t.seed) for t in tasks["aime"]] == [
        (f"aime{year}/0", seed) for year in (2025, 2026) for seed in range(3)]
    assert [t.task_id for t in tasks["gpqa_diamond"]] == ["gpqa/0"] * 2 + ["gpqa/1"] * 2
    assert [rq1.rg_bucket(t.category) for t in tasks["rg_hard"][::2]] == ["math", "algorithmic"]
    assert [t.task_id for t in tasks["livecodebench"]] == ["lcb/abc999_a", "lcb/3999"]


def _table_json(directory: Path, method: str, values: dict) -> None:
    directory.mkdir(parents=True)
    result = {"table": "rq1", "method": method, "settings": {},
              "values": {k: {"value": v, "episodes": 1, "items": 1} for k, v in values.items()}}
    (directory / tables.TABLE_JSON).write_text(json.dumps(result))


def _eval(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "launch" / "eval.py"), *args], cwd=ROOT,
                          env=command_env(), capture_output=True, text=True, timeout=timeout)


def test_compare_puts_two_tables_side_by_side(tmp_path):
    _table_json(tmp_path / "base", "base", {"AIME 2025": 0.25, "RG:Math": None})
    _table_json(tmp_path / "spade", "spade", {"AIME 2025": 0.5, "RG:Math": 0.1})
    result = _eval("--compare", str(tmp_path / "base"), str(tmp_path / "spade"))
    assert result.returncode == 0, result.stderr
    assert "| column | base | spade | delta |" in result.stdout
    assert "| AIME 2025 | 25.0 | 50.0 | +25.0 |" in result.stdout
    assert "| RG:Math | — | 10.0 | — |" in result.stdout


def test_launch_refuses_a_missing_data_dir_before_loading_a_model(tmp_path):
    result = _eval("--config=configs/tiny.py", "--table=rq1", f"--data_dir={tmp_path}",
                   f"--out={tmp_path / 'out'}")
    assert result.returncode != 0
    assert f"error: AIME needs {tmp_path}/aime-2025/aime-2025.jsonl" in result.stderr
    assert "sandbox layers" not in result.stderr  # no runtime was created


@pytest.mark.slow
def test_tiny_model_plays_the_rq1_table_and_a_killed_run_resumes(tmp_path):
    pytest.importorskip("reasoning_gym")
    pytest.importorskip("math_verify")
    out = tmp_path / "out"
    suites = ("aime", "gpqa_diamond", "livecodebench", "rg_hard")
    settings = ",".join(["aime.samples=2", "gpqa_diamond.samples=1", "rg_hard.samples=1"]
                        + [f"{s}.max_new_tokens=4" for s in suites])
    args = ("--config=configs/tiny.py", "--table=rq1", f"--data_dir={FIXTURES}", "--limit=2",
            f"--table_settings={settings}", f"--out={out}")
    result = _eval(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    header = ("| Method | AIME 2025 | AIME 2026 | GPQA-Diamond | LiveCodeBench v6 | RG:Math | "
              "RG:Algorithmic | RG:Cognition | RG:Logic | RG:Average |")
    assert result.stdout.startswith(header + "\n")
    table = json.loads((out / tables.TABLE_JSON).read_text())
    episodes = {name: v["episodes"] for name, v in table["values"].items()}
    assert episodes == {"AIME 2025": 2, "AIME 2026": 2, "GPQA-Diamond": 2,
                        "LiveCodeBench v6": 2, "RG:Math": 1, "RG:Algorithmic": 1,
                        "RG:Cognition": 0, "RG:Logic": 0, "RG:Average": 2}
    assert table["settings"]["aime"]["samples"] == 2

    # A run killed during AIME: one row scored, no table yet. The rerun plays only the rest.
    items = out / "aime" / report.ITEMS_FILE
    rows = report.read_jsonl(items)
    items.write_text(json.dumps(rows[0]) + "\n")
    (out / tables.TABLE_JSON).unlink()
    result = _eval(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "aime: 1 rows already scored, 3 episodes to play" in result.stderr
    assert "gpqa_diamond: 2 rows already scored, 0 episodes to play" in result.stderr
    assert report.read_jsonl(items)[0] == rows[0]
    assert json.loads((out / tables.TABLE_JSON).read_text())["values"].keys() == episodes.keys()


@pytest.mark.parametrize("text, boxed", [
    ("so \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("none", None),
    ("\\boxed{open", None), ("\\boxed{}", "")])
def test_the_self_contained_env_modules_carry_one_last_boxed(text, boxed):
    """Each sandboxed env module must hold its own copy (it runs without our package); the
    copies must stay one function."""
    import inspect

    from spade_jax.eval import humaneval_env, reasoning_gym_env

    assert (inspect.getsource(humaneval_env.last_boxed)
            == inspect.getsource(reasoning_gym_env.last_boxed))
    assert humaneval_env.last_boxed(text) == boxed
