"""`Engine`: continuous batching of conversations over a fixed number of KV-cache slots."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from spade_jax.sampling.sampler import Sampler
from spade_jax.sampling.session import FinishReason, TurnOutput


@dataclasses.dataclass(frozen=True)
class Request:
    """One conversation to serve: its prompt ids and the token budget of each of its turns."""

    prompt: Sequence[int]
    max_new_tokens: int


@dataclasses.dataclass
class Conversation:
    """A served conversation: its whole token sequence with the loss mask and log-probs of the
    sampled tokens (`Session.training_arrays`'s per-row data), its turns, and the slot it ran
    in. `context_full`: it ended because its cache could not take the next turn."""

    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    sampling_logprobs: list[float]
    turns: list[TurnOutput]
    slot: int
    context_full: bool


# on_turns({request index: the turn it just ended}) -> {request index: observation ids to append
# before that conversation's next turn}; a conversation left out is over
TurnsCallback = Callable[[dict[int, TurnOutput]], dict[int, Sequence[int]]]


# While a reply is out, a decode segment pauses after this many steps to collect it, so its
# conversation rejoins the decode soon after the reply is in
REPLY_CHECK_STEPS = 32


class TurnReplies(Protocol):
    """Replies to ended turns that may take a while (environments stepping in the background).

    `submit({request index: the turn it just ended})` starts answering them;
    `collect(block=...)` returns the replies that are in, {request index: observation ids to
    append before that conversation's next turn, or None when it is over}; with `block`
    (nothing else to decode) it waits for at least one.
    """

    def submit(self, ended: dict[int, TurnOutput]) -> None: ...

    def collect(self, *, block: bool) -> dict[int, Sequence[int] | None]: ...


class _RepliedAtOnce:
    """`TurnReplies` of a synchronous `TurnsCallback`: each submission is answered at once."""

    def __init__(self, on_turns: TurnsCallback):
        self.on_turns = on_turns
        self.replies: dict[int, Sequence[int] | None] = {}

    def submit(self, ended: dict[int, TurnOutput]) -> None:
        replies = self.on_turns(ended)
        self.replies.update({i: replies.get(i) for i in ended})

    def collect(self, *, block: bool) -> dict[int, Sequence[int] | None]:
        replies, self.replies = self.replies, {}
        return replies


class Engine:
    """Serves a queue of conversations on `slots` rows of one KV cache (continuous batching).

    Every slot decodes its conversation's current turn. The decode pauses once a share of the
    running turns ended (stop token, budget or full cache; `pause_share`); their turns are
    answered (`on_turns` at once, or `replies` in the background), each with the
    conversation's next observation, appended to that slot alone before its next turn starts,
    or with its end; a freed slot is prefilled with the next waiting conversation (that row
    only). The other slots keep their state and resume decoding, so a long answer holds only
    its own slot, and so does a slow reply: a slot waiting for `replies` sits out the decode
    segments until its reply is collected at a pause (every `REPLY_CHECK_STEPS` steps while
    one is out). Each conversation has `capacity` cache slots of its own, and its sampling
    keys derive from (seed, request index, position), so what it samples depends neither on
    its slot nor on its neighbours: greedy outputs equal one-at-a-time generation. The
    schedule depends only on the sampled tokens and on which replies are in at each pause
    (with `on_turns`, all of them), so the hosts of a multi-host run make the same program
    calls when their `replies` collect the same on every host. `draft_tokens`: prompt-lookup
    drafts each decode step verifies (`Sampler.start`; None: the sampler's).
    """

    def __init__(self, sampler: Sampler, *, slots: int, capacity: int,
                 pause_share: float = 0.25, draft_tokens: int | None = None):
        if slots < 1:
            raise ValueError(f"slots={slots!r}: the engine needs at least one slot")
        if not 0.0 < pause_share <= 1.0:
            raise ValueError(f"pause_share={pause_share!r}: the share of running turns that "
                             "ends a decode segment, in (0, 1]")
        self.sampler, self.slots, self.capacity = sampler, int(slots), int(capacity)
        self.pause_share = float(pause_share)
        self.draft_tokens = draft_tokens  # drafts per decode step (None: the sampler's)
        self.decode_steps = 0  # decode-loop iterations of the last run (`Session.decode_steps`)

    def run(self, requests: Sequence[Request], *, on_turns: TurnsCallback | None = None,
            replies: TurnReplies | None = None, temperature: float = 0.0, top_k: int = 0,
            top_p: float = 1.0, stop_token_ids: Sequence[int] = (),
            seed: int = 0) -> list[Conversation]:
        """Serve every request to its end; one Conversation per request, in order.

        Without `on_turns` or `replies` each conversation is one turn. An observation is
        appended only if the conversation's cache keeps room for a whole next turn
        (`max_new_tokens`); otherwise the conversation ends `context_full`. Sampling settings
        as `Session.decode`.
        """
        if on_turns is not None and replies is not None:
            raise ValueError("give on_turns (replies at once) or replies (collected later), "
                             "not both")
        if on_turns is not None:
            replies = _RepliedAtOnce(on_turns)
        if not requests:
            return []
        queue = collections.deque(range(len(requests)))
        first = [queue.popleft() for _ in range(min(self.slots, len(requests)))]
        drafts = {} if self.draft_tokens is None else {"draft_tokens": self.draft_tokens}
        session = self.sampler.start([requests[i].prompt for i in first],
                                     capacity=self.capacity, **drafts)
        owner: list[int | None] = list(first)  # request served by each row (None: free)
        session.key_ids[: len(first)] = first
        turn = session.begin_turn([requests[i].max_new_tokens for i in first],
                                  temperature=temperature, top_k=top_k, top_p=top_p,
                                  stop_token_ids=stop_token_ids, seed=seed)
        turns: list[list[TurnOutput]] = [[] for _ in requests]
        results: list[Conversation | None] = [None] * len(requests)
        waiting: dict[int, int] = {}  # row -> request whose reply it waits for

        def finish(r: int, context_full: bool) -> None:
            i = owner[r]
            results[i] = Conversation(
                session.sequences[r], session.loss_masks[r], session.logprobs[r],
                session.sampling_logprobs[r], turns[i], r, context_full=context_full
                or turn.outputs[r].finish_reason is FinishReason.CONTEXT_FULL)
            owner[r] = None

        while any(i is not None for i in owner):
            ended = {r: owner[r] for r in range(session.num_rows) if owner[r] is not None
                     and not turn.running[r] and r not in waiting}
            for r, i in ended.items():
                turns[i].append(turn.outputs[r])
            # a refused prompt (longer than the capacity) sampled nothing: no turn to answer
            answered = {r: i for r, i in ended.items() if replies is not None and (
                turn.outputs[r].tokens
                or turn.outputs[r].finish_reason is not FinishReason.CONTEXT_FULL)}
            for r in ended.keys() - answered.keys():
                finish(r, context_full=False)
            if answered:
                replies.submit({i: turn.outputs[r] for r, i in answered.items()})
                waiting.update(answered)
            observations: dict[int, list[int]] = {}
            if waiting:
                # with nothing to decode or prefill, wait for a reply
                idle = not turn.running.any() and not (queue and None in owner)
                got, before = replies.collect(block=idle), len(waiting)
                free = session.free_slots
                for r, i in list(waiting.items()):
                    if i not in got:
                        continue
                    del waiting[r]
                    obs = list(map(int, got[i] or ()))
                    fits = len(obs) + requests[i].max_new_tokens <= free[r]
                    if obs and fits:
                        observations[r] = obs
                    else:
                        finish(r, context_full=bool(obs) and not fits)
                if idle and len(waiting) == before:
                    raise RuntimeError("TurnReplies.collect(block=True) returned none of the "
                                       f"{before} replies waited for")
            if observations:
                session.append([observations.get(r) for r in range(session.num_rows)])
                session.start_rows(turn, {r: requests[owner[r]].max_new_tokens
                                          for r in observations})
            refill = {}
            for r in range(session.num_rows):
                if owner[r] is None and queue:
                    owner[r] = queue.popleft()
                    session.key_ids[r] = owner[r]
                    refill[r] = requests[owner[r]].prompt
            if refill:
                session.restart(refill)
                session.start_rows(turn, {r: requests[owner[r]].max_new_tokens
                                          for r in refill})
            # pause once a share of the running turns ended, while a conversation waits or
            # may continue
            pause_after = max(1, round(self.pause_share * int(turn.running.sum())))
            session.decode_segment(turn, exit_after_finished=(
                pause_after if queue or replies is not None else None),
                max_steps=REPLY_CHECK_STEPS if waiting else None)
        self.decode_steps = session.decode_steps
        return results
