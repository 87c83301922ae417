"""KV-cache sampler: jitted extend (prefill / append) and a `lax.while_loop` decode.

Cache layout. One (keys, values) pair per layer, over a window of slots, in the `KVLayout` the
mesh's platform runs without copies (`Sampler.kv_layout`) and, per row, its length: row r's
tokens fill its slots [0, lengths[r]) in order, with no gaps, so a row's capacity depends only
on its own tokens. Writes are per row: a forward writes the whole batch at a shared *staging*
range (the window's last slots, which every row leaves free) and attends there, then each row's
new keys/values move to its own next slots; a decode step writes each row's token at its own
slot directly (one in-place scatter per layer). Rotary positions are per row too (a row's position
counts its tokens), so a row attends exactly to its own tokens in order, whatever the other
rows hold — which is what makes left-padding invariance and "appending equals re-prefilling"
hold.

Every row always has one *pending* token: the last token of its sequence, not yet in the cache.
Prefill writes a prompt's tokens but the last; a decode step writes the pending token and
samples the next one, which becomes pending; an append writes the pending token and the
observation but its last token. So prefill and append are the same jitted `extend`, and a turn
that ended on a stop token needs no extra forward pass. An extend computes only the rows that
have tokens (where the cache's batch is not split over devices): an observation for one row
does not pay for the whole batch.

Capacity: each row holds at most `capacity` tokens in its cache (`Session.free_slots`). A decode
that fills a row ends it with finish reason 'context_full'; an append that does not fit raises
`CacheFullError` naming its rows; a prompt that does not fit is refused for its row only.

Live window: the cache arrays only hold a bucketed *window* of slots that grows with the
longest row (by padding), so attention costs scale with the filled prefix, not with capacity.
A decode runs in segments: each is one `lax.while_loop` over the current window, and the window
grows geometrically between segments while rows still run.

Chunked prefill: an extend writes at most `Sampler.extend_width(batch)` tokens per row per
call, the widest bucket whose rows x width on one device stay within `prefill_tokens`
(`PREFILL_TOKENS_PER_DEVICE`); longer prompts and observations are written in successive
pieces, which appending-equals-re-prefilling makes exact. So an extend's activations (its MoE
buffers, attention scores) are bounded whatever the prompts' lengths, and the extend program
the memory plan compiles is the widest one a session runs.

Shapes that reach the compiler are bucketed (window, extend width, stop-id list), and
temperature / top-k / top-p / seed / limits are traced, so a session compiles a handful of
programs once (about two per window size it reaches).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spade_jax.distributed import to_host
from spade_jax.models.kv_layout import KVLayout
from spade_jax.models.layers import vocab_logits
from spade_jax.models.transformer import Transformer, unrolled_forward
from spade_jax.sampling.sampling_fns import DEFAULT_MAX_TOP_K, row_keys, select_tokens
from spade_jax.seeding import check_seed
from spade_jax.sharding import (
    BATCH_AXES,
    fit_spec,
    kv_cache_axes,
    make_mesh,
    param_shardings,
    traced_in_mesh,
)

_MIN_BUCKET = 16
_STOP_ID_SLOTS = 8


class CacheFullError(ValueError):
    """An append needs more cache slots than the session has left."""


def bucket(n: int, minimum: int = _MIN_BUCKET) -> int:
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
    if b <= n or b == _MIN_BUCKET:
        return b
    return b * 3 // 4 if b & (b - 1) == 0 else b * 2 // 3


PREFILL_TOKENS_PER_DEVICE = 65536  # tokens one extend call computes per device (its rows x width)
_MIN_WINDOW = 64  # smallest cache window: fewer programs, and attention over 64 slots is cheap
_SEGMENT_MIN_STEPS = 64  # a decode segment gets room for at least this many steps when needed


class FinishReason(enum.StrEnum):
    """Why a row stopped generating: a stop token, its token budget, or its own cache being
    full (including a prompt longer than the capacity)."""

    STOP = "stop"
    LENGTH = "length"
    CONTEXT_FULL = "context_full"


@dataclasses.dataclass
class TurnOutput:
    """What one row generated in one `Session.decode` call."""

    tokens: list[int]
    logprobs: list[float]  # raw policy log-softmax (temperature 1) of the sampled token
    sampling_logprobs: list[float]  # under the distribution actually sampled from
    finish_reason: FinishReason

    @property
    def stopped(self) -> bool:
        """Whether the row ended with a stop token (its turn is complete)."""
        return self.finish_reason is FinishReason.STOP


@dataclasses.dataclass
class Turn:
    """A decode in progress (`Session.begin_turn`): per row its output so far, the tokens it
    may still sample, whether it still runs, and the sampling settings as program arguments."""

    outputs: list[TurnOutput | None]
    remaining: np.ndarray
    running: np.ndarray
    settings: tuple


def fused_decode_weights(model: Transformer) -> dict:
    """The sampler's CPU copy of the weights: fused per-layer matrices and a [D, vocab] output.

    `layers`: `Transformer.layer_params(fuse=True)`. `unembedding`: the output projection as a
    [D, vocab] matrix even when it is the tied [vocab, D] embedding, the layout XLA-CPU's
    batch-1 logits matmul reads fastest.
    """
    weight, vocab_major = model.output_projection()
    return {"layers": model.layer_params(fuse=True),
            "unembedding": weight.T if vocab_major else weight}


def _decode_weights(model: Transformer, fused: dict | None):
    """(per-layer weights, logits function): from the fused copy, or the model's own layout."""
    if fused is None:
        return model.layer_params(), model.logits
    return fused["layers"], partial(vocab_logits, weight=fused["unembedding"], vocab_major=False)


def _valid_slots(lengths: jax.Array, window: int) -> jax.Array:
    """[B, window] bool: row r's tokens fill its slots [0, lengths[r])."""
    return jnp.arange(window)[None, :] < lengths[:, None]


def _move_staged(cache: list, stage: int, targets: jax.Array, layout: KVLayout) -> list:
    """Move every layer's keys/values at slots [stage, stage + W) to each row's own slots
    `targets` [B, W] (an out-of-range target drops that slot): per-row writes after a forward
    that wrote the whole batch at one shared staging slot range."""
    return [layout.move_rows_slots(k, v, stage, targets) for k, v in cache]


def _extend_block(model, layer_params, cache, lengths, tokens, token_mask, positions, layout):
    """Write each row's left-aligned block after its own `lengths[r]` tokens.

    The forward writes the block at the last W slots of the window (a staging range every row
    leaves free) and attends there causally; the block is then moved to each row's own slots.
    """
    window, width = layout.n_slots(cache[0][1]), tokens.shape[1]
    stage = window - width
    kv_valid = _valid_slots(lengths, window) | jnp.pad(token_mask, ((0, 0), (stage, 0)))
    _, cache = unrolled_forward(model, layer_params, tokens, positions, kv_valid, cache, stage,
                                layout)
    targets = jnp.where(token_mask, lengths[:, None] + jnp.arange(width), window)
    return _move_staged(cache, stage, targets, layout)


def _extend(graphdef, state, fused, cache, lengths, tokens, token_mask, positions, *, layout):
    """`_extend_block` over the whole batch."""
    model = nnx.merge(graphdef, state)
    layer_params, _ = _decode_weights(model, fused)
    return _extend_block(model, layer_params, cache, lengths, tokens, token_mask, positions,
                         layout)


def _extend_rows(graphdef, state, fused, cache, lengths, rows, tokens, token_mask, positions, *,
                 layout):
    """`_extend_block` of only the cache rows `rows` [b] (an index past the batch: a padding
    row, dropped), so the compute scales with the rows that have tokens, not the batch."""
    model = nnx.merge(graphdef, state)
    layer_params, _ = _decode_weights(model, fused)
    sub = [(jnp.take(k, rows, axis=0, mode="clip"), jnp.take(v, rows, axis=0, mode="clip"))
           for k, v in cache]
    sub = _extend_block(model, layer_params, sub, lengths, tokens, token_mask, positions, layout)
    return [(k.at[rows].set(sk, mode="drop"), v.at[rows].set(sv, mode="drop"))
            for (k, v), (sk, sv) in zip(cache, sub, strict=True)]


class DecodeState(NamedTuple):
    """The decode loop's carry: the cache, each row's length, pending token and progress, and
    the buffers of what it sampled (token, policy log-prob, sampling log-prob per step)."""

    step: jax.Array  # steps taken
    cache: list
    lengths: jax.Array  # [B] tokens in each row's cache; the pending token goes to this slot
    pending: jax.Array  # [B] the token to write next
    positions: jax.Array  # [B] rotary position of the pending token
    running: jax.Array  # [B] rows still sampling
    n_generated: jax.Array  # [B] tokens sampled so far per row
    stopped: jax.Array  # [B] rows that sampled a stop token
    buffers: tuple  # ([B, window] tokens, log-probs, sampling log-probs)


def _decode(graphdef, state, fused, cache, lengths, pending, positions, limits, max_steps,
            exit_after_finished, stop_ids, temperature, top_k, top_p, seed, row_ids, *,
            max_top_k, layout):
    """At most `max_steps` decode steps (the caller keeps every running row's length + steps
    within the window); the token buffers are as long as the window. The loop also ends once
    `exit_after_finished` rows have finished (continuous batching refills their slots)."""
    model = nnx.merge(graphdef, state)
    layer_params, logits_of = _decode_weights(model, fused)
    batch, window = pending.shape[0], layout.n_slots(cache[0][1])
    max_steps = jnp.minimum(jnp.max(limits), max_steps)
    rows = jnp.arange(batch)
    buffers = (jnp.zeros((batch, window), jnp.int32),
               jnp.zeros((batch, window), jnp.float32),
               jnp.zeros((batch, window), jnp.float32))
    init = DecodeState(step=jnp.int32(0), cache=cache, lengths=lengths, pending=pending,
                       positions=positions, running=limits > 0,
                       n_generated=jnp.zeros((batch,), jnp.int32),
                       stopped=jnp.zeros((batch,), bool), buffers=buffers)

    def cond(s: DecodeState):
        return ((s.step < max_steps) & jnp.any(s.running)
                & (jnp.sum((limits > 0) & ~s.running) < exit_after_finished))

    def body(s: DecodeState) -> DecodeState:
        # Each running row writes its pending token at its own slot, in place; a finished
        # row's write goes past the window and is dropped.
        slots = jnp.where(s.running, s.lengths, window)
        hidden, cache = unrolled_forward(
            model, layer_params, s.pending[:, None], s.positions[:, None],
            _valid_slots(s.lengths + s.running, window), s.cache, slots, layout)
        logits = logits_of(hidden[:, 0])
        keys = row_keys(seed, row_ids, s.positions + 1)
        token, logp, sampling_logp = select_tokens(
            logits, keys, temperature=temperature, top_k=top_k, top_p=top_p, max_top_k=max_top_k
        )
        column = jnp.where(s.running, s.n_generated, window)  # out of range: dropped
        buffers = tuple(
            buf.at[rows, column].set(val, mode="drop")
            for buf, val in zip(s.buffers, (token, logp, sampling_logp), strict=True)
        )
        n_generated = s.n_generated + s.running
        hit_stop = s.running & jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        return DecodeState(
            step=s.step + 1, cache=cache, lengths=s.lengths + s.running,
            pending=jnp.where(s.running, token, s.pending), positions=s.positions + s.running,
            running=s.running & ~hit_stop & (n_generated < limits), n_generated=n_generated,
            stopped=s.stopped | hit_stop, buffers=buffers)

    final = jax.lax.while_loop(cond, body, init)
    return final.cache, final.buffers, final.n_generated, final.stopped, final.step


def _grow_layer(k, v, *, new_window, layout):
    """One layer's keys and values padded to `new_window` slots."""
    return layout.pad_slots(k, v, new_window - layout.n_slots(v))


class Sampler:
    """Owns the compiled extend/decode programs for one model on one mesh.

    `set_params(state)` swaps in new weights (e.g. after a train step) without recompiling.
    `compute_dtype` (None: the weights' own): the sampler decodes from its own copy of the
    weights in this dtype, and its KV cache has this dtype too (float32 master weights, bf16
    sampling).
    `fuse_weights` (default: on for CPU) keeps `fused_decode_weights`, a copy of the weights
    with q/k/v and gate/up concatenated and the output projection as [D, vocab] — faster decode
    on CPU at the cost of a second copy of the weights.
    `prefill_tokens`: the tokens one extend call may compute per device (see `extend_width`).
    `kv_layout` (None: the one the mesh's platform runs without copies,
    `KVLayout.for_platform`): how the KV cache stores each layer.
    """

    def __init__(self, model: Transformer, *, mesh: Mesh | None = None,
                 max_top_k: int = DEFAULT_MAX_TOP_K, fuse_weights: bool | None = None,
                 compute_dtype=None, prefill_tokens: int = PREFILL_TOKENS_PER_DEVICE,
                 kv_layout: KVLayout | str | None = None):
        if int(prefill_tokens) < _MIN_BUCKET:
            raise ValueError(f"prefill_tokens={prefill_tokens!r}: an extend needs room for at "
                             f"least {_MIN_BUCKET} tokens per device")
        self.cfg = model.cfg
        self.prefill_tokens = int(prefill_tokens)
        self.compute_dtype = None if compute_dtype is None else jnp.dtype(compute_dtype)
        self.mesh = mesh if mesh is not None else make_mesh((1, 1, 1), jax.devices()[:1])
        platform = self.mesh.devices.flat[0].platform
        self.kv_layout = (KVLayout.for_platform(platform) if kv_layout is None
                          else KVLayout(kv_layout))
        self.max_top_k = max_top_k
        self.fuse_weights = jax.default_backend() == "cpu" if fuse_weights is None else fuse_weights
        self.graphdef, state = nnx.split(model)
        self._state_shardings = param_shardings(state, self.mesh)
        self._prepare = jax.jit(
            lambda s: fused_decode_weights(nnx.merge(self.graphdef, s)),
            in_shardings=(self._state_shardings,),
        )
        self._cast = jax.jit(lambda s: jax.tree.map(lambda a: a.astype(self._dtype_for(a)), s),
                             in_shardings=(self._state_shardings,),
                             out_shardings=self._state_shardings)
        self._jitted: dict = {}
        self._source: list | None = None  # the arrays last passed to set_params (immutable)
        self.set_params(state)

    @property
    def batch_multiple(self) -> int:
        """Batches are padded to a multiple of the axes the KV cache's batch is split over."""
        batch_axes, _ = kv_cache_axes(self.cfg.n_kv_heads, self.mesh.shape)
        return int(np.prod([self.mesh.shape[a] for a in batch_axes]))

    def extend_width(self, batch: int) -> int:
        """Tokens per row of one extend over `batch` rows: the widest bucket whose rows on one
        device (the batch is split over the data axes) x width stay within `prefill_tokens`."""
        rows = self.batch_sharding((batch,)).shard_shape((batch,))[0]
        return bucket_at_most(max(_MIN_BUCKET, self.prefill_tokens // rows))

    def _dtype_for(self, a):
        """The dtype the sampler keeps weight `a` (array or ShapeDtypeStruct) in."""
        if self.compute_dtype is None or not jnp.issubdtype(a.dtype, jnp.floating):
            return a.dtype
        return self.compute_dtype

    def set_params(self, state: nnx.State) -> None:
        """Use these weights, cast to `compute_dtype`, from now on (same structure as the
        model's state).

        Abstract weights (a model built with `nnx.eval_shape`) give a sampler that can only
        `lower` its programs: ahead-of-time checks of a model too large for this machine.
        Passing the very arrays already in use is free: `generate` calls this on every call,
        so unchanged weights are neither re-placed nor re-fused.
        """
        leaves = jax.tree.leaves(state)
        if self._source is not None and len(leaves) == len(self._source) and all(
                a is b for a, b in zip(leaves, self._source, strict=True)):
            return
        self._source = leaves
        if all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves):
            if self.fuse_weights:
                raise ValueError("abstract weights need fuse_weights=False (the TPU/GPU layout)")
            self.state = jax.tree.map(
                lambda x, sh: jax.ShapeDtypeStruct(x.shape, self._dtype_for(x),
                                                   sharding=sh),
                state, self._state_shardings)
            self.fused_weights = None
            return
        self.state = jax.device_put(state, self._state_shardings)
        if any(self._dtype_for(a) != a.dtype for a in leaves):
            self.state = self._cast(self.state)  # the sampler's own copy
        self.fused_weights = self._prepare(self.state) if self.fuse_weights else None

    def compile_count(self) -> int:
        """Programs compiled so far (tests use it to prove that knobs do not recompile)."""
        return sum(f._cache_size() for f in self._jitted.values()) + self._prepare._cache_size()

    def batch_sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        spec = PartitionSpec(BATCH_AXES, *([None] * (len(shape) - 1)))
        return NamedSharding(self.mesh, fit_spec(spec, shape, self.mesh))

    def put_batch(self, value: np.ndarray) -> jax.Array:
        """Host batch data [batch, ...] as a device array split over the data axes.

        Explicit `device_put` rather than numpy arguments to the jitted programs: a
        multi-process run refuses numpy inputs with a sharded `in_shardings`, while
        `device_put` builds the global array from the (identical) host data on every process.
        """
        return jax.device_put(value, self.batch_sharding(value.shape))

    def put_replicated(self, value: np.ndarray) -> jax.Array:
        """Host data as a device array every device holds whole (`put_batch`'s reasons)."""
        return jax.device_put(value, NamedSharding(self.mesh, PartitionSpec()))

    def _cache_sharding(self, shape):
        batch_axes, head_axis = kv_cache_axes(self.cfg.n_kv_heads, self.mesh.shape)
        spec = [None] * len(shape)
        spec[0], spec[self.kv_layout.head_axis] = batch_axes, head_axis
        return NamedSharding(self.mesh, fit_spec(PartitionSpec(*spec), shape, self.mesh))

    def _cache_shapes(self, batch: int, window: int) -> tuple[tuple, tuple]:
        """Per-layer (keys, values) shapes over `window` slots, in `kv_layout`."""
        return self.kv_layout.shapes(batch, window, self.cfg.n_kv_heads, self.cfg.head_dim)

    def _cache_shardings(self, batch: int, window: int) -> list:
        pair = tuple(self._cache_sharding(shape) for shape in self._cache_shapes(batch, window))
        return [pair] * self.cfg.n_layers

    def new_cache(self, batch: int, window: int) -> tuple[list, jax.Array]:
        """Empty per-layer cache (see `_cache_shapes`) and its row lengths [B] (zeros)."""
        key = ("new_cache", batch, window, ())
        if key not in self._jitted:  # a fresh jit per call would recompile every time
            k_shape, v_shape = self._cache_shapes(batch, window)
            dtype = self.state["embed"][...].dtype
            self._jitted[key] = jax.jit(
                lambda: [(jnp.zeros(k_shape, dtype), jnp.zeros(v_shape, dtype))
                         for _ in range(self.cfg.n_layers)],
                out_shardings=self._cache_shardings(batch, window))
        return self._jitted[key](), self.put_batch(np.zeros((batch,), np.int32))

    def _program(self, name: str, batch: int, window: int, **static):
        """The jitted 'extend', 'extend_rows' (static `rows`: how many), 'decode' or
        'grow_layer' (to `static['new_window']` slots) program."""
        key = (name, batch, window, tuple(sorted(static.items())))
        if key in self._jitted:
            return self._jitted[key]
        cache_sh = self._cache_shardings(batch, window)
        row = self.batch_sharding((batch,))
        mat = self.batch_sharding((batch, 2))
        scalar = NamedSharding(self.mesh, PartitionSpec())
        if name == "grow_layer":
            self._jitted[key] = jax.jit(
                partial(_grow_layer, **static, layout=self.kv_layout), in_shardings=cache_sh[0],
                out_shardings=self._cache_shardings(batch, static["new_window"])[0])
            return self._jitted[key]
        params = jax.tree.map(lambda a: a.sharding, self.fused_weights)
        head = (self._state_shardings, params, cache_sh)
        if name == "extend":
            fn = partial(_extend, self.graphdef, layout=self.kv_layout)
            in_sh = (*head, row, mat, mat, mat)
            out_sh = cache_sh
        elif name == "extend_rows":  # only used where the cache's batch is not split
            fn = partial(_extend_rows, self.graphdef, layout=self.kv_layout)
            in_sh = (*head, scalar, scalar, scalar, scalar, scalar)
            out_sh = cache_sh
        else:
            fn = partial(_decode, self.graphdef, max_top_k=self.max_top_k,
                         layout=self.kv_layout)
            in_sh = (*head, row, row, row, row, scalar, scalar, scalar, scalar, scalar, scalar,
                     scalar, row)
            out_sh = (cache_sh, (mat, mat, mat), row, row, scalar)
        self._jitted[key] = jax.jit(traced_in_mesh(fn, self.mesh), in_shardings=in_sh,
                                    out_shardings=out_sh, donate_argnums=(2,))
        return self._jitted[key]

    def lower(self, name: str, batch: int, window: int, *, width: int = _MIN_BUCKET):
        """`jax.jit(...).lower` of the 'extend' (`width` tokens per row) or 'decode' program
        over a cache window of `window` slots (the largest a session reaches is its capacity).

        Works with abstract weights; `.compile()` the result to check it builds on this mesh.
        """
        if name not in ("extend", "decode"):
            raise ValueError(f"program {name!r}: use 'extend' or 'decode'")
        window = bucket(window)
        sds = lambda shape, dtype, sh=None: jax.ShapeDtypeStruct(  # noqa: E731
            shape, dtype, sharding=sh or self.batch_sharding(shape))
        scalar = NamedSharding(self.mesh, PartitionSpec())
        dtype = jax.tree.leaves(self.state["embed"])[0].dtype
        cache = [tuple(sds(shape, dtype, sh)
                       for shape, sh in zip(self._cache_shapes(batch, window), shardings,
                                            strict=True))
                 for shardings in self._cache_shardings(batch, window)]
        row = lambda dtype: sds((batch,), dtype)  # noqa: E731
        head = (self.state, self.fused_weights, cache, row(jnp.int32))
        if name == "extend":
            block = (batch, width)
            args = (*head, sds(block, jnp.int32), sds(block, jnp.bool_), sds(block, jnp.int32))
            return self._program("extend", batch, window).lower(*args)
        scalar_of = lambda dtype: sds((), dtype, scalar)  # noqa: E731
        args = (*head, row(jnp.int32), row(jnp.int32), row(jnp.int32), scalar_of(jnp.int32),
                scalar_of(jnp.int32), sds((_STOP_ID_SLOTS,), jnp.int32, scalar),
                scalar_of(jnp.float32), scalar_of(jnp.int32), scalar_of(jnp.float32),
                scalar_of(jnp.uint32), row(jnp.int32))
        return self._program("decode", batch, window).lower(*args)

    def start(self, prompts: Sequence[Sequence[int]], *, capacity: int) -> Session:
        """Prefill `prompts` (token ids, each non-empty) into a session with `capacity` slots."""
        return Session(self, prompts, capacity)


class Session:
    """A batch of conversations living in one KV cache; the host-facing multi-turn API.

        session = sampler.start(prompt_ids, capacity=4096)
        turn = session.decode(max_new_tokens=256, temperature=0.7, stop_token_ids=[eos])
        session.append([obs_ids_or_None_per_row])       # observations, any lengths
        turn = session.decode(max_new_tokens=256, active=still_playing)
        batch = session.training_arrays()                # tokens, loss_mask, policy_logp, ...

    Per row the session keeps the full token sequence, a loss mask (1 on sampled tokens only)
    and the log-probabilities of the sampled tokens, aligned with the tokens. Each row holds up
    to `capacity` tokens of its own (`free_slots`); a prompt longer than that is refused for its
    row alone (`refused`: it decodes nothing, finish reason 'context_full').
    """

    def __init__(self, sampler: Sampler, prompts: Sequence[Sequence[int]], capacity: int):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if int(capacity) < 1:
            raise ValueError(f"capacity={capacity!r}: a session needs at least one slot per row")
        self.sampler = sampler
        self.num_rows = len(prompts)
        multiple = sampler.batch_multiple
        self.batch = -(-self.num_rows // multiple) * multiple
        self.slots = int(capacity)
        self.lengths = np.zeros((self.batch,), np.int32)  # tokens in each row's cache
        self.refused = np.zeros((self.num_rows,), bool)
        self.key_ids = np.arange(self.batch, dtype=np.int32)  # row id in the sampling keys
        self.sequences: list[list[int]] = [[] for _ in range(self.num_rows)]
        self.loss_masks: list[list[int]] = [[] for _ in range(self.num_rows)]
        self.logprobs: list[list[float]] = [[] for _ in range(self.num_rows)]
        self.sampling_logprobs: list[list[float]] = [[] for _ in range(self.num_rows)]
        self.cache = None
        self.restart({r: p for r, p in enumerate(prompts)})

    def restart(self, prompts: dict[int, Sequence[int]]) -> None:
        """Replace rows by new conversations {row: prompt} and prefill them (those rows only).

        A prompt that does not leave room for one generated token (longer than the capacity)
        marks its row `refused` instead of failing the batch.
        """
        blocks = {}
        for r, prompt in prompts.items():
            prompt = list(map(int, prompt))
            if not prompt:
                raise ValueError(f"row {r}: every prompt needs at least one token")
            self.sequences[r] = prompt
            self.loss_masks[r] = [0] * len(prompt)
            self.logprobs[r] = [0.0] * len(prompt)
            self.sampling_logprobs[r] = [0.0] * len(prompt)
            self.lengths[r] = 0
            self.refused[r] = len(prompt) > self.slots
            if not self.refused[r]:
                blocks[r] = prompt[:-1]
        self._extend(blocks)

    @property
    def window(self) -> int:
        """Slots the cache arrays currently hold (a bucket; grows on demand)."""
        return 0 if self.cache is None else self.sampler.kv_layout.n_slots(self.cache[0][1])

    def _ensure_window(self, needed: int) -> None:
        """Grow the cache arrays so that slots [0, needed) exist."""
        if needed <= self.window:
            return
        window = bucket(needed, _MIN_WINDOW)
        if self.cache is None:
            self.cache, _ = self.sampler.new_cache(self.batch, window)
            return
        # layer by layer, each old layer freed before the next grows: the peak is the new
        # cache plus one old layer, not both caches whole
        grow = self.sampler._program("grow_layer", self.batch, self.window, new_window=window)
        for layer, (k, v) in enumerate(self.cache):
            self.cache[layer] = None
            self.cache[layer] = grow(k, v)
            del k, v

    @property
    def free_slots(self) -> np.ndarray:
        """[num_rows] tokens each row's cache can still take (0 for a refused row)."""
        free = self.slots - self.lengths[: self.num_rows]
        return np.where(self.refused, 0, free)

    def _extend(self, blocks: dict[int, list[int]]) -> None:
        """Write `blocks[r]` after row r's cached tokens, each row at its own position, in
        pieces of at most `Sampler.extend_width` tokens per row (chunked prefill)."""
        blocks = {r: b for r, b in blocks.items() if b}
        chunk = self.sampler.extend_width(self.batch)
        for start in range(0, max((len(b) for b in blocks.values()), default=0), chunk):
            self._extend_piece({r: b[start:start + chunk] for r, b in blocks.items()
                                if len(b) > start})

    def _extend_piece(self, blocks: dict[int, list[int]]) -> None:
        """Write the non-empty `blocks[r]` after row r's cached tokens in one extend call.

        The rows with tokens are written in one bucketed block: all of the batch, or (where the
        cache's batch is not split over devices) only those rows, padded to a bucketed count.
        """
        longest = max(len(b) for b in blocks.values())
        width = bucket(longest)
        self._ensure_window(int(self.lengths.max()) + width)
        n_rows = bucket(len(blocks), 1)
        subset = self.sampler.batch_multiple == 1 and n_rows < self.batch
        rows = np.array(sorted(blocks), np.int32) if subset else np.arange(self.batch)
        if subset:
            rows = np.concatenate([rows, np.full((n_rows - len(rows),), self.batch, np.int32)])
        tokens = np.zeros((len(rows), width), np.int32)
        mask = np.zeros((len(rows), width), bool)
        positions = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            block = blocks.get(int(r))
            if block:
                n = len(block)
                tokens[i, :n] = block
                mask[i, :n] = True
                # a row's rotary position counts its tokens: the block follows its cached ones
                positions[i, :n] = self.lengths[r] + np.arange(n)
        lengths = np.append(self.lengths, 0)[rows]  # padding rows: empty
        if subset:
            program = self.sampler._program("extend_rows", self.batch, self.window,
                                            rows=len(rows))
            self.cache = program(self.sampler.state, self.sampler.fused_weights, self.cache,
                                 *map(self.sampler.put_replicated,
                                     (lengths, rows, tokens, mask, positions)))
        else:
            program = self.sampler._program("extend", self.batch, self.window)
            self.cache = program(
                self.sampler.state, self.sampler.fused_weights, self.cache,
                *map(self.sampler.put_batch, (lengths, tokens, mask, positions)))
        for r, block in blocks.items():
            self.lengths[r] += len(block)

    def append(self, observations: Sequence[Sequence[int] | None]) -> None:
        """Append tokens (e.g. an environment observation) to rows; None or [] leaves a row as is.

        Appended tokens are context, not samples: loss mask 0, log-prob 0. Raises
        CacheFullError, naming the rows and changing nothing, when an observation does not fit
        in its row's free slots.
        """
        if len(observations) != self.num_rows:
            raise ValueError(f"got {len(observations)} observations for {self.num_rows} rows")
        observations = [list(map(int, o or ())) for o in observations]
        free = self.free_slots
        too_long = [r for r, obs in enumerate(observations) if len(obs) > free[r]]
        if too_long:
            raise CacheFullError(
                "observations of rows " + ", ".join(
                    f"{r} ({len(observations[r])} tokens, {free[r]} of {self.slots} slots "
                    "left)" for r in too_long)
                + " do not fit; start the session with a larger capacity")
        blocks = {}
        for r, obs in enumerate(observations):
            if obs:
                blocks[r] = self.sequences[r][-1:] + obs[:-1]
                self.sequences[r] += obs
                self.loss_masks[r] += [0] * len(obs)
                self.logprobs[r] += [0.0] * len(obs)
                self.sampling_logprobs[r] += [0.0] * len(obs)
        self._extend(blocks)

    def decode(
        self,
        max_new_tokens: int | Sequence[int],
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        stop_token_ids: Sequence[int] = (),
        seed: int = 0,
        active: Sequence[bool] | None = None,
    ) -> list[TurnOutput | None]:
        """Sample up to `max_new_tokens` (an int or one per row) for every active row.

        A row stops at its first stop token (kept, with loss mask 1: the model must learn to
        end its turn), at its limit ('length'), or when its own cache is full
        ('context_full'). Inactive rows get None and are untouched. Sampling with a given
        seed is reproducible: each token's key derives from (seed, row, position in the
        conversation). `seed` is in [0, 2**31) (`spade_jax.seeding`); another value is a
        ValueError naming it.
        """
        limits = np.broadcast_to(np.asarray(max_new_tokens, np.int32), (self.num_rows,)).copy()
        if active is not None:
            limits[~np.asarray(active, bool)] = 0
        turn = self.begin_turn(limits, temperature=temperature, top_k=top_k, top_p=top_p,
                               stop_token_ids=stop_token_ids, seed=seed)
        while turn.running.any():
            self.decode_segment(turn)
        return turn.outputs

    def begin_turn(self, limits: np.ndarray, *, temperature: float = 0.0, top_k: int = 0,
                   top_p: float = 1.0, stop_token_ids: Sequence[int] = (),
                   seed: int = 0) -> Turn:
        """A turn of the rows with `limits[r]` > 0 tokens to sample, to run with
        `decode_segment` (what `decode` does, and what lets an engine refill rows between
        segments)."""
        seed = check_seed(seed)
        limits = np.asarray(limits, np.int32)
        if len(stop_token_ids) > _STOP_ID_SLOTS:
            raise ValueError(f"at most {_STOP_ID_SLOTS} stop token ids are supported")
        stop_ids = np.full((_STOP_ID_SLOTS,), -1, np.int32)
        stop_ids[: len(stop_token_ids)] = list(stop_token_ids)
        settings = (stop_ids, np.float32(temperature), np.int32(top_k), np.float32(top_p),
                    np.uint32(seed))
        turn = Turn([None] * self.num_rows, np.zeros((self.num_rows,), np.int32),
                    np.zeros((self.num_rows,), bool), settings)
        self.start_rows(turn, {int(r): int(limits[r]) for r in np.flatnonzero(limits > 0)})
        return turn

    def start_rows(self, turn: Turn, limits: dict[int, int]) -> None:
        """Start a new turn in `turn` for the rows {row: max_new_tokens} (others keep theirs).

        A row with fewer free slots than its limit samples until its cache is full
        ('context_full', unless it stops first); a full row ends at once with no token.
        """
        free = self.free_slots
        for r, limit in limits.items():
            reason = FinishReason.CONTEXT_FULL if free[r] < limit else FinishReason.LENGTH
            turn.outputs[r] = TurnOutput([], [], [], reason)
            turn.remaining[r] = min(limit, free[r])
            turn.running[r] = turn.remaining[r] > 0

    def decode_segment(self, turn: Turn, exit_after_finished: int | None = None) -> None:
        """One while-loop decode over the current window for `turn`'s running rows, ending
        early once `exit_after_finished` of them finished; updates `turn` and the rows."""
        running = turn.running
        if not running.any():
            return
        longest = int(self.lengths[: self.num_rows][running].max())
        want = int(turn.remaining[running].max())
        # Grow the window geometrically, only as far as this segment needs.
        self._ensure_window(max(int(self.lengths.max()), longest + min(
            want, max(_SEGMENT_MIN_STEPS, longest // 2))))
        n = self.num_rows
        padded = lambda values: self.sampler.put_batch(np.concatenate(  # noqa: E731
            [np.asarray(values, np.int32), np.zeros((self.batch - n,), np.int32)]))
        program = self.sampler._program("decode", self.batch, self.window)
        exit_after = self.batch + 1 if exit_after_finished is None else exit_after_finished
        self.cache, buffers, n_gen, stopped, _ = program(
            self.sampler.state, self.sampler.fused_weights, self.cache,
            self.sampler.put_batch(self.lengths),
            padded([seq[-1] for seq in self.sequences]),
            padded([len(seq) - 1 for seq in self.sequences]),
            padded(np.where(running, turn.remaining, 0)),
            np.int32(self.window - longest), np.int32(exit_after), *turn.settings,
            self.sampler.put_batch(self.key_ids))
        n_gen, stopped = to_host(n_gen)[:n], to_host(stopped)[:n]
        buffers = tuple(to_host(b)[:n] for b in buffers)
        for r in np.flatnonzero(running):
            k = int(n_gen[r])
            tokens, logps, sampling_logps = (b[r, :k].tolist() for b in buffers)
            out = turn.outputs[r]
            out.tokens += tokens
            out.logprobs += logps
            out.sampling_logprobs += sampling_logps
            self.sequences[r] += tokens
            self.loss_masks[r] += [1] * k
            self.logprobs[r] += logps
            self.sampling_logprobs[r] += sampling_logps
            self.lengths[r] += k
            turn.remaining[r] -= k
            if stopped[r]:
                out.finish_reason = FinishReason.STOP
            running[r] = not stopped[r] and turn.remaining[r] > 0

    def training_arrays(self, rows: Sequence[int] | None = None,
                        length: int | None = None) -> dict[str, np.ndarray]:
        """Right-padded arrays of the chosen rows in the train step's batch format.

        tokens [R, T] int32, mask [R, T] (real tokens), loss_mask [R, T] (sampled tokens),
        policy_logp (temperature 1) and behaviour_logp (as sampled) [R, T] (log-prob of
        tokens[t] given tokens[<t]; 0 off the loss mask). `length` defaults to the longest row.
        """
        rows = list(range(self.num_rows)) if rows is None else list(rows)
        length = length or max(len(self.sequences[r]) for r in rows)
        out = {
            "tokens": np.zeros((len(rows), length), np.int32),
            "mask": np.zeros((len(rows), length), bool),
            "loss_mask": np.zeros((len(rows), length), np.float32),
            "policy_logp": np.zeros((len(rows), length), np.float32),
            "behaviour_logp": np.zeros((len(rows), length), np.float32),
        }
        for i, r in enumerate(rows):
            n = len(self.sequences[r])
            if n > length:
                raise ValueError(f"row {r} has {n} tokens, more than length={length}")
            out["tokens"][i, :n] = self.sequences[r]
            out["mask"][i, :n] = True
            out["loss_mask"][i, :n] = self.loss_masks[r]
            out["policy_logp"][i, :n] = self.logprobs[r]
            out["behaviour_logp"][i, :n] = self.sampling_logprobs[r]
        return out
