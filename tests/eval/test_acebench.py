"""ACEBench: loading a clone, Normal / Special scoring, Agent dialogues, roll-up, rq2 wiring.

The fixture clone (tests/eval/fixtures/acebench/ACEBench) mimics the real one's layout with
items and a phone scenario written for these tests.
"""

import dataclasses
import re
from pathlib import Path

import pytest

from spade_jax.envs import StepResult
from spade_jax.errors import MissingFileError
from spade_jax.eval import acebench, acebench_env, tables
from spade_jax.eval.acebench_env import USER_OPENING
from spade_jax.eval.report import episode_record
from spade_jax.eval.simulated_user import UserSimulatorRunner
from spade_jax.spade.rollout import ChatFormat, Decoding, EpisodeSpec
from tests.eval.local_pool import LocalPool

DATA = Path(__file__).resolve().parent / "fixtures" / "acebench"
SEND = "[send_message(sender_name='Eve', receiver_name='Bob', message='Lunch at noon?')]"


@pytest.fixture(scope="module")
def tasks():
    return {t.task_id: t for t in acebench.acebench_tasks(DATA)}


def play(task, replies):
    """(reward, terminated, info) after the replies, in this process."""
    env = task.make_local()
    env.reset(seed=0)
    for reply in replies:
        _, reward, terminated, _, info = env.step(reply)
        if terminated:
            return reward, terminated, info
    return reward, terminated, info


def test_every_category_loads_with_acebench_prompts(tasks):
    assert {t.category for t in tasks.values()} == set(acebench.ALL_CATEGORIES)
    assert len(tasks) == 20
    prompt = tasks["normal_single_turn_single_function_0"].make_local().reset(seed=0)[0]
    assert prompt.startswith("NORMAL.") and "The current time is 2024-06-01" in prompt
    assert "'name': 'get_weather'" in prompt  # the function list as ACEBench formats it
    assert prompt.endswith("History:\nuser: Weather in Paris for 3 days?")
    preference = tasks["normal_preference_0"].make_local().reset(seed=0)[0]
    assert preference.startswith("PREFERENCE. Profile:\nFavourite restaurant: Roma.")
    assert tasks["special_incomplete_0"].make_local().reset(seed=0)[0].startswith("SPECIAL.")
    assert tasks["agent_multi_turn_0"].max_turns == 41  # 40 messages and the user's opening


def test_missing_clone_or_file_names_the_file_expected(tmp_path):
    with pytest.raises(MissingFileError, match="ACEBench/data_all/data_en/data_normal_single_"
                                               "turn_single_function.json \\(--data_dir was not "):
        acebench.acebench_tasks(None)
    with pytest.raises(MissingFileError, match=re.escape(str(tmp_path / "ACEBench" / "data_all"))):
        acebench.acebench_tasks(tmp_path)
    data = tmp_path / "ACEBench" / "data_all" / "data_en"
    data.mkdir(parents=True)
    (data / "data_special_irrelevant.json").write_text("")
    with pytest.raises(MissingFileError, match="possible_answer/data_special_irrelevant.json"):
        acebench.category_tasks(tmp_path, "special_irrelevant")
    with pytest.raises(ValueError, match="unknown ACEBench category 'normal'"):
        acebench.category_tasks(tmp_path, "normal")


@pytest.mark.parametrize("item, reply, passed", [
    ("normal_single_turn_single_function_0", "[get_weather(city='Paris', days=3)]", True),
    ("normal_single_turn_single_function_0", "[get_weather(days=3, city='paris')]", True),
    ("normal_single_turn_single_function_0",
     "<think>Paris, 3 days</think>\n[get_weather(city='Paris', days=3)]", True),
    ("normal_single_turn_single_function_0", "[get_weather(city='Berlin', days=3)]", False),
    # ACEBench compares strings (contained, normalised), lists and dicts, never numbers:
    ("normal_single_turn_single_function_0", "[get_weather(city='Paris', days=4)]", True),
    ("normal_single_turn_single_function_0", "[get_weather(city='Paris, FR', days=3)]", True),
    ("normal_single_turn_single_function_0", "[get_weather(city='Paris', days='3')]", False),
    ("normal_single_turn_single_function_0", "[get_weather(days=3)]", False),  # required
    ("normal_single_turn_single_function_0",
     "[get_weather(city='Paris', days=3, unit='C')]", False),  # extra parameter
    ("normal_single_turn_single_function_0", "get_weather(city='Paris', days=3)", False),
    ("normal_single_turn_single_function_0", "The weather in Paris.", False),
    ("normal_single_turn_single_function_1",
     "[book_table(restaurant='chez-nous', guests=2, vegan='true')]", True),
    ("normal_single_turn_single_function_1", "[get_weather(city='Chez Nous')]", False),
    ("normal_single_turn_parallel_function_0",
     "[get_weather(city='Rome'), get_weather(city='Oslo')]", True),
    ("normal_single_turn_parallel_function_0", "[get_weather(city='Rome')]", False),
    ("normal_single_turn_parallel_function_0",
     "[get_weather(city='Rome'), get_weather(city='Oslo'), get_weather(city='Oslo')]", False),
    ("normal_atom_list_0", "[tag_photos(tags=['Beach', 'sunset'], rating=4.5)]", True),
    ("normal_atom_list_0", "[tag_photos(tags=['sunset', 'beach'], rating=4.5)]", False),
    ("normal_atom_object_deep_0",
     "[plan_trip(route={'start': 'Turin', 'stops': ['Genoa', 'Pisa']})]", True),
    ("normal_atom_object_deep_0",
     "[plan_trip(route={'start': 'Turin', 'stops': ['Genoa']})]", False),
    ("normal_atom_object_deep_0", "[plan_trip(route={'start': 'Turin'})]", False),
    ("normal_atom_enum_0",
     "[plan_trip(route={'start': 'Turin', 'stops': []}, mode='train')]", True),
])
def test_normal_replies_are_scored_by_acebench_rules(tasks, item, reply, passed):
    reward, terminated, info = play(tasks[item], [reply])
    assert terminated and reward == (1.0 if passed else 0.0), info


@pytest.mark.parametrize("item, reply, passed", [
    ("special_incomplete_0",
     '["Missing necessary parameters (restaurant) for the api (book_table)"]', True),
    ("special_incomplete_0", '["Missing necessary parameters (guests) for the api (book_table)"]',
     False),
    ("special_incomplete_0", "[book_table(guests=3)]", False),
    ("special_incomplete_0", "<think>Missing necessary parameters (restaurant) for book_table?"
                             "</think>[book_table(guests=3)]", False),  # only the answer counts
    ("special_error_param_0",
     '["There is incorrect value (three-ish) for the parameters (days) in the conversation '
     'history."]', True),
    ("special_error_param_0", '["There is incorrect value for the parameters (days)."]', False),
    ("special_irrelevant_0",
     '["Due to the limitations of the function, I cannot solve this problem."]', True),
    ("special_irrelevant_0", "[get_weather(city='Paris')]", False),
])
def test_special_replies_must_name_the_problem_as_acebench_asks(tasks, item, reply, passed):
    reward, _, info = play(tasks[item], [reply])
    assert reward == (1.0 if passed else 0.0), info


def test_multi_step_agent_is_scored_on_the_scenario_end_state(tasks):
    task = tasks["agent_multi_step_0"]
    env = task.make_local()
    assert "MULTI-STEP AGENT" in env.reset(seed=0)[0]
    observation = env.step(SEND)[0]
    assert observation == "execution result:[{'status': False, 'message': 'Wi-Fi is off'}]"
    assert env.step("[turn_on_wifi()]")[0].endswith("'Wi-Fi is on'}]")
    assert env.step(SEND)[:3] == ("execution result:[{'status': True, 'message': 'sent'}]",
                                  0.0, False)
    assert env.step("finish conversation")[1:3] == (1.0, True)
    wrong = SEND.replace("noon", "one")
    assert play(task, ["[turn_on_wifi()]", wrong, "finish conversation"])[0] == 0.0
    assert play(task, [SEND, "finish conversation"])[0] == 0.0  # no Wi-Fi: never sent
    asked = task.make_local()
    asked.reset(seed=0)
    assert asked.step("Who is the sender?")[0].startswith("execution result:Please do not ask")
    unknown = task.make_local()
    unknown.reset(seed=0)
    assert "name 'fly' is not defined" in unknown.step("[fly(to='Mars')]")[0]


def test_an_agent_dialogue_ends_after_max_dialog_turns_messages(tasks):
    task = tasks["agent_multi_step_0"]
    env = task.make_local(max_dialog_turns=4)
    env.reset(seed=0)
    assert env.step("[turn_on_wifi()]")[2] is False  # messages 1-2: call and result
    *_, terminated, _, info = env.step(SEND)  # messages 3-4: the dialogue is over
    assert terminated and info["messages"] == 4 and info["valid"]


class ScriptedUser:
    """The simulated user's sampler: its fixed lines in order, whatever it was shown."""

    def __init__(self, tokenizer, lines):
        self.tokenizer, self.lines = tokenizer, list(lines)

    def start(self, prompts, *, capacity):
        from tests.loop.pin import ScriptedSession

        return ScriptedSession(self.tokenizer, lambda prompt, row, seed: self.lines.pop(0),
                               prompts, capacity)


@pytest.fixture(scope="module")
def chat():
    from spade_jax.weights.gguf import smollm2_gguf_path
    from spade_jax.weights.tokenizer import load_tokenizer

    return ChatFormat(load_tokenizer(smollm2_gguf_path()))


def user_runner(pool, max_turns, user, chat):
    """The simulated-user runner of the evaluation, with `user` as its model."""
    return UserSimulatorRunner(pool, max_turns, sampler=user, chat=chat,
                               decoding=Decoding(0.0, 1.0, 0, 64), capacity=4096, seed=0)


def start_items(runner, *items):
    return runner.reset_many([EpisodeSpec(t.task_id, t.code, 0, None, t.max_turns)
                              for t in items])


def test_multi_turn_agent_talks_to_the_simulated_user_through_the_runner(tasks, chat):
    task = tasks["agent_multi_turn_0"]
    user = ScriptedUser(chat.tokenizer, ["Hi, I want to text Bob.",
                                         "I am Eve; say 'Lunch at noon?'.",
                                         "Thanks. finish conversation"])
    runner = user_runner(LocalPool([task]), task.max_turns, user, chat)
    (start,) = start_items(runner, task)
    assert start.observation.startswith("MULTI-TURN AGENT.")
    assert "PHONE POLICY" in start.observation  # the BaseApi domain's policy
    assert start.observation.endswith("History:\nuser:Hi, I want to text Bob.\n")
    assert start.system_prompt is None  # ACEBench's own is in the observation

    def user_view():
        return chat.tokenizer.decode(runner.session.sequences[0])

    opening = user_view()  # the user's scenario, then ACEBench's opening question
    assert opening.index("You are a phone user. Instruction: You are Eve. You want to send "
                         "Bob the message 'Lunch at noon?'.") < opening.index(USER_OPENING)
    (reply,) = runner.step_many([(start.handle, "Who sends it, and what should it say?")])
    assert reply.observation == "user:I am Eve; say 'Lunch at noon?'."
    view = user_view()
    assert (view.index(USER_OPENING) < view.index("Hi, I want to text Bob.")
            < view.index("Who sends it, and what should it say?")
            < view.index("I am Eve; say 'Lunch at noon?'."))
    assert runner.step_many([(start.handle, "[turn_on_wifi()]")])[0].observation.startswith(
        "execution:")
    assert runner.step_many([(start.handle, SEND)])[0].observation.endswith("'sent'}]")
    assert "turn_on_wifi" not in user_view()  # the agent's calls are not the user's to see
    (end,) = runner.step_many([(start.handle, "Your message is sent. Anything else?")])
    assert (end.reward, end.terminated, end.info["valid"]) == (1.0, True, True)
    assert not user.lines


def test_multi_turn_agent_fails_when_nothing_was_executed(tasks, chat):
    task = tasks["agent_multi_turn_0"]
    user = ScriptedUser(chat.tokenizer, ["Text Bob for me.", "finish conversation",
                                         "finish conversation"])
    runner = user_runner(LocalPool([task]), task.max_turns, user, chat)
    (start,) = start_items(runner, task)
    (early,) = runner.step_many([(start.handle, "Sure, what should it say?")])
    assert early.observation == "user:finish conversation"  # ACEBench ends from message 3 on
    (end,) = runner.step_many([(start.handle, "Okay.")])
    assert (end.reward, end.terminated, end.info["error_type"]) == (
        0.0, True, "wrong number of class")


def test_items_without_a_user_share_the_runner_with_those_that_have_one(tasks, chat):
    """Resets addressed to the agent (single replies, multi-step Agent items) start at once;
    only the multi-turn item gets a user conversation."""
    single, step, turn = (tasks[i] for i in ("normal_single_turn_single_function_0",
                                             "agent_multi_step_0", "agent_multi_turn_0"))
    user = ScriptedUser(chat.tokenizer, ["Please text Bob."])
    runner = user_runner(LocalPool([single, step, turn]), turn.max_turns, user, chat)
    starts = start_items(runner, single, step, turn)
    assert starts[0].observation.startswith("NORMAL.")
    assert "MULTI-STEP AGENT" in starts[1].observation
    assert starts[2].observation.endswith("user:Please text Bob.\n")
    assert len(runner.session.sequences) == 1 and not user.lines
    results = runner.step_many([(starts[0].handle, "[get_weather(city='Paris', days=3)]"),
                                (starts[1].handle, "[turn_on_wifi()]")])
    assert (results[0].reward, results[0].terminated) == (1.0, True)
    assert results[1].observation.endswith("'Wi-Fi is on'}]")


def test_a_user_turn_in_an_episode_that_started_with_the_agent_is_refused(chat):
    class AgentFirstPool:
        def start_many(self, specs, max_turns=None):
            return [StepResult(0, "ok", "the task", info={"to": "agent"})]

        def step_many(self, pairs):
            return [StepResult(0, "ok", "for the user", info={"to": "user"})]

    runner = user_runner(AgentFirstPool(), 2, ScriptedUser(chat.tokenizer, []), chat)
    (start,) = runner.reset_many([EpisodeSpec("e", "code", 0)])
    assert runner.session is None  # nobody to play: no user session
    with pytest.raises(ValueError, match=r"episodes \[0\] address the user"):
        runner.step_many([(start.handle, "hello")])


def test_agent_items_play_inside_the_sandbox(tasks, chat):
    from spade_jax import envs

    try:
        pool = envs.EnvPool(envs.SandboxConfig(), warm=1)
    except envs.SandboxUnavailable as error:
        pytest.skip(f"no sandbox here: {error}")
    step, turn = tasks["agent_multi_step_0"], tasks["agent_multi_turn_0"]
    try:
        first = pool.start(step.code, 0, max_turns=step.max_turns)
        assert first.ok, first.error
        for action in ("[turn_on_wifi()]", SEND):
            assert pool.step(first.handle, action).ok
        result = pool.step(first.handle, "finish conversation")
        assert (result.reward, result.terminated) == (1.0, True), result
        user = ScriptedUser(chat.tokenizer, ["Please text Bob.", "Sure. finish conversation"])
        runner = user_runner(pool, turn.max_turns, user, chat)
        (start,) = start_items(runner, turn)
        assert start.ok and start.observation.endswith("user:Please text Bob.\n"), start
        for action in ("[turn_on_wifi()]", SEND):
            assert runner.step_many([(start.handle, action)])[0].observation.startswith("exec")
        (end,) = runner.step_many([(start.handle, "Sent. Anything else?")])
        assert (end.reward, end.terminated) == (1.0, True), end
    finally:
        pool.shutdown()


def records(passed):
    """One record per fixture item, returning 1 where `passed(task_id)`."""
    return [episode_record(t, 1.0 if passed(t.task_id) else 0.0)
            for t in acebench.acebench_tasks(DATA)]


def test_multi_turn_normal_categories_score_whole_conversations():
    rows = records(lambda task_id: task_id != "normal_multi_turn_user_adjust_0_1")
    adjust = [r for r in rows if r["category"] == "normal_multi_turn_user_adjust"]
    assert len(adjust) == 3  # two turns of conversation 0, one of conversation 1
    assert acebench.category_accuracy("normal_multi_turn_user_adjust", adjust) == 0.5
    assert acebench.group_accuracy(rows, "normal") == pytest.approx(1 - 0.5 / 12)
    assert acebench.category_accuracy("special_incomplete",
                                      [r for r in rows if r["category"] == "special_incomplete"])


def test_rq2_acebench_columns_roll_up_as_acebench_does():
    settings = tables.table_settings("rq2")
    assert not settings["acebench"].unavailable
    assert (settings["acebench"].decoding.temperature, settings["acebench"].max_turns) == (0.7, 40)
    assert settings["acebench"].user_decoding.max_new_tokens == 1000  # ACEBench's APIUSER
    settings["tau2"] = dataclasses.replace(settings["tau2"], unavailable="no clone in DATA")
    tasks = tables.table_tasks("rq2", settings, data_dir=DATA)["acebench"]
    assert len(tasks) == 20
    failed = ("special_irrelevant", "agent_multi_turn")
    rows = [dict(r, suite="acebench") for r in records(lambda i: not i.startswith(failed))]
    values = tables.table_values("rq2", rows)
    special, agent = 2 / 3, 1 / 2
    assert values["ACEBench-N"]["value"] == 1.0
    assert values["ACEBench-S"]["value"] == pytest.approx(special)
    assert values["ACEBench-A"]["value"] == pytest.approx(agent)
    assert values["ACEBench"]["value"] == pytest.approx(0.578 + 0.2676 * special + 0.1545 * agent)
    partial = tables.table_values("rq2", [r for r in rows if r["category"] != "agent_multi_step"])
    assert partial["ACEBench-A"]["value"] is None and partial["ACEBench"]["value"] is None
    assert partial["ACEBench-N"]["value"] == 1.0


def test_every_fixture_answer_scores_full_marks(tasks):
    """The possible answers, written as calls, pass (the check run on the real data)."""
    for category in acebench.CATEGORIES["normal"]:
        for item, truth in acebench.load_category(DATA, category):
            calls = [re.sub(r"_[0-9]+$", "", name) + "("
                     + ", ".join(f"{k}={v!r}" for k, v in p.items()) + ")"
                     for name, p in truth.items()]
            assert play(tasks[item["id"]], ["[" + ", ".join(calls) + "]"])[0] == 1.0, item["id"]


def test_the_env_module_needs_nothing_beyond_the_standard_library():
    source = Path(acebench_env.__file__).read_text()
    imports = [line.split()[1] for line in source.splitlines()
               if line.startswith(("import ", "from "))]
    assert all(name.split(".")[0] in {"ast", "collections", "copy", "importlib", "inspect",
                                       "json", "re", "sys"} for name in imports), imports
