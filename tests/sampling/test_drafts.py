"""Prompt-lookup drafts: golden lookups, and decoding that verifies them (greedy or sampled)
is unchanged."""

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models.transformer import Transformer
from spade_jax.sampling import Engine, Request, Sampler
from spade_jax.sampling import session as session_lib
from spade_jax.sampling.drafts import confirmed_drafts, ngram_drafts
from tests.sampling.test_sampler import CFG


def drafts_of(history, last, n_drafts=4, sizes=(4, 3, 2)):
    width = max(len(h) for h in history)
    padded = np.zeros((len(history), width), np.int32)
    for r, h in enumerate(history):
        padded[r, : len(h)] = h
    return np.asarray(ngram_drafts(jnp.asarray(padded), jnp.asarray(last), n_drafts,
                                   sizes)).tolist()


def test_drafts_continue_the_latest_earlier_occurrence_of_the_longest_tail():
    # tail (5, 6) occurred at 1..2 (then 7, 8) and at 5..6 (then 9): the latest wins; the
    # 3-gram (4, 5, 6) occurred only at 0..2, so the longer lookup wins over both
    assert drafts_of([[4, 5, 6, 7, 8, 5, 6, 9, 1, 5, 6]], [10], sizes=(2,)) == [[9, 1, 5, 6]]
    assert drafts_of([[4, 5, 6, 7, 8, 5, 6, 9, 4, 5, 6]], [10]) == [[7, 8, 5, 6]]


def test_a_loop_closer_than_the_drafts_repeats_cyclically():
    # period 3: after ...1 2 3 1 2 the drafts are 3 1 2 3
    assert drafts_of([[1, 2, 3, 1, 2, 3, 1, 2]], [7]) == [[3, 1, 2, 3]]
    # one token repeated
    assert drafts_of([[9, 7, 7, 7]], [3], n_drafts=3) == [[7, 7, 7]]


def test_rows_look_only_at_their_own_valid_tokens():
    # row 0's tail (2, 3) occurs past its last index only (stale slots): no match there, so
    # it repeats its newest token; row 1 matches; padding rows of other rows do not leak in
    got = drafts_of([[1, 2, 3, 0, 2, 3, 4], [6, 7, 6, 7, 0, 0, 0]], [2, 3], n_drafts=2)
    assert got == [[3, 3], [6, 7]]


def test_confirmed_drafts_count_the_agreeing_prefix():
    drafts = jnp.array([[5, 6, 7], [5, 6, 7], [1, 6, 7]])
    chosen = jnp.array([[5, 6, 7, 8], [5, 9, 7, 8], [5, 6, 7, 8]])
    assert confirmed_drafts(drafts, chosen).tolist() == [3, 1, 0]


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], [5] * 30, [7, 8, 9], list(range(1, 50))]


@pytest.fixture
def always_feed(monkeypatch):
    """Greedy segments feed their drafts whatever their lookups' record."""
    monkeypatch.setattr(session_lib, "DRAFTS_PAY_AT", 0.0)


def echo_model(weights_seed: int, sharpness: float):
    """Logits peaked at the newest token (the head is the embedding, the layers' writes are
    scaled down), so sampled turns mostly repeat a token and now and then leave it: drafts
    are confirmed often and refused often, both at temperature > 0."""
    model = Transformer(CFG, rngs=nnx.Rngs(weights_seed))
    model.wo[...] *= 0.1
    model.w_down[...] *= 0.1
    model.lm_head[...] = model.embed[...].T
    model.final_norm[...] *= sharpness
    return model


def assert_drafts_change_nothing(model, capacity, **sampling):
    """Tokens, finish reasons and log-probs equal with and without drafts, over two turns with
    an append between, with a stop token, budgets, rows that fill their capacity and windows
    that grow between segments; returns the decode steps (without, with)."""
    plain_sampler, drafting = Sampler(model, draft_tokens=0), Sampler(model, draft_tokens=4)
    plain = plain_sampler.start(PROMPTS, capacity=capacity)
    drafted = drafting.start(PROMPTS, capacity=capacity)
    first = plain.decode(40, **sampling)[0].tokens
    plain = plain_sampler.start(PROMPTS, capacity=capacity)
    stop = first[len(first) // 2]
    for budget in (40, 150):
        a = plain.decode(budget, stop_token_ids=[stop], **sampling)
        b = drafted.decode(budget, stop_token_ids=[stop], **sampling)
        for x, y in zip(a, b, strict=True):
            assert x.tokens == y.tokens
            assert x.finish_reason == y.finish_reason
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)
            np.testing.assert_allclose(x.sampling_logprobs, y.sampling_logprobs, atol=1e-4)
        observations = [[3, 4] if free >= 2 else None for free in plain.free_slots]
        plain.append(observations)
        drafted.append(observations)
    assert any(dict(key[3]).get("draft_tokens") == 4 for key in drafting._jitted)
    got, want = drafted.training_arrays(), plain.training_arrays()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-4)
    return plain.decode_steps, drafted.decode_steps


@pytest.mark.parametrize("capacity", [64, 200])
@pytest.mark.parametrize("weights_seed", [0, 1, 2])
def test_greedy_turns_with_drafts_equal_those_without(capacity, weights_seed, always_feed):
    model = Transformer(CFG, rngs=nnx.Rngs(weights_seed))
    plain_steps, drafted_steps = assert_drafts_change_nothing(model, capacity)
    assert drafted_steps <= plain_steps


# the three ways `select_tokens` samples: top-p among candidates, top-k, the whole vocabulary
SAMPLINGS = [dict(temperature=0.7, top_p=0.9), dict(temperature=1.0, top_k=20),
             dict(temperature=0.6)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["top_p", "top_k", "full"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_turns_with_drafts_equal_those_without(sampling, seed, always_feed):
    """A sampled token depends on its position's logits and key only, so verifying drafts
    draws the same samples as one token a step, while taking fewer steps."""
    plain_steps, drafted_steps = assert_drafts_change_nothing(
        echo_model(seed, sharpness=4.0), capacity=200, seed=seed, **sampling)
    assert drafted_steps < 0.9 * plain_steps


def repeating_model():
    """All-zero weights make every logit equal, so greedy picks token 0 forever."""
    graphdef, state = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    return nnx.merge(graphdef, jax.tree.map(jnp.zeros_like, state))


def test_a_row_that_repeats_itself_takes_several_tokens_a_step():
    """The first segment only looks drafts up (one token a step); its first drafts were right,
    so the next segments feed them and each step takes five tokens."""
    model = repeating_model()
    first = session_lib.DRAFT_CHECK_STEPS
    for drafts, most_steps in ((0, 100), (4, first + (100 - first) // 5 + 2)):
        sampler = Sampler(model, draft_tokens=drafts)
        session = sampler.start([[3, 9]], capacity=256)
        [out] = session.decode(100)
        assert out.tokens == [0] * 100
        assert session.decode_steps <= most_steps
    assert any(dict(key[3]).get("draft_tokens") == 4 for key in sampler._jitted)


def test_drafts_are_not_fed_while_they_do_not_pay(monkeypatch):
    monkeypatch.setattr(session_lib, "DRAFTS_PAY_AT", float("inf"))
    sampler = Sampler(repeating_model(), draft_tokens=4)
    session = sampler.start([[3, 9]], capacity=256)
    [out] = session.decode(100)
    assert out.tokens == [0] * 100 and session.decode_steps == 100
    assert session.draft_yield == pytest.approx(5.0, abs=0.5)  # what they would have given
    assert not any(dict(key[3]).get("draft_tokens") for key in sampler._jitted)


def test_a_sampled_row_that_repeats_itself_takes_several_tokens_a_step():
    """The gate weighs sampled turns as greedy ones: the first segment's first drafts were
    mostly right, so the later segments feed them."""
    session = Sampler(echo_model(0, sharpness=8.0), draft_tokens=4).start([[5] * 30],
                                                                         capacity=256)
    [out] = session.decode(160, temperature=0.7, top_p=0.9, seed=3)
    assert len(out.tokens) == 160
    assert session.decode_steps < 0.6 * 160


def test_the_engine_serves_greedy_drafts_as_one_at_a_time(model, always_feed):
    sampler = Sampler(model, draft_tokens=0)  # the engine's own count overrides it
    requests = [Request(p, b) for p, b in zip(PROMPTS, (30, 12, 45, 7), strict=True)]
    alone = [sampler.start([q.prompt], capacity=96).decode(q.max_new_tokens)[0]
             for q in requests]
    served = Engine(sampler, slots=2, capacity=96, draft_tokens=3).run(requests)
    assert [c.turns[0].tokens for c in served] == [a.tokens for a in alone]
    assert {dict(key[3]).get("draft_tokens") for key in sampler._jitted
            if key[0].startswith("decode")} == {0, 3}


def test_the_lookup_histories_follow_prompts_answers_observations_and_restarts(model):
    """The session copies only new tokens into its host histories; each row's slots up to its
    pending token must hold its sequence through decodes, appends, window growth and a
    restart with a shorter prompt (slots past a row's tokens are never looked at)."""
    session = Sampler(model, draft_tokens=4).start(PROMPTS, capacity=300)

    def check():
        rows = np.arange(session.batch + 1)
        got = session._histories(rows)
        assert got.shape == (session.batch + 1, session.window)
        for r, sequence in enumerate(session.sequences):
            assert got[r, :len(sequence)].tolist() == sequence[: session.window]
        assert not got[session.batch].any()  # the padding row

    session.decode(20)
    check()
    session.append([[3, 4, 5]] * len(PROMPTS))
    session.decode(150)  # the window grows
    check()
    session.restart({1: [9, 8]})
    session.decode(10)
    check()


def test_draft_tokens_out_of_range_is_refused(model):
    with pytest.raises(ValueError, match="draft_tokens=8"):
        Sampler(model, draft_tokens=8)
    with pytest.raises(ValueError, match="draft_tokens=-1"):
        Sampler(model).start([[1, 2]], capacity=8, draft_tokens=-1)
