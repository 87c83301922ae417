"""Sampler invariants on a tiny random model (CPU, 8 fake devices)."""

import dataclasses
import re

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spade_jax.models.config import ModelConfig
from spade_jax.models.kv_layout import KVLayout
from spade_jax.models.transformer import Transformer, forward_logits
from spade_jax.sampling import CacheFullError, Sampler, generate, sampler_for
from spade_jax.seeding import SEED_LIMIT
from spade_jax.sharding import make_mesh

CFG = ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  ffn_dim=48, qk_norm=True)


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def sampler(model):
    return Sampler(model)


def full_logprobs(model, seq):
    logits = forward_logits(model, jnp.asarray([seq]))[0]
    return np.asarray(jax.nn.log_softmax(logits, axis=-1))


def assert_greedy(tokens, ref):
    """Each token is the argmax of its row of reference log-probs, up to a float near-tie
    (1e-4): another CPU rounds differently and may pick the other of two tied tokens."""
    chosen = ref[np.arange(len(tokens)), tokens]
    assert np.all(chosen >= ref.max(axis=-1) - 1e-4), (tokens, np.argmax(ref, axis=-1))


def test_greedy_with_cache_equals_full_forward_argmax(model, sampler):
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [3]]
    turns = sampler.start(prompts, capacity=64).decode(12)
    for prompt, turn in zip(prompts, turns, strict=True):
        # one teacher-forced forward over the final sequence gives every step's logits
        ref = full_logprobs(model, prompt + turn.tokens)[len(prompt) - 1: -1]
        assert_greedy(turn.tokens, ref)
        np.testing.assert_allclose(turn.logprobs, ref[np.arange(12), turn.tokens], atol=1e-4)
        assert turn.finish_reason == "length" and len(turn.tokens) == 12


def test_left_padding_invariance(sampler):
    prompt = [5, 6, 7, 8]
    alone = sampler.start([prompt], capacity=64).decode(10, temperature=1.0, seed=3)[0]
    # in a batch with a much longer prompt, the same row is left-padded further
    mixed = sampler.start([list(range(1, 30)), prompt], capacity=96)
    # the row id enters the sampling key, so put the prompt at row 0 of another batch too
    again = sampler.start([prompt, list(range(1, 30))], capacity=96).decode(
        10, temperature=1.0, seed=3)[0]
    assert alone.tokens == again.tokens
    np.testing.assert_allclose(alone.logprobs, again.logprobs, atol=1e-5)
    greedy_alone = sampler.start([prompt], capacity=64).decode(10)[0]
    assert mixed.decode(10)[1].tokens == greedy_alone.tokens


def test_stop_tokens_halt_and_mask(sampler):
    base = sampler.start([[1, 2, 3]], capacity=64).decode(10)[0].tokens
    stop = base[3]
    first = base.index(stop)
    session = sampler.start([[1, 2, 3], [4, 5]], capacity=64)
    turn = session.decode(10, stop_token_ids=[stop])
    assert turn[0].tokens == base[: first + 1] and turn[0].finish_reason == "stop"
    arrays = session.training_arrays()
    n = 3 + first + 1
    assert arrays["loss_mask"][0].tolist() == [0, 0, 0] + [1] * (first + 1) + [0] * (
        arrays["tokens"].shape[1] - n)
    assert arrays["mask"][0, :n].all() and not arrays["mask"][0, n:].any()


def test_fixed_seed_reproducible_and_seeds_differ(sampler):
    run = lambda seed: sampler.start([[1, 2], [3, 4, 5]], capacity=64).decode(  # noqa: E731
        16, temperature=1.0, top_p=0.9, seed=seed)
    a, b, c = run(7), run(7), run(8)
    assert [t.tokens for t in a] == [t.tokens for t in b]
    assert [t.tokens for t in a] != [t.tokens for t in c]


def test_any_seed_below_2_31_samples_and_others_are_a_clear_error(sampler):
    run = lambda seed: sampler.start([[1, 2], [3, 4, 5]], capacity=64).decode(  # noqa: E731
        8, temperature=1.0, seed=seed)
    largest = run(SEED_LIMIT - 1)
    assert [t.tokens for t in largest] == [t.tokens for t in run(SEED_LIMIT - 1)]
    assert all(len(t.tokens) == 8 for t in largest)
    for bad in (-1, SEED_LIMIT, 1.5):
        with pytest.raises(ValueError, match=re.escape(f"seed={bad!r}")):
            run(bad)


@pytest.mark.slow
def test_multi_turn_equals_reprefill(model, sampler):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
    observations = [[[11, 12, 13], None, [14]], [[15], [16, 17, 18, 19, 20], [21, 22]]]
    kwargs = dict(temperature=0.8, top_k=20, seed=5)
    session = sampler.start(prompts, capacity=256)
    session.decode([6, 4, 5], **kwargs)
    for obs in observations:
        session.append(obs)
        session.decode(5, active=[o is not None for o in obs], **kwargs)
    arrays = session.training_arrays()
    for r in range(len(prompts)):
        seq = session.sequences[r]
        # re-prefill: each generated token equals a fresh one-turn decode of its prefix
        ref = full_logprobs(model, seq)
        gen = np.flatnonzero(arrays["loss_mask"][r])
        np.testing.assert_allclose(arrays["policy_logp"][r, gen],
                                   ref[gen - 1, np.asarray(seq)[gen]], atol=1e-4)
        for t in gen[:: max(1, len(gen) // 3)]:
            # row ids enter the sampling keys: re-prefill the row at the same row index
            fresh_rows = [[1]] * r + [seq[:t]]
            fresh = sampler.start(fresh_rows, capacity=256).decode(
                1, active=[i == r for i in range(r + 1)], **kwargs)[r]
            assert fresh.tokens == [seq[t]]


def test_chunked_prefill_and_append_equal_one_block(model, sampler, monkeypatch):
    """A sampler allowed 16 tokens per device per extend writes a 40-token prompt and a
    20-token observation in pieces of at most 16 tokens per row, and its caches and sampled
    tokens equal those of the default sampler, which writes each in one block."""
    from spade_jax.sampling.session import Session

    widths = []
    original = Session._extend_piece

    def spy(self, blocks):
        widths.append(max(len(b) for b in blocks.values()))
        return original(self, blocks)

    chunked = Sampler(model, prefill_tokens=16)
    assert chunked.extend_width(2) == 16 and sampler.extend_width(2) > 64
    prompts = [list(range(1, 41)), [7, 8, 9, 10, 11, 12, 13]]
    results = []
    for s in (sampler, chunked):
        monkeypatch.setattr(Session, "_extend_piece", spy)
        widths.clear()
        session = s.start(prompts, capacity=128)
        first = session.decode(5, temperature=0.8, top_k=20, seed=2)
        session.append([list(range(20, 40)), None])
        second = session.decode(6, temperature=0.8, top_k=20, seed=2)
        lengths = session.lengths.copy()
        caches = [(np.asarray(k)[..., :60], np.asarray(v)[:, :, :60]) for k, v in session.cache]
        results.append((list(widths), first, second, lengths, caches))
    (whole_widths, *whole), (piece_widths, *pieces) = results
    # prompt (39 + 6 tokens to write: two length groups) and observation: 3 blocks whole;
    # in pieces of 16, 3 + 1 + 2
    assert max(whole_widths) == 39 and len(whole_widths) == 3
    assert max(piece_widths) == 16 and len(piece_widths) == 6
    (first_a, second_a, lengths_a, cache_a), (first_b, second_b, lengths_b, cache_b) = whole, pieces
    np.testing.assert_array_equal(lengths_a, lengths_b)
    for a, b in zip(first_a + second_a, first_b + second_b, strict=True):
        if a is not None:
            assert a.tokens == b.tokens
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    for row, n in enumerate(lengths_a[:2]):
        for (ka, va), (kb, vb) in zip(cache_a, cache_b, strict=True):
            np.testing.assert_allclose(ka[row, ..., :n], kb[row, ..., :n], atol=1e-5)
            np.testing.assert_allclose(va[row, :, :n], vb[row, :, :n], atol=1e-5)


def test_prompts_are_prefilled_in_groups_of_one_length_bucket(model, sampler, monkeypatch):
    """Short prompts are not padded to the longest: rows whose prompts fall in the same
    length bucket are written together, apart from the others, and each row then samples
    what it samples alone."""
    from spade_jax.sampling.session import Session

    pieces = []
    original = Session._extend_piece

    def spy(self, blocks):
        pieces.append((frozenset(blocks), max(len(b) for b in blocks.values())))
        return original(self, blocks)

    monkeypatch.setattr(Session, "_extend_piece", spy)
    prompts = [[1 + (3 * i + j) % 50 for j in range(n)] for i, n in enumerate([3, 70, 5, 40])]
    turns = sampler.start(prompts, capacity=128).decode(6)
    assert sorted(pieces, key=lambda p: p[1]) == [
        (frozenset({0, 2}), 4), (frozenset({3}), 39), (frozenset({1}), 69)]
    for prompt, turn in zip(prompts, turns, strict=True):
        assert turn.tokens == sampler.start([prompt], capacity=128).decode(6)[0].tokens


def test_finished_rows_leave_the_decode(model, monkeypatch):
    """Once the rows still running fit in half the batch, the decode pauses and goes on with
    only those rows ('decode_rows', a bucket of them, at least `MIN_DECODE_ROWS`).
    Every row samples what it samples in a decode that keeps all rows, greedy or seeded."""
    from spade_jax.sampling import session as session_lib

    prompts = [[1 + (5 * i + j) % 50 for j in range(2 + i % 5)] for i in range(12)]
    limits = [40, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 24]  # after 3 steps 2 of 12 rows still run
    runs, programs = [], []
    for min_rows in (session_lib.MIN_DECODE_ROWS, 1 << 20):  # then: never fewer rows
        monkeypatch.setattr(session_lib, "MIN_DECODE_ROWS", min_rows)
        sampler = Sampler(model, draft_tokens=0)  # one token a step: the schedule is known
        runs.append([sampler.start(prompts, capacity=96).decode(limits, **knobs)
                     for knobs in ({}, {"temperature": 1.0, "seed": 3})])
        programs.append({key[3] for key in sampler._jitted if key[0] == "decode_rows"})
    assert programs == [{(("draft_tokens", 0), ("lookup", False), ("rows", 4))}, set()]
    for compacted, whole in zip(*runs, strict=True):
        assert [len(t.tokens) for t in compacted] == limits
        for a, b in zip(compacted, whole, strict=True):
            assert a.tokens == b.tokens
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_running_rows_are_padded_to_a_row_bucket_within_half_the_batch(sampler):
    """A segment computes its running rows padded to the next row bucket (2^i or 1.5 * 2^i):
    22 of 64 rows as 24, not 32; more than half the batch runs as the whole batch; and it
    pauses for the largest smaller bucket that may run apart."""
    session = sampler.start([[1, 2]] * 64, capacity=32)
    assert [session._program_rows(n) for n in (1, 3, 5, 7, 9, 17, 22, 25, 32, 33, 64)] == [
        4, 4, 6, 8, 12, 24, 24, 32, 32, 64, 64]
    assert [session._next_smaller_program(r) for r in (64, 32, 24, 16, 12, 8, 6, 4)] == [
        32, 24, 16, 12, 8, 6, 4, 0]
    assert sampler.start([[1, 2]] * 10, capacity=32)._next_smaller_program(10) == 4


def test_prefill_token_budget_below_one_bucket_is_refused(model):
    with pytest.raises(ValueError, match="prefill_tokens=8"):
        Sampler(model, prefill_tokens=8)


def test_sampling_knobs_do_not_recompile(sampler):
    knobs = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.5, 5, 0.9), (0.7, 0, 0.5), (0.0, 3, 0.2)]

    def conversation(knobs):
        # The same shapes every time (the window grows the same way); only the knobs change.
        session = sampler.start([[1, 2, 3]], capacity=128)
        for temperature, top_k, top_p in knobs:
            session.decode(8, temperature=temperature, top_k=top_k, top_p=top_p, seed=1)

    conversation([knobs[0]] * len(knobs))
    before = sampler.compile_count()
    compiles = []  # every XLA compilation in the process, not only the sampler's own programs

    def listener(event, _secs, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        conversation(knobs)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert sampler.compile_count() == before
    assert compiles == []


@pytest.mark.parametrize("prompt_len, new_tokens", [(300, 200), (700, 32)])
def test_bucket_padding_never_eats_the_decode_slots(model, sampler, prompt_len, new_tokens):
    # Sized like the SPADE runtime: longest prompt + max_new_tokens + 1. Padding the prefill
    # block to its bucket (300 -> 384 wide) must not consume the slots the decode needs.
    prompt = [1 + i % 50 for i in range(prompt_len)]
    session = sampler.start([prompt], capacity=prompt_len + new_tokens + 1)
    turn = session.decode(new_tokens)[0]
    assert len(turn.tokens) == new_tokens and turn.finish_reason == "length"
    # The window grew across several decode segments; greedy still equals the full forward.
    ref = full_logprobs(model, prompt + turn.tokens)[prompt_len - 1: -1]
    assert_greedy(turn.tokens, ref)
    assert session.window < 2 * (prompt_len + new_tokens)


def test_top_k_one_is_greedy_and_capacity_errors(sampler):
    greedy = sampler.start([[2, 3]], capacity=64).decode(8)[0].tokens
    assert sampler.start([[2, 3]], capacity=64).decode(8, temperature=1.5, top_k=1)[0].tokens \
        == greedy
    session = sampler.start([[2, 3]], capacity=32)  # the prefill takes 1 slot
    turn = session.decode(100)[0]
    assert turn.finish_reason == "context_full" and len(turn.tokens) == 31
    with pytest.raises(CacheFullError, match="rows 0 "):
        session.append([[1, 2, 3]])


def test_each_row_has_its_own_capacity(sampler):
    """A long row next to a short one: the short row's room depends only on its own tokens
    (with one shared write index it would end after the long row's 11 free slots)."""
    long_prompt, short_prompt = [1 + i % 50 for i in range(30)], [4, 5]
    session = sampler.start([long_prompt, short_prompt], capacity=40)
    assert session.free_slots.tolist() == [40 - 29, 40 - 1]
    long_turn, short_turn = session.decode(30)
    assert long_turn.finish_reason == "context_full" and len(long_turn.tokens) == 11
    assert short_turn.finish_reason == "length" and len(short_turn.tokens) == 30
    alone = sampler.start([short_prompt], capacity=40).decode(30)[0]
    assert short_turn.tokens == alone.tokens
    # the full row cannot take an observation; the short one still can, and continues
    with pytest.raises(CacheFullError, match="rows 0 "):
        session.append([[7], [8]])
    session.append([None, [8, 9]])
    assert session.decode(20, active=[False, True])[1].finish_reason == "context_full"
    assert len(session.sequences[1]) == 40 + 1


def test_a_prompt_over_capacity_is_refused_for_its_row_only(sampler):
    session = sampler.start([[1 + i % 50 for i in range(20)], [4, 5]], capacity=8)
    assert session.refused.tolist() == [True, False]
    refused, short = session.decode(6)
    assert refused.tokens == [] and refused.finish_reason == "context_full"
    assert short.tokens == sampler.start([[4, 5]], capacity=8).decode(6)[0].tokens
    with pytest.raises(CacheFullError, match="rows 0 "):
        session.append([[3], None])


def test_sharded_mesh_matches_single_device(model, sampler):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    ref = sampler.start(prompts, capacity=64).decode(8, temperature=1.0, seed=2)
    mesh = make_mesh((2, 2, 2))
    sharded = Sampler(model, mesh=mesh).start(prompts, capacity=64).decode(
        8, temperature=1.0, seed=2)
    assert [t.tokens for t in sharded] == [t.tokens for t in ref]


class CharTokenizer:
    """Characters 'a'..: ids 3.., 2 = EOS; enough of the HF interface for generate()."""

    eos_token_id = 2

    def encode(self, text, add_special_tokens=False):
        return [3 + (ord(c) % 50) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(ord("a") + (i - 3) % 26) if i >= 3 else "#" for i in ids)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(m["role"][0] + m["content"] for m in messages) + "a"


def test_generate_strings_chat_and_stop_strings(model):
    tok = CharTokenizer()
    out = generate(model, tok, ["hello", [{"role": "user", "content": "hi"}]],
                   max_new_tokens=12, ignore_eos=True)
    assert all(len(c.tokens) == 12 and c.finish_reason == "length" for c in out)
    assert out[0].text == tok.decode(out[0].tokens)
    stop = out[0].text[4:6]
    cut = generate(model, tok, ["hello"], max_new_tokens=12, stop=[stop], ignore_eos=True)[0]
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert out[0].text.startswith(cut.text)


def test_generate_reuses_unchanged_weights_and_picks_up_new_ones():
    """Repeated `generate` calls skip re-placing/re-fusing the weights; an update is seen."""
    model = Transformer(CFG, rngs=nnx.Rngs(3))
    tok = CharTokenizer()
    first = generate(model, tok, ["hello"], max_new_tokens=8, ignore_eos=True)[0].tokens
    sampler = sampler_for(model)
    prepared = sampler.fused_weights
    assert generate(model, tok, ["hello"], max_new_tokens=8, ignore_eos=True)[0].tokens == first
    assert sampler.fused_weights is prepared  # same arrays: nothing redone
    nnx.update(model, jax.tree.map(lambda a: -a, nnx.state(model, nnx.Param)))
    changed = generate(model, tok, ["hello"], max_new_tokens=8, ignore_eos=True)[0].tokens
    assert sampler.fused_weights is not prepared
    prompt = tok.encode("hello")
    assert_greedy(changed, full_logprobs(model, prompt + changed)[len(prompt) - 1: -1])
    assert changed != first


@pytest.mark.parametrize("mesh_shape", [(1, 2, 4), (2, 2, 2)])
def test_kv_cache_is_never_replicated_and_grows_layer_by_layer(model, sampler, mesh_shape):
    """2 KV heads do not divide tensor=4, so the cache's batch is split over 'tensor' too: each
    device holds 1/8 of it. An observation past the window grows the cache mid-session; the
    tokens before and after still match one device."""
    prompts = [[1 + (i + j) % 50 for j in range(5 + i)] for i in range(8)]
    observation = [[3 + j % 40 for j in range(100)]] * 8

    def play(session):
        first = session.decode(4, temperature=1.0, seed=5)
        window = session.window
        session.append(observation)
        assert session.window > window  # the append grew the cache
        return [t.tokens for t in first + session.decode(4, temperature=1.0, seed=6)]

    sharded = Sampler(model, mesh=make_mesh(mesh_shape)).start(prompts, capacity=256)
    assert play(sharded) == play(sampler.start(prompts, capacity=256))
    for k_t, v in sharded.cache:
        for array in (k_t, v):
            assert array.addressable_shards[0].data.size * 8 == array.size, array.sharding


@pytest.mark.parametrize("layout", list(KVLayout))
@pytest.mark.parametrize("program", ["decode", "extend", "extend_rows"])
def test_programs_update_the_cache_in_place(model, layout, program):
    """Each decode step writes each row's token, and an extend each row's block, into the
    cache in place: no copy of a whole layer's keys or values in the compiled program (a
    staged write moved by a second scatter cost XLA-CPU two copies of every layer's cache per
    generated token, and attending before writing two per extend), and an extend's
    temporaries do not grow with the window."""
    sampler = Sampler(model, mesh=make_mesh((1, 1, 1), jax.devices()[:1]), kv_layout=layout)

    def compiled(window):
        return sampler.lower(program, 4, window, width=128, rows=2).compile()

    hlo = compiled(1024).as_text()
    shapes = {",".join(map(str, shape)) for shape in layout.shapes(4, 1024, CFG.n_kv_heads,
                                                                    CFG.head_dim)}
    copies = [line for line in hlo.splitlines()
              if re.search(r"= f32\[([\d,]+)\]\S* copy\(", line)
              and re.search(r"= f32\[([\d,]+)\]", line).group(1) in shapes]
    assert "while" in hlo and not copies, copies[:4]
    if program != "decode":  # windows of the same key block (512 slots)
        temps = [compiled(w).memory_analysis().temp_size_in_bytes for w in (1024, 8192)]
        assert temps[1] <= temps[0] * 1.1, temps


@pytest.mark.parametrize("program", ["decode", "extend"])
def test_a_program_traces_one_layer_and_compiles_what_per_layer_traces_did(program,
                                                                           monkeypatch):
    """`unrolled_forward`'s layers share one trace of the decoder block (the preparation of a
    30-layer program, bench/prepare.py), inlined: a 3-layer program traces the block's norms
    once, and XLA compiles the same instructions as from a trace per layer."""
    import spade_jax.models.transformer as transformer

    deeper = Transformer(dataclasses.replace(CFG, n_layers=3, d_model=40), rngs=nnx.Rngs(0))
    norms = []
    rms_norm = transformer.layers.rms_norm
    monkeypatch.setattr(transformer.layers, "rms_norm",
                        lambda *args: norms.append(1) or rms_norm(*args))

    def compiled_lines():
        norms.clear()
        one_device = make_mesh((1, 1, 1), jax.devices()[:1])
        text = Sampler(deeper, mesh=one_device).lower(program, 2, 96).compile().as_text()
        # the instructions, without their source locations (which differ)
        return [re.sub(r", metadata=\{[^}]*\}", "", line) for line in text.splitlines()
                if re.match(r"\s+\S+ = ", line)]

    per_block = 4 if CFG.qk_norm else 2  # attention's and the MLP's, and q's and k's
    shared = compiled_lines()
    assert len(norms) == per_block + 1
    with transformer.tracing_each_layer():
        assert shared == compiled_lines()
    assert len(norms) == 3 * per_block + 1


@pytest.mark.parametrize(("mesh_shape", "decode_attention", "feed_drafts"), [
    ((1, 1, 1), "xla", False), ((1, 2, 4), "xla", False),
    ((1, 1, 1), "ragged", False), ((1, 2, 4), "ragged", True)])
def test_sequence_major_cache_samples_what_head_major_does(model, sampler, mesh_shape,
                                                           decode_attention, feed_drafts,
                                                           monkeypatch):
    """The TPU/GPU cache layout ([B, S, K, Dh]) runs the same maths as the CPU one: prefill,
    decode (with drafts), an append that grows the window, and more decode give the same
    tokens and log-probs, on one device and split over (1, 2, 4) without a replica; so does
    the decode attention TPU runs, the Pallas ragged decode (interpreted here)."""
    prompts = [[1 + (i + j) % 50 for j in range(3 + 2 * i)] for i in range(8)]
    observations = [[3 + (j * (i + 1)) % 40 for j in range(20 + 10 * i)] for i in range(8)]

    def play(session):
        first = session.decode([4, 9, 2, 7, 5, 3, 8, 6], temperature=1.0, seed=5)
        session.append(observations)
        second = session.decode(6, temperature=1.0, seed=6)
        return first + second, session.training_arrays()

    import spade_jax.models.ragged_decode as ragged
    import spade_jax.sampling.session as session_lib

    if feed_drafts:  # steps feed their drafts (5 queries a row) whatever they confirmed
        monkeypatch.setattr(session_lib, "DRAFTS_PAY_AT", 0.0)
    traced = []
    kernel = ragged.ragged_decode
    monkeypatch.setattr(ragged, "ragged_decode", lambda q, *a, **kw: traced.append(
        q.shape[3]) or kernel(q, *a, **kw))
    n_devices = int(np.prod(mesh_shape))
    tpu_like = nnx.clone(model)
    tpu_like.cfg = CFG.replace(decode_attention=decode_attention)
    sequence_major = Sampler(tpu_like, mesh=make_mesh(mesh_shape, jax.devices()[:n_devices]),
                             kv_layout="sequence_major")
    assert sequence_major.kv_layout is KVLayout.SEQUENCE_MAJOR
    assert sampler.kv_layout is KVLayout.HEAD_MAJOR  # the CPU default
    session = sequence_major.start(prompts, capacity=256)
    turns, arrays = play(session)
    ref_turns, ref_arrays = play(sampler.start(prompts, capacity=256))
    assert [t.tokens for t in turns] == [t.tokens for t in ref_turns]
    np.testing.assert_allclose(arrays["policy_logp"], ref_arrays["policy_logp"], atol=1e-5)
    queries = 1 + sampler.draft_tokens if feed_drafts else 1  # per row and step
    assert set(traced) == ({queries} if decode_attention == "ragged" else set()), traced
    for k, v in session.cache:
        assert k.shape == v.shape == (8, session.window, CFG.n_kv_heads, CFG.head_dim)
        assert k.addressable_shards[0].data.size * n_devices == k.size, k.sharding


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dots", ["ynnpack", "emitter"])
def test_each_decode_dot_path_reads_its_own_weight_layout_to_the_same_tokens(tied, dots):
    """YNNPACK's fused copy holds every matrix [out, in] (the output projection [vocab, D]),
    the emitter's [in, out], from a tied embedding or an lm_head alike; both sample the same
    tokens with the same log-probs as the unfused weights."""
    model = Transformer(dataclasses.replace(CFG, tie_embeddings=tied), rngs=nnx.Rngs(1))
    fused = Sampler(model, decode_dots=dots)
    out_major = dots == "ynnpack"

    def orient(matrix):  # an [in, out] matrix as the copy holds it
        return matrix.T if out_major else matrix

    unembedding = fused.fused_weights["unembedding"]
    weight, stored_vocab_major = model.output_projection()
    assert unembedding.out_major is out_major
    np.testing.assert_array_equal(unembedding.weight,
                                  orient(weight.T if stored_vocab_major else weight))
    layer, held = model.layer_params()[1], fused.fused_weights["layers"][1]
    assert {name: p.out_major for name, p in held.items() if hasattr(p, "out_major")} == {
        name: out_major for name in ("wqkv", "wo", "w_gate_up", "w_down")}
    d_model = CFG.d_model
    np.testing.assert_array_equal(held["wqkv"].weight, orient(np.concatenate(
        [layer[n].reshape(d_model, -1) for n in ("wq", "wk", "wv")], axis=1)))
    np.testing.assert_array_equal(held["wo"].weight, orient(layer["wo"].reshape(-1, d_model)))
    np.testing.assert_array_equal(held["w_gate_up"].weight,
                                  orient(np.concatenate([layer["w_gate"], layer["w_up"]], axis=1)))
    np.testing.assert_array_equal(held["w_down"].weight, orient(layer["w_down"]))
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    turns = fused.start(prompts, capacity=64).decode(10, temperature=1.0, seed=4)
    ref = Sampler(model, fuse_weights=False).start(prompts, capacity=64).decode(
        10, temperature=1.0, seed=4)
    assert [t.tokens for t in turns] == [t.tokens for t in ref]
    np.testing.assert_allclose([t.logprobs for t in turns], [t.logprobs for t in ref], atol=1e-5)


@pytest.mark.parametrize("dots, platform, program, plain", [
    ("emitter", "cpu", "decode", True), ("emitter", "cpu", "decode_rows", True),
    ("emitter", "cpu", "extend", False), ("emitter", "tpu", "decode", False),
    ("emitter", "gpu", "decode", False), ("ynnpack", "cpu", "decode", False),
    ("ynnpack", "cpu", "decode_rows", False)])
def test_only_an_emitter_run_compiles_the_cpu_decode_without_ynnpack(dots, platform, program,
                                                                      plain):
    from spade_jax.sampling.sampler import XLA_DOT_EMITTER, DecodeDots

    options = DecodeDots(dots).compiler_options(platform, program)
    assert options == (XLA_DOT_EMITTER if plain else None)


@pytest.mark.parametrize("rows, width, ynnpack", [(2, 16, True), (4, 16, False),
                                                  (2, 32, False)])
def test_a_cpu_extend_of_many_tokens_compiles_its_dots_with_the_emitter(model, rows, width,
                                                                         ynnpack):
    """From `extend_emitter_tokens` tokens per call (rows x width) an extend compiles without
    YNNPACK's fusions; a narrower one keeps them."""
    sampler = Sampler(model, extend_emitter_tokens=64)
    compiled = sampler.lower("extend", rows, 64, width=width).compile().as_text()
    assert ("__ynn_fusion" in compiled) is ynnpack


def test_extends_on_either_dot_path_sample_the_same_tokens(model):
    """The dot path changes how XLA computes an extend, not what: the same tokens and
    log-probs whether every extend compiles with the emitter or none does, over a prefill and
    a multi-row append (the rows' own extends)."""
    prompts = [[1 + (i * 7 + j) % 50 for j in range(9 + 3 * i)] for i in range(6)]
    runs = []
    for threshold in (1, None):
        session = Sampler(model, extend_emitter_tokens=threshold).start(prompts, capacity=96)
        first = session.decode(5, temperature=1.0, seed=2)
        session.append([[3, 4, 5, 6]] * 2 + [None] * 4)
        runs.append(first + session.decode(6, temperature=1.0, seed=2))
    emitter, ynnpack = runs
    assert [t and t.tokens for t in emitter] == [t and t.tokens for t in ynnpack]
    for a, b in zip(emitter, ynnpack, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_per_step_decode_weights_sample_the_same_tokens(model, sampler):
    """Gathering the weights every decode step (fsdp 4 x tensor 2 of fake CPU devices) changes
    where the weights live, not the maths: the same tokens and log-probs as one device."""
    from spade_jax.sampling import DecodeWeights

    prompts = [[1 + (i + j) % 50 for j in range(5 + i)] for i in range(8)]
    per_step = Sampler(model, mesh=make_mesh((1, 4, 2)), decode_weights=DecodeWeights.PER_STEP)
    assert per_step.decode_weights is DecodeWeights.PER_STEP
    out = per_step.start(prompts, capacity=64).decode(6, temperature=1.0, seed=3)
    ref = sampler.start(prompts, capacity=64).decode(6, temperature=1.0, seed=3)
    assert [t.tokens for t in out] == [t.tokens for t in ref]
    for a, b in zip(out, ref, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
