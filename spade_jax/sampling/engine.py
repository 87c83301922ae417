"""`Engine`: continuous batching of conversations over a fixed number of KV-cache slots."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

from spade_jax.sampling.sampler import Sampler
from spade_jax.sampling.session import FinishReason, Session, TurnOutput


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


# on_turn(request index, the turn just ended) -> observation ids to append before that
# conversation's next turn, or None when the conversation is over
TurnCallback = Callable[[int, TurnOutput], Sequence[int] | None]


class Engine:
    """Serves a queue of conversations on `slots` rows of one KV cache (continuous batching).

    Every slot decodes its conversation's current turn; when a turn ends (stop token, budget or
    full cache) the decode pauses, `on_turn` gives the conversation's next observation (appended
    to that slot alone, then its next turn starts) or ends it, and a freed slot is prefilled
    with the next waiting conversation (that row only), while the other slots keep their state
    and resume decoding. So a long answer holds only its own slot, and short ones do not wait
    for it. Each conversation has `capacity` cache slots of its own, and its sampling keys
    derive from (seed, request index, position), so what it samples does not depend on the
    slot or on its neighbours: greedy outputs equal one-at-a-time generation.
    """

    def __init__(self, sampler: Sampler, *, slots: int, capacity: int):
        if slots < 1:
            raise ValueError(f"slots={slots!r}: the engine needs at least one slot")
        self.sampler, self.slots, self.capacity = sampler, int(slots), int(capacity)

    def run(self, requests: Sequence[Request], *, on_turn: TurnCallback | None = None,
            temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
            stop_token_ids: Sequence[int] = (), seed: int = 0) -> list[Conversation]:
        """Serve every request to its end; one Conversation per request, in order.

        Without `on_turn` each conversation is one turn. Sampling settings as
        `Session.decode`.
        """
        if not requests:
            return []
        queue = collections.deque(range(len(requests)))
        first = [queue.popleft() for _ in range(min(self.slots, len(requests)))]
        session = Session(self.sampler, [requests[i].prompt for i in first], self.capacity)
        owner = list(first)  # request served by each row (None: free)
        session.key_ids[: len(first)] = first
        turn = session.begin_turn([0] * session.num_rows, temperature=temperature,
                                  top_k=top_k, top_p=top_p, stop_token_ids=stop_token_ids,
                                  seed=seed)
        session.start_rows(turn, {r: requests[i].max_new_tokens for r, i in enumerate(first)})
        turns: list[list[TurnOutput]] = [[] for _ in requests]
        results: list[Conversation | None] = [None] * len(requests)
        while any(i is not None for i in owner):
            observations: dict[int, list[int]] = {}
            for r, i in enumerate(owner):
                if i is None or turn.running[r]:
                    continue
                output = turn.outputs[r]
                turns[i].append(output)
                obs = None
                if on_turn is not None and output.finish_reason is not FinishReason.CONTEXT_FULL:
                    obs = on_turn(i, output)
                obs = list(map(int, obs)) if obs else None
                fits = obs is None or len(obs) < session.free_slots[r]
                if obs is not None and fits:
                    observations[r] = obs
                    continue
                results[i] = Conversation(
                    session.sequences[r], session.loss_masks[r], session.logprobs[r],
                    session.sampling_logprobs[r], turns[i], r,
                    context_full=not fits or output.finish_reason is FinishReason.CONTEXT_FULL)
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
            # pause at the first finished turn while a conversation waits or may continue
            session.decode_segment(
                turn, exit_after_finished=1 if queue or on_turn is not None else None)
        return results
