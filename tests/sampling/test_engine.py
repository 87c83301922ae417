"""Continuous batching (`Engine`) on a tiny random model: same outputs as one at a time."""

import flax.nnx as nnx
import pytest

from spade_jax.models.transformer import Transformer
from spade_jax.sampling import Engine, Request, Sampler
from tests.sampling.test_sampler import CFG


@pytest.fixture(scope="module")
def sampler():
    """One token a decode step (no drafts), so the schedules the tests assert are known."""
    return Sampler(Transformer(CFG, rngs=nnx.Rngs(0)), draft_tokens=0)


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

    def on_turns(ended):  # two observations per conversation, of request-dependent lengths
        observations = {}
        for i in ended:
            if calls.count(i) < 2:
                observations[i] = [5 + i] * (1 + i % 3)
            calls.append(i)
        return observations

    runs = []
    for slots, pause_share in ((2, 1.0), (5, 0.2), (7, 0.5)):
        calls = []
        runs.append(Engine(sampler, slots=slots, capacity=64, pause_share=pause_share).run(
            requests, on_turns=on_turns, temperature=1.0, seed=4))
    for a, b, c in zip(*runs, strict=True):
        assert len(a.turns) == 3
        assert a.tokens == b.tokens == c.tokens and a.loss_mask == b.loss_mask == c.loss_mask


def test_a_conversation_over_capacity_ends_alone(sampler):
    requests = [Request(list(range(1, 30)), 5), Request([4, 5], 5), Request([6], 5)]
    served = Engine(sampler, slots=2, capacity=16).run(requests)
    assert served[0].context_full and served[0].turns[0].tokens == []
    assert [len(c.turns[0].tokens) for c in served[1:]] == [5, 5]
    assert not served[1].context_full


def test_a_long_answer_holds_only_its_own_slot(sampler):
    # no stop token: each turn runs to its budget, so the schedule is known
    requests = [Request([3, 4, 5], 40), Request([6, 7], 3), Request([8], 3)]
    ended, counts = [], {}

    def on_turns(turns):  # the short conversations go on for three turns
        ended.append(sorted(turns))
        for i in turns:
            counts[i] = counts.get(i, 0) + 1
        return {i: [9] for i in turns if i and counts[i] < 3}

    engine = Engine(sampler, slots=3, capacity=64, pause_share=0.3)
    served = engine.run(requests, on_turns=on_turns)
    # the short conversations play their three turns while the long answer's first decodes
    assert ended[:3] == [[1, 2], [1, 2], [1, 2]] and ended[-1] == [0], ended
    assert [len(c.turns) for c in served] == [1, 3, 3]
    assert engine.decode_steps == 40  # the long answer's steps; the short turns ran alongside


class SlowFirstReplies:
    """`TurnReplies` where conversation 0's reply comes back only after two more submissions of
    the others (a slow environment) or when the engine has nothing else to wait for; the others
    are answered at once. Every conversation goes on for three turns."""

    def __init__(self):
        self.submitted, self.turns, self.out, self.blocks = [], {}, {}, 0

    def submit(self, ended):
        self.submitted.append(sorted(ended))
        for i in ended:
            self.turns[i] = self.turns.get(i, 0) + 1
            self.out[i] = len(self.submitted)

    def collect(self, *, block):
        self.blocks += block
        ready = [i for i, at in self.out.items() if i or len(self.submitted) >= at + 2]
        if block and not ready:
            ready = list(self.out)
        for i in ready:
            del self.out[i]
        return {i: [9] if self.turns[i] < 3 else None for i in ready}


def test_a_slow_reply_holds_only_its_own_slot(sampler):
    # no stop token: each turn runs to its budget; conversation 0's turns end first
    requests = [Request([3, 4, 5], 2), Request([6, 7], 6), Request([8], 6)]
    replies = SlowFirstReplies()
    engine = Engine(sampler, slots=3, capacity=64, pause_share=0.3)
    served = engine.run(requests, replies=replies)
    # the others play two turns while conversation 0's first reply is out
    assert replies.submitted[:3] == [[0], [1, 2], [1, 2]], replies.submitted
    assert replies.blocks and [len(c.turns) for c in served] == [3, 3, 3]
    # what each conversation sampled does not depend on when its replies came
    counts = {}

    def three_turns(ended):
        for i in ended:
            counts[i] = counts.get(i, 0) + 1
        return {i: [9] for i in ended if counts[i] < 3}

    at_once = Engine(sampler, slots=3, capacity=64).run(requests, on_turns=three_turns)
    assert [c.tokens for c in served] == [c.tokens for c in at_once]
    assert [c.slot for c in served] == [0, 1, 2]


def test_a_reply_that_comes_late_is_picked_up_within_a_few_steps(sampler):
    class NextCollection:  # each reply is in at the second collection after its submission
        def __init__(self):
            self.submitted, self.out, self.turns = [], {}, {}

        def submit(self, ended):
            self.submitted.append(sorted(ended))
            for i in ended:
                self.turns[i] = self.turns.get(i, 0) + 1
                self.out[i] = 2

        def collect(self, *, block):
            for i in self.out:
                self.out[i] -= 1
            ready = [i for i, left in self.out.items() if left <= 0 or block]
            for i in ready:
                del self.out[i]
            return {i: [9] if i == 0 and self.turns[i] < 3 else None for i in ready}

    replies = NextCollection()
    # no stop token: conversation 1's one turn takes 200 steps, conversation 0's turns 2 each;
    # conversation 1's long prompt makes the decode's window, and so its segments, long
    requests = [Request([3, 4, 5], 2), Request([1 + j % 50 for j in range(300)], 200)]
    served = Engine(sampler, slots=2, capacity=1024, pause_share=0.3).run(
        requests, replies=replies)
    # the decode pauses every REPLY_CHECK_STEPS steps while a reply is out, so conversation
    # 0 plays its three turns long before conversation 1's answer ends
    assert replies.submitted == [[0], [0], [0], [1]], replies.submitted
    assert [len(c.turns) for c in served] == [3, 1]


def test_replies_that_never_come_are_an_error(sampler):
    class Silent:
        def submit(self, ended):
            pass

        def collect(self, *, block):
            return {}

    with pytest.raises(RuntimeError, match="returned none of the 2 replies"):
        Engine(sampler, slots=2, capacity=64).run([Request([1], 2), Request([2], 2)],
                                                  replies=Silent())
    with pytest.raises(ValueError, match="not both"):
        Engine(sampler, slots=2, capacity=64).run([Request([1], 2)], replies=Silent(),
                                                  on_turns=lambda ended: {})


def test_an_observation_without_room_for_a_whole_next_turn_ends_the_conversation(sampler):
    requests = [Request([1, 2, 3], 4), Request([4, 5, 6], 4)]
    # after 7 tokens (6 cached: the last one is pending), 16 slots take 6 + 4 more, not 7 + 4
    given = {0: [7] * 7, 1: [7] * 6}
    served = Engine(sampler, slots=2, capacity=16).run(
        requests, on_turns=lambda turns: {i: given.pop(i) for i in turns if i in given})
    assert served[0].context_full and len(served[0].turns) == 1
    assert not served[1].context_full and len(served[1].turns) == 2
    assert len(served[1].tokens) == 17 and served[1].turns[1].finish_reason == "length"


def test_a_refused_prompt_is_not_passed_to_the_callback(sampler):
    seen = []
    served = Engine(sampler, slots=2, capacity=8).run(
        [Request(list(range(1, 12)), 3), Request([2], 3)],
        on_turns=lambda turns: seen.extend(turns) or {})
    assert seen == [1] and served[0].context_full and not served[1].context_full


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_the_pause_share_is_checked(sampler, share):
    with pytest.raises(ValueError, match="pause_share"):
        Engine(sampler, slots=2, capacity=8, pause_share=share)
