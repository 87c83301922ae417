"""Native tool calling: the chat template renders the tools and a call; our parser recovers it.

A Qwen3 tokenizer cannot be downloaded here, so QWEN3_STYLE_TEMPLATE reproduces the parts of
Qwen3's chat template that matter (tools as JSON in `<tools>`, calls as `<tool_call>` JSON,
tool results as `<tool_response>`) on the SmolLM2 tokenizer. SmolLM2's own template ignores
`tools=`: the fallback, where the environment's first observation describes the tools and the
call format.
"""

import copy
import json

import pytest

from spade_jax.envs import EnvPool
from spade_jax.envs.seeds import list_seed_envs
from spade_jax.envs.tool_use import ToolUseEnv, parse_tool_calls
from spade_jax.spade.envrunner import SandboxEnvRunner
from spade_jax.spade.rollout import ChatFormat, Decoding, EpisodeSpec, play_episodes
from tests.envs.conftest import TEST_CONFIG
from tests.loop.pin import ScriptedSession

QWEN3_STYLE_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML "
    "tags:\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set f = call.function if call.function is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}"
    "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}"
    "{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PENCIL = next(e for e in list_seed_envs(tool_use=True) if e.name.endswith("pencil_shop"))
CALLS = [("multiply", {"a": 2, "b": 3}), ("add", {"a": 6, "b": -1})]


@pytest.fixture(scope="module")
def smollm2():
    from spade_jax.weights.gguf import smollm2_gguf_path
    from spade_jax.weights.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_gguf_path())


@pytest.fixture(scope="module")
def qwen3_style(smollm2):
    tokenizer = copy.deepcopy(smollm2)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    return tokenizer


def pencil_env() -> ToolUseEnv:
    """The pencil-shop seed, run in-process the way the sandbox runs it."""
    namespace = {"ToolUseEnv": ToolUseEnv}
    exec(compile(PENCIL.code, PENCIL.name, "exec"), namespace)
    return namespace["PencilShopEnv"]()


def assistant_turn(tokenizer, calls) -> str:
    """The text the template renders for an assistant turn making `calls`, as the model emits
    it after the generation prompt (decoded the way the rollout decodes the model's tokens)."""
    context = [{"role": "user", "content": "go"}]
    answer = {"role": "assistant", "content": "",
              "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}}
                             for n, a in calls]}
    head = tokenizer.apply_chat_template(context, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(context + [answer], tokenize=False)
    assert full.startswith(head)
    text = full[len(head):].split("<|im_end|>")[0]
    ids = tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.decode(ids, skip_special_tokens=True)


def test_a_template_with_tool_support_renders_the_tools(qwen3_style):
    chat = ChatFormat(qwen3_style)
    tools = pencil_env().get_tools()
    messages = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "OBS"}]
    text = qwen3_style.decode(chat.prompt(messages, tools=tools))
    assert chat.supports_tools
    assert "<tools>" in text and json.dumps(tools[0], ensure_ascii=False) in text, text
    assert text.startswith("<|im_start|>system\nSYS") and text.endswith("<|im_start|>assistant\n")


def test_native_calls_round_trip_through_the_template_and_run_in_the_environment(qwen3_style):
    text = assistant_turn(qwen3_style, CALLS)
    assert parse_tool_calls(text) == CALLS
    env = pencil_env()
    obs, reward, terminated, _, _ = env.step(text)
    assert obs.startswith("[multiply] 6\n[add] 5") and reward == 0.0 and not terminated, obs


def test_string_arguments_round_trip_too(qwen3_style):
    calls = [("subtract", json.dumps({"a": 9, "b": 4}))]
    assert parse_tool_calls(assistant_turn(qwen3_style, calls)) == [("subtract", {"a": 9, "b": 4})]


def test_smollm2_template_has_no_tool_support_so_the_observation_carries_the_tools(smollm2):
    chat = ChatFormat(smollm2)
    env = pencil_env()
    messages = [{"role": "user", "content": env.reset(seed=1)[0]}]
    assert not chat.supports_tools
    assert chat.prompt(messages, tools=env.get_tools()) == chat.prompt(messages)
    first = smollm2.decode(chat.prompt(messages))
    assert "- multiply(a: integer, b: integer) - Return a * b." in first
    assert '<tool_call>{"name": "TOOL", "arguments": {"ARG": VALUE}}</tool_call>' in first
    fallback = "".join("<tool_call>" + json.dumps({"name": n, "arguments": a}) + "</tool_call>"
                       for n, a in CALLS)  # the format the observation explains
    ids = smollm2.encode(fallback, add_special_tokens=False)
    assert parse_tool_calls(smollm2.decode(ids, skip_special_tokens=True)) == CALLS


def test_tool_results_go_back_as_the_templates_tool_turn(qwen3_style):
    """Round trip: prompt + the assistant's call + observation_turn(tool=True) are the tokens of
    the template's own rendering of that conversation with the result as a `tool` message."""
    chat = ChatFormat(qwen3_style)
    messages = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "OBS"}]
    call = assistant_turn(qwen3_style, CALLS[:1])
    answer = qwen3_style.encode(call + qwen3_style.eos_token, add_special_tokens=False)
    ids = chat.prompt(messages) + answer + chat.observation_turn("[multiply] 6", True, tool=True)
    want = qwen3_style.apply_chat_template(
        messages + [{"role": "assistant", "content": call},
                    {"role": "tool", "content": "[multiply] 6"}],
        tokenize=False, add_generation_prompt=True)
    assert chat.has_tool_role and qwen3_style.decode(ids) == want
    assert want.endswith("<|im_start|>user\n<tool_response>\n[multiply] 6\n</tool_response>"
                         "<|im_end|>\n<|im_start|>assistant\n"), want
    user = qwen3_style.decode(chat.observation_turn("[multiply] 6", True))
    assert "<tool_response>" not in user and "[multiply] 6" in user  # other observations


def test_smollm2_has_no_tool_turn_so_tool_results_go_back_as_user_turns(smollm2):
    chat = ChatFormat(smollm2)
    assert not chat.has_tool_role
    as_tool = chat.observation_turn("[multiply] 6", True, tool=True)
    assert as_tool == chat.observation_turn("[multiply] 6", True)
    assert smollm2.decode(as_tool).endswith("<|im_start|>user\n[multiply] 6<|im_end|>\n"
                                            "<|im_start|>assistant\n")


class NativeCallSampler:
    """Answers every turn with the template's rendering of one multiply call; keeps the prompts."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sessions = tokenizer, []
        self.answer_text = assistant_turn(tokenizer, [("multiply", {"a": 7, "b": 6})])

    def start(self, prompts, *, capacity):
        session = ScriptedSession(self.tokenizer, lambda *_: self.answer_text, prompts, capacity)
        self.sessions.append(session)
        return session


def test_play_renders_the_environment_tools_and_feeds_back_the_call_results(qwen3_style):
    sampler = NativeCallSampler(qwen3_style)
    with EnvPool(TEST_CONFIG, warm=1, max_turns=2) as pool:
        [episode] = play_episodes(
            [EpisodeSpec("pencil", PENCIL.code, seed=0)], sampler=sampler,
            envs=SandboxEnvRunner(pool, max_turns=2), chat=ChatFormat(qwen3_style),
            system_prompt="SYS", max_turns=2,
            decoding=Decoding(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=64), seed=0,
            capacity=4096)
    [session] = sampler.sessions
    assert '"name": "multiply"' in session.prompt_texts[0].split("\n</tools>")[0]
    played = qwen3_style.decode(episode.tokens.tolist())
    assert played.count("[multiply] 42") == 1 and episode.turns == 2, played
    assert "<|im_start|>user\n<tool_response>\n[multiply] 42" in played, played  # a tool turn
    assert episode.rewards == [0.0, 0.0] and episode.status == "ok"
