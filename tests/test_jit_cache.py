"""Programs shared between samplers (`spade_jax.jit_cache`): a second sampler of the same
model and settings compiles nothing, another setting compiles its own, nothing shared keeps a
sampler alive, and the least recently used functions go first."""

import collections
import gc
import weakref

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax import jit_cache
from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer, forward_logits
from spade_jax.sampling import Sampler

# widths no other test uses, so the first sampler here compiles its own programs
CFG = ModelConfig(vocab_size=67, d_model=24, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=12,
                  ffn_dim=40)
PROMPTS = [[1, 2, 3, 4, 5], [7, 8]]
PREPARATION = ("/jax/core/compile/jaxpr_trace_duration",
               "/jax/core/compile/backend_compile_duration")


def greedy_turns(sampler):
    return [turn.tokens for turn in sampler.start(PROMPTS, capacity=64).decode(10)]


def preparations(run) -> tuple[list, int]:
    """`run()`'s result and how many traces and XLA compilations it caused."""
    events = []

    def listener(event, _secs, **_):
        if event in PREPARATION:
            events.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        return run(), len(events)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def assert_greedy_for(model, tokens):
    """Each token is its model's argmax after the prompt and the tokens before it (up to a
    float near-tie)."""
    for prompt, turn in zip(PROMPTS, tokens, strict=True):
        logits = forward_logits(model, jnp.asarray([prompt + turn]))[0]
        ref = np.asarray(jax.nn.log_softmax(logits, axis=-1))[len(prompt) - 1: -1]
        chosen = ref[np.arange(len(turn)), turn]
        assert np.all(chosen >= ref.max(axis=-1) - 1e-4), turn


def test_a_second_sampler_of_the_model_traces_and_compiles_nothing():
    first_model, second_model = (Transformer(CFG, rngs=nnx.Rngs(seed)) for seed in (0, 1))
    first_tokens, first_count = preparations(lambda: greedy_turns(Sampler(first_model)))
    assert first_count > 0
    second_tokens, second_count = preparations(lambda: greedy_turns(Sampler(second_model)))
    assert second_count == 0
    assert second_tokens != first_tokens  # its own weights, passed to the shared programs
    assert_greedy_for(first_model, first_tokens)
    assert_greedy_for(second_model, second_tokens)


@pytest.mark.parametrize("setting", [dict(kv_layout="sequence_major"),
                                     dict(decode_weights="per_step"), dict(max_top_k=8)])
def test_another_setting_compiles_its_own_programs(setting):
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    greedy_turns(Sampler(model))
    tokens, count = preparations(lambda: greedy_turns(Sampler(model, **setting)))
    assert count > 0
    assert_greedy_for(model, tokens)


def test_the_shared_programs_keep_no_sampler_alive():
    sampler = Sampler(Transformer(CFG, rngs=nnx.Rngs(0)))
    greedy_turns(sampler)
    alive = weakref.ref(sampler)
    del sampler
    gc.collect()
    assert alive() is None


def test_the_least_recently_used_function_goes_first(monkeypatch):
    monkeypatch.setattr(jit_cache, "SHARED_JIT_LIMIT", 2)
    monkeypatch.setattr(jit_cache, "_functions", collections.OrderedDict())
    a, b = jit_cache.shared_jit("a", object), jit_cache.shared_jit("b", object)
    assert jit_cache.shared_jit("a", object) is a  # and "a" is now the most recent
    jit_cache.shared_jit("c", object)  # over the limit: "b" goes
    assert jit_cache.shared_jit("a", object) is a
    assert jit_cache.shared_jit("b", object) is not b
