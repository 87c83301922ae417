"""Runtime.train end to end with bf16 compute, TIS and KL: the sampler's log-probs reach the
step as behaviour_logp, KL reads the frozen reference, the sampler's bf16 copy is refreshed."""

import jax
import jax.numpy as jnp
import numpy as np

from spade_jax.config import load_config_file, parse
from spade_jax.spade.batch import Role, TrainSample


def host(tree, dtype=None):
    leaves = jax.tree.leaves(jax.device_get(tree))
    return [np.asarray(x if dtype is None else jnp.asarray(x).astype(dtype)) for x in leaves]


def samples(advantages):
    """Sequences of 40 tokens, the last 20 generated; the sampler's log-prob is -20 on even
    generated tokens (so exp(train - sampler) > e^8 hits the TIS cap) and 0 on odd ones (a
    weight e^logp, far below it): the cap binds on exactly half of them."""
    rng = np.random.default_rng(0)
    out = []
    for i, adv in enumerate(advantages):
        tokens = rng.integers(0, 49152, 40).astype(np.int32)
        mask = np.arange(40) >= 20
        logp = np.where(mask & (np.arange(40) % 2 == 0), -20.0, 0.0).astype(np.float32)
        out.append(TrainSample(tokens, mask, logp, adv, Role.AGENT if i else Role.DESIGNER))
    return out


def test_bf16_runtime_trains_with_tis_and_kl_and_refreshes_the_sampler_copy():
    from spade_jax.spade.runtime import Runtime

    cfg = load_config_file("tiny")
    cfg.model.compute_dtype = "bfloat16"
    cfg.train.kl_coef = 0.1
    cfg.sandbox.warm_workers = 1
    rt = Runtime.create(parse(cfg, 1), jax.devices()[:1])
    try:
        initial = host(rt.train_state.params, jnp.bfloat16)
        assert {x.dtype for x in host(rt.train_state.params)} == {np.dtype("float32")}
        batch = samples([1.0, -0.5, 0.0])  # KL on: the zero-advantage sample is computed too
        first = rt.train(batch)
        second = rt.train(batch)
        assert first["train/ratio"] == 1.0 and first["train/clip_fraction"] == 0.0
        assert first["train/tis_clip_fraction"] == 0.5
        assert first["train/skipped_tokens"] == 0 and first["train/samples"] == 3
        assert first["train/kl"] == 0.0 < second["train/kl"]  # the reference stayed behind
        for got, want in zip(host(rt.reference_params), initial, strict=True):
            np.testing.assert_array_equal(got, want)
        masters = host(rt.train_state.params, jnp.bfloat16)
        sampler = host(rt.sampler.state)
        assert {x.dtype for x in sampler} == {np.dtype(jnp.bfloat16)}
        for got, want in zip(sampler, masters, strict=True):
            np.testing.assert_array_equal(got, want)
        assert any((a != b).any() for a, b in zip(masters, initial, strict=True))
    finally:
        rt.close()
