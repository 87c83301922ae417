"""Continuous batching (`Engine`) on a tiny random model: same outputs as one at a time."""

import flax.nnx as nnx
import pytest

from spade_jax.models.transformer import Transformer
from spade_jax.sampling import Engine, Request, Sampler
from tests.sampling.test_sampler import CFG


@pytest.fixture(scope="module")
def sampler():
    return Sampler(Transformer(CFG, rngs=nnx.Rngs(0)))


def mixed_requests():
    """Seven requests of mixed prompt lengths and budgets, more than the engine's slots."""
    lengths, budgets = [3, 40, 1, 17, 6, 29, 2], [9, 4, 14, 6, 11, 3, 8]
    return [Request([1 + (7 * i + j) % 55 for j in range(n)], b)
            for i, (n, b) in enumerate(zip(lengths, budgets, strict=True))]


def test_greedy_equals_one_at_a_time_and_slots_are_reused(sampler):
    requests = mixed_requests()
    # a stop token the greedy answers hit, so turns end at different steps
    alone = [sampler.start([q.prompt], capacity=64).decode(q.max_new_tokens)[0]
             for q in requests]
    stop = alone[0].tokens[2]
    alone = [sampler.start([q.prompt], capacity=64).decode(
        q.max_new_tokens, stop_token_ids=[stop])[0] for q in requests]
    served = Engine(sampler, slots=3, capacity=64).run(requests, stop_token_ids=[stop])
    for request, conversation, reference in zip(requests, served, alone, strict=True):
        [turn] = conversation.turns
        assert turn.tokens == reference.tokens
        assert turn.finish_reason == reference.finish_reason
        assert conversation.tokens == list(request.prompt) + reference.tokens
    assert {c.slot for c in served} == {0, 1, 2}  # 7 conversations on 3 slots
    assert any(r.finish_reason == "stop" for r in alone)


def test_multi_turn_sampling_does_not_depend_on_the_slot_count(sampler):
    requests = mixed_requests()

    def on_turn(i, turn):  # two observations per conversation, of request-dependent lengths
        done = sum(1 for c in calls if c == i)
        calls.append(i)
        return [5 + i] * (1 + i % 3) if done < 2 else None

    runs = []
    for slots in (2, 5):
        calls = []
        runs.append(Engine(sampler, slots=slots, capacity=64).run(
            requests, on_turn=on_turn, temperature=1.0, seed=4))
    for a, b in zip(*runs, strict=True):
        assert len(a.turns) == 3
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask


def test_a_conversation_over_capacity_ends_alone(sampler):
    requests = [Request(list(range(1, 30)), 5), Request([4, 5], 5), Request([6], 5)]
    served = Engine(sampler, slots=2, capacity=16).run(requests)
    assert served[0].context_full and served[0].turns[0].tokens == []
    assert [len(c.turns[0].tokens) for c in served[1:]] == [5, 5]
    assert not served[1].context_full
