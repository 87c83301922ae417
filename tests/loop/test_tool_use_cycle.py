"""Tool-use SPADE end to end: two cycles of the tiny model with `spade.game_type=tool_use`.

The model's answers are scripted (tests/loop/pin.py's ScriptedSession): the Designer writes one
valid tool-use environment (a seed) and two broken ones, the Agent answers with malformed,
unknown and real tool calls. Everything else is the real loop: the gate with its tool-use checks,
hints, play in the sandbox, rewards, the train step, the memory and the replay cycle.
"""

import json
import math

import jax
import pytest

from spade_jax.config import load_config_file, parse
from spade_jax.envs.skills import TOOL_USE_SKILLS
from spade_jax.spade.driver import run_training
from tests.envs.test_tool_use import PENCIL, TOOL_USE_BROKEN
from tests.loop.pin import ScriptedSampler

pytestmark = pytest.mark.slow  # two tiny cycles: ~2.5 min on 2 idle cores, 8 min when shared

DESIGNER_MARKER = "tool-calling environments"  # in the tool-use Designer's system prompt
DESIGNS = [("valid", PENCIL), TOOL_USE_BROKEN["bad schema"],
           TOOL_USE_BROKEN["criterion throws at reset"]]
AGENT_ANSWERS = ("<tool_call>{not json</tool_call>",
                 '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
                 '<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>',
                 "I do not know.")


def tool_use_config():
    cfg = load_config_file("tiny")
    cfg.spade.game_type = "tool_use"  # spade.skills left empty: the six tool-use skills
    cfg.spade.games_per_cycle = len(DESIGNS)
    cfg.spade.replay_per_cycle = 1
    cfg.spade.max_turns = 4  # the pencil shop's solution: three calls and the answer
    cfg.sampling.designer_max_new_tokens = 4096  # room for an environment's code
    cfg.sampling.agent_max_new_tokens = 48
    cfg.train.seq_len = 3072  # a Designer sample is ~3k tokens; 4096 took 8 GB on 8 CPU devices
    cfg.total_cycles = 2  # a regeneration cycle, then a replay-only one
    return cfg


@pytest.fixture(scope="module")
def tool_use_run(tmp_path_factory):
    from spade_jax.spade.runtime import Runtime

    cfg, workdir = tool_use_config(), tmp_path_factory.mktemp("tool_use_run")
    rt = Runtime.create(parse(cfg, 1), jax.devices()[:1])
    try:
        rt.sampler = ScriptedSampler(rt.tokenizer, [code for _, code in DESIGNS],
                                     designer_marker=DESIGNER_MARKER,
                                     agent_answers=AGENT_ANSWERS)
        history = run_training(cfg, str(workdir), resume=False, runtime=rt)
        from spade_jax.checkpoint import Checkpointer

        ck = Checkpointer(str(workdir))
        _, host = ck.restore(2, rt.device_state())
        ck.close()
    finally:
        rt.close()
    return cfg, workdir, history, host


def test_invalid_tool_use_designs_are_rejected_by_the_named_check(tool_use_run):
    cfg, workdir, history, _ = tool_use_run
    row = history[0]
    assert row["designer/attempts"] == len(DESIGNS)
    # the Designer was asked for the tool-use skills, the default of this game type
    written = sorted((workdir / "envs" / "cycle_00000").rglob("s*.json"), key=lambda p: p.name)
    k, names = cfg.spade.skills_per_regen, list(TOOL_USE_SKILLS)
    assert [json.loads(p.read_text())["skill"] for p in written] == [
        names[slot % k] for slot in range(len(DESIGNS))]
    assert row["designer/valid_rate"] == pytest.approx(1 / len(DESIGNS))
    rejected = sorted((workdir / "envs" / "cycle_00000" / "rejected").glob("*.json"))
    checks = [json.loads(p.read_text())["failures"][0][0] for p in rejected]
    assert checks == [check for check, _ in DESIGNS[1:]] == ["T1", "T2"]


def test_the_valid_design_is_played_rewarded_trained_and_remembered(tool_use_run):
    cfg, workdir, history, host = tool_use_run
    first, second = history
    s = cfg.spade
    assert first["envs/played"] == 1 + s.replay_per_cycle
    assert first["samples/agent"] == (1 + s.replay_per_cycle) * s.plays_per_env
    # the reference's Designer delay (4) holds the samples back; its final flush trains them at
    # the last cycle, the valid design's only: invalid ones are never trained (reference)
    assert s.designer_delay > 1 and s.final_flush and not s.penalize_invalid
    assert first["samples/designer"] == 0 and second["samples/designer"] == 1
    assert "designer/reward_mean" in second
    # the regeneration's environments live until the next one (regen_interval 2), plus replays
    assert second["envs/played"] == 1 + s.replay_per_cycle
    assert all(math.isfinite(r["train/loss"]) for r in history)
    played = [json.loads(p.read_text())
              for p in (workdir / "envs" / "cycle_00000").glob("played_c00000_*.json")]
    assert len(played) == 1 and played[0]["stats"]["n_nohint"] == s.plays_per_env
    records = host["state"]["memory"]["records"]
    [new] = [r for r in records if r["id"].startswith("c00000_")]
    assert "class PencilShopEnv(ToolUseEnv)" in new["code"] and new["win_rate"] is not None
