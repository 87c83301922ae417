"""`Engine`: continuous batching of conversations over a fixed number of KV-cache slots."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

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


class Engine:
    """Serves a queue of conversations on `slots` rows of one KV cache (continuous batching).

    Every slot decodes its conversation's current turn. The decode pauses once a share of the
    running turns ended (stop token, budget or full cache; `pause_share`); `on_turns` then
    gives, for all of them at once (e.g. environments stepped concurrently), each
    conversation's next observation, appended to that slot alone before its next turn starts,
    or ends it; a freed slot is prefilled with the next waiting conversation (that row only).
    The other slots keep their state and resume decoding, so a long answer holds only its own
    slot. Each conversation has `capacity` cache slots of its own, and its sampling keys derive
    from (seed, request index, position), so what it samples depends neither on its slot nor
    on its neighbours: greedy outputs equal one-at-a-time generation. The schedule depends only
    on the sampled tokens and the callback's answers, never on timing, so every host of a
    multi-host run makes the same program calls.
    """

    def __init__(self, sampler: Sampler, *, slots: int, capacity: int,
                 pause_share: float = 0.25):
        if slots < 1:
            raise ValueError(f"slots={slots!r}: the engine needs at least one slot")
        if not 0.0 < pause_share <= 1.0:
            raise ValueError(f"pause_share={pause_share!r}: the share of running turns that "
                             "ends a decode segment, in (0, 1]")
        self.sampler, self.slots, self.capacity = sampler, int(slots), int(capacity)
        self.pause_share = float(pause_share)
        self.decode_steps = 0  # decode-loop iterations of the last run (`Session.decode_steps`)

    def run(self, requests: Sequence[Request], *, on_turns: TurnsCallback | None = None,
            temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
            stop_token_ids: Sequence[int] = (), seed: int = 0) -> list[Conversation]:
        """Serve every request to its end; one Conversation per request, in order.

        Without `on_turns` each conversation is one turn. An observation is appended only
        if the conversation's cache keeps room for a whole next turn (`max_new_tokens`);
        otherwise the conversation ends `context_full`. Sampling settings as `Session.decode`.
        """
        if not requests:
            return []
        queue = collections.deque(range(len(requests)))
        first = [queue.popleft() for _ in range(min(self.slots, len(requests)))]
        session = self.sampler.start([requests[i].prompt for i in first],
                                     capacity=self.capacity)
        owner: list[int | None] = list(first)  # request served by each row (None: free)
        session.key_ids[: len(first)] = first
        turn = session.begin_turn([requests[i].max_new_tokens for i in first],
                                  temperature=temperature, top_k=top_k, top_p=top_p,
                                  stop_token_ids=stop_token_ids, seed=seed)
        turns: list[list[TurnOutput]] = [[] for _ in requests]
        results: list[Conversation | None] = [None] * len(requests)
        while any(i is not None for i in owner):
            ended = {r: owner[r] for r in range(session.num_rows)
                     if owner[r] is not None and not turn.running[r]}
            for r, i in ended.items():
                turns[i].append(turn.outputs[r])
            # a refused prompt (longer than the capacity) sampled nothing: no turn to answer
            answered = {i: turn.outputs[r] for r, i in ended.items() if turn.outputs[r].tokens
                        or turn.outputs[r].finish_reason is not FinishReason.CONTEXT_FULL}
            replies = on_turns(answered) if on_turns is not None and answered else {}
            observations: dict[int, list[int]] = {}
            free = session.free_slots
            for r, i in ended.items():
                obs = list(map(int, replies.get(i) or ()))
                fits = len(obs) + requests[i].max_new_tokens <= free[r]
                if obs and fits:
                    observations[r] = obs
                    continue
                results[i] = Conversation(
                    session.sequences[r], session.loss_masks[r], session.logprobs[r],
                    session.sampling_logprobs[r], turns[i], r,
                    context_full=bool(obs) and not fits
                    or turn.outputs[r].finish_reason is FinishReason.CONTEXT_FULL)
                owner[r] = None
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
                pause_after if queue or on_turns is not None else None))
        self.decode_steps = session.decode_steps
        return results
