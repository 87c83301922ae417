"""KV-cache sampler: jitted extend (prefill / append) and a `lax.while_loop` decode.

Cache layout. One (keys, values) pair per layer, over a window of slots, in the `KVLayout` the
mesh's platform runs without copies (`Sampler.kv_layout`) and, per row, its length: row r's
tokens fill its slots [0, lengths[r]) in order, with no gaps, so a row's capacity depends only
on its own tokens. Writes are per row: an extend writes each row's block, and a decode step
each row's token, at the row's own next slots (one in-place scatter per layer), then attends.
Rotary positions are per row too (a row's position counts its tokens), so a row attends
exactly to its own tokens in order, whatever the other rows hold — which is what makes
left-padding invariance and "appending equals re-prefilling" hold.

Every row always has one *pending* token: the last token of its sequence, not yet in the cache.
Prefill writes a prompt's tokens but the last; a decode step writes the pending token and
samples the next one, which becomes pending; an append writes the pending token and the
observation but its last token. So prefill and append are the same jitted `extend`, and a turn
that ended on a stop token needs no extra forward pass. Where the cache's batch is not split
over devices, programs compute only the rows with work: an extend only the rows that have
tokens, grouped by length bucket (an observation for one row does not pay for the whole batch,
a short prompt is not padded to the longest), and a decode only the rows still running once
they fit in half the batch (`Session.decode_segment`).

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

Drafts: a decode step looks up `draft_tokens` prompt-lookup drafts per row
(`spade_jax.sampling.drafts`) and, while the session's record says they pay
(`Session._drafts_pay`), feeds them and keeps the chosen tokens up to the first draft they
contradict, so a row that repeats itself takes several tokens a step. Sampled tokens are
unchanged too: each is drawn with its position's key, whichever step draws it.

Shapes that reach the compiler are bucketed (window, extend width, stop-id list), and
temperature / top-k / top-p / seed / limits are traced, so a session compiles a handful of
programs once (about two per window size it reaches).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from functools import partial

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spade_jax.jit_cache import shared_jit, tree_key
from spade_jax.models.kv_layout import KVLayout
from spade_jax.models.transformer import Transformer, block_tracing
from spade_jax.sampling import programs
from spade_jax.sampling.programs import (
    MIN_BUCKET,
    STOP_ID_SLOTS,
    DecodeWeights,
    bucket,
    bucket_at_most,
)
from spade_jax.sampling.sampling_fns import DEFAULT_MAX_TOP_K
from spade_jax.sampling.session import Session, check_draft_tokens
from spade_jax.sharding import (
    BATCH_AXES,
    fit_spec,
    kv_cache_axes,
    make_mesh,
    param_shardings,
    reserved_memory_options,
    traced_in_mesh,
)

DRAFT_TOKENS = 4  # prompt-lookup drafts per decode step (bench/rollout.py)
PREFILL_TOKENS_PER_DEVICE = 65536  # tokens one extend call computes per device (its rows x width)
# XLA:CPU sends dots to YNNPACK library fusions by default; XLA's own dot emitter is the other
# way to compile the decode programs' dots (`DecodeDots`).
CPU_DECODE_PROGRAMS = frozenset({"decode", "decode_rows"})
XLA_DOT_EMITTER = {"xla_cpu_experimental_ynn_fusion_type": ""}  # XLA:CPU options: no YNNPACK
# An extend (prefill / append) of this many tokens per device or more compiles its dots with
# XLA's emitter on CPU: YNNPACK is faster for a few rows, the emitter for wide blocks
# (bench/extend_dots.py).
CPU_EXTEND_EMITTER_TOKENS = 1024


class DecodeDots(enum.StrEnum):
    """`sampling.cpu_decode_dots`: how XLA:CPU compiles the decode programs' dots. YNNPACK:
    XLA's default library fusions, as fast as XLA's own dot emitter or faster in every
    `bench/sampler.py --decode-dots` A/B so far (docs/performance.md); EMITTER: the emitter,
    for a run that measures it faster on its host. Other programs and platforms keep XLA's
    defaults."""

    YNNPACK = "ynnpack"
    EMITTER = "emitter"

    @property
    def out_major(self) -> bool:
        """Whether the fused CPU weights hold every matrix as [out, in] (YNNPACK's faster
        batched products, logits included) rather than [in, out] (the emitter's)."""
        return self is DecodeDots.YNNPACK

    def compiler_options(self, platform: str, program: str) -> dict | None:
        """XLA options for compiling sampler `program` on `platform`."""
        if self is DecodeDots.EMITTER and platform == "cpu" and program in CPU_DECODE_PROGRAMS:
            return XLA_DOT_EMITTER
        return None


def _fused_decode_weights(graphdef, out_major: bool, state):
    return programs.fused_decode_weights(nnx.merge(graphdef, state), out_major)


def _kept_dtype(dtype, compute_dtype):
    """The dtype a sampler keeps a weight of `dtype` in: `compute_dtype` for floating-point
    weights (None: their own)."""
    if compute_dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        return dtype
    return compute_dtype


def _cast_floats(state, compute_dtype):
    return jax.tree.map(lambda a: a.astype(_kept_dtype(a.dtype, compute_dtype)), state)


def _zero_cache(shapes: tuple[tuple, tuple], dtype, n_layers: int) -> list:
    return [tuple(jnp.zeros(shape, dtype) for shape in shapes) for _ in range(n_layers)]


class Sampler:
    """Owns the compiled extend/decode programs for one model on one mesh.

    `set_params(state)` swaps in new weights (e.g. after a train step) without recompiling.
    `compute_dtype` (None: the weights' own): the sampler decodes from its own copy of the
    weights in this dtype, and its KV cache has this dtype too (float32 master weights, bf16
    sampling).
    `fuse_weights` (default: on for CPU) keeps `fused_decode_weights`, a copy of the weights
    with q/k/v and gate/up concatenated and every matrix in the orientation `decode_dots`
    reads fastest — faster decode on CPU at the cost of a second copy of the
    weights.
    `prefill_tokens`: the tokens one extend call may compute per device (see `extend_width`).
    `kv_layout` (None: the one the mesh's platform runs without copies,
    `KVLayout.for_platform`): how the KV cache stores each layer.
    `decode_dots`: how the CPU decode programs compile their dots (`DecodeDots`).
    `decode_weights`: whether a decode loop holds the weights gathered over 'fsdp' or gathers
    them every step (`DecodeWeights`).
    `draft_tokens`: prompt-lookup drafts a decode step verifies per row while they pay
    (`spade_jax.sampling.drafts`; 0: none).
    `extend_emitter_tokens`: on CPU, an extend call of this many tokens per device or more
    compiles its dots with XLA's emitter rather than YNNPACK (None: never).
    `reserved_bytes`: per device, what stays resident beside the sampler's programs (the
    trainer's state, `ResidentBytes.beside_sampler`); the TPU compiler keeps them within the
    rest of the HBM (`reserved_memory_options`).
    """

    def __init__(self, model: Transformer, *, mesh: Mesh | None = None,
                 max_top_k: int = DEFAULT_MAX_TOP_K, fuse_weights: bool | None = None,
                 compute_dtype=None, prefill_tokens: int = PREFILL_TOKENS_PER_DEVICE,
                 kv_layout: KVLayout | str | None = None,
                 decode_dots: DecodeDots | str = DecodeDots.YNNPACK,
                 decode_weights: DecodeWeights | str = DecodeWeights.RESIDENT,
                 draft_tokens: int = DRAFT_TOKENS, reserved_bytes: int = 0,
                 extend_emitter_tokens: int | None = CPU_EXTEND_EMITTER_TOKENS):
        if int(prefill_tokens) < MIN_BUCKET:
            raise ValueError(f"prefill_tokens={prefill_tokens!r}: an extend needs room for at "
                             f"least {MIN_BUCKET} tokens per device")
        self.cfg = model.cfg
        self.prefill_tokens = int(prefill_tokens)
        self.compute_dtype = None if compute_dtype is None else jnp.dtype(compute_dtype)
        self.mesh = mesh if mesh is not None else make_mesh((1, 1, 1), jax.devices()[:1])
        platform = self.mesh.devices.flat[0].platform
        self.kv_layout = (KVLayout.for_platform(platform) if kv_layout is None
                          else KVLayout(kv_layout))
        self.max_top_k = max_top_k
        self.draft_tokens = check_draft_tokens(draft_tokens)
        self.decode_dots = DecodeDots(decode_dots)
        self.decode_weights = DecodeWeights(decode_weights)
        self.fuse_weights = jax.default_backend() == "cpu" if fuse_weights is None else fuse_weights
        self.reserved_bytes = int(reserved_bytes)
        self.extend_emitter_tokens = extend_emitter_tokens
        self.graphdef, state = nnx.split(model)
        self._state_shardings = param_shardings(state, self.mesh)
        state_key = tree_key(self._state_shardings)
        # what determines every program of this sampler but its own name and static arguments
        self._programs_key = (self.graphdef, self.mesh, state_key, self.kv_layout,
                              self.max_top_k, self.decode_weights, self.decode_dots,
                              self.fuse_weights, self.compute_dtype, self.reserved_bytes,
                              self.extend_emitter_tokens)
        self._prepare = shared_jit(
            ("fused_decode_weights", self.graphdef, self.decode_dots, state_key),
            lambda: jax.jit(partial(_fused_decode_weights, self.graphdef,
                                    self.decode_dots.out_major),
                            in_shardings=(self._state_shardings,)))
        self._cast = shared_jit(
            ("cast", self.compute_dtype, state_key),
            lambda: jax.jit(partial(_cast_floats, compute_dtype=self.compute_dtype),
                            in_shardings=(self._state_shardings,),
                            out_shardings=self._state_shardings))
        self._jitted: dict = {}  # this sampler's programs (shared with its likes: `shared_jit`)
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
        return bucket_at_most(max(MIN_BUCKET, self.prefill_tokens // self.rows_per_device(batch)))

    def rows_per_device(self, batch: int) -> int:
        """Rows of a `batch` one device holds (the batch is split over the data axes)."""
        return self.batch_sharding((batch,)).shard_shape((batch,))[0]

    def _dtype_for(self, a):
        """The dtype the sampler keeps weight `a` (array or ShapeDtypeStruct) in."""
        return _kept_dtype(a.dtype, self.compute_dtype)

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
            shapes = self._cache_shapes(batch, window)
            dtype = self.state["embed"][...].dtype
            shardings = self._cache_shardings(batch, window)
            self._jitted[key] = shared_jit(
                (*key, shapes, dtype, tree_key(shardings)),
                lambda: jax.jit(partial(_zero_cache, shapes, dtype, self.cfg.n_layers),
                                out_shardings=shardings))
        return self._jitted[key](), self.put_batch(np.zeros((batch,), np.int32))

    def program(self, name: str, batch: int, window: int, **static):
        """The jitted 'extend', 'extend_rows' or 'decode_rows' (static `rows`: how many),
        'decode' or 'grow_layer' (to `static['new_window']` slots) program. The extends also
        take their block's `width` (tokens per row), which chooses their CPU dot path."""
        key = (name, batch, window, tuple(sorted(static.items())))
        if key in self._jitted:
            return self._jitted[key]
        shared_key = (*key, self._programs_key, block_tracing())
        cache_sh = self._cache_shardings(batch, window)
        row = self.batch_sharding((batch,))
        mat = self.batch_sharding((batch, 2))
        scalar = NamedSharding(self.mesh, PartitionSpec())
        if name == "grow_layer":
            self._jitted[key] = shared_jit(shared_key, lambda: jax.jit(
                partial(programs.grow_layer, **static, layout=self.kv_layout),
                in_shardings=cache_sh[0],
                out_shardings=self._cache_shardings(batch, static["new_window"])[0],
                compiler_options=self._compiler_options(name, batch, static)))
            return self._jitted[key]
        params = jax.tree.map(lambda a: a.sharding, self.fused_weights)
        head = (self._state_shardings, params, cache_sh)
        # a decode's own static arguments (`rows` only keys the program); looking drafts up
        # (fed drafts are) it takes the rows' histories too
        drafts = {k: static[k] for k in ("draft_tokens", "lookup") if k in static}
        lookup = bool(static.get("lookup") or static.get("draft_tokens"))
        if name == "extend":
            fn = partial(programs.extend, self.graphdef, layout=self.kv_layout)
            in_sh = (*head, row, mat, mat, mat)
            out_sh = cache_sh
        elif name == "extend_rows":  # only used where the cache's batch is not split
            fn = partial(programs.extend_rows, self.graphdef, layout=self.kv_layout)
            in_sh = (*head, scalar, scalar, scalar, scalar, scalar)
            out_sh = cache_sh
        elif name == "decode_rows":  # only used where the cache's batch is not split
            fn = partial(programs.decode_rows, self.graphdef, max_top_k=self.max_top_k,
                         layout=self.kv_layout, decode_weights=self.decode_weights,
                         **drafts)
            in_sh = (*head, *[scalar] * (13 + lookup))
            out_sh = (cache_sh, (scalar,) * 3, scalar, scalar, scalar, scalar)
        else:
            fn = partial(programs.decode, self.graphdef, max_top_k=self.max_top_k,
                         layout=self.kv_layout, decode_weights=self.decode_weights,
                         **drafts)
            in_sh = (*head, row, row, row, row, scalar, scalar, scalar, scalar, scalar, scalar,
                     scalar, row, *[mat] * lookup)
            out_sh = (cache_sh, (mat, mat, mat), row, row, scalar, scalar)
        self._jitted[key] = shared_jit(
            (*shared_key, tree_key(params)),
            lambda: jax.jit(traced_in_mesh(fn, self.mesh), in_shardings=in_sh,
                            out_shardings=out_sh, donate_argnums=(2,),
                            compiler_options=self._compiler_options(name, batch, static)))
        return self._jitted[key]

    def _compiler_options(self, program: str, batch: int, static: dict) -> dict | None:
        """XLA options of `program`: the CPU dot path of a decode (`decode_dots`) or of an
        extend (by its tokens per device, `extend_emitter_tokens`), the HBM reserved beside
        it."""
        platform = self.mesh.devices.flat[0].platform
        options = {**(self.decode_dots.compiler_options(platform, program) or {}),
                   **reserved_memory_options(self.mesh, self.reserved_bytes)}
        if (platform == "cpu" and program in ("extend", "extend_rows")
                and self.extend_emitter_tokens is not None):
            rows = static["rows"] if program == "extend_rows" else self.rows_per_device(batch)
            if rows * static["width"] >= self.extend_emitter_tokens:
                options |= XLA_DOT_EMITTER
        return options or None

    def lower(self, name: str, batch: int, window: int, *, width: int = MIN_BUCKET,
              draft_tokens: int = 0, rows: int = 1):
        """`jax.jit(...).lower` of the 'extend' (`width` tokens per row), 'extend_rows' (of
        `rows` of the batch) or 'decode' program over a cache window of `window` slots (the
        largest a session reaches is its capacity); a decode with `draft_tokens` is the one a
        session runs while drafts pay.

        Works with abstract weights; `.compile()` the result to check it builds on this mesh.
        """
        if name not in ("extend", "extend_rows", "decode"):
            raise ValueError(f"program {name!r}: use 'extend', 'extend_rows' or 'decode'")
        window = bucket(window)
        sds = lambda shape, dtype, sh=None: jax.ShapeDtypeStruct(  # noqa: E731
            shape, dtype, sharding=sh or self.batch_sharding(shape))
        scalar = NamedSharding(self.mesh, PartitionSpec())
        replicated = lambda shape, dtype: sds(shape, dtype, scalar)  # noqa: E731
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
            return self.program("extend", batch, window, width=width).lower(*args)
        if name == "extend_rows":
            block = (rows, width)
            args = (*head[:3], replicated((rows,), jnp.int32), replicated((rows,), jnp.int32),
                    replicated(block, jnp.int32), replicated(block, jnp.bool_),
                    replicated(block, jnp.int32))
            return self.program("extend_rows", batch, window, rows=rows,
                                width=width).lower(*args)
        scalar_of = lambda dtype: replicated((), dtype)  # noqa: E731
        args = (*head, row(jnp.int32), row(jnp.int32), row(jnp.int32), scalar_of(jnp.int32),
                scalar_of(jnp.int32), replicated((STOP_ID_SLOTS,), jnp.int32),
                scalar_of(jnp.float32), scalar_of(jnp.int32), scalar_of(jnp.float32),
                scalar_of(jnp.uint32), row(jnp.int32))
        if draft_tokens:
            args = (*args, sds((batch, window), jnp.int32))  # the rows' histories
            return self.program("decode", batch, window, draft_tokens=check_draft_tokens(
                draft_tokens), lookup=True).lower(*args)
        return self.program("decode", batch, window).lower(*args)

    def start(self, prompts: Sequence[Sequence[int]], *, capacity: int,
              draft_tokens: int | None = None) -> Session:
        """Prefill `prompts` (token ids, each non-empty) into a session with `capacity` slots;
        its decode steps verify `draft_tokens` drafts (None: the sampler's)."""
        return Session(self, prompts, capacity,
                       self.draft_tokens if draft_tokens is None else draft_tokens)
