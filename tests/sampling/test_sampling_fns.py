"""Token selection against NumPy: first_argmax, the Gumbel noise, and the distribution
select_tokens samples from under temperature, top-k and top-p, on both of its paths."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.sampling.sampling_fns import first_argmax, gumbel_noise, row_keys, select_tokens


def test_first_argmax_equals_numpy_argmax_with_ties_and_nan():
    rng = np.random.default_rng(0)
    values = rng.standard_normal((6, 1000)).astype(np.float32)
    values[1, [7, 300, 999]] = 9.0  # tie: the first maximum wins
    values[2, :] = 0.0  # all tied
    values[3, -1] = 50.0  # maximum in the last position
    got = np.asarray(first_argmax(jnp.asarray(values)))
    np.testing.assert_array_equal(got, np.argmax(values, axis=-1))
    assert got.dtype == np.int32
    values[4, 5] = np.nan  # no maximum: still a valid index
    assert 0 <= int(first_argmax(jnp.asarray(values))[4]) < 1000


@functools.partial(jax.jit, static_argnames="max_top_k")
def _select(logits, keys, temperature, top_k, top_p, max_top_k=64):
    """select_tokens as the sampler runs it: jitted, the knobs traced."""
    return select_tokens(logits, keys, temperature=temperature, top_k=top_k, top_p=top_p,
                         max_top_k=max_top_k)


def _keys(n, seed=0):
    return row_keys(jnp.asarray(seed), jnp.arange(n), jnp.zeros(n, jnp.int32))


def _kept_distribution(logits, temperature, top_k, top_p):
    """The exact distribution select_tokens samples from, in NumPy (HF's order: temperature,
    top-k, then top-p on the renormalised rest)."""
    scaled = logits.astype(np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    kept = np.zeros_like(probs, dtype=bool)
    kept[order[:top_k] if top_k > 0 else order] = True
    probs = np.where(kept, probs, 0.0) / probs[kept].sum()
    mass_before = np.cumsum(probs[order]) - probs[order]
    kept[order[mass_before >= top_p]] = False
    probs = np.where(kept, probs, 0.0)
    return probs / probs.sum()


def test_gumbel_noise_is_a_function_of_key_and_index_and_gumbel_distributed():
    keys = _keys(4)
    vocab = jnp.broadcast_to(jnp.arange(1000), (4, 1000))
    full = np.asarray(gumbel_noise(keys, vocab))
    picks = jnp.asarray([[7, 999, 3], [0, 5, 500], [42, 42, 1], [998, 2, 10]])
    np.testing.assert_array_equal(np.asarray(gumbel_noise(keys, picks)),
                                  np.take_along_axis(full, np.asarray(picks), axis=-1))
    assert not np.array_equal(full[0], full[1])  # rows differ
    samples = np.asarray(gumbel_noise(_keys(100, seed=1),
                                      jnp.broadcast_to(jnp.arange(1000), (100, 1000)))).ravel()
    assert abs(samples.mean() - np.euler_gamma) < 0.02  # 1e5 draws: standard error 0.004
    assert abs(samples.var() - np.pi**2 / 6) < 0.06
    assert abs((samples < 0).mean() - np.exp(-1)) < 0.01


@pytest.mark.parametrize("temperature, top_k, top_p, max_top_k", [
    (0.7, 3, 1.0, 64),  # top-k, candidates
    (1.0, 0, 0.8, 64),  # top-p alone, nucleus inside the candidates
    (1.3, 5, 0.9, 64),  # both
    (1.0, 0, 0.99, 4),  # top-p alone, nucleus wider than the candidates: bisection path
    (1.0, 0, 1.0, 4),  # plain sampling over the whole vocabulary
])
def test_select_tokens_samples_the_truncated_distribution(temperature, top_k, top_p, max_top_k):
    rng = np.random.default_rng(3)
    logits = rng.normal(scale=1.5, size=12).astype(np.float32)
    n = 20000
    tokens, policy_logp, sampling_logp = _select(
        jnp.broadcast_to(jnp.asarray(logits), (n, 12)), _keys(n), temperature=temperature,
        top_k=top_k, top_p=top_p, max_top_k=max_top_k)
    tokens = np.asarray(tokens)
    expected = _kept_distribution(logits, temperature, top_k, top_p)
    if top_k == 0 and max_top_k < 12:  # the full-vocabulary path: the candidates miss top_p
        assert np.sort(_kept_distribution(logits, temperature, 0, 1.0))[-max_top_k:].sum() < top_p
    counts = np.bincount(tokens, minlength=12) / n
    assert np.all(counts[expected == 0] == 0), (counts, expected)
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(counts - expected) <= 5 * sigma + 1e-3), (counts, expected)
    np.testing.assert_allclose(np.asarray(sampling_logp), np.log(expected[tokens]), atol=1e-4)
    log_softmax = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    np.testing.assert_allclose(np.asarray(policy_logp), log_softmax[tokens], atol=1e-4)


def test_which_path_runs_never_changes_a_rows_token():
    """Top-p without top-k: the batch takes the bisection path as soon as one row's candidates
    miss top_p of the mass; a row's token must not depend on that."""
    rng = np.random.default_rng(0)
    peaked = rng.normal(size=50).astype(np.float32)
    peaked[:3] += 8.0  # its top 4 hold > 0.9 of the mass
    flat = np.zeros(50, np.float32)  # its top 4 hold 0.08
    n = 300
    knobs = dict(temperature=1.0, top_k=0, top_p=0.9, max_top_k=4)
    alone, _, alone_logp = _select(jnp.broadcast_to(jnp.asarray(peaked), (n, 50)), _keys(n),
                                   **knobs)
    mixed_logits = jnp.asarray(np.stack([peaked] * n + [flat]))
    mixed, _, mixed_logp = _select(mixed_logits, jnp.concatenate([_keys(n), _keys(1, 9)]),
                                   **knobs)
    np.testing.assert_array_equal(np.asarray(alone), np.asarray(mixed)[:n])
    np.testing.assert_allclose(np.asarray(alone_logp), np.asarray(mixed_logp)[:n], atol=1e-5)
    assert len(set(np.asarray(alone).tolist())) > 1  # really sampled


def test_rows_outside_their_candidates_sample_as_they_would_alone():
    """The bisection gathers the rows whose candidates miss top_p a few at a time: 11 such rows
    scattered among 29 others (two gathers, the second part-full) get the tokens and log-probs
    each gets in a batch of its own."""
    rng = np.random.default_rng(1)
    peaked = rng.normal(size=(40, 50)).astype(np.float32)
    peaked[:, :3] += 8.0
    outside = rng.choice(40, size=11, replace=False)
    logits = peaked.copy()
    logits[outside] = rng.normal(scale=0.3, size=(11, 50))
    keys = _keys(40, 4)
    knobs = dict(temperature=1.0, top_k=0, top_p=0.9, max_top_k=4)
    tokens, _, logp = _select(jnp.asarray(logits), keys, **knobs)
    for r in outside:
        alone, _, alone_logp = _select(jnp.asarray(logits[r:r + 1]), keys[r:r + 1], **knobs)
        assert int(tokens[r]) == int(alone[0])
        np.testing.assert_allclose(float(logp[r]), float(alone_logp[0]), atol=1e-5)
    assert len(set(np.asarray(tokens)[outside].tolist())) > 3  # really sampled, per row


def test_temperature_zero_is_greedy():
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(5, 30)), jnp.float32)
    tokens, _, sampling_logp = _select(logits, _keys(5), temperature=0.0, top_k=20, top_p=0.9)
    np.testing.assert_array_equal(np.asarray(tokens), np.argmax(np.asarray(logits), axis=-1))
    assert np.all(np.asarray(sampling_logp) == 0)


def test_greedy_policy_logp_is_the_log_softmax_of_the_pick_with_masked_entries():
    """The greedy pick and the policy log-normaliser share one max pass; masked (-inf) logits
    and a huge logit leave both exact, as jax.nn.log_softmax computes them."""
    logits = np.random.default_rng(2).normal(size=(4, 50)).astype(np.float32)
    logits[1, ::2] = -np.inf  # a masked half of the vocabulary
    logits[2, 17] = 1e30  # a logit far past exp's range
    logits[3, 4] = logits[3, 9] = 7.0  # a tie: the first wins
    tokens, policy_logp, _ = _select(jnp.asarray(logits), _keys(4), temperature=0.0, top_k=0,
                                     top_p=1.0)
    np.testing.assert_array_equal(np.asarray(tokens), [np.argmax(logits[0]),
                                                      np.argmax(logits[1]), 17, 4])
    expected = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))[
        np.arange(4), np.asarray(tokens)]
    np.testing.assert_allclose(np.asarray(policy_logp), expected, atol=1e-6)
    assert np.all(np.isfinite(np.asarray(policy_logp)))


def test_plain_sampling_inverts_each_rows_cdf_across_blocks_and_skips_masked_tokens():
    """No top-k and no top-p: one uniform draw per row, inverted through cumulative sums over
    blocks of the vocabulary and then within one. Over 700 tokens (three blocks, the second all
    masked) the frequencies match the softmax, masked tokens are never picked, and a row's token
    depends only on its own key and logits."""
    rng = np.random.default_rng(4)
    logits = np.full(700, -np.inf, np.float32)
    live = np.array([0, 3, 255, 512, 650, 699])  # both ends of blocks; 256-511 all masked
    logits[live] = rng.normal(scale=1.0, size=live.size)
    n = 20000
    knobs = dict(temperature=1.0, top_k=0, top_p=1.0)
    tokens, _, sampling_logp = _select(jnp.broadcast_to(jnp.asarray(logits), (n, 700)), _keys(n),
                                       **knobs)
    tokens = np.asarray(tokens)
    expected = np.zeros(700)
    expected[live] = np.exp(logits[live] - logits[live].max())
    expected /= expected.sum()
    counts = np.bincount(tokens, minlength=700) / n
    assert set(np.flatnonzero(counts)) <= set(live.tolist())
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(counts - expected) <= 5 * sigma + 1e-3), (counts[live], expected[live])
    np.testing.assert_allclose(np.asarray(sampling_logp), np.log(expected[tokens]), atol=1e-5)
    other = rng.normal(size=(5, 700)).astype(np.float32)
    mixed, _, _ = _select(jnp.asarray(np.concatenate([np.stack([logits] * 50), other])),
                          jnp.concatenate([_keys(50), _keys(5, seed=7)]), **knobs)
    np.testing.assert_array_equal(np.asarray(mixed)[:50], tokens[:50])
