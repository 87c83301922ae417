"""τ²-bench: tasks from a clone, the two-speaker conversation, τ²'s scoring, the user runner.

The clone is `fixtures/tau2-bench`, a tiny domain ("tiny": get_order, cancel_order over two
orders; tasks "cancel" and "status") written for these tests with the interface of
tau2-bench's domains. Agent and user messages are scripted.
"""

import json
import shutil
from pathlib import Path

import jax
import pytest

from spade_jax.errors import MissingFileError
from spade_jax.eval import tau2, tau2_env
from spade_jax.eval.simulated_user import UserModel, UserSimulatorRunner, load_user_model
from spade_jax.spade.rollout import (
    OBSERVATION_BUDGET,
    ChatFormat,
    Decoding,
    EpisodeSpec,
    play_episodes,
)
from tests.eval.local_pool import LocalPool

FIXTURES = Path(__file__).parent / "fixtures"


def _call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _env(task_id, trials=1, max_steps=50):
    tasks = tau2.tau2_tasks(FIXTURES, trials, max_steps=max_steps, max_turns=max_steps,
                            domains=("tiny",))
    task = next(t for t in tasks if t.task_id == f"tau2/tiny/{task_id}")
    return task.make_local()


def _play(env, messages):
    """Reset, then step each message; the last step's result."""
    env.reset()
    result = None
    for message in messages:
        result = env.step(message)
        if result[2] or result[3]:
            break
    return result


CANCEL_WELL = [
    "Hi, I want to cancel order #1, I no longer need it.",               # user
    _call("get_order", order_id="#1"),                                    # agent
    _call("cancel_order", order_id="#1", reason="no longer needed"),     # agent
    "Done: order #1 is now cancelled.",                                   # agent
    "Thanks! ###STOP###",                                                 # user
]


def test_tasks_are_the_split_times_trials_with_the_domain_as_category():
    tasks = tau2.tau2_tasks(FIXTURES, 3, max_steps=40, max_turns=30, domains=("tiny",))
    assert [(t.task_id, t.seed) for t in tasks] == [
        (f"tau2/tiny/{i}", s) for i in ("cancel", "status") for s in range(3)]
    assert {(t.suite, t.category, t.max_turns) for t in tasks} == {("tau2", "tiny", 30)}
    train = tau2.tau2_tasks(FIXTURES, 1, max_steps=40, max_turns=30, domains=("tiny",),
                            split="train")
    assert [t.task_id for t in train] == ["tau2/tiny/cancel"]
    with pytest.raises(ValueError, match="no split 'small'"):
        tau2.tau2_tasks(FIXTURES, 1, max_steps=40, max_turns=30, domains=("tiny",),
                        split="small")


def test_a_missing_clone_or_file_is_an_error_naming_the_path(tmp_path):
    with pytest.raises(MissingFileError, match="--data_dir was not given"):
        tau2.tau2_tasks(None, 1, max_steps=10, max_turns=10)
    with pytest.raises(MissingFileError, match=f"{tmp_path}/tau2-bench"):
        tau2.tau2_tasks(tmp_path, 1, max_steps=10, max_turns=10)
    shutil.copytree(FIXTURES / "tau2-bench", tmp_path / "tau2-bench")
    (tmp_path / "tau2-bench/data/tau2/domains/tiny/tasks.json").unlink()
    with pytest.raises(MissingFileError, match="tau2-bench/data/tau2/domains/tiny/tasks.json"):
        tau2.tau2_tasks(tmp_path, 1, max_steps=10, max_turns=10, domains=("tiny",))
    # the real domains name their own files (the fixture clone has no retail code or data)
    with pytest.raises(MissingFileError, match="src/tau2/domains/retail/environment.py"):
        tau2.tau2_tasks(FIXTURES, 1, max_steps=10, max_turns=10)


def test_reset_greets_the_user_with_both_system_prompts_and_the_agent_tools():
    env = _env("cancel")
    observation, info = env.reset()
    assert observation == tau2_env.FIRST_AGENT_MESSAGE and info["to"] == "user"
    assert [t["function"]["name"] for t in info["tools"]] == ["get_order", "cancel_order"]
    assert info["user_tools"] is None
    assert "<policy>\n# Tiny order desk policy" in info["agent_system_prompt"]
    user_prompt = info["user_system_prompt"]
    assert user_prompt.startswith("# Test user guidelines\nYou are a customer. End with")
    assert "Persona:\n\tBrief and polite.\nInstructions:\n\tDomain: tiny\n\tReason for call:\n" \
           "\t\tCancel order #1; you no longer need it.\n\tKnown info:\n\t\tYour order is #1." \
           in user_prompt
    assert "Unknown info" not in user_prompt


def test_the_conversation_alternates_and_the_right_actions_score_one():
    env = _env("cancel")
    env.reset()
    observation, reward, terminated, truncated, info = env.step(CANCEL_WELL[0])
    assert (observation, info["to"]) == (CANCEL_WELL[0], "agent")  # the user's words, to agent
    observation, *_, info = env.step(CANCEL_WELL[1])
    assert info["to"] == "agent" and info["tool_results"]
    assert json.loads(observation[len("<tool_response>"):-len("</tool_response>")]) == {
        "name": "get_order", "content": json.dumps(
            {"order_id": "#1", "status": "pending", "item": "kettle"})}
    env.step(CANCEL_WELL[2])
    observation, reward, terminated, truncated, info = env.step(CANCEL_WELL[3])
    assert (observation, info["to"], terminated) == (CANCEL_WELL[3], "user", False)
    observation, reward, terminated, truncated, info = env.step(CANCEL_WELL[4])
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0}
    assert info["termination"] == "user_stop"


@pytest.mark.parametrize("messages, breakdown", [
    # another reason leaves another database than the gold actions do
    ([*CANCEL_WELL[:2], _call("cancel_order", order_id="#1", reason="changed my mind"),
      *CANCEL_WELL[3:]], {"DB": 0.0, "COMMUNICATE": 1.0}),
    # nothing cancelled
    ([CANCEL_WELL[0], CANCEL_WELL[1], CANCEL_WELL[3], CANCEL_WELL[4]],
     {"DB": 0.0, "COMMUNICATE": 1.0}),
    # the right database, but the agent never says "cancelled"
    ([*CANCEL_WELL[:3], "All done, order #1 is handled.", CANCEL_WELL[4]],
     {"DB": 1.0, "COMMUNICATE": 0.0}),
])
def test_a_wrong_database_or_a_missing_communication_scores_zero(messages, breakdown):
    _, reward, terminated, _, info = _play(_env("cancel"), messages)
    assert terminated and reward == 0.0 and info["reward_breakdown"] == breakdown


MET, NOT_MET = (json.dumps({"results": [{"expectedOutcome": "x", "reasoning": "y",
                                          "metExpectation": verdict}]})
                for verdict in (True, False))
ASK_STATUS = ["Is order #2 pending?", _call("get_order", order_id="#2"), "Yes, #2 is pending.",
              "###STOP###"]


def test_initial_state_env_assertions_and_action_checks():
    env = _env("status")
    _, reward, terminated, _, info = _play(env, [*ASK_STATUS, MET])
    assert (reward, terminated) == (1.0, True)  # the initialization data made #2 pending
    assert info["reward_breakdown"] == {"DB": 1.0, "ENV_ASSERTION": 1.0, "ACTION": 1.0,
                                        "NL_ASSERTION": 1.0}
    for agent_turns in ([], [_call("get_order", order_id="#1")]):  # no call; another order
        _, reward, _, _, info = _play(
            env, [ASK_STATUS[0], *agent_turns, "It is pending.", "###STOP###", MET])
        assert reward == 0.0 and info["reward_breakdown"]["ACTION"] == 0.0
        assert info["reward_breakdown"]["DB"] == 1.0


def test_the_judge_sees_the_conversation_and_its_verdict_gates_the_reward():
    env = _env("status")
    observation, reward, terminated, _, info = _play(env, ASK_STATUS)
    assert (reward, terminated, info["to"]) == (0.0, False, "judge")
    assert info["judge_system_prompt"] == tau2_env.JUDGE_SYSTEM_PROMPT
    assert observation == (
        "conversation:\nassistant: Hi! How can I help you today?\nuser: Is order #2 pending?\n"
        "assistant: None\ntool: " + json.dumps({"order_id": "#2", "status": "pending",
                                                "item": "lamp"})
        + "\nassistant: Yes, #2 is pending.\nuser: ###STOP###\n\nexpectedOutcomes:\n"
        "['The agent says the order is pending.']")
    for verdict, expected in ((MET, 1.0), (NOT_MET, 0.0), ("<think>{</think> no JSON", 0.0),
                              ("Sure: " + MET + " Done.", 1.0), ('{"results": "all"}', 0.0)):
        _play(env, ASK_STATUS)
        _, reward, terminated, _, info = env.step(verdict)
        assert (reward, terminated) == (expected, True), verdict
        assert info["reward_breakdown"]["NL_ASSERTION"] == expected


@pytest.mark.parametrize("message, reason", [
    ("Let me check. " + _call("get_order", order_id="#1"), "not both"),
    ("<think>hmm</think>  ", "empty message"),
    ("<tool_call>{not json}</tool_call>", "invalid tool call JSON"),
])
def test_a_malformed_agent_message_ends_the_episode_with_nothing(message, reason):
    _, reward, terminated, truncated, info = _play(_env("cancel"), [CANCEL_WELL[0], message])
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["termination"].startswith("agent_error") and reason in info["termination"]


def test_step_and_error_limits_end_the_episode():
    env = _env("cancel", max_steps=6)
    env.reset()
    results = [env.step(m) for m in ["hi", "Hello, how can I help?", "cancel #1", "Which one?"]]
    assert not any(r[3] for r in results)
    assert env.step("order #1")[4].get("termination") == "max_steps"
    env = _env("cancel")
    env.reset()
    env.step("hi")
    for _ in range(tau2_env.DEFAULT_MAX_ERRORS - 1):
        observation, *_, truncated, info = env.step(_call("get_order", order_id="#9"))
        assert "Error: order #9 not found" in observation and not truncated
    assert env.step(_call("get_order", order_id="#9"))[4]["termination"] == "too_many_errors"


def test_solution_replays_the_gold_agent_actions():
    env = _env("cancel")
    env.reset()
    env.step(CANCEL_WELL[0])
    for block in env.solution().split("\n"):
        assert env.step(block)[4]["to"] == "agent"
    assert env.score() == (0.0, {"DB": 1.0, "COMMUNICATE": 0.0})  # nothing said yet


# -- the rollout with the simulated user's runner: local environments, scripted model ---------


class ScriptedModel:
    """The sampler both parties share: each row's next line of the agent's or the user's
    script (the user's conversation is the one whose prompt holds the user guidelines)."""

    def __init__(self, tokenizer, agent_lines, user_lines, judge_lines=((MET,),)):
        self.tokenizer = tokenizer
        self.lines = {"agent": agent_lines, "user": user_lines, "judge": judge_lines}
        self.said = {}

    def answer(self, prompt, row, seed):
        party = ("judge" if "expectedOutcomes" in prompt else
                 "user" if "# Test user guidelines" in prompt else "agent")
        turn = self.said[party, row] = self.said.get((party, row), -1) + 1
        return self.lines[party][row][turn]

    def start(self, prompts, *, capacity):
        from tests.loop.pin import ScriptedSession

        return ScriptedSession(self.tokenizer, self.answer, prompts, capacity)


@pytest.fixture(scope="module")
def tokenizer():
    from spade_jax.weights.gguf import smollm2_gguf_path
    from spade_jax.weights.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_gguf_path())


def test_episodes_with_a_simulated_user_play_and_score_through_the_rollout(tokenizer):
    chat = ChatFormat(tokenizer)
    tasks = tau2.tau2_tasks(FIXTURES, 1, max_steps=50, max_turns=10, domains=("tiny",))
    agent = [[_call("get_order", order_id="#1"),
              _call("cancel_order", order_id="#1", reason="no longer needed"),
              "Order #1 is cancelled."],
             [_call("get_order", order_id="#2"), "It is pending."]]
    user = [["Please cancel order #1, I no longer need it.", "Great. ###STOP###"],
            ["Is #2 pending?", "ok ###STOP###"]]
    model = ScriptedModel(tokenizer, agent, user, judge_lines=[[NOT_MET]])  # judges "status"
    runner = UserSimulatorRunner(LocalPool(tasks), 10, sampler=model, chat=chat,
                                 decoding=Decoding(0.0, 1.0, 0, 64), capacity=4096, seed=0)
    episodes = play_episodes(
        [EpisodeSpec(t.task_id, t.code, t.seed) for t in tasks], sampler=model, envs=runner,
        chat=chat, system_prompt=None, max_turns=10, decoding=Decoding(0.0, 1.0, 0, 64),
        seed=0, capacity=4096)
    assert [(e.episode_return, e.terminated, e.turns) for e in episodes] == [
        (1.0, True, 3), (0.0, True, 2)]
    assert model.said[("judge", 0)] == 0  # asked once, on the status task alone
    agent_view = tokenizer.decode(episodes[0].tokens)
    # the policy is the agent's system prompt; the user's first words its first message
    assert agent_view.index("<policy>") < agent_view.index(user[0][0])
    assert "Test user guidelines" not in agent_view
    user_view = tokenizer.decode(runner.session.sequences[0])
    assert "Cancel order #1; you no longer need it." in user_view  # the user's scenario
    assert user_view.index(tau2_env.FIRST_AGENT_MESSAGE) < user_view.index(agent[0][2])
    assert "cancel_order" not in user_view  # the agent's tool calls are not the user's to see


def test_the_rq2_table_plays_tau2_in_the_sandbox_with_the_policy_as_user(tmp_path, monkeypatch):
    """The real path on the tiny random model: `tables.run_table` binds the clone read-only
    into the sandbox and the policy's sampler plays the user; whatever it says, every episode
    is played and scored into items.jsonl."""
    import dataclasses

    from spade_jax.config import load_config_file, parse
    from spade_jax.eval import report, runner, tables
    from spade_jax.spade.runtime import Runtime

    tasks = tau2.tau2_tasks(FIXTURES, 1, max_steps=8, max_turns=2, domains=("tiny",))
    settings = tables.table_settings("rq2", "tau2.max_new_tokens=8")
    settings["tau2"] = dataclasses.replace(settings["tau2"], user_decoding=runner.greedy(8))
    cuts = []  # the observation budget of every rollout

    def play(*args, **kwargs):
        cuts.append(kwargs["max_observation_tokens"])
        return play_episodes(*args, **kwargs)

    monkeypatch.setattr(runner, "play_episodes", play)
    rt = Runtime.create(parse(load_config_file("tiny"), 1), jax.devices()[:1])
    try:
        with pytest.raises(ValueError, match="need user_decoding"):
            runner.evaluate(rt, tasks, tmp_path, decoding=runner.greedy(8), progress=False)
        table = tables.run_table(rt, "rq2", {"tau2": tasks}, settings, tmp_path,
                                 data_dir=FIXTURES)
        # another model as the user: here a scripted one, whose conversation is the status
        # task's right answer once the agent has spoken
        user = ScriptedModel(rt.tokenizer, None, [["Cancel #1. ###STOP###"],
                                                  ["Is #2 pending?", "###STOP###"]])
        runner.evaluate(rt, tasks, tmp_path / "scripted_user", decoding=runner.greedy(8),
                        user_decoding=runner.greedy(8), user_model=UserModel(user, rt.chat),
                        sandbox={"read_only_paths": tau2.sandbox_paths(FIXTURES)},
                        with_hints=False, progress=False)
        other = load_user_model(rt, "random")
        assert other.sampler is not rt.sampler and other.chat.eos_id == rt.chat.eos_id
    finally:
        rt.close()
    scripted = report.read_jsonl(tmp_path / "scripted_user" / report.ITEMS_FILE)
    # the scripted user answered both (the cancel task's user stopped before anything was
    # done; the random agent cannot answer the status task right): both score 0
    assert user.said[("user", 0)] == 0 and user.said[("user", 1)] in (0, 1)
    assert {r["task_id"]: r["info"]["rewards"] for r in scripted} == {
        "tau2/tiny/cancel": [0.0], "tau2/tiny/status": [0.0]}
    rows = report.read_jsonl(tmp_path / "tau2" / report.ITEMS_FILE)
    assert sorted((r["task_id"], r["category"]) for r in rows) == [
        ("tau2/tiny/cancel", "tiny"), ("tau2/tiny/status", "tiny")]
    # started in the sandbox (a worker that cannot import the domain crashes the episode)
    assert all(r["info"]["status"] != "crashed" and r["n_steps"] >= 1 for r in rows), rows
    assert table["values"]["Tau2-Retail"]["episodes"] == 0  # "tiny" is no column of the table
    assert cuts == [settings["tau2"].observation_tokens, OBSERVATION_BUDGET]
    assert settings["tau2"].observation_tokens > OBSERVATION_BUDGET


def test_read_only_paths_are_bound_and_may_not_expose_host_secrets():
    from spade_jax.envs.sandbox.isolation import SandboxConfig, bwrap_prefix

    clone = str(FIXTURES / "tau2-bench")
    config = SandboxConfig(read_only_paths=(clone,))
    assert config.problems() == []
    args = bwrap_prefix(config)
    assert ["--ro-bind", clone, clone] in [args[i:i + 3] for i in range(len(args))]
    for bad in ("/etc", "/", "relative/dir"):
        assert "read_only_paths entry" in " ".join(SandboxConfig(read_only_paths=(bad,))
                                                   .problems())
