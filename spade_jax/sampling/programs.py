"""The sampler's jitted device programs: chunked extend (prefill / append), the decode loop,
cache growth, and the bucketed shapes they are compiled for.

Pure functions of (weights, cache, row lengths, tokens); `sampler.Sampler` jits them with the
mesh's shardings and `session.Session` drives them from the host. The cache layout, the
pending-token convention and the per-row writes are described in `spade_jax/sampling/sampler.py`.
"""

from __future__ import annotations

import enum
from functools import partial
from typing import NamedTuple

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from spade_jax.models.layers import Projection
from spade_jax.models.transformer import Transformer, unrolled_forward
from spade_jax.sampling.drafts import confirmed_drafts, ngram_drafts
from spade_jax.sampling.sampling_fns import row_keys, select_tokens

MIN_BUCKET = 16
STOP_ID_SLOTS = 8


def bucket(n: int, minimum: int = MIN_BUCKET) -> int:
    """Smallest length >= max(n, minimum) of the form 2^i or 1.5 * 2^i (16, 24, 32, 48, ...).

    The few lengths we compile for: padding wastes at most a third, and sizes up to 8k need
    about 20 buckets.
    """
    n = max(int(n), minimum)
    power = 1 << (n - 1).bit_length()
    return power * 3 // 4 if power * 3 // 4 >= n else power


def bucket_at_most(n: int) -> int:
    """Largest bucket (see `bucket`) <= n, and at least the smallest bucket."""
    b = bucket(n)
    if b <= n or b == MIN_BUCKET:
        return b
    return b * 3 // 4 if b & (b - 1) == 0 else b * 2 // 3


def fused_decode_weights(model: Transformer, out_major: bool) -> dict:
    """The sampler's CPU copy of the weights: fused per-layer matrices and the output projection,
    every matrix a `layers.Projection` in the orientation `out_major` asks for
    (`DecodeDots.out_major`: the one the decode's dot path reads fastest).

    `layers`: `Transformer.layer_params(fuse=True)`. `unembedding`: [vocab, D] where `out_major`,
    else [D, vocab], transposed from the model's only where the two differ.
    """
    weight, stored_vocab_major = model.output_projection()
    if stored_vocab_major != out_major:
        weight = weight.T
    return {"layers": model.layer_params(fuse=True, out_major=out_major),
            "unembedding": Projection(weight, out_major)}


def weights_and_logits(model: Transformer, fused: dict | None):
    """(per-layer weights, logits function): from the fused copy, or the model's own layout."""
    if fused is None:
        return model.layer_params(), model.logits
    return fused["layers"], partial(fused["unembedding"], preferred_element_type=jnp.float32)


class DecodeWeights(enum.StrEnum):
    """`sampling.decode_weights`: how a decode loop reads layer weights split over 'fsdp'.

    RESIDENT: as XLA schedules it. The TPU compiler hoists the all-gathers of the MoE
    experts' weights (the expert `shard_map` takes them whole over fsdp) out of the loop, so
    the devices hold every layer's experts of their 'tensor' rank for the whole segment: no
    expert traffic per step, where the memory allows. PER_STEP: every step gathers each
    layer's weights one layer ahead of its use (`unrolled_forward`'s `stream_weights`), so a
    few layers' gathered weights are live, at the cost of moving all the weights over the
    interconnect on every step. With fsdp 1 nothing is gathered.
    """

    RESIDENT = "resident"
    PER_STEP = "per_step"

    @property
    def streams(self) -> bool:
        return self is DecodeWeights.PER_STEP


def valid_slots(lengths: jax.Array, window: int) -> jax.Array:
    """[B, window] bool: row r's tokens fill its slots [0, lengths[r])."""
    return jnp.arange(window)[None, :] < lengths[:, None]


def extend_block(model, layer_params, cache, lengths, tokens, token_mask, positions, layout,
                 rows=None):
    """Write each row's left-aligned block after its own `lengths[r]` tokens (of only the
    cache rows `rows`, where given: an index past the batch is a padding row, dropped).

    Each layer writes the block at each row's own slots, in place (slots past the window are
    dropped; those past a row's real tokens are not valid), then attends causally over the
    key blocks up to the furthest row's last slot, reading only the rows it writes: a new
    conversation in a continuous batch reads only what it holds. Writing before attending
    orders the attention's key-block loop after the write, which is what lets XLA update
    the donated cache in place (written after, each layer's cache was copied twice).
    """
    window = layout.n_slots(cache[0][1])
    ends = lengths + jnp.sum(token_mask, axis=1)
    _, cache = unrolled_forward(model, layer_params, tokens, positions,
                                valid_slots(ends, window), cache, lengths, layout,
                                cache_rows=rows)
    return cache


def extend(graphdef, state, fused, cache, lengths, tokens, token_mask, positions, *, layout):
    """`extend_block` over the whole batch."""
    model = nnx.merge(graphdef, state)
    layer_params, _ = weights_and_logits(model, fused)
    return extend_block(model, layer_params, cache, lengths, tokens, token_mask, positions,
                        layout)


def extend_rows(graphdef, state, fused, cache, lengths, rows, tokens, token_mask, positions, *,
                layout):
    """`extend_block` of only the cache rows `rows` [b], so the compute scales with the rows
    that have tokens, not the batch, and nothing but their blocks moves."""
    model = nnx.merge(graphdef, state)
    layer_params, _ = weights_and_logits(model, fused)
    return extend_block(model, layer_params, cache, lengths, tokens, token_mask, positions,
                        layout, rows)


def take_rows(cache: list, rows: jax.Array) -> list:
    """The cache rows `rows` [b] of every layer (an index past the batch reads the last row)."""
    return [(jnp.take(k, rows, axis=0, mode="clip"), jnp.take(v, rows, axis=0, mode="clip"))
            for k, v in cache]


def put_rows(cache: list, rows: jax.Array, sub: list) -> list:
    """`cache` with its rows `rows` replaced by `sub` (an index past the batch is dropped)."""
    return [(k.at[rows].set(sk, mode="drop"), v.at[rows].set(sv, mode="drop"))
            for (k, v), (sk, sv) in zip(cache, sub, strict=True)]


class DecodeState(NamedTuple):
    """The decode loop's carry: the cache, each row's length, pending token and progress, the
    buffers of what it sampled (token, policy log-prob, sampling log-prob per step) and, when
    it looks drafts up, each row's tokens by position and the lookups' record."""

    step: jax.Array  # steps taken
    cache: list
    lengths: jax.Array  # [B] tokens in each row's cache; the pending token goes to this slot
    pending: jax.Array  # [B] the token to write next
    positions: jax.Array  # [B] rotary position of the pending token
    running: jax.Array  # [B] rows still sampling
    n_generated: jax.Array  # [B] tokens sampled so far per row
    stopped: jax.Array  # [B] rows that sampled a stop token
    buffers: tuple  # ([B, window] tokens, log-probs, sampling log-probs)
    history: jax.Array | None  # [B, window] tokens by slot, the pending one included
    draft_record: jax.Array  # [2] row-steps taken, and drafts confirmed (or first drafts right)


def decode(graphdef, state, fused, cache, lengths, pending, positions, limits, max_steps,
            exit_after_finished, stop_ids, temperature, top_k, top_p, seed, row_ids,
            history=None, *, max_top_k, layout, decode_weights: DecodeWeights,
            draft_tokens: int = 0, lookup: bool = False):
    """At most `max_steps` decode steps (the caller keeps every running row's length + steps
    within the window); the token buffers are as long as the window. The loop also ends once
    `exit_after_finished` rows have finished (continuous batching refills their slots).
    `decode_weights` (`DecodeWeights`): whether the loop holds the gathered weights or gathers
    them every step. Returns (cache, buffers, tokens per row, stopped per row, steps, record):
    `record` [2] counts the running rows' steps and, with `lookup`, their drafts' success.

    `lookup` carries each row's tokens by slot from `history` [B, window] and looks up its
    prompt-lookup drafts every step (`drafts.ngram_drafts`). With `draft_tokens` > 0 each step
    also feeds them and chooses a token at every fed position; each row keeps the chosen
    tokens up to the first draft they contradict, so a step may take several tokens with the
    tokens unchanged, sampled ones included: a token is a function of its position's logits
    and its position's key (`row_keys`), whichever step computes it, so a draft stands with
    the probability the sampled distribution gives it, as in speculative sampling, and the
    sample is the one a step per token would draw. A row takes no more than fit in the
    window, and the loop ends when a running row filled it. The record's second count is then
    the drafts confirmed; with `draft_tokens` 0 (one token a step) it is the steps whose first
    draft the chosen token matched, what the host weighs before feeding drafts.
    """
    lookup = lookup or draft_tokens > 0  # fed drafts are looked up
    model = nnx.merge(graphdef, state)
    layer_params, logits_of = weights_and_logits(model, fused)
    batch, window = pending.shape[0], layout.n_slots(cache[0][1])
    width = 1 + draft_tokens  # tokens each row feeds a step
    offsets = jnp.arange(width)
    max_steps = jnp.minimum(jnp.max(limits), max_steps)
    rows = jnp.arange(batch)
    buffers = (jnp.zeros((batch, window), jnp.int32),
               jnp.zeros((batch, window), jnp.float32),
               jnp.zeros((batch, window), jnp.float32))
    init = DecodeState(step=jnp.int32(0), cache=cache, lengths=lengths, pending=pending,
                       positions=positions, running=limits > 0,
                       n_generated=jnp.zeros((batch,), jnp.int32),
                       stopped=jnp.zeros((batch,), bool), buffers=buffers,
                       history=history if lookup else None,
                       draft_record=jnp.zeros((2,), jnp.int32))

    def cond(s: DecodeState):
        go = ((s.step < max_steps) & jnp.any(s.running)
              & (jnp.sum((limits > 0) & ~s.running) < exit_after_finished))
        if draft_tokens:  # a row at the window's end waits for the next segment's window
            go &= ~jnp.any(s.running & (s.lengths >= window))
        return go

    def body(s: DecodeState) -> DecodeState:
        # Each running row writes its pending token (and drafts) from its own slot, in
        # place; a finished row's write goes past the window and is dropped.
        tokens = s.pending[:, None]
        if lookup:
            drafts = ngram_drafts(s.history, s.lengths, max(draft_tokens, 1))
        if draft_tokens:
            tokens = jnp.concatenate([tokens, drafts], axis=1)
        slots = jnp.where(s.running, s.lengths, window)
        hidden, cache = unrolled_forward(
            model, layer_params, tokens, s.positions[:, None] + offsets,
            valid_slots(s.lengths + width * s.running, window), s.cache, slots, layout,
            stream_weights=decode_weights.streams)
        logits = logits_of(hidden.reshape(batch * width, -1))
        keys = row_keys(seed, jnp.repeat(row_ids, width),
                        (s.positions[:, None] + 1 + offsets).reshape(-1))
        token, logp, sampling_logp = (a.reshape(batch, width) for a in select_tokens(
            logits, keys, temperature=temperature, top_k=top_k, top_p=top_p,
            max_top_k=max_top_k))
        # a row takes the tokens its confirmed drafts lead to, up to its first stop token,
        # its budget and the window's end
        is_stop = jnp.any(token[..., None] == stop_ids, axis=-1)
        to_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1) + 1,
                            width + 1)
        confirmed = (confirmed_drafts(drafts, token) if draft_tokens
                     else (drafts[:, 0] == token[:, 0]).astype(jnp.int32) if lookup else 0)
        taken = 1 + confirmed if draft_tokens else 1
        taken = jnp.minimum(jnp.minimum(taken, to_stop),
                            jnp.minimum(limits - s.n_generated, window - s.lengths))
        taken = jnp.where(s.running, taken, 0)
        kept = offsets[None, :] < taken[:, None]
        column = jnp.where(kept, s.n_generated[:, None] + offsets, window)  # else dropped
        buffers = tuple(
            buf.at[rows[:, None], column].set(val, mode="drop")
            for buf, val in zip(s.buffers, (token, logp, sampling_logp), strict=True)
        )
        history = s.history
        if lookup:
            history = history.at[rows[:, None], jnp.where(
                kept, s.lengths[:, None] + 1 + offsets, window)].set(token, mode="drop")
        record = s.draft_record + jnp.stack([jnp.sum(s.running),
                                             jnp.sum(jnp.where(s.running, confirmed, 0))])
        n_generated = s.n_generated + taken
        hit_stop = s.running & (to_stop <= taken)
        last = jnp.take_along_axis(token, jnp.maximum(taken - 1, 0)[:, None], axis=1)[:, 0]
        return DecodeState(
            step=s.step + 1, cache=cache, lengths=s.lengths + taken,
            pending=jnp.where(taken > 0, last, s.pending), positions=s.positions + taken,
            running=s.running & ~hit_stop & (n_generated < limits), n_generated=n_generated,
            stopped=s.stopped | hit_stop, buffers=buffers, history=history,
            draft_record=record.astype(jnp.int32))

    final = jax.lax.while_loop(cond, body, init)
    return (final.cache, final.buffers, final.n_generated, final.stopped, final.step,
            final.draft_record)


def grow_layer(k, v, *, new_window, layout):
    """One layer's keys and values padded to `new_window` slots."""
    return layout.pad_slots(k, v, new_window - layout.n_slots(v))


def decode_rows(graphdef, state, fused, cache, rows, *args, **static):
    """`decode` of only the cache rows `rows` [b] (an index past the batch: a padding row with
    limit 0, dropped); the other arguments are those rows'. The compute scales with the rows
    still sampling, not with the batch."""
    sub, *outputs = decode(graphdef, state, fused, take_rows(cache, rows), *args, **static)
    return (put_rows(cache, rows, sub), *outputs)
