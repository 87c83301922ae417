"""Designer, Agent and hint prompts: required blocks, variants, and valid worked examples."""

import random

import pytest

from spade_jax.envs.contract import solution_actions
from spade_jax.envs.seeds import list_seed_envs
from spade_jax.envs.tool_use import ToolUseEnv
from spade_jax.spade import memory as M
from spade_jax.spade import prompts as P
from spade_jax.spade import self_validation as V

SEED_CODE = "class SeedExampleEnv:\n    pass\n"


def _user(messages):
    assert [m["role"] for m in messages] == ["system", "user"]
    return messages[1]["content"]


def _records():
    good = [
        M.MemoryRecord(id=f"g{i}", code_hash=f"h{i}", skill="Optimization",
                       code=f"class Good{i}Env:\n    x = {i}\n" + "#" * 3000,
                       win_rate=0.5, regret=0.3)
        for i in range(3)
    ]
    bad = M.MemoryRecord(id="b", code_hash="hb", skill="Optimization",
                         code="import math\n\nclass TrivialEnv:\n    pass\n", win_rate=0.97)
    return good, bad


def test_six_skills():
    assert list(P.SKILLS) == [
        "Mathematical_Reasoning", "Logical_Deduction", "Spatial_Reasoning",
        "Pattern_Recognition", "Optimization", "Causal_Inference",
    ]
    assert len(P.TOOL_USE_SKILLS) == 6


def test_designer_prompt_blocks_without_grounding_or_memory():
    messages = P.designer_messages("Optimization", example_code=SEED_CODE, max_turns=20)
    assert "expert Python programmer and game designer" in messages[0]["content"]
    user = _user(messages)
    assert "REFERENCE_DOCUMENT" not in user and "REFERENCE_ENVIRONMENTS" not in user
    assert "Optimization: " + P.SKILLS["Optimization"] in user
    assert "Difficulty: medium" in user and "at most 20 turns" in user
    assert "about 10 to 15 turns" in user  # max_turns/2 .. 3*max_turns/4
    for block in ("DESIGN RULES", "INTERFACE", "A SHORT WORKED EXAMPLE", "ROBUSTNESS RULES"):
        assert block in user
    assert "random play must lose" in user.lower()
    assert "def solution(self)" in user and SEED_CODE.rstrip() in user
    assert user.rstrip().endswith(P.ANSWER_FORMAT)


def test_designer_prompt_with_document_and_memory():
    good, bad = _records()
    user = _user(P.designer_messages(
        "Optimization", document="The simplex method pivots ...",
        memory=M.MemoryExamples(good, [bad])))
    assert user.startswith("You are given a reference document.\n<REFERENCE_DOCUMENT>\n"
                           "The simplex method pivots ...\n</REFERENCE_DOCUMENT>")
    assert "never mention" in user
    assert user.count("### Example") == 2  # at most two positives
    assert "### Example 1 (skill: Optimization, win_rate: 0.50, regret: 0.30)" in user
    code = good[0].code
    assert code[: P.MEMORY_CODE_CHARS] + "\n```" in user  # code truncated to 2000 chars
    assert code[: P.MEMORY_CODE_CHARS + 1] not in user
    assert "- too easy (win_rate=0.97): class TrivialEnv" in user
    assert user.index("</REFERENCE_ENVIRONMENTS>") < user.index(P.ANSWER_FORMAT)


def test_empty_memory_adds_no_block():
    user = _user(P.designer_messages("Optimization", memory=M.MemoryExamples([], [])))
    assert "REFERENCE_ENVIRONMENTS" not in user and "Do not make" not in user


def test_worked_example_from_seeds():
    seeds = list_seed_envs()
    if not seeds:
        pytest.skip("no seed environments yet")
    game = P.worked_example(seeds, P.GameType.GAME, exclude_skill="Optimization")
    chosen = next(e for e in seeds if e.code == game)
    assert not chosen.is_tool_use and chosen.skill != "Optimization"
    assert game == P.worked_example(list(reversed(seeds)), P.GameType.GAME,
                                    exclude_skill="Optimization")
    if any(e.is_tool_use for e in seeds):
        tool = P.worked_example(seeds, P.GameType.TOOL_USE)
        assert next(e for e in seeds if e.code == tool).is_tool_use
    assert P.worked_example([], P.GameType.GAME) is None


def test_tool_use_variant():
    messages = P.designer_messages("Data_Retrieval", game_type=P.GameType.TOOL_USE)
    assert "tool-calling environments" in messages[0]["content"]
    user = _user(messages)
    assert "ToolUseEnv" in user and "tool_lookup" in user and "class LibraryLoanEnv" in user


def test_designer_prompt_errors():
    with pytest.raises(ValueError, match="unknown game skill"):
        P.designer_messages("Juggling")
    assert "juggling balls" in _user(P.designer_messages("Juggling",
                                                         skill_description="juggling balls"))
    with pytest.raises(ValueError, match="difficulty"):
        P.designer_messages("Optimization", difficulty="extreme")


@pytest.mark.parametrize("seed", range(8))
def test_default_game_example_is_a_valid_solvable_env(seed):
    namespace = {}
    exec(P.DEFAULT_GAME_EXAMPLE, namespace)
    env = namespace["WaterJugsEnv"](max_turns=25)
    observation, info = env.reset(seed=seed)
    assert observation and info == {}
    assert env.solution() not in observation
    for action in solution_actions(env.solution()):
        observation, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (1.0, True, False)


@pytest.mark.parametrize("seed", range(4))
def test_default_tool_use_example_is_solvable(seed):
    namespace = {"ToolUseEnv": ToolUseEnv, "random": random}
    exec(P.DEFAULT_TOOL_USE_EXAMPLE, namespace)
    env = namespace["LibraryLoanEnv"]()
    env.reset(seed=seed)
    for action in solution_actions(env.solution()):
        observation, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated) == (1.0, True)


def test_agent_prompts():
    assert "\\boxed{...}" in P.GameType.GAME.agent_system_prompt
    assert "<tool_call>" in P.GameType.TOOL_USE.agent_system_prompt


def test_hint_prompt():
    messages = P.hint_messages("class XEnv: pass", P.GameType.GAME)
    assert "1 to 3 sentences" in messages[0]["content"]
    assert "do NOT give the answer" in messages[0]["content"]
    assert messages[1]["content"] == "Environment code:\n```python\nclass XEnv: pass\n```"
    assert "placeholders" in P.hint_messages("x", P.GameType.TOOL_USE)[0]["content"]


# ----- self-validation ------------------------------------------------------------------------

@pytest.mark.parametrize("text, verdict", [
    ("fine \\boxed{yes}", V.Verdict.ACCEPT), ("\\boxed{ True }", V.Verdict.ACCEPT),
    ("\\boxed{no}", V.Verdict.REJECT), ("\\boxed{unsure}", V.Verdict.REJECT),
    ("first \\boxed{no}, on reflection \\boxed{yes}", V.Verdict.ACCEPT),  # the last one counts
    ("no verdict at all", V.Verdict.NO_VERDICT), ("", V.Verdict.NO_VERDICT),
])
def test_the_verdict_is_the_last_boxed_answer_and_none_keeps_the_design(text, verdict):
    assert V.parse_verdict(text) is verdict
    assert verdict.keeps == (verdict is not V.Verdict.REJECT)


@pytest.mark.parametrize("game_type, asks", [("game", "played and won"),
                                             ("tool_use", "can be completed")])
def test_self_validation_messages_carry_the_code_and_the_game_types_question(game_type, asks):
    assert set(V.PROMPTS) == set(P.GameType)
    code = 'class XEnv:\n    d = {"k": "{braces}"}\n'
    system, user = V.self_validation_messages(code, P.GameType(game_type))
    assert system["role"] == "system" and user["role"] == "user"
    assert f"```python\n{code}\n```" in user["content"] and asks in user["content"]
    assert user["content"].rstrip().endswith("\\boxed{no} when it cannot." if game_type ==
                                             "tool_use" else "\\boxed{no} if it has a fatal bug.")
