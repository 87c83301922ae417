"""The rollout's env runner for conversations with a simulated user, played by a model.

Environments of this kind (τ²-bench's `tau2_env.py`, ACEBench's `acebench_env.py`) say whom
each observation is for (`info["to"]`): "agent" observations (or ones that name nobody) go
back to the rollout as usual; "user" observations are the user's to answer, and this runner
answers them with its own model (by default the policy's sampler) in a second KV-cache
session, one conversation per episode that has a user: the user's system prompt and tools
from the environment's reset info, the agent's messages as the user model's incoming turns,
its tool results as tool turns. An episode whose reset is addressed to the agent (ACEBench's
single replies and multi-step Agent items) has no user conversation. The agent's system prompt
and tools come from the same reset info (`EpisodeStart.system_prompt`, `EpisodeStart.tools`).
An observation for the "judge" (τ²'s natural-language assertions) is answered by the same
model, in a fresh conversation of the judge's system prompt and that observation."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from spade_jax.envs import EnvPool, StepResult
from spade_jax.envs.tool_use import TOOL_RESULTS
from spade_jax.seeding import derive_seed
from spade_jax.spade.envrunner import EpisodeStart, StepsAtOnce
from spade_jax.spade.rollout import ChatFormat, Decoding, EpisodeStatus

TO_AGENT, TO_USER, TO_JUDGE = "agent", "user", "judge"


@dataclasses.dataclass(frozen=True)
class UserModel:
    """The model that plays the simulated users: a sampler and its tokenizer's chat format."""

    sampler: Any
    chat: ChatFormat


def load_user_model(rt, source: str) -> UserModel:
    """A model other than the policy for the simulated users: `source` as `model.source` takes
    it (a name, an HF directory or a .gguf file), on the policy's mesh, in its compute dtype."""
    from spade_jax.sampling import Sampler
    from spade_jax.spade.runtime import load_model_and_tokenizer

    policy = rt.run.model
    model, tokenizer = load_model_and_tokenizer(dataclasses.replace(policy, source=source),
                                                rt.run.seed, rt.mesh)
    # it samples beside everything the policy's sampler runs beside, and that sampler's copy
    reserved = rt.resident.beside_sampler + rt.resident.sampler_copy
    return UserModel(Sampler(model, mesh=rt.mesh, compute_dtype=policy.compute_dtype,
                             reserved_bytes=reserved, **rt.run.sampling.sampler_options()),
                     ChatFormat(tokenizer))


class UserSimulatorRunner(StepsAtOnce):
    """Start, step and close episodes whose user is played by `sampler` with `decoding`
    (steps at once: the user's turns sample from the model, in the caller's thread).

    `capacity` is the user conversation's KV-cache slots per episode; a user turn that no
    longer fits ends its episode with status 'context_full'.
    """

    def __init__(self, pool: EnvPool, max_turns: int, *, sampler, chat: ChatFormat,
                 decoding: Decoding, capacity: int, seed: int):
        self.pool = pool
        self.max_turns = max_turns
        self.sampler = sampler
        self.chat = chat
        self.decoding = decoding
        self.capacity = capacity
        self.seed = seed
        self.session = None
        self.rows: dict[int, int] = {}  # episode handle -> row of the user session
        self.stopped: dict[int, bool] = {}  # row -> whether its last reply ended on EOS
        self.user_turns = 0
        self.finished: dict[int, StepResult] = {}  # episodes that ended on a user turn at start

    def reset_many(self, specs: Sequence) -> list[EpisodeStart]:
        """Start the episodes; where a reset addresses the user (τ²'s greeting, ACEBench's
        opening question), play the user's first message, which the agent then sees first."""
        by_turns: dict[int, list[int]] = {}
        for i, spec in enumerate(specs):
            by_turns.setdefault(spec.max_turns or self.max_turns, []).append(i)
        started: list[StepResult] = [None] * len(specs)  # type: ignore[list-item]
        for turns, indices in by_turns.items():
            results = self.pool.start_many([(specs[i].code, specs[i].seed) for i in indices],
                                           max_turns=turns)
            for i, result in zip(indices, results, strict=True):
                started[i] = result
        prompts = []
        for result in started:
            info = result.info if result.ok and isinstance(result.info, dict) else {}
            if info.get("to") == TO_USER:  # the user speaks first: a row of the user session
                self.rows[result.handle] = len(prompts)
                self.stopped[len(prompts)] = True
                messages = [{"role": "system", "content": info.get("user_system_prompt", "")},
                            {"role": "user", "content": result.observation or " "}]
                prompts.append(self.chat.prompt(messages, tools=info.get("user_tools")))
        self.session = self.sampler.start(prompts, capacity=self.capacity) if prompts else None
        firsts = self._answer({r.handle: r for r in started if r.ok}, first=True)
        starts = []
        for result in started:
            info = result.info if isinstance(result.info, dict) else {}
            first = firsts.get(result.handle, result)
            if first.ok and first.done:
                self.finished[result.handle] = first
            tools = info.get("tools")
            starts.append(EpisodeStart(
                result.handle, first.ok, first.status, first.observation, None,
                first.error, tools=tools if isinstance(tools, list) else None,
                system_prompt=info.get("agent_system_prompt")))
        return starts

    def step_many(self, handles_and_actions) -> list[StepResult]:
        """Step the agents' actions; answer every observation addressed to the user."""
        pairs = [(h, a) for h, a in handles_and_actions if h not in self.finished]
        results = dict(zip([h for h, _ in pairs], self.pool.step_many(pairs), strict=True))
        results.update(self._answer(results))
        return [self.finished.pop(h) if h in self.finished else results[h]
                for h, _ in handles_and_actions]

    def close_many(self, handles) -> None:
        for handle in handles:
            self.pool.close(handle)

    def _answer(self, results: dict[int, StepResult], first: bool = False
                ) -> dict[int, StepResult]:
        """Play user turns until every episode's observation is for the agent (or it ended);
        then the judge's turn of those that ask for it."""
        waiting = {h: r for h, r in results.items() if _addressed(r, TO_USER)}
        judging = {h: r for h, r in results.items() if _addressed(r, TO_JUDGE)}
        unseated = sorted(h for h in waiting if h not in self.rows)
        if unseated:
            raise ValueError(f"episodes {unseated} address the user, but their reset addressed "
                             "the agent: a conversation with a user starts with the user")
        answered: dict[int, StepResult] = {}
        while waiting:
            if not first:
                waiting, full = self._append_user_turns(waiting)
                answered.update(full)
            first = False
            if not waiting:
                break
            active = [False] * len(self.session.sequences)
            for handle in waiting:
                active[self.rows[handle]] = True
            outputs = self.session.decode(
                self.decoding.max_new_tokens, **self.decoding.decode_kwargs(),
                stop_token_ids=[self.chat.eos_id],
                seed=derive_seed(self.seed, "user", self.user_turns), active=active)
            self.user_turns += 1
            replies = []
            for handle in waiting:
                output = outputs[self.rows[handle]]
                self.stopped[self.rows[handle]] = output.stopped
                replies.append((handle, self.chat.tokenizer.decode(
                    output.tokens, skip_special_tokens=True)))
            stepped = self.pool.step_many(replies)
            waiting = {}
            for result in stepped:
                if _addressed(result, TO_USER):
                    waiting[result.handle] = result
                elif _addressed(result, TO_JUDGE):
                    judging[result.handle] = result
                else:
                    answered[result.handle] = result
        if judging:
            answered.update(self._judge(judging))
        return answered

    def _judge(self, judging: dict[int, StepResult]) -> dict[int, StepResult]:
        """Each judge prompt answered in a conversation of its own; the environments' results."""
        prompts = [self.chat.prompt([
            {"role": "system", "content": result.info.get("judge_system_prompt", "")},
            {"role": "user", "content": result.observation}]) for result in judging.values()]
        # a prompt over the user conversation's capacity is refused: no verdict, assertions fail
        session = self.sampler.start(prompts, capacity=min(
            self.capacity, max(map(len, prompts)) + self.decoding.max_new_tokens + 1))
        outputs = session.decode(self.decoding.max_new_tokens, **self.decoding.decode_kwargs(),
                                 stop_token_ids=[self.chat.eos_id],
                                 seed=derive_seed(self.seed, "judge", self.user_turns))
        verdicts = [(handle, self.chat.tokenizer.decode(output.tokens, skip_special_tokens=True))
                    for handle, output in zip(judging, outputs, strict=True)]
        return {result.handle: result for result in self.pool.step_many(verdicts)}

    def _append_user_turns(self, waiting: dict[int, StepResult]
                           ) -> tuple[dict[int, StepResult], dict[int, StepResult]]:
        """Append each observation to its user conversation: (still waiting, ended as full)."""
        turns: list[list[int] | None] = [None] * len(self.session.sequences)
        for handle, result in waiting.items():
            row = self.rows[handle]
            tool = isinstance(result.info, dict) and bool(result.info.get(TOOL_RESULTS))
            turns[row] = self.chat.observation_turn(result.observation or " ",
                                                    self.stopped[row], tool=tool)
        free = self.session.free_slots
        full = {}
        for handle in list(waiting):
            row = self.rows[handle]
            if len(turns[row]) + self.decoding.max_new_tokens > free[row]:
                turns[row] = None
                full[handle] = dataclasses.replace(waiting.pop(handle),
                                                   status=EpisodeStatus.CONTEXT_FULL)
        if any(t is not None for t in turns):
            self.session.append(turns)
        return waiting, full


def _addressed(result: StepResult, party: str) -> bool:
    return (result.ok and not result.done and isinstance(result.info, dict)
            and result.info.get("to") == party)
