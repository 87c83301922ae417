"""The rollout's host side: episodes in the sandbox pool, with hints resolved and leak-checked.

A thin adapter from `EpisodeSpec`s to `spade_jax.envs.EnvPool`. It owns one decision the
rollout should not care about: which hint an episode actually sees. `ENV_HINT` asks the
environment's own `hint()` for the episode's seed (hint mode `designer`); any other text is
used as given (mode `self`). In both cases `hints.resolve_hint` drops a hint that is empty or
contains the episode's `solution()`, so a leaking hint can never inflate regret; the reason is
returned with the episode's start (`EpisodeStart.hint_status`) and counted by the loop.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from spade_jax.distributed import allgather_json, merge_across_processes
from spade_jax.envs import EnvPool, StepResult
from spade_jax.spade.hints import HintMode, HintStatus, resolve_hint

ENV_HINT = "\x00env-hint\x00"


@dataclasses.dataclass(frozen=True)
class EpisodeStart:
    """First observation of an episode (or why it could not start) and the hint it gets."""

    handle: int
    ok: bool
    status: str
    observation: str
    hint: str | None
    error: str = ""
    hint_status: HintStatus = HintStatus.NONE  # NONE: no hint asked (or no start)
    tools: list | None = None  # a tool-use environment's schemas (its reset info's "tools")
    system_prompt: str | None = None  # the episode's own agent system prompt (None: the run's)


class SandboxEnvRunner:
    """Start, step and close many sandboxed episodes at once."""

    def __init__(self, pool: EnvPool, max_turns: int):
        self.pool = pool
        self.max_turns = max_turns

    def reset_many(self, specs: Sequence) -> list[EpisodeStart]:
        by_turns: dict[int, list[int]] = {}
        for i, spec in enumerate(specs):
            by_turns.setdefault(spec.max_turns or self.max_turns, []).append(i)
        results = [None] * len(specs)
        for turns, rows in by_turns.items():
            started = self.pool.start_many([(specs[i].code, specs[i].seed) for i in rows],
                                           max_turns=turns)
            for i, result in zip(rows, started, strict=True):
                results[i] = result
        starts = []
        for spec, result in zip(specs, results, strict=True):
            hint, status = self._resolve_hint(result.handle, spec.hint) \
                if (result.ok and spec.hint) else (None, HintStatus.NONE)
            tools = result.info.get("tools") if isinstance(result.info, dict) else None
            starts.append(EpisodeStart(result.handle, result.ok, result.status,
                                       result.observation, hint, result.error, status,
                                       tools if isinstance(tools, list) else None))
        return starts

    def _resolve_hint(self, handle: int, requested: str) -> tuple[str | None, HintStatus]:
        """(hint shown, resolve_hint's reason) for a hint asked of this episode."""
        mode, text = HintMode.SELF, requested
        if requested == ENV_HINT:
            answer = self.pool.call(handle, "hint")
            mode, text = HintMode.DESIGNER, answer.value if answer.ok else None
        if not isinstance(text, str) or not text.strip():
            return None, HintStatus.EMPTY
        solution = self.pool.call(handle, "solution")
        known = solution.value if solution.ok and isinstance(solution.value, str) else None
        result = resolve_hint(mode, text, known)
        return result.hint, result.reason

    def step_many(self, handles_and_actions):
        return self.pool.step_many(list(handles_and_actions))

    def submit_steps(self, handles_and_actions) -> None:
        """Step these episodes in the background (`EnvPool.submit_steps`)."""
        self.pool.submit_steps(list(handles_and_actions))

    def collect_steps(self, *, fresh_s: float, wait_s: float) -> list[StepResult]:
        """The submitted steps that are back (`EnvPool.collect_steps`)."""
        return self.pool.collect_steps(fresh_s=fresh_s, wait_s=wait_s)

    @property
    def steps_outstanding(self) -> int:
        return self.pool.steps_outstanding

    def close_many(self, handles) -> None:
        for handle in handles:
            self.pool.close(handle)


class StepsAtOnce:
    """`submit_steps`/`collect_steps` for a runner whose steps must run in the caller's thread
    (they sample from the model, say): a submission steps at once, a collection returns it."""

    _stepped: tuple = ()

    def submit_steps(self, handles_and_actions) -> None:
        self._stepped = (*self._stepped, *self.step_many(list(handles_and_actions)))

    def collect_steps(self, *, fresh_s: float, wait_s: float) -> list[StepResult]:
        stepped, self._stepped = list(self._stepped), ()
        return stepped

    @property
    def steps_outstanding(self) -> int:
        return len(self._stepped)


# How long a host waits for its own steps between two exchanges, while none is back anywhere
EXCHANGE_ROUND_S = 0.05


class ShardedEnvRunner:
    """The episodes of a multi-host rollout, each run by one host; every host sees all results.

    Row i of a `reset_many` belongs to process i % process_count: only that process starts,
    steps and closes its environment, in its own sandbox pool. After every call the processes
    exchange their rows' results (`allgather_json`), so the replicated host loop (sampler
    inputs, returns, rewards) stays identical on every host while environment execution is
    divided among them. Handles returned here are run-wide episode numbers.
    """

    def __init__(self, local: SandboxEnvRunner, process_index: int, process_count: int,
                 gather=allgather_json):
        self.local = local
        self.process_index = process_index
        self.process_count = process_count
        self.gather = gather
        self._local_handles: dict[int, int] = {}  # episode number -> handle in our pool
        self._episodes = 0

    def reset_many(self, specs: Sequence) -> list[EpisodeStart]:
        numbers = list(range(self._episodes, self._episodes + len(specs)))
        self._episodes += len(specs)
        own = [i for i in range(len(specs)) if i % self.process_count == self.process_index]
        started = self.local.reset_many([specs[i] for i in own])
        mine = {}
        for i, start in zip(own, started, strict=True):
            self._local_handles[numbers[i]] = start.handle
            mine[numbers[i]] = dataclasses.asdict(dataclasses.replace(start, handle=numbers[i]))
        merged = merge_across_processes(mine, self.gather)
        return [EpisodeStart(**merged[n]) for n in numbers]

    def step_many(self, handles_and_actions) -> list[StepResult]:
        pairs = list(handles_and_actions)
        own = [(n, a) for n, a in pairs if n in self._local_handles]
        results = self.local.step_many([(self._local_handles[n], a) for n, a in own])
        mine = {n: dataclasses.asdict(dataclasses.replace(r, handle=n))
                for (n, _), r in zip(own, results, strict=True)}
        merged = merge_across_processes(mine, self.gather)
        return [StepResult(**merged[n]) for n, _ in pairs]

    def submit_steps(self, handles_and_actions) -> None:
        """Step this process's episodes among these in the background."""
        self.local.submit_steps([(self._local_handles[n], a) for n, a in handles_and_actions
                                 if n in self._local_handles])

    def collect_steps(self, *, fresh_s: float, wait_s: float) -> list[StepResult]:
        """The submitted steps that are back on any process, the same list on every process.

        Each round every process collects its own (the first round with the `fresh_s` grace)
        and all exchange them. Rounds go on while none is back anywhere, some are still out,
        and process 0 still has `wait_s` to wait: one process's clock decides, and the
        decision travels with the exchanged data, so every process makes the same calls and
        returns the same results.
        """
        numbers = {local: n for n, local in self._local_handles.items()}
        deadline = time.monotonic() + wait_s
        first = True
        while True:
            left = deadline - time.monotonic()
            mine = self.local.collect_steps(
                fresh_s=fresh_s if first else 0.0,
                wait_s=0.0 if first else min(EXCHANGE_ROUND_S, max(left, 0.0)))
            first = False
            parts = self.gather({
                "results": {str(numbers[r.handle]): dataclasses.asdict(
                    dataclasses.replace(r, handle=numbers[r.handle])) for r in mine},
                "waiting": math.isinf(left) or left > 0,
                "outstanding": self.local.steps_outstanding})
            results = [StepResult(**r) for part in parts for r in part["results"].values()]
            if results or not parts[0]["waiting"] or not any(p["outstanding"] for p in parts):
                return sorted(results, key=lambda r: r.handle)

    def close_many(self, handles) -> None:
        self.local.close_many([self._local_handles.pop(n) for n in handles
                               if n in self._local_handles])
