"""The jitted PPO train step: chunked log-probs, PPO-clip loss, exact gradient accumulation.

    optimizer = make_optimizer(TrainConfig(learning_rate=1e-6))
    state = init_train_state(model, optimizer, mesh)
    step = TrainStep(model.cfg, optimizer, mesh, TrainConfig(), micro_batches=2,
                     compute_dtype=jnp.bfloat16)
    state, metrics = step(state, batch)      # state is donated
    step.lower(abstract_state, abstract_batch).compile()   # AOT, e.g. spade_jax.readiness

batch: tokens [B, T] int32, loss_mask [B, T], advantages [B] or [B, T], optionally mask [B, T]
(real tokens; default all) and behaviour_logp [B, T] (the sampler's log-probs, for TIS).
B must divide into `micro_batches` (a count; `TrainConfig.micro_batch` is sequences per
micro-batch) and each micro-batch over the data axes.

Precision: the master weights, both Adam moments and the gradient sums are float32; the
forward runs in `compute_dtype` (bf16 matmuls, float32 norms, softmax, logits and loss).
PPO's old_logp is the training forward's own log-prob under stop_gradient: the reference takes
one optimizer step per rollout, so the policy that the ratio compares against is the current
one (ratio exactly 1); the sampler's log-probs only enter through the TIS weight.
With `reference` weights (KL on) their log-probs come from a second, gradient-free forward.
Micro-batches run in a `lax.scan`; their loss numerators, token and sample counts and gradient
sums are added and divided once, so k micro-batches give the same update as one batch.
"""

from __future__ import annotations

import dataclasses
import enum

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spade_jax.models import moe
from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.rl.logprobs import token_logprobs
from spade_jax.rl.losses import LossAggregation, ppo_clip_loss
from spade_jax.sharding import (
    BATCH_AXES,
    param_shardings,
    reserved_memory_options,
    traced_in_mesh,
)

ROUTER_LOAD_KEY = "router_load"  # the sums' entry holding a MoE's `moe.RouterLoad` per layer


class Remat(enum.StrEnum):
    """Rematerialisation in the backward pass: none, or recompute each transformer block."""

    NONE = "none"
    BLOCK = "block"

    @property
    def recompute_layers(self) -> bool:
        return self is Remat.BLOCK


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimiser, loss and batch settings, the run config's `train` block (docs/DESIGN.md §4.7).

    `tis_cap` None turns importance-weight truncation off (0 in a config file); 2.0 is Slime's
    `--tis-clip` default, which the reference's recipes use with `--use-tis`.
    `kl_coef` > 0 adds the low-variance KL to a frozen copy of the initial weights.
    """

    learning_rate: float = 1e-6
    b1: float = 0.9
    b2: float = 0.98
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float | None = 2.0
    kl_coef: float = 0.0
    loss_aggregation: LossAggregation = LossAggregation.SAMPLE_MEAN
    logprob_chunk: int = 256
    remat: Remat = Remat.NONE
    micro_batch: int = 8  # sequences per micro-batch (gradient accumulation is exact)
    seq_len: int = 32768  # longest trained sequence

    def problems(self) -> list[str]:
        """What is wrong with these settings, one message per problem (key names as in config)."""
        out = []
        if self.remat is not None and self.remat not in tuple(Remat):  # None: parse refused it
            out.append(f"remat={self.remat!r}: use one of {tuple(Remat)}")
        if (self.loss_aggregation is not None
                and self.loss_aggregation not in tuple(LossAggregation)):
            out.append(f"loss_aggregation={self.loss_aggregation!r}: use one of "
                       f"{tuple(m.value for m in LossAggregation)}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            out.append(f"tis_cap={self.tis_cap} must be > 0 (or 0 in a config file: TIS off)")
        if self.kl_coef < 0:
            out.append(f"kl_coef={self.kl_coef} must be >= 0")
        for key in ("micro_batch", "seq_len", "logprob_chunk"):
            if getattr(self, key) < 1:
                out.append(f"{key}={getattr(self, key)} must be >= 1")
        if self.learning_rate < 0 or self.grad_clip <= 0:
            out.append(f"learning_rate={self.learning_rate} must be >= 0 and grad_clip="
                       f"{self.grad_clip} > 0")
        return out


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    params: nnx.State
    opt_state: optax.OptState
    step: jax.Array


def decayed(params: nnx.State):
    """AdamW's weight-decay mask: True for the weight matrices and embeddings, False for the
    norms' scales. Megatron, which the reference trains with through Slime, skips 1-D
    parameters (norms, biases) by default; ours stack the layers' norms on a leading axis, so
    they are told by name."""
    def is_decayed(path, _):
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return not str(names[-1]).endswith("norm")
    return jax.tree_util.tree_map_with_path(is_decayed, params)


def _masked_weight_decay(rate: float) -> optax.GradientTransformation:
    """`optax.add_decayed_weights` on the `decayed` parameters. Its state stays the empty one
    of the unmasked transform (`optax.masked` would wrap it), so checkpoints written before
    the mask still restore."""
    def update(updates, state, params):
        grow = jax.tree.map(lambda u, p, m: u + rate * p if m else u, updates, params,
                            decayed(params))
        return grow, state
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW (weight decay on the `decayed` parameters).

    The first moment is float32 whatever the weights (`mu_dtype`); the second follows the
    weights, which `init_train_state` requires to be float32 masters: at lr 1e-6 a bf16 weight
    (8 mantissa bits) would round most updates away.
    """
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip),
        optax.chain(  # optax.adamw, its decay masked by `decayed`
            optax.scale_by_adam(b1=config.b1, b2=config.b2, mu_dtype=jnp.float32),
            _masked_weight_decay(config.weight_decay),
            optax.scale_by_learning_rate(config.learning_rate)),
    )


def _abstract_split(model_cfg: ModelConfig):
    return nnx.split(nnx.eval_shape(lambda: Transformer(model_cfg, rngs=nnx.Rngs(0))))


def state_shardings(model_cfg: ModelConfig, optimizer, mesh: Mesh) -> TrainState:
    """Shardings of a TrainState: params by their specs, Adam moments like their params."""
    _, abstract_params = _abstract_split(model_cfg)
    params_sh = param_shardings(abstract_params, mesh)
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    by_shape = {}
    for value, sharding in zip(jax.tree.leaves(abstract_params), jax.tree.leaves(params_sh),
                               strict=True):
        by_shape.setdefault(value.shape, sharding)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_sh = jax.tree.map(lambda a: by_shape.get(a.shape, replicated) if a.ndim else replicated,
                          abstract_opt)
    return TrainState(params=params_sh, opt_state=opt_sh, step=replicated)


def init_train_state(model: Transformer, optimizer, mesh: Mesh) -> TrainState:
    """A TrainState for `model`'s weights, placed on `mesh`; the weights must be float32
    (the master copy: bf16 weights do not move at the reference's lr 1e-6)."""
    low = sorted({str(a.dtype) for a in jax.tree.leaves(nnx.state(model))
                  if jnp.issubdtype(a.dtype, jnp.floating) and a.dtype != jnp.float32})
    if low:
        raise ValueError(f"training needs float32 master weights but the model holds {low}; "
                         "build or load it with param_dtype=float32 (model.compute_dtype sets "
                         "the dtype of the matmuls)")
    shardings = state_shardings(model.cfg, optimizer, mesh)
    params = jax.device_put(nnx.state(model), shardings.params)
    init = jax.jit(optimizer.init, out_shardings=shardings.opt_state)
    return TrainState(params, init(params), jax.device_put(jnp.int32(0), shardings.step))


def compute_copy(params: nnx.State, dtype, shardings=None) -> nnx.State:
    """A separate copy of `params` with floating leaves in `dtype` (e.g. the frozen KL
    reference): never the same buffers, so donating `params` later cannot delete it."""
    dtype = jnp.dtype(dtype)

    def copy(a):
        a = jnp.copy(a)  # a new buffer even where the dtype already matches
        return a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a

    return jax.jit(lambda p: jax.tree.map(copy, p), out_shardings=shardings)(params)


def _micro_loss(graphdef, config: TrainConfig, compute_dtype, params, micro, reference):
    """(loss numerator, (sums)) of one micro-batch; see the module docstring."""
    def logprobs(model, record_router_load=False):
        return token_logprobs(model, micro["tokens"], micro.get("mask"),
                              chunk_size=config.logprob_chunk,
                              remat=Remat(config.remat).recompute_layers,
                              compute_dtype=compute_dtype, record_router_load=record_router_load)

    logp, sown = nnx.capture(lambda model: logprobs(model, record_router_load=True),
                             nnx.Intermediate)(nnx.merge(graphdef, params))
    ref_logp = (None if reference is None
                else jax.lax.stop_gradient(logprobs(nnx.merge(graphdef, reference))))
    loss, sums = ppo_clip_loss(
        logp, jax.lax.stop_gradient(logp), micro["advantages"], micro["loss_mask"],
        clip_low=config.clip_low, clip_high=config.clip_high,
        behaviour_logp=micro.get("behaviour_logp"), tis_cap=config.tis_cap,
        ref_logp=ref_logp, kl_coef=config.kl_coef,
        aggregation=LossAggregation(config.loss_aggregation),
    )
    if "router_load" in sown:  # MoE: [layers, E] copies per expert and [layers] dropped
        load = moe.RouterLoad(*sown["router_load"].get_value()[0])
        sums = dict(sums, **{ROUTER_LOAD_KEY: load})
    return loss, sums


class TrainStep:
    """The jitted `step(state, batch) -> (state, metrics)` with explicit shardings; donates state.

    `step` and `step.lower` split the batch into `micro_batches` micro-batches; the forward
    runs in `compute_dtype`. `reference` (every call's keyword): the frozen KL reference
    weights (`compute_copy` of the initial ones), needed when `config.kl_coef` > 0.

    metrics: loss (as aggregated), tokens, samples, grad_norm (before clipping), and token means
    of clip_fraction, ratio, approx_kl (exactly 0, 1 and 0 while old_logp is the step's own
    forward), tis_weight and tis_clip_fraction (share of tokens whose importance ratio exceeded
    tis_cap), kl; with a mixture of experts also router_max_over_mean_load and
    router_dropped_fraction (`moe.load_metrics` of the step's summed per-layer loads).
    `grouped(state, [(batch, micro_batches), ...])` is
    one optimizer step over several batches of different lengths (RL batches mix 4k-token
    Designer samples with short Agent episodes: each group is padded to its own length, not
    the longest), with the same exact accumulation: each group's program adds into one donated
    set of sums, so a batch shape costs one compile (`spade.batch.train_groups` keeps the
    shapes few; `compiled_programs` counts them).

    `skipped_tokens` / `skipped_samples`: generated tokens and samples left out of the batch
    because their advantage is 0. With no KL term their loss and gradient are exactly 0, so
    leaving them out changes nothing but the work, provided they still count in the
    denominator (tokens for token_mean, samples for sample_mean). The per-token metrics are
    means over the tokens computed.
    """

    def __init__(self, model_cfg: ModelConfig, optimizer, mesh: Mesh,
                 config: TrainConfig = TrainConfig(), micro_batches: int = 1,
                 compute_dtype=jnp.float32, reserved_bytes: int = 0):
        self.config = config
        self.aggregation = LossAggregation(config.loss_aggregation)
        self.micro_batches = micro_batches
        self.compute_dtype = jnp.dtype(compute_dtype)
        self.optimizer = optimizer
        self.mesh = mesh
        self.graphdef, _ = _abstract_split(model_cfg)
        self.shardings = state_shardings(model_cfg, optimizer, mesh)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        # per device, what stays resident beside the step (the sampler's weight copy,
        # `ResidentBytes.beside_train_step`): the TPU compiler keeps the step within the rest
        self.compiler_options = reserved_memory_options(mesh, reserved_bytes) or None
        self._jitted: dict = {}
        self._apply_sums = jax.jit(self._apply, donate_argnums=(0,),
                                   out_shardings=(self.shardings, self.replicated),
                                   compiler_options=self.compiler_options)

    def _loss(self, params, micro, reference):
        return traced_in_mesh(_micro_loss, self.mesh)(
            self.graphdef, self.config, self.compute_dtype, params, micro, reference)

    def _batch_sharding(self, a) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(BATCH_AXES, *[None] * (a.ndim - 1)))

    def _gradient_sums(self, params, reference, batch: dict, m: int, initial=None):
        """(float32 grad sums, loss numerator, count and metric sums) over `m` micro-batches,
        added to `initial` (sums of earlier batches) when given."""
        micro_sharding = NamedSharding(self.mesh, PartitionSpec(None, BATCH_AXES))
        micro = jax.tree.map(
            lambda a: jax.lax.with_sharding_constraint(
                a.reshape(m, a.shape[0] // m, *a.shape[1:]),
                NamedSharding(self.mesh, PartitionSpec(None, BATCH_AXES, *[None] * (a.ndim - 1)))
                if a.ndim > 1 else micro_sharding),
            batch)
        grad_of = jax.value_and_grad(self._loss, has_aux=True)

        def accumulate(carry, mb):
            grads, loss, sums = carry
            (value, mb_sums), g = grad_of(params, mb, reference)
            grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
            return (grads, loss + value, jax.tree.map(jnp.add, sums, mb_sums)), None

        if initial is None:
            initial = self._zero_sums(params, jax.tree.map(lambda a: a[0], micro), reference)
        acc, _ = jax.lax.scan(accumulate, initial, micro)
        return acc

    def _zero_sums(self, params, micro: dict, reference):
        """Zeros shaped like `_gradient_sums`' result (traced: the sums' keys come from the
        loss)."""
        zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        _, zero_sums = jax.eval_shape(self._loss, params, micro, reference)
        zero_sums = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), zero_sums)
        return zero_grads, jnp.float32(0), zero_sums

    def _apply(self, state: TrainState, acc, skipped):
        """Divide the sums once and take the optimizer step."""
        grads, loss, sums = acc
        tokens = sums["tokens"] + skipped["tokens"]
        samples = sums["samples"] + skipped["samples"]
        denom = jnp.maximum(self.aggregation.denominator(tokens, samples), 1.0)
        grads = jax.tree.map(lambda g: g / denom, grads)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        out = {k: v / jnp.maximum(sums["tokens"], 1.0) for k, v in sums.items()
               if k not in ("tokens", "samples", ROUTER_LOAD_KEY)}
        if ROUTER_LOAD_KEY in sums:
            out.update(moe.load_metrics(sums[ROUTER_LOAD_KEY]))
        out.update(loss=loss / denom, tokens=tokens, samples=samples,
                   skipped_tokens=skipped["tokens"], skipped_samples=skipped["samples"],
                   grad_norm=optax.global_norm(grads))
        return TrainState(params, opt_state, state.step + 1), out

    def _jitted_for(self, kind: str, batch: dict, m: int, reference):
        """The compiled 'step' (gradients and update), 'zeros' (empty sums) or 'accumulate'
        (sums added to donated earlier sums) for this batch shape."""
        has_ref = reference is not None
        if self.config.kl_coef and not has_ref:
            raise ValueError(f"train.kl_coef={self.config.kl_coef} needs the frozen reference "
                             "weights: pass reference=compute_copy(initial params, dtype)")
        key = (kind, m, has_ref,
               tuple(sorted((k, v.shape, str(v.dtype)) for k, v in batch.items())))
        if key not in self._jitted:
            in_batch = {k: self._batch_sharding(v) for k, v in batch.items()}
            rep = self.replicated
            ref_sh = self.shardings.params if has_ref else None
            if kind == "step":
                self._jitted[key] = jax.jit(
                    lambda state, ref, b, skipped: self._apply(
                        state, self._gradient_sums(state.params, ref, b, m), skipped),
                    in_shardings=(self.shardings, ref_sh, in_batch, rep),
                    out_shardings=(self.shardings, rep), donate_argnums=(0,),
                    compiler_options=self.compiler_options)
            else:
                self._jitted[key] = jax.jit(
                    lambda params, ref, b, acc: self._gradient_sums(params, ref, b, m, acc),
                    in_shardings=(self.shardings.params, ref_sh, in_batch,
                                  (self.shardings.params, rep, rep)),
                    out_shardings=(self.shardings.params, rep, rep), donate_argnums=(3,),
                    compiler_options=self.compiler_options)
        return self._jitted[key]

    def _zeros_for(self, params, batch: dict, reference):
        """The compiled program making empty sums: one per set of batch keys, whatever the
        batch's shape (the sums are scalars and parameter-shaped)."""
        key = ("zeros", reference is not None, tuple(sorted(batch)))
        if key not in self._jitted:
            abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), batch)
            shapes = jax.eval_shape(self._zero_sums, params, abstract, reference)
            self._jitted[key] = jax.jit(
                lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes),
                out_shardings=(self.shardings.params, self.replicated, self.replicated))
        return self._jitted[key]

    def compiled_programs(self) -> int:
        """How many programs this step has compiled: one per kind and batch shape it met."""
        return sum(f._cache_size() for f in (*self._jitted.values(), self._apply_sums))

    def _to_device(self, batch: dict) -> dict:
        """Host batch -> arrays split over the data axes. `device_put`, not `jnp.asarray`: it
        also builds global arrays from identical host data in a multi-process run."""
        return {k: jax.device_put(v, self._batch_sharding(v)) for k, v in batch.items()}

    @staticmethod
    def _skipped(tokens, samples) -> dict:
        return {"tokens": jnp.float32(tokens), "samples": jnp.float32(samples)}

    def __call__(self, state: TrainState, batch: dict, *, reference=None):
        batch = self._to_device(batch)
        return self._jitted_for("step", batch, self.micro_batches, reference)(
            state, reference, batch, self._skipped(0, 0))

    def grouped(self, state: TrainState, groups: list[tuple[dict, int]], skipped_tokens: int = 0,
                skipped_samples: int = 0, *, reference=None):
        """One optimizer step over (batch, micro_batches) groups of different shapes."""
        if not groups:
            raise ValueError("grouped train step needs at least one batch")
        groups = [(self._to_device(b), m) for b, m in groups]
        acc = self._zeros_for(state.params, groups[0][0], reference)()
        for batch, m in groups:  # the sums are donated: one accumulator, as in one batch's scan
            acc = self._jitted_for("accumulate", batch, m, reference)(state.params, reference,
                                                                      batch, acc)
        return self._apply_sums(state, acc, self._skipped(skipped_tokens, skipped_samples))

    def lower(self, state: TrainState, batch: dict, *, reference=None, **lower_kwargs):
        """`jax.jit(...).lower` of the step for abstract (ShapeDtypeStruct) state and batch.

        `lower_kwargs` go to `Traced.lower`, e.g. lowering_platforms=('tpu',) on an AbstractMesh.
        """
        skipped = jax.tree.map(lambda _: jax.ShapeDtypeStruct((), jnp.float32),
                               self._skipped(0, 0))
        return self._jitted_for("step", batch, self.micro_batches, reference).trace(
            state, reference, batch, skipped).lower(**lower_kwargs)
