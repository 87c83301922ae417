"""Multi-turn play: the Agent and a batch of sandboxed environments, turn by turn.

Every row of the batch is one episode (an environment, a seed, with or without hint). Each turn
the sampler decodes the active rows' actions on the live KV cache; the environments step in
their sandbox workers concurrently; each observation is appended to the cache as a new user turn
(no re-prefill of earlier turns). The result per row is the whole token sequence with a mask of
the tokens the policy generated and their sampling log-probabilities — a training sample.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from spade_jax.envs.tool_use import TOOL_RESULTS
from spade_jax.sampling.engine import Conversation, Engine, Request
from spade_jax.sampling.session import TurnOutput
from spade_jax.spade import hints as hint_lib
from spade_jax.spade import rewards

PROMPT_BUDGET = 2048  # cache slots for the system prompt and first observation
OBSERVATION_BUDGET = 512  # cache slots per later observation; longer ones are cut to fit


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """What to play: environment code, seed, and the hint asked for (None: no hint).

    The env runner resolves the hint the episode really sees (see `envrunner.ENV_HINT`).
    `max_turns` overrides the runner's turn limit for this episode (evaluation tasks).
    """

    env_id: str
    code: str
    seed: int
    hint: str | None = None
    max_turns: int | None = None
    # a reply that used its whole token budget without an end-of-turn token ends the episode
    # unstepped, truncated (return 0): the reference's no-hint plays (`hit_eos`)
    end_on_cut_reply: bool = False


class EpisodeStatus(enum.StrEnum):
    """How an episode ended: normally, its environment crashed or timed out in the sandbox,
    its environment's step failed and ended it as a loss (`play_episodes`'
    `step_error_reward`), or the conversation outgrew the KV cache."""

    OK = "ok"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    ENV_ERROR = "env_error"
    CONTEXT_FULL = "context_full"

    @property
    def failed(self) -> bool:
        """The sandbox failed the episode (it scores FAILED_EPISODE_RETURN)."""
        return self in (EpisodeStatus.CRASHED, EpisodeStatus.TIMEOUT)


@dataclasses.dataclass
class Episode:
    """A played episode: its token sequence (a training sample) and its outcome."""

    spec: EpisodeSpec
    tokens: np.ndarray
    loss_mask: np.ndarray
    behaviour_logp: np.ndarray  # the sampler's raw log-probs (TurnOutput.logprobs)
    rewards: list[float]
    terminated: bool
    status: EpisodeStatus
    turns: int
    generated_tokens: int
    hint: str | None = None  # the hint this episode was shown (after the env runner's checks)
    hint_status: hint_lib.HintStatus = hint_lib.HintStatus.NONE  # EpisodeStart.hint_status

    @property
    def failed(self) -> bool:
        return EpisodeStatus(self.status).failed

    @property
    def episode_return(self) -> float:
        return rewards.episode_return(self.rewards, self.terminated, failed=self.failed)


@dataclasses.dataclass(frozen=True)
class Decoding:
    """How one kind of generation samples: temperature, top-p, top-k (0: off) and the token
    budget of one answer (one turn for the Agent)."""

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int

    def decode_kwargs(self) -> dict:
        """The keyword arguments `Session.decode` takes for these settings."""
        return dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


def conversation_capacity(max_turns: int, max_new_tokens: int, max_context: int) -> int:
    """KV-cache slots of one Agent conversation: the prompt budget plus, per turn, the Agent's
    answer and an observation budget; capped by `max_context`."""
    return int(min(max_context, PROMPT_BUDGET + max_turns * (max_new_tokens + OBSERVATION_BUDGET)))


class EnvRunner(Protocol):
    """Host side of a rollout: many sandboxed environments stepped concurrently, at once
    (`step_many`) or in the background (`submit_steps`, then `collect_steps` with
    `EnvPool.collect_steps`'s waits)."""

    def reset_many(self, specs: Sequence[EpisodeSpec]) -> list[Any]: ...

    def step_many(self, handles_and_actions: Sequence[tuple[Any, str]]) -> list[Any]: ...

    def submit_steps(self, handles_and_actions: Sequence[tuple[Any, str]]) -> None: ...

    def collect_steps(self, *, fresh_s: float, wait_s: float) -> list[Any]: ...

    def close_many(self, handles: Sequence[Any]) -> None: ...


TOOLS_PROBE = [{"type": "function", "function": {
    "name": "spade_probe_tool", "description": "probe",
    "parameters": {"type": "object", "properties": {}}}}]


class ChatFormat:
    """Token-level chat turns for a tokenizer's template, derived from the template itself.

    `prompt(messages, tools)` gives the ids of a conversation ready for the assistant to answer,
    with the tool schemas rendered by the template's own tool support (`supports_tools`, e.g.
    Qwen3's) when it has one; otherwise the tools are only described in the environment's first
    observation, with the `<tool_call>` JSON format it explains (the fallback, e.g. SmolLM2).
    `observation_turn(text, stopped, tool)` gives the ids that close the assistant's turn (if it
    ended without its end-of-turn token) and add a turn holding an environment observation: the
    template's `tool` turn for the results of tool calls when it supports tools (Qwen3's
    `<tool_response>`), else a user turn (the fallback: SmolLM2's template only echoes roles, so
    a `tool` role there would be one the model never saw).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.supports_tools = TOOLS_PROBE[0]["function"]["name"] in tokenizer.apply_chat_template(
            [{"role": "user", "content": "U"}], tools=TOOLS_PROBE, tokenize=False,
            add_generation_prompt=True)
        probe = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
        closed = self._render(probe, add_generation_prompt=False)
        following = self._render(probe + [{"role": "user", "content": "\x00OBS\x00"}], True)
        if not following.startswith(closed):
            raise ValueError("chat template does not extend conversations by appending turns")
        end_of_answer = closed[closed.rindex("A") + 1:]
        self._assistant_end = end_of_answer
        self._user_prefix, self._user_suffix = following[len(closed):].split("\x00OBS\x00")
        self._tool_turn = None  # (prefix, suffix) of a tool turn, when the template has one
        if self.supports_tools:
            tool = self._render(probe + [{"role": "tool", "content": "\x00OBS\x00"}], True)
            if tool.startswith(closed) and tool.count("\x00OBS\x00") == 1:
                self._tool_turn = tuple(tool[len(closed):].split("\x00OBS\x00"))
        self.eos_id = tokenizer.eos_token_id

    def _render(self, messages, add_generation_prompt, tools=None) -> str:
        extra = {"tools": tools} if tools and self.supports_tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )

    def prompt(self, messages: list[dict[str, str]], tools: list[dict] | None = None) -> list[int]:
        text = self._render(messages, add_generation_prompt=True, tools=tools)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def has_tool_role(self) -> bool:
        """Whether tool results go back as the template's own tool turn."""
        return self._tool_turn is not None

    def observation_turn(self, observation: str, stopped_on_eos: bool,
                         tool: bool = False) -> list[int]:
        end = self._assistant_end
        eos_text = self.tokenizer.eos_token or ""
        if stopped_on_eos and end.startswith(eos_text):
            end = end[len(eos_text):]
        prefix, suffix = (self._tool_turn if tool and self.has_tool_role
                          else (self._user_prefix, self._user_suffix))
        text = end + prefix + observation + suffix
        return self.tokenizer.encode(text, add_special_tokens=False)


class _EnvironmentTurns:
    """The Agent's ended turns stepped in their environments in the background
    (`engine.TurnReplies`), with each episode's turns, rewards and outcome so far."""

    def __init__(self, envs: EnvRunner, starts: list, chat: ChatFormat, *, max_turns: int,
                 max_observation_tokens: int, step_wait_s: float, playing: list[int],
                 to_action: Callable[[str], str], end_on_cut_reply: list[bool],
                 step_error_reward: float | None):
        self.envs, self.starts, self.chat, self.to_action = envs, starts, chat, to_action
        self.max_turns, self.max_observation_tokens = max_turns, max_observation_tokens
        self.step_wait_s, self.playing = step_wait_s, playing
        self.end_on_cut_reply, self.step_error_reward = end_on_cut_reply, step_error_reward
        self.unstepped: dict[int, None] = {}  # requests whose cut reply ended them
        self.request = {starts[i].handle: j for j, i in enumerate(playing)}  # handle -> request
        n = len(starts)
        self.rewards: list[list[float]] = [[] for _ in range(n)]
        self.terminated = [False] * n
        self.status = [EpisodeStatus.OK if s.ok else EpisodeStatus.CRASHED for s in starts]
        self.turns = [0] * n
        self.continued = [False] * n  # whether the last turn's observation asked for another
        self.stopped: dict[int, bool] = {}  # request -> whether its last turn ended on EOS
        self.seconds = 0.0  # host time spent submitting and waiting for steps

    def submit(self, ended: dict[int, TurnOutput]) -> None:
        started = time.perf_counter()
        pairs = []
        for j, out in ended.items():
            i = self.playing[j]
            self.turns[i] += 1
            self.stopped[j] = out.stopped
            if not out.stopped and self.end_on_cut_reply[i]:
                self.unstepped[j] = None
                self.continued[i] = False
                continue
            reply = self.chat.tokenizer.decode(out.tokens, skip_special_tokens=True)
            pairs.append((self.starts[i].handle, self.to_action(reply)))
        if pairs:
            self.envs.submit_steps(pairs)
        self.seconds += time.perf_counter() - started

    def collect(self, *, block: bool) -> dict[int, list[int] | None]:
        started = time.perf_counter()
        observations: dict[int, list[int] | None] = dict(self.unstepped)
        self.unstepped.clear()
        results = self.envs.collect_steps(
            fresh_s=self.step_wait_s, wait_s=math.inf if block and not observations else 0.0)
        for result in results:
            j = self.request[result.handle]
            i = self.playing[j]
            observations[j] = None
            self.continued[i] = False
            if not result.ok:
                if (result.status == EpisodeStatus.CRASHED
                        and self.step_error_reward is not None):
                    self.rewards[i].append(self.step_error_reward)
                    self.terminated[i] = True
                    self.status[i] = EpisodeStatus.ENV_ERROR
                else:
                    self.status[i] = EpisodeStatus(result.status)
                continue
            self.rewards[i].append(float(result.reward))
            if result.terminated or result.truncated:
                self.terminated[i] = bool(result.terminated)
            elif self.turns[i] < self.max_turns:
                text = result.observation[:4 * self.max_observation_tokens]
                tool = isinstance(result.info, dict) and bool(result.info.get(TOOL_RESULTS))
                observations[j] = self.chat.observation_turn(text, self.stopped[j], tool=tool)
                self.continued[i] = True
        self.seconds += time.perf_counter() - started
        return observations


def play_episodes(
    specs: Sequence[EpisodeSpec],
    *,
    sampler,
    envs: EnvRunner,
    chat: ChatFormat,
    system_prompt: str | None,
    max_turns: int,
    decoding: Decoding,
    seed: int,
    capacity: int,
    max_observation_tokens: int = OBSERVATION_BUDGET,
    step_wait_s: float = math.inf,
    timer=None,
    to_action: Callable[[str], str] = str,
    step_error_reward: float | None = None,
) -> list[Episode]:
    """Play every spec to the end (or `max_turns`) and return one Episode per spec.

    `sampler` is a `spade_jax.sampling.Sampler`; the episodes are served by one `Engine` with
    a slot (`capacity` cache slots of its own) per episode. Turns are not synchronised: once
    some turns end, those episodes' environments step (concurrently, in the background),
    their observations are appended and their next turns start while the other episodes keep
    decoding, so a long answer holds only its own episode. The engine waits up to
    `step_wait_s` after submitting steps for them (math.inf: every step, so the schedule
    depends on the tokens alone); a slower step's episode sits out decode segments until its
    result is in, so a slow environment too holds only its own episode. An observation
    longer than about `max_observation_tokens` is cut; an episode whose next observation and
    answer no longer fit in its cache ends with status 'context_full'. Every turn samples
    with `decoding` (its `max_new_tokens` per turn); each token's key derives from (seed, the
    episode's index among those whose environment started, position), so `seed` may be any
    seed in [0, 2**31). `system_prompt=None` starts the conversation with the observation alone
    (benchmarks whose reference sends no system message); an episode start's own
    `system_prompt` replaces it. `to_action` makes the action `step` receives of a decoded
    reply (default: the reply itself; SPADE's plays pass `GameType.agent_action`). With
    `step_error_reward`, a step that crashes (raises, breaks the contract, kills its worker)
    ends its episode terminated with that reward, status 'env_error', as the reference's
    environment wrapper answers an error (None: the episode fails, status 'crashed'). A spec's
    `end_on_cut_reply` ends its episode, unstepped, at a reply cut by the token budget.
    """
    started = time.perf_counter()
    n = len(specs)
    starts = envs.reset_many(specs)
    env_seconds = time.perf_counter() - started
    prompts = []
    for start in starts:
        observation = start.observation if start.ok else ""
        if start.ok and start.hint:
            observation = hint_lib.inject_hint(observation, start.hint)
        messages = [{"role": "user", "content": observation}]
        system = start.system_prompt if start.system_prompt is not None else system_prompt
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        prompts.append(chat.prompt(messages, tools=start.tools)[-capacity // 2:])
    playing = [i for i in range(n) if starts[i].ok]
    env_turns = _EnvironmentTurns(envs, starts, chat, max_turns=max_turns,
                                  max_observation_tokens=max_observation_tokens,
                                  step_wait_s=step_wait_s, playing=playing,
                                  to_action=to_action,
                                  end_on_cut_reply=[s.end_on_cut_reply for s in specs],
                                  step_error_reward=step_error_reward)
    engine = Engine(sampler, slots=max(len(playing), 1), capacity=capacity)
    served = engine.run([Request(prompts[i], decoding.max_new_tokens) for i in playing],
                        replies=env_turns,
                        **decoding.decode_kwargs(), stop_token_ids=[chat.eos_id], seed=seed)
    stepped = time.perf_counter()
    envs.close_many([s.handle for s in starts])
    env_seconds += time.perf_counter() - stepped + env_turns.seconds
    if timer is not None:
        timer.add("env", env_seconds)
        timer.add("sampling", time.perf_counter() - started - env_seconds)
    conversations = dict(zip(playing, served, strict=True))
    episodes = []
    for i in range(n):
        # an episode whose environment did not start keeps its prompt alone
        played = conversations.get(i) or Conversation(
            prompts[i], [0] * len(prompts[i]), [0.0] * len(prompts[i]), [], [], -1, False)
        status = env_turns.status[i]
        if played.context_full and env_turns.continued[i]:
            status = EpisodeStatus.CONTEXT_FULL
        episodes.append(Episode(
            spec=specs[i], tokens=np.asarray(played.tokens, np.int32),
            loss_mask=np.asarray(played.loss_mask, bool),
            behaviour_logp=np.asarray(played.logprobs, np.float32),
            rewards=env_turns.rewards[i], terminated=env_turns.terminated[i], status=status,
            turns=env_turns.turns[i], generated_tokens=sum(len(t.tokens) for t in played.turns),
            hint=starts[i].hint, hint_status=starts[i].hint_status))
    return episodes
